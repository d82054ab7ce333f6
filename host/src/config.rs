//! `toolguard.toml`: the data directory, engine settings, host-wide limits
//! and each plugin (component, optional sha256 pin, limits, non-secret
//! settings). A bad file fails with the file, the field and what is wrong.
//!
//! Relative paths are resolved against the config file's directory.

use crate::policy::{Downstream, Downstreams, Grant, RawDownstream};
use crate::runtime::limits::{LimitOverrides, Limits};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

/// Default engine memory ceiling: no plugin's `memory_mb` may exceed it.
pub const DEFAULT_MEMORY_CEILING_MB: u64 = 256;
/// Default number of invocations the pooling allocator holds at once.
pub const DEFAULT_POOL_INSTANCES: u32 = 256;

/// A parsed and validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where the ledger and compiled components live.
    pub data_dir: PathBuf,
    /// Where precompiled components are cached (default `<data_dir>/compiled`).
    pub compile_cache: PathBuf,
    /// Engine-wide settings.
    pub engine: EngineConfig,
    /// The downstreams plugins may be granted, by name.
    pub downstreams: Downstreams,
    /// Each plugin, in name order.
    pub plugins: Vec<PluginConfig>,
}

/// Engine-wide settings (`[engine]`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineConfig {
    /// Use the pooling allocator (falls back to on-demand, logged, if it cannot be set up).
    pub pooling: bool,
    /// How many invocations the pool holds at once.
    pub pool_instances: u32,
    /// The largest `memory_mb` any plugin may be given.
    pub memory_ceiling_mb: u64,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self { pooling: true, pool_instances: DEFAULT_POOL_INSTANCES, memory_ceiling_mb: DEFAULT_MEMORY_CEILING_MB }
    }
}

/// Where a plugin's component comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ComponentSource {
    /// A component embedded in the binary (`builtin:NAME`).
    Builtin(String),
    /// A `.wasm` file.
    File(PathBuf),
}

impl fmt::Display for ComponentSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Builtin(name) => write!(f, "builtin:{name}"),
            Self::File(path) => write!(f, "{}", path.display()),
        }
    }
}

/// One plugin as the operator configured it.
#[derive(Debug, Clone)]
pub struct PluginConfig {
    /// The plugin's name (the key under `[plugins]`).
    pub name: String,
    /// Its component.
    pub component: ComponentSource,
    /// Lower-case hex sha256 the component must have, if pinned.
    pub sha256: Option<String>,
    /// The limits its invocations run under.
    pub limits: Limits,
    /// Non-secret settings the plugin reads with `outbound.config`.
    pub settings: BTreeMap<String, String>,
    /// What it may reach through `outbound` (nothing by default).
    pub grants: Vec<Grant>,
}

/// A config that could not be used: which file, which field, what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {field}: {message}")]
pub struct ConfigError {
    /// The file (or `<embedded>`).
    pub file: String,
    /// The dotted path of the offending field (`.` for the whole file).
    pub field: String,
    /// What is wrong and, where it helps, what would be right.
    pub message: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default = "default_data_dir")]
    data_dir: PathBuf,
    compile_cache: Option<PathBuf>,
    #[serde(default)]
    engine: EngineConfig,
    #[serde(default)]
    limits: LimitOverrides,
    #[serde(default)]
    downstreams: BTreeMap<String, RawDownstream>,
    #[serde(default)]
    plugins: BTreeMap<String, RawPlugin>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPlugin {
    component: String,
    sha256: Option<String>,
    #[serde(default)]
    limits: LimitOverrides,
    #[serde(default)]
    config: BTreeMap<String, String>,
    #[serde(default)]
    grants: Vec<Grant>,
}

fn default_data_dir() -> PathBuf {
    PathBuf::from(".toolguard")
}

impl Config {
    /// Reads and validates the config file at `path`.
    ///
    /// # Errors
    /// The file cannot be read, is not valid TOML, or a field is wrong.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: file.clone(),
            field: ".".into(),
            message: format!("cannot read the config file: {e}"),
        })?;
        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
        Self::parse(&text, &file, &base)
    }

    /// Parses config `text`, naming it `file` in errors and resolving relative
    /// paths against `base`.
    ///
    /// # Errors
    /// The text is not valid TOML or a field is wrong.
    pub fn parse(text: &str, file: &str, base: &Path) -> Result<Self, ConfigError> {
        let err = |field: &str, message: String| ConfigError { file: file.into(), field: field.into(), message };
        let de = toml::Deserializer::parse(text).map_err(|e| err(".", describe_toml_error(text, &e)))?;
        let raw: RawConfig = serde_path_to_error::deserialize(de).map_err(|e| {
            let field = e.path().to_string();
            err(&field, describe_toml_error(text, e.inner()))
        })?;

        let resolve = |p: &Path| if p.is_absolute() { p.to_path_buf() } else { base.join(p) };
        let data_dir = resolve(&raw.data_dir);
        let compile_cache = raw.compile_cache.as_deref().map_or_else(|| data_dir.join("compiled"), resolve);
        let engine = raw.engine;
        if engine.pool_instances == 0 {
            return Err(err("engine.pool_instances", "must be at least 1".into()));
        }
        let host_limits = Limits::default().with(&raw.limits);
        check_limits(&host_limits, &engine).map_err(|(f, m)| err(&format!("limits.{f}"), m))?;

        let mut downstreams = Downstreams::new();
        for (name, d) in raw.downstreams {
            let d = Downstream::from_raw(&name, d).map_err(|(f, m)| err(&format!("downstreams.{name}.{f}"), m))?;
            downstreams.insert(name, std::sync::Arc::new(d));
        }

        let mut plugins = Vec::with_capacity(raw.plugins.len());
        for (name, p) in raw.plugins {
            let at = |f: &str| format!("plugins.{name}.{f}");
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
                return Err(err(&format!("plugins.{name}"), "a plugin name uses only A-Z a-z 0-9 - _".into()));
            }
            let component = match p.component.strip_prefix("builtin:") {
                Some(b) if crate::builtin::component(b).is_some() => ComponentSource::Builtin(b.into()),
                Some(b) => {
                    let known = crate::builtin::names().join(", ");
                    return Err(err(&at("component"), format!("no builtin plugin `{b}`; builtins are: {known}")));
                }
                None => ComponentSource::File(resolve(Path::new(&p.component))),
            };
            if let Some(pin) = &p.sha256
                && (pin.len() != 64 || !pin.chars().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()))
            {
                return Err(err(&at("sha256"), "expected 64 lower-case hex digits (the component's sha256)".into()));
            }
            let limits = host_limits.with(&p.limits);
            check_limits(&limits, &engine).map_err(|(f, m)| err(&at(&format!("limits.{f}")), m))?;
            for (i, g) in p.grants.iter().enumerate() {
                if !downstreams.contains_key(&g.downstream) {
                    let known = downstreams.keys().cloned().collect::<Vec<_>>().join(", ");
                    return Err(err(&at(&format!("grants[{i}].downstream")), format!("no downstream `{}`; configured: {known}", g.downstream)));
                }
                if g.methods.is_empty() || g.methods.iter().any(|m| m.is_empty() || !m.chars().all(|c| c.is_ascii_uppercase())) {
                    return Err(err(&at(&format!("grants[{i}].methods")), "list upper-case HTTP methods, e.g. [\"POST\"]".into()));
                }
            }
            plugins.push(PluginConfig { name, component, sha256: p.sha256, limits, settings: p.config, grants: p.grants });
        }
        Ok(Self { data_dir, compile_cache, engine, downstreams, plugins })
    }
}

/// Checks limits for values that cannot work; names the field on failure.
fn check_limits(l: &Limits, engine: &EngineConfig) -> Result<(), (&'static str, String)> {
    let positive = [
        ("memory_mb", l.memory_mb),
        ("cpu_ms", l.cpu_ms),
        ("wall_ms", l.wall_ms),
        ("max_args_bytes", l.max_args_bytes as u64),
        ("max_result_bytes", l.max_result_bytes as u64),
    ];
    if let Some((field, _)) = positive.iter().find(|(_, v)| *v == 0) {
        return Err((field, "must be greater than 0".into()));
    }
    if l.memory_mb > engine.memory_ceiling_mb {
        return Err((
            "memory_mb",
            format!("{} exceeds the engine's memory_ceiling_mb of {}; raise [engine] memory_ceiling_mb", l.memory_mb, engine.memory_ceiling_mb),
        ));
    }
    Ok(())
}

/// A TOML error as one line, with the line and column it points at.
fn describe_toml_error(text: &str, e: &toml::de::Error) -> String {
    let message = e.message().trim_end().to_string();
    match e.span() {
        Some(span) => {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
            format!("{message} (line {line}, column {column})")
        }
        None => message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, "t.toml", Path::new("/base"))
    }

    #[test]
    fn names_file_field_and_problem() {
        let e = parse("[plugins.a]\ncomponent = \"a.wasm\"\n[plugins.a.limits]\ncpu_ms = \"fast\"\n").unwrap_err();
        assert_eq!(e.file, "t.toml");
        assert_eq!(e.field, "plugins.a.limits.cpu_ms");
        assert!(e.message.contains("line 4"), "{e}");

        let e = parse("[plugins.a]\ncomponent = \"a.wasm\"\ncolour = 1\n").unwrap_err();
        assert!(e.message.contains("unknown field `colour`"), "{e}");

        let e = parse("[plugins.a]\ncomponent = \"a.wasm\"\nsha256 = \"abc\"\n").unwrap_err();
        assert_eq!(e.field, "plugins.a.sha256");

        let e = parse("[plugins.a]\ncomponent = \"builtin:nope\"\n").unwrap_err();
        assert!(e.message.contains("builtins are"), "{e}");

        let e = parse("[limits]\nmemory_mb = 4096\n").unwrap_err();
        assert_eq!(e.field, "limits.memory_mb");

        let e = parse("data_dir = [").unwrap_err();
        assert_eq!(e.field, ".");
    }

    #[test]
    fn downstreams_and_grants_are_checked() {
        let base = "[downstreams.pay]\nurl = \"http://127.0.0.1:4242\"\n[plugins.a]\ncomponent = \"a.wasm\"\n";
        let ok = parse(&format!("{base}[[plugins.a.grants]]\ndownstream = \"pay\"\nmethods = [\"POST\"]\npath_prefix = \"/v1\"\n")).unwrap();
        assert_eq!(ok.plugins[0].grants[0].downstream, "pay");
        assert_eq!(ok.downstreams["pay"].timeout.as_millis(), 8000);
        let e = parse(&format!("{base}[[plugins.a.grants]]\ndownstream = \"nope\"\n")).unwrap_err();
        assert_eq!(e.field, "plugins.a.grants[0].downstream");
        let e = parse(&format!("{base}[[plugins.a.grants]]\ndownstream = \"pay\"\nmethods = [\"post\"]\n")).unwrap_err();
        assert_eq!(e.field, "plugins.a.grants[0].methods");
        let e = parse("[downstreams.pay]\nurl = \"ftp://x\"\n").unwrap_err();
        assert_eq!(e.field, "downstreams.pay.url");
        let e = parse("[downstreams.pay]\nurl = \"http://x\"\nkey = [{ transport = \"smoke-signal\" }]\n").unwrap_err();
        assert!(e.field.starts_with("downstreams.pay.key"), "{e}");
    }

    #[test]
    fn resolves_paths_and_layers_limits() {
        let c = parse(
            "data_dir = \"d\"\n[limits]\ncpu_ms = 200\n[plugins.a]\ncomponent = \"x/a.wasm\"\n[plugins.a.limits]\nwall_ms = 5\n",
        )
        .unwrap();
        assert_eq!(c.data_dir, Path::new("/base/d"));
        assert_eq!(c.compile_cache, Path::new("/base/d/compiled"));
        let a = &c.plugins[0];
        assert_eq!(a.component, ComponentSource::File("/base/x/a.wasm".into()));
        assert_eq!((a.limits.cpu_ms, a.limits.wall_ms), (200, 5));
        assert_eq!(a.limits.memory_mb, crate::runtime::limits::DEFAULT_MEMORY_MB);
    }
}
