//! The layout at work: what is read from memory, the block caches, pinned
//! partitions, compression and compaction.

use super::layout::*;
use super::*;
use crate::Prior;
use crate::{AttemptState, Backend, Durability, EpisodeRecord, LedgerWrite};

use super::tests::attempt;

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
