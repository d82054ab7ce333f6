//! How claiming a tool call came out, and how a record already in the
//! ledger classifies for a call (the rule both backends apply).

use super::records::{CallRecord, CallState};

/// How claiming a tool call came out.
#[derive(Debug, Clone, PartialEq)]
pub enum Claim {
    /// Ours to run: the call as the ledger now holds it (or the new record),
    /// and whether it is in the ledger yet.
    Run {
        /// The call as the ledger holds it (or the new record).
        record: CallRecord,
        /// Whether it is in the ledger yet.
        persisted: bool,
    },
    /// It completed before: replay its outcome. (A record that says so
    /// without an outcome is damaged: it is handed back as it is, for the
    /// host to refuse, never claimed and run over.)
    Completed(CallRecord),
    /// It was made before with another tool or arguments.
    Conflict(CallRecord),
    /// Another host runs it now; its claim is live.
    Busy(CallRecord),
    /// An identical later call took its place in its episode: it never runs again.
    Superseded(CallRecord),
}

impl Claim {
    /// How an existing record (`Some`) or none classifies for `call`, on a
    /// ledger only this host writes.
    pub(super) fn of_existing(call: &CallRecord, existing: Option<CallRecord>) -> Self {
        match existing {
            None => Self::Run { record: call.clone(), persisted: false },
            Some(r) if r.tool != call.tool || r.args_digest != call.args_digest => Self::Conflict(r),
            Some(r) if r.state == CallState::Completed => Self::Completed(r),
            Some(r) if r.superseded_by.is_some() => Self::Superseded(r),
            Some(r) => Self::Run { record: r, persisted: true },
        }
    }
}
