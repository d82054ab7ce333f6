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
