//! The audit's report: what it found for each component, as `toolguard
//! audit --json` prints it (`docs/audit.md`, `docs/audit.schema.json`).

use crate::imports::ImportClass;
use crate::policy::{Budgets, Effect, EffectiveGrant};
use serde::Serialize;

/// The version of the JSON report's schema.
pub const SCHEMA: &str = "toolguard-audit/1";

/// PASS or FAIL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Verdict {
    /// Every check passed.
    PASS,
    /// At least one check failed; the reasons say which.
    FAIL,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The report format's identifier (`docs/audit.schema.json`).
    pub schema: &'static str,
    /// The config file audited.
    pub config: String,
    /// Where the policy came from.
    pub policy: String,
    /// FAIL if any component fails.
    pub verdict: Verdict,
    /// What every plugin request and every tool call is held to, host-wide.
    pub limits: LimitsReport,
    /// One report per component: configured plugins first, then extra files.
    pub components: Vec<ComponentReport>,
}

/// The host-wide limits on what plugins and clients hand the host
/// (`docs/policy.md`, "Limits on requests"; `docs/mcp.md`).
#[derive(Debug, Clone, Serialize)]
pub struct LimitsReport {
    /// Most headers a plugin request may carry.
    pub max_request_headers: usize,
    /// Longest header name, in bytes.
    pub max_header_name_bytes: usize,
    /// Longest header value, in bytes.
    pub max_header_value_bytes: usize,
    /// Most header bytes in one request, names and values together.
    pub max_header_bytes: usize,
    /// The largest magnitude of a number in tool arguments (2^53 − 1).
    pub max_exact_number: u64,
    /// The longest tool-call or session id a caller may send, in bytes.
    pub max_id_bytes: usize,
}

impl LimitsReport {
    pub(super) fn current() -> Self {
        Self {
            max_request_headers: crate::net::http::MAX_HEADERS,
            max_header_name_bytes: crate::net::http::MAX_HEADER_NAME_BYTES,
            max_header_value_bytes: crate::net::http::MAX_HEADER_VALUE_BYTES,
            max_header_bytes: crate::net::http::MAX_HEADER_BYTES,
            max_exact_number: crate::keys::MAX_EXACT_NUMBER,
            max_id_bytes: crate::runtime::MAX_ID_BYTES,
        }
    }
}

/// One component.
#[derive(Debug, Clone, Serialize)]
pub struct ComponentReport {
    /// The plugin name (a file's stem for a component not in the config).
    pub plugin: String,
    /// `builtin:NAME`, the file, or the `oci://` reference.
    pub source: String,
    /// For a registry component: the resolved digest, when it was pulled, who signed it.
    pub registry: Option<super::RegistryReport>,
    /// Lower-case hex sha256 of the component, if it could be read.
    pub sha256: Option<String>,
    /// The component's sha256 against the policy's pin.
    pub pin: PinReport,
    /// Imported interfaces (and bare functions), each classified.
    pub imports: Vec<InterfaceReport>,
    /// Exported interfaces (and bare functions).
    pub exports: Vec<InterfaceReport>,
    /// Each tool: the effect claimed, the effect granted, whether reviewed.
    pub tools: Vec<ToolReport>,
    /// Where it may reach: one row per grant.
    pub grants: Vec<EffectiveGrant>,
    /// Credentials the host injects for it (never seen by the plugin).
    pub credentials: Vec<CredentialReport>,
    /// Where the host puts the idempotency key on guarded sends, per granted downstream.
    pub keys: Vec<KeyReport>,
    /// Its send and irreversible-call budgets.
    pub budgets: Budgets,
    /// What one invocation runs under.
    pub limits: crate::config::Limits,
    /// The kinds of question it may put to the MCP client mid-call (`ask_client`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ask_client: Vec<crate::policy::QuestionKind>,
    /// PASS or FAIL for this component.
    pub verdict: Verdict,
    /// Why it fails (empty on PASS).
    pub reasons: Vec<String>,
    /// Observations that do not fail it.
    pub notes: Vec<String>,
}

/// The sha256 pin.
#[derive(Debug, Clone, Serialize)]
pub struct PinReport {
    /// `match`, `mismatch`, `unpinned`, `builtin` (embedded, so pinned by
    /// this binary), `signed` (not pinned: a publisher's signature vouches),
    /// or `digest` (referenced by manifest digest, which fixes its bytes).
    pub status: &'static str,
    /// The pin in the policy, if any.
    pub expected: Option<String>,
}

/// One imported or exported interface.
#[derive(Debug, Clone, Serialize)]
pub struct InterfaceReport {
    /// E.g. `wasi:io/poll@0.2.6`.
    pub name: String,
    /// For imports: how the host treats it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub class: Option<ImportClass>,
    /// For imports: why that class (what the host links there, or why not).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    /// The functions of the interface the component uses.
    pub functions: Vec<String>,
}

/// One tool.
#[derive(Debug, Clone, Serialize)]
pub struct ToolReport {
    /// The tool's name as the plugin describes it.
    pub name: String,
    /// The class the plugin claims.
    pub claimed: Effect,
    /// The class the host enforces.
    pub granted: Effect,
    /// Whether the reviewer classified it.
    pub reviewed: bool,
    /// Whether it can make side-effecting requests at all (not read-only, and grants exist).
    pub may_send: bool,
    /// The arguments that name its action, where the reviewer declared them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub action: Option<Vec<String>>,
    /// When a person must approve a call before it runs, in words, where the reviewer asks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approval: Option<String>,
    /// Minutes within which a repeat of an action carried out needs a person's confirmation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub confirm_repeat_within_minutes: Option<u64>,
    /// How much its calls may move (policy `limits`; `docs/policy.md#limits`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub spending_limits: Vec<crate::policy::limits::Limit>,
    /// The OAuth scopes a call of it needs (`[mcp.oauth.scopes]`), if any.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub scopes: Vec<String>,
    /// What it tells the model it does (its MCP description).
    pub description: String,
    /// The JSON Schema its arguments must satisfy.
    pub input_schema: serde_json::Value,
    /// The JSON Schema of its result, if it promises one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<serde_json::Value>,
}

/// A credential the host injects on a granted downstream.
#[derive(Debug, Clone, Serialize)]
pub struct CredentialReport {
    /// The downstream the credential is for.
    pub downstream: String,
    /// The header it is injected into.
    pub header: String,
    /// `env:NAME` or `file:PATH` — never the value.
    pub source: String,
    /// Whether it can be read right now.
    pub available: bool,
}

/// How the host attaches its idempotency key to a granted downstream's sends.
#[derive(Debug, Clone, Serialize)]
pub struct KeyReport {
    /// The downstream.
    pub downstream: String,
    /// Each place the key goes: `header NAME`, `sf-string NAME`,
    /// `form-field NAME`, `json-field NAME` or `query NAME`.
    pub transports: Vec<String>,
    /// How it is written: `toolguard`, `uuid` or `hex`.
    pub format: &'static str,
}
