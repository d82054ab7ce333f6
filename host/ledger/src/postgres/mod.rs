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

mod apply;
mod backend;
#[cfg(feature = "bench")]
mod bench;
mod fused;
mod prepared;
mod retention;
mod schema;
mod tls;

use super::{BackendError, CallRecord, CallState};
use crate::error::{damaged_record, failed};
use apply::{apply, most_statements};
use prepared::{Manager, Param, Params, Prepared, Uncommitted};
use r2d2_postgres::PostgresConnectionManager;
use r2d2_postgres::postgres::{Row, Transaction};
use r2d2_postgres::r2d2::{Pool, PooledConnection};
use schema::{MIGRATION_1, MIGRATION_2, MIGRATION_3, MIGRATION_4};
use std::time::Duration;

/// Connections one host keeps to a PostgreSQL ledger unless its config
/// says otherwise (`ledger_pool`).
pub const DEFAULT_POOL_SIZE: u32 = 16;

/// Connecting to the server (TCP, TLS, authentication) unless the URL's
/// `connect_timeout` says otherwise, and waiting for a pooled connection:
/// a server that does not answer fails the start or the operation with a
/// message instead of holding it (the host names it among its deadlines,
/// `toolguard::net::deadlines::POSTGRES_CONNECT`).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

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
        let (mut config, tls) = tls::config(url)?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        let manager = Manager::new(PostgresConnectionManager::new(config, tls));
        let pool = Pool::builder().max_size(pool_size.max(1)).min_idle(Some(1)).connection_timeout(CONNECT_TIMEOUT).build(manager).map_err(|e| {
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
            match self.client()?.client.batch_execute(&format!("{MIGRATION_1}{MIGRATION_2}{MIGRATION_3}{MIGRATION_4}")) {
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
        serde_json::from_str(text).map_err(|e| damaged_record(text.as_bytes(), e))
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
