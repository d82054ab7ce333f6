//! `serve --http` as an OAuth 2.1 resource server (`[mcp.oauth]`): it
//! publishes its protected-resource metadata (RFC 9728), accepts only
//! access tokens its authorization servers issued for *it* (issuer,
//! audience = its resource URI, expiry, signature by the issuer's current
//! keys, an allowed asymmetric algorithm), derives the principal from the
//! token's claims, and answers a missing scope with 403 `insufficient_scope`
//! naming it. The token itself is never logged, stored or passed on.

mod crypto;
pub mod gate;
mod jwks;
pub mod metadata;
pub mod scopes;

use crate::config::OAuthConfig;
use jsonwebtoken::Validation;
use jwks::{IssuerKeys, Lookup};
use serde::Deserialize;
use std::collections::BTreeSet;

/// Who a valid token speaks for, and what it may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authenticated {
    /// The principal (namespaces sessions, keys, budgets, the ledger).
    pub principal: String,
    /// The scopes the token grants.
    pub scopes: BTreeSet<String>,
    /// The tenant its token names (`tenant_claim`), qualified by the
    /// issuer's principal prefix so two issuers' tenants never meet.
    pub tenant: Option<String>,
}

/// Why a request is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No bearer token.
    Missing,
    /// A token this server does not accept, and why (for `error_description`).
    Invalid(String),
    /// The authorization server's keys are not available: refused, never accepted.
    Unavailable(String),
    /// The token lacks scopes the request needs: these.
    InsufficientScope(Vec<String>),
}

/// The claims read from a token (all others are ignored, never kept).
#[derive(Deserialize)]
struct Claims {
    iss: Option<String>,
    sub: Option<String>,
    client_id: Option<String>,
    scope: Option<String>,
    scp: Option<serde_json::Value>,
    roles: Option<Vec<String>>,
    #[serde(flatten)]
    other: serde_json::Map<String, serde_json::Value>,
}

/// Checks bearer tokens against `[mcp.oauth]`.
pub struct Authenticator {
    /// The configuration.
    pub config: OAuthConfig,
    issuers: Vec<IssuerKeys>,
}

impl Authenticator {
    /// An authenticator for `config` (keys are fetched on first use).
    ///
    /// # Errors
    /// An issuer's TLS settings cannot be used.
    pub fn new(config: &OAuthConfig) -> Result<Self, String> {
        crypto::install();
        let issuers = config.issuers.iter().map(|i| IssuerKeys::new(i, config)).collect::<Result<Vec<_>, _>>()?;
        Ok(Self { config: config.clone(), issuers })
    }

    /// The principal and scopes of the request's `Authorization` header value.
    ///
    /// # Errors
    /// Why the token is not accepted.
    pub async fn authenticate(&self, authorization: Option<&str>) -> Result<Authenticated, Refusal> {
        let token = authorization
            .and_then(|h| h.split_once(' ').filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer")).map(|(_, t)| t.trim()))
            .filter(|t| !t.is_empty())
            .ok_or(Refusal::Missing)?;
        let invalid = |why: &str| Refusal::Invalid(why.to_string());
        // The algorithm first, read as written: `none` and HMAC never reach a key.
        let alg = alg_of(token).ok_or_else(|| invalid("not a signed JWT"))?;
        if !self.config.algorithms.contains(&alg) {
            return Err(Refusal::Invalid(format!("it is signed with `{alg}`, which this server does not accept")));
        }
        let header = jsonwebtoken::decode_header(token).map_err(|_| invalid("not a signed JWT"))?;
        // The issuer picks whose keys to check with; it is verified with the signature below.
        let unverified = jsonwebtoken::dangerous::insecure_decode::<Claims>(token).map_err(|_| invalid("its claims are not readable"))?;
        let iss = unverified.claims.iss.ok_or_else(|| invalid("it names no issuer"))?;
        let issuer = self.issuers.iter().find(|i| i.issuer == iss).ok_or_else(|| invalid("its issuer is not one this server trusts"))?;
        let key = match issuer.lookup(header.kid.as_deref(), header.alg).await {
            Lookup::Found(key) => key,
            Lookup::UnknownKey => return Err(invalid("it is signed with a key its issuer does not publish")),
            Lookup::Unavailable(why) => return Err(Refusal::Unavailable(why)),
        };
        // Only the header's algorithm, checked against the allowlist above (jsonwebtoken wants
        // every listed algorithm to fit the key's family).
        let mut validation = Validation::new(header.alg);
        validation.leeway = self.config.leeway_seconds;
        validation.validate_nbf = true;
        validation.set_issuer(&[&issuer.issuer]);
        validation.set_audience(&[&self.config.resource]);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        let claims = jsonwebtoken::decode::<Claims>(token, &key, &validation).map_err(|e| Refusal::Invalid(describe(e.kind()).into()))?.claims;
        let subject = match self.config.principal_claim.as_str() {
            "client_id" => claims.client_id.clone(),
            _ => claims.sub.clone(),
        }
        .ok_or_else(|| Refusal::Invalid(format!("it has no `{}` claim to name its principal", self.config.principal_claim)))?;
        let tenant = match &self.config.tenant_claim {
            Some(claim) => {
                Some(claims.other.get(claim).and_then(|v| v.as_str()).ok_or_else(|| Refusal::Invalid(format!("it has no `{claim}` claim naming its tenant")))?)
            }
            None => None,
        };
        let principal = principal_name(issuer.principal_prefix.as_deref(), tenant, &subject);
        let tenant = tenant.map(|t| serde_json::json!([issuer.issuer, t]).to_string());
        Ok(Authenticated { principal, scopes: scopes_of(&claims), tenant })
    }
}

/// The `alg` a token's header names, if its header is readable.
fn alg_of(token: &str) -> Option<String> {
    use base64::Engine as _;
    let header = token.split('.').next()?;
    let json = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(header.trim_end_matches('=')).ok()?;
    serde_json::from_slice::<serde_json::Value>(&json).ok()?["alg"].as_str().map(String::from)
}

/// What a validation failure means, in words a client can act on.
fn describe(kind: &jsonwebtoken::errors::ErrorKind) -> &'static str {
    use jsonwebtoken::errors::ErrorKind as K;
    match kind {
        K::ExpiredSignature => "the token has expired",
        K::ImmatureSignature => "the token is not valid yet (nbf)",
        K::InvalidAudience => "the token was not issued for this resource (aud)",
        K::InvalidIssuer => "its issuer is not one this server trusts",
        K::InvalidSignature => "its signature does not verify",
        K::MissingRequiredClaim(_) => "it lacks a required claim (exp, iss, aud)",
        K::InvalidAlgorithm => "its algorithm does not fit its issuer's key",
        _ => "it is not a valid access token",
    }
}

/// The scopes a token grants: `scope` (RFC 9068, space-separated), `scp`
/// (a string or a list, as Entra ID and Okta write it) and, for
/// application tokens, `roles` (Entra ID's app permissions).
fn scopes_of(claims: &Claims) -> BTreeSet<String> {
    let mut scopes: BTreeSet<String> = claims.scope.iter().flat_map(|s| s.split_whitespace()).map(String::from).collect();
    match &claims.scp {
        Some(serde_json::Value::String(s)) => scopes.extend(s.split_whitespace().map(String::from)),
        Some(serde_json::Value::Array(list)) => scopes.extend(list.iter().filter_map(|v| v.as_str()).map(String::from)),
        _ => {}
    }
    scopes.extend(claims.roles.iter().flatten().cloned());
    scopes
}

/// The principal for `subject` (of `tenant`, from the issuer with `prefix`):
/// `PREFIX.TENANT.SUBJECT` when every part is plain (A-Z a-z 0-9 _ -) and
/// the whole fits 64 characters; otherwise `PREFIX.id-` and 24 hex digits
/// of a digest of tenant and subject — never ambiguous, never too long.
pub fn principal_name(prefix: Option<&str>, tenant: Option<&str>, subject: &str) -> String {
    let plain = |p: &str| !p.is_empty() && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    let parts: Vec<&str> = prefix.into_iter().chain(tenant).chain([subject]).collect();
    let joined = parts.join(".");
    if parts.iter().all(|p| plain(p)) && joined.len() <= 64 {
        return joined;
    }
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(format!("{}\0{subject}", tenant.unwrap_or_default()));
    let id = format!("id-{}", &hex::encode(digest)[..24]);
    prefix.map_or(id.clone(), |p| format!("{p}.{id}"))
}

#[cfg(test)]
mod tests {
    use super::principal_name;

    #[test]
    fn principals_are_readable_when_plain_and_digests_otherwise() {
        assert_eq!(principal_name(None, None, "agent-a"), "agent-a");
        assert_eq!(principal_name(Some("corp"), Some("t1"), "f47ac10b-58cc"), "corp.t1.f47ac10b-58cc");
        let hashed = principal_name(None, None, "auth0|abc");
        assert!(hashed.starts_with("id-") && hashed.len() == 27, "{hashed}");
        // A dot inside a part would make `a.b` + `c` and `a` + `b.c` one principal: digested instead.
        assert_ne!(principal_name(None, Some("a.b"), "c"), principal_name(None, Some("a"), "b.c"));
        assert!(crate::config::valid_principal(&principal_name(Some("p"), Some(&"t".repeat(80)), "s")));
    }
}
