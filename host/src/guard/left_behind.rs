//! What earlier runs of a call left for this one: the sends they made that
//! this run did not make again — a tool that decides otherwise when its
//! call runs again (a clock, randomness, a hostile plugin) must not end
//! with an answer that hides them (`docs/guard.md`) — and the answers to
//! its questions they were made on ([`super::answers`]).

use super::unconfirmed::ledger_down;
use super::{Answered, CallGuard, SendError, Unsettled};
use crate::ledger::records::Resolution;
use crate::policy;
use serde_json::Value;

impl CallGuard {
    /// Notes that an earlier run of the call may have sent ([`CallGuard::settle_left_behind`]).
    pub(super) fn after_earlier_runs(mut self, ran_before: bool) -> Self {
        self.ran_before = ran_before;
        self
    }

    /// The sends an earlier run of this call made at steps this run did not
    /// reach — the tool decided otherwise this time (another answer to its
    /// question, or it is not deterministic) — settled as recovery would
    /// (the same key re-sent, or reconciled; never a new key) and noted with
    /// the call's effects; one still unsettled leaves the call unsettled.
    /// Its answer must account for them (`docs/guard.md`).
    ///
    /// # Errors
    /// The ledger could not be read.
    pub(super) async fn settle_left_behind(&mut self) -> Result<(), SendError> {
        if !self.ran_before {
            return Ok(());
        }
        let (session, call_id, reached) = (self.record.session.clone(), self.record.call_id.clone(), self.next_step);
        let mut behind = self.guard.ledger.read(move |ledger| ledger.attempts_of_call(&session, &call_id)).await.map_err(ledger_down)?;
        behind.retain(|a| a.step >= reached);
        behind.sort_by_key(|a| a.step);
        for a in behind {
            // Settled: what it came to (a send settled as never sent took no effect).
            if a.state.is_final() {
                self.progress.effects.note_settled_earlier(&a);
                continue;
            }
            let (method, url) = (a.request.method.clone(), a.request.url.clone());
            let outcome = if a.resolution == Some(Resolution::HostFault) {
                Err(self.left_for_operator(&a))
            } else {
                match policy::authorize(&self.rules.grants, self.rules.wires.downstreams(), &method, &url) {
                    Ok((downstream, _)) if downstream.name == a.downstream => self.redrive(a.step, &downstream).await,
                    _ => Err(Unsettled::of(&a, "the policy no longer grants it, so it is not re-sent; an operator must settle it")
                        .kept_open(&mut self.open_steps, &a.fingerprint)),
                }
            };
            self.progress.effects.note_earlier(&method, &url, &outcome);
        }
        Ok(())
    }

    /// The answered rounds the call's earlier runs recorded with their sends
    /// (those of the latest send that carries any), if it ran before.
    ///
    /// # Errors
    /// The ledger could not be read.
    pub async fn earlier_answers(&mut self) -> Result<Option<Value>, SendError> {
        if !self.ran_before {
            return Ok(None);
        }
        let (session, call_id) = (self.record.session.clone(), self.record.call_id.clone());
        let attempts = self.guard.ledger.read(move |ledger| ledger.attempts_of_call(&session, &call_id)).await.map_err(ledger_down)?;
        Ok(attempts.into_iter().filter(|a| a.answers.is_some()).max_by_key(|a| (a.step, a.created_ms)).and_then(|a| a.answers))
    }

    /// Records the run's answered rounds, as `answered` holds them, with each new send.
    pub fn record_answers(&mut self, answered: Answered) {
        self.answered = Some(answered);
    }
}
