//! Where the ledger lives (a RocksDB directory or a PostgreSQL URL, its cache
//! and pool) and how long it keeps what it may forget (`[retention]`).

use crate::ledger::LedgerLocation;
use crate::policy::Downstreams;
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// The ledger's retention (`[retention]`, `docs/ledger.md`, "Retention").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Retention {
    /// Final records older than this many hours are pruned: at least the
    /// longest downstream `retention_hours` plus [`RETENTION_MARGIN_HOURS`].
    pub hours: u64,
    /// How often `toolguard serve` prunes, in minutes (default 10).
    #[serde(default = "default_prune_minutes")]
    pub every_minutes: u64,
}

/// Hours a record is kept beyond the longest downstream `retention_hours`:
/// room for the hold rule's waits (seconds) and clocks a little apart.
pub const RETENTION_MARGIN_HOURS: u64 = 1;

pub(super) fn default_prune_minutes() -> u64 {
    10
}

impl Retention {
    /// The shortest `hours` the downstreams allow.
    pub fn minimum_hours(downstreams: &Downstreams) -> u64 {
        let longest = downstreams.values().map(|d| d.retention.as_secs().div_ceil(3600)).max().unwrap_or(0);
        longest + RETENTION_MARGIN_HOURS
    }
}

/// Where the ledger lives: `ledger` (a PostgreSQL URL or a directory), or
/// the URL in the environment variable `ledger_url_env` (keeps a password
/// out of the file), else `<data_dir>/ledger`.
pub(super) fn ledger_location(
    ledger: Option<String>,
    url_env: Option<String>,
    data_dir: &Path,
    resolve: &dyn Fn(&Path) -> PathBuf,
) -> Result<LedgerLocation, (&'static str, String)> {
    let is_url = |s: &str| s.starts_with("postgres://") || s.starts_with("postgresql://");
    match (ledger, url_env) {
        (Some(_), Some(_)) => Err(("ledger_url_env", "give `ledger` or `ledger_url_env`, not both".into())),
        (None, None) => Ok(LedgerLocation::Dir(data_dir.join("ledger"))),
        (Some(l), None) if is_url(&l) => Ok(LedgerLocation::Postgres(l)),
        (Some(l), None) if l.contains("://") => {
            Err(("ledger", format!("`{}` is not a ledger toolguard knows: use postgres://… or a directory", crate::ledger::postgres::redacted(&l))))
        }
        (Some(l), None) => Ok(LedgerLocation::Dir(resolve(Path::new(&l)))),
        (None, Some(name)) => match std::env::var(&name) {
            Ok(url) if is_url(&url) => Ok(LedgerLocation::Postgres(url)),
            Ok(_) => Err(("ledger_url_env", format!("${name} does not hold a postgres:// URL"))),
            Err(_) => Err(("ledger_url_env", format!("${name} is not set; export the ledger's postgres:// URL in it"))),
        },
    }
}

/// The block cache of a RocksDB ledger: 1 MiB to 64 GiB; PostgreSQL's is
/// the server's own (`shared_buffers`).
pub(super) fn ledger_cache(mib: Option<u64>, ledger: &LedgerLocation) -> Result<u64, String> {
    match (mib, ledger) {
        (None, _) => Ok(crate::ledger::DEFAULT_BLOCK_CACHE_MIB),
        (Some(_), LedgerLocation::Postgres(_)) => {
            Err("sizes a RocksDB ledger's cache; a PostgreSQL ledger caches in the server (its `shared_buffers`): remove it".into())
        }
        (Some(m), LedgerLocation::Dir(_)) if (1..=65_536).contains(&m) => Ok(m),
        (Some(m), LedgerLocation::Dir(_)) => Err(format!("{m} is out of range: give 1 to 65536 (MiB)")),
    }
}

pub(super) fn ledger_pool(size: Option<u32>, ledger: &LedgerLocation) -> Result<u32, String> {
    match (size, ledger) {
        (None, _) => Ok(crate::ledger::DEFAULT_POOL_SIZE),
        (Some(_), LedgerLocation::Dir(_)) => Err("sizes a PostgreSQL ledger's connection pool; a RocksDB ledger has none: remove it".into()),
        (Some(n), LedgerLocation::Postgres(_)) if (1..=1_000).contains(&n) => Ok(n),
        (Some(n), LedgerLocation::Postgres(_)) => Err(format!("{n} is out of range: give 1 to 1000 (connections)")),
    }
}
