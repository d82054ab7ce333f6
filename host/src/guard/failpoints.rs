//! Failpoints: named places in the attempt protocol where the integration
//! tests make a real `toolguard` process abort, panic, or see a ledger write
//! go wrong, as a kill -9, a bug or a lost connection would.
//!
//! They exist only in the binary the tests build (the `test-hooks` cargo
//! feature, which `./dev.sh test` turns on; `docs/development.md`). In any
//! other build `TOOLGUARD_FAILPOINT` is never read and every point is a
//! no-op: whoever can set a service's environment cannot make it abort
//! between its durable write and its send.

/// A crash point: when `TOOLGUARD_FAILPOINT` names this point, the process
/// aborts here, as a `kill -9` would; `panic:NAME` panics here instead (a
/// bug in the host, which must fail only the call it hit). Without the
/// `test-hooks` feature, nothing.
pub(crate) fn failpoint(name: &str) {
    let Some(point) = setting() else { return };
    if point == name {
        eprintln!("toolguard: failpoint `{name}` reached; aborting");
        std::process::abort();
    }
    if point.strip_prefix("panic:") == Some(name) {
        panic!("failpoint `{name}` reached");
    }
}

/// Whether `TOOLGUARD_FAILPOINT` is `KIND:NAME` for this `kind` and point
/// `name` — a ledger write made to go wrong there: `conflict`, the
/// conditional write fails as if another writer had won the race;
/// `lost-ack`, the write lands and its caller is told it failed, as when a
/// connection drops between a commit and its acknowledgement; `fail`, the
/// write fails without landing. Without the `test-hooks` feature, never.
pub(crate) fn write_failpoint(kind: &str, name: &str) -> bool {
    setting().and_then(|p| p.strip_prefix(kind)).and_then(|p| p.strip_prefix(':')) == Some(name)
}

/// `TOOLGUARD_FAILPOINT`, read once.
#[cfg(feature = "test-hooks")]
fn setting() -> Option<&'static str> {
    static POINT: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    POINT.get_or_init(|| std::env::var("TOOLGUARD_FAILPOINT").ok()).as_deref()
}

/// A build without test hooks has no failpoint set, whatever the environment says.
#[cfg(not(feature = "test-hooks"))]
#[inline(always)]
fn setting() -> Option<&'static str> {
    None
}
