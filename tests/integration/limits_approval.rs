//! A spending limit a person may let a call pass (`over_limit =
//! "approve"`), through the real binary and counted at the sandbox: over
//! it, the call waits for a person's approval through the consent path
//! instead of a refusal, nothing sent; approved, it runs and its amount
//! counts past the limit; denied, it completes `denied` and its amount is
//! given back.

use crate::common::stdout_json;
use crate::payments::Downstream;
use crate::world::{World, torture_downstream};

/// At most 5,000 cents in one call and 8,000 a day per session without a person.
const POLICY: &str = r#"limits = [
    { sum = "/amount_cents", max = 5000, window = "call", over_limit = "approve" },
    { sum = "/amount_cents", max = 8000, per = "session", window = "day", over_limit = "approve" },
]"#;

fn approvals(w: &World, args: &[&str]) -> (Option<i32>, serde_json::Value) {
    let mut all = vec!["approvals"];
    all.extend_from_slice(args);
    let out = w.toolguard(&all);
    (out.status.code(), stdout_json(&out))
}

#[test]
fn over_an_approvable_limit_a_refund_waits_for_a_person_and_their_decision_decides() {
    let w = World::with(Downstream { refund_policy: Some(POLICY), ..torture_downstream() });
    assert!(w.refund("c1", 3_000).0, "under both limits: no person");
    // 6,000 in one call: past the per-call limit; a person is asked, nothing is sent.
    let (ok, out) = w.refund("c2", 6_000);
    assert!(!ok && out["kind"] == "awaiting-approval", "{out}");
    let reason = out["detail"]["approval"]["reason"].as_str().unwrap_or_default().to_string();
    assert!(reason.contains("over a spending limit") && reason.contains("this call would move 6000"), "{reason}");
    assert!(w.posts_of(6_000).is_empty(), "nothing was sent before a decision");
    let (code, listed) = approvals(&w, &["list"]);
    assert_eq!(code, Some(0), "{listed}");
    assert_eq!(listed["waiting"][0]["call_id"], "c2", "{listed}");
    let (code, decided) = approvals(&w, &["approve", "c2", "--by", "risk-analyst"]);
    assert_eq!(code, Some(0), "{decided}");
    let (ok, out) = w.refund("c2", 6_000);
    assert!(ok, "approved: it runs: {out}");
    assert_eq!(w.refunds_of(6_000), 1);
    // The day now holds 9,000 of 8,000 (approved past it): the next refund, however small, asks.
    let (ok, out) = w.refund("c3", 100);
    assert!(!ok && out["kind"] == "awaiting-approval", "{out}");
    let reason = out["detail"]["approval"]["reason"].as_str().unwrap_or_default().to_string();
    assert!(reason.contains("9000 of 8000 is used") && reason.contains("would add 100"), "{reason}");
    let (code, decided) = approvals(&w, &["deny", "c3", "--by", "risk-analyst", "--note", "enough for today"]);
    assert_eq!(code, Some(0), "{decided}");
    let (ok, out) = w.refund("c3", 100);
    assert!(!ok && out["kind"] == "denied", "denied: {out}");
    assert!(w.posts_of(100).is_empty(), "a denied refund sends nothing");
    // What the day holds: the approved 9,000; the denied 100 was given back.
    let out = w.toolguard(&["ledger", "limits", "--json"]);
    let uses = stdout_json(&out);
    let day: Vec<&serde_json::Value> = uses.as_array().into_iter().flatten().filter(|u| u["used"].as_u64().is_some()).collect();
    assert_eq!(day.len(), 1, "one scope holds a use: {uses}");
    assert_eq!((day[0]["used"].as_u64(), day[0]["calls"].as_u64()), (Some(9_000), Some(2)), "{uses}");
    let amounts: Vec<u64> = w.sandbox.refunds().iter().map(|r| r.amount).collect();
    assert_eq!(amounts, [3_000, 6_000], "the provider made the refund under the limits and the approved one, nothing else");
}

#[test]
fn a_limit_made_passable_with_approval_is_a_widening_in_a_review() {
    let w = World::with(Downstream { refund_policy: Some(r#"limits = [{ sum = "/amount_cents", max = 5000, window = "call" }]"#), ..torture_downstream() });
    let config = std::fs::read_to_string(&w.config).unwrap();
    let edited = w.dir.path().join("new.toml");
    std::fs::write(&edited, config.replace(r#"window = "call" }"#, r#"window = "call", over_limit = "approve" }"#)).unwrap();
    let out = std::process::Command::new(crate::common::BIN)
        .args(["audit", "--config", edited.to_str().unwrap(), "--against", w.config.to_str().unwrap(), "--json"])
        .env("TOOLGUARD_LOG", "error")
        .output()
        .unwrap();
    let review = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(review.contains("spending-limit-widened"), "refused past it before, a person may let it pass now: {review}");
    // And back: a narrowing.
    let out = std::process::Command::new(crate::common::BIN)
        .args(["audit", "--config", w.config.to_str().unwrap(), "--against", edited.to_str().unwrap(), "--json"])
        .env("TOOLGUARD_LOG", "error")
        .output()
        .unwrap();
    let review = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(review.contains("spending-limit-narrowed") && !review.contains("spending-limit-widened"), "{review}");
}
