//! Retention on RocksDB: pruning through the retire index, tombstones,
//! and the figures of `ledger stats` (see [`crate::retention`]).

use super::layout::{
    CF_ATTEMPTS, CF_BUDGET, CF_BY_STATE, CF_CALL_ATTEMPTS, CF_CALLS, CF_EPISODE_CALLS, CF_EPISODES, CF_EXPIRED, CF_RETIRE, CF_SPEND, CF_SPEND_TOTAL,
    spend_total_key, use_of,
};
use super::layout::{call_key, episode_call_key, episode_key, retire_key};
use super::{Rocks, db_error, read_options, write_options};
use crate::error::{damaged_record, failed};
use crate::retention::{LedgerStats, Removal, RetireEntry, tombstone};
use crate::{AttemptState, BackendError, CallRecord, CallState, Durability, EpisodeRecord};
use rocksdb::{IteratorMode, WriteBatch};
use serde::Deserialize;

impl Rocks {
    /// Entries of the retire index older than `before_ms`, after `after`.
    pub(super) fn retire_page_of(&self, before_ms: u64, after: Option<&RetireEntry>, limit: usize) -> Result<Vec<RetireEntry>, BackendError> {
        let Some(family) = self.db.cf_handle(CF_RETIRE) else { return Ok(Vec::new()) };
        let mut opts = read_options();
        opts.set_iterate_upper_bound(before_ms.to_be_bytes().to_vec());
        let start = after.map(retire_key).unwrap_or_default();
        let mut out = Vec::new();
        for item in self.db.iterator_cf_opt(family, opts, IteratorMode::From(&start, rocksdb::Direction::Forward)) {
            let (k, _) = item.map_err(|e| db_error(&e))?;
            if *k == *start {
                continue;
            }
            // time (8 bytes, big-endian) ‖ unit; anything shorter was not written by toolguard.
            let Some((at, unit)) = k.split_first_chunk::<8>() else {
                return Err(failed(format!(
                    "the retire index holds a damaged entry ({} bytes, key {}): it was left as it is and pruning stopped at it. \
                     Restore the ledger from a backup, or delete that key from the `{CF_RETIRE}` column family",
                    k.len(),
                    hex::encode(&k)
                )));
            };
            out.push(RetireEntry { at_ms: u64::from_be_bytes(*at), unit: String::from_utf8_lossy(unit).into_owned() });
            if out.len() >= limit {
                break;
            }
        }
        Ok(out)
    }

    /// Applies `removal` as one batch.
    pub(super) fn remove_unit(&self, removal: &Removal) -> Result<(), BackendError> {
        let mut batch = WriteBatch::default();
        for (session, call_id) in &removal.calls {
            batch.delete_cf(self.cf(CF_CALLS), call_key(session, call_id));
            batch.put_cf(self.cf(CF_EXPIRED), tombstone(session, call_id), removal.pruned_ms.to_be_bytes());
            if let Some((s, tool, digest, n)) = &removal.episode {
                let mut k = episode_key(s, tool, digest, *n);
                k.extend_from_slice(call_id.as_bytes());
                batch.delete_cf(self.cf(CF_EPISODE_CALLS), k);
            }
        }
        for a in &removal.attempts {
            batch.delete_cf(self.cf(CF_ATTEMPTS), a.key.as_bytes());
            for state in AttemptState::ALL {
                batch.delete_cf(self.cf(CF_BY_STATE), [&[state.tag()], a.key.as_bytes()].concat());
            }
            let mut by_call = call_key(&a.session, &a.call_id);
            by_call.extend_from_slice(&a.step.to_be_bytes());
            batch.delete_cf(self.cf(CF_CALL_ATTEMPTS), by_call);
        }
        if let Some((session, tool, digest, n)) = &removal.episode {
            batch.delete_cf(self.cf(CF_EPISODES), episode_key(session, tool, digest, *n));
        }
        batch.delete_cf(self.cf(CF_RETIRE), retire_key(&removal.entry));
        // Buffered is enough: the batch is atomic, so a lost removal loses its
        // tombstones together with the deletions they stand for.
        self.db.write_opt(batch, &write_options(Durability::Buffered)).map_err(failed)
    }

    /// When (session, call id) was pruned, if it was.
    pub(super) fn expired_at(&self, session: &str, call_id: &str) -> Result<Option<u64>, BackendError> {
        let Some(family) = self.db.cf_handle(CF_EXPIRED) else { return Ok(None) };
        let found = self.db.get_pinned_cf_opt(family, tombstone(session, call_id), &read_options()).map_err(|e| db_error(&e))?;
        Ok(found.and_then(|v| v.as_ref().try_into().ok()).map(u64::from_be_bytes))
    }

    /// Every call of episode `n` of the action.
    pub(super) fn calls_of_episode(&self, session: &str, tool: &str, args_digest: &str, n: u64) -> Result<Vec<CallRecord>, BackendError> {
        let prefix = episode_key(session, tool, args_digest, n);
        let ids = self.scan(CF_EPISODE_CALLS, &prefix, |k, _| Some(String::from_utf8_lossy(&k[prefix.len()..]).into_owned()))?;
        ids.iter().filter_map(|id| self.get_json(CF_CALLS, &call_key(session, id)).transpose()).collect()
    }

    /// Removes budget uses made before `before_ms`.
    pub(super) fn forget_budget(&self, before_ms: u64) -> Result<u64, BackendError> {
        let old = self.scan(CF_BUDGET, &[], |k, _| {
            let len = u32::from_be_bytes(k.get(..4)?.try_into().ok()?) as usize;
            let at = u64::from_be_bytes(k.get(4 + len..12 + len)?.try_into().ok()?);
            (at < before_ms).then(|| k.to_vec())
        })?;
        // A limit's use, once its window has ended.
        let ended = self.scan(CF_SPEND, &[], |k, v| {
            let (_, until) = use_of(v)?;
            (until < before_ms).then(|| k.to_vec())
        })?;
        // And its window's running total (the key ends with the window's end).
        let totals = self.scan(CF_SPEND_TOTAL, &[], |k, _| {
            let until = u64::from_be_bytes(k.get(k.len().checked_sub(8)?..)?.try_into().ok()?);
            (until < before_ms).then(|| k.to_vec())
        })?;
        let mut batch = WriteBatch::default();
        for k in &old {
            batch.delete_cf(self.cf(CF_BUDGET), k);
        }
        for k in &ended {
            batch.delete_cf(self.cf(CF_SPEND), k);
        }
        for k in &totals {
            batch.delete_cf(self.cf(CF_SPEND_TOTAL), k);
        }
        self.db.write_opt(batch, &write_options(Durability::Buffered)).map_err(failed)?;
        Ok((old.len() + ended.len()) as u64)
    }

    /// Sums the limits' uses into their windows' running totals: once, for
    /// a ledger written before the totals were kept (they are derived, like
    /// an index: nothing else changes).
    pub(super) fn total_the_uses(&self) -> Result<(), BackendError> {
        let mut totals: std::collections::BTreeMap<Vec<u8>, i64> = std::collections::BTreeMap::new();
        for (key, amount) in self.scan(CF_SPEND, &[], |k, v| {
            let len = u32::from_be_bytes(k.get(..4)?.try_into().ok()?) as usize;
            let (amount, until) = use_of(v)?;
            Some((spend_total_key(k.get(..4 + len)?, until), i64::try_from(amount).ok()?))
        })? {
            *totals.entry(key).or_default() += amount;
        }
        let mut batch = WriteBatch::default();
        for (key, total) in totals {
            batch.put_cf(self.cf(CF_SPEND_TOTAL), key, total.to_be_bytes());
        }
        self.db.write_opt(batch, &write_options(Durability::Synced)).map_err(failed)
    }

    /// Writes the episode-calls index of every call (schema 2 → 3).
    pub(super) fn backfill_episode_index(&self) -> Result<(), BackendError> {
        let mut batch = WriteBatch::default();
        for raw in self.scan(CF_CALLS, &[], |_, v| Some(v.to_vec()))? {
            let call: CallRecord = serde_json::from_slice(&raw).map_err(|e| damaged_record(&raw, e))?;
            if let Some(n) = call.episode {
                batch.put_cf(self.cf(CF_EPISODE_CALLS), episode_call_key(&call, n), []);
            }
        }
        self.db.write_opt(batch, &write_options(Durability::Synced)).map_err(failed)
    }

    /// Every episode.
    pub(super) fn all_episodes(&self) -> Result<Vec<EpisodeRecord>, BackendError> {
        Self::records(&self.scan(CF_EPISODES, &[], |_, v| Some(v.to_vec()))?)
    }

    /// The figures of `ledger stats`, read by one pass over each family.
    pub(super) fn figures(&self) -> Result<LedgerStats, BackendError> {
        #[derive(Deserialize)]
        struct Call {
            state: CallState,
            created_ms: u64,
        }
        #[derive(Deserialize)]
        struct Attempt {
            state: AttemptState,
        }
        #[derive(Deserialize)]
        struct Episode {
            closed: bool,
        }
        let mut stats = LedgerStats::default();
        self.each(CF_CALLS, |_, v| {
            let call: Call = parse(v)?;
            *stats.calls.entry(call_state(call.state).into()).or_default() += 1;
            stats.oldest_call_ms = Some(stats.oldest_call_ms.map_or(call.created_ms, |t| t.min(call.created_ms)));
            Ok(())
        })?;
        self.each(CF_ATTEMPTS, |_, v| {
            let attempt: Attempt = parse(v)?;
            *stats.attempts.entry(attempt.state.as_str().into()).or_default() += 1;
            Ok(())
        })?;
        self.each(CF_EPISODES, |_, v| {
            let episode: Episode = parse(v)?;
            if episode.closed {
                stats.episodes_closed += 1
            } else {
                stats.episodes_open += 1
            }
            Ok(())
        })?;
        let count = |cf| {
            let mut n = 0;
            self.each(cf, |_, _| {
                n += 1;
                Ok(())
            })
            .map(|()| n)
        };
        stats.retiring = count(CF_RETIRE)?;
        stats.tombstones = count(CF_EXPIRED)?;
        stats.budget_uses = count(CF_BUDGET)?;
        stats.bytes = dir_bytes(&self.dir);
        Ok(stats)
    }
}

impl Rocks {
    /// Runs `f` on every entry of family `cf`, without collecting them.
    fn each(&self, cf: &str, mut f: impl FnMut(&[u8], &[u8]) -> Result<(), BackendError>) -> Result<(), BackendError> {
        let Some(family) = self.db.cf_handle(cf) else { return Ok(()) };
        for item in self.db.iterator_cf_opt(family, read_options(), IteratorMode::Start) {
            let (k, v) = item.map_err(|e| db_error(&e))?;
            f(&k, &v)?;
        }
        Ok(())
    }
}

/// A record's fields `T` names.
fn parse<T: serde::de::DeserializeOwned>(v: &[u8]) -> Result<T, BackendError> {
    serde_json::from_slice(v).map_err(|e| damaged_record(v, e))
}

fn call_state(state: CallState) -> &'static str {
    match state {
        CallState::Admitted => "admitted",
        CallState::Completed => "completed",
    }
}

/// Bytes of the files in `dir` (RocksDB keeps a flat directory).
fn dir_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| entries.filter_map(Result::ok).filter_map(|e| e.metadata().ok()).filter(std::fs::Metadata::is_file).map(|m| m.len()).sum())
        .unwrap_or(0)
}
