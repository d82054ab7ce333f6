//! Changing tools and policy while serving (`docs/operations.md`). On
//! SIGHUP or `toolguard reload`, the configuration is read again and checked
//! whole — parse, pins and signatures, imports, footprints, compilation,
//! credentials, what MCP clients may present — and a change that fails any
//! check, needs a restart ([`crate::config::RestartOnly`], each section's own), or would change
//! the identity of an action still unresolved ([`changes::identity`]) is
//! refused whole: the running generation keeps serving. A valid change is
//! swapped in at once. A call holds the generation that admitted it until
//! it ends, so calls admitted before the swap finish under the policy that
//! admitted them and calls after it run under the new one; each attempt
//! records which (its policy digest).

mod changes;

use crate::config::{Config, RestartOnly};
use crate::runtime::Runtime;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

/// What serves now: the current generation and its configuration, swapped
/// whole by [`Live::reload`].
pub struct Live {
    current: RwLock<(Arc<Runtime>, Option<Arc<Config>>)>,
    /// The config file a reload reads (none: the runtime is fixed).
    path: Option<PathBuf>,
    /// One reload at a time.
    reloading: tokio::sync::Mutex<()>,
    /// What else serves from the generation (the MCP tool list, the tokens).
    followers: Mutex<Vec<Arc<dyn Follower>>>,
    /// 1 at start; one more per reload swapped in.
    generation: AtomicU64,
}

/// Something serving from the current generation that must follow a reload
/// (the MCP face's tool list and its accepted tokens).
pub trait Follower: Send + Sync {
    /// Readies what it serves from `next`, or says why it cannot (the
    /// reload is then refused); the returned step runs once `next` is in.
    ///
    /// # Errors
    /// Why `next` cannot be served (a token variable unset, say).
    fn prepare(&self, next: &Next<'_>) -> Result<Commit, String>;
}

/// A follower's step once a reload is swapped in.
pub type Commit = Box<dyn FnOnce() + Send>;

/// A generation about to be swapped in, beside the one serving.
pub struct Next<'a> {
    /// Its configuration.
    pub config: &'a Config,
    /// Its runtime.
    pub runtime: &'a Arc<Runtime>,
    /// The generation serving now.
    pub previous: &'a Runtime,
}

/// What a reload did, as `toolguard reload` prints it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    /// The generation serving now (1 at start).
    pub generation: u64,
    /// Plugins new in it.
    pub added: Vec<String>,
    /// Plugins gone from it (their unsettled attempts are left for an operator).
    pub removed: Vec<String>,
    /// Plugins whose component or effective policy changed.
    pub changed: Vec<String>,
    /// Whether the tools clients see changed (they were told).
    pub tools_changed: bool,
    /// Each plugin's component sha256 and effective policy digest now.
    pub plugins: serde_json::Value,
    /// What an operator should know (unsettled calls of a removed tool).
    pub warnings: Vec<String>,
}

/// Why a reload was refused; the generation that served before still serves.
#[derive(Debug, Clone, thiserror::Error)]
#[error("reload refused, the running configuration keeps serving: {0}")]
pub struct Refused(pub String);

impl Live {
    /// The host serving `runtime`, loaded from the config file at `path`.
    pub fn new(runtime: Arc<Runtime>, config: Config, path: PathBuf) -> Arc<Self> {
        Self::serving(runtime, Some(Arc::new(config)), Some(path))
    }

    /// A host serving `runtime` of `config` until it exits, which no reload
    /// changes (a `toolguard call` holding the ledger for others).
    pub fn pinned(runtime: Arc<Runtime>, config: Config) -> Arc<Self> {
        Self::serving(runtime, Some(Arc::new(config)), None)
    }

    /// A host serving `runtime` as it is, which no reload changes (the
    /// demo's, the benchmarks').
    pub fn fixed(runtime: Arc<Runtime>) -> Arc<Self> {
        Self::serving(runtime, None, None)
    }

    fn serving(runtime: Arc<Runtime>, config: Option<Arc<Config>>, path: Option<PathBuf>) -> Arc<Self> {
        Arc::new(Self {
            current: RwLock::new((runtime, config)),
            path,
            reloading: tokio::sync::Mutex::new(()),
            followers: Mutex::new(Vec::new()),
            generation: AtomicU64::new(1),
        })
    }

    /// The generation serving now: a call takes it once and keeps it.
    pub fn runtime(&self) -> Arc<Runtime> {
        self.current.read().unwrap_or_else(PoisonError::into_inner).0.clone()
    }

    /// The configuration serving now (none for a fixed runtime).
    pub fn config(&self) -> Option<Arc<Config>> {
        self.current.read().unwrap_or_else(PoisonError::into_inner).1.clone()
    }

    /// How many generations have served (1 until a reload is swapped in).
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// Notes in the ledger what this host serves, now and every `every`
    /// (so a fleet's `ledger stats` sees it live), until the process ends.
    pub async fn note_serving_every(self: Arc<Self>, every: std::time::Duration) {
        loop {
            let generation = self.generation();
            if let Err(e) = self.runtime().note_serving(generation).await {
                tracing::warn!(error = %e, "cannot note in the ledger what this host serves");
            }
            tokio::time::sleep(every).await;
        }
    }

    /// Has `follower` follow every reload from now on.
    pub fn follow(&self, follower: Arc<dyn Follower>) {
        self.followers.lock().unwrap_or_else(PoisonError::into_inner).push(follower);
    }

    /// Reads the config file again and, if every check passes, swaps the
    /// new generation in (see the module docs).
    ///
    /// # Errors
    /// Why it was refused; nothing changed.
    pub async fn reload(&self) -> Result<Report, Refused> {
        let _one = self.reloading.lock().await;
        let (previous, old_config) = (self.runtime(), self.config());
        let (Some(old_config), Some(path)) = (old_config, self.path.clone()) else {
            return Err(Refused("this host serves a fixed set of tools, not a config file; restart it to change them".into()));
        };
        let config = tokio::task::spawn_blocking(move || Config::load(&path)).await.map_err(|e| Refused(e.to_string()))?.map_err(|e| Refused(e.to_string()))?;
        let restart = old_config.restart_only_changes(&config);
        if !restart.is_empty() {
            return Err(Refused(format!("{}; restart `toolguard serve` for these", restart.join("; "))));
        }
        let next = Arc::new(previous.next_generation(&config).await.map_err(|e| Refused(e.to_string()))?);
        changes::identity(&old_config, &config, &previous, &next).await.map_err(Refused)?;
        let followers: Vec<Arc<dyn Follower>> = self.followers.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let view = Next { config: &config, runtime: &next, previous: &previous };
        let commits = followers.iter().map(|f| f.prepare(&view)).collect::<Result<Vec<Commit>, String>>().map_err(Refused)?;
        next.record_grants().await.map_err(|e| Refused(format!("cannot record the new grants in the ledger: {e}")))?;
        let warnings = changes::left_behind(&previous, &next).await;
        let report = Report { warnings, ..self.report(&previous, &next) };
        next.publish(&config);
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = (next, Some(Arc::new(config)));
        let generation = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
        for commit in commits {
            commit();
        }
        let report = Report { generation, ..report };
        if let Err(e) = self.runtime().note_serving(generation).await {
            tracing::warn!(error = %e, "cannot note in the ledger what this host serves now");
        }
        tracing::info!(generation, added = ?report.added, removed = ?report.removed, changed = ?report.changed, "reloaded");
        for warning in &report.warnings {
            tracing::warn!("{warning}");
        }
        Ok(report)
    }

    /// What swapping `next` in for `previous` changes.
    fn report(&self, previous: &Runtime, next: &Runtime) -> Report {
        let (before, after) = (previous.info()["plugins"].clone(), next.info()["plugins"].clone());
        let names = |v: &serde_json::Value| v.as_object().map(|m| m.keys().cloned().collect::<Vec<_>>()).unwrap_or_default();
        let (old, new) = (names(&before), names(&after));
        let added = new.iter().filter(|n| !old.contains(n)).cloned().collect();
        let removed: Vec<String> = old.iter().filter(|n| !new.contains(n)).cloned().collect();
        let changed = new.iter().filter(|n| old.contains(n) && before[n.as_str()] != after[n.as_str()]).cloned().collect();
        let tools_changed = changes::tools_changed(previous, next);
        Report { generation: self.generation(), added, removed, changed, tools_changed, plugins: after, warnings: Vec::new() }
    }
}
