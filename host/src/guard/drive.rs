//! One attempt driven: sent (or re-sent with the same key) if that is safe,
//! classified, an unknown outcome reconciled ([`super::reconcile`]), and
//! what came of it recorded. Sends and recovery both drive attempts here.

use super::attempt::{Drive, Driven, settle, settled_durability};
use super::transport::Outcome;
use super::{Guard, Unsettled, failpoint, prepare};
use crate::ledger::records::{AttemptRecord, AttemptState, StoredResponse, now_ms};
use crate::ledger::{Durability, LedgerWrite, Prior};
use std::time::Duration;

/// What a running tool call keeps while its sends are driven.
#[derive(Default)]
pub(super) struct Progress {
    /// The send on the wire right now. If the invocation is cancelled (its
    /// wall clock ran out) mid-send, this is what may have taken effect.
    pub in_flight: Option<Unsettled>,
    /// Buffered outcome writes not made yet, and the keys of their attempts:
    /// they ride with the call's completion (or are written before the call
    /// ends without one), one write for the whole call.
    held: (LedgerWrite, Vec<String>),
    /// The sends of this run answered 2xx.
    pub effects: super::effects::Effects,
}

impl Progress {
    /// Holds the outcome write of attempt `key` for the call's next write.
    fn hold(&mut self, key: String, write: LedgerWrite) {
        let (held, keys) = &mut self.held;
        *held = std::mem::take(held).and(write);
        keys.push(key);
    }

    /// The held outcome writes, and the keys of their attempts, taken.
    pub fn take_held(&mut self) -> (LedgerWrite, Vec<String>) {
        std::mem::take(&mut self.held)
    }
}

impl Guard {
    /// Sends (or re-sends, same key) `d.attempt` if that is safe, reconciles
    /// an unknown outcome, and records what came of it.
    ///
    /// An attempt that was possibly sent is re-sent only within the
    /// downstream's key retention and only if it honours keys; otherwise it
    /// is reconciled. Its failure to connect now proves nothing about the
    /// earlier try, so it stays unknown.
    ///
    /// With `progress` (a running call), the send on the wire is tracked
    /// and a buffered outcome write is left there for the call to wait for
    /// before it ends — the plugin need not wait for the ledger to hear the
    /// answer; otherwise, and when synced, the write is waited for here.
    ///
    /// Runs in an `attempt` span (key, step, downstream; then the state it
    /// ended in and its latency), a child of the tool call's span.
    pub(super) async fn drive(&self, mut d: Drive<'_>, mut progress: Option<&mut Progress>) -> Driven {
        use tracing::Instrument as _;
        let span = tracing::info_span!("attempt", key = %d.attempt.key, step = d.attempt.step, downstream = %d.downstream.name,
            state = tracing::field::Empty, latency_ms = tracing::field::Empty);
        let started = std::time::Instant::now();
        let driven = async {
            let prior = Prior::Was(d.attempt.state);
            let (durability, mut driven) = self.attempt_once(&mut d, progress.as_deref_mut()).await;
            if let Driven::Damaged(_) = driven {
                return driven;
            }
            crate::metrics::attempt(&d.downstream.name, d.attempt.state);
            let _written = crate::phases::time(crate::phases::Phase::OutcomeWrite);
            let write = LedgerWrite::new().attempt_over(d.attempt.clone(), prior);
            match progress {
                Some(progress) if durability == Durability::Buffered => {
                    progress.hold(d.attempt.key.clone(), write);
                    progress.in_flight = None;
                }
                progress => {
                    let written = if matches!(driven, Driven::NotSent(_)) && super::write_failpoint("fail", "not-sent-write") {
                        Err("failpoint fail:not-sent-write".to_string())
                    } else {
                        self.ledger.queue(write, durability).wait().await.map_err(|e| e.to_string())
                    };
                    if let (Driven::NotSent(told), Err(e)) = (&driven, &written) {
                        driven = Driven::Unsettled(super::unconfirmed::unrecorded_not_sent(d.attempt, told, e));
                    }
                    outcomes_written(&[&d.attempt.key], written);
                    if let Some(progress) = progress {
                        progress.in_flight = None;
                    }
                }
            }
            driven
        }
        .instrument(span.clone())
        .await;
        span.record("state", d.attempt.state.as_str());
        span.record("latency_ms", started.elapsed().as_secs_f64() * 1e3);
        driven
    }

    /// Sends the attempt if that is safe and classifies what came of it:
    /// the attempt updated in place, the durability its record needs, and
    /// what the sender is told.
    async fn attempt_once(&self, d: &mut Drive<'_>, progress: Option<&mut Progress>) -> (Durability, Driven) {
        let downstream = d.downstream;
        // Parsed before it was first recorded; a stored one that does not
        // parse was damaged or written by something else since.
        let url = match url::Url::parse(&d.attempt.request.url) {
            Ok(url) => url,
            Err(e) => return (Durability::Buffered, Driven::Damaged(damaged(d.attempt, &format!("its stored URL does not parse ({e})")))),
        };
        let age = Duration::from_millis(now_ms().saturating_sub(d.attempt.created_ms));
        let may_resend = !d.possibly_sent || (downstream.honours_keys && age < downstream.retention);
        let outcome = if may_resend {
            if let Some(progress) = progress {
                let on_the_wire = AttemptRecord { tries: d.attempt.tries + 1, ..d.attempt.clone() };
                progress.in_flight = Some(Unsettled::of(&on_the_wire, "the invocation was cut off while the request was on its way"));
            }
            let prepared = prepare::build(&d.attempt.request, url, downstream, Some(&d.attempt.key));
            let http = crate::phases::time(crate::phases::Phase::Http);
            let outcome = super::transport::perform(d.client, downstream, &prepared, &mut d.attempt.tries).await;
            drop(http);
            failpoint("after-answer");
            outcome
        } else {
            let why = if downstream.honours_keys { "the provider no longer keeps its key" } else { "the provider does not deduplicate by key" };
            Outcome::Unsettled { state: AttemptState::Unknown, response: None, reason: format!("not re-sent: {why}") }
        };
        let attempt = &mut *d.attempt;
        attempt.updated_ms = now_ms();
        match outcome {
            Outcome::Answered { state, response } => {
                attempt.provider_replayed = header(&response, "idempotent-replayed").is_some_and(|v| v == "true");
                (settled_durability(downstream), settle(attempt, state, response, None))
            }
            Outcome::Unsettled { state: AttemptState::Pending, response, reason } => {
                attempt.state = AttemptState::Pending;
                attempt.response = response;
                attempt.last_error = Some(reason.clone());
                if let Some(found) = self.reconcile_pending(d).await {
                    return found;
                }
                (settled_durability(downstream), Driven::Unsettled(Unsettled::of(d.attempt, &reason)))
            }
            Outcome::NotSent { reason } if !d.possibly_sent => {
                // Nothing reached the downstream: settle it as not sent, synced,
                // so recovery never re-sends what the model was told did not happen.
                attempt.state = AttemptState::Failed;
                attempt.response = None;
                attempt.last_error = Some(format!("not sent: {reason}"));
                let message = format!("{reason}; nothing reached `{}`. Retrying the same tool call is safe", downstream.name);
                (Durability::Synced, Driven::NotSent(message))
            }
            Outcome::Unsettled { response, reason, .. } => {
                attempt.response = response;
                self.reconcile_unknown(d, may_resend, reason).await
            }
            Outcome::NotSent { reason } => {
                let reason = format!("could not reach the provider again ({reason}); an earlier try may have taken effect");
                self.reconcile_unknown(d, may_resend, reason).await
            }
        }
    }
}

/// What the caller of a send is told of attempt `a`, whose record is
/// damaged in the way `what` says: not sent, left as it is, for an operator.
fn damaged(a: &AttemptRecord, what: &str) -> Unsettled {
    let message = format!(
        "the ledger's record of attempt `{}` (step {} of tool call `{}`) is damaged or was written by something other than \
         toolguard: {what}. It was not sent again and the record was left as it is; an earlier try may have taken effect. \
         Do not repeat it under a new tool-call id: an operator must check the provider's state and settle the attempt \
         (`toolguard ledger show {}`, then `toolguard ledger resolve`)",
        a.key, a.step, a.call_id, a.key
    );
    Unsettled { message, ..Unsettled::of(a, what) }
}

/// What came of writing the outcomes of attempts `keys` (if any): on
/// success the `after-outcome-write` failpoint; a failure is logged, since
/// recovery resolves each attempt with its key.
pub(super) fn outcomes_written<K: AsRef<str>, E: std::fmt::Display>(keys: &[K], written: Result<(), E>) {
    if keys.is_empty() {
        return;
    }
    match written {
        Ok(()) => failpoint("after-outcome-write"),
        Err(e) => {
            for key in keys {
                let key = key.as_ref();
                tracing::error!(error = %e, %key, "could not record an attempt's outcome; recovery will resolve it with the same key");
            }
        }
    }
}

fn header<'a>(r: &'a StoredResponse, name: &str) -> Option<&'a str> {
    r.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
}

/// What the ledger said of a step about to be sent.
pub(super) struct Recorded {
    /// Settled before: its response, and nothing is sent.
    pub replay: Option<super::Response>,
    /// An earlier try may have reached the downstream.
    pub possibly_sent: bool,
}

impl Recorded {
    /// Written as pending just now: send it.
    pub fn to_send() -> Self {
        Self { replay: None, possibly_sent: false }
    }
}
