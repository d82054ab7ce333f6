//! `toolguard audit --against OLD`: the review of a change — both configs
//! audited, every widening and narrowing between them listed, and exit 1
//! while a widening is not acknowledged (`--ack FINGERPRINT`). Whether the
//! new configuration passes its own audit is shown beside it; `toolguard
//! audit` gates that (`docs/audit.md`, "Reviewing a change").

use super::output::Format;
use crate::audit::{Direction, Finding, Location, Verdict};
use serde_json::json;
use std::path::Path;

/// The review's JSON schema id.
const SCHEMA: &str = "toolguard-review/1";

/// Reviews the change from the config at `old` to `config`; returns the exit status.
pub(super) async fn run(config: &crate::Config, (config_path, old): (&Path, &Path), acks: &[String], format: Format) -> u8 {
    // What the configuration is held to now, whatever its lock says (the review is the lock's comparison).
    let mut unlocked = config.clone();
    unlocked.plugins.iter_mut().for_each(|p| p.policy.locked = None);
    let after = match crate::audit::audit(&unlocked, config_path, &[]).await {
        Ok(a) => a,
        Err(e) => {
            super::print_json(&json!({ "kind": "internal", "message": e }));
            return super::EXIT_CALL_FAILED;
        }
    };
    let mut findings = if old.file_name().is_some_and(|n| n.to_string_lossy().ends_with(".lock")) {
        match crate::policy::lock::Lock::read(old) {
            Ok(lock) => crate::audit::diff_lock(&lock, &after),
            Err(e) => return super::config_error(e),
        }
    } else {
        let mut old_config = match crate::Config::load(old) {
            Ok(c) => c,
            Err(e) => return super::config_error(format!("the older config: {e}")),
        };
        old_config.plugins.iter_mut().for_each(|p| p.policy.locked = None);
        match crate::audit::audit(&old_config, old, &[]).await {
            Ok(before) => crate::audit::diff(&before, &after),
            Err(e) => {
                super::print_json(&json!({ "kind": "internal", "message": e }));
                return super::EXIT_CALL_FAILED;
            }
        }
    };
    for f in &mut findings {
        f.acknowledged = acks.contains(&f.fingerprint);
    }
    let open = findings.iter().filter(|f| f.direction == Direction::Widening && !f.acknowledged).count();
    let verdict = if open == 0 { Verdict::PASS } else { Verdict::FAIL };
    if format == Format::Sarif {
        let locate = |f: &Finding| locate(config, config_path, f);
        super::print_json(&crate::audit::sarif(&findings, &locate));
    } else if format == Format::Json {
        super::print_json(&json!({
            "schema": SCHEMA,
            "config": config_path.display().to_string(),
            "against": old.display().to_string(),
            "verdict": verdict,
            "audit_verdict": after.verdict,
            "unacknowledged_widenings": open,
            "findings": findings,
        }));
    } else {
        out!("{}", render(&findings, (verdict, after.verdict), open));
    }
    if verdict == Verdict::PASS { 0 } else { super::EXIT_CALL_FAILED }
}

/// The review for a person: one line per finding, then the verdict.
fn render(findings: &[Finding], (verdict, audit): (Verdict, Verdict), open: usize) -> String {
    let mut out = String::new();
    for f in findings {
        let (kind, mark) = match (f.direction, f.acknowledged) {
            (Direction::Narrowing, _) => ("narrows", ""),
            (Direction::Widening, true) => ("WIDENS", " (acknowledged)"),
            (Direction::Widening, false) => ("WIDENS", ""),
        };
        let at = f.tool.as_ref().map_or_else(|| f.plugin.clone(), |t| format!("{}/{t}", f.plugin));
        out.push_str(&super::terminal_safe(&format!("{kind:<8} {at:<24} {:<22} {}  [{}]{mark}\n", f.rule, f.message, f.fingerprint)));
    }
    if findings.is_empty() {
        out.push_str("no change in what the plugins may do or tell the model\n");
    }
    let audit = if audit == Verdict::PASS { "" } else { " (and the new configuration fails its own audit: run toolguard audit)" };
    out.push_str(&format!("{verdict:?}: {open} widening(s) not acknowledged; acknowledge one with --ack FINGERPRINT{audit}\n"));
    out
}

/// Where a finding is written: a policy change at its plugin's policy table
/// (in the config, or in its `policy_file`), anything else at the plugin's
/// `[plugins.NAME]` table; line 1 when it is not written (a plugin removed).
fn locate(config: &crate::Config, config_path: &Path, f: &Finding) -> Location {
    let policy = matches!(f.rule.split('-').next(), Some("grant" | "credential" | "key" | "budget" | "effect" | "action" | "consent" | "scopes"));
    let (file, tables): (String, Vec<String>) = if policy {
        let p = &f.plugin;
        (config.policy_source.clone(), vec![format!("[policy.plugins.{p}"), format!("[plugins.{p}")])
    } else {
        (config_path.display().to_string(), vec![format!("[plugins.{}]", f.plugin)])
    };
    let text = std::fs::read_to_string(&file).unwrap_or_default();
    let line = tables.iter().find_map(|t| text.lines().position(|l| l.trim_start().starts_with(t.as_str()))).map_or(1, |i| i + 1);
    Location { uri: file, line }
}
