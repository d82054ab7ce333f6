//! One plugin's effective policy: what the reviewer's policy lets it do once
//! it is loaded — each tool's enforced effect class, the URLs its grants
//! open and how requests there travel, the credentials the host injects for
//! it, its budgets. Computed once when the plugin loads; the runtime enforces
//! it, the audit shows it, and the ledger's grant history records it (this
//! value, serialised, is the history entry).

use super::{Downstream, Downstreams, Effect, Grant, PluginPolicy, TlsPolicy, is_loopback};
use serde::Serialize;
use std::sync::Arc;

/// What one loaded plugin may do.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EffectivePolicy {
    /// Each tool with the class the host enforces.
    pub tools: Vec<ToolClass>,
    /// Where it may reach: one entry per grant.
    pub grants: Vec<EffectiveGrant>,
    /// The credentials the host injects on its granted downstreams (never their values).
    pub credentials: Vec<InjectedCredential>,
    /// Its send and irreversible-call budgets.
    pub budgets: Budgets,
    /// When a person must approve a call of an irreversible tool, by tool.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub approvals: std::collections::BTreeMap<String, super::ApprovalRule>,
    /// Minutes within which a repeat of an irreversible tool's action needs confirmation, by tool.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub confirm_repeats: std::collections::BTreeMap<String, u64>,
    /// How much each irreversible tool's calls may move, by tool (`policy/limits.rs`).
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub limits: std::collections::BTreeMap<String, Vec<super::limits::Limit>>,
    /// The kinds of question it may put to the MCP client mid-call (`ask_client`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ask_client: Vec<super::QuestionKind>,
    /// The grants as the reviewer wrote them: what each request is authorised against.
    #[serde(skip)]
    pub rules: Arc<[Grant]>,
}

/// A tool and the effect class the host enforces on it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ToolClass {
    /// The tool's name as the host serves it.
    pub name: String,
    /// The class enforced: the reviewer's, or the plugin's claim restricted.
    pub effect: Effect,
    /// Whether the reviewer classified it.
    pub reviewed: bool,
}

/// One outbound grant, resolved against its downstream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EffectiveGrant {
    /// The downstream the grant points at.
    pub downstream: String,
    /// The URL prefix it opens: the downstream's origin and base path plus the path prefix.
    pub url: String,
    /// The HTTP methods it allows.
    pub methods: Vec<String>,
    /// Whether its paths may carry encoded separators, `%25` or `;` parameters.
    pub allow_encoded_path: bool,
    /// The largest request body a plugin may send to its downstream, in bytes.
    pub max_request_bytes: usize,
    /// How requests travel: `https`, `http (loopback)`, or `http (insecure_http)`.
    pub transport: String,
    /// The proxy they go through, if any.
    pub proxy: Option<String>,
    /// TLS as the policy sets it (for `https`).
    pub tls: Option<TlsView>,
}

/// A downstream's TLS, as the policy sets it (never a key).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TlsView {
    /// Whether the platform's root certificates are trusted.
    pub platform_roots: bool,
    /// An extra CA file the reviewer named, if any.
    pub ca_file: Option<String>,
    /// `file:PATH` or `env:NAME` of the client key, with the certificate file, for mutual TLS.
    pub client_certificate: Option<String>,
    /// How many SPKI pins the connection must match.
    pub spki_pins: usize,
    /// The minimum TLS version.
    pub min_version: String,
}

/// A credential the host injects on a granted downstream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InjectedCredential {
    /// The downstream the credential is for.
    pub downstream: String,
    /// The header it is injected into.
    pub header: String,
    /// `env:NAME` or `file:PATH` — never the value.
    pub source: String,
}

/// A plugin's budgets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Budgets {
    /// Most sends one tool call may make.
    pub max_sends_per_call: u32,
    /// Most irreversible calls per session per hour (none: unlimited).
    pub max_irreversible_calls_per_session_hour: Option<u32>,
    /// Most irreversible calls per principal per hour (none: unlimited).
    pub max_irreversible_calls_per_principal_hour: Option<u32>,
}

impl EffectivePolicy {
    /// The effective policy of a plugin whose reviewer's part is `policy`,
    /// offering `tools`, its grants resolved against `downstreams`.
    pub fn of(policy: &PluginPolicy, tools: Vec<ToolClass>, downstreams: &Downstreams) -> Self {
        let grants = policy.grants.iter().map(|g| EffectiveGrant::of(g, downstreams.get(&g.downstream).map(|d| &**d))).collect();
        let mut names: Vec<&str> = policy.grants.iter().map(|g| g.downstream.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        let credentials = names
            .into_iter()
            .filter_map(|name| {
                let spec = downstreams.get(name)?.credential.as_ref()?;
                Some(InjectedCredential { downstream: name.into(), header: spec.header.clone(), source: spec.source() })
            })
            .collect();
        let budgets = Budgets {
            max_sends_per_call: policy.max_sends_per_call,
            max_irreversible_calls_per_session_hour: policy.max_irreversible_calls_per_session_hour,
            max_irreversible_calls_per_principal_hour: policy.max_irreversible_calls_per_principal_hour,
        };
        Self {
            tools,
            grants,
            credentials,
            budgets,
            approvals: policy.approvals.clone(),
            confirm_repeats: policy.confirm_repeats.clone(),
            limits: policy.limits.clone(),
            ask_client: policy.ask_client.clone(),
            rules: policy.grants.clone().into(),
        }
    }

    /// sha256 of its grant-history entry: what an approval is bound to.
    pub fn digest(&self) -> String {
        use sha2::Digest as _;
        hex::encode(sha2::Sha256::digest(self.to_record().to_string().as_bytes()))
    }

    /// Its entry in the ledger's grant history.
    pub fn to_record(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("an effective policy is plain data")
    }
}

impl EffectiveGrant {
    /// Grant `g`, resolved against its downstream `d` (missing: shown without a URL base).
    fn of(g: &Grant, d: Option<&Downstream>) -> Self {
        let base = d.map_or_else(String::new, |d| d.origin.as_str().trim_end_matches('/').to_string());
        let prefix = g.path_prefix.trim_start_matches('/');
        Self {
            downstream: g.downstream.clone(),
            url: format!("{base}/{prefix}"),
            methods: g.methods.clone(),
            allow_encoded_path: g.allow_encoded_path,
            max_request_bytes: d.map_or(super::DEFAULT_MAX_REQUEST_BYTES, |d| d.max_request_bytes),
            transport: d.map_or_else(String::new, transport),
            proxy: d.and_then(|d| d.proxy.as_ref().map(|p| p.to_string())),
            tls: d.filter(|d| d.origin.scheme() == "https").map(|d| TlsView::of(&d.tls)),
        }
    }
}

/// How requests to `d` travel, in the audit's words.
fn transport(d: &Downstream) -> String {
    match d.origin.scheme() {
        "https" => "https".into(),
        _ if is_loopback(&d.origin) => "http (loopback)".into(),
        _ => "http (insecure_http)".into(),
    }
}

impl TlsView {
    fn of(t: &TlsPolicy) -> Self {
        let key = t.client_key_file.as_ref().map(|f| format!("file:{}", f.display())).or_else(|| t.client_key_env.as_ref().map(|v| format!("env:{v}")));
        Self {
            platform_roots: t.platform_roots,
            ca_file: t.ca_file.as_ref().map(|f| f.display().to_string()),
            client_certificate: t.client_cert_file.as_ref().map(|c| format!("{} (key {})", c.display(), key.unwrap_or_default())),
            spki_pins: t.spki_sha256.len(),
            min_version: t.min_version.clone().unwrap_or_else(|| "1.2".into()),
        }
    }
}
