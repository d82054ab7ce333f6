//! A Stripe-like payments provider for toolguard's tests and demo: refunds on
//! payment intents with real idempotency semantics (stored responses replayed
//! with `Idempotent-Replayed: true`, 409 while a key is executing, an error
//! on key reuse with other parameters, a retention clock tests can advance)
//! and fault injection around the commit. It exposes its ledger, so tests
//! count refunds rather than trusting anyone's return value.
//!
//! It speaks Stripe's wire format for this subset: form-encoded
//! `POST /v1/refunds` (`payment_intent`, `amount`, `reason`, `metadata[…]`),
//! `GET /v1/refunds?payment_intent=…` (newest first, in pages: `limit`,
//! `has_more`, `starting_after`), `GET /v1/refunds/{id}`.
//! Control endpoints live under `/_sandbox` (see [`http`]).

pub mod config;
mod http;
mod provider;
mod tickets;

pub use config::PaymentsConfig;
pub use provider::{Fault, Mode, PaymentIntent, Refund, is_uuid};
pub use tickets::Ticket;

use hyper_util::rt::TokioIo;
use serde::Serialize;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower::ServiceExt as _;

/// How long keys are kept by default (Stripe: at least 24 h).
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// One request as the sandbox received it.
#[derive(Debug, Clone, Serialize)]
pub struct Observed {
    /// Arrival order, from 0.
    pub seq: u64,
    pub method: String,
    pub path: String,
    pub query: String,
    /// Every header, lower-case names.
    pub headers: Vec<(String, String)>,
    /// The raw `Idempotency-Key` header, if sent; else the
    /// `idempotency_key` query parameter, if sent.
    pub idempotency_key: Option<String>,
    pub body: String,
}

/// A callback run for every request as it arrives, before it is processed.
pub type Observer = Box<dyn Fn(&Observed) + Send + Sync>;

/// State shared by the handle and the server.
pub(crate) struct Shared {
    provider: Mutex<provider::Provider>,
    requests: Mutex<Vec<Observed>>,
    observers: Mutex<Vec<Observer>>,
    seq: AtomicU64,
    release: tokio::sync::watch::Sender<u64>,
    paused: AtomicUsize,
    /// The API key `/v1` requests must carry as `Authorization: Bearer …`, if any.
    api_key: Mutex<Option<String>>,
}

impl Shared {
    fn add_intent(&self, id: &str, amount: u64, refund_status: &str) {
        let intent = PaymentIntent { id: id.into(), amount, currency: "usd".into(), refund_status: refund_status.into() };
        self.provider.lock().unwrap().intents.insert(id.into(), intent);
    }

    fn set_refund_status(&self, id: &str, status: &str) -> bool {
        let mut p = self.provider.lock().unwrap();
        p.refunds.iter_mut().find(|r| r.id == id).map(|r| r.status = status.into()).is_some()
    }

    /// Waits until the next release.
    async fn pause(&self) {
        let mut rx = self.release.subscribe();
        self.paused.fetch_add(1, Ordering::SeqCst);
        let _ = rx.changed().await;
        self.paused.fetch_sub(1, Ordering::SeqCst);
    }

    fn release(&self) {
        self.release.send_modify(|g| *g += 1);
    }
}

/// A running sandbox. Dropping it stops the server.
pub struct Sandbox {
    shared: Arc<Shared>,
    addr: SocketAddr,
    server: tokio::task::JoinHandle<()>,
    /// Whether it speaks HTTPS.
    tls: bool,
}

/// The TLS side of the sandbox's server, re-exported for tests that build one.
pub use tokio_rustls::rustls;

impl Sandbox {
    /// Starts a sandbox on `addr` (`127.0.0.1:0` for any free port) with the
    /// given semantics and key retention. No payment intents exist yet.
    ///
    /// # Errors
    /// The address cannot be bound.
    pub async fn start(addr: &str, mode: Mode, retention: Duration) -> std::io::Result<Self> {
        Self::start_with(addr, mode, retention, None).await
    }

    /// [`Sandbox::start`], serving HTTPS with `tls` (its certificate, and
    /// client-certificate verification if it asks for it).
    ///
    /// # Errors
    /// The address cannot be bound.
    pub async fn start_tls(addr: &str, mode: Mode, retention: Duration, tls: Arc<rustls::ServerConfig>) -> std::io::Result<Self> {
        Self::start_with(addr, mode, retention, Some(tls)).await
    }

    async fn start_with(addr: &str, mode: Mode, retention: Duration, tls: Option<Arc<rustls::ServerConfig>>) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            provider: Mutex::new(provider::Provider::new(mode, retention)),
            requests: Mutex::new(Vec::new()),
            observers: Mutex::new(Vec::new()),
            seq: AtomicU64::new(0),
            release: tokio::sync::watch::channel(0).0,
            paused: AtomicUsize::new(0),
            api_key: Mutex::new(None),
        });
        let secure = tls.is_some();
        let server = tokio::spawn(serve(listener, http::router(shared.clone()), tls.map(tokio_rustls::TlsAcceptor::from)));
        Ok(Self { shared, addr, server, tls: secure })
    }

    /// The base URL, e.g. `http://127.0.0.1:4242` (`https://…` when serving TLS).
    pub fn url(&self) -> String {
        format!("{}://{}", if self.tls { "https" } else { "http" }, self.addr)
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Adds (or replaces) a payment intent of `amount` cents whose refunds succeed at once.
    pub fn add_payment_intent(&self, id: &str, amount: u64) {
        self.shared.add_intent(id, amount, "succeeded");
    }

    /// Adds a payment intent whose new refunds start in `refund_status`
    /// (e.g. `pending`, `requires_action`).
    pub fn add_payment_intent_with_status(&self, id: &str, amount: u64, refund_status: &str) {
        self.shared.add_intent(id, amount, refund_status);
    }

    /// Moves a refund to `status` (e.g. `succeeded` → `failed`, as a later
    /// `refund.failed` event would). False if there is no such refund.
    pub fn set_refund_status(&self, id: &str, status: &str) -> bool {
        self.shared.set_refund_status(id, status)
    }

    /// Makes a refund of `amount` cents of `payment_intent` the way another
    /// client of the provider would (its dashboard, another system), with
    /// no key: the status (200 or 4xx) and body it answered.
    pub fn refund_elsewhere(&self, payment_intent: &str, amount: u64) -> (u16, serde_json::Value) {
        let params = std::collections::BTreeMap::from([("payment_intent".to_string(), payment_intent.to_string()), ("amount".to_string(), amount.to_string())]);
        self.shared.provider.lock().unwrap().create_refund(&params)
    }

    /// Queues a fault for the next refund creation.
    pub fn inject(&self, fault: Fault) {
        self.shared.provider.lock().unwrap().faults.push_back(fault);
    }

    /// Drops the injected faults no request has met yet (the request they
    /// were aimed at never came).
    pub fn clear_faults(&self) {
        self.shared.provider.lock().unwrap().faults.clear();
    }

    /// Every refund ever created: the provider's ledger.
    pub fn refunds(&self) -> Vec<Refund> {
        self.shared.provider.lock().unwrap().refunds.clone()
    }

    /// Every ticket the ticket desk ever opened.
    pub fn tickets(&self) -> Vec<Ticket> {
        self.shared.provider.lock().unwrap().tickets.clone()
    }

    /// Every request received, in order.
    pub fn requests(&self) -> Vec<Observed> {
        self.shared.requests.lock().unwrap().clone()
    }

    /// Runs `observer` for every request as it arrives.
    pub fn on_request(&self, observer: impl Fn(&Observed) + Send + Sync + 'static) {
        self.shared.observers.lock().unwrap().push(Box::new(observer));
    }

    /// Moves the provider's clock forward (e.g. past key retention).
    pub fn advance_clock(&self, by: Duration) {
        self.shared.provider.lock().unwrap().clock_offset += by.as_secs();
    }

    /// Makes the refund listing ignore its cursor (`starting_after`): every
    /// page is the first, `has_more` and all, as a faulty provider's might.
    pub fn set_list_ignores_cursor(&self, ignores: bool) {
        self.shared.provider.lock().unwrap().list_ignores_cursor = ignores;
    }

    /// Refuses every idempotency key that is not a UUID (400
    /// `idempotency_key_invalid`), as some providers do.
    pub fn require_uuid_keys(&self, required: bool) {
        self.shared.provider.lock().unwrap().uuid_keys_only = required;
    }

    /// Keeps refunds (and tickets) out of listings until `lag` after their creation (an
    /// eventually consistent index; applies to existing refunds too);
    /// `GET /v1/refunds/{id}` and [`Sandbox::refunds`] see them at once.
    pub fn set_list_lag(&self, lag: Duration) {
        self.shared.provider.lock().unwrap().list_lag = lag;
    }

    /// Requires `Authorization: Bearer <key>` on every `/v1` request (401
    /// otherwise), as Stripe does; `None` lets anyone in.
    pub fn require_api_key(&self, key: Option<&str>) {
        *self.shared.api_key.lock().unwrap() = key.map(str::to_string);
    }

    /// Lets every request held by `PauseAfterCommit` answer.
    pub fn release(&self) {
        self.shared.release();
    }

    /// How many requests are held by `PauseAfterCommit` right now.
    pub fn paused(&self) -> usize {
        self.shared.paused.load(Ordering::SeqCst)
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// Serves `app` on `listener` over TLS (for test servers other than the
/// sandbox, e.g. a trace collector), until the task is dropped.
pub async fn serve_https(listener: tokio::net::TcpListener, app: axum::Router, tls: Arc<rustls::ServerConfig>) {
    serve(listener, app, Some(tokio_rustls::TlsAcceptor::from(tls))).await;
}

/// Accepts connections (over TLS when `tls` is given: a failed handshake
/// just closes the connection); a handler that marks its response
/// `DropConnection` makes the connection close without an answer.
async fn serve(listener: tokio::net::TcpListener, app: axum::Router, tls: Option<tokio_rustls::TlsAcceptor>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else { continue };
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let app = app.clone();
                async move {
                    let response = app.oneshot(req.map(axum::body::Body::new)).await.unwrap_or_else(|e| match e {});
                    if response.extensions().get::<http::DropConnection>().is_some() {
                        return Err("sandbox: connection dropped (injected fault)");
                    }
                    Ok(response)
                }
            });
            let http = hyper::server::conn::http1::Builder::new();
            match tls {
                Some(acceptor) => {
                    if let Ok(stream) = acceptor.accept(stream).await {
                        let _ = http.serve_connection(TokioIo::new(stream), service).await;
                    }
                }
                None => {
                    let _ = http.serve_connection(TokioIo::new(stream), service).await;
                }
            }
        });
    }
}
