//! One [`LedgerWrite`] as one transaction: its conditions checked and its
//! rows written in as few statements (and round trips) as the server allows.

use super::prepared::{Param, Prepared};
use super::*;
use crate::error::failed;
use crate::retention::RetireEntry;
use crate::{AttemptRecord, BackendError, EpisodeOp, LedgerWrite, Prior, checks};
use r2d2_postgres::postgres::GenericClient;

/// The most statements [`apply`] may run for `write`.
pub(super) fn most_statements(write: &LedgerWrite) -> usize {
    let superseding = if write.superseding.is_some() { 2 } else { 0 };
    // A call or a closed episode may add an entry to the retire index.
    superseding
        + 3 * write.charges.len()
        + 5 * write.spends.len()
        + 2 * write.releases.len()
        + 2 * write.calls.len()
        + write.retire.len()
        + write.attempts.len()
        + write.reports.len()
        + 2 * write.episodes.len()
}

/// Runs `write`'s statements on `tx`: a transaction, or a connection when
/// there is only one.
pub(super) fn apply(tx: &mut Prepared<'_, impl GenericClient>, write: &LedgerWrite) -> Result<(), BackendError> {
    if let Some(s) = &write.superseding {
        // The call's row stays locked until the commit: a host claiming it
        // waits, then finds it superseded (the claim's condition).
        let sql = "SELECT completed, lease_until FROM toolguard_calls WHERE session = $1 AND call_id = $2 FOR UPDATE";
        let row = tx.query_opt(sql, &[&s.session, &s.call_id]).map_err(db)?;
        let now = i64::try_from(s.now_ms).map_err(failed)?;
        let free = row.is_some_and(|r| !r.get::<_, bool>("completed") && r.get::<_, i64>("lease_until") <= now);
        let sql = "SELECT record FROM toolguard_attempts WHERE session = $1 AND call_id = $2";
        let attempts: Vec<AttemptRecord> = Postgres::records(&tx.query(sql, &[&s.session, &s.call_id]).map_err(db)?)?;
        checks::supersedable(s, free, &attempts)?;
    }
    for c in &write.charges {
        // One row per budget, locked until the commit (the upsert locks it,
        // new or not): charges of one budget queue here.
        let sql = "INSERT INTO toolguard_budget_scopes (scope) VALUES ($1) ON CONFLICT (scope) DO UPDATE SET scope = EXCLUDED.scope";
        tx.execute(sql, &[&c.scope]).map_err(db)?;
        let sql = "SELECT count(*) FROM (SELECT 1 FROM toolguard_budget WHERE scope = $1 AND at_ms >= $2 LIMIT $3) used";
        let used: i64 = tx.query_one(sql, &[&c.scope, &big(c.since_ms)?, &i64::from(c.max)]).map_err(db)?.get(0);
        checks::within_budget(c, u64::try_from(used).unwrap_or(0))?;
        let sql = "INSERT INTO toolguard_budget (scope, at_ms, call_id) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING";
        tx.execute(sql, &[&c.scope, &big(c.at_ms)?, &c.call_id]).map_err(db)?;
    }
    for s in &write.spends {
        // The limit's scope row, locked until the commit as a budget's is:
        // two hosts spending from one limit queue here, so they cannot
        // both pass its edge.
        let sql = "INSERT INTO toolguard_budget_scopes (scope) VALUES ($1) ON CONFLICT (scope) DO UPDATE SET scope = EXCLUDED.scope";
        tx.execute(sql, &[&s.scope]).map_err(db)?;
        // The window's running total: one row, summed from its uses the first time it is needed.
        let sql = "INSERT INTO toolguard_spend_totals (scope, until_ms, total) \
                   SELECT $1, $2, coalesce(sum(amount), 0)::BIGINT FROM toolguard_spend WHERE scope = $1 AND until_ms = $2 \
                   ON CONFLICT DO NOTHING";
        tx.execute(sql, &[&s.scope, &big(s.until_ms)?]).map_err(db)?;
        let sql = "SELECT total FROM toolguard_spend_totals WHERE scope = $1 AND until_ms = $2";
        let used: i64 = tx.query_one(sql, &[&s.scope, &big(s.until_ms)?]).map_err(db)?.get(0);
        checks::within_limit(s, u64::try_from(used).unwrap_or(0))?;
        let sql = "INSERT INTO toolguard_spend (scope, at_ms, call_id, amount, until_ms) VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING";
        if tx.execute(sql, &[&s.scope, &big(s.at_ms)?, &s.call_id, &big(s.amount)?, &big(s.until_ms)?]).map_err(db)? == 1 {
            let sql = "UPDATE toolguard_spend_totals SET total = total + $3 WHERE scope = $1 AND until_ms = $2";
            tx.execute(sql, &[&s.scope, &big(s.until_ms)?, &big(s.amount)?]).map_err(db)?;
        }
    }
    for r in &write.releases {
        // Only a use still recorded is taken off its window's total (a release never counts twice).
        let sql = "DELETE FROM toolguard_spend WHERE scope = $1 AND at_ms = $2 AND call_id = $3 RETURNING amount, until_ms";
        for row in tx.query(sql, &[&r.scope, &big(r.at_ms)?, &r.call_id]).map_err(db)? {
            let (amount, until_ms): (i64, i64) = (row.get(0), row.get(1));
            let sql = "UPDATE toolguard_spend_totals SET total = total - $3 WHERE scope = $1 AND until_ms = $2";
            tx.execute(sql, &[&r.scope, &until_ms, &amount]).map_err(db)?;
        }
    }
    for call in &write.calls {
        // Only over a row of the same action: two hosts that both found a
        // tool-call id unused and admitted it with different arguments must
        // not both go on (the second's whole write is refused, and its next
        // look finds the conflict). An unconditional upsert let the second
        // replace the first's record under the first's tool and digest
        // columns, so the first's claim returned the second's record: one
        // id ran one refund and answered the other's caller with it.
        let sql = format!(
            "{INSERT_CALL} ON CONFLICT (session, call_id) DO UPDATE SET completed = EXCLUDED.completed, owner = EXCLUDED.owner, \
             lease_until = EXCLUDED.lease_until, record = EXCLUDED.record, episode = EXCLUDED.episode \
             WHERE toolguard_calls.tool = EXCLUDED.tool AND toolguard_calls.args_digest = EXCLUDED.args_digest"
        );
        if tx.execute(&sql, &call_row(call)?.params()).map_err(db)? == 0 {
            return Err(checks::another_action(&call.call_id));
        }
        if let Some(entry) = RetireEntry::of_call(call) {
            retention::add_retire(tx, &entry)?;
        }
    }
    for entry in &write.retire {
        retention::add_retire(tx, entry)?;
    }
    for (a, prior) in &write.attempts {
        let value = serde_json::to_string(a).map_err(failed)?;
        let (step, generation, state) = (int(a.step)?, int(a.generation)?, a.state.as_str());
        let params: [Param<'_>; 9] = [&a.key, &a.session, &a.call_id, &step, &generation, &a.tool, &a.args_digest, &state, &value];
        let insert = "INSERT INTO toolguard_attempts (key, session, call_id, step, generation, tool, args_digest, state, record) \
                      VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)";
        if *prior == Prior::Absent {
            // A new attempt is claimed, not overwritten: if another host
            // recorded it first, nothing of this write applies (and so
            // nothing is sent).
            let inserted = tx.execute(&format!("{insert} ON CONFLICT DO NOTHING"), &params).map_err(db)?;
            if inserted == 0 {
                return Err(BackendError::Conflict(format!(
                    "attempt `{}` (step {} of tool call `{}`) was already recorded by another host; nothing was sent — retry the tool call",
                    a.key, a.step, a.call_id
                )));
            }
        } else {
            let upsert = format!("{insert} ON CONFLICT (key) DO UPDATE SET state = EXCLUDED.state, record = EXCLUDED.record");
            tx.execute(&upsert, &params).map_err(db)?;
        }
    }
    // A report's record as its caller read it is not needed: the update sets one field.
    for crate::write::Report { session, call_id, reported, .. } in &write.reports {
        let sql = "UPDATE toolguard_calls SET record = (record::jsonb || jsonb_build_object('reported', $3::text))::text \
                   WHERE session = $1 AND call_id = $2";
        tx.execute(sql, &[session, call_id, &reported.as_str()]).map_err(db)?;
    }
    for op in &write.episodes {
        let r = op.id();
        let n = big(r.episode)?;
        let key: [Param<'_>; 4] = [&r.session, &r.tool, &r.args_digest, &n];
        let changed = match op {
            EpisodeOp::Open(opened) => {
                let record = serde_json::to_string(opened).map_err(failed)?;
                let sql = "INSERT INTO toolguard_episodes (session, tool, args_digest, episode, executor, closed, record) \
                           VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING";
                tx.execute(sql, &[key[0], key[1], key[2], key[3], &opened.executor, &opened.closed, &record]).map_err(db)?
            }
            EpisodeOp::Hand { record, from } => {
                let sql = "UPDATE toolguard_episodes SET executor = $5, \
                           record = (record::jsonb || jsonb_build_object('executor', $5::text))::text \
                           WHERE session = $1 AND tool = $2 AND args_digest = $3 AND episode = $4 AND executor = $6";
                tx.execute(sql, &[key[0], key[1], key[2], key[3], &record.executor, from]).map_err(db)?
            }
            EpisodeOp::Close { at_ms, .. } => {
                let sql = "UPDATE toolguard_episodes SET closed = true, \
                           record = (record::jsonb || jsonb_build_object('closed', true, 'closed_ms', $5::bigint))::text \
                           WHERE session = $1 AND tool = $2 AND args_digest = $3 AND episode = $4 AND NOT closed";
                if tx.execute(sql, &[key[0], key[1], key[2], key[3], &big(*at_ms)?]).map_err(db)? == 1 {
                    retention::add_retire(tx, &RetireEntry::of_close(&r, *at_ms))?;
                }
                continue;
            }
        };
        if changed == 0 {
            return Err(checks::episode_changed(&r));
        }
    }
    Ok(())
}
