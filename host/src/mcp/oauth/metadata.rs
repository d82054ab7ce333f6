//! What a client learns about this resource server: its protected-resource
//! metadata (RFC 9728) and the `WWW-Authenticate` challenges of its
//! refusals (RFC 6750 §3, with RFC 9728's `resource_metadata`).

use super::Refusal;
use crate::config::OAuthConfig;

/// The metadata's path for `resource`: RFC 9728's well-known prefix
/// followed by the resource's own path (`/mcp` → `/.well-known/oauth-protected-resource/mcp`).
pub fn path(resource: &str) -> String {
    let path = url::Url::parse(resource).map(|u| u.path().trim_end_matches('/').to_string()).unwrap_or_default();
    format!("/.well-known/oauth-protected-resource{path}")
}

/// Where clients fetch the metadata.
pub fn url(resource: &str) -> String {
    let origin = url::Url::parse(resource).map(|u| u.origin().ascii_serialization()).unwrap_or_default();
    format!("{origin}{}", path(resource))
}

/// The metadata document.
pub fn document(config: &OAuthConfig) -> serde_json::Value {
    serde_json::json!({
        "resource": config.resource,
        "authorization_servers": config.issuers.iter().map(|i| i.issuer.as_str()).collect::<Vec<_>>(),
        "scopes_supported": config.scopes_supported(),
        "bearer_methods_supported": ["header"],
        "resource_name": "toolguard",
    })
}

/// The status, `WWW-Authenticate` value and body of a refusal.
pub fn challenge(refusal: &Refusal, config: &OAuthConfig) -> (u16, String, String) {
    let metadata = format!("resource_metadata=\"{}\"", url(&config.resource));
    let quoted = |s: &str| s.replace(['"', '\\'], "'");
    match refusal {
        Refusal::Missing => {
            let scope = config.scopes.any.as_ref().map(|s| format!(", scope=\"{s}\"")).unwrap_or_default();
            (401, format!("Bearer {metadata}{scope}"), "an access token from this server's authorization server is required\n".into())
        }
        Refusal::Invalid(why) => {
            (401, format!("Bearer error=\"invalid_token\", error_description=\"{}\", {metadata}", quoted(why)), format!("invalid token: {why}\n"))
        }
        // 503, not 401: the client's token may be fine; the host cannot tell now.
        Refusal::Unavailable(why) => (
            503,
            format!("Bearer error=\"temporarily_unavailable\", error_description=\"{}\", {metadata}", quoted(why)),
            format!("cannot check tokens now: {why}\n"),
        ),
        Refusal::InsufficientScope(needed) => {
            let scope = needed.join(" ");
            (
                403,
                format!("Bearer error=\"insufficient_scope\", scope=\"{scope}\", error_description=\"this call needs scope {scope}\", {metadata}"),
                format!("insufficient scope: this call needs {scope}\n"),
            )
        }
    }
}
