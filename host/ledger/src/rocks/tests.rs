//! The RocksDB backend's own tests: index upkeep, group commit, memory-only reads.

use super::writer::{apply_group, sync_round};
use super::*;
use crate::Prior;

#[test]
fn prefix_successor_bounds_exactly_the_prefix() {
    assert_eq!(prefix_successor(b"ab"), Some(b"ac".to_vec()));
    assert_eq!(prefix_successor(&[1, 0xff]), Some(vec![2]));
    assert_eq!(prefix_successor(&[0xff, 0xff]), None);
    assert_eq!(prefix_successor(b""), None);
}

#[test]
fn scans_stay_inside_their_prefix_past_many_tombstones() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Rocks::open(dir.path()).unwrap();
    let cf = ledger.cf(CF_EPISODES);
    for i in 0..1_000u32 {
        let key = [b"b", &i.to_be_bytes()[..]].concat();
        ledger.db.put_cf(cf, &key, b"x").unwrap();
        ledger.db.delete_cf(cf, &key).unwrap();
    }
    ledger.db.put_cf(cf, b"a1", b"x").unwrap();
    ledger.db.put_cf(cf, b"c1", b"y").unwrap();
    assert_eq!(ledger.scan(CF_EPISODES, b"a", |k, _| Some(k.to_vec())).unwrap(), vec![b"a1".to_vec()]);
    assert!(ledger.scan(CF_EPISODES, b"b", |k, _| Some(k.to_vec())).unwrap().is_empty());
}

/// Episode `n` of action (session `s`, tool `refund`, digest `digest`).
fn episode_of(digest: &str, n: u64) -> EpisodeRecord {
    EpisodeRecord { args_digest: digest.into(), opened_ms: 1, ..EpisodeRecord::open(&crate::suite::call("s", &format!("c{n}")), n) }
}

fn open_episodes(ledger: &Rocks, digest: &str, numbers: std::ops::RangeInclusive<u64>) {
    for n in numbers {
        ledger.commit(&LedgerWrite::new().episode(EpisodeOp::Open(episode_of(digest, n))), Durability::Buffered).unwrap();
    }
}

/// A ledger written before `latest_episode` existed: episodes 1 and 2 of
/// action `d`, in a table without the prefix filter, and no index mark.
fn unindexed_ledger(dir: &Path) {
    let mut opts = Options::default();
    opts.create_if_missing(true);
    opts.create_missing_column_families(true);
    let db = DB::open_cf(&opts, dir, ALL_CFS).unwrap();
    for n in 1..=2 {
        let e = episode_of("d", n);
        db.put_cf(db.cf_handle(CF_EPISODES).unwrap(), episode_key("s", "refund", "d", n), serde_json::to_vec(&e).unwrap()).unwrap();
    }
    db.flush_cf(db.cf_handle(CF_EPISODES).unwrap()).unwrap();
}

fn ticker(ledger: &Rocks, t: rocksdb::statistics::Ticker) -> u64 {
    ledger.opts.as_ref().unwrap().get_ticker_count(t)
}

#[test]
fn the_latest_episode_is_found_by_point_reads_in_memtables_tables_and_ledgers_written_before_the_index() {
    let dir = tempfile::tempdir().unwrap();
    unindexed_ledger(dir.path());
    let ledger = Rocks::open(dir.path()).unwrap();
    let latest = |digest: &str| ledger.episode("s", "refund", digest, None).unwrap().map(|e| e.episode);
    let seeks = || ticker(&ledger, rocksdb::statistics::Ticker::NumberDbSeek);
    let before = seeks();
    assert_eq!(latest("d"), Some(2), "indexed when the ledger was opened");
    // `dd`'s key starts with `d`'s bytes but for the length prefix: another action.
    open_episodes(&ledger, "dd", 1..=5);
    open_episodes(&ledger, "d", 3..=3);
    assert_eq!((latest("d"), latest("dd"), latest("e")), (Some(3), Some(5), None), "from the memtable");
    ledger.db.flush_cf(ledger.cf(CF_EPISODES)).unwrap();
    ledger.db.flush_cf(ledger.cf(CF_LATEST)).unwrap();
    open_episodes(&ledger, "d", 4..=4);
    assert_eq!((latest("d"), latest("dd"), latest("e")), (Some(4), Some(5), None), "across memtable and tables");
    ledger.settle().unwrap();
    assert_eq!((latest("d"), latest("dd"), latest("e")), (Some(4), Some(5), None), "after compaction into one table");
    assert_eq!(seeks(), before, "no lookup of a latest episode seeks");
    assert_eq!(ledger.episode("s", "refund", "d", Some(2)).unwrap().map(|e| e.episode), Some(2), "point reads still see every episode");
    assert_eq!(ledger.all_episodes().unwrap().len(), 9, "a total-order scan still sees every action");
    // Reopened: the mark stands, nothing is indexed again, the entries hold.
    drop(ledger);
    let ledger = Rocks::open(dir.path()).unwrap();
    assert_eq!(ledger.episode("s", "refund", "d", None).unwrap().map(|e| e.episode), Some(4));
}

#[test]
fn an_action_whose_latest_episode_was_pruned_is_found_by_prefix_seek() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Rocks::open(dir.path()).unwrap();
    let latest = |digest: &str| ledger.episode("s", "refund", digest, None).unwrap().map(|e| e.episode);
    open_episodes(&ledger, "d", 1..=3);
    open_episodes(&ledger, "e", 1..=1);
    let prune = |digest: &str, n: u64| {
        let removal = Removal {
            entry: RetireEntry::of_close(&episode_of(digest, n).id(), 1),
            calls: vec![],
            attempts: vec![],
            episode: Some(("s".into(), "refund".into(), digest.into(), n)),
            pruned_ms: 2,
        };
        ledger.remove(&removal).unwrap();
    };
    // Episode 2 kept (as if a check failed), 3 pruned: 2 is the latest.
    prune("d", 3);
    prune("d", 1);
    ledger.db.flush_cf(ledger.cf(CF_EPISODES)).unwrap();
    let seeks = || ticker(&ledger, rocksdb::statistics::Ticker::NumberDbSeek);
    let before = seeks();
    assert_eq!(latest("d"), Some(2), "the entry names a pruned episode: found by seek");
    assert!(seeks() > before, "the fallback seeks");
    prune("e", 1);
    assert_eq!(latest("e"), None, "every episode pruned");
    // A new episode after pruning sets the entry again.
    open_episodes(&ledger, "e", 1..=1);
    assert_eq!(latest("e"), Some(1));
    prune("d", 2);
    assert_eq!(latest("d"), None);
}

#[test]
fn an_entry_behind_its_episodes_is_repaired_by_the_opening_it_misleads() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Rocks::open(dir.path()).unwrap();
    open_episodes(&ledger, "d", 1..=3);
    // As if something had opened episodes 2 and 3 without their entry.
    ledger.db.put_cf(ledger.cf(CF_LATEST), latest::latest_key("s", "refund", "d"), 1u64.to_be_bytes()).unwrap();
    let latest = || ledger.episode("s", "refund", "d", None).unwrap().map(|e| e.episode);
    assert_eq!(latest(), Some(1), "the entry is trusted");
    // The guard opens the episode after the latest it read: 2 exists.
    let stale = LedgerWrite::new().episode(EpisodeOp::Open(episode_of("d", 2)));
    assert!(matches!(ledger.commit(&stale, Durability::Buffered), Err(BackendError::Conflict(_))));
    assert_eq!(latest(), Some(3), "its next look finds the true latest");
    ledger.commit(&LedgerWrite::new().episode(EpisodeOp::Open(episode_of("d", 4))), Durability::Buffered).unwrap();
    assert_eq!(latest(), Some(4));
}

#[test]
fn a_read_only_open_of_a_ledger_written_before_the_index_seeks_by_prefix() {
    let dir = tempfile::tempdir().unwrap();
    unindexed_ledger(dir.path());
    let ledger = Rocks::open_read_only(dir.path()).unwrap();
    assert!(!ledger.latest_indexed);
    assert_eq!(ledger.episode("s", "refund", "d", None).unwrap().map(|e| e.episode), Some(2));
    assert_eq!(ledger.episode("s", "refund", "e", None).unwrap(), None);
    drop(ledger);
    // An index interrupted before its mark is written is built again whole.
    let ledger = Rocks::open(dir.path()).unwrap();
    ledger.db.delete_cf(ledger.cf(CF_META), latest::INDEXED).unwrap();
    ledger.db.delete_cf(ledger.cf(CF_LATEST), latest::latest_key("s", "refund", "d")).unwrap();
    drop(ledger);
    let ledger = Rocks::open(dir.path()).unwrap();
    assert!(ledger.latest_indexed);
    assert_eq!(ledger.episode("s", "refund", "d", None).unwrap().map(|e| e.episode), Some(2));
}

fn attempt(call_id: &str, state: AttemptState) -> AttemptRecord {
    crate::suite::attempt(call_id, 0, 0, state)
}

fn indexes(ledger: &Rocks) -> Vec<Vec<u8>> {
    [CF_BY_STATE, CF_CALL_ATTEMPTS].iter().flat_map(|cf| ledger.scan(cf, &[], |k, v| Some([cf.as_bytes(), k, v].concat())).unwrap()).collect()
}

#[test]
fn writes_over_a_known_prior_leave_the_same_indexes_as_blind_writes() {
    for path in crate::suite::STATE_PATHS {
        let (precise, blind) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (precise, blind) = (Rocks::open(precise.path()).unwrap(), Rocks::open(blind.path()).unwrap());
        let mut prior = Prior::Absent;
        for (i, state) in path.iter().enumerate() {
            for (call_id, ledger) in [("a", &precise), ("b", &precise), ("a", &blind), ("b", &blind)] {
                let write_prior = if std::ptr::eq(ledger, &precise) { prior } else { Prior::Unread };
                ledger.commit(&LedgerWrite::new().attempt_over(attempt(call_id, *state), write_prior), Durability::Buffered).unwrap();
            }
            prior = Prior::Was(*state);
            assert_eq!(indexes(&precise), indexes(&blind), "path {path:?}, after step {i}");
            assert_eq!(precise.attempts_in_state(*state).unwrap().len(), 2);
            // Only unsettled attempts have a by-state entry.
            let entries = precise.scan(CF_BY_STATE, &[], |k, _| Some(k[0])).unwrap();
            let expected = if state.is_unsettled() { vec![state.tag(); 2] } else { vec![] };
            assert_eq!(entries, expected, "path {path:?}, after step {i}");
        }
    }
}

#[test]
fn a_settled_attempt_s_entry_from_an_older_ledger_goes_when_it_is_written_again() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Rocks::open(dir.path()).unwrap();
    let failed = attempt("a", AttemptState::Failed);
    // Written before only unsettled attempts were indexed.
    ledger.db.put_cf(ledger.cf(CF_BY_STATE), [&[AttemptState::Failed.tag()], failed.key.as_bytes()].concat(), []).unwrap();
    ledger.commit(&LedgerWrite::new().attempt_over(failed, Prior::Absent), Durability::Buffered).unwrap();
    assert_eq!(ledger.attempts_in_state(AttemptState::Failed).unwrap().len(), 1, "settled states are read from the records");
    for prior in [Prior::Was(AttemptState::Failed), Prior::Unread] {
        ledger.commit(&LedgerWrite::new().attempt_over(attempt("a", AttemptState::Pending), prior), Durability::Buffered).unwrap();
        assert_eq!(ledger.scan(CF_BY_STATE, &[], |k, _| Some(k[0])).unwrap(), vec![AttemptState::Pending.tag()], "{prior:?}");
        ledger.commit(&LedgerWrite::new().attempt_over(attempt("a", AttemptState::Failed), Prior::Was(AttemptState::Pending)), Durability::Buffered).unwrap();
    }
    assert!(ledger.scan(CF_BY_STATE, &[], |k, _| Some(k[0])).unwrap().is_empty());
    assert_eq!(ledger.attempts_in_state(AttemptState::Pending).unwrap().len(), 0);
}

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
fn what_a_flush_writes_is_read_from_memory_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Rocks::open(dir.path()).unwrap();
    for i in 0..100 {
        ledger.commit(&LedgerWrite::new().call(crate::suite::call("s", &format!("c{i}"))), Durability::Buffered).unwrap();
    }
    ledger.db.flush_cf(ledger.cf(CF_CALLS)).unwrap();
    // Out of the memtable, in a table file: its blocks were cached as the flush wrote them.
    for i in [0, 50, 99] {
        let found = memory_only(|| ledger.call("s", &format!("c{i}")));
        assert!(matches!(found, Ok(Some(_))), "c{i}: {found:?}");
    }
    assert_eq!(memory_only(|| ledger.call("s", "absent")), Ok(None), "a miss is answered by the cached filter");
}

/// The families keyed by a hash (each action's latest episode, pruned
/// calls' tombstones) keep every filter partition pinned: after a reopen,
/// a new action's or a new call's lookup is answered from memory, however
/// many tables and partitions hold the others.
#[test]
fn lookups_of_new_actions_and_new_calls_tombstones_are_answered_from_memory_after_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let ledger = Rocks::open(dir.path()).unwrap();
        for i in 0..20_000u64 {
            let episode = EpisodeRecord { args_digest: format!("d{i}"), ..EpisodeRecord::open(&crate::suite::call("s", &format!("c{i}")), 1) };
            let mut batch = rocksdb::WriteBatch::default();
            ledger.index_latest(&mut batch, &episode);
            batch.put_cf(ledger.cf(CF_EXPIRED), crate::retention::tombstone("s", &format!("c{i}")), 1u64.to_be_bytes());
            ledger.db.write(batch).unwrap();
        }
        // Out of level 0 (whose filters are pinned anyway), into many partitions.
        for cf in [CF_LATEST, CF_EXPIRED] {
            ledger.db.flush_cf(ledger.cf(cf)).unwrap();
            ledger.db.compact_range_cf(ledger.cf(cf), None::<&[u8]>, None::<&[u8]>);
        }
    }
    let ledger = Rocks::open(dir.path()).unwrap();
    let (mut latest, mut tombstones) = (0, 0);
    for i in 0..200 {
        let new = format!("new{i}");
        // A miss is answered by the filter; a false positive (~1 %) reads a data block.
        match memory_only(|| ledger.episode("s", "refund", &new, None)) {
            Ok(found) => assert_eq!(found, None),
            Err(e) => latest += usize::from(e == BackendError::NeedsIo),
        }
        match memory_only(|| ledger.expired_at("s", &new)) {
            Ok(found) => assert_eq!(found, None),
            Err(e) => tombstones += usize::from(e == BackendError::NeedsIo),
        }
    }
    assert!(latest <= 10 && tombstones <= 10, "of 200 lookups each, {latest} (latest episodes) and {tombstones} (tombstones) needed the disk");
}

#[test]
fn a_read_that_needs_the_disk_is_answered_off_the_async_workers() {
    let dir = tempfile::tempdir().unwrap();
    {
        let ledger = Rocks::open(dir.path()).unwrap();
        ledger.commit(&LedgerWrite::new().call(crate::suite::call("s", "c1")), Durability::Synced).unwrap();
        ledger.db.flush_cf(ledger.cf(CF_CALLS)).unwrap();
    }
    {
        // Reopened: the record is in a table file, not in memory.
        let ledger = Rocks::open(dir.path()).unwrap();
        assert_eq!(memory_only(|| ledger.call("s", "c1")), Err(BackendError::NeedsIo));
        assert!(ledger.call("s", "c1").unwrap().is_some(), "a plain read goes to the disk");
    }
    let ledger = crate::Ledger::open(dir.path()).unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).build().unwrap();
    let found = runtime.block_on(ledger.read(|l| l.call("s", "c1"))).unwrap();
    assert_eq!(found.map(|c| c.call_id), Some("c1".to_string()), "retried on the blocking pool");
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

#[test]
fn reads_skip_index_entries_a_wrong_prior_left_behind() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Rocks::open(dir.path()).unwrap();
    ledger.commit(&LedgerWrite::new().attempt_over(attempt("a", AttemptState::Pending), Prior::Absent), Durability::Buffered).unwrap();
    // Claims it was Unknown, so the Pending entries stay behind.
    let wrong = Prior::Was(AttemptState::Unknown);
    ledger.commit(&LedgerWrite::new().attempt_over(attempt("a", AttemptState::Succeeded), wrong), Durability::Buffered).unwrap();
    assert!(ledger.attempts_in_state(AttemptState::Pending).unwrap().is_empty());
    assert_eq!(ledger.attempts_in_state(AttemptState::Succeeded).unwrap().len(), 1);
}

#[test]
fn settled_tables_are_compressed_to_well_under_the_records_json() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Rocks::open(dir.path()).unwrap();
    let mut json_bytes = 0;
    for batch in 0..20 {
        let mut write = LedgerWrite::new();
        for i in 0..100 {
            let id = format!("call-{batch}-{i}");
            let (call, attempt) = (crate::suite::call("s", &id), attempt(&id, AttemptState::Succeeded));
            json_bytes += serde_json::to_vec(&call).unwrap().len() + serde_json::to_vec(&attempt).unwrap().len();
            write = write.call(call).attempt_over(attempt, Prior::Absent);
        }
        ledger.commit(&write, Durability::Buffered).unwrap();
    }
    ledger.settle().unwrap();
    let sst = |cf| ledger.db.property_int_value_cf(ledger.cf(cf), "rocksdb.live-sst-files-size").unwrap().unwrap() as usize;
    let table_bytes = sst(CF_CALLS) + sst(CF_ATTEMPTS);
    // Uncompressed, the tables hold every record's JSON and its key: more than `json_bytes`.
    assert!(table_bytes * 2 < json_bytes, "{table_bytes} bytes of tables for {json_bytes} bytes of records: are the tables compressed?");
}

#[test]
fn the_block_caches_have_the_size_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Rocks::open_cached(dir.path(), 3).unwrap();
    for name in ALL_CFS {
        let capacity = ledger.db.property_int_value_cf(ledger.cf(name), "rocksdb.block-cache-capacity").unwrap();
        assert_eq!(capacity, Some(3 << 20), "{name}");
    }
}

/// One cache of the configured size for every family but the two keyed by
/// a hash, which share another of that size.
#[test]
fn the_families_share_one_block_cache_but_the_two_whose_partitions_are_pinned() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Rocks::open_cached(dir.path(), 8).unwrap();
    let prop = |name: &str, what: &str| ledger.db.property_int_value_cf(ledger.cf(name), what).unwrap().unwrap();
    for i in 0..100 {
        ledger.commit(&LedgerWrite::new().call(crate::suite::call("s", &format!("c{i}"))), Durability::Buffered).unwrap();
    }
    ledger.db.flush_cf(ledger.cf(CF_CALLS)).unwrap();
    let used = prop(CF_CALLS, "rocksdb.block-cache-usage");
    assert!(used > 0, "the flush cached what it wrote");
    for name in ALL_CFS {
        let pinned = PINNED_CFS.contains(&name);
        let expected = if pinned { prop(CF_LATEST, "rocksdb.block-cache-usage") } else { used };
        assert_eq!(prop(name, "rocksdb.block-cache-usage"), expected, "{name}");
        assert_eq!(pinned, expected != used, "{name}: the blocks of `calls` are in the shared cache only");
    }
}

/// The pinned partitions of the families keyed by a hash grow with the
/// ledger (~1.4 bytes per action) past any fixed cache. They must not crowd
/// the other families out of theirs: in one shared cache, a call's blocks
/// were evicted the moment its read ended, so every read of a large ledger
/// needed the disk (2 per admission at 10 M calls, docs/benchmarks.md (i)).
#[test]
fn pinned_partitions_that_outgrow_the_cache_leave_room_for_the_other_families() {
    let dir = tempfile::tempdir().unwrap();
    {
        let ledger = Rocks::open(dir.path()).unwrap();
        let mut batch = rocksdb::WriteBatch::default();
        for i in 0..100_000u64 {
            let episode = EpisodeRecord { args_digest: format!("d{i}"), ..EpisodeRecord::open(&crate::suite::call("s", &format!("c{i}")), 1) };
            ledger.index_latest(&mut batch, &episode);
        }
        ledger.db.write(batch).unwrap();
        ledger.db.flush_cf(ledger.cf(CF_LATEST)).unwrap();
        ledger.db.compact_range_cf(ledger.cf(CF_LATEST), None::<&[u8]>, None::<&[u8]>);
        ledger.commit(&LedgerWrite::new().call(crate::suite::call("s", "c1")), Durability::Buffered).unwrap();
        ledger.db.flush_cf(ledger.cf(CF_CALLS)).unwrap();
    }
    let cache = 64 << 10;
    let ledger = Rocks::open_with_cache(dir.path(), cache).unwrap();
    let pinned = ledger.db.property_int_value_cf(ledger.cf(CF_LATEST), "rocksdb.block-cache-pinned-usage").unwrap().unwrap();
    assert!(pinned > cache as u64, "the test needs more pinned partitions than a cache holds: {pinned} bytes");
    assert!(ledger.call("s", "c1").unwrap().is_some(), "read from the table file");
    let again = memory_only(|| ledger.call("s", "c1"));
    assert!(matches!(again, Ok(Some(_))), "the blocks that read loaded were evicted: {again:?}");
}

#[test]
fn level_0_is_compacted_once_it_holds_8_flushed_files_not_4() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Rocks::open(dir.path()).unwrap();
    let level0 = || ledger.db.property_int_value_cf(ledger.cf(CF_CALLS), "rocksdb.num-files-at-level0").unwrap().unwrap();
    // Each file spans the whole key range, as files of calls with random ids do
    // (files that do not overlap would be moved down one by one instead).
    let flush = |n: u64| {
        let write = LedgerWrite::new().call(crate::suite::call("s", &format!("a{n}"))).call(crate::suite::call("s", &format!("z{n}")));
        ledger.commit(&write, Durability::Buffered).unwrap();
        ledger.db.flush_cf(ledger.cf(CF_CALLS)).unwrap();
        ledger.db.wait_for_compact(&rocksdb::WaitForCompactOptions::default()).unwrap();
    };
    for n in 1..=7 {
        flush(n);
        assert_eq!(level0(), n, "{n} flushed files stay in level 0: no compaction yet");
    }
    flush(8);
    assert_eq!(level0(), 0, "the 8th flushed file starts the compaction of level 0");
    for n in 1..=8 {
        assert!(ledger.call("s", &format!("a{n}")).unwrap().is_some(), "a{n} survives the compaction");
    }
}

#[test]
fn a_ledger_with_families_a_newer_toolguard_added_is_refused_before_anything_in_it_changes() {
    let dir = tempfile::tempdir().unwrap();
    drop(Rocks::open(dir.path()).unwrap());
    // A newer toolguard's ledger: one family more, and one of ours it dropped.
    {
        let mut db = DB::open_cf(&Options::default(), dir.path(), ALL_CFS).unwrap();
        db.create_cf("calls_v9", &Options::default()).unwrap();
        db.drop_cf(CF_UNSETTLED).unwrap();
    }
    let before = DB::list_cf(&Options::default(), dir.path()).unwrap();
    let err = format!("{:?}", Rocks::open(dir.path()).err().expect("refused"));
    assert!(err.contains("calls_v9") && err.contains("newer toolguard") && err.contains("matching toolguard"), "says why and what to do: {err}");
    assert_eq!(DB::list_cf(&Options::default(), dir.path()).unwrap(), before, "no family of this build was put back");
}

#[test]
fn a_damaged_retire_index_key_stops_pruning_with_its_name_and_stays() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Rocks::open(dir.path()).unwrap();
    // Shorter than the 8-byte time every entry starts with: not written by toolguard.
    ledger.db.put_cf(ledger.cf(CF_RETIRE), [0x01, 0x02, 0x03], b"").unwrap();
    let err = ledger.retire_page_of(u64::MAX, None, 16).expect_err("a damaged key is an error, not a panic");
    let message = format!("{err:?}");
    assert!(message.contains("damaged entry") && message.contains("010203") && message.contains(CF_RETIRE), "{message}");
    let kept = ledger.db.get_cf(ledger.cf(CF_RETIRE), [0x01, 0x02, 0x03]).unwrap();
    assert!(kept.is_some(), "the damaged key is left as it is");
}
