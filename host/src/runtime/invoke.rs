//! One tool call: arguments checked before any instance exists, the call
//! admitted by the guard (replayed if completed), one sandboxed run, the
//! result checked and recorded.

use super::bindings::Plugin;
use super::outbound::{Mode, wit};
use super::plugin::ToolInfo;
use super::questions::Asking;
use super::questions::journal::Inputs;
use super::reconcile::PluginReconciler;
use super::sandbox::Slot;
use super::{CallOutput, CallRequest, Runtime};
use crate::error::{CallError, ErrorKind};
use crate::guard::{Admission, CallIdentity, CallRules, Reconciler};
use crate::keys;
use crate::ledger::{Reported, StoredOutcome};
use serde_json::{Value, json};
use std::sync::Arc;

/// How long a claim outlasts the run's wall-clock budget: time to record
/// the outcome after the last possible send.
const LEASE_MARGIN_MS: u64 = 2_000;

impl Runtime {
    /// Invokes a tool (see the module docs).
    pub(crate) async fn invoke(&self, req: &CallRequest, gate: Option<Arc<crate::guard::Gate>>, inputs: Arc<Inputs>) -> Result<CallOutput, CallError> {
        let (index, tool) = self.tools.get(&req.tool).ok_or_else(|| unknown_tool(self, &req.tool))?;
        let plugin = &self.plugins[*index];
        let args = check_args(&req.args_json, plugin.ctx.limits.max_args_bytes, tool)?;
        let mut canonical = keys::canonical_args(&args).map_err(|m| CallError::new(ErrorKind::InvalidArgs, m))?;
        let read_only = tool.effect == super::Effect::ReadOnly;
        // A read-only call has nothing downstream to protect: it is neither
        // recorded nor replayed (`docs/ledger.md`, "What a call leaves").
        let call_guard = match self.core.guard.get() {
            Some(_) if read_only || self.unguarded() => None,
            None => None,
            Some(guard) => {
                let id = CallIdentity {
                    session: req.session.clone(),
                    call_id: req.call_id.clone(),
                    tool: tool.name.clone(),
                    args_digest: tool.action.as_ref().map_or_else(|| keys::args_digest(&canonical), |a| a.digest(&args)),
                    args: args.clone(),
                };
                let rules = CallRules {
                    effect: tool.effect,
                    grants: plugin.ctx.grants.clone(),
                    wires: plugin.ctx.wires.clone(),
                    policy_digest: plugin.policy_digest.clone(),
                    reconciler: PluginReconciler::for_plugin(&self.core, plugin).map(|r| Arc::new(r) as Arc<dyn Reconciler>),
                    max_sends: plugin.policy.budgets.max_sends_per_call,
                    budgets: budgets(plugin, req),
                    spending: spending(tool, req, &args)?,
                    carried: carried(tool, &args),
                    // The wall clock cuts a run off, so nothing is sent after it.
                    lease_ms: plugin.ctx.limits.wall_ms + LEASE_MARGIN_MS,
                    hold_wait: plugin.ctx.wires.hold_wait(&plugin.ctx.grants),
                    gate,
                    arrived_ms: self.receipts.as_ref().filter(|_| tool.effect == super::Effect::Irreversible).and_then(|r| r.of(&req.session, &req.call_id)),
                };
                let rules_gated = rules.gate.is_some();
                let admit = crate::phases::time(crate::phases::Phase::Admit);
                let admitted = guard.admit(id, rules).await?;
                drop(admit);
                match admitted {
                    Admission::Replay(stored) => return replayed(stored),
                    Admission::Run(mut call) => {
                        if rules_gated {
                            call.persist().await?;
                        }
                        if let Some(ask) = consent_asked(guard, plugin, tool, (&args, req), call.admitted()).await? {
                            let _consent = crate::phases::time(crate::phases::Phase::Admit);
                            if let Err(e) = call.consent(ask).await {
                                return guard.finish(call, Err(e)).await.map(|value| CallOutput { value, replayed: false });
                            }
                        }
                        // The same action under this call id, first made with other
                        // wording outside the reviewer's `action` arguments: it runs
                        // again as first recorded, so its sends stay the same requests.
                        if call.args() != &args {
                            canonical = keys::canonical_args(call.args()).map_err(|m| CallError::new(ErrorKind::InvalidArgs, m))?;
                        }
                        Some(call)
                    }
                }
            }
        };
        let mut call_guard = call_guard;
        let (inputs, recording) = super::questions::recorded(call_guard.as_mut(), &plugin.policy.ask_client, inputs).await?;
        let mode = match call_guard {
            Some(call) => Mode::Guarded(call),
            None if read_only => Mode::ReadOnly(tool.name.clone()),
            #[cfg(feature = "bench")]
            None if self.unguarded() => Mode::Unguarded,
            None => Mode::NoCall,
        };
        let name = tool.plugin_tool.clone();
        let asking = Asking::new(&plugin.policy.ask_client, inputs).recording(recording);
        let run = crate::phases::time(crate::phases::Phase::Run);
        let (returned, call_guard) = self
            .core
            .sandboxed(plugin, (mode, asking), Slot::Invoke, move |store, instance| {
                Box::pin(async move {
                    let bindings = Plugin::new(&mut *store, &instance)?;
                    bindings.toolguard_plugin_tool().call_invoke(store, &name, &canonical).await
                })
            })
            .await;
        drop(run);
        let result = match returned {
            Ok(Ok(text)) => check_result(&text, plugin.ctx.limits.max_result_bytes, tool),
            Ok(Err(e)) => Err(wit::tool_error(e)),
            Err(fault) => Err(fault.into()),
        };
        let result = match (self.core.guard.get(), call_guard) {
            (Some(guard), Some(call)) => {
                let _finish = crate::phases::time(crate::phases::Phase::Finish);
                guard.finish(call, result).await
            }
            _ => result,
        };
        result.map(|value| CallOutput { value, replayed: false })
    }
}

impl Runtime {
    /// Records what the caller of `request` was told, once `answer` has left
    /// the host (printed, written to the client): the hold rule counts a
    /// call's lifetime until a definitive outcome reached the caller
    /// (`docs/guard.md`). Only calls of irreversible tools keep this; other
    /// calls, and answers that admitted nothing (unknown tool, bad
    /// arguments, a conflict), are ignored. A failure to record is logged:
    /// it can only make a later identical call be held once more.
    pub async fn report(&self, request: &CallRequest, answer: &Result<CallOutput, CallError>) {
        self.report_at(request, answer, crate::ledger::records::now_ms()).await;
    }

    /// [`Runtime::report`] for an answer that left the host at `delivered_ms`.
    pub async fn report_at(&self, request: &CallRequest, answer: &Result<CallOutput, CallError>, delivered_ms: u64) {
        let (Some(guard), Some((_, tool))) = (self.core.guard.get(), self.tools.get(&request.tool)) else { return };
        if tool.effect != super::Effect::Irreversible || self.unguarded() {
            return;
        }
        let reported = match answer {
            Ok(_) => Reported::Definitive,
            Err(e) => match e.kind {
                ErrorKind::UnknownTool
                | ErrorKind::InvalidArgs
                | ErrorKind::Conflict
                | ErrorKind::Expired
                | ErrorKind::Busy
                | ErrorKind::AwaitingApproval
                | ErrorKind::InputRequired
                | ErrorKind::Internal => return,
                // Cancelled provably before anything left: nothing can follow from it.
                ErrorKind::ToolFailed | ErrorKind::Cancelled => Reported::Definitive,
                // A person's denial (or no decision in time): nothing was sent.
                ErrorKind::Denied if crate::guard::is_consent_decision(e) => Reported::Definitive,
                // What took effect was told, but not what the tool made of it:
                // a blind repeat is held with this outcome (guard/effects.rs).
                ErrorKind::FailedAfterEffect => Reported::Unknown,
                ErrorKind::Held if e.detail.as_ref().is_some_and(|d| d.get("earlier_outcome").is_some()) => Reported::Definitive,
                _ => Reported::Unknown,
            },
        };
        let _report = crate::phases::time(crate::phases::Phase::Report);
        if let Err(e) = guard.report(&request.session, &request.call_id, reported, delivered_ms).await {
            tracing::warn!(error = %e, call_id = %request.call_id, "could not record what the caller was told");
        }
    }
}

/// The budgets a call of `plugin`'s irreversible tools spends: per session,
/// and per authenticated principal, as its policy sets them.
fn budgets(plugin: &super::plugin::LoadedPlugin, req: &CallRequest) -> Vec<crate::guard::Budget> {
    let name = &plugin.ctx.name;
    let limits = plugin.policy.budgets;
    let per_session = limits.max_irreversible_calls_per_session_hour.map(|max| crate::guard::Budget {
        scope: json!(["session", name, req.session]).to_string(),
        max,
        what: format!("this session's budget of irreversible calls of `{name}` (max_irreversible_calls_per_session_hour = {max})"),
    });
    let per_principal = limits.max_irreversible_calls_per_principal_hour.zip(req.principal.as_ref()).map(|(max, principal)| crate::guard::Budget {
        scope: json!(["principal", name, principal]).to_string(),
        max,
        what: format!("principal `{principal}`'s budget of irreversible calls of `{name}` (max_irreversible_calls_per_principal_hour = {max})"),
    });
    per_session.into_iter().chain(per_principal).collect()
}

/// What a call of `tool` with `args` spends from each of its limits, each
/// limit's scope naming whose calls count together (`docs/policy.md`,
/// "Limits"). A limit of each call alone is checked here: over it, the call
/// is refused before anything is recorded.
///
/// # Errors
/// `denied` over a per-call limit; `invalid-args` when a summed argument is
/// not a non-negative integer.
fn spending(tool: &super::ToolInfo, req: &CallRequest, args: &Value) -> Result<Vec<crate::guard::Spending>, CallError> {
    let mut uses = Vec::new();
    for (i, limit) in tool.limits.iter().enumerate() {
        let (amount, currency) = limit.amount(args).map_err(|m| CallError::new(ErrorKind::InvalidArgs, format!("{m}; the tool's limit counts it")))?;
        let what = format!("`{}`'s limit ({})", tool.name, limit.describe());
        let approvable = limit.over_limit == crate::policy::limits::OverLimit::Approve;
        if limit.window == crate::policy::limits::Window::Call {
            if amount > limit.max && !approvable {
                crate::metrics::limit_over(&tool.name, "refused");
                return Err(CallError::new(ErrorKind::Denied, format!("{what}: this call would move {amount}; nothing was run")));
            }
            // Over an approvable one, the admission marks the call for a person ([`crate::guard::Spending`]).
            if amount > limit.max {
                uses.push(crate::guard::Spending { scope: String::new(), max: limit.max, amount, window: limit.window, what, approvable });
            }
            continue;
        }
        use crate::policy::limits::Per;
        let whose = match (limit.per, &req.tenant, &req.principal) {
            (Per::Tenant, Some(tenant), _) => json!(["tenant", tenant]),
            (Per::Tenant | Per::Principal, _, Some(principal)) => json!(["principal", principal]),
            (Per::Tenant | Per::Principal | Per::Session, _, _) => json!(["session", req.session]),
            (Per::Everyone, _, _) => json!(["everyone"]),
        };
        let scope = crate::policy::limits::Scope { plugin: tool.plugin.to_string(), tool: tool.name.clone(), index: i, whose, currency }.key();
        uses.push(crate::guard::Spending { scope, max: limit.max, amount, window: limit.window, what, approvable });
    }
    Ok(uses)
}

/// The amounts each send of a call with `args` must carry: one per limit
/// bound to a request field (`sent_as`).
fn carried(tool: &super::ToolInfo, args: &Value) -> Vec<crate::guard::Carried> {
    let bound = tool.limits.iter().filter_map(|l| Some((l, l.sent_as.clone()?)));
    bound
        .filter_map(|(l, field)| {
            let amount = l.amount(args).ok()?.0;
            Some(crate::guard::Carried { field, amount, what: format!("`{}`'s limit ({})", tool.name, l.describe()) })
        })
        .collect()
}

fn unknown_tool(rt: &Runtime, name: &str) -> CallError {
    let known: Vec<&str> = rt.tools.keys().map(String::as_str).take(20).collect();
    let available = if known.is_empty() { "none".into() } else { known.join(", ") };
    // A plugin left out (its registry unreachable) may be the one that offers it.
    let missing = if rt.unavailable.is_empty() { String::new() } else { format!(". Not loaded now: {}", rt.unavailable.join("; ")) };
    CallError::new(ErrorKind::UnknownTool, format!("no tool named `{name}`; available: {available}{missing}"))
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
    tool.input_schema.check(&args).map_err(|e| invalid(format!("the arguments do not match the schema of `{}`: {e}", tool.name)))?;
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
    let value: Value = serde_json::from_str(text).map_err(|e| bad(format!("`{}` returned a result that is not JSON: {e}", tool.name)))?;
    if let Some(schema) = &tool.output_schema {
        schema.check(&value).map_err(|e| bad(format!("`{}` broke its own output schema: {e}", tool.name)))?;
    }
    Ok(value)
}

/// What to ask a person about the call admitted as `record`, if anything:
/// the reviewer's approval rule; else a repeat of an action carried out
/// within the tool's `confirm_repeat_within_minutes`; and its being past a
/// spending limit a person may approve (`over_limit = "approve"`); else,
/// for a call asked about before, the same question (it stays under consent
/// whatever the rules say now).
async fn consent_asked(
    guard: &crate::guard::Guard,
    plugin: &super::plugin::LoadedPlugin,
    tool: &ToolInfo,
    (args, req): (&Value, &CallRequest),
    record: &crate::ledger::CallRecord,
) -> Result<Option<crate::guard::Ask>, CallError> {
    let rule = tool.approval.as_ref();
    let mut reason = rule.and_then(|r| r.asks(args));
    if reason.is_none()
        && let Some(window) = tool.confirm_repeat_ms
    {
        reason = guard.repeat_to_confirm(record, window).await?;
    }
    let reasons: Vec<String> = reason.into_iter().chain(record.over_limit.clone()).collect();
    let reason = (!reasons.is_empty()).then(|| reasons.join("; "));
    // Once asked, a call stays under consent whatever the rules say now.
    let asked_before = record.approval.as_ref().map(|a| a.reason.clone());
    let Some(reason) = reason.or(asked_before) else { return Ok(None) };
    let minutes = rule.map_or(crate::policy::DEFAULT_APPROVAL_MINUTES, |r| r.expires_minutes);
    Ok(Some(crate::guard::Ask { reason, policy_digest: plugin.policy_digest.clone(), expires_ms: minutes * 60_000, principal: req.principal.clone() }))
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
