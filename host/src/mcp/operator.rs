//! The operator's routes over HTTP: approvals (`docs/tasks.md`, "Consent"),
//! for a host whose ledger the command line cannot open (a `serve` holding
//! its RocksDB ledger) and for a fleet — `GET /approvals` lists the calls
//! waiting for a decision, `POST /approvals` decides one — and `POST
//! /reload`, a reload of this host (`docs/operations.md`). Served only when
//! `[mcp] operator_token_env` names the operator's bearer token — never an
//! MCP client's: a model holding a client token cannot approve its own
//! actions.

use crate::ledger::Decision;
use crate::ledger::records::now_ms;
use crate::runtime::Runtime;
use axum::http::StatusCode;
use axum::response::{IntoResponse as _, Response};
use serde::Deserialize;
use serde_json::json;
use std::sync::Arc;

/// Where the approvals are served.
pub const PATH: &str = "/approvals";

/// Where a reload is asked for.
pub const RELOAD_PATH: &str = "/reload";

/// One decision, as `POST /approvals` takes it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Decide {
    session: String,
    call_id: String,
    request: String,
    /// `approve` or `deny`.
    decision: String,
    /// Who decides (recorded as `operator:<by>`).
    by: String,
    #[serde(default)]
    note: Option<String>,
}

/// The approvals routes, behind the operator's `token`.
pub fn router(live: Arc<crate::reload::Live>, token: String) -> axum::Router {
    let token = Arc::new(token);
    let list = {
        let (live, token) = (live.clone(), token.clone());
        move |req: axum::extract::Request| async move {
            if !authorized(&req, &token) {
                return refused();
            }
            waiting(&live.runtime()).await
        }
    };
    let reload = {
        let (live, token) = (live.clone(), token.clone());
        move |req: axum::extract::Request| async move {
            if !authorized(&req, &token) {
                return refused();
            }
            match live.reload().await {
                Ok(report) => axum::Json(json!({ "reloaded": true, "report": report })).into_response(),
                Err(refused) => (StatusCode::CONFLICT, axum::Json(json!({ "reloaded": false, "error": refused.to_string() }))).into_response(),
            }
        }
    };
    let decide = move |req: axum::extract::Request| async move {
        if !authorized(&req, &token) {
            return refused();
        }
        let Ok(body) = axum::body::to_bytes(req.into_body(), 64 << 10).await else { return (StatusCode::BAD_REQUEST, "unreadable body\n").into_response() };
        match serde_json::from_slice::<Decide>(&body) {
            Ok(d) => decide(&live.runtime(), d).await,
            Err(e) => (StatusCode::BAD_REQUEST, format!("expected {{session, call_id, request, decision, by, note?}}: {e}\n")).into_response(),
        }
    };
    axum::Router::new().route(PATH, axum::routing::get(list).post(decide)).route(RELOAD_PATH, axum::routing::post(reload))
}

fn authorized(req: &axum::extract::Request, token: &str) -> bool {
    let given = req.headers().get(axum::http::header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    given.is_some_and(|g| constant_time_eq(g.as_bytes(), token.as_bytes()))
}

fn refused() -> Response {
    (StatusCode::UNAUTHORIZED, [(axum::http::header::WWW_AUTHENTICATE, "Bearer")], "the operator's bearer token is required\n").into_response()
}

async fn waiting(runtime: &Runtime) -> Response {
    let Some(guard) = runtime.guard() else { return axum::Json(json!({ "waiting": [] })).into_response() };
    let now = now_ms();
    match guard.ledger().read(|l| l.calls(None)).await {
        Ok(calls) => {
            let waiting: Vec<_> = calls.iter().filter_map(|c| c.waiting_view(now)).collect();
            axum::Json(json!({ "waiting": waiting })).into_response()
        }
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("the ledger could not be read: {e}\n")).into_response(),
    }
}

async fn decide(runtime: &Runtime, d: Decide) -> Response {
    let approve = match d.decision.as_str() {
        "approve" => true,
        "deny" => false,
        other => return (StatusCode::BAD_REQUEST, format!("decision `{other}`: say approve or deny\n")).into_response(),
    };
    let Some(guard) = runtime.guard() else { return (StatusCode::NOT_FOUND, "this host keeps no ledger\n").into_response() };
    let by = format!("operator:{}", d.by);
    let decision = Decision { approve, by: &by, note: d.note.as_deref() };
    match guard.decide_approval(&d.session, &d.call_id, &d.request, decision).await {
        Ok(approval) => axum::Json(json!({ "decided": approval, "session": d.session, "call_id": d.call_id })).into_response(),
        Err(why) => (StatusCode::CONFLICT, axum::Json(json!({ "kind": "not-decided", "message": why }))).into_response(),
    }
}

/// Whether two tokens are equal, in time that does not depend on where they differ.
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
