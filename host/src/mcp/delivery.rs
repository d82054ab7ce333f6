//! When an answer has left the host. The hold rule counts a call's lifetime
//! until a definitive outcome *reached the caller* (`docs/guard.md`), so the
//! host records what it told a caller only once the response is written:
//!
//! - over stdio, when the transport has written and flushed the JSON-RPC
//!   response ([`Delivering`] wraps rmcp's transport);
//! - over Streamable HTTP, when the frame of the response body carrying the
//!   JSON-RPC response (the JSON body, or its event on the request's event
//!   stream) has been handed to the HTTP server to write ([`Slot`] rides in
//!   the HTTP request's extensions, which rmcp hands to the tool call).
//!
//! A response that never went out (the client went away) is not recorded:
//! the call counts as never answered, and an identical repeat is held.

use crate::error::CallError;
use crate::runtime::{CallOutput, CallRequest, Runtime};
use rmcp::RoleServer;
use rmcp::model::RequestId;
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// An answer waiting to leave the host.
pub(crate) struct Answer {
    pub(crate) request: CallRequest,
    pub(crate) answer: Result<CallOutput, CallError>,
    /// The generation that ran the call: what it told is judged by its
    /// rules, even after a reload.
    pub(crate) runtime: Arc<Runtime>,
}

impl Answer {
    /// Records that the caller was told it, its response having been
    /// written at `at_ms`.
    pub(crate) async fn delivered(self, at_ms: u64) {
        self.runtime.report_at(&self.request, &self.answer, at_ms).await;
    }
}

/// Answers of a stdio session waiting to be written, by JSON-RPC request id,
/// each with when it came. `None` marks an id a client used for two
/// requests in flight at once (JSON-RPC forbids it): a response with that id
/// cannot tell which answer it carried, so neither is recorded as told — the
/// safe side. An answer whose response rmcp never writes (the client
/// cancelled its request: rmcp drops the response) would stay for good, so
/// answers older than [`STALE`] are let go once many wait — unrecorded,
/// which is again the safe side.
#[derive(Default)]
pub(crate) struct Pending(Mutex<HashMap<RequestId, (Instant, Option<Answer>)>>);

/// How long an answer waits for its response to be written before it may
/// be let go (a response is written in microseconds unless the client stops
/// reading).
const STALE: Duration = Duration::from_secs(60);

/// How many answers may wait before the stale ones are let go.
const SWEEP_AT: usize = 256;

impl Pending {
    pub(crate) fn insert(&self, id: RequestId, answer: Answer) {
        let mut map = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if map.len() >= SWEEP_AT {
            map.retain(|_, (since, _)| since.elapsed() < STALE);
        }
        match map.entry(id) {
            std::collections::hash_map::Entry::Occupied(mut taken) => taken.get_mut().1 = None,
            std::collections::hash_map::Entry::Vacant(free) => {
                free.insert((Instant::now(), Some(answer)));
            }
        }
    }

    fn take(&self, id: &RequestId) -> Option<Answer> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(id).and_then(|(_, answer)| answer)
    }
}

/// A server transport that records an answer once its response was written.
pub(crate) struct Delivering<T> {
    pub(crate) inner: T,
    pub(crate) pending: Arc<Pending>,
}

impl<T: Transport<RoleServer>> Transport<RoleServer> for Delivering<T> {
    type Error = T::Error;

    fn send(&mut self, item: TxJsonRpcMessage<RoleServer>) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let id = match &item {
            rmcp::model::JsonRpcMessage::Response(r) => Some(r.id.clone()),
            _ => None,
        };
        let sent = self.inner.send(item);
        let pending = self.pending.clone();
        async move {
            sent.await?;
            if let Some(answer) = id.and_then(|id| pending.take(&id)) {
                answer.delivered(crate::ledger::records::now_ms()).await;
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

/// The answer one HTTP request produced and the JSON-RPC id of the request,
/// recorded once the response carrying it has left. Put in the request's
/// extensions by [`track`].
#[derive(Clone, Default)]
pub(crate) struct Slot(Arc<Mutex<Vec<(RequestId, Answer)>>>);

impl Slot {
    pub(crate) fn push(&self, id: RequestId, answer: Answer) {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push((id, answer));
    }

    fn is_empty(&self) -> bool {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).is_empty()
    }

    /// Takes the answers whose response `frame` carries. An answer whose
    /// request id the frame's response has, but for another tool call (its
    /// `_meta` names another), is dropped unrecorded: a client that used one
    /// JSON-RPC id for two requests at once got another call's response on
    /// this stream, and this call's answer will not follow on it.
    fn answered_by(&self, frame: &[u8]) -> Vec<Answer> {
        let mut slot = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let responses = responses_in(frame);
        let mut told = Vec::new();
        for (id, answer) in std::mem::take(&mut *slot) {
            match responses.iter().find(|(r, _)| *r == id) {
                None => slot.push((id, answer)),
                Some((_, Some(call_id))) if *call_id != answer.request.call_id => {
                    tracing::warn!(%call_id, mine = %answer.request.call_id, "a client used one JSON-RPC id for two calls at once; this call is not recorded as told");
                }
                Some(_) => told.push(answer),
            }
        }
        told
    }
}

/// The ids of the JSON-RPC responses (results or errors) in one frame of a
/// response body — a whole JSON body, or a server-sent event whose `data`
/// lines carry one message (rmcp writes one event per frame) — each with
/// the tool-call id its result names in `_meta`, if it names one.
fn responses_in(frame: &[u8]) -> Vec<(RequestId, Option<String>)> {
    let Ok(text) = std::str::from_utf8(frame) else { return Vec::new() };
    let json = if text.trim_start().starts_with('{') {
        text.to_string()
    } else {
        let data: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("data:")).map(|d| d.strip_prefix(' ').unwrap_or(d)).collect();
        data.join("\n")
    };
    let Ok(message) = serde_json::from_str::<serde_json::Value>(&json) else { return Vec::new() };
    let is_response = message.get("result").is_some() || message.get("error").is_some();
    let call_id = message.pointer("/result/_meta").and_then(|m| m.get(super::ids::CALL_ID_KEY)).and_then(|c| c.as_str()).map(str::to_string);
    match message.get("id").cloned().map(serde_json::from_value::<RequestId>) {
        Some(Ok(id)) if is_response => vec![(id, call_id)],
        _ => Vec::new(),
    }
}

/// Records answers as told at `at_ms`.
type Record = Arc<dyn Fn(Vec<Answer>, u64) + Send + Sync>;

/// What a request keeps until its response body is done (sent or dropped),
/// such as the JSON-RPC ids it holds (`super::request_ids`): put in the
/// request's extensions by an outer layer, kept by [`Delivered`].
#[derive(Clone)]
pub(crate) struct KeptUntilAnswered {
    _value: Arc<dyn std::any::Any + Send + Sync>,
}

impl KeptUntilAnswered {
    /// Keeps `value` until the response body of the request it rides in is done.
    pub(crate) fn new(value: impl std::any::Any + Send + Sync) -> Self {
        Self { _value: Arc::new(value) }
    }
}

/// Middleware: gives the request a [`Slot`], and records its answer once
/// the response carrying it has left.
pub(crate) async fn track(mut req: axum::extract::Request, next: axum::middleware::Next) -> axum::response::Response {
    let slot = Slot::default();
    req.extensions_mut().insert(slot.clone());
    let kept = req.extensions_mut().remove::<KeptUntilAnswered>();
    let response = next.run(req).await;
    let record: Record = Arc::new(move |answers, at_ms| {
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                for answer in answers {
                    answer.delivered(at_ms).await;
                }
            });
        }
    });
    response.map(|inner| axum::body::Body::new(Delivered { inner, slot, record, _kept: kept }))
}

/// A response body that records its slot's answers as told once the frame
/// carrying their JSON-RPC response has been handed to the HTTP server to
/// write — the counterpart of a flushed write on stdio. Clients commonly
/// close an event stream as soon as they have read the response, before the
/// server has polled the stream's end, so its end is not what counts; nor
/// does a body that ended or was dropped without that frame tell anything,
/// whatever its slot holds (a cancelled request's stream ends without its
/// response, which rmcp drops, possibly just after the answer came). It
/// keeps what its request asked to be kept until it is done.
struct Delivered<B> {
    inner: B,
    slot: Slot,
    record: Record,
    _kept: Option<KeptUntilAnswered>,
}

impl<B: http_body::Body<Data = axum::body::Bytes> + Unpin> http_body::Body for Delivered<B> {
    type Data = axum::body::Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_frame(cx);
        if let std::task::Poll::Ready(Some(Ok(frame))) = &polled
            && let Some(data) = frame.data_ref()
            && !self.slot.is_empty()
        {
            let told = self.slot.answered_by(data);
            if !told.is_empty() {
                (self.record)(told, crate::ledger::records::now_ms());
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(call_id: &str) -> Answer {
        let request = CallRequest { session: "s".into(), call_id: call_id.into(), tool: "refund".into(), args_json: "{}".into(), ..Default::default() };
        Answer { request, answer: Ok(CallOutput { value: serde_json::Value::Null, replayed: false }), runtime: runtime() }
    }

    /// One small runtime for every answer of these tests (it is never asked anything).
    fn runtime() -> Arc<Runtime> {
        static RUNTIME: std::sync::OnceLock<Arc<Runtime>> = std::sync::OnceLock::new();
        let engine = crate::config::EngineConfig { pool_instances: 1, ..Default::default() };
        RUNTIME.get_or_init(|| Arc::new(Runtime::new(&engine, std::env::temp_dir().join("toolguard-delivery-tests")).unwrap())).clone()
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

    #[test]
    fn answers_never_written_are_let_go_once_stale_and_many() {
        let pending = Pending::default();
        pending.insert(RequestId::Number(0), answer("cancelled"));
        {
            let mut map = pending.0.lock().unwrap();
            let since = &mut map.get_mut(&RequestId::Number(0)).unwrap().0;
            *since = since.checked_sub(STALE).expect("the machine has been up a minute");
        }
        for n in 1..SWEEP_AT as i64 {
            pending.insert(RequestId::Number(n), answer("waiting"));
        }
        assert_eq!(pending.0.lock().unwrap().len(), SWEEP_AT, "nothing is let go below the mark");
        pending.insert(RequestId::Number(1_000), answer("new"));
        assert!(pending.take(&RequestId::Number(0)).is_none(), "the stale answer was let go");
        assert_eq!(pending.0.lock().unwrap().len(), SWEEP_AT, "the fresh ones stay");
        assert!(pending.take(&RequestId::Number(1)).is_some());
    }

    /// A body that yields its frames, then ends if told to, else stays
    /// pending (its end never comes).
    struct Frames(std::collections::VecDeque<&'static str>, bool);

    impl http_body::Body for Frames {
        type Data = axum::body::Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
            match self.0.pop_front() {
                Some(f) => std::task::Poll::Ready(Some(Ok(http_body::Frame::data(axum::body::Bytes::from_static(f.as_bytes()))))),
                None if self.1 => std::task::Poll::Ready(None),
                None => std::task::Poll::Pending,
            }
        }
    }

    /// Polls a body of `frames` until it stops yielding, then drops it; the call ids recorded as told.
    fn serve(frames: &[&'static str], id: RequestId) -> Vec<String> {
        serve_then(frames, id, false)
    }

    /// [`serve`], the body ending after its frames if `ends`.
    fn serve_then(frames: &[&'static str], id: RequestId, ends: bool) -> Vec<String> {
        let told = Arc::new(Mutex::new(Vec::new()));
        let sink = told.clone();
        let record: Record = Arc::new(move |answers, _| sink.lock().unwrap().extend(answers.into_iter().map(|a| a.request.call_id)));
        let slot = Slot::default();
        slot.push(id, answer("a"));
        let mut body = Delivered { inner: Frames(frames.iter().copied().collect(), ends), slot, record, _kept: None };
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        while let std::task::Poll::Ready(Some(_)) = http_body::Body::poll_frame(std::pin::Pin::new(&mut body), &mut cx) {}
        drop(body);
        told.lock().unwrap().clone()
    }

    #[test]
    fn an_event_stream_closed_by_the_client_after_its_response_still_counts_as_told() {
        // The official Python SDK closes the stream as soon as it read the response.
        let frames = ["id: 0\nretry: 3000\ndata:\n\n", "id: 1\ndata: {\"jsonrpc\":\"2.0\",\"id\":4,\"result\":{\"content\":[]}}\n\n"];
        assert_eq!(serve(&frames, RequestId::Number(4)), ["a"]);
        // An error response counts the same; so does a string id.
        let error = ["data: {\"jsonrpc\":\"2.0\",\"id\":\"r-4\",\"error\":{\"code\":-32603,\"message\":\"x\"}}\n\n"];
        assert_eq!(serve(&error, RequestId::String("r-4".into())), ["a"]);
        // A JSON (not event-stream) body.
        assert_eq!(serve(&["{\"jsonrpc\":\"2.0\",\"id\":4,\"result\":{}}"], RequestId::Number(4)), ["a"]);
    }

    #[test]
    fn another_calls_response_under_the_same_request_id_does_not_tell_this_caller() {
        // A client sent two calls as request 7 at once; the other one's
        // response (tool call `b`) came out on this call's (`a`'s) stream.
        let crossed = ["data: {\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"content\":[],\"_meta\":{\"toolguard/toolCallId\":\"b\"}}}\n\n"];
        assert!(serve(&crossed, RequestId::Number(7)).is_empty(), "not told");
        assert!(serve_then(&crossed, RequestId::Number(7), true).is_empty(), "not even when the stream ends after it");
        let own = ["data: {\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"content\":[],\"_meta\":{\"toolguard/toolCallId\":\"a\"}}}\n\n"];
        assert_eq!(serve(&own, RequestId::Number(7)), ["a"], "its own response tells it");
    }

    #[test]
    fn a_stream_that_ended_without_its_response_records_nothing() {
        // The client cancelled: rmcp ends the request's stream and drops the
        // response. The call finished just before the stream's end was
        // polled, so its answer is in the slot; it was never written.
        let told = Arc::new(Mutex::new(Vec::new()));
        let sink = told.clone();
        let record: Record = Arc::new(move |answers, _| sink.lock().unwrap().extend(answers.into_iter().map(|a| a.request.call_id)));
        let slot = Slot::default();
        let mut body = Delivered { inner: Frames(["id: 0\nretry: 3000\ndata:\n\n"].into_iter().collect(), true), slot: slot.clone(), record, _kept: None };
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        assert!(matches!(http_body::Body::poll_frame(std::pin::Pin::new(&mut body), &mut cx), std::task::Poll::Ready(Some(_))));
        slot.push(RequestId::Number(5), answer("a"));
        assert!(matches!(http_body::Body::poll_frame(std::pin::Pin::new(&mut body), &mut cx), std::task::Poll::Ready(None)), "the stream ended");
        drop(body);
        assert!(told.lock().unwrap().is_empty(), "not told: its response never went out");
    }

    #[test]
    fn a_stream_dropped_before_its_response_left_records_nothing() {
        // Only the priming event and a notification went out; then the client went away.
        let frames = ["id: 0\nretry: 3000\ndata:\n\n", "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{\"id\":4}}\n\n"];
        assert!(serve(&frames, RequestId::Number(4)).is_empty());
        // Another request's response does not tell this one's caller.
        assert!(serve(&["data: {\"jsonrpc\":\"2.0\",\"id\":5,\"result\":{}}\n\n"], RequestId::Number(4)).is_empty());
        // A JSON body cut short.
        assert!(serve(&["{\"jsonrpc\":\"2.0\",\"id\":4,\"res"], RequestId::Number(4)).is_empty());
    }
}
