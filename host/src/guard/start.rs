//! The end of admission, which both paths share (the plain one,
//! [`super::admit`], and the hold rule's, [`super::hold`]): an admitted call
//! is claimed and handed its `CallGuard` to run, or a completed one is
//! replayed; and the refusals admission answers with.

use super::claim::Held;
use super::{CallGuard, CallRules, Guard, internal};
use crate::error::{CallError, ErrorKind};
use crate::ledger::Claim;
use crate::ledger::records::{CallRecord, StoredOutcome};
use serde_json::json;
use std::sync::Arc;

/// What admission decided.
#[allow(clippy::large_enum_variant, reason = "one per tool call, moved once into the run")]
pub enum Admission {
    /// The call completed before: its stored outcome, no plugin run.
    Replay(StoredOutcome),
    /// Run the plugin under this call guard.
    Run(CallGuard),
}

/// Where the record a run starts from came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Origin {
    /// Made by this admission, not in the ledger yet.
    New,
    /// Written by this admission (an episode opened, a call superseded): no run before.
    Written,
    /// Found in the ledger, not completed: an earlier run may have sent.
    Found,
}

/// How starting a run came out (on a shared ledger, after claiming the call).
#[allow(clippy::large_enum_variant, reason = "one per tool call")]
pub(super) enum Started {
    Admitted(Admission),
    /// Another host runs this call now; the lock back, to wait and retry.
    Busy(Held),
    /// An identical later call superseded it meanwhile; the lock back, to decide again.
    Superseded(Held),
}

impl Guard {
    /// Starts the run of `record` under `lock`, once this host holds its claim.
    pub(super) async fn start(self: &Arc<Self>, record: CallRecord, origin: Origin, rules: &CallRules, lock: Held) -> Result<Started, CallError> {
        Ok(match self.claim(record, origin != Origin::New, rules.lease_ms).await.map_err(internal)? {
            Claim::Run { record, persisted } => {
                // A record another host wrote meanwhile counts as found.
                let ran_before = origin == Origin::Found || (persisted && origin == Origin::New);
                Started::Admitted(Admission::Run(CallGuard::new(self.clone(), record, persisted, rules.clone(), lock).after_earlier_runs(ran_before)))
            }
            Claim::Completed(r) => Started::Admitted(self.replay(r)?),
            Claim::Conflict(r) => return Err(conflict(&r.call_id, &r)),
            Claim::Busy(_) => Started::Busy(lock),
            Claim::Superseded(_) => Started::Superseded(lock),
        })
    }

    /// A completed call's stored outcome, remembered for the next replay.
    ///
    /// # Errors
    /// `internal`, naming the record, when it holds no outcome ([`damaged`]).
    pub(super) fn replay(&self, record: CallRecord) -> Result<Admission, CallError> {
        let Some(outcome) = record.outcome.clone() else { return Err(damaged(&record)) };
        self.remember(&record);
        Ok(Admission::Replay(outcome))
    }

    /// Keeps a completed call's outcome for fast replays.
    pub(super) fn remember(&self, record: &CallRecord) {
        self.completed.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(record);
    }
}

/// The refusal of a call whose record was pruned at `pruned_ms`.
pub(super) fn expired(call_id: &str, pruned_ms: u64) -> CallError {
    CallError::new(
        ErrorKind::Expired,
        format!(
            "tool call `{call_id}` is older than the ledger keeps (its record was pruned at {pruned_ms} ms since the epoch, \
             by the retention policy); it was not run again, and its outcome is no longer kept. Nothing was sent"
        ),
    )
    .with_detail(json!({ "pruned_ms": pruned_ms }))
}

/// The refusal of a call because of `record`, which says it completed but
/// holds no outcome: the ledger row is damaged, or was written by something
/// other than toolguard (a shared PostgreSQL ledger is within reach of
/// other programs). Nothing acts on it — nothing runs, nothing is sent,
/// nothing is written over it — until an operator has looked.
pub(super) fn damaged(record: &CallRecord) -> CallError {
    CallError::new(
        ErrorKind::Internal,
        format!(
            "the ledger's record of tool call `{}` (session `{}`, tool `{}`) says it completed but holds no outcome: it is damaged, \
             or was written by something other than toolguard. Nothing was run or sent, and the record was left as it is. \
             An operator must inspect it (`toolguard ledger show {}`) and restore it from a backup; until then this call, and \
             any identical repeat of it, is refused",
            record.call_id, record.session, record.tool, record.call_id
        ),
    )
    .with_detail(json!({ "damaged_record": { "session": record.session, "call_id": record.call_id } }))
}

/// The refusal of tool call `call_id`, first made as `first` with other arguments.
pub(super) fn conflict(call_id: &str, first: &CallRecord) -> CallError {
    CallError::new(
        ErrorKind::Conflict,
        format!("tool call `{call_id}` was first made as `{}` with other arguments; a changed request needs a new tool-call id. Nothing was sent", first.tool),
    )
    .with_detail(json!({ "first_args": first.args, "first_tool": first.tool }))
}
