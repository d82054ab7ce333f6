//! Retention: what the ledger may forget, and what it holds.
//!
//! A record becomes *final* when nothing can change it any more: a call
//! outside episodes when it completes, an episode (with all its calls) when
//! a definitive outcome reached its caller. Each backend writes an entry to
//! its retire index (time ‖ unit) in the same write that makes a unit final,
//! so a pruning pass reads only what is old enough, in time order.
//!
//! [`Ledger::prune`] takes each entry older than the cut-off, re-reads its
//! unit and removes it only if every check below holds — written once here,
//! for both backends:
//! - the unit still exists (otherwise only the index entry goes);
//! - a call unit is completed; an episode unit is closed;
//! - no attempt of any of its calls is `pending` or `unknown`;
//! - no call of it is claimed by a host now.
//!
//! Removed calls leave a 16-byte tombstone (a digest of session and call
//! id), so a later call under the same id is refused as `expired`, never run
//! afresh. `docs/ledger.md` ("Retention") gives the safety argument.

use super::{AttemptRecord, Backend, BackendError, CallRecord, CallState, EpisodeId, Ledger, LedgerError};
use crate::error::failed;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

/// Retire-index entries a pruning pass reads at a time.
const PAGE: usize = 256;

/// How long budget uses are kept: a budget counts the last hour.
pub const BUDGET_WINDOW_MS: u64 = 3_600_000;

/// What a pruning pass may remove together, once it is old.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "unit", rename_all = "kebab-case")]
pub(crate) enum Unit {
    /// A completed call outside episodes (a call of an idempotent tool, or
    /// one recorded before episodes).
    Call { session: String, call_id: String },
    /// A closed episode of an irreversible action and every call in it.
    Episode { session: String, tool: String, args_digest: String, episode: u64 },
}

/// One entry of the retire index: a unit and when it became final.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RetireEntry {
    pub at_ms: u64,
    /// The [`Unit`] as JSON text (so the index sorts and stores it as bytes).
    pub unit: String,
}

impl RetireEntry {
    fn new(at_ms: u64, unit: &Unit) -> Self {
        Self { at_ms, unit: serde_json::to_string(unit).expect("a unit serialises") }
    }

    /// The entry a write of `call` adds, if the write makes it final.
    pub(crate) fn of_call(call: &CallRecord) -> Option<Self> {
        match (call.state, call.episode, call.completed_ms) {
            (CallState::Completed, None, Some(at)) => Some(Self::new(at, &Unit::Call { session: call.session.clone(), call_id: call.call_id.clone() })),
            _ => None,
        }
    }

    /// The entry closing `episode` at `at_ms` adds.
    pub(crate) fn of_close(episode: &EpisodeId, at_ms: u64) -> Self {
        let unit =
            Unit::Episode { session: episode.session.clone(), tool: episode.tool.clone(), args_digest: episode.args_digest.clone(), episode: episode.episode };
        Self::new(at_ms, &unit)
    }
}

/// What one removal deletes, atomically: the calls (each leaving a
/// tombstone), their attempts with their index entries, the episode, and
/// the retire entry itself.
#[derive(Debug, Clone)]
pub(crate) struct Removal {
    pub entry: RetireEntry,
    /// (session, call id) of each call removed.
    pub calls: Vec<(String, String)>,
    pub attempts: Vec<AttemptRecord>,
    /// (session, tool, args digest, number).
    pub episode: Option<(String, String, String, u64)>,
    /// When the tombstones say the calls were pruned.
    pub pruned_ms: u64,
}

/// The tombstone of a pruned call: the first 16 bytes of
/// sha256(len(session) ‖ session ‖ call id).
pub(crate) fn tombstone(session: &str, call_id: &str) -> [u8; 16] {
    let mut h = Sha256::new();
    h.update((session.len() as u64).to_be_bytes());
    h.update(session.as_bytes());
    h.update(call_id.as_bytes());
    let digest = h.finalize();
    digest[..16].try_into().expect("sha256 has 32 bytes")
}

/// What one pruning pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PruneReport {
    /// Final units old enough to be examined.
    pub examined: u64,
    /// Tool calls removed (each leaves a tombstone).
    pub calls: u64,
    /// Attempts removed.
    pub attempts: u64,
    /// Episodes removed.
    pub episodes: u64,
    /// Units kept because a check failed (an unsettled attempt, a claim).
    pub kept: u64,
    /// Budget uses older than the budgets' hour, removed.
    pub budget_uses: u64,
}

/// What the ledger holds, as `toolguard ledger stats` shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct LedgerStats {
    /// Tool calls recorded, by state (`admitted`, `completed`).
    pub calls: BTreeMap<String, u64>,
    /// Attempts recorded, by state.
    pub attempts: BTreeMap<String, u64>,
    /// Episodes still open (their caller has not heard a definitive outcome).
    pub episodes_open: u64,
    /// Episodes closed and not yet pruned.
    pub episodes_closed: u64,
    /// Final units waiting in the retire index.
    pub retiring: u64,
    /// Tombstones of pruned calls.
    pub tombstones: u64,
    /// Budget uses kept.
    pub budget_uses: u64,
    /// Bytes the ledger takes: on disk (RocksDB) or in its tables (PostgreSQL).
    pub bytes: u64,
    /// When the oldest call still recorded was admitted (ms since the epoch).
    pub oldest_call_ms: Option<u64>,
}

impl LedgerStats {
    /// Calls recorded, in any state.
    pub fn total_calls(&self) -> u64 {
        self.calls.values().sum()
    }
}

impl Ledger {
    /// Removes every final unit that became final before `cutoff_ms` and
    /// passes the checks in the module docs, and budget uses older than the
    /// budgets' hour. Safe to run while hosts serve, and from several hosts
    /// of a fleet at once.
    ///
    /// # Errors
    /// The ledger cannot be read or written; what was removed stays removed.
    pub fn prune(&self, cutoff_ms: u64, now_ms: u64) -> Result<PruneReport, LedgerError> {
        let backend = self.backend.as_ref();
        let mut report = PruneReport::default();
        let mut after: Option<RetireEntry> = None;
        loop {
            let page = backend.retire_page(cutoff_ms, after.as_ref(), PAGE).map_err(|e| self.backend_err(e))?;
            let Some(last) = page.last().cloned() else { break };
            for entry in page {
                report.examined += 1;
                match plan(backend, entry, now_ms).map_err(|e| self.backend_err(e))? {
                    Some(removal) => {
                        backend.remove(&removal).map_err(|e| self.backend_err(e))?;
                        report.calls += removal.calls.len() as u64;
                        report.attempts += removal.attempts.len() as u64;
                        report.episodes += u64::from(removal.episode.is_some());
                    }
                    None => report.kept += 1,
                }
            }
            after = Some(last);
        }
        report.budget_uses = backend.forget_budget_before(now_ms.saturating_sub(2 * BUDGET_WINDOW_MS)).map_err(|e| self.backend_err(e))?;
        Ok(report)
    }

    /// When tool call (session, call id) was pruned, if it was.
    ///
    /// # Errors
    /// The ledger cannot be read.
    pub fn expired(&self, session: &str, call_id: &str) -> Result<Option<u64>, LedgerError> {
        self.backend.expired(session, call_id).map_err(|e| self.backend_err(e))
    }

    /// Counts, bytes and the oldest call (reads the whole ledger).
    ///
    /// # Errors
    /// The ledger cannot be read.
    pub fn stats(&self) -> Result<LedgerStats, LedgerError> {
        self.backend.stats().map_err(|e| self.backend_err(e))
    }
}

/// The removal of `entry`'s unit, if every check holds; `None` keeps it.
/// A unit that no longer exists yields a removal of the index entry alone.
fn plan(backend: &dyn Backend, entry: RetireEntry, now_ms: u64) -> Result<Option<Removal>, BackendError> {
    let unit: Unit = serde_json::from_str(&entry.unit).map_err(|e| failed(format!("damaged retire entry: {e}")))?;
    let mut removal = Removal { entry, calls: Vec::new(), attempts: Vec::new(), episode: None, pruned_ms: now_ms };
    let calls = match unit {
        Unit::Call { session, call_id } => match backend.call(&session, &call_id)? {
            Some(call) if call.state != CallState::Completed || call.episode.is_some() => return Ok(None),
            Some(call) => vec![call],
            None => Vec::new(),
        },
        Unit::Episode { session, tool, args_digest, episode } => match backend.episode(&session, &tool, &args_digest, Some(episode))? {
            Some(e) if !e.closed => return Ok(None),
            Some(_) => {
                removal.episode = Some((session.clone(), tool.clone(), args_digest.clone(), episode));
                backend.episode_calls(&session, &tool, &args_digest, episode)?
            }
            None => Vec::new(),
        },
    };
    for call in calls {
        if call.leased_elsewhere("", now_ms) {
            return Ok(None);
        }
        let attempts = backend.attempts_of_call(&call.session, &call.call_id)?;
        if attempts.iter().any(|a| a.state.is_unsettled()) {
            return Ok(None);
        }
        removal.attempts.extend(attempts);
        removal.calls.push((call.session, call.call_id));
    }
    Ok(Some(removal))
}
