//! Damaged or foreign ledger records. A shared PostgreSQL ledger is within
//! reach of other programs, and any ledger can be damaged: a record the
//! guard cannot act on is refused with an error naming it and the
//! operator's move, nothing is run or sent, the record is left as it is,
//! and the host goes on serving other calls. Run on RocksDB, and again on
//! PostgreSQL by `./dev.sh test` (`TOOLGUARD_TEST_LEDGER=postgres`).

use crate::payments::{Downstream, harness, refund_args};
use toolguard::ErrorKind;
use toolguard::ledger::records::{CallRecord, CallState, EpisodeRecord};
use toolguard::ledger::{Durability, EpisodeOp, LedgerWrite};

/// A record of `call_id` refunding `amount`, as toolguard would write it
/// for session `s1`, but completed without an outcome.
fn completed_without_outcome(call_id: &str, amount: u64, episode: Option<u64>) -> CallRecord {
    let args: serde_json::Value = serde_json::from_str(&refund_args(amount)).unwrap();
    let canonical = toolguard::keys::canonical_args(&args).unwrap();
    let digest = toolguard::keys::args_digest(&canonical);
    let args = serde_json::from_str(&canonical).unwrap();
    CallRecord {
        state: CallState::Completed,
        completed_ms: Some(toolguard::ledger::records::now_ms()),
        episode,
        ..CallRecord::admitted("s1".into(), call_id.into(), "refund".into(), digest, args)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guard_a_completed_record_without_its_outcome_is_refused_by_name_and_left_as_it_is() {
    let h = harness(Downstream::default()).await;
    let ledger = h.ledger();
    let foreign = completed_without_outcome("f1", 300, Some(1));
    let write = LedgerWrite::new().call(foreign.clone()).episode(EpisodeOp::Open(EpisodeRecord::open(&foreign, 1)));
    ledger.commit(write, Durability::Synced).unwrap();

    // The same call again: it would be a replay, but there is nothing to replay.
    let err = h.refund("f1", 300).await.expect_err("nothing to replay");
    assert_eq!(err.kind, ErrorKind::Internal, "{err:?}");
    assert!(err.message.contains("`f1`") && err.message.contains("holds no outcome") && err.message.contains("toolguard ledger show f1"), "{}", err.message);
    assert_eq!(err.detail.as_ref().unwrap()["damaged_record"]["call_id"], "f1");
    // A blind repeat of it under a new id follows it as its executor: refused the same way, naming it.
    let err = h.refund("f2", 300).await.expect_err("its executor has no outcome to answer with");
    assert_eq!(err.kind, ErrorKind::Internal, "{err:?}");
    assert!(err.message.contains("`f1`") && err.message.contains("holds no outcome"), "{}", err.message);

    assert!(h.posts().is_empty(), "nothing was sent");
    let kept = ledger.call("s1", "f1").unwrap().expect("still there");
    assert_eq!(kept, foreign, "the damaged record is left as it was");
    assert!(ledger.call("s1", "f2").unwrap().is_none(), "nothing was recorded for the repeat");
    // The host goes on serving other calls.
    let ok = h.refund("g1", 301).await.expect("another refund goes through");
    assert_eq!(ok.value["status"], "succeeded");
    assert_eq!(h.refunds(), 1, "one refund: the new one");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guard_an_unknown_send_whose_stored_url_is_damaged_is_not_resent_and_is_named() {
    let d = Downstream { timeout_ms: 200, max_retries: 0, reconcile_ms: 100, key: crate::payments::HEADER_ONLY, ..Downstream::default() };
    let h = harness(d).await;
    // The provider commits the refund but answers after the deadline: unknown.
    h.sandbox.inject(toolguard_sandbox::Fault::DelayAfterCommit { ms: 1_000 });
    let first = h.call_unheard("u1", "refund", &refund_args(310)).await.expect_err("the outcome is unknown");
    assert_eq!(first.kind, ErrorKind::OutcomeUnknown, "{first:?}");
    let ledger = h.ledger();
    let mut attempts = ledger.attempts_of_call("s1", "u1").unwrap();
    assert_eq!(attempts.len(), 1);
    let mut damaged = attempts.remove(0);
    assert!(damaged.state.is_unsettled(), "{:?}", damaged.state);
    damaged.request.url = "http://[::1".into();
    ledger.commit(LedgerWrite::new().attempt(damaged.clone()), Durability::Synced).unwrap();
    let posts = h.posts().len();

    // The same call again re-sends its recorded step: not this one.
    let err = h.refund("u1", 310).await.expect_err("it cannot be sent as recorded");
    assert_eq!(err.kind, ErrorKind::OutcomeUnknown, "{err:?}");
    assert!(err.message.contains(&damaged.key) && err.message.contains("stored URL does not parse"), "{}", err.message);
    assert_eq!(h.posts().len(), posts, "nothing was sent again");
    let kept = ledger.attempt(&damaged.key).unwrap().expect("still there");
    assert_eq!(kept, damaged, "the damaged attempt is left as it was");
    // The host goes on serving other calls.
    h.refund("g2", 311).await.expect("another refund goes through");
}
