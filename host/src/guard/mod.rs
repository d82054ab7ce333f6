//! The guard: the one way out of a plugin. It admits each tool call once
//! (replaying completed ones, refusing changed arguments), and for every
//! `send` mints the key, writes the attempt durably *before* the request
//! leaves, sends it with the key the way the downstream expects, and records
//! the outcome. A repeat of a settled send returns the recorded response and
//! sends nothing; an unsettled one is re-sent with the same key.

pub mod keys;
pub mod transport;
pub mod wire;

use crate::error::{CallError, ErrorKind};
use crate::ledger::records::{AttemptRecord, AttemptState, CallRecord, CallState, StoredOutcome, StoredResponse, now_ms};
use crate::ledger::{Durability, Ledger, LedgerWrite};
use crate::policy::{self, Downstreams, Grant, Refusal};
use crate::runtime::Effect;
use crate::runtime::bindings::types::{self, AttemptInfo, OutboundError};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use transport::Outcome;

/// Shared by all tool calls of a host: the ledger, the HTTP client, the downstreams.
pub struct Guard {
    ledger: Ledger,
    client: reqwest::Client,
    downstreams: Downstreams,
    /// One lock per tool call in progress: concurrent duplicates wait for it.
    in_flight: Mutex<HashMap<(String, String), Arc<tokio::sync::Mutex<()>>>>,
}

/// The tool call as the guard identifies it.
#[derive(Debug, Clone)]
pub struct CallIdentity {
    pub session: String,
    pub call_id: String,
    pub tool: String,
    /// RFC 8785 canonical arguments.
    pub args: Value,
    /// sha256 of the canonical arguments.
    pub args_digest: String,
}

/// What admission decided.
pub enum Admission {
    /// The call completed before: its stored outcome, no plugin run.
    Replay(StoredOutcome),
    /// Run the plugin under this call guard.
    Run(CallGuard),
}

/// Runs `f` on the blocking pool: RocksDB never blocks an async worker.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.expect("a ledger task panicked")
}

impl Guard {
    /// A guard over `ledger` that may reach `downstreams`.
    ///
    /// # Errors
    /// The HTTP client cannot be built (no TLS roots, for instance).
    pub fn new(ledger: Ledger, downstreams: Downstreams) -> Result<Self, String> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            // A redirect could lead outside the grants; the plugin sees the 3xx instead.
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
        Ok(Self { ledger, client, downstreams, in_flight: Mutex::new(HashMap::new()) })
    }

    /// The ledger the guard records into.
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// Admits a tool call: waits for a duplicate in progress, then replays a
    /// completed call, refuses changed arguments, or lets the plugin run.
    ///
    /// # Errors
    /// `conflict` when the call id was used with another tool or arguments;
    /// `internal` when the ledger cannot be read.
    pub async fn admit(self: &Arc<Self>, id: CallIdentity, effect: Effect, grants: Arc<[Grant]>) -> Result<Admission, CallError> {
        let lock = {
            let mut map = self.in_flight.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            map.retain(|_, l| Arc::strong_count(l) > 1);
            map.entry((id.session.clone(), id.call_id.clone())).or_default().clone()
        };
        let lock = lock.lock_owned().await;
        let ledger = self.ledger.clone();
        let (session, call_id) = (id.session.clone(), id.call_id.clone());
        let existing = blocking(move || ledger.call(&session, &call_id)).await.map_err(internal)?;
        let (record, persisted) = match existing {
            Some(r) if r.tool != id.tool || r.args_digest != id.args_digest => {
                return Err(CallError::new(
                    ErrorKind::Conflict,
                    format!(
                        "tool call `{}` was first made as `{}` with other arguments; a changed request needs a new tool-call id. Nothing was sent",
                        id.call_id, r.tool
                    ),
                )
                .with_detail(json!({ "first_args": r.args, "first_tool": r.tool })));
            }
            Some(r) if r.state == CallState::Completed => {
                if let Some(outcome) = r.outcome {
                    return Ok(Admission::Replay(outcome));
                }
                (r, true)
            }
            Some(r) => (r, true),
            None => {
                let record = CallRecord {
                    session: id.session,
                    call_id: id.call_id,
                    tool: id.tool,
                    args_digest: id.args_digest,
                    args: id.args,
                    state: CallState::Admitted,
                    outcome: None,
                    created_ms: now_ms(),
                    completed_ms: None,
                };
                (record, false)
            }
        };
        Ok(Admission::Run(CallGuard {
            guard: self.clone(),
            record,
            persisted,
            effect,
            grants,
            next_step: 0,
            unsettled: None,
            _lock: lock,
        }))
    }

    /// Ends a tool call: an unsettled send makes it `outcome-unknown` whatever
    /// the plugin returned; a result (or a tool-reported failure) completes it.
    pub async fn finish(&self, mut call: CallGuard, result: Result<Value, CallError>) -> Result<Value, CallError> {
        if let Some(info) = call.unsettled.take() {
            let message = match &result {
                Err(e) if e.kind == ErrorKind::OutcomeUnknown => e.message.clone(),
                _ => info.message.clone(),
            };
            return Err(CallError::new(ErrorKind::OutcomeUnknown, message).with_detail(attempt_detail(&info)));
        }
        let outcome = match &result {
            Ok(value) => StoredOutcome::Result(value.clone()),
            Err(e) if e.kind == ErrorKind::ToolFailed => StoredOutcome::error(e),
            Err(_) => return result,
        };
        let mut record = call.record.clone();
        record.state = CallState::Completed;
        record.outcome = Some(outcome);
        record.completed_ms = Some(now_ms());
        let ledger = self.ledger.clone();
        // Buffered: a lost completion is rebuilt by re-running the plugin,
        // whose sends replay from their recorded attempts.
        let written = blocking(move || ledger.commit(LedgerWrite::new().call(record), Durability::Buffered)).await;
        if let Err(e) = written {
            tracing::warn!(error = %e, call_id = %call.record.call_id, "could not record the completed tool call; a replay will re-run it");
        }
        result
    }
}

/// One tool call in progress: the guard's state for the plugin's sends.
pub struct CallGuard {
    guard: Arc<Guard>,
    record: CallRecord,
    /// Whether `record` is in the ledger yet (it is written with the first attempt).
    persisted: bool,
    effect: Effect,
    grants: Arc<[Grant]>,
    next_step: u32,
    /// The first send whose outcome is not settled, if any.
    unsettled: Option<AttemptInfo>,
    _lock: tokio::sync::OwnedMutexGuard<()>,
}

impl CallGuard {
    /// `outbound.send`: see the module docs.
    pub async fn send(&mut self, req: types::Request) -> Result<types::Response, OutboundError> {
        if self.effect == Effect::ReadOnly {
            return Err(OutboundError::Denied(format!(
                "`{}` is a read-only tool: it may fetch but not send; nothing was sent",
                self.record.tool
            )));
        }
        let (downstream, url) = policy::authorize(&self.grants, &self.guard.downstreams, &req.method, &req.url).map_err(refusal)?;
        let headers: Vec<(String, String)> = req.headers.into_iter().map(|h| (h.name, h.value)).collect();
        let request = wire::stored(&req.method, url.as_str(), headers, &req.body);
        wire::check(&request, &downstream).map_err(OutboundError::Invalid)?;

        let step = self.next_step;
        self.next_step += 1;
        let r = &self.record;
        let input = keys::KeyInput { session: &r.session, call_id: &r.call_id, tool: &r.tool, args_digest: &r.args_digest, step };
        let key = keys::mint(self.guard.ledger.secret(), input);
        let fingerprint = keys::request_fingerprint(&request.method, &request.url, &request.headers, &req.body);

        let ledger = self.guard.ledger.clone();
        let lookup = key.clone();
        let existing = blocking(move || ledger.attempt(&lookup)).await.map_err(ledger_down)?;
        let mut attempt = match existing {
            Some(a) if a.fingerprint != fingerprint => {
                return Err(OutboundError::Conflict(format!(
                    "step {step} of tool call `{}` was recorded with a different request ({} {}); the plugin is not deterministic for the same arguments. Nothing was sent",
                    r.call_id, a.request.method, a.request.url
                )));
            }
            Some(a) if a.state.is_final() && a.response.is_some() => return Ok(to_response(a.response.expect("checked"))),
            Some(a) => a,
            None => {
                let now = now_ms();
                let a = AttemptRecord {
                    key: key.clone(),
                    session: r.session.clone(),
                    call_id: r.call_id.clone(),
                    tool: r.tool.clone(),
                    step,
                    fingerprint,
                    downstream: downstream.name.clone(),
                    request: request.clone(),
                    state: AttemptState::Pending,
                    response: None,
                    last_error: None,
                    tries: 0,
                    provider_replayed: false,
                    created_ms: now,
                    updated_ms: now,
                };
                // The attempt (and, the first time, the call) is durable before the request leaves.
                let mut write = LedgerWrite::new().attempt(a.clone());
                if !self.persisted {
                    write = write.call(self.record.clone());
                }
                let ledger = self.guard.ledger.clone();
                blocking(move || ledger.commit(write, Durability::Synced)).await.map_err(ledger_down)?;
                self.persisted = true;
                a
            }
        };

        let wire = wire::build(&request, url, &downstream, Some(&key));
        let outcome = transport::perform(&self.guard.client, &downstream, &wire, &mut attempt.tries).await;
        attempt.updated_ms = now_ms();
        let (durability, answer) = match outcome {
            Outcome::Answered { state, response } => {
                attempt.state = state;
                attempt.provider_replayed = header(&response, "idempotent-replayed").is_some_and(|v| v == "true");
                attempt.response = Some(response.clone());
                attempt.last_error = None;
                (settled_durability(downstream.honours_keys), Ok(to_response(response)))
            }
            Outcome::Unsettled { state, response, reason } => {
                attempt.state = state;
                attempt.response = response;
                attempt.last_error = Some(reason.clone());
                let info = attempt_info(&attempt, &reason);
                self.unsettled.get_or_insert_with(|| info.clone());
                (settled_durability(downstream.honours_keys), Err(OutboundError::OutcomeUnknown(info)))
            }
            Outcome::NotSent { reason } => {
                // Nothing reached the downstream: settle it as failed-unsent, synced,
                // so recovery never re-sends what the model was told did not happen.
                attempt.state = AttemptState::Failed;
                attempt.response = None;
                attempt.last_error = Some(format!("not sent: {reason}"));
                let message = format!("{reason}; nothing reached `{}`. Retrying the same tool call is safe", downstream.name);
                (Durability::Synced, Err(OutboundError::Transport(message)))
            }
        };
        let ledger = self.guard.ledger.clone();
        if let Err(e) = blocking(move || ledger.commit(LedgerWrite::new().attempt(attempt), durability)).await {
            tracing::error!(error = %e, %key, "could not record an attempt's outcome; recovery will re-send it with the same key");
        }
        answer
    }

    /// `outbound.fetch`: a `GET`/`HEAD` inside the grants; not keyed, not recorded.
    pub async fn fetch(&mut self, req: types::Request) -> Result<types::Response, OutboundError> {
        fetch(&self.guard, &self.grants, req).await
    }
}

/// A read-only request inside `grants`.
pub(crate) async fn fetch(guard: &Guard, grants: &[Grant], req: types::Request) -> Result<types::Response, OutboundError> {
    if !req.method.eq_ignore_ascii_case("GET") && !req.method.eq_ignore_ascii_case("HEAD") {
        return Err(OutboundError::Invalid(format!("fetch is for GET and HEAD, not {}; side effects go through send", req.method)));
    }
    let (downstream, url) = policy::authorize(grants, &guard.downstreams, &req.method, &req.url).map_err(refusal)?;
    let headers: Vec<(String, String)> = req.headers.into_iter().map(|h| (h.name, h.value)).collect();
    let request = wire::stored(&req.method, url.as_str(), headers, &req.body);
    wire::check_headers(&request, &downstream).map_err(OutboundError::Invalid)?;
    let wire = wire::build(&request, url, &downstream, None);
    let mut tries = 0;
    match transport::perform(&guard.client, &downstream, &wire, &mut tries).await {
        Outcome::Answered { response, .. } | Outcome::Unsettled { response: Some(response), .. } => Ok(to_response(response)),
        Outcome::Unsettled { reason, .. } | Outcome::NotSent { reason } => Err(OutboundError::Transport(reason)),
    }
}

/// Outcomes of key-honouring downstreams may be buffered: a lost one is
/// recovered by re-sending the same key. Others must be synced.
fn settled_durability(honours_keys: bool) -> Durability {
    if honours_keys { Durability::Buffered } else { Durability::Synced }
}

fn refusal(r: Refusal) -> OutboundError {
    match r {
        Refusal::Denied(m) => OutboundError::Denied(m),
        Refusal::Invalid(m) => OutboundError::Invalid(m),
    }
}

fn ledger_down(e: crate::ledger::LedgerError) -> OutboundError {
    OutboundError::Transport(format!("the ledger is unavailable ({e}); nothing was sent"))
}

fn internal(e: crate::ledger::LedgerError) -> CallError {
    CallError::new(ErrorKind::Internal, format!("{e}; nothing was run"))
}

fn header<'a>(r: &'a StoredResponse, name: &str) -> Option<&'a str> {
    r.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
}

fn to_response(r: StoredResponse) -> types::Response {
    types::Response {
        status: r.status,
        headers: r.headers.into_iter().map(|(name, value)| types::Header { name, value }).collect(),
        body: r.body.to_bytes(),
    }
}

fn wit_state(s: AttemptState) -> types::AttemptState {
    match s {
        AttemptState::Pending => types::AttemptState::Pending,
        AttemptState::Succeeded => types::AttemptState::Succeeded,
        AttemptState::Failed => types::AttemptState::Failed,
        AttemptState::Unknown => types::AttemptState::Unknown,
    }
}

/// What the plugin (and through it the model) learns of an unsettled attempt.
fn attempt_info(a: &AttemptRecord, reason: &str) -> AttemptInfo {
    let tries = if a.tries == 1 { "1 try".to_string() } else { format!("{} tries", a.tries) };
    let what = if a.state == AttemptState::Pending { "is still in flight at the provider" } else { "got no definitive answer" };
    AttemptInfo {
        key: a.key.clone(),
        step: a.step,
        state: wit_state(a.state),
        tries: a.tries,
        message: format!(
            "{} {} {what} after {tries} ({reason}). It may have taken effect. Do not repeat it under a new tool-call id: \
             check the provider's state first. Retrying the same tool-call id is safe: it re-sends the same idempotency key",
            a.request.method, a.request.url
        ),
    }
}

/// The structured detail of an `outcome-unknown` error.
pub(crate) fn attempt_detail(info: &AttemptInfo) -> Value {
    let state = match info.state {
        types::AttemptState::Pending => "pending",
        types::AttemptState::Succeeded => "succeeded",
        types::AttemptState::Failed => "failed",
        types::AttemptState::Unknown => "unknown",
    };
    json!({ "key": info.key, "step": info.step, "state": state, "tries": info.tries })
}
