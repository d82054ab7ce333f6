//! MCP over Streamable HTTP, hardened: loopback by default; a bearer token
//! required when binding anywhere else (several tokens, each its own
//! principal); Host validation against DNS rebinding always on (loopback
//! plus the configured `allowed_hosts`), `/metrics` included; `Origin`
//! validated on every route (`super::origin`: the server's own, or one in
//! `[mcp] allowed_origins`; any other 403); a session served only to the
//! principal that opened it (`super::sessions`); request
//! bodies capped and read whole within a timeout; connections capped and
//! given a header timeout (`super::listen`);
//! a request id reused while in flight refused (`super::request_ids`).

use super::McpHost;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use std::net::SocketAddr;
use std::sync::Arc;

/// The path the MCP endpoint is served on.
pub const PATH: &str = "/mcp";

/// Where Prometheus scrapes this host's metrics (behind the same token).
pub const METRICS_PATH: &str = "/metrics";

/// What this host serves — each plugin's component and policy digest —
/// as JSON, for an operator comparing a fleet's hosts (behind the same token).
pub const INFO_PATH: &str = "/info";

/// `GET /metrics`: OpenMetrics text (the ledger is read on a blocking thread).
async fn metrics(ledger: Option<crate::ledger::Ledger>) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    match tokio::task::spawn_blocking(move || crate::metrics::render(ledger.as_ref(), &limits_in_use(ledger.as_ref())?)).await {
        Ok(Ok(text)) => ([(axum::http::header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], text).into_response(),
        Ok(Err(e)) => (axum::http::StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
        Err(e) => (axum::http::StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// What each spending limit holds now, per scope (read from the ledger), for the gauges.
fn limits_in_use(ledger: Option<&crate::ledger::Ledger>) -> Result<Vec<crate::metrics::LimitUse>, crate::ledger::LedgerError> {
    let Some(ledger) = ledger else { return Ok(Vec::new()) };
    let spent = ledger.spent(crate::ledger::records::now_ms())?;
    let in_use = crate::policy::limits::in_use(spent.iter().map(|u| (u.scope.as_str(), u.amount, u.until_ms)));
    Ok(in_use
        .into_iter()
        .filter_map(|u| {
            let l = u.limit?;
            Some(crate::metrics::LimitUse { plugin: l.plugin, tool: l.tool, limit: l.index, currency: l.currency.unwrap_or_default(), used: u.used })
        })
        .collect())
}

/// Serves `host` on `addr` until the process ends. Prints the URL on stderr
/// once listening.
///
/// # Errors
/// A non-loopback bind without a token, a token variable that is unset,
/// or the address cannot be bound.
pub async fn serve(host: McpHost, addr: SocketAddr) -> anyhow::Result<()> {
    let max_connections = host.config.max_connections;
    let app = router(host, addr)?;
    let listener = tokio::net::TcpListener::bind(addr).await?;
    eprintln!("toolguard: MCP on http://{}{PATH}", listener.local_addr()?);
    super::listen::serve_on(listener, app, max_connections).await;
    Ok(())
}

/// The hardened MCP endpoint for a server that will bind `addr`.
///
/// # Errors
/// A non-loopback `addr` without a token or allowed hosts, or a token
/// variable that is unset.
pub fn router(host: McpHost, addr: SocketAddr) -> anyhow::Result<axum::Router> {
    // `Origin` first, on every route: a present one that is neither the server's own nor allowed is 403 (origin.rs).
    let origins = Arc::new(super::origin::Origins::new(&host.config.allowed_origins));
    let routes = routes(host, addr)?;
    Ok(routes.layer(axum::middleware::from_fn(move |req, next| super::origin::only_allowed_origins(origins.clone(), req, next))))
}

/// Every route of [`router`], behind its checks but the `Origin`'s.
fn routes(host: McpHost, addr: SocketAddr) -> anyhow::Result<axum::Router> {
    let config = host.config.clone();
    // Who may come in: static tokens or OAuth, read again on every reload (access.rs).
    let access = super::access::Access::of(&config, &host.runtime(), None, addr).map_err(anyhow::Error::msg)?;
    let client_tokens: Vec<String> = access.tokens.iter().map(|(_, t)| t.clone()).collect();
    let first_gate = access.oauth.clone();
    let doors = super::access::Doors::new(access, addr);
    host.live.follow(Arc::new(super::access::Following(doors.clone())));
    if !addr.ip().is_loopback() {
        anyhow::ensure!(
            !config.allowed_hosts.is_empty(),
            "binding {addr} beyond loopback needs [mcp] allowed_hosts: the host names clients use (DNS-rebinding protection)"
        );
    }
    let mut hosts: Vec<String> = ["localhost", "127.0.0.1", "::1", "[::1]"].iter().map(|h| h.to_string()).collect();
    hosts.extend(config.allowed_hosts.iter().cloned());
    let mcp_config = StreamableHttpServerConfig::default().with_allowed_hosts(hosts.clone()).with_max_request_body_bytes(config.max_request_bytes);
    let ledger = host.runtime().guard().map(|g| g.ledger().clone());
    let (live, live_for_operator) = (host.live.clone(), host.live.clone());
    let sessions = Arc::new(super::sessions::CappedSessions::new(config.max_sessions, config.max_sessions_per_principal));
    let service = StreamableHttpService::new(move || Ok(host.clone()), sessions, mcp_config);
    // Answers are recorded as told once their response body has been sent (delivery.rs).
    // A request reusing an id still in flight in its session is refused first (request_ids.rs).
    let open_ids = Arc::new(super::request_ids::OpenIds::default());
    let mcp = axum::Router::new()
        .nest_service(PATH, service)
        .layer(axum::middleware::from_fn(super::delivery::track))
        .layer(axum::middleware::from_fn(move |req, next| super::request_ids::claim(open_ids.clone(), req, next)));
    // The operator's views of this host, behind the same Host check (and, below, the same token).
    let hosts = Arc::new(hosts);
    let views = axum::Router::new()
        .route(METRICS_PATH, axum::routing::get(move || metrics(ledger.clone())))
        .route(
            INFO_PATH,
            axum::routing::get(move || {
                let mut info = live.runtime().info();
                info["generation"] = live.generation().into();
                async move { axum::Json(info) }
            }),
        )
        .layer(axum::middleware::from_fn(move |req, next| only_allowed_hosts(hosts.clone(), req, next)));
    let router = mcp.merge(views);
    let max_bytes = config.max_request_bytes;
    // Innermost first: the scopes a read body needs; the body read whole; who is asking.
    let router = match &first_gate {
        Some(_) => {
            let doors = doors.clone();
            router.layer(axum::middleware::from_fn(move |req, next| super::oauth::gate::require_scopes(doors.gate(), req, next)))
        }
        None => router,
    };
    let router = router.layer(axum::middleware::from_fn(move |req, next| super::listen::whole_body(max_bytes, req, next)));
    // Each principal's share of open requests, counted before its body is read.
    let open = super::principals::OpenRequests::new(config.max_requests_per_principal);
    let router = router.layer(axum::middleware::from_fn(move |req, next| super::principals::open_request(open.clone(), req, next)));
    let router = match &first_gate {
        Some(gate) => {
            let (inner, current) = (doors.clone(), doors.clone());
            router
                .layer(axum::middleware::from_fn(move |req, next| super::oauth::gate::authenticate(inner.gate(), req, next)))
                .merge(super::oauth::gate::metadata_routes(gate, move || current.gate()))
        }
        None => router.layer(axum::middleware::from_fn(move |req, next| {
            let access = doors.current();
            async move { bearer(&access.tokens, req, next).await }
        })),
    };
    // The operator's routes sit beside the clients', behind their own token (operator.rs).
    let Some(var) = config.operator_token_env.as_deref() else { return Ok(router) };
    let token = std::env::var(var).map_err(|_| anyhow::anyhow!("the operator's token is in `{var}`, which is not set"))?;
    anyhow::ensure!(token.len() >= 16, "the token in `{var}` is shorter than 16 characters; use a long random one");
    anyhow::ensure!(!client_tokens.contains(&token), "the operator's token in `{var}` is also an MCP client's token: use its own");
    let max_bytes = config.max_request_bytes;
    let operator =
        super::operator::router(live_for_operator, token).layer(axum::middleware::from_fn(move |req, next| super::listen::whole_body(max_bytes, req, next)));
    Ok(router.merge(operator))
}

pub use super::principals::Principal;

/// Lets through only a request whose `Host` is allowed ([`host_allowed`]).
async fn only_allowed_hosts(allowed: Arc<Vec<String>>, req: axum::extract::Request, next: axum::middleware::Next) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    if !host_allowed(&req, &allowed) {
        return (axum::http::StatusCode::FORBIDDEN, "this Host is not served\n").into_response();
    }
    next.run(req).await
}

/// Whether the request's `Host` is loopback or one of `allowed` (with or without a port).
fn host_allowed(req: &axum::extract::Request, allowed: &[String]) -> bool {
    let Some(host) = req.headers().get(axum::http::header::HOST).and_then(|h| h.to_str().ok()) else { return false };
    let name = match host.rsplit_once(':') {
        // `[::1]:8765`, `name:8765`; a bare IPv6 literal has no brackets and more colons.
        Some((name, port)) if port.chars().all(|c| c.is_ascii_digit()) && (!name.contains(':') || name.ends_with(']')) => name,
        _ => host,
    };
    allowed.iter().any(|a| a.eq_ignore_ascii_case(host) || a.eq_ignore_ascii_case(name))
}

/// Lets a request through only with one of the bearer tokens (if any are
/// set), and tells the rest of the stack whose it is.
async fn bearer(tokens: &[(Principal, String)], mut req: axum::extract::Request, next: axum::middleware::Next) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    if tokens.is_empty() {
        return next.run(req).await;
    }
    let given = req.headers().get(axum::http::header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    // Every token is compared, in constant time, whichever matches.
    let matched = given.and_then(|g| {
        tokens.iter().fold(
            None,
            |found, (principal, token)| if super::operator::constant_time_eq(g.as_bytes(), token.as_bytes()) { Some(principal.clone()) } else { found },
        )
    });
    if let Some(principal) = matched {
        let name = principal.0.clone();
        req.extensions_mut().insert(principal);
        // A session opened by this request is counted as the principal's.
        return super::sessions::PRINCIPAL.scope(Some(name), next.run(req)).await;
    }
    (axum::http::StatusCode::UNAUTHORIZED, [(axum::http::header::WWW_AUTHENTICATE, "Bearer")], "a valid bearer token is required\n").into_response()
}
