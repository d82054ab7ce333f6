//! The ledger's writers: every write from async callers is queued for the
//! writer thread, which applies whatever queued while it was busy as one
//! RocksDB batch (group commit without a thread per waiting writer), never
//! waiting for the disk; the writes that must be synced are then handed to
//! the sync thread, which fsyncs the WAL once for all of them (RocksDB's
//! `SyncWAL`) while the writer goes on applying — a pipelined group commit.
//! A buffered write never waits behind an fsync, and when nothing is queued
//! ahead of it, no write waits for the writer either: it is applied on its
//! caller's thread ([`Writer::apply_now`]) and, if synced, fsynced there
//! when no other synced write waits for one ([`Writer::sync_now`]) or else
//! handed straight to the sync thread ([`Writer::sync_applied`]).
//! `docs/ledger.md` ("Who does the I/O") has the contract.

use super::write_options;
use crate::Durability;
use rocksdb::{DB, ErrorKind, WriteBatch, WriteOptions};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

/// The most queued writes the writer applies as one batch.
const MAX_GROUP: usize = 256;

/// Where a write's result goes.
pub(super) type Done = tokio::sync::oneshot::Sender<Result<(), String>>;

/// One write queued for the writer thread.
pub(super) struct Job {
    pub(super) batch: WriteBatch,
    pub(super) sync: bool,
    pub(super) done: Done,
}

/// A write queued for the writer thread: wait for its result.
pub(super) struct Ticket {
    pub(super) result: tokio::sync::oneshot::Receiver<Result<(), String>>,
}

impl Ticket {
    /// The write's result, once the writer has applied (and, if asked, synced) it.
    pub(super) async fn wait(self) -> Result<(), String> {
        self.result.await.unwrap_or_else(|_| Err("the ledger's writer thread stopped".into()))
    }
}

/// The writer thread (and, behind it, the sync thread). Callers wait on
/// their job's channel, so an async worker never blocks on a stalled write
/// nor on an fsync another write could share (only on a write it may apply
/// itself, see [`Writer::apply_now`], and the fsync of a lone synced one,
/// [`Writer::sync_now`]), and N waiting writes cost one wake-up of a
/// thread, not N threads.
pub(super) struct Writer {
    queue: Option<mpsc::Sender<Job>>,
    /// The sync thread's queue, for synced writes applied on a caller's thread.
    to_sync: Option<mpsc::Sender<Vec<Done>>>,
    /// Writes queued and not yet applied, and the one being applied on a
    /// caller's thread: a buffered write skips the queue only while this is
    /// zero, so it never lands before one queued earlier.
    pub(super) queued: Arc<AtomicUsize>,
    /// Synced writes not yet told their fsync ended (queued, waiting for the
    /// sync thread, or being synced on a caller's thread): a synced write
    /// with nothing ahead of it is synced by its caller only while this is zero.
    syncs: Arc<AtomicUsize>,
    /// How long recent fsyncs of the WAL took (µs, a moving average): a
    /// caller fsyncs its own write only while the disk is fast.
    pub(super) fsync_micros: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Writer {
    /// Starts the threads, which write to `db` until the writer is dropped.
    pub(super) fn start(db: Arc<DB>) -> Result<Self, String> {
        let (queue, jobs) = mpsc::channel::<Job>();
        let (to_sync, waiting) = mpsc::channel::<Vec<Done>>();
        let queued = Arc::new(AtomicUsize::new(0));
        let applied = queued.clone();
        let syncs = Arc::new(AtomicUsize::new(0));
        let (synced, failed) = (syncs.clone(), syncs.clone());
        let sync_db = db.clone();
        let inline_sync = to_sync.clone();
        let fsync_micros = Arc::new(AtomicU64::new(0));
        let timed = fsync_micros.clone();
        let syncer = std::thread::Builder::new()
            .name("toolguard-ledger-sync".into())
            .spawn(move || {
                while let Ok(first) = waiting.recv() {
                    synced.fetch_sub(sync_round(&sync_db, first, &waiting, &timed), SeqCst);
                }
            })
            .map_err(|e| format!("cannot start the ledger's sync thread: {e}"))?;
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
                    failed.fetch_sub(apply_group(&db, group, &applied, &to_sync), SeqCst);
                }
                // Every write is applied; the syncs still queued finish before the database closes.
                drop(to_sync);
                let _ = syncer.join();
            })
            .map_err(|e| format!("cannot start the ledger's writer thread: {e}"))?;
        Ok(Self { queue: Some(queue), to_sync: Some(inline_sync), queued, syncs, fsync_micros, thread: Some(thread) })
    }

    /// Queues `job` for the writer thread; gives it back if the thread has stopped.
    pub(super) fn queue(&self, job: Job) -> Result<(), Job> {
        let Some(queue) = self.queue.as_ref() else { return Err(job) };
        let syncs = usize::from(job.sync);
        self.queued.fetch_add(1, SeqCst);
        self.syncs.fetch_add(syncs, SeqCst);
        queue.send(job).map_err(|mpsc::SendError(job)| {
            self.queued.fetch_sub(1, SeqCst);
            self.syncs.fetch_sub(syncs, SeqCst);
            job
        })
    }

    /// Syncs the WAL on the caller's thread, after [`Writer::apply_now`]
    /// applied a synced write, when no other synced write is waiting for an
    /// fsync (nothing would share the sync thread's fsync with it), the
    /// caller is one of two or more async workers (the others go on serving
    /// while this one waits on the disk) and recent fsyncs took at most
    /// [`INLINE_FSYNC_MAX`] (a slow disk would hold the worker, and every
    /// task queued on it, for milliseconds): `None` otherwise, to hand it to
    /// the sync thread. The caller's task goes on the moment the fsync ends,
    /// with no thread to wake on the way.
    pub(super) fn sync_now(&self, db: &DB) -> Option<Result<(), String>> {
        use tokio::runtime::{Handle, RuntimeFlavor};
        if self.fsync_micros.load(Relaxed) > INLINE_FSYNC_MAX.as_micros() as u64 {
            return None;
        }
        let many_workers = Handle::try_current().is_ok_and(|h| h.runtime_flavor() == RuntimeFlavor::MultiThread && h.metrics().num_workers() > 1);
        if !many_workers || self.syncs.compare_exchange(0, 1, SeqCst, SeqCst).is_err() {
            return None;
        }
        let result = sync_wal(db, &self.fsync_micros);
        self.syncs.fetch_sub(1, SeqCst);
        Some(result)
    }

    /// Hands a write [`Writer::apply_now`] applied to the sync thread, which
    /// tells `done` once an fsync that began after it ends; gives `done`
    /// back if the thread has stopped.
    pub(super) fn sync_applied(&self, done: Done) -> Result<(), Done> {
        let Some(to_sync) = self.to_sync.as_ref() else { return Err(done) };
        self.syncs.fetch_add(1, SeqCst);
        to_sync.send(vec![done]).map_err(|mpsc::SendError(mut done)| {
            self.syncs.fetch_sub(1, SeqCst);
            done.pop().expect("one")
        })
    }

    /// Applies `batch`, unsynced, on the caller's thread — a WAL append to
    /// the page cache and a memtable insert, microseconds, without waking the
    /// writer — when no write is queued ahead of it nor being applied by
    /// another caller (concurrent writers would contend in RocksDB's own
    /// write queue; the writer groups them instead) and RocksDB need not
    /// delay it (`no_slowdown`: a write stall answers `Incomplete` at once
    /// instead of sleeping on an async worker).
    pub(super) fn apply_now(&self, db: &DB, batch: WriteBatch) -> Now {
        // Counted like a queued write while it runs, so no one overtakes or joins it.
        if self.queued.compare_exchange(0, 1, SeqCst, SeqCst).is_err() {
            return Now::Queue(batch);
        }
        let mut options = WriteOptions::default();
        options.set_no_slowdown(true);
        let written = db.write_opt(batch, &options);
        self.queued.fetch_sub(1, SeqCst);
        match written {
            Err(e) if e.kind() == ErrorKind::Incomplete => Now::Stalled,
            written => Now::Applied(written.map_err(|e| e.to_string())),
        }
    }
}

/// What [`Writer::apply_now`] did with a batch.
pub(super) enum Now {
    /// Applied (or failed) on the caller's thread.
    Applied(Result<(), String>),
    /// Not tried, because a write is queued or being applied: queue it.
    Queue(WriteBatch),
    /// Refused by RocksDB, which would have stalled it; the batch is spent:
    /// build it again and queue it (a rare path, so the common one copies nothing).
    Stalled,
}

/// Applies `group` as one batch, unsynced, and tells each buffered writer
/// how it went; the writers that need their write synced are handed to the
/// sync thread (`to_sync`). A failed batch fails every write in it. The
/// group leaves `queued` once applied, before anyone is told. Returns how
/// many synced writes it told itself (their batch failed, or the sync
/// thread has stopped), which no fsync will tell.
pub(super) fn apply_group(db: &DB, group: Vec<Job>, queued: &AtomicUsize, to_sync: &mpsc::Sender<Vec<Done>>) -> usize {
    let n = group.len();
    let mut batches = Vec::with_capacity(n);
    let (mut synced, mut buffered) = (Vec::new(), Vec::with_capacity(n));
    for job in group {
        batches.push(job.batch);
        if job.sync { synced.push(job.done) } else { buffered.push(job.done) }
    }
    let result = db.write_opt(concat(batches), &write_options(Durability::Buffered)).map_err(|e| e.to_string());
    queued.fetch_sub(n, SeqCst);
    for tx in buffered {
        let _ = tx.send(result.clone());
    }
    let (synced, error) = match result {
        Ok(()) if synced.is_empty() => return 0,
        Ok(()) => match to_sync.send(synced) {
            Ok(()) => return 0,
            Err(mpsc::SendError(synced)) => (synced, "the ledger's sync thread has stopped; the write may not be durable".to_string()),
        },
        Err(e) => (synced, e),
    };
    let n = synced.len();
    for tx in synced {
        let _ = tx.send(Err(error.clone()));
    }
    n
}

/// One fsync of the WAL for `first` and every writer queued behind it: all
/// their writes were applied before they were queued here, so one
/// `SyncWAL` makes them all durable. Then each is told; returns how many.
pub(super) fn sync_round(db: &DB, mut first: Vec<Done>, waiting: &mpsc::Receiver<Vec<Done>>, fsync_micros: &AtomicU64) -> usize {
    while let Ok(more) = waiting.try_recv() {
        first.extend(more);
    }
    let result = sync_wal(db, fsync_micros);
    let n = first.len();
    for tx in first {
        let _ = tx.send(result.clone());
    }
    n
}

/// The slowest recent fsync (µs, moving average) at which a caller still
/// fsyncs its own write ([`Writer::sync_now`]): handing a write to the sync
/// thread costs two thread wake-ups, tens of µs on a VM, less than an
/// async worker held for longer than this.
pub(super) const INLINE_FSYNC_MAX: Duration = Duration::from_micros(500);

/// One fsync of the WAL (`SyncWAL`), slowed by [`simulate_slow_fsync`]'s
/// extra time if set; folds how long it took into `fsync_micros` (each
/// fsync a quarter of the average, so one slow fsync turns inline fsyncs
/// off, and fast ones turn them back on: 4 after a 4 ms fsync, a few
/// dozen after a stall of seconds).
fn sync_wal(db: &DB, fsync_micros: &AtomicU64) -> Result<(), String> {
    let started = Instant::now();
    let result = db.flush_wal(true).map_err(|e| e.to_string());
    #[cfg(any(test, feature = "bench"))]
    {
        let extra = SLOW_FSYNC_MICROS.load(Relaxed);
        if extra > 0 {
            std::thread::sleep(Duration::from_micros(extra));
        }
    }
    let took = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
    let average = fsync_micros.load(Relaxed);
    fsync_micros.store(average.saturating_mul(3).saturating_add(took) / 4, Relaxed);
    result
}

/// `toolguard-bench`'s slow-disk mode: extra time every fsync of the WAL
/// takes, as if the disk's fsync were that much slower (0: off).
#[cfg(any(test, feature = "bench"))]
static SLOW_FSYNC_MICROS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Makes every fsync of the WAL by this process's sync threads take
/// `extra` longer (`Duration::ZERO` turns it off). Only with the `bench`
/// feature (the bench crate's): the shipped ledger has no such mode.
#[cfg(any(test, feature = "bench"))]
pub fn simulate_slow_fsync(extra: Duration) {
    SLOW_FSYNC_MICROS.store(extra.as_micros() as u64, Relaxed);
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
        // The sync thread ends once every handle on its queue is gone.
        drop(self.to_sync.take());
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
