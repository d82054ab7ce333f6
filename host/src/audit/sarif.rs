//! The review as SARIF 2.1.0, for code scanning: one rule per kind of
//! change (its id, its help for the reviewer), one result per finding —
//! an unacknowledged widening an `error`, anything else a `note`, an
//! acknowledged one suppressed — each pointing into the config (or policy)
//! file where the plugin or its policy is written, with the finding's
//! fingerprint as its stable `partialFingerprints`.

use super::diff::{Direction, Finding, RULES};
use serde_json::{Value, json};

/// Where a finding is written: a file (as given) and its 1-based line.
pub struct Location {
    /// The file, as a relative or absolute path.
    pub uri: String,
    /// Its line.
    pub line: usize,
}

/// The SARIF log of a review; `locate` places each finding.
pub fn sarif(findings: &[Finding], locate: &dyn Fn(&Finding) -> Location) -> Value {
    let rules: Vec<Value> = RULES
        .iter()
        .map(|r| {
            let level = if r.direction == Direction::Widening { "error" } else { "note" };
            json!({
                "id": r.id,
                "name": r.id.split('-').map(|w| { let mut c = w.chars(); c.next().map(|f| f.to_uppercase().collect::<String>() + c.as_str()).unwrap_or_default() }).collect::<String>(),
                "shortDescription": { "text": r.help.split(':').next().unwrap_or(r.help) },
                "fullDescription": { "text": r.help },
                "help": { "text": format!("{} Acknowledge a reviewed widening with `toolguard audit --against OLD --ack FINGERPRINT`.", r.help) },
                "defaultConfiguration": { "level": level },
                "properties": { "direction": r.direction },
            })
        })
        .collect();
    let results: Vec<Value> = findings
        .iter()
        .map(|f| {
            let index = RULES.iter().position(|r| r.id == f.rule).unwrap_or(0);
            let level = if f.direction == Direction::Widening && !f.acknowledged { "error" } else { "note" };
            let at = locate(f);
            let mut result = json!({
                "ruleId": f.rule,
                "ruleIndex": index,
                "level": level,
                "message": { "text": f.message },
                "locations": [{
                    "physicalLocation": { "artifactLocation": { "uri": at.uri }, "region": { "startLine": at.line.max(1) } },
                    "logicalLocations": [{ "name": f.tool.clone().unwrap_or_else(|| f.plugin.clone()), "fullyQualifiedName": qualified(f), "kind": if f.tool.is_some() { "function" } else { "module" } }],
                }],
                "partialFingerprints": { "toolguardFinding/v1": f.fingerprint },
                "properties": { "plugin": f.plugin, "tool": f.tool, "before": f.before, "after": f.after, "fingerprint": f.fingerprint },
            });
            if f.acknowledged {
                result["suppressions"] = json!([{ "kind": "external", "justification": "acknowledged by the reviewer (--ack)" }]);
            }
            result
        })
        .collect();
    json!({
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [{
            "tool": { "driver": { "name": "toolguard", "version": env!("CARGO_PKG_VERSION"), "rules": rules } },
            "automationDetails": { "id": "toolguard/review/" },
            "results": results,
        }],
    })
}

fn qualified(f: &Finding) -> String {
    f.tool.as_ref().map_or_else(|| f.plugin.clone(), |t| format!("{}/{t}", f.plugin))
}
