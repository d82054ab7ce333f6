//! The reviewer's word on registries and publishers: how the host reaches
//! each registry (`[policy.registries."HOST[:PORT]"]`: TLS as for
//! downstreams, plain HTTP only on loopback, the platform's credentials),
//! which publishers may sign a plugin's component (`signed_by`), and whether
//! every component from a registry must be signed (`require_signatures`).

use super::TlsPolicy;
use crate::registry::keyless::Identity;
use crate::registry::publishers::PublisherKey;
use crate::registry::trusted_root::TrustedRoot;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// `[policy.registries."HOST[:PORT]"]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRegistry {
    /// Plain HTTP (loopback registries only).
    #[serde(default)]
    pub plain_http: bool,
    /// TLS settings, as for a downstream.
    pub tls: Option<TlsPolicy>,
    /// A docker-style `config.json` holding this registry's credentials.
    pub docker_config: Option<PathBuf>,
    /// The environment variable holding the user name…
    pub username_env: Option<String>,
    /// … and the one holding the password or token.
    pub password_env: Option<String>,
    /// The largest component pulled from it, in MiB (default 256).
    pub max_component_mb: Option<u64>,
    /// How long one exchange with it may take in all, in seconds (default
    /// 10; a blob one more second per 256 KiB).
    pub timeout_seconds: Option<u64>,
}

/// Where a registry's credentials come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegistryCredentials {
    /// None: anonymous pulls.
    Anonymous,
    /// A docker-style `config.json`.
    DockerConfig(PathBuf),
    /// Two environment variables: user name, password.
    Env(String, String),
}

/// How the host reaches one registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registry {
    /// `host[:port]`.
    pub host: String,
    /// Plain HTTP (only on loopback).
    pub plain_http: bool,
    /// TLS settings (HTTPS only).
    pub tls: TlsPolicy,
    /// Its credentials.
    pub credentials: RegistryCredentials,
    /// The largest component pulled from it.
    pub max_component_bytes: u64,
    /// How long one exchange with it may take in all ([`crate::net::deadlines::REGISTRY`]).
    pub timeout: std::time::Duration,
}

/// Registries by `host[:port]`.
pub type Registries = BTreeMap<String, Arc<Registry>>;

impl Registry {
    /// The settings of a registry the policy does not name: HTTPS with the
    /// platform's roots, anonymous.
    pub fn default_for(host: &str) -> Self {
        Self {
            host: host.into(),
            plain_http: false,
            tls: TlsPolicy::default(),
            credentials: RegistryCredentials::Anonymous,
            max_component_bytes: crate::registry::DEFAULT_MAX_COMPONENT_BYTES,
            timeout: crate::net::deadlines::REGISTRY,
        }
    }

    /// Checks a written entry, resolving paths against `base`.
    ///
    /// # Errors
    /// `(field, message)` for the first problem, the field under the entry.
    pub fn from_raw(host: &str, raw: RawRegistry, base: &Path) -> Result<Self, (String, String)> {
        let scheme = if raw.plain_http { "http" } else { "https" };
        let origin = url::Url::parse(&format!("{scheme}://{host}/")).map_err(|e| (".".to_string(), format!("`{host}` is not host[:port]: {e}")))?;
        if raw.plain_http && !super::is_loopback(&origin) {
            return Err(("plain_http".into(), format!("plain HTTP only to a loopback registry; `{host}` is not loopback: use HTTPS")));
        }
        let tls = raw.tls.unwrap_or_default().checked(&origin, base)?;
        let resolve = |p: PathBuf| if p.is_absolute() { p } else { base.join(p) };
        let credentials = match (raw.docker_config, raw.username_env, raw.password_env) {
            (None, None, None) => RegistryCredentials::Anonymous,
            (Some(path), None, None) => RegistryCredentials::DockerConfig(resolve(path)),
            (None, Some(u), Some(p)) => RegistryCredentials::Env(u, p),
            (Some(_), _, _) => {
                return Err(("docker_config".into(), "give credentials in `docker_config` or in `username_env` and `password_env`, not both".into()));
            }
            _ => return Err(("username_env".into(), "give both `username_env` and `password_env`".into())),
        };
        let max_component_bytes = match raw.max_component_mb {
            None => crate::registry::DEFAULT_MAX_COMPONENT_BYTES,
            Some(0) => return Err(("max_component_mb".into(), "must be at least 1".into())),
            Some(mb) => mb << 20,
        };
        let timeout = match raw.timeout_seconds {
            None => crate::net::deadlines::REGISTRY,
            Some(0) => return Err(("timeout_seconds".into(), "must be at least 1".into())),
            Some(s) => std::time::Duration::from_secs(s.min(3_600)),
        };
        Ok(Self { host: host.to_ascii_lowercase(), plain_http: raw.plain_http, tls, credentials, max_component_bytes, timeout })
    }
}

/// One publisher in `signed_by`, as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSigner {
    /// The publisher's public key (PEM).
    pub key: Option<PathBuf>,
    /// A keyless identity's OIDC issuer.
    pub issuer: Option<String>,
    /// A keyless identity's subject (an email, or a workflow URI).
    pub subject: Option<String>,
}

/// `signed_by`: one publisher or a list.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum RawSignedBy {
    /// `signed_by = { key = "…" }`
    One(RawSigner),
    /// `signed_by = [{ key = "…" }, …]`
    Many(Vec<RawSigner>),
}

/// Reads the publishers of `signed_by`: keys (paths resolved against
/// `base`) and keyless identities (checked against `root`, the policy's
/// `trusted_root`).
///
/// # Errors
/// `(field, message)`: a key cannot be read, an identity is incomplete, or
/// there is no trusted root to check an identity against.
pub fn publishers(raw: RawSignedBy, base: &Path, root: Option<&Arc<TrustedRoot>>) -> Result<(Vec<PublisherKey>, Vec<Identity>), (String, String)> {
    let signers = match raw {
        RawSignedBy::One(s) => vec![s],
        RawSignedBy::Many(list) => list,
    };
    if signers.is_empty() {
        return Err(("signed_by".into(), "name at least one publisher, or leave `signed_by` out".into()));
    }
    let (mut keys, mut identities) = (Vec::new(), Vec::new());
    for (i, s) in signers.into_iter().enumerate() {
        let field = format!("signed_by[{i}]");
        match (s.key, s.issuer, s.subject) {
            (Some(path), None, None) => {
                let label = path.display().to_string();
                let path = if path.is_absolute() { path } else { base.join(path) };
                let pem = std::fs::read(&path).map_err(|e| (format!("{field}.key"), format!("cannot read {}: {e}", path.display())))?;
                keys.push(PublisherKey::from_pem(&label, &pem).map_err(|m| (format!("{field}.key"), m))?);
            }
            (None, Some(issuer), Some(subject)) => {
                let Some(root) = root else {
                    return Err((
                        field,
                        "a keyless identity is checked against a sigstore trusted root: set [policy] trusted_root = \"trusted_root.json\"".into(),
                    ));
                };
                if issuer.is_empty() || subject.is_empty() {
                    return Err((field, "give the exact OIDC issuer and subject (an email, or a workflow URI)".into()));
                }
                identities.push(Identity { issuer, subject, root: root.clone() });
            }
            (Some(_), _, _) => return Err((field, "a key or a keyless identity, not both".into())),
            _ => {
                return Err((
                    field,
                    "name a publisher key, `{ key = \"publisher.pub\" }`, or a keyless identity, `{ issuer = \"https://…\", subject = \"…\" }`".into(),
                ));
            }
        }
    }
    Ok((keys, identities))
}

/// Reads the sigstore trusted root at `path` (relative to `base`).
///
/// # Errors
/// It cannot be read, or is not a trusted root.
pub fn trusted_root(path: &Path, base: &Path) -> Result<TrustedRoot, String> {
    let full = if path.is_absolute() { path.to_path_buf() } else { base.join(path) };
    let json = std::fs::read(&full).map_err(|e| format!("cannot read {}: {e}", full.display()))?;
    TrustedRoot::parse(&path.display().to_string(), &json)
}
