//! The shared backend: PostgreSQL, for a fleet of hosts agreeing on every
//! key. Plain SQL that PostgreSQL-protocol databases share (`INSERT … ON
//! CONFLICT`, no stored procedures, no advisory locks); records are stored as
//! the same JSON the RocksDB backend stores, beside the columns queries need.
//!
//! Tables (created and migrated by the host; `toolguard_meta.schema` holds
//! the version):
//! - `toolguard_meta (name, value)`: `secret` (the key-derivation secret),
//!   `schema`, and one empty `grant-history/<plugin>` row per plugin that
//!   hosts recording its grants lock in turn.
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
mod fused;
mod prepared;
mod retention;
mod tls;

use super::retention::{LedgerStats, Removal, RetireEntry};
use super::{
    AttemptRecord, AttemptState, Backend, BackendError, CallRecord, CallState, Claim, Durability, EpisodeOp, EpisodeRecord, FirstLook, GrantRecord,
    LedgerWrite, Prior, checks,
};
use crate::error::failed;
use prepared::{Manager, Param, Params, Prepared, Uncommitted};
use r2d2_postgres::PostgresConnectionManager;
use r2d2_postgres::postgres::{GenericClient, Row, Transaction};
use r2d2_postgres::r2d2::{Pool, PooledConnection};
use std::time::Duration;

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

/// Connections one host keeps to a PostgreSQL ledger unless its config
/// says otherwise (`ledger_pool`).
pub const DEFAULT_POOL_SIZE: u32 = 16;

/// A PostgreSQL ledger: a pool of connections to one database.
pub(crate) struct Postgres {
    /// Always `Some` until dropped.
    pool: Option<Pool<Manager>>,
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
    pub(crate) fn connect(url: &str, pool_size: u32) -> Result<Self, BackendError> {
        let (config, tls) = tls::config(url)?;
        let manager = Manager::new(PostgresConnectionManager::new(config, tls));
        let pool = Pool::builder().max_size(pool_size.max(1)).min_idle(Some(1)).connection_timeout(Duration::from_secs(10)).build(manager).map_err(|e| {
            let tls = if url.contains("sslmode=verify") {
                ", and that `sslrootcert` is the CA that signed the server's certificate (for verify-full, one naming this host)"
            } else {
                ""
            };
            format!("cannot connect: {e}; check the URL, the server and its pg_hba.conf{tls}")
        })?;
        let this = Self { pool: Some(pool) };
        this.migrate()?;
        this.follow_server_clock(3)?;
        Ok(this)
    }

    /// Sets the ledger's clock to the server's ([`crate::clock`]): leases
    /// written by one host and judged by another are then read on one clock,
    /// whatever the hosts' own clocks say. Of `readings` readings, the quickest counts.
    fn follow_server_clock(&self, readings: usize) -> Result<(), BackendError> {
        use crate::clock;
        let sql = "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint";
        let mut taken = Vec::with_capacity(readings);
        for _ in 0..readings {
            let sent_ms = clock::host_ms();
            let server_ms: i64 = self.query(sql, &[])?.first().map(|r| r.get(0)).ok_or("the server did not say the time")?;
            taken.push(clock::Reading { sent_ms, server_ms, received_ms: clock::host_ms() });
        }
        if let Some(offset) = clock::follow(&taken) {
            tracing::debug!(offset_ms = offset, "the ledger's clock follows PostgreSQL's");
        }
        Ok(())
    }

    fn client(&self) -> Result<PooledConnection<Manager>, BackendError> {
        let pool = self.pool.as_ref().expect("the pool lives until drop");
        pool.get().map_err(|e| BackendError::Unreachable(format!("no connection to PostgreSQL: {e}")))
    }

    /// Creates the tables a new database lacks, and those of later schema
    /// versions an older one lacks. Hosts starting together may race on
    /// `CREATE … IF NOT EXISTS` (the catalogue's own unique index), so a
    /// failed attempt is retried. A ledger of this build's schema, or of one
    /// it does not know (a newer toolguard's: the ledger then refuses to
    /// open), is not touched: no table of ours is put back into a newer
    /// schema, and no `ALTER TABLE` queues for a lock on a fleet's tables
    /// each time an outdated host restarts.
    fn migrate(&self) -> Result<(), BackendError> {
        let current = self.query("SELECT value FROM toolguard_meta WHERE name = 'schema'", &[]);
        if let Ok(rows) = current
            && let Some(row) = rows.first()
            && !super::MIGRATES_FROM.contains(&String::from_utf8_lossy(&row.get::<_, Vec<u8>>(0)).as_ref())
        {
            return Ok(());
        }
        let mut last = String::new();
        for _ in 0..5 {
            match self.client()?.client.batch_execute(&format!("{MIGRATION_1}{MIGRATION_2}{MIGRATION_3}")) {
                Ok(()) => return Ok(()),
                Err(e) => last = e.to_string(),
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(format!("cannot create the ledger's tables: {last}").into())
    }

    /// The rows `sql` returns, on a connection of the pool.
    ///
    /// Every caller reads (a `SELECT`): one whose connection was lost — the
    /// server terminated it, the socket dropped, often while it sat idle in
    /// the pool — changed nothing, and runs again ([`Postgres::retried`]).
    fn query(&self, sql: &str, params: &Params<'_>) -> Result<Vec<Row>, BackendError> {
        self.retried(|connection| connection.prepared().query(sql, params).map_err(|e| Uncommitted::Before(db(e))))
    }

    /// Runs `f` in a transaction on a connection of the pool. One that lost
    /// its connection before its `COMMIT` was sent changed nothing, and runs
    /// again ([`Postgres::retried`]); one lost at its `COMMIT` may have
    /// landed, and is [`BackendError::Lost`].
    fn transaction<T>(&self, mut f: impl FnMut(&mut Prepared<'_, Transaction<'_>>) -> Result<T, BackendError>) -> Result<T, BackendError> {
        self.retried(|connection| connection.in_transaction(&mut f))
    }

    /// Runs `run` on a connection of the pool, and again on another (a lost
    /// one leaves the pool), up to [`TRIES`] connections in all, while it
    /// fails before anything of it could apply because its connection was
    /// lost: a passing loss, or a restart that closed every pooled
    /// connection, is not a failed operation.
    fn retried<T>(&self, mut run: impl FnMut(&mut prepared::Connection) -> Result<T, Uncommitted>) -> Result<T, BackendError> {
        let mut tries = 1;
        loop {
            match run(&mut *self.client()?) {
                Err(Uncommitted::Before(BackendError::Lost(_))) if tries < TRIES => tries += 1,
                done => return done.map_err(BackendError::from),
            }
        }
    }

    /// Runs `sql` on a connection of the pool; the rows it changed.
    fn execute(&self, sql: &str, params: &Params<'_>) -> Result<u64, BackendError> {
        self.client()?.prepared().execute(sql, params).map_err(db)
    }

    fn records<T: serde::de::DeserializeOwned>(rows: &[Row]) -> Result<Vec<T>, BackendError> {
        rows.iter().map(|r| Self::parse(r.get::<_, &str>("record"))).collect()
    }

    /// A record from its stored JSON.
    fn parse<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, BackendError> {
        serde_json::from_str(text).map_err(|e| failed(format!("damaged record: {e}")))
    }

    fn one<T: serde::de::DeserializeOwned>(rows: &[Row]) -> Result<Option<T>, BackendError> {
        Ok(Self::records(rows)?.into_iter().next())
    }

    /// Call records with their claim from the columns (a claim updates only those).
    fn calls_of(rows: &[Row]) -> Result<Vec<CallRecord>, BackendError> {
        let mut calls: Vec<CallRecord> = Self::records(rows)?;
        for (call, row) in calls.iter_mut().zip(rows) {
            Self::claim_of(call, row);
        }
        Ok(calls)
    }

    /// `call`'s claim, from its row's columns.
    fn claim_of(call: &mut CallRecord, row: &Row) {
        call.owner = row.get("owner");
        call.lease_until_ms = u64::try_from(row.get::<_, i64>("lease_until")).ok().filter(|t| *t > 0);
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
        [&c.session, &c.call_id, &c.tool, &c.args_digest, &self.completed, &c.owner, &self.lease_until, &self.record, &self.episode]
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

/// [`Backend::first_look`] in one statement: the call ($1, $2); with no
/// call, its tombstone ($5) and the action's ($1, $3, $4) latest episode;
/// with a call not completed, the episode it names. (`CASE` runs each
/// subquery only when its answer is wanted: a replay reads the call alone.)
const FIRST_LOOK: &str = "SELECT c.record, c.owner, c.lease_until, \
    CASE WHEN c.call_id IS NULL THEN (SELECT x.pruned_ms FROM toolguard_expired x WHERE x.call_digest = $5) END AS pruned_ms, \
    CASE WHEN c.call_id IS NULL OR NOT c.completed THEN \
        (SELECT e.record FROM toolguard_episodes e WHERE e.session = $1 AND e.tool = $3 AND e.args_digest = $4 \
            AND (c.call_id IS NULL OR e.episode = c.episode) ORDER BY e.episode DESC LIMIT 1) END AS episode \
    FROM (SELECT 1) AS one LEFT JOIN toolguard_calls c ON c.session = $1 AND c.call_id = $2";

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
        self.client()?.client.batch_execute("VACUUM ANALYZE").map_err(db)
    }

    fn replicate_for_bench(&self, seed: &str, prefix: &str, from: u64, to: u64) -> Result<bool, BackendError> {
        off_async(|| bench::replicate(self, seed, prefix, from as i64, to as i64)).map(|()| true)
    }

    fn bench_schema(&self, name: &str, create: bool) -> Result<(), BackendError> {
        off_async(|| bench::schema(self, name, create))
    }

    fn meta(&self, create: bool) -> Result<(String, [u8; 32]), BackendError> {
        off_async(|| {
            let mut client = self.client()?;
            if create {
                let insert = "INSERT INTO toolguard_meta (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING";
                client.prepared().execute(insert, &[&"schema", &super::SCHEMA.as_bytes()]).map_err(db)?;
                // The first host to get here sets the secret; every other reads it.
                client.prepared().execute(insert, &[&"secret", &super::new_secret()?.as_slice()]).map_err(db)?;
            }
            let rows = client.prepared().query("SELECT name, value FROM toolguard_meta", &[]).map_err(db)?;
            let value = |name: &str| rows.iter().find(|r| r.get::<_, &str>("name") == name).map(|r| r.get::<_, Vec<u8>>("value"));
            let schema = value("schema").ok_or("the ledger has no schema record")?;
            let secret = value("secret").and_then(|s| s.try_into().ok()).ok_or("the key secret is missing or damaged")?;
            Ok((String::from_utf8_lossy(&schema).into_owned(), secret))
        })
    }

    fn set_schema(&self, version: &str) -> Result<(), BackendError> {
        off_async(|| {
            let sql = "UPDATE toolguard_meta SET value = $1 WHERE name = 'schema'";
            self.execute(sql, &[&version.as_bytes()]).map(|_| ())
        })
    }

    fn episode(&self, session: &str, tool: &str, args_digest: &str, episode: Option<u64>) -> Result<Option<EpisodeRecord>, BackendError> {
        off_async(|| {
            let rows = match episode {
                Some(n) => {
                    let sql = "SELECT record FROM toolguard_episodes WHERE session = $1 AND tool = $2 AND args_digest = $3 AND episode = $4";
                    self.query(sql, &[&session, &tool, &args_digest, &big(n)?])?
                }
                None => {
                    let sql = "SELECT record FROM toolguard_episodes WHERE session = $1 AND tool = $2 AND args_digest = $3 \
                               ORDER BY episode DESC LIMIT 1";
                    self.query(sql, &[&session, &tool, &args_digest])?
                }
            };
            Self::one(&rows)
        })
    }

    fn call(&self, session: &str, call_id: &str) -> Result<Option<CallRecord>, BackendError> {
        off_async(|| {
            let sql = "SELECT record, owner, lease_until FROM toolguard_calls WHERE session = $1 AND call_id = $2";
            Ok(Self::calls_of(&self.query(sql, &[&session, &call_id])?)?.pop())
        })
    }

    fn first_look(&self, session: &str, call_id: &str, tool: &str, args_digest: &str) -> Result<Option<FirstLook>, BackendError> {
        off_async(|| {
            let tombstone = crate::retention::tombstone(session, call_id);
            let rows = self.query(FIRST_LOOK, &[&session, &call_id, &tool, &args_digest, &tombstone.as_slice()])?;
            let row = rows.first().ok_or("the first look at a call returned no row")?;
            let call = row.get::<_, Option<&str>>("record").map(Self::parse).transpose()?.map(|mut call: CallRecord| {
                Self::claim_of(&mut call, row);
                call
            });
            let pruned = row.get::<_, Option<i64>>("pruned_ms").and_then(|t| u64::try_from(t).ok());
            let episode = row.get::<_, Option<&str>>("episode").map(Self::parse).transpose()?;
            Ok(Some(FirstLook { expired: pruned.filter(|_| call.is_none()), call, episode }))
        })
    }

    fn attempt(&self, key: &str) -> Result<Option<AttemptRecord>, BackendError> {
        off_async(|| Self::one(&self.query("SELECT record FROM toolguard_attempts WHERE key = $1", &[&key])?))
    }

    fn attempt_at(&self, session: &str, call_id: &str, step: u32) -> Result<Option<AttemptRecord>, BackendError> {
        off_async(|| {
            let sql = "SELECT record FROM toolguard_attempts WHERE session = $1 AND call_id = $2 AND step = $3 ORDER BY generation DESC LIMIT 1";
            Self::one(&self.query(sql, &[&session, &call_id, &int(step)?])?)
        })
    }

    fn attempts_of_call(&self, session: &str, call_id: &str) -> Result<Vec<AttemptRecord>, BackendError> {
        off_async(|| {
            let sql = "SELECT record FROM toolguard_attempts a WHERE session = $1 AND call_id = $2 AND generation = \
                       (SELECT max(generation) FROM toolguard_attempts b WHERE b.session = a.session AND b.call_id = a.call_id AND b.step = a.step) \
                       ORDER BY step";
            Self::records(&self.query(sql, &[&session, &call_id])?)
        })
    }

    fn calls(&self, session: Option<&str>) -> Result<Vec<CallRecord>, BackendError> {
        off_async(|| {
            // The RocksDB backend's order: length-prefixed session, then call id.
            let order = "ORDER BY octet_length(session), session COLLATE \"C\", octet_length(call_id), call_id COLLATE \"C\"";
            let rows = match session {
                Some(s) => self.query(&format!("SELECT record, owner, lease_until FROM toolguard_calls WHERE session = $1 {order}"), &[&s])?,
                None => self.query(&format!("SELECT record, owner, lease_until FROM toolguard_calls {order}"), &[])?,
            };
            Self::calls_of(&rows)
        })
    }

    fn attempts_in_state(&self, state: AttemptState) -> Result<Vec<AttemptRecord>, BackendError> {
        off_async(|| {
            let sql = "SELECT record FROM toolguard_attempts WHERE state = $1 ORDER BY key COLLATE \"C\"";
            Self::records(&self.query(sql, &[&state.as_str()])?)
        })
    }

    fn attempts(&self) -> Result<Vec<AttemptRecord>, BackendError> {
        off_async(|| Self::records(&self.query("SELECT record FROM toolguard_attempts ORDER BY key COLLATE \"C\"", &[])?))
    }

    fn record_grants(&self, record: &GrantRecord) -> Result<bool, BackendError> {
        let value = serde_json::to_string(record).map_err(failed)?;
        let at = i64::try_from(record.recorded_ms).map_err(failed)?;
        let turn = format!("grant-history/{}", record.plugin);
        off_async(|| {
            self.transaction(|tx| {
                // Hosts starting together take turns on one row per plugin (the
                // upsert locks it, new or not), so each compares with the entry
                // the one before it committed: one entry per change, not per host.
                let sql = "INSERT INTO toolguard_meta (name, value) VALUES ($1, ''::bytea) ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value";
                tx.execute(sql, &[&turn]).map_err(db)?;
                let sql = "SELECT record FROM toolguard_grant_history WHERE plugin = $1 ORDER BY recorded_ms DESC LIMIT 1";
                let latest: Option<GrantRecord> = Self::one(&tx.query(sql, &[&record.plugin]).map_err(db)?)?;
                if !checks::grants_changed(latest.as_ref(), record) {
                    return Ok(false);
                }
                let sql = "INSERT INTO toolguard_grant_history (plugin, recorded_ms, record) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING";
                Ok(tx.execute(sql, &[&record.plugin, &at, &value]).map_err(db)? == 1)
            })
        })
    }

    fn grant_history(&self) -> Result<Vec<GrantRecord>, BackendError> {
        off_async(|| Self::records(&self.query("SELECT record FROM toolguard_grant_history ORDER BY recorded_ms, plugin COLLATE \"C\"", &[])?))
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
            Self::calls_of(&self.query(sql, &[&session, &tool, &args_digest, &big(episode)?])?)
        })
    }

    fn forget_budget_before(&self, before_ms: u64) -> Result<u64, BackendError> {
        off_async(|| {
            let sql = "DELETE FROM toolguard_budget WHERE at_ms < $1";
            self.execute(sql, &[&big(before_ms)?])
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
            self.execute(sql, &[]).map(|_| ())
        })
    }

    fn follow_clock(&self) -> Result<(), BackendError> {
        off_async(|| self.follow_server_clock(1))
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
            params.push(&now);
            let mut connection = self.client()?;
            let mut client = connection.prepared();
            let claimed = client.query(&sql, &params).map_err(db)?;
            if let Some(mut record) = Self::one::<CallRecord>(&claimed)? {
                // Taken over: the stored record, with our claim.
                record.owner.clone_from(&call.owner);
                record.lease_until_ms = call.lease_until_ms;
                return Ok(Claim::Run { record, persisted: true });
            }
            let sql = "SELECT record, owner, lease_until FROM toolguard_calls WHERE session = $1 AND call_id = $2";
            let existing = Self::calls_of(&client.query(sql, &[&call.session, &call.call_id]).map_err(db)?)?.pop();
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
            self.execute(sql, &[&session, &call_id, &owner]).map(|_| ())
        })
    }

    fn commit(&self, write: &LedgerWrite, _durability: Durability) -> Result<(), BackendError> {
        off_async(|| {
            // A statement is atomic on its own: no BEGIN and COMMIT round trips
            // around one (nor a second try: a lost connection may have committed it).
            if let Some((report, episode, at_ms)) = fused::report_and_close(write) {
                return fused::apply_report_and_close(&mut self.client()?.prepared(), report, episode, at_ms);
            }
            if most_statements(write) == 1 {
                return apply(&mut self.client()?.prepared(), write);
            }
            self.transaction(|tx| apply(tx, write))
        })
    }
}

/// The most statements [`apply`] may run for `write`.
fn most_statements(write: &LedgerWrite) -> usize {
    let superseding = if write.superseding.is_some() { 2 } else { 0 };
    // A call or a closed episode may add an entry to the retire index.
    superseding + 3 * write.charges.len() + 2 * write.calls.len() + write.retire.len() + write.attempts.len() + write.reports.len() + 2 * write.episodes.len()
}

/// Runs `write`'s statements on `tx`: a transaction, or a connection when
/// there is only one.
fn apply(tx: &mut Prepared<'_, impl GenericClient>, write: &LedgerWrite) -> Result<(), BackendError> {
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

/// How many connections a read, or a transaction lost before its commit,
/// tries while each it gets turns out lost.
const TRIES: usize = 4;

/// Whether `e` lost the connection rather than failed the statement: the
/// connection closed, its socket failed (reset by the server, broken
/// pipe), or the server ended the session (SQLSTATE class 08, a connection
/// exception, or 57P01–57P03, an administrator's termination or a shutdown).
pub(super) fn connection_lost(e: &r2d2_postgres::postgres::Error) -> bool {
    let socket_failed = std::error::Error::source(e).is_some_and(|cause| cause.is::<std::io::Error>());
    e.is_closed() || socket_failed || e.code().is_some_and(|c| c.code().starts_with("08") || matches!(c.code(), "57P01" | "57P02" | "57P03"))
}

/// A PostgreSQL error, with the server's own message and its SQLSTATE
/// (rust-postgres displays a server error as "db error" alone); `Lost` when
/// the connection was ([`connection_lost`]).
pub(super) fn db(e: r2d2_postgres::postgres::Error) -> BackendError {
    let lost = connection_lost(&e);
    let error = match e.as_db_error() {
        Some(server) => format!("PostgreSQL: {} ({}, SQLSTATE {})", server.message(), server.severity(), server.code().code()),
        None => match std::error::Error::source(&e) {
            Some(cause) => format!("{e}: {cause}"),
            None => e.to_string(),
        },
    };
    if lost { BackendError::Lost(error) } else { BackendError::Failed(error) }
}

/// An episode number or time as SQL's BIGINT.
fn big(n: u64) -> Result<i64, BackendError> {
    i64::try_from(n).map_err(|_| failed(format!("{n} is too large for the ledger")))
}
