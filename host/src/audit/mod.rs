//! `toolguard audit`: what each component can reach, proved from its bytes
//! and the reviewer's policy — its digest and pin, every imported and
//! exported interface with its functions, each import's class (granted /
//! inert / forbidden), each tool's claimed and granted effect class, its
//! outbound grants, the credentials injected for it (by name, never value),
//! its budgets, and a verdict with reasons. The JSON form is documented in
//! `docs/audit.md` and `docs/audit.schema.json`.

mod against_lock;
mod diff;
mod registry;
mod render;
mod report;
mod rules;
mod sarif;

use crate::config::{ComponentSource, Config, EngineConfig, PluginConfig};
use crate::imports::{self, ImportClass};
use crate::policy::{Downstreams, Effect, EffectiveGrant, EffectivePolicy};
use crate::runtime::source::{Component, Sources, Unchecked};
use crate::runtime::{Runtime, ToolInfo};
pub use against_lock::diff_lock;
pub use diff::{Direction, Finding, RULES, Rule, diff};
pub use registry::{RegistryReport, SignatureReport};
pub use render::render;
pub use report::{ComponentReport, CredentialReport, InterfaceReport, KeyReport, LimitsReport, PinReport, Report, SCHEMA, ToolReport, Verdict};
pub use sarif::{Location, sarif};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

/// The lock of what `report` found: each component's digests, signer,
/// imports (not those sealed) and each tool's description and schemas.
pub fn lock_of(report: &Report) -> crate::policy::lock::Lock {
    use crate::policy::lock::{Lock, LockedPlugin, LockedTool, SCHEMA, import_list};
    let plugins = report
        .components
        .iter()
        .filter_map(|c| {
            let imports = import_list(c.imports.iter().filter(|i| i.class != Some(ImportClass::Sealed)).map(|i| i.name.as_str()));
            let tools = c
                .tools
                .iter()
                .map(|t| {
                    (
                        t.name.clone(),
                        LockedTool { description: t.description.clone(), input_schema: t.input_schema.clone(), output_schema: t.output_schema.clone() },
                    )
                })
                .collect();
            let registry = c.registry.as_ref();
            let plugin = LockedPlugin {
                sha256: c.sha256.clone()?,
                manifest_digest: registry.map(|r| r.manifest_digest.clone()),
                signer: registry.and_then(|r| r.signature.fingerprint.clone()),
                imports,
                tools,
            };
            Some((c.plugin.clone(), plugin))
        })
        .collect();
    Lock { schema: SCHEMA.into(), plugins }
}

/// Audits every plugin of `config`, then each extra component file.
///
/// # Errors
/// The engine cannot be set up.
pub async fn audit(config: &Config, config_path: &Path, extra: &[PathBuf]) -> Result<Report, String> {
    let mut components = Vec::new();
    let sources = crate::runtime::source::Sources::of(config);
    for plugin in &config.plugins {
        components.push(audit_one(&config.engine, &config.compile_cache, &sources, plugin, &config.downstreams).await?);
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
        components.push(audit_one(&config.engine, &config.compile_cache, &sources, &plugin, &config.downstreams).await?);
    }
    if let Some(oauth) = &config.mcp.oauth {
        for c in &mut components {
            for t in &mut c.tools {
                t.scopes = oauth.scopes.needed(&t.name, &c.plugin, t.granted.as_str());
            }
        }
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

async fn audit_one(
    engine: &EngineConfig,
    cache: &Path,
    sources: &Sources,
    plugin: &PluginConfig,
    downstreams: &Downstreams,
) -> Result<ComponentReport, String> {
    let policy = &plugin.policy;
    let mut reasons = Vec::new();
    let mut notes = Vec::new();
    let found = sources.fetch(plugin).await;
    let (registry, provenance) = match &found {
        Ok(Unchecked { fetched: Some(f), .. }) => {
            let (report, provenance) = registry::report(plugin, f, &mut reasons);
            (Some(report), provenance)
        }
        _ => (None, None),
    };
    let bytes = found.map(|u| u.bytes).map_err(|e| format!("cannot read: {e}"));
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
        (None, _) if registry.as_ref().is_some_and(|r| r.signature.status != "not-required") => PinReport { status: "signed", expected: None },
        // `oci://…@sha256:D`: the manifest digest fixes the bytes, as the start admits it (docs/distribution.md).
        (None, _) if matches!(&plugin.component, ComponentSource::Oci(r) if r.digest.is_some()) => PinReport { status: "digest", expected: None },
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
    if let Some(client) = imports.iter().find(|i| crate::imports::falls_under(&i.name, crate::imports::CLIENT)).filter(|_| policy.ask_client.is_empty()) {
        reasons.push(format!("imports {} (questions to the MCP client) but policy.plugins.{}.ask_client grants none", client.name, plugin.name));
    }
    if !policy.reviewed {
        reasons.push(format!("not in the policy: no [policy.plugins.{}], so its tools' classes are unreviewed and it has no grants", plugin.name));
    }

    // Load it (compile, link, describe) when nothing above already rules it out.
    let mut tools = Vec::new();
    // Loaded, its effective policy is the one the host would enforce; refused,
    // the policy's own part of it (no tools).
    let mut effective = None;
    let refused = |r: &String| ["sha256", "imports", "not a usable", "cannot read", "plugin `"].iter().any(|p| r.starts_with(p));
    if !reasons.iter().any(refused)
        && let Ok(bytes) = &bytes
    {
        let needs = crate::runtime::Footprint::of(bytes).unwrap_or_default();
        let engine = engine.fitted_to(needs);
        let mut runtime = Runtime::new(&engine, cache.to_path_buf()).map_err(|e| e.to_string())?.with_downstreams(downstreams.clone());
        let component = Component { bytes: bytes.clone(), sha256: sha256.clone().unwrap_or_default(), provenance };
        match runtime.add_component(plugin, component).await {
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
        registry,
        sha256,
        pin,
        imports,
        exports,
        tools,
        grants,
        credentials,
        keys,
        budgets: effective.budgets,
        limits: plugin.limits,
        ask_client: policy.ask_client.clone(),
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
        approval: t.approval.as_ref().map(approval_words),
        confirm_repeat_within_minutes: t.confirm_repeat_ms.map(|ms| ms / 60_000),
        spending_limits: t.limits.clone(),
        scopes: Vec::new(),
        description: t.description.clone(),
        input_schema: t.input_schema.json().clone(),
        output_schema: t.output_schema.as_ref().map(|s| s.json().clone()),
    }
}

/// An approval rule in words: when it asks, and how long a request waits.
fn approval_words(rule: &crate::policy::ApprovalRule) -> String {
    let when =
        if rule.always { "every call".to_string() } else { rule.above.iter().map(|(p, line)| format!("{p} above {line}")).collect::<Vec<_>>().join(" or ") };
    format!("{when}; a request waits {} min", rule.expires_minutes)
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
