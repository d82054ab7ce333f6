//! The ledger: tool calls and attempts, and the grant history. One handle
//! ([`Ledger`]) over two backends with the same semantics: RocksDB
//! (embedded, the default; [`rocks`]) and PostgreSQL (shared by a fleet of
//! hosts; [`postgres`]). Every plain method blocks. Async callers use
//! [`Ledger::read`] and [`Ledger::commit_async`], which never block a runtime
//! worker: RocksDB answers reads from memory on the caller's thread when it
//! can and queues writes for its writer thread; anything else runs on the
//! blocking pool.
//!
//! Durability is chosen per write ([`Durability`]); why each write is synced
//! or not is in `docs/ledger.md`.

mod migrate;
pub mod postgres;
pub mod records;
pub mod retention;
pub mod rocks;
#[cfg(test)]
mod suite;

pub use records::{AttemptRecord, AttemptState, CallRecord, CallState, EpisodeRecord, GrantRecord, Reported, Resolution, StoredOutcome};
pub(crate) use rocks::simulate_slow_fsync;

use crate::guard::keys::KeySecret;
use retention::{LedgerStats, Removal, RetireEntry};
use std::path::Path;
use std::sync::Arc;

/// A ledger operation failed; the message names where the ledger lives.
#[derive(Debug, Clone, thiserror::Error)]
#[error("ledger at {location}: {message}")]
pub struct LedgerError {
    location: String,
    message: String,
    /// A conditional write found the ledger changed ([`BackendError::Conflict`]),
    /// or another process holds it ([`BackendError::Busy`]).
    conflict: bool,
    busy: bool,
    /// A budget of the write was spent ([`BackendError::Refused`]).
    refused: bool,
}

impl LedgerError {
    fn at(location: &str, message: String) -> Self {
        Self { location: location.to_string(), message, conflict: false, busy: false, refused: false }
    }

    fn of(location: &str, e: BackendError) -> Self {
        match e {
            BackendError::Conflict(message) => Self { conflict: true, ..Self::at(location, message) },
            BackendError::Busy(message) => Self { busy: true, ..Self::at(location, message) },
            BackendError::Refused(message) => Self { refused: true, ..Self::at(location, message) },
            BackendError::Failed(message) => Self::at(location, message),
        }
    }

    /// Whether a conditional write was refused because the ledger changed
    /// under it (another call or host got there first): re-read and decide again.
    pub fn is_conflict(&self) -> bool {
        self.conflict
    }

    /// Whether another process holds the (embedded) ledger right now.
    pub fn is_busy(&self) -> bool {
        self.busy
    }

    /// Whether a budget of the write was spent; the message says which.
    pub fn is_refused(&self) -> bool {
        self.refused
    }

    /// What went wrong, without where the ledger lives.
    pub fn message(&self) -> &str {
        &self.message
    }
}

/// Why a backend's operation failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum BackendError {
    /// A condition of the write did not hold (an episode opened or handed
    /// over by someone else first, a call no longer supersedable); nothing
    /// of the write was applied.
    Conflict(String),
    /// Another process holds the database (RocksDB's lock).
    Busy(String),
    /// A budget charged by the write was spent; nothing of it was applied.
    Refused(String),
    /// Anything else; nothing of the write was applied.
    Failed(String),
}

impl From<String> for BackendError {
    fn from(message: String) -> Self {
        Self::Failed(message)
    }
}

/// The schema version this code reads and writes: 2 added episodes, 3
/// retention (`docs/ledger.md`, "Schema versions"); older ones are migrated
/// on open.
pub(crate) const SCHEMA: &str = "3";

/// A backend's message for "this read needs the disk", under
/// [`rocks::memory_only`]; [`Ledger::read`] then retries on the blocking pool.
pub(crate) const NEEDS_IO: &str = "the read needs the disk";

/// Whether a write waits for the WAL to reach the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// fsync the WAL before returning (group-committed with concurrent writers).
    Synced,
    /// In the WAL and memtable; survives a process crash, not a power loss.
    /// (PostgreSQL commits every write durably.)
    Buffered,
}

/// What a ledger backend stores and finds; errors are plain messages, which
/// [`Ledger`] prefixes with the ledger's location.
pub(crate) trait Backend: Send + Sync {
    /// The schema version and the key secret, both created on a new ledger
    /// when `create` (then at [`SCHEMA`]).
    fn meta(&self, create: bool) -> Result<(String, [u8; 32]), String>;
    /// Records that the ledger now holds schema `version`.
    fn set_schema(&self, version: &str) -> Result<(), String>;
    /// Episode `episode` of the action (session, tool, args digest), or its
    /// latest episode when `None`.
    fn episode(&self, session: &str, tool: &str, args_digest: &str, episode: Option<u64>) -> Result<Option<EpisodeRecord>, String>;
    fn call(&self, session: &str, call_id: &str) -> Result<Option<CallRecord>, String>;
    fn attempt(&self, key: &str) -> Result<Option<AttemptRecord>, String>;
    /// The latest generation's attempt at `step`.
    fn attempt_at(&self, session: &str, call_id: &str, step: u32) -> Result<Option<AttemptRecord>, String>;
    /// The current attempt of each step, by step.
    fn attempts_of_call(&self, session: &str, call_id: &str) -> Result<Vec<AttemptRecord>, String>;
    fn calls(&self, session: Option<&str>) -> Result<Vec<CallRecord>, String>;
    fn attempts_in_state(&self, state: AttemptState) -> Result<Vec<AttemptRecord>, String>;
    fn attempts(&self) -> Result<Vec<AttemptRecord>, String>;
    fn record_grants(&self, record: &GrantRecord) -> Result<bool, String>;
    fn grant_history(&self) -> Result<Vec<GrantRecord>, String>;
    /// Applies `write` atomically, if its conditions hold.
    fn commit(&self, write: &LedgerWrite, durability: Durability) -> Result<(), BackendError>;
    /// Queues `write` for the backend's writer thread, if it has one.
    fn enqueue(&self, _write: &LedgerWrite, _durability: Durability) -> Option<Result<rocks::Ticket, BackendError>> {
        None
    }
    /// Whether reads under [`rocks::memory_only`] answer from memory (or
    /// fail with [`NEEDS_IO`]) instead of blocking.
    fn memory_reads(&self) -> bool {
        false
    }
    /// Whether other hosts share this ledger: then calls are claimed.
    fn shared(&self) -> bool {
        false
    }
    /// Claims `call` for `call.owner` until `call.lease_until_ms`, in one
    /// conditional write (see [`Ledger::claim_call`]).
    fn claim_call(&self, call: &CallRecord, now_ms: u64) -> Result<Claim, String>;
    /// Ends `owner`'s claim on a call, if it still holds it.
    fn release_call(&self, session: &str, call_id: &str, owner: &str) -> Result<(), String>;
    /// Memory the backend holds in this process, in bytes, if it knows.
    fn memory_usage(&self) -> u64 {
        0
    }
    /// fsyncs of the write-ahead log by this process, if the backend has one.
    fn wal_syncs(&self) -> Option<u64> {
        None
    }
    /// Finishes the housekeeping a bulk load leaves (RocksDB: flush and
    /// compact everything; PostgreSQL: `VACUUM ANALYZE`).
    fn settle(&self) -> Result<(), String> {
        Ok(())
    }
    /// `toolguard bench` only: copies every record of session `seed` into
    /// sessions `{prefix}{n}` for n in `from..=to`, server-side; `false` if
    /// the backend has no such fast path (the bench then writes each copy).
    fn replicate_for_bench(&self, _seed: &str, _prefix: &str, _from: u64, _to: u64) -> Result<bool, String> {
        Ok(false)
    }
    /// Retire-index entries older than `before_ms` that sort after `after`,
    /// oldest first, at most `limit`.
    fn retire_page(&self, before_ms: u64, after: Option<&RetireEntry>, limit: usize) -> Result<Vec<RetireEntry>, String>;
    /// Applies `removal` atomically.
    fn remove(&self, removal: &Removal) -> Result<(), String>;
    /// When (session, call id) was pruned, if it was.
    fn expired(&self, session: &str, call_id: &str) -> Result<Option<u64>, String>;
    /// Every call of episode `episode` of the action (session, tool, args digest).
    fn episode_calls(&self, session: &str, tool: &str, args_digest: &str, episode: u64) -> Result<Vec<CallRecord>, String>;
    /// Removes budget uses made before `before_ms`; returns how many.
    fn forget_budget_before(&self, before_ms: u64) -> Result<u64, String>;
    /// What the ledger holds ([`LedgerStats`]).
    fn stats(&self) -> Result<LedgerStats, String>;
    /// Every episode (for migrations).
    fn episodes(&self) -> Result<Vec<EpisodeRecord>, String>;
    /// Indexes the calls of each episode (schema 2 → 3).
    fn backfill_episode_index(&self) -> Result<(), String>;
}

/// 32 bytes from the OS for a new ledger's key secret.
fn new_secret() -> Result<[u8; 32], String> {
    let mut secret = [0u8; 32];
    getrandom::fill(&mut secret).map_err(|e| format!("no randomness for the key secret: {e}"))?;
    Ok(secret)
}

/// The ledger. Cheap to clone; all clones share one backend.
#[derive(Clone)]
pub struct Ledger {
    backend: Arc<dyn Backend>,
    /// Shared, so cloning the handle (once per queued write) allocates nothing.
    location: Arc<str>,
    secret: KeySecret,
    /// Writes committed so far: (synced, buffered).
    counts: Arc<[std::sync::atomic::AtomicU64; 2]>,
}

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ledger").field("location", &self.location).finish_non_exhaustive()
    }
}

impl Ledger {
    /// Opens (creating if needed) the RocksDB ledger in `dir`.
    ///
    /// # Errors
    /// The directory cannot be used, another process holds the ledger, or it
    /// was written by an incompatible version.
    pub fn open(dir: &Path) -> Result<Self, LedgerError> {
        let location = dir.display().to_string();
        let backend = rocks::Rocks::open(dir).map_err(|e| LedgerError::of(&location, e))?;
        Self::init(Arc::new(backend), location, true)
    }

    /// Opens an existing RocksDB ledger read-only (works while a host holds it).
    ///
    /// # Errors
    /// There is no ledger in `dir`, or it cannot be read.
    pub fn open_read_only(dir: &Path) -> Result<Self, LedgerError> {
        let location = dir.display().to_string();
        let backend = rocks::Rocks::open_read_only(dir).map_err(|message| LedgerError::at(&location, message))?;
        Self::init(Arc::new(backend), location, false)
    }

    /// Connects to the PostgreSQL ledger at `url` (`postgres://…`), creating
    /// or migrating its tables.
    ///
    /// # Errors
    /// The server cannot be reached, refuses the login, or holds an
    /// incompatible schema.
    pub fn connect(url: &str) -> Result<Self, LedgerError> {
        let location = postgres::redacted(url);
        let backend = postgres::Postgres::connect(url).map_err(|message| LedgerError::at(&location, message))?;
        Self::init(Arc::new(backend), location, true)
    }

    /// Opens the ledger a config names: `postgres://…` or `postgresql://…`
    /// connects to PostgreSQL; anything else is a RocksDB directory.
    ///
    /// # Errors
    /// As [`Ledger::open`] or [`Ledger::connect`].
    pub fn open_at(location: &LedgerLocation, read_only: bool) -> Result<Self, LedgerError> {
        match location {
            LedgerLocation::Postgres(url) => Self::connect(url),
            LedgerLocation::Dir(dir) if read_only => Self::open_read_only(dir),
            LedgerLocation::Dir(dir) => Self::open(dir),
        }
    }

    /// Checks the schema (migrating an older one, unless opened read-only)
    /// and reads the key secret.
    fn init(backend: Arc<dyn Backend>, location: String, writable: bool) -> Result<Self, LedgerError> {
        let failed = |message| LedgerError::at(&location, message);
        let (schema, secret) = backend.meta(writable).map_err(failed)?;
        let ledger = Self { backend, location: location.clone().into(), secret: KeySecret(secret), counts: Arc::default() };
        match schema.as_str() {
            SCHEMA => {}
            // Read-only opens read schema-1 records as they are.
            "1" | "2" if !writable => {}
            "1" => {
                migrate::to_2(&ledger)?;
                migrate::to_3(&ledger)?;
            }
            "2" => migrate::to_3(&ledger)?,
            other => return Err(failed(format!("schema {other} is not {SCHEMA}; use a matching toolguard"))),
        }
        Ok(ledger)
    }

    /// The secret keys are derived with.
    pub fn secret(&self) -> &KeySecret {
        &self.secret
    }

    /// Where the ledger lives: a directory, or a PostgreSQL URL without its password.
    pub fn location(&self) -> &str {
        &self.location
    }

    fn err(&self, message: String) -> LedgerError {
        LedgerError::at(&self.location, message)
    }

    fn backend_err(&self, e: BackendError) -> LedgerError {
        LedgerError::of(&self.location, e)
    }

    /// Episode `episode` of the action (session, tool, args digest), or its
    /// latest when `None`.
    ///
    /// # Errors
    /// The read failed or the record is damaged.
    pub fn episode(&self, session: &str, tool: &str, args_digest: &str, episode: Option<u64>) -> Result<Option<EpisodeRecord>, LedgerError> {
        self.backend.episode(session, tool, args_digest, episode).map_err(|m| self.err(m))
    }

    /// The tool call (session, call id), if recorded.
    ///
    /// # Errors
    /// The read failed or the record is damaged.
    pub fn call(&self, session: &str, call_id: &str) -> Result<Option<CallRecord>, LedgerError> {
        self.backend.call(session, call_id).map_err(|m| self.err(m))
    }

    /// The attempt with idempotency key `key`, if recorded.
    ///
    /// # Errors
    /// The read failed or the record is damaged.
    pub fn attempt(&self, key: &str) -> Result<Option<AttemptRecord>, LedgerError> {
        self.backend.attempt(key).map_err(|m| self.err(m))
    }

    /// The current attempt at `step` of a tool call (the latest key of that step).
    ///
    /// # Errors
    /// The read failed or the record is damaged.
    pub fn attempt_at(&self, session: &str, call_id: &str, step: u32) -> Result<Option<AttemptRecord>, LedgerError> {
        self.backend.attempt_at(session, call_id, step).map_err(|m| self.err(m))
    }

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
        Ok(attempt)
    }

    /// The attempts of one tool call, by step.
    ///
    /// # Errors
    /// A read failed or a record is damaged.
    pub fn attempts_of_call(&self, session: &str, call_id: &str) -> Result<Vec<AttemptRecord>, LedgerError> {
        self.backend.attempts_of_call(session, call_id).map_err(|m| self.err(m))
    }

    /// Tool calls, in (session, call id) order; only those of `session` if given.
    ///
    /// # Errors
    /// A read failed or a record is damaged.
    pub fn calls(&self, session: Option<&str>) -> Result<Vec<CallRecord>, LedgerError> {
        self.backend.calls(session).map_err(|m| self.err(m))
    }

    /// Attempts in `state`.
    ///
    /// # Errors
    /// A read failed or a record is damaged.
    pub fn attempts_in_state(&self, state: AttemptState) -> Result<Vec<AttemptRecord>, LedgerError> {
        self.backend.attempts_in_state(state).map_err(|m| self.err(m))
    }

    /// Every attempt, in key order.
    ///
    /// # Errors
    /// A read failed or a record is damaged.
    pub fn attempts(&self) -> Result<Vec<AttemptRecord>, LedgerError> {
        self.backend.attempts().map_err(|m| self.err(m))
    }

    /// Records that `record.plugin` runs `record.digest` with `record.grants`,
    /// unless that is already its latest entry. Synced: it is audit evidence.
    /// Returns whether a new entry was written.
    ///
    /// # Errors
    /// A read or the write failed.
    pub fn record_grants(&self, record: &GrantRecord) -> Result<bool, LedgerError> {
        let written = self.backend.record_grants(record).map_err(|m| self.err(m))?;
        if written {
            self.counts[0].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(written)
    }

    /// Every grant-history entry, oldest first.
    ///
    /// # Errors
    /// A read failed or a record is damaged.
    pub fn grant_history(&self) -> Result<Vec<GrantRecord>, LedgerError> {
        self.backend.grant_history().map_err(|m| self.err(m))
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

    /// Runs the reads in `read` without blocking an async worker: on this
    /// thread when the backend can answer from memory (RocksDB's memtables
    /// and block cache hold what recent calls wrote), else on the blocking
    /// pool. `read` may run twice, so it must only read.
    ///
    /// # Errors
    /// Whatever `read` returns.
    pub async fn read<T: Send + 'static>(
        &self,
        read: impl Fn(&Ledger) -> Result<T, LedgerError> + Send + 'static,
    ) -> Result<T, LedgerError> {
        if self.backend.memory_reads() {
            match rocks::memory_only(|| read(self)) {
                Err(e) if e.message == NEEDS_IO && !e.conflict && !e.busy && !e.refused => {}
                answered => return answered,
            }
        }
        let ledger = self.clone();
        tokio::task::spawn_blocking(move || read(&ledger)).await.expect("a ledger read panicked")
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
            Some(Err(e)) => Waiting::Failed(e),
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

    /// Whether other hosts share this ledger (PostgreSQL): then a host claims
    /// a tool call before running it, and lets the claim lapse only by dying.
    pub fn shared(&self) -> bool {
        self.backend.shared()
    }

    /// Claims tool call `call` for `call.owner` until `call.lease_until_ms`.
    /// On a shared ledger this is one conditional write: the call is inserted,
    /// or taken over if it is not completed, was made with the same tool and
    /// arguments, and its claim has lapsed or is already the owner's. On a
    /// host's own ledger nothing is written (the host's lock per call is the
    /// claim) and the call is only classified.
    ///
    /// # Errors
    /// The ledger cannot be read or written.
    pub fn claim_call(&self, call: &CallRecord, now_ms: u64) -> Result<Claim, LedgerError> {
        self.backend.claim_call(call, now_ms).map_err(|m| self.err(m))
    }

    /// Ends `owner`'s claim on (session, call id), if it still holds it.
    ///
    /// # Errors
    /// The write failed.
    pub fn release_call(&self, session: &str, call_id: &str, owner: &str) -> Result<(), LedgerError> {
        self.backend.release_call(session, call_id, owner).map_err(|m| self.err(m))
    }

    /// The backend's own estimate of the memory it holds here, in bytes
    /// (RocksDB: memtables, table readers, block cache; PostgreSQL: 0).
    pub fn memory_usage(&self) -> u64 {
        self.backend.memory_usage()
    }

    /// Finishes the housekeeping a bulk load leaves, as a ledger that grew
    /// over months has had it done (the bench, after filling a ledger).
    ///
    /// # Errors
    /// The backend failed.
    pub fn settle(&self) -> Result<(), LedgerError> {
        self.backend.settle().map_err(|m| self.err(m))
    }

    /// `toolguard bench` only: see `Backend::replicate_for_bench`.
    pub(crate) fn replicate_for_bench(&self, seed: &str, prefix: &str, from: u64, to: u64) -> Result<bool, LedgerError> {
        self.backend.replicate_for_bench(seed, prefix, from, to).map_err(|m| self.err(m))
    }

    /// fsyncs of the write-ahead log by this process (RocksDB), if known:
    /// synced writes per fsync is the group-commit batch size.
    pub fn wal_syncs(&self) -> Option<u64> {
        self.backend.wal_syncs()
    }

    /// How many writes this handle (and its clones) committed: (synced,
    /// buffered). Synced ones include grant-history entries, not the ledger's
    /// creation.
    pub fn write_counts(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.counts[0].load(Relaxed), self.counts[1].load(Relaxed))
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
    Writer(rocks::Ticket),
    Pool(tokio::task::JoinHandle<Result<(), BackendError>>),
    Failed(BackendError),
}

impl QueuedWrite {
    /// Waits until the write is applied (and synced, if it is to be).
    ///
    /// # Errors
    /// The write failed; nothing of it was applied.
    pub async fn wait(self) -> Result<(), LedgerError> {
        let written = match self.waiting {
            Waiting::Writer(ticket) => ticket.wait().await.map_err(BackendError::Failed),
            Waiting::Pool(task) => task.await.unwrap_or_else(|e| Err(BackendError::Failed(format!("the ledger write panicked: {e}")))),
            Waiting::Failed(e) => Err(e),
        };
        written.map_err(|e| self.ledger.backend_err(e))?;
        self.ledger.count(self.durability);
        Ok(())
    }
}

/// How claiming a tool call came out.
#[derive(Debug, Clone, PartialEq)]
pub enum Claim {
    /// Ours to run: the call as the ledger now holds it (or the new record),
    /// and whether it is in the ledger yet.
    Run {
        /// The call as the ledger holds it (or the new record).
        record: CallRecord,
        /// Whether it is in the ledger yet.
        persisted: bool,
    },
    /// It completed before: replay its outcome.
    Completed(CallRecord),
    /// It was made before with another tool or arguments.
    Conflict(CallRecord),
    /// Another host runs it now; its claim is live.
    Busy(CallRecord),
    /// An identical later call took its place in its episode: it never runs again.
    Superseded(CallRecord),
}

impl Claim {
    /// How an existing record (`Some`) or none classifies for `call`, on a
    /// ledger only this host writes.
    fn of_existing(call: &CallRecord, existing: Option<CallRecord>) -> Self {
        match existing {
            None => Self::Run { record: call.clone(), persisted: false },
            Some(r) if r.tool != call.tool || r.args_digest != call.args_digest => Self::Conflict(r),
            Some(r) if r.state == CallState::Completed && r.outcome.is_some() => Self::Completed(r),
            Some(r) if r.superseded_by.is_some() => Self::Superseded(r),
            Some(r) => Self::Run { record: r, persisted: true },
        }
    }
}

/// Where a ledger lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LedgerLocation {
    /// A RocksDB directory, used by this host alone.
    Dir(std::path::PathBuf),
    /// A PostgreSQL URL, shared by every host that names it.
    Postgres(String),
}

/// Records to write together, atomically; with conditions (an episode
/// opened or handed over, a call superseded) the whole write is refused
/// with a conflict ([`LedgerError::is_conflict`]) if one does not hold.
#[derive(Debug, Default, Clone)]
pub struct LedgerWrite {
    calls: Vec<CallRecord>,
    attempts: Vec<(AttemptRecord, Prior)>,
    episodes: Vec<EpisodeOp>,
    /// (session, call id, what its caller was told): set on the stored record.
    reports: Vec<(String, String, Reported)>,
    superseding: Option<Superseding>,
    charges: Vec<Charge>,
    /// Retire-index entries to add beside those the records imply (migrations).
    retire: Vec<RetireEntry>,
}

/// One use of a budget, recorded with the write that spends it; the write is
/// refused whole ([`LedgerError::is_refused`]) if the budget's `scope`
/// already holds `max` uses at or after `since_ms`. Scopes are opaque
/// strings the guard builds (a plugin and a session, or a principal).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Charge {
    /// What the budget counts (session or principal, tool).
    pub scope: String,
    /// Most spends in the window.
    pub max: u32,
    /// The window's start (Unix ms).
    pub since_ms: u64,
    /// This spend's time (Unix ms).
    pub at_ms: u64,
    /// The call spending it (a repeat of it spends nothing more).
    pub call_id: String,
    /// What the budget is, for the refusal's message.
    pub what: String,
}

/// A change to an episode record.
#[derive(Debug, Clone, PartialEq)]
pub enum EpisodeOp {
    /// Creates it; refused if that episode of the action exists already.
    Open(EpisodeRecord),
    /// Makes `record.executor` its executor; refused unless `from` still is.
    Hand {
        /// The episode with its new executor.
        record: EpisodeRecord,
        /// The executor it must still have.
        from: String,
    },
    /// Marks it closed at `at_ms` (a no-op if it is closed already).
    Close {
        /// The episode.
        record: EpisodeRecord,
        /// When it closed (Unix ms).
        at_ms: u64,
    },
}

impl EpisodeOp {
    /// The episode this changes.
    pub fn record(&self) -> &EpisodeRecord {
        match self {
            Self::Open(record) | Self::Hand { record, .. } | Self::Close { record, .. } => record,
        }
    }
}

/// The condition of a write that supersedes an episode's executor: the
/// call (`session`, `call_id`) is not completed, holds no live claim at
/// `now_ms`, and has no attempt that may have taken effect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superseding {
    /// The call's session.
    pub session: String,
    /// The call's tool-call id.
    pub call_id: String,
    /// Now (Unix ms): the expiry is measured from here.
    pub now_ms: u64,
}

/// Whether `attempts` prove their call sent nothing that could have taken
/// effect: none, or each settled as never sent (by the transport or an operator).
pub fn sent_nothing(attempts: &[AttemptRecord]) -> bool {
    attempts.iter().all(|a| a.state == AttemptState::Failed && a.response.is_none())
}

/// What the ledger held under an attempt's key before a write replaces it.
/// Knowing it lets a write touch only the index entries that change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prior {
    /// Not known: every index entry is rewritten.
    Unread,
    /// Nothing: the key is new.
    Absent,
    /// The attempt, in this state (read or written by the caller).
    Was(AttemptState),
}

impl LedgerWrite {
    /// An empty write.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) a tool call record.
    pub fn call(mut self, call: CallRecord) -> Self {
        self.calls.push(call);
        self
    }

    /// Adds (or replaces) an attempt record, keeping its indexes right.
    pub fn attempt(self, attempt: AttemptRecord) -> Self {
        self.attempt_over(attempt, Prior::Unread)
    }

    /// Adds an attempt record over what `prior` says the ledger holds for its
    /// key. A wrong `prior` leaves stale index entries, which reads skip.
    pub fn attempt_over(mut self, attempt: AttemptRecord, prior: Prior) -> Self {
        self.attempts.push((attempt, prior));
        self
    }

    /// Adds a change to an episode.
    pub fn episode(mut self, op: EpisodeOp) -> Self {
        self.episodes.push(op);
        self
    }

    /// Records what the caller of (session, call id) was told, on its stored
    /// record (a no-op if there is none).
    pub fn reported(mut self, session: &str, call_id: &str, reported: Reported) -> Self {
        self.reports.push((session.into(), call_id.into(), reported));
        self
    }

    /// Makes the write conditional on `call` being supersedable (see [`Superseding`]).
    pub fn superseding(mut self, call: Superseding) -> Self {
        self.superseding = Some(call);
        self
    }

    /// Adds an entry to the retire index (a migration's backfill).
    pub(crate) fn retiring(mut self, entry: RetireEntry) -> Self {
        self.retire.push(entry);
        self
    }

    /// Spends one use of a budget with this write (see [`Charge`]).
    pub fn charge(mut self, charge: Charge) -> Self {
        self.charges.push(charge);
        self
    }
}

