//! `toolguard bench`'s fast fill of a PostgreSQL ledger (benchmark (i)):
//! the rows of one seed session copied into many new sessions by the
//! server itself (`INSERT … SELECT … generate_series`), so ten million
//! recorded calls take minutes, not hours of round trips. Each copy differs
//! from its seed only in the session and (for attempts) the key.

use super::{Postgres, db};
use crate::BackendError;

/// Copies every row of session `seed` into sessions `{prefix}{g}` for g in
/// `from..=to`, in one transaction.
pub(super) fn replicate(pg: &Postgres, seed: &str, prefix: &str, from: i64, to: i64) -> Result<(), BackendError> {
    // The session as it appears in a record's JSON, before and after.
    let moved = |column: &str| format!("replace({column}, '\"session\":\"' || $1 || '\"', '\"session\":\"' || $2 || g || '\"')");
    let statements = [
        format!(
            "INSERT INTO toolguard_calls (session, call_id, tool, args_digest, completed, owner, lease_until, record, episode) \
             SELECT $2 || g, call_id, tool, args_digest, completed, owner, lease_until, {}, episode \
             FROM toolguard_calls, generate_series($3::bigint, $4::bigint) g WHERE session = $1",
            moved("record")
        ),
        format!(
            "INSERT INTO toolguard_attempts (key, session, call_id, step, generation, tool, args_digest, state, record) \
             SELECT key || '.' || g, $2 || g, call_id, step, generation, tool, args_digest, state, \
                    replace({}, '\"key\":\"' || key || '\"', '\"key\":\"' || key || '.' || g || '\"') \
             FROM toolguard_attempts, generate_series($3::bigint, $4::bigint) g WHERE session = $1",
            moved("record")
        ),
        format!(
            "INSERT INTO toolguard_episodes (session, tool, args_digest, episode, executor, closed, record) \
             SELECT $2 || g, tool, args_digest, episode, executor, closed, {} \
             FROM toolguard_episodes, generate_series($3::bigint, $4::bigint) g WHERE session = $1",
            moved("record")
        ),
        format!(
            "INSERT INTO toolguard_retire (at_ms, unit) SELECT at_ms, {} \
             FROM toolguard_retire, generate_series($3::bigint, $4::bigint) g WHERE unit LIKE '%\"session\":\"' || $1 || '\"%'",
            moved("unit")
        ),
    ];
    let mut client = pg.client()?;
    let mut tx = client.client.transaction().map_err(db)?;
    for sql in &statements {
        tx.execute(sql.as_str(), &[&seed, &prefix, &from, &to]).map_err(db)?;
    }
    tx.commit().map_err(db)
}
