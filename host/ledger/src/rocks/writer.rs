//! The ledger's writer thread: every write from async callers is queued
//! here, and whatever queued while the thread was busy is committed as one
//! RocksDB batch with at most one fsync (group commit without a thread per
//! waiting writer). `docs/ledger.md` ("Who does the I/O") has the contract.

use super::write_options;
use crate::Durability;
use rocksdb::{DB, WriteBatch};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

/// The most queued writes the writer commits as one batch.
const MAX_GROUP: usize = 256;

/// One write queued for the writer thread.
pub(super) struct Job {
    pub(super) batch: WriteBatch,
    pub(super) sync: bool,
    pub(super) done: tokio::sync::oneshot::Sender<Result<(), String>>,
}

/// How long a caller polls for an unsynced write's result before it sleeps,
/// unless the writer is in an fsync: such a write takes the writer a few
/// microseconds, less than waking a sleeping thread costs on a VM.
const POLL: Duration = Duration::from_micros(30);

/// A write queued for the writer thread: wait for its result.
pub(super) struct Ticket {
    pub(super) result: tokio::sync::oneshot::Receiver<Result<(), String>>,
    pub(super) sync: bool,
    pub(super) syncing: Arc<AtomicBool>,
}

impl Ticket {
    /// The write's result, once the writer has applied (and, if asked, synced) it.
    pub(super) async fn wait(mut self) -> Result<(), String> {
        if !self.sync {
            let until = Instant::now() + POLL;
            while !self.syncing.load(Ordering::Acquire) && Instant::now() < until {
                match self.result.try_recv() {
                    Ok(result) => return result,
                    Err(tokio::sync::oneshot::error::TryRecvError::Closed) => break,
                    Err(tokio::sync::oneshot::error::TryRecvError::Empty) => std::hint::spin_loop(),
                }
            }
        }
        self.result.await.unwrap_or_else(|_| Err("the ledger's writer thread stopped".into()))
    }
}

/// The writer thread: takes every write queued while it was busy and commits
/// them as one batch, synced if any of them must be. Callers wait on their
/// job's channel, so an async worker never blocks on a write or an fsync,
/// and N waiting writes cost one wake-up of this thread, not N threads.
pub(super) struct Writer {
    pub(super) queue: Option<mpsc::Sender<Job>>,
    /// Whether the writer is in a synced write now (callers then sleep at once).
    pub(super) syncing: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Writer {
    /// Starts the thread, which commits to `db` until the writer is dropped.
    pub(super) fn start(db: Arc<DB>) -> Result<Self, String> {
        let (queue, jobs) = mpsc::channel::<Job>();
        let syncing = Arc::new(AtomicBool::new(false));
        let in_sync = syncing.clone();
        let thread = std::thread::Builder::new()
            .name("toolguard-ledger".into())
            .spawn(move || {
                while let Some(first) = next_job(&jobs) {
                    let mut group = vec![first];
                    while group.len() < MAX_GROUP
                        && let Ok(job) = jobs.try_recv()
                    {
                        group.push(job);
                    }
                    commit_group(&db, group, &in_sync);
                }
            })
            .map_err(|e| format!("cannot start the ledger's writer thread: {e}"))?;
        Ok(Self { queue: Some(queue), syncing, thread: Some(thread) })
    }
}

/// Commits `group` as one batch, synced if any of its writes must be, and
/// tells each writer how it went. `syncing` is raised during a synced write.
pub(super) fn commit_group(db: &DB, group: Vec<Job>, syncing: &AtomicBool) {
    let durability = if group.iter().any(|j| j.sync) { Durability::Synced } else { Durability::Buffered };
    let (batches, done): (Vec<_>, Vec<_>) = group.into_iter().map(|j| (j.batch, j.done)).unzip();
    syncing.store(durability == Durability::Synced, Ordering::Release);
    let result = db.write_opt(concat(batches), &write_options(durability)).map_err(|e| e.to_string());
    if durability == Durability::Synced {
        let extra = SLOW_FSYNC_MICROS.load(Ordering::Relaxed);
        if extra > 0 {
            std::thread::sleep(Duration::from_micros(extra));
        }
    }
    syncing.store(false, Ordering::Release);
    for tx in done {
        let _ = tx.send(result.clone());
    }
}

/// `toolguard bench`'s slow-disk mode: extra time every synced group
/// commit takes, as if the disk's fsync were that much slower (0: off).
static SLOW_FSYNC_MICROS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Makes every synced group commit of this process take `extra` longer
/// (`Duration::ZERO` turns it off). For `toolguard bench` only.
pub fn simulate_slow_fsync(extra: Duration) {
    SLOW_FSYNC_MICROS.store(extra.as_micros() as u64, Ordering::Relaxed);
}

/// How long the writer keeps polling for the next write before it sleeps:
/// waking a sleeping thread costs tens of microseconds on a VM, more than
/// an unsynced write, and a tool call's writes come a few hundred
/// microseconds apart. (RocksDB's own write threads spin 100 µs.)
const SPIN: Duration = Duration::from_micros(200);

/// The next queued write, polling for [`SPIN`] before sleeping; `None` once
/// every sender is gone.
fn next_job(jobs: &mpsc::Receiver<Job>) -> Option<Job> {
    let until = Instant::now() + SPIN;
    loop {
        match jobs.try_recv() {
            Ok(job) => return Some(job),
            Err(mpsc::TryRecvError::Disconnected) => return None,
            Err(mpsc::TryRecvError::Empty) if Instant::now() < until => std::thread::yield_now(),
            Err(mpsc::TryRecvError::Empty) => return jobs.recv().ok(),
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        drop(self.queue.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One batch holding `batches`' operations in order. A batch's
/// representation is RocksDB's WAL record format: a 12-byte header (sequence
/// number, then the operation count as a little-endian u32) and the
/// operations; appending is what RocksDB's own `WriteBatchInternal::Append` does.
fn concat(mut batches: Vec<WriteBatch>) -> WriteBatch {
    const HEADER: usize = 12;
    if batches.len() == 1 {
        return batches.pop().expect("one batch");
    }
    let mut rep = vec![0u8; HEADER];
    let mut count = 0u32;
    for b in &batches {
        rep.extend_from_slice(&b.data()[HEADER..]);
        count += u32::try_from(b.len()).expect("a batch holds fewer than 2^32 operations");
    }
    rep[8..HEADER].copy_from_slice(&count.to_le_bytes());
    WriteBatch::from_data(&rep)
}
