//! Admission, the first step of a tool call: a duplicate in progress is
//! waited for, a completed call is replayed, a call id reused with other
//! arguments is refused, and an irreversible call goes through the hold rule
//! ([`super::hold`]); what is left runs, under the call's lock and claim.

use super::claim::CLAIM_POLL;
use super::start::{Admission, Origin, Started, conflict, expired};
use super::{CallIdentity, CallRules, Guard, internal};
use crate::error::CallError;
use crate::ledger::records::{CallRecord, CallState};
use crate::policy::Effect;
use std::sync::Arc;

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
            let (record, origin) = match existing {
                Lookup::Expired(at) => return Err(expired(&id.call_id, at)),
                Lookup::Found(r) if r.tool != id.tool || r.args_digest != id.args_digest => return Err(conflict(&id.call_id, &r)),
                Lookup::Found(r) if r.state == CallState::Completed => return self.replay(*r),
                Lookup::Found(r) => (*r, Origin::Found),
                Lookup::New => {
                    (CallRecord::admitted(id.session.clone(), id.call_id.clone(), id.tool.clone(), id.args_digest.clone(), id.args.clone()), Origin::New)
                }
            };
            match self.start(record, origin, &rules, lock).await? {
                Started::Admitted(admission) => return Ok(admission),
                Started::Busy(back) | Started::Superseded(back) => {
                    lock = back;
                    tokio::time::sleep(CLAIM_POLL).await;
                }
            }
        }
    }
}
