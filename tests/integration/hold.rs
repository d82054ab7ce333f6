//! The hold rule (`docs/guard.md`): identical irreversible calls whose
//! lifetimes overlap — from the first one's admission until a definitive
//! outcome of one of them reached the caller — make at most one side effect;
//! a call made after the caller heard a definitive outcome is a new action.
//! In-process hosts against the payments sandbox; every test counts refunds
//! at the provider. (The real binary, the MCP server and fleets: `hold_cli.rs`.)

use crate::payments::{Downstream, HEADER_ONLY, PI, harness, refund_args, rogue_args};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use toolguard::ErrorKind;
use toolguard::ledger::{AttemptState, Reported};
use toolguard_sandbox::Fault;

/// Longer than any test runs: reconciliation by listing cannot see the refund.
const LONG_LAG: Duration = Duration::from_secs(600);

/// The outcome a `held` answer carries, if any.
fn earlier_outcome(e: &toolguard::CallError) -> Option<serde_json::Value> {
    e.detail.as_ref().and_then(|d| d.get("earlier_outcome")).cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeat_after_a_background_resolution_is_held_with_the_real_outcome_and_a_third_call_runs() {
    let h = harness(Downstream::default()).await;
    h.sandbox.set_list_lag(LONG_LAG);
    h.sandbox.inject(Fault::DelayAfterCommit { ms: 2_000 });
    let err = h.refund("k1", 500).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::OutcomeUnknown, "{err}");
    assert_eq!(h.ledger().call("s1", "k1").unwrap().unwrap().reported, Reported::Unknown, "the model was told `unknown`");
    // Start-up recovery, `toolguard recover` and a fleet's takeover all run this pass.
    let report = h.rt.recover().await.unwrap();
    assert_eq!(report.settled.len(), 1, "the same key, replayed by the provider: {report:?}");
    assert_eq!(h.refunds(), 1);

    let posts = h.posts().len();
    let held = h.refund("k1-retry", 500).await.unwrap_err();
    assert_eq!(held.kind, ErrorKind::Held, "{held}");
    let outcome = earlier_outcome(&held).expect("it carries k1's real outcome");
    let refund_id = h.sandbox.refunds()[0].id.clone();
    assert_eq!(outcome["sends"][0]["body"]["id"], refund_id.as_str(), "{outcome}");
    assert_eq!(held.detail.as_ref().unwrap()["earlier_call_id"], "k1");
    assert!(held.message.contains("k1") && held.message.contains(&refund_id) && held.message.contains("Nothing new was sent"), "{}", held.message);
    assert_eq!(h.posts().len(), posts, "nothing sent for the repeat");
    assert_eq!(h.refunds(), 1);
    assert_eq!(h.ledger().call("s1", "k1-retry").unwrap().unwrap().reported, Reported::Definitive);

    // The caller has now heard a definitive outcome: a further identical call is a new action.
    let third = h.refund("k1-third", 500).await.expect("a deliberate second refund runs");
    assert_eq!(third.value["amount_cents"], 500);
    assert_eq!(h.refunds(), 2);
    // And the repeat's own replay keeps its answer.
    let again = h.refund("k1-retry", 500).await.unwrap_err();
    assert_eq!((again.kind, earlier_outcome(&again)), (ErrorKind::Held, Some(outcome)));
    assert_eq!(h.refunds(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blind_repeat_resolves_the_earlier_call_itself_with_its_key_before_answering() {
    let h = harness(Downstream::default()).await;
    h.sandbox.set_list_lag(LONG_LAG);
    h.sandbox.inject(Fault::DelayAfterCommit { ms: 2_000 });
    assert_eq!(h.refund("k1", 500).await.unwrap_err().kind, ErrorKind::OutcomeUnknown);
    let held = h.refund("k2", 500).await.unwrap_err();
    assert_eq!(held.kind, ErrorKind::Held, "{held}");
    assert!(earlier_outcome(&held).is_some(), "k1 was re-sent with its key and the provider replayed: {held}");
    let posts = h.posts();
    assert_eq!(posts.len(), 2, "k1's request and its re-send");
    assert_eq!(posts[0].idempotency_key, posts[1].idempotency_key, "the same key: never a new action");
    assert_eq!(h.refunds(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unresolvable_earlier_call_holds_the_repeat_without_an_outcome_and_its_replay_gets_one_later() {
    let h = harness(Downstream::default()).await;
    // The provider stores a 500 for the key: every re-send replays it.
    h.sandbox.inject(Fault::Stored500 { should_retry: None });
    assert_eq!(h.refund("k1", 500).await.unwrap_err().kind, ErrorKind::OutcomeUnknown);
    let held = h.refund("k2", 500).await.unwrap_err();
    assert_eq!(held.kind, ErrorKind::Held, "{held}");
    assert_eq!(earlier_outcome(&held), None, "nothing is known yet");
    assert_eq!(held.detail.as_ref().unwrap()["earlier_call_id"], "k1");
    assert!(held.message.contains("status first"), "{}", held.message);
    // Other arguments are another action; a read is never held.
    h.refund("k3", 501).await.expect("another action runs");
    h.call("k4", "refund_status", &format!(r#"{{"payment_intent":"{PI}"}}"#)).await.unwrap();
    assert_eq!(h.refunds(), 1);
    // An operator finds k1 was never made; k1's next run makes it (a new key).
    let key = h.posts()[0].idempotency_key.clone().unwrap();
    h.ledger().resolve_not_sent(&key, "not in the provider's dashboard").unwrap();
    let k1 = h.refund("k1", 500).await.expect("k1 runs with its next key");
    assert_eq!(h.refunds(), 2);
    // k2 was admitted while k1 was unresolved: it never runs, it gets k1's outcome.
    let k2 = h.refund("k2", 500).await.unwrap_err();
    assert_eq!(k2.kind, ErrorKind::Held);
    assert_eq!(earlier_outcome(&k2).unwrap()["result"], k1.value);
    assert_eq!(h.refunds(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_definitive_answer_the_caller_never_heard_holds_the_repeat_once() {
    let h = harness(Downstream::default()).await;
    let first = h.call_unheard("k1", "refund", &refund_args(500)).await.unwrap();
    assert_eq!(h.ledger().call("s1", "k1").unwrap().unwrap().reported, Reported::Nothing, "the answer was lost");
    let held = h.refund("k2", 500).await.unwrap_err();
    assert_eq!(held.kind, ErrorKind::Held, "{held}");
    assert_eq!(earlier_outcome(&held).unwrap()["result"], first.value, "k1's result, as the tool returned it");
    assert_eq!(h.refunds(), 1);
    // Told now (through k2): the next identical call is a new action.
    h.refund("k3", 500).await.unwrap();
    assert_eq!(h.refunds(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeat_after_a_definitive_answer_was_heard_runs() {
    let h = harness(Downstream::default()).await;
    h.refund("k1", 500).await.unwrap();
    assert_eq!(h.ledger().call("s1", "k1").unwrap().unwrap().reported, Reported::Definitive);
    h.refund("k2", 500).await.expect("a legitimate second refund");
    assert_eq!(h.refunds(), 2);
    // A declined refund is a definitive answer too.
    let declined = h.refund("k3", 1_000_000).await.unwrap_err();
    assert_eq!(declined.kind, ErrorKind::ToolFailed);
    assert_eq!(h.refund("k4", 1_000_000).await.unwrap_err().kind, ErrorKind::ToolFailed, "asked again: declined again");
    assert_eq!(h.posts().len(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_call_that_sent_nothing_is_answered_with_the_call_that_superseded_it() {
    // k1's only try is refused before the provider (429, no retries): nothing was sent.
    let h = harness(Downstream { max_retries: 0, ..Downstream::default() }).await;
    h.sandbox.inject(Fault::RateLimit429);
    let err = h.refund("t1", 500).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::Transport, "{err}");
    // The model lost t1's id and re-issues: t1 provably sent nothing, so t1-model takes its place.
    let out = h.refund("t1-model", 500).await.expect("t1-model runs");
    assert_eq!(h.refunds(), 1);
    let t1 = h.ledger().call("s1", "t1").unwrap().unwrap();
    assert_eq!(t1.superseded_by.as_deref(), Some("t1-model"));
    // The harness resumes t1 from its checkpoint: it never runs again.
    let resumed = h.refund("t1", 500).await.unwrap_err();
    assert_eq!(resumed.kind, ErrorKind::Held, "{resumed}");
    assert_eq!(earlier_outcome(&resumed).unwrap()["result"], out.value, "t1 is answered with t1-model's outcome");
    assert_eq!(h.refunds(), 1);
    assert_eq!(h.posts().len(), 2, "t1's refused try and t1-model's refund");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_resending_an_unknown_request_in_one_invocation_reuses_its_key() {
    let h = harness(Downstream { key: HEADER_ONLY, ..Downstream::default() }).await;
    h.sandbox.inject(Fault::DelayAfterCommit { ms: 2_000 });
    let request = json!({ "method": "POST", "url": format!("{}/v1/refunds", h.sandbox.url()),
        "headers": { "Content-Type": "application/x-www-form-urlencoded" }, "body": format!("payment_intent={PI}&amount=100") });
    // The plugin swallows `outcome-unknown` and sends the identical request again.
    let out = h.call("c1", "send_all", &rogue_args(json!([request, request]), true)).await.unwrap();
    assert!(out.value[0]["error"].as_str().unwrap().starts_with("outcome-unknown"), "{}", out.value);
    assert_eq!(out.value[1]["status"], 200, "the re-send got the provider's stored answer: {}", out.value);
    assert_eq!(h.refunds(), 1, "one refund");
    let posts = h.posts();
    assert_eq!(posts.len(), 2);
    assert_eq!(posts[0].idempotency_key, posts[1].idempotency_key, "the same key, not a new step's");
    let attempts = h.ledger().attempts_of_call("s1", "c1").unwrap();
    assert_eq!(attempts.len(), 1, "one step");
    assert_eq!(attempts[0].state, AttemptState::Succeeded);
    // A second identical request after a *settled* one is a new step: an intended second effect.
    let out = h.call("c2", "send_all", &rogue_args(json!([request, request]), true)).await.unwrap();
    assert_eq!((out.value[0]["status"].clone(), out.value[1]["status"].clone()), (json!(200), json!(200)));
    assert_eq!(h.refunds(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_identical_calls_make_one_refund_and_the_second_gets_the_firsts_outcome() {
    let h = Arc::new(harness(Downstream { reconcile_ms: 2_000, ..Downstream::default() }).await);
    h.sandbox.inject(Fault::DelayBeforeCommit { ms: 300 });
    let (a, b) = (h.clone(), h.clone());
    let first = tokio::spawn(async move { a.refund("p1", 500).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let second = tokio::spawn(async move { b.refund("p2", 500).await });
    let (first, second) = (first.await.unwrap().expect("the first runs"), second.await.unwrap().unwrap_err());
    assert_eq!(second.kind, ErrorKind::Held, "{second}");
    assert_eq!(earlier_outcome(&second).unwrap()["result"], first.value, "it waited for the first and carries its outcome");
    assert_eq!(h.refunds(), 1);
    assert_eq!(h.posts().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_that_waited_too_long_is_held_and_its_replay_gets_the_outcome() {
    // The follower waits up to reconcile_ms (300 ms); the first call takes 1.5 s.
    let h = Arc::new(harness(Downstream::default()).await);
    h.sandbox.inject(Fault::DelayBeforeCommit { ms: 900 });
    let a = h.clone();
    let first = tokio::spawn(async move { a.refund("p1", 500).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let held = h.refund("p2", 500).await.unwrap_err();
    assert_eq!((held.kind, earlier_outcome(&held)), (ErrorKind::Held, None), "{held}");
    let first = first.await.unwrap().unwrap();
    let replay = h.refund("p2", 500).await.unwrap_err();
    assert_eq!(earlier_outcome(&replay).unwrap()["result"], first.value);
    assert_eq!(h.refunds(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hold_rule_is_per_session_tool_and_arguments() {
    let h = harness(Downstream::default()).await;
    h.call_unheard("k1", "refund", &refund_args(500)).await.unwrap();
    h.refund("k2", 501).await.expect("other arguments");
    let other_session = toolguard::CallRequest {
        session: "s2".into(),
        call_id: "k3".into(),
        tool: "refund".into(),
        args_json: refund_args(500),
        principal: None,
        tenant: None,
    };
    h.rt.call(&other_session).await.expect("another session");
    assert_eq!(h.refunds(), 3);
}
