//! The ledger's clock. Every time the ledger stores or compares — a claim's
//! lease, an attempt's age, a budget's window, a record's retention — is read
//! from [`now_ms`]. On a ledger of one host that is the host's clock; on one
//! shared by a fleet it is the PostgreSQL server's, so hosts whose clocks
//! disagree still agree on when a claim lapses (`docs/fleet.md`, "One clock").

use std::sync::atomic::{AtomicI64, Ordering};

/// What is added to this host's clock to read the ledger's: zero until a
/// shared ledger is opened, then the server's clock minus ours.
static OFFSET_MS: AtomicI64 = AtomicI64::new(0);

/// Milliseconds since the Unix epoch on the ledger's clock.
pub fn now_ms() -> u64 {
    u64::try_from(host_ms() + OFFSET_MS.load(Ordering::Relaxed)).unwrap_or(0)
}

/// This host's clock in milliseconds since the Unix epoch (in the tests'
/// build, set off by `TOOLGUARD_CLOCK_SKEW_MS`: a host whose clock is wrong).
pub(crate) fn host_ms() -> i64 {
    let ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
    ms + skew_ms()
}

/// `TOOLGUARD_CLOCK_SKEW_MS`, read once; zero when unset or not a number.
/// A test-only fault: it exists only with the `test-hooks` cargo feature
/// (the build `./dev.sh test` makes), so no environment can skew the leases
/// and retention of a shipped host.
#[cfg(feature = "test-hooks")]
fn skew_ms() -> i64 {
    static SKEW: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    *SKEW.get_or_init(|| std::env::var("TOOLGUARD_CLOCK_SKEW_MS").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(0))
}

/// A build without test hooks reads the host's clock as it is.
#[cfg(not(feature = "test-hooks"))]
#[inline(always)]
fn skew_ms() -> i64 {
    0
}

/// One reading of a server's clock: ours before the question, the server's
/// answer, ours after it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reading {
    /// This host's clock when the question was sent.
    pub sent_ms: i64,
    /// The server's clock, read while the question was in flight.
    pub server_ms: i64,
    /// This host's clock when the answer came back.
    pub received_ms: i64,
}

impl Reading {
    /// The server's clock minus ours, taking the server to have read its
    /// clock halfway through the round trip (off by at most half of it).
    fn offset_ms(&self) -> i64 {
        self.server_ms - (self.sent_ms + self.received_ms) / 2
    }

    fn round_trip_ms(&self) -> i64 {
        self.received_ms - self.sent_ms
    }
}

/// Follows the server these readings asked: the ledger's clock becomes the
/// server's, as read by the reading with the shortest round trip. Returns
/// the offset now applied.
pub(crate) fn follow(readings: &[Reading]) -> Option<i64> {
    let offset = best_offset(readings)?;
    OFFSET_MS.store(offset, Ordering::Relaxed);
    Some(offset)
}

/// The offset the reading with the shortest round trip gives.
fn best_offset(readings: &[Reading]) -> Option<i64> {
    readings.iter().min_by_key(|r| r.round_trip_ms()).map(Reading::offset_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reading_with_the_shortest_round_trip_sets_the_offset() {
        let slow = Reading { sent_ms: 1_000, server_ms: 61_500, received_ms: 1_800 };
        let quick = Reading { sent_ms: 2_000, server_ms: 62_010, received_ms: 2_020 };
        assert_eq!(best_offset(&[slow, quick]), Some(60_000), "the quick reading: 62,010 − 2,010");
        assert_eq!(best_offset(&[slow]), Some(60_100), "61,500 − 1,400");
        let behind = Reading { sent_ms: 5_000, server_ms: 3_002, received_ms: 5_004 };
        assert_eq!(best_offset(&[behind]), Some(-2_000), "a server behind us gives a negative offset");
        assert_eq!(best_offset(&[]), None);
    }
}
