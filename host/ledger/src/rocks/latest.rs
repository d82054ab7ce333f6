//! Each action's latest episode, found with point reads: family
//! `latest_episode` maps a digest of the action to the number of its latest
//! episode, written in the same batch that opens that episode.
//!
//! Admission reads the latest episode of every new irreversible call's
//! action; a point read behind a bloom filter costs a fraction of the
//! prefix seek it replaces (an iterator over every memtable and level),
//! and for nearly every new call (an action never seen) it is one lookup
//! that finds nothing.
//!
//! Why it is exact (`docs/ledger.md`, Layout):
//! - episode n of an action opens only after its latest, n − 1, closed
//!   (the hold rule, under the guard's lock per action), and that write
//!   sets the entry to n, so no episode above the entry exists;
//! - entries are never deleted: pruning may remove the episode an entry
//!   names (then the action's episodes are found by the prefix seek, as
//!   before), but a deletion racing an opening could lose the entry of a
//!   live episode, and a missing entry means "no episode";
//! - a ledger written before the family existed is indexed when a
//!   writable handle opens it, before it serves; the `meta` key
//!   [`INDEXED`], written in the same batch, says it is done.

use super::layout::{CF_EPISODES, CF_LATEST, CF_META, action_prefix, episode_key, prefix_successor};
use super::{Rocks, db_error, read_options, write_options};
use crate::error::{damaged_record, failed};
use crate::{BackendError, Durability, EpisodeRecord};
use rocksdb::{IteratorMode, WriteBatch};
use sha2::{Digest, Sha256};

/// The `meta` key present once every episode's action has its entry.
pub(super) const INDEXED: &[u8] = b"latest-episode-indexed";

/// The key of an action's entry: the first 16 bytes of sha256 of its
/// length-prefixed (session, tool, args digest), so an entry is 24 bytes
/// whatever the session and tool names.
pub(super) fn latest_key(session: &str, tool: &str, args_digest: &str) -> [u8; 16] {
    latest_key_of(&action_prefix(session, tool, args_digest))
}

fn latest_key_of(action: &[u8]) -> [u8; 16] {
    Sha256::digest(action)[..16].try_into().expect("sha256 has 32 bytes")
}

impl Rocks {
    /// The action's episode with the highest number, if it has any.
    pub(super) fn latest_episode(&self, session: &str, tool: &str, args_digest: &str) -> Result<Option<EpisodeRecord>, BackendError> {
        if !self.latest_indexed {
            return self.latest_episode_by_seek(session, tool, args_digest);
        }
        let entry = self.db.get_pinned_cf_opt(self.cf(CF_LATEST), latest_key(session, tool, args_digest), &read_options()).map_err(|e| db_error(&e))?;
        let Some(n) = entry.and_then(|v| v.as_ref().try_into().ok()).map(u64::from_be_bytes) else { return Ok(None) };
        match self.get_json(CF_EPISODES, &episode_key(session, tool, args_digest, n))? {
            Some(episode) => Ok(Some(episode)),
            // Pruned: an earlier episode kept by a failed check may remain.
            None => self.latest_episode_by_seek(session, tool, args_digest),
        }
    }

    /// Sets the action's entry to `n` in `batch`: episode `n` opens in it.
    pub(super) fn index_latest(&self, batch: &mut WriteBatch, episode: &EpisodeRecord) {
        let key = latest_key(&episode.session, &episode.tool, &episode.args_digest);
        batch.put_cf(self.cf(CF_LATEST), key, episode.episode.to_be_bytes());
    }

    /// Sets the action's entry to its latest episode as a seek finds it.
    /// Called when an episode was to be opened under a number that exists:
    /// only an entry that fell behind (which nothing here writes) makes the
    /// guard do that, and without the repair it would try again forever.
    pub(super) fn repair_latest(&self, session: &str, tool: &str, args_digest: &str) {
        let repaired = match self.latest_episode_by_seek(session, tool, args_digest) {
            Ok(Some(latest)) => {
                let key = latest_key(session, tool, args_digest);
                self.db.put_cf(self.cf(CF_LATEST), key, latest.episode.to_be_bytes()).map_err(|e| e.to_string())
            }
            // No episode at all: the conflict was not this entry's doing.
            Ok(None) => return,
            Err(e) => Err(format!("{e:?}")),
        };
        match repaired {
            Ok(()) => tracing::warn!(session, tool, "an action's latest-episode entry was behind its episodes; repaired"),
            Err(e) => tracing::error!(session, tool, error = %e, "an action's latest-episode entry is behind its episodes and could not be repaired"),
        }
    }

    /// The action's episode with the highest number, by a seek of the
    /// action's prefix (a few episodes at most), so the prefix filters skip
    /// what holds none of them.
    fn latest_episode_by_seek(&self, session: &str, tool: &str, args_digest: &str) -> Result<Option<EpisodeRecord>, BackendError> {
        let Some(family) = self.db.cf_handle(CF_EPISODES) else { return Ok(None) };
        let prefix = action_prefix(session, tool, args_digest);
        let mut opts = read_options();
        opts.set_total_order_seek(false);
        opts.set_prefix_same_as_start(true);
        if let Some(upper) = prefix_successor(&prefix) {
            opts.set_iterate_upper_bound(upper);
        }
        let start = episode_key(session, tool, args_digest, 0);
        let mut last = None;
        for item in self.db.iterator_cf_opt(family, opts, IteratorMode::From(&start, rocksdb::Direction::Forward)) {
            let (k, v) = item.map_err(|e| db_error(&e))?;
            if !k.starts_with(&prefix) {
                break;
            }
            last = Some(v);
        }
        last.map(|v| serde_json::from_slice(&v).map_err(|e| damaged_record(&v, e))).transpose()
    }

    /// Whether every action's latest episode has its entry (read at open).
    pub(super) fn latest_is_indexed(&self) -> Result<bool, BackendError> {
        let Some(meta) = self.db.cf_handle(CF_META) else { return Ok(false) };
        Ok(self.db.get_cf(meta, INDEXED).map_err(failed)?.is_some() && self.db.cf_handle(CF_LATEST).is_some())
    }

    /// Gives every action with episodes its entry (the number of its last
    /// episode) and marks the index complete, in one batch. Runs when a
    /// writable handle opens a ledger without the mark, before any other
    /// write. Buffered: the WAL keeps writes in order, so a crash that loses
    /// this batch loses every write after it too, and the next open indexes
    /// again, writing the same entries.
    pub(super) fn index_latest_episodes(&self) -> Result<(), BackendError> {
        let mut batch = WriteBatch::default();
        let mut last: Option<(Vec<u8>, [u8; 8])> = None;
        for item in self.db.iterator_cf_opt(self.cf(CF_EPISODES), read_options(), IteratorMode::Start) {
            let (k, _) = item.map_err(|e| db_error(&e))?;
            let (action, number) = k.split_at(k.len().saturating_sub(8));
            if let Some((previous, n)) = last.take_if(|(a, _)| a.as_slice() != action) {
                batch.put_cf(self.cf(CF_LATEST), latest_key_of(&previous), n);
            }
            last = Some((action.to_vec(), number.try_into().map_err(|_| failed("damaged episode key"))?));
        }
        if let Some((action, n)) = last {
            batch.put_cf(self.cf(CF_LATEST), latest_key_of(&action), n);
        }
        let indexed = batch.len();
        batch.put_cf(self.cf(CF_META), INDEXED, []);
        self.db.write_opt(batch, &write_options(Durability::Buffered)).map_err(failed)?;
        if indexed > 0 {
            tracing::info!(ledger = %self.dir.display(), actions = indexed, "indexed the latest episode of each action");
        }
        Ok(())
    }
}
