//! What the guard takes and gives back for one outbound request, in its own
//! terms. The plugin contract's types are converted to and from these in one
//! place, at the edge of the sandbox (`runtime::outbound::wit`); nothing in
//! the guard knows the WIT.

use crate::error::{CallError, ErrorKind};
use crate::ledger::records::{AttemptRecord, AttemptState, StoredResponse};
use serde_json::{Value, json};

/// A request a plugin asks the host to make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The HTTP method, as the plugin wrote it.
    pub method: String,
    /// The absolute URL, as the plugin wrote it (authorised before use).
    pub url: String,
    /// The plugin's headers (checked before anything is recorded).
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

/// A downstream's answer (or the recorded answer of an earlier send).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The HTTP status.
    pub status: u16,
    /// The response headers.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl From<StoredResponse> for Response {
    fn from(r: StoredResponse) -> Self {
        Self { status: r.status, body: r.body.to_bytes(), headers: r.headers }
    }
}

/// Why a request was not answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendError {
    /// No grant covers it, or the call may not send (read-only, budget spent).
    Denied(String),
    /// The ledger holds another request under this step, or another call under this id.
    Conflict(String),
    /// It may have taken effect; what the plugin and the model are told.
    OutcomeUnknown(Unsettled),
    /// Nothing reached the downstream (or the ledger is down, so nothing was sent).
    Transport(String),
    /// The request itself is malformed (headers, body size, method).
    Invalid(String),
}

/// What the plugin (and through it the model) learns of a send whose
/// outcome is not known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsettled {
    /// The idempotency key the host sent it with.
    pub key: String,
    /// Its step within the tool call.
    pub step: u32,
    /// Pending (still in flight at the provider) or unknown.
    pub state: AttemptState,
    /// Tries made so far.
    pub tries: u32,
    /// What happened and the recovery move, in words.
    pub message: String,
}

/// What to do about a send whose outcome is unknown, as every such message ends.
const RECOVERY_MOVE: &str = "Do not repeat it under a new tool-call id: check the provider's state first. Retrying the same tool-call id is safe";

impl Unsettled {
    /// The unsettled send `a`, with why it is unsettled.
    pub(crate) fn of(a: &AttemptRecord, reason: &str) -> Self {
        let tries = if a.tries == 1 { "1 try".to_string() } else { format!("{} tries", a.tries) };
        let what = if a.state == AttemptState::Pending { "is still in flight at the provider" } else { "got no definitive answer" };
        let message = format!(
            "{} {} {what} after {tries} ({reason}). It may have taken effect. {RECOVERY_MOVE}: it re-sends the same idempotency key",
            a.request.method, a.request.url
        );
        Self { key: a.key.clone(), step: a.step, state: a.state, tries: a.tries, message }
    }

    /// Send `a`, which the ledger may hold as pending though it was not
    /// sent — recovery would send it — after `tries` tries, with what
    /// happened (`what`, which the recovery move follows).
    pub(crate) fn maybe_pending(a: &AttemptRecord, tries: u32, what: String) -> Self {
        Self { key: a.key.clone(), step: a.step, state: AttemptState::Pending, tries, message: format!("{what}. {RECOVERY_MOVE}") }
    }

    /// The structured detail of an `outcome-unknown` error.
    pub fn detail(&self) -> Value {
        json!({ "key": self.key, "step": self.step, "state": self.state.as_str(), "tries": self.tries })
    }

    /// Keeps it among a run's open steps (`open`: each with its request
    /// fingerprint, one per step): the call cannot complete past it.
    pub(super) fn kept_open(self, open: &mut Vec<(String, Unsettled)>, fingerprint: &str) -> SendError {
        if !open.iter().any(|(_, o)| o.step == self.step) {
            open.push((fingerprint.to_string(), self.clone()));
        }
        SendError::OutcomeUnknown(self)
    }

    /// The `outcome-unknown` error a caller sees for it.
    pub fn into_error(self) -> CallError {
        let detail = self.detail();
        CallError::new(ErrorKind::OutcomeUnknown, self.message).with_detail(detail)
    }
}

/// A policy refusal, as the plugin is told it.
impl From<crate::policy::Refusal> for SendError {
    fn from(r: crate::policy::Refusal) -> Self {
        match r {
            crate::policy::Refusal::Denied(m) => SendError::Denied(m),
            crate::policy::Refusal::Invalid(m) => SendError::Invalid(m),
        }
    }
}

impl From<SendError> for CallError {
    fn from(e: SendError) -> Self {
        match e {
            SendError::Denied(m) => CallError::new(ErrorKind::Denied, m),
            SendError::Conflict(m) => CallError::new(ErrorKind::Conflict, m),
            SendError::Transport(m) => CallError::new(ErrorKind::Transport, m),
            SendError::Invalid(m) => CallError::new(ErrorKind::InvalidRequest, m),
            SendError::OutcomeUnknown(u) => u.into_error(),
        }
    }
}
