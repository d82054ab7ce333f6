//! The reviewer's policy, and the one place outbound policy is enforced:
//! the downstreams the host knows (how each takes keys, its timeout, retries,
//! retention, and the credential the host injects), and per plugin its sha256
//! pin, the effect class of each tool, its outbound grants (downstream,
//! methods, path prefix) and its budgets. Deny by default: a request no grant
//! covers is `denied` and nothing is sent. The format is in `docs/policy.md`.

mod approval;
mod ask;
mod authorize;
mod downstream;
mod effect;
mod effective;
pub mod limits;
pub mod lock;
mod network;
mod plugin;
mod registry;

pub use crate::net::TlsPolicy;
pub use approval::{ApprovalRule, DEFAULT_APPROVAL_MINUTES, RawApproval};
pub use ask::QuestionKind;
pub use authorize::{Refusal, authorize};
pub use downstream::{
    CredentialSpec, DEFAULT_BACKOFF_MS, DEFAULT_KEY_HEADER, DEFAULT_MAX_REQUEST_BYTES, DEFAULT_MAX_RETRIES, DEFAULT_RECONCILE_MS, DEFAULT_RETENTION_HOURS,
    DEFAULT_TIMEOUT_MS, Downstream, Downstreams, KeyTransport, MAX_BACKOFF, RawDownstream, Secret,
};
pub use effect::Effect;
pub use effective::{Budgets, EffectiveGrant, EffectivePolicy, InjectedCredential, TlsView, ToolClass};
pub use network::is_loopback;
pub use plugin::{DEFAULT_MAX_SENDS_PER_CALL, GRANTABLE_METHODS, Grant, PluginPolicy};
pub use registry::{RawRegistry, RawSignedBy, RawSigner, Registries, Registry, RegistryCredentials};

use crate::keys::ActionFields;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// The reviewer's policy as written (`[policy]`, or a `policy_file`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPolicy {
    #[serde(default)]
    /// Downstreams by name, as written.
    pub downstreams: BTreeMap<String, RawDownstream>,
    #[serde(default)]
    /// Each plugin's policy, as written.
    pub plugins: BTreeMap<String, RawPluginPolicy>,
    #[serde(default)]
    /// How the host reaches each registry, by `host[:port]`.
    pub registries: BTreeMap<String, RawRegistry>,
    #[serde(default)]
    /// Whether every component from a registry must carry a publisher's signature.
    pub require_signatures: bool,
    /// The sigstore trusted root keyless publishers are checked against (a file).
    pub trusted_root: Option<std::path::PathBuf>,
}

/// One plugin's policy as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPluginPolicy {
    /// The sha256 the reviewed component must have.
    pub sha256: Option<String>,
    /// Who may publish its component (registry components only).
    pub signed_by: Option<RawSignedBy>,
    #[serde(default)]
    /// The effect class granted to each tool.
    pub tools: BTreeMap<String, RawToolPolicy>,
    #[serde(default)]
    /// Where the plugin may reach.
    pub grants: Vec<Grant>,
    /// Most sends per tool call (default 8).
    pub max_sends_per_call: Option<u32>,
    /// Most irreversible calls per session per hour.
    pub max_irreversible_calls_per_session_hour: Option<u32>,
    /// Most irreversible calls per principal per hour.
    pub max_irreversible_calls_per_principal_hour: Option<u32>,
    #[serde(default)]
    /// Imports refused even though inert or sealed (packages or package/interface).
    pub deny_imports: Vec<String>,
    #[serde(default)]
    /// The kinds of question it may put to the MCP client mid-call.
    pub ask_client: Vec<QuestionKind>,
}

/// One tool's policy as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawToolPolicy {
    /// The class the reviewer assigns.
    pub effect: Effect,
    /// For an irreversible tool, the JSON pointers of the arguments that name
    /// its action (`docs/keys.md`); by default all of them.
    pub action: Option<Vec<String>>,
    /// For an irreversible tool, when a person must approve a call before
    /// it runs (`docs/tasks.md`).
    pub approval: Option<RawApproval>,
    /// For an irreversible tool: a new call identical to an action carried
    /// out less than this many minutes ago runs only once a person confirms
    /// it (`docs/tasks.md`, "The repeat nobody can link").
    pub confirm_repeat_within_minutes: Option<u64>,
    /// For an irreversible tool: how much its calls may move (`docs/policy.md`, "Limits").
    #[serde(default)]
    pub limits: Vec<limits::RawLimit>,
}

/// The checked policy.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    /// The downstreams, checked.
    pub downstreams: Downstreams,
    /// Each plugin's policy, checked.
    pub plugins: BTreeMap<String, PluginPolicy>,
    /// The registries the policy names.
    pub registries: Registries,
    /// Whether every component from a registry must carry a publisher's signature.
    pub require_signatures: bool,
}

impl Policy {
    /// Checks a written policy; file paths resolve against `base`.
    ///
    /// # Errors
    /// `(field, message)` for the first problem, the field relative to the policy's root.
    pub fn from_raw(raw: RawPolicy, base: &Path) -> Result<Self, (String, String)> {
        let mut downstreams = Downstreams::new();
        for (name, d) in raw.downstreams {
            let d = Downstream::from_raw(&name, d, base).map_err(|(f, m)| (format!("downstreams.{name}.{f}"), m))?;
            downstreams.insert(name, Arc::new(d));
        }
        let mut registries = Registries::new();
        for (host, r) in raw.registries {
            let r = Registry::from_raw(&host, r, base).map_err(|(f, m)| (format!("registries.\"{host}\".{f}"), m))?;
            registries.insert(r.host.clone(), Arc::new(r));
        }
        let trusted_root = match &raw.trusted_root {
            Some(path) => Some(Arc::new(registry::trusted_root(path, base).map_err(|m| ("trusted_root".to_string(), m))?)),
            None => None,
        };
        let mut plugins = BTreeMap::new();
        for (name, p) in raw.plugins {
            let at = |f: &str| format!("plugins.{name}.{f}");
            if let Some(pin) = &p.sha256
                && (pin.len() != 64 || !pin.chars().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()))
            {
                return Err((at("sha256"), "expected 64 lower-case hex digits (the component's sha256)".into()));
            }
            for (i, g) in p.grants.iter().enumerate() {
                if !downstreams.contains_key(&g.downstream) {
                    let known = downstreams.keys().cloned().collect::<Vec<_>>().join(", ");
                    return Err((at(&format!("grants[{i}].downstream")), format!("no downstream `{}`; configured: {known}", g.downstream)));
                }
                if g.methods.is_empty() || g.methods.iter().any(|m| !GRANTABLE_METHODS.contains(&m.as_str())) {
                    let why = format!("list upper-case HTTP methods among {} (never TRACE or CONNECT)", GRANTABLE_METHODS.join(", "));
                    return Err((at(&format!("grants[{i}].methods")), why));
                }
            }
            for (i, d) in p.deny_imports.iter().enumerate() {
                let (package, interface) = d.split_once('/').unwrap_or((d.as_str(), "x"));
                let ok = |part: &str| !part.is_empty() && part.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
                let well_formed = package.split_once(':').is_some_and(|(ns, name)| ok(ns) && ok(name)) && ok(interface);
                if !well_formed {
                    return Err((
                        at(&format!("deny_imports[{i}]")),
                        "expected a package such as `wasi:filesystem` or an interface such as `wasi:filesystem/preopens`, without a version".into(),
                    ));
                }
            }
            let mut actions = BTreeMap::new();
            let mut approvals = BTreeMap::new();
            let mut confirm_repeats = BTreeMap::new();
            let mut tool_limits = BTreeMap::new();
            // A setting only an irreversible tool may have: its field, or the error naming it.
            let only_irreversible = |tool: &str, tp: &RawToolPolicy, setting: &str, what: &str| {
                let field = at(&format!("tools.{tool}.{setting}"));
                if tp.effect == Effect::Irreversible { Ok(field) } else { Err((field, format!("{what}; `{tool}` is {}: remove it", tp.effect.as_str()))) }
            };
            for (tool, tp) in &p.tools {
                if let Some(minutes) = tp.confirm_repeat_within_minutes {
                    let field = only_irreversible(tool, tp, "confirm_repeat_within_minutes", "confirms repeats of an irreversible action")?;
                    if minutes == 0 {
                        return Err((field, "must be at least 1 (or leave it out)".into()));
                    }
                    confirm_repeats.insert(tool.clone(), minutes);
                }
                if let Some(raw) = tp.approval.clone() {
                    let field = only_irreversible(tool, tp, "approval", "asks a person to approve an irreversible action")?;
                    approvals.insert(tool.clone(), ApprovalRule::new(raw).map_err(|m| (field, m))?);
                }
                if !tp.limits.is_empty() {
                    let field = only_irreversible(tool, tp, "limits", "limits how much an irreversible tool's calls may move")?;
                    let checked = tp.limits.iter().cloned().enumerate().map(|(i, raw)| limits::Limit::new(raw).map_err(|m| (format!("{field}[{i}]"), m)));
                    tool_limits.insert(tool.clone(), checked.collect::<Result<Vec<_>, _>>()?);
                }
                if let Some(pointers) = tp.action.clone() {
                    let field = only_irreversible(tool, tp, "action", "names what identifies an irreversible tool's action")?;
                    actions.insert(tool.clone(), ActionFields::new(pointers).map_err(|m| (field, m))?);
                }
            }
            let (signed_by, signed_by_identity) = match p.signed_by {
                Some(raw) => registry::publishers(raw, base, trusted_root.as_ref()).map_err(|(f, m)| (at(&f), m))?,
                None => (Vec::new(), Vec::new()),
            };
            let policy = PluginPolicy {
                reviewed: true,
                sha256: p.sha256,
                signed_by,
                signed_by_identity,
                locked: None,
                tools: p.tools.into_iter().map(|(t, tp)| (t, tp.effect)).collect(),
                actions,
                approvals,
                confirm_repeats,
                limits: tool_limits,
                grants: p.grants,
                max_sends_per_call: p.max_sends_per_call.unwrap_or(DEFAULT_MAX_SENDS_PER_CALL),
                max_irreversible_calls_per_session_hour: p.max_irreversible_calls_per_session_hour,
                max_irreversible_calls_per_principal_hour: p.max_irreversible_calls_per_principal_hour,
                deny_imports: p.deny_imports,
                ask_client: {
                    let mut kinds = p.ask_client;
                    kinds.sort();
                    kinds.dedup();
                    kinds
                },
            };
            plugins.insert(name, policy);
        }
        Ok(Self { downstreams, plugins, registries, require_signatures: raw.require_signatures })
    }
}

#[cfg(test)]
mod tests;
