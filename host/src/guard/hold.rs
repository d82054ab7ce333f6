//! The hold rule: identical calls of an irreversible tool (same session,
//! tool and canonical arguments) whose lifetimes overlap — from the first
//! one's admission until a definitive outcome of one of them reached the
//! caller — make at most one side effect. Such calls form an *episode* of
//! their action; exactly one of them, the executor, may send, and the
//! others follow it: they wait for it (bounded), then are answered with its
//! outcome. The state table is in `docs/guard.md` ("The hold rule").
//!
//! Every decision about one action is taken under an in-process lock per
//! action and written before the lock is released; on a shared ledger the
//! writes that matter are conditional ([`EpisodeOp`], [`Superseding`]), so
//! two hosts can never both act.

use super::{Admission, CallIdentity, CallRules, Guard, Started, conflict, failpoint, internal};
use crate::error::{CallError, ErrorKind};
use crate::ledger::records::{CallRecord, CallState, EpisodeRecord, Reported, StoredOutcome, now_ms};
use crate::ledger::{AttemptRecord, AttemptState, Durability, EpisodeOp, LedgerWrite, Superseding, sent_nothing};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the ledger holds about a call and its action, read in one trip.
#[derive(Debug, Default)]
struct Seen {
    /// The call's own record.
    call: Option<CallRecord>,
    /// The call's episode, or (for a call not in one yet) its action's latest.
    episode: Option<EpisodeRecord>,
    /// That episode's executor, when it is another call: its record (if
    /// any) and its attempts.
    executor: Option<(Option<CallRecord>, Vec<AttemptRecord>)>,
    /// When the call was pruned, if it was (then nothing else is read).
    expired: Option<u64>,
}

/// Where the executor of a call's episode stands.
#[derive(Debug)]
enum Executor {
    /// It completed: its outcome answers the follower.
    Completed(CallRecord),
    /// It runs now, here or on another host.
    Running,
    /// It left a send pending or unknown and nothing runs it: resolve it.
    Unsettled(CallRecord),
    /// Every send it made was answered, but it never completed (its host
    /// stopped first, or recovery settled its sends).
    Settled(CallRecord, Vec<AttemptRecord>),
    /// It provably sent nothing and is not running: it may be superseded.
    Idle(Option<CallRecord>),
}

/// What admission decided.
#[derive(Debug)]
enum Decision {
    Conflict(CallRecord),
    /// The ledger contradicts itself.
    Damaged(String),
    Replay(CallRecord),
    /// Run the call (its record, whether new).
    Run(CallRecord, bool),
    /// Open episode `n` of the action with this (new) call as its executor.
    Open(u64),
    /// Follow the episode's executor.
    Follow(EpisodeRecord, Executor),
    /// The call was pruned at this time: refuse it.
    Expired(u64),
}

/// What to do after a decision was written.
#[allow(clippy::large_enum_variant, reason = "one per decision, moved once")]
enum Next {
    Admitted(Admission),
    /// Run the call (its record, and whether it is in the ledger).
    Run(CallRecord, bool),
    Wait(String),
    Settle(CallRecord),
    /// Decide again at once (a conditional write lost a race).
    Again,
    /// Decide again once an answer of this action has been recorded as told.
    AnswerOnItsWay,
}

impl Guard {
    /// Admits a call of an irreversible tool under the hold rule, holding
    /// the call's own lock `lock` throughout.
    pub(super) async fn admit_irreversible(
        self: &Arc<Self>,
        id: CallIdentity,
        rules: CallRules,
        mut lock: tokio::sync::OwnedMutexGuard<()>,
    ) -> Result<Admission, CallError> {
        let arrived_ms = now_ms();
        let deadline = Instant::now() + rules.hold_wait;
        let answers_deadline = Instant::now() + super::outgoing::DELIVERY_WAIT;
        let action = (id.session.clone(), id.tool.clone(), id.args_digest.clone());
        let mut resolved_once = false;
        loop {
            let next = {
                let _action = self.action_lock(&id).lock_owned().await;
                let seen = self.look(&id, arrived_ms).await?;
                // A new call while an answer of this action is on its way: whether
                // it is a new action depends on when that answer left. Learn it first.
                let open = seen.episode.as_ref().is_some_and(|e| !e.closed);
                if seen.call.is_none() && open && Instant::now() < answers_deadline && self.outgoing.any(&action) {
                    Next::AnswerOnItsWay
                } else {
                    let decision = self.decide(&id, seen, arrived_ms);
                    self.apply(&id, &rules, decision).await?
                }
            };
            match next {
                Next::Admitted(admission) => return Ok(admission),
                Next::Run(record, persisted) => match self.start(record, persisted, &rules, lock).await? {
                    Started::Admitted(admission) => return Ok(admission),
                    // The same call id runs on another host: wait for it, however long it takes.
                    Started::Busy(back) => {
                        lock = back;
                        tokio::time::sleep(super::CLAIM_POLL).await;
                    }
                    Started::Superseded(back) => lock = back,
                },
                Next::Again => {}
                Next::AnswerOnItsWay => self.outgoing.wait(answers_deadline).await,
                Next::Wait(executor) if Instant::now() < deadline => self.wait_for(&id.session, &executor, deadline).await,
                Next::Settle(executor) if Instant::now() < deadline && !resolved_once => {
                    resolved_once = true;
                    let tool = super::ToolRules { grants: rules.grants.clone(), reconciler: rules.reconciler.clone() };
                    self.resolve_in_background(executor, tool, deadline).await;
                }
                Next::Wait(executor) | Next::Settle(CallRecord { call_id: executor, .. }) => return Err(self.held(&id, &executor).await),
            }
        }
    }

    /// Reads the call, its episode and the episode's executor.
    /// The executor is not read when the rule will not need it: a new call
    /// after the episode closed opens the next one (see [`Guard::decide`]).
    async fn look(&self, id: &CallIdentity, arrived_ms: u64) -> Result<Seen, CallError> {
        let (session, call_id, tool, digest) = (id.session.clone(), id.call_id.clone(), id.tool.clone(), id.args_digest.clone());
        self.ledger
            .read(move |l| {
                let call = l.call(&session, &call_id)?;
                if call.is_none()
                    && let Some(at) = l.expired(&session, &call_id)?
                {
                    return Ok(Seen { call, episode: None, executor: None, expired: Some(at) });
                }
                let number = call.as_ref().and_then(|c| c.episode);
                let episode = match (&call, number) {
                    (Some(_), None) => None,
                    (_, n) => l.episode(&session, &tool, &digest, n)?,
                };
                let executor = match &episode {
                    Some(e) if call.is_none() && e.closed && e.closed_ms.unwrap_or(0) <= arrived_ms => None,
                    Some(e) if e.executor != call_id => Some((l.call(&session, &e.executor)?, l.attempts_of_call(&session, &e.executor)?)),
                    _ => None,
                };
                Ok(Seen { call, episode, executor, expired: None })
            })
            .await
            .map_err(internal)
    }

    /// The rule itself, on what [`Guard::look`] found (see `docs/guard.md`),
    /// for a call that arrived at `arrived_ms`.
    fn decide(&self, id: &CallIdentity, seen: Seen, arrived_ms: u64) -> Decision {
        if let Some(at) = seen.expired {
            return Decision::Expired(at);
        }
        match (seen.call, seen.episode) {
            (Some(c), _) if c.tool != id.tool || c.args_digest != id.args_digest => Decision::Conflict(c),
            (Some(c), _) if c.state == CallState::Completed && c.outcome.is_some() => Decision::Replay(c),
            // Recorded before episodes existed (schema 1): it runs as it always did.
            (Some(c), None) if c.episode.is_none() => Decision::Run(c, true),
            (Some(c), Some(e)) if e.executor == c.call_id => Decision::Run(c, true),
            (None, None) => Decision::Open(1),
            // Closed when its definitive answer left the host: before this call
            // arrived, a new action; after, the two overlapped.
            (None, Some(e)) if e.closed && e.closed_ms.unwrap_or(0) <= arrived_ms => Decision::Open(e.episode + 1),
            (_, Some(e)) => {
                let (record, attempts) = seen.executor.unwrap_or_default();
                let state = self.executor_state(&id.session, &e.executor, record, attempts);
                Decision::Follow(e, state)
            }
            (Some(c), None) => Decision::Damaged(format!(
                "tool call `{}` belongs to episode {} of its action, which the ledger no longer holds; nothing was run. \
                 An operator must inspect the ledger (`toolguard ledger show {}`)",
                c.call_id,
                c.episode.unwrap_or_default(),
                c.call_id
            )),
        }
    }

    fn executor_state(&self, session: &str, call_id: &str, record: Option<CallRecord>, attempts: Vec<AttemptRecord>) -> Executor {
        let running = self.in_progress(session, call_id)
            || (self.ledger.shared() && record.as_ref().is_some_and(|r| r.leased_elsewhere(&self.host, now_ms())));
        match record {
            Some(r) if r.state == CallState::Completed && r.outcome.is_some() => Executor::Completed(r),
            _ if running => Executor::Running,
            record if sent_nothing(&attempts) => Executor::Idle(record),
            Some(r) if attempts.iter().any(|a| a.state.is_unsettled()) => Executor::Unsettled(r),
            Some(r) => Executor::Settled(r, attempts),
            // Attempts without their call record: treat as unresolved.
            None => Executor::Running,
        }
    }

    /// Writes what `decision` needs and says what comes next.
    async fn apply(self: &Arc<Self>, id: &CallIdentity, rules: &CallRules, decision: Decision) -> Result<Next, CallError> {
        let new_call = |episode: u64, follower: bool| CallRecord {
            episode: Some(episode),
            follower,
            ..CallRecord::admitted(id.session.clone(), id.call_id.clone(), id.tool.clone(), id.args_digest.clone(), id.args.clone())
        };
        match decision {
            Decision::Conflict(first) => Err(conflict(id, &first)),
            Decision::Expired(at) => Err(super::expired(&id.call_id, at)),
            Decision::Damaged(message) => Err(CallError::new(ErrorKind::Internal, message)),
            Decision::Replay(record) => Ok(Next::Admitted(self.replay(record))),
            Decision::Run(record, persisted) => Ok(Next::Run(record, persisted)),
            Decision::Open(n) => {
                let call = new_call(n, false);
                let write = LedgerWrite::new().call(call.clone()).episode(EpisodeOp::Open(EpisodeRecord::open(&call, n)));
                if self.written_charging(id, rules, write).await? {
                    failpoint("after-admission");
                    return Ok(Next::Run(call, true));
                }
                Ok(Next::Again)
            }
            Decision::Follow(episode, executor) => {
                let n = episode.episode;
                match executor {
                    Executor::Idle(old) => {
                        // The executor provably sent nothing and runs nowhere: this call takes its place.
                        let existing = self.stored(id).await?;
                        let call = CallRecord { follower: false, ..existing.unwrap_or_else(|| new_call(n, false)) };
                        let mut write = LedgerWrite::new().call(call.clone()).episode(EpisodeOp::Hand {
                            record: EpisodeRecord { executor: id.call_id.clone(), ..episode.clone() },
                            from: episode.executor.clone(),
                        });
                        if let Some(old) = old {
                            let condition = Superseding { session: id.session.clone(), call_id: old.call_id.clone(), now_ms: now_ms() };
                            write = write.call(CallRecord { superseded_by: Some(id.call_id.clone()), ..old }).superseding(condition);
                        }
                        if self.written_charging(id, rules, write).await? {
                            tracing::info!(call_id = %id.call_id, superseded = %episode.executor, "supersedes an identical call that sent nothing");
                            return Ok(Next::Run(call, true));
                        }
                        Ok(Next::Again)
                    }
                    Executor::Running => {
                        self.follower_record(id, n, new_call).await?;
                        Ok(Next::Wait(episode.executor))
                    }
                    Executor::Unsettled(record) => {
                        self.follower_record(id, n, new_call).await?;
                        Ok(Next::Settle(record))
                    }
                    Executor::Completed(record) => {
                        let outcome = record.outcome.clone().expect("completed calls carry their outcome");
                        Err(self.answer(id, n, new_call, &record.call_id, earlier_outcome(&outcome)).await?)
                    }
                    Executor::Settled(record, attempts) => Err(self.answer(id, n, new_call, &record.call_id, sends_outcome(&attempts)).await?),
                }
            }
        }
    }

    /// The call's stored record, if any.
    async fn stored(&self, id: &CallIdentity) -> Result<Option<CallRecord>, CallError> {
        let (session, call_id) = (id.session.clone(), id.call_id.clone());
        self.ledger.read(move |l| l.call(&session, &call_id)).await.map_err(internal)
    }

    /// This call's record as a follower of episode `n`, written if it is new.
    async fn follower_record(&self, id: &CallIdentity, n: u64, new_call: impl Fn(u64, bool) -> CallRecord) -> Result<CallRecord, CallError> {
        if let Some(existing) = self.stored(id).await? {
            return Ok(existing);
        }
        let call = new_call(n, true);
        self.ledger.commit_async(LedgerWrite::new().call(call.clone()), Durability::Buffered).await.map_err(internal)?;
        Ok(call)
    }

    /// Completes the follower with `held` carrying the executor's outcome.
    async fn answer(
        &self,
        id: &CallIdentity,
        n: u64,
        new_call: impl Fn(u64, bool) -> CallRecord,
        earlier: &str,
        (summary, outcome): (String, Value),
    ) -> Result<CallError, CallError> {
        let message = format!(
            "Not executed: an identical earlier call of `{}` (tool call `{earlier}`) already acted, and doing it again would \
             do it twice. Its outcome: {summary}. Nothing new was sent. If you do want a second, separate `{}`, call it again \
             with a new tool-call id.",
            id.tool, id.tool
        );
        let error = CallError::new(ErrorKind::Held, message).with_detail(json!({ "earlier_call_id": earlier, "earlier_outcome": outcome }));
        let mut call = self.follower_record(id, n, new_call).await?;
        call.state = CallState::Completed;
        call.outcome = Some(StoredOutcome::error(&error));
        call.completed_ms = Some(now_ms());
        self.ledger.commit_async(LedgerWrite::new().call(call.clone()), Durability::Buffered).await.map_err(internal)?;
        self.remember(&call);
        self.outgoing.leaving((id.session.clone(), id.tool.clone(), id.args_digest.clone()), &id.call_id);
        Ok(error)
    }

    /// `held` without an outcome: the executor is still unresolved.
    async fn held(&self, id: &CallIdentity, executor: &str) -> CallError {
        let (session, call_id) = (id.session.clone(), executor.to_string());
        let attempts = self.ledger.read(move |l| l.attempts_of_call(&session, &call_id)).await.unwrap_or_default();
        let unsettled = attempts.iter().find(|a| a.state.is_unsettled());
        let message = format!(
            "Not executed: an identical earlier call of `{}` (tool call `{executor}`) has not finished or its outcome is still \
             unknown, so running this one could do it twice. Check its status first (for refunds: refund_status), or retry tool \
             call `{executor}` itself, which is safe. Retrying this call later returns the earlier call's outcome once it is known.",
            id.tool
        );
        CallError::new(ErrorKind::Held, message).with_detail(json!({
            "earlier_call_id": executor,
            "earlier_key": unsettled.map(|a| a.key.clone()),
            "earlier_state": unsettled.map_or("running", |a| a.state.as_str()),
        }))
    }

    /// Commits `write`, which admits this call to run, spending one use of
    /// each of its budgets in the same write; false if a condition of it lost
    /// a race. Budgets are locked in name order while they are counted and
    /// written, so concurrent calls never both spend a last use.
    ///
    /// # Errors
    /// `denied` when a budget is spent (nothing was run); `internal` when
    /// the ledger fails.
    async fn written_charging(&self, id: &CallIdentity, rules: &CallRules, mut write: LedgerWrite) -> Result<bool, CallError> {
        let at_ms = now_ms();
        let mut scopes: Vec<&super::Budget> = rules.budgets.iter().collect();
        scopes.sort_by(|a, b| a.scope.cmp(&b.scope));
        let mut held = Vec::new();
        for budget in scopes {
            held.push(self.budgets.get(budget.scope.clone()).lock_owned().await);
            write = write.charge(crate::ledger::Charge {
                scope: budget.scope.clone(),
                max: budget.max,
                since_ms: at_ms.saturating_sub(super::BUDGET_WINDOW_MS),
                at_ms,
                call_id: id.call_id.clone(),
                what: budget.what.clone(),
            });
        }
        match self.ledger.commit_async(write, Durability::Buffered).await {
            Ok(()) => Ok(true),
            Err(e) if e.is_conflict() => Ok(false),
            Err(e) if e.is_refused() => {
                Err(CallError::new(ErrorKind::Denied, format!("budget spent: {}; nothing was run", e.message())))
            }
            Err(e) => Err(internal(e)),
        }
    }

    /// Waits until the executor's run here ends, or a poll on another host's, or the deadline.
    async fn wait_for(&self, session: &str, executor: &str, deadline: Instant) {
        let left = deadline.saturating_duration_since(Instant::now());
        if self.in_progress(session, executor) {
            let lock = self.call_lock(session, executor);
            let _ = tokio::time::timeout(left, lock.lock_owned()).await;
        } else {
            tokio::time::sleep(left.min(super::CLAIM_POLL)).await;
        }
    }

    /// Resolves the executor's unsettled sends (same keys; or reconciled),
    /// as recovery would; waits for that until the deadline, and lets it
    /// finish in the background if it takes longer.
    async fn resolve_in_background(self: &Arc<Self>, executor: CallRecord, rules: super::ToolRules, deadline: Instant) {
        let guard = self.clone();
        let task = tokio::spawn(async move { guard.resolve_call(&executor, &rules).await });
        let _ = tokio::time::timeout(deadline.saturating_duration_since(Instant::now()), task).await;
    }

    /// Records that the caller of tool call (`session`, `call_id`) was told
    /// `reported`, the answer having left the host at `delivered_ms`. A
    /// definitive answer closes the call's episode as of that time: an
    /// identical call that arrived later is a new action. Never lowers a
    /// definitive report.
    ///
    /// # Errors
    /// The ledger could not be read or written.
    pub async fn report(&self, session: &str, call_id: &str, reported: Reported, delivered_ms: u64) -> Result<(), crate::ledger::LedgerError> {
        let _lock = self.call_lock(session, call_id).lock_owned().await;
        let (s, c) = (session.to_string(), call_id.to_string());
        let Some(call) = self.ledger.read(move |l| l.call(&s, &c)).await? else { return Ok(()) };
        let action = (call.session.clone(), call.tool.clone(), call.args_digest.clone());
        let written = self.record_report(call, reported, delivered_ms).await;
        self.outgoing.recorded(&action, call_id);
        written
    }

    async fn record_report(&self, call: CallRecord, reported: Reported, delivered_ms: u64) -> Result<(), crate::ledger::LedgerError> {
        let (session, call_id) = (call.session.as_str(), call.call_id.as_str());
        if call.reported == Reported::Definitive || call.reported == reported {
            return Ok(());
        }
        let mut write = LedgerWrite::new().reported(session, call_id, reported);
        let id = CallIdentity { session: session.into(), call_id: call_id.into(), tool: call.tool.clone(), args_digest: call.args_digest.clone(), args: Value::Null };
        let _action = self.action_lock(&id).lock_owned().await;
        if let (Reported::Definitive, Some(n)) = (reported, call.episode) {
            let (s, t, d) = (id.session.clone(), id.tool.clone(), id.args_digest.clone());
            if let Some(episode) = self.ledger.read(move |l| l.episode(&s, &t, &d, Some(n))).await? {
                write = write.episode(EpisodeOp::Close { record: episode, at_ms: delivered_ms });
            }
        }
        self.ledger.commit_async(write, Durability::Buffered).await
    }
}

/// A completed call's outcome, in words and as the follower's detail.
fn earlier_outcome(outcome: &StoredOutcome) -> (String, Value) {
    match outcome {
        StoredOutcome::Result(value) => (format!("it succeeded with {}", excerpt(&value.to_string())), json!({ "result": value })),
        StoredOutcome::Error { kind, message, .. } => {
            (format!("it failed ({kind}: {})", excerpt(message)), json!({ "error": { "kind": kind, "message": message } }))
        }
    }
}

/// What the sends of a call that never completed got back from the provider.
fn sends_outcome(attempts: &[AttemptRecord]) -> (String, Value) {
    let sends: Vec<Value> = attempts
        .iter()
        .map(|a| {
            let body = a.response.as_ref().map(|r| {
                let text = String::from_utf8_lossy(&r.body.to_bytes()).into_owned();
                serde_json::from_str::<Value>(&text).unwrap_or(Value::String(text))
            });
            json!({ "step": a.step, "method": a.request.method, "url": a.request.url, "key": a.key, "state": a.state.as_str(),
                    "status": a.response.as_ref().map(|r| r.status), "body": body })
        })
        .collect();
    let words: Vec<String> = attempts
        .iter()
        .filter(|a| a.state != AttemptState::Failed || a.response.is_some())
        .map(|a| {
            let status = a.response.as_ref().map_or("no response".to_string(), |r| format!("HTTP {}", r.status));
            let body = a.response.as_ref().map(|r| excerpt(&String::from_utf8_lossy(&r.body.to_bytes()))).unwrap_or_default();
            format!("{} {} was answered {status} {body}", a.request.method, a.request.url)
        })
        .collect();
    let summary = format!("{} (that tool call has not completed; retrying it returns its result)", words.join("; "));
    (summary, json!({ "sends": sends }))
}

/// At most 300 characters of `text`.
fn excerpt(text: &str) -> String {
    const MAX: usize = 300;
    match text.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}

/// How long a follower waits for its executor by default: the longest
/// reconcile window among the downstreams a plugin may reach.
pub const DEFAULT_HOLD_WAIT: Duration = Duration::from_secs(3);
