//! Budgets and spending limits in the ledger: uses counted or summed in
//! their window, the one that passes refused whole, and uses given back.

use super::{Store, attempt, call, claimed};
use crate::records::{AttemptRecord, AttemptState, CallRecord, StoredBody};
use crate::{Charge, Durability, LedgerWrite, Release, Spend};

pub(super) fn budgets_count_uses_in_their_window_and_refuse_the_one_too_many(store: &dyn Store) {
    let ledger = store.open();
    let charge = |scope: &str, at_ms: u64, call_id: &str| Charge {
        scope: scope.into(),
        max: 2,
        since_ms: at_ms.saturating_sub(100),
        at_ms,
        call_id: call_id.into(),
        what: format!("budget {scope}"),
    };
    let spend = |c: Charge| ledger.commit(LedgerWrite::new().call(call("s", &c.call_id)).charge(c), Durability::Buffered);
    spend(charge("a", 1_000, "c1")).unwrap();
    spend(charge("a", 1_050, "c2")).unwrap();
    let refused = spend(charge("a", 1_060, "c3")).unwrap_err();
    assert!(refused.is_refused() && refused.message().contains("budget a is spent"), "{refused}");
    assert_eq!(ledger.call("s", "c3").unwrap(), None, "nothing of a refused write applies");
    spend(charge("b", 1_060, "c4")).expect("another budget");
    // "a" = [1_000, 1_050]; at 1_120 the window starts at 1_020: one use left.
    spend(charge("a", 1_120, "c5")).expect("the oldest use left the window");
    assert!(spend(charge("a", 1_130, "c6")).unwrap_err().is_refused());
    // A scope that is a prefix of another is another budget.
    spend(charge("a-longer", 1_130, "c7")).unwrap();
}

/// A spend of `amount` from limit `scope` (at most `max` in the window that
/// starts at `since_ms`, when it is spent, and lasts 1 s), by call `call_id`.
pub(crate) fn spend_of(scope: &str, max: u64, since_ms: u64, call_id: &str, amount: u64) -> Spend {
    Spend { scope: scope.into(), max, until_ms: since_ms + 1_000, at_ms: since_ms, call_id: call_id.into(), amount, what: format!("limit {scope}") }
}

pub(super) fn limits_sum_uses_in_their_window_refuse_the_one_that_passes_and_take_back_a_release(store: &dyn Store) {
    let ledger = store.open();
    let spend = |s: Spend| ledger.commit(LedgerWrite::new().call(call("s", &s.call_id)).spend(s), Durability::Buffered);
    // 5,000 a window from 1_000: 3,000 + 1,500 fit; 600 more would pass it.
    spend(spend_of("refunds/t1", 5_000, 1_000, "c1", 3_000)).unwrap();
    spend(spend_of("refunds/t1", 5_000, 1_000, "c2", 1_500)).unwrap();
    let refused = spend(spend_of("refunds/t1", 5_000, 1_000, "c3", 600)).unwrap_err();
    assert!(refused.is_over_limit() && !refused.is_refused(), "a limit's refusal is its own kind: {refused}");
    let message = refused.message();
    assert!(
        message.contains("limit refunds/t1") && message.contains("4500 of 5000") && message.contains("would add 600"),
        "names the limit, the use, the addition: {message}"
    );
    assert_eq!(ledger.call("s", "c3").unwrap(), None, "nothing of a refused write applies");
    // Exactly to the edge is allowed; one more is not.
    spend(spend_of("refunds/t1", 5_000, 1_000, "c4", 500)).expect("to the edge exactly");
    assert!(spend(spend_of("refunds/t1", 5_000, 1_000, "c5", 1)).unwrap_err().is_over_limit());
    // Another tenant's scope, and a scope that is a prefix of another, are other limits.
    spend(spend_of("refunds/t2", 5_000, 1_000, "c6", 5_000)).expect("another tenant");
    spend(spend_of("refunds/t", 5_000, 1_000, "c7", 5_000)).expect("a prefix is another scope");
    // The next window starts empty: uses before its start do not count.
    spend(spend_of("refunds/t1", 5_000, 2_000, "c8", 5_000)).expect("a new window");
    // A release gives its amount back (its call never took effect).
    let back = Release { scope: "refunds/t1".into(), at_ms: 2_000, call_id: "c8".into() };
    assert!(spend(spend_of("refunds/t1", 5_000, 2_000, "c9", 1)).unwrap_err().is_over_limit());
    ledger.commit(LedgerWrite::new().release(back), Durability::Buffered).unwrap();
    spend(spend_of("refunds/t1", 5_000, 2_000, "c9", 5_000)).expect("the released use no longer counts");
    // Spending nothing spends nothing.
    spend(spend_of("refunds/t1", 5_000, 2_000, "c10", 0)).expect("an amount of 0 is no use");
    // What the operator sees at 2_500: the current window's one use of t1 (the first window has ended).
    let t1: Vec<(String, u64)> = ledger.spent(2_500).unwrap().into_iter().filter(|u| u.scope == "refunds/t1").map(|u| (u.call_id, u.amount)).collect();
    assert_eq!(t1, [("c9".to_string(), 5_000)]);
}

/// A call whose sends all settled without effect (refused, or never sent
/// by an operator's word) gives back what it spent, from its record alone;
/// one with an effect, a send still unsettled, no send, a completed one, or
/// one another host holds a claim on keeps counting.
pub(super) fn a_call_whose_sends_never_took_effect_gives_back_what_it_spent(store: &dyn Store) {
    let ledger = store.open();
    let spending = |call_id: &str, amount: u64, record: CallRecord| {
        let record = CallRecord { spent: vec!["refunds/t1".into()], ..record };
        ledger.commit(LedgerWrite::new().call(record).spend(Spend { at_ms: 1, ..spend_of("refunds/t1", 20_000, 0, call_id, amount) }), Durability::Synced)
    };
    let refused = |call_id: &str| AttemptRecord {
        response: Some(crate::records::StoredResponse { status: 400, headers: vec![], body: StoredBody::from_bytes(b"no") }),
        ..attempt(call_id, 0, 0, AttemptState::Failed)
    };
    spending("refused", 1_000, call("s", "refused")).unwrap();
    spending("made", 2_000, call("s", "made")).unwrap();
    spending("unsettled", 3_000, call("s", "unsettled")).unwrap();
    spending("nothing-sent-yet", 4_000, call("s", "nothing-sent-yet")).unwrap();
    spending("claimed", 5_000, claimed("claimed", "host-b", crate::records::now_ms() + 3_600_000)).unwrap();
    let attempts = [
        refused("refused"),
        attempt("made", 0, 0, AttemptState::Succeeded),
        refused("unsettled"),
        attempt("unsettled", 1, 0, AttemptState::Unknown),
        refused("claimed"),
    ];
    ledger.commit(attempts.into_iter().fold(LedgerWrite::new(), LedgerWrite::attempt), Durability::Synced).unwrap();
    let gave_back = |call_id: &str, owner: Option<&str>| ledger.give_back_if_never_took_effect("s", call_id, owner).unwrap();
    assert!(gave_back("refused", None), "refused: never took effect");
    assert!(!gave_back("refused", None), "once");
    assert!(ledger.call("s", "refused").unwrap().unwrap().released);
    for kept in ["made", "unsettled", "nothing-sent-yet"] {
        assert!(!gave_back(kept, None), "{kept} keeps counting");
    }
    assert!(!gave_back("claimed", None), "another host runs it: its run decides");
    assert!(!gave_back("claimed", Some("host-a")), "another host runs it: its run decides");
    let used = |call_id: &str| ledger.spent(2).unwrap().into_iter().any(|u| u.call_id == call_id);
    assert!(!used("refused") && used("made") && used("unsettled") && used("nothing-sent-yet") && used("claimed"));
    assert!(gave_back("claimed", Some("host-b")), "by the host holding its claim");
    assert!(!used("claimed"));
}
