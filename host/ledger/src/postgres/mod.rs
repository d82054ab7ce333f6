//! The shared backend: PostgreSQL, for a fleet of hosts agreeing on every
//! key. Plain SQL that PostgreSQL-protocol databases share (`INSERT … ON
//! CONFLICT`, no stored procedures, no advisory locks); records are stored as
//! the same JSON the RocksDB backend stores, beside the columns queries need.
//!
//! Tables (created and migrated by the host; `toolguard_meta.schema` holds
//! the version):
//! - `toolguard_meta (name, value)`: `secret` (the key-derivation secret),
//!   `schema`.
//! - `toolguard_calls (session, call_id) → tool, args_digest, completed,
//!   owner, lease_until, record`: the claim columns beside the record.
//! - `toolguard_attempts (key) → session, call_id, step, generation, tool,
//!   args_digest, state, record`; unique (session, call_id, step, generation).
//! - `toolguard_grant_history (plugin, recorded_ms) → record`.
//! - `toolguard_episodes (session, tool, args_digest, episode) → executor,
//!   closed, record` (schema 2): the hold rule's episodes.
//! - `toolguard_budget (scope, at_ms, call_id)` and `toolguard_budget_scopes
//!   (scope)` (schema 2): each use of a budget, and one row per budget that
//!   a charging transaction locks, so two hosts never both spend its last use.
//! - schema 3: `toolguard_calls.episode` (indexed with the action), the
//!   retire index `toolguard_retire (at_ms, unit)` and the tombstones of
//!   pruned calls `toolguard_expired (call_digest) → pruned_ms`
//!   (`ledger::retention`).
//!
//! A new attempt (written over `Prior::Absent`) is inserted with `ON
//! CONFLICT DO NOTHING`: if another host recorded it first the whole write
//! fails, so this host sends nothing. Later writes of an attempt upsert.
//!
//! Every commit is durable (`synchronous_commit` as the server has it): the
//! buffered writes of the RocksDB backend are an fsync optimisation, and a
//! shared ledger must not lose a write another host may already rely on.

mod bench;
mod retention;
mod tls;
mod typed;

use crate::error::failed;
use super::retention::{LedgerStats, Removal, RetireEntry};
use super::{AttemptRecord, AttemptState, Backend, BackendError, CallRecord, CallState, Claim, Durability, EpisodeOp, EpisodeRecord, GrantRecord, LedgerWrite, Prior, checks};
use r2d2_postgres::PostgresConnectionManager;
use r2d2_postgres::postgres::Row;
use tokio_postgres_rustls::MakeRustlsConnect;
use r2d2_postgres::r2d2::{Pool, PooledConnection};
use std::time::Duration;
use typed::{Param, p};

/// Version 1's tables and indexes.
const MIGRATION_1: &str = "
CREATE TABLE IF NOT EXISTS toolguard_meta (
    name TEXT PRIMARY KEY,
    value BYTEA NOT NULL
);
CREATE TABLE IF NOT EXISTS toolguard_calls (
    session TEXT NOT NULL,
    call_id TEXT NOT NULL,
    tool TEXT NOT NULL,
    args_digest TEXT NOT NULL,
    completed BOOLEAN NOT NULL,
    owner TEXT,
    lease_until BIGINT NOT NULL,
    record TEXT NOT NULL,
    PRIMARY KEY (session, call_id)
);
CREATE TABLE IF NOT EXISTS toolguard_attempts (
    key TEXT PRIMARY KEY,
    session TEXT NOT NULL,
    call_id TEXT NOT NULL,
    step INTEGER NOT NULL,
    generation INTEGER NOT NULL,
    tool TEXT NOT NULL,
    args_digest TEXT NOT NULL,
    state TEXT NOT NULL,
    record TEXT NOT NULL,
    UNIQUE (session, call_id, step, generation)
);
CREATE INDEX IF NOT EXISTS toolguard_attempts_by_state ON toolguard_attempts (state);
CREATE INDEX IF NOT EXISTS toolguard_attempts_by_action ON toolguard_attempts (session, tool, args_digest);
CREATE TABLE IF NOT EXISTS toolguard_grant_history (
    plugin TEXT NOT NULL,
    recorded_ms BIGINT NOT NULL,
    record TEXT NOT NULL,
    PRIMARY KEY (plugin, recorded_ms)
);
";

/// Version 2: episodes. (The migration of the rows is `ledger::migrate`.)
const MIGRATION_2: &str = "
CREATE TABLE IF NOT EXISTS toolguard_episodes (
    session TEXT NOT NULL,
    tool TEXT NOT NULL,
    args_digest TEXT NOT NULL,
    episode BIGINT NOT NULL,
    executor TEXT NOT NULL,
    closed BOOLEAN NOT NULL,
    record TEXT NOT NULL,
    PRIMARY KEY (session, tool, args_digest, episode)
);
DROP INDEX IF EXISTS toolguard_attempts_by_action;
CREATE TABLE IF NOT EXISTS toolguard_budget_scopes (
    scope TEXT PRIMARY KEY
);
CREATE TABLE IF NOT EXISTS toolguard_budget (
    scope TEXT NOT NULL,
    at_ms BIGINT NOT NULL,
    call_id TEXT NOT NULL,
    PRIMARY KEY (scope, at_ms, call_id)
);
";

/// Version 3: retention (`ledger::retention`). The episode column is filled
/// from the records here; the retire index by `ledger::migrate`.
const MIGRATION_3: &str = "
ALTER TABLE toolguard_calls ADD COLUMN IF NOT EXISTS episode BIGINT;
CREATE INDEX IF NOT EXISTS toolguard_calls_by_episode ON toolguard_calls (session, tool, args_digest, episode) WHERE episode IS NOT NULL;
CREATE TABLE IF NOT EXISTS toolguard_retire (
    at_ms BIGINT NOT NULL,
    unit TEXT NOT NULL,
    PRIMARY KEY (at_ms, unit)
);
CREATE TABLE IF NOT EXISTS toolguard_expired (
    call_digest BYTEA PRIMARY KEY,
    pruned_ms BIGINT NOT NULL
);
";

/// Connections one host keeps to the ledger.
const POOL_SIZE: u32 = 16;

/// A PostgreSQL ledger: a pool of connections to one database.
pub(crate) struct Postgres {
    /// Always `Some` until dropped.
    pool: Option<Pool<PostgresConnectionManager<MakeRustlsConnect>>>,
}

impl Drop for Postgres {
    /// Closing a blocking client blocks, which panics on an async worker, and
    /// a ledger is often dropped on one: the pool is closed on a thread of its own.
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            let _ = std::thread::Builder::new().name("toolguard-pg-close".into()).spawn(move || drop(pool));
        }
    }
}

/// `url` without its password, for messages and logs.
pub fn redacted(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) => {
            if u.password().is_some() {
                let _ = u.set_password(Some("…"));
            }
            u.to_string()
        }
        Err(_) => "a PostgreSQL URL that does not parse".into(),
    }
}

impl Postgres {
    /// Connects to `url` and creates or migrates the schema.
    pub(crate) fn connect(url: &str) -> Result<Self, BackendError> {
        let (config, tls) = tls::config(url)?;
        let manager = PostgresConnectionManager::new(config, tls);
        let pool = Pool::builder()
            .max_size(POOL_SIZE)
            .min_idle(Some(1))
            .connection_timeout(Duration::from_secs(10))
            .build(manager)
            .map_err(|e| {
                let tls = if url.contains("sslmode=verify") { ", and that `sslrootcert` is the CA that signed the server's certificate (for verify-full, one naming this host)" } else { "" };
                format!("cannot connect: {e}; check the URL, the server and its pg_hba.conf{tls}")
            })?;
        let this = Self { pool: Some(pool) };
        this.migrate()?;
        Ok(this)
    }

    fn client(&self) -> Result<PooledConnection<PostgresConnectionManager<MakeRustlsConnect>>, BackendError> {
        let pool = self.pool.as_ref().expect("the pool lives until drop");
        pool.get().map_err(|e| failed(format!("no connection to PostgreSQL: {e}")))
    }

    /// Creates the tables a new database lacks, and those of later schema
    /// versions an older one lacks. Hosts starting together may race on
    /// `CREATE … IF NOT EXISTS` (the catalogue's own unique index), so a
    /// failed attempt is retried.
    fn migrate(&self) -> Result<(), BackendError> {
        let current = self.client()?.query_typed("SELECT value FROM toolguard_meta WHERE name = 'schema'", &[]);
        if current.is_ok_and(|rows| rows.iter().any(|r| r.get::<_, Vec<u8>>(0) == super::SCHEMA.as_bytes())) {
            return Ok(());
        }
        let mut last = String::new();
        for _ in 0..5 {
            match self.client()?.batch_execute(&format!("{MIGRATION_1}{MIGRATION_2}{MIGRATION_3}")) {
                Ok(()) => return Ok(()),
                Err(e) => last = e.to_string(),
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(format!("cannot create the ledger's tables: {last}").into())
    }

    fn query(&self, sql: &str, params: &[Param<'_>]) -> Result<Vec<Row>, BackendError> {
        self.client()?.query_typed(sql, params).map_err(failed)
    }

    fn records<T: serde::de::DeserializeOwned>(rows: &[Row]) -> Result<Vec<T>, BackendError> {
        rows.iter().map(|r| serde_json::from_str(r.get::<_, &str>("record")).map_err(|e| failed(format!("damaged record: {e}")))).collect()
    }

    fn one<T: serde::de::DeserializeOwned>(rows: &[Row]) -> Result<Option<T>, BackendError> {
        Ok(Self::records(rows)?.into_iter().next())
    }

    /// Call records with their claim from the columns (a claim updates only those).
    fn calls_of(rows: &[Row]) -> Result<Vec<CallRecord>, BackendError> {
        let mut calls: Vec<CallRecord> = Self::records(rows)?;
        for (call, row) in calls.iter_mut().zip(rows) {
            call.owner = row.get("owner");
            call.lease_until_ms = u64::try_from(row.get::<_, i64>("lease_until")).ok().filter(|t| *t > 0);
        }
        Ok(calls)
    }
}

/// A call's columns, as the statements bind them.
struct CallRow<'a> {
    call: &'a CallRecord,
    completed: bool,
    lease_until: i64,
    record: String,
    episode: Option<i64>,
}

impl CallRow<'_> {
    fn params(&self) -> [Param<'_>; 9] {
        let c = self.call;
        [p(&c.session), p(&c.call_id), p(&c.tool), p(&c.args_digest), p(&self.completed), p(&c.owner), p(&self.lease_until), p(&self.record), p(&self.episode)]
    }
}

fn call_row(call: &CallRecord) -> Result<CallRow<'_>, BackendError> {
    Ok(CallRow {
        call,
        completed: call.state == CallState::Completed,
        lease_until: i64::try_from(call.lease_until_ms.unwrap_or(0)).map_err(failed)?,
        record: serde_json::to_string(call).map_err(failed)?,
        episode: call.episode.map(big).transpose()?,
    })
}

/// The insert of one call's row, for `ON CONFLICT` clauses to complete.
const INSERT_CALL: &str = "INSERT INTO toolguard_calls (session, call_id, tool, args_digest, completed, owner, lease_until, record, episode) \
                           VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)";

/// Runs a blocking query `f` where rust-postgres's blocking client may run:
/// its client drives its own runtime, which must not start on an async
/// worker. On a multi-threaded runtime the worker hands its tasks off first
/// (nothing to do on a blocking thread); on a current-thread runtime `f`
/// runs on a thread of its own.
fn off_async<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        Ok(_) => std::thread::scope(|scope| scope.spawn(f).join().expect("a ledger query panicked")),
        Err(_) => f(),
    }
}

/// A step or generation as SQL's INTEGER.
fn int(n: u32) -> Result<i32, BackendError> {
    i32::try_from(n).map_err(|_| failed(format!("{n} is too large for the ledger")))
}

impl Backend for Postgres {
    fn settle(&self) -> Result<(), BackendError> {
        self.client()?.batch_execute("VACUUM ANALYZE").map_err(failed)
    }

    fn replicate_for_bench(&self, seed: &str, prefix: &str, from: u64, to: u64) -> Result<bool, BackendError> {
        off_async(|| bench::replicate(self, seed, prefix, from as i64, to as i64)).map(|()| true)
    }

    fn meta(&self, create: bool) -> Result<(String, [u8; 32]), BackendError> {
        off_async(|| {
            let mut client = self.client()?;
            if create {
                let insert = "INSERT INTO toolguard_meta (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING";
                client.execute_typed(insert, &[p(&"schema"), p(&super::SCHEMA.as_bytes())]).map_err(failed)?;
                // The first host to get here sets the secret; every other reads it.
                client.execute_typed(insert, &[p(&"secret"), p(&super::new_secret()?.as_slice())]).map_err(failed)?;
            }
            let rows = client.query_typed("SELECT name, value FROM toolguard_meta", &[]).map_err(failed)?;
            let value = |name: &str| rows.iter().find(|r| r.get::<_, &str>("name") == name).map(|r| r.get::<_, Vec<u8>>("value"));
            let schema = value("schema").ok_or("the ledger has no schema record")?;
            let secret = value("secret").and_then(|s| s.try_into().ok()).ok_or("the key secret is missing or damaged")?;
            Ok((String::from_utf8_lossy(&schema).into_owned(), secret))
        })
    }

    fn set_schema(&self, version: &str) -> Result<(), BackendError> {
        off_async(|| {
            let sql = "UPDATE toolguard_meta SET value = $1 WHERE name = 'schema'";
            self.client()?.execute_typed(sql, &[p(&version.as_bytes())]).map(|_| ()).map_err(failed)
        })
    }

    fn episode(&self, session: &str, tool: &str, args_digest: &str, episode: Option<u64>) -> Result<Option<EpisodeRecord>, BackendError> {
        off_async(|| {
            let rows = match episode {
                Some(n) => {
                    let sql = "SELECT record FROM toolguard_episodes WHERE session = $1 AND tool = $2 AND args_digest = $3 AND episode = $4";
                    self.query(sql, &[p(&session), p(&tool), p(&args_digest), p(&big(n)?)])?
                }
                None => {
                    let sql = "SELECT record FROM toolguard_episodes WHERE session = $1 AND tool = $2 AND args_digest = $3 \
                               ORDER BY episode DESC LIMIT 1";
                    self.query(sql, &[p(&session), p(&tool), p(&args_digest)])?
                }
            };
            Self::one(&rows)
        })
    }

    fn call(&self, session: &str, call_id: &str) -> Result<Option<CallRecord>, BackendError> {
        off_async(|| {
            let sql = "SELECT record, owner, lease_until FROM toolguard_calls WHERE session = $1 AND call_id = $2";
            Ok(Self::calls_of(&self.query(sql, &[p(&session), p(&call_id)])?)?.pop())
        })
    }

    fn attempt(&self, key: &str) -> Result<Option<AttemptRecord>, BackendError> {
        off_async(|| {
            Self::one(&self.query("SELECT record FROM toolguard_attempts WHERE key = $1", &[p(&key)])?)
        })
    }

    fn attempt_at(&self, session: &str, call_id: &str, step: u32) -> Result<Option<AttemptRecord>, BackendError> {
        off_async(|| {
            let sql = "SELECT record FROM toolguard_attempts WHERE session = $1 AND call_id = $2 AND step = $3 ORDER BY generation DESC LIMIT 1";
            Self::one(&self.query(sql, &[p(&session), p(&call_id), p(&int(step)?)])?)
        })
    }

    fn attempts_of_call(&self, session: &str, call_id: &str) -> Result<Vec<AttemptRecord>, BackendError> {
        off_async(|| {
            let sql = "SELECT record FROM toolguard_attempts a WHERE session = $1 AND call_id = $2 AND generation = \
                       (SELECT max(generation) FROM toolguard_attempts b WHERE b.session = a.session AND b.call_id = a.call_id AND b.step = a.step) \
                       ORDER BY step";
            Self::records(&self.query(sql, &[p(&session), p(&call_id)])?)
        })
    }

    fn calls(&self, session: Option<&str>) -> Result<Vec<CallRecord>, BackendError> {
        off_async(|| {
            // The RocksDB backend's order: length-prefixed session, then call id.
            let order = "ORDER BY octet_length(session), session COLLATE \"C\", octet_length(call_id), call_id COLLATE \"C\"";
            let rows = match session {
                Some(s) => self.query(&format!("SELECT record, owner, lease_until FROM toolguard_calls WHERE session = $1 {order}"), &[p(&s)])?,
                None => self.query(&format!("SELECT record, owner, lease_until FROM toolguard_calls {order}"), &[])?,
            };
            Self::calls_of(&rows)
        })
    }

    fn attempts_in_state(&self, state: AttemptState) -> Result<Vec<AttemptRecord>, BackendError> {
        off_async(|| {
            let sql = "SELECT record FROM toolguard_attempts WHERE state = $1 ORDER BY key COLLATE \"C\"";
            Self::records(&self.query(sql, &[p(&state.as_str())])?)
        })
    }

    fn attempts(&self) -> Result<Vec<AttemptRecord>, BackendError> {
        off_async(|| {
            Self::records(&self.query("SELECT record FROM toolguard_attempts ORDER BY key COLLATE \"C\"", &[])?)
        })
    }

    fn record_grants(&self, record: &GrantRecord) -> Result<bool, BackendError> {
        off_async(|| {
            let latest: Option<GrantRecord> = Self::one(&self.query(
                "SELECT record FROM toolguard_grant_history WHERE plugin = $1 ORDER BY recorded_ms DESC LIMIT 1", &[p(&record.plugin)])?)?;
            if !checks::grants_changed(latest.as_ref(), record) {
                return Ok(false);
            }
            let value = serde_json::to_string(record).map_err(failed)?;
            let at = i64::try_from(record.recorded_ms).map_err(failed)?;
            let sql = "INSERT INTO toolguard_grant_history (plugin, recorded_ms, record) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING";
            Ok(self.client()?.execute_typed(sql, &[p(&record.plugin), p(&at), p(&value)]).map_err(failed)? == 1)
        })
    }

    fn grant_history(&self) -> Result<Vec<GrantRecord>, BackendError> {
        off_async(|| {
            Self::records(&self.query("SELECT record FROM toolguard_grant_history ORDER BY recorded_ms, plugin COLLATE \"C\"", &[])?)
        })
    }

    fn shared(&self) -> bool {
        true
    }

    fn retire_page(&self, before_ms: u64, after: Option<&RetireEntry>, limit: usize) -> Result<Vec<RetireEntry>, BackendError> {
        off_async(|| self.retire_page_of(before_ms, after, limit))
    }

    fn remove(&self, removal: &Removal) -> Result<(), BackendError> {
        off_async(|| self.remove_unit(removal))
    }

    fn expired(&self, session: &str, call_id: &str) -> Result<Option<u64>, BackendError> {
        off_async(|| self.expired_at(session, call_id))
    }

    fn episode_calls(&self, session: &str, tool: &str, args_digest: &str, episode: u64) -> Result<Vec<CallRecord>, BackendError> {
        off_async(|| {
            let sql = "SELECT record, owner, lease_until FROM toolguard_calls WHERE session = $1 AND tool = $2 AND args_digest = $3 AND episode = $4";
            Self::calls_of(&self.query(sql, &[p(&session), p(&tool), p(&args_digest), p(&big(episode)?)])?)
        })
    }

    fn forget_budget_before(&self, before_ms: u64) -> Result<u64, BackendError> {
        off_async(|| {
            let sql = "DELETE FROM toolguard_budget WHERE at_ms < $1";
            self.client()?.execute_typed(sql, &[p(&big(before_ms)?)]).map_err(failed)
        })
    }

    fn stats(&self) -> Result<LedgerStats, BackendError> {
        off_async(|| self.figures())
    }

    fn episodes(&self) -> Result<Vec<EpisodeRecord>, BackendError> {
        off_async(|| Self::records(&self.query("SELECT record FROM toolguard_episodes", &[])?))
    }

    fn backfill_episode_index(&self) -> Result<(), BackendError> {
        off_async(|| {
            let sql = "UPDATE toolguard_calls SET episode = (record::jsonb ->> 'episode')::bigint \
                       WHERE episode IS NULL AND record::jsonb ? 'episode'";
            self.client()?.execute_typed(sql, &[]).map(|_| ()).map_err(failed)
        })
    }

    fn claim_call(&self, call: &CallRecord, now_ms: u64) -> Result<Claim, BackendError> {
        off_async(|| {
            // Insert, or take over a call that is not completed, is the same
            // action, and whose claim has lapsed or is already ours: one statement,
            // so two hosts can never both hold it.
            let sql = format!(
                "{INSERT_CALL} ON CONFLICT (session, call_id) DO UPDATE SET \
                 owner = EXCLUDED.owner, lease_until = EXCLUDED.lease_until \
                 WHERE NOT toolguard_calls.completed AND toolguard_calls.tool = EXCLUDED.tool \
                 AND toolguard_calls.args_digest = EXCLUDED.args_digest \
                 AND (toolguard_calls.lease_until < $10 OR toolguard_calls.owner = EXCLUDED.owner) \
                 AND (toolguard_calls.record::jsonb ->> 'superseded_by') IS NULL \
                 RETURNING record"
            );
            let row = call_row(call)?;
            let now = i64::try_from(now_ms).map_err(failed)?;
            let mut params = row.params().to_vec();
            params.push(p(&now));
            let mut client = self.client()?;
            let claimed = client.query_typed(&sql, &params).map_err(failed)?;
            if let Some(mut record) = Self::one::<CallRecord>(&claimed)? {
                // Taken over: the stored record, with our claim.
                record.owner.clone_from(&call.owner);
                record.lease_until_ms = call.lease_until_ms;
                return Ok(Claim::Run { record, persisted: true });
            }
            let sql = "SELECT record, owner, lease_until FROM toolguard_calls WHERE session = $1 AND call_id = $2";
            let existing = Self::calls_of(&client.query_typed(sql, &[p(&call.session), p(&call.call_id)]).map_err(failed)?)?.pop();
            let Some(existing) = existing else { return Err("the call vanished while being claimed; retry".into()) };
            Ok(match Claim::of_existing(call, Some(existing)) {
                Claim::Run { record, .. } => Claim::Busy(record),
                other => other,
            })
        })
    }

    fn release_call(&self, session: &str, call_id: &str, owner: &str) -> Result<(), BackendError> {
        off_async(|| {
            let sql = "UPDATE toolguard_calls SET lease_until = 0 WHERE session = $1 AND call_id = $2 AND owner = $3";
            self.client()?.execute_typed(sql, &[p(&session), p(&call_id), p(&owner)]).map(|_| ()).map_err(failed)
        })
    }

    fn commit(&self, write: &LedgerWrite, _durability: Durability) -> Result<(), BackendError> {
        off_async(|| {
            let mut client = self.client()?;
            let mut tx = client.transaction().map_err(failed)?;
            if let Some(s) = &write.superseding {
                // The call's row stays locked until the commit: a host claiming it
                // waits, then finds it superseded (the claim's condition).
                let sql = "SELECT completed, lease_until FROM toolguard_calls WHERE session = $1 AND call_id = $2 FOR UPDATE";
                let row = tx.query_typed_opt(sql, &[p(&s.session), p(&s.call_id)]).map_err(failed)?;
                let now = i64::try_from(s.now_ms).map_err(failed)?;
                let free = row.is_some_and(|r| !r.get::<_, bool>("completed") && r.get::<_, i64>("lease_until") <= now);
                let sql = "SELECT record FROM toolguard_attempts WHERE session = $1 AND call_id = $2";
                let attempts: Vec<AttemptRecord> = Self::records(&tx.query_typed(sql, &[p(&s.session), p(&s.call_id)]).map_err(failed)?)?;
                checks::supersedable(s, free, &attempts)?;
            }
            for c in &write.charges {
                // One row per budget, locked until the commit: charges of one budget queue here.
                tx.execute_typed("INSERT INTO toolguard_budget_scopes (scope) VALUES ($1) ON CONFLICT DO NOTHING", &[p(&c.scope)])
                    .map_err(failed)?;
                tx.query_typed("SELECT scope FROM toolguard_budget_scopes WHERE scope = $1 FOR UPDATE", &[p(&c.scope)]).map_err(failed)?;
                let sql = "SELECT count(*) FROM (SELECT 1 FROM toolguard_budget WHERE scope = $1 AND at_ms >= $2 LIMIT $3) used";
                let used: i64 = tx.query_typed_one(sql, &[p(&c.scope), p(&big(c.since_ms)?), p(&i64::from(c.max))]).map_err(failed)?.get(0);
                checks::within_budget(c, u64::try_from(used).unwrap_or(0))?;
                let sql = "INSERT INTO toolguard_budget (scope, at_ms, call_id) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING";
                tx.execute_typed(sql, &[p(&c.scope), p(&big(c.at_ms)?), p(&c.call_id)]).map_err(failed)?;
            }
            for call in &write.calls {
                let sql = format!(
                    "{INSERT_CALL} ON CONFLICT (session, call_id) DO UPDATE SET completed = EXCLUDED.completed, owner = EXCLUDED.owner, \
                     lease_until = EXCLUDED.lease_until, record = EXCLUDED.record, episode = EXCLUDED.episode"
                );
                tx.execute_typed(&sql, &call_row(call)?.params()).map_err(failed)?;
                if let Some(entry) = RetireEntry::of_call(call) {
                    retention::add_retire(&mut tx, &entry)?;
                }
            }
            for entry in &write.retire {
                retention::add_retire(&mut tx, entry)?;
            }
            for (a, prior) in &write.attempts {
                let value = serde_json::to_string(a).map_err(failed)?;
                let (step, generation, state) = (int(a.step)?, int(a.generation)?, a.state.as_str());
                let params = [p(&a.key), p(&a.session), p(&a.call_id), p(&step), p(&generation), p(&a.tool), p(&a.args_digest), p(&state), p(&value)];
                let insert = "INSERT INTO toolguard_attempts (key, session, call_id, step, generation, tool, args_digest, state, record) \
                              VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)";
                if *prior == Prior::Absent {
                    // A new attempt is claimed, not overwritten: if another host
                    // recorded it first, nothing of this write applies (and so
                    // nothing is sent).
                    let inserted = tx.execute_typed(&format!("{insert} ON CONFLICT DO NOTHING"), &params).map_err(failed)?;
                    if inserted == 0 {
                        return Err(BackendError::Conflict(format!(
                            "attempt `{}` (step {} of tool call `{}`) was already recorded by another host; nothing was sent — retry the tool call",
                            a.key, a.step, a.call_id
                        )));
                    }
                } else {
                    let upsert = format!("{insert} ON CONFLICT (key) DO UPDATE SET state = EXCLUDED.state, record = EXCLUDED.record");
                    tx.execute_typed(&upsert, &params).map_err(failed)?;
                }
            }
            // A report's record as its caller read it is not needed: the update sets one field.
            for crate::write::Report { session, call_id, reported, .. } in &write.reports {
                let sql = "UPDATE toolguard_calls SET record = (record::jsonb || jsonb_build_object('reported', $3::text))::text \
                           WHERE session = $1 AND call_id = $2";
                tx.execute_typed(sql, &[p(&session), p(&call_id), p(&reported.as_str())]).map_err(failed)?;
            }
            for op in &write.episodes {
                let r = op.id();
                let n = big(r.episode)?;
                let key = [p(&r.session), p(&r.tool), p(&r.args_digest), p(&n)];
                let changed = match op {
                    EpisodeOp::Open(opened) => {
                        let record = serde_json::to_string(opened).map_err(failed)?;
                        let sql = "INSERT INTO toolguard_episodes (session, tool, args_digest, episode, executor, closed, record) \
                                   VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING";
                        tx.execute_typed(sql, &[&key[..], &[p(&opened.executor), p(&opened.closed), p(&record)]].concat()).map_err(failed)?
                    }
                    EpisodeOp::Hand { record, from } => {
                        let sql = "UPDATE toolguard_episodes SET executor = $5, \
                                   record = (record::jsonb || jsonb_build_object('executor', $5::text))::text \
                                   WHERE session = $1 AND tool = $2 AND args_digest = $3 AND episode = $4 AND executor = $6";
                        tx.execute_typed(sql, &[&key[..], &[p(&record.executor), p(&from)]].concat()).map_err(failed)?
                    }
                    EpisodeOp::Close { at_ms, .. } => {
                        let sql = "UPDATE toolguard_episodes SET closed = true, \
                                   record = (record::jsonb || jsonb_build_object('closed', true, 'closed_ms', $5::bigint))::text \
                                   WHERE session = $1 AND tool = $2 AND args_digest = $3 AND episode = $4 AND NOT closed";
                        if tx.execute_typed(sql, &[&key[..], &[p(&big(*at_ms)?)]].concat()).map_err(failed)? == 1 {
                            retention::add_retire(&mut tx, &RetireEntry::of_close(&r, *at_ms))?;
                        }
                        continue;
                    }
                };
                if changed == 0 {
                    return Err(checks::episode_changed(&r));
                }
            }
            tx.commit().map_err(|e| BackendError::Failed(e.to_string()))
        })
    }
}

/// An episode number or time as SQL's BIGINT.
fn big(n: u64) -> Result<i64, BackendError> {
    i64::try_from(n).map_err(|_| failed(format!("{n} is too large for the ledger")))
}
