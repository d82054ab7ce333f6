//! Reference edge cases 10–14 and 19–30 (`idempotency-semantics.md`, §3):
//! unknown outcomes are resolved — re-sent with the same key, reconciled,
//! held, or left to an operator — never guessed. Cases 8 and 9 (real
//! crashes) are in `crash.rs`. Every test counts refunds at the sandbox.

use crate::payments::{Downstream, HEADER_ONLY, Harness, PI, harness, refund_args, rogue_args};
use serde_json::json;
use std::time::Duration;
use toolguard::ErrorKind;
use toolguard::ledger::{AttemptState, Resolution};
use toolguard_sandbox::{Fault, Mode};

/// Reconciliation cannot find a committed refund while the listing lags this long.
const LONG_LAG: Duration = Duration::from_secs(60);

/// A host that treats keys as already expired at the provider (retention
/// 0 h), and on it refund `c1` (500 cents): committed, answered too late,
/// not listed yet — unknown, and never to be re-sent.
async fn unknown_past_retention() -> Harness {
    let h = harness(Downstream { retention_hours: 0, ..Downstream::default() }).await;
    h.sandbox.set_list_lag(LONG_LAG);
    h.sandbox.inject(Fault::DelayAfterCommit { ms: 3_000 });
    assert_eq!(h.refund("c1", 500).await.unwrap_err().kind, ErrorKind::OutcomeUnknown);
    h
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e10_a_cut_off_invocation_is_unknown_and_its_retry_uses_the_same_key() {
    // The plugin's wall clock runs out while the provider is still executing.
    let d = Downstream { wall_ms: 1_500, timeout_ms: 5_000, backoff_ms: 100, max_retries: 8, ..Downstream::default() };
    let h = harness(d).await;
    h.sandbox.inject(Fault::DelayBeforeCommit { ms: 2_000 });
    let err = h.refund("c1", 500).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::OutcomeUnknown, "a send cut off mid-flight is not a limit error: {err}");
    assert_eq!(err.detail.as_ref().unwrap()["state"], "pending");
    // The next executor finds the attempt pending and re-sends the same key:
    // 409 while the first is still executing, then its stored answer.
    let out = h.refund("c1", 500).await.expect("settled by the provider's replay");
    assert_eq!(h.refunds(), 1);
    let posts = h.posts();
    assert!(posts.len() >= 2);
    assert!(posts.iter().all(|p| p.idempotency_key == posts[0].idempotency_key), "one key for all executors");
    assert_eq!(out.value["refund_id"], h.sandbox.refunds()[0].id.as_str());
}

#[tokio::test]
async fn e11_e13_a_stored_500_stays_unknown_and_only_an_operator_mints_a_new_key() {
    let h = harness(Downstream::default()).await;
    h.sandbox.inject(Fault::Stored500 { should_retry: None });
    assert_eq!(h.refund("c1", 500).await.unwrap_err().kind, ErrorKind::OutcomeUnknown);
    // e11: the replay gets the identical stored 500; reconciliation finds nothing; no fresh key.
    assert_eq!(h.refund("c1", 500).await.unwrap_err().kind, ErrorKind::OutcomeUnknown);
    let posts = h.posts();
    assert_eq!(posts.len(), 2);
    assert_eq!(posts[0].idempotency_key, posts[1].idempotency_key, "no fresh key");
    assert_eq!(h.refunds(), 0);
    let old_key = posts[0].idempotency_key.clone().unwrap();
    assert!(h.sandbox.requests().iter().any(|r| r.method == "GET"), "it reconciled by listing");

    // e13: the operator declares it never sent; the next run mints a new key.
    let resolved = h.ledger().resolve_not_sent(&old_key, "checked the provider's dashboard").unwrap();
    assert_eq!(resolved.resolution, Some(Resolution::OperatorNotSent));
    let out = h.refund("c1", 500).await.expect("the operator's resolution lets it run");
    assert_eq!(h.refunds(), 1);
    let new_key = h.posts().last().unwrap().idempotency_key.clone().unwrap();
    assert_ne!(new_key, old_key, "a new key, minted by the operator's action");
    let attempt = h.ledger().attempt(&new_key).unwrap().unwrap();
    assert_eq!((attempt.step, attempt.generation), (0, 1));
    assert_eq!(out.value["amount_cents"], 500);
}

#[tokio::test]
async fn e12_a_500_with_a_hidden_commit_is_found_by_reconciliation() {
    let h = harness(Downstream::default()).await;
    h.sandbox.inject(Fault::HiddenCommit500);
    let out = h.refund("c1", 500).await.expect("reconciled before answering");
    assert_eq!(out.value["status"], "succeeded");
    assert_eq!(h.refunds(), 1);
    assert_eq!(h.posts().len(), 1);
    let attempt = h.ledger().attempts_of_call("s1", "c1").unwrap().remove(0);
    assert_eq!((attempt.state, attempt.resolution), (AttemptState::Succeeded, Some(Resolution::ReconciledFound)));
}

#[tokio::test]
async fn e14_past_the_providers_key_retention_it_reconciles_and_never_resends() {
    let h = unknown_past_retention().await;
    h.sandbox.advance_clock(Duration::from_secs(25 * 3600));
    h.sandbox.set_list_lag(Duration::ZERO);
    let out = h.refund("c1", 500).await.expect("found by reconciliation");
    assert_eq!(h.posts().len(), 1, "no POST after the window");
    assert_eq!(h.refunds(), 1);
    assert_eq!(out.value["refund_id"], h.sandbox.refunds()[0].id.as_str());
}

#[tokio::test]
async fn e14_not_found_past_retention_needs_an_operator() {
    let h = harness(Downstream { retention_hours: 0, ..Downstream::default() }).await;
    h.sandbox.inject(Fault::DropBeforeCommit);
    assert_eq!(h.refund("c1", 500).await.unwrap_err().kind, ErrorKind::OutcomeUnknown);
    let err = h.refund("c1", 500).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::OutcomeUnknown);
    assert!(err.message.contains("ledger resolve"), "tells the model an operator must act: {}", err.message);
    assert_eq!(h.posts().len(), 1, "not re-sent past the window");
    let key = h.posts()[0].idempotency_key.clone().unwrap();
    let attempt = h.ledger().attempt(&key).unwrap().unwrap();
    assert_eq!(attempt.resolution, Some(Resolution::ReconciledNotFound));
    h.ledger().resolve_not_sent(&key, "never made").unwrap();
    h.refund("c1", 500).await.unwrap();
    assert_eq!(h.refunds(), 1);
}

#[tokio::test]
async fn e19_a_full_refund_resent_under_a_new_key_is_never_taken_for_success() {
    let h = harness(Downstream::default()).await;
    h.sandbox.add_payment_intent("pi_full", 1_000);
    h.sandbox.set_list_lag(LONG_LAG);
    h.sandbox.inject(Fault::DelayAfterCommit { ms: 3_000 });
    let args = r#"{"payment_intent":"pi_full","amount_cents":1000,"reason":"duplicate"}"#;
    assert_eq!(h.call("c1", "refund", args).await.unwrap_err().kind, ErrorKind::OutcomeUnknown);
    // An operator wrongly declares it unsent: the next run uses a new key.
    let key = h.posts()[0].idempotency_key.clone().unwrap();
    h.ledger().resolve_not_sent(&key, "mistaken").unwrap();
    let err = h.call("c1", "refund", args).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::ToolFailed, "not a success: {err}");
    assert!(err.message.contains("already fully refunded") && err.message.contains("refund_status"), "{}", err.message);
    assert_eq!(h.refunds(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e20_hold_rule_a_blind_repeat_is_held_and_never_refunds_twice() {
    let h = harness(Downstream::default()).await;
    h.sandbox.set_list_lag(LONG_LAG);
    h.sandbox.inject(Fault::DelayAfterCommit { ms: 3_000 });
    assert_eq!(h.refund("c1", 500).await.unwrap_err().kind, ErrorKind::OutcomeUnknown);
    let held = h.refund("c2", 500).await.unwrap_err();
    assert_eq!(held.kind, ErrorKind::Held, "{held}");
    let detail = held.detail.as_ref().unwrap();
    assert_eq!(detail["earlier_call_id"], "c1");
    // Before answering, the host resolved c1 itself: the same key, re-sent; the provider replayed.
    assert_eq!(detail["earlier_outcome"]["sends"][0]["status"], 200, "{detail}");
    let posts = h.posts();
    assert!(posts.iter().all(|p| p.idempotency_key == posts[0].idempotency_key), "only c1's key went out");
    assert_eq!(h.refunds(), 1);
    // Other arguments are not held; neither is a read.
    h.refund("c3", 501).await.unwrap();
    h.call("c4", "refund_status", &format!(r#"{{"payment_intent":"{PI}"}}"#)).await.unwrap();
    // The original's retry returns its refund; told, a deliberate repeat under a new id runs.
    let original = h.refund("c1", 500).await.unwrap();
    assert_eq!(original.value["refund_id"], h.sandbox.refunds()[0].id.as_str());
    let again = h.refund("c5", 500).await.expect("a legitimate repeat");
    assert_eq!(again.value["amount_cents"], 500);
    assert_eq!(h.refunds(), 3);
}

#[tokio::test]
async fn e21_e23_non_terminal_refund_statuses_are_reported_not_re_posted() {
    let h = harness(Downstream::default()).await;
    h.sandbox.add_payment_intent_with_status("pi_slow", 1_000, "pending");
    h.sandbox.add_payment_intent_with_status("pi_3ds", 1_000, "requires_action");
    let pending = h.call("c1", "refund", r#"{"payment_intent":"pi_slow","amount_cents":100,"reason":"duplicate"}"#).await.unwrap();
    assert_eq!(pending.value["status"], "pending");
    let id = pending.value["refund_id"].as_str().unwrap().to_string();
    assert!(h.sandbox.set_refund_status(&id, "succeeded"));
    let status = h.call("c2", "refund_status", r#"{"payment_intent":"pi_slow"}"#).await.unwrap();
    assert_eq!(status.value["refunds"][0]["status"], "succeeded", "e21: a later status query shows it");
    let replay = h.call("c1", "refund", r#"{"payment_intent":"pi_slow","amount_cents":100,"reason":"duplicate"}"#).await.unwrap();
    assert_eq!(replay.value, pending.value, "e21: no re-POST");
    let action = h.call("c3", "refund", r#"{"payment_intent":"pi_3ds","amount_cents":100,"reason":"duplicate"}"#).await.unwrap();
    assert_eq!(action.value["status"], "requires_action", "e23: non-terminal, reported as such");
    h.call("c3", "refund", r#"{"payment_intent":"pi_3ds","amount_cents":100,"reason":"duplicate"}"#).await.unwrap();
    assert_eq!(h.posts().len(), 2);
    assert_eq!(h.refunds(), 2);
}

#[tokio::test]
async fn e22_a_refund_that_later_fails_shows_in_status_while_the_replay_keeps_the_original() {
    let h = harness(Downstream::default()).await;
    let first = h.refund("c1", 500).await.unwrap();
    assert!(h.sandbox.set_refund_status(first.value["refund_id"].as_str().unwrap(), "failed"));
    let status = h.call("c2", "refund_status", &format!(r#"{{"payment_intent":"{PI}"}}"#)).await.unwrap();
    assert_eq!(status.value["refunds"][0]["status"], "failed");
    assert_eq!(status.value["refunded_cents"], 0);
    assert_eq!(h.refund("c1", 500).await.unwrap().value, first.value);
    assert_eq!(h.posts().len(), 1);
}

#[tokio::test]
async fn e24_each_endpoint_and_step_gets_its_own_key() {
    let h = harness(Downstream::default()).await;
    h.sandbox.add_payment_intent_with_status("pi_slow", 1_000, "pending");
    let created = h.call("c1", "refund", r#"{"payment_intent":"pi_slow","amount_cents":100,"reason":"duplicate"}"#).await.unwrap();
    let id = created.value["refund_id"].as_str().unwrap();
    let cancel = json!([{ "method": "POST", "url": format!("{}/v1/refunds/{id}/cancel", h.sandbox.url()) }]);
    let out = h.call("c2", "send_all", &rogue_args(cancel, false)).await.unwrap();
    assert_eq!(out.value[0]["status"], 200, "{}", out.value);
    let keys: Vec<_> = h.posts().into_iter().map(|p| p.idempotency_key.unwrap()).collect();
    assert_eq!(keys.len(), 2);
    assert_ne!(keys[0], keys[1], "namespaced by tool call, tool and step: never shared across endpoints");
    assert_eq!(h.sandbox.refunds()[0].status, "canceled");
}

#[tokio::test]
async fn e25_a_non_deterministic_plugin_is_a_conflict_even_where_the_provider_would_not_notice() {
    // Adyen returns the first response for the same key whatever the payload.
    let d = Downstream { mode: Mode::Adyen, key: HEADER_ONLY, ..Downstream::default() };
    let h = harness(d).await;
    h.sandbox.inject(Fault::DelayAfterCommit { ms: 3_000 });
    let request = json!([{ "method": "POST", "url": format!("{}/v1/refunds", h.sandbox.url()),
        "headers": { "Content-Type": "application/x-www-form-urlencoded" }, "body": format!("payment_intent={PI}&amount=100") }]);
    let args = rogue_args(request, false);
    assert_eq!(h.call("c1", "send_with_nonce", &args).await.unwrap_err().kind, ErrorKind::OutcomeUnknown);
    let posts = h.posts().len();
    let err = h.call("c1", "send_with_nonce", &args).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::Conflict, "the local fingerprint blocked it: {err}");
    assert!(err.message.contains("not deterministic"), "{}", err.message);
    assert_eq!(h.posts().len(), posts, "nothing sent");
    assert_eq!(h.refunds(), 1);
    // Once recovery has settled the first run's refund, the conflict names it: it took effect.
    tokio::time::sleep(std::time::Duration::from_millis(3_500)).await;
    h.rt.recover().await.unwrap();
    let err = h.call("c1", "send_with_nonce", &args).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::Conflict, "{err}");
    assert!(err.message.contains("an earlier run of this tool call made POST"), "{}", err.message);
    assert_eq!(err.detail.unwrap()["effects"][0]["earlier_run"], true);
    assert_eq!(h.refunds(), 1);
}

#[tokio::test]
async fn resume_replays_settled_steps_and_re_drives_only_the_unsettled_one() {
    let h = harness(Downstream { key: HEADER_ONLY, ..Downstream::default() }).await;
    let form = json!({ "Content-Type": "application/x-www-form-urlencoded" });
    let req = |amount: u64| json!({ "method": "POST", "url": format!("{}/v1/refunds", h.sandbox.url()), "headers": form, "body": format!("payment_intent={PI}&amount={amount}") });
    let args = rogue_args(json!([req(100), req(200)]), false);
    h.sandbox.inject(Fault::Pass); // step 0: fine
    h.sandbox.inject(Fault::DelayAfterCommit { ms: 3_000 }); // step 1: answer lost
    assert_eq!(h.call("c1", "send_all", &args).await.unwrap_err().kind, ErrorKind::OutcomeUnknown);
    assert_eq!(h.refunds(), 2);
    let before = h.posts();
    let out = h.call("c1", "send_all", &args).await.unwrap();
    let after = h.posts();
    assert_eq!(after.len(), before.len() + 1, "only the unsettled step went out again");
    assert_eq!(after.last().unwrap().idempotency_key, before.last().unwrap().idempotency_key, "with its own key");
    assert_eq!(out.value.as_array().unwrap().len(), 2);
    assert_eq!(h.refunds(), 2);
}

#[tokio::test]
async fn e26_adyen_transient_704_is_retried_and_a_plain_4xx_is_final() {
    let h = harness(Downstream { mode: Mode::Adyen, ..Downstream::default() }).await;
    h.sandbox.inject(Fault::InFlight409); // Adyen: 422 code 704 with transient-error: true
    h.refund("c1", 500).await.unwrap();
    assert_eq!(h.refunds(), 1);
    assert_eq!(h.posts().len(), 2);
    let err = h.call("c2", "refund", &refund_args(1_000_000)).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::ToolFailed);
    assert_eq!(h.posts().len(), 3, "a 4xx without transient-error is not retried");
}

#[tokio::test]
async fn e27_adyen_503_703_is_retried_and_the_key_is_never_dropped() {
    let h = harness(Downstream { mode: Mode::Adyen, ..Downstream::default() }).await;
    h.sandbox.inject(Fault::StoreDown503);
    h.sandbox.inject(Fault::StoreDown503);
    h.refund("c1", 500).await.unwrap();
    let posts = h.posts();
    assert_eq!(posts.len(), 3);
    assert!(posts.iter().all(|p| p.idempotency_key.is_some() && p.idempotency_key == posts[0].idempotency_key));
    assert_eq!(h.refunds(), 1);
}

#[tokio::test]
async fn e30_a_lagging_listing_is_retried_within_the_reconcile_window_without_resending() {
    let h = harness(Downstream { reconcile_ms: 2_000, ..Downstream::default() }).await;
    h.sandbox.set_list_lag(Duration::from_millis(400));
    h.sandbox.inject(Fault::HiddenCommit500);
    let out = h.refund("c1", 500).await.expect("found once the listing caught up");
    assert_eq!(out.value["status"], "succeeded");
    let lists = h.sandbox.requests().iter().filter(|r| r.method == "GET").count();
    assert!(lists >= 2, "listed more than once: {lists}");
    assert_eq!(h.posts().len(), 1, "no resend");
    assert_eq!(h.refunds(), 1);
}

#[tokio::test]
async fn a_refund_behind_a_page_of_newer_ones_is_still_found_by_reconciliation() {
    // The first look finds nothing (the listing lags) and the outcome stays unknown …
    let h = harness(Downstream::default()).await;
    h.sandbox.set_list_lag(LONG_LAG);
    h.sandbox.inject(Fault::HiddenCommit500);
    assert_eq!(h.refund("c1", 500).await.unwrap_err().kind, ErrorKind::OutcomeUnknown);
    // … and by the next look 120 newer refunds of the same payment list before it:
    // a page of 100 alone would call the committed refund "not found".
    let newer: Vec<u64> = (1..=120).collect();
    for amount in &newer {
        h.refund(&format!("n{amount}"), *amount).await.unwrap();
    }
    h.sandbox.set_list_lag(Duration::ZERO);
    let out = h.refund("c1", 500).await.expect("found on the listing's second page");
    assert_eq!(out.value["refund_id"], h.sandbox.refunds()[0].id.as_str());
    assert_eq!(h.refunds(), 121, "found, never made again");
    let attempt = h.ledger().attempts_of_call("s1", "c1").unwrap().remove(0);
    assert_eq!((attempt.state, attempt.resolution), (AttemptState::Succeeded, Some(Resolution::ReconciledFound)));
    let pages = h.sandbox.requests().iter().filter(|r| r.method == "GET" && r.query.contains("starting_after")).count();
    assert!(pages >= 1, "it read past the first page");
    // `refund_status` reads every page too: the total is the whole payment's.
    let status = h.call("st", "refund_status", &json!({ "payment_intent": PI }).to_string()).await.unwrap();
    assert_eq!(status.value["refunds"].as_array().unwrap().len(), 121);
    assert_eq!(status.value["refunded_cents"], 500 + newer.iter().sum::<u64>());
}

#[tokio::test]
async fn a_listing_that_cannot_be_read_to_its_end_never_says_not_found() {
    // Past the provider's key retention a "not found" goes to an operator,
    // who may declare the refund never made; a refund behind the first page
    // of a listing that ignores its cursor must stay "can't tell" instead.
    let h = unknown_past_retention().await;
    for amount in 1..=120 {
        h.sandbox.refund_elsewhere(PI, amount);
    }
    h.sandbox.set_list_lag(Duration::ZERO);
    h.sandbox.set_list_ignores_cursor(true);
    let report = h.rt.recover().await.unwrap();
    assert_eq!((report.settled.len(), report.needs_operator.len(), report.unresolved.len()), (0, 0, 1), "{report:?}");
    assert!(report.unresolved[0].1.contains("does not page past"), "{report:?}");
    let attempt = h.ledger().attempts_of_call("s1", "c1").unwrap().remove(0);
    assert_eq!((attempt.state, attempt.resolution), (AttemptState::Unknown, None));
    // Once the listing pages, the refund is found and nothing was sent again.
    h.sandbox.set_list_ignores_cursor(false);
    let report = h.rt.recover().await.unwrap();
    assert_eq!(report.settled.len(), 1, "{report:?}");
    assert_eq!((h.posts().len(), h.refunds()), (1, 121));
}

#[tokio::test]
async fn a_listing_longer_than_a_look_up_reads_is_cant_tell_never_not_found() {
    // 1,600 newer refunds: more pages than the plugin reads in one look-up
    // (15, within the host's budget of 16 outbound calls per invocation).
    let h = unknown_past_retention().await;
    for _ in 0..1_600 {
        assert_eq!(h.sandbox.refund_elsewhere(PI, 1).0, 200);
    }
    h.sandbox.set_list_lag(Duration::ZERO);
    let report = h.rt.recover().await.unwrap();
    assert_eq!((report.settled.len(), report.needs_operator.len(), report.unresolved.len()), (0, 0, 1), "{report:?}");
    assert!(report.unresolved[0].1.contains("more than 1500 refunds"), "{report:?}");
    assert_eq!(h.posts().len(), 1, "nothing re-sent past the provider's retention");
}

#[tokio::test]
async fn a_held_call_gets_the_outcome_reconciliation_found_for_the_earlier_one() {
    // Past retention, so resolution can only come from reconciliation.
    let h = unknown_past_retention().await;
    let held = h.refund("c2", 500).await.unwrap_err();
    assert_eq!(held.kind, ErrorKind::Held);
    assert!(held.detail.as_ref().unwrap()["earlier_outcome"].is_null(), "nothing found yet: {held}");
    assert_eq!(h.posts().len(), 1, "held: no request");
    h.sandbox.set_list_lag(Duration::ZERO);
    let report = h.rt.recover().await.unwrap();
    assert_eq!((report.examined, report.settled.len()), (1, 1), "{report:?}");
    assert_eq!(h.posts().len(), 1, "settled by looking, not by sending");
    // c2 was admitted while c1 was unresolved: it is answered with c1's outcome, now known.
    let answered = h.refund("c2", 500).await.unwrap_err();
    assert_eq!(answered.detail.as_ref().unwrap()["earlier_outcome"]["sends"][0]["status"], 200, "{answered}");
    assert_eq!(h.refunds(), 1);
    h.refund("c3", 500).await.expect("told the outcome, a new call runs");
    assert_eq!(h.refunds(), 2);
}
