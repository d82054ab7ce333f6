//! A fleet upgraded under a running host. When a newer toolguard on another
//! host migrates the shared ledger to a schema this build does not know,
//! this host stops admitting the calls it records (read-only ones, never
//! recorded, still run) and stops taking calls over — it would apply its
//! rules to records written under newer ones — and says to upgrade it;
//! calls it already admitted finish. Every recovery pass asks
//! (`serve` runs one every 2 s on a shared ledger); the ledger put back to
//! this build's schema lets the host serve again. See `docs/ledger.md`,
//! "Schema versions".

use crate::error::{CallError, ErrorKind};
use std::sync::Mutex;

/// The ledger's schema as the last recovery pass found it, when it was not
/// this build's.
#[derive(Default)]
pub(super) struct SchemaWatch(Mutex<Option<String>>);

impl SchemaWatch {
    /// Notes what a pass read (`Some`: a schema this build does not know);
    /// whether the host must stand aside.
    pub(super) fn note(&self, changed: Option<String>) -> bool {
        let mut seen = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let known = crate::ledger::Ledger::schema();
        match (&*seen, &changed) {
            (None, Some(now)) => tracing::error!(
                ledger_schema = %now, this_build = known,
                "the ledger was migrated to a schema this toolguard does not know (another host was upgraded): \
                 this host admits no calls and takes none over until it is upgraded"
            ),
            (Some(_), None) => tracing::warn!(ledger_schema = known, "the ledger's schema is this toolguard's again: admitting calls"),
            _ => {}
        }
        *seen = changed;
        seen.is_some()
    }

    /// The answer to a call while the host stands aside: nothing was run.
    pub(super) fn refusal(&self) -> Option<CallError> {
        let seen = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        seen.as_ref().map(|now| {
            CallError::new(
                ErrorKind::Transport,
                format!(
                    "this host's toolguard is older than its ledger (schema {now}; it knows {}): another host was upgraded, and this one \
                     admits no calls until it is too. Nothing was run; retry the same tool-call id on an upgraded host",
                    crate::ledger::Ledger::schema()
                ),
            )
        })
    }
}
