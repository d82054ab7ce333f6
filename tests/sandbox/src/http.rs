//! The sandbox's HTTP face: Stripe's refund endpoints, a ticket desk, control endpoints
//! under `/_sandbox`, and fault injection around the commit.

use crate::provider::{Admission, Fault};
use crate::{Observed, Shared};
use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Marks a response whose connection must be dropped instead of answered.
#[derive(Clone, Copy)]
pub(crate) struct DropConnection;

pub(crate) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/v1/refunds", post(create_refund).get(list_refunds))
        .route("/v1/refunds/{id}", get(get_refund))
        .route("/v1/refunds/{id}/cancel", post(cancel_refund))
        .route("/v1/tickets", post(crate::tickets::create).get(crate::tickets::list))
        .route("/_sandbox/refunds", get(all_refunds))
        .route("/_sandbox/requests", get(all_requests))
        .route("/_sandbox/faults", post(push_fault))
        .route("/_sandbox/clock", post(advance_clock))
        .route("/_sandbox/release", post(release))
        .route("/_sandbox/payment_intents", post(add_intent))
        .route("/_sandbox/refunds/{id}/status", post(set_status))
        .with_state(shared)
}

pub(crate) fn json_response(status: u16, body: &Value) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, axum::Json(body.clone())).into_response()
}

fn dropped() -> Response {
    let mut r = Response::new(Body::empty());
    r.extensions_mut().insert(DropConnection);
    r
}

/// The 401 to answer if the sandbox requires an API key and this request lacks it.
fn unauthorized(shared: &Shared, headers: &HeaderMap) -> Option<Response> {
    let required = shared.api_key.lock().unwrap().clone()?;
    let given = headers.get("authorization").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    if given == Some(required.as_str()) {
        return None;
    }
    let body = crate::provider::stripe_error("invalid_request_error", "api_key_invalid", "Invalid API Key provided.");
    Some(json_response(401, &body))
}

/// Records the request and tells the observers, before anything else happens.
pub(crate) fn observe(shared: &Shared, method: &Method, uri: &Uri, headers: &HeaderMap, body: &str) -> Observed {
    let observed = Observed {
        seq: shared.seq.fetch_add(1, Ordering::SeqCst),
        method: method.to_string(),
        path: uri.path().to_string(),
        query: uri.query().unwrap_or_default().to_string(),
        headers: headers.iter().map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("<binary>").to_string())).collect(),
        idempotency_key: headers.get("idempotency-key").and_then(|v| v.to_str().ok()).map(str::to_string).or_else(|| {
            // Some providers take the key as a query parameter instead.
            form_urlencoded::parse(uri.query().unwrap_or_default().as_bytes()).find(|(k, _)| k == "idempotency_key").map(|(_, v)| v.into_owned())
        }),
        body: body.to_string(),
    };
    shared.requests.lock().unwrap().push(observed.clone());
    for observer in shared.observers.lock().unwrap().iter() {
        observer(&observed);
    }
    observed
}

async fn create_refund(State(shared): State<Arc<Shared>>, method: Method, uri: Uri, headers: HeaderMap, body: String) -> Response {
    let observed = observe(&shared, &method, &uri, &headers, &body);
    if let Some(denied) = unauthorized(&shared, &headers) {
        return denied;
    }
    let params: BTreeMap<String, String> = form_urlencoded::parse(body.as_bytes()).into_owned().collect();
    let fingerprint = format!("POST /v1/refunds?{}", serde_json::to_string(&params).unwrap_or_default());

    // Decide under the lock; never hold it across an await.
    let (fault, key, admission) = {
        let mut p = shared.provider.lock().unwrap();
        if p.faults.front() == Some(&Fault::RateLimit429) {
            p.faults.pop_front();
            let body = crate::provider::stripe_error("rate_limit_error", "rate_limit", "Too many requests hit the API too quickly.");
            return json_response(429, &body);
        }
        if p.faults.front() == Some(&Fault::Conflict409) {
            p.faults.pop_front();
            let body = crate::provider::stripe_error("invalid_request_error", "charge_disputed", "The charge is disputed and cannot be refunded now.");
            return json_response(409, &body);
        }
        if p.faults.front() == Some(&Fault::StoreDown503) {
            p.faults.pop_front();
            let body = json!({ "status": 503, "errorCode": "703", "message": "idempotency store unavailable", "errorType": "internal" });
            let mut r = json_response(503, &body);
            r.headers_mut().insert("transient-error", "true".parse().unwrap());
            return r;
        }
        let key = match p.parse_key(observed.idempotency_key.as_deref()) {
            Ok(key) => key,
            Err((status, body)) => return json_response(status, &body),
        };
        let fault = p.faults.pop_front();
        if fault == Some(Fault::InFlight409) {
            let Admission::Reject { status, body, transient } = p.in_use() else { unreachable!("in_use rejects") };
            return reject(p.mode, status, &body, transient);
        }
        let admission = match &key {
            Some(k) => p.admit(k, &fingerprint),
            None => Admission::Execute,
        };
        (fault, key, admission)
    };
    match admission {
        Admission::Replay { status, body } => {
            let mut r = json_response(status, &body);
            r.headers_mut().insert("idempotent-replayed", "true".parse().unwrap());
            r
        }
        Admission::Reject { status, body, transient } => reject(shared.provider.lock().unwrap().mode, status, &body, transient),
        // Like a real provider, keep executing when the client goes away:
        // the work runs in its own task, which a dropped connection cannot cancel.
        Admission::Execute => {
            let task = tokio::spawn(async move { execute(&shared, fault, key.as_deref(), &params).await });
            task.await.unwrap_or_else(|_| json_response(500, &json!({ "error": "sandbox task failed" })))
        }
    }
}

fn reject(mode: crate::Mode, status: u16, body: &Value, transient: bool) -> Response {
    let mut r = json_response(status, body);
    if transient {
        let h = if mode == crate::Mode::Adyen { "transient-error" } else { "stripe-should-retry" };
        r.headers_mut().insert(h, "true".parse().unwrap());
    }
    r
}

/// Runs an admitted creation, with the fault (if any) around the commit.
async fn execute(shared: &Shared, fault: Option<Fault>, key: Option<&str>, params: &BTreeMap<String, String>) -> Response {
    if let Some(Fault::DelayBeforeCommit { ms }) = fault {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    let (status, body) = {
        let mut p = shared.provider.lock().unwrap();
        match &fault {
            Some(Fault::DropBeforeCommit) => {
                if let Some(k) = key {
                    p.forget(k);
                }
                return dropped();
            }
            Some(Fault::Stored500 { .. }) => (500, crate::provider::stripe_error("api_error", "internal", "An unknown error occurred")),
            Some(Fault::HiddenCommit500) => {
                p.create_refund(params);
                (500, crate::provider::stripe_error("api_error", "internal", "An unknown error occurred"))
            }
            Some(Fault::CommitStuckInFlight) => {
                p.create_refund(params);
                return dropped();
            }
            Some(Fault::CommitAnsweredInAnotherShape) => {
                let (status, _) = p.create_refund(params);
                (status, json!({ "ok": true }))
            }
            _ => p.create_refund(params),
        }
    };
    if let Some(k) = key {
        shared.provider.lock().unwrap().store(k, status, &body);
    }
    let mut response = json_response(status, &body);
    match fault {
        Some(Fault::DelayAfterCommit { ms }) => tokio::time::sleep(Duration::from_millis(ms)).await,
        Some(Fault::DropAfterCommit) => return dropped(),
        Some(Fault::PauseAfterCommit) => shared.pause().await,
        Some(Fault::Stored500 { should_retry: Some(retry) }) => {
            response.headers_mut().insert("stripe-should-retry", retry.to_string().parse().unwrap());
        }
        _ => {}
    }
    response
}

/// Cancels a refund that has not succeeded yet. Shares the key store with
/// creation, so a key reused across the two endpoints is refused.
async fn cancel_refund(State(shared): State<Arc<Shared>>, method: Method, uri: Uri, headers: HeaderMap, Path(id): Path<String>) -> Response {
    let observed = observe(&shared, &method, &uri, &headers, "");
    if let Some(denied) = unauthorized(&shared, &headers) {
        return denied;
    }
    let mut p = shared.provider.lock().unwrap();
    let key = match p.parse_key(observed.idempotency_key.as_deref()) {
        Ok(key) => key,
        Err((status, body)) => return json_response(status, &body),
    };
    let admission = match &key {
        Some(k) => p.admit(k, &format!("POST /v1/refunds/{id}/cancel")),
        None => Admission::Execute,
    };
    let (status, body) = match admission {
        Admission::Replay { status, body } => return json_response(status, &body),
        Admission::Reject { status, body, transient } => return reject(p.mode, status, &body, transient),
        Admission::Execute => match p.refunds.iter_mut().find(|r| r.id == id) {
            Some(r) if matches!(r.status.as_str(), "pending" | "requires_action") => {
                r.status = "canceled".into();
                (200, serde_json::to_value(&*r).unwrap_or_default())
            }
            Some(r) => (400, crate::provider::stripe_error("invalid_request_error", "refund_not_cancelable", &format!("Refund {} is {}", r.id, r.status))),
            None => (404, crate::provider::stripe_error("invalid_request_error", "resource_missing", &format!("No such refund: '{id}'"))),
        },
    };
    if let Some(k) = &key {
        p.store(k, status, &body);
    }
    json_response(status, &body)
}

async fn list_refunds(State(shared): State<Arc<Shared>>, method: Method, uri: Uri, headers: HeaderMap, Query(q): Query<HashMap<String, String>>) -> Response {
    observe(&shared, &method, &uri, &headers, "");
    if let Some(denied) = unauthorized(&shared, &headers) {
        return denied;
    }
    let limit = q.get("limit").and_then(|l| l.parse().ok()).unwrap_or(10);
    let list = shared.provider.lock().unwrap().list_refunds(q.get("payment_intent").map(String::as_str), limit, q.get("starting_after").map(String::as_str));
    match list {
        Ok(list) => json_response(200, &list),
        Err(error) => json_response(400, &error),
    }
}

async fn get_refund(State(shared): State<Arc<Shared>>, method: Method, uri: Uri, headers: HeaderMap, Path(id): Path<String>) -> Response {
    observe(&shared, &method, &uri, &headers, "");
    if let Some(denied) = unauthorized(&shared, &headers) {
        return denied;
    }
    let p = shared.provider.lock().unwrap();
    match p.refunds.iter().find(|r| r.id == id) {
        Some(r) => json_response(200, &serde_json::to_value(r).unwrap_or_default()),
        None => json_response(404, &crate::provider::stripe_error("invalid_request_error", "resource_missing", &format!("No such refund: '{id}'"))),
    }
}

async fn all_refunds(State(shared): State<Arc<Shared>>) -> Response {
    let refunds = shared.provider.lock().unwrap().refunds.clone();
    json_response(200, &serde_json::to_value(refunds).unwrap_or_default())
}

async fn all_requests(State(shared): State<Arc<Shared>>) -> Response {
    let requests = shared.requests.lock().unwrap().clone();
    json_response(200, &serde_json::to_value(requests).unwrap_or_default())
}

async fn push_fault(State(shared): State<Arc<Shared>>, axum::Json(fault): axum::Json<Fault>) -> Response {
    shared.provider.lock().unwrap().faults.push_back(fault);
    json_response(200, &json!({ "queued": true }))
}

async fn advance_clock(State(shared): State<Arc<Shared>>, axum::Json(v): axum::Json<Value>) -> Response {
    let secs = v["advance_secs"].as_u64().unwrap_or(0);
    shared.provider.lock().unwrap().clock_offset += secs;
    json_response(200, &json!({ "advanced_secs": secs }))
}

async fn release(State(shared): State<Arc<Shared>>) -> Response {
    shared.release();
    json_response(200, &json!({ "released": true }))
}

async fn set_status(State(shared): State<Arc<Shared>>, Path(id): Path<String>, axum::Json(v): axum::Json<Value>) -> Response {
    match v["status"].as_str() {
        Some(status) if shared.set_refund_status(&id, status) => json_response(200, &json!({ "id": id, "status": status })),
        Some(_) => json_response(404, &json!({ "error": format!("no refund {id}") })),
        None => json_response(400, &json!({ "error": "expected {\"status\": string}" })),
    }
}

async fn add_intent(State(shared): State<Arc<Shared>>, axum::Json(v): axum::Json<Value>) -> Response {
    match (v["id"].as_str(), v["amount"].as_u64()) {
        (Some(id), Some(amount)) => {
            shared.add_intent(id, amount, v["refund_status"].as_str().unwrap_or("succeeded"));
            json_response(200, &json!({ "id": id, "amount": amount }))
        }
        _ => json_response(400, &json!({ "error": "expected {\"id\": string, \"amount\": integer}" })),
    }
}
