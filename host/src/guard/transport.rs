//! Puts a request on the wire with bounded retries — always the same bytes,
//! so always the same key — and classifies how it ended.
//!
//! Retried (with backoff, honouring `Retry-After`): connect errors (nothing
//! reached the downstream), 409 (a request with this key is in flight), 429,
//! and any status the downstream marks retryable (`Stripe-Should-Retry: true`,
//! Adyen's `transient-error: true`). A downstream's `…: false` stops retries.
//! Not retried: a timeout or dropped connection after sending, and a 5xx not
//! marked retryable — the outcome is unknown and is resolved, not guessed.
//!
//! "In flight" is a statement about a key, so only a downstream that honours
//! keys can make it: from one that ignores them (`honours_keys = false`, a
//! ticket desk, a chat API) a 409 is a conflict in its own business — a
//! definitive refusal handed to the plugin like any other 4xx.
//!
//! "Not sent" is said only of a send no try of which may have reached the
//! downstream's idempotency layer: once one try was answered "in flight" or
//! with a 5xx, a later try that could not connect (or was rate limited)
//! leaves the send unsettled, not unsent.

use super::prepare::Prepared;
use crate::ledger::records::{AttemptState, StoredBody, StoredResponse};
use crate::policy::{Downstream, MAX_BACKOFF};
use std::time::Duration;

/// Largest response body recorded; a larger answer is treated as unsettled.
pub const MAX_RESPONSE_BYTES: usize = 4 << 20;

/// How a send ended.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// A definitive answer: `Succeeded` (2xx) or `Failed` (4xx).
    Answered {
        /// `Succeeded` or `Failed`.
        state: AttemptState,
        /// The downstream's answer.
        response: StoredResponse,
    },
    /// It may have taken effect: `Unknown`, or `Pending` while the downstream
    /// still reports the key in flight.
    Unsettled {
        /// `Unknown` or `Pending`.
        state: AttemptState,
        /// A non-definitive answer, if one came.
        response: Option<StoredResponse>,
        /// What happened, for the model and the log.
        reason: String,
    },
    /// Nothing reached the downstream (or it refused before its idempotency layer).
    NotSent {
        /// Why nothing reached it.
        reason: String,
    },
}

/// What one try produced.
enum Try {
    Done(Outcome),
    Retry { reason: String, after: Option<Duration>, exhausted: Outcome },
}

/// Sends `prepared` to `downstream`, retrying as the module docs describe.
/// `tries` counts every time the request is put on the wire.
pub async fn perform(client: &reqwest::Client, downstream: &Downstream, prepared: &Prepared, tries: &mut u32) -> Outcome {
    let mut attempt = 0u32;
    // The last answer saying a request with this key may be in progress.
    let mut reached: Option<Outcome> = None;
    loop {
        *tries += 1;
        let result = one_try(client, downstream, prepared).await;
        match result {
            Try::Done(outcome) => return after_earlier_tries(outcome, reached),
            Try::Retry { reason, after, exhausted } => {
                if attempt >= downstream.max_retries {
                    return after_earlier_tries(exhausted, reached);
                }
                if matches!(exhausted, Outcome::Unsettled { .. }) {
                    reached = Some(exhausted);
                }
                let backoff = after.unwrap_or(downstream.backoff.saturating_mul(1 << attempt.min(16))).min(MAX_BACKOFF);
                tracing::debug!(downstream = %downstream.name, %reason, ?backoff, "retrying with the same key");
                tokio::time::sleep(backoff).await;
                attempt += 1;
            }
        }
    }
}

/// `outcome` of the last try, unless it says "not sent" after an earlier try
/// was answered in a way that leaves the request possibly in progress.
fn after_earlier_tries(outcome: Outcome, reached: Option<Outcome>) -> Outcome {
    match (outcome, reached) {
        (Outcome::NotSent { reason: last }, Some(Outcome::Unsettled { state, response, reason })) => {
            Outcome::Unsettled { state, response, reason: format!("{reason}; then {last}") }
        }
        (outcome, _) => outcome,
    }
}

async fn one_try(client: &reqwest::Client, d: &Downstream, prepared: &Prepared) -> Try {
    let method = reqwest::Method::from_bytes(prepared.method.as_bytes()).unwrap_or(reqwest::Method::POST);
    let mut request = client.request(method, prepared.url.clone()).timeout(d.timeout).body(prepared.body.clone());
    for (name, value) in &prepared.headers {
        request = request.header(name.as_str(), value.as_str());
    }
    let response = match request.send().await {
        Ok(r) => r,
        // The request could not even be built: nothing left the host. (The
        // guard checks headers before recording, so this is a last resort.)
        Err(e) if e.is_builder() => return Try::Done(Outcome::NotSent { reason: format!("the request could not be built: {}", error_chain(&e)) }),
        Err(e) if e.is_connect() => {
            let reason = format!("could not connect to {}: {}", d.name, error_chain(&e));
            return Try::Retry { reason: reason.clone(), after: None, exhausted: Outcome::NotSent { reason } };
        }
        // The server refused the TLS session itself (in TLS 1.3 its refusal of
        // our client certificate arrives after our side of the handshake): it
        // processed nothing, whatever bytes left.
        Err(e) if handshake_refused(&e).is_some() => {
            let alert = handshake_refused(&e).unwrap_or_default();
            return Try::Done(Outcome::NotSent { reason: format!("{} refused the TLS handshake ({alert})", d.name) });
        }
        // The connection closed before the client wrote the request (it hands
        // the request back unwritten): as safe to retry as a connect error.
        Err(e) if never_written(&e) => {
            let reason = format!("the connection to {} closed before the request was written: {}", d.name, error_chain(&e));
            return Try::Retry { reason: reason.clone(), after: None, exhausted: Outcome::NotSent { reason } };
        }
        Err(e) => return Try::Done(unsettled(None, unsent_reason(d, &e))),
    };
    let status = response.status().as_u16();
    let headers: Vec<(String, String)> =
        response.headers().iter().map(|(k, v)| (k.as_str().to_string(), String::from_utf8_lossy(v.as_bytes()).into_owned())).collect();
    let body = match read_capped(response).await {
        Ok(body) => body,
        Err(reason) => return Try::Done(unsettled(None, format!("HTTP {status}, but the body could not be read: {reason}"))),
    };
    let response = StoredResponse { status, headers, body: StoredBody::from_bytes(&body) };
    classify(response, d.honours_keys)
}

/// Decides what a received response from a downstream that does (or does
/// not) honour keys means.
fn classify(response: StoredResponse, honours_keys: bool) -> Try {
    let status = response.status;
    let marked = retry_mark(&response.headers);
    let after = retry_after(&response.headers);
    let in_flight = honours_keys && (status == 409 || (matches!(status, 422 | 503) && marked == Some(true)));
    if (200..300).contains(&status) {
        return Try::Done(Outcome::Answered { state: AttemptState::Succeeded, response });
    }
    if in_flight {
        let reason = format!("HTTP {status}: the downstream reports a request with this key still in flight");
        let exhausted = Outcome::Unsettled { state: AttemptState::Pending, response: Some(response), reason: reason.clone() };
        return if marked == Some(false) { Try::Done(exhausted) } else { Try::Retry { reason, after, exhausted } };
    }
    if status == 429 {
        let reason = "HTTP 429: rate limited before the downstream's idempotency layer".to_string();
        let exhausted = Outcome::NotSent { reason: reason.clone() };
        return if marked == Some(false) { Try::Done(exhausted) } else { Try::Retry { reason, after, exhausted } };
    }
    if (400..500).contains(&status) {
        // A refusal; one the downstream says to retry is retried, and stands if it lasts.
        let exhausted = Outcome::Answered { state: AttemptState::Failed, response };
        let reason = format!("HTTP {status}, marked retryable by the downstream");
        return if marked == Some(true) { Try::Retry { reason, after, exhausted } } else { Try::Done(exhausted) };
    }
    // 5xx (and anything unexpected): indeterminate unless the downstream says to retry.
    let reason = format!("HTTP {status}: an indeterminate answer (the request may or may not have taken effect)");
    let exhausted = Outcome::Unsettled { state: AttemptState::Unknown, response: Some(response), reason: reason.clone() };
    if marked == Some(true) { Try::Retry { reason, after, exhausted } } else { Try::Done(exhausted) }
}

fn unsettled(response: Option<StoredResponse>, reason: String) -> Outcome {
    Outcome::Unsettled { state: AttemptState::Unknown, response, reason }
}

fn unsent_reason(d: &Downstream, e: &reqwest::Error) -> String {
    if e.is_timeout() {
        format!("no answer from {} within {} ms", d.name, d.timeout.as_millis())
    } else {
        format!("the exchange with {} broke off: {}", d.name, error_chain(e))
    }
}

/// `Stripe-Should-Retry` or Adyen's `transient-error`, if present.
fn retry_mark(headers: &[(String, String)]) -> Option<bool> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("stripe-should-retry") || k.eq_ignore_ascii_case("transient-error"))
        .map(|(_, v)| v.trim().eq_ignore_ascii_case("true"))
}

/// `Retry-After`, if present: seconds, or an HTTP-date (the wait until
/// then; none if it passed). The caller caps it at [`MAX_BACKOFF`].
fn retry_after(headers: &[(String, String)]) -> Option<Duration> {
    let (_, v) = headers.iter().find(|(k, _)| k.eq_ignore_ascii_case("retry-after"))?;
    let v = v.trim();
    match v.parse::<u64>() {
        Ok(seconds) => Some(Duration::from_secs(seconds)),
        Err(_) => httpdate::parse_http_date(v).ok().map(|at| at.duration_since(std::time::SystemTime::now()).unwrap_or_default()),
    }
}

/// The body of a downstream's answer, at most [`MAX_RESPONSE_BYTES`].
async fn read_capped(response: reqwest::Response) -> Result<Vec<u8>, String> {
    crate::net::body::collect_within(response, MAX_RESPONSE_BYTES as u64).await.map_err(|e| match e {
        crate::net::body::BodyError::TooLarge => format!("it exceeds {MAX_RESPONSE_BYTES} bytes"),
        crate::net::body::BodyError::Transport(e) => error_chain(&e),
        crate::net::body::BodyError::Sink(e) => e.to_string(),
    })
}

/// The TLS alert by which the server refused the handshake, if that is how
/// `e` came about: a refusal of the session, not of a request.
fn handshake_refused(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    use rustls::AlertDescription as A;
    causes(e).find_map(|cause| match cause.downcast_ref::<rustls::Error>() {
        Some(rustls::Error::AlertReceived(alert))
            if matches!(
                alert,
                A::CertificateRequired
                    | A::BadCertificate
                    | A::UnsupportedCertificate
                    | A::CertificateRevoked
                    | A::CertificateExpired
                    | A::CertificateUnknown
                    | A::UnknownCA
                    | A::AccessDenied
                    | A::HandshakeFailure
                    | A::ProtocolVersion
                    | A::InsufficientSecurity
            ) =>
        {
            Some(format!("{alert:?}"))
        }
        _ => None,
    })
}

/// Whether `e` is hyper's "canceled": every place hyper makes it (a
/// connection not ready, or closed with the request still queued), it hands
/// the request back without having written a byte of it.
fn never_written(e: &(dyn std::error::Error + 'static)) -> bool {
    causes(e).any(|cause| cause.downcast_ref::<hyper::Error>().is_some_and(hyper::Error::is_canceled))
}

/// `e` and every error beneath it, including the one an `io::Error` wraps
/// (which it hides from `source()`).
fn causes<'a>(e: &'a (dyn std::error::Error + 'static)) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    let mut next = Some(e);
    let mut wrapped: Option<&'a (dyn std::error::Error + 'static)> = None;
    std::iter::from_fn(move || {
        if let Some(inner) = wrapped.take() {
            next = inner.source();
            return Some(inner);
        }
        let err = next?;
        wrapped = err.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref()).map(|i| i as &(dyn std::error::Error + 'static));
        next = if wrapped.is_some() { None } else { err.source() };
        Some(err)
    })
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
#[path = "transport_tests.rs"]
mod tests;
