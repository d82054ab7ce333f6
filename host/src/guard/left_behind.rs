//! The sends an earlier run of a call made that this run did not make
//! again: a tool that decides otherwise when its call runs again (another
//! answer to its question, a clock, randomness, a hostile plugin) must not
//! end with an answer that hides them (`docs/guard.md`).

use super::unconfirmed::ledger_down;
use super::{CallGuard, SendError, Unsettled};
use crate::ledger::records::Resolution;
use crate::policy;

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
            let (method, url) = (a.request.method.clone(), a.request.url.clone());
            let outcome = match &a.response {
                Some(response) if a.state.is_final() => Ok(response.clone().into()),
                _ if a.resolution == Some(Resolution::HostFault) => Err(self.left_for_operator(&a)),
                _ => match policy::authorize(&self.rules.grants, self.rules.wires.downstreams(), &method, &url) {
                    Ok((downstream, _)) if downstream.name == a.downstream => self.redrive(a.step, &downstream).await,
                    _ => Err(Unsettled::of(&a, "the policy no longer grants it, so it is not re-sent; an operator must settle it")
                        .kept_open(&mut self.open_steps, &a.fingerprint)),
                },
            };
            self.progress.effects.note_earlier(&method, &url, &outcome);
        }
        Ok(())
    }
}
