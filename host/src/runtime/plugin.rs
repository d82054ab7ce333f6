//! A loaded plugin and the tools it offers, checked once at load.

use super::bindings::{PluginPre, types};
use super::context::PluginContext;
use super::state::HostState;
use crate::error::LoadError;
use crate::keys::ActionFields;
pub use crate::policy::Effect;
use crate::policy::{EffectivePolicy, PluginPolicy, ToolClass};
use crate::schema::Schema;
use std::sync::Arc;

/// Most tools one plugin may offer.
const MAX_TOOLS: usize = 256;
/// Longest tool description accepted, in bytes.
const MAX_DESCRIPTION: usize = 8 << 10;

impl From<types::Effect> for Effect {
    fn from(e: types::Effect) -> Self {
        match e {
            types::Effect::ReadOnly => Self::ReadOnly,
            types::Effect::Idempotent => Self::Idempotent,
            types::Effect::Irreversible => Self::Irreversible,
        }
    }
}

/// One tool as the host serves it.
#[derive(Debug)]
pub struct ToolInfo {
    /// Unique name across the host (the plugin's tool prefix and its own name).
    pub name: String,
    /// The name the plugin itself knows the tool by.
    pub plugin_tool: String,
    /// The plugin that offers it.
    pub plugin: String,
    /// What it does, for the model.
    pub description: String,
    /// The effect class the plugin claims (a hint).
    pub claimed: Effect,
    /// The effect class the host enforces: the reviewer's, or the claim
    /// restricted (see [`Effect::effective`]).
    pub effect: Effect,
    /// Whether the reviewer classified this tool.
    pub reviewed: bool,
    /// Schema the arguments must satisfy.
    pub input_schema: Schema,
    /// The arguments that name its action, where the reviewer declared them
    /// (otherwise all of them: `docs/keys.md`).
    pub action: Option<ActionFields>,
    /// When a person must approve a call before it runs, if the reviewer asks.
    pub approval: Option<crate::policy::ApprovalRule>,
    /// How recently an identical action may have been carried out before a
    /// new call of it needs a person's confirmation (ms), if the reviewer asks.
    pub confirm_repeat_ms: Option<u64>,
    /// For an irreversible tool: how much its calls may move (`docs/policy.md`, "Limits").
    pub limits: Vec<crate::policy::limits::Limit>,
    /// Schema the result must satisfy, if the plugin promised one.
    pub output_schema: Option<Schema>,
}

impl ToolInfo {
    /// The tool's enforced class, as its plugin's effective policy lists it.
    pub fn class(&self) -> ToolClass {
        ToolClass { name: self.name.clone(), effect: self.effect, reviewed: self.reviewed }
    }
}

/// A compiled, linked plugin ready to instantiate.
pub(crate) struct LoadedPlugin {
    /// Name, settings and limits shared by its invocations.
    pub ctx: Arc<PluginContext>,
    /// sha256 of the component, lower-case hex.
    pub digest: String,
    /// For a registry component: what was pulled and who signed it.
    pub provenance: Option<super::source::Provenance>,
    /// Type-checked and linked once; instantiated per invocation.
    pub pre: PluginPre<HostState>,
    /// Its `reconcile` export, if it has one (checked at load).
    pub reconcile: Option<wasmtime::component::ComponentExportIndex>,
    /// What the reviewer's policy lets it do (its tools' classes once described).
    pub policy: Arc<EffectivePolicy>,
    /// sha256 of `policy` once complete ([`EffectivePolicy::digest`]): what
    /// an approval is bound to, computed once at load.
    pub policy_digest: String,
}

/// Checks what `describe` returned and turns it into tools, each with the
/// effect class the reviewer's `classes` give it.
///
/// # Errors
/// No tools, too many, a bad or repeated name, a schema that does not
/// compile or does not describe an object, or a class for a tool the plugin
/// does not offer.
pub(crate) fn check_specs(plugin: &str, prefix: &str, specs: Vec<types::ToolSpec>, policy: &PluginPolicy) -> Result<Vec<ToolInfo>, LoadError> {
    let classes = &policy.tools;
    let bad = |tool: &str, reason: String| LoadError::BadTool { plugin: plugin.into(), tool: tool.into(), reason };
    if specs.is_empty() || specs.len() > MAX_TOOLS {
        let reason = format!("describe returned {} tools; a plugin offers 1 to {MAX_TOOLS}", specs.len());
        return Err(LoadError::Describe { plugin: plugin.into(), reason });
    }
    let mut tools: Vec<ToolInfo> = Vec::with_capacity(specs.len());
    for spec in specs {
        let plugin_tool = spec.name;
        let name = format!("{prefix}{plugin_tool}");
        let name_ok = (1..=64).contains(&name.len()) && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !name_ok {
            return Err(bad(&name, "a tool name is 1–64 of A-Z a-z 0-9 _ -".into()));
        }
        if tools.iter().any(|t| t.name == name) {
            return Err(bad(&name, "the plugin describes this tool twice".into()));
        }
        if spec.description.trim().is_empty() || spec.description.len() > MAX_DESCRIPTION {
            return Err(bad(&name, format!("the description must be 1 to {MAX_DESCRIPTION} bytes")));
        }
        let input_schema = object_schema(&spec.input_schema).map_err(|e| bad(&name, format!("input-schema: {e}")))?;
        let output_schema = match &spec.output_schema {
            Some(text) => Some(object_schema(text).map_err(|e| bad(&name, format!("output-schema: {e}")))?),
            None => None,
        };
        let claimed = Effect::from(spec.effect);
        let reviewed = classes.get(&plugin_tool).copied();
        let action = policy.actions.get(&plugin_tool).cloned();
        if let Some(undeclared) = action.iter().flat_map(|a| a.pointers()).find(|p| !input_schema.declares(p)) {
            let why = format!(
                "the policy's `action` names `{undeclared}`, which its input schema does not declare: a pointer that names nothing would make every call of the tool one action"
            );
            return Err(bad(&name, why));
        }
        let approval = policy.approvals.get(&plugin_tool).cloned();
        if let Some(undeclared) = approval.iter().flat_map(|a| a.pointers()).find(|p| !input_schema.declares(p)) {
            return Err(bad(&name, format!("the policy's `approval` reads `{undeclared}`, which its input schema does not declare")));
        }
        let limits = policy.limits.get(&plugin_tool).cloned().unwrap_or_default();
        if let Some(e) = limits.iter().find_map(|l| l.fits(input_schema.json()).err()) {
            return Err(bad(&name, e));
        }
        tools.push(ToolInfo {
            limits,
            action,
            approval,
            confirm_repeat_ms: policy.confirm_repeats.get(&plugin_tool).map(|m| m * 60_000),
            plugin_tool,
            effect: Effect::effective(claimed, reviewed),
            reviewed: reviewed.is_some(),
            claimed,
            name,
            plugin: plugin.into(),
            description: spec.description,
            input_schema,
            output_schema,
        });
    }
    if let Some(stray) = classes.keys().find(|c| !tools.iter().any(|t| &t.plugin_tool == *c)) {
        return Err(bad(stray, "the policy classifies this tool, but the plugin does not offer it".into()));
    }
    Ok(tools)
}

/// Compiles a schema that must describe a JSON object (as MCP requires).
fn object_schema(text: &str) -> Result<Schema, String> {
    let schema = Schema::compile(text)?;
    if schema.json().get("type").and_then(|t| t.as_str()) != Some("object") {
        return Err("the schema must have \"type\": \"object\" at its root".into());
    }
    Ok(schema)
}
