//! What a tool call's sends did downstream, told with any failure that
//! follows them. The one that could hide it: a plugin reporting its own
//! failure (`tool-failed`) after a send of it was answered 2xx — a refund
//! made, then its answer not understood. Told "failed", a model would do it
//! again under a new tool-call id; the host tells it `failed-after-effect`
//! instead, naming what took effect, and does not count that as a
//! definitive answer, so a blind repeat is held with this outcome
//! (`docs/guard.md`). Other failures after an effect (a trap, a refused
//! second send) keep their kind and name the effects too.

use super::{Response, SendError};
use crate::error::{CallError, ErrorKind};
use serde::Serialize;
use serde_json::Value;

/// A send answered 2xx: what the caller is told took effect.
#[derive(Debug, Serialize)]
struct Effect {
    method: String,
    url: String,
    status: u16,
}

/// The sends of one run that were answered 2xx (made now, replayed from an
/// earlier run, or found by reconciliation), in the order they were made.
#[derive(Debug, Default)]
pub(super) struct Effects(Vec<Effect>);

impl Effects {
    /// Notes what `send` of `method url` came to, if it took effect.
    pub fn note(&mut self, method: &str, url: &str, sent: &Result<Response, SendError>) {
        if let Ok(r) = sent
            && (200..300).contains(&r.status)
        {
            self.0.push(Effect { method: method.to_string(), url: url.to_string(), status: r.status });
        }
    }

    /// `result`, with what took effect named if the call failed after a
    /// send was answered 2xx: the plugin's own failure (`tool-failed`)
    /// becomes `failed-after-effect`; any other failure keeps its kind, none
    /// of them definitive. An unknown outcome tells its own story.
    pub fn disclosed(&self, result: Result<Value, CallError>) -> Result<Value, CallError> {
        let Some(first) = self.0.first() else { return result };
        let e = match result {
            Err(e) if e.kind != ErrorKind::OutcomeUnknown => e,
            other => return other,
        };
        let kind = if e.kind == ErrorKind::ToolFailed { ErrorKind::FailedAfterEffect } else { e.kind };
        let message = format!(
            "{} — but its {} {} was answered HTTP {} before the call failed: that took effect. Do not repeat this call \
             under a new tool-call id; check what happened first",
            e.message.trim_end_matches('.'),
            first.method,
            first.url,
            first.status
        );
        let mut detail = match e.detail {
            Some(Value::Object(map)) => map,
            Some(other) => [("tool_detail".to_string(), other)].into_iter().collect(),
            None => serde_json::Map::new(),
        };
        detail.insert("effects".into(), serde_json::to_value(&self.0).unwrap_or_default());
        Err(CallError::new(kind, message).with_detail(Value::Object(detail)))
    }
}
