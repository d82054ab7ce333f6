//! The end of a run, as `Guard::finish` takes it apart: the call's record,
//! its first unsettled send, the outcome writes its completion carries, and
//! the lock it leaves the completion in.

use super::{CallGuard, Unsettled};
use crate::ledger::LedgerWrite;
use crate::ledger::records::CallRecord;

impl CallGuard {
    /// The call's completion, with the buffered outcomes its sends hold
    /// (one atomic write), and the keys of those attempts.
    pub(super) fn completion(&mut self, completed: CallRecord) -> (LedgerWrite, Vec<String>) {
        let (outcomes, keys) = self.take_held();
        (outcomes.call(completed), keys)
    }

    /// The buffered outcomes this call's sends hold, taken, and the keys of
    /// their attempts: for a completion that carries them.
    pub(super) fn take_held(&mut self) -> (LedgerWrite, Vec<String>) {
        self.progress.take_held()
    }

    /// Ends the run, leaving the call's completion in its lock for the
    /// lock's next holder to wait for; the lock, to watch it.
    pub(super) fn leave(mut self, landing: super::landing::Landing) -> super::claim::CallLock {
        *self._lock = Some(landing);
        tokio::sync::OwnedMutexGuard::mutex(&self._lock).clone()
    }

    /// The tool call this guard serves.
    pub(super) fn record(&self) -> &CallRecord {
        &self.record
    }

    /// The first unsettled send, or the one cut off mid-flight, if any.
    pub(super) fn take_unsettled(&mut self) -> Option<Unsettled> {
        let first = (!self.open_steps.is_empty()).then(|| self.open_steps.remove(0).1);
        first.or_else(|| self.progress.in_flight.take())
    }
}
