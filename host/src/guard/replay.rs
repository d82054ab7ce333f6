//! The replay cache: recently completed tool calls, so that replaying one
//! needs no ledger read. Bounded by count *and* bytes: a plugin returns
//! results of up to `max_result_bytes` each, and 4,096 of those must not
//! become gigabytes of a long-running host's memory.

use crate::ledger::records::{CallRecord, StoredOutcome};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

/// The most completed calls kept: the replays a model makes within a few turns.
pub const MAX_CALLS: usize = 4_096;
/// The most bytes of outcomes kept, all calls together.
pub const MAX_BYTES: usize = 16 << 20;
/// An outcome larger than this is not kept: its replays read the ledger.
pub const MAX_ENTRY_BYTES: usize = 256 << 10;

/// What the cache keeps of a completed call: enough to tell the same call
/// from a conflicting one, and its outcome.
pub(super) struct Done {
    pub tool: String,
    pub args_digest: String,
    pub outcome: Arc<StoredOutcome>,
    /// What it costs the cache, roughly: its outcome as JSON and its names.
    bytes: usize,
}

/// A bounded, first-in-first-out map of completed calls.
#[derive(Default)]
pub(super) struct Completed {
    calls: HashMap<(String, String), Arc<Done>>,
    order: VecDeque<(String, String)>,
    bytes: usize,
}

/// How many bytes `value` takes as JSON, counted without building it.
fn json_len(value: &StoredOutcome) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    serde_json::to_writer(&mut count, value).map_or(usize::MAX, |()| count.0)
}

impl Completed {
    /// The completed call (session, call id), if it is kept.
    pub fn get(&self, session: &str, call_id: &str) -> Option<Arc<Done>> {
        // Borrowed lookups on a tuple key need an owned key; the strings are short.
        self.calls.get(&(session.to_string(), call_id.to_string())).cloned()
    }

    /// Keeps `record` if it is completed and small enough; drops the oldest
    /// calls until the cache is within its bounds again.
    pub fn insert(&mut self, record: &CallRecord) {
        let Some(outcome) = record.outcome.clone() else { return };
        let size = json_len(&outcome);
        if size > MAX_ENTRY_BYTES {
            return;
        }
        let key = (record.session.clone(), record.call_id.clone());
        let bytes = size + key.0.len() + key.1.len() + record.tool.len() + record.args_digest.len();
        let done = Done { tool: record.tool.clone(), args_digest: record.args_digest.clone(), outcome: Arc::new(outcome), bytes };
        match self.calls.insert(key.clone(), Arc::new(done)) {
            Some(old) => self.bytes -= old.bytes,
            None => self.order.push_back(key),
        }
        self.bytes += bytes;
        while self.order.len() > MAX_CALLS || self.bytes > MAX_BYTES {
            let Some(oldest) = self.order.pop_front() else { break };
            if let Some(old) = self.calls.remove(&oldest) {
                self.bytes -= old.bytes;
            }
        }
    }

    /// Bytes kept now (outcomes and names).
    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::records::CallState;

    fn completed(call_id: &str, result_bytes: usize) -> CallRecord {
        let mut call = CallRecord::admitted("s".into(), call_id.into(), "t".into(), "d".into(), serde_json::Value::Null);
        call.state = CallState::Completed;
        call.outcome = Some(StoredOutcome::Result(serde_json::Value::String("x".repeat(result_bytes))));
        call
    }

    #[test]
    fn large_results_cannot_grow_the_cache_past_its_bytes() {
        let mut cache = Completed::default();
        for i in 0..200 {
            cache.insert(&completed(&format!("c{i}"), 200 << 10));
            assert!(cache.bytes() <= MAX_BYTES, "after {i}: {} bytes", cache.bytes());
        }
        assert!(cache.get("s", "c199").is_some(), "the newest is kept");
        assert!(cache.get("s", "c0").is_none(), "the oldest made room");
        cache.insert(&completed("huge", MAX_ENTRY_BYTES + 1));
        assert!(cache.get("s", "huge").is_none(), "too large to keep: replays read the ledger");
    }

    #[test]
    fn many_small_results_are_bounded_by_count_and_a_rewrite_is_counted_once() {
        let mut cache = Completed::default();
        for i in 0..MAX_CALLS + 10 {
            cache.insert(&completed(&format!("c{i}"), 10));
        }
        assert!(cache.get("s", "c9").is_none() && cache.get("s", "c10").is_some());
        let before = cache.bytes();
        cache.insert(&completed("c10", 10));
        assert_eq!(cache.bytes(), before, "the same call again replaces its entry");
    }
}
