//! Retention's behaviour on both backends: what a pruning pass removes,
//! what it keeps, and the tombstones it leaves.

use super::{attempt, call, episode};
use crate::*;

/// Call `call_id` of session `s` (tool refund, digest `d`), completed at `at`.
fn completed(call_id: &str, at: u64) -> CallRecord {
    CallRecord {
        state: CallState::Completed,
        outcome: Some(StoredOutcome::Result(serde_json::json!({ "id": call_id }))),
        completed_ms: Some(at),
        ..call("s", call_id)
    }
}

/// `c` as a member of episode `n`.
fn in_episode(c: CallRecord, n: u64, follower: bool) -> CallRecord {
    CallRecord { episode: Some(n), follower, ..c }
}

fn commit(ledger: &Ledger, write: LedgerWrite) {
    ledger.commit(write, Durability::Buffered).unwrap();
}

pub(super) fn a_pruning_pass_removes_old_final_units_and_leaves_tombstones(store: &dyn super::Store) {
    let ledger = store.open();
    // Outside episodes (an idempotent tool): old, recent, and old but not completed.
    commit(&ledger, LedgerWrite::new().call(completed("old", 1_000)).attempt(attempt("old", 0, 0, AttemptState::Succeeded)));
    commit(&ledger, LedgerWrite::new().call(completed("recent", 9_000)).attempt(attempt("recent", 0, 0, AttemptState::Succeeded)));
    commit(&ledger, LedgerWrite::new().call(call("s", "running")).attempt(attempt("running", 0, 0, AttemptState::Unknown)));
    // Episode 1 of the refund: closed long ago, an executor and a follower.
    let (x, y) = (in_episode(completed("x", 1_000), 1, false), in_episode(call("s", "y"), 1, true));
    commit(&ledger, LedgerWrite::new().call(x).call(y).attempt(attempt("x", 0, 0, AttemptState::Succeeded)).episode(EpisodeOp::Open(episode(1, "x"))));
    commit(&ledger, LedgerWrite::new().episode(EpisodeOp::Close { episode: episode(1, "x").id(), at_ms: 1_100 }));
    // Episode 1 of another action: closed long ago, but an attempt is still unknown.
    let other = |c: CallRecord| CallRecord { args_digest: "other".into(), ..c };
    let z = other(in_episode(completed("z", 1_000), 1, false));
    let open = EpisodeRecord { args_digest: "other".into(), ..episode(1, "z") };
    commit(&ledger, LedgerWrite::new().call(z).attempt(attempt("z", 0, 0, AttemptState::Unknown)).episode(EpisodeOp::Open(open.clone())));
    commit(&ledger, LedgerWrite::new().episode(EpisodeOp::Close { episode: open.id(), at_ms: 1_100 }));
    // Episode 2 of the refund: open (its caller has not heard).
    commit(&ledger, LedgerWrite::new().call(in_episode(call("s", "w"), 2, false)).episode(EpisodeOp::Open(episode(2, "w"))));

    let before = ledger.stats().unwrap();
    assert_eq!((before.total_calls(), before.retiring, before.tombstones), (7, 4, 0), "{before:?}");

    let report = ledger.prune(5_000, 10_000).unwrap();
    assert_eq!((report.examined, report.calls, report.attempts, report.episodes, report.kept), (3, 3, 2, 1, 1), "{report:?}");
    for gone in ["old", "x", "y"] {
        assert_eq!(ledger.call("s", gone).unwrap(), None, "{gone} is pruned");
        assert_eq!(ledger.expired("s", gone).unwrap(), Some(10_000), "{gone} leaves a tombstone");
    }
    assert_eq!(ledger.attempt("tg1_old_0_0").unwrap(), None);
    assert!(ledger.attempts_in_state(AttemptState::Succeeded).unwrap().iter().all(|a| a.call_id == "recent"), "the index went with them");
    assert_eq!(ledger.attempts_of_call("s", "x").unwrap(), vec![]);
    assert_eq!(ledger.episode("s", "refund", "d", Some(1)).unwrap(), None, "the closed episode is gone");
    for kept in ["recent", "running", "z", "w"] {
        assert!(ledger.call("s", kept).unwrap().is_some(), "{kept} is kept");
        assert_eq!(ledger.expired("s", kept).unwrap(), None);
    }
    assert!(ledger.episode("s", "refund", "other", Some(1)).unwrap().is_some(), "an episode with an unknown attempt stays");
    assert_eq!(ledger.episode("s", "refund", "d", None).unwrap().map(|e| e.episode), Some(2), "the open episode stays the latest");
    assert_eq!(ledger.expired("other-session", "old").unwrap(), None, "a tombstone names its session");

    let after = ledger.stats().unwrap();
    assert_eq!((after.total_calls(), after.retiring, after.tombstones, after.episodes_open, after.episodes_closed), (4, 2, 3, 1, 1), "{after:?}");
    // Again: only the kept unit is looked at; nothing else changes.
    let again = ledger.prune(5_000, 11_000).unwrap();
    assert_eq!((again.examined, again.calls, again.kept), (1, 0, 1), "{again:?}");
    assert_eq!(ledger.expired("s", "old").unwrap(), Some(10_000), "the first time stays");
    // Later, the recent call's turn.
    assert_eq!(ledger.prune(9_500, 12_000).unwrap().calls, 1);
    assert_eq!(ledger.expired("s", "recent").unwrap(), Some(12_000));
}

pub(super) fn old_budget_uses_are_forgotten(store: &dyn super::Store) {
    let ledger = store.open();
    let now = 100 * 3_600_000;
    for (at, id) in [(now - 3 * 3_600_000, "c1"), (now - 30 * 60_000, "c2")] {
        let charge = Charge { scope: "a".into(), max: 10, since_ms: at - 3_600_000, at_ms: at, call_id: id.into(), what: "budget a".into() };
        commit(&ledger, LedgerWrite::new().call(call("s", id)).charge(charge));
    }
    assert_eq!(ledger.prune(0, now).unwrap().budget_uses, 1, "uses older than two hours go");
    assert_eq!(ledger.stats().unwrap().budget_uses, 1);
}

pub(super) fn limit_uses_are_forgotten_once_their_window_has_ended(store: &dyn super::Store) {
    let ledger = store.open();
    let now = 100 * 3_600_000;
    let day = 86_400_000;
    // A use of yesterday's window (ended more than two hours ago), and one of today's.
    let old = Spend { until_ms: now - 3 * 3_600_000, ..super::limits::spend_of("a", 10, now - day - 3 * 3_600_000, "c1", 4) };
    let today = Spend { until_ms: now + day, ..super::limits::spend_of("a", 10, now - 3_600_000, "c2", 4) };
    for s in [old, today] {
        let id = s.call_id.clone();
        commit(&ledger, LedgerWrite::new().call(call("s", &id)).spend(s));
    }
    assert_eq!(ledger.prune(0, now).unwrap().budget_uses, 1, "only the use whose window ended goes");
    // Today's use still counts: 4 + 7 passes 10.
    let more = Spend { until_ms: now + day, ..super::limits::spend_of("a", 10, now - 3_600_000, "c3", 7) };
    assert!(ledger.commit(LedgerWrite::new().spend(more), Durability::Buffered).unwrap_err().is_over_limit());
}
