//! The registry cache under the data directory: blobs by digest
//! (`blobs/sha256/<hex>`: components, manifests, signature payloads), each
//! written once after its digest was checked, and what each tag last
//! resolved to (`tags/<registry>/<repository>/<tag>.json`). Start-up,
//! `tools` and `audit` work from it when the registry cannot be reached.

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use std::path::{Path, PathBuf};

/// The cache of one data directory.
#[derive(Debug, Clone)]
pub struct Cache {
    pub(super) root: PathBuf,
}

/// What a tag resolved to when it was last asked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TagRecord {
    /// The manifest digest.
    pub digest: String,
    /// When (ms since the epoch).
    pub resolved_ms: u64,
    /// The digest it resolved to before, if it moved.
    #[serde(default)]
    pub previous: Option<String>,
}

impl Cache {
    /// The cache under `data_dir` (`<data_dir>/registry`).
    pub fn under(data_dir: &Path) -> Self {
        Self { root: data_dir.join("registry") }
    }

    /// Where blob `digest` lives (whether or not it is there).
    pub fn blob_path(&self, digest: &str) -> PathBuf {
        self.root.join("blobs").join(digest.replacen(':', "/", 1))
    }

    /// A new temporary file for a blob being downloaded.
    ///
    /// # Errors
    /// The cache directory cannot be created.
    pub fn temp_path(&self) -> Result<PathBuf, String> {
        let dir = self.root.join("tmp");
        std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let n: u64 = rand_u64();
        Ok(dir.join(format!("{}-{n:016x}", std::process::id())))
    }

    /// Moves a downloaded, digest-checked file into place as blob `digest`.
    ///
    /// # Errors
    /// The file cannot be moved.
    pub fn commit(&self, temp: &Path, digest: &str) -> Result<PathBuf, String> {
        let path = self.blob_path(digest);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
        std::fs::rename(temp, &path).map_err(|e| format!("cannot store blob {digest}: {e}"))?;
        Ok(path)
    }

    /// Stores small content (a manifest, a payload) as its blob.
    ///
    /// # Errors
    /// It cannot be written.
    pub fn put(&self, bytes: &[u8]) -> Result<String, String> {
        let digest = format!("sha256:{}", hex::encode(Sha256::digest(bytes)));
        if !self.blob_path(&digest).exists() {
            let temp = self.temp_path()?;
            std::fs::write(&temp, bytes).map_err(|e| format!("cannot write {}: {e}", temp.display()))?;
            self.commit(&temp, &digest)?;
        }
        Ok(digest)
    }

    /// Blob `digest`, if cached and still its digest (a damaged file is removed).
    pub fn get(&self, digest: &str) -> Option<Vec<u8>> {
        let path = self.blob_path(digest);
        let bytes = std::fs::read(&path).ok()?;
        if format!("sha256:{}", hex::encode(Sha256::digest(&bytes))) == digest {
            Some(bytes)
        } else {
            tracing::warn!(blob = %digest, "a cached blob no longer has its digest; removed, it will be fetched again");
            let _ = std::fs::remove_file(&path);
            None
        }
    }

    /// When blob `digest` entered the cache (ms since the epoch).
    pub fn stored_ms(&self, digest: &str) -> Option<u64> {
        written_ms(&std::fs::metadata(self.blob_path(digest)).ok()?)
    }

    /// Where `tag`'s record lives (whether or not it is there).
    pub(super) fn tag_path(&self, registry: &str, repository: &str, tag: &str) -> PathBuf {
        let registry: String = registry.chars().map(|c| if c.is_ascii_alphanumeric() || c == '.' || c == '-' { c } else { '_' }).collect();
        self.root.join("tags").join(registry).join(repository).join(format!("{tag}.json"))
    }

    /// What `tag` last resolved to.
    pub fn tag(&self, registry: &str, repository: &str, tag: &str) -> Option<TagRecord> {
        serde_json::from_slice(&std::fs::read(self.tag_path(registry, repository, tag)).ok()?).ok()
    }

    /// Forgets what `tag` resolved to (the registry no longer has it).
    pub fn forget_tag(&self, registry: &str, repository: &str, tag: &str) {
        let _ = std::fs::remove_file(self.tag_path(registry, repository, tag));
    }

    /// Records that `tag` resolves to `digest` now; answers the record
    /// (with the digest it resolved to before, if it moved).
    ///
    /// # Errors
    /// It cannot be written.
    pub fn set_tag(&self, registry: &str, repository: &str, tag: &str, digest: &str) -> Result<TagRecord, String> {
        let before = self.tag(registry, repository, tag);
        let previous = match &before {
            Some(b) if b.digest != digest => Some(b.digest.clone()),
            Some(b) => b.previous.clone(),
            None => None,
        };
        let record = TagRecord { digest: digest.into(), resolved_ms: crate::ledger::records::now_ms(), previous };
        let path = self.tag_path(registry, repository, tag);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
        let temp = self.temp_path()?;
        std::fs::write(&temp, serde_json::to_vec(&record).unwrap_or_default()).map_err(|e| format!("cannot write {}: {e}", temp.display()))?;
        std::fs::rename(&temp, &path).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        Ok(record)
    }
}

/// When a cache file was last written (ms since the epoch), if the system says.
pub fn written_ms(meta: &std::fs::Metadata) -> Option<u64> {
    let modified = meta.modified().ok()?;
    modified.duration_since(std::time::UNIX_EPOCH).ok().map(|d| d.as_millis() as u64)
}

fn rand_u64() -> u64 {
    let mut b = [0u8; 8];
    let _ = getrandom::fill(&mut b);
    u64::from_le_bytes(b)
}
