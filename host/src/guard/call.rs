//! One tool call in progress, [`CallGuard`]: the guard's state for that
//! call — its record, the steps it sent, the outcomes not yet written, the
//! answers to its questions, its lock — private to this file, and every
//! step that reads or writes it. The steps that need only the shared
//! [`Guard`] take their inputs as arguments (`drive`, `consent`, `finish`).
//!
//! A send (`outbound.send` of a running tool call): the request is checked,
//! its step found or minted a key (`crate::keys`), the attempt written
//! durably as pending *before* anything leaves, then driven
//! ([`super::drive`]). A step already recorded is never sent under a new
//! key: a settled one replays its response, an unsettled one is re-driven
//! with its own key.
//!
//! What earlier runs of a call left for this one: the sends they made that
//! this run did not make again — a tool that decides otherwise when its
//! call runs again (a clock, randomness, a hostile plugin) must not end
//! with an answer that hides them (`docs/guard.md`) — and the answers to
//! its questions they were made on ([`super::answers`]).
//!
//! The end of a run, as [`Guard::finish`] takes it: the call's record, its
//! first unsettled send, the outcome writes its completion carries, and the
//! lock it leaves the completion in.

use super::attempt::{Drive, Driven};
use super::claim::Held;
use super::drive::{Progress, Recorded, outcomes_written};
use super::unconfirmed::{self, Unwritten, ledger_down};
use super::{Answered, CallRules, Guard, Request, Response, SendError, Unsettled, failpoint, prepare};
use crate::keys;
use crate::ledger::records::{AttemptRecord, AttemptState, CallRecord, PlannedSend, Resolution, now_ms};
use crate::ledger::{Durability, LedgerWrite, Prior, QueuedWrite};
use crate::policy::{self, Downstream, Effect};
use serde_json::Value;
use std::sync::Arc;

/// One tool call in progress: the guard's state for the plugin's sends.
pub struct CallGuard {
    guard: Arc<Guard>,
    record: CallRecord,
    /// Whether `record` is in the ledger yet (written with the first attempt, or [`CallGuard::persist`]).
    persisted: bool,
    /// Whether an earlier run of this call may have sent (its record was found, not written).
    ran_before: bool,
    rules: CallRules,
    next_step: u32,
    /// Sends made so far, re-sends of an unsettled step included (the budget).
    sends: u32,
    /// Sends of this run whose outcome is not settled, in the order they
    /// were made, with their request fingerprint: the same request again
    /// re-drives that step with its key.
    open_steps: Vec<(String, Unsettled)>,
    /// The send on the wire, the outcome writes not yet waited for, the effects.
    progress: Progress,
    /// The run's answers to its questions, recorded with each new send (`super::answers`).
    answered: Option<super::answers::Answered>,
    _lock: Held,
}

impl CallGuard {
    pub(super) fn new(guard: Arc<Guard>, record: CallRecord, persisted: bool, rules: CallRules, lock: Held) -> Self {
        Self {
            guard,
            record,
            persisted,
            ran_before: false,
            rules,
            next_step: 0,
            sends: 0,
            open_steps: Vec::new(),
            progress: Progress::default(),
            answered: None,
            _lock: lock,
        }
    }

    /// The call's arguments as first recorded.
    pub fn args(&self) -> &serde_json::Value {
        &self.record.args
    }

    /// Writes the buffered outcomes this call's sends hold, and waits, so
    /// the ledger holds them before they are read again, or the call's
    /// error is returned and its lock released.
    pub(super) async fn flush(&mut self) {
        if let Some((write, keys)) = self.queue_held() {
            outcomes_written(&keys, write.wait().await);
        }
    }

    /// Queues the buffered outcomes this call's sends hold, if any, as one
    /// write; with the keys of their attempts.
    fn queue_held(&mut self) -> Option<(QueuedWrite, Vec<String>)> {
        let (write, keys) = self.progress.take_held();
        (!keys.is_empty()).then(|| (self.guard.ledger.queue(write, Durability::Buffered), keys))
    }

    /// `outbound.send`: see `docs/guard.md`.
    ///
    /// # Errors
    /// Why nothing was sent, or that the outcome is unknown ([`SendError`]).
    pub async fn send(&mut self, req: Request) -> Result<Response, SendError> {
        let (method, url) = (req.method.clone(), req.url.clone());
        let sent = self.send_checked(req).await;
        self.progress.effects.note(&method, &url, &sent);
        sent
    }

    async fn send_checked(&mut self, req: Request) -> Result<Response, SendError> {
        if self.rules.effect == Effect::ReadOnly {
            return Err(SendError::Denied(format!("`{}` is a read-only tool: it may fetch but not send; nothing was sent", self.record.tool)));
        }
        if self.sends >= self.rules.max_sends {
            return Err(SendError::Denied(format!(
                "send budget spent: a call of `{}` may send {} time(s) (max_sends_per_call); nothing was sent",
                self.record.tool, self.rules.max_sends
            )));
        }
        if let Some(gate) = &self.rules.gate
            && !gate.pass().await
        {
            return Err(SendError::Denied("this tool call was cancelled by its caller; nothing was sent".into()));
        }
        let (downstream, url) = policy::authorize(&self.rules.grants, self.rules.wires.downstreams(), &req.method, &req.url).map_err(SendError::from)?;
        if req.body.len() > downstream.max_request_bytes {
            return Err(SendError::Invalid(format!(
                "the request body is {} bytes; `{}` takes at most {} (max_request_bytes); nothing was sent",
                req.body.len(),
                downstream.name,
                downstream.max_request_bytes
            )));
        }
        let request = prepare::stored(&req.method, url.as_str(), req.headers, &req.body);
        prepare::check(&request, &downstream).map_err(SendError::Invalid)?;
        super::spending::carries(&self.rules.carried, &request).map_err(SendError::Denied)?;
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
        let format = downstream.key_format;
        let mut attempt = self.fresh_attempt(PlannedSend { step, generation: 0, fingerprint, downstream: downstream.name.clone(), request }, format);
        let recorded = self.record_step(&mut attempt, format).await?;
        if let Some(response) = recorded.replay {
            return Ok(response);
        }
        self.drive_step(&mut attempt, &downstream, recorded.possibly_sent).await
    }

    /// Looks step `fresh.step` up and, if it is new, writes `fresh` (and the
    /// call, the first time) synced before anything leaves; otherwise
    /// replaces `fresh` with what the ledger holds and says what to do with it.
    /// A key minted here (an operator's next generation) is written in `format`.
    async fn record_step(&mut self, fresh: &mut AttemptRecord, format: keys::KeyFormat) -> Result<Recorded, SendError> {
        let (session, call_id, step) = (self.record.session.clone(), self.record.call_id.clone(), fresh.step);
        let current = self.guard.ledger.read(move |ledger| ledger.attempt_at(&session, &call_id, step)).await.map_err(ledger_down)?;
        let Some(a) = current else {
            self.commit_pending(fresh, Prior::Absent).await?;
            return Ok(Recorded::to_send());
        };
        if a.fingerprint != fresh.fingerprint {
            // What the earlier run's request came to, the call's answer must tell.
            self.progress.effects.note_settled_earlier(&a);
            return Err(SendError::Conflict(format!(
                "step {step} of tool call `{}` was recorded with a different request ({} {}); the plugin is not \
                 deterministic for the same arguments. Nothing was sent",
                self.record.call_id, a.request.method, a.request.url
            )));
        }
        if a.state.is_final()
            && let Some(response) = a.response
        {
            return Ok(Recorded { replay: Some(response.into()), possibly_sent: true });
        }
        match a.resolution {
            Some(Resolution::HostFault) => Err(self.left_for_operator(&a)),
            Some(Resolution::OperatorNotSent) => {
                let (fingerprint, downstream, request) = (fresh.fingerprint.clone(), fresh.downstream.clone(), fresh.request.clone());
                let next = self.fresh_attempt(PlannedSend { step, generation: a.generation + 1, fingerprint, downstream, request }, format);
                *fresh = self.write_pending(next, Prior::Absent).await?;
                Ok(Recorded::to_send())
            }
            // Settled as never sent: try again, same key, recorded as pending first.
            _ if a.state == AttemptState::Failed => {
                *fresh = self.write_pending(a, Prior::Was(AttemptState::Failed)).await?;
                Ok(Recorded::to_send())
            }
            // Pending or unknown: it may be out there already.
            _ => {
                *fresh = a;
                Ok(Recorded { replay: None, possibly_sent: true })
            }
        }
    }

    /// Drives `attempt` and tells the plugin how it ended, keeping track of
    /// this run's steps whose outcome is not settled.
    async fn drive_step(&mut self, attempt: &mut AttemptRecord, downstream: &Downstream, possibly_sent: bool) -> Result<Response, SendError> {
        let (rec, wires, step) = (self.rules.reconciler.clone(), self.rules.wires.clone(), attempt.step);
        let d = Drive { attempt: &mut *attempt, downstream, client: wires.client(downstream), reconciler: rec.as_deref(), call: &self.record, possibly_sent };
        match self.guard.drive(d, Some(&mut self.progress)).await {
            Driven::Answered(response) => {
                self.open_steps.retain(|(_, info)| info.step != step);
                Ok(response.into())
            }
            Driven::Unsettled(info) | Driven::Damaged(info) => {
                match self.open_steps.iter_mut().find(|(_, open)| open.step == step) {
                    Some((_, open)) => *open = info.clone(),
                    None => self.open_steps.push((attempt.fingerprint.clone(), info.clone())),
                }
                Err(SendError::OutcomeUnknown(info))
            }
            Driven::NotSent(message) => Err(SendError::Transport(message)),
        }
    }

    /// Drives step `step` of this run again: its outcome was not settled when
    /// the plugin sent the same request once more.
    pub(super) async fn redrive(&mut self, step: u32, downstream: &Downstream) -> Result<Response, SendError> {
        // Its outcome writes land before it is read again.
        self.flush().await;
        let (session, call_id) = (self.record.session.clone(), self.record.call_id.clone());
        let current = self.guard.ledger.read(move |ledger| ledger.attempt_at(&session, &call_id, step)).await.map_err(ledger_down)?;
        match current {
            Some(a) if a.state.is_final() && a.response.is_some() => Ok(a.response.expect("checked").into()),
            Some(a) if a.resolution == Some(Resolution::HostFault) => Err(self.left_for_operator(&a)),
            Some(mut a) if a.state.is_unsettled() => self.drive_step(&mut a, downstream, true).await,
            _ => Err(SendError::Transport(format!("step {step} of this call is no longer in the ledger as it was; nothing was sent"))),
        }
    }

    /// An attempt the host failed on before (a panic): it is never sent
    /// again on its own, and the call cannot complete past it.
    pub(super) fn left_for_operator(&mut self, a: &AttemptRecord) -> SendError {
        let message = a.last_error.clone().unwrap_or_else(|| "the host failed on it; an operator must resolve it".into());
        Unsettled { message, ..Unsettled::of(a, "the host failed on it") }.kept_open(&mut self.open_steps, &a.fingerprint)
    }

    /// A new attempt for `send`: its key minted from the call's identity,
    /// the step and the key generation (`docs/keys.md`), written in `format`.
    fn fresh_attempt(&self, send: PlannedSend, format: keys::KeyFormat) -> AttemptRecord {
        let (r, step, generation) = (&self.record, send.step, send.generation);
        let input = keys::KeyInput { session: &r.session, call_id: &r.call_id, tool: &r.tool, args_digest: &r.args_digest, step, generation };
        let policy = Some(self.rules.policy_digest.clone()).filter(|d| !d.is_empty());
        let answers = self.answered.as_ref().and_then(super::answers::Answered::to_record);
        AttemptRecord { policy, answers, ..AttemptRecord::pending(r, keys::mint_as(self.guard.ledger.secret(), input, format), send) }
    }

    /// Makes `attempt` durable as pending (with the call, the first time) before anything is sent.
    async fn write_pending(&mut self, mut attempt: AttemptRecord, prior: Prior) -> Result<AttemptRecord, SendError> {
        attempt.state = AttemptState::Pending;
        attempt.response = None;
        attempt.updated_ms = now_ms();
        self.commit_pending(&attempt, prior).await?;
        Ok(attempt)
    }

    /// Writes the pending `attempt` (and the call, the first time) synced, over
    /// what `prior` says the ledger held: nothing leaves before this returns.
    async fn commit_pending(&mut self, attempt: &AttemptRecord, prior: Prior) -> Result<(), SendError> {
        let mut write = LedgerWrite::new().attempt_over(attempt.clone(), prior);
        if !self.persisted {
            write = write.call(self.record.clone());
        }
        let pending = crate::phases::time(crate::phases::Phase::PendingWrite);
        let written = unconfirmed::pending_written(self.guard.ledger.commit_async(write, Durability::Synced).await);
        drop(pending);
        match written {
            Ok(()) => {}
            Err(Unwritten::Refused(told)) => return Err(told),
            Err(Unwritten::Unconfirmed(error)) => {
                // It may have landed; an unknown outcome stays this run's open step.
                let call = (!self.persisted).then(|| self.record.clone());
                let told = unconfirmed::settle_pending(&self.guard, call, attempt, &error).await;
                match &told {
                    SendError::OutcomeUnknown(info) => self.open_steps.push((attempt.fingerprint.clone(), info.clone())),
                    _ => self.persisted = true,
                }
                return Err(told);
            }
        }
        self.persisted = true;
        failpoint("after-attempt-write");
        Ok(())
    }
}

// What earlier runs left for this one.

impl CallGuard {
    /// Notes that an earlier run of the call may have sent ([`CallGuard::settle_left_behind`]).
    pub(super) fn after_earlier_runs(mut self, ran_before: bool) -> Self {
        self.ran_before = ran_before;
        self
    }

    /// The sends an earlier run of this call made at steps this run did not
    /// reach — the tool decided otherwise this time (another answer to its
    /// question, or it is not deterministic) — settled as recovery would
    /// (the same key re-sent, or reconciled; never a new key) and noted with
    /// the call's effects; one still unsettled leaves the call unsettled.
    /// Its answer must account for them (`docs/guard.md`).
    ///
    /// # Errors
    /// The ledger could not be read.
    pub(super) async fn settle_left_behind(&mut self) -> Result<(), SendError> {
        if !self.ran_before {
            return Ok(());
        }
        let (session, call_id, reached) = (self.record.session.clone(), self.record.call_id.clone(), self.next_step);
        let mut behind = self.guard.ledger.read(move |ledger| ledger.attempts_of_call(&session, &call_id)).await.map_err(ledger_down)?;
        behind.retain(|a| a.step >= reached);
        behind.sort_by_key(|a| a.step);
        for a in behind {
            // Settled: what it came to (a send settled as never sent took no effect).
            if a.state.is_final() {
                self.progress.effects.note_settled_earlier(&a);
                continue;
            }
            let (method, url) = (a.request.method.clone(), a.request.url.clone());
            let outcome = if a.resolution == Some(Resolution::HostFault) {
                Err(self.left_for_operator(&a))
            } else {
                match policy::authorize(&self.rules.grants, self.rules.wires.downstreams(), &method, &url) {
                    Ok((downstream, _)) if downstream.name == a.downstream => self.redrive(a.step, &downstream).await,
                    _ => Err(Unsettled::of(&a, "the policy no longer grants it, so it is not re-sent; an operator must settle it")
                        .kept_open(&mut self.open_steps, &a.fingerprint)),
                }
            };
            self.progress.effects.note_earlier(&method, &url, &outcome);
        }
        Ok(())
    }

    /// The answered rounds the call's earlier runs recorded with their sends
    /// (those of the latest send that carries any), if it ran before.
    ///
    /// # Errors
    /// The ledger could not be read.
    pub async fn earlier_answers(&mut self) -> Result<Option<Value>, SendError> {
        if !self.ran_before {
            return Ok(None);
        }
        let (session, call_id) = (self.record.session.clone(), self.record.call_id.clone());
        let attempts = self.guard.ledger.read(move |ledger| ledger.attempts_of_call(&session, &call_id)).await.map_err(ledger_down)?;
        Ok(attempts.into_iter().filter(|a| a.answers.is_some()).max_by_key(|a| (a.step, a.created_ms)).and_then(|a| a.answers))
    }

    /// Records the run's answered rounds, as `answered` holds them, with each new send.
    pub fn record_answers(&mut self, answered: Answered) {
        self.answered = Some(answered);
    }
}

// The end of a run.

impl CallGuard {
    /// The call's completion, with the buffered outcomes its sends hold
    /// (one atomic write), and the keys of those attempts.
    pub(super) fn completion(&mut self, completed: CallRecord) -> (LedgerWrite, Vec<String>) {
        let (outcomes, keys) = self.take_held();
        (outcomes.call(completed), keys)
    }

    /// The buffered outcomes this call's sends hold, taken, and the keys of
    /// their attempts: for a completion that carries them.
    pub(super) fn take_held(&mut self) -> (LedgerWrite, Vec<String>) {
        self.progress.take_held()
    }

    /// Ends the run, leaving the call's completion in its lock for the
    /// lock's next holder to wait for; the lock, to watch it.
    pub(super) fn leave(mut self, landing: super::landing::Landing) -> super::claim::CallLock {
        *self._lock = Some(landing);
        tokio::sync::OwnedMutexGuard::mutex(&self._lock).clone()
    }

    /// The plugin's `result`, made to account for the effects this call's
    /// sends had ([`super::effects`]).
    pub(super) fn disclosed(&self, result: Result<Value, crate::error::CallError>) -> Result<Value, crate::error::CallError> {
        self.progress.effects.disclosed(result)
    }

    /// Gives back the spending limits' uses of `completed` if none of its
    /// sends took effect (a 4xx, nothing sent, denied): only effects count.
    /// `completed` is marked released, to be written with it.
    pub(super) fn unspent(&self, completed: &mut CallRecord) -> LedgerWrite {
        if !self.progress.effects.none() || !completed.holds_spending() {
            return LedgerWrite::new();
        }
        let write = LedgerWrite::new().release_spent(completed);
        completed.released = true;
        write
    }

    /// The tool call this guard serves.
    pub(super) fn record(&self) -> &CallRecord {
        &self.record
    }

    /// The first unsettled send, or the one cut off mid-flight, if any.
    pub(super) fn take_unsettled(&mut self) -> Option<Unsettled> {
        let first = (!self.open_steps.is_empty()).then(|| self.open_steps.remove(0).1);
        first.or_else(|| self.progress.in_flight.take())
    }
}

impl CallGuard {
    /// The call's record as admitted (what consent is decided on).
    pub fn admitted(&self) -> &CallRecord {
        &self.record
    }

    /// Lets the call run if a person approved it ([`Guard::consent`], which
    /// may write the approval request into this call's record).
    ///
    /// # Errors
    /// The call's answer now: `awaiting-approval`, `busy`, `denied`, or the
    /// ledger's failure.
    pub async fn consent(&mut self, ask: super::Ask) -> Result<(), crate::error::CallError> {
        match self.guard.consent(&mut self.record, ask).await {
            super::approval::Consent::Run => Ok(()),
            super::approval::Consent::Answer { error, recorded } => {
                self.persisted |= recorded;
                Err(error)
            }
        }
    }

    /// Writes the call's record now (synced) if it is not in the ledger
    /// yet, instead of with its first attempt: a task names a durable call.
    ///
    /// # Errors
    /// The ledger could not be written; nothing was run.
    pub async fn persist(&mut self) -> Result<(), crate::error::CallError> {
        if self.persisted {
            return Ok(());
        }
        let write = LedgerWrite::new().call(self.record.clone());
        self.guard.ledger.commit_async(write, Durability::Synced).await.map_err(super::internal)?;
        self.persisted = true;
        Ok(())
    }
}

impl Drop for CallGuard {
    /// A call dropped without ending (a host fault) still writes the
    /// outcomes it holds, buffered and not waited for, as if it had queued
    /// them when they came.
    fn drop(&mut self) {
        if tokio::runtime::Handle::try_current().is_ok() {
            drop(self.queue_held());
        }
    }
}
