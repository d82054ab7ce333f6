//! The guard as the one way out: refusals send nothing, the attempt is
//! durable before the request leaves, and unsettled sends cannot be hidden.

use crate::payments::{Downstream, PI, harness, rogue_args};
use serde_json::json;
use std::sync::{Arc, Mutex};
use toolguard::ErrorKind;
use toolguard::ledger::AttemptState;
use toolguard_sandbox::Fault;

fn refund_request(url: &str, headers: serde_json::Value) -> serde_json::Value {
    json!({ "method": "POST", "url": format!("{url}/v1/refunds"), "headers": headers, "body": format!("payment_intent={PI}&amount=100") })
}

#[tokio::test]
async fn a_plugin_cannot_set_the_key_or_credentials_or_leave_its_grants() {
    let h = harness(Downstream::default()).await;
    let url = h.sandbox.url();
    let other_port = format!("http://127.0.0.1:{}", h.sandbox.addr().port().wrapping_add(1));
    let cases = [
        (refund_request(&url, json!({ "Idempotency-Key": "mine" })), ErrorKind::InvalidRequest),
        (refund_request(&url, json!({ "authorization": "Bearer sk_live_stolen" })), ErrorKind::InvalidRequest),
        (json!({ "method": "POST", "url": format!("{url}/v1/refunds"), "body": "amount=1&metadata%5Btoolguard_key%5D=mine" }), ErrorKind::InvalidRequest),
        (json!({ "method": "POST", "url": format!("{url}/v1/charges"), "body": "" }), ErrorKind::Denied),
        (json!({ "method": "DELETE", "url": format!("{url}/v1/refunds/re_1") }), ErrorKind::Denied),
        (refund_request(&other_port, json!({})), ErrorKind::Denied),
        (json!({ "method": "POST", "url": "http://example.com/v1/refunds" }), ErrorKind::Denied),
    ];
    for (i, (request, kind)) in cases.into_iter().enumerate() {
        let err = h.call(&format!("c{i}"), "send_all", &rogue_args(json!([request]), false)).await.unwrap_err();
        assert_eq!(err.kind, kind, "case {i}: {err}");
    }
    let err = h.call("ro", "send_from_read_only", &rogue_args(json!([refund_request(&url, json!({}))]), false)).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::Denied, "a read-only tool may not send: {err}");
    assert!(h.sandbox.requests().is_empty(), "nothing reached the sandbox: {:?}", h.sandbox.requests());
    assert!(h.ledger().attempts().unwrap().is_empty(), "and nothing was recorded as sent");
}

#[tokio::test]
async fn a_read_only_call_leaves_nothing_in_the_ledger_and_reads_afresh_each_time() {
    let h = harness(Downstream::default()).await;
    h.refund("c1", 100).await.unwrap();
    let ledger = h.ledger();
    let harness = &h;
    let status = |call_id: &'static str, pi: &'static str| {
        let args = format!(r#"{{"payment_intent":"{pi}"}}"#);
        async move { harness.call(call_id, "refund_status", &args).await }
    };
    let before = ledger.write_counts();
    let first = status("r1", PI).await.unwrap();
    assert_eq!(ledger.write_counts(), before, "a read writes nothing");
    h.refund("c2", 200).await.unwrap();
    let before = ledger.write_counts();
    // The same tool-call id again: not a replay of the first answer, a fresh read.
    let again = status("r1", PI).await.unwrap();
    assert!(!first.replayed && !again.replayed, "read-only calls are never replayed");
    assert_ne!(first.value, again.value, "the second read sees the second refund");
    // The same id with other arguments: there is nothing to conflict with.
    if let Err(e) = status("r1", "pi_other").await {
        assert_ne!(e.kind, ErrorKind::Conflict, "{e}");
    }
    assert_eq!(ledger.write_counts(), before, "reads write nothing");
    let gets = h.sandbox.requests().into_iter().filter(|r| r.method == "GET").count();
    assert_eq!(gets, 3, "each read went to the provider");
    assert!(ledger.call("s1", "r1").unwrap().is_none(), "no call record for a read");
    assert_eq!(ledger.calls(None).unwrap().len(), 2, "only the two refunds are recorded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_attempt_is_durable_in_the_ledger_before_the_request_leaves() {
    let h = harness(Downstream::default()).await;
    let ledger = h.ledger();
    let seen: Arc<Mutex<Vec<Option<AttemptState>>>> = Arc::default();
    let record = seen.clone();
    h.sandbox.on_request(move |req| {
        if req.method == "POST" {
            let key = req.idempotency_key.clone().expect("keyed");
            let state = ledger.attempt(&key).unwrap().map(|a| a.state);
            record.lock().unwrap().push(state);
        }
    });
    h.refund("c1", 500).await.unwrap();
    h.refund("c2", 700).await.unwrap();
    assert_eq!(*seen.lock().unwrap(), vec![Some(AttemptState::Pending); 2], "pending and in the ledger as each request arrived");
    let call = h.ledger().call("s1", "c1").unwrap().unwrap();
    assert_eq!(call.state, toolguard::ledger::CallState::Completed);
}

#[tokio::test]
async fn an_unsettled_send_cannot_be_hidden_by_the_plugin() {
    let h = harness(Downstream { key: crate::payments::HEADER_ONLY, ..Downstream::default() }).await;
    h.sandbox.inject(Fault::DelayAfterCommit { ms: 3_000 });
    let args = rogue_args(json!([refund_request(&h.sandbox.url(), json!({ "Content-Type": "application/x-www-form-urlencoded" }))]), true);
    let err = h.call("c1", "send_all", &args).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::OutcomeUnknown, "the plugin swallowed it; the host did not: {err}");
    assert_eq!(h.ledger().call("s1", "c1").unwrap().unwrap().state, toolguard::ledger::CallState::Admitted, "not completed");
}

#[tokio::test]
async fn a_run_that_skips_a_send_its_earlier_run_made_answers_for_that_send() {
    // A hostile (or merely not deterministic) plugin: its first run refunds
    // and the answer is lost; run again, it sends nothing and says all is well.
    let h = harness(Downstream { key: crate::payments::HEADER_ONLY, ..Downstream::default() }).await;
    h.sandbox.inject(Fault::DelayAfterCommit { ms: 3_000 });
    let until = toolguard::ledger::records::now_ms() + 1_500;
    let form = json!({ "Content-Type": "application/x-www-form-urlencoded" });
    let args = json!({ "requests": [refund_request(&h.sandbox.url(), form)], "swallow_errors": true, "until_ms": until }).to_string();
    let err = h.call("c1", "send_all", &args).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::OutcomeUnknown, "{err}");
    // Past `until_ms`, and past the provider's late answer: the plugin skips its send now.
    tokio::time::sleep(std::time::Duration::from_millis(3_500)).await;
    let told = h.call("c1", "send_all", &args).await.unwrap_err();
    assert_eq!(told.kind, ErrorKind::FailedAfterEffect, "not the plugin's 'nothing sent': {told}");
    let detail = told.detail.clone().unwrap();
    assert_eq!(detail["tool_result"], json!([{ "skipped": true }]), "{detail}");
    assert_eq!((detail["effects"][0]["earlier_run"].clone(), detail["effects"][0]["status"].clone()), (json!(true), json!(200)), "{detail}");
    assert_eq!(h.refunds(), 1);
    let keys: Vec<_> = h.posts().into_iter().map(|p| p.idempotency_key.unwrap()).collect();
    assert!(keys.iter().all(|k| *k == keys[0]), "settled with its own key, never a new one: {keys:?}");
    // Recorded: the same call again replays it, nothing sent.
    let posts = h.posts().len();
    let again = h.call("c1", "send_all", &args).await.unwrap_err();
    assert_eq!((again.kind, h.posts().len(), h.refunds()), (ErrorKind::FailedAfterEffect, posts, 1));
}

#[tokio::test]
async fn each_send_of_a_call_has_its_own_key_and_all_replay_without_going_out() {
    let h = harness(Downstream::default()).await;
    let form = json!({ "Content-Type": "application/x-www-form-urlencoded" });
    let args = rogue_args(json!([refund_request(&h.sandbox.url(), form.clone()), refund_request(&h.sandbox.url(), form)]), false);
    let first = h.call("c1", "send_all", &args).await.unwrap();
    assert_eq!(h.refunds(), 2);
    let keys: Vec<_> = h.posts().into_iter().map(|p| p.idempotency_key.unwrap()).collect();
    assert_ne!(keys[0], keys[1], "step 0 and step 1 differ");
    let attempts = h.ledger().attempts_of_call("s1", "c1").unwrap();
    assert_eq!(attempts.iter().map(|a| a.step).collect::<Vec<_>>(), [0, 1]);
    let again = h.call("c1", "send_all", &args).await.unwrap();
    assert!(again.replayed);
    assert_eq!(again.value, first.value);
    assert_eq!(h.posts().len(), 2, "nothing went out again");
}

#[tokio::test]
async fn an_unreachable_downstream_is_a_transport_error_and_nothing_stays_pending() {
    let h = harness(Downstream { max_retries: 1, ..Downstream::default() }).await;
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_url = format!("http://{}", dead.local_addr().unwrap());
    drop(dead);
    // Grant-wise the dead port is not the sandbox's: refused before anything.
    let err = h.call("c0", "send_all", &rogue_args(json!([refund_request(&dead_url, json!({}))]), false)).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::Denied);
    // The sandbox itself going away: a connect error, retried, then transport.
    let url = h.sandbox.url();
    let Harness { sandbox, rt, dir: _dir } = h;
    drop(sandbox);
    let req = toolguard::CallRequest {
        session: "s1".into(),
        call_id: "c1".into(),
        tool: "send_all".into(),
        args_json: rogue_args(json!([refund_request(&url, json!({}))]), false),
        principal: None,
        tenant: None,
    };
    let err = rt.call(&req).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::Transport, "{err}");
    let ledger = rt.guard().unwrap().ledger();
    assert!(ledger.attempts_in_state(AttemptState::Pending).unwrap().is_empty(), "settled, so recovery will not resend it");
    let attempt = ledger.attempts_of_call("s1", "c1").unwrap().remove(0);
    assert!(attempt.last_error.unwrap().starts_with("not sent"));
}

use crate::payments::Harness;

#[tokio::test]
async fn the_per_session_hourly_budget_of_irreversible_calls_is_enforced() {
    let h = harness(Downstream { refunds_per_session_hour: 2, ..Downstream::default() }).await;
    h.refund("c1", 100).await.unwrap();
    h.refund("c2", 200).await.unwrap();
    let err = h.refund("c3", 300).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::Denied, "{err}");
    assert!(err.message.contains("max_irreversible_calls_per_session_hour"), "{}", err.message);
    assert_eq!(h.posts().len(), 2, "nothing sent for the third");
    // Replays do not count again, reads are not irreversible, other sessions have their own budget.
    assert!(h.refund("c1", 100).await.unwrap().replayed);
    h.call("c4", "refund_status", &format!(r#"{{"payment_intent":"{PI}"}}"#)).await.unwrap();
    let other = toolguard::CallRequest {
        session: "s2".into(),
        call_id: "c1".into(),
        tool: "refund".into(),
        args_json: crate::payments::refund_args(300),
        principal: None,
        tenant: None,
    };
    h.rt.call(&other).await.unwrap();
    assert_eq!(h.refunds(), 3);
}

#[tokio::test]
async fn a_guarded_call_costs_exactly_one_synced_write() {
    let h = harness(Downstream::default()).await;
    let before = h.ledger().write_counts();
    h.refund("c1", 100).await.unwrap();
    let after = h.ledger().write_counts();
    assert_eq!(after.0 - before.0, 1, "the first attempt is the one synced write (it carries the admission to the disk)");
    // On RocksDB the completion rides with the report (one write); on PostgreSQL each is its own.
    let end = if h.ledger().lands_in_order() { 1 } else { 2 };
    assert_eq!(after.1 - before.1, 1 + end, "buffered: the admission (and its episode), the completion with the outcome, what the caller was told");
    // A replay writes nothing at all.
    h.refund("c1", 100).await.unwrap();
    assert_eq!(h.ledger().write_counts(), after);
}

#[tokio::test]
async fn a_calls_outcomes_ride_with_its_completion_and_land_even_when_it_does_not_complete() {
    let h = harness(Downstream::default()).await;
    let form = json!({ "Content-Type": "application/x-www-form-urlencoded" });
    let two = rogue_args(json!([refund_request(&h.sandbox.url(), form.clone()), refund_request(&h.sandbox.url(), form.clone())]), false);
    let before = h.ledger().write_counts();
    h.call("c1", "send_all", &two).await.unwrap();
    let after = h.ledger().write_counts();
    assert_eq!(after.0 - before.0, 2, "each send's pending attempt is synced before it leaves");
    let end = if h.ledger().lands_in_order() { 1 } else { 2 };
    assert_eq!(after.1 - before.1, 1 + end, "buffered: the admission, the completion with both outcomes, the report (on RocksDB, one write)");
    let states: Vec<_> = h.ledger().attempts_of_call("s1", "c1").unwrap().into_iter().map(|a| a.state).collect();
    assert_eq!(states, [AttemptState::Succeeded, AttemptState::Succeeded]);
    // A call that fails after a send never completes; the outcome it holds is written before it returns.
    let denied = json!({ "method": "POST", "url": "https://elsewhere.invalid/v1/refunds", "body": "amount=1" });
    let err = h.call("c2", "send_all", &rogue_args(json!([refund_request(&h.sandbox.url(), form), denied]), false)).await.unwrap_err();
    assert_ne!(h.ledger().call("s1", "c2").unwrap().unwrap().state, toolguard::ledger::CallState::Completed, "{err}");
    let attempts = h.ledger().attempts_of_call("s1", "c2").unwrap();
    assert_eq!(attempts.len(), 1, "the denied request was never an attempt");
    assert_eq!(attempts[0].state, AttemptState::Succeeded, "recorded, not left pending for recovery to re-send");
    assert_eq!(h.refunds(), 3);
}

#[tokio::test]
async fn a_call_that_fails_after_a_refund_went_through_says_so_whatever_the_failure() {
    // The first send refunds; the second leaves the grants and is refused.
    let h = harness(Downstream::default()).await;
    let url = h.sandbox.url();
    let requests = json!([refund_request(&url, json!({})), { "method": "POST", "url": format!("{url}/v1/charges"), "body": "" }]);
    let err = h.call("c1", "send_all", &rogue_args(requests, false)).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::Denied, "the failure keeps its kind: {err}");
    assert!(err.message.contains("/v1/refunds was answered HTTP 200") && err.message.contains("took effect"), "{err}");
    assert_eq!(err.detail.as_ref().unwrap()["effects"][0]["status"], 200, "{err:?}");
    assert_eq!(h.sandbox.refunds().len(), 1);
    // The same with a refund the provider declines (a 4xx): nothing took effect to name.
    let declined = json!([{ "method": "POST", "url": format!("{url}/v1/refunds"), "body": "payment_intent=pi_missing&amount=100" },
                          { "method": "POST", "url": format!("{url}/v1/charges"), "body": "" }]);
    let err = h.call("c2", "send_all", &rogue_args(declined, false)).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::Denied, "{err}");
    assert!(!err.message.contains("took effect") && err.detail.as_ref().is_none_or(|d| d.get("effects").is_none()), "{err:?}");
    assert_eq!(h.sandbox.refunds().len(), 1);
}
