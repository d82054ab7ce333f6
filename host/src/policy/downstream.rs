//! Downstreams: the providers the host may send to — where each is, how it
//! takes the idempotency key, its timeouts, retries, key retention and
//! reconcile window, and the credential the host injects (read once, never
//! shown to a plugin).

use super::network;
use crate::net::TlsPolicy;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use url::Url;

/// Default per-try timeout of a downstream.
pub const DEFAULT_TIMEOUT_MS: u64 = crate::net::deadlines::DOWNSTREAM_TRY_MS;
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
/// Default largest request body a plugin may send to a downstream.
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 1 << 20;

/// How a downstream expects the idempotency key.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "transport", rename_all = "kebab-case", deny_unknown_fields)]
pub enum KeyTransport {
    /// A header carrying the bare token (Stripe, Adyen): `Idempotency-Key: tg1_…`.
    Header {
        /// The header's name (default `Idempotency-Key`).
        #[serde(default = "default_key_header")]
        name: String,
    },
    /// A header carrying an RFC 8941 sf-string (IETF draft): `Idempotency-Key: "tg1_…"`.
    SfString {
        /// The header's name (default `Idempotency-Key`).
        #[serde(default = "default_key_header")]
        name: String,
    },
    /// A field of a JSON object body: top-level (Square: `idempotency_key`),
    /// or nested, named by a JSON Pointer (`/options/idempotency_key`; the
    /// objects on its way are made where missing).
    JsonField {
        /// The field's name, or a JSON Pointer starting with `/`.
        name: String,
    },
    /// A field of a form-encoded body (e.g. `metadata[toolguard_key]`).
    FormField {
        /// The field's name, as written in the form.
        name: String,
    },
    /// A query parameter appended to the URL (`?idempotency_key=tg1_…`),
    /// for providers that take the key there.
    Query {
        /// The parameter's name.
        name: String,
    },
}

impl KeyTransport {
    /// Where it puts the key, as the policy names it: `header Idempotency-Key`.
    pub fn describe(&self) -> String {
        match self {
            Self::Header { name } => format!("header {name}"),
            Self::SfString { name } => format!("sf-string {name}"),
            Self::FormField { name } => format!("form-field {name}"),
            Self::JsonField { name } => format!("json-field {name}"),
            Self::Query { name } => format!("query {name}"),
        }
    }
}

fn default_key_header() -> String {
    DEFAULT_KEY_HEADER.into()
}

/// A downstream as written in the config (`[policy.downstreams.NAME]`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDownstream {
    /// Scheme, host, optional port and optional base path: `https://api.stripe.com`.
    pub url: String,
    /// Per-try deadline (default [`DEFAULT_TIMEOUT_MS`]).
    pub timeout_ms: Option<u64>,
    /// Re-sends with the same key after a retryable try (default [`DEFAULT_MAX_RETRIES`]).
    pub max_retries: Option<u32>,
    /// Wait before the first re-send, doubling after (default [`DEFAULT_BACKOFF_MS`]).
    pub backoff_ms: Option<u64>,
    /// Whether the downstream deduplicates by key (default true); only one
    /// that does can answer "a request with this key is in flight" (409).
    pub honours_keys: Option<bool>,
    /// How long the downstream keeps an idempotency key (hours).
    pub retention_hours: Option<u64>,
    /// How long to keep reconciling an unknown outcome before answering.
    pub reconcile_ms: Option<u64>,
    /// How the key travels; default a bare `Idempotency-Key` header.
    pub key: Option<Vec<KeyTransport>>,
    /// How the key is written (default `toolguard`: `tg1_…`; `uuid` for
    /// providers that take only UUIDs; `hex`, the 32 digits alone).
    pub key_format: Option<crate::keys::KeyFormat>,
    /// A credential the host adds to every request to this downstream.
    pub credential: Option<CredentialSpec>,
    /// Largest request body a plugin may send here (default 1 MiB).
    pub max_request_bytes: Option<usize>,
    /// TLS as the reviewer sets it (default: the platform's roots, TLS 1.2+).
    pub tls: Option<TlsPolicy>,
    /// An HTTP CONNECT proxy to reach it through (never from the environment).
    pub proxy: Option<String>,
    /// Allow a plain `http://` URL beyond loopback (default false).
    pub insecure_http: Option<bool>,
}

/// Where a credential comes from and how it is sent. Its value is read when
/// the host starts, never written anywhere, and never visible to a plugin.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CredentialSpec {
    /// The header carrying it (default `Authorization`).
    #[serde(default = "default_credential_header")]
    pub header: String,
    /// Text before the secret in the header value, e.g. `"Bearer "`.
    #[serde(default)]
    pub prefix: String,
    /// An environment variable of the host holding the secret.
    pub env: Option<String>,
    /// A file holding the secret (trailing newline ignored); relative to the config.
    pub file: Option<PathBuf>,
}

fn default_credential_header() -> String {
    "Authorization".into()
}

impl CredentialSpec {
    /// Where the secret comes from, for reports (never the value).
    pub fn source(&self) -> String {
        match (&self.env, &self.file) {
            (Some(var), _) => format!("env:{var}"),
            (None, Some(path)) => format!("file:{}", path.display()),
            (None, None) => "nowhere".into(),
        }
    }

    /// Reads the secret now.
    ///
    /// # Errors
    /// The variable is unset or empty, or the file cannot be read.
    pub fn resolve(&self) -> Result<Secret, String> {
        let raw = match (&self.env, &self.file) {
            (Some(var), _) => std::env::var(var).map_err(|_| format!("environment variable `{var}` is not set"))?,
            (None, Some(path)) => std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?,
            (None, None) => return Err("no `env` or `file` given".into()),
        };
        let secret = raw.trim_end_matches(['\n', '\r']);
        if secret.is_empty() {
            return Err(format!("the credential from {} is empty", self.source()));
        }
        Ok(Secret(format!("{}{secret}", self.prefix).into()))
    }
}

/// A secret header value. Its `Debug` shows nothing.
#[derive(Clone)]
pub struct Secret(Arc<str>);

impl Secret {
    /// The value, for the one place that puts it on the wire.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(…)")
    }
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
    /// How the keys of its attempts are written.
    pub key_format: crate::keys::KeyFormat,
    /// The credential the host injects, if any.
    pub credential: Option<CredentialSpec>,
    /// Its value, once the host has read it (`Guard::new`).
    pub secret: Option<Secret>,
    /// Largest request body a plugin may send here, in bytes.
    pub max_request_bytes: usize,
    /// How TLS to it is set up.
    pub tls: TlsPolicy,
    /// The proxy requests to it go through, if any.
    pub proxy: Option<Url>,
    /// Whether the reviewer allowed plain HTTP beyond loopback.
    pub insecure_http: bool,
}

impl Downstream {
    /// Checks a raw downstream; errors name the offending field.
    ///
    /// # Errors
    /// `(field, message)` for the first problem found.
    pub fn from_raw(name: &str, raw: RawDownstream, base: &Path) -> Result<Self, (String, String)> {
        let origin = Url::parse(&raw.url).map_err(|e| ("url".to_string(), format!("not a URL: {e}")))?;
        if !matches!(origin.scheme(), "http" | "https") || origin.host_str().is_none() {
            return Err(("url".into(), "expected an http or https URL with a host".into()));
        }
        if !origin.username().is_empty() || origin.password().is_some() || origin.query().is_some() {
            return Err(("url".into(), "no credentials or query in the URL; credentials are injected separately".into()));
        }
        let insecure_http = raw.insecure_http.unwrap_or(false);
        let proxy = network::checked_route(&origin, raw.proxy.as_deref(), insecure_http)?;
        let tls = raw.tls.unwrap_or_default().checked(&origin, base)?;
        let keys = raw.key.unwrap_or_else(|| vec![KeyTransport::Header { name: default_key_header() }]);
        if keys.is_empty() {
            return Err(("key".into(), "at least one key transport is needed".into()));
        }
        let credential = match raw.credential {
            Some(c) if c.env.is_some() == c.file.is_some() => {
                return Err(("credential".into(), "give exactly one of `env` or `file`".into()));
            }
            Some(c) if c.header.trim().is_empty() => return Err(("credential.header".into(), "must not be empty".into())),
            Some(c) if http::HeaderName::from_bytes(c.header.as_bytes()).is_err() => {
                return Err(("credential.header".into(), format!("`{}` is not a valid HTTP header name", c.header)));
            }
            Some(mut c) => {
                c.file = c.file.map(|f| if f.is_absolute() { f } else { base.join(f) });
                Some(c)
            }
            None => None,
        };
        for (i, k) in keys.iter().enumerate() {
            match k {
                KeyTransport::Header { name } | KeyTransport::SfString { name } if http::HeaderName::from_bytes(name.as_bytes()).is_err() => {
                    return Err((format!("key[{i}].name"), format!("`{name}` is not a valid HTTP header name")));
                }
                KeyTransport::FormField { name } | KeyTransport::JsonField { name } | KeyTransport::Query { name } if name.is_empty() => {
                    return Err((format!("key[{i}].name"), "must not be empty".into()));
                }
                _ => {}
            }
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
            key_format: raw.key_format.unwrap_or_default(),
            credential,
            secret: None,
            max_request_bytes: raw.max_request_bytes.unwrap_or(DEFAULT_MAX_REQUEST_BYTES),
            tls,
            proxy,
            insecure_http,
        })
    }

    /// Header names only the host sets on requests to this downstream (the
    /// key headers and the credential's), lower-case.
    pub fn host_headers(&self) -> impl Iterator<Item = String> + '_ {
        let keys = self.keys.iter().filter_map(|k| match k {
            KeyTransport::Header { name } | KeyTransport::SfString { name } => Some(name.to_ascii_lowercase()),
            _ => None,
        });
        keys.chain(self.credential.iter().map(|c| c.header.to_ascii_lowercase()))
    }
}

/// The downstreams by name.
pub type Downstreams = BTreeMap<String, Arc<Downstream>>;
