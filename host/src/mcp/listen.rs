//! Accepting `serve --http`'s connections, bounded: at most `[mcp]
//! max_connections` open at once (more wait in the kernel's backlog), each
//! given [`HEADER_TIMEOUT`] to send a request's headers — so a client that
//! opens connections and trickles its headers (slowloris) neither holds them
//! for ever nor takes the file descriptors RocksDB and the ledger need —
//! and Nagle's algorithm off (an SSE event goes out at once, not after a
//! delayed ACK). A request's body must then arrive whole within
//! [`BODY_TIMEOUT`] ([`whole_body`]), so a client that trickles bodies holds
//! no connection for ever either. axum's own `serve` sets none of these. HTTP/1.1 only, as
//! before (MCP's Streamable HTTP needs nothing more).

use axum::body::Body;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::sync::Arc;
use std::time::Duration;
use tower::ServiceExt as _;

/// How long a client has to send a request's headers once it has started
/// one (or, on a kept-alive connection, once the previous answer ended).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a client has to send a request's body once its headers are in.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// Middleware: reads the request's body whole — at most `max_bytes` (413
/// beyond), within [`BODY_TIMEOUT`] (408 and the connection closed after)
/// — before anything else handles the request.
pub async fn whole_body(max_bytes: usize, req: axum::extract::Request, next: axum::middleware::Next) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    let (parts, body) = req.into_parts();
    let bytes = match tokio::time::timeout(BODY_TIMEOUT, axum::body::to_bytes(body, max_bytes)).await {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(_)) => {
            let why = format!("the request body is over {max_bytes} bytes ([mcp] max_request_bytes), or was cut off\n");
            return (axum::http::StatusCode::PAYLOAD_TOO_LARGE, [(axum::http::header::CONNECTION, "close")], why).into_response();
        }
        Err(_) => {
            let why = format!("the request body did not arrive within {} s; send it whole\n", BODY_TIMEOUT.as_secs());
            return (axum::http::StatusCode::REQUEST_TIMEOUT, [(axum::http::header::CONNECTION, "close")], why).into_response();
        }
    };
    next.run(axum::extract::Request::from_parts(parts, Body::from(bytes))).await
}

/// Serves `app` on `listener` until the process ends, with at most
/// `max_connections` connections open at once — and never more than half
/// the files the process may open, which the ledger needs too.
pub async fn serve_on(listener: tokio::net::TcpListener, app: axum::Router, max_connections: usize) {
    let half_the_open_file_limit = crate::open_files::limits().and_then(|(soft, _)| usize::try_from(soft / 2).ok()).unwrap_or(usize::MAX);
    let most = max_connections.min(half_the_open_file_limit);
    if most < max_connections {
        tracing::warn!(max_connections, most, "[mcp] max_connections is more than half the open-file limit; serving at most {most} connections");
    }
    let slots = Arc::new(tokio::sync::Semaphore::new(most.max(1)));
    loop {
        let slot = slots.clone().acquire_owned().await.expect("the semaphore is never closed");
        let tcp = match listener.accept().await {
            Ok((tcp, _)) => tcp,
            // Out of file descriptors, or a connection reset before it was
            // accepted: the listener is fine; try again shortly.
            Err(e) => {
                tracing::warn!(error = %e, "accepting an MCP connection failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone().map_request(|req: axum::http::Request<hyper::body::Incoming>| req.map(Body::new)));
        tokio::spawn(async move {
            let mut builder = http1::Builder::new();
            builder.timer(TokioTimer::new()).header_read_timeout(HEADER_TIMEOUT);
            let _ = builder.serve_connection(TokioIo::new(tcp), service).with_upgrades().await;
            drop(slot);
        });
    }
}
