//! Reviewing a change (`toolguard audit --against OLD`, `docs/audit.md`):
//! real before/after configurations, one per kind of change, each asserting
//! the exact finding; widenings fail the review until acknowledged by
//! fingerprint, narrowings are listed and pass.

use crate::common::{BIN, stdout_json, wasm};
use crate::payments::{Downstream, HEADER_ONLY, INTENT_AND_AMOUNT, config_text};
use serde_json::{Value, json};
use std::path::Path;
use std::process::Command;

/// The payments host's config for `d`, with `extra` TOML after it.
fn config(dir: &Path, name: &str, d: &Downstream, extra: &str) -> String {
    let text = format!("{}\n{extra}\n", config_text("http://127.0.0.1:9", &dir.join("data"), d));
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// `toolguard audit --config NEW --against OLD --json [--ack …]`: the review and whether it passed.
fn reviewed(new: &str, old: &str, acks: &[&str]) -> (Value, bool) {
    let mut args = vec!["audit", "--config", new, "--against", old, "--json"];
    for a in acks {
        args.extend(["--ack", a]);
    }
    let out = Command::new(BIN).args(&args).output().unwrap();
    (stdout_json(&out), out.status.success())
}

/// The findings of `review` of rule `rule`.
fn of<'a>(review: &'a Value, rule: &str) -> Vec<&'a Value> {
    review["findings"].as_array().unwrap().iter().filter(|f| f["rule"] == rule).collect()
}

/// A change case: the rule it must raise, the new downstream settings, the
/// plugin and tool it is found at, and the facts before and after (null: not checked).
type Case = (&'static str, Downstream, &'static str, Option<&'static str>, Value, Value);

/// Each change to the payments plugin's policy, against the same baseline:
/// the rule it must raise, where, and the fact before and after.
#[test]
fn each_kind_of_policy_change_is_found_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let old = config(
        d,
        "old.toml",
        &Downstream { refund_action: Some(INTENT_AND_AMOUNT), refund_policy: Some("approval = { always = true }"), ..Default::default() },
        "",
    );
    let base = || Downstream { refund_action: Some(INTENT_AND_AMOUNT), refund_policy: Some("approval = { always = true }"), ..Default::default() };
    let cases: Vec<Case> = vec![
        ("budget-raised", Downstream { refunds_per_session_hour: 5_000, ..base() }, "payments", None, json!(1000), json!(5000)),
        ("budget-lowered", Downstream { refunds_per_session_hour: 10, ..base() }, "payments", None, json!(1000), json!(10)),
        ("limits-raised", Downstream { wall_ms: 60_000, ..base() }, "payments", None, json!(30_000), json!(60_000)),
        (
            "credential-added",
            Downstream { extra: r#"credential = { env = "TG_REVIEW_KEY" }"#, ..base() },
            "payments",
            None,
            Value::Null,
            json!("payments Authorization (env:TG_REVIEW_KEY)"),
        ),
        ("key-transport-changed", Downstream { key: HEADER_ONLY, ..base() }, "payments", None, Value::Null, Value::Null),
        ("grant-loosened", Downstream { extra: "max_request_bytes = 9000000", ..base() }, "payments", None, Value::Null, Value::Null),
        ("action-changed", Downstream { refund_action: None, ..base() }, "payments", Some("refund"), json!(["/payment_intent", "/amount_cents"]), Value::Null),
        ("consent-removed", Downstream { refund_policy: None, ..base() }, "payments", Some("refund"), Value::Null, Value::Null),
    ];
    for (i, (rule, d_new, plugin, tool, before, after)) in cases.into_iter().enumerate() {
        let new = config(d, &format!("new{i}.toml"), &d_new, "");
        let (review, passed) = reviewed(&new, &old, &[]);
        // The rogue plugin's grant reaches the same downstream: a change to it shows there too.
        let found: Vec<&Value> = of(&review, rule).into_iter().filter(|f| f["plugin"] == plugin).collect();
        assert_eq!(found.len(), 1, "{rule}: {review:#}");
        let f = found[0];
        assert_eq!(f["tool"].as_str(), tool, "{rule}: {f:#}");
        if !before.is_null() || !after.is_null() {
            assert_eq!((&f["before"], &f["after"]), (&before, &after), "{rule}: {f:#}");
        }
        let widening = f["direction"] == "widening";
        assert_eq!(widening, !rule.ends_with("-lowered"), "{rule}: {f:#}");
        // Only this change: nothing else is reported.
        assert!(review["findings"].as_array().unwrap().iter().all(|f| f["rule"] == rule), "{rule}: {review:#}");
        assert_eq!(passed, !widening, "{rule}: a widening fails the review, a narrowing passes: {review:#}");
        if widening {
            let all: Vec<&str> = review["findings"].as_array().unwrap().iter().filter_map(|f| f["fingerprint"].as_str()).collect();
            let fingerprint = f["fingerprint"].as_str().unwrap();
            let (acked, passed) = reviewed(&new, &old, &all);
            assert!(passed, "{rule}: acknowledged, it passes: {acked:#}");
            assert_eq!(of(&acked, rule)[0]["acknowledged"], true);
            assert_eq!(of(&acked, rule)[0]["fingerprint"], fingerprint, "the same change, the same fingerprint");
        }
    }
}

/// An irreversible refund made idempotent (the guard would stop holding its
/// repeats), a grant opened wider, and a grant gone.
#[test]
fn an_effect_class_and_a_grant_widened_are_findings() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let old = config(d, "old.toml", &Downstream::default(), "");
    let text = std::fs::read_to_string(&old).unwrap();
    let idempotent = text.replace(r#"refund = { effect = "irreversible""#, r#"refund = { effect = "idempotent""#);
    let wider = text.replacen(r#"path_prefix = "/v1/refunds""#, r#"path_prefix = "/v1""#, 1);
    for (name, new_text) in [("idempotent.toml", idempotent), ("wider.toml", wider)] {
        std::fs::write(d.join(name), new_text).unwrap();
    }
    let (review, passed) = reviewed(&d.join("idempotent.toml").display().to_string(), &old, &[]);
    let f = of(&review, "effect-widened");
    assert!(!passed && f.len() == 1 && f[0]["tool"] == "refund" && f[0]["before"] == "irreversible" && f[0]["after"] == "idempotent", "{review:#}");
    let (review, _) = reviewed(&d.join("wider.toml").display().to_string(), &old, &[]);
    let added: Vec<&str> = of(&review, "grant-added").iter().filter_map(|f| f["after"].as_str()).collect();
    let removed: Vec<&str> = of(&review, "grant-removed").iter().filter_map(|f| f["before"].as_str()).collect();
    assert!(added.iter().any(|g| g.starts_with("POST ") && g.ends_with("/v1")), "{review:#}");
    assert!(removed.iter().any(|g| g.starts_with("POST ") && g.ends_with("/v1/refunds")), "{review:#}");
}

/// A plugin added; its component swapped for another (new bytes, other
/// tools); one that imports more.
#[test]
fn new_plugins_components_tools_and_imports_are_findings() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let plugin = |component: &str| format!("[plugins.extra]\ncomponent = {component:?}\n");
    let old = config(d, "old.toml", &Downstream::default(), &plugin("builtin:text-stats"));
    let (review, passed) = reviewed(&config(d, "none.toml", &Downstream::default(), &plugin("builtin:text-stats")), &old, &[]);
    assert!(review["findings"].as_array().unwrap().is_empty(), "the same configuration changes nothing: {review:#}");
    assert!(passed, "{review:#}");
    assert_eq!(review["audit_verdict"], "FAIL", "shown: the unreviewed `extra` fails its own audit");

    let swapped = config(d, "swapped.toml", &Downstream::default(), &plugin("builtin:template"));
    let (review, _) = reviewed(&swapped, &old, &[]);
    assert_eq!(of(&review, "component-changed").len(), 1, "{review:#}");
    assert_eq!(of(&review, "tool-added")[0]["tool"], "greet");
    assert_eq!(of(&review, "tool-removed")[0]["tool"], "text_stats");

    let fs = config(d, "fs.toml", &Downstream::default(), &plugin(&wasm("import-filesystem").display().to_string()));
    let (review, _) = reviewed(&fs, &old, &[]);
    let imports: Vec<&str> = of(&review, "import-added").iter().filter_map(|f| f["after"].as_str()).collect();
    assert!(imports.contains(&"wasi:filesystem/types") && imports.contains(&"wasi:filesystem/preopens"), "{review:#}");

    let without = config(d, "without.toml", &Downstream::default(), "");
    let (review, passed) = reviewed(&old, &without, &[]);
    assert_eq!(of(&review, "plugin-added")[0]["plugin"], "extra", "{review:#}");
    assert!(!passed);
}

/// The text form names each finding, its fingerprint and the verdict.
#[test]
fn the_review_reads_as_text() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let old = config(d, "old.toml", &Downstream::default(), "");
    let new = config(d, "new.toml", &Downstream { refunds_per_session_hour: 5_000, ..Downstream::default() }, "");
    let out = Command::new(BIN).args(["audit", "--config", &new, "--against", &old]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success());
    assert!(
        text.contains("WIDENS") && text.contains("budget-raised") && text.contains("[tg1:") && text.contains("FAIL: 1 widening(s) not acknowledged"),
        "{text}"
    );
}

/// `--format sarif`: valid SARIF 2.1.0 (checked against the OASIS schema), a
/// rule per kind of change with help, each result at the line of the
/// plugin's policy in the config, its fingerprint stable and the same as
/// the JSON's, an acknowledged widening suppressed.
#[test]
fn the_review_as_sarif_is_valid_and_points_into_the_config() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let old = config(d, "old.toml", &Downstream::default(), "");
    let new = config(d, "new.toml", &Downstream { refunds_per_session_hour: 5_000, key: HEADER_ONLY, ..Downstream::default() }, "");
    let sarif = |acks: &[&str]| {
        let mut args = vec!["audit", "--config", &new, "--against", &old, "--format", "sarif"];
        acks.iter().for_each(|a| args.extend(["--ack", a]));
        stdout_json(&Command::new(BIN).args(&args).output().unwrap())
    };
    let log = sarif(&[]);
    let path = d.join("review.sarif");
    std::fs::write(&path, log.to_string()).unwrap();
    let schema = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/sarif/sarif-schema-2.1.0.json");
    let check = "import json, sys, jsonschema; jsonschema.validate(json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))); print('valid')";
    let valid = crate::registry::python(&["-c", check, path.to_str().unwrap(), schema.to_str().unwrap()]);
    assert_eq!(valid.trim(), "valid");
    let run = &log["runs"][0];
    assert_eq!(run["automationDetails"]["id"], "toolguard/review/");
    let rules = run["tool"]["driver"]["rules"].as_array().unwrap();
    let results = run["results"].as_array().unwrap();
    let budget = results.iter().find(|r| r["ruleId"] == "budget-raised" && r["properties"]["plugin"] == "payments").expect("the budget's result");
    assert_eq!(rules[budget["ruleIndex"].as_u64().unwrap() as usize]["id"], "budget-raised");
    assert!(rules.iter().all(|r| r["help"]["text"].as_str().is_some_and(|h| !h.is_empty())));
    assert_eq!(budget["level"], "error");
    let text = std::fs::read_to_string(&new).unwrap();
    let line = text.lines().position(|l| l.starts_with("[policy.plugins.payments]")).unwrap() + 1;
    let location = &budget["locations"][0]["physicalLocation"];
    assert_eq!((location["artifactLocation"]["uri"].as_str(), location["region"]["startLine"].as_u64()), (Some(new.as_str()), Some(line as u64)));
    // The same change, the same fingerprints as the JSON review's, run after run.
    let (json, _) = reviewed(&new, &old, &[]);
    let fingerprints = |v: &Vec<Value>, at: &str| v.iter().map(|r| r.pointer(at).unwrap().as_str().unwrap().to_string()).collect::<Vec<_>>();
    assert_eq!(fingerprints(results, "/partialFingerprints/toolguardFinding~1v1"), fingerprints(json["findings"].as_array().unwrap(), "/fingerprint"));
    assert_eq!(sarif(&[])["runs"][0]["results"], log["runs"][0]["results"]);
    let fingerprint = budget["partialFingerprints"]["toolguardFinding/v1"].as_str().unwrap();
    let acked = sarif(&[fingerprint]);
    let acked =
        acked["runs"][0]["results"].as_array().unwrap().iter().find(|r| r["partialFingerprints"]["toolguardFinding/v1"] == fingerprint).cloned().unwrap();
    assert_eq!((acked["level"].as_str(), acked["suppressions"][0]["kind"].as_str()), (Some("note"), Some("external")));
}
