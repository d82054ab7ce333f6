//! `toolguard bench`'s fast fill of a PostgreSQL ledger (benchmark (i)):
//! the rows of one seed session copied into many new sessions by the
//! server itself (`INSERT … SELECT … generate_series`), so ten million
//! recorded calls take minutes, not hours of round trips. Each copy differs
//! from its seed only in the session and (for attempts) the key. And the
//! schema of the empty ledger (i) measures beside the filled one.

use super::{Postgres, db};
use crate::BackendError;

/// Copies every row of session `seed` into sessions `{prefix}{g:05}` (g
/// zero-padded to five digits) for g in `from..=to`, in one transaction.
pub(super) fn replicate(pg: &Postgres, seed: &str, prefix: &str, from: i64, to: i64) -> Result<(), BackendError> {
    // The session of copy g: the prefix, then g in five digits.
    let session = "$2 || lpad(g::text, 5, '0')";
    // The session as it appears in a record's JSON, before and after.
    let moved = |column: &str| format!("replace({column}, '\"session\":\"' || $1 || '\"', '\"session\":\"' || {session} || '\"')");
    let statements = [
        format!(
            "INSERT INTO toolguard_calls (session, call_id, tool, args_digest, completed, owner, lease_until, record, episode) \
             SELECT {session}, call_id, tool, args_digest, completed, owner, lease_until, {}, episode \
             FROM toolguard_calls, generate_series($3::bigint, $4::bigint) g WHERE session = $1",
            moved("record")
        ),
        format!(
            "INSERT INTO toolguard_attempts (key, session, call_id, step, generation, tool, args_digest, state, record) \
             SELECT key || '.' || g, {session}, call_id, step, generation, tool, args_digest, state, \
                    replace({}, '\"key\":\"' || key || '\"', '\"key\":\"' || key || '.' || g || '\"') \
             FROM toolguard_attempts, generate_series($3::bigint, $4::bigint) g WHERE session = $1",
            moved("record")
        ),
        format!(
            "INSERT INTO toolguard_episodes (session, tool, args_digest, episode, executor, closed, record) \
             SELECT {session}, tool, args_digest, episode, executor, closed, {} \
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

/// Creates the schema `name` (or drops it and everything in it). `name` is
/// the bench's own constant: lower-case letters and `_` only.
pub(super) fn schema(pg: &Postgres, name: &str, create: bool) -> Result<(), BackendError> {
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_') {
        return Err(BackendError::Failed(format!("`{name}` is not a schema name the bench uses")));
    }
    let sql = if create { format!("CREATE SCHEMA IF NOT EXISTS {name}") } else { format!("DROP SCHEMA IF EXISTS {name} CASCADE") };
    // Without the server's notices ("does not exist, skipping", "drop cascades to …") in the bench's output.
    pg.client()?.client.batch_execute(&format!("BEGIN; SET LOCAL client_min_messages = warning; {sql}; COMMIT")).map_err(db)
}
