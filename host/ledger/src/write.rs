//! A write to the ledger: records to put together, atomically, and the
//! conditions under which the whole write is refused.

use super::records::{AttemptRecord, AttemptState, CallRecord, EpisodeId, EpisodeRecord, Reported};
use super::retention::RetireEntry;

/// Records to write together, atomically; with conditions (an episode
/// opened or handed over, a call superseded) the whole write is refused
/// with a conflict ([`LedgerError::is_conflict`]) if one does not hold.
#[derive(Debug, Default, Clone)]
pub struct LedgerWrite {
    pub(super) calls: Vec<CallRecord>,
    pub(super) attempts: Vec<(AttemptRecord, Prior)>,
    pub(super) episodes: Vec<EpisodeOp>,
    /// What callers were told: set on the stored records.
    pub(super) reports: Vec<Report>,
    pub(super) superseding: Option<Superseding>,
    pub(super) charges: Vec<Charge>,
    /// Uses of spending limits, each refused whole if it would pass its limit.
    pub(super) spends: Vec<Spend>,
    /// Uses of spending limits given back: their call never took effect.
    pub(super) releases: Vec<Release>,
    /// Retire-index entries to add beside those the records imply (migrations).
    pub(super) retire: Vec<RetireEntry>,
}

/// What the caller of one tool call was told, to set on its stored record.
#[derive(Debug, Clone)]
pub(super) struct Report {
    pub(super) session: String,
    pub(super) call_id: String,
    pub(super) reported: Reported,
    /// The stored record as the writer read it (or wrote it) last, under the
    /// call's lock, with `reported` set already: RocksDB writes it as it is
    /// instead of reading it again.
    pub(super) read: Option<Box<CallRecord>>,
}

/// One use of a budget, recorded with the write that spends it; the write is
/// refused whole ([`LedgerError::is_refused`]) if the budget's `scope`
/// already holds `max` uses at or after `since_ms`. Scopes are opaque
/// strings the guard builds (a plugin and a session, or a principal).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Charge {
    /// What the budget counts (session or principal, tool).
    pub scope: String,
    /// Most spends in the window.
    pub max: u32,
    /// The window's start (Unix ms).
    pub since_ms: u64,
    /// This spend's time (Unix ms).
    pub at_ms: u64,
    /// The call spending it (a repeat of it spends nothing more).
    pub call_id: String,
    /// What the budget is, for the refusal's message.
    pub what: String,
}

/// One use of a spending limit (an amount: cents of a refund, or 1 for a
/// count), recorded with the write that admits its call; the write is
/// refused whole ([`LedgerError::is_over_limit`]) if what `scope` already
/// holds in the window ending at `until_ms` (its running total), plus
/// `amount`, would pass `max`. A use counts until it is released ([`LedgerWrite::release`]:
/// its call settled as never having happened) — a call whose outcome is
/// unknown keeps counting — and is forgotten by retention once its window
/// has ended (`until_ms`). Scopes are opaque strings the guard builds (the
/// limit, its principal or tenant, its currency); one write at a time
/// spends from a scope, on a fleet too.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spend {
    /// What the limit counts, and for whom.
    pub scope: String,
    /// The most the window may hold.
    pub max: u64,
    /// The window's end, which names the window: past it this use no longer counts for anything.
    pub until_ms: u64,
    /// This use's time (Unix ms, the ledger's clock).
    pub at_ms: u64,
    /// The call spending it.
    pub call_id: String,
    /// How much it spends (at least 1).
    pub amount: u64,
    /// The limit, in words, for the refusal's message.
    pub what: String,
}

/// A use of a spending limit given back ([`Spend`] by its scope, time and call).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    /// The use's scope.
    pub scope: String,
    /// The use's time.
    pub at_ms: u64,
    /// The call it was spent for.
    pub call_id: String,
}

/// A change to an episode record.
#[derive(Debug, Clone, PartialEq)]
pub enum EpisodeOp {
    /// Creates it; refused if that episode of the action exists already.
    Open(EpisodeRecord),
    /// Makes `record.executor` its executor; refused unless `from` still is.
    Hand {
        /// The episode with its new executor.
        record: EpisodeRecord,
        /// The executor it must still have.
        from: String,
    },
    /// Marks it closed at `at_ms` (a no-op if it is closed already, or if
    /// the ledger holds no such episode). Only its identity is needed: the
    /// ledger closes the record it holds.
    Close {
        /// The episode.
        episode: EpisodeId,
        /// When it closed (Unix ms).
        at_ms: u64,
    },
}

impl EpisodeOp {
    /// The episode this changes.
    pub fn id(&self) -> EpisodeId {
        match self {
            Self::Open(record) | Self::Hand { record, .. } => record.id(),
            Self::Close { episode, .. } => episode.clone(),
        }
    }
}

/// The condition of a write that supersedes an episode's executor: the
/// call (`session`, `call_id`) is not completed, holds no live claim at
/// `now_ms`, and has no attempt that may have taken effect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superseding {
    /// The call's session.
    pub session: String,
    /// The call's tool-call id.
    pub call_id: String,
    /// Now (Unix ms): the expiry is measured from here.
    pub now_ms: u64,
}

/// What the ledger held under an attempt's key before a write replaces it.
/// Knowing it lets a write touch only the index entries that change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prior {
    /// Not known: every index entry is rewritten.
    Unread,
    /// Nothing: the key is new.
    Absent,
    /// The attempt, in this state (read or written by the caller).
    Was(AttemptState),
}

impl LedgerWrite {
    /// An empty write.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) a tool call record.
    pub fn call(mut self, call: CallRecord) -> Self {
        self.calls.push(call);
        self
    }

    /// Adds (or replaces) an attempt record, keeping its indexes right.
    pub fn attempt(self, attempt: AttemptRecord) -> Self {
        self.attempt_over(attempt, Prior::Unread)
    }

    /// Adds an attempt record over what `prior` says the ledger holds for its
    /// key. A wrong `prior` leaves stale index entries, which reads skip.
    pub fn attempt_over(mut self, attempt: AttemptRecord, prior: Prior) -> Self {
        self.attempts.push((attempt, prior));
        self
    }

    /// Adds a change to an episode.
    pub fn episode(mut self, op: EpisodeOp) -> Self {
        self.episodes.push(op);
        self
    }

    /// Records what the caller of (session, call id) was told, on its stored
    /// record (a no-op if there is none).
    pub fn reported(mut self, session: &str, call_id: &str, reported: Reported) -> Self {
        self.reports.push(Report { session: session.into(), call_id: call_id.into(), reported, read: None });
        self
    }

    /// [`LedgerWrite::reported`] on `call`, the stored record as the caller
    /// read or wrote it last while holding the call's lock, so that nothing
    /// else can have changed it since: the ledger need not read it again.
    pub fn reported_on(mut self, mut call: CallRecord, reported: Reported) -> Self {
        let (session, call_id) = (call.session.clone(), call.call_id.clone());
        call.reported = reported;
        self.reports.push(Report { session, call_id, reported, read: Some(Box::new(call)) });
        self
    }

    /// Makes the write conditional on `call` being supersedable (see [`Superseding`]).
    pub fn superseding(mut self, call: Superseding) -> Self {
        self.superseding = Some(call);
        self
    }

    /// Adds an entry to the retire index (a migration's backfill).
    pub(crate) fn retiring(mut self, entry: RetireEntry) -> Self {
        self.retire.push(entry);
        self
    }

    /// Appends `other`'s records to this write, after its own: both land
    /// together, atomically. Only for writes without conditions (a
    /// supersession or a budget charge is refused whole, so it stays alone).
    pub fn and(mut self, other: LedgerWrite) -> Self {
        debug_assert!(other.superseding.is_none() && other.charges.is_empty() && other.spends.is_empty(), "a conditional write is not merged");
        self.calls.extend(other.calls);
        self.attempts.extend(other.attempts);
        self.episodes.extend(other.episodes);
        self.reports.extend(other.reports);
        self.retire.extend(other.retire);
        self.releases.extend(other.releases);
        self
    }

    /// Spends one use of a budget with this write (see [`Charge`]).
    pub fn charge(mut self, charge: Charge) -> Self {
        self.charges.push(charge);
        self
    }

    /// Spends from a limit with this write (see [`Spend`]); an amount of 0 spends nothing.
    pub fn spend(mut self, spend: Spend) -> Self {
        if spend.amount > 0 {
            self.spends.push(spend);
        }
        self
    }

    /// Gives back with this write every use `call` holds of spending limits
    /// ([`CallRecord::spent`]; nothing if released already). The caller
    /// writes `call` as `released` in the same write.
    pub fn release_spent(mut self, call: &CallRecord) -> Self {
        if call.holds_spending() {
            for scope in &call.spent {
                self.releases.push(Release { scope: scope.clone(), at_ms: call.created_ms, call_id: call.call_id.clone() });
            }
        }
        self
    }

    /// Gives a limit's use back with this write (see [`Release`]).
    pub fn release(mut self, release: Release) -> Self {
        self.releases.push(release);
        self
    }
}
