//! JSON-RPC request ids in flight, per MCP session, over Streamable HTTP.
//! The protocol forbids a client to reuse a request id within its session;
//! rmcp routes a response by id, so a second request under an id still in
//! flight would take the first one's response and leave the first request's
//! stream waiting for good. Such a request is refused here, before rmcp sees
//! it — nothing run — with 409 and a JSON-RPC error that names the id. An id
//! is free again once the response of the request that held it has been
//! sent or dropped, so a client that reuses ids one request at a time is
//! served as before. Ids are held per principal *and* session: a request
//! naming another principal's session (which rmcp then refuses as unknown)
//! holds nothing of that session's, so it cannot make its owner's
//! requests collide.

use super::delivery::KeptUntilAnswered;
use rmcp::model::RequestId;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};

/// The header that names a request's MCP session.
const SESSION_HEADER: &str = "mcp-session-id";

/// The longest session id held (rmcp's are 36-character UUIDs).
const MAX_SESSION_ID: usize = 128;

/// The (session, request id) pairs whose response has not been sent yet.
#[derive(Default)]
pub(crate) struct OpenIds(Mutex<HashSet<(String, RequestId)>>);

/// Ids one HTTP request holds; dropping it (its response sent or dropped) frees them.
pub(crate) struct Held {
    of: Arc<OpenIds>,
    ids: Vec<(String, RequestId)>,
}

impl OpenIds {
    /// Holds `ids` in `session`, or, if one of them is already held, holds
    /// none and returns that one.
    fn hold(self: &Arc<Self>, session: &str, ids: Vec<RequestId>) -> Result<Held, RequestId> {
        let mut open = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let keyed: Vec<(String, RequestId)> = ids.into_iter().map(|id| (session.to_string(), id)).collect();
        if let Some((_, taken)) = keyed.iter().find(|k| open.contains(*k)) {
            return Err(taken.clone());
        }
        let mut held = Held { of: self.clone(), ids: Vec::with_capacity(keyed.len()) };
        for k in keyed {
            // A body that names one id twice holds it once (rmcp refuses it anyway).
            if open.insert(k.clone()) {
                held.ids.push(k);
            }
        }
        Ok(held)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut open = self.of.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for k in &self.ids {
            open.remove(k);
        }
    }
}

/// The ids of the JSON-RPC requests (messages with a `method` and an `id`)
/// in a POST body: one message, or a batch. Everything else in the body is
/// skipped, not built (`IgnoredAny`), so a large body costs no memory here.
fn request_ids(body: &[u8]) -> Vec<RequestId> {
    #[derive(serde::Deserialize)]
    struct Message {
        id: Option<RequestId>,
        method: Option<serde::de::IgnoredAny>,
    }
    let messages = match body.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'[') => serde_json::from_slice::<Vec<Message>>(body).unwrap_or_default(),
        _ => serde_json::from_slice::<Message>(body).map(|m| vec![m]).unwrap_or_default(),
    };
    messages.into_iter().filter(|m| m.method.is_some()).filter_map(|m| m.id).collect()
}

/// Middleware: refuses a POST that reuses a request id still in flight in
/// its session; otherwise holds its ids until its response is done (the
/// response body keeps them: `super::delivery::KeptUntilAnswered`). The body
/// is already whole and within `[mcp] max_request_bytes` here
/// (`super::listen::whole_body`).
pub(crate) async fn claim(open: Arc<OpenIds>, req: axum::extract::Request, next: axum::middleware::Next) -> axum::response::Response {
    // rmcp's session ids are UUIDs; a longer one names no session (rmcp answers 404) and is not held.
    let session = req.headers().get(SESSION_HEADER).and_then(|v| v.to_str().ok()).filter(|s| s.len() <= MAX_SESSION_ID).map(str::to_string);
    let Some(session) = session.filter(|_| req.method() == axum::http::Method::POST) else { return next.run(req).await };
    // The principal is part of the scope: the same session id named by someone else is another scope.
    let principal = req.extensions().get::<super::principals::Principal>().map(|p| p.0.as_str()).unwrap_or_default();
    let session = format!("{principal}\u{0}{session}");
    let (mut parts, body) = req.into_parts();
    // Whole already: this takes its bytes, it does not wait for them.
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        use axum::response::IntoResponse as _;
        return (axum::http::StatusCode::BAD_REQUEST, "the request body could not be read\n").into_response();
    };
    match open.hold(&session, request_ids(&bytes)) {
        Ok(held) => parts.extensions.insert(KeptUntilAnswered::new(held)),
        Err(id) => return refusal(&id),
    };
    next.run(axum::extract::Request::from_parts(parts, axum::body::Body::from(bytes))).await
}

/// 409 with a JSON-RPC error. Its `id` is null, not the reused one: a client
/// that routes responses by id must not take it for the first request's answer.
fn refusal(id: &RequestId) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    let id = serde_json::to_string(id).unwrap_or_default();
    let message = format!(
        "request id {id} is already in flight in this session; JSON-RPC ids must be unique among a session's requests. \
         Send this request again under a new id. Nothing was run"
    );
    let error = serde_json::json!({ "jsonrpc": "2.0", "id": null, "error": { "code": -32600, "message": message } });
    (axum::http::StatusCode::CONFLICT, axum::Json(error)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_held_per_session_until_its_request_is_done() {
        let open = Arc::new(OpenIds::default());
        let first = open.hold("s1", vec![RequestId::Number(7)]).unwrap();
        assert_eq!(open.hold("s1", vec![RequestId::Number(7)]).err(), Some(RequestId::Number(7)), "reused in flight");
        let other = open.hold("s2", vec![RequestId::Number(7)]).expect("another session's id 7 is its own");
        let string = open.hold("s1", vec![RequestId::String("7".into())]).expect("the string \"7\" is another id");
        drop(first);
        assert!(open.hold("s1", vec![RequestId::Number(7)]).is_ok(), "free once the first is done");
        drop((other, string));
        assert!(open.0.lock().unwrap().is_empty(), "nothing left held");
    }

    #[test]
    fn a_batch_holding_a_taken_id_holds_none_of_its_ids() {
        let open = Arc::new(OpenIds::default());
        let _first = open.hold("s", vec![RequestId::Number(2)]).unwrap();
        assert!(open.hold("s", vec![RequestId::Number(1), RequestId::Number(2)]).is_err());
        assert!(open.hold("s", vec![RequestId::Number(1)]).is_ok(), "id 1 was not left held by the refused batch");
    }

    #[test]
    fn only_requests_hold_ids() {
        assert_eq!(request_ids(br#"{"jsonrpc":"2.0","id":3,"method":"tools/call"}"#), [RequestId::Number(3)]);
        assert_eq!(request_ids(br#"{"jsonrpc":"2.0","id":"a","method":"ping"}"#), [RequestId::String("a".into())]);
        assert!(request_ids(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#).is_empty(), "a notification has none");
        assert!(request_ids(br#"{"jsonrpc":"2.0","id":3,"result":{}}"#).is_empty(), "a response answers the server's id");
        assert_eq!(request_ids(br#"[{"jsonrpc":"2.0","id":1,"method":"a"},{"jsonrpc":"2.0","id":2,"method":"b"}]"#).len(), 2);
        assert!(request_ids(b"{not json").is_empty(), "left to rmcp to refuse");
    }
}
