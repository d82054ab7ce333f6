//! The last steps of a tool call: finishing its run (completed, or left for
//! a retry or recovery), and recording what its caller was told — which
//! closes the episode of an irreversible action (`docs/guard.md`).

use super::claim::Held;
use super::landing::Landing;
use super::{CallGuard, Guard};
use crate::error::{CallError, ErrorKind};
use crate::ledger::records::{CallRecord, CallState, EpisodeId, Reported, StoredOutcome, now_ms};
use crate::ledger::{Durability, EpisodeOp, LedgerError, LedgerWrite};
use serde_json::Value;

impl Guard {
    /// Ends a tool call: an unsettled send makes it `outcome-unknown` whatever
    /// the plugin returned; a result (or a tool-reported failure) completes it.
    /// A run that did not make a send an earlier run of the call made
    /// answers for it too (settled first, as recovery would): a question
    /// asked is the one answer that does not.
    pub async fn finish(&self, mut call: CallGuard, result: Result<Value, CallError>) -> Result<Value, CallError> {
        let asking = matches!(&result, Err(e) if e.kind == ErrorKind::InputRequired);
        if !asking && let Err(e) = call.settle_left_behind().await {
            self.end_uncompleted(&mut call).await;
            return Err(e.into());
        }
        if let Some(info) = call.take_unsettled() {
            self.end_uncompleted(&mut call).await;
            let message = match &result {
                Err(e) if e.kind == ErrorKind::OutcomeUnknown => e.message.clone(),
                _ => info.message.clone(),
            };
            let detail = info.detail();
            return Err(CallError::new(ErrorKind::OutcomeUnknown, message).with_detail(detail));
        }
        let result = call.disclosed(result);
        let outcome = match &result {
            Ok(value) => StoredOutcome::Result(value.clone()),
            Err(e) if matches!(e.kind, ErrorKind::ToolFailed | ErrorKind::FailedAfterEffect) || super::approval::is_decision(e) => StoredOutcome::from(e),
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
        // replay meanwhile is answered from memory (docs/ledger.md). An
        // irreversible call's completion, on a ledger that lands writes in
        // order, is not even queued yet: it rides with the report of what
        // the caller was told, one write instead of two (`super::landing`).
        let unspent = call.unspent(&mut record);
        self.remember(&record);
        let leaving = record.episode.is_some().then(|| ((record.session.clone(), record.tool.clone(), record.args_digest.clone()), record.call_id.clone()));
        if leaving.is_some() && self.ledger.lands_in_order() {
            let (held, outcomes) = call.take_held();
            let held = held.and(unspent);
            let lock = call.leave(Landing::deferred(self.ledger.clone(), held, outcomes, record));
            self.deferrals.watch(lock);
        } else {
            let (write, outcomes) = call.completion(record.clone());
            let write = write.and(unspent);
            let mut landing = Landing::new(self.ledger.queue(write, Durability::Buffered), outcomes, record);
            // Applied on this thread already when nothing was queued ahead of it.
            landing.landed();
            call.leave(landing);
        }
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
        // The completion this host's run of the call left, if nobody has
        // waited for it yet: its record is what the ledger holds or will. A
        // ledger that applies writes in order lands this report after it
        // without waiting for it first (and one still deferred rides with
        // it); it stays in the lock until it has landed, so a cancelled
        // report leaves it for the next holder.
        if !self.ledger.lands_in_order()
            && let Some(landing) = lock.as_mut()
        {
            let _ = landing.wait().await;
        }
        let known = lock.as_ref().and_then(|landing| landing.record.as_ref());
        let read = match known {
            Some(_) => None,
            None => {
                let (s, c) = (session.to_string(), call_id.to_string());
                let Some(call) = self.ledger.read(move |l| l.call(&s, &c)).await? else { return Ok(()) };
                Some(call)
            }
        };
        let call = known.or(read.as_ref()).expect("known or read");
        let action = (call.session.clone(), call.tool.clone(), call.args_digest.clone());
        let written = if call.reported == Reported::Definitive || call.reported == reported {
            Ok(())
        } else {
            self.record_report(&mut lock, read, reported, delivered_ms).await
        };
        // The completion (if it did not ride with the report): landed before the lock goes.
        let landed = match lock.as_mut() {
            Some(landing) => landing.wait().await,
            None => Ok(()),
        };
        *lock = None;
        self.outgoing.recorded(&action, call_id);
        written.and(landed)
    }

    /// Writes that the caller of the call in `lock` was told `reported`,
    /// closing its episode if that is definitive: the call is the one its
    /// landing keeps, or else `read`. A completion still deferred rides
    /// with it, the call's record written once.
    async fn record_report(&self, lock: &mut Held, read: Option<CallRecord>, reported: Reported, delivered_ms: u64) -> Result<(), LedgerError> {
        let call = read.as_ref().or_else(|| lock.as_ref().and_then(|landing| landing.record.as_ref())).expect("known or read");
        let _action = self.action_lock(&call.session, &call.tool, &call.args_digest).lock_owned().await;
        // From here to the queueing of the write, nothing waits: the
        // deferred completion is never taken out and left behind.
        let mut landing = lock.as_mut();
        let call = read.or_else(|| landing.as_mut().and_then(|l| l.record.take())).expect("known or read");
        // The ledger closes the episode it holds: no need to read it here.
        let close = match (reported, EpisodeId::of_call(&call)) {
            (Reported::Definitive, Some(episode)) => Some(EpisodeOp::Close { episode, at_ms: delivered_ms }),
            _ => None,
        };
        let (write, riding) = match landing {
            Some(landing) => match landing.take_deferred() {
                Some((held, _)) => (held.call(CallRecord { reported, ..call }), Some(landing)),
                None => (LedgerWrite::new().reported_on(call, reported), None),
            },
            // Read (or written) under the call's lock, which is held: the
            // ledger need not read the record again.
            None => (LedgerWrite::new().reported_on(call, reported), None),
        };
        let write = match close {
            Some(close) => write.episode(close),
            None => write,
        };
        let queued = self.ledger.queue(write, Durability::Buffered);
        match riding {
            // Waited for, and told, as the completion's landing.
            Some(landing) => {
                landing.ride(queued);
                Ok(())
            }
            None => queued.wait().await,
        }
    }
}
