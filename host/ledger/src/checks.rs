//! The checks both backends make of a write, written once. Each backend
//! reads what a check needs its own way (a RocksDB lookup under the host's
//! lock per action, a locked PostgreSQL row) and asks here whether the write
//! may go on.

use super::records::{AttemptRecord, AttemptState, CallRecord, CallState, EpisodeId, GrantRecord};
use super::{BackendError, Charge, Spend, Superseding};

/// Whether `attempts` prove their call sent nothing that could have taken
/// effect: none, or each settled as never sent (by the transport or an operator).
pub fn sent_nothing(attempts: &[AttemptRecord]) -> bool {
    attempts.iter().all(|a| a.state == AttemptState::Failed && a.response.is_none())
}

/// Whether `attempts` settled their call as never having taken effect:
/// there is at least one, each is settled, and none was answered 2xx (a
/// refusal, or never sent by the transport's or an operator's word).
pub fn never_took_effect(attempts: &[AttemptRecord]) -> bool {
    !attempts.is_empty() && attempts.iter().all(|a| a.state == AttemptState::Failed)
}

/// A superseding write's condition: the call is `free` (recorded, not
/// completed, and on a shared ledger claimed by nobody) and sent nothing.
pub(super) fn supersedable(s: &Superseding, free: bool, attempts: &[AttemptRecord]) -> Result<(), BackendError> {
    if free && sent_nothing(attempts) {
        return Ok(());
    }
    Err(BackendError::Conflict(format!("tool call `{}` can no longer be superseded", s.call_id)))
}

/// A budget charge, given the uses its scope already holds in its window.
pub(super) fn within_budget(c: &Charge, used: u64) -> Result<(), BackendError> {
    if used < u64::from(c.max) {
        return Ok(());
    }
    Err(BackendError::Refused(format!("{} is spent ({} in the last hour)", c.what, c.max)))
}

/// A spend from a limit, given what its scope already holds in its window.
pub(super) fn within_limit(s: &Spend, used: u64) -> Result<(), BackendError> {
    if used.saturating_add(s.amount) <= s.max {
        return Ok(());
    }
    let ends = i64::try_from(s.until_ms).ok().and_then(chrono::DateTime::from_timestamp_millis);
    let room = match ends {
        Some(at) => format!("room returns at {} (the window's end), or when a use is released", at.to_rfc3339()),
        None => "room returns only when a use is released (the window never ends)".into(),
    };
    Err(BackendError::OverLimit(format!("{}: {used} of {} is used in this window, and this call would add {}; {room}", s.what, s.max, s.amount)))
}

/// The refusal of a write of tool call `call_id` over a record of the same
/// id with another tool or arguments (written meanwhile by another host).
pub(super) fn another_action(call_id: &str) -> BackendError {
    BackendError::Conflict(format!("tool call `{call_id}` was recorded meanwhile with another tool or arguments"))
}

/// The refusal of an episode change whose condition no longer held.
pub(super) fn episode_changed(r: &EpisodeId) -> BackendError {
    BackendError::Conflict(format!("episode {} of `{}` changed under this write", r.episode, r.tool))
}

/// Whether `record` tells something `latest` (its plugin's last entry) does not.
pub(super) fn grants_changed(latest: Option<&GrantRecord>, record: &GrantRecord) -> bool {
    latest.is_none_or(|last| last.digest != record.digest || last.grants != record.grants)
}

/// Whether `call` is not completed and its approval `request` waits for a decision.
pub(super) fn approval_pending(call: &CallRecord, request: &str) -> bool {
    call.state != CallState::Completed && call.approval.as_ref().is_some_and(|a| a.request == request && a.status == crate::records::ApprovalStatus::Pending)
}
