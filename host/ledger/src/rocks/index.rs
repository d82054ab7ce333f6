//! The RocksDB ledger's indexes, kept right by every write: unsettled
//! attempts by state, attempts by (call, step), the calls of each episode, and the retire index.

use super::Rocks;
use super::layout::{CF_BY_STATE, CF_CALL_ATTEMPTS, CF_EPISODE_CALLS, CF_RETIRE, call_key, episode_call_key, retire_key};
use crate::retention::RetireEntry;
use crate::{AttemptRecord, AttemptState, CallRecord, Prior};
use rocksdb::WriteBatch;

impl Rocks {
    /// Keeps the attempt indexes right. The by-state index holds only
    /// unsettled attempts (`pending`, `unknown`): recovery and the metrics
    /// look those up; a settled attempt needs no entry, so settling one
    /// deletes its entry and adds none. With the prior state known only what
    /// changed is touched; otherwise every other state's entry is deleted
    /// blind (a ledger written before 2026-12-05 indexed settled states too).
    pub(super) fn index(&self, batch: &mut WriteBatch, attempt: &AttemptRecord, prior: Prior) {
        let by_state = |state: AttemptState| [&[state.tag()], attempt.key.as_bytes()].concat();
        let stale: &[AttemptState] = match prior {
            Prior::Absent => &[],
            Prior::Was(state) if state == attempt.state => &[],
            Prior::Was(ref state) => std::slice::from_ref(state),
            Prior::Unread => &AttemptState::ALL,
        };
        for state in stale.iter().filter(|s| **s != attempt.state) {
            batch.delete_cf(self.cf(CF_BY_STATE), by_state(*state));
        }
        if attempt.state.is_unsettled() && prior != Prior::Was(attempt.state) {
            batch.put_cf(self.cf(CF_BY_STATE), by_state(attempt.state), []);
        }
        if !matches!(prior, Prior::Was(_)) {
            let mut by_call = call_key(&attempt.session, &attempt.call_id);
            by_call.extend_from_slice(&attempt.step.to_be_bytes());
            batch.put_cf(self.cf(CF_CALL_ATTEMPTS), by_call, attempt.key.as_bytes());
        }
    }

    /// Adds the index entries a write of `call` needs: its episode
    /// membership and, once final, its retire entry.
    pub(super) fn index_call(&self, batch: &mut WriteBatch, call: &CallRecord) {
        if let Some(n) = call.episode {
            batch.put_cf(self.cf(CF_EPISODE_CALLS), episode_call_key(call, n), []);
        }
        if let Some(entry) = RetireEntry::of_call(call) {
            batch.put_cf(self.cf(CF_RETIRE), retire_key(&entry), []);
        }
    }
}
