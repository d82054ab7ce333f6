//! `toolguard audit`: what each component can reach, proved from its bytes
//! and the reviewer's policy — its digest and pin, every imported and
//! exported interface with its functions, each import's class (granted /
//! inert / forbidden), each tool's claimed and granted effect class, its
//! outbound grants, the credentials injected for it (by name, never value),
//! its budgets, and a verdict with reasons. The JSON form is documented in
//! `docs/audit.md` and `docs/audit.schema.json`.

use crate::config::{ComponentSource, Config, EngineConfig, PluginConfig};
use crate::imports::{self, ImportClass};
use crate::policy::{Budgets, Downstreams, Effect, EffectiveGrant, EffectivePolicy};
use crate::runtime::{Runtime, ToolInfo};
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

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
    fn current() -> Self {
        use crate::guard::wire;
        Self {
            max_request_headers: wire::MAX_HEADERS,
            max_header_name_bytes: wire::MAX_HEADER_NAME_BYTES,
            max_header_value_bytes: wire::MAX_HEADER_VALUE_BYTES,
            max_header_bytes: wire::MAX_HEADER_BYTES,
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
    /// `builtin:NAME` or the file.
    pub source: String,
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
    /// `match`, `mismatch`, `unpinned`, or `builtin` (embedded, so pinned by this binary).
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

/// Audits every plugin of `config`, then each extra component file.
///
/// # Errors
/// The engine cannot be set up.
pub async fn audit(config: &Config, config_path: &Path, extra: &[PathBuf]) -> Result<Report, String> {
    let mut components = Vec::new();
    for plugin in &config.plugins {
        components.push(audit_one(&config.engine, &config.compile_cache, plugin, &config.downstreams).await?);
    }
    for path in extra {
        let name = path.file_stem().map_or_else(|| "component".into(), |s| s.to_string_lossy().into_owned());
        let plugin = PluginConfig {
            name,
            component: ComponentSource::File(path.clone()),
            limits: Default::default(),
            settings: Default::default(),
            tool_prefix: String::new(),
            policy: Default::default(),
        };
        components.push(audit_one(&config.engine, &config.compile_cache, &plugin, &config.downstreams).await?);
    }
    let verdict = if components.iter().all(|c| c.verdict == Verdict::PASS) { Verdict::PASS } else { Verdict::FAIL };
    Ok(Report {
        schema: SCHEMA,
        config: config_path.display().to_string(),
        policy: config.policy_source.clone(),
        verdict,
        limits: LimitsReport::current(),
        components,
    })
}

async fn audit_one(engine: &EngineConfig, cache: &Path, plugin: &PluginConfig, downstreams: &Downstreams) -> Result<ComponentReport, String> {
    let policy = &plugin.policy;
    let mut reasons = Vec::new();
    let mut notes = Vec::new();
    let bytes = match &plugin.component {
        ComponentSource::Builtin(b) => crate::builtin::component(b).map(<[u8]>::to_vec).ok_or_else(|| format!("no builtin `{b}`")),
        ComponentSource::File(p) => std::fs::read(p).map_err(|e| format!("cannot read {}: {e}", p.display())),
    };
    let (sha256, imports, exports) = match &bytes {
        Ok(bytes) => {
            let (mut imports, exports) = match interfaces(bytes) {
                Ok(found) => found,
                Err(e) => {
                    reasons.push(format!("not a usable component: {e}"));
                    (Vec::new(), Vec::new())
                }
            };
            imports.extend(crate::seal::record_of(bytes).into_iter().flat_map(|r| r.sealed).map(|name| InterfaceReport {
                name,
                class: Some(ImportClass::Sealed),
                why: Some("sealed: composed under a stub whose every function traps (toolguard seal); not imported from the host".into()),
                functions: Vec::new(),
            }));
            (Some(hex::encode(Sha256::digest(bytes))), imports, exports)
        }
        Err(e) => {
            reasons.push(e.clone());
            (None, Vec::new(), Vec::new())
        }
    };
    let builtin = matches!(plugin.component, ComponentSource::Builtin(_));
    let pin = match (&policy.sha256, &sha256) {
        (Some(expected), Some(actual)) if expected == actual => PinReport { status: "match", expected: Some(expected.clone()) },
        (Some(expected), actual) => {
            reasons.push(format!("sha256 {} does not match the pin {expected}", actual.as_deref().unwrap_or("?")));
            PinReport { status: "mismatch", expected: Some(expected.clone()) }
        }
        (None, _) if builtin => PinReport { status: "builtin", expected: None },
        (None, _) => {
            reasons.push(format!("not pinned: set policy.plugins.{}.sha256 to the reviewed build's digest", plugin.name));
            PinReport { status: "unpinned", expected: None }
        }
    };
    let forbidden: Vec<&str> = imports.iter().filter(|i| i.class == Some(ImportClass::Forbidden)).map(|i| i.name.as_str()).collect();
    if !forbidden.is_empty() {
        reasons.push(format!("imports interfaces the host never grants: {}", forbidden.join(", ")));
    }
    let denied: Vec<&str> = imports.iter().filter(|i| policy.denies_import(&i.name).is_some()).map(|i| i.name.as_str()).collect();
    if !denied.is_empty() {
        reasons.push(format!("imports or carries sealed what policy.plugins.{}.deny_imports forbids: {}", plugin.name, denied.join(", ")));
    }
    if !policy.reviewed {
        reasons.push(format!("not in the policy: no [policy.plugins.{}], so its tools' classes are unreviewed and it has no grants", plugin.name));
    }

    // Load it (compile, link, describe) when nothing above already rules it out.
    let mut tools = Vec::new();
    // Loaded, its effective policy is the one the host would enforce; refused,
    // the policy's own part of it (no tools).
    let mut effective = None;
    if reasons.iter().all(|r| !r.starts_with("sha256") && !r.starts_with("imports") && !r.starts_with("not a usable") && !r.starts_with("cannot read")) {
        let needs = bytes.as_ref().ok().and_then(|b| crate::runtime::Footprint::of(b).ok()).unwrap_or_default();
        let engine = engine.fitted_to(needs);
        let mut runtime = Runtime::new(&engine, cache.to_path_buf()).map_err(|e| e.to_string())?.with_downstreams(downstreams.clone());
        match runtime.add_plugin(plugin).await {
            Ok(()) => {
                tools = runtime.tools().map(|t| tool_report(t, policy.grants.is_empty())).collect();
                notes.extend(runtime.tools().filter_map(loose_note));
                effective = runtime.effective_policy(&plugin.name).cloned();
            }
            Err(e) => reasons.push(e.to_string()),
        }
    }
    let effective = effective.unwrap_or_else(|| EffectivePolicy::of(policy, Vec::new(), downstreams));
    for t in tools.iter().filter(|t| !t.reviewed && policy.reviewed) {
        notes.push(format!("the class of tool `{}` is not reviewed: enforced as {}", t.name, t.granted.as_str()));
    }
    for t in tools.iter().filter(|t| t.claimed != t.granted) {
        notes.push(format!("tool `{}` claims {} but is enforced as {}", t.name, t.claimed.as_str(), t.granted.as_str()));
    }
    let grants = effective.grants.clone();
    let credentials = credential_reports(&effective, downstreams);
    let keys = key_reports(&grants, downstreams);
    for c in credentials.iter().filter(|c| !c.available) {
        notes.push(format!("the credential for `{}` ({}) is not available here; the host will not start without it", c.downstream, c.source));
    }
    for g in grants.iter().filter(|g| g.transport != "https") {
        let beyond = if g.transport == "http (insecure_http)" { ", beyond loopback (insecure_http = true)" } else { " (loopback)" };
        notes.push(format!("`{}` is reached over plain HTTP{beyond}: requests and any credential travel unencrypted", g.downstream));
    }
    let verdict = if reasons.is_empty() { Verdict::PASS } else { Verdict::FAIL };
    Ok(ComponentReport {
        plugin: plugin.name.clone(),
        source: plugin.component.to_string(),
        sha256,
        pin,
        imports,
        exports,
        tools,
        grants,
        credentials,
        keys,
        budgets: effective.budgets,
        verdict,
        reasons,
        notes,
    })
}

fn tool_report(t: &ToolInfo, no_grants: bool) -> ToolReport {
    ToolReport {
        name: t.name.clone(),
        claimed: t.claimed,
        granted: t.effect,
        reviewed: t.reviewed,
        may_send: t.effect != Effect::ReadOnly && !no_grants,
        action: t.action.as_ref().map(|a| a.pointers().to_vec()),
    }
}

/// For an irreversible tool whose arguments can vary without naming another
/// action (and whose action the reviewer did not declare), what varies: a
/// blind repeat changed there is not held.
fn loose_note(t: &ToolInfo) -> Option<String> {
    if t.effect != Effect::Irreversible || t.action.is_some() {
        return None;
    }
    let loose = t.input_schema.loose_arguments();
    (!loose.is_empty()).then(|| {
        format!(
            "irreversible tool `{}` takes arguments that can vary without naming another action: {}; the hold rule holds only identical repeats, so a blind repeat that changes one of them runs; the policy's `action` can name the arguments that identify it (docs/keys.md)",
            t.name,
            loose.join(", ")
        )
    })
}

/// The credentials the host injects for a plugin, each with whether it can be read here now.
fn credential_reports(effective: &EffectivePolicy, downstreams: &Downstreams) -> Vec<CredentialReport> {
    effective
        .credentials
        .iter()
        .map(|c| CredentialReport {
            downstream: c.downstream.clone(),
            header: c.header.clone(),
            source: c.source.clone(),
            available: downstreams.get(&c.downstream).and_then(|d| d.credential.as_ref()).is_some_and(|spec| spec.resolve().is_ok()),
        })
        .collect()
}

/// Where the key goes on each downstream the grants reach, once each.
fn key_reports(grants: &[EffectiveGrant], downstreams: &Downstreams) -> Vec<KeyReport> {
    let mut names: Vec<&str> = grants.iter().map(|g| g.downstream.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    names
        .into_iter()
        .filter_map(|name| downstreams.get(name).map(|d| (name, d)))
        .map(|(name, d)| KeyReport {
            downstream: name.to_string(),
            transports: d.keys.iter().map(crate::policy::KeyTransport::describe).collect(),
            format: d.key_format.as_str(),
        })
        .collect()
}

/// The component's imports (classified) and exports, with their functions,
/// decoded from its embedded WIT.
fn interfaces(bytes: &[u8]) -> Result<(Vec<InterfaceReport>, Vec<InterfaceReport>), String> {
    imports::component_imports(bytes)?; // validates, and refuses core modules
    let decoded = wit_parser::decoding::decode(bytes).map_err(|e| format!("{e:#}"))?;
    let wit_parser::decoding::DecodedWasm::Component(resolve, world) = decoded else {
        return Err("a WIT package, not a component".into());
    };
    let describe = |items: &wit_parser::IndexMap<wit_parser::WorldKey, wit_parser::WorldItem>, classify: bool| -> Vec<InterfaceReport> {
        items
            .iter()
            .filter_map(|(key, item)| {
                let name = resolve.name_world_key(key);
                let functions = match item {
                    wit_parser::WorldItem::Interface { id, .. } => resolve.interfaces[*id].functions.keys().cloned().collect(),
                    wit_parser::WorldItem::Function(f) => vec![f.name.clone()],
                    wit_parser::WorldItem::Type { .. } => return None,
                };
                let (class, why) = if classify { (Some(imports::classify(&name)), Some(imports::why(&name).to_string())) } else { (None, None) };
                Some(InterfaceReport { class, why, name, functions })
            })
            .collect()
    };
    let world = &resolve.worlds[world];
    Ok((describe(&world.imports, true), describe(&world.exports, false)))
}

/// The human rendering of a report.
pub fn render(report: &Report) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(out, "toolguard audit — config {}, policy {}", report.config, report.policy);
    let l = &report.limits;
    let _ = writeln!(
        out,
        "limits: plugin requests up to {} headers ({} bytes a name, {} a value, {} together); numbers in arguments up to ±{}; ids up to {} bytes\n",
        l.max_request_headers, l.max_header_name_bytes, l.max_header_value_bytes, l.max_header_bytes, l.max_exact_number, l.max_id_bytes
    );
    for c in &report.components {
        let _ = writeln!(out, "{}  {:?}", c.plugin, c.verdict);
        let _ = writeln!(out, "  component    {}", c.source);
        let pin = match c.pin.status {
            "builtin" => " (embedded: pinned by this binary)",
            "match" => " (matches the pin)",
            "mismatch" => " (DOES NOT MATCH the pin)",
            _ => " (unpinned)",
        };
        let _ = writeln!(out, "  sha256       {}{pin}", c.sha256.as_deref().unwrap_or("-"));
        for (i, imp) in c.imports.iter().enumerate() {
            let class = imp.class.map_or("", |k| match k {
                ImportClass::Granted => "granted",
                ImportClass::Inert => "inert",
                ImportClass::Sealed => "sealed",
                ImportClass::Forbidden => "FORBIDDEN",
            });
            let label = if i == 0 { "imports" } else { "" };
            let why = imp.why.as_deref().map(|w| format!(" — {w}")).unwrap_or_default();
            let functions = if imp.functions.is_empty() { String::new() } else { format!(" [{}]", imp.functions.join(", ")) };
            let _ = writeln!(out, "  {label:<12} {:<40} {class:<9}{functions}{why}", imp.name);
        }
        for (i, exp) in c.exports.iter().enumerate() {
            let label = if i == 0 { "exports" } else { "" };
            let _ = writeln!(out, "  {label:<12} {:<40} [{}]", exp.name, exp.functions.join(", "));
        }
        for (i, t) in c.tools.iter().enumerate() {
            let label = if i == 0 { "tools" } else { "" };
            let reviewed = if t.reviewed { "reviewed" } else { "unreviewed" };
            let _ = writeln!(
                out,
                "  {label:<12} {:<16} claimed {:<13} granted {:<13} {reviewed}{}{}",
                t.name,
                t.claimed.as_str(),
                t.granted.as_str(),
                if t.may_send { ", may send" } else { "" },
                t.action.as_ref().map(|a| format!("; its action: {}", a.join(", "))).unwrap_or_default()
            );
        }
        if c.grants.is_empty() {
            let _ = writeln!(out, "  grants       none: it reaches nothing");
        }
        for (i, g) in c.grants.iter().enumerate() {
            let label = if i == 0 { "grants" } else { "" };
            let encoded = if g.allow_encoded_path { ", ENCODED PATHS ALLOWED" } else { "" };
            let _ = writeln!(out, "  {label:<12} {} {} ({}; bodies up to {} bytes{encoded})", g.methods.join(","), g.url, g.downstream, g.max_request_bytes);
            let clear = if g.transport == "http (insecure_http)" { " — IN CLEAR beyond loopback" } else { "" };
            let mut route = format!("{}{clear}", g.transport);
            if let Some(t) = &g.tls {
                let roots = match (&t.ca_file, t.platform_roots) {
                    (Some(ca), true) => format!("platform roots + {ca}"),
                    (Some(ca), false) => format!("only {ca}"),
                    (None, _) => "platform roots".into(),
                };
                let mtls = t.client_certificate.as_ref().map_or(String::new(), |c| format!(", client certificate {c}"));
                let pins = if t.spki_pins > 0 { format!(", {} SPKI pin(s)", t.spki_pins) } else { String::new() };
                route.push_str(&format!(", TLS {}+, {roots}{mtls}{pins}", t.min_version));
            }
            if let Some(p) = &g.proxy {
                route.push_str(&format!(", through proxy {p}"));
            }
            let _ = writeln!(out, "  {:<12} {route}", "");
        }
        for c in &c.credentials {
            let state = if c.available { "available" } else { "NOT available" };
            let _ = writeln!(out, "  credential   {}: {} from {} ({state})", c.downstream, c.header, c.source);
        }
        for k in &c.keys {
            let _ = writeln!(out, "  keys         {}: {} ({} format)", k.downstream, k.transports.join(", "), k.format);
        }
        let per_hour = |n: Option<u32>| n.map_or("unlimited".to_string(), |n| n.to_string());
        let _ = writeln!(
            out,
            "  budgets      {} sends per call; {} irreversible calls per session per hour, {} per principal per hour",
            c.budgets.max_sends_per_call,
            per_hour(c.budgets.max_irreversible_calls_per_session_hour),
            per_hour(c.budgets.max_irreversible_calls_per_principal_hour)
        );
        for r in &c.reasons {
            let _ = writeln!(out, "  FAIL         {r}");
        }
        for n in &c.notes {
            let _ = writeln!(out, "  note         {n}");
        }
        out.push('\n');
    }
    let failed = report.components.iter().filter(|c| c.verdict == Verdict::FAIL).count();
    let _ = writeln!(out, "verdict: {:?} ({failed} of {} components fail)", report.verdict, report.components.len());
    out
}
