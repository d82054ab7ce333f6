//! When an answer has left the host. The hold rule counts a call's lifetime
//! until a definitive outcome *reached the caller* (`docs/guard.md`), so the
//! host records what it told a caller only once the response is written:
//!
//! - over stdio, when the transport has written and flushed the JSON-RPC
//!   response ([`Delivering`] wraps rmcp's transport);
//! - over Streamable HTTP, when the response body (JSON or the request's
//!   event stream) has been sent to its end ([`Slot`] rides in the HTTP
//!   request's extensions, which rmcp hands to the tool call).
//!
//! A response that never went out (the client went away) is not recorded:
//! the call counts as never answered, and an identical repeat is held.

use crate::error::CallError;
use crate::runtime::{CallOutput, CallRequest, Runtime};
use rmcp::model::RequestId;
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use rmcp::RoleServer;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// An answer waiting to leave the host.
pub(crate) struct Answer {
    pub(crate) request: CallRequest,
    pub(crate) answer: Result<CallOutput, CallError>,
}

impl Answer {
    /// Records that the caller was told it, its response having been
    /// written at `at_ms`.
    pub(crate) async fn delivered(self, runtime: &Runtime, at_ms: u64) {
        runtime.report_at(&self.request, &self.answer, at_ms).await;
    }
}

/// Answers of a stdio session waiting to be written, by JSON-RPC request id.
/// `None` marks an id a client used for two requests in flight at once
/// (JSON-RPC forbids it): a response with that id cannot tell which answer
/// it carried, so neither is recorded as told — the safe side.
#[derive(Default)]
pub(crate) struct Pending(Mutex<HashMap<RequestId, Option<Answer>>>);

impl Pending {
    pub(crate) fn insert(&self, id: RequestId, answer: Answer) {
        let mut map = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match map.entry(id) {
            std::collections::hash_map::Entry::Occupied(mut taken) => *taken.get_mut() = None,
            std::collections::hash_map::Entry::Vacant(free) => {
                free.insert(Some(answer));
            }
        }
    }

    fn take(&self, id: &RequestId) -> Option<Answer> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(id).flatten()
    }
}

/// A server transport that records an answer once its response was written.
pub(crate) struct Delivering<T> {
    pub(crate) inner: T,
    pub(crate) pending: Arc<Pending>,
    pub(crate) runtime: Arc<Runtime>,
}

impl<T: Transport<RoleServer>> Transport<RoleServer> for Delivering<T> {
    type Error = T::Error;

    fn send(&mut self, item: TxJsonRpcMessage<RoleServer>) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let id = match &item {
            rmcp::model::JsonRpcMessage::Response(r) => Some(r.id.clone()),
            _ => None,
        };
        let sent = self.inner.send(item);
        let (pending, runtime) = (self.pending.clone(), self.runtime.clone());
        async move {
            sent.await?;
            if let Some(answer) = id.and_then(|id| pending.take(&id)) {
                answer.delivered(&runtime, crate::ledger::records::now_ms()).await;
            }
            Ok(())
        }
    }

    fn receive(&mut self) -> impl Future<Output = Option<RxJsonRpcMessage<RoleServer>>> + Send {
        self.inner.receive()
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}

/// The answers one HTTP request produced, recorded when its response body
/// has been sent to its end. Put in the request's extensions by [`track`].
#[derive(Clone, Default)]
pub(crate) struct Slot(Arc<Mutex<Vec<Answer>>>);

impl Slot {
    pub(crate) fn push(&self, answer: Answer) {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(answer);
    }

    fn take(&self) -> Vec<Answer> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
    }
}

/// Middleware: gives the request a [`Slot`], and records the answers put in
/// it once the response body has been sent whole.
pub(crate) async fn track(runtime: Arc<Runtime>, mut req: axum::extract::Request, next: axum::middleware::Next) -> axum::response::Response {
    let slot = Slot::default();
    req.extensions_mut().insert(slot.clone());
    let response = next.run(req).await;
    response.map(|inner| {
        let expected = http_body::Body::size_hint(&inner).exact();
        axum::body::Body::new(Delivered { inner, slot, runtime, expected, sent: 0, ended: false })
    })
}

/// A response body that records its slot's answers once the server has taken
/// all of it: its end was polled, or every byte of a body of known length.
/// A body dropped before that (the client went away) records nothing.
struct Delivered {
    inner: axum::body::Body,
    slot: Slot,
    runtime: Arc<Runtime>,
    expected: Option<u64>,
    sent: u64,
    ended: bool,
}

impl http_body::Body for Delivered {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            std::task::Poll::Ready(Some(Ok(frame))) => self.sent += frame.data_ref().map_or(0, |d| d.len() as u64),
            std::task::Poll::Ready(None) => self.ended = true,
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Delivered {
    fn drop(&mut self) {
        let whole = self.ended || self.expected == Some(self.sent);
        let answers = self.slot.take();
        if !whole || answers.is_empty() {
            return;
        }
        let (runtime, at_ms) = (self.runtime.clone(), crate::ledger::records::now_ms());
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                for answer in answers {
                    answer.delivered(&runtime, at_ms).await;
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(call_id: &str) -> Answer {
        let request = CallRequest { session: "s".into(), call_id: call_id.into(), tool: "refund".into(), args_json: "{}".into(), principal: None };
        Answer { request, answer: Ok(CallOutput { value: serde_json::Value::Null, replayed: false }) }
    }

    #[test]
    fn a_response_is_matched_to_its_answer_by_request_id() {
        let pending = Pending::default();
        pending.insert(RequestId::Number(1), answer("a"));
        pending.insert(RequestId::Number(2), answer("b"));
        assert_eq!(pending.take(&RequestId::Number(2)).map(|a| a.request.call_id), Some("b".into()));
        assert_eq!(pending.take(&RequestId::Number(1)).map(|a| a.request.call_id), Some("a".into()));
        assert!(pending.take(&RequestId::Number(1)).is_none(), "recorded once");
    }

    #[test]
    fn an_id_used_twice_at_once_records_neither_answer() {
        let pending = Pending::default();
        pending.insert(RequestId::Number(7), answer("a"));
        pending.insert(RequestId::Number(7), answer("b"));
        assert!(pending.take(&RequestId::Number(7)).is_none(), "the first response cannot tell whose answer it carried");
        assert!(pending.take(&RequestId::Number(7)).is_none());
    }
}
