//! The attempt protocol of `outbound.send`: refuse, mint, write durably,
//! send (or re-send with the same key), classify, reconcile what is unknown,
//! record. And `outbound.fetch`, which is none of that.

use super::transport::Outcome;
use super::{Guard, Reconciled, Reconciler, failpoint, keys, wire};
use crate::ledger::records::{AttemptRecord, AttemptState, CallRecord, Resolution, StoredRequest, StoredResponse, now_ms};
use crate::ledger::{Durability, LedgerWrite, Prior, QueuedWrite};
use crate::policy::{self, Downstream, Grant, Refusal};
use crate::runtime::Effect;
use crate::runtime::bindings::types::{self, AttemptInfo, OutboundError};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One tool call in progress: the guard's state for the plugin's sends.
pub struct CallGuard {
    guard: Arc<Guard>,
    record: CallRecord,
    /// Whether `record` is in the ledger yet (it is written with the first attempt).
    persisted: bool,
    rules: super::CallRules,
    next_step: u32,
    /// Sends made so far, re-sends of an unsettled step included (the budget).
    sends: u32,
    /// Sends of this run whose outcome is not settled, in the order they
    /// were made, with their request fingerprint: the same request again
    /// re-drives that step with its key.
    open_steps: Vec<(String, AttemptInfo)>,
    /// The send on the wire right now. If the invocation is cancelled (its
    /// wall clock ran out) mid-send, this is what may have taken effect.
    in_flight: Option<AttemptInfo>,
    /// Buffered outcome writes not waited for yet, by attempt key: they are
    /// waited for before the call ends ([`CallGuard::flush`]).
    queued: Vec<(String, QueuedWrite)>,
    _lock: tokio::sync::OwnedMutexGuard<()>,
}

/// Waits for the outcome write of attempt `key`; a failure is logged, since
/// recovery resolves the attempt with the same key.
async fn outcome_written(key: &str, write: QueuedWrite) {
    match write.wait().await {
        Ok(()) => failpoint("after-outcome-write"),
        Err(e) => tracing::error!(error = %e, %key, "could not record an attempt's outcome; recovery will resolve it with the same key"),
    }
}

/// How driving an attempt ended.
pub(crate) enum Driven {
    /// A definitive answer (from the downstream or found by reconciliation).
    Answered(StoredResponse),
    /// It may have taken effect; what the plugin and model are told.
    Unsettled(AttemptInfo),
    /// Nothing reached the downstream.
    NotSent(String),
}

impl CallGuard {
    pub(crate) fn new(
        guard: Arc<Guard>,
        record: CallRecord,
        persisted: bool,
        rules: super::CallRules,
        lock: tokio::sync::OwnedMutexGuard<()>,
    ) -> Self {
        Self { guard, record, persisted, rules, next_step: 0, sends: 0, open_steps: Vec::new(), in_flight: None, queued: Vec::new(), _lock: lock }
    }

    /// Waits for the buffered outcome writes of this call's sends, so the
    /// ledger holds them before the call's result (or error) is returned and
    /// its lock is released.
    pub(crate) async fn flush(&mut self) {
        for (key, write) in self.queued.drain(..) {
            outcome_written(&key, write).await;
        }
    }

    /// The tool call this guard serves.
    pub(crate) fn record(&self) -> &CallRecord {
        &self.record
    }

    /// The first unsettled send, or the one cut off mid-flight, if any.
    pub(crate) fn take_unsettled(&mut self) -> Option<AttemptInfo> {
        let first = (!self.open_steps.is_empty()).then(|| self.open_steps.remove(0).1);
        first.or_else(|| self.in_flight.take())
    }

    /// `outbound.send`: see `docs/guard.md`.
    pub async fn send(&mut self, req: types::Request) -> Result<types::Response, OutboundError> {
        if self.rules.effect == Effect::ReadOnly {
            return Err(OutboundError::Denied(format!(
                "`{}` is a read-only tool: it may fetch but not send; nothing was sent",
                self.record.tool
            )));
        }
        if self.sends >= self.rules.max_sends {
            return Err(OutboundError::Denied(format!(
                "send budget spent: a call of `{}` may send {} time(s) (max_sends_per_call); nothing was sent",
                self.record.tool, self.rules.max_sends
            )));
        }
        let (downstream, url) = policy::authorize(&self.rules.grants, &self.guard.downstreams, &req.method, &req.url).map_err(refusal)?;
        if req.body.len() > downstream.max_request_bytes {
            return Err(OutboundError::Invalid(format!(
                "the request body is {} bytes; `{}` takes at most {} (max_request_bytes); nothing was sent",
                req.body.len(),
                downstream.name,
                downstream.max_request_bytes
            )));
        }
        let headers: Vec<(String, String)> = req.headers.into_iter().map(|h| (h.name, h.value)).collect();
        let request = wire::stored(&req.method, url.as_str(), headers, &req.body);
        wire::check(&request, &downstream).map_err(OutboundError::Invalid)?;
        let fingerprint = keys::request_fingerprint(&request.method, &request.url, &request.headers, &req.body);
        self.sends += 1;
        // The plugin sends again what an earlier send of this run sent without
        // a settled outcome (it swallowed `outcome-unknown` and retried): that
        // is the same side effect, so it gets the same step and key — re-sent
        // or reconciled as recovery would, never a second effect.
        if let Some(step) = self.open_steps.iter().find(|(f, _)| *f == fingerprint).map(|(_, info)| info.step) {
            return self.redrive(step, &downstream).await;
        }
        let step = self.next_step;
        self.next_step += 1;

        // Look the step up and, if it is new, write it (and the call, the
        // first time) synced before anything leaves.
        let fresh = self.fresh_attempt(step, 0, fingerprint.clone(), &downstream, request.clone());
        let first_write = (!self.persisted).then(|| self.record.clone());
        let (session, call_id) = (self.record.session.clone(), self.record.call_id.clone());
        let current = self.guard.ledger.read(move |ledger| ledger.attempt_at(&session, &call_id, step)).await.map_err(ledger_down)?;
        if current.is_none() {
            let mut write = LedgerWrite::new().attempt_over(fresh.clone(), Prior::Absent);
            if let Some(call) = first_write {
                write = write.call(call);
            }
            let _pending = crate::phases::time(crate::phases::Phase::PendingWrite);
            self.guard.ledger.commit_async(write, Durability::Synced).await.map_err(ledger_down)?;
        }
        let (mut attempt, possibly_sent) = match current {
            Some(a) if a.fingerprint != fingerprint => {
                return Err(OutboundError::Conflict(format!(
                    "step {step} of tool call `{}` was recorded with a different request ({} {}); the plugin is not \
                     deterministic for the same arguments. Nothing was sent",
                    self.record.call_id, a.request.method, a.request.url
                )));
            }
            Some(a) if a.state.is_final() && a.response.is_some() => return Ok(to_response(a.response.expect("checked"))),
            Some(a) if a.resolution == Some(Resolution::HostFault) => return Err(self.left_for_operator(&a)),
            Some(a) if a.resolution == Some(Resolution::OperatorNotSent) => {
                let next = self.fresh_attempt(step, a.generation + 1, fingerprint, &downstream, request);
                (self.write_pending(next, Prior::Absent).await?, false)
            }
            // Settled as never sent: try again, same key, recorded as pending first.
            Some(a) if a.state == AttemptState::Failed => (self.write_pending(a, Prior::Was(AttemptState::Failed)).await?, false),
            // Pending or unknown: it may be out there already.
            Some(a) => (a, true),
            None => {
                self.persisted = true;
                failpoint("after-attempt-write");
                (fresh, false)
            }
        };
        self.drive_step(&mut attempt, &downstream, possibly_sent).await
    }

    /// Drives `attempt` and tells the plugin how it ended, keeping track of
    /// this run's steps whose outcome is not settled.
    async fn drive_step(&mut self, attempt: &mut AttemptRecord, downstream: &Downstream, possibly_sent: bool) -> Result<types::Response, OutboundError> {
        let reconciler = self.rules.reconciler.clone();
        let driven = self
            .guard
            .drive(attempt, downstream, reconciler.as_deref(), &self.record, possibly_sent, &mut self.in_flight, Some(&mut self.queued))
            .await;
        match driven {
            Driven::Answered(response) => {
                self.open_steps.retain(|(_, info)| info.step != attempt.step);
                Ok(to_response(response))
            }
            Driven::Unsettled(info) => {
                match self.open_steps.iter_mut().find(|(_, open)| open.step == attempt.step) {
                    Some((_, open)) => *open = info.clone(),
                    None => self.open_steps.push((attempt.fingerprint.clone(), info.clone())),
                }
                Err(OutboundError::OutcomeUnknown(info))
            }
            Driven::NotSent(message) => Err(OutboundError::Transport(message)),
        }
    }

    /// Drives step `step` of this run again: its outcome was not settled when
    /// the plugin sent the same request once more.
    async fn redrive(&mut self, step: u32, downstream: &Downstream) -> Result<types::Response, OutboundError> {
        // Its outcome writes land before it is read again.
        self.flush().await;
        let (session, call_id) = (self.record.session.clone(), self.record.call_id.clone());
        let current = self.guard.ledger.read(move |ledger| ledger.attempt_at(&session, &call_id, step)).await.map_err(ledger_down)?;
        match current {
            Some(a) if a.state.is_final() && a.response.is_some() => Ok(to_response(a.response.expect("checked"))),
            Some(a) if a.resolution == Some(Resolution::HostFault) => Err(self.left_for_operator(&a)),
            Some(mut a) if a.state.is_unsettled() => self.drive_step(&mut a, downstream, true).await,
            _ => Err(OutboundError::Transport(format!("step {step} of this call is no longer in the ledger as it was; nothing was sent"))),
        }
    }

    /// An attempt the host failed on before (a panic): it is never sent
    /// again on its own, and the call cannot complete past it.
    fn left_for_operator(&mut self, a: &AttemptRecord) -> OutboundError {
        let message = a.last_error.clone().unwrap_or_else(|| "the host failed on it; an operator must resolve it".into());
        let info = AttemptInfo { message, ..info(a, "the host failed on it") };
        if !self.open_steps.iter().any(|(_, open)| open.step == a.step) {
            self.open_steps.push((a.fingerprint.clone(), info.clone()));
        }
        OutboundError::OutcomeUnknown(info)
    }

    fn fresh_attempt(&self, step: u32, generation: u32, fingerprint: String, d: &Downstream, request: StoredRequest) -> AttemptRecord {
        let r = &self.record;
        let input = keys::KeyInput { session: &r.session, call_id: &r.call_id, tool: &r.tool, args_digest: &r.args_digest, step, generation };
        AttemptRecord::pending(r, keys::mint(self.guard.ledger.secret(), input), step, generation, fingerprint, d.name.clone(), request)
    }

    /// Makes `attempt` durable as pending (with the call, the first time)
    /// before anything is sent.
    async fn write_pending(&mut self, mut attempt: AttemptRecord, prior: Prior) -> Result<AttemptRecord, OutboundError> {
        attempt.state = AttemptState::Pending;
        attempt.response = None;
        attempt.updated_ms = now_ms();
        let mut write = LedgerWrite::new().attempt_over(attempt.clone(), prior);
        if !self.persisted {
            write = write.call(self.record.clone());
        }
        let pending = crate::phases::time(crate::phases::Phase::PendingWrite);
        self.guard.ledger.commit_async(write, Durability::Synced).await.map_err(ledger_down)?;
        drop(pending);
        self.persisted = true;
        failpoint("after-attempt-write");
        Ok(attempt)
    }
}

impl Guard {
    /// Sends (or re-sends, same key) `attempt` if that is safe, reconciles an
    /// unknown outcome, and records what came of it.
    ///
    /// `possibly_sent`: an earlier try may have reached the downstream (the
    /// attempt was found pending or unknown). Such an attempt is re-sent only
    /// within the downstream's key retention and only if it honours keys;
    /// otherwise it is reconciled. Its failure to connect now proves nothing
    /// about the earlier try, so it stays unknown.
    ///
    /// A buffered outcome write goes into `later` when given (the caller
    /// waits for it before its call ends: the plugin need not wait for the
    /// ledger to hear the answer); otherwise, and when synced, it is waited for.
    ///
    /// Runs in an `attempt` span (key, step, downstream; then the state it
    /// ended in and its latency), a child of the tool call's span.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn drive(
        &self,
        attempt: &mut AttemptRecord,
        d: &Downstream,
        reconciler: Option<&dyn Reconciler>,
        call: &CallRecord,
        possibly_sent: bool,
        in_flight: &mut Option<AttemptInfo>,
        later: Option<&mut Vec<(String, QueuedWrite)>>,
    ) -> Driven {
        use tracing::Instrument as _;
        let span = tracing::info_span!("attempt", key = %attempt.key, step = attempt.step, downstream = %d.name,
            state = tracing::field::Empty, latency_ms = tracing::field::Empty);
        let started = std::time::Instant::now();
        let driven = async {
            // `attempt` is as the ledger holds it: the caller read or just wrote it.
            let prior = Prior::Was(attempt.state);
            let age = Duration::from_millis(now_ms().saturating_sub(attempt.created_ms));
            let may_resend = !possibly_sent || (d.honours_keys && age < d.retention);
            let outcome = if may_resend {
                let on_the_wire = AttemptRecord { tries: attempt.tries + 1, ..attempt.clone() };
                *in_flight = Some(info(&on_the_wire, "the invocation was cut off while the request was on its way"));
                let url = url::Url::parse(&attempt.request.url).expect("stored URLs were parsed before they were stored");
                let wire = wire::build(&attempt.request, url, d, Some(&attempt.key));
                let http = crate::phases::time(crate::phases::Phase::Http);
                let outcome = super::transport::perform(self.client(d), d, &wire, &mut attempt.tries).await;
                drop(http);
                failpoint("after-answer");
                outcome
            } else {
                let why = if d.honours_keys { "the provider no longer keeps its key" } else { "the provider does not deduplicate by key" };
                Outcome::Unsettled { state: AttemptState::Unknown, response: None, reason: format!("not re-sent: {why}") }
            };
            attempt.updated_ms = now_ms();
            let (durability, driven) = match outcome {
                Outcome::Answered { state, response } => {
                    attempt.provider_replayed = header(&response, "idempotent-replayed").is_some_and(|v| v == "true");
                    (settled_durability(d), self.settle(attempt, state, response, None))
                }
                Outcome::Unsettled { state: AttemptState::Pending, response, reason } => {
                    attempt.state = AttemptState::Pending;
                    attempt.response = response;
                    attempt.last_error = Some(reason.clone());
                    (settled_durability(d), Driven::Unsettled(info(attempt, &reason)))
                }
                Outcome::NotSent { reason } if !possibly_sent => {
                    // Nothing reached the downstream: settle it as not sent, synced,
                    // so recovery never re-sends what the model was told did not happen.
                    attempt.state = AttemptState::Failed;
                    attempt.response = None;
                    attempt.last_error = Some(format!("not sent: {reason}"));
                    let message = format!("{reason}; nothing reached `{}`. Retrying the same tool call is safe", d.name);
                    (Durability::Synced, Driven::NotSent(message))
                }
                Outcome::Unsettled { response, reason, .. } => {
                    attempt.response = response;
                    self.reconcile_unknown(attempt, d, reconciler, call, may_resend, reason).await
                }
                Outcome::NotSent { reason } => {
                    let reason = format!("could not reach the provider again ({reason}); an earlier try may have taken effect");
                    self.reconcile_unknown(attempt, d, reconciler, call, may_resend, reason).await
                }
            };
            crate::metrics::attempt(&d.name, attempt.state);
            let _written = crate::phases::time(crate::phases::Phase::OutcomeWrite);
            let write = self.ledger.queue(LedgerWrite::new().attempt_over(attempt.clone(), prior), durability);
            match later {
                Some(later) if durability == Durability::Buffered => later.push((attempt.key.clone(), write)),
                _ => outcome_written(&attempt.key, write).await,
            }
            *in_flight = None;
            driven
        }
        .instrument(span.clone())
        .await;
        span.record("state", attempt.state.as_str());
        span.record("latency_ms", started.elapsed().as_secs_f64() * 1e3);
        driven
    }

    /// An unknown outcome is looked up at the provider (within the
    /// downstream's reconcile window) before anyone is told it is unknown.
    async fn reconcile_unknown(
        &self,
        attempt: &mut AttemptRecord,
        d: &Downstream,
        reconciler: Option<&dyn Reconciler>,
        call: &CallRecord,
        may_resend: bool,
        reason: String,
    ) -> (Durability, Driven) {
        attempt.state = AttemptState::Unknown;
        attempt.last_error = Some(reason.clone());
        let found = match reconciler {
            Some(r) => reconcile_within(r, call, attempt, d.reconcile_window).await,
            None => Reconciled::StillUnknown("the plugin cannot reconcile".into()),
        };
        crate::metrics::reconcile(match &found {
            Reconciled::Found(_) => "found",
            Reconciled::NotFound => "not-found",
            Reconciled::StillUnknown(_) => "still-unknown",
        });
        match found {
            Reconciled::Found(response) => {
                let state = if (200..300).contains(&response.status) { AttemptState::Succeeded } else { AttemptState::Failed };
                tracing::info!(key = %attempt.key, "reconciled: the provider has it");
                (settled_durability(d), self.settle(attempt, state, response, Some(Resolution::ReconciledFound)))
            }
            Reconciled::NotFound if !may_resend => {
                attempt.resolution = Some(Resolution::ReconciledNotFound);
                let message = format!(
                    "{} {} got no definitive answer ({reason}); the provider has no record of it and no longer keeps its key, \
                     so it cannot be re-sent safely. Do not repeat it under a new tool-call id. An operator must resolve it \
                     (`toolguard ledger resolve {} --not-sent` if it was never made)",
                    attempt.request.method, attempt.request.url, attempt.key
                );
                tracing::warn!(key = %attempt.key, "reconciled: not found past the provider's retention; an operator must resolve it");
                (Durability::Synced, Driven::Unsettled(AttemptInfo { message, ..info(attempt, &reason) }))
            }
            Reconciled::NotFound => (settled_durability(d), Driven::Unsettled(info(attempt, &format!("{reason}; the provider lists no such request yet")))),
            Reconciled::StillUnknown(why) => (settled_durability(d), Driven::Unsettled(info(attempt, &format!("{reason}; reconciling: {why}")))),
        }
    }

    fn settle(&self, attempt: &mut AttemptRecord, state: AttemptState, response: StoredResponse, resolution: Option<Resolution>) -> Driven {
        attempt.state = state;
        attempt.response = Some(response.clone());
        attempt.last_error = None;
        attempt.resolution = resolution;
        Driven::Answered(response)
    }
}

/// Asks the plugin until it finds the attempt, cannot tell, or the window
/// closes (a provider's listing may lag its writes).
async fn reconcile_within(r: &dyn Reconciler, call: &CallRecord, attempt: &AttemptRecord, window: Duration) -> Reconciled {
    let deadline = Instant::now() + window;
    let mut pause = Duration::from_millis(50);
    loop {
        let found = r.reconcile(&call.tool, &call.args, attempt).await;
        if found != Reconciled::NotFound || Instant::now() + pause >= deadline {
            return found;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(500));
    }
}

/// `toolguard bench`'s unguarded baseline: the request authorised and sent
/// as a guarded send would be — no admission, no ledger write, no key.
/// Reachable only from a runtime built by the bench.
pub(crate) async fn send_unguarded(guard: &Guard, grants: &[Grant], req: types::Request) -> Result<types::Response, OutboundError> {
    direct(guard, grants, req).await
}

/// A read-only request inside `grants`.
pub async fn fetch(guard: &Guard, grants: &[Grant], req: types::Request) -> Result<types::Response, OutboundError> {
    if !req.method.eq_ignore_ascii_case("GET") && !req.method.eq_ignore_ascii_case("HEAD") {
        let method = req.method.chars().take(32).collect::<String>();
        return Err(OutboundError::Invalid(format!("fetch is for GET and HEAD, not {method}; side effects go through send")));
    }
    if !req.body.is_empty() {
        return Err(OutboundError::Invalid("fetch sends no body (GET and HEAD carry none); nothing was sent".into()));
    }
    direct(guard, grants, req).await
}

/// Authorises `req` under `grants` and sends it once, keyless and unrecorded.
async fn direct(guard: &Guard, grants: &[Grant], req: types::Request) -> Result<types::Response, OutboundError> {
    let (downstream, url) = policy::authorize(grants, &guard.downstreams, &req.method, &req.url).map_err(refusal)?;
    let headers: Vec<(String, String)> = req.headers.into_iter().map(|h| (h.name, h.value)).collect();
    let request = wire::stored(&req.method, url.as_str(), headers, &req.body);
    wire::check_headers(&request, &downstream).map_err(OutboundError::Invalid)?;
    let wire = wire::build(&request, url, &downstream, None);
    let mut tries = 0;
    let _http = crate::phases::time(crate::phases::Phase::Http);
    match super::transport::perform(guard.client(&downstream), &downstream, &wire, &mut tries).await {
        Outcome::Answered { response, .. } | Outcome::Unsettled { response: Some(response), .. } => Ok(to_response(response)),
        Outcome::Unsettled { reason, .. } | Outcome::NotSent { reason } => Err(OutboundError::Transport(reason)),
    }
}

/// Outcomes of key-honouring downstreams may be buffered: a lost one is
/// recovered by re-sending the same key. Others must be synced.
fn settled_durability(d: &Downstream) -> Durability {
    if d.honours_keys { Durability::Buffered } else { Durability::Synced }
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

/// The WIT form of an attempt's state.
pub(crate) fn wit_state(s: AttemptState) -> types::AttemptState {
    match s {
        AttemptState::Pending => types::AttemptState::Pending,
        AttemptState::Succeeded => types::AttemptState::Succeeded,
        AttemptState::Failed => types::AttemptState::Failed,
        AttemptState::Unknown => types::AttemptState::Unknown,
    }
}

/// What the plugin (and through it the model) learns of an unsettled attempt.
pub(crate) fn info(a: &AttemptRecord, reason: &str) -> AttemptInfo {
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
