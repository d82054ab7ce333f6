//! A ticket desk that, like most ticket, e-mail and chat APIs, ignores
//! idempotency keys: every `POST /v1/tickets` opens a new ticket. What it
//! keeps is whatever the request body carries, including an `external_ref`
//! field the caller may set — toolguard puts its key there, so a reconciler
//! can find the ticket later with `GET /v1/tickets?external_ref=…`.
//!
//! Faults: a queued `DelayAfterCommit` opens the ticket, then answers late
//! (the caller times out; the ticket exists); `Sandbox::set_list_lag` keeps
//! new tickets out of searches for a while (an eventually consistent index).

use crate::Shared;
use crate::http::{json_response, observe};
use crate::provider::Fault;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, Method, Uri};
use axum::response::Response;
use serde::Serialize;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// One ticket as the desk stores it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Ticket {
    pub id: String,
    pub subject: String,
    pub body: String,
    /// The caller's reference, if it sent one (toolguard's key travels here).
    pub external_ref: Option<String>,
    /// When it was opened (Unix ms); searches show it only `list_lag` later.
    #[serde(skip)]
    pub created_ms: u64,
}

pub(crate) async fn create(State(shared): State<Arc<Shared>>, method: Method, uri: Uri, headers: HeaderMap, body: String) -> Response {
    observe(&shared, &method, &uri, &headers, &body);
    let Ok(v) = serde_json::from_str::<Value>(&body) else {
        return json_response(400, &json!({ "error": "the body must be a JSON object" }));
    };
    let (Some(subject), Some(text)) = (v["subject"].as_str(), v["body"].as_str()) else {
        return json_response(400, &json!({ "error": "subject and body are required strings" }));
    };
    let (ticket, delay) = {
        let mut p = shared.provider.lock().unwrap();
        let delay = match p.faults.front() {
            Some(Fault::DelayAfterCommit { ms }) => {
                let ms = *ms;
                p.faults.pop_front();
                Some(ms)
            }
            _ => None,
        };
        let ticket = Ticket {
            id: format!("tkt_{:04}", p.tickets.len() + 1),
            subject: subject.into(),
            body: text.into(),
            external_ref: v["external_ref"].as_str().map(str::to_string),
            created_ms: crate::provider::now_ms(),
        };
        p.tickets.push(ticket.clone());
        (ticket, delay)
    };
    if let Some(ms) = delay {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    json_response(201, &serde_json::to_value(ticket).unwrap_or_default())
}

pub(crate) async fn list(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    observe(&shared, &method, &uri, &headers, "");
    let p = shared.provider.lock().unwrap();
    let visible = crate::provider::now_ms().saturating_sub(p.list_lag.as_millis() as u64);
    let data: Vec<&Ticket> =
        p.tickets.iter().filter(|t| t.created_ms <= visible).filter(|t| q.get("external_ref").is_none_or(|r| t.external_ref.as_ref() == Some(r))).collect();
    json_response(200, &json!({ "data": data }))
}
