//! `toolguard demo`: the host at work on embedded defaults — no config file,
//! no network. Loads the embedded plugins, runs a tool, and shows that bad
//! input is refused before any sandbox exists.

use crate::{CallRequest, Config, Runtime};
use std::path::Path;

/// The demo's config: the embedded plugins only.
const DEMO_CONFIG: &str = r#"
[plugins.text-stats]
component = "builtin:text-stats"

[plugins.template]
component = "builtin:template"
[plugins.template.config]
salutation = "Welcome"
"#;

/// Runs the demo; returns the exit status.
pub async fn run() -> u8 {
    match demo().await {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("demo failed: {e}");
            1
        }
    }
}

async fn demo() -> anyhow::Result<()> {
    let data = tempfile::tempdir()?;
    let config = Config::parse(DEMO_CONFIG, "<demo config>", data.path())?;
    let runtime = Runtime::from_config(&config).await?;
    println!("toolguard demo — tools run as WebAssembly components with no capability but the guard.\n");
    println!("1. Loaded {} plugin(s) ({:?} allocator):", config.plugins.len(), runtime.allocator());
    for tool in runtime.tools() {
        println!("   - {} ({}, {:?}): {}", tool.name, tool.plugin, tool.effect, tool.description);
    }

    let stats = call(&runtime, "c1", "text_stats", r#"{"text":"a refund, a refund, never two refunds","top":2}"#).await;
    println!("\n2. text_stats → {stats}");
    let greeting = call(&runtime, "c2", "greet", r#"{"name":"reviewer"}"#).await;
    println!("\n3. greet → {greeting}");

    let before = runtime.sandboxes_created();
    let refused = call(&runtime, "c3", "text_stats", r#"{"text": 42}"#).await;
    println!("\n4. text_stats with a number for `text` → {refused}");
    println!("   sandboxes created for it: {}", runtime.sandboxes_created() - before);
    print_paths(data.path());
    Ok(())
}

async fn call(runtime: &Runtime, call_id: &str, tool: &str, args: &str) -> String {
    let req = CallRequest { session: "demo".into(), call_id: call_id.into(), tool: tool.into(), args_json: args.into() };
    match runtime.call(&req).await {
        Ok(v) => v.value.to_string(),
        Err(e) => serde_json::to_string(&e).unwrap_or_else(|_| e.to_string()),
    }
}

fn print_paths(data: &Path) {
    println!("\nThe demo's data lived in {} (removed on exit).", data.display());
}
