//! Pruning the registry cache (`toolguard prune-cache`). Kept: what the
//! configuration can load with the registry down — for each `oci://`
//! component its tag's manifest and the one the tag pointed to before (a
//! rollback), or its pinned manifest; their config and layer blobs; the
//! signatures and referrers (sigstore bundles) of those manifests. The rest
//! goes once it is older than a grace period, so a blob or tag a concurrent
//! pull has just written is never taken.

use super::reference::is_sha256_digest;
use super::{Cache, OciRef};
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The most manifests followed from one reference (signatures, referrers
/// and their manifests included): a hostile index cannot make a prune walk forever.
const MAX_MANIFESTS: usize = 256;

/// What a prune kept and removed.
#[derive(Debug, Default, Serialize)]
pub struct Pruned {
    /// Files the configuration needs, kept.
    pub kept: usize,
    /// Files not needed and older than the grace period: removed (in a dry
    /// run, to be removed), as paths under the cache.
    pub removed: Vec<String>,
    /// Their bytes.
    pub bytes: u64,
    /// Files not needed but younger than the grace period: left for a later prune.
    pub young: usize,
}

impl Cache {
    /// Removes what `refs` do not need and was last written more than
    /// `grace_ms` before `now_ms` (nothing, if `dry_run`).
    pub fn prune(&self, refs: &[OciRef], grace_ms: u64, now_ms: u64, dry_run: bool) -> Pruned {
        let needed = self.needed(refs);
        let mut pruned = Pruned::default();
        for dir in ["blobs", "tags", "tmp"] {
            for (file, meta) in files_under(&self.root.join(dir)) {
                if needed.contains(&file) {
                    pruned.kept += 1;
                    continue;
                }
                if now_ms.saturating_sub(super::cache::written_ms(&meta).unwrap_or(0)) < grace_ms {
                    pruned.young += 1;
                    continue;
                }
                if !dry_run && let Err(e) = std::fs::remove_file(&file) {
                    tracing::warn!(file = %file.display(), error = %e, "could not remove a cache file");
                    continue;
                }
                pruned.removed.push(file.strip_prefix(&self.root).unwrap_or(&file).display().to_string());
                pruned.bytes += meta.len();
            }
        }
        pruned
    }

    /// The cache files `refs` need to load offline.
    fn needed(&self, refs: &[OciRef]) -> BTreeSet<PathBuf> {
        let mut files = BTreeSet::new();
        for r in refs {
            let mut manifests: Vec<String> = r.digest.iter().cloned().collect();
            if let Some(tag) = &r.tag {
                files.insert(self.tag_path(&r.registry, &r.repository, tag));
                if let Some(record) = self.tag(&r.registry, &r.repository, tag) {
                    manifests.push(record.digest);
                    manifests.extend(record.previous);
                }
            }
            let mut seen = BTreeSet::new();
            while let Some(digest) = manifests.pop() {
                if !is_sha256_digest(&digest) || seen.len() >= MAX_MANIFESTS || !seen.insert(digest.clone()) {
                    continue;
                }
                files.insert(self.blob_path(&digest));
                // Its signatures and referrers: tags beside it in its repository.
                for tag in [super::signature::signature_tag(&digest), super::referrers::referrers_tag(&digest)] {
                    if let Some(record) = self.tag(&r.registry, &r.repository, &tag) {
                        files.insert(self.tag_path(&r.registry, &r.repository, &tag));
                        manifests.push(record.digest);
                    }
                }
                let Some(manifest) = self.get(&digest).and_then(|bytes| serde_json::from_slice::<Value>(&bytes).ok()) else { continue };
                let blobs = std::iter::once(&manifest["config"]).chain(manifest["layers"].as_array().into_iter().flatten());
                files.extend(blobs.filter_map(|d| d["digest"].as_str()).filter(|d| is_sha256_digest(d)).map(|d| self.blob_path(d)));
                manifests.extend(manifest["manifests"].as_array().into_iter().flatten().filter_map(|d| d["digest"].as_str()).map(String::from));
            }
        }
        files
    }
}

/// The regular files under `dir`, with their metadata (symbolic links are not followed).
fn files_under(dir: &Path) -> Vec<(PathBuf, std::fs::Metadata)> {
    let mut files = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            let Ok(meta) = entry.path().symlink_metadata() else { continue };
            if meta.is_dir() {
                dirs.push(entry.path());
            } else if meta.is_file() {
                files.push((entry.path(), meta));
            }
        }
    }
    files
}
