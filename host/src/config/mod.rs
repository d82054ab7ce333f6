//! `toolguard.toml`: the operator's part — the data directory, engine
//! settings, host-wide limits, and each plugin (component, limits, non-secret
//! settings) — and the reviewer's part, `[policy]` (or a separate
//! `policy_file`): downstreams, pins, effect classes, grants, budgets,
//! credentials (see [`crate::policy`]). A bad file fails with the file, the
//! field and what is wrong.
//!
//! Relative paths are resolved against the directory of the file they are in.

mod engine;
mod ledger;
pub mod limits;
mod mcp;
mod oauth;
mod raw;
mod restart;

pub use engine::{DEFAULT_COMPONENT_FOOTPRINT, DEFAULT_MEMORY_CEILING_MB, DEFAULT_POOL_INSTANCES, EngineConfig, Footprint};
pub use ledger::Retention;
use ledger::{RETENTION_MARGIN_HOURS, ledger_cache, ledger_location, ledger_pool};
pub use limits::{LimitOverrides, Limits};
pub use mcp::{McpConfig, McpToken, MissingCallId, split_origin, valid_principal};
pub use oauth::{ACCEPTABLE_ALGORITHMS, IssuerConfig, OAuthConfig, ScopeRules};
use raw::{RawConfig, parse_toml};
pub use restart::RestartOnly;

use crate::ledger::LedgerLocation;
use crate::policy::{Downstreams, PluginPolicy, Policy, RawPolicy};
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

/// A parsed and validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where the ledger (unless `ledger` says otherwise) and compiled components live.
    pub data_dir: PathBuf,
    /// The ledger: `<data_dir>/ledger` on RocksDB by default, or a PostgreSQL
    /// database shared by a fleet (`ledger = "postgres://…"`, or the URL in
    /// the environment variable `ledger_url_env` names).
    pub ledger: LedgerLocation,
    /// MiB of a RocksDB ledger's table files its host keeps in memory, in
    /// each of its two block caches (`ledger_cache_mib`, default
    /// [`crate::ledger::DEFAULT_BLOCK_CACHE_MIB`]).
    pub ledger_cache_mib: u64,
    /// Connections a host keeps to a PostgreSQL ledger at most (`ledger_pool`,
    /// default [`crate::ledger::DEFAULT_POOL_SIZE`]): a fleet's hosts share
    /// the server's `max_connections`.
    pub ledger_pool: u32,
    /// Where precompiled components are cached (default `<data_dir>/compiled`).
    pub compile_cache: PathBuf,
    /// Engine-wide settings.
    pub engine: EngineConfig,
    /// How `toolguard serve` speaks MCP.
    pub mcp: McpConfig,
    /// The downstreams plugins may be granted, by name (from the policy).
    pub downstreams: Downstreams,
    /// How the host reaches each registry the policy names.
    pub registries: crate::policy::Registries,
    /// Whether every component from a registry must carry a publisher's signature.
    pub require_signatures: bool,
    /// Where the policy came from (this file, or its `policy_file`).
    pub policy_source: String,
    /// Each plugin, in name order.
    pub plugins: Vec<PluginConfig>,
    /// How long the ledger keeps final records (`[retention]`); `None`
    /// keeps everything.
    pub retention: Option<Retention>,
}

/// Where a plugin's component comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ComponentSource {
    /// A component embedded in the binary (`builtin:NAME`).
    Builtin(String),
    /// A `.wasm` file.
    File(PathBuf),
    /// A Wasm component artifact in an OCI registry (`oci://…`).
    Oci(crate::registry::OciRef),
}

impl fmt::Display for ComponentSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Builtin(name) => write!(f, "builtin:{name}"),
            Self::File(path) => write!(f, "{}", path.display()),
            Self::Oci(r) => write!(f, "{r}"),
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
    /// The limits its invocations run under.
    pub limits: Limits,
    /// Non-secret settings the plugin reads with `outbound.config`.
    pub settings: BTreeMap<String, String>,
    /// Prepended to each of its tools' names as the host serves them (to keep
    /// two plugins' tools apart); the plugin still sees its own names.
    pub tool_prefix: String,
    /// The reviewer's policy for it (the default if the policy does not name it).
    pub policy: PluginPolicy,
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

impl Config {
    /// The directory of its embedded (RocksDB) ledger; `None` on PostgreSQL.
    pub fn ledger_dir(&self) -> Option<&Path> {
        match &self.ledger {
            crate::ledger::LedgerLocation::Dir(dir) => Some(dir),
            crate::ledger::LedgerLocation::Postgres(_) => None,
        }
    }

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
        let mut config = Self::parse(&text, &file, &base)?;
        // The reviewer's lock beside it, if there is one: every plugin is held to it.
        let lock_path = base.join(crate::policy::lock::FILE_NAME);
        if lock_path.exists() {
            let lock = crate::policy::lock::Lock::read(&lock_path).map_err(|message| ConfigError {
                file: lock_path.display().to_string(),
                field: ".".into(),
                message,
            })?;
            for plugin in &mut config.plugins {
                let entry = lock.plugins.get(&plugin.name).cloned();
                plugin.policy.locked = Some(crate::policy::lock::Locked { file: lock_path.display().to_string(), entry });
            }
        }
        Ok(config)
    }

    /// Opens the ledger this config names (read-only: while a host holds it).
    ///
    /// # Errors
    /// As [`crate::ledger::Ledger::open_at`].
    pub fn open_ledger(&self, read_only: bool) -> Result<crate::ledger::Ledger, crate::ledger::LedgerError> {
        crate::ledger::Ledger::open_at(&self.ledger, read_only, self.ledger_cache_mib, self.ledger_pool)
    }

    /// Parses config `text`, naming it `file` in errors and resolving relative
    /// paths against `base`.
    ///
    /// # Errors
    /// The text is not valid TOML or a field is wrong.
    pub fn parse(text: &str, file: &str, base: &Path) -> Result<Self, ConfigError> {
        let err = |field: &str, message: String| ConfigError { file: file.into(), field: field.into(), message };
        let mut raw: RawConfig = parse_toml(text, file)?;

        let resolve = |p: &Path| if p.is_absolute() { p.to_path_buf() } else { base.join(p) };
        let data_dir = resolve(&raw.data_dir);
        let compile_cache = raw.compile_cache.as_deref().map_or_else(|| data_dir.join("compiled"), resolve);
        let ledger = ledger_location(raw.ledger, raw.ledger_url_env, &data_dir, &resolve).map_err(|(f, m)| err(f, m))?;
        let ledger_cache_mib = ledger_cache(raw.ledger_cache_mib, &ledger).map_err(|m| err("ledger_cache_mib", m))?;
        let ledger_pool = ledger_pool(raw.ledger_pool, &ledger).map_err(|m| err("ledger_pool", m))?;
        let engine = raw.engine;
        if engine.pool_instances == 0 {
            return Err(err("engine.pool_instances", "must be at least 1".into()));
        }
        let host_limits = Limits::default().with(&raw.limits);
        check_limits(&host_limits, &engine).map_err(|(f, m)| err(&format!("limits.{f}"), m))?;

        let (mut policy, policy_source) = match (raw.policy, raw.policy_file) {
            (Some(_), Some(_)) => return Err(err("policy_file", "give the policy inline (`[policy]`) or in `policy_file`, not both".into())),
            (Some(p), None) => (Policy::from_raw(p, base).map_err(|(f, m)| err(&format!("policy.{f}"), m))?, file.to_string()),
            (None, Some(path)) => {
                let path = resolve(&path);
                let name = path.display().to_string();
                let text = std::fs::read_to_string(&path).map_err(|e| ConfigError {
                    file: name.clone(),
                    field: ".".into(),
                    message: format!("cannot read the policy file: {e}"),
                })?;
                let raw: RawPolicy = parse_toml(&text, &name)?;
                let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
                let policy = Policy::from_raw(raw, &dir).map_err(|(field, message)| ConfigError { file: name.clone(), field, message })?;
                (policy, name)
            }
            (None, None) => (Policy::default(), file.to_string()),
        };
        if let Some(stray) = policy.plugins.keys().find(|p| !raw.plugins.contains_key(*p)) {
            return Err(ConfigError {
                file: policy_source.clone(),
                field: format!("policy.plugins.{stray}"),
                message: format!("no plugin `{stray}` is configured under [plugins]"),
            });
        }

        let policy_require_signatures = policy.require_signatures;
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
                None if p.component.starts_with("oci://") => {
                    ComponentSource::Oci(crate::registry::OciRef::parse(&p.component).map_err(|m| err(&at("component"), m))?)
                }
                None => ComponentSource::File(resolve(Path::new(&p.component))),
            };
            let policy = policy.plugins.remove(&name).unwrap_or_default();
            check_provenance(&name, &component, &policy, policy_require_signatures).map_err(|(f, m)| ConfigError {
                file: policy_source.clone(),
                field: format!("policy.plugins.{name}.{f}"),
                message: m,
            })?;
            let limits = host_limits.with(&p.limits);
            check_limits(&limits, &engine).map_err(|(f, m)| err(&at(&format!("limits.{f}")), m))?;
            if !p.tool_prefix.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') || p.tool_prefix.len() > 32 {
                return Err(err(&at("tool_prefix"), "up to 32 of A-Z a-z 0-9 _ -".into()));
            }
            plugins.push(PluginConfig { name, component, limits, settings: p.config, tool_prefix: p.tool_prefix, policy });
        }
        if let Some(bad) = raw.mcp.allowed_origins.iter().find(|o| !mcp::valid_origin(o)) {
            return Err(err(
                "mcp.allowed_origins",
                format!("`{bad}` is not an origin: write `https://host`, `https://host:8443`, `http://localhost:*` or `null`"),
            ));
        }
        if raw.mcp.max_request_bytes < 1024 {
            return Err(err("mcp.max_request_bytes", "must be at least 1024".into()));
        }
        let counts = [
            ("mcp.max_sessions", raw.mcp.max_sessions),
            ("mcp.max_sessions_per_principal", raw.mcp.max_sessions_per_principal),
            ("mcp.max_calls_per_principal", raw.mcp.max_calls_per_principal),
            ("mcp.max_requests_per_principal", raw.mcp.max_requests_per_principal),
            ("mcp.max_tasks_per_principal", raw.mcp.max_tasks_per_principal),
            ("mcp.max_approval_requests_per_principal_hour", raw.mcp.max_approval_requests_per_principal_hour as usize),
            ("mcp.max_connections", raw.mcp.max_connections),
            ("mcp.task_poll_ms", raw.mcp.task_poll_ms as usize),
            ("mcp.task_ttl_ms", raw.mcp.task_ttl_ms as usize),
        ];
        for (field, n) in counts {
            if n == 0 {
                return Err(err(field, "must be at least 1".into()));
            }
        }
        if let Some(oauth) = raw.mcp.oauth.take() {
            raw.mcp.oauth = Some(oauth.checked(base).map_err(|(f, m)| err(&format!("mcp.oauth.{f}"), m))?);
            if !raw.mcp.all_tokens().is_empty() {
                return Err(err("mcp.oauth", "with [mcp.oauth] every client authenticates with the identity provider: remove [mcp] token_env and tokens (static tokens are for loopback and development)".into()));
            }
        }
        let tokens = raw.mcp.all_tokens();
        if let Some((principal, _)) = tokens.iter().find(|(p, _)| !valid_principal(p)) {
            return Err(err("mcp.tokens", format!("principal `{principal}`: use 1–64 of A-Z a-z 0-9 . _ -")));
        }
        let mut names: Vec<&str> = tokens.iter().map(|(p, _)| p.as_str()).collect();
        names.sort_unstable();
        if names.windows(2).any(|w| w[0] == w[1]) {
            return Err(err("mcp.tokens", "each principal may have one token".into()));
        }
        if let Some(r) = raw.retention {
            let minimum = Retention::minimum_hours(&policy.downstreams);
            if r.hours < minimum {
                return Err(err(
                    "retention.hours",
                    format!(
                        "{} is shorter than the longest downstream retention_hours plus {RETENTION_MARGIN_HOURS} (= {minimum}): a call \
                         pruned earlier could still be retried while its provider keeps the key",
                        r.hours
                    ),
                ));
            }
            if r.every_minutes == 0 {
                return Err(err("retention.every_minutes", "must be at least 1".into()));
            }
        }
        Ok(Self {
            data_dir,
            ledger,
            ledger_cache_mib,
            ledger_pool,
            compile_cache,
            engine,
            mcp: raw.mcp,
            downstreams: policy.downstreams,
            registries: policy.registries,
            require_signatures: policy.require_signatures,
            policy_source,
            plugins,
            retention: raw.retention,
        })
    }
}

/// Checks that what vouches for a component fits where it comes from:
/// `signed_by` only on a registry component; under `require_signatures`,
/// every registry component names its publishers and every file is pinned.
fn check_provenance(name: &str, component: &ComponentSource, policy: &PluginPolicy, require: bool) -> Result<(), (String, String)> {
    match component {
        ComponentSource::Oci(_) if require && !policy.asks_signature() => Err((
            "signed_by".into(),
            format!("`require_signatures` is on and plugin `{name}` comes from a registry: name its publisher, `signed_by = {{ key = \"publisher.pub\" }}`"),
        )),
        ComponentSource::File(_) | ComponentSource::Builtin(_) if policy.asks_signature() => {
            Err(("signed_by".into(), format!("plugin `{name}`'s component is not from a registry; pin a local file with `sha256`")))
        }
        ComponentSource::Oci(r) if r.digest.is_none() && policy.sha256.is_none() && !policy.asks_signature() => Err((
            "sha256".into(),
            format!(
                "plugin `{name}` comes from tag `{}`, which can move to other bytes: pin its component (`sha256`), name its publisher \
                 (`signed_by`), or reference it by digest (`{}@sha256:…`)",
                r.tag.as_deref().unwrap_or_default(),
                r.name()
            ),
        )),
        ComponentSource::File(_) if require && policy.sha256.is_none() => {
            Err(("sha256".into(), format!("`require_signatures` is on: a local file cannot be signed, so pin plugin `{name}`'s component with `sha256`")))
        }
        _ => Ok(()),
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

#[cfg(test)]
mod tests;
