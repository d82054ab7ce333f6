//! When a `toolguard call` first received its tool call, kept beside a
//! host's own (RocksDB) ledger before anything else is loaded
//! (`docs/tasks.md`, "The repeat nobody can link"). A call killed while its
//! plugins were still loading left no record in the ledger, so when the
//! model re-issued it under a new id and its harness then resumed the old
//! id, the resume looked like a new action made after the repeat's
//! definitive answer. Its receipt says it arrived before: the hold rule
//! compares the repeat's answer with that arrival, so the resume is held
//! with the repeat's outcome. One small file per call, written and synced
//! when the process starts; removed once the call is answered (the ledger
//! then holds it).

use sha2::Digest as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};

/// The receipts of the calls a data directory's host received.
#[derive(Debug, Clone)]
pub struct Receipts {
    dir: PathBuf,
}

impl Receipts {
    /// The receipts beside the ledger in `ledger_dir`.
    pub fn beside(ledger_dir: &Path) -> Self {
        let mut name = ledger_dir.as_os_str().to_owned();
        name.push(".receipts");
        Self { dir: PathBuf::from(name) }
    }

    fn path(&self, session: &str, call_id: &str) -> PathBuf {
        let digest = sha2::Sha256::digest(format!("{session}\n{call_id}").as_bytes());
        self.dir.join(hex::encode(&digest[..16]))
    }

    /// When tool call (`session`, `call_id`) was first received (Unix ms,
    /// the ledger's clock), if a receipt of it is kept.
    pub fn of(&self, session: &str, call_id: &str) -> Option<u64> {
        std::fs::read_to_string(self.path(session, call_id)).ok()?.trim().parse().ok()
    }

    /// Records that tool call (`session`, `call_id`) was received now,
    /// unless an earlier receipt of it is kept; synced.
    ///
    /// # Errors
    /// The receipt could not be written (the call then runs as if unrecorded).
    pub fn note(&self, session: &str, call_id: &str) -> std::io::Result<()> {
        if self.of(session, call_id).is_some() {
            return Ok(());
        }
        std::fs::create_dir_all(&self.dir)?;
        let path = self.path(session, call_id);
        let staged = path.with_extension("new");
        let mut file = std::fs::File::create(&staged)?;
        write!(file, "{}", crate::ledger::records::now_ms())?;
        file.sync_all()?;
        std::fs::rename(&staged, &path)?;
        std::fs::File::open(&self.dir)?.sync_all()
    }

    /// Lets the receipt of (`session`, `call_id`) go: the call was answered.
    pub fn forget(&self, session: &str, call_id: &str) {
        let _ = std::fs::remove_file(self.path(session, call_id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_receipt_of_a_call_stays_until_it_is_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let receipts = Receipts::beside(&dir.path().join("ledger"));
        assert_eq!(receipts.of("s", "c"), None);
        receipts.note("s", "c").unwrap();
        let first = receipts.of("s", "c").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(5));
        receipts.note("s", "c").unwrap();
        assert_eq!(receipts.of("s", "c"), Some(first), "a later receipt of the same call keeps the first");
        assert_eq!(receipts.of("s", "other"), None);
        receipts.forget("s", "c");
        assert_eq!(receipts.of("s", "c"), None);
    }
}
