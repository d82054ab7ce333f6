//! `[mcp.oauth]`: `serve --http` as an OAuth 2.1 resource server — the
//! authorization servers it trusts, the resource URI tokens must be issued
//! for, the algorithms it accepts, which claims make the principal, and the
//! scopes each tool needs (`docs/mcp.md`, "Authorization").

use crate::policy::TlsPolicy;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Signature algorithms a resource server may accept: asymmetric only (no
/// `none`, no HMAC — a public key must never verify a MAC).
pub const ACCEPTABLE_ALGORITHMS: [&str; 9] = ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "EdDSA"];

/// `[mcp.oauth]` as written, and checked.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct OAuthConfig {
    /// This server's canonical resource URI (RFC 8707): a token's `aud` must name it.
    pub resource: String,
    /// The authorization servers whose tokens are accepted.
    pub issuers: Vec<IssuerConfig>,
    /// The accepted `alg`s (default RS256, PS256, ES256, EdDSA).
    #[serde(default = "default_algorithms")]
    pub algorithms: Vec<String>,
    /// Clock leeway for `exp` and `nbf`, seconds (default 30).
    #[serde(default = "default_leeway")]
    pub leeway_seconds: u64,
    /// The claim naming the principal: `sub` (default) or `client_id`.
    #[serde(default = "default_principal_claim")]
    pub principal_claim: String,
    /// A claim naming the tenant (e.g. `tid`): the principal is then `TENANT.SUBJECT`.
    pub tenant_claim: Option<String>,
    /// How long keys fetched from an authorization server are trusted
    /// without fetching them again, seconds (default 3600): when the server
    /// cannot be reached past that, every request is refused.
    #[serde(default = "default_keys_max_age")]
    pub keys_max_age_seconds: u64,
    /// The fewest seconds between two fetches of an issuer's keys prompted by
    /// an unknown `kid` (default 30): forged `kid`s cannot make the host hammer it.
    #[serde(default = "default_refetch")]
    pub refetch_min_seconds: u64,
    /// The scopes calls need.
    #[serde(default)]
    pub scopes: ScopeRules,
}

/// One trusted authorization server.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct IssuerConfig {
    /// Its issuer identifier: a token's `iss`, and where its metadata is discovered (RFC 8414).
    pub issuer: String,
    /// Its JWKS URL, if not discovered from its metadata.
    pub jwks_uri: Option<String>,
    /// Its keys as a JWKS file, instead of fetching them.
    pub jwks_file: Option<PathBuf>,
    /// TLS to it, as for a downstream.
    pub tls: Option<TlsPolicy>,
    /// Prepended to its principals (`PREFIX.NAME`), to keep two issuers' subjects apart.
    pub principal_prefix: Option<String>,
}

/// Which scopes a tool call needs: every one that applies.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ScopeRules {
    /// Needed for any request at all.
    pub any: Option<String>,
    /// By tool name (as served).
    #[serde(default)]
    pub tools: BTreeMap<String, String>,
    /// By plugin name.
    #[serde(default)]
    pub plugins: BTreeMap<String, String>,
    /// By effect class (`read-only`, `idempotent`, `irreversible`).
    #[serde(default)]
    pub effects: BTreeMap<String, String>,
}

impl ScopeRules {
    /// The scopes a call of `tool` (of `plugin`, enforced as `effect`) needs, sorted, `any` included.
    pub fn needed(&self, tool: &str, plugin: &str, effect: &str) -> Vec<String> {
        let mut needed: Vec<String> =
            [self.any.as_ref(), self.tools.get(tool), self.plugins.get(plugin), self.effects.get(effect)].into_iter().flatten().cloned().collect();
        needed.sort();
        needed.dedup();
        needed
    }
}

fn default_algorithms() -> Vec<String> {
    ["RS256", "PS256", "ES256", "EdDSA"].map(String::from).to_vec()
}
fn default_leeway() -> u64 {
    30
}
fn default_principal_claim() -> String {
    "sub".into()
}
fn default_keys_max_age() -> u64 {
    3600
}
fn default_refetch() -> u64 {
    30
}

impl OAuthConfig {
    /// Checks it, resolving file paths against `base`.
    ///
    /// # Errors
    /// `(field under [mcp.oauth], message)` for the first problem.
    pub fn checked(mut self, base: &Path) -> Result<Self, (String, String)> {
        let resource = url::Url::parse(&self.resource).map_err(|e| ("resource".to_string(), format!("not a URL: {e}")))?;
        if resource.fragment().is_some() || !matches!(resource.scheme(), "https" | "http") {
            return Err(("resource".into(), "an http(s) URI without a fragment: the URI clients reach this server at (RFC 8707)".into()));
        }
        if self.issuers.is_empty() {
            return Err(("issuers".into(), "name at least one authorization server: [[mcp.oauth.issuers]] issuer = \"https://…\"".into()));
        }
        if self.algorithms.is_empty() {
            return Err(("algorithms".into(), "name at least one".into()));
        }
        if let Some(bad) = self.algorithms.iter().find(|a| !ACCEPTABLE_ALGORITHMS.contains(&a.as_str())) {
            return Err(("algorithms".into(), format!("`{bad}` is not accepted: use {} (never `none`, never HMAC)", ACCEPTABLE_ALGORITHMS.join(", "))));
        }
        if !matches!(self.principal_claim.as_str(), "sub" | "client_id") {
            return Err(("principal_claim".into(), "`sub` or `client_id`".into()));
        }
        if self.keys_max_age_seconds == 0 {
            return Err(("keys_max_age_seconds".into(), "must be at least 1".into()));
        }
        for (i, issuer) in self.issuers.iter_mut().enumerate() {
            let at = |f: &str| format!("issuers[{i}].{f}");
            let url = url::Url::parse(&issuer.issuer).map_err(|e| (at("issuer"), format!("not a URL: {e}")))?;
            let loopback = crate::policy::is_loopback(&url);
            if url.scheme() != "https" && !(url.scheme() == "http" && loopback) {
                return Err((at("issuer"), "an https:// URL (http:// only on loopback)".into()));
            }
            if issuer.jwks_uri.is_some() && issuer.jwks_file.is_some() {
                return Err((at("jwks_file"), "give `jwks_uri` or `jwks_file`, not both".into()));
            }
            issuer.jwks_file = issuer.jwks_file.take().map(|f| if f.is_absolute() { f } else { base.join(f) });
            if let Some(tls) = issuer.tls.take() {
                issuer.tls = Some(tls.checked(&url, base).map_err(|(f, m)| (at(&f), m))?);
            }
            if let Some(prefix) = &issuer.principal_prefix
                && (prefix.is_empty() || prefix.len() > 16 || !prefix.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'))
            {
                return Err((at("principal_prefix"), "1–16 of A-Z a-z 0-9 -".into()));
            }
        }
        if let Some(bad) = self.scopes.effects.keys().find(|k| !matches!(k.as_str(), "read-only" | "idempotent" | "irreversible")) {
            return Err((format!("scopes.effects.{bad}"), "an effect class: `read-only`, `idempotent` or `irreversible`".into()));
        }
        let all = self.scopes.any.iter().chain(self.scopes.tools.values()).chain(self.scopes.plugins.values()).chain(self.scopes.effects.values());
        if let Some(bad) = all.into_iter().find(|s| s.is_empty() || !s.chars().all(|c| c.is_ascii_graphic() && c != '"' && c != '\\')) {
            return Err(("scopes".into(), format!("`{bad}` is not a scope token (RFC 6749: printable ASCII, no spaces, quotes or backslashes)")));
        }
        Ok(self)
    }

    /// Every scope the rules name, sorted, once each (the metadata's `scopes_supported`).
    pub fn scopes_supported(&self) -> Vec<String> {
        let s = &self.scopes;
        let mut all: Vec<String> = s.any.iter().chain(s.tools.values()).chain(s.plugins.values()).chain(s.effects.values()).cloned().collect();
        all.sort();
        all.dedup();
        all
    }
}
