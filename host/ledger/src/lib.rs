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
#[cfg(feature = "bench")]
mod bench;
mod checks;
mod claim;
mod clock;
mod commit;
mod error;
mod migrate;
pub mod postgres;
mod read;
pub mod records;
pub mod retention;
pub mod rocks;
#[cfg(test)]
mod suite;
mod write;

pub use checks::{never_took_effect, sent_nothing};
pub use claim::Claim;
pub use commit::{Decision, QueuedWrite};
pub use error::LedgerError;
pub use postgres::{CONNECT_TIMEOUT as POSTGRES_CONNECT_TIMEOUT, DEFAULT_POOL_SIZE};
pub use records::{
    Approval, ApprovalStatus, AttemptRecord, AttemptState, CallRecord, CallState, EpisodeId, EpisodeRecord, GrantRecord, Reported, Resolution, ServedPlugin,
    ServingRecord, StoredOutcome,
};
pub use rocks::DEFAULT_BLOCK_CACHE_MIB;
#[cfg(any(test, feature = "bench"))]
pub use rocks::simulate_slow_fsync;
pub use write::{Charge, EpisodeOp, LedgerWrite, Prior, Release, Spend, Superseding};

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
/// retention, 4 spending limits (`docs/ledger.md`, "Schema versions");
/// older ones are migrated on open.
pub(crate) const SCHEMA: &str = "4";

/// The older schema versions this code migrates from ([`SCHEMA`]'s history).
pub(crate) const MIGRATES_FROM: &[&str] = &["1", "2", "3"];

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
                migrate::to_4(&ledger)?;
            }
            "2" => {
                migrate::to_3(&ledger)?;
                migrate::to_4(&ledger)?;
            }
            "3" => migrate::to_4(&ledger)?,
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

/// Where a ledger lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LedgerLocation {
    /// A RocksDB directory, used by this host alone.
    Dir(std::path::PathBuf),
    /// A PostgreSQL URL, shared by every host that names it.
    Postgres(String),
}
