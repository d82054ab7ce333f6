//! A completion queued and not waited for ([`Landing`]): until it lands, its
//! call counts as in progress and the next holder of the call's lock waits.

use super::Landing;
use crate::guard::Guard;
use crate::ledger::records::{CallRecord, CallState};
use crate::ledger::{Durability, Ledger, LedgerWrite, simulate_slow_fsync};
use std::sync::Arc;
use std::time::Duration;

/// A completed call record.
fn completed(call_id: &str) -> CallRecord {
    let mut record = CallRecord::admitted("s".into(), call_id.into(), "refund".into(), "digest".into(), serde_json::json!({}));
    record.state = CallState::Completed;
    record
}

// One worker: a synced write goes to the sync thread, so it lands only
// after the (slowed) fsync, long after `queue` returned.
#[tokio::test(flavor = "current_thread")]
async fn the_next_holder_of_a_calls_lock_waits_for_its_queued_completion() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(dir.path()).unwrap();
    let guard = Arc::new(Guard::new(ledger.clone(), Default::default()).unwrap());
    simulate_slow_fsync(Duration::from_millis(300));
    let record = completed("c1");
    let write = ledger.queue(LedgerWrite::new().call(record.clone()), Durability::Synced);
    let mut lock = guard.call_lock("s", "c1").lock_owned().await;
    *lock = Some(Landing::new(write, Vec::new(), record));
    drop(lock);
    let synced_before = ledger.write_counts().0;
    assert!(guard.in_progress("s", "c1"), "a call whose completion has not landed is still in progress");
    // Other calls' locks come and go meanwhile: the map is swept, the pending completion stays.
    for n in 0..200 {
        drop(guard.lock_call("s", &format!("other-{n}")).await);
    }
    assert!(guard.in_progress("s", "c1"), "a sweep keeps a lock whose completion has not landed");
    // A holder that gives up waiting leaves the completion for the next one.
    assert!(tokio::time::timeout(Duration::from_millis(20), guard.lock_call("s", "c1")).await.is_err());
    assert!(guard.in_progress("s", "c1"), "a cancelled wait leaves the completion in the lock");
    let held = guard.lock_call("s", "c1").await;
    simulate_slow_fsync(Duration::ZERO);
    assert!(held.is_none(), "the holder took the completion out");
    assert_eq!(ledger.write_counts().0, synced_before + 1, "the lock was handed over only once the completion had landed");
    drop(held);
    assert!(!guard.in_progress("s", "c1"));
}
