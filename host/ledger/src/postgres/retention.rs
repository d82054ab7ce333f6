//! Retention on PostgreSQL: the retire index, tombstones and the figures of
//! `ledger stats` (see [`crate::retention`]).

use super::prepared::Prepared;
use super::{Postgres, big, db};
use crate::BackendError;
use crate::retention::{LedgerStats, Removal, RetireEntry, tombstone};
use r2d2_postgres::postgres::GenericClient;

/// Adds `entry` to the retire index inside `tx` (a no-op if it is there).
pub(super) fn add_retire(tx: &mut Prepared<'_, impl GenericClient>, entry: &RetireEntry) -> Result<(), BackendError> {
    let sql = "INSERT INTO toolguard_retire (at_ms, unit) VALUES ($1, $2) ON CONFLICT DO NOTHING";
    tx.execute(sql, &[&big(entry.at_ms)?, &entry.unit]).map(|_| ()).map_err(db)
}

/// The count in the first column of the first row.
fn count(rows: &[r2d2_postgres::postgres::Row]) -> u64 {
    rows.first().map_or(0, |r| u64::try_from(r.get::<_, i64>(0)).unwrap_or(0))
}

impl Postgres {
    /// Entries of the retire index older than `before_ms`, after `after`.
    pub(super) fn retire_page_of(&self, before_ms: u64, after: Option<&RetireEntry>, limit: usize) -> Result<Vec<RetireEntry>, BackendError> {
        let (from_ms, from_unit) = after.map_or((-1, String::new()), |a| (i64::try_from(a.at_ms).unwrap_or(i64::MAX), a.unit.clone()));
        let sql = "SELECT at_ms, unit FROM toolguard_retire WHERE at_ms < $1 \
                   AND (at_ms > $2 OR (at_ms = $2 AND unit COLLATE \"C\" > $3)) \
                   ORDER BY at_ms, unit COLLATE \"C\" LIMIT $4";
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = self.query(sql, &[&big(before_ms)?, &from_ms, &from_unit, &limit])?;
        Ok(rows.iter().map(|r| RetireEntry { at_ms: u64::try_from(r.get::<_, i64>(0)).unwrap_or(0), unit: r.get(1) }).collect())
    }

    /// Applies `removal` in one transaction.
    pub(super) fn remove_unit(&self, removal: &Removal) -> Result<(), BackendError> {
        let pruned = big(removal.pruned_ms)?;
        self.transaction(|tx| {
            for (session, call_id) in &removal.calls {
                tx.execute("DELETE FROM toolguard_attempts WHERE session = $1 AND call_id = $2", &[session, call_id]).map_err(db)?;
                tx.execute("DELETE FROM toolguard_calls WHERE session = $1 AND call_id = $2", &[session, call_id]).map_err(db)?;
                let sql = "INSERT INTO toolguard_expired (call_digest, pruned_ms) VALUES ($1, $2) ON CONFLICT DO NOTHING";
                tx.execute(sql, &[&tombstone(session, call_id).as_slice(), &pruned]).map_err(db)?;
            }
            if let Some((session, tool, digest, n)) = &removal.episode {
                let sql = "DELETE FROM toolguard_episodes WHERE session = $1 AND tool = $2 AND args_digest = $3 AND episode = $4";
                tx.execute(sql, &[session, tool, digest, &big(*n)?]).map_err(db)?;
            }
            let sql = "DELETE FROM toolguard_retire WHERE at_ms = $1 AND unit = $2";
            tx.execute(sql, &[&big(removal.entry.at_ms)?, &removal.entry.unit]).map(|_| ()).map_err(db)
        })
    }

    /// When (session, call id) was pruned, if it was.
    pub(super) fn expired_at(&self, session: &str, call_id: &str) -> Result<Option<u64>, BackendError> {
        let rows = self.query("SELECT pruned_ms FROM toolguard_expired WHERE call_digest = $1", &[&tombstone(session, call_id).as_slice()])?;
        Ok(rows.first().and_then(|r| u64::try_from(r.get::<_, i64>(0)).ok()))
    }

    /// The figures of `ledger stats`.
    pub(super) fn figures(&self) -> Result<LedgerStats, BackendError> {
        let mut stats = LedgerStats::default();
        for row in self.query("SELECT completed, count(*) FROM toolguard_calls GROUP BY completed", &[])? {
            let state = if row.get::<_, bool>(0) { "completed" } else { "admitted" };
            stats.calls.insert(state.into(), u64::try_from(row.get::<_, i64>(1)).unwrap_or(0));
        }
        for row in self.query("SELECT state, count(*) FROM toolguard_attempts GROUP BY state", &[])? {
            stats.attempts.insert(row.get(0), u64::try_from(row.get::<_, i64>(1)).unwrap_or(0));
        }
        for row in self.query("SELECT closed, count(*) FROM toolguard_episodes GROUP BY closed", &[])? {
            let n = u64::try_from(row.get::<_, i64>(1)).unwrap_or(0);
            if row.get::<_, bool>(0) { stats.episodes_closed = n } else { stats.episodes_open = n }
        }
        stats.retiring = count(&self.query("SELECT count(*) FROM toolguard_retire", &[])?);
        stats.tombstones = count(&self.query("SELECT count(*) FROM toolguard_expired", &[])?);
        stats.budget_uses = count(&self.query("SELECT count(*) FROM toolguard_budget", &[])?);
        let sql = "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint FROM pg_class c \
                   JOIN pg_namespace n ON n.oid = c.relnamespace \
                   WHERE c.relkind = 'r' AND c.relname LIKE 'toolguard\\_%' AND n.nspname = current_schema()";
        stats.bytes = count(&self.query(sql, &[])?);
        let oldest = self.query("SELECT min((record::jsonb ->> 'created_ms')::bigint) FROM toolguard_calls", &[])?;
        stats.oldest_call_ms = oldest.first().and_then(|r| r.get::<_, Option<i64>>(0)).and_then(|t| u64::try_from(t).ok());
        Ok(stats)
    }
}
