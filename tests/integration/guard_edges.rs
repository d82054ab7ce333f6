//! The reference edge cases (numbers from `idempotency-semantics.md`, §3)
//! against the payments sandbox. Every test counts refunds in the sandbox's
//! own ledger, not just what the host returned.

use crate::payments::{Downstream, HEADER_ONLY, PI, PI_AMOUNT, harness};
use std::time::Duration;
use toolguard::ErrorKind;
use toolguard::ledger::AttemptState;
use toolguard_sandbox::{Fault, Mode, is_uuid};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e01_commit_then_lost_answer_is_reconciled_before_answering() {
    let h = harness(Downstream::default()).await;
    h.sandbox.inject(Fault::DelayAfterCommit { ms: 3_000 });
    let out = h.refund("c1", 500).await.expect("reconciliation finds the committed refund");
    let refunds = h.sandbox.refunds();
    assert_eq!(refunds.len(), 1);
    assert_eq!(out.value["refund_id"], refunds[0].id.as_str(), "the real outcome, not `unknown`");
    assert_eq!(h.posts().len(), 1, "found by looking, not by sending again");
    let attempt = h.ledger().attempts_of_call("s1", "c1").unwrap().remove(0);
    assert_eq!(attempt.state, AttemptState::Succeeded);
    assert_eq!(attempt.resolution, Some(toolguard::ledger::Resolution::ReconciledFound));
    let again = h.refund("c1", 500).await.unwrap();
    assert!(again.replayed);
    assert_eq!(h.refunds(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e01_commit_then_lost_answer_then_replay_returns_the_original_refund() {
    // Without the key in the refund's metadata, reconciliation cannot tell.
    let h = harness(Downstream { key: HEADER_ONLY, ..Downstream::default() }).await;
    h.sandbox.inject(Fault::DelayAfterCommit { ms: 3_000 });
    let err = h.refund("c1", 500).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::OutcomeUnknown, "{err}");
    assert!(err.message.contains("Do not call refund again") && err.message.contains("refund_status"), "{}", err.message);
    assert_eq!(err.detail.as_ref().unwrap()["state"], "unknown");
    assert_eq!(h.refunds(), 1, "the provider committed");

    let out = h.refund("c1", 500).await.expect("the replay settles it");
    let refunds = h.sandbox.refunds();
    assert_eq!(refunds.len(), 1, "still one refund");
    assert_eq!(out.value["refund_id"], refunds[0].id.as_str(), "the original refund is returned");
    let posts = h.posts();
    assert_eq!(posts.len(), 2);
    assert_eq!(posts[0].idempotency_key, posts[1].idempotency_key, "the same key both times");
    let attempt = h.ledger().attempts_of_call("s1", "c1").unwrap().remove(0);
    assert_eq!(attempt.state, AttemptState::Succeeded);
    assert!(attempt.provider_replayed, "the second answer carried Idempotent-Replayed: true");
}

#[tokio::test]
async fn e02_request_lost_before_the_provider_then_replay_makes_one_refund() {
    let h = harness(Downstream::default()).await;
    h.sandbox.inject(Fault::DropBeforeCommit);
    let err = h.refund("c1", 500).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::OutcomeUnknown, "a dropped connection says nothing about the outcome");
    assert_eq!(h.refunds(), 0);
    let out = h.refund("c1", 500).await.unwrap();
    assert_eq!(h.refunds(), 1);
    assert_eq!(out.value["status"], "succeeded");
    let attempt = h.ledger().attempts_of_call("s1", "c1").unwrap().remove(0);
    assert!(!attempt.provider_replayed, "executed fresh, not replayed");
}

#[tokio::test]
async fn e03_same_call_id_with_mutated_args_is_a_conflict_and_sends_nothing() {
    let h = harness(Downstream::default()).await;
    h.refund("c1", 500).await.unwrap();
    let posts = h.posts().len();
    let err = h.refund("c1", 700).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::Conflict, "{err}");
    assert_eq!(h.posts().len(), posts, "zero downstream calls");
    assert_eq!(h.refunds(), 1);

    // Also while the first is unsettled.
    h.sandbox.inject(Fault::DropBeforeCommit);
    assert_eq!(h.refund("c2", 100).await.unwrap_err().kind, ErrorKind::OutcomeUnknown);
    let posts = h.posts().len();
    assert_eq!(h.refund("c2", 101).await.unwrap_err().kind, ErrorKind::Conflict);
    assert_eq!(h.posts().len(), posts);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e03_one_call_id_with_different_args_at_once_runs_one_and_answers_each_caller_truly() {
    // A hostile or confused client sends one tool-call id with two amounts
    // at the same moment, with a replay of each right behind.
    let h = harness(Downstream::default()).await;
    for round in 0..30u64 {
        let (x, y, id) = (10 + 2 * round, 11 + 2 * round, format!("c{round}"));
        let (a, b, c, d) = tokio::join!(h.refund(&id, x), h.refund(&id, y), h.refund(&id, x), h.refund(&id, y));
        let refunds: Vec<u64> = h.sandbox.refunds().iter().map(|r| r.amount).filter(|a| *a == x || *a == y).collect();
        assert_eq!(refunds.len(), 1, "round {round}: {a:?} {b:?} {c:?} {d:?}");
        for (asked, answer) in [(x, &a), (y, &b), (x, &c), (y, &d)] {
            match answer {
                Ok(out) => assert_eq!(out.value["amount_cents"], asked, "round {round}: a caller told of a refund it did not ask for"),
                Err(e) => assert_eq!((e.kind, asked == refunds[0]), (ErrorKind::Conflict, false), "round {round}: {e}"),
            }
        }
    }
}

#[tokio::test]
async fn e04_reordered_args_and_whitespace_are_the_same_call() {
    let h = harness(Downstream::default()).await;
    let first = h.refund("c1", 500).await.unwrap();
    assert!(!first.replayed);
    let reordered = format!("{{ \"reason\" : \"requested_by_customer\",\n  \"amount_cents\": 500, \"payment_intent\": \"{PI}\" }}");
    let again = h.call("c1", "refund", &reordered).await.unwrap();
    assert!(again.replayed, "answered from the ledger");
    assert_eq!(again.value, first.value);
    assert_eq!(h.posts().len(), 1);
    assert_eq!(h.refunds(), 1);
}

#[tokio::test]
async fn e05_409_in_flight_is_retried_with_the_same_key() {
    let h = harness(Downstream::default()).await;
    h.sandbox.inject(Fault::InFlight409);
    h.sandbox.inject(Fault::InFlight409);
    let out = h.refund("c1", 500).await.unwrap();
    assert_eq!(out.value["status"], "succeeded");
    assert_eq!(h.refunds(), 1);
    let posts = h.posts();
    assert_eq!(posts.len(), 3);
    assert!(posts.iter().all(|p| p.idempotency_key == posts[0].idempotency_key));
}

#[tokio::test]
async fn e06_409_outlasting_the_retry_budget_stays_pending_with_no_new_key() {
    let h = harness(Downstream { max_retries: 2, ..Downstream::default() }).await;
    for _ in 0..3 {
        h.sandbox.inject(Fault::InFlight409);
    }
    let err = h.refund("c1", 500).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::OutcomeUnknown);
    assert_eq!(err.detail.as_ref().unwrap()["state"], "pending", "still in flight, retryable");
    assert_eq!(h.refunds(), 0);
    let posts = h.posts();
    assert_eq!(posts.len(), 3, "1 try + 2 retries");
    assert!(posts.iter().all(|p| p.idempotency_key == posts[0].idempotency_key), "no new key");
    // Retrying the same tool call later uses the same key again and settles it.
    let out = h.refund("c1", 500).await.unwrap();
    assert_eq!(h.refunds(), 1);
    assert_eq!(h.posts().last().unwrap().idempotency_key, posts[0].idempotency_key);
    assert_eq!(out.value["amount_cents"], 500);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_refund_its_provider_reports_in_flight_for_good_is_found_not_left_pending() {
    // The provider commits and fails before its idempotency record is
    // written: the key stays "executing" there, so every re-send gets 409.
    // Its listing shows the refund a second later.
    let h = harness(Downstream { max_retries: 1, reconcile_ms: 200, ..Downstream::default() }).await;
    h.sandbox.set_list_lag(Duration::from_secs(1));
    h.sandbox.inject(Fault::CommitStuckInFlight);
    let first = h.refund("c1", 500).await.unwrap_err();
    assert_eq!(first.kind, ErrorKind::OutcomeUnknown, "not listed yet: {first}");
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    // The same tool call again: 409 on every try, and the look-up finds the refund.
    let out = h.refund("c1", 500).await.expect("found: a definitive answer, not `pending`");
    let refunds = h.sandbox.refunds();
    assert_eq!(refunds.len(), 1);
    assert_eq!(out.value["refund_id"], refunds[0].id.as_str());
    let posts = h.posts();
    assert_eq!(posts.len(), 3, "the first send, then a re-send and its retry, each answered 409");
    assert!(posts.iter().all(|p| p.idempotency_key == posts[0].idempotency_key));
    let attempt = h.ledger().attempts_of_call("s1", "c1").unwrap().remove(0);
    assert_eq!((attempt.state, attempt.resolution), (AttemptState::Succeeded, Some(toolguard::ledger::Resolution::ReconciledFound)));
}

#[tokio::test]
async fn a_409_then_a_refusal_is_still_in_flight_not_never_sent() {
    // The provider said a request with this key is executing; the next try was
    // turned away before its idempotency layer. The first answer still stands:
    // telling the model "nothing happened" could make it issue a new call.
    let h = harness(Downstream { max_retries: 1, ..Downstream::default() }).await;
    h.sandbox.inject(Fault::InFlight409);
    h.sandbox.inject(Fault::RateLimit429);
    let err = h.refund("c1", 500).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::OutcomeUnknown, "{err}");
    assert_eq!(err.detail.as_ref().unwrap()["state"], "pending");
    let attempt = h.ledger().attempts_of_call("s1", "c1").unwrap().remove(0);
    assert_eq!(attempt.state, AttemptState::Pending, "not settled as never sent: {attempt:?}");
    assert_eq!(h.posts().len(), 2);
    // The same tool call again settles it with the same key: one refund.
    h.refund("c1", 500).await.unwrap();
    assert_eq!(h.refunds(), 1);
    assert!(h.posts().iter().all(|p| p.idempotency_key == h.posts()[0].idempotency_key));
}

#[tokio::test]
async fn a_409_from_a_downstream_that_ignores_keys_is_its_answer_not_a_key_in_flight() {
    // A provider that does not deduplicate by key refuses with 409 for its
    // own reasons (a disputed charge): no key of ours can be in flight there,
    // so the refusal is definitive — not retried, not left unknown, and the
    // model's next call (told "failed") is a new action that runs.
    let h = harness(Downstream { extra: "honours_keys = false", ..Downstream::default() }).await;
    h.sandbox.inject(Fault::Conflict409);
    let err = h.refund("c1", 500).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::ToolFailed, "{err}");
    assert!(err.message.contains("disputed"), "the provider's own answer: {err}");
    let attempt = h.ledger().attempts_of_call("s1", "c1").unwrap().remove(0);
    assert_eq!(attempt.state, AttemptState::Failed, "{attempt:?}");
    assert_eq!(h.posts().len(), 1, "not retried as a key in flight");
    let out = h.refund("c2", 500).await.unwrap();
    assert_eq!(h.refunds(), 1);
    assert_eq!(out.value["amount_cents"], 500);
    assert_eq!(h.posts().len(), 2);

    // From a provider that honours keys the same 409 means "a request with
    // this key is in flight": retried with the key, then left pending.
    let h = harness(Downstream { max_retries: 1, ..Downstream::default() }).await;
    h.sandbox.inject(Fault::Conflict409);
    h.sandbox.inject(Fault::Conflict409);
    let err = h.refund("c1", 500).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::OutcomeUnknown, "{err}");
    assert_eq!(h.posts().len(), 2);
    assert_eq!(h.refunds(), 0);
}

#[tokio::test]
async fn a_refund_made_but_answered_in_a_shape_the_plugin_cannot_read_is_not_reported_as_failed() {
    // The provider makes the refund and answers 200 with a body the plugin
    // cannot parse, so the plugin reports its own failure. Told "failed",
    // a model would refund again; it is told what took effect instead.
    let h = harness(Downstream::default()).await;
    h.sandbox.inject(Fault::CommitAnsweredInAnotherShape);
    let err = h.refund("c1", 500).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::FailedAfterEffect, "{err}");
    assert!(err.message.contains("not the expected JSON") && err.message.contains("took effect"), "{err}");
    let effects = err.detail.as_ref().unwrap()["effects"].clone();
    assert_eq!(effects[0]["status"], 200, "{effects}");
    assert!(effects[0]["url"].as_str().unwrap().ends_with("/v1/refunds"), "{effects}");
    assert_eq!(h.refunds(), 1);
    // Replayed as it was; the model's blind repeat is held with this outcome.
    let again = h.refund("c1", 500).await.unwrap_err();
    assert_eq!((again.kind, again.detail.as_ref().unwrap()["replayed"].clone()), (ErrorKind::FailedAfterEffect, true.into()));
    let repeat = h.refund("c2", 500).await.unwrap_err();
    assert_eq!(repeat.kind, ErrorKind::Held, "{repeat}");
    assert_eq!(repeat.detail.as_ref().unwrap()["earlier_outcome"]["error"]["kind"], "failed-after-effect", "{repeat}");
    assert_eq!((h.posts().len(), h.refunds()), (1, 1), "nothing sent again");
    // Told that twice, a call after it is a new action: a second refund, on purpose.
    h.refund("c3", 500).await.unwrap();
    assert_eq!(h.refunds(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e07_64_concurrent_duplicates_make_one_refund_and_64_identical_results() {
    let h = std::sync::Arc::new(harness(Downstream::default()).await);
    let calls: Vec<_> = (0..64)
        .map(|_| {
            let h = h.clone();
            tokio::spawn(async move { h.refund("c-dup", 1_234).await.unwrap().value })
        })
        .collect();
    let mut results = Vec::new();
    for c in calls {
        results.push(c.await.unwrap());
    }
    assert_eq!(h.refunds(), 1, "exactly one refund at the sandbox");
    assert_eq!(h.posts().len(), 1, "exactly one request reached it");
    assert!(results.iter().all(|r| *r == results[0]), "64 identical results");
    assert_eq!(results[0]["amount_cents"], 1_234);
}

#[tokio::test]
async fn e15_after_the_provider_forgot_the_key_a_known_success_is_answered_locally() {
    let h = harness(Downstream::default()).await;
    let first = h.refund("c1", 500).await.unwrap();
    h.sandbox.advance_clock(Duration::from_secs(25 * 3600));
    let again = h.refund("c1", 500).await.unwrap();
    assert!(again.replayed);
    assert_eq!(again.value, first.value);
    assert_eq!(h.posts().len(), 1, "no downstream call");
    assert_eq!(h.refunds(), 1);
}

#[tokio::test]
async fn e16_429_is_retried_with_the_same_key() {
    let h = harness(Downstream::default()).await;
    h.sandbox.inject(Fault::RateLimit429);
    h.refund("c1", 500).await.unwrap();
    assert_eq!(h.refunds(), 1);
    let posts = h.posts();
    assert_eq!(posts.len(), 2);
    assert_eq!(posts[0].idempotency_key, posts[1].idempotency_key);
}

#[tokio::test]
async fn e17_a_validation_error_is_final_and_replayed_without_a_new_call() {
    let h = harness(Downstream::default()).await;
    let err = h.refund("c1", PI_AMOUNT + 1).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::ToolFailed);
    assert!(err.message.contains("amount_too_large"), "{}", err.message);
    let attempt = h.ledger().attempts_of_call("s1", "c1").unwrap().remove(0);
    assert_eq!(attempt.state, AttemptState::Failed);
    let again = h.refund("c1", PI_AMOUNT + 1).await.unwrap_err();
    assert_eq!(again.kind, ErrorKind::ToolFailed);
    assert_eq!(again.message, err.message);
    assert_eq!(again.detail.unwrap()["replayed"], true);
    assert_eq!(h.posts().len(), 1, "no new call");
    assert_eq!(h.refunds(), 0);
}

#[tokio::test]
async fn e18_the_providers_retry_advice_is_followed() {
    // Stripe-Should-Retry: false on a 5xx: one try, outcome unknown.
    let h = harness(Downstream::default()).await;
    h.sandbox.inject(Fault::Stored500 { should_retry: Some(false) });
    assert_eq!(h.refund("c1", 500).await.unwrap_err().kind, ErrorKind::OutcomeUnknown);
    assert_eq!(h.posts().len(), 1);
    // Stripe-Should-Retry: true on a 5xx: retried with the same key. The
    // provider replays its stored 500 without advice, so the attempt stays
    // unknown after the retry — and nothing is duplicated.
    h.sandbox.inject(Fault::Stored500 { should_retry: Some(true) });
    assert_eq!(h.refund("c2", 501).await.unwrap_err().kind, ErrorKind::OutcomeUnknown);
    let c2: Vec<_> = h.posts().into_iter().skip(1).collect();
    assert_eq!(c2.len(), 2, "the try the provider advised, then its stored answer");
    assert!(c2.iter().all(|p| p.idempotency_key == c2[0].idempotency_key));
    assert_eq!(h.refunds(), 0);
    // A 409 carries Stripe-Should-Retry: true and is retried (see e05).
}

#[tokio::test]
async fn a_genuinely_new_call_with_the_same_args_is_a_second_refund() {
    let h = harness(Downstream::default()).await;
    let a = h.refund("c1", 500).await.unwrap();
    let b = h.refund("c2", 500).await.unwrap();
    assert_ne!(a.value["refund_id"], b.value["refund_id"]);
    assert_eq!(h.refunds(), 2);
    let keys: Vec<_> = h.posts().into_iter().map(|p| p.idempotency_key).collect();
    assert_ne!(keys[0], keys[1], "a new tool-call id is a new key");
}

#[tokio::test]
async fn e28_29_the_key_is_short_ascii_identical_on_every_transport_and_try() {
    let h = harness(Downstream::default()).await;
    h.sandbox.inject(Fault::RateLimit429);
    h.refund("c1", 500).await.unwrap();
    let posts = h.posts();
    let key = posts[0].idempotency_key.clone().unwrap();
    assert!(key.len() <= 40 && key.is_ascii() && key.starts_with("tg1_"), "{key}");
    assert!(key[4..].chars().all(|c| c.is_ascii_hexdigit()), "an opaque digest, no ids: {key}");
    assert!(posts.iter().all(|p| p.idempotency_key.as_deref() == Some(key.as_str())));
    assert_eq!(h.sandbox.refunds()[0].metadata["toolguard_key"], key, "the same key in the refund's metadata");
    let attempt = h.ledger().attempt(&key).unwrap().expect("the ledger maps the key back to its call");
    assert_eq!((attempt.session.as_str(), attempt.call_id.as_str(), attempt.step), ("s1", "c1", 0));
}

#[tokio::test]
async fn e28_ietf_downstreams_get_a_quoted_sf_string() {
    let d = Downstream { mode: Mode::Ietf, key: r#"[{ transport = "sf-string" }]"#, ..Downstream::default() };
    let h = harness(d).await;
    h.refund("c1", 500).await.unwrap();
    let raw = h.posts()[0].idempotency_key.clone().unwrap();
    assert!(raw.starts_with("\"tg1_") && raw.ends_with('"'), "{raw}");
    assert_eq!(h.refunds(), 1);
    // The same IETF downstream refuses a bare token: a definitive failure, nothing refunded.
    let bare = Downstream { mode: Mode::Ietf, key: r#"[{ transport = "header" }]"#, ..Downstream::default() };
    let h = harness(bare).await;
    assert_eq!(h.refund("c1", 500).await.unwrap_err().kind, ErrorKind::ToolFailed);
    assert_eq!(h.refunds(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_taking_its_key_in_the_query_gets_the_same_key_on_every_resend() {
    let d = Downstream { key: r#"[{ transport = "query", name = "idempotency_key" }]"#, ..Downstream::default() };
    let h = harness(d).await;
    h.sandbox.inject(Fault::DelayAfterCommit { ms: 3_000 });
    let first = h.refund("c1", 500).await.unwrap_err();
    assert_eq!(first.kind, ErrorKind::OutcomeUnknown, "committed, but the answer never came: {first}");
    let out = h.refund("c1", 500).await.expect("the same key, and the provider's stored answer");
    let posts = h.posts();
    assert!(posts.len() >= 2, "re-sent");
    let key = |query: &str| form_urlencoded::parse(query.as_bytes()).find(|(k, _)| k == "idempotency_key").map(|(_, v)| v.into_owned());
    let keys: Vec<Option<String>> = posts.iter().map(|p| key(&p.query)).collect();
    assert!(keys[0].as_deref().is_some_and(|k| k.starts_with("tg1_")), "{:?}", posts[0].query);
    assert!(keys.iter().all(|k| *k == keys[0]), "one key on every send: {keys:?}");
    assert!(posts.iter().all(|p| p.headers.iter().all(|(n, _)| n != "idempotency-key")), "and only in the query");
    assert_eq!(h.refunds(), 1, "the provider deduplicated by it");
    assert_eq!(out.value["refund_id"], h.sandbox.refunds()[0].id.as_str());
}

/// A provider that takes only UUID keys (`key_format = "uuid"`): every send
/// of a step carries one UUID, in the header and the refund's metadata, so
/// the provider deduplicates a re-send by it and the plugin's
/// reconciliation finds the refund by it. The default `tg1_…` key is
/// refused by such a provider, before anything happens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_taking_only_uuid_keys_gets_one_uuid_per_send_and_is_reconciled_by_it() {
    // Reconciled: the key in the refund's metadata is the UUID the host sent.
    let h = harness(Downstream { extra: r#"key_format = "uuid""#, ..Downstream::default() }).await;
    h.sandbox.require_uuid_keys(true);
    h.sandbox.inject(Fault::DelayAfterCommit { ms: 3_000 });
    let out = h.refund("c1", 500).await.expect("committed, answered late, and found by its key");
    let refund = &h.sandbox.refunds()[0];
    assert_eq!(out.value["refund_id"], refund.id.as_str());
    let key = h.posts()[0].idempotency_key.clone().unwrap();
    assert!(is_uuid(&key), "{key}");
    assert_eq!(refund.metadata.get("toolguard_key"), Some(&key), "the same UUID in the body");
    assert_eq!(h.ledger().attempts_of_call("s1", "c1").unwrap()[0].key, key, "and in the ledger");
    h.refund("c1", 500).await.expect("a replay");
    assert_eq!((h.refunds(), h.posts().len()), (1, 1), "sends nothing");

    // Re-sent: the header only, so nothing to reconcile by; the same UUID again.
    let h = harness(Downstream { key: HEADER_ONLY, extra: r#"key_format = "uuid""#, ..Downstream::default() }).await;
    h.sandbox.require_uuid_keys(true);
    h.sandbox.inject(Fault::DelayAfterCommit { ms: 3_000 });
    assert_eq!(h.refund("c1", 500).await.unwrap_err().kind, ErrorKind::OutcomeUnknown);
    h.refund("c1", 500).await.expect("re-sent under its key, the provider's stored answer");
    let keys: Vec<String> = h.posts().iter().map(|p| p.idempotency_key.clone().unwrap()).collect();
    assert!(keys.len() >= 2 && keys.iter().all(|k| *k == keys[0] && is_uuid(k)), "{keys:?}");
    assert_eq!(h.refunds(), 1, "deduplicated by it");

    // The default format: refused by this provider, nothing refunded.
    let h = harness(Downstream::default()).await;
    h.sandbox.require_uuid_keys(true);
    let refused = h.refund("c1", 500).await.unwrap_err();
    assert!(refused.to_string().contains("must be a UUID"), "{refused}");
    assert_eq!(h.refunds(), 0);
}

#[tokio::test]
async fn refund_status_reads_through_fetch_and_is_not_keyed() {
    let h = harness(Downstream::default()).await;
    h.refund("c1", 500).await.unwrap();
    h.refund("c2", 700).await.unwrap();
    let status = h.call("c3", "refund_status", &format!(r#"{{"payment_intent":"{PI}"}}"#)).await.unwrap();
    assert_eq!(status.value["refunded_cents"], 1_200);
    assert_eq!(status.value["refunds"].as_array().unwrap().len(), 2);
    let get = h.sandbox.requests().into_iter().find(|r| r.method == "GET").unwrap();
    assert_eq!(get.idempotency_key, None, "fetches carry no key");
    assert!(h.ledger().attempts_of_call("s1", "c3").unwrap().is_empty(), "and are not recorded as attempts");
}
