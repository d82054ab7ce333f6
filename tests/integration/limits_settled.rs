//! What counts against a spending limit when a call's outcome is unknown
//! (`docs/policy.md`, "Limits"), through the real binary and counted at the
//! sandbox: a refund killed mid-call keeps counting while its outcome is
//! unknown; settled as made, it counts on; settled as never having happened
//! (the provider refuses recovery's re-send, or an operator says it was
//! never sent), its amount is given back — and a later run of that same
//! call spends again before it may send.

use crate::common::stdout_json;
use crate::payments::Downstream;
use crate::world::{PI, SESSION, World, torture_downstream, wait_for};
use serde_json::json;
use std::time::Duration;
use toolguard::ledger::AttemptState;
use toolguard_sandbox::Fault;

/// At most 2,000 cents a day per session.
fn limited() -> World {
    let limit = r#"limits = [{ sum = "/amount_cents", max = 2000, per = "session", window = "day" }]"#;
    World::with(Downstream { refund_policy: Some(limit), ..torture_downstream() })
}

/// A refund of `amount` of another payment (whose refunds the provider makes), under `call_id`.
fn refund_other(w: &World, call_id: &str, amount: u64) -> (bool, serde_json::Value) {
    let (ok, out, _) = w.call(call_id, "refund", &json!({ "payment_intent": "pi_other", "amount_cents": amount, "reason": "duplicate" }));
    (ok, out)
}

fn over_the_limit(out: &serde_json::Value) -> bool {
    out["kind"] == "denied" && out["message"].as_str().is_some_and(|m| m.contains("over a spending limit"))
}

#[test]
fn a_refund_killed_mid_call_counts_while_unknown_and_on_once_found_made() {
    let w = limited();
    w.sandbox.add_payment_intent("pi_other", 1_000_000);
    w.sandbox.inject(Fault::PauseAfterCommit);
    let mut child = w.spawn_refund("c1", 1_500, None);
    assert!(wait_for(Duration::from_secs(20), || w.sandbox.paused() == 1), "the provider committed and holds its answer");
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    w.sandbox.release();
    assert_eq!(w.ledger().attempts_in_state(AttemptState::Pending).unwrap().len(), 1, "its outcome is unknown to the host");
    // The next process's start-up pass re-sends it and is turned away on
    // every try, and the provider's list does not show the refund yet: still unknown.
    for _ in 0..6 {
        w.sandbox.inject(Fault::RateLimit429);
    }
    w.sandbox.set_list_lag(Duration::from_secs(3_600));
    let (ok, out) = refund_other(&w, "c2", 600);
    assert!(!ok && over_the_limit(&out), "an unknown outcome counts (1,500 + 600 > 2,000): {out}");
    w.sandbox.clear_faults();
    w.sandbox.set_list_lag(Duration::ZERO);
    let ledger = w.ledger();
    let mut unsettled = ledger.attempts_in_state(AttemptState::Pending).unwrap();
    unsettled.extend(ledger.attempts_in_state(AttemptState::Unknown).unwrap());
    assert_eq!(unsettled.len(), 1, "it was still unsettled when c2 was refused: {:?}", ledger.attempts().unwrap());
    drop(ledger);
    // Recovery finds it made (the provider replays its answer to the same key): it counts on.
    let out = w.toolguard(&["recover"]);
    assert_eq!(stdout_json(&out)["settled"].as_array().map(Vec::len), Some(1), "{}", String::from_utf8_lossy(&out.stdout));
    let (ok, out) = refund_other(&w, "c3", 600);
    assert!(!ok && over_the_limit(&out), "a made refund counts: {out}");
    assert!(refund_other(&w, "c4", 500).0, "to the edge");
    let amounts: Vec<u64> = w.sandbox.refunds().iter().map(|r| r.amount).collect();
    assert_eq!(amounts, [1_500, 500], "the provider made the killed refund once and the one under the limit; nothing of the refused ones");
}

/// How a crashed refund's send is settled as never having happened.
#[derive(Debug, Clone, Copy)]
enum NeverHappened {
    /// The provider refuses recovery's re-send (the payment can no longer cover it).
    ProviderRefusesTheResend,
    /// An operator checked the provider and says it was never sent.
    OperatorSaysNotSent,
}

#[test]
fn a_crashed_refund_settled_as_never_made_gives_its_amount_back_and_spends_again_if_it_runs_again() {
    for how in [NeverHappened::ProviderRefusesTheResend, NeverHappened::OperatorSaysNotSent] {
        let w = limited();
        w.sandbox.add_payment_intent("pi_other", 1_000_000);
        // Dies after its attempt is durable and before anything leaves, as a kill -9 there would.
        let out = w.spawn_refund("c1", 1_500, Some("after-attempt-write")).wait_with_output().unwrap();
        assert!(!out.status.success(), "{how:?}: it aborted at the failpoint");
        let key = w.ledger().attempts_in_state(AttemptState::Pending).unwrap().remove(0).key;
        match how {
            NeverHappened::ProviderRefusesTheResend => {
                // The payment is now worth 1 cent: the re-send with the same key is refused (400).
                w.sandbox.add_payment_intent(PI, 1);
                let out = w.toolguard(&["recover"]);
                assert_eq!(stdout_json(&out)["settled"].as_array().map(Vec::len), Some(1), "{how:?}: {}", String::from_utf8_lossy(&out.stdout));
            }
            NeverHappened::OperatorSaysNotSent => {
                let out = w.toolguard(&["ledger", "resolve", &key, "--not-sent", "--note", "checked the dashboard"]);
                assert!(out.status.success(), "{how:?}: {}", String::from_utf8_lossy(&out.stdout));
            }
        }
        let record = w.ledger().call(SESSION, "c1").unwrap().unwrap();
        assert!(record.released, "{how:?}: its use was given back: {record:?}");
        let (ok, out) = refund_other(&w, "c2", 2_000);
        assert!(ok, "{how:?}: the whole limit is free again: {out}");
        // The crashed call resumed: it spends again before it may send, and the limit is full.
        w.sandbox.add_payment_intent(PI, 1_000_000);
        let (ok, out) = w.refund("c1", 1_500);
        assert!(!ok && over_the_limit(&out), "{how:?}: a released call that runs again spends again: {out}");
        assert_eq!(w.refunds_of(1_500), 0, "{how:?}: the crashed refund was never made");
        assert_eq!(w.refunds_of(2_000), 1, "{how:?}");
        assert!(w.posts_of(1_500).len() <= 1, "{how:?}: at most recovery's refused re-send reached the provider");
    }
}
