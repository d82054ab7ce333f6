//! Writing the ledger: a write committed (blocking or async) or queued for
//! the writer with its durability, and what an operator's resolution writes.

use crate::{AttemptRecord, AttemptState, BackendError, CallRecord, Durability, GrantRecord, Ledger, LedgerError, LedgerWrite, Pending, Resolution, records};

/// How long a host's note of what it serves outlives its last write.
const SERVING_KEPT_MS: u64 = 24 * 3_600_000;

impl Ledger {
    /// Settles an unsettled attempt as never sent, on an operator's word; the
    /// next run of its tool call mints a new key for that step. Synced.
    ///
    /// # Errors
    /// No such attempt, it is already settled, or the write failed.
    pub fn resolve_not_sent(&self, key: &str, note: &str) -> Result<AttemptRecord, LedgerError> {
        let mut attempt = self.attempt(key)?.ok_or_else(|| self.err(format!("no attempt with key `{key}`")))?;
        if !attempt.state.is_unsettled() && attempt.resolution != Some(Resolution::ReconciledNotFound) {
            return Err(self.err(format!("attempt `{key}` is already settled ({}); nothing to resolve", attempt.state.as_str())));
        }
        attempt.state = AttemptState::Failed;
        attempt.response = None;
        attempt.resolution = Some(Resolution::OperatorNotSent);
        attempt.last_error = Some(format!("operator: not sent ({note})"));
        attempt.updated_ms = records::now_ms();
        self.commit(LedgerWrite::new().attempt(attempt.clone()), Durability::Synced)?;
        // Unless a host runs its call now (its run's end decides that).
        self.give_back_if_never_took_effect(&attempt.session, &attempt.call_id, None)?;
        Ok(attempt)
    }

    /// Gives back what tool call (`session`, `call_id`) took from spending
    /// limits if it settled as never having taken effect: not completed,
    /// each of its sends settled and none answered 2xx
    /// ([`crate::never_took_effect`]). Only by the host holding its claim
    /// (`owner`), or with `None` when no host holds one. Synced. Returns
    /// whether anything was given back; a later run of the call spends again.
    ///
    /// # Errors
    /// A read or the write failed.
    pub fn give_back_if_never_took_effect(&self, session: &str, call_id: &str, owner: Option<&str>) -> Result<bool, LedgerError> {
        let Some(call) = self.call(session, call_id)? else { return Ok(false) };
        let claimed_by_another = match owner {
            Some(owner) => call.leased_elsewhere(owner, records::now_ms()),
            None => call.leased_at(records::now_ms()),
        };
        if !call.holds_spending() || call.state == records::CallState::Completed || claimed_by_another {
            return Ok(false);
        }
        if !crate::never_took_effect(&self.attempts_of_call(session, call_id)?) {
            return Ok(false);
        }
        let write = LedgerWrite::new().release_spent(&call).call(CallRecord { released: true, ..call });
        self.commit(write, Durability::Synced)?;
        Ok(true)
    }

    /// Records a person's decision on the approval `request` of tool call
    /// (`session`, `call_id`): `approve`d or denied, by `by`, with `note`.
    /// The decision lands only while that request waits (not decided, not
    /// expired, the call not completed): a decision for an earlier or
    /// expired request never applies. Synced. Returns the call as decided.
    ///
    /// # Errors
    /// No such call, no such request waiting, or the ledger failed.
    pub fn decide_approval(&self, session: &str, call_id: &str, request: &str, decision: Decision<'_>) -> Result<CallRecord, LedgerError> {
        let now = records::now_ms();
        let mut call = self.call(session, call_id)?.ok_or_else(|| self.err(format!("no tool call `{call_id}` in session `{session}`")))?;
        let Some(approval) = call.approval.as_mut().filter(|a| a.request == request && a.waiting(now)) else {
            return Err(
                self.err(format!("tool call `{call_id}` has no approval request `{request}` waiting for a decision (decided, expired, or asked again)"))
            );
        };
        approval.status = if decision.approve { records::ApprovalStatus::Approved } else { records::ApprovalStatus::Denied };
        approval.decided_by = Some(decision.by.to_string());
        approval.decided_ms = Some(now);
        approval.note = decision.note.map(str::to_string);
        if !self.backend.decide_approval(&call, request).map_err(|e| self.backend_err(e))? {
            return Err(self.err(format!("tool call `{call_id}`'s approval request `{request}` was decided or replaced meanwhile")));
        }
        Ok(call)
    }

    /// Records that `record.plugin` runs `record.digest` with `record.grants`,
    /// unless that is already its latest entry. Synced: it is audit evidence.
    /// Returns whether a new entry was written.
    ///
    /// # Errors
    /// A read or the write failed.
    pub fn record_grants(&self, record: &GrantRecord) -> Result<bool, LedgerError> {
        let written = self.backend.record_grants(record).map_err(|e| self.backend_err(e))?;
        if written {
            self.counts[0].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(written)
    }

    /// Notes what `record.host` serves now (over its earlier note), and
    /// forgets hosts not seen for a day.
    ///
    /// # Errors
    /// The write failed.
    pub fn note_serving(&self, record: &crate::ServingRecord) -> Result<(), LedgerError> {
        let stale_before = record.seen_ms.saturating_sub(SERVING_KEPT_MS);
        self.backend.note_serving(record, stale_before).map_err(|e| self.backend_err(e))
    }

    /// What each host serves, as each last noted it.
    ///
    /// # Errors
    /// The ledger cannot be read.
    pub fn serving(&self) -> Result<Vec<crate::ServingRecord>, LedgerError> {
        self.backend.serving().map_err(|e| self.backend_err(e))
    }

    /// Applies `write` atomically with the given durability.
    ///
    /// # Errors
    /// The write failed; nothing of it was applied.
    pub fn commit(&self, write: LedgerWrite, durability: Durability) -> Result<(), LedgerError> {
        self.backend.commit(&write, durability).map_err(|e| self.backend_err(e))?;
        self.count(durability);
        Ok(())
    }

    /// [`Ledger::commit`] for async callers: the write goes to the backend's
    /// writer thread (RocksDB), where writes queued together share one
    /// batch and one fsync, or to the blocking pool (PostgreSQL).
    ///
    /// # Errors
    /// The write failed; nothing of it was applied.
    pub async fn commit_async(&self, write: LedgerWrite, durability: Durability) -> Result<(), LedgerError> {
        self.queue(write, durability).wait().await
    }

    /// Hands `write` to the backend now and returns without waiting for it.
    /// On RocksDB, writes are applied in the order they were queued, so a
    /// later write never lands before an earlier one; on PostgreSQL they run
    /// at once on the blocking pool, so wait for a write before queueing one
    /// that must land after it *in the same record*. Call within a Tokio
    /// runtime.
    pub fn queue(&self, write: LedgerWrite, durability: Durability) -> QueuedWrite {
        let waiting = match self.backend.enqueue(&write, durability) {
            Some(Ok(pending)) => Waiting::Writer(pending),
            Some(Err(e)) => Waiting::Ready(Err(e)),
            None => {
                let backend = self.backend.clone();
                Waiting::Pool(tokio::task::spawn_blocking(move || backend.commit(&write, durability)))
            }
        };
        QueuedWrite { ledger: self.clone(), durability, waiting }
    }

    fn count(&self, durability: Durability) {
        let slot = usize::from(durability == Durability::Buffered);
        self.counts[slot].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether writes queued with [`Ledger::queue`] land in the order they
    /// were queued (RocksDB's writer thread), so a write may be queued
    /// behind one it must follow without waiting for it first.
    pub fn lands_in_order(&self) -> bool {
        self.backend.lands_in_order()
    }
}

/// A write handed to the ledger's backend ([`Ledger::queue`]): it is
/// applied whether or not anyone waits for it; waiting tells how it went.
#[must_use = "wait for the write, or its failure goes unseen"]
pub struct QueuedWrite {
    ledger: Ledger,
    durability: Durability,
    waiting: Waiting,
}

enum Waiting {
    Writer(Pending),
    Pool(tokio::task::JoinHandle<Result<(), BackendError>>),
    /// Applied or failed already (or refused before it was queued).
    Ready(Result<(), BackendError>),
}

impl QueuedWrite {
    /// Waits until the write is applied (and synced, if it is to be).
    ///
    /// # Errors
    /// The write failed; nothing of it was applied.
    pub async fn wait(mut self) -> Result<(), LedgerError> {
        self.landed().await
    }

    /// The write's result if it has landed (applied, and synced if it is
    /// to be), without waiting: `None` while it has not. Once it has
    /// returned a result, it returns it again on every call.
    pub fn try_wait(&mut self) -> Option<Result<(), LedgerError>> {
        match self.poll_landed(&mut std::task::Context::from_waker(std::task::Waker::noop())) {
            std::task::Poll::Ready(written) => Some(written),
            std::task::Poll::Pending => None,
        }
    }

    /// [`QueuedWrite::wait`] without giving the write up: cancelled, it
    /// can be waited for again; landed, it returns the same result again.
    ///
    /// # Errors
    /// The write failed; nothing of it was applied.
    pub async fn landed(&mut self) -> Result<(), LedgerError> {
        std::future::poll_fn(|cx| self.poll_landed(cx)).await
    }

    fn poll_landed(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), LedgerError>> {
        let polled = match &mut self.waiting {
            Waiting::Writer(pending) => pending.as_mut().poll(cx),
            Waiting::Pool(task) => std::pin::Pin::new(task).poll(cx).map(|r| r.unwrap_or_else(|e| Err(pool_panic(&e)))),
            Waiting::Ready(written) => return std::task::Poll::Ready(written.clone().map_err(|e| self.ledger.backend_err(e))),
        };
        // Just come from the backend: counted here, once, if it landed.
        polled.map(|written| {
            self.waiting = Waiting::Ready(written.clone());
            written.map_err(|e| self.ledger.backend_err(e))?;
            self.ledger.count(self.durability);
            Ok(())
        })
    }
}

fn pool_panic(e: &tokio::task::JoinError) -> BackendError {
    BackendError::Failed(format!("the ledger write panicked: {e}"))
}

/// A person's decision on an approval request.
#[derive(Debug, Clone, Copy)]
pub struct Decision<'a> {
    /// Approved (else denied).
    pub approve: bool,
    /// Who decided: `client:<principal>` or `operator:<name>`.
    pub by: &'a str,
    /// What they said, if anything.
    pub note: Option<&'a str>,
}
