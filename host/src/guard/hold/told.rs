//! What a follower of an episode is told: its executor's outcome (`held`
//! with `earlier_outcome`), or that the executor is still unresolved.

use super::new_call;
use crate::error::{CallError, ErrorKind};
use crate::guard::{CallIdentity, Guard, internal};
use crate::ledger::records::{AttemptRecord, AttemptState, CallRecord, CallState, StoredOutcome, now_ms};
use crate::ledger::{Durability, LedgerWrite};
use serde_json::{Value, json};

impl Guard {
    /// The call's stored record, if any.
    pub(super) async fn stored(&self, id: &CallIdentity) -> Result<Option<CallRecord>, CallError> {
        let (session, call_id) = (id.session.clone(), id.call_id.clone());
        self.ledger.read(move |l| l.call(&session, &call_id)).await.map_err(internal)
    }

    /// This call's record as a follower of episode `n`, written if it is new.
    pub(super) async fn follower_record(&self, id: &CallIdentity, n: u64) -> Result<CallRecord, CallError> {
        if let Some(existing) = self.stored(id).await? {
            return Ok(existing);
        }
        let call = new_call(id, n, true);
        self.ledger.commit_async(LedgerWrite::new().call(call.clone()), Durability::Buffered).await.map_err(internal)?;
        Ok(call)
    }

    /// Completes the follower with `held` carrying the executor's outcome.
    pub(super) async fn answer(&self, id: &CallIdentity, n: u64, earlier: &str, (summary, outcome): (String, Value)) -> Result<CallError, CallError> {
        let message = format!(
            "Not executed: an identical earlier call of `{}` (tool call `{earlier}`) already acted, and doing it again would \
             do it twice. Its outcome: {summary}. Nothing new was sent. If you do want a second, separate `{}`, call it again \
             with a new tool-call id.",
            id.tool, id.tool
        );
        let error = CallError::new(ErrorKind::Held, message).with_detail(json!({ "earlier_call_id": earlier, "earlier_outcome": outcome }));
        let mut call = self.follower_record(id, n).await?;
        call.state = CallState::Completed;
        call.outcome = Some(StoredOutcome::from(&error));
        call.completed_ms = Some(now_ms());
        self.ledger.commit_async(LedgerWrite::new().call(call.clone()), Durability::Buffered).await.map_err(internal)?;
        self.remember(&call);
        self.outgoing.leaving((id.session.clone(), id.tool.clone(), id.args_digest.clone()), &id.call_id);
        Ok(error)
    }

    /// `held` without an outcome: the executor is still unresolved.
    pub(super) async fn held(&self, id: &CallIdentity, executor: &str) -> CallError {
        let (session, call_id) = (id.session.clone(), executor.to_string());
        let attempts = self.ledger.read(move |l| l.attempts_of_call(&session, &call_id)).await.unwrap_or_default();
        let unsettled = attempts.iter().find(|a| a.state.is_unsettled());
        let message = format!(
            "Not executed: an identical earlier call of `{}` (tool call `{executor}`) has not finished or its outcome is still \
             unknown, so running this one could do it twice. Check its status first (for refunds: refund_status), or retry tool \
             call `{executor}` itself, which is safe. Retrying this call later returns the earlier call's outcome once it is known.",
            id.tool
        );
        CallError::new(ErrorKind::Held, message).with_detail(json!({
            "earlier_call_id": executor,
            "earlier_key": unsettled.map(|a| a.key.clone()),
            "earlier_state": unsettled.map_or("running", |a| a.state.as_str()),
        }))
    }
}

/// A completed call's outcome, in words and as the follower's detail.
pub(super) fn earlier_outcome(outcome: &StoredOutcome) -> (String, Value) {
    match outcome {
        StoredOutcome::Result(value) => (format!("it succeeded with {}", excerpt(&value.to_string())), json!({ "result": value })),
        StoredOutcome::Error { kind, message, .. } => {
            (format!("it failed ({kind}: {})", excerpt(message)), json!({ "error": { "kind": kind, "message": message } }))
        }
    }
}

/// What the sends of a call that never completed got back from the provider.
pub(super) fn sends_outcome(attempts: &[AttemptRecord]) -> (String, Value) {
    let sends: Vec<Value> = attempts
        .iter()
        .map(|a| {
            let body = a.response.as_ref().map(|r| {
                let text = String::from_utf8_lossy(&r.body.to_bytes()).into_owned();
                serde_json::from_str::<Value>(&text).unwrap_or(Value::String(text))
            });
            json!({ "step": a.step, "method": a.request.method, "url": a.request.url, "key": a.key, "state": a.state.as_str(),
                    "status": a.response.as_ref().map(|r| r.status), "body": body })
        })
        .collect();
    let words: Vec<String> = attempts
        .iter()
        .filter(|a| a.state != AttemptState::Failed || a.response.is_some())
        .map(|a| {
            let status = a.response.as_ref().map_or("no response".to_string(), |r| format!("HTTP {}", r.status));
            let body = a.response.as_ref().map(|r| excerpt(&String::from_utf8_lossy(&r.body.to_bytes()))).unwrap_or_default();
            format!("{} {} was answered {status} {body}", a.request.method, a.request.url)
        })
        .collect();
    let summary = format!("{} (that tool call has not completed; retrying it returns its result)", words.join("; "));
    (summary, json!({ "sends": sends }))
}

/// At most 300 characters of `text`.
fn excerpt(text: &str) -> String {
    const MAX: usize = 300;
    match text.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}
