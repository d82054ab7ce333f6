//! The ledger's errors: a backend's typed [`BackendError`], and the
//! [`LedgerError`] callers see, which adds where the ledger lives.

/// Why a backend's operation failed. Nothing of a failed write was applied,
/// except perhaps after [`BackendError::Lost`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum BackendError {
    /// A condition of the write did not hold (an episode opened or handed
    /// over by someone else first, a call no longer supersedable, an attempt
    /// another host recorded first).
    Conflict(String),
    /// Another process holds the database (RocksDB's lock).
    Busy(String),
    /// A budget charged by the write was spent.
    Refused(String),
    /// A spending limit the write spends from would be passed.
    OverLimit(String),
    /// A read asked to be answered from memory needs the disk
    /// ([`super::Backend::read_from_memory`]); it is retried off the async workers.
    NeedsIo,
    /// The connection to the database was lost mid-operation (PostgreSQL's
    /// server ended the session, the socket dropped): a write may or may not
    /// have been applied; a read changed nothing.
    Lost(String),
    /// The database could not be reached at all (no connection could be
    /// made or taken from the pool): nothing was read or applied.
    Unreachable(String),
    /// Anything else: the database failed, or a record is damaged.
    Failed(String),
}

impl From<String> for BackendError {
    fn from(message: String) -> Self {
        Self::Failed(message)
    }
}

impl From<&str> for BackendError {
    fn from(message: &str) -> Self {
        Self::Failed(message.into())
    }
}

/// What kind of failure a [`LedgerError`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Failed,
    Conflict,
    Busy,
    Refused,
    OverLimit,
    NeedsIo,
    Lost,
    Unreachable,
}

/// A ledger operation failed; the message names where the ledger lives.
#[derive(Debug, Clone, thiserror::Error)]
#[error("ledger at {location}: {message}")]
pub struct LedgerError {
    location: String,
    message: String,
    kind: Kind,
}

impl LedgerError {
    /// A plain failure at `location`.
    pub(super) fn at(location: &str, message: String) -> Self {
        Self { location: location.to_string(), message, kind: Kind::Failed }
    }

    /// A backend's error, at `location`.
    pub(super) fn of(location: &str, e: BackendError) -> Self {
        let (kind, message) = match e {
            BackendError::Conflict(m) => (Kind::Conflict, m),
            BackendError::Busy(m) => (Kind::Busy, m),
            BackendError::Refused(m) => (Kind::Refused, m),
            BackendError::OverLimit(m) => (Kind::OverLimit, m),
            BackendError::NeedsIo => (Kind::NeedsIo, "the read needs the disk".to_string()),
            BackendError::Lost(m) => (Kind::Lost, m),
            BackendError::Unreachable(m) => (Kind::Unreachable, m),
            BackendError::Failed(m) => (Kind::Failed, m),
        };
        Self { location: location.to_string(), message, kind }
    }

    /// Whether a conditional write was refused because the ledger changed
    /// under it (another call or host got there first): re-read and decide again.
    pub fn is_conflict(&self) -> bool {
        self.kind == Kind::Conflict
    }

    /// Whether another process holds the (embedded) ledger right now.
    pub fn is_busy(&self) -> bool {
        self.kind == Kind::Busy
    }

    /// Whether a budget of the write was spent; the message says which.
    pub fn is_refused(&self) -> bool {
        self.kind == Kind::Refused
    }

    /// Whether a spending limit of the write would have been passed; the
    /// message names the limit, its use, the amount and when room returns.
    pub fn is_over_limit(&self) -> bool {
        self.kind == Kind::OverLimit
    }

    /// Whether the connection to the database was lost mid-operation: a
    /// write may or may not have been applied (look before deciding again).
    pub fn is_lost(&self) -> bool {
        self.kind == Kind::Lost
    }

    /// Whether the database could not be reached or the connection to it
    /// was lost ([`LedgerError::is_lost`]): the ledger is unavailable, not
    /// broken, and the operation may succeed when tried again.
    pub fn is_unavailable(&self) -> bool {
        matches!(self.kind, Kind::Lost | Kind::Unreachable)
    }

    /// Whether a read from memory only needs the disk (then it is retried there).
    pub(super) fn needs_io(&self) -> bool {
        self.kind == Kind::NeedsIo
    }

    /// What went wrong, without where the ledger lives.
    pub fn message(&self) -> &str {
        &self.message
    }
}

/// Any other failure of a backend (the database's error, a damaged record), as its message.
pub(crate) fn failed(e: impl std::fmt::Display) -> BackendError {
    BackendError::Failed(e.to_string())
}

/// A stored record that does not parse (`bytes`, as the store holds them),
/// named by its first bytes: nothing acts on it and it is left as it is.
pub(crate) fn damaged_record(bytes: &[u8], e: impl std::fmt::Display) -> BackendError {
    const SHOWN: usize = 96;
    let shown = String::from_utf8_lossy(&bytes[..bytes.len().min(SHOWN)]).escape_debug().to_string();
    let more = if bytes.len() > SHOWN { "…" } else { "" };
    failed(format!(
        "the ledger holds a damaged record, or one toolguard did not write (\"{shown}{more}\": {e}); nothing acted on it and it was left as it \
         is. An operator must restore it from a backup (`toolguard ledger export` lists the records around it)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unreachable_or_lost_database_is_unavailable_and_nothing_else_is() {
        let of = |e| LedgerError::of("postgres://db", e);
        let unreachable = of(BackendError::Unreachable("no connection to PostgreSQL: timed out".into()));
        assert!(unreachable.is_unavailable() && !unreachable.is_lost(), "unreachable: nothing was applied, so not `lost`");
        assert!(of(BackendError::Lost("connection closed".into())).is_unavailable());
        for other in [BackendError::Failed("damaged record".into()), BackendError::Conflict("raced".into()), BackendError::Refused("spent".into())] {
            assert!(!of(other).is_unavailable());
        }
    }
}
