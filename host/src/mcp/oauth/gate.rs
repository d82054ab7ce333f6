//! The HTTP side of `[mcp.oauth]`: the metadata routes, the middleware
//! that authenticates every MCP request before its body is read, and the
//! one that checks a read body's scopes.

use super::metadata;
use super::scopes::ScopeMap;
use super::{Authenticated, Authenticator, Refusal};
use axum::response::IntoResponse as _;
use std::sync::Arc;

/// The authenticator and the scopes each tool needs.
pub struct Gate {
    /// Checks tokens (kept across a reload that leaves `[mcp.oauth]` as it was).
    pub auth: Arc<Authenticator>,
    /// What each request needs.
    pub scopes: ScopeMap,
}

/// The protected-resource metadata, at RFC 9728's well-known path for the
/// resource and at the bare well-known path (unauthenticated, as clients
/// fetch it before they hold a token).
pub fn metadata_routes(gate: &Arc<Gate>, current: impl Fn() -> Option<Arc<Gate>> + Clone + Send + Sync + 'static) -> axum::Router {
    // Read per request: a reload may change the issuers and scopes (not the resource).
    let handler = move || {
        let document = current().map(|g| metadata::document(&g.auth.config));
        async move { axum::Json(document) }
    };
    let with_path = metadata::path(&gate.auth.config.resource);
    let router = axum::Router::new().route("/.well-known/oauth-protected-resource", axum::routing::get(handler.clone()));
    if with_path == "/.well-known/oauth-protected-resource" { router } else { router.route(&with_path, axum::routing::get(handler)) }
}

/// Lets a request through only with an access token this server accepts,
/// and tells the rest of the stack whose it is and what it may do.
pub async fn authenticate(gate: Option<Arc<Gate>>, mut req: axum::extract::Request, next: axum::middleware::Next) -> axum::response::Response {
    let Some(gate) = gate else { return closed() };
    let header = req.headers().get(axum::http::header::AUTHORIZATION).and_then(|v| v.to_str().ok()).map(str::to_string);
    match gate.auth.authenticate(header.as_deref()).await {
        Ok(who) => {
            let name = who.principal.clone();
            req.extensions_mut().insert(crate::mcp::principals::Principal(name.clone()));
            req.extensions_mut().insert(who);
            crate::mcp::sessions::PRINCIPAL.scope(Some(name), next.run(req)).await
        }
        // An unavailable issuer is logged where its keys' fetch failed (jwks.rs), once per attempt, not per request.
        Err(refusal) => refuse(&refusal, &gate),
    }
}

/// Refuses a request (its body read whole) whose token lacks a scope it needs.
pub async fn require_scopes(gate: Option<Arc<Gate>>, req: axum::extract::Request, next: axum::middleware::Next) -> axum::response::Response {
    let Some(gate) = gate else { return closed() };
    let granted = req.extensions().get::<Authenticated>().map(|a| a.scopes.clone()).unwrap_or_default();
    let (parts, body) = req.into_parts();
    // Already read whole and bounded (listen::whole_body).
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        return (axum::http::StatusCode::BAD_REQUEST, "the request body could not be read\n").into_response();
    };
    let missing = gate.scopes.missing(&bytes, &granted);
    if !missing.is_empty() {
        return refuse(&Refusal::InsufficientScope(missing), &gate);
    }
    next.run(axum::extract::Request::from_parts(parts, axum::body::Body::from(bytes))).await
}

/// No gate to check a token with (cannot happen: a reload does not turn
/// `[mcp.oauth]` off), so nothing is let in.
fn closed() -> axum::response::Response {
    (axum::http::StatusCode::SERVICE_UNAVAILABLE, "this server cannot check access tokens now\n").into_response()
}

fn refuse(refusal: &Refusal, gate: &Gate) -> axum::response::Response {
    let (status, challenge, body) = metadata::challenge(refusal, &gate.auth.config);
    let status = axum::http::StatusCode::from_u16(status).unwrap_or(axum::http::StatusCode::UNAUTHORIZED);
    let mut response = (status, body).into_response();
    if let Ok(value) = axum::http::HeaderValue::from_str(&challenge) {
        response.headers_mut().insert(axum::http::header::WWW_AUTHENTICATE, value);
    }
    if status == axum::http::StatusCode::SERVICE_UNAVAILABLE {
        response.headers_mut().insert(axum::http::header::RETRY_AFTER, axum::http::HeaderValue::from_static("5"));
    }
    response
}
