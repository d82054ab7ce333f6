//! `toolguard audit --against OLD`: the review of a change — both configs
//! audited, every widening and narrowing between them listed, and exit 1
//! while a widening is not acknowledged (`--ack FINGERPRINT`). Whether the
//! new configuration passes its own audit is shown beside it; `toolguard
//! audit` gates that (`docs/audit.md`, "Reviewing a change").

use crate::audit::{Direction, Finding, Verdict};
use serde_json::json;
use std::path::Path;

/// The review's JSON schema id.
const SCHEMA: &str = "toolguard-review/1";

/// Reviews the change from the config at `old` to `config`; returns the exit status.
pub(super) async fn run(config: &crate::Config, config_path: &Path, old: &Path, acks: &[String], json: bool) -> u8 {
    let old_config = match crate::Config::load(old) {
        Ok(c) => c,
        Err(e) => return super::config_error(format!("the older config: {e}")),
    };
    let (before, after) = match (crate::audit::audit(&old_config, old, &[]).await, crate::audit::audit(config, config_path, &[]).await) {
        (Ok(b), Ok(a)) => (b, a),
        (Err(e), _) | (_, Err(e)) => {
            super::print_json(&json!({ "kind": "internal", "message": e }));
            return super::EXIT_CALL_FAILED;
        }
    };
    let mut findings = crate::audit::diff(&before, &after);
    for f in &mut findings {
        f.acknowledged = acks.contains(&f.fingerprint);
    }
    let open = findings.iter().filter(|f| f.direction == Direction::Widening && !f.acknowledged).count();
    let verdict = if open == 0 { Verdict::PASS } else { Verdict::FAIL };
    if json {
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
        print!("{}", render(&findings, (verdict, after.verdict), open));
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
