//! The ledger's [`Backend`] on RocksDB: each operation as reads of the
//! families and one atomic batch, after the checks both backends make.

use super::layout::*;
use super::writer::{Job, Now, Ticket};
use super::*;
use crate::backend::Pending;
use crate::error::failed;
use crate::retention::{LedgerStats, Removal, RetireEntry};
use crate::{AttemptRecord, AttemptState, Backend, BackendError, CallRecord, Claim, Durability, EpisodeRecord, GrantRecord, LedgerWrite, checks};
use rocksdb::WriteBatch;

impl Backend for Rocks {
    fn meta(&self, create: bool) -> Result<(String, [u8; 32]), BackendError> {
        let meta = self.cf(CF_META);
        let schema = match self.db.get_cf(meta, b"schema").map_err(failed)? {
            Some(v) => String::from_utf8_lossy(&v).into_owned(),
            None if create => {
                let mut batch = WriteBatch::default();
                batch.put_cf(meta, b"secret", crate::new_secret()?);
                batch.put_cf(meta, b"schema", crate::SCHEMA);
                self.db.write_opt(batch, &write_options(Durability::Synced)).map_err(failed)?;
                crate::SCHEMA.to_string()
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

    fn note_serving(&self, record: &crate::ServingRecord, stale_before_ms: u64) -> Result<(), BackendError> {
        let mut batch = WriteBatch::default();
        for old in self.serving()?.into_iter().filter(|r| r.seen_ms < stale_before_ms) {
            batch.delete_cf(self.cf(CF_META), serving_key(&old.host));
        }
        batch.put_cf(self.cf(CF_META), serving_key(&record.host), serde_json::to_vec(record).map_err(failed)?);
        // A note for the operator, not a guarantee: it costs no fsync.
        self.db.write_opt(batch, &write_options(Durability::Buffered)).map_err(failed)
    }

    fn serving(&self) -> Result<Vec<crate::ServingRecord>, BackendError> {
        self.scan(CF_META, SERVING_PREFIX, |_, v| serde_json::from_slice(v).ok())
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

    fn spent(&self, now_ms: u64) -> Result<Vec<crate::records::SpentUse>, BackendError> {
        self.scan(CF_SPEND, &[], |k, v| {
            let len = u32::from_be_bytes(k.get(..4)?.try_into().ok()?) as usize;
            let scope = String::from_utf8_lossy(k.get(4..4 + len)?).into_owned();
            let at_ms = u64::from_be_bytes(k.get(4 + len..12 + len)?.try_into().ok()?);
            let call_id = String::from_utf8_lossy(k.get(12 + len..)?).into_owned();
            let (amount, until_ms) = use_of(v)?;
            (until_ms > now_ms).then_some(crate::records::SpentUse { scope, at_ms, call_id, amount, until_ms })
        })
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

    #[cfg(any(test, feature = "bench"))]
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
pub(super) fn ready(result: Result<(), String>) -> Pending {
    Box::pin(std::future::ready(result.map_err(BackendError::Failed)))
}
