//! A tool call run as an MCP task (`docs/tasks.md`): recorded as soon as it
//! is admitted, so that its task names a durable call, and cancellable
//! while it provably never left the host. A call run as a task sends through its
//! [`Gate`]: the first send that passes makes the call uncancellable, and a
//! cancel closes the gate so no send passes after it. The call is cancelled
//! only if, with the gate closed, its run stopped and (on a shared ledger)
//! its claim held, the ledger holds no attempt of it: then its record is
//! completed as `cancelled` (replays return that). An episode's executor
//! cancelled so, definitive and effect-free, closes its episode at once; a
//! follower's cancel leaves the episode to its executor.

use super::Guard;
use crate::error::{CallError, ErrorKind};
use crate::ledger::records::{CallRecord, CallState, Reported, StoredOutcome, now_ms};
use crate::ledger::{Claim, Durability, LedgerWrite};

/// Whether a tool call run as a task may still send.
#[derive(Debug, Default)]
pub struct Gate(tokio::sync::Mutex<Passage>);

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Passage {
    #[default]
    Open,
    /// A send went through: the call can no longer be cancelled.
    Passed,
    /// Cancelled: no send goes through.
    Closed,
}

impl Gate {
    /// Lets a send through, after which the call cannot be cancelled;
    /// false once a cancel closed the gate.
    pub(super) async fn pass(&self) -> bool {
        let mut passage = self.0.lock().await;
        if *passage == Passage::Closed {
            return false;
        }
        *passage = Passage::Passed;
        true
    }
}

/// What a cancelled call answers, now and on every replay.
fn cancelled(call_id: &str) -> CallError {
    CallError::new(ErrorKind::Cancelled, format!("tool call `{call_id}` was cancelled by its caller before anything of it left the host; nothing was done"))
}

impl Guard {
    /// Cancels tool call (`session`, `call_id`), run here through `gate`,
    /// if it provably sent nothing; `stop` stops this host's run of it. Its
    /// answer, `cancelled`, is recorded.
    ///
    /// # Errors
    /// Why it was not cancelled, in words (a send passed or is recorded, it
    /// completed, another host runs it, the ledger failed); the run was
    /// stopped only if nothing of it had passed the gate, so running the
    /// call again is safe.
    pub async fn cancel(&self, gate: &Gate, session: &str, call_id: &str, stop: impl FnOnce()) -> Result<CallError, String> {
        {
            let mut passage = gate.0.lock().await;
            if *passage == Passage::Passed {
                return Err("a send of it has left the host, so it may have taken effect".into());
            }
            *passage = Passage::Closed;
        }
        stop();
        // The stopped run lets go of the call's lock; nothing of it passed the gate.
        let lock = self.lock_call(session, call_id).await;
        let (s, c) = (session.to_string(), call_id.to_string());
        let read = self.ledger.read(move |l| l.call(&s, &c)).await.map_err(|e| format!("the ledger could not be read ({e})"))?;
        let record = match read {
            None => return Err("it is not recorded yet".into()),
            Some(r) if r.state == CallState::Completed => return Err("it has completed".into()),
            Some(r) => r,
        };
        let record = self.claimed_for_cancel(record).await?;
        let (s, c) = (session.to_string(), call_id.to_string());
        let attempts = self.ledger.read(move |l| l.attempts_of_call(&s, &c)).await.map_err(|e| format!("the ledger could not be read ({e})"));
        let refusal = match attempts {
            Err(why) => Some(why),
            Ok(attempts) => attempts.first().map(|a| {
                format!("step {} of it ({} to `{}`) is recorded as {}, so it may have taken effect", a.step, a.request.method, a.downstream, a.state.as_str())
            }),
        };
        if let Some(why) = refusal {
            self.release(&record).await;
            return Err(why);
        }
        let error = cancelled(call_id);
        let done = CallRecord {
            state: CallState::Completed,
            outcome: Some(StoredOutcome::Error { kind: error.kind.as_str().into(), message: error.message.clone(), detail: None }),
            completed_ms: Some(now_ms()),
            owner: None,
            lease_until_ms: None,
            ..record
        };
        let written = self.ledger.commit_async(LedgerWrite::new().call(done.clone()), Durability::Synced).await;
        written.map_err(|e| format!("its cancellation could not be recorded ({e})"))?;
        self.remember(&done);
        drop(lock);
        // An executor that did nothing closes its episode; a follower's cancel leaves the executor's open.
        if done.episode.is_some()
            && done.is_executor()
            && let Err(e) = self.report(session, call_id, Reported::Definitive, now_ms()).await
        {
            tracing::warn!(error = %e, %call_id, "a cancelled call's episode stays open until its caller is told");
        }
        Ok(error)
    }

    /// On a shared ledger, `record` claimed by this host, so that no other
    /// host runs it while it is being cancelled.
    async fn claimed_for_cancel(&self, record: CallRecord) -> Result<CallRecord, String> {
        let lease_ms = 30_000;
        match self.claim(record, true, lease_ms).await.map_err(|e| format!("the ledger could not be written ({e})"))? {
            Claim::Run { record, .. } => Ok(record),
            Claim::Busy(r) => Err(format!("host `{}` is running it", r.owner.unwrap_or_default())),
            Claim::Completed(_) => Err("it has completed".into()),
            Claim::Conflict(_) | Claim::Superseded(_) => Err("an identical call has taken its place".into()),
        }
    }
}
