//! A plugin's part of the policy: its pin, its tools' effect classes, its
//! outbound grants (deny by default) and its budgets.

use super::Effect;
use crate::keys::ActionFields;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Default number of sends one tool call may make.
pub const DEFAULT_MAX_SENDS_PER_CALL: u32 = 8;

/// The methods a grant may list: every real method a side effect or a read
/// uses. `TRACE` (which echoes the request, credential included, back to the
/// plugin) and `CONNECT` (a tunnel) never.
pub const GRANTABLE_METHODS: [&str; 7] = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"];

/// One outbound grant of a plugin (`[[policy.plugins.NAME.grants]]`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Grant {
    /// The downstream it opens.
    pub downstream: String,
    /// Allowed methods, upper-case (default `GET` and `HEAD`).
    #[serde(default = "read_methods")]
    pub methods: Vec<String>,
    /// Path prefix under the downstream's base path (default: all of it).
    #[serde(default)]
    pub path_prefix: String,
    /// Whether paths this grant covers may carry what a downstream or a
    /// proxy could read as another path: encoded `/`, `\` or `%`, and `;`
    /// parameters (default false: refused). Only for downstreams whose ids
    /// need them, and that do not decode them into separators.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_encoded_path: bool,
}

fn read_methods() -> Vec<String> {
    vec!["GET".into(), "HEAD".into()]
}

/// The reviewer's policy for one plugin. A plugin the policy does not name
/// gets the default: not reviewed, no pin, no grants, claims only restrict.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginPolicy {
    /// Whether the policy names this plugin at all.
    pub reviewed: bool,
    /// Lower-case hex sha256 the component must have, if pinned.
    pub sha256: Option<String>,
    /// The publishers whose signature admits its component from a registry
    /// (any one of them); empty: no signature is asked for.
    pub signed_by: Vec<crate::registry::publishers::PublisherKey>,
    /// The keyless publishers (OIDC issuer and subject) whose signature
    /// admits it, checked against the policy's `trusted_root`.
    pub signed_by_identity: Vec<crate::registry::keyless::Identity>,
    /// What `toolguard.lock` says of it, when a lock exists beside the config.
    pub locked: Option<super::lock::Locked>,
    /// The effect class of each reviewed tool.
    pub tools: BTreeMap<String, Effect>,
    /// The arguments that name each irreversible tool's action, where the
    /// reviewer declares them (otherwise all of its arguments).
    pub actions: BTreeMap<String, ActionFields>,
    /// When a person must approve a call of an irreversible tool, by tool.
    pub approvals: BTreeMap<String, super::ApprovalRule>,
    /// Minutes within which a new call identical to an action carried out
    /// needs a person's confirmation, by irreversible tool.
    pub confirm_repeats: BTreeMap<String, u64>,
    /// How much each irreversible tool's calls may move, by tool.
    pub limits: BTreeMap<String, Vec<super::limits::Limit>>,
    /// What it may reach through `outbound` (nothing by default).
    pub grants: Vec<Grant>,
    /// Sends one tool call may make.
    pub max_sends_per_call: u32,
    /// Calls of its irreversible tools one session may make per hour, if limited.
    pub max_irreversible_calls_per_session_hour: Option<u32>,
    /// Calls of its irreversible tools one authenticated principal (an MCP
    /// token) may make per hour, over all its sessions, if limited.
    pub max_irreversible_calls_per_principal_hour: Option<u32>,
    /// Interfaces (`wasi:filesystem`, or `wasi:filesystem/preopens`) it may
    /// not import even where the host links them inert, nor carry sealed.
    pub deny_imports: Vec<String>,
    /// The kinds of question it may put to the MCP client mid-call through
    /// `toolguard:plugin/client` (none by default: importing it is refused).
    pub ask_client: Vec<super::QuestionKind>,
}

impl PluginPolicy {
    /// Whether a publisher's signature is asked for (a key or a keyless identity).
    pub fn asks_signature(&self) -> bool {
        !self.signed_by.is_empty() || !self.signed_by_identity.is_empty()
    }

    /// The publishers it names, in words: each key's file and fingerprint, each identity.
    pub fn publishers(&self) -> Vec<String> {
        let keys = self.signed_by.iter().map(|k| format!("{} ({})", k.label, k.fingerprint));
        keys.chain(self.signed_by_identity.iter().map(crate::registry::keyless::Identity::label)).collect()
    }

    /// The entry of [`PluginPolicy::deny_imports`] that `import` (a name
    /// such as `wasi:filesystem/types@0.2.9`) falls under, if any.
    pub fn denies_import(&self, import: &str) -> Option<&str> {
        self.deny_imports.iter().find(|d| crate::imports::falls_under(import, d)).map(String::as_str)
    }
}

impl Default for PluginPolicy {
    fn default() -> Self {
        Self {
            reviewed: false,
            sha256: None,
            signed_by: Vec::new(),
            signed_by_identity: Vec::new(),
            locked: None,
            tools: BTreeMap::new(),
            actions: BTreeMap::new(),
            approvals: BTreeMap::new(),
            confirm_repeats: BTreeMap::new(),
            limits: BTreeMap::new(),
            grants: Vec::new(),
            max_sends_per_call: DEFAULT_MAX_SENDS_PER_CALL,
            max_irreversible_calls_per_session_hour: None,
            max_irreversible_calls_per_principal_hour: None,
            deny_imports: Vec::new(),
            ask_client: Vec::new(),
        }
    }
}
