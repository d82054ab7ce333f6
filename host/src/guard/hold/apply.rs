//! The hold rule's decisions written: an episode opened (budgets spent in
//! the same write), an idle executor superseded, a follower recorded and
//! told to wait, settle or take its executor's outcome.

use super::told::{earlier_outcome, sends_outcome};
use super::{Decision, Executor, Next, new_call};
use crate::error::{CallError, ErrorKind};
use crate::guard::claim::CLAIM_POLL;
use crate::guard::spending::{Costs, spent};
use crate::guard::start::{Origin, conflict, damaged, expired};
use crate::guard::{CallIdentity, CallRules, Guard, ToolRules, failpoint, internal};
use crate::ledger::records::{CallRecord, EpisodeRecord, now_ms};
use crate::ledger::{Durability, EpisodeOp, LedgerError, LedgerWrite, Superseding};
use std::sync::Arc;
use std::time::Instant;

impl Guard {
    /// Writes what `decision` needs and says what comes next.
    pub(super) async fn apply(self: &Arc<Self>, id: &CallIdentity, rules: &CallRules, decision: Decision) -> Result<Next, CallError> {
        match decision {
            Decision::Conflict(first) => Err(conflict(&id.call_id, &first)),
            Decision::Expired(at) => Err(expired(&id.call_id, at)),
            Decision::Damaged(message) => Err(CallError::new(ErrorKind::Internal, message)),
            Decision::Replay(record) => Ok(Next::Admitted(self.replay(record)?)),
            // It settled as never having taken effect, and what it spent was
            // given back: it spends again before it may send.
            Decision::Run(record, origin) if record.released && !rules.spending.is_empty() => {
                let mut call = spent(&rules.spending, CallRecord { released: false, ..record });
                if self.written_charging(&mut call, Costs { budgets: &[], spending: &rules.spending }, LedgerWrite::new()).await? {
                    return Ok(Next::Run(call, origin));
                }
                Ok(Next::Again)
            }
            Decision::Run(record, origin) => Ok(Next::Run(record, origin)),
            Decision::Open(n) => {
                let mut call = spent(&rules.spending, new_call(id, n, false));
                let opened = LedgerWrite::new().episode(EpisodeOp::Open(EpisodeRecord::open(&call, n)));
                if self.written_charging(&mut call, rules.costs(), opened).await? {
                    failpoint("after-admission");
                    return Ok(Next::Run(call, Origin::Written));
                }
                Ok(Next::Again)
            }
            Decision::Follow(episode, executor) => {
                let n = episode.episode;
                match executor {
                    Executor::Idle(old) => {
                        // The executor provably sent nothing and runs nowhere: this call takes its place.
                        let existing = self.stored(id).await?;
                        let mut call = spent(&rules.spending, CallRecord { follower: false, ..existing.unwrap_or_else(|| new_call(id, n, false)) });
                        let mut write = LedgerWrite::new().episode(EpisodeOp::Hand {
                            record: EpisodeRecord { executor: id.call_id.clone(), ..episode.clone() },
                            from: episode.executor.clone(),
                        });
                        if let Some(old) = old {
                            let condition = Superseding { session: id.session.clone(), call_id: old.call_id.clone(), now_ms: now_ms() };
                            // It sent nothing: what it spent from the limits is given back.
                            let released = old.holds_spending();
                            write = write.release_spent(&old);
                            write = write.call(CallRecord { superseded_by: Some(id.call_id.clone()), released, ..old }).superseding(condition);
                        }
                        if self.written_charging(&mut call, rules.costs(), write).await? {
                            tracing::info!(call_id = %id.call_id, superseded = %episode.executor, "supersedes an identical call that sent nothing");
                            return Ok(Next::Run(call, Origin::Written));
                        }
                        Ok(Next::Again)
                    }
                    Executor::Running => {
                        self.follower_record(id, n).await?;
                        Ok(Next::Wait(episode.executor))
                    }
                    Executor::Unsettled(record) => {
                        self.follower_record(id, n).await?;
                        Ok(Next::Settle(record))
                    }
                    Executor::Completed(record) => {
                        let Some(outcome) = &record.outcome else { return Err(damaged(&record)) };
                        Err(self.answer(id, n, &record.call_id, earlier_outcome(outcome)).await?)
                    }
                    Executor::Settled(record, attempts) => Err(self.answer(id, n, &record.call_id, sends_outcome(&attempts)).await?),
                }
            }
        }
    }

    /// Commits `call` with `rest`, which admits it to run, spending one use
    /// of each of `budgets` and its amount from each of `spending`'s limits
    /// in the same write; false if a condition of it lost a race. Budgets
    /// and limits are locked in name order while they are counted and
    /// written, so concurrent calls never both spend a last use. Past a
    /// limit a person may approve, `call` is admitted marked `over_limit`
    /// (its amount spent unchecked), to wait for a person's approval.
    ///
    /// # Errors
    /// `denied` when a budget is spent or a limit would be passed (nothing
    /// was run); `transport` when the ledger is unavailable, `internal` when
    /// it fails otherwise.
    async fn written_charging(&self, call: &mut CallRecord, costs: Costs<'_>, rest: LedgerWrite) -> Result<bool, CallError> {
        if crate::guard::write_failpoint("conflict", "admission-write") {
            return Ok(false);
        }
        let written = match self.admission_write(call, costs, rest.clone(), false).await {
            Err(e) if e.is_over_limit() && costs.spending.iter().any(|s| s.approvable) => {
                let over = format!("over a spending limit: {}", e.message());
                call.over_limit = Some(call.over_limit.take().map_or_else(|| over.clone(), |earlier| format!("{earlier}; {over}")));
                self.admission_write(call, costs, rest, true).await
            }
            written => written,
        };
        if written.is_ok() && call.over_limit.is_some() {
            crate::metrics::limit_over(&call.tool, "asked");
        }
        match written {
            Ok(()) => Ok(true),
            Err(e) if e.is_conflict() => Ok(false),
            // It may have landed or not: the next look finds out (this call's
            // own record and episode, or none), and decides again.
            Err(e) if e.is_lost() => Ok(false),
            Err(e) if e.is_over_limit() => {
                crate::metrics::limit_over(&call.tool, "refused");
                Err(CallError::new(ErrorKind::Denied, format!("over a spending limit: {}; nothing was run", e.message())))
            }
            Err(e) if e.is_refused() => Err(CallError::new(ErrorKind::Denied, format!("budget spent: {}; nothing was run", e.message()))),
            Err(e) => Err(internal(e)),
        }
    }

    /// One try of [`Guard::written_charging`]'s write (`past` approvable limits: unchecked).
    async fn admission_write(&self, call: &CallRecord, costs: Costs<'_>, rest: LedgerWrite, past: bool) -> Result<(), LedgerError> {
        let (write, _held) = self.charged(rest.call(call.clone()), costs, call, past).await;
        let _written = crate::phases::time(crate::phases::Phase::AdmitWrite);
        self.ledger.commit_async(write, Durability::Buffered).await
    }

    /// Waits until the executor's run here ends, or a poll on another host's, or the deadline.
    pub(super) async fn wait_for(&self, session: &str, executor: &str, deadline: Instant) {
        let left = deadline.saturating_duration_since(Instant::now());
        if self.in_progress(session, executor) {
            // Its run, then the completion it queued (which keeps it in progress).
            let _ = tokio::time::timeout(left, self.lock_call(session, executor)).await;
        } else {
            tokio::time::sleep(left.min(CLAIM_POLL)).await;
        }
    }

    /// Resolves the executor's unsettled sends (same keys; or reconciled),
    /// as recovery would; waits for that until the deadline, and lets it
    /// finish in the background if it takes longer.
    pub(super) async fn resolve_in_background(self: &Arc<Self>, executor: CallRecord, rules: ToolRules, deadline: Instant) {
        let guard = self.clone();
        let task = tokio::spawn(async move { guard.resolve_call(&executor, &rules).await });
        let _ = tokio::time::timeout(deadline.saturating_duration_since(Instant::now()), task).await;
    }
}
