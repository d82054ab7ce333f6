//! The per-invocation store state: a fresh one for every tool invocation,
//! dropped with its store when the invocation ends.

use super::limits::{Limits, MemoryLimiter};
use crate::guard::CallGuard;
use crate::policy::Grant;
use super::wasi::{self, PluginLog};
use std::collections::BTreeMap;
use std::sync::Arc;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

/// What one plugin's invocations share: its name, settings and limits.
#[derive(Debug)]
pub struct PluginContext {
    /// The plugin's configured name.
    pub name: Arc<str>,
    /// Prepended to its tools' names as served.
    pub tool_prefix: Arc<str>,
    /// Non-secret settings served by `outbound.config`.
    pub settings: BTreeMap<String, String>,
    /// The limits each invocation runs under.
    pub limits: Limits,
    /// What one instance of it takes: its store may create that much, no more.
    pub footprint: super::Footprint,
    /// What `outbound` may reach.
    pub grants: Arc<[Grant]>,
    /// Sends one tool call may make.
    pub max_sends_per_call: u32,
    /// Calls of its irreversible tools one session may make per hour.
    pub max_irreversible_calls_per_session_hour: Option<u32>,
    /// Calls of its irreversible tools one authenticated principal may make per hour.
    pub max_irreversible_calls_per_principal_hour: Option<u32>,
}

/// Who is calling: the ids the guard scopes its keys to.
#[derive(Debug, Clone, Default)]
pub struct CallContext {
    /// The agent session (conversation).
    pub session: String,
    /// The model's tool-call id.
    pub call_id: String,
    /// The tool being invoked.
    pub tool: String,
    /// Whether the tool is read-only: it runs without the guard's records
    /// and its `send` is denied.
    pub read_only: bool,
    /// `toolguard bench`'s baseline only: `send` bypasses the guard
    /// ([`crate::Runtime`]'s crate-private `unguarded_for_bench`).
    pub(crate) unguarded: bool,
}

/// The state of one store: WASI context, limits and the call it serves.
pub struct HostState {
    wasi: WasiCtx,
    table: ResourceTable,
    /// Enforces the memory cap.
    pub limiter: MemoryLimiter,
    /// The plugin this invocation runs.
    pub plugin: Arc<PluginContext>,
    /// The call this invocation serves (empty for `describe`).
    pub call: CallContext,
    /// The guard's state for this tool call (`None`: no guard, or `describe`).
    pub call_guard: Option<CallGuard>,
    /// The guard, for fetches made without a tool call guard.
    pub guard: Option<Arc<crate::guard::Guard>>,
    /// Outbound calls made so far.
    pub outbound_calls: u32,
    /// Epoch ticks of guest execution so far.
    pub cpu_ticks: u64,
    /// The limit that stopped the invocation, if one did.
    pub limit_hit: Option<String>,
    stdout: PluginLog,
    stderr: PluginLog,
}

impl HostState {
    /// A fresh state for one invocation of `plugin` serving `call`.
    pub fn new(plugin: Arc<PluginContext>, call: CallContext, call_guard: Option<CallGuard>, guard: Option<Arc<crate::guard::Guard>>) -> Self {
        let stdout = PluginLog::new(plugin.name.clone(), false);
        let stderr = PluginLog::new(plugin.name.clone(), true);
        Self {
            wasi: wasi::context(stdout.clone(), stderr.clone()),
            table: ResourceTable::new(),
            limiter: MemoryLimiter::new(plugin.limits.memory_bytes(), plugin.footprint),
            plugin,
            call,
            call_guard,
            guard,
            outbound_calls: 0,
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

    /// Records that `limit` stopped the invocation and returns the trap to raise.
    pub fn stop(&mut self, limit: String) -> wasmtime::Error {
        let error = wasmtime::Error::msg(limit.clone());
        self.limit_hit.get_or_insert(limit);
        error
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
