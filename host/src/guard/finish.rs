//! The last steps of a tool call: finishing its run (completed, or left for
//! a retry or recovery), and recording what its caller was told — which
//! closes the episode of an irreversible action (`docs/guard.md`).

use super::drive::outcomes_written;
use super::{CallGuard, Guard};
use crate::error::{CallError, ErrorKind};
use crate::ledger::records::{CallRecord, CallState, EpisodeId, Reported, StoredOutcome, now_ms};
use crate::ledger::{Durability, EpisodeOp, LedgerError, LedgerWrite};
use serde_json::Value;

impl Guard {
    /// Ends a tool call: an unsettled send makes it `outcome-unknown` whatever
    /// the plugin returned; a result (or a tool-reported failure) completes it.
    pub async fn finish(&self, mut call: CallGuard, result: Result<Value, CallError>) -> Result<Value, CallError> {
        if let Some(info) = call.take_unsettled() {
            self.end_uncompleted(&mut call).await;
            let message = match &result {
                Err(e) if e.kind == ErrorKind::OutcomeUnknown => e.message.clone(),
                _ => info.message.clone(),
            };
            let detail = info.detail();
            return Err(CallError::new(ErrorKind::OutcomeUnknown, message).with_detail(detail));
        }
        let outcome = match &result {
            Ok(value) => StoredOutcome::Result(value.clone()),
            Err(e) if e.kind == ErrorKind::ToolFailed => StoredOutcome::from(e),
            Err(_) => {
                self.end_uncompleted(&mut call).await;
                return result;
            }
        };
        let mut record = call.record().clone();
        record.state = CallState::Completed;
        record.outcome = Some(outcome);
        record.completed_ms = Some(now_ms());
        // Completed: no claim is needed any more.
        (record.owner, record.lease_until_ms) = (None, None);
        // Buffered: a lost completion is rebuilt by re-running the plugin,
        // whose sends replay from their recorded attempts. The buffered
        // outcomes of those sends ride with it: one write, and a completion
        // never lands without them (docs/ledger.md).
        let (write, outcomes) = call.completion(record.clone());
        match self.ledger.queue(write, Durability::Buffered).wait().await {
            Ok(()) => {
                outcomes_written(&outcomes, Ok(()));
                self.remember(&record);
            }
            Err(e) => {
                tracing::warn!(error = %e, call_id = %record.call_id, "could not record the completed tool call; a replay will re-run it");
                outcomes_written(&outcomes, Err(e));
            }
        }
        if record.episode.is_some() {
            self.outgoing.leaving((record.session.clone(), record.tool.clone(), record.args_digest.clone()), &record.call_id);
        }
        result
    }

    /// Ends a run that did not complete its call: its outcome writes land,
    /// then its claim (on a shared ledger) is released.
    async fn end_uncompleted(&self, call: &mut CallGuard) {
        call.flush().await;
        self.release(call.record()).await;
    }

    /// Records that the caller of tool call (`session`, `call_id`) was told
    /// `reported`, the answer having left the host at `delivered_ms`. A
    /// definitive answer closes the call's episode as of that time: an
    /// identical call that arrived later is a new action. Never lowers a
    /// definitive report.
    ///
    /// # Errors
    /// The ledger could not be read or written.
    pub async fn report(&self, session: &str, call_id: &str, reported: Reported, delivered_ms: u64) -> Result<(), LedgerError> {
        let _lock = self.lock_call(session, call_id).await;
        let (s, c) = (session.to_string(), call_id.to_string());
        let Some(call) = self.ledger.read(move |l| l.call(&s, &c)).await? else { return Ok(()) };
        let action = (call.session.clone(), call.tool.clone(), call.args_digest.clone());
        let written = self.record_report(call, reported, delivered_ms).await;
        self.outgoing.recorded(&action, call_id);
        written
    }

    async fn record_report(&self, call: CallRecord, reported: Reported, delivered_ms: u64) -> Result<(), LedgerError> {
        let (session, call_id) = (call.session.as_str(), call.call_id.as_str());
        if call.reported == Reported::Definitive || call.reported == reported {
            return Ok(());
        }
        let mut write = LedgerWrite::new().reported(session, call_id, reported);
        let _action = self.action_lock(session, &call.tool, &call.args_digest).lock_owned().await;
        // The ledger closes the episode it holds: no need to read it here.
        if let (Reported::Definitive, Some(episode)) = (reported, EpisodeId::of_call(&call)) {
            write = write.episode(EpisodeOp::Close { episode, at_ms: delivered_ms });
        }
        self.ledger.commit_async(write, Durability::Buffered).await
    }
}
