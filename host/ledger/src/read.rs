//! Reading the ledger: calls, attempts, episodes and the grant history,
//! blocking or, for async callers, from memory or the blocking pool.

use crate::{AttemptRecord, AttemptState, CallRecord, EpisodeRecord, FirstLook, GrantRecord, Ledger, LedgerError};

impl Ledger {
    /// Episode `episode` of the action (session, tool, args digest), or its
    /// latest when `None`.
    ///
    /// # Errors
    /// The read failed or the record is damaged.
    pub fn episode(&self, session: &str, tool: &str, args_digest: &str, episode: Option<u64>) -> Result<Option<EpisodeRecord>, LedgerError> {
        self.backend.episode(session, tool, args_digest, episode).map_err(|e| self.backend_err(e))
    }

    /// The call (session, call id), its tombstone and its action's episode,
    /// in one trip to a backend that answers over a network (PostgreSQL);
    /// `None` from one whose reads are cheap (RocksDB), whose caller reads
    /// only what it needs.
    ///
    /// # Errors
    /// The read failed or a record is damaged.
    pub fn first_look(&self, session: &str, call_id: &str, tool: &str, args_digest: &str) -> Result<Option<FirstLook>, LedgerError> {
        self.backend.first_look(session, call_id, tool, args_digest).map_err(|e| self.backend_err(e))
    }

    /// The tool call (session, call id), if recorded.
    ///
    /// # Errors
    /// The read failed or the record is damaged.
    pub fn call(&self, session: &str, call_id: &str) -> Result<Option<CallRecord>, LedgerError> {
        self.backend.call(session, call_id).map_err(|e| self.backend_err(e))
    }

    /// The attempt with idempotency key `key`, if recorded.
    ///
    /// # Errors
    /// The read failed or the record is damaged.
    pub fn attempt(&self, key: &str) -> Result<Option<AttemptRecord>, LedgerError> {
        self.backend.attempt(key).map_err(|e| self.backend_err(e))
    }

    /// The current attempt at `step` of a tool call (the latest key of that step).
    ///
    /// # Errors
    /// The read failed or the record is damaged.
    pub fn attempt_at(&self, session: &str, call_id: &str, step: u32) -> Result<Option<AttemptRecord>, LedgerError> {
        self.backend.attempt_at(session, call_id, step).map_err(|e| self.backend_err(e))
    }

    /// The attempts of one tool call, by step.
    ///
    /// # Errors
    /// A read failed or a record is damaged.
    pub fn attempts_of_call(&self, session: &str, call_id: &str) -> Result<Vec<AttemptRecord>, LedgerError> {
        self.backend.attempts_of_call(session, call_id).map_err(|e| self.backend_err(e))
    }

    /// Tool calls, in (session, call id) order; only those of `session` if given.
    ///
    /// # Errors
    /// A read failed or a record is damaged.
    pub fn calls(&self, session: Option<&str>) -> Result<Vec<CallRecord>, LedgerError> {
        self.backend.calls(session).map_err(|e| self.backend_err(e))
    }

    /// Attempts in `state`.
    ///
    /// # Errors
    /// A read failed or a record is damaged.
    pub fn attempts_in_state(&self, state: AttemptState) -> Result<Vec<AttemptRecord>, LedgerError> {
        self.backend.attempts_in_state(state).map_err(|e| self.backend_err(e))
    }

    /// Every attempt, in key order.
    ///
    /// # Errors
    /// A read failed or a record is damaged.
    pub fn attempts(&self) -> Result<Vec<AttemptRecord>, LedgerError> {
        self.backend.attempts().map_err(|e| self.backend_err(e))
    }

    /// Every grant-history entry, oldest first.
    ///
    /// # Errors
    /// A read failed or a record is damaged.
    pub fn grant_history(&self) -> Result<Vec<GrantRecord>, LedgerError> {
        self.backend.grant_history().map_err(|e| self.backend_err(e))
    }

    /// Runs the reads in `read` without blocking an async worker: on this
    /// thread when the backend can answer from memory (RocksDB's memtables
    /// and block cache hold what recent calls wrote), else on the blocking
    /// pool. `read` may run twice, so it must only read.
    ///
    /// # Errors
    /// Whatever `read` returns.
    pub async fn read<T: Send + 'static>(&self, read: impl Fn(&Ledger) -> Result<T, LedgerError> + Send + 'static) -> Result<T, LedgerError> {
        let mut answered = None;
        if self.backend.read_from_memory(&mut || answered = Some(read(self))) {
            match answered.expect("read_from_memory ran the read") {
                Err(e) if e.needs_io() => {}
                answered => return answered,
            }
        }
        self.pool_reads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let ledger = self.clone();
        tokio::task::spawn_blocking(move || read(&ledger)).await.expect("a ledger read panicked")
    }

    /// The spending limits' uses whose window has not ended at `now_ms`
    /// (`toolguard ledger limits`).
    ///
    /// # Errors
    /// The ledger cannot be read.
    pub fn spent(&self, now_ms: u64) -> Result<Vec<crate::records::SpentUse>, LedgerError> {
        self.backend.spent(now_ms).map_err(|e| self.backend_err(e))
    }
}
