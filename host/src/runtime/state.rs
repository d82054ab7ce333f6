//! The per-invocation store state: a fresh one for every tool invocation,
//! dropped with its store when the invocation ends.

use super::context::PluginContext;
use super::limits::MemoryLimiter;
use super::outbound::{Outbound, OutboundView};
use super::wasi::{self, PluginLog};
use std::sync::Arc;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

/// The state of one store: WASI context, limits and the outbound capability.
pub struct HostState {
    wasi: WasiCtx,
    table: ResourceTable,
    /// Enforces the memory cap.
    pub limiter: MemoryLimiter,
    /// The plugin this invocation runs.
    pub plugin: Arc<PluginContext>,
    /// The plugin's only way out, and the call it serves.
    pub outbound: Outbound,
    /// Its questions to the call's client.
    pub asking: super::questions::Asking,
    /// Epoch ticks of guest execution so far.
    pub cpu_ticks: u64,
    /// The limit that stopped the invocation, if one did.
    pub limit_hit: Option<String>,
    stdout: PluginLog,
    stderr: PluginLog,
}

impl HostState {
    /// A fresh state for one invocation of `plugin`, reaching out through `outbound`.
    pub(crate) fn new(plugin: Arc<PluginContext>, outbound: Outbound, asking: super::questions::Asking) -> Self {
        let stdout = PluginLog::new(plugin.name.clone(), false);
        let stderr = PluginLog::new(plugin.name.clone(), true);
        Self {
            wasi: wasi::context(stdout.clone(), stderr.clone()),
            table: ResourceTable::new(),
            limiter: MemoryLimiter::new(plugin.limits.memory_bytes(), plugin.footprint),
            plugin,
            outbound,
            asking,
            cpu_ticks: 0,
            limit_hit: None,
            stdout,
            stderr,
        }
    }

    /// The last lines the plugin wrote to stderr (a panic message, typically).
    pub fn stderr_tail(&self) -> Option<String> {
        self.stderr.tail()
    }

    /// The limit that stopped the invocation, if one did (the host's own
    /// limits first, then the outbound budget).
    pub fn limit_hit(&self) -> Option<&String> {
        self.limit_hit.as_ref().or(self.outbound.limit_hit.as_ref())
    }
}

impl OutboundView for HostState {
    fn outbound(&mut self) -> &mut Outbound {
        &mut self.outbound
    }
}

impl super::questions::ClientView for HostState {
    fn asking(&mut self) -> &mut super::questions::Asking {
        &mut self.asking
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

impl Drop for HostState {
    fn drop(&mut self) {
        self.stdout.finish();
        self.stderr.finish();
    }
}
