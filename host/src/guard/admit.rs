//! Admission, the first step of a tool call: a duplicate in progress is
//! waited for, a completed call is replayed, a call id reused with other
//! arguments is refused, and an irreversible call goes through the hold rule
//! ([`super::hold`]); what is left runs, under the call's lock and claim.

use super::claim::{CLAIM_POLL, Held};
use super::{CallGuard, CallIdentity, CallRules, Guard, internal};
use crate::error::{CallError, ErrorKind};
use crate::ledger::Claim;
use crate::ledger::records::{CallRecord, CallState, StoredOutcome};
use crate::policy::Effect;
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

/// How starting a run came out (on a shared ledger, after claiming the call).
#[allow(clippy::large_enum_variant, reason = "one per tool call")]
pub(super) enum Started {
    Admitted(Admission),
    /// Another host runs this call now; the lock back, to wait and retry.
    Busy(Held),
    /// An identical later call superseded it meanwhile; the lock back, to decide again.
    Superseded(Held),
}

/// What the ledger holds under a tool call's id.
enum Lookup {
    Found(Box<CallRecord>),
    /// Pruned at this time.
    Expired(u64),
    New,
}

impl Guard {
    /// Admits a tool call: waits for a duplicate in progress, then replays a
    /// completed call, refuses changed arguments, applies the hold rule to an
    /// irreversible one, or lets the plugin run.
    ///
    /// # Errors
    /// `conflict` when the call id was used with another tool or arguments;
    /// `held` under the hold rule; `expired` for a pruned call; `transport`
    /// when the ledger is unavailable (unreachable, its connection lost) or
    /// a newer toolguard migrated it (`upgrade`);
    /// `internal` when it fails otherwise.
    pub async fn admit(self: &Arc<Self>, id: CallIdentity, rules: CallRules) -> Result<Admission, CallError> {
        if let Some(refused) = self.schema.refusal() {
            return Err(refused);
        }
        let cached = self.completed.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(&id.session, &id.call_id);
        // A hit with other arguments falls through to the ledger, which holds
        // what the conflict error shows.
        if let Some(done) = cached
            && done.tool == id.tool
            && done.args_digest == id.args_digest
        {
            return Ok(Admission::Replay((*done.outcome).clone()));
        }
        let mut lock = self.lock_call(&id.session, &id.call_id).await;
        if rules.effect == Effect::Irreversible {
            return self.admit_irreversible(id, rules, lock).await;
        }
        loop {
            let (session, call_id) = (id.session.clone(), id.call_id.clone());
            let existing = self
                .ledger
                .read(move |ledger| match ledger.call(&session, &call_id)? {
                    None => Ok(ledger.expired(&session, &call_id)?.map_or(Lookup::New, Lookup::Expired)),
                    Some(r) => Ok(Lookup::Found(Box::new(r))),
                })
                .await
                .map_err(internal)?;
            let (record, persisted) = match existing {
                Lookup::Expired(at) => return Err(expired(&id.call_id, at)),
                Lookup::Found(r) if r.tool != id.tool || r.args_digest != id.args_digest => return Err(conflict(&id.call_id, &r)),
                Lookup::Found(r) if r.state == CallState::Completed && r.outcome.is_some() => return Ok(self.replay(*r)),
                Lookup::Found(r) => (*r, true),
                Lookup::New => (CallRecord::admitted(id.session.clone(), id.call_id.clone(), id.tool.clone(), id.args_digest.clone(), id.args.clone()), false),
            };
            match self.start(record, persisted, &rules, lock).await? {
                Started::Admitted(admission) => return Ok(admission),
                Started::Busy(back) | Started::Superseded(back) => {
                    lock = back;
                    tokio::time::sleep(CLAIM_POLL).await;
                }
            }
        }
    }

    /// Starts the run of `record` under `lock`, once this host holds its claim.
    pub(super) async fn start(self: &Arc<Self>, record: CallRecord, persisted: bool, rules: &CallRules, lock: Held) -> Result<Started, CallError> {
        Ok(match self.claim(record, persisted, rules.lease_ms).await.map_err(internal)? {
            Claim::Run { record, persisted } => Started::Admitted(Admission::Run(CallGuard::new(self.clone(), record, persisted, rules.clone(), lock))),
            Claim::Completed(r) => Started::Admitted(self.replay(r)),
            Claim::Conflict(r) => return Err(conflict(&r.call_id, &r)),
            Claim::Busy(_) => Started::Busy(lock),
            Claim::Superseded(_) => Started::Superseded(lock),
        })
    }

    /// A completed call's stored outcome, remembered for the next replay.
    pub(super) fn replay(&self, record: CallRecord) -> Admission {
        self.remember(&record);
        Admission::Replay(record.outcome.expect("completed calls carry their outcome"))
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

/// The refusal of tool call `call_id`, first made as `first` with other arguments.
pub(super) fn conflict(call_id: &str, first: &CallRecord) -> CallError {
    CallError::new(
        ErrorKind::Conflict,
        format!("tool call `{call_id}` was first made as `{}` with other arguments; a changed request needs a new tool-call id. Nothing was sent", first.tool),
    )
    .with_detail(json!({ "first_args": first.args, "first_tool": first.tool }))
}
