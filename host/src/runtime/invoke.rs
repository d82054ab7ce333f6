//! One sandboxed invocation: a fresh store per call (a trap poisons an
//! instance), the invocation's limits armed, and every way it can end turned
//! into a clear error.

use super::bindings::{Plugin, types};
use super::plugin::{LoadedPlugin, ToolInfo};
use super::state::{CallContext, HostState};
use super::{CallOutput, CallRequest, Runtime};
use crate::error::{CallError, ErrorKind};
use crate::guard::{Admission, CallGuard, CallIdentity, keys};
use crate::ledger::StoredOutcome;
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
    /// Runs `body` against a fresh instance of `plugin` in a fresh store,
    /// under the plugin's limits. The store is dropped when this returns; the
    /// call guard (if one was given) is handed back for `Guard::finish`.
    pub(crate) async fn sandboxed<R>(
        &self,
        plugin: &LoadedPlugin,
        call: CallContext,
        call_guard: Option<CallGuard>,
        body: impl for<'a> FnOnce(&'a mut Store<HostState>, Plugin) -> GuestCall<'a, R>,
    ) -> (Result<R, Fault>, Option<CallGuard>) {
        let _slot = self.slots.acquire().await.expect("the slot semaphore is never closed");
        let limits = plugin.ctx.limits;
        let mut store = self.new_store(plugin, call, call_guard);
        let run = async {
            let instance = plugin.pre.instantiate_async(&mut store).await?;
            body(&mut store, instance).await
        };
        let outcome = tokio::time::timeout(Duration::from_millis(limits.wall_ms), run).await;
        let result = match outcome {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => Err(classify(&error, store.data())),
            Err(_elapsed) => Err(Fault::Limit(format!(
                "plugin `{}` did not finish within its wall-clock budget of {} ms (wall_ms)",
                plugin.ctx.name, limits.wall_ms
            ))),
        };
        (result, store.data_mut().call_guard.take())
    }

    /// A fresh store for one invocation, its limiter and CPU budget armed.
    fn new_store(&self, plugin: &LoadedPlugin, call: CallContext, call_guard: Option<CallGuard>) -> Store<HostState> {
        self.sandboxes.fetch_add(1, Ordering::Relaxed);
        let state = HostState::new(plugin.ctx.clone(), call, call_guard, self.guard.clone());
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

    /// Invokes a tool: arguments checked before any instance exists, the
    /// call admitted by the guard (replayed if completed), one sandboxed run,
    /// the result checked and recorded.
    pub(crate) async fn invoke(&self, req: &CallRequest) -> Result<CallOutput, CallError> {
        let (index, tool) = self.tools.get(&req.tool).ok_or_else(|| unknown_tool(self, &req.tool))?;
        let plugin = &self.plugins[*index];
        let args = check_args(&req.args_json, plugin.ctx.limits.max_args_bytes, tool)?;
        let canonical = keys::canonical_args(&args).map_err(|m| CallError::new(ErrorKind::InvalidArgs, m))?;
        let call_guard = match &self.guard {
            None => None,
            Some(guard) => {
                let id = CallIdentity {
                    session: req.session.clone(),
                    call_id: req.call_id.clone(),
                    tool: tool.name.clone(),
                    args_digest: keys::args_digest(&canonical),
                    args: args.clone(),
                };
                match guard.admit(id, tool.effect, plugin.ctx.grants.clone()).await? {
                    Admission::Replay(stored) => return replayed(stored),
                    Admission::Run(call) => Some(call),
                }
            }
        };
        let call = CallContext { session: req.session.clone(), call_id: req.call_id.clone(), tool: tool.name.clone() };
        let name = tool.name.clone();
        let (returned, call_guard) = self
            .sandboxed(plugin, call, call_guard, move |store, p| {
                Box::pin(async move { p.toolguard_plugin_tool().call_invoke(store, &name, &canonical).await })
            })
            .await;
        let result = match returned {
            Ok(Ok(text)) => check_result(&text, plugin.ctx.limits.max_result_bytes, tool),
            Ok(Err(e)) => Err(tool_error(e)),
            Err(fault) => Err(fault.into()),
        };
        let result = match (&self.guard, call_guard) {
            (Some(guard), Some(call)) => guard.finish(call, result).await,
            _ => result,
        };
        result.map(|value| CallOutput { value, replayed: false })
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

/// The stored outcome of a completed call, marked as replayed.
fn replayed(stored: StoredOutcome) -> Result<CallOutput, CallError> {
    match stored {
        StoredOutcome::Result(value) => Ok(CallOutput { value, replayed: true }),
        StoredOutcome::Error { kind, message, detail } => {
            let kind = kind.parse().unwrap_or(ErrorKind::ToolFailed);
            let mut detail = detail.unwrap_or_else(|| json!({}));
            if let Some(map) = detail.as_object_mut() {
                map.insert("replayed".into(), Value::Bool(true));
            }
            Err(CallError::new(kind, message).with_detail(detail))
        }
    }
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
            let detail = crate::guard::attempt_detail(&a);
            CallError::new(ErrorKind::OutcomeUnknown, a.message).with_detail(detail)
        }
    }
}
