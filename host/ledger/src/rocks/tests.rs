//! The RocksDB backend's own tests: key scans, the latest-episode index,
//! index upkeep, schema refusals, damaged keys (the writer's:
//! `writer_tests.rs`; the layout's: `layout_tests.rs`).

use super::layout::*;
use super::*;
use crate::Prior;
use crate::retention::Removal;
use crate::{AttemptRecord, AttemptState, Backend, Durability, EpisodeOp, EpisodeRecord, LedgerWrite};
use rocksdb::{DB, Options};
use std::path::Path;

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

pub(super) fn ticker(ledger: &Rocks, t: rocksdb::statistics::Ticker) -> u64 {
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

pub(super) fn attempt(call_id: &str, state: AttemptState) -> AttemptRecord {
    crate::suite::attempt(call_id, 0, 0, state)
}

pub(super) fn indexes(ledger: &Rocks) -> Vec<Vec<u8>> {
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

#[test]
fn a_record_that_is_not_json_is_refused_by_what_it_holds_and_left_as_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Rocks::open(dir.path()).unwrap();
    ledger.db.put_cf(ledger.cf(CF_CALLS), call_key("s", "c1"), b"written by another program").unwrap();
    let e = ledger.call("s", "c1").expect_err("a damaged record is an error, not a panic");
    let message = format!("{e:?}");
    assert!(message.contains("damaged record") && message.contains("written by another program") && message.contains("restore it"), "{message}");
    let kept = ledger.db.get_cf(ledger.cf(CF_CALLS), call_key("s", "c1")).unwrap();
    assert_eq!(kept.as_deref(), Some(&b"written by another program"[..]), "left as it is");
}

/// A ledger whose limits' uses were written before their running totals
/// were kept gets them summed when it opens: the next spend is checked
/// against everything the window holds, and a release takes its use off.
#[test]
fn limits_uses_written_before_running_totals_are_summed_when_the_ledger_opens() {
    let dir = tempfile::tempdir().unwrap();
    let spend = |call_id: &str, amount: u64| {
        let s = crate::Spend { at_ms: 10, ..crate::suite::limits::spend_of("t1", 5_000, 0, call_id, amount) };
        LedgerWrite::new().call(crate::suite::call("s", call_id)).spend(s)
    };
    {
        let ledger = Rocks::open(dir.path()).unwrap();
        Backend::commit(&ledger, &spend("c1", 3_000), Durability::Synced).unwrap();
        Backend::commit(&ledger, &spend("c2", 1_500), Durability::Synced).unwrap();
    }
    // As written before the totals: the family gone.
    {
        let mut opts = Options::default();
        opts.create_missing_column_families(true);
        let described = ALL_CFS.map(|name| {
            let mut o = Options::default();
            if name == CF_SPEND_TOTAL {
                options::with_totals_merge(&mut o);
            }
            rocksdb::ColumnFamilyDescriptor::new(name, o)
        });
        let mut db = DB::open_cf_descriptors(&opts, dir.path(), described).unwrap();
        // Flushed first: the log's batches name the family about to go, and
        // RocksDB would drop them whole on the next open.
        for cf in ALL_CFS {
            db.flush_cf(db.cf_handle(cf).unwrap()).unwrap();
        }
        db.drop_cf(CF_SPEND_TOTAL).unwrap();
    }
    assert!(!DB::list_cf(&Options::default(), dir.path()).unwrap().iter().any(|n| n == CF_SPEND_TOTAL));
    let ledger = Rocks::open(dir.path()).unwrap();
    let refused = Backend::commit(&ledger, &spend("c3", 600), Durability::Synced).unwrap_err();
    assert!(matches!(&refused, BackendError::OverLimit(m) if m.contains("4500 of 5000")), "{refused:?}");
    Backend::commit(&ledger, &spend("c4", 500), Durability::Synced).expect("to the edge exactly");
    let release = crate::Release { scope: "t1".into(), at_ms: 10, call_id: "c1".into() };
    Backend::commit(&ledger, &LedgerWrite::new().release(release.clone()), Durability::Synced).unwrap();
    Backend::commit(&ledger, &LedgerWrite::new().release(release), Durability::Synced).unwrap();
    Backend::commit(&ledger, &spend("c5", 3_000), Durability::Synced).expect("c1's 3,000 given back, once");
    assert!(
        matches!(Backend::commit(&ledger, &spend("c6", 1), Durability::Synced), Err(BackendError::OverLimit(_))),
        "a second release of c1 gave nothing more"
    );
    // A read-only open beside the writer replays the log, running totals' merges and all: it sees every use.
    let beside = Rocks::open_read_only(dir.path()).unwrap();
    let mut seen: Vec<String> = beside.spent(0).unwrap().into_iter().map(|u| u.call_id).collect();
    seen.sort();
    assert_eq!(seen, ["c2", "c4", "c5"]);
}
