//! Principals: who an HTTP request speaks for ([`Principal`], named by a
//! static token or an OAuth access token), and one principal's share of
//! the host's tool calls. The instance pool is
//! first come, first served, so a token holder firing thousands of slow calls
//! would queue every other principal's behind them. Each authenticated
//! principal therefore has at most `[mcp] max_calls_per_principal` tool
//! calls running or waiting for an instance at once; one more is answered
//! `busy` at once, before admission — nothing run, nothing recorded, so
//! retrying the same tool call later is safe. Calls without a principal (stdio,
//! HTTP without tokens) have one client and are not counted.
//!
//! The same share, one level down: each principal has at most `[mcp]
//! max_requests_per_principal` HTTP requests open at once ([`OpenRequests`]:
//! a body being read, a response being streamed, a GET stream held open),
//! so one token holder's open streams and trickled bodies cannot take the
//! connections and memory every other principal needs. One more is
//! answered 429 before its body is read.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The authenticated principal of an HTTP request, put in its extensions
/// by the authentication middleware (a static token's, or an OAuth
/// token's, `oauth/`), which rmcp hands on to the tool call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal(pub String);

/// The tool calls each principal has in flight, capped.
pub struct CallsInFlight {
    cap: usize,
    counts: Mutex<HashMap<String, usize>>,
}

/// One counted call; dropping it (the call answered, or its request gone) frees its place.
pub struct InFlight {
    of: Arc<CallsInFlight>,
    principal: String,
}

impl CallsInFlight {
    /// At most `cap` calls in flight per principal (at least 1).
    pub fn new(cap: usize) -> Arc<Self> {
        Arc::new(Self { cap: cap.max(1), counts: Mutex::default() })
    }

    /// Counts one more call of `principal`, or `Err(cap)` if it has `cap` in flight already.
    pub fn enter(self: &Arc<Self>, principal: &str) -> Result<InFlight, usize> {
        let mut counts = self.counts.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = counts.entry(principal.to_string()).or_default();
        if *n >= self.cap {
            return Err(self.cap);
        }
        *n += 1;
        Ok(InFlight { of: self.clone(), principal: principal.to_string() })
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut counts = self.of.counts.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(n) = counts.get_mut(&self.principal) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.principal);
            }
        }
    }
}

/// Each principal's open HTTP requests, capped.
pub type OpenRequests = CallsInFlight;

/// Middleware (after authentication): counts the request against its
/// principal's `[mcp] max_requests_per_principal` until its response body
/// is done (streamed whole, or dropped when the client goes away); one past
/// the cap is answered 429 with nothing read or run.
pub(crate) async fn open_request(open: Arc<OpenRequests>, req: axum::extract::Request, next: axum::middleware::Next) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    let Some(principal) = req.extensions().get::<Principal>().map(|p| p.0.clone()) else { return next.run(req).await };
    let counted = match open.enter(&principal) {
        Ok(counted) => counted,
        Err(cap) => {
            let why = format!(
                "{cap} of your requests are already open, the most [mcp] max_requests_per_principal lets one principal have; close a \
                 stream or wait for an answer, then send this again (nothing of it was read or run)\n"
            );
            return (axum::http::StatusCode::TOO_MANY_REQUESTS, [(axum::http::header::RETRY_AFTER, "1")], why).into_response();
        }
    };
    next.run(req).await.map(|inner| axum::body::Body::new(Holding { inner, _counted: counted }))
}

/// A response body that holds its request's place until it is done.
struct Holding<B> {
    inner: B,
    _counted: InFlight,
}

impl<B: http_body::Body<Data = axum::body::Bytes> + Unpin> http_body::Body for Holding<B> {
    type Data = axum::body::Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::CallsInFlight;

    #[test]
    fn a_principal_at_its_cap_is_refused_and_others_are_not() {
        let calls = CallsInFlight::new(2);
        let (a1, a2) = (calls.enter("a").unwrap(), calls.enter("a").unwrap());
        assert_eq!(calls.enter("a").err(), Some(2), "a third call of `a` is refused");
        let b = calls.enter("b").expect("another principal has its own share");
        drop(a1);
        let a3 = calls.enter("a").expect("a finished call frees its place");
        assert_eq!(calls.counts.lock().unwrap().get("a"), Some(&2));
        drop((a2, a3, b));
        assert!(calls.counts.lock().unwrap().is_empty(), "idle principals leave no entry behind");
    }
}
