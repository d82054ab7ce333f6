//! `Origin` validation on `serve --http`, as the Streamable HTTP transport
//! requires: a request that carries an `Origin` is served only if that
//! origin is the server's own — the request's `Host` (which is checked
//! against loopback and `[mcp] allowed_hosts` beside this), as a page the
//! server itself served would send — or one the operator allowed in `[mcp]
//! allowed_origins`; any other is answered 403 before anything reads it.
//! MCP clients that are not browsers send no `Origin` and are not affected.
//! A page on another origin — another port of localhost included, or a
//! DNS-rebinding site whose `Host` the host check then refuses — is.

use crate::config::split_origin;

/// The origins allowed besides the server's own, as configured.
#[derive(Debug, Clone, Default)]
pub(crate) struct Origins(Vec<String>);

impl Origins {
    /// The origins of `[mcp] allowed_origins` (checked when the config was read).
    pub(crate) fn new(allowed: &[String]) -> Self {
        Self(allowed.iter().map(|o| o.to_ascii_lowercase()).collect())
    }

    /// Whether a request whose `Host` is `host` may carry `origin`.
    pub(crate) fn allow(&self, origin: &str, host: Option<&str>) -> bool {
        let origin = origin.trim().to_ascii_lowercase();
        if origin == "null" {
            return self.0.iter().any(|a| a == "null");
        }
        let Some((scheme, o_host, o_port)) = split_origin(&origin) else { return false };
        // The server's own origin: what a page it served would send.
        let authority = origin.split_once("://").map_or("", |(_, a)| a);
        if host.is_some_and(|h| h.eq_ignore_ascii_case(authority)) {
            return true;
        }
        self.0
            .iter()
            .filter_map(|a| split_origin(a))
            .any(|(a_scheme, a_host, a_port)| a_scheme == scheme && a_host == o_host && (a_port == "*" || a_port == o_port))
    }
}

/// Middleware: refuses a request whose `Origin` is not allowed ([`Origins::allow`])
/// with 403 and a JSON-RPC error without an id.
pub(crate) async fn only_allowed_origins(
    origins: std::sync::Arc<Origins>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    let refused = {
        // A header that is not text is no origin and no host.
        let text = |name| req.headers().get(name).map(|v: &axum::http::HeaderValue| v.to_str().unwrap_or("\u{0}"));
        text(axum::http::header::ORIGIN).filter(|origin| !origins.allow(origin, text(axum::http::header::HOST))).map(str::to_string)
    };
    if let Some(origin) = refused {
        let message =
            format!("requests from the web origin `{}` are not served here; an operator may allow it in [mcp] allowed_origins", origin.escape_debug());
        let error = serde_json::json!({ "jsonrpc": "2.0", "error": { "code": -32600, "message": message } });
        return (axum::http::StatusCode::FORBIDDEN, axum::Json(error)).into_response();
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::Origins;

    #[test]
    fn the_servers_own_origin_and_the_allowed_ones_pass() {
        let none = Origins::new(&[]);
        assert!(none.allow("http://127.0.0.1:8765", Some("127.0.0.1:8765")), "same origin as the Host");
        assert!(none.allow("http://LOCALHOST:8765", Some("localhost:8765")));
        assert!(!none.allow("http://localhost:3000", Some("localhost:8765")), "another port is another origin");
        assert!(!none.allow("https://evil.example", Some("127.0.0.1:8765")));
        assert!(!none.allow("null", Some("127.0.0.1:8765")));
        assert!(!none.allow("http://127.0.0.1:8765/path", Some("127.0.0.1:8765")), "an origin has no path");
        let some = Origins::new(&["https://app.example.com".into(), "http://localhost:*".into(), "null".into()]);
        assert!(some.allow("https://app.example.com", None));
        assert!(some.allow("https://app.example.com:443", None), "the default port spelled out");
        assert!(!some.allow("https://app.example.com:8443", None), "an entry without a port is the scheme's default port");
        assert!(!some.allow("http://app.example.com", None), "another scheme");
        assert!(!some.allow("https://app.example.com.evil.example", None));
        assert!(some.allow("http://localhost:3000", None), ":* is any port");
        assert!(some.allow("null", None));
    }
}
