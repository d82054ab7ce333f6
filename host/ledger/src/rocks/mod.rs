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
//! - `spend`: length-prefixed scope ‖ time ‖ call id → amount ‖ window end:
//!   each use of a spending limit.
//! - `spend_total`: length-prefixed scope ‖ window end → the window's
//!   running total (an `i64`): added to by each use, taken from by each
//!   release, with a merge operator (commutative: a release needs no
//!   lock), so an admission reads one key instead of summing the window.
//!   Every open sets the merge, a read-only one too (without it, replaying
//!   the log drops the batches that hold a merge).
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

mod backend;
mod index;
mod latest;
mod layout;
#[cfg(test)]
mod layout_tests;
mod options;
mod retention;
#[cfg(test)]
mod tests;
mod writer;
#[cfg(test)]
mod writer_tests;
pub use options::DEFAULT_BLOCK_CACHE_MIB;
use options::*;
#[cfg(any(test, feature = "bench"))]
pub use writer::simulate_slow_fsync;

use crate::error::{damaged_record, failed};
use layout::*;
use writer::Writer;

use super::retention::RetireEntry;
use super::{AttemptRecord, Backend, BackendError, CallRecord, CallState, EpisodeOp, EpisodeRecord, LedgerWrite, checks};
use rocksdb::{Cache, ColumnFamilyDescriptor, DB, IteratorMode, Options, WriteBatch};
use std::cell::Cell;
use std::path::Path;
use std::sync::Arc;

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
        // A ledger whose limits' uses predate their running totals gets them summed once, here.
        let untotalled = dir.join("CURRENT").exists() && DB::list_cf(&Options::default(), dir).is_ok_and(|f| !f.iter().any(|n| n == CF_SPEND_TOTAL));
        let caches = Caches { shared: Cache::new_lru_cache(bytes), pinned: Cache::new_lru_cache(bytes) };
        let cfs = ALL_CFS.iter().map(|n| ColumnFamilyDescriptor::new(*n, cf_options(n, &caches)));
        let db = Arc::new(DB::open_cf_descriptors(&opts, dir, cfs).map_err(|e| describe_open_error(&e))?);
        let mut rocks = Self { writer: Some(Writer::start(db.clone())?), db, opts: Some(opts), dir: dir.to_path_buf(), latest_indexed: false };
        if !rocks.latest_is_indexed()? {
            rocks.index_latest_episodes()?;
        }
        rocks.latest_indexed = true;
        if untotalled {
            rocks.total_the_uses()?;
        }
        Ok(rocks)
    }

    /// Opens an existing database read-only (works while a host holds it).
    pub(crate) fn open_read_only(dir: &Path) -> Result<Self, BackendError> {
        if !dir.join("CURRENT").exists() {
            return Err("no ledger here yet (nothing has been recorded)".into());
        }
        // A ledger of an older schema lacks the newer families; reads of them find nothing.
        let families = DB::list_cf(&Options::default(), dir).map_err(failed)?;
        let described = families.into_iter().map(|name| {
            let mut o = Options::default();
            if name == CF_SPEND_TOTAL {
                options::with_totals_merge(&mut o);
            }
            ColumnFamilyDescriptor::new(name, o)
        });
        let db = DB::open_cf_descriptors_read_only(&Options::default(), dir, described, false).map_err(failed)?;
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
            Some(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| damaged_record(&bytes, e)),
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

    /// What a limit's window holds now: its running total (`spend_total`,
    /// kept in the write of each use and release).
    fn spend_total(&self, key: &[u8]) -> Result<u64, BackendError> {
        let Some(family) = self.db.cf_handle(CF_SPEND_TOTAL) else { return Ok(0) };
        let total = self.db.get_cf_opt(family, key, &read_options()).map_err(|e| db_error(&e))?;
        Ok(total.map_or(0, |t| u64::try_from(total_of(&t)).unwrap_or(0)))
    }

    fn attempts_by_key(&self, keys: &[String]) -> Result<Vec<AttemptRecord>, BackendError> {
        keys.iter().filter_map(|k| self.attempt(k).transpose()).collect()
    }

    fn records<T: serde::de::DeserializeOwned>(raw: &[Vec<u8>]) -> Result<Vec<T>, BackendError> {
        raw.iter().map(|v| serde_json::from_slice(v).map_err(|e| damaged_record(v, e))).collect()
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
        for s in &write.spends {
            // The window's running total: one read, whatever the window holds.
            let prefix = length_prefixed(&s.scope);
            let total = spend_total_key(&prefix, s.until_ms);
            checks::within_limit(s, self.spend_total(&total)?)?;
            let key = [prefix.as_slice(), &s.at_ms.to_be_bytes(), s.call_id.as_bytes()].concat();
            batch.put_cf(self.cf(CF_SPEND), key, use_value(s.amount, s.until_ms));
            batch.merge_cf(self.cf(CF_SPEND_TOTAL), total, i64::try_from(s.amount).unwrap_or(i64::MAX).to_be_bytes());
        }
        for r in &write.releases {
            let prefix = length_prefixed(&r.scope);
            let key = [prefix.as_slice(), &r.at_ms.to_be_bytes(), r.call_id.as_bytes()].concat();
            // Only a use still recorded is taken off its window's total (a release never counts twice).
            let Some(used) = self.db.get_cf_opt(self.cf(CF_SPEND), &key, &read_options()).map_err(|e| db_error(&e))? else { continue };
            let Some((amount, until)) = use_of(&used) else {
                return Err(damaged_record(&used, "a spending limit's use is not an amount and a window's end"));
            };
            batch.delete_cf(self.cf(CF_SPEND), key);
            batch.merge_cf(self.cf(CF_SPEND_TOTAL), spend_total_key(&prefix, until), (-i64::try_from(amount).unwrap_or(i64::MAX)).to_be_bytes());
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
