//! Every deadline of a network exchange the host makes, with its default,
//! in one place (`docs/network.md` tables them). Each exchange has a total
//! deadline — connecting, the answer and its whole body — and a per-read
//! one (the longest silence between two reads), so neither a silent peer
//! nor one trickling bytes can hold a start, a call or a pass for ever.

use std::time::Duration;

/// How long one kind of exchange may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadlines {
    /// Establishing the connection (TCP and TLS).
    pub connect: Duration,
    /// The longest wait for the next bytes once connected.
    pub read: Duration,
    /// The whole exchange: connecting, the answer, its whole body.
    pub total: Duration,
}

impl Deadlines {
    /// The same bound for connecting, each read and the whole exchange.
    pub const fn within(total: Duration) -> Self {
        Self { connect: total, read: total, total }
    }
}

/// One try of a send or fetch to a downstream, unless its
/// `[policy.downstreams.NAME] timeout_ms` says otherwise: past it the
/// outcome of a send that left is unknown (`docs/guard.md`).
pub const DOWNSTREAM_TRY_MS: u64 = 8_000;

/// One exchange with an OCI registry (a manifest, a token, a referrers
/// list), unless `[policy.registries."HOST"] timeout_seconds` says
/// otherwise; a silent registry costs a start at most this (the cache then
/// stands in). A blob is given more: [`blob`].
pub const REGISTRY: Duration = Duration::from_secs(10);

/// The slowest a registry's blob may arrive: its total deadline is the
/// registry's plus one second per this many bytes of its declared size.
pub const REGISTRY_MIN_BYTES_PER_SECOND: u64 = 256 << 10;

/// The total deadline of moving `bytes` of a blob, for a registry whose
/// exchanges take `timeout`.
pub fn blob(timeout: Duration, bytes: u64) -> Duration {
    timeout + Duration::from_secs(bytes / REGISTRY_MIN_BYTES_PER_SECOND)
}

/// An authorization server's metadata or signing keys (JWKS). A token
/// whose keys cannot be fetched in time is refused, never let through.
pub const AUTHORIZATION_SERVER: Deadlines = Deadlines { connect: Duration::from_secs(5), read: Duration::from_secs(10), total: Duration::from_secs(10) };

/// One export of spans to the OTLP collector; a batch not taken in time is
/// dropped (telemetry never holds a call).
pub const OTLP_EXPORT: Deadlines = Deadlines::within(Duration::from_secs(10));

/// Connecting to the shared ledger's PostgreSQL server (TCP, TLS and
/// authentication), and waiting for a pooled connection: a server that
/// does not answer fails the start, or the operation, with a message.
pub const POSTGRES_CONNECT: Duration = crate::ledger::POSTGRES_CONNECT_TIMEOUT;
