//! The embedded backend: RocksDB, one process at a time (the default).
//!
//! Column families (keys → values):
//! - `meta`: `secret` → the 32-byte key-derivation secret; `schema` → version.
//! - `calls`: (session, call id) → [`CallRecord`] JSON. Keys start with the
//!   length-prefixed session, so a prefix scan is the by-session index.
//! - `attempts`: idempotency key → [`AttemptRecord`] JSON.
//! - `attempts_by_state`: state tag ‖ key → ∅, for unsettled attempts
//!   (`pending`, `unknown`) only.
//! - `call_attempts`: (session, call id) ‖ step → key.
//! - `grant_history`: plugin ‖ 0 ‖ time → [`GrantRecord`] JSON: which component
//!   digest ran with which effective grants, from when.
//! - `episodes`: (session, tool, args digest) ‖ episode number →
//!   [`EpisodeRecord`] JSON: the hold rule's episodes of each irreversible action.
//! - `budget`: length-prefixed scope ‖ time ‖ call id → ∅: each use of a
//!   budget (irreversible calls per session or principal and hour).
//! - `unsettled`: schema 1's hold-rule index; no longer written or read
//!   (kept because RocksDB opens every family a database has).
//! - `episode_calls`: (session, tool, args digest) ‖ episode ‖ call id → ∅:
//!   the calls of each episode.
//! - `retire`: time ‖ unit JSON → ∅: units that became final, by when
//!   (`ledger::retention`).
//! - `expired`: 16-byte digest of (session, call id) → time pruned: the
//!   tombstones of pruned calls.
//! - `latest_episode`: 16-byte digest of (session, tool, args digest) → the
//!   number of the action's latest episode ([`latest`]).
//!
//! Their keys are built in [`keys`]; the indexes are kept in [`index`].
//!
//! Synced writes fsync the WAL; buffered ones reach the WAL and the memtables
//! only. Writes from async callers go to one writer thread ([`Writer`]),
//! which commits everything queued while it was busy as one batch, and a
//! sync thread fsyncs for the synced ones: group commit without a thread per
//! waiting writer. A write with nothing queued ahead of it is applied on its
//! caller's thread instead ([`Writer::apply_now`]); if synced, its fsync
//! runs there too when no other synced write waits for one
//! ([`Writer::sync_now`]), and is left to the sync thread otherwise. Reads
//! from async callers may be answered from memory only ([`memory_only`]).

mod index;
mod keys;
mod latest;
mod retention;
#[cfg(test)]
mod tests;
mod writer;
#[cfg(any(test, feature = "bench"))]
pub use writer::simulate_slow_fsync;

use crate::error::failed;
use keys::*;
use writer::{Job, Now, Ticket, Writer};

use super::backend::Pending;
use super::retention::{LedgerStats, Removal, RetireEntry};
use super::{
    AttemptRecord, AttemptState, Backend, BackendError, CallRecord, CallState, Claim, Durability, EpisodeOp, EpisodeRecord, GrantRecord, LedgerWrite, checks,
};
use rocksdb::{BlockBasedOptions, Cache, ColumnFamilyDescriptor, DB, IteratorMode, Options, ReadOptions, WriteBatch, WriteOptions};
use std::cell::Cell;
use std::path::Path;
use std::sync::Arc;

/// Memory all memtables together may use before RocksDB flushes them.
const LEDGER_MEMTABLE_BUDGET: usize = 32 << 20;

/// The default memory for data, index and filter blocks read from table
/// files, in MiB, shared by all column families (RocksDB's own default is
/// 32 MiB per family); `ledger_cache_mib` in the config sets it. The two
/// families keyed by a hash have a cache of their own of the same size
/// ([`Caches`]).
pub const DEFAULT_BLOCK_CACHE_MIB: u64 = 8;

/// The families keyed by a hash, whose index and filter partitions are all
/// pinned, in a block cache of their own ([`Caches`]).
const PINNED_CFS: [&str; 2] = [CF_LATEST, CF_EXPIRED];

/// The block caches of a ledger.
struct Caches {
    /// Every family's blocks but those of `pinned`'s families.
    shared: Cache,
    /// The families keyed by a hash (`latest_episode`, `expired`), whose
    /// index and filter partitions are all pinned: ~1.4 bytes per action or
    /// tombstone, which outgrow any fixed cache (14 MB at 10 M actions).
    /// In the shared cache they took all of it, and every block any other
    /// family loaded was evicted the moment its read ended: at 10 M calls
    /// each guarded call made two reads memory could not answer
    /// (docs/benchmarks.md, (i)). Here they crowd only their own families'
    /// data blocks.
    pinned: Cache,
}

/// How many table files flushed from memtables (level 0) a family gathers
/// before RocksDB compacts them into the level below (its default is 4).
const L0_COMPACTION_TRIGGER: i32 = 8;

/// The options of family `name`.
fn cf_options(name: &str, caches: &Caches) -> Options {
    let pinned = PINNED_CFS.contains(&name);
    let mut table = BlockBasedOptions::default();
    table.set_block_cache(if pinned { &caches.pinned } else { &caches.shared });
    // Index and filter blocks count against the cache instead of growing
    // with the number of table files.
    table.set_cache_index_and_filter_blocks(true);
    // A lookup of a key that is not there (every new tool call, every new
    // step) skips the table's data blocks.
    table.set_bloom_filter(10.0, false);
    // Partitioned: a lookup loads one 4 KiB partition of a table's index and
    // filter, not the whole of them (megabytes for a large table), so a
    // ledger of millions of calls costs what a small one does in a cache
    // this size (docs/benchmarks.md, (i)). The top levels stay pinned, and
    // index and filter blocks go to the cache's high-priority pool, ahead of
    // data blocks.
    table.set_index_type(rocksdb::BlockBasedIndexType::TwoLevelIndexSearch);
    table.set_partition_filters(true);
    table.set_metadata_block_size(4096);
    table.set_pin_top_level_index_and_filter(true);
    table.set_cache_index_and_filter_blocks_with_high_priority(true);
    table.set_pin_l0_filter_and_index_blocks_in_cache(true);
    if pinned {
        // Keyed by a hash, so each admission's lookup of a new action (or of
        // a new call's tombstone) lands in a random partition of every
        // level: unpinned, a ledger of millions read a partition from the
        // disk for nearly every new action (admission 18 → 54 µs at 1 M
        // calls, 77 at 10 M). Pinned, all of them stay in memory, ~1.4 bytes
        // per action or tombstone (docs/benchmarks.md, (i)).
        table.set_partition_pinning_tier(rocksdb::BlockBasedTablePinningTier::All);
    }
    let mut o = Options::default();
    o.set_write_buffer_size(8 << 20);
    // Keys are (session, call id), not time-ordered: every compaction of
    // level 0 rewrites the overlapping part of the level below, nearly all of
    // it. Compacting 8 flushed files at once instead of RocksDB's 4 halves
    // how often that happens: the flushes and compactions of a host serving
    // without pause fell from ~31 to ~21 µs of CPU per guarded call
    // (docs/benchmarks.md), for point lookups that check up to 8 young
    // files' pinned filters instead of 4.
    o.set_level_zero_file_num_compaction_trigger(L0_COMPACTION_TRIGGER);
    o.set_block_based_table_factory(&table);
    // Records are JSON: LZ4 at every level. ZSTD at the bottom took ~30 %
    // less disk, but keys are not in time order, so every compaction of
    // level 0 rewrites (and recompresses) the level below, which grows with
    // the ledger: ZSTD made RocksDB's background CPU per call grow ~2x as
    // fast (docs/benchmarks.md). Compression runs in flushes and
    // compactions, off the write path.
    o.set_compression_type(rocksdb::DBCompressionType::Lz4);
    // The blocks a memtable flush writes (data, index and filter) go into
    // the block cache as they are written (`prepopulate_block_cache`, which
    // the Rust binding has no setter for: set over the table options above,
    // keeping them and the shared cache). Without it the first read to meet
    // a freshly flushed table — the newest records, the likeliest to be
    // read — could not be answered from memory and went to the blocking
    // pool: ~0.1 of the guard's reads per call at 64 in flight
    // (docs/benchmarks.md).
    let mut o = o.get_options_from_string("block_based_table_factory={prepopulate_block_cache=kFlushOnly}").expect("a valid option string");
    if name == CF_EPISODES {
        // Finding an action's latest episode without its `latest_episode`
        // entry scans the action's prefix, which without a prefix filter
        // seeks into the memtables and every table file even when the action
        // has none. With the action as the prefix, the memtable's prefix
        // bloom and each table's filter skip them instead. Only
        // [`Rocks::latest_episode`]'s fallback seeks by prefix (a read-only
        // open of an older ledger, an action whose latest episode was
        // pruned); every other read seeks in total order ([`read_options`]).
        o.set_prefix_extractor(rocksdb::SliceTransform::create("toolguard.episode-action", episode_action, Some(is_episode_key)));
        o.set_memtable_prefix_bloom_ratio(0.1);
    }
    o
}

/// The action part of an episode key: all but its 8-byte episode number.
fn episode_action(key: &[u8]) -> &[u8] {
    &key[..key.len().saturating_sub(8)]
}

/// Whether `key` is long enough to be an episode key.
fn is_episode_key(key: &[u8]) -> bool {
    key.len() > 8
}

/// A RocksDB ledger database.
pub(crate) struct Rocks {
    /// Declared first: dropping it drains the queue and joins the thread
    /// before the database closes.
    writer: Option<Writer>,
    db: Arc<DB>,
    /// The options the database was opened with: they hold its statistics.
    opts: Option<Options>,
    /// The database's directory.
    dir: std::path::PathBuf,
    /// Whether family `latest_episode` indexes every action ([`latest`]);
    /// a read-only open of an older ledger seeks by prefix instead.
    latest_indexed: bool,
}

thread_local! {
    static MEMORY_ONLY: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with this thread's RocksDB reads answered from memory only
/// (memtables and block cache): a read that would touch the disk fails with
/// [`BackendError::NeedsIo`] instead of blocking.
pub(crate) fn memory_only<T>(f: impl FnOnce() -> T) -> T {
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            MEMORY_ONLY.set(self.0);
        }
    }
    let _reset = Reset(MEMORY_ONLY.replace(true));
    f()
}

/// Read options in total order (a family's prefix filter is never used to
/// skip data), answered from memory only on a [`memory_only`] thread.
fn read_options() -> ReadOptions {
    let mut o = ReadOptions::default();
    o.set_total_order_seek(true);
    if MEMORY_ONLY.get() {
        o.set_read_tier(rocksdb::ReadTier::BlockCache);
    }
    o
}

fn db_error(e: &rocksdb::Error) -> BackendError {
    if e.kind() == rocksdb::ErrorKind::Incomplete { BackendError::NeedsIo } else { BackendError::Failed(e.to_string()) }
}

impl Rocks {
    /// Opens (creating if needed) the database in `dir`, with the default block cache.
    #[cfg(test)]
    pub(crate) fn open(dir: &Path) -> Result<Self, BackendError> {
        Self::open_cached(dir, DEFAULT_BLOCK_CACHE_MIB)
    }

    /// Opens (creating if needed) the database in `dir`, with block caches
    /// of `cache_mib` MiB each ([`Caches`]).
    pub(crate) fn open_cached(dir: &Path, cache_mib: u64) -> Result<Self, BackendError> {
        Self::open_with_cache(dir, usize::try_from(cache_mib << 20).unwrap_or(usize::MAX))
    }

    /// [`Rocks::open_cached`] with block caches of `bytes` each.
    fn open_with_cache(dir: &Path, bytes: usize) -> Result<Self, BackendError> {
        std::fs::create_dir_all(dir).map_err(|e| failed(format!("cannot create the directory: {e}")))?;
        let mut opts = Options::default();
        opts.create_if_missing(true);
        opts.create_missing_column_families(true);
        opts.set_keep_log_file_num(4);
        // Bounded memory: memtables across all families share one budget.
        opts.set_db_write_buffer_size(LEDGER_MEMTABLE_BUDGET);
        // Tickers only (no histograms or timers): WAL fsyncs for /metrics.
        opts.enable_statistics();
        opts.set_statistics_level(rocksdb::statistics::StatsLevel::ExceptHistogramOrTimers);
        let caches = Caches { shared: Cache::new_lru_cache(bytes), pinned: Cache::new_lru_cache(bytes) };
        let cfs = ALL_CFS.iter().map(|n| ColumnFamilyDescriptor::new(*n, cf_options(n, &caches)));
        let db = Arc::new(DB::open_cf_descriptors(&opts, dir, cfs).map_err(|e| describe_open_error(&e))?);
        let mut rocks = Self { writer: Some(Writer::start(db.clone())?), db, opts: Some(opts), dir: dir.to_path_buf(), latest_indexed: false };
        if !rocks.latest_is_indexed()? {
            rocks.index_latest_episodes()?;
        }
        rocks.latest_indexed = true;
        Ok(rocks)
    }

    /// Opens an existing database read-only (works while a host holds it).
    pub(crate) fn open_read_only(dir: &Path) -> Result<Self, BackendError> {
        if !dir.join("CURRENT").exists() {
            return Err("no ledger here yet (nothing has been recorded)".into());
        }
        // A ledger of an older schema lacks the newer families; reads of them find nothing.
        let families = DB::list_cf(&Options::default(), dir).map_err(failed)?;
        let db = DB::open_cf_for_read_only(&Options::default(), dir, families, false).map_err(failed)?;
        let mut rocks = Self { writer: None, db: Arc::new(db), opts: None, dir: dir.to_path_buf(), latest_indexed: false };
        rocks.latest_indexed = rocks.latest_is_indexed()?;
        Ok(rocks)
    }

    fn cf(&self, name: &str) -> &rocksdb::ColumnFamily {
        self.db.cf_handle(name).expect("every column family is opened with the database")
    }

    fn get_json<T: serde::de::DeserializeOwned>(&self, cf: &str, key: &[u8]) -> Result<Option<T>, BackendError> {
        // Only a read-only open of an older schema lacks a family.
        let Some(family) = self.db.cf_handle(cf) else { return Ok(None) };
        match self.db.get_cf_opt(family, key, &read_options()).map_err(|e| db_error(&e))? {
            Some(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| failed(format!("damaged record: {e}"))),
            None => Ok(None),
        }
    }

    fn scan<T>(&self, cf: &str, prefix: &[u8], mut f: impl FnMut(&[u8], &[u8]) -> Option<T>) -> Result<Vec<T>, BackendError> {
        let mut out = Vec::new();
        let Some(family) = self.db.cf_handle(cf) else { return Ok(out) };
        // An upper bound stops RocksDB at the prefix's end even when deleted
        // keys (tombstones) follow: without it a seek may walk them all.
        let mut opts = read_options();
        if let Some(upper) = prefix_successor(prefix) {
            opts.set_iterate_upper_bound(upper);
        }
        for item in self.db.iterator_cf_opt(family, opts, IteratorMode::From(prefix, rocksdb::Direction::Forward)) {
            let (k, v) = item.map_err(|e| db_error(&e))?;
            if !k.starts_with(prefix) {
                break;
            }
            out.extend(f(&k, &v));
        }
        Ok(out)
    }

    /// How many keys under `prefix` sort at or after `from`, counting at most `max`.
    fn count_from(&self, cf: &str, prefix: &[u8], from: &[u8], max: usize) -> Result<usize, BackendError> {
        let Some(family) = self.db.cf_handle(cf) else { return Ok(0) };
        let mut opts = read_options();
        if let Some(upper) = prefix_successor(prefix) {
            opts.set_iterate_upper_bound(upper);
        }
        let mut n = 0;
        for item in self.db.iterator_cf_opt(family, opts, IteratorMode::From(from, rocksdb::Direction::Forward)) {
            item.map_err(|e| db_error(&e))?;
            n += 1;
            if n >= max {
                break;
            }
        }
        Ok(n)
    }

    fn attempts_by_key(&self, keys: &[String]) -> Result<Vec<AttemptRecord>, BackendError> {
        keys.iter().filter_map(|k| self.attempt(k).transpose()).collect()
    }

    fn records<T: serde::de::DeserializeOwned>(raw: &[Vec<u8>]) -> Result<Vec<T>, BackendError> {
        raw.iter().map(|v| serde_json::from_slice(v).map_err(|e| failed(format!("damaged record: {e}")))).collect()
    }

    /// `write` as one RocksDB batch, after checking its conditions against
    /// what the database holds. This process is the database's only writer,
    /// and the guard decides about one action at a time (its lock per
    /// action), so nothing changes between this check and the write.
    fn batch(&self, write: &LedgerWrite) -> Result<WriteBatch, BackendError> {
        if let Some(s) = &write.superseding {
            let call: Option<CallRecord> = self.get_json(CF_CALLS, &call_key(&s.session, &s.call_id))?;
            // One host writes this ledger: no other host's claim to check.
            let free = call.is_some_and(|c| c.state != CallState::Completed);
            checks::supersedable(s, free, &self.attempts_of_call(&s.session, &s.call_id)?)?;
        }
        let mut batch = WriteBatch::default();
        for c in &write.charges {
            let prefix = length_prefixed(&c.scope);
            let from = [prefix.as_slice(), &c.since_ms.to_be_bytes()].concat();
            checks::within_budget(c, self.count_from(CF_BUDGET, &prefix, &from, c.max as usize)? as u64)?;
            let key = [prefix.as_slice(), &c.at_ms.to_be_bytes(), c.call_id.as_bytes()].concat();
            batch.put_cf(self.cf(CF_BUDGET), key, []);
        }
        for call in &write.calls {
            let value = serde_json::to_vec(call).map_err(failed)?;
            batch.put_cf(self.cf(CF_CALLS), call_key(&call.session, &call.call_id), value);
            self.index_call(&mut batch, call);
        }
        for entry in &write.retire {
            batch.put_cf(self.cf(CF_RETIRE), retire_key(entry), []);
        }
        for report in &write.reports {
            let key = call_key(&report.session, &report.call_id);
            let value = match &report.read {
                Some(call) => serde_json::to_vec(call).map_err(failed)?,
                None => match self.get_json::<CallRecord>(CF_CALLS, &key)? {
                    Some(call) => serde_json::to_vec(&CallRecord { reported: report.reported, ..call }).map_err(failed)?,
                    None => continue,
                },
            };
            batch.put_cf(self.cf(CF_CALLS), key, value);
        }
        for (attempt, prior) in &write.attempts {
            let value = serde_json::to_vec(attempt).map_err(failed)?;
            batch.put_cf(self.cf(CF_ATTEMPTS), attempt.key.as_bytes(), value);
            self.index(&mut batch, attempt, *prior);
        }
        for op in &write.episodes {
            let r = op.id();
            let key = episode_key(&r.session, &r.tool, &r.args_digest, r.episode);
            let stored: Option<EpisodeRecord> = self.get_json(CF_EPISODES, &key)?;
            let new = match (op, stored) {
                (EpisodeOp::Open(record), None) => {
                    self.index_latest(&mut batch, record);
                    record.clone()
                }
                (EpisodeOp::Hand { record, from }, Some(old)) if old.executor == *from => EpisodeRecord { executor: record.executor.clone(), ..old },
                (EpisodeOp::Close { .. }, Some(old)) if old.closed => continue,
                (EpisodeOp::Close { at_ms, .. }, Some(old)) => {
                    batch.put_cf(self.cf(CF_RETIRE), retire_key(&RetireEntry::of_close(&r, *at_ms)), []);
                    EpisodeRecord { closed: true, closed_ms: Some(*at_ms), ..old }
                }
                (EpisodeOp::Close { .. }, None) => continue,
                (EpisodeOp::Open(_), Some(_)) => {
                    // Opened from a stale latest episode: set its entry right first.
                    self.repair_latest(&r.session, &r.tool, &r.args_digest);
                    return Err(checks::episode_changed(&r));
                }
                _ => return Err(checks::episode_changed(&r)),
            };
            batch.put_cf(self.cf(CF_EPISODES), key, serde_json::to_vec(&new).map_err(failed)?);
        }
        Ok(batch)
    }
}

impl Backend for Rocks {
    fn meta(&self, create: bool) -> Result<(String, [u8; 32]), BackendError> {
        let meta = self.cf(CF_META);
        let schema = match self.db.get_cf(meta, b"schema").map_err(failed)? {
            Some(v) => String::from_utf8_lossy(&v).into_owned(),
            None if create => {
                let mut batch = WriteBatch::default();
                batch.put_cf(meta, b"secret", super::new_secret()?);
                batch.put_cf(meta, b"schema", super::SCHEMA);
                self.db.write_opt(batch, &write_options(Durability::Synced)).map_err(failed)?;
                super::SCHEMA.to_string()
            }
            None => return Err("the ledger has no schema record".into()),
        };
        let secret = self.db.get_cf(meta, b"secret").map_err(failed)?;
        let secret = secret.as_deref().and_then(|s| s.try_into().ok()).ok_or("the key secret is missing or damaged")?;
        Ok((schema, secret))
    }

    fn set_schema(&self, version: &str) -> Result<(), BackendError> {
        let mut batch = WriteBatch::default();
        batch.put_cf(self.cf(CF_META), b"schema", version);
        self.db.write_opt(batch, &write_options(Durability::Synced)).map_err(failed)
    }

    fn episode(&self, session: &str, tool: &str, args_digest: &str, episode: Option<u64>) -> Result<Option<EpisodeRecord>, BackendError> {
        match episode {
            Some(n) => self.get_json(CF_EPISODES, &episode_key(session, tool, args_digest, n)),
            // An action has a few episodes at most: the last of them is the latest.
            None => self.latest_episode(session, tool, args_digest),
        }
    }

    fn call(&self, session: &str, call_id: &str) -> Result<Option<CallRecord>, BackendError> {
        self.get_json(CF_CALLS, &call_key(session, call_id))
    }

    fn attempt(&self, key: &str) -> Result<Option<AttemptRecord>, BackendError> {
        self.get_json(CF_ATTEMPTS, key.as_bytes())
    }

    fn attempt_at(&self, session: &str, call_id: &str, step: u32) -> Result<Option<AttemptRecord>, BackendError> {
        let mut index = call_key(session, call_id);
        index.extend_from_slice(&step.to_be_bytes());
        match self.db.get_cf_opt(self.cf(CF_CALL_ATTEMPTS), index, &read_options()).map_err(|e| db_error(&e))? {
            Some(key) => self.attempt(&String::from_utf8_lossy(&key)),
            None => Ok(None),
        }
    }

    fn attempts_of_call(&self, session: &str, call_id: &str) -> Result<Vec<AttemptRecord>, BackendError> {
        let keys = self.scan(CF_CALL_ATTEMPTS, &call_key(session, call_id), |_, v| Some(String::from_utf8_lossy(v).into_owned()))?;
        self.attempts_by_key(&keys)
    }

    fn calls(&self, session: Option<&str>) -> Result<Vec<CallRecord>, BackendError> {
        let prefix = session.map(session_prefix).unwrap_or_default();
        Self::records(&self.scan(CF_CALLS, &prefix, |_, v| Some(v.to_vec()))?)
    }

    fn attempts_in_state(&self, state: AttemptState) -> Result<Vec<AttemptRecord>, BackendError> {
        // Only unsettled attempts are indexed ([`Rocks::index`]).
        if !state.is_unsettled() {
            return Ok(self.attempts()?.into_iter().filter(|a| a.state == state).collect());
        }
        let keys = self.scan(CF_BY_STATE, &[state.tag()], |k, _| Some(String::from_utf8_lossy(&k[1..]).into_owned()))?;
        Ok(self.attempts_by_key(&keys)?.into_iter().filter(|a| a.state == state).collect())
    }

    fn attempts(&self) -> Result<Vec<AttemptRecord>, BackendError> {
        Self::records(&self.scan(CF_ATTEMPTS, &[], |_, v| Some(v.to_vec()))?)
    }

    fn record_grants(&self, record: &GrantRecord) -> Result<bool, BackendError> {
        let mut prefix = record.plugin.as_bytes().to_vec();
        prefix.push(0);
        let history: Vec<GrantRecord> = self.scan(CF_GRANT_HISTORY, &prefix, |_, v| serde_json::from_slice(v).ok())?;
        if !checks::grants_changed(history.last(), record) {
            return Ok(false);
        }
        let mut key = prefix;
        key.extend_from_slice(&record.recorded_ms.to_be_bytes());
        let value = serde_json::to_vec(record).map_err(failed)?;
        let mut batch = WriteBatch::default();
        batch.put_cf(self.cf(CF_GRANT_HISTORY), key, value);
        self.db.write_opt(batch, &write_options(Durability::Synced)).map_err(failed)?;
        Ok(true)
    }

    fn grant_history(&self) -> Result<Vec<GrantRecord>, BackendError> {
        let mut all: Vec<GrantRecord> = Self::records(&self.scan(CF_GRANT_HISTORY, &[], |_, v| Some(v.to_vec()))?)?;
        all.sort_by_key(|r| r.recorded_ms);
        Ok(all)
    }

    fn commit(&self, write: &LedgerWrite, durability: Durability) -> Result<(), BackendError> {
        self.db.write_opt(self.batch(write)?, &write_options(durability)).map_err(|e| BackendError::Failed(e.to_string()))
    }

    fn lands_in_order(&self) -> bool {
        self.writer.is_some()
    }

    fn enqueue(&self, write: &LedgerWrite, durability: Durability) -> Option<Result<Pending, BackendError>> {
        let writer = self.writer.as_ref()?;
        let batch = match self.batch(write) {
            Ok(batch) => batch,
            Err(e) => return Some(Err(e)),
        };
        let sync = durability == Durability::Synced;
        let (done, result) = tokio::sync::oneshot::channel();
        let handed = match writer.apply_now(&self.db, batch) {
            // Applied with nothing ahead of it: only the fsync is left.
            Now::Applied(Ok(())) if sync => match writer.sync_now(&self.db) {
                Some(synced) => return Some(Ok(ready(synced))),
                None => writer.sync_applied(done).is_ok(),
            },
            Now::Applied(written) => return Some(Ok(ready(written))),
            Now::Queue(batch) => writer.queue(Job { batch, sync, done }).is_ok(),
            Now::Stalled => match self.batch(write) {
                Ok(batch) => writer.queue(Job { batch, sync, done }).is_ok(),
                Err(e) => return Some(Err(e)),
            },
        };
        if !handed {
            return Some(Err(BackendError::Failed("the ledger's writer thread has stopped".into())));
        }
        let ticket = Ticket { result };
        Some(Ok(Box::pin(async move { ticket.wait().await.map_err(BackendError::Failed) })))
    }

    fn read_from_memory(&self, read: &mut dyn FnMut()) -> bool {
        if self.writer.is_none() {
            return false;
        }
        memory_only(read);
        true
    }

    fn claim_call(&self, call: &CallRecord, _now_ms: u64) -> Result<Claim, BackendError> {
        Ok(Claim::of_existing(call, self.call(&call.session, &call.call_id)?))
    }

    fn release_call(&self, _session: &str, _call_id: &str, _owner: &str) -> Result<(), BackendError> {
        Ok(())
    }

    fn retire_page(&self, before_ms: u64, after: Option<&RetireEntry>, limit: usize) -> Result<Vec<RetireEntry>, BackendError> {
        self.retire_page_of(before_ms, after, limit)
    }

    fn remove(&self, removal: &Removal) -> Result<(), BackendError> {
        self.remove_unit(removal)
    }

    fn expired(&self, session: &str, call_id: &str) -> Result<Option<u64>, BackendError> {
        self.expired_at(session, call_id)
    }

    fn episode_calls(&self, session: &str, tool: &str, args_digest: &str, episode: u64) -> Result<Vec<CallRecord>, BackendError> {
        self.calls_of_episode(session, tool, args_digest, episode)
    }

    fn forget_budget_before(&self, before_ms: u64) -> Result<u64, BackendError> {
        self.forget_budget(before_ms)
    }

    fn stats(&self) -> Result<LedgerStats, BackendError> {
        self.figures()
    }

    fn episodes(&self) -> Result<Vec<EpisodeRecord>, BackendError> {
        self.all_episodes()
    }

    fn backfill_episode_index(&self) -> Result<(), BackendError> {
        Rocks::backfill_episode_index(self)
    }

    fn wal_syncs(&self) -> Option<u64> {
        self.opts.as_ref().map(|o| o.get_ticker_count(rocksdb::statistics::Ticker::WalFileSynced))
    }

    fn settle(&self) -> Result<(), BackendError> {
        self.db.flush().map_err(failed)?;
        for name in ALL_CFS {
            self.db.compact_range_cf(self.cf(name), None::<&[u8]>, None::<&[u8]>);
        }
        Ok(())
    }

    fn memory_usage(&self) -> u64 {
        let cfs = ALL_CFS.iter().map(|n| self.cf(n));
        let prop = |name: &str, cf: &rocksdb::ColumnFamily| self.db.property_int_value_cf(cf, name).ok().flatten().unwrap_or(0);
        let tables: u64 = cfs.map(|cf| prop("rocksdb.cur-size-all-mem-tables", cf) + prop("rocksdb.estimate-table-readers-mem", cf)).sum();
        tables + prop("rocksdb.block-cache-usage", self.cf(CF_CALLS)) + prop("rocksdb.block-cache-usage", self.cf(CF_LATEST))
    }
}

/// A write's result known already (it was applied, and if need be synced, on the caller's thread).
fn ready(result: Result<(), String>) -> Pending {
    Box::pin(std::future::ready(result.map_err(BackendError::Failed)))
}

fn write_options(durability: Durability) -> WriteOptions {
    let mut o = WriteOptions::default();
    o.set_sync(durability == Durability::Synced);
    o
}

fn describe_open_error(e: &rocksdb::Error) -> BackendError {
    let text = e.to_string();
    // RocksDB reports its LOCK file held by another process as an I/O error naming the lock.
    if e.kind() == rocksdb::ErrorKind::IOError && text.contains("lock") {
        BackendError::Busy(format!("{text} — another toolguard process holds this ledger"))
    } else if let Some((_, unknown)) = text.split_once("Column families not opened: ") {
        // Families this build does not know: a newer toolguard's ledger. RocksDB
        // refuses the open before it creates or writes anything.
        BackendError::Failed(format!(
            "the ledger holds column families this toolguard does not know ({unknown}): a newer toolguard wrote it; use a matching \
             toolguard (nothing in it was changed)"
        ))
    } else {
        BackendError::Failed(text)
    }
}
