//! The reviewer's policy, and the one place outbound policy is enforced:
//! the downstreams the host knows (how each takes keys, its timeout, retries,
//! retention, and the credential the host injects), and per plugin its sha256
//! pin, the effect class of each tool, its outbound grants (downstream,
//! methods, path prefix) and its budgets. Deny by default: a request no grant
//! covers is `denied` and nothing is sent. The format is in `docs/policy.md`.

mod network;

pub use network::{TlsPolicy, is_loopback};

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use url::Url;

/// Default number of sends one tool call may make.
pub const DEFAULT_MAX_SENDS_PER_CALL: u32 = 8;

/// The side effect a tool has on the world.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Effect {
    /// Reads only: may fetch, may not send.
    ReadOnly,
    /// Repeating it with the same arguments leaves the world as one call would.
    Idempotent,
    /// Every execution is a new effect in the world (held while an identical one is unresolved).
    Irreversible,
}

impl Effect {
    /// The class the host enforces: the reviewer's if given; otherwise the
    /// plugin's claim may only restrict — `read-only` stays read-only, any
    /// other claim is treated as `irreversible`.
    pub fn effective(claimed: Self, reviewed: Option<Self>) -> Self {
        match (reviewed, claimed) {
            (Some(r), _) => r,
            (None, Self::ReadOnly) => Self::ReadOnly,
            (None, _) => Self::Irreversible,
        }
    }

    /// The kebab-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ReadOnly => "read-only",
            Self::Idempotent => "idempotent",
            Self::Irreversible => "irreversible",
        }
    }
}

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
/// Default largest request body a plugin may send to a downstream.
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 1 << 20;
/// The methods a grant may list: every real method a side effect or a read
/// uses. `TRACE` (which echoes the request, credential included, back to the
/// plugin) and `CONNECT` (a tunnel) never.
pub const GRANTABLE_METHODS: [&str; 7] = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"];

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
    /// A top-level field of a JSON object body (Square: `idempotency_key`).
    JsonField {
        /// The field's name.
        name: String,
    },
    /// A field of a form-encoded body (e.g. `metadata[toolguard_key]`).
    FormField {
        /// The field's name, as written in the form.
        name: String,
    },
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
    /// Per-try deadline (default 10 000 ms).
    pub timeout_ms: Option<u64>,
    /// Re-sends with the same key after a transport failure (default 2).
    pub max_retries: Option<u32>,
    /// Wait before the first re-send, doubling after (default 200 ms).
    pub backoff_ms: Option<u64>,
    /// Whether the downstream deduplicates by key (default true).
    pub honours_keys: Option<bool>,
    /// How long the downstream keeps an idempotency key (hours).
    pub retention_hours: Option<u64>,
    /// How long to keep reconciling an unknown outcome before answering.
    pub reconcile_ms: Option<u64>,
    /// How the key travels; default a bare `Idempotency-Key` header.
    pub key: Option<Vec<KeyTransport>>,
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
            if let KeyTransport::Header { name } | KeyTransport::SfString { name } = k
                && http::HeaderName::from_bytes(name.as_bytes()).is_err()
            {
                return Err((format!("key[{i}].name"), format!("`{name}` is not a valid HTTP header name")));
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

/// One outbound grant of a plugin (`[[policy.plugins.NAME.grants]]`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
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
    /// Whether paths this grant covers may carry what a downstream or a
    /// proxy could read as another path: encoded `/`, `\` or `%`, and `;`
    /// parameters (default false: refused). Only for downstreams whose ids
    /// need them, and that do not decode them into separators.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_encoded_path: bool,
}

fn read_methods() -> Vec<String> {
    vec!["GET".into(), "HEAD".into()]
}

/// The downstreams by name.
pub type Downstreams = BTreeMap<String, Arc<Downstream>>;

/// The reviewer's policy for one plugin. A plugin the policy does not name
/// gets the default: not reviewed, no pin, no grants, claims only restrict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginPolicy {
    /// Whether the policy names this plugin at all.
    pub reviewed: bool,
    /// Lower-case hex sha256 the component must have, if pinned.
    pub sha256: Option<String>,
    /// The effect class of each reviewed tool.
    pub tools: BTreeMap<String, Effect>,
    /// What it may reach through `outbound` (nothing by default).
    pub grants: Vec<Grant>,
    /// Sends one tool call may make.
    pub max_sends_per_call: u32,
    /// Calls of its irreversible tools one session may make per hour, if limited.
    pub max_irreversible_calls_per_session_hour: Option<u32>,
    /// Calls of its irreversible tools one authenticated principal (an MCP
    /// token) may make per hour, over all its sessions, if limited.
    pub max_irreversible_calls_per_principal_hour: Option<u32>,
    /// Interfaces (`wasi:filesystem`, or `wasi:filesystem/preopens`) it may
    /// not import even where the host links them inert, nor carry sealed.
    pub deny_imports: Vec<String>,
}

impl PluginPolicy {
    /// The entry of [`PluginPolicy::deny_imports`] that `import` (a name
    /// such as `wasi:filesystem/types@0.2.9`) falls under, if any.
    pub fn denies_import(&self, import: &str) -> Option<&str> {
        self.deny_imports.iter().find(|d| crate::imports::falls_under(import, d)).map(String::as_str)
    }
}

impl Default for PluginPolicy {
    fn default() -> Self {
        Self {
            reviewed: false,
            sha256: None,
            tools: BTreeMap::new(),
            grants: Vec::new(),
            max_sends_per_call: DEFAULT_MAX_SENDS_PER_CALL,
            max_irreversible_calls_per_session_hour: None,
            max_irreversible_calls_per_principal_hour: None,
            deny_imports: Vec::new(),
        }
    }
}

/// The reviewer's policy as written (`[policy]`, or a `policy_file`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPolicy {
    #[serde(default)]
    /// Downstreams by name, as written.
    pub downstreams: BTreeMap<String, RawDownstream>,
    #[serde(default)]
    /// Each plugin's policy, as written.
    pub plugins: BTreeMap<String, RawPluginPolicy>,
}

/// One plugin's policy as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPluginPolicy {
    /// The sha256 the reviewed component must have.
    pub sha256: Option<String>,
    #[serde(default)]
    /// The effect class granted to each tool.
    pub tools: BTreeMap<String, RawToolPolicy>,
    #[serde(default)]
    /// Where the plugin may reach.
    pub grants: Vec<Grant>,
    /// Most sends per tool call (default 8).
    pub max_sends_per_call: Option<u32>,
    /// Most irreversible calls per session per hour.
    pub max_irreversible_calls_per_session_hour: Option<u32>,
    /// Most irreversible calls per principal per hour.
    pub max_irreversible_calls_per_principal_hour: Option<u32>,
    #[serde(default)]
    /// Imports refused even though inert or sealed (packages or package/interface).
    pub deny_imports: Vec<String>,
}

/// One tool's policy as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawToolPolicy {
    /// The class the reviewer assigns.
    pub effect: Effect,
}

/// The checked policy.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    /// The downstreams, checked.
    pub downstreams: Downstreams,
    /// Each plugin's policy, checked.
    pub plugins: BTreeMap<String, PluginPolicy>,
}

impl Policy {
    /// Checks a written policy; file paths resolve against `base`.
    ///
    /// # Errors
    /// `(field, message)` for the first problem, the field relative to the policy's root.
    pub fn from_raw(raw: RawPolicy, base: &Path) -> Result<Self, (String, String)> {
        let mut downstreams = Downstreams::new();
        for (name, d) in raw.downstreams {
            let d = Downstream::from_raw(&name, d, base).map_err(|(f, m)| (format!("downstreams.{name}.{f}"), m))?;
            downstreams.insert(name, Arc::new(d));
        }
        let mut plugins = BTreeMap::new();
        for (name, p) in raw.plugins {
            let at = |f: &str| format!("plugins.{name}.{f}");
            if let Some(pin) = &p.sha256
                && (pin.len() != 64 || !pin.chars().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()))
            {
                return Err((at("sha256"), "expected 64 lower-case hex digits (the component's sha256)".into()));
            }
            for (i, g) in p.grants.iter().enumerate() {
                if !downstreams.contains_key(&g.downstream) {
                    let known = downstreams.keys().cloned().collect::<Vec<_>>().join(", ");
                    return Err((at(&format!("grants[{i}].downstream")), format!("no downstream `{}`; configured: {known}", g.downstream)));
                }
                if g.methods.is_empty() || g.methods.iter().any(|m| !GRANTABLE_METHODS.contains(&m.as_str())) {
                    let why = format!("list upper-case HTTP methods among {} (never TRACE or CONNECT)", GRANTABLE_METHODS.join(", "));
                    return Err((at(&format!("grants[{i}].methods")), why));
                }
            }
            for (i, d) in p.deny_imports.iter().enumerate() {
                let (package, interface) = d.split_once('/').unwrap_or((d.as_str(), "x"));
                let ok = |part: &str| !part.is_empty() && part.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
                let well_formed = package.split_once(':').is_some_and(|(ns, name)| ok(ns) && ok(name)) && ok(interface);
                if !well_formed {
                    return Err((at(&format!("deny_imports[{i}]")), "expected a package such as `wasi:filesystem` or an interface such as `wasi:filesystem/preopens`, without a version".into()));
                }
            }
            let policy = PluginPolicy {
                reviewed: true,
                sha256: p.sha256,
                tools: p.tools.into_iter().map(|(t, tp)| (t, tp.effect)).collect(),
                grants: p.grants,
                max_sends_per_call: p.max_sends_per_call.unwrap_or(DEFAULT_MAX_SENDS_PER_CALL),
                max_irreversible_calls_per_session_hour: p.max_irreversible_calls_per_session_hour,
                max_irreversible_calls_per_principal_hour: p.max_irreversible_calls_per_principal_hour,
                deny_imports: p.deny_imports,
            };
            plugins.insert(name, policy);
        }
        Ok(Self { downstreams, plugins })
    }
}

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
/// The URL is parsed as a browser would (WHATWG): `\` becomes `/`, and dot
/// segments — literal or percent-encoded — are resolved. The path is then
/// compared with the grant's prefix *decoded*, segment by segment. What
/// could still make a downstream or a proxy route the request elsewhere than
/// the path that was checked — an encoded `/` or `\`, an encoded `%` (a
/// second decoding), a `;` path parameter, an encoded control character —
/// is refused unless the grant opts in (`allow_encoded_path`).
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
    let ambiguous = ambiguous_path(parsed.path());
    let Some(path) = decoded_path(parsed.path()) else {
        return Err(Refusal::Invalid(format!("the path of `{parsed}` does not decode to UTF-8")));
    };
    // Dot segments were resolved by the parser; one that appears only once
    // decoded (from `%2F..`) could climb out of any prefix.
    if path.split('/').any(|segment| segment == "." || segment == "..") {
        return Err(Refusal::Denied(format!("{method} {parsed}: its decoded path has a `.` or `..` segment; nothing was sent")));
    }
    for grant in grants {
        let Some(d) = downstreams.get(&grant.downstream) else { continue };
        let same_origin = parsed.scheme() == d.origin.scheme()
            && parsed.host_str() == d.origin.host_str()
            && parsed.port_or_known_default() == d.origin.port_or_known_default();
        let prefix = decoded_path(&join_paths(d.origin.path(), &grant.path_prefix)).unwrap_or_default();
        if same_origin && path_within(&path, &prefix) && grant.methods.iter().any(|m| m.eq_ignore_ascii_case(&method)) {
            if let Some(what) = ambiguous.filter(|_| !grant.allow_encoded_path) {
                return Err(Refusal::Denied(format!(
                    "{method} {parsed}: the path contains {what}, which a downstream or proxy may read as another path than \
                     the one the grant was checked against; nothing was sent (a reviewer may allow it with \
                     `allow_encoded_path = true` on the grant)"
                )));
            }
            return Ok((d.clone(), parsed));
        }
    }
    Err(Refusal::Denied(format!("{method} {parsed}: no outbound grant of this plugin covers it; nothing was sent")))
}

/// What in a (parsed, still encoded) path could be read as another path.
fn ambiguous_path(path: &str) -> Option<&'static str> {
    let lower = path.to_ascii_lowercase();
    if lower.contains("%2f") {
        Some("an encoded `/` (%2F)")
    } else if lower.contains("%5c") {
        Some("an encoded `\\` (%5C)")
    } else if lower.contains("%25") {
        Some("an encoded `%` (%25), which a second decoding turns into something else")
    } else if path.contains(';') {
        Some("a `;` path parameter, which some servers and proxies strip")
    } else if (0..0x20u8).chain([0x7f]).any(|c| lower.contains(&format!("%{c:02x}"))) {
        Some("an encoded control character")
    } else {
        None
    }
}

/// `path` percent-decoded, if that is UTF-8.
fn decoded_path(path: &str) -> Option<String> {
    percent_encoding::percent_decode_str(path).decode_utf8().ok().map(|p| p.into_owned())
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
        let raw = RawDownstream { url: "http://127.0.0.1:4242".into(), ..RawDownstream::default() };
        BTreeMap::from([("pay".to_string(), Arc::new(Downstream::from_raw("pay", raw, Path::new(".")).unwrap()))])
    }

    fn grant(methods: &[&str], prefix: &str) -> Grant {
        Grant { downstream: "pay".into(), methods: methods.iter().map(|m| m.to_string()).collect(), path_prefix: prefix.into(), allow_encoded_path: false }
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

    #[test]
    fn paths_that_could_be_read_as_another_path_are_refused_unless_the_grant_allows_them() {
        let g = [grant(&["POST"], "/v1/refunds")];
        let d = downstreams();
        let base = "http://127.0.0.1:4242";
        for path in [
            "/v1/refunds/..%2Fcharges",
            "/v1/refunds/..%2fcharges",
            "/v1/refunds/..;/charges",
            "/v1/refunds;jsessionid=1/../charges",
            "/v1/refunds/%2e%2e/charges",
            "/v1/refunds/.%2E/charges",
            "/v1/refunds\\..\\charges",
            "/v1/refunds/..%5Ccharges",
            "/v1/refunds/%252e%252e/charges",
            "/v1/refunds/re_1%00",
            "/v1/refunds%2F..%2Fcharges",
        ] {
            let url = format!("{base}{path}");
            assert!(matches!(authorize(&g, &d, "POST", &url), Err(Refusal::Denied(_))), "{path}: {:?}", authorize(&g, &d, "POST", &url));
        }
        // Encodings that do not change the path's structure are compared decoded.
        assert!(authorize(&g, &d, "POST", &format!("{base}/v1/%72efunds/re_1")).is_ok());
        assert!(authorize(&g, &d, "POST", &format!("{base}/v1/refunds/re%20one")).is_ok());
        // A reviewer may let a grant carry encoded separators, never climb out of it.
        let open = [Grant { allow_encoded_path: true, ..grant(&["POST"], "/v1/refunds") }];
        assert!(authorize(&open, &d, "POST", &format!("{base}/v1/refunds/a%2Fb")).is_ok());
        assert!(matches!(authorize(&open, &d, "POST", &format!("{base}/v1/refunds/..%2Fcharges")), Err(Refusal::Denied(_))));
    }

    #[test]
    fn grants_list_real_methods_only_and_header_names_are_checked() {
        let policy = |methods: &str| {
            let text = format!(
                "[downstreams.pay]\nurl = \"http://127.0.0.1:1\"\n[[plugins.p.grants]]\ndownstream = \"pay\"\nmethods = {methods}\n"
            );
            Policy::from_raw(toml::from_str(&text).unwrap(), Path::new("."))
        };
        assert!(policy(r#"["POST", "GET"]"#).is_ok());
        for bad in [r#"["TRACE"]"#, r#"["CONNECT"]"#, r#"["post"]"#, r#"["FOO"]"#, "[]"] {
            let (field, message) = policy(bad).unwrap_err();
            assert_eq!(field, "plugins.p.grants[0].methods", "{bad}");
            assert!(message.contains("never TRACE or CONNECT"), "{message}");
        }
        let header = |name: &str| {
            let raw = RawDownstream { url: "http://127.0.0.1:1".into(), key: Some(vec![KeyTransport::Header { name: name.into() }]), ..RawDownstream::default() };
            Downstream::from_raw("d", raw, Path::new("."))
        };
        assert!(header("Idempotency-Key").is_ok());
        assert_eq!(header("Bad Header\r\n").unwrap_err().0, "key[0].name");
    }
}
