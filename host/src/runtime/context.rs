//! What every invocation of one plugin shares: its name, settings, limits,
//! the room it takes in the instance pool, and the grants of its effective
//! policy.

use crate::config::{Footprint, Limits};
use crate::policy::Grant;
use std::collections::BTreeMap;
use std::sync::Arc;

/// What one plugin's invocations share: its name, settings, limits and grants.
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
    pub footprint: Footprint,
    /// What `outbound` may reach: its effective policy's grants.
    pub grants: Arc<[Grant]>,
    /// The downstreams those grants resolve against, with their
    /// credentials and HTTP clients (of the configuration that loaded it).
    pub wires: Arc<crate::guard::Wires>,
}
