//! A task's driver: the call run again under its own tool-call id until
//! its answer is definitive, reporting each try into the task's state.

use super::{Answer, MAX_PAUSE, Progress, Snapshot, answers, lock};
use crate::error::ErrorKind;
use crate::guard::Gate;
use crate::runtime::{CallRequest, Runtime};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// One driver: the call it runs, through which gate, reporting where,
/// woken by whom.
pub(super) struct Driving {
    pub(super) runtime: Arc<Runtime>,
    pub(super) request: Arc<CallRequest>,
    pub(super) gate: Arc<Gate>,
    pub(super) state: watch::Sender<Snapshot>,
    pub(super) wake: Arc<tokio::sync::Notify>,
    pub(super) answers: Arc<Mutex<answers::Answers>>,
}

/// What a task says before its first try has answered.
pub(crate) const STARTED: &str = "running the tool call";

/// What a task says while its call waits behind an identical earlier one.
pub(crate) const HELD: &str = "an identical earlier call is still unsettled; this one waits for its outcome and does not act on its own. \
                               Poll this task; do not repeat the call";

impl Driving {
    /// Runs the call until its answer is definitive (then the task's result)
    /// or until `until`, pausing between tries from `poll` up to
    /// [`MAX_PAUSE`]. Each try is the same tool call under the same id: a
    /// completed call replays, an unsettled send is re-sent with its own key
    /// or looked up at the provider, never made anew (`docs/guard.md`).
    pub(super) async fn settle(self, poll: Duration, until: Instant) {
        let mut pause = poll;
        loop {
            let inputs = Arc::new(lock(&self.answers).inputs());
            let answer = self.runtime.call_as_task(&self.request, &self.gate, inputs).await;
            let now = crate::ledger::records::now_ms();
            let working = unsettled(&answer);
            let settled = working.is_none();
            let approval = crate::mcp::approval::awaited(&answer).cloned();
            let asked = {
                let mut answers = lock(&self.answers);
                answers.stopped_at(crate::mcp::questions::asked(&answer));
                answers.open()
            };
            // Questions wait for the client's answers (which wake the driver); a
            // decision may come from anywhere, so each try is a ledger read at the client's pace.
            let next = if asked.is_some() {
                until.saturating_duration_since(Instant::now())
            } else if approval.is_some() {
                poll
            } else {
                pause
            };
            let waits_for_answers = asked.is_some();
            self.state.send_modify(|s| {
                s.progress = working.map_or(Progress::Settled(answer), Progress::Working);
                // The same request keeps its key until an answer to it is delivered; another gets its own.
                if approval.as_ref().map(|a| &a["request"]) != s.approval.as_ref().map(|a| &a["request"]) {
                    s.approval_key = approval_key(approval.as_ref());
                }
                s.approval = approval;
                s.asked = asked;
                s.updated_ms = now;
            });
            // Waiting for answers, it waits up to its time to live.
            let out_of_time = if waits_for_answers { Instant::now() >= until } else { Instant::now() + next > until };
            if settled || out_of_time {
                return;
            }
            tokio::select! {
                () = tokio::time::sleep(next) => pause = (next * 2).min(MAX_PAUSE),
                () = self.wake.notified() => pause = poll,
            }
        }
    }
}

/// A new key for the approval request `approval` (`detail.approval`), if any.
pub(super) fn approval_key(approval: Option<&serde_json::Value>) -> Option<String> {
    approval.and_then(|a| a["request"].as_str()).map(crate::mcp::approval::fresh_key)
}

/// Why `answer` does not settle its call, in words for the model; `None`
/// when it is definitive.
pub(crate) fn unsettled(answer: &Answer) -> Option<String> {
    let Err(e) = answer else { return None };
    match e.kind {
        ErrorKind::OutcomeUnknown => Some(
            "the provider may already have carried this out and has not yet said so; toolguard keeps settling it (its own \
             idempotency key re-sent, or the provider's records looked up) and nothing is done twice. Poll this task for \
             the real outcome; do not repeat the call"
                .into(),
        ),
        ErrorKind::Held if e.detail.as_ref().is_none_or(|d| d.get("earlier_outcome").is_none()) => Some(HELD.into()),
        ErrorKind::AwaitingApproval => Some(format!("{}. Poll this task; do not repeat the call", e.message)),
        ErrorKind::InputRequired => Some("the tool asks its client the questions this task lists; answer them with tasks/update".into()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CallError, CallOutput};
    use serde_json::json;

    #[test]
    fn only_an_unknown_outcome_or_a_hold_without_one_keeps_a_task_working() {
        let error = |kind, detail| Err(CallError { kind, message: "m".into(), detail });
        assert!(unsettled(&error(ErrorKind::OutcomeUnknown, None)).is_some());
        assert!(unsettled(&error(ErrorKind::AwaitingApproval, None)).is_some());
        assert!(unsettled(&error(ErrorKind::Held, Some(json!({ "earlier": "c1" })))).is_some());
        assert!(unsettled(&error(ErrorKind::Held, Some(json!({ "earlier_outcome": {} })))).is_none(), "held with the earlier outcome is told");
        for kind in [ErrorKind::ToolFailed, ErrorKind::Transport, ErrorKind::Conflict, ErrorKind::Denied, ErrorKind::Internal] {
            assert!(unsettled(&error(kind, None)).is_none(), "{kind}");
        }
        assert!(unsettled(&Ok(CallOutput { value: json!({}), replayed: false })).is_none());
    }
}
