//! The sandbox of one invocation: a fresh store per call (a trap poisons an
//! instance), the invocation's limits armed, and every way it can end turned
//! into a [`Fault`]. [`Core`] is what every sandbox needs, shared (via `Arc`)
//! with reconcilers that run while an invocation waits in a send.

use super::engine::Allocator;
use super::outbound::{Mode, Outbound};
use super::plugin::LoadedPlugin;
use super::state::HostState;
use crate::error::{CallError, ErrorKind};
use crate::guard::{CallGuard, Guard};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use wasmtime::component::Instance;
use wasmtime::{Engine, Store, Trap, UpdateDeadline};

/// The guest-side part of a sandboxed run, given the store and a fresh instance.
pub(crate) type GuestCall<'a, R> = Pin<Box<dyn Future<Output = wasmtime::Result<R>> + Send + 'a>>;

/// Why an invocation stopped before the guest returned.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Fault {
    /// A limit stopped it (CPU, wall clock, memory, stack, outbound calls).
    Limit(String),
    /// It asked the client a round of questions not answered yet.
    Asked(Box<super::questions::journal::Pending>),
    /// The guest trapped.
    Trap(String),
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Limit(m) | Self::Trap(m) => f.write_str(m),
            Self::Asked(p) => write!(f, "waiting for the client to answer {} question(s)", p.questions.len()),
        }
    }
}

impl From<Fault> for CallError {
    fn from(f: Fault) -> Self {
        match f {
            Fault::Limit(m) => CallError::new(ErrorKind::LimitExceeded, m),
            Fault::Trap(m) => CallError::new(ErrorKind::PluginTrap, m),
            Fault::Asked(pending) => {
                let keys: Vec<&str> = pending.questions.iter().map(|q| q.key.as_str()).collect();
                let message = format!(
                    "the tool asks its client {} before it goes on ({}); nothing after the questions has run. Answer them and call \
                     again with the answers, under the same tool-call id",
                    if keys.len() == 1 { "a question" } else { "questions" },
                    keys.join(", ")
                );
                CallError::new(ErrorKind::InputRequired, message).with_detail(serde_json::json!({ "asked": pending }))
            }
        }
    }
}

/// Which pool of slots a sandbox takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slot {
    /// A tool invocation or `describe`.
    Invoke,
    /// A reconciliation (runs while an invocation waits).
    Reconcile,
}

/// What every sandbox needs: the engine, the slots, the guard.
pub(crate) struct Core {
    pub engine: Engine,
    pub allocator: Allocator,
    /// What one component may take from the pool (only binding when pooling).
    pub room: super::Footprint,
    /// Bounds concurrent invocations to what the instance pool holds.
    pub slots: tokio::sync::Semaphore,
    /// Bounds concurrent reconciliations to their reserve.
    pub reconcile_slots: tokio::sync::Semaphore,
    /// Stores (sandboxes) created so far.
    pub sandboxes: AtomicU64,
    /// The guard for sends, set once before serving.
    pub guard: OnceLock<Arc<Guard>>,
    /// The tool calls running now, in every generation.
    pub running: super::generation::Running,
}

impl Core {
    /// Runs `body` against a fresh instance of `plugin` in a fresh store,
    /// under the plugin's limits, its `send` as `mode` allows, its questions
    /// answered as `asking` can. The store is
    /// dropped when this returns; the call guard (if `mode` had one) is
    /// handed back for `Guard::finish`.
    pub(crate) async fn sandboxed<R>(
        &self,
        plugin: &LoadedPlugin,
        (mode, asking): (Mode, super::questions::Asking),
        slot: Slot,
        body: impl for<'a> FnOnce(&'a mut Store<HostState>, Instance) -> GuestCall<'a, R>,
    ) -> (Result<R, Fault>, Option<CallGuard>) {
        let slots = if slot == Slot::Invoke { &self.slots } else { &self.reconcile_slots };
        let _slot = slots.acquire().await.expect("the slot semaphores are never closed");
        let limits = plugin.ctx.limits;
        let mut store = self.new_store(plugin, mode, asking);
        let run = async {
            let started = std::time::Instant::now();
            let instance = plugin.pre.instance_pre().instantiate_async(&mut store).await?;
            crate::metrics::instantiated(started.elapsed());
            body(&mut store, instance).await
        };
        let outcome = tokio::time::timeout(Duration::from_millis(limits.wall_ms), run).await;
        let result = match outcome {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => Err(classify(&error, store.data())),
            Err(_elapsed) => {
                Err(Fault::Limit(format!("plugin `{}` did not finish within its wall-clock budget of {} ms (wall_ms)", plugin.ctx.name, limits.wall_ms)))
            }
        };
        (result, store.data_mut().outbound.take_call())
    }

    /// A fresh store for one invocation, its limiter and CPU budget armed.
    fn new_store(&self, plugin: &LoadedPlugin, mode: Mode, asking: super::questions::Asking) -> Store<HostState> {
        self.sandboxes.fetch_add(1, Ordering::Relaxed);
        let outbound = Outbound::new(plugin.ctx.clone(), self.guard.get().cloned(), mode);
        let state = HostState::new(plugin.ctx.clone(), outbound, asking);
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.limiter);
        let budget = plugin.ctx.limits.cpu_ticks();
        store.set_epoch_deadline(1);
        // Each tick of guest execution yields to tokio (so the wall-clock
        // timeout can cancel) and counts against the CPU budget.
        store.epoch_deadline_callback(move |mut cx| {
            let state = cx.data_mut();
            state.cpu_ticks += 1;
            if state.cpu_ticks < budget {
                return Ok(UpdateDeadline::Yield(1));
            }
            let (name, cpu_ms) = (state.plugin.name.clone(), state.plugin.limits.cpu_ms);
            state.limit_hit.get_or_insert(format!("plugin `{name}` used up its CPU budget of {cpu_ms} ms (cpu_ms)"));
            Ok(UpdateDeadline::Interrupt)
        });
        store
    }
}

/// Names the limit or trap behind `error`, preferring what the host itself recorded.
fn classify(error: &wasmtime::Error, state: &HostState) -> Fault {
    let plugin = &state.plugin.name;
    if let Some(pending) = &state.asking.pending {
        return Fault::Asked(Box::new(pending.clone()));
    }
    if let Some(limit) = state.limit_hit() {
        return Fault::Limit(limit.clone());
    }
    if let Some(wanted) = state.limiter.refused {
        return Fault::Limit(format!(
            "plugin `{plugin}` tried to grow its memory to {} MiB, over its limit of {} MiB (memory_mb)",
            wanted.div_ceil(1 << 20),
            state.plugin.limits.memory_mb
        ));
    }
    let stderr = state.stderr_tail().map(|l| format!(" (its stderr: {l})")).unwrap_or_default();
    match error.downcast_ref::<Trap>() {
        Some(Trap::StackOverflow) => Fault::Limit(format!("plugin `{plugin}` exhausted its call stack (runaway recursion?){stderr}")),
        Some(trap) => Fault::Trap(format!("plugin `{plugin}` trapped: {trap}{stderr}")),
        None => Fault::Trap(format!("plugin `{plugin}` failed: {error}{stderr}")),
    }
}
