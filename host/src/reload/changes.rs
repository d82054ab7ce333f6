//! What a reload may not change while an action is unresolved — what makes
//! two calls the same action or carries its key to the provider — and what
//! it leaves behind (`docs/operations.md`). Settings only a restart applies
//! are each config section's own word ([`crate::config::RestartOnly`]).

use crate::config::Config;
use crate::ledger::AttemptState;
use crate::policy::Effect;
use crate::runtime::Runtime;

/// At most this many calls are named in one refusal or warning.
const NAMED: usize = 10;

/// A change to the identity of an action, and what it touches.
struct IdentityChange {
    what: String,
    tool: Option<String>,
    downstream: Option<String>,
}

/// Refuses a change to what makes two calls of a tool the same action (its
/// `action` arguments, or its class to or from irreversible) or to how a
/// downstream takes keys (transport, format), while a call it touches is
/// unresolved: an unsettled attempt in the ledger, or a call running now.
///
/// # Errors
/// The change and the calls to settle first.
pub(super) async fn identity(old: &Config, new: &Config, previous: &Runtime, next: &Runtime) -> Result<(), String> {
    let mut changes = Vec::new();
    for tool in previous.tools() {
        let Some(now) = next.tool(&tool.name) else { continue };
        let irreversible = |e: Effect| e == Effect::Irreversible;
        let what = if tool.action != now.action {
            "its `action` arguments (which calls are the same action)"
        } else if irreversible(tool.effect) != irreversible(now.effect) {
            "its effect class, to or from irreversible (whether repeats of it are held)"
        } else {
            continue;
        };
        changes.push(IdentityChange { what: format!("tool `{}`: {what}", tool.name), tool: Some(tool.name.clone()), downstream: None });
    }
    for (name, d) in &old.downstreams {
        let Some(now) = new.downstreams.get(name) else { continue };
        if d.keys != now.keys || d.key_format != now.key_format {
            let what = format!("downstream `{name}`: how it takes idempotency keys (`key`, `key_format`)");
            changes.push(IdentityChange { what, tool: None, downstream: Some(name.clone()) });
        }
    }
    if changes.is_empty() {
        return Ok(());
    }
    let unsettled = unsettled(previous).await?;
    let running = previous.running_calls();
    let granted = |tool: &str, downstream: &str| {
        let plugin = previous.tool(tool).map(|t| t.plugin.clone()).unwrap_or_default();
        previous.effective_policy(&plugin).is_some_and(|p| p.rules.iter().any(|g| g.downstream == downstream))
    };
    let mut refusals = Vec::new();
    for change in changes {
        let touches_attempt = |a: &crate::ledger::AttemptRecord| change.tool.as_deref() == Some(&a.tool) || change.downstream.as_deref() == Some(&a.downstream);
        let touches_call = |tool: &str| change.tool.as_deref() == Some(tool) || change.downstream.as_deref().is_some_and(|d| granted(tool, d));
        // One entry per call, whatever of it is unresolved: its attempts, and that it runs now.
        let mut touched: std::collections::BTreeMap<(&str, &str), Vec<String>> = std::collections::BTreeMap::new();
        for a in unsettled.iter().filter(|a| touches_attempt(a)) {
            touched.entry((&a.session, &a.call_id)).or_default().push(format!("attempt {}, {:?}", a.key, a.state).to_lowercase());
        }
        for c in running.iter().filter(|c| touches_call(&c.tool)) {
            touched.entry((&c.session, &c.call_id)).or_default().push("running now".into());
        }
        let calls: Vec<String> = touched.iter().map(|((session, call), facts)| format!("session `{session}` call `{call}` ({})", facts.join("; "))).collect();
        if !calls.is_empty() {
            refusals.push(format!("{} changes while {} call(s) it touches are unresolved: {}", change.what, calls.len(), named(&calls)));
        }
    }
    if refusals.is_empty() {
        return Ok(());
    }
    Err(format!(
        "{}. Settle them first — let running calls end; resolve the rest (`toolguard recover`, or `toolguard ledger resolve KEY` \
         after checking the provider) — then reload again",
        refusals.join("; ")
    ))
}

/// Whether the tools clients see differ: names, descriptions, schemas or annotations.
pub(super) fn tools_changed(previous: &Runtime, next: &Runtime) -> bool {
    let seen = |rt: &Runtime| -> Vec<String> {
        rt.tools()
            .map(|t| {
                let output = t.output_schema.as_ref().map(|s| s.json().clone());
                format!("{}\n{}\n{}\n{output:?}\n{:?}\n{}", t.name, t.description, t.input_schema.json(), t.effect, rt.has_grants(&t.plugin))
            })
            .collect()
    };
    seen(previous) != seen(next)
}

/// Warnings about what a reload leaves behind: unsettled attempts of tools
/// it removed, which nothing re-sends any more.
pub(super) async fn left_behind(previous: &Runtime, next: &Runtime) -> Vec<String> {
    let removed: Vec<String> = previous.tools().filter(|t| next.tool(&t.name).is_none()).map(|t| t.name.clone()).collect();
    if removed.is_empty() {
        return Vec::new();
    }
    let unsettled = match unsettled(previous).await {
        Ok(unsettled) => unsettled,
        Err(e) => return vec![format!("cannot look for unsettled calls of removed tools: {e}")],
    };
    removed
        .iter()
        .filter_map(|tool| {
            let keys: Vec<String> = unsettled.iter().filter(|a| &a.tool == tool).map(|a| a.key.clone()).collect();
            (!keys.is_empty()).then(|| {
                format!(
                    "tool `{tool}` was removed with {} unsettled attempt(s): {}. Nothing re-sends them under a policy that no longer \
                     grants them; check the provider, then `toolguard ledger resolve KEY --not-sent` for one that never happened, or load \
                     the tool again to have them resolved",
                    keys.len(),
                    named(&keys)
                )
            })
        })
        .collect()
}

/// The attempts pending or unknown in the ledger.
async fn unsettled(runtime: &Runtime) -> Result<Vec<crate::ledger::AttemptRecord>, String> {
    let Some(ledger) = runtime.guard().map(|g| g.ledger().clone()) else { return Ok(Vec::new()) };
    tokio::task::spawn_blocking(move || {
        let mut all = ledger.attempts_in_state(AttemptState::Pending)?;
        all.extend(ledger.attempts_in_state(AttemptState::Unknown)?);
        Ok::<_, crate::ledger::LedgerError>(all)
    })
    .await
    .map_err(|e| e.to_string())?
    .map_err(|e| format!("cannot read the ledger's unsettled attempts: {e}"))
}

/// The first [`NAMED`] of `items`, and how many more.
fn named(items: &[String]) -> String {
    let shown = items.iter().take(NAMED).cloned().collect::<Vec<_>>().join(", ");
    match items.len().saturating_sub(NAMED) {
        0 => shown,
        more => format!("{shown} and {more} more"),
    }
}
