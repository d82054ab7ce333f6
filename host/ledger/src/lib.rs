//! toolguard's ledger: tool calls and attempts, and the grant history. One handle
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

#![warn(missing_docs)]

mod backend;
mod checks;
mod claim;
mod clock;
mod error;
mod migrate;
pub mod postgres;
pub mod records;
pub mod retention;
pub mod rocks;
#[cfg(test)]
mod suite;
mod write;

pub use checks::sent_nothing;
pub use claim::Claim;
pub use error::LedgerError;
pub use postgres::DEFAULT_POOL_SIZE;
pub use records::{AttemptRecord, AttemptState, CallRecord, CallState, EpisodeId, EpisodeRecord, GrantRecord, Reported, Resolution, StoredOutcome};
pub use rocks::DEFAULT_BLOCK_CACHE_MIB;
#[cfg(any(test, feature = "bench"))]
pub use rocks::simulate_slow_fsync;
pub use write::{Charge, EpisodeOp, LedgerWrite, Prior, Superseding};

use backend::{Backend, Pending};
use error::BackendError;
use std::path::Path;
use std::sync::Arc;

/// What [`Ledger::first_look`] finds about a tool call and its action.
#[derive(Debug, Default)]
pub struct FirstLook {
    /// The call's record, if recorded.
    pub call: Option<CallRecord>,
    /// When the call's record was pruned, if it has none and was.
    pub expired: Option<u64>,
    /// The call's episode if it has one; with no call, the action's latest;
    /// none read for a completed call (its record decides, or the caller reads it).
    pub episode: Option<EpisodeRecord>,
}

/// The schema version this code reads and writes: 2 added episodes, 3
/// retention (`docs/ledger.md`, "Schema versions"); older ones are migrated
/// on open.
pub(crate) const SCHEMA: &str = "3";

/// The older schema versions this code migrates from ([`SCHEMA`]'s history).
pub(crate) const MIGRATES_FROM: &[&str] = &["1", "2"];

/// Whether a write waits for the WAL to reach the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// fsync the WAL before returning (group-committed with concurrent writers).
    Synced,
    /// In the WAL and memtable; survives a process crash, not a power loss.
    /// (PostgreSQL commits every write durably.)
    Buffered,
}

/// The ledger's secret for key derivation, created with the ledger and kept
/// in it: keys cannot be linked back to (guessable) session or call ids
/// without it. Its `Debug` shows nothing.
#[derive(Clone)]
pub struct KeySecret(pub [u8; 32]);

impl std::fmt::Debug for KeySecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeySecret(…)")
    }
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
    /// Async reads that could not be answered from memory and went to the blocking pool.
    pool_reads: Arc<std::sync::atomic::AtomicU64>,
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
        Self::open_cached(dir, rocks::DEFAULT_BLOCK_CACHE_MIB)
    }

    /// [`Ledger::open`] with a block cache of `cache_mib` MiB (what
    /// RocksDB keeps in memory of the table files it read).
    ///
    /// # Errors
    /// As [`Ledger::open`].
    pub fn open_cached(dir: &Path, cache_mib: u64) -> Result<Self, LedgerError> {
        let location = dir.display().to_string();
        let backend = rocks::Rocks::open_cached(dir, cache_mib).map_err(|e| LedgerError::of(&location, e))?;
        Self::init(Arc::new(backend), location, true)
    }

    /// Opens an existing RocksDB ledger read-only (works while a host holds it).
    ///
    /// # Errors
    /// There is no ledger in `dir`, or it cannot be read.
    pub fn open_read_only(dir: &Path) -> Result<Self, LedgerError> {
        let location = dir.display().to_string();
        let backend = rocks::Rocks::open_read_only(dir).map_err(|e| LedgerError::of(&location, e))?;
        Self::init(Arc::new(backend), location, false)
    }

    /// Connects to the PostgreSQL ledger at `url` (`postgres://…`), creating
    /// or migrating its tables.
    ///
    /// # Errors
    /// The server cannot be reached, refuses the login, or holds an
    /// incompatible schema.
    pub fn connect(url: &str) -> Result<Self, LedgerError> {
        Self::connect_pooled(url, DEFAULT_POOL_SIZE)
    }

    /// [`Ledger::connect`], keeping at most `pool_size` connections to the server.
    ///
    /// # Errors
    /// As [`Ledger::connect`].
    pub fn connect_pooled(url: &str, pool_size: u32) -> Result<Self, LedgerError> {
        let location = postgres::redacted(url);
        let backend = postgres::Postgres::connect(url, pool_size).map_err(|e| LedgerError::of(&location, e))?;
        Self::init(Arc::new(backend), location, true)
    }

    /// Opens the ledger a config names: `postgres://…` or `postgresql://…`
    /// connects to PostgreSQL with at most `pool_size` connections; anything
    /// else is a RocksDB directory: opened writable with a block cache of
    /// `cache_mib` MiB, or read-only (a short inspection, on RocksDB's
    /// default cache).
    ///
    /// # Errors
    /// As [`Ledger::open`] or [`Ledger::connect`].
    pub fn open_at(location: &LedgerLocation, read_only: bool, cache_mib: u64, pool_size: u32) -> Result<Self, LedgerError> {
        match location {
            LedgerLocation::Postgres(url) => Self::connect_pooled(url, pool_size),
            LedgerLocation::Dir(dir) if read_only => Self::open_read_only(dir),
            LedgerLocation::Dir(dir) => Self::open_cached(dir, cache_mib),
        }
    }

    /// Checks the schema (migrating an older one, unless opened read-only)
    /// and reads the key secret.
    fn init(backend: Arc<dyn Backend>, location: String, writable: bool) -> Result<Self, LedgerError> {
        let failed = |message| LedgerError::at(&location, message);
        let (schema, secret) = backend.meta(writable).map_err(|e| LedgerError::of(&location, e))?;
        let ledger = Self { backend, location: location.clone().into(), secret: KeySecret(secret), counts: Arc::default(), pool_reads: Arc::default() };
        match schema.as_str() {
            SCHEMA => {}
            // Read-only opens read schema-1 records as they are.
            older if !writable && MIGRATES_FROM.contains(&older) => {}
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

    /// Every grant-history entry, oldest first.
    ///
    /// # Errors
    /// A read failed or a record is damaged.
    pub fn grant_history(&self) -> Result<Vec<GrantRecord>, LedgerError> {
        self.backend.grant_history().map_err(|e| self.backend_err(e))
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

    /// Whether other hosts share this ledger (PostgreSQL): then a host claims
    /// a tool call before running it, and lets the claim lapse only by dying.
    pub fn shared(&self) -> bool {
        self.backend.shared()
    }

    /// Reads the ledger's clock again: on a shared ledger, the server's
    /// (`docs/fleet.md`, "One clock"); nothing to do on a host's own.
    ///
    /// # Errors
    /// The server cannot be asked; the last reading stands.
    pub fn follow_clock(&self) -> Result<(), LedgerError> {
        self.backend.follow_clock().map_err(|e| self.backend_err(e))
    }

    /// The ledger's schema version now, if it is no longer this build's: a
    /// newer toolguard on another host of a fleet migrated it since this
    /// host opened it (the open checks it once; a serving host asks again
    /// every recovery pass). A host's own ledger is not read: no other
    /// process can open it writable while this one holds it.
    ///
    /// # Errors
    /// The ledger cannot be read.
    pub fn schema_changed(&self) -> Result<Option<String>, LedgerError> {
        if !self.shared() {
            return Ok(None);
        }
        let (schema, _) = self.backend.meta(false).map_err(|e| self.backend_err(e))?;
        Ok((schema != SCHEMA).then_some(schema))
    }

    /// This build's schema version.
    pub const fn schema() -> &'static str {
        SCHEMA
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
        self.backend.claim_call(call, now_ms).map_err(|e| self.backend_err(e))
    }

    /// Ends `owner`'s claim on (session, call id), if it still holds it.
    ///
    /// # Errors
    /// The write failed.
    pub fn release_call(&self, session: &str, call_id: &str, owner: &str) -> Result<(), LedgerError> {
        self.backend.release_call(session, call_id, owner).map_err(|e| self.backend_err(e))
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
        self.backend.settle().map_err(|e| self.backend_err(e))
    }

    /// `toolguard bench` only: see `Backend::replicate_for_bench`.
    pub fn replicate_for_bench(&self, seed: &str, prefix: &str, from: u64, to: u64) -> Result<bool, LedgerError> {
        self.backend.replicate_for_bench(seed, prefix, from, to).map_err(|e| self.backend_err(e))
    }

    /// `toolguard bench` only: see `Backend::bench_schema`.
    pub fn bench_schema(&self, name: &str, create: bool) -> Result<(), LedgerError> {
        self.backend.bench_schema(name, create).map_err(|e| self.backend_err(e))
    }

    /// fsyncs of the write-ahead log by this process (RocksDB), if known:
    /// synced writes per fsync is the group-commit batch size.
    pub fn wal_syncs(&self) -> Option<u64> {
        self.backend.wal_syncs()
    }

    /// How many [`Ledger::read`]s of this handle (and its clones) went to
    /// the blocking pool: memory could not answer them (or, on PostgreSQL,
    /// every one).
    pub fn pool_reads(&self) -> u64 {
        self.pool_reads.load(std::sync::atomic::Ordering::Relaxed)
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

/// Where a ledger lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LedgerLocation {
    /// A RocksDB directory, used by this host alone.
    Dir(std::path::PathBuf),
    /// A PostgreSQL URL, shared by every host that names it.
    Postgres(String),
}
