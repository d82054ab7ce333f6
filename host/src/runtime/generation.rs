//! A runtime's next generation, for a reload while serving: the same
//! engine, instance pool, linker and guard (so the same ledger), with the
//! plugins, policy and downstreams of a new configuration — every one of
//! them read, pinned or verified, import-checked, fitted, compiled and
//! described before the generation exists. Also which tool calls are
//! running now, in any generation, for the checks a reload makes first.

use super::{Runtime, StartError};
use crate::config::Config;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// A tool call running now: its tool, session and tool-call id.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct RunningCall {
    /// The tool it runs.
    pub tool: String,
    /// Its session.
    pub session: String,
    /// Its tool-call id.
    pub call_id: String,
}

/// The calls running now across a runtime's generations.
#[derive(Default)]
pub(crate) struct Running {
    next: AtomicU64,
    calls: std::sync::Mutex<HashMap<u64, RunningCall>>,
}

/// A call's entry in [`Running`], removed when dropped.
pub(crate) struct Entered<'a> {
    running: &'a Running,
    id: u64,
}

impl Running {
    /// Notes `call` as running until the returned entry is dropped.
    pub(crate) fn enter(&self, call: RunningCall) -> Entered<'_> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.calls.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(id, call);
        Entered { running: self, id }
    }

    fn all(&self) -> Vec<RunningCall> {
        let mut calls: Vec<RunningCall> = self.calls.lock().unwrap_or_else(std::sync::PoisonError::into_inner).values().cloned().collect();
        calls.sort();
        calls
    }
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        self.running.calls.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&self.id);
    }
}

impl Runtime {
    /// The runtime of `config` sharing this one's engine, pool and guard:
    /// what a reload swaps in. Nothing of this runtime changes; a refused
    /// plugin refuses the whole generation (every refusal listed), and so
    /// does one whose registry cannot be reached (the running one keeps it).
    ///
    /// # Errors
    /// A credential cannot be read, or any plugin is refused.
    pub async fn next_generation(&self, config: &Config) -> Result<Runtime, StartError> {
        let sources = super::source::Sources::of(config);
        let mut components = Vec::with_capacity(config.plugins.len());
        for plugin in &config.plugins {
            components.push(sources.read(plugin).await);
        }
        let wires = crate::guard::Wires::new(&config.downstreams).map_err(StartError::Guard)?;
        let mut next = Runtime {
            core: self.core.clone(),
            linker: self.linker.clone(),
            compile_cache: self.compile_cache.clone(),
            plugins: Vec::new(),
            tools: std::collections::BTreeMap::new(),
            recovery: None,
            downstreams: config.downstreams.clone(),
            wires: Arc::new(wires),
            #[cfg(feature = "bench")]
            unguarded: self.unguarded,
            receipts: self.receipts.clone(),
            unavailable: Vec::new(),
        };
        next.add_components(config, components, false).await?;
        Ok(next)
    }

    /// The tool calls running now, in this generation or an earlier one.
    pub fn running_calls(&self) -> Vec<RunningCall> {
        self.core.running.all()
    }

    /// The tool named `name`, if this generation serves it.
    pub fn tool(&self, name: &str) -> Option<&super::ToolInfo> {
        self.tools.get(name).map(|(_, t)| t)
    }

    /// The effective policy digest of each plugin, by name.
    pub fn policy_digests(&self) -> std::collections::BTreeMap<String, String> {
        self.plugins.iter().map(|p| (p.ctx.name.to_string(), p.policy_digest.clone())).collect()
    }

    /// Publishes which component and policy each plugin is served with
    /// (`toolguard_component_info`) and its tools' spending limits
    /// (`toolguard_limit_max`), replacing what an earlier generation published.
    pub fn publish(&self, config: &Config) {
        crate::metrics::components_cleared();
        for p in &self.plugins {
            let source = config.plugins.iter().find(|c| *c.name == *p.ctx.name).map(|c| c.component.to_string()).unwrap_or_default();
            let provenance = p.provenance.as_ref();
            crate::metrics::component(crate::metrics::ComponentInfo {
                plugin: &p.ctx.name,
                sha256: &p.digest,
                source: &source,
                manifest: provenance.map(|v| v.manifest_digest.as_str()),
                signer: provenance.and_then(|v| v.signer.as_ref()).map(|s| s.fingerprint.as_str()),
                policy: &p.policy_digest,
            });
        }
        for (_, tool) in self.tools.values() {
            for (i, limit) in tool.limits.iter().enumerate() {
                crate::metrics::limit(&tool.plugin, &tool.name, i, limit.max);
            }
        }
    }

    /// Notes in the ledger what this host serves in this generation
    /// (`toolguard ledger stats` shows a fleet's hosts side by side).
    ///
    /// # Errors
    /// The ledger cannot be written.
    pub async fn note_serving(&self, generation: u64) -> Result<(), String> {
        let Some(guard) = self.guard() else { return Ok(()) };
        let plugins = self
            .plugins
            .iter()
            .map(|p| (p.ctx.name.to_string(), crate::ledger::ServedPlugin { sha256: p.digest.clone(), policy_digest: p.policy_digest.clone() }))
            .collect();
        let record = crate::ledger::ServingRecord { host: guard.host().to_string(), generation, plugins, seen_ms: crate::ledger::records::now_ms() };
        let ledger = guard.ledger().clone();
        tokio::task::spawn_blocking(move || ledger.note_serving(&record)).await.map_err(|e| e.to_string())?.map_err(|e| e.to_string())
    }

    /// Records each plugin's digest and effective policy in the ledger's
    /// grant history (only what changed since its last entry): after a
    /// start, and after a reload swapped this generation in.
    ///
    /// # Errors
    /// The ledger cannot be written.
    pub async fn record_grants(&self) -> Result<(), String> {
        let Some(guard) = self.guard() else { return Ok(()) };
        let now = crate::ledger::records::now_ms();
        let records: Vec<crate::ledger::GrantRecord> = self
            .plugins
            .iter()
            .map(|p| crate::ledger::GrantRecord { plugin: p.ctx.name.to_string(), digest: p.digest.clone(), grants: p.policy.to_record(), recorded_ms: now })
            .collect();
        let ledger = guard.ledger().clone();
        tokio::task::spawn_blocking(move || records.iter().try_for_each(|r| ledger.record_grants(r).map(|_| ())))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())
    }
}
