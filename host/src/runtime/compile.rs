//! Each component is compiled once and cached across runs: precompiled
//! artifacts keyed by the component's sha256 and the engine's compatibility
//! hash, each with a sha256 trailer checked before it is deserialised.

use sha2::{Digest, Sha256};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use wasmtime::Engine;
use wasmtime::component::Component;

/// Length of the integrity trailer appended to each cache entry.
const TRAILER: usize = 32;

/// The cache file for a component with `digest` under this engine.
pub fn cache_path(engine: &Engine, cache_dir: &Path, digest: &str) -> PathBuf {
    let mut h = std::hash::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut h);
    cache_dir.join(format!("{digest}-{:016x}.cwasm", h.finish()))
}

/// The compiled component for `bytes` (whose sha256 is `digest`): from the
/// cache when a sound entry exists, else compiled and cached.
///
/// A cache that cannot be written is logged and otherwise ignored.
///
/// # Errors
/// The component does not compile.
pub fn load(engine: &Engine, bytes: &[u8], digest: &str, cache_dir: &Path) -> anyhow::Result<Component> {
    let path = cache_path(engine, cache_dir, digest);
    if let Some(component) = read_cached(engine, &path) {
        return Ok(component);
    }
    let compiled = engine.precompile_component(bytes)?;
    // SAFETY: `compiled` was produced just now by this engine.
    let component = unsafe { Component::deserialize(engine, &compiled)? };
    if let Err(e) = write_cached(&path, &compiled) {
        tracing::warn!(path = %path.display(), error = %e, "could not cache the compiled component");
    }
    Ok(component)
}

fn read_cached(engine: &Engine, path: &Path) -> Option<Component> {
    let data = std::fs::read(path).ok()?;
    let Some(split) = data.len().checked_sub(TRAILER) else {
        tracing::warn!(path = %path.display(), "cache entry truncated; recompiling");
        return None;
    };
    let (artifact, trailer) = data.split_at(split);
    if Sha256::digest(artifact).as_slice() != trailer {
        tracing::warn!(path = %path.display(), "cache entry corrupt; recompiling");
        return None;
    }
    // SAFETY: the cache directory is host-owned, the entry is keyed by this
    // engine's compatibility hash, and its checksum matches what this host
    // wrote; wasmtime also checks the header before use.
    match unsafe { Component::deserialize(engine, artifact) } {
        Ok(component) => {
            mark_used(path);
            Some(component)
        }
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cache entry unusable; recompiling");
            None
        }
    }
}

/// Notes that the entry at `path` was used now (its modification time), so
/// that [`prune`] keeps what is still loaded; a read-only cache stays as it is.
fn mark_used(path: &Path) {
    if let Ok(file) = std::fs::File::options().append(true).open(path) {
        let _ = file.set_modified(std::time::SystemTime::now());
    }
}

/// What a prune of the compile cache removed.
#[derive(Debug, Default, serde::Serialize)]
pub struct Pruned {
    /// Entries used (written or loaded) within the grace period, kept.
    pub kept: usize,
    /// Entries removed (in a dry run, to be removed): file names.
    pub removed: Vec<String>,
    /// Their bytes.
    pub bytes: u64,
}

/// Removes from `cache_dir` the compiled entries (and stray temporary
/// files) not written or loaded within `grace_ms` before `now_ms` (none,
/// if `dry_run`). What is removed is compiled again when next loaded.
pub fn prune(cache_dir: &Path, grace_ms: u64, now_ms: u64, dry_run: bool) -> Pruned {
    let mut pruned = Pruned::default();
    let Ok(entries) = std::fs::read_dir(cache_dir) else { return pruned };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Ok(meta) = entry.path().symlink_metadata() else { continue };
        if !meta.is_file() || !(name.ends_with(".cwasm") || name.ends_with(".tmp")) {
            continue;
        }
        if now_ms.saturating_sub(crate::registry::cache::written_ms(&meta).unwrap_or(0)) < grace_ms {
            pruned.kept += 1;
            continue;
        }
        if !dry_run && let Err(e) = std::fs::remove_file(entry.path()) {
            tracing::warn!(file = %entry.path().display(), error = %e, "could not remove a compiled entry");
            continue;
        }
        pruned.removed.push(name);
        pruned.bytes += meta.len();
    }
    pruned
}

/// Writes atomically: a reader sees the old entry, no entry, or the new one.
fn write_cached(path: &Path, artifact: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".{}.{}.tmp", std::process::id(), next_suffix()));
    let mut data = Vec::with_capacity(artifact.len() + TRAILER);
    data.extend_from_slice(artifact);
    data.extend_from_slice(&Sha256::digest(artifact));
    std::fs::write(&tmp, &data)?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// A per-call suffix so concurrent writers in one process never share a temp file.
fn next_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}
