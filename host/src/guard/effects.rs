//! What a tool call's sends did downstream, told with any failure that
//! follows them. The one that could hide it: a plugin reporting its own
//! failure (`tool-failed`) after a send of it was answered 2xx — a refund
//! made, then its answer not understood. Told "failed", a model would do it
//! again under a new tool-call id; the host tells it `failed-after-effect`
//! instead, naming what took effect, and does not count that as a
//! definitive answer, so a blind repeat is held with this outcome
//! (`docs/guard.md`). Other failures after an effect (a trap, a refused
//! second send) keep their kind and name the effects too.
//!
//! The other: a run of a call that does not make a send an earlier run of
//! it made — the tool decided otherwise this time (another answer to its
//! question, or it is not deterministic). Whatever it returns, that send
//! took effect: the answer is `failed-after-effect`, naming it, with the
//! tool's own result beside it.

use super::{Response, SendError};
use crate::error::{CallError, ErrorKind};
use crate::ledger::AttemptRecord;
use serde::Serialize;
use serde_json::Value;

/// A send answered 2xx: what the caller is told took effect.
#[derive(Debug, Serialize)]
struct Effect {
    method: String,
    url: String,
    status: u16,
    /// Made by an earlier run of the call, and not by this one.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    earlier_run: bool,
}

/// The sends of one run that were answered 2xx (made now, replayed from an
/// earlier run, or found by reconciliation), in the order they were made,
/// then those an earlier run made that this one did not.
#[derive(Debug, Default)]
pub(super) struct Effects(Vec<Effect>);

impl Effects {
    /// Notes what `send` of `method url` came to, if it took effect.
    pub fn note(&mut self, method: &str, url: &str, sent: &Result<Response, SendError>) {
        self.push(method, url, sent, false);
    }

    /// Notes what a send an earlier run made, and this one did not, came to.
    pub fn note_earlier(&mut self, method: &str, url: &str, sent: &Result<Response, SendError>) {
        self.push(method, url, sent, true);
    }

    /// Notes what attempt `a` of an earlier run came to, if it is settled.
    pub fn note_settled_earlier(&mut self, a: &AttemptRecord) {
        if let Some(response) = a.response.clone().filter(|_| a.state.is_final()) {
            self.note_earlier(&a.request.method, &a.request.url, &Ok(response.into()));
        }
    }

    /// Whether no send of the call took effect (none answered 2xx, now or in an earlier run).
    pub fn none(&self) -> bool {
        self.0.is_empty()
    }

    fn push(&mut self, method: &str, url: &str, sent: &Result<Response, SendError>, earlier_run: bool) {
        if let Ok(r) = sent
            && (200..300).contains(&r.status)
        {
            self.0.push(Effect { method: method.to_string(), url: url.to_string(), status: r.status, earlier_run });
        }
    }

    /// `result`, with what took effect named if the call failed after a
    /// send was answered 2xx: the plugin's own failure (`tool-failed`)
    /// becomes `failed-after-effect`; any other failure keeps its kind, none
    /// of them definitive. An unknown outcome tells its own story.
    ///
    /// A result of a run that left an earlier run's effect behind becomes
    /// `failed-after-effect` too, the tool's result in `detail.tool_result`.
    pub fn disclosed(&self, result: Result<Value, CallError>) -> Result<Value, CallError> {
        let Some(first) = self.0.first() else { return result };
        let left = self.0.iter().find(|e| e.earlier_run);
        let (e, tool_result) = match (result, left) {
            (Ok(value), Some(_)) => (CallError::new(ErrorKind::ToolFailed, "the tool returned a result"), Some(value)),
            (Err(e), _) if e.kind != ErrorKind::OutcomeUnknown => (e, None),
            (other, _) => return other,
        };
        let kind = if e.kind == ErrorKind::ToolFailed { ErrorKind::FailedAfterEffect } else { e.kind };
        let message = match left {
            Some(l) => format!(
                "{} — but an earlier run of this tool call made {} {}, answered HTTP {}, and this run did not make it again \
                 (the tool decided otherwise this time): that took effect, and the tool's answer does not account for it. \
                 Do not repeat this call under a new tool-call id; check what happened first",
                e.message.trim_end_matches('.'),
                l.method,
                l.url,
                l.status
            ),
            None => format!(
                "{} — but its {} {} was answered HTTP {} before the call failed: that took effect. Do not repeat this call \
                 under a new tool-call id; check what happened first",
                e.message.trim_end_matches('.'),
                first.method,
                first.url,
                first.status
            ),
        };
        let mut detail = match e.detail {
            Some(Value::Object(map)) => map,
            Some(other) => [("tool_detail".to_string(), other)].into_iter().collect(),
            None => serde_json::Map::new(),
        };
        if let Some(value) = tool_result {
            detail.insert("tool_result".into(), value);
        }
        detail.insert("effects".into(), serde_json::to_value(&self.0).unwrap_or_default());
        Err(CallError::new(kind, message).with_detail(Value::Object(detail)))
    }
}
