//! (j) What a tool's language costs per call: a fresh sandbox plus one invoke
//! of an equal read-only text tool written in Rust (toolguard-sdk), Python
//! (componentize-py, on the Python SDK) and JavaScript (componentize-js),
//! side by side in one runtime, each ratio against the Rust tool measured in
//! the same run. The Python and JavaScript components are the ones
//! `plugins/build-foreign.sh` builds (`./dev.sh test` does); without them (j)
//! says so and reports the Rust figure alone.

use super::guarded::drive;
use super::{Figure, Scale, Stats, us};
use std::path::Path;
use std::sync::Arc;
use toolguard::config::{ComponentSource, EngineConfig, PluginConfig};
use toolguard::{CallRequest, Runtime};

/// One language's tool: the plugin that holds it and the tool's name.
struct Entry {
    language: &'static str,
    plugin: PluginConfig,
    tool: &'static str,
}

fn plugin(name: &str, component: ComponentSource) -> PluginConfig {
    PluginConfig {
        name: name.into(),
        component,
        limits: Default::default(),
        settings: Default::default(),
        tool_prefix: String::new(),
        policy: Default::default(),
    }
}

/// The entries whose components exist: Rust always (built in), Python and
/// JavaScript from `foreign` (Python sealed here, as `toolguard seal` would).
fn entries(dir: &Path, foreign: Option<&Path>) -> anyhow::Result<(Vec<Entry>, Vec<Figure>)> {
    let mut entries = vec![Entry { language: "Rust", plugin: plugin("rust", ComponentSource::Builtin("text-stats".into())), tool: "text_stats" }];
    let mut notes = Vec::new();
    for (language, file, tool) in [("Python", "py_text", "py_text_stats"), ("JavaScript", "js_text", "js_text_stats")] {
        let Some(path) = foreign.map(|f| f.join(format!("{file}.wasm"))).filter(|p| p.exists()) else {
            notes.push(Figure::new(format!("(j) {language}: skipped, no {file}.wasm (build it: ./dev.sh test, or --foreign DIR)"), 0.0, ""));
            continue;
        };
        let (sealed, _) = toolguard::seal::seal(&std::fs::read(&path)?)?;
        let out = dir.join(format!("{file}.sealed.wasm"));
        std::fs::write(&out, sealed)?;
        entries.push(Entry { language, plugin: plugin(file, ComponentSource::File(out)), tool });
    }
    Ok((entries, notes))
}

/// (j): per-call cost of the same read-only tool in each language.
///
/// # Errors
/// The engine or a plugin cannot be set up, or a call fails.
pub async fn per_language(dir: &Path, scale: Scale, foreign: Option<&Path>) -> anyhow::Result<Vec<Figure>> {
    let scratch = tempfile::tempdir_in(dir)?;
    let (entries, mut figures) = entries(scratch.path(), foreign)?;
    let plugins: Vec<PluginConfig> = entries.iter().map(|e| e.plugin.clone()).collect();
    let engine = EngineConfig::default().fitted_to(toolguard::runtime::footprint_of(&plugins));
    let mut runtime = Runtime::new(&engine, dir.join("compiled"))?;
    for p in &plugins {
        runtime.add_plugin(p).await?;
    }
    let runtime = Arc::new(runtime);
    let mut rust_p50 = None;
    for entry in &entries {
        let (rt, tool) = (runtime.clone(), entry.tool);
        let (mut samples, _) = drive(1, scale.n(super::described::J_CALLS), move |i| {
            let rt = rt.clone();
            async move {
                let req = CallRequest {
                    session: "bench".into(),
                    call_id: format!("j{i}"),
                    tool: tool.into(),
                    args_json: r#"{"text":"one two three\nfour five"}"#.into(),
                    principal: None,
                    tenant: None,
                };
                rt.call(&req).await.map(|_| ()).map_err(|e| e.to_string())
            }
        })
        .await?;
        let stats = Stats::of(&mut samples);
        let p50 = us(stats.p50);
        let rust = *rust_p50.get_or_insert(p50);
        let size = match &entry.plugin.component {
            ComponentSource::File(path) => std::fs::metadata(path).map(|m| m.len()).unwrap_or(0),
            ComponentSource::Builtin(_) | ComponentSource::Oci(_) => 0,
        };
        let what = if size > 0 { format!(" ({:.1} MB sealed)", size as f64 / 1e6) } else { String::new() };
        figures.push(Figure::new(format!("(j) {}{what}: fresh sandbox + invoke, p50", entry.language), p50, "µs").against("the Rust tool", p50 / rust));
        figures.push(Figure::new(format!("(j) {}: fresh sandbox + invoke, p99", entry.language), us(stats.p99), "µs"));
    }
    Ok(figures)
}
