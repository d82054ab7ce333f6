//! The sandbox's own semantics, checked over HTTP: it is the ground truth the
//! guard's tests count against, so it must be right by itself.

use serde_json::Value;
use std::time::Duration;
use toolguard_sandbox::{Fault, Mode, Sandbox};

struct Client {
    http: reqwest::Client,
    url: String,
}

impl Client {
    fn new(sandbox: &Sandbox) -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        Self { http: reqwest::Client::new(), url: sandbox.url() }
    }

    /// POST /v1/refunds; returns (status, replayed header, body).
    async fn refund(&self, key: Option<&str>, body: &str) -> (u16, bool, Value) {
        let mut req = self.http.post(format!("{}/v1/refunds", self.url)).header("Content-Type", "application/x-www-form-urlencoded").body(body.to_string());
        if let Some(k) = key {
            req = req.header("Idempotency-Key", k);
        }
        let r = req.send().await.unwrap();
        let replayed = r.headers().get("idempotent-replayed").is_some_and(|v| v == "true");
        let status = r.status().as_u16();
        (status, replayed, serde_json::from_slice(&r.bytes().await.unwrap()).unwrap_or(Value::Null))
    }
}

async fn sandbox(mode: Mode) -> Sandbox {
    let s = Sandbox::start("127.0.0.1:0", mode, Duration::from_secs(24 * 3600)).await.unwrap();
    s.add_payment_intent("pi_1", 1_000);
    s
}

#[tokio::test]
async fn stripe_replays_stored_responses_and_rejects_reuse_with_other_parameters() {
    let s = sandbox(Mode::Stripe).await;
    let c = Client::new(&s);
    let (status, replayed, first) = c.refund(Some("k1"), "payment_intent=pi_1&amount=100").await;
    assert_eq!((status, replayed), (200, false));
    let (status, replayed, again) = c.refund(Some("k1"), "payment_intent=pi_1&amount=100").await;
    assert_eq!((status, replayed), (200, true));
    assert_eq!(again, first);
    let (status, _, body) = c.refund(Some("k1"), "payment_intent=pi_1&amount=101").await;
    assert_eq!(status, 400);
    assert_eq!(body["error"]["type"], "idempotency_error");
    assert_eq!(s.refunds().len(), 1);
    // No key: Stripe runs the request unprotected — twice is two refunds.
    c.refund(None, "payment_intent=pi_1&amount=100").await;
    c.refund(None, "payment_intent=pi_1&amount=100").await;
    assert_eq!(s.refunds().len(), 3);
}

#[tokio::test]
async fn a_request_with_an_executing_key_gets_409() {
    let s = std::sync::Arc::new(sandbox(Mode::Stripe).await);
    s.inject(Fault::DelayBeforeCommit { ms: 300 });
    let c = std::sync::Arc::new(Client::new(&s));
    let slow = tokio::spawn({
        let c = c.clone();
        async move { c.refund(Some("k"), "payment_intent=pi_1&amount=100").await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (status, _, body) = c.refund(Some("k"), "payment_intent=pi_1&amount=100").await;
    assert_eq!(status, 409);
    assert_eq!(body["error"]["code"], "idempotency_key_in_use");
    assert_eq!(slow.await.unwrap().0, 200);
    assert_eq!(s.refunds().len(), 1);
}

#[tokio::test]
async fn keys_expire_with_the_retention_clock() {
    let s = sandbox(Mode::Stripe).await;
    let c = Client::new(&s);
    c.refund(Some("k"), "payment_intent=pi_1&amount=100").await;
    s.advance_clock(Duration::from_secs(25 * 3600));
    let (status, replayed, _) = c.refund(Some("k"), "payment_intent=pi_1&amount=100").await;
    assert_eq!((status, replayed), (200, false), "a reuse after retention is a new request");
    assert_eq!(s.refunds().len(), 2);
}

#[tokio::test]
async fn over_refunds_are_refused_the_stripe_way() {
    let s = sandbox(Mode::Stripe).await;
    let c = Client::new(&s);
    let (status, _, body) = c.refund(Some("a"), "payment_intent=pi_1&amount=1001").await;
    assert_eq!((status, body["error"]["code"].as_str()), (400, Some("amount_too_large")));
    assert_eq!(c.refund(Some("b"), "payment_intent=pi_1").await.0, 200, "no amount: the rest");
    let (status, _, body) = c.refund(Some("c"), "payment_intent=pi_1&amount=1").await;
    assert_eq!((status, body["error"]["code"].as_str()), (400, Some("charge_already_refunded")));
    let (status, replayed, body) = c.refund(Some("a"), "payment_intent=pi_1&amount=1001").await;
    assert_eq!((status, replayed, body["error"]["code"].as_str()), (400, true, Some("amount_too_large")), "4xx stored and replayed");
}

#[tokio::test]
async fn ietf_mode_wants_a_quoted_key_and_answers_422_on_reuse() {
    let s = sandbox(Mode::Ietf).await;
    let c = Client::new(&s);
    assert_eq!(c.refund(None, "payment_intent=pi_1&amount=1").await.0, 400, "missing key");
    assert_eq!(c.refund(Some("bare"), "payment_intent=pi_1&amount=1").await.0, 400, "not an sf-string");
    assert_eq!(c.refund(Some("\"q\""), "payment_intent=pi_1&amount=1").await.0, 200);
    assert_eq!(c.refund(Some("\"q\""), "payment_intent=pi_1&amount=2").await.0, 422);
    assert_eq!(s.refunds().len(), 1);
}

#[tokio::test]
async fn adyen_mode_returns_the_first_response_even_for_another_payload() {
    let s = sandbox(Mode::Adyen).await;
    let c = Client::new(&s);
    let (_, _, first) = c.refund(Some("k"), "payment_intent=pi_1&amount=1").await;
    let (status, replayed, second) = c.refund(Some("k"), "payment_intent=pi_1&amount=2").await;
    assert_eq!((status, replayed), (200, true));
    assert_eq!(second, first);
    assert_eq!(s.refunds().len(), 1);
}

#[tokio::test]
async fn faults_around_the_commit_do_what_they_say() {
    let s = sandbox(Mode::Stripe).await;
    let c = Client::new(&s);
    s.inject(Fault::HiddenCommit500);
    assert_eq!(c.refund(Some("h"), "payment_intent=pi_1&amount=1").await.0, 500);
    assert_eq!(s.refunds().len(), 1, "hidden commit");
    assert_eq!(c.refund(Some("h"), "payment_intent=pi_1&amount=1").await.0, 500, "the stored 500 replays");
    s.inject(Fault::Stored500 { should_retry: None });
    assert_eq!(c.refund(Some("n"), "payment_intent=pi_1&amount=1").await.0, 500);
    assert_eq!(s.refunds().len(), 1, "no commit");
    s.inject(Fault::RateLimit429);
    assert_eq!(c.refund(Some("r"), "payment_intent=pi_1&amount=1").await.0, 429);
    assert_eq!(c.refund(Some("r"), "payment_intent=pi_1&amount=1").await.0, 200, "429 stored nothing");
    s.inject(Fault::DropAfterCommit);
    let dropped =
        reqwest::Client::new().post(format!("{}/v1/refunds", s.url())).header("Idempotency-Key", "d").body("payment_intent=pi_1&amount=1").send().await;
    assert!(dropped.is_err(), "no answer");
    assert_eq!(s.refunds().len(), 3, "but committed");
    s.inject(Fault::PauseAfterCommit);
    let paused = tokio::spawn({
        let (http, url) = (reqwest::Client::new(), s.url());
        async move { http.post(format!("{url}/v1/refunds")).header("Idempotency-Key", "p").body("payment_intent=pi_1&amount=1").send().await }
    });
    while s.paused() == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(s.refunds().len(), 4, "committed while paused");
    s.release();
    assert_eq!(paused.await.unwrap().unwrap().status(), 200);
}

#[tokio::test]
async fn refund_statuses_can_start_pending_and_change_later() {
    let s = sandbox(Mode::Stripe).await;
    s.add_payment_intent_with_status("pi_slow", 500, "pending");
    let c = Client::new(&s);
    let (_, _, body) = c.refund(Some("k"), "payment_intent=pi_slow&amount=100").await;
    assert_eq!(body["status"], "pending");
    let id = body["id"].as_str().unwrap();
    assert!(s.set_refund_status(id, "succeeded"));
    let list: Value = serde_json::from_slice(
        &reqwest::Client::new().get(format!("{}/v1/refunds?payment_intent=pi_slow", s.url())).send().await.unwrap().bytes().await.unwrap(),
    )
    .unwrap();
    assert_eq!(list["data"][0]["status"], "succeeded");
    assert_eq!(list["object"], "list");
}

#[tokio::test]
async fn listings_page_newest_first_with_has_more_and_a_cursor() {
    let s = sandbox(Mode::Stripe).await;
    let ids: Vec<String> = (1..=5).map(|a| s.refund_elsewhere("pi_1", a).1["id"].as_str().unwrap().to_string()).collect();
    let get = |query: String| {
        let url = format!("{}/v1/refunds?payment_intent=pi_1&{query}", s.url());
        async move {
            let r = reqwest::Client::new().get(url).send().await.unwrap();
            (r.status().as_u16(), serde_json::from_slice::<Value>(&r.bytes().await.unwrap()).unwrap())
        }
    };
    let listed = |page: &Value| page["data"].as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap().to_string()).collect::<Vec<_>>();
    let (_, first) = get("limit=2".into()).await;
    assert_eq!((listed(&first), first["has_more"].as_bool()), (vec![ids[4].clone(), ids[3].clone()], Some(true)));
    let (_, second) = get(format!("limit=2&starting_after={}", ids[3])).await;
    assert_eq!((listed(&second), second["has_more"].as_bool()), (vec![ids[2].clone(), ids[1].clone()], Some(true)));
    let (_, last) = get(format!("limit=2&starting_after={}", ids[1])).await;
    assert_eq!((listed(&last), last["has_more"].as_bool()), (vec![ids[0].clone()], Some(false)));
    let (status, unknown) = get("starting_after=re_nope".into()).await;
    assert_eq!((status, unknown["error"]["code"].as_str()), (400, Some("resource_missing")));
}

#[tokio::test]
async fn an_api_key_can_be_required() {
    let s = sandbox(Mode::Stripe).await;
    s.require_api_key(Some("sk_test_x"));
    let c = Client::new(&s);
    let (status, _, body) = c.refund(Some("k"), "payment_intent=pi_1&amount=1").await;
    assert_eq!((status, body["error"]["code"].as_str()), (401, Some("api_key_invalid")));
    let ok = reqwest::Client::new()
        .post(format!("{}/v1/refunds", s.url()))
        .header("Authorization", "Bearer sk_test_x")
        .body("payment_intent=pi_1&amount=1")
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    assert_eq!(s.refunds().len(), 1);
}
