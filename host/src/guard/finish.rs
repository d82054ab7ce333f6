//! The last steps of a tool call: finishing its run (completed, or left for
//! a retry or recovery), and recording what its caller was told — which
//! closes the episode of an irreversible action (`docs/guard.md`).

use super::drive::outcomes_written;
use super::{CallGuard, Guard};
use crate::error::{CallError, ErrorKind};
use crate::ledger::records::{CallRecord, CallState, EpisodeId, Reported, StoredOutcome, now_ms};
use crate::ledger::{Durability, EpisodeOp, LedgerError, LedgerWrite, QueuedWrite};
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
        // Not waited for: the answer goes on while the writer applies it.
        // The call's lock keeps it (a [`Landing`]) until it has landed, so
        // whoever takes the lock next reads what the ledger holds; a
        // replay meanwhile is answered from memory (docs/ledger.md).
        let (write, outcomes) = call.completion(record.clone());
        self.remember(&record);
        let leaving = record.episode.is_some().then(|| ((record.session.clone(), record.tool.clone(), record.args_digest.clone()), record.call_id.clone()));
        let mut landing = Landing::new(self.ledger.queue(write, Durability::Buffered), outcomes, record);
        // Applied on this thread already when nothing was queued ahead of it.
        landing.landed();
        call.leave(landing);
        if let Some((action, call_id)) = leaving {
            self.outgoing.leaving(action, &call_id);
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
        let mut lock = self.call_lock(session, call_id).lock_owned().await;
        // The completion this host's run of the call queued, if nobody has
        // waited for it yet: its record is what the ledger will hold, and a
        // ledger that applies writes in order lands this report after it
        // without waiting for it first. It stays in the lock until it has
        // landed, so a cancelled report leaves it for the next holder.
        let in_order = self.ledger.lands_in_order();
        let known = match lock.as_mut() {
            Some(landing) if in_order => landing.record.take(),
            Some(landing) => {
                landing.wait().await;
                None
            }
            None => None,
        };
        let call = match known {
            Some(record) => record,
            None => {
                let (s, c) = (session.to_string(), call_id.to_string());
                let Some(call) = self.ledger.read(move |l| l.call(&s, &c)).await? else { return Ok(()) };
                call
            }
        };
        let action = (call.session.clone(), call.tool.clone(), call.args_digest.clone());
        let written = self.record_report(call, reported, delivered_ms).await;
        if let Some(landing) = lock.as_mut() {
            landing.wait().await;
        }
        *lock = None;
        self.outgoing.recorded(&action, call_id);
        written
    }

    async fn record_report(&self, call: CallRecord, reported: Reported, delivered_ms: u64) -> Result<(), LedgerError> {
        if call.reported == Reported::Definitive || call.reported == reported {
            return Ok(());
        }
        let _action = self.action_lock(&call.session, &call.tool, &call.args_digest).lock_owned().await;
        // The ledger closes the episode it holds: no need to read it here.
        let close = match (reported, EpisodeId::of_call(&call)) {
            (Reported::Definitive, Some(episode)) => Some(EpisodeOp::Close { episode, at_ms: delivered_ms }),
            _ => None,
        };
        // Read (or written) under the call's lock, which is held: the ledger
        // need not read the record again.
        let mut write = LedgerWrite::new().reported_on(call, reported);
        if let Some(close) = close {
            write = write.episode(close);
        }
        self.ledger.commit_async(write, Durability::Buffered).await
    }
}

/// A tool call's completion, queued and not waited for, kept in the call's
/// lock ([`super::claim::CallLock`]) until it lands: the next holder of the
/// lock waits for it, so nobody reads the call before the ledger holds it.
pub(super) struct Landing {
    write: QueuedWrite,
    call_id: String,
    /// The keys of the attempts whose outcomes ride with it; emptied once
    /// how the write went has been told.
    outcomes: Vec<String>,
    /// The call, as completed: for the report of what its caller was told.
    record: Option<CallRecord>,
    /// Whether how the write went has been told (logged) yet.
    told: bool,
}

impl Landing {
    /// The completion `write` of `record`, with the outcomes of `outcomes`.
    fn new(write: QueuedWrite, outcomes: Vec<String>, record: CallRecord) -> Self {
        Self { write, call_id: record.call_id.clone(), outcomes, record: Some(record), told: false }
    }

    /// Whether the write has landed; how it went is told the first time it has.
    pub(super) fn landed(&mut self) -> bool {
        if self.told {
            return true;
        }
        let Some(written) = self.write.try_wait() else { return false };
        self.tell(written);
        true
    }

    /// Waits for the write to land, and tells how it went. Cancelled, it
    /// can be waited for again.
    pub(super) async fn wait(&mut self) {
        if !self.told {
            let written = self.write.landed().await;
            self.tell(written);
        }
    }

    /// Tells how the write went: the completion's, and its outcomes'.
    fn tell(&mut self, written: Result<(), LedgerError>) {
        self.told = true;
        if let Err(e) = &written {
            tracing::warn!(error = %e, call_id = %self.call_id, "could not record the completed tool call; a replay will re-run it");
        }
        outcomes_written(&std::mem::take(&mut self.outcomes), written);
    }
}

#[cfg(test)]
#[path = "landing_tests.rs"]
mod tests;
