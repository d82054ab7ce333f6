//! One sandboxed invocation: a fresh store per call (a trap poisons an
//! instance), the invocation's limits armed, and every way it can end turned
//! into a clear error.

use super::bindings::{Plugin, types};
use super::plugin::{LoadedPlugin, ToolInfo};
use super::state::{CallContext, HostState};
use super::{CallRequest, Runtime};
use crate::error::{CallError, ErrorKind};
use serde_json::{Value, json};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::time::Duration;
use wasmtime::{Store, Trap, UpdateDeadline};

/// The guest-side part of an invocation, given the store and a fresh instance.
pub(crate) type GuestCall<'a, R> = Pin<Box<dyn Future<Output = wasmtime::Result<R>> + Send + 'a>>;

/// Why an invocation stopped before the guest returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Fault {
    /// A limit stopped it (CPU, wall clock, memory, stack, outbound calls).
    Limit(String),
    /// The guest trapped.
    Trap(String),
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Limit(m) => write!(f, "limit exceeded: {m}"),
            Self::Trap(m) => write!(f, "trapped: {m}"),
        }
    }
}

impl From<Fault> for CallError {
    fn from(f: Fault) -> Self {
        match f {
            Fault::Limit(m) => CallError::new(ErrorKind::LimitExceeded, m),
            Fault::Trap(m) => CallError::new(ErrorKind::PluginTrap, m),
        }
    }
}

impl Runtime {
    /// Runs `body` against a fresh instance of `plugin` in a fresh store,
    /// under the plugin's limits. The store is dropped when this returns.
    pub(crate) async fn sandboxed<R>(
        &self,
        plugin: &LoadedPlugin,
        call: CallContext,
        body: impl for<'a> FnOnce(&'a mut Store<HostState>, Plugin) -> GuestCall<'a, R>,
    ) -> Result<R, Fault> {
        let _slot = self.slots.acquire().await.expect("the slot semaphore is never closed");
        let limits = plugin.ctx.limits;
        let mut store = self.new_store(plugin, call);
        let run = async {
            let instance = plugin.pre.instantiate_async(&mut store).await?;
            body(&mut store, instance).await
        };
        let outcome = tokio::time::timeout(Duration::from_millis(limits.wall_ms), run).await;
        match outcome {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => Err(classify(&error, store.data())),
            Err(_elapsed) => Err(Fault::Limit(format!(
                "plugin `{}` did not finish within its wall-clock budget of {} ms (wall_ms)",
                plugin.ctx.name, limits.wall_ms
            ))),
        }
    }

    /// A fresh store for one invocation, its limiter and CPU budget armed.
    fn new_store(&self, plugin: &LoadedPlugin, call: CallContext) -> Store<HostState> {
        self.sandboxes.fetch_add(1, Ordering::Relaxed);
        let mut store = Store::new(&self.engine, HostState::new(plugin.ctx.clone(), call));
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

    /// Invokes a tool: arguments checked before any instance exists, then
    /// one sandboxed run, then the result checked.
    pub(crate) async fn invoke(&self, req: &CallRequest) -> Result<Value, CallError> {
        let (index, tool) = self.tools.get(&req.tool).ok_or_else(|| unknown_tool(self, &req.tool))?;
        let plugin = &self.plugins[*index];
        let args = check_args(&req.args_json, plugin.ctx.limits.max_args_bytes, tool)?;
        let call = CallContext { session: req.session.clone(), call_id: req.call_id.clone(), tool: tool.name.clone() };
        let (name, args_text) = (tool.name.clone(), args.to_string());
        let returned = self
            .sandboxed(plugin, call, move |store, p| {
                Box::pin(async move { p.toolguard_plugin_tool().call_invoke(store, &name, &args_text).await })
            })
            .await?;
        match returned {
            Ok(text) => check_result(&text, plugin.ctx.limits.max_result_bytes, tool),
            Err(e) => Err(tool_error(e)),
        }
    }
}

/// Names the limit or trap behind `error`, preferring what the host itself recorded.
fn classify(error: &wasmtime::Error, state: &HostState) -> Fault {
    let plugin = &state.plugin.name;
    if let Some(limit) = &state.limit_hit {
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
        Some(Trap::StackOverflow) => {
            Fault::Limit(format!("plugin `{plugin}` exhausted its call stack (runaway recursion?){stderr}"))
        }
        Some(trap) => Fault::Trap(format!("plugin `{plugin}` trapped: {trap}{stderr}")),
        None => Fault::Trap(format!("plugin `{plugin}` failed: {error}{stderr}")),
    }
}

fn unknown_tool(rt: &Runtime, name: &str) -> CallError {
    let known: Vec<&str> = rt.tools.keys().map(String::as_str).take(20).collect();
    CallError::new(
        ErrorKind::UnknownTool,
        format!("no tool named `{name}`; available: {}", if known.is_empty() { "none".into() } else { known.join(", ") }),
    )
}

/// Size, syntax and schema of the arguments, checked before any instance exists.
fn check_args(text: &str, max: usize, tool: &ToolInfo) -> Result<Value, CallError> {
    let invalid = |m: String| CallError::new(ErrorKind::InvalidArgs, m);
    if text.len() > max {
        return Err(invalid(format!("the arguments are {} bytes, over the limit of {max} (max_args_bytes)", text.len())));
    }
    let args: Value = serde_json::from_str(text).map_err(|e| invalid(format!("the arguments are not valid JSON: {e}")))?;
    if !args.is_object() {
        return Err(invalid("the arguments must be a JSON object".into()));
    }
    tool.input_schema
        .check(&args)
        .map_err(|e| invalid(format!("the arguments do not match the schema of `{}`: {e}", tool.name)))?;
    Ok(args)
}

/// Size, syntax and (if promised) schema of the result.
fn check_result(text: &str, max: usize, tool: &ToolInfo) -> Result<Value, CallError> {
    if text.len() > max {
        return Err(CallError::new(
            ErrorKind::LimitExceeded,
            format!("`{}` returned {} bytes, over the limit of {max} (max_result_bytes)", tool.name, text.len()),
        ));
    }
    let bad = |m: String| CallError::new(ErrorKind::InvalidResult, m);
    let value: Value =
        serde_json::from_str(text).map_err(|e| bad(format!("`{}` returned a result that is not JSON: {e}", tool.name)))?;
    if let Some(schema) = &tool.output_schema {
        schema.check(&value).map_err(|e| bad(format!("`{}` broke its own output schema: {e}", tool.name)))?;
    }
    Ok(value)
}

/// The error a plugin reported, under the kind the caller expects.
fn tool_error(e: types::ToolError) -> CallError {
    use types::{OutboundError as O, ToolError as T};
    match e {
        T::InvalidArgs(m) => CallError::new(ErrorKind::InvalidArgs, m),
        T::Failed(m) => CallError::new(ErrorKind::ToolFailed, m),
        T::Outbound(O::Denied(m)) => CallError::new(ErrorKind::Denied, m),
        T::Outbound(O::Conflict(m)) => CallError::new(ErrorKind::Conflict, m),
        T::Outbound(O::Transport(m)) => CallError::new(ErrorKind::Transport, m),
        T::Outbound(O::Invalid(m)) => CallError::new(ErrorKind::InvalidRequest, m),
        T::Outbound(O::Held(h)) => CallError::new(ErrorKind::Held, h.message)
            .with_detail(json!({ "earlier_call_id": h.earlier_call_id })),
        T::Outbound(O::OutcomeUnknown(a)) => {
            let state = format!("{:?}", a.state).to_lowercase();
            CallError::new(ErrorKind::OutcomeUnknown, a.message)
                .with_detail(json!({ "key": a.key, "step": a.step, "state": state, "tries": a.tries }))
        }
    }
}
