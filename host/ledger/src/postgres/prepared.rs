//! Connections that prepare each statement once. A statement given as text
//! is otherwise prepared on every use — a round trip for the server to parse
//! and describe it, then a second to execute it — and planned again each
//! time; a guarded call runs ~15 of them. Prepared once per connection (the
//! statements are the code's constants, so the cache stays small), a
//! statement is one round trip, and the server reuses its plan.

use super::{connection_lost, db};
use crate::BackendError;
use r2d2_postgres::PostgresConnectionManager;
use r2d2_postgres::postgres::types::ToSql;
use r2d2_postgres::postgres::{Client, Error, GenericClient, Row, Statement, Transaction};
use r2d2_postgres::r2d2::ManageConnection;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::time::{Duration, Instant};
use tokio_postgres_rustls::MakeRustlsConnect;

/// A statement's parameter.
pub(super) type Param<'a> = &'a (dyn ToSql + Sync);

/// A statement's parameters.
pub(super) type Params<'a> = [Param<'a>];

/// How recently a connection must have been used for the pool to hand it
/// out again without a round trip to check it.
const CHECKED_BY_USE: Duration = Duration::from_secs(1);

/// One connection to the ledger's database and the statements prepared on it.
pub(super) struct Connection {
    /// The connection itself (for what is not a prepared statement: batches, transactions).
    pub(super) client: Client,
    /// Statements prepared so far, by their SQL.
    statements: HashMap<String, Statement>,
    /// When it was last handed statements to run.
    used: Instant,
    /// Whether a statement on it found the connection lost: then it never
    /// goes back to the pool (the client may not have noticed it closed yet,
    /// and a checkout soon after would not check it).
    lost: bool,
    /// The pool's [`Manager::losses`] when this connection was last known
    /// alive (made, checked, or used without losing it).
    losses_seen: u64,
}

impl Connection {
    /// Statements on the connection, outside a transaction.
    pub(super) fn prepared(&mut self) -> Prepared<'_, Client> {
        self.used = Instant::now();
        Prepared { client: &mut self.client, statements: &mut self.statements, lost: &mut self.lost }
    }

    /// Runs `f` in a transaction, committed if it returns `Ok`.
    pub(super) fn in_transaction<T>(&mut self, f: impl FnOnce(&mut Prepared<'_, Transaction<'_>>) -> Result<T, BackendError>) -> Result<T, Uncommitted> {
        self.used = Instant::now();
        let lost = &mut self.lost;
        let mut tx = noted(lost, self.client.transaction()).map_err(|e| Uncommitted::Before(db(e)))?;
        let done = f(&mut Prepared { client: &mut tx, statements: &mut self.statements, lost }).map_err(Uncommitted::Before)?;
        noted(lost, tx.commit()).map_err(|e| Uncommitted::AtCommit(db(e)))?;
        Ok(done)
    }
}

/// How an operation on a connection failed, and so whether it may run again.
#[derive(Debug)]
pub(super) enum Uncommitted {
    /// Before anything of it could apply — a read, or a transaction whose
    /// `COMMIT` was not sent yet — even if the connection was lost (the
    /// server rolls back a transaction whose client is gone), so it may run
    /// again on another connection.
    Before(BackendError),
    /// At its `COMMIT`: with the connection lost, it may have been applied.
    AtCommit(BackendError),
}

impl From<Uncommitted> for BackendError {
    fn from(e: Uncommitted) -> Self {
        match e {
            Uncommitted::Before(e) | Uncommitted::AtCommit(e) => e,
        }
    }
}

/// Runs statements on `client` (a connection or a transaction on it),
/// each prepared on the first use and reused after.
pub(super) struct Prepared<'a, C> {
    client: &'a mut C,
    statements: &'a mut HashMap<String, Statement>,
    /// The connection's [`Connection::lost`].
    lost: &'a mut bool,
}

impl<C: GenericClient> Prepared<'_, C> {
    /// `sql`, prepared on this connection (once).
    fn statement(&mut self, sql: &str) -> Result<Statement, Error> {
        if let Some(statement) = self.statements.get(sql) {
            return Ok(statement.clone());
        }
        let statement = noted(self.lost, self.client.prepare(sql))?;
        self.statements.insert(sql.to_string(), statement.clone());
        Ok(statement)
    }

    /// The rows `sql` returns.
    pub(super) fn query(&mut self, sql: &str, params: &Params<'_>) -> Result<Vec<Row>, Error> {
        let statement = self.statement(sql)?;
        noted(self.lost, self.client.query(&statement, params))
    }

    /// The row `sql` returns, if any.
    pub(super) fn query_opt(&mut self, sql: &str, params: &Params<'_>) -> Result<Option<Row>, Error> {
        let statement = self.statement(sql)?;
        noted(self.lost, self.client.query_opt(&statement, params))
    }

    /// The one row `sql` returns.
    pub(super) fn query_one(&mut self, sql: &str, params: &Params<'_>) -> Result<Row, Error> {
        let statement = self.statement(sql)?;
        noted(self.lost, self.client.query_one(&statement, params))
    }

    /// Runs `sql`; the rows it changed.
    pub(super) fn execute(&mut self, sql: &str, params: &Params<'_>) -> Result<u64, Error> {
        let statement = self.statement(sql)?;
        noted(self.lost, self.client.execute(&statement, params))
    }
}

/// `result`, having set `lost` if it found the connection lost.
fn noted<T>(lost: &mut bool, result: Result<T, Error>) -> Result<T, Error> {
    if let Err(e) = &result {
        *lost |= connection_lost(e);
    }
    result
}

/// Opens [`Connection`]s for the pool.
pub(super) struct Manager {
    connector: PostgresConnectionManager<MakeRustlsConnect>,
    /// How many lost connections came back to the pool. A loss is seldom
    /// alone (a restart, a failover or a network fault takes every
    /// connection at once), so after one every idle connection is checked
    /// before it is handed out again, however recently it was used.
    losses: AtomicU64,
}

impl Manager {
    /// A manager of connections made by `connector`.
    pub(super) fn new(connector: PostgresConnectionManager<MakeRustlsConnect>) -> Self {
        Self { connector, losses: AtomicU64::new(0) }
    }
}

impl ManageConnection for Manager {
    type Connection = Connection;
    type Error = Error;

    fn connect(&self) -> Result<Connection, Error> {
        let losses_seen = self.losses.load(SeqCst);
        Ok(Connection { client: self.connector.connect()?, statements: HashMap::new(), used: Instant::now(), lost: false, losses_seen })
    }

    /// Checked on every checkout: with a round trip (an empty query) only
    /// when the connection sat unused for [`CHECKED_BY_USE`], or another
    /// connection was lost since it was last known alive. A busy host's
    /// connections are checked by their own statements; checking each
    /// checkout cost a round trip per ledger operation, ~8 per call.
    fn is_valid(&self, connection: &mut Connection) -> Result<(), Error> {
        let losses = self.losses.load(SeqCst);
        if connection.used.elapsed() < CHECKED_BY_USE && connection.losses_seen == losses && !connection.client.is_closed() {
            return Ok(());
        }
        self.connector.is_valid(&mut connection.client)?;
        connection.losses_seen = losses;
        Ok(())
    }

    fn has_broken(&self, connection: &mut Connection) -> bool {
        if connection.lost {
            self.losses.fetch_add(1, SeqCst);
            return true;
        }
        self.connector.has_broken(&mut connection.client)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection of the pool to the test server.
    fn connection() -> Connection {
        let url = std::env::var("TOOLGUARD_TEST_POSTGRES").expect("TOOLGUARD_TEST_POSTGRES is set by ./dev.sh test");
        let (config, tls) = super::super::tls::config(&url).unwrap();
        Manager::new(PostgresConnectionManager::new(config, tls)).connect().unwrap()
    }

    /// Each SQL text is prepared once per connection, in or out of a
    /// transaction: the server holds one prepared statement per text used.
    #[test]
    fn a_statement_is_prepared_once_per_connection() {
        let mut connection = connection();
        let held = |c: &mut Connection| -> i64 { c.prepared().query_one("SELECT count(*) FROM pg_prepared_statements", &[]).unwrap().get(0) };
        for _ in 0..3 {
            assert_eq!(connection.prepared().query_one("SELECT $1::int + 1", &[&1i32]).unwrap().get::<_, i32>(0), 2);
        }
        assert_eq!(held(&mut connection), 2, "`SELECT $1::int + 1` once, and the count itself");
        connection.in_transaction(|tx| tx.query("SELECT $1::int + 1", &[&2i32]).map_err(db)).unwrap();
        assert_eq!(held(&mut connection), 2, "a transaction reuses the connection's statements");
    }

    /// A server error reaches the ledger's caller with the server's own
    /// message and SQLSTATE, not rust-postgres's bare "db error".
    #[test]
    fn a_server_error_says_what_the_server_said() {
        let mut connection = connection();
        let err = connection.prepared().query("SELECT 1 / $1::int", &[&0i32]).map_err(db).unwrap_err();
        let message = format!("{err:?}");
        assert!(message.contains("division by zero") && message.contains("22012"), "{message}");
    }
}
