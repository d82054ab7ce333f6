//! How RocksDB is tuned for the ledger: each column family's options (block
//! cache, pinned index and filter partitions, prefix blooms, compression,
//! compaction), and the read and write options every access uses
//! (`docs/ledger.md`, "Layout").

use super::layout::*;
use super::*;
use crate::Durability;
use rocksdb::{BlockBasedOptions, Cache, Options, ReadOptions, WriteOptions};

/// Memory all memtables together may use before RocksDB flushes them.
pub(super) const LEDGER_MEMTABLE_BUDGET: usize = 32 << 20;

/// The default memory for data, index and filter blocks read from table
/// files, in MiB, shared by all column families (RocksDB's own default is
/// 32 MiB per family); `ledger_cache_mib` in the config sets it. The two
/// families keyed by a hash have a cache of their own of the same size
/// ([`Caches`]).
pub const DEFAULT_BLOCK_CACHE_MIB: u64 = 8;

/// The families keyed by a hash, whose index and filter partitions are all
/// pinned, in a block cache of their own ([`Caches`]).
pub(super) const PINNED_CFS: [&str; 2] = [CF_LATEST, CF_EXPIRED];

/// The block caches of a ledger.
pub(super) struct Caches {
    /// Every family's blocks but those of `pinned`'s families.
    pub(super) shared: Cache,
    /// The families keyed by a hash (`latest_episode`, `expired`), whose
    /// index and filter partitions are all pinned: ~1.4 bytes per action or
    /// tombstone, which outgrow any fixed cache (14 MB at 10 M actions).
    /// In the shared cache they took all of it, and every block any other
    /// family loaded was evicted the moment its read ended: at 10 M calls
    /// each guarded call made two reads memory could not answer
    /// (docs/benchmarks.md, (i)). Here they crowd only their own families'
    /// data blocks.
    pub(super) pinned: Cache,
}

/// How many table files flushed from memtables (level 0) a family gathers
/// before RocksDB compacts them into the level below (its default is 4).
pub(super) const L0_COMPACTION_TRIGGER: i32 = 8;

/// The options of family `name`.
/// The merge of a limit's running total (`spend_total`): the stored value
/// and every operand are amounts ([`total_of`]), and the result their sum.
/// Commutative, so a release never needs the scope's lock: whatever order
/// spends and releases land in, the total is the same.
fn add_amounts(_key: &[u8], existing: Option<&[u8]>, operands: &rocksdb::MergeOperands) -> Option<Vec<u8>> {
    let sum = operands.iter().fold(existing.map_or(0, total_of), |sum, op| sum.saturating_add(total_of(op)));
    Some(sum.to_be_bytes().to_vec())
}

pub(super) fn cf_options(name: &str, caches: &Caches) -> Options {
    let pinned = PINNED_CFS.contains(&name);
    let mut table = BlockBasedOptions::default();
    table.set_block_cache(if pinned { &caches.pinned } else { &caches.shared });
    // Index and filter blocks count against the cache instead of growing
    // with the number of table files.
    table.set_cache_index_and_filter_blocks(true);
    // A lookup of a key that is not there (every new tool call, every new
    // step) skips the table's data blocks.
    table.set_bloom_filter(10.0, false);
    // Partitioned: a lookup loads one 4 KiB partition of a table's index and
    // filter, not the whole of them (megabytes for a large table), so a
    // ledger of millions of calls costs what a small one does in a cache
    // this size (docs/benchmarks.md, (i)). The top levels stay pinned, and
    // index and filter blocks go to the cache's high-priority pool, ahead of
    // data blocks.
    table.set_index_type(rocksdb::BlockBasedIndexType::TwoLevelIndexSearch);
    table.set_partition_filters(true);
    table.set_metadata_block_size(4096);
    table.set_pin_top_level_index_and_filter(true);
    table.set_cache_index_and_filter_blocks_with_high_priority(true);
    table.set_pin_l0_filter_and_index_blocks_in_cache(true);
    if pinned {
        // Keyed by a hash, so each admission's lookup of a new action (or of
        // a new call's tombstone) lands in a random partition of every
        // level: unpinned, a ledger of millions read a partition from the
        // disk for nearly every new action (admission 18 → 54 µs at 1 M
        // calls, 77 at 10 M). Pinned, all of them stay in memory, ~1.4 bytes
        // per action or tombstone (docs/benchmarks.md, (i)).
        table.set_partition_pinning_tier(rocksdb::BlockBasedTablePinningTier::All);
    }
    let mut o = Options::default();
    o.set_write_buffer_size(8 << 20);
    // Keys are (session, call id), not time-ordered: every compaction of
    // level 0 rewrites the overlapping part of the level below, nearly all of
    // it. Compacting 8 flushed files at once instead of RocksDB's 4 halves
    // how often that happens: the flushes and compactions of a host serving
    // without pause fell from ~31 to ~21 µs of CPU per guarded call
    // (docs/benchmarks.md), for point lookups that check up to 8 young
    // files' pinned filters instead of 4.
    o.set_level_zero_file_num_compaction_trigger(L0_COMPACTION_TRIGGER);
    o.set_block_based_table_factory(&table);
    // Records are JSON: LZ4 at every level. ZSTD at the bottom took ~30 %
    // less disk, but keys are not in time order, so every compaction of
    // level 0 rewrites (and recompresses) the level below, which grows with
    // the ledger: ZSTD made RocksDB's background CPU per call grow ~2x as
    // fast (docs/benchmarks.md). Compression runs in flushes and
    // compactions, off the write path.
    o.set_compression_type(rocksdb::DBCompressionType::Lz4);
    // The blocks a memtable flush writes (data, index and filter) go into
    // the block cache as they are written (`prepopulate_block_cache`, which
    // the Rust binding has no setter for: set over the table options above,
    // keeping them and the shared cache). Without it the first read to meet
    // a freshly flushed table — the newest records, the likeliest to be
    // read — could not be answered from memory and went to the blocking
    // pool: ~0.1 of the guard's reads per call at 64 in flight
    // (docs/benchmarks.md).
    let mut o = o.get_options_from_string("block_based_table_factory={prepopulate_block_cache=kFlushOnly}").expect("a valid option string");
    if name == CF_EPISODES {
        // Finding an action's latest episode without its `latest_episode`
        // entry scans the action's prefix, which without a prefix filter
        // seeks into the memtables and every table file even when the action
        // has none. With the action as the prefix, the memtable's prefix
        // bloom and each table's filter skip them instead. Only
        // [`Rocks::latest_episode`]'s fallback seeks by prefix (a read-only
        // open of an older ledger, an action whose latest episode was
        // pruned); every other read seeks in total order ([`read_options`]).
        o.set_prefix_extractor(rocksdb::SliceTransform::create("toolguard.episode-action", episode_action, Some(is_episode_key)));
        o.set_memtable_prefix_bloom_ratio(0.1);
    }
    if name == CF_SPEND_TOTAL {
        with_totals_merge(&mut o);
    }
    o
}

/// Sets the running totals' merge on `o`. Every open of `spend_total`
/// needs it, a read-only one too: replaying the log's merges, RocksDB
/// without it drops the batch that holds one.
pub(super) fn with_totals_merge(o: &mut Options) {
    o.set_merge_operator_associative("toolguard.add-amounts", add_amounts);
}

/// The action part of an episode key: all but its 8-byte episode number.
pub(super) fn episode_action(key: &[u8]) -> &[u8] {
    &key[..key.len().saturating_sub(8)]
}

/// Whether `key` is long enough to be an episode key.
pub(super) fn is_episode_key(key: &[u8]) -> bool {
    key.len() > 8
}

/// Read options in total order (a family's prefix filter is never used to
/// skip data), answered from memory only on a [`memory_only`] thread.
pub(super) fn read_options() -> ReadOptions {
    let mut o = ReadOptions::default();
    o.set_total_order_seek(true);
    if MEMORY_ONLY.get() {
        o.set_read_tier(rocksdb::ReadTier::BlockCache);
    }
    o
}

pub(super) fn write_options(durability: Durability) -> WriteOptions {
    let mut o = WriteOptions::default();
    o.set_sync(durability == Durability::Synced);
    o
}
