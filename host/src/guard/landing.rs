//! A tool call's completion after its run: kept in the call's lock (a
//! [`Landing`]) until it has landed, so that whoever takes the lock next
//! reads what the ledger holds. On a ledger that lands writes in order
//! (RocksDB), the completion of an irreversible call is not even queued when
//! the run ends: it waits for the record of what the caller was told, which
//! follows within microseconds to milliseconds, and both go as one write
//! (`docs/ledger.md`, "Who does the I/O"). If that record has not come
//! within [`REPORT_WAIT`], the completion is queued alone ([`Deferrals`]).

use super::drive::outcomes_written;
use crate::ledger::records::CallRecord;
use crate::ledger::{Durability, Ledger, LedgerError, LedgerWrite, QueuedWrite};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// How long a completion waits for the report of what its caller was told
/// before it is queued alone: long enough for an answer to be written to a
/// client, short enough that little sits in memory (at most twice this).
pub(super) const REPORT_WAIT: Duration = Duration::from_millis(50);

/// A tool call's completion, kept in the call's lock
/// ([`super::claim::CallLock`]) until it lands: the next holder of the lock
/// waits for it, so nobody reads the call before the ledger holds it.
pub(super) struct Landing {
    write: Write,
    call_id: String,
    /// The keys of the attempts whose outcomes ride with it; emptied once
    /// how the write went has been told.
    outcomes: Vec<String>,
    /// The call, as completed: for the report of what its caller was told.
    pub(super) record: Option<CallRecord>,
    /// Whether how the write went has been told (logged) yet.
    told: bool,
}

/// Where a completion's write is.
enum Write {
    /// Not handed to the ledger yet, waiting to ride with the report: the
    /// outcomes of the call's sends; the completed record is the landing's.
    Deferred(Box<LedgerWrite>, Ledger),
    /// Handed to the ledger (alone, or with the report).
    Queued(QueuedWrite),
    /// Between the two, never across an `await`.
    Moving,
}

impl Landing {
    /// The queued completion `write` of `record`, with the outcomes of `outcomes`.
    pub(super) fn new(write: QueuedWrite, outcomes: Vec<String>, record: CallRecord) -> Self {
        Self { write: Write::Queued(write), call_id: record.call_id.clone(), outcomes, record: Some(record), told: false }
    }

    /// The completion of `record`, not queued yet, with `held`, the outcome
    /// writes of the attempts `outcomes`: the report carries it
    /// ([`Landing::take_deferred`]); anyone else who needs it landed queues
    /// it first ([`Landing::wait`]); dropped, it is queued.
    pub(super) fn deferred(ledger: Ledger, held: LedgerWrite, outcomes: Vec<String>, record: CallRecord) -> Self {
        Self { write: Write::Deferred(Box::new(held), ledger), call_id: record.call_id.clone(), outcomes, record: Some(record), told: false }
    }

    /// Whether the write has landed; how it went is told the first time it has.
    pub(super) fn landed(&mut self) -> bool {
        if self.told {
            return true;
        }
        let Write::Queued(write) = &mut self.write else { return false };
        let Some(written) = write.try_wait() else { return false };
        self.tell(written.clone());
        true
    }

    /// Waits for the write to land (queueing it first if it was deferred),
    /// tells how it went the first time, and returns that. Cancelled, it
    /// can be waited for again.
    pub(super) async fn wait(&mut self) -> Result<(), LedgerError> {
        self.queue();
        let Write::Queued(write) = &mut self.write else { unreachable!("queue() leaves the write queued") };
        let written = write.landed().await;
        if !self.told {
            self.tell(written.clone());
        }
        written
    }

    /// Hands a deferred completion to the ledger alone, without waiting for it.
    pub(super) fn queue(&mut self) {
        if let Some((held, ledger)) = self.take_deferred() {
            // The completed record stays for the report; a landing without
            // one (never made so) still writes its outcomes.
            let write = match self.record.clone() {
                Some(record) => held.call(record),
                None => held,
            };
            self.write = Write::Queued(ledger.queue(write, Durability::Buffered));
        }
    }

    /// The deferred completion's outcome writes (without the completed
    /// record, which the taker writes) and the ledger: [`Landing::ride`]
    /// must follow before any `await`.
    pub(super) fn take_deferred(&mut self) -> Option<(LedgerWrite, Ledger)> {
        match std::mem::replace(&mut self.write, Write::Moving) {
            Write::Deferred(held, ledger) => Some((*held, ledger)),
            other => {
                self.write = other;
                None
            }
        }
    }

    /// The write that carries the completion now (the report's, with it).
    pub(super) fn ride(&mut self, write: QueuedWrite) {
        self.write = Write::Queued(write);
    }

    /// Tells how the write went: the completion's, and its outcomes'.
    fn tell(&mut self, written: Result<(), LedgerError>) {
        self.told = true;
        if let Err(e) = &written {
            tracing::warn!(error = %e, call_id = %self.call_id, "could not record the completed tool call; a replay will re-run it");
        }
        outcomes_written(&std::mem::take(&mut self.outcomes), written);
    }
}

impl Drop for Landing {
    /// A completion still waiting for its report is queued, not lost, when
    /// its lock goes away (the host shutting down).
    fn drop(&mut self) {
        self.queue();
    }
}

/// A call's lock with what it keeps (`super::claim::CallLock`).
type CallLock = Arc<tokio::sync::Mutex<Option<Landing>>>;

/// The completions waiting for their reports, each queued alone by a
/// background task if its report has not come within [`REPORT_WAIT`].
pub(super) struct Deferrals {
    /// The background task's queue; a new task is started when there is
    /// none, or when the runtime that ran the last one has shut down.
    tx: Mutex<Option<mpsc::UnboundedSender<(CallLock, Instant)>>>,
    /// [`REPORT_WAIT`] in µs; tests change it.
    wait_us: AtomicU64,
}

impl Default for Deferrals {
    fn default() -> Self {
        Self { tx: Mutex::new(None), wait_us: AtomicU64::new(REPORT_WAIT.as_micros() as u64) }
    }
}

impl Deferrals {
    /// Watches the completion deferred in `lock`: if it is still there in
    /// [`REPORT_WAIT`], it is queued. Call within a Tokio runtime.
    pub(super) fn watch(&self, lock: CallLock) {
        let due = Instant::now() + Duration::from_micros(self.wait_us.load(Relaxed));
        let mut tx = self.tx.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if tx.as_ref().is_none_or(mpsc::UnboundedSender::is_closed) {
            let (sender, rx) = mpsc::unbounded_channel();
            tokio::spawn(flush_late(rx));
            *tx = Some(sender);
        }
        let watching = tx.as_ref().expect("just made").send((lock, due));
        drop(tx);
        // The task is gone already (its runtime shutting down): queue it now.
        if let Err(mpsc::error::SendError((lock, _))) = watching {
            queue_unless_held(&lock);
        }
    }
}

/// Queues the completion deferred in `lock`, if any, unless someone holds
/// the lock: a holder takes care of the completion itself.
fn queue_unless_held(lock: &CallLock) {
    if let Ok(mut slot) = lock.try_lock()
        && let Some(landing) = slot.as_mut()
    {
        landing.queue();
    }
}

/// Queues each watched completion still deferred at its time. Watches come
/// in the order of their times: one sleep serves every watch queued by then.
async fn flush_late(mut rx: mpsc::UnboundedReceiver<(CallLock, Instant)>) {
    let mut due = Vec::new();
    while rx.recv_many(&mut due, 4096).await > 0 {
        if let Some((_, last)) = due.last() {
            tokio::time::sleep_until(*last).await;
        }
        for (lock, _) in due.drain(..) {
            queue_unless_held(&lock);
        }
    }
}

#[cfg(test)]
#[path = "landing_tests.rs"]
mod tests;
