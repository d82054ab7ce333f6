//! Every conversion between the plugin contract's types (`wit/plugin.wit`,
//! as wasmtime's bindgen generates them) and the guard's, in one file: what
//! a plugin sends and is told, what a reconciler is asked and answers, and
//! the errors a plugin reports back.

use crate::error::{CallError, ErrorKind};
use crate::guard::{self, Reconciled, SendError, Unsettled};
use crate::ledger::records::{AttemptRecord, AttemptState, StoredBody, StoredResponse};
use crate::runtime::bindings::types;
use serde_json::json;

/// A plugin's request, for the guard.
pub fn request(r: types::Request) -> guard::Request {
    guard::Request { method: r.method, url: r.url, headers: r.headers.into_iter().map(|h| (h.name, h.value)).collect(), body: r.body }
}

/// The guard's answer, for the plugin.
pub fn response(r: guard::Response) -> types::Response {
    types::Response { status: r.status, headers: headers(r.headers), body: r.body }
}

fn headers(h: Vec<(String, String)>) -> Vec<types::Header> {
    h.into_iter().map(|(name, value)| types::Header { name, value }).collect()
}

/// The guard's refusal or unknown outcome, for the plugin.
pub fn send_error(e: SendError) -> types::OutboundError {
    match e {
        SendError::Denied(m) => types::OutboundError::Denied(m),
        SendError::Conflict(m) => types::OutboundError::Conflict(m),
        SendError::Transport(m) => types::OutboundError::Transport(m),
        SendError::Invalid(m) => types::OutboundError::Invalid(m),
        SendError::OutcomeUnknown(u) => types::OutboundError::OutcomeUnknown(attempt_info(u)),
    }
}

fn attempt_info(u: Unsettled) -> types::AttemptInfo {
    types::AttemptInfo { key: u.key, step: u.step, state: attempt_state(u.state), tries: u.tries, message: u.message }
}

/// An attempt's state, as the contract names it.
pub fn attempt_state(s: AttemptState) -> types::AttemptState {
    match s {
        AttemptState::Pending => types::AttemptState::Pending,
        AttemptState::Succeeded => types::AttemptState::Succeeded,
        AttemptState::Failed => types::AttemptState::Failed,
        AttemptState::Unknown => types::AttemptState::Unknown,
    }
}

fn from_attempt_state(s: types::AttemptState) -> AttemptState {
    match s {
        types::AttemptState::Pending => AttemptState::Pending,
        types::AttemptState::Succeeded => AttemptState::Succeeded,
        types::AttemptState::Failed => AttemptState::Failed,
        types::AttemptState::Unknown => AttemptState::Unknown,
    }
}

/// A recorded attempt, as a reconciler is shown it (its key, step, state,
/// the request as sent without the host's headers, and its tries).
pub fn attempt(a: &AttemptRecord) -> types::Attempt {
    types::Attempt {
        key: a.key.clone(),
        step: a.step,
        state: attempt_state(a.state),
        request: types::Request {
            method: a.request.method.clone(),
            url: a.request.url.clone(),
            headers: headers(a.request.headers.clone()),
            body: a.request.body.to_bytes(),
        },
        tries: a.tries,
    }
}

/// What a reconciler found, for the guard.
pub fn reconciliation(r: types::Reconciliation) -> Reconciled {
    match r {
        types::Reconciliation::Found(r) => Reconciled::Found(StoredResponse {
            status: r.status,
            headers: r.headers.into_iter().map(|h| (h.name, h.value)).collect(),
            body: StoredBody::from_bytes(&r.body),
        }),
        types::Reconciliation::NotFound => Reconciled::NotFound,
        types::Reconciliation::StillUnknown(why) => Reconciled::StillUnknown(why),
    }
}

/// The error a plugin reported, under the kind the caller expects.
pub fn tool_error(e: types::ToolError) -> CallError {
    use types::{OutboundError as O, ToolError as T};
    match e {
        T::InvalidArgs(m) => CallError::new(ErrorKind::InvalidArgs, m),
        T::Failed(m) => CallError::new(ErrorKind::ToolFailed, m),
        T::Outbound(O::Denied(m)) => SendError::Denied(m).into(),
        T::Outbound(O::Conflict(m)) => SendError::Conflict(m).into(),
        T::Outbound(O::Transport(m)) => SendError::Transport(m).into(),
        T::Outbound(O::Invalid(m)) => SendError::Invalid(m).into(),
        T::Outbound(O::Held(h)) => CallError::new(ErrorKind::Held, h.message).with_detail(json!({ "earlier_call_id": h.earlier_call_id })),
        T::Outbound(O::OutcomeUnknown(a)) => {
            Unsettled { key: a.key, step: a.step, state: from_attempt_state(a.state), tries: a.tries, message: a.message }.into_error()
        }
    }
}
