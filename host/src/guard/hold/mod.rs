//! Admission under the hold rule: identical calls of an irreversible tool (same session,
//! tool and canonical arguments) whose lifetimes overlap — from the first
//! one's admission until a definitive outcome of one of them reached the
//! caller — make at most one side effect. Such calls form an *episode* of
//! their action; exactly one of them, the executor, may send, and the
//! others follow it: they wait for it (bounded), then are answered with its
//! outcome. The state table is in `docs/guard.md` ("The hold rule").
//!
//! Every decision about one action is taken under an in-process lock per
//! action and written before the lock is released; on a shared ledger the
//! writes that matter are conditional (`EpisodeOp`, `Superseding`), so
//! two hosts can never both act.

mod apply;
mod told;

use super::claim::{CLAIM_POLL, Held};
use super::start::{Origin, Started};
use super::{Admission, CallIdentity, CallRules, Guard, internal};
use crate::error::CallError;
use crate::ledger::records::{CallRecord, CallState, EpisodeRecord, now_ms};
use crate::ledger::{AttemptRecord, FirstLook, sent_nothing};
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
    Run(CallRecord, Origin),
    /// Open episode `n` of the action with this (new) call as its executor.
    Open(u64),
    /// Follow the episode's executor.
    Follow(EpisodeRecord, Executor),
    /// The call was pruned at this time: refuse it.
    Expired(u64),
}

/// How many conditional admission writes in a row one call may lose
/// before admission gives up with an internal error instead of trying on.
const MAX_LOST_RACES: u32 = 100;

/// The error of a call whose admission lost [`MAX_LOST_RACES`] races.
fn lost_every_race(call_id: &str) -> CallError {
    tracing::error!(%call_id, "admission lost {MAX_LOST_RACES} conditional ledger writes in a row; gave up");
    CallError::new(
        crate::error::ErrorKind::Internal,
        format!(
            "tool call `{call_id}` could not be admitted: its ledger write lost {MAX_LOST_RACES} races in a row, which contention alone does not cause. \
             Nothing was run or sent; retrying the same tool call is safe. If it persists, check the ledger (`toolguard ledger stats`) and the host's log"
        ),
    )
}

/// What to do after a decision was written.
#[allow(clippy::large_enum_variant, reason = "one per decision, moved once")]
enum Next {
    Admitted(Admission),
    /// Run the call (its record, and where it came from).
    Run(CallRecord, Origin),
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
    pub(super) async fn admit_irreversible(self: &Arc<Self>, id: CallIdentity, rules: CallRules, mut lock: Held) -> Result<Admission, CallError> {
        // A call received earlier (its receipt kept while its plugins loaded) arrived then.
        let arrived_ms = rules.arrived_ms.map_or_else(now_ms, |at| at.min(now_ms()));
        let deadline = Instant::now() + rules.hold_wait;
        let answers_deadline = Instant::now() + super::outgoing::DELIVERY_WAIT;
        let action = (id.session.clone(), id.tool.clone(), id.args_digest.clone());
        let mut resolved_once = false;
        let mut lost_races = 0;
        loop {
            let next = {
                let _action = self.action_lock(&id.session, &id.tool, &id.args_digest).lock_owned().await;
                let read = crate::phases::time(crate::phases::Phase::AdmitRead);
                let seen = self.look(&id, arrived_ms).await?;
                drop(read);
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
                Next::Run(record, origin) => match self.start(record, origin, &rules, lock).await? {
                    Started::Admitted(admission) => return Ok(admission),
                    // The same call id runs on another host: wait for it, however long it takes.
                    Started::Busy(back) => {
                        lock = back;
                        tokio::time::sleep(CLAIM_POLL).await;
                    }
                    Started::Superseded(back) => lock = back,
                },
                Next::Again => {
                    // Each lost race means another writer moved this action on, so
                    // the next look decides differently; losing without end is a
                    // fault (of the ledger or of this code), not contention.
                    lost_races += 1;
                    if lost_races >= MAX_LOST_RACES {
                        return Err(lost_every_race(&id.call_id));
                    }
                }
                Next::AnswerOnItsWay => self.outgoing.wait(answers_deadline).await,
                Next::Wait(executor) if Instant::now() < deadline => self.wait_for(&id.session, &executor, deadline).await,
                Next::Settle(executor) if Instant::now() < deadline && !resolved_once => {
                    resolved_once = true;
                    let tool = super::ToolRules { grants: rules.grants.clone(), wires: rules.wires.clone(), reconciler: rules.reconciler.clone() };
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
                // In one trip where each costs a round trip (PostgreSQL); else one read at a time.
                let first = l.first_look(&session, &call_id, &tool, &digest)?;
                let (call, expired, prefetched) = match first {
                    Some(FirstLook { call, expired, episode }) => (call, expired, Some(episode)),
                    None => {
                        let call = l.call(&session, &call_id)?;
                        let expired = if call.is_none() { l.expired(&session, &call_id)? } else { None };
                        (call, expired, None)
                    }
                };
                if let Some(at) = expired {
                    return Ok(Seen { call, episode: None, executor: None, expired: Some(at) });
                }
                // A conflict or a replay: the call's record decides alone.
                if call.as_ref().is_some_and(|c| decides_alone(c, &tool, &digest)) {
                    return Ok(Seen { call, ..Seen::default() });
                }
                let number = call.as_ref().and_then(|c| c.episode);
                let episode = match (&call, number) {
                    (Some(_), None) => None,
                    (_, n) => match prefetched {
                        Some(episode) if call.as_ref().is_none_or(|c| c.state != CallState::Completed) => episode,
                        _ => l.episode(&session, &tool, &digest, n)?,
                    },
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
        // The first two arms are [`decides_alone`]'s: keep them together.
        match (seen.call, seen.episode) {
            (Some(c), _) if c.tool != id.tool || c.args_digest != id.args_digest => Decision::Conflict(c),
            // A completed record without its outcome is refused there, untouched.
            (Some(c), _) if c.state == CallState::Completed => Decision::Replay(c),
            // Recorded before episodes existed (schema 1): it runs as it always did.
            (Some(c), None) if c.episode.is_none() => Decision::Run(c, Origin::Found),
            (Some(c), Some(e)) if e.executor == c.call_id => Decision::Run(c, Origin::Found),
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
        let running = self.in_progress(session, call_id) || (self.ledger.shared() && record.as_ref().is_some_and(|r| r.leased_elsewhere(&self.host, now_ms())))
            // Waiting for a person's decision: as good as running (its approval is the episode's).
            || record.as_ref().is_some_and(|r| r.awaiting_approval(now_ms()));
        match record {
            // One without its outcome (damaged) is refused there, never superseded or settled.
            Some(r) if r.state == CallState::Completed => Executor::Completed(r),
            _ if running => Executor::Running,
            record if sent_nothing(&attempts) => Executor::Idle(record),
            Some(r) if attempts.iter().any(|a| a.state.is_unsettled()) => Executor::Unsettled(r),
            Some(r) => Executor::Settled(r, attempts),
            // Attempts without their call record: treat as unresolved.
            None => Executor::Running,
        }
    }
}

/// How long a follower waits for its executor by default: the longest
/// reconcile window among the downstreams a plugin may reach.
pub const DEFAULT_HOLD_WAIT: Duration = Duration::from_secs(3);

/// A new record of call `id` in episode `episode` of its action, as its
/// executor or (`follower`) one of its followers.
fn new_call(id: &CallIdentity, episode: u64, follower: bool) -> CallRecord {
    CallRecord {
        episode: Some(episode),
        follower,
        ..CallRecord::admitted(id.session.clone(), id.call_id.clone(), id.tool.clone(), id.args_digest.clone(), id.args.clone())
    }
}

/// Whether a call's own record decides its admission, so nothing else need
/// be read: it was first made with another tool or arguments (a conflict),
/// or it completed (a replay). The first two arms of [`Guard::decide`].
fn decides_alone(call: &CallRecord, tool: &str, args_digest: &str) -> bool {
    call.tool != tool || call.args_digest != args_digest || call.state == CallState::Completed
}
