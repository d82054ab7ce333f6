//! The writer: group commit, who fsyncs, the order writes land in.

use super::writer::Job;
use super::writer::{apply_group, sync_round};
use super::*;
use crate::Prior;
use crate::{AttemptState, Backend, Durability, LedgerWrite};

use super::tests::{attempt, indexes};

fn job(ledger: &Rocks, write: &LedgerWrite, sync: bool) -> (Job, tokio::sync::oneshot::Receiver<Result<(), String>>) {
    let (done, result) = tokio::sync::oneshot::channel();
    (Job { batch: ledger.batch(write).unwrap(), sync, done }, result)
}

#[test]
fn a_group_of_queued_writes_lands_whole_with_one_fsync() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Rocks::open(dir.path()).unwrap();
    let (mut group, mut results) = (Vec::new(), Vec::new());
    for i in 0..64 {
        let write =
            LedgerWrite::new().call(crate::suite::call("s", &format!("c{i}"))).attempt_over(attempt(&format!("c{i}"), AttemptState::Pending), Prior::Absent);
        // One synced write among buffered ones: the group is applied whole, and synced once for it.
        let (j, r) = job(&ledger, &write, i == 40);
        group.push(j);
        results.push(r);
    }
    // The same attempt again, later in the group: the later write wins.
    let (j, r) = job(&ledger, &LedgerWrite::new().attempt_over(attempt("c7", AttemptState::Succeeded), Prior::Was(AttemptState::Pending)), false);
    group.push(j);
    results.push(r);
    let syncs = ledger.wal_syncs().unwrap();
    let (to_sync, waiting) = std::sync::mpsc::channel();
    let queued = std::sync::atomic::AtomicUsize::new(group.len());
    apply_group(&ledger.db, group, &queued, &to_sync);
    assert_eq!(queued.into_inner(), 0, "the group has left the queue");
    assert_eq!(ledger.wal_syncs().unwrap() - syncs, 0, "applied, not yet synced");
    let (synced, buffered): (Vec<_>, Vec<_>) = results.iter_mut().enumerate().partition(|(i, _)| *i == 40);
    assert!(buffered.into_iter().all(|(_, r)| r.try_recv() == Ok(Ok(()))), "every buffered writer is told at once");
    let synced = synced.into_iter().map(|(_, r)| r).next().unwrap();
    assert!(synced.try_recv().is_err(), "the synced writer waits for the fsync");
    sync_round(&ledger.db, waiting.recv().unwrap(), &waiting, &std::sync::atomic::AtomicU64::new(0));
    assert_eq!(ledger.wal_syncs().unwrap() - syncs, 1, "65 writes, one fsync");
    assert_eq!(synced.try_recv(), Ok(Ok(())), "and then it is told");
    assert_eq!(ledger.calls(Some("s")).unwrap().len(), 64);
    assert_eq!(ledger.attempts_in_state(AttemptState::Pending).unwrap().len(), 63);
    assert_eq!(ledger.attempt_at("s", "c7", 0).unwrap().unwrap().state, AttemptState::Succeeded);
    assert_eq!(indexes(&ledger).len(), 63 + 64, "a by-state entry per pending attempt, a by-call entry per attempt");
}

#[test]
fn writes_queued_while_the_writer_is_busy_share_its_next_fsync() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Rocks::open(dir.path()).unwrap();
    let write = |i: usize| LedgerWrite::new().call(crate::suite::call("s", &format!("c{i}")));
    // Built first, then queued back to back: far faster than the writer
    // commits even one, so all but the first few wait for it together.
    let jobs: Vec<_> = (0..64).map(|i| job(&ledger, &write(i), true)).collect();
    let syncs = ledger.wal_syncs().unwrap();
    let writer = ledger.writer.as_ref().unwrap();
    let results: Vec<_> = jobs.into_iter().map(|(j, r)| writer.queue(j).map(|()| r).ok().unwrap()).collect();
    for r in results {
        assert_eq!(r.blocking_recv().unwrap(), Ok(()));
    }
    let fsyncs = ledger.wal_syncs().unwrap() - syncs;
    assert!((1..=8).contains(&fsyncs), "64 synced writes queued at once took {fsyncs} fsyncs");
    assert_eq!(ledger.calls(Some("s")).unwrap().len(), 64);
}

#[test]
fn a_buffered_write_never_waits_behind_an_fsync() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Rocks::open(dir.path()).unwrap();
    let writer = ledger.writer.as_ref().unwrap();
    // A synced write, then a buffered one queued behind it; the sync thread
    // is made to take its time over the fsync.
    let (synced, mut synced_result) = job(&ledger, &LedgerWrite::new().call(crate::suite::call("s", "a")), true);
    let (buffered, buffered_result) = job(&ledger, &LedgerWrite::new().call(crate::suite::call("s", "b")), false);
    let _slow = SlowFsync::new(std::time::Duration::from_millis(300));
    assert!(writer.queue(synced).is_ok() && writer.queue(buffered).is_ok());
    assert_eq!(buffered_result.blocking_recv().unwrap(), Ok(()), "the buffered write is applied");
    assert!(synced_result.try_recv().is_err(), "while the synced one still waits for its fsync");
    assert_eq!(synced_result.blocking_recv().unwrap(), Ok(()));
    assert_eq!(ledger.calls(Some("s")).unwrap().len(), 2);
}

#[test]
fn a_write_with_nothing_queued_lands_on_its_callers_thread() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Rocks::open(dir.path()).unwrap();
    let syncs = ledger.wal_syncs().unwrap();
    let pending = ledger.enqueue(&LedgerWrite::new().call(crate::suite::call("s", "a")), Durability::Buffered).unwrap().unwrap();
    // Readable before its future is even polled: no writer thread took part.
    assert!(ledger.call("s", "a").unwrap().is_some());
    assert_eq!(wait_for(pending), Ok(()));
    assert_eq!(ledger.wal_syncs().unwrap(), syncs, "and nothing was synced");
    // A synced write lands there too, but its caller is told only once the
    // sync thread's fsync (slowed here to half a second) has ended.
    let _slow = SlowFsync::new(std::time::Duration::from_millis(500));
    let mut synced = ledger.enqueue(&LedgerWrite::new().call(crate::suite::call("s", "b")), Durability::Synced).unwrap().unwrap();
    assert!(ledger.call("s", "b").unwrap().is_some(), "applied on the caller's thread");
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    assert!(synced.as_mut().poll(&mut cx).is_pending(), "not reported durable while its fsync runs");
    assert_eq!(wait_for(synced), Ok(()));
    assert_eq!(ledger.wal_syncs().unwrap() - syncs, 1);
}

#[test]
fn a_lone_synced_write_is_fsynced_by_its_caller_and_one_behind_another_by_the_sync_thread() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Rocks::open(dir.path()).unwrap();
    let write = |id: &str| LedgerWrite::new().call(crate::suite::call("s", id));
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let workers = |n| tokio::runtime::Builder::new_multi_thread().worker_threads(n).build().unwrap();
    let two = workers(2);
    let _in_runtime = two.enter();
    // Alone, on one of two workers: durable by the time enqueue returns.
    let syncs = ledger.wal_syncs().unwrap();
    let mut alone = ledger.enqueue(&write("a"), Durability::Synced).unwrap().unwrap();
    assert_eq!(alone.as_mut().poll(&mut cx), std::task::Poll::Ready(Ok(())), "synced on the caller's thread");
    assert_eq!(ledger.wal_syncs().unwrap() - syncs, 1, "by one fsync");
    // Behind a synced write still waiting for its (slowed) fsync: handed to
    // the sync thread, which tells it after an fsync of its own.
    let _slow = SlowFsync::new(std::time::Duration::from_millis(300));
    let (earlier, earlier_result) = tokio::sync::oneshot::channel();
    assert!(ledger.writer.as_ref().unwrap().sync_applied(earlier).is_ok());
    let syncs = ledger.wal_syncs().unwrap();
    let mut behind = ledger.enqueue(&write("b"), Durability::Synced).unwrap().unwrap();
    assert!(ledger.call("s", "b").unwrap().is_some(), "applied on the caller's thread");
    assert!(behind.as_mut().poll(&mut cx).is_pending(), "its fsync is the sync thread's");
    assert_eq!(earlier_result.blocking_recv().unwrap(), Ok(()));
    assert_eq!(wait_for(behind), Ok(()));
    assert!(ledger.wal_syncs().unwrap() - syncs >= 1);
    drop(_in_runtime);
    // With one async worker, never: that worker serves everything.
    let one = workers(1);
    let _in_runtime = one.enter();
    let mut lone = ledger.enqueue(&write("c"), Durability::Synced).unwrap().unwrap();
    assert!(lone.as_mut().poll(&mut cx).is_pending(), "one worker never waits on the disk");
    assert_eq!(wait_for(lone), Ok(()));
}

#[test]
fn a_slow_disk_turns_the_callers_own_fsync_off_until_fsyncs_are_fast_again() {
    use std::sync::atomic::Ordering::Relaxed;
    let dir = tempfile::tempdir().unwrap();
    let ledger = Rocks::open(dir.path()).unwrap();
    let writer = ledger.writer.as_ref().unwrap();
    let max = super::writer::INLINE_FSYNC_MAX.as_micros() as u64;
    let write = |id: String| LedgerWrite::new().call(crate::suite::call("s", &id));
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let two = tokio::runtime::Builder::new_multi_thread().worker_threads(2).build().unwrap();
    let _in_runtime = two.enter();
    // A lone synced write, with no slow fsync seen, is fsynced by its caller.
    let mut first = ledger.enqueue(&write("first".into()), Durability::Synced).unwrap().unwrap();
    assert!(first.as_mut().poll(&mut cx).is_ready(), "fsynced on the caller's thread");
    let disk = writer.fsync_micros.load(Relaxed) * 4; // this disk's own fsync, µs
    // One fsync 40 times slower than the limit (the sync thread's here)...
    let _slow = SlowFsync::new(super::writer::INLINE_FSYNC_MAX * 40);
    let (done, result) = tokio::sync::oneshot::channel();
    assert!(writer.sync_applied(done).is_ok());
    assert_eq!(result.blocking_recv().unwrap(), Ok(()));
    let after_slow = writer.fsync_micros.load(Relaxed);
    assert!(after_slow > max, "one slow fsync lifts the average over the limit: {after_slow} µs");
    // ...and the next lone synced write is the sync thread's (whose fsync,
    // still slow, cannot have ended before it is polled): its caller's
    // worker is not held for a slow disk's fsync.
    let mut next = ledger.enqueue(&write("next".into()), Durability::Synced).unwrap().unwrap();
    assert!(next.as_mut().poll(&mut cx).is_pending(), "handed to the sync thread after a slow fsync");
    assert_eq!(wait_for(next), Ok(()));
    drop(_slow);
    if disk * 2 > max {
        eprintln!("this disk's fsync ({disk} µs) is too near the limit ({max} µs) to show the caller's fsync coming back");
        return;
    }
    // Fast fsyncs (the sync thread's) bring the caller's own fsync back:
    // five lone synced writes in a row are durable when enqueue returns.
    let mut in_a_row = 0;
    for i in 0..100 {
        let mut write = ledger.enqueue(&write(format!("w{i}")), Durability::Synced).unwrap().unwrap();
        in_a_row = if write.as_mut().poll(&mut cx).is_ready() { in_a_row + 1 } else { 0 };
        assert_eq!(wait_for(write), Ok(()));
        if in_a_row == 5 {
            return;
        }
    }
    panic!("100 fast fsyncs did not turn the caller's own fsync back on (average {} µs)", writer.fsync_micros.load(Relaxed));
}

#[test]
fn a_buffered_write_never_overtakes_one_queued_before_it() {
    use AttemptState::*;
    let dir = tempfile::tempdir().unwrap();
    let ledger = Rocks::open(dir.path()).unwrap();
    let writer = ledger.writer.as_ref().unwrap();
    let mut overtaking_possible = 0;
    for round in 0..20 {
        let id = format!("c{round}");
        // Many writes of the attempt as pending, queued back to back, then at
        // once its settlement through the caller's path: while any of them is
        // still queued, the settlement must queue behind them.
        let jobs: Vec<_> = (0..300).map(|_| job(&ledger, &LedgerWrite::new().attempt_over(attempt(&id, Pending), Prior::Absent), false)).collect();
        let results: Vec<_> = jobs.into_iter().map(|(j, r)| writer.queue(j).map(|()| r).ok().unwrap()).collect();
        overtaking_possible += usize::from(writer.queued.load(std::sync::atomic::Ordering::SeqCst) > 0);
        let settled = ledger.enqueue(&LedgerWrite::new().attempt_over(attempt(&id, Succeeded), Prior::Was(Pending)), Durability::Buffered);
        assert_eq!(wait_for(settled.unwrap().unwrap()), Ok(()));
        for r in results {
            assert_eq!(r.blocking_recv().unwrap(), Ok(()));
        }
        assert_eq!(ledger.attempt_at("s", &id, 0).unwrap().unwrap().state, Succeeded, "round {round}: the later write landed last");
    }
    assert!(overtaking_possible > 0, "the writer never had a write queued: the test showed nothing");
}

/// Runs `f` to its end on a runtime of its own.
fn wait_for<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
}

/// The slowed fsync of `simulate_slow_fsync`, undone when dropped. The
/// slowdown is process-wide: tests that slow the disk take turns, so none
/// undoes another's while it counts on it.
struct SlowFsync(#[allow(dead_code)] std::sync::MutexGuard<'static, ()>);

impl SlowFsync {
    fn new(extra: std::time::Duration) -> Self {
        static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let turn = TURN.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        super::simulate_slow_fsync(extra);
        Self(turn)
    }
}

impl Drop for SlowFsync {
    fn drop(&mut self) {
        super::simulate_slow_fsync(std::time::Duration::ZERO);
    }
}

#[test]
fn queued_writes_land_in_the_order_they_were_queued() {
    use AttemptState::*;
    let dir = tempfile::tempdir().unwrap();
    let ledger = crate::Ledger::open(dir.path()).unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).build().unwrap();
    runtime.block_on(async {
        // One attempt through its states, queued back to back; only the last is waited for.
        let mut prior = Prior::Absent;
        let mut last = None;
        for state in [Pending, Unknown, Succeeded] {
            last = Some(ledger.queue(LedgerWrite::new().attempt_over(attempt("c1", state), prior), Durability::Buffered));
            prior = Prior::Was(state);
        }
        last.unwrap().wait().await.unwrap();
        let found = ledger.read(|l| l.attempt_at("s", "c1", 0)).await.unwrap();
        assert_eq!(found.map(|a| a.state), Some(Succeeded));
        assert!(ledger.read(|l| l.attempts_in_state(Unknown)).await.unwrap().is_empty(), "settled last");
    });
}

#[test]
fn closing_the_ledger_lands_every_queued_write_first() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    runtime.block_on(async {
        let ledger = crate::Ledger::open(dir.path()).unwrap();
        for i in 0..20 {
            // Queued and never waited for.
            drop(ledger.queue(LedgerWrite::new().call(crate::suite::call("s", &format!("c{i}"))), Durability::Buffered));
        }
    });
    // The directory's lock is free again, so the writer thread is gone.
    let reopened = crate::Ledger::open(dir.path()).unwrap();
    assert_eq!(reopened.calls(Some("s")).unwrap().len(), 20);
}
