//! Tests of how the transport classifies what a try produced.

use super::*;
use hyper_util::rt::TokioIo;
use tokio::io::AsyncReadExt;

/// The error a bare HTTP/1 client gets for one request when the server
/// side behaves as `server` does with its end of the connection.
async fn client_error(server: impl FnOnce(tokio::io::DuplexStream) -> tokio::task::JoinHandle<()>, wait_for_close: bool) -> hyper::Error {
    let (ours, theirs) = tokio::io::duplex(64 << 10);
    let peer = server(theirs);
    let (mut sender, conn) = hyper::client::conn::http1::handshake::<_, String>(TokioIo::new(ours)).await.unwrap();
    let conn = tokio::spawn(conn);
    if wait_for_close {
        let _ = conn.await;
    }
    let request = hyper::Request::post("http://provider.test/v1/refunds").body("amount=500".to_string()).unwrap();
    let err = sender.send_request(request).await.unwrap_err();
    peer.await.unwrap();
    err
}

#[tokio::test]
async fn a_request_handed_back_unwritten_is_never_written_and_one_cut_off_is_not() {
    // The server closes before the request is handed over (as a server
    // refusing a TLS 1.3 client certificate may): hyper gives it back.
    let closed = client_error(|s| tokio::spawn(async move { drop(s) }), true).await;
    assert!(closed.is_canceled(), "{closed}");
    assert!(never_written(&closed), "{closed}");
    // The server reads the request, then drops the connection: it may have acted.
    let cut = client_error(
        |mut s| {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let _ = s.read(&mut buf).await;
            })
        },
        false,
    )
    .await;
    assert!(!never_written(&cut), "{cut}");
}

#[test]
fn not_sent_after_an_in_flight_answer_stays_unsettled() {
    let in_flight = Outcome::Unsettled { state: AttemptState::Pending, response: None, reason: "HTTP 409".into() };
    let then = after_earlier_tries(Outcome::NotSent { reason: "HTTP 429".into() }, Some(in_flight));
    assert!(matches!(&then, Outcome::Unsettled { state: AttemptState::Pending, reason, .. } if reason == "HTTP 409; then HTTP 429"), "{then:?}");
    let first = after_earlier_tries(Outcome::NotSent { reason: "refused".into() }, None);
    assert!(matches!(first, Outcome::NotSent { .. }));
}

/// A response with `status` and the given headers, and an empty body.
fn answer(status: u16, headers: &[(&str, &str)]) -> StoredResponse {
    let headers = headers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    StoredResponse { status, headers, body: StoredBody::from_bytes(b"") }
}

#[test]
fn a_409_means_a_key_in_flight_only_from_a_downstream_that_honours_keys() {
    let keyed = classify(answer(409, &[]), true);
    assert!(matches!(keyed, Try::Retry { exhausted: Outcome::Unsettled { state: AttemptState::Pending, .. }, .. }));
    // A desk that ignores keys cannot have one in flight: its 409 is its answer.
    let unkeyed = classify(answer(409, &[]), false);
    assert!(matches!(unkeyed, Try::Done(Outcome::Answered { state: AttemptState::Failed, .. })));
    // Adyen's "in progress" (422 + transient-error) likewise; a marked 503
    // from it is a retryable 5xx, unknown if it lasts.
    let adyen = classify(answer(422, &[("transient-error", "true")]), false);
    assert!(matches!(adyen, Try::Retry { exhausted: Outcome::Answered { state: AttemptState::Failed, .. }, .. }));
    let busy = classify(answer(503, &[("transient-error", "true")]), false);
    assert!(matches!(busy, Try::Retry { exhausted: Outcome::Unsettled { state: AttemptState::Unknown, .. }, .. }));
}

#[test]
fn a_refusal_the_downstream_marks_retryable_is_retried_and_stands_if_it_lasts() {
    let marked = classify(answer(400, &[("Stripe-Should-Retry", "true")]), true);
    assert!(matches!(marked, Try::Retry { exhausted: Outcome::Answered { state: AttemptState::Failed, .. }, .. }));
    for plain in [answer(400, &[]), answer(400, &[("Stripe-Should-Retry", "false")])] {
        assert!(matches!(classify(plain, true), Try::Done(Outcome::Answered { state: AttemptState::Failed, .. })));
    }
}

#[test]
fn retry_after_is_read_as_seconds_or_as_a_date() {
    let after = |v: &str| retry_after(&[("Retry-After".to_string(), v.to_string())]);
    assert_eq!(after("2"), Some(Duration::from_secs(2)));
    let soon = httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(30));
    assert!(after(&soon).is_some_and(|d| d > Duration::from_secs(25) && d <= Duration::from_secs(30)), "{soon}: {:?}", after(&soon));
    assert_eq!(after("Wed, 21 Oct 2015 07:28:00 GMT"), Some(Duration::ZERO), "a date gone by: retry now");
    assert_eq!(after("soon"), None, "unreadable: the downstream's own backoff");
}
