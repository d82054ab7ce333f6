//! The component runtime: one engine per process, each plugin compiled once
//! (and cached across runs), linked once into an `InstancePre`, and run in a
//! fresh store per invocation under its limits.
//!
//! Loading a plugin, in order: read the bytes; check the sha256 pin; list the
//! imports and refuse any outside the allowlist (all of them, by name);
//! compile (or load the cached artifact); link; call `describe` in a sandbox;
//! check every tool spec and compile its schemas.

pub mod bindings;
pub mod compile;
pub mod engine;
mod footprint;
mod inert_fs;
mod invoke;
pub mod limits;
mod plugin;
mod reconcile;
mod sandbox;
pub mod state;
pub mod wasi;

pub use engine::Allocator;
pub use footprint::Footprint;
pub use plugin::{Effect, ToolInfo};

use crate::config::{ComponentSource, Config, EngineConfig, PluginConfig};
use crate::error::{CallError, ErrorKind, LoadError};
use crate::guard::{Guard, Reconciler, RecoveryReport, ToolRules};
use crate::ledger::Ledger;
use bindings::{Plugin, PluginPre};
use plugin::LoadedPlugin;
use sha2::{Digest, Sha256};
use state::{CallContext, HostState, PluginContext};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use sandbox::{Core, Slot};
use wasmtime::component::{HasSelf, Linker};

/// One tool call as a caller makes it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct CallRequest {
    /// The agent session (conversation) the call belongs to.
    pub session: String,
    /// The model's tool-call id.
    pub call_id: String,
    /// The tool to run.
    pub tool: String,
    /// The arguments, as JSON text.
    pub args_json: String,
    /// Who made it, when the client authenticated (an MCP token's
    /// principal); the budgets per principal count by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
}

/// The longest tool-call id a caller may send, and the longest session
/// id (a principal's namespace may add up to 65 bytes to the latter), in bytes.
pub const MAX_ID_BYTES: usize = 256;

/// Checks an id a caller sent: 1–[`MAX_ID_BYTES`] bytes, no control
/// characters and no bidirectional overrides (ids are keys, log fields and
/// table cells; none of them may steer a terminal).
///
/// # Errors
/// What is wrong with it, naming `what` it is.
pub fn check_id(what: &str, id: &str) -> Result<(), String> {
    check_id_within(what, id, MAX_ID_BYTES)
}

fn check_id_within(what: &str, id: &str, max: usize) -> Result<(), String> {
    if id.is_empty() || id.len() > max {
        return Err(format!("the {what} must be 1–{max} bytes long (it is {})", id.len()));
    }
    if id.chars().any(|c| c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')) {
        return Err(format!("the {what} contains a control character or a bidirectional override; use printable text"));
    }
    Ok(())
}

/// A tool call's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct CallOutput {
    /// The tool's JSON result.
    pub value: serde_json::Value,
    /// True when this is the stored result of an earlier, completed call
    /// with the same session, call id and arguments: no plugin ran.
    pub replayed: bool,
}

/// Loaded plugins and the means to run their tools.
pub struct Runtime {
    core: Arc<Core>,
    linker: Linker<HostState>,
    compile_cache: PathBuf,
    plugins: Vec<Arc<LoadedPlugin>>,
    /// Tool name → (index into `plugins`, tool).
    tools: BTreeMap<String, (usize, ToolInfo)>,
    /// What the start-up recovery pass did, if one ran.
    recovery: Option<RecoveryReport>,
    /// Bench only ([`Runtime::unguarded_for_bench`]): `send` goes straight to HTTP.
    unguarded: bool,
}

/// Why a runtime could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// wasmtime refused the engine configuration.
    #[error("cannot set up the WebAssembly engine: {0}")]
    Engine(String),
    /// The ledger could not be opened or the guard set up.
    #[error("{0}")]
    Guard(String),
    /// Another process holds the (embedded) ledger now; retry, or hand the
    /// call to that process ([`crate::local`]).
    #[error("{0}")]
    LedgerBusy(String),
    /// One or more plugins were refused; every refusal is listed.
    #[error("{} plugin(s) refused:\n{}", .0.len(), .0.iter().map(|e| format!("  - {e}")).collect::<Vec<_>>().join("\n"))]
    Plugins(Vec<LoadError>),
}

impl Runtime {
    /// An empty runtime: the engine, its least-privilege linker, no plugins.
    ///
    /// # Errors
    /// wasmtime refuses the engine configuration.
    pub fn new(engine_config: &EngineConfig, compile_cache: PathBuf) -> Result<Self, StartError> {
        let (engine, allocator) = engine::build(engine_config).map_err(|e| StartError::Engine(format!("{e:#}")))?;
        let mut linker = Linker::new(&engine);
        wasi::add_to_linker(&mut linker).map_err(|e| StartError::Engine(format!("{e:#}")))?;
        Plugin::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |s| s)
            .map_err(|e| StartError::Engine(format!("{e:#}")))?;
        let core = Core {
            engine,
            allocator,
            room: engine_config.component_room(),
            slots: tokio::sync::Semaphore::new(engine_config.pool_instances as usize),
            reconcile_slots: tokio::sync::Semaphore::new(sandbox::RECONCILE_SLOTS as usize),
            sandboxes: AtomicU64::new(0),
            guard: std::sync::OnceLock::new(),
        };
        Ok(Self { core: Arc::new(core), linker, compile_cache, plugins: Vec::new(), tools: BTreeMap::new(), recovery: None, unguarded: false })
    }

    /// Routes sends through `guard` (and records tool calls in its ledger).
    /// Set it once, before serving; a second guard is ignored.
    pub fn set_guard(&mut self, guard: Guard) {
        if self.core.guard.set(Arc::new(guard)).is_err() {
            tracing::warn!("a guard was already set; keeping the first");
        }
    }

    /// The guard, if one is set.
    pub fn guard(&self) -> Option<&Arc<Guard>> {
        self.core.guard.get()
    }

    /// The same runtime with its guard bypassed, for `toolguard bench`'s
    /// baseline only: irreversible calls are neither admitted nor recorded,
    /// and `send` goes straight to HTTP under the plugin's grants — no key,
    /// no ledger. Crate-private and set by no configuration: a served or
    /// embedded host can never run this way.
    pub(crate) fn unguarded_for_bench(mut self) -> Self {
        self.unguarded = true;
        self
    }

    /// Resolves every attempt left pending or unknown (see
    /// [`crate::guard::recover`]). Run it before serving.
    ///
    /// # Errors
    /// There is no guard, or the ledger cannot be read.
    pub async fn recover(&self) -> Result<RecoveryReport, String> {
        let guard = self.guard().ok_or("no guard is set, so there is no ledger to recover")?;
        let rules_for = |tool: &str| -> Option<ToolRules> {
            let (index, _) = self.tools.get(tool)?;
            let plugin = &self.plugins[*index];
            let reconciler = reconcile::PluginReconciler::for_plugin(&self.core, plugin).map(|r| Arc::new(r) as Arc<dyn Reconciler>);
            Some(ToolRules { grants: plugin.ctx.grants.clone(), reconciler })
        };
        guard.recover(&rules_for).await.map_err(|e| e.to_string())
    }

    /// Records each plugin's digest and effective grants in the ledger's
    /// grant history (only what changed since its last entry).
    async fn record_grants(&self, config: &Config) -> Result<(), String> {
        let Some(guard) = self.guard() else { return Ok(()) };
        let digests = self.plugin_digests();
        let now = crate::ledger::records::now_ms();
        let records: Vec<crate::ledger::GrantRecord> = config
            .plugins
            .iter()
            .map(|p| {
                let tools: Vec<&ToolInfo> = self.tools().filter(|t| t.plugin == p.name).collect();
                crate::ledger::GrantRecord {
                    plugin: p.name.clone(),
                    digest: digests.get(&p.name).cloned().unwrap_or_default(),
                    grants: crate::audit::effective_grants(p, &tools, &config.downstreams),
                    recorded_ms: now,
                }
            })
            .collect();
        let ledger = guard.ledger().clone();
        tokio::task::spawn_blocking(move || records.iter().try_for_each(|r| ledger.record_grants(r).map(|_| ())))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())
    }

    /// What the start-up recovery pass of [`Runtime::from_config`] did.
    pub fn recovery(&self) -> Option<&RecoveryReport> {
        self.recovery.as_ref()
    }

    /// A runtime with every plugin of `config` loaded.
    ///
    /// # Errors
    /// The engine cannot be set up, or any plugin is refused (all refusals are listed).
    pub async fn from_config(config: &Config) -> Result<Self, StartError> {
        let engine = config.engine.fitted_to(footprint_of(&config.plugins));
        let mut runtime = Self::new(&engine, config.compile_cache.clone())?;
        let location = config.ledger.clone();
        let ledger = tokio::task::spawn_blocking(move || Ledger::open_at(&location, false))
            .await
            .map_err(|e| StartError::Guard(e.to_string()))?
            .map_err(|e| if e.is_busy() { StartError::LedgerBusy(e.to_string()) } else { StartError::Guard(e.to_string()) })?;
        runtime.set_guard(Guard::new(ledger, config.downstreams.clone()).map_err(StartError::Guard)?);
        let mut refused = Vec::new();
        for plugin in &config.plugins {
            if let Err(e) = runtime.add_plugin(plugin).await {
                refused.push(e);
            }
        }
        if !refused.is_empty() {
            return Err(StartError::Plugins(refused));
        }
        runtime.record_grants(config).await.map_err(StartError::Guard)?;
        // Every unsettled attempt is resolved before any new work proceeds.
        runtime.recovery = Some(runtime.recover().await.map_err(StartError::Guard)?);
        Ok(runtime)
    }

    /// Loads one plugin. A refused plugin leaves the runtime as it was.
    ///
    /// # Errors
    /// Why the plugin was refused; see [`LoadError`].
    pub async fn add_plugin(&mut self, config: &PluginConfig) -> Result<(), LoadError> {
        let name = config.name.clone();
        let bytes = read_component(config)?;
        let digest = hex::encode(Sha256::digest(&bytes));
        if let Some(expected) = &config.policy.sha256
            && *expected != digest
        {
            return Err(LoadError::DigestMismatch { plugin: name, expected: expected.clone(), actual: digest });
        }
        match crate::imports::forbidden_imports(&bytes) {
            Err(reason) => return Err(LoadError::NotAComponent { plugin: name, reason }),
            Ok(imports) if !imports.is_empty() => return Err(LoadError::ForbiddenImports { plugin: name, imports }),
            Ok(_) => {}
        }
        let denied: Vec<String> = crate::imports::component_imports(&bytes)
            .unwrap_or_default()
            .into_iter()
            .chain(crate::seal::record_of(&bytes).map(|r| r.sealed).unwrap_or_default())
            .filter(|i| config.policy.denies_import(i).is_some())
            .collect();
        if !denied.is_empty() {
            return Err(LoadError::DeniedImports { plugin: name, imports: denied });
        }
        let footprint = Footprint::of(&bytes).map_err(|reason| LoadError::NotAComponent { plugin: name.clone(), reason })?;
        if self.core.allocator == Allocator::Pooling {
            check_room(&name, footprint, self.core.room)?;
        }
        let link_error = |e: String| LoadError::Link { plugin: config.name.clone(), reason: with_hint(e) };
        let (engine, cache, hash) = (self.core.engine.clone(), self.compile_cache.clone(), digest.clone());
        let component = tokio::task::spawn_blocking(move || compile::load(&engine, &bytes, &hash, &cache))
            .await
            .map_err(|e| link_error(e.to_string()))?
            .map_err(|e| link_error(format!("{e:#}")))?;
        let pre = self.linker.instantiate_pre(&component).map_err(|e| link_error(format!("{e:#}")))?;
        let pre = PluginPre::new(pre).map_err(|e| link_error(format!("{e:#}")))?;
        let reconcile = reconcile::find_export(&component);
        let ctx = Arc::new(PluginContext {
            name: name.as_str().into(),
            tool_prefix: config.tool_prefix.as_str().into(),
            settings: config.settings.clone(),
            limits: config.limits,
            footprint,
            grants: config.policy.grants.clone().into(),
            max_sends_per_call: config.policy.max_sends_per_call,
            max_irreversible_calls_per_session_hour: config.policy.max_irreversible_calls_per_session_hour,
            max_irreversible_calls_per_principal_hour: config.policy.max_irreversible_calls_per_principal_hour,
        });
        let loaded = Arc::new(LoadedPlugin { ctx, digest, pre, reconcile });

        // One sandbox: describe, and check the reconcile export's type if there is one.
        let (specs, _) = self
            .core
            .sandboxed(&loaded, CallContext::default(), None, Slot::Invoke, move |store, instance| {
                Box::pin(async move {
                    if let Some(func) = &reconcile {
                        reconcile::typed(store, &instance, func)
                            .map_err(|e| wasmtime::Error::msg(format!("its {} export has the wrong type: {e}", reconcile::RECONCILER_INTERFACE)))?;
                    }
                    Plugin::new(&mut *store, &instance)?.toolguard_plugin_tool().call_describe(store).await
                })
            })
            .await;
        let specs = specs.map_err(|f| LoadError::Describe { plugin: name.clone(), reason: f.to_string() })?;
        let tools = plugin::check_specs(&name, &config.tool_prefix, specs, &config.policy.tools)?;
        for tool in &tools {
            if let Some((other, _)) = self.tools.get(&tool.name) {
                let first = self.plugins[*other].ctx.name.to_string();
                return Err(LoadError::DuplicateTool { tool: tool.name.clone(), first, second: name });
            }
        }
        let index = self.plugins.len();
        self.plugins.push(loaded);
        self.tools.extend(tools.into_iter().map(|t| (t.name.clone(), (index, t))));
        tracing::debug!(plugin = %name, "loaded");
        Ok(())
    }

    /// Runs one tool call. Arguments are checked before any instance exists;
    /// with a guard, a completed call is replayed and a changed one refused.
    ///
    /// # Errors
    /// Why the call failed, as a [`CallError`] with a stable kind.
    ///
    /// Runs in a `tool_call` span (tool, session, call id; then the outcome
    /// and latency); each send's `attempt` span is its child.
    pub async fn call(&self, request: &CallRequest) -> Result<CallOutput, CallError> {
        use tracing::Instrument as _;
        let span = tracing::info_span!("tool_call", tool = %request.tool, session = %request.session, call_id = %request.call_id,
            outcome = tracing::field::Empty, latency_ms = tracing::field::Empty);
        let started = std::time::Instant::now();
        let ids = check_id("tool-call id", &request.call_id).and_then(|()| check_id_within("session id", &request.session, MAX_ID_BYTES + 65));
        if let Err(why) = ids {
            return Err(CallError::new(ErrorKind::InvalidArgs, format!("{why}; nothing was run")));
        }
        // A panic while running one call (a bug in the host, reachable from some
        // plugin or client input) fails that call; the host goes on serving.
        let running = std::panic::AssertUnwindSafe(self.invoke(request).instrument(span.clone()));
        let result = match futures_util::FutureExt::catch_unwind(running).await {
            Ok(result) => result,
            Err(panic) => {
                let why = crate::guard::panic_message(panic.as_ref());
                tracing::error!(call_id = %request.call_id, tool = %request.tool, %why, "the host failed while running a tool call");
                Err(CallError::new(
                    ErrorKind::Internal,
                    format!(
                        "the host failed while running this call ({why}); it was stopped and the host goes on serving. Anything it \
                         sent is resolved with its own key, or left for an operator. Retrying the same tool-call id is safe"
                    ),
                ))
            }
        };
        let outcome = match &result {
            Ok(out) if out.replayed => "replayed",
            Ok(_) => "ok",
            Err(e) => e.kind.as_str(),
        };
        span.record("outcome", outcome);
        span.record("latency_ms", started.elapsed().as_secs_f64() * 1e3);
        crate::metrics::tool_call(&request.tool, outcome);
        result
    }

    /// Every tool, in name order.
    pub fn tools(&self) -> impl Iterator<Item = &ToolInfo> {
        self.tools.values().map(|(_, t)| t)
    }

    /// The sha256 (hex) of each loaded plugin's component, by plugin name.
    pub fn plugin_digests(&self) -> BTreeMap<String, String> {
        self.plugins.iter().map(|p| (p.ctx.name.to_string(), p.digest.clone())).collect()
    }

    /// How many sandboxes (stores) have been created, `describe` included.
    pub fn sandboxes_created(&self) -> u64 {
        self.core.sandboxes.load(Ordering::Relaxed)
    }

    /// How the engine allocates instances.
    pub fn allocator(&self) -> Allocator {
        self.core.allocator
    }

    /// Whether `plugin` has any outbound grant (reaches beyond the host).
    pub fn has_grants(&self, plugin: &str) -> bool {
        self.plugins.iter().any(|p| &*p.ctx.name == plugin && !p.ctx.grants.is_empty())
    }

    /// Whether `plugin` exports `reconcile`.
    pub fn can_reconcile(&self, plugin: &str) -> bool {
        self.plugins.iter().any(|p| &*p.ctx.name == plugin && p.reconcile.is_some())
    }
}

/// A link or compile error, with what to do when the cause is a known toolchain setting.
fn with_hint(reason: String) -> String {
    if reason.contains("component model async") {
        // wasmtime is built without component-model-async (README: crates).
        format!("{reason}. The component uses the component model's async ABI, which toolguard does not enable: build it synchronous (componentize-qjs --sync; wit-bindgen without async exports)")
    } else {
        reason
    }
}

/// The most any of `plugins` takes from the pool (unreadable ones count as
/// nothing here; loading them reports why).
pub fn footprint_of(plugins: &[PluginConfig]) -> Footprint {
    plugins
        .iter()
        .filter_map(|p| read_component(p).ok())
        .filter_map(|bytes| Footprint::of(&bytes).ok())
        .fold(Footprint::default(), Footprint::max)
}

/// Refuses a component the pool has no room for, naming the setting to raise.
fn check_room(plugin: &str, need: Footprint, room: Footprint) -> Result<(), LoadError> {
    let over = [
        (need.core_instances, room.core_instances, "core instances", "component_core_instances"),
        (need.memories, room.memories, "linear memories", "component_memories"),
        (need.tables, room.tables, "tables", "component_tables"),
    ];
    match over.into_iter().find(|(need, room, _, _)| need > room) {
        None => Ok(()),
        Some((need, room, what, setting)) => Err(LoadError::TooBig {
            plugin: plugin.into(),
            reason: format!(
                "it needs {need} {what} per instance and the instance pool holds {room} per component; \
                 set [engine] {setting} = {need} (a host started from its config sizes the pool to its plugins)"
            ),
        }),
    }
}

fn read_component(config: &PluginConfig) -> Result<Vec<u8>, LoadError> {
    match &config.component {
        ComponentSource::Builtin(b) => crate::builtin::component(b).map(<[u8]>::to_vec).ok_or_else(|| LoadError::Read {
            plugin: config.name.clone(),
            path: format!("builtin:{b}"),
            reason: "no such builtin plugin".into(),
        }),
        ComponentSource::File(path) => std::fs::read(path).map_err(|e| LoadError::Read {
            plugin: config.name.clone(),
            path: path.display().to_string(),
            reason: e.to_string(),
        }),
    }
}
