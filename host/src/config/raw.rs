//! `toolguard.toml` as written, before it is checked: the raw TOML shape,
//! and parse errors with the dotted path of the offending field.

use super::{ConfigError, EngineConfig, LimitOverrides, McpConfig, Retention};
use crate::policy::RawPolicy;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    #[serde(default = "default_data_dir")]
    pub(super) data_dir: PathBuf,
    pub(super) ledger: Option<String>,
    pub(super) ledger_url_env: Option<String>,
    pub(super) ledger_cache_mib: Option<u64>,
    pub(super) ledger_pool: Option<u32>,
    pub(super) compile_cache: Option<PathBuf>,
    #[serde(default)]
    pub(super) engine: EngineConfig,
    #[serde(default)]
    pub(super) limits: LimitOverrides,
    #[serde(default)]
    pub(super) plugins: BTreeMap<String, RawPlugin>,
    pub(super) policy: Option<RawPolicy>,
    pub(super) policy_file: Option<PathBuf>,
    #[serde(default)]
    pub(super) mcp: McpConfig,
    pub(super) retention: Option<Retention>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPlugin {
    pub(super) component: String,
    #[serde(default)]
    pub(super) limits: LimitOverrides,
    #[serde(default)]
    pub(super) config: BTreeMap<String, String>,
    #[serde(default)]
    pub(super) tool_prefix: String,
}

/// Deserialises `text` (named `file` in errors), naming the offending field.
pub(super) fn parse_toml<T: serde::de::DeserializeOwned>(text: &str, file: &str) -> Result<T, ConfigError> {
    let err = |field: String, message: String| ConfigError { file: file.into(), field, message };
    let de = toml::Deserializer::parse(text).map_err(|e| err(".".into(), describe_toml_error(text, &e)))?;
    serde_path_to_error::deserialize(de).map_err(|e| {
        let field = e.path().to_string();
        err(field, describe_toml_error(text, e.inner()))
    })
}

/// A TOML error as one line, with the line and column it points at.
pub(super) fn describe_toml_error(text: &str, e: &toml::de::Error) -> String {
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

fn default_data_dir() -> PathBuf {
    PathBuf::from(".toolguard")
}
