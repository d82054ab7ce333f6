//! What every ledger backend provides: one trait, the same semantics on
//! RocksDB and PostgreSQL (the behavioural suite runs on both).

use super::retention::{LedgerStats, Removal, RetireEntry};
use super::{AttemptRecord, AttemptState, BackendError, CallRecord, Claim, Durability, EpisodeRecord, FirstLook, GrantRecord, LedgerWrite};
use std::future::Future;
use std::pin::Pin;

/// A write on its way through a backend's writer: resolves once it is
/// applied (and synced, if it is to be).
pub(crate) type Pending = Pin<Box<dyn Future<Output = Result<(), BackendError>> + Send>>;

/// What a ledger backend stores and finds. Its errors are typed
/// ([`BackendError`]); [`super::Ledger`] adds the ledger's location.
pub(crate) trait Backend: Send + Sync {
    /// The schema version and the key secret, both created on a new ledger
    /// when `create` (then at [`super::SCHEMA`]).
    fn meta(&self, create: bool) -> Result<(String, [u8; 32]), BackendError>;
    /// Records that the ledger now holds schema `version`.
    fn set_schema(&self, version: &str) -> Result<(), BackendError>;
    /// Episode `episode` of the action (session, tool, args digest), or its
    /// latest episode when `None`.
    fn episode(&self, session: &str, tool: &str, args_digest: &str, episode: Option<u64>) -> Result<Option<EpisodeRecord>, BackendError>;
    fn call(&self, session: &str, call_id: &str) -> Result<Option<CallRecord>, BackendError>;
    /// What admission reads first, in one trip to the backend ([`FirstLook`]);
    /// `None` where each read is cheap and the guard reads only what it needs.
    fn first_look(&self, _session: &str, _call_id: &str, _tool: &str, _args_digest: &str) -> Result<Option<FirstLook>, BackendError> {
        Ok(None)
    }
    fn attempt(&self, key: &str) -> Result<Option<AttemptRecord>, BackendError>;
    /// The latest generation's attempt at `step`.
    fn attempt_at(&self, session: &str, call_id: &str, step: u32) -> Result<Option<AttemptRecord>, BackendError>;
    /// The current attempt of each step, by step.
    fn attempts_of_call(&self, session: &str, call_id: &str) -> Result<Vec<AttemptRecord>, BackendError>;
    fn calls(&self, session: Option<&str>) -> Result<Vec<CallRecord>, BackendError>;
    fn attempts_in_state(&self, state: AttemptState) -> Result<Vec<AttemptRecord>, BackendError>;
    fn attempts(&self) -> Result<Vec<AttemptRecord>, BackendError>;
    fn record_grants(&self, record: &GrantRecord) -> Result<bool, BackendError>;
    fn grant_history(&self) -> Result<Vec<GrantRecord>, BackendError>;
    /// Writes what `record.host` serves now, over its earlier record, and
    /// drops records of hosts not seen since `stale_before_ms`.
    fn note_serving(&self, record: &crate::ServingRecord, stale_before_ms: u64) -> Result<(), BackendError>;
    /// What each host that noted it serves.
    fn serving(&self) -> Result<Vec<crate::ServingRecord>, BackendError>;
    /// Applies `write` atomically, if its conditions hold.
    fn commit(&self, write: &LedgerWrite, durability: Durability) -> Result<(), BackendError>;
    /// Writes `decided`, a call whose approval `request` was just decided,
    /// only if the ledger still holds that call not completed with that
    /// request pending; whether it did. On a host's own ledger one process
    /// writes, under the call's lock: a read and a write.
    fn decide_approval(&self, decided: &CallRecord, request: &str) -> Result<bool, BackendError> {
        let current = self.call(&decided.session, &decided.call_id)?;
        if !current.is_some_and(|c| crate::checks::approval_pending(&c, request)) {
            return Ok(false);
        }
        self.commit(&LedgerWrite::new().call(decided.clone()), Durability::Synced).map(|()| true)
    }
    /// Queues `write` for the backend's writer thread, if it has one; the
    /// future tells how it went. `None`: the ledger runs it on the blocking pool.
    fn enqueue(&self, _write: &LedgerWrite, _durability: Durability) -> Option<Result<Pending, BackendError>> {
        None
    }
    /// Runs `read` with this thread's reads answered from memory only — a
    /// read that would touch the disk fails with [`BackendError::NeedsIo`]
    /// instead of blocking — and returns true; or returns false without
    /// running it, when the backend cannot answer from memory.
    fn read_from_memory(&self, _read: &mut dyn FnMut()) -> bool {
        false
    }
    /// Whether writes given to [`Backend::enqueue`] land in the order they
    /// were given (a single writer thread).
    fn lands_in_order(&self) -> bool {
        false
    }
    /// Whether other hosts share this ledger: then calls are claimed.
    fn shared(&self) -> bool {
        false
    }
    /// Reads the clock the ledger's times are kept on again (a shared
    /// ledger's server's), so a host follows it as it drifts.
    fn follow_clock(&self) -> Result<(), BackendError> {
        Ok(())
    }
    /// Claims `call` for `call.owner` until `call.lease_until_ms`, in one
    /// conditional write (see [`Ledger::claim_call`]).
    fn claim_call(&self, call: &CallRecord, now_ms: u64) -> Result<Claim, BackendError>;
    /// Ends `owner`'s claim on a call, if it still holds it.
    fn release_call(&self, session: &str, call_id: &str, owner: &str) -> Result<(), BackendError>;
    /// Memory the backend holds in this process, in bytes, if it knows.
    fn memory_usage(&self) -> u64 {
        0
    }
    /// fsyncs of the write-ahead log by this process, if the backend has one.
    fn wal_syncs(&self) -> Option<u64> {
        None
    }
    #[cfg(any(test, feature = "bench"))]
    /// Finishes the housekeeping a bulk load leaves (RocksDB: flush and
    /// compact everything; PostgreSQL: `VACUUM ANALYZE`).
    fn settle(&self) -> Result<(), BackendError> {
        Ok(())
    }
    #[cfg(feature = "bench")]
    /// `toolguard-bench` only: copies every record of session `seed` into
    /// sessions `{prefix}{n:05}` for n in `from..=to`, server-side; `false` if
    /// the backend has no such fast path (the bench then writes each copy).
    fn replicate_for_bench(&self, _seed: &str, _prefix: &str, _from: u64, _to: u64) -> Result<bool, BackendError> {
        Ok(false)
    }
    #[cfg(feature = "bench")]
    /// `toolguard-bench` only: creates (or, with `create` false, drops with
    /// everything in it) the schema `name` beside this ledger's, where a
    /// second ledger can live on the same server; nothing on a backend
    /// without schemas (RocksDB: a second ledger is a second directory).
    fn bench_schema(&self, _name: &str, _create: bool) -> Result<(), BackendError> {
        Ok(())
    }
    /// Retire-index entries older than `before_ms` that sort after `after`,
    /// oldest first, at most `limit`.
    fn retire_page(&self, before_ms: u64, after: Option<&RetireEntry>, limit: usize) -> Result<Vec<RetireEntry>, BackendError>;
    /// Applies `removal` atomically.
    fn remove(&self, removal: &Removal) -> Result<(), BackendError>;
    /// When (session, call id) was pruned, if it was.
    fn expired(&self, session: &str, call_id: &str) -> Result<Option<u64>, BackendError>;
    /// Every call of episode `episode` of the action (session, tool, args digest).
    fn episode_calls(&self, session: &str, tool: &str, args_digest: &str, episode: u64) -> Result<Vec<CallRecord>, BackendError>;
    /// Removes budget uses made before `before_ms`; returns how many.
    fn forget_budget_before(&self, before_ms: u64) -> Result<u64, BackendError>;
    /// What the ledger holds ([`LedgerStats`]).
    fn stats(&self) -> Result<LedgerStats, BackendError>;
    /// The spending limits' uses whose window has not ended at `now_ms`.
    fn spent(&self, now_ms: u64) -> Result<Vec<crate::records::SpentUse>, BackendError>;
    /// Every episode (for migrations).
    fn episodes(&self) -> Result<Vec<EpisodeRecord>, BackendError>;
    /// Indexes the calls of each episode (schema 2 → 3).
    fn backfill_episode_index(&self) -> Result<(), BackendError>;
}
