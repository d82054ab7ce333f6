//! Outbound policy: the downstreams the host knows (how each takes keys,
//! its timeout, retries and retention) and each plugin's grants (which
//! downstream, which methods, which path prefix). Deny by default: a request
//! no grant covers is `denied` and nothing is sent.

use serde::Deserialize;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use url::Url;

/// Default per-try timeout of a downstream.
pub const DEFAULT_TIMEOUT_MS: u64 = 8_000;
/// Default retries after the first try (same key each time).
pub const DEFAULT_MAX_RETRIES: u32 = 3;
/// Default first backoff; doubled per retry, capped at [`MAX_BACKOFF`].
pub const DEFAULT_BACKOFF_MS: u64 = 100;
/// Longest wait between two tries.
pub const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// Default time the downstream keeps keys (Stripe: at least 24 h).
pub const DEFAULT_RETENTION_HOURS: u64 = 24;
/// Default time spent reconciling an unknown outcome before answering
/// (listings may lag writes).
pub const DEFAULT_RECONCILE_MS: u64 = 3_000;
/// The key header used when a downstream configures none.
pub const DEFAULT_KEY_HEADER: &str = "Idempotency-Key";

/// How a downstream expects the idempotency key.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "transport", rename_all = "kebab-case", deny_unknown_fields)]
pub enum KeyTransport {
    /// A header carrying the bare token (Stripe, Adyen): `Idempotency-Key: tg1_…`.
    Header {
        #[serde(default = "default_key_header")]
        name: String,
    },
    /// A header carrying an RFC 8941 sf-string (IETF draft): `Idempotency-Key: "tg1_…"`.
    SfString {
        #[serde(default = "default_key_header")]
        name: String,
    },
    /// A top-level field of a JSON object body (Square: `idempotency_key`).
    JsonField { name: String },
    /// A field of a form-encoded body (e.g. `metadata[toolguard_key]`).
    FormField { name: String },
}

fn default_key_header() -> String {
    DEFAULT_KEY_HEADER.into()
}

/// A downstream as written in the config (`[downstreams.NAME]`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDownstream {
    /// Scheme, host, optional port and optional base path: `https://api.stripe.com`.
    pub url: String,
    pub timeout_ms: Option<u64>,
    pub max_retries: Option<u32>,
    pub backoff_ms: Option<u64>,
    /// Whether the downstream deduplicates by key (default true).
    pub honours_keys: Option<bool>,
    pub retention_hours: Option<u64>,
    /// How long to keep reconciling an unknown outcome before answering.
    pub reconcile_ms: Option<u64>,
    /// How the key travels; default a bare `Idempotency-Key` header.
    pub key: Option<Vec<KeyTransport>>,
}

/// A downstream the host may send to.
#[derive(Debug, Clone)]
pub struct Downstream {
    /// Its configured name.
    pub name: String,
    /// Scheme, host, port and base path.
    pub origin: Url,
    /// Per-try timeout.
    pub timeout: Duration,
    /// Retries after the first try.
    pub max_retries: u32,
    /// First backoff between tries.
    pub backoff: Duration,
    /// Whether it deduplicates by key; if not, outcomes are written synced.
    pub honours_keys: bool,
    /// How long it keeps keys.
    pub retention: Duration,
    /// How long an unknown outcome is reconciled before the model is told.
    pub reconcile_window: Duration,
    /// Every way the key is attached to a request (at least one).
    pub keys: Vec<KeyTransport>,
}

impl Downstream {
    /// Checks a raw downstream; errors name the offending field.
    ///
    /// # Errors
    /// `(field, message)` for the first problem found.
    pub fn from_raw(name: &str, raw: RawDownstream) -> Result<Self, (String, String)> {
        let origin = Url::parse(&raw.url).map_err(|e| ("url".to_string(), format!("not a URL: {e}")))?;
        if !matches!(origin.scheme(), "http" | "https") || origin.host_str().is_none() {
            return Err(("url".into(), "expected an http or https URL with a host".into()));
        }
        if !origin.username().is_empty() || origin.password().is_some() || origin.query().is_some() {
            return Err(("url".into(), "no credentials or query in the URL; credentials are injected separately".into()));
        }
        let keys = raw.key.unwrap_or_else(|| vec![KeyTransport::Header { name: default_key_header() }]);
        if keys.is_empty() {
            return Err(("key".into(), "at least one key transport is needed".into()));
        }
        let timeout_ms = raw.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS);
        if timeout_ms == 0 {
            return Err(("timeout_ms".into(), "must be greater than 0".into()));
        }
        Ok(Self {
            name: name.into(),
            origin,
            timeout: Duration::from_millis(timeout_ms),
            max_retries: raw.max_retries.unwrap_or(DEFAULT_MAX_RETRIES),
            backoff: Duration::from_millis(raw.backoff_ms.unwrap_or(DEFAULT_BACKOFF_MS)),
            honours_keys: raw.honours_keys.unwrap_or(true),
            retention: Duration::from_secs(3600 * raw.retention_hours.unwrap_or(DEFAULT_RETENTION_HOURS)),
            reconcile_window: Duration::from_millis(raw.reconcile_ms.unwrap_or(DEFAULT_RECONCILE_MS)),
            keys,
        })
    }

    /// Header names that carry the key to this downstream, lower-case.
    pub fn key_headers(&self) -> impl Iterator<Item = String> + '_ {
        self.keys.iter().filter_map(|k| match k {
            KeyTransport::Header { name } | KeyTransport::SfString { name } => Some(name.to_ascii_lowercase()),
            _ => None,
        })
    }
}

/// One outbound grant of a plugin (`[[plugins.NAME.grants]]`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Grant {
    /// The downstream it opens.
    pub downstream: String,
    /// Allowed methods, upper-case (default `GET` and `HEAD`).
    #[serde(default = "read_methods")]
    pub methods: Vec<String>,
    /// Path prefix under the downstream's base path (default: all of it).
    #[serde(default)]
    pub path_prefix: String,
}

fn read_methods() -> Vec<String> {
    vec!["GET".into(), "HEAD".into()]
}

/// The downstreams by name.
pub type Downstreams = BTreeMap<String, Arc<Downstream>>;

/// Why a request may not go out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No grant covers it.
    Denied(String),
    /// It is malformed.
    Invalid(String),
}

/// Finds the downstream a grant opens for `method url`, returning it with
/// the parsed (normalised) URL to send to.
///
/// # Errors
/// [`Refusal::Invalid`] for a URL that does not parse or carries
/// credentials; [`Refusal::Denied`] when no grant covers the request.
pub fn authorize(grants: &[Grant], downstreams: &Downstreams, method: &str, url: &str) -> Result<(Arc<Downstream>, Url), Refusal> {
    let parsed = Url::parse(url).map_err(|e| Refusal::Invalid(format!("`{url}` is not an absolute URL: {e}")))?;
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(Refusal::Invalid("URLs may not carry credentials".into()));
    }
    let method = method.to_ascii_uppercase();
    for grant in grants {
        let Some(d) = downstreams.get(&grant.downstream) else { continue };
        let same_origin = parsed.scheme() == d.origin.scheme()
            && parsed.host_str() == d.origin.host_str()
            && parsed.port_or_known_default() == d.origin.port_or_known_default();
        let prefix = join_paths(d.origin.path(), &grant.path_prefix);
        if same_origin && path_within(parsed.path(), &prefix) && grant.methods.iter().any(|m| m.eq_ignore_ascii_case(&method)) {
            return Ok((d.clone(), parsed));
        }
    }
    Err(Refusal::Denied(format!("{method} {parsed}: no outbound grant of this plugin covers it; nothing was sent")))
}

/// `base` and `prefix` joined with exactly one slash between them.
fn join_paths(base: &str, prefix: &str) -> String {
    format!("{}/{}", base.trim_end_matches('/'), prefix.trim_start_matches('/'))
}

/// Whether `path` is `prefix` or lies below it (segment-wise).
fn path_within(path: &str, prefix: &str) -> bool {
    let prefix = prefix.trim_end_matches('/');
    prefix.is_empty() || path == prefix || path.strip_prefix(prefix).is_some_and(|rest| rest.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn downstreams() -> Downstreams {
        let raw = RawDownstream {
            url: "http://127.0.0.1:4242".into(),
            timeout_ms: None,
            max_retries: None,
            backoff_ms: None,
            honours_keys: None,
            retention_hours: None,
            reconcile_ms: None,
            key: None,
        };
        BTreeMap::from([("pay".to_string(), Arc::new(Downstream::from_raw("pay", raw).unwrap()))])
    }

    fn grant(methods: &[&str], prefix: &str) -> Grant {
        Grant { downstream: "pay".into(), methods: methods.iter().map(|m| m.to_string()).collect(), path_prefix: prefix.into() }
    }

    #[test]
    fn grants_match_origin_method_and_path_prefix_by_segment() {
        let g = [grant(&["POST"], "/v1/refunds")];
        let d = downstreams();
        assert!(authorize(&g, &d, "post", "http://127.0.0.1:4242/v1/refunds").is_ok());
        assert!(authorize(&g, &d, "POST", "http://127.0.0.1:4242/v1/refunds/re_1?x=1").is_ok());
        for (method, url) in [
            ("GET", "http://127.0.0.1:4242/v1/refunds"),
            ("POST", "http://127.0.0.1:4242/v1/refundsX"),
            ("POST", "http://127.0.0.1:4242/v1/charges"),
            ("POST", "http://127.0.0.1:4243/v1/refunds"),
            ("POST", "https://127.0.0.1:4242/v1/refunds"),
            ("POST", "http://localhost:4242/v1/refunds"),
            ("POST", "http://127.0.0.1:4242/v1/refunds/../charges"),
        ] {
            assert!(matches!(authorize(&g, &d, method, url), Err(Refusal::Denied(_))), "{method} {url}");
        }
        assert!(matches!(authorize(&g, &d, "POST", "/v1/refunds"), Err(Refusal::Invalid(_))));
        assert!(matches!(authorize(&g, &d, "POST", "http://u:p@127.0.0.1:4242/v1/refunds"), Err(Refusal::Invalid(_))));
        assert!(matches!(authorize(&[], &d, "GET", "http://127.0.0.1:4242/"), Err(Refusal::Denied(_))));
    }
}
