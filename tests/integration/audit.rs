//! `toolguard audit` through the real binary: PASS for the shipped plugins
//! under the example config, FAIL (exit 1) with the reason for each hostile
//! fixture, JSON checked against the documented schema, and the grant history.

use crate::common::{BIN, shared_cache, stdout_json, wasm};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

/// The example config in `dir`, its relative paths made absolute.
fn example_config(dir: &Path, extra: &str) -> PathBuf {
    let text = std::fs::read_to_string(repo("toolguard.toml")).unwrap();
    let text = text
        .replacen("data_dir = \".toolguard\"", &format!("data_dir = \"data\"\ncompile_cache = {:?}", shared_cache().display().to_string()), 1)
        .replacen("file = \"examples/sandbox-api-key\"", &format!("file = {:?}", repo("examples/sandbox-api-key").display().to_string()), 1);
    let path = dir.join("toolguard.toml");
    std::fs::write(&path, text + extra).unwrap();
    path
}

fn audit(config: &Path, args: &[&str]) -> Output {
    Command::new(BIN).arg("audit").arg("--config").arg(config).args(args).env("TOOLGUARD_LOG", "error").output().unwrap()
}

/// Checks `report` against `docs/audit.schema.json`.
pub fn assert_schema(report: &Value) {
    let schema: Value = serde_json::from_str(&std::fs::read_to_string(repo("docs/audit.schema.json")).unwrap()).unwrap();
    let validator = jsonschema::validator_for(&schema).expect("the documented schema compiles");
    let errors: Vec<String> = validator.iter_errors(report).map(|e| format!("{} at {}", e, e.instance_path())).collect();
    assert!(errors.is_empty(), "the report breaks the documented schema: {errors:#?}");
}

#[test]
fn the_shipped_plugins_pass_under_the_example_config() {
    let dir = tempfile::tempdir().unwrap();
    let config = example_config(dir.path(), "");
    let out = audit(&config, &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    for line in ["payments  PASS", "template  PASS", "text-stats  PASS", "verdict: PASS (0 of 3 components fail)"] {
        assert!(text.contains(line), "missing `{line}`:\n{text}");
    }
    assert!(text.contains("toolguard:plugin/outbound@0.1.0") && text.contains("granted"), "{text}");
    assert!(text.contains("refund           claimed irreversible  granted irreversible  reviewed, may send"), "{text}");
    assert!(text.contains("; a repeat within 15 min needs confirming"), "the shipped config confirms repeats of a refund:\n{text}");
    assert!(text.contains("credential   payments: Authorization from file:"), "{text}");
    assert!(!text.contains("sk_test_toolguard_sandbox"), "never the credential's value");
    let keys = "keys         payments: header Idempotency-Key, form-field metadata[toolguard_key] (toolguard format)";
    assert!(text.contains(keys), "where the host puts its key, for the reviewer:\n{text}");

    let report = stdout_json(&audit(&config, &["--json"]));
    assert_schema(&report);
    assert_eq!(report["verdict"], "PASS");
    let payments = report["components"].as_array().unwrap().iter().find(|c| c["plugin"] == "payments").unwrap();
    assert_eq!(payments["pin"]["status"], "builtin");
    let refund = payments["tools"].as_array().unwrap().iter().find(|t| t["name"] == "refund").unwrap();
    assert_eq!(refund["confirm_repeat_within_minutes"], 15, "{refund}");
    let classes: Vec<&str> = payments["imports"].as_array().unwrap().iter().map(|i| i["class"].as_str().unwrap()).collect();
    assert!(classes.contains(&"granted") && !classes.contains(&"forbidden"));
    let exports: Vec<&str> = payments["exports"].as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap()).collect();
    assert!(exports.iter().any(|e| e.starts_with("toolguard:plugin/reconciler")), "{exports:?}");
    assert_eq!(payments["credentials"][0]["available"], true);
    assert_eq!(
        payments["keys"],
        serde_json::json!([{ "downstream": "payments", "transports": ["header Idempotency-Key", "form-field metadata[toolguard_key]"], "format": "toolguard" }])
    );
    assert_eq!(payments["budgets"]["max_sends_per_call"], 2);
    // The limits on what plugins and clients hand the host, for the reviewer.
    assert!(text.contains("limits: plugin requests up to 64 headers"), "{text}");
    assert!(text.contains("bodies up to 1048576 bytes"), "{text}");
    assert_eq!(report["limits"]["max_request_headers"], 64);
    assert_eq!(report["limits"]["max_exact_number"], 9007199254740991u64);
    assert_eq!(payments["grants"][0]["max_request_bytes"], 1 << 20);
    assert_eq!(payments["grants"][0]["allow_encoded_path"], false);
}

#[test]
fn an_irreversible_tool_whose_arguments_can_vary_without_naming_another_action_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let config = example_config(dir.path(), "");
    let notes_of = |report: &Value, plugin: &str| -> String {
        let c = report["components"].as_array().unwrap().iter().find(|c| c["plugin"] == plugin).unwrap();
        c["notes"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()).collect::<Vec<_>>().join(" | ")
    };
    // As shipped: the refund takes an id, an amount and an enumerated reason,
    // all required; `greet` takes free text but is read-only (never held).
    let report = stdout_json(&audit(&config, &["--json"]));
    for plugin in ["payments", "template"] {
        assert!(!notes_of(&report, plugin).contains("vary without naming"), "{plugin}: {}", notes_of(&report, plugin));
    }
    // The reviewer makes `greet` irreversible: its free-text name is named.
    let text = std::fs::read_to_string(&config).unwrap().replacen(r#"greet = { effect = "read-only" }"#, r#"greet = { effect = "irreversible" }"#, 1);
    std::fs::write(&config, text).unwrap();
    let out = audit(&config, &["--json"]);
    assert_eq!(out.status.code(), Some(0), "a note, not a failure");
    let report = stdout_json(&out);
    assert_schema(&report);
    let notes = notes_of(&report, "template");
    assert!(notes.contains("irreversible tool `greet` takes arguments that can vary without naming another action: `/name` (free text)"), "{notes}");
    assert!(notes.contains("a blind repeat that changes one of them runs; the policy's `action` can name"), "{notes}");
    assert!(!notes_of(&report, "payments").contains("vary without naming"));
    // Once the reviewer declares what names its action, the audit shows that instead.
    let text = std::fs::read_to_string(&config).unwrap().replacen(
        r#"greet = { effect = "irreversible" }"#,
        r#"greet = { effect = "irreversible", action = ["/name"] }"#,
        1,
    );
    std::fs::write(&config, text).unwrap();
    let report = stdout_json(&audit(&config, &["--json"]));
    assert_schema(&report);
    assert!(!notes_of(&report, "template").contains("vary without naming"), "{}", notes_of(&report, "template"));
    let template = report["components"].as_array().unwrap().iter().find(|c| c["plugin"] == "template").unwrap();
    assert_eq!(template["tools"][0]["action"], serde_json::json!(["/name"]));
    let text = String::from_utf8_lossy(&audit(&config, &[]).stdout).to_string();
    assert!(text.contains("reviewed; its action: /name"), "{text}");
}

#[test]
fn each_hostile_fixture_fails_naming_its_reason() {
    let dir = tempfile::tempdir().unwrap();
    let config = example_config(dir.path(), "");
    let fixtures = ["import-sockets", "import-http", "import-filesystem", "describe-trap", "misbehave", "rogue"];
    let paths: Vec<String> = fixtures.iter().map(|f| wasm(f).display().to_string()).collect();
    let args: Vec<&str> = std::iter::once("--json").chain(paths.iter().map(String::as_str)).collect();
    let out = audit(&config, &args);
    assert_eq!(out.status.code(), Some(1), "any FAIL exits non-zero");
    let report = stdout_json(&out);
    assert_schema(&report);
    assert_eq!(report["verdict"], "FAIL");
    let reasons = |plugin: &str| -> String {
        let c = report["components"].as_array().unwrap().iter().find(|c| c["plugin"] == plugin).unwrap();
        assert_eq!(c["verdict"], "FAIL", "{plugin}");
        c["reasons"].as_array().unwrap().iter().map(|r| r.as_str().unwrap()).collect::<Vec<_>>().join(" | ")
    };
    assert!(reasons("import_sockets").contains("never grants: wasi:sockets/"), "{}", reasons("import_sockets"));
    assert!(reasons("import_http").contains("never grants: wasi:http/"));
    // The filesystem is linked inert: that fixture fails only as unreviewed and unpinned.
    assert!(!reasons("import_filesystem").contains("never grants"), "{}", reasons("import_filesystem"));
    let files = report["components"].as_array().unwrap().iter().find(|c| c["plugin"] == "import_filesystem").unwrap();
    let fs: Vec<&Value> = files["imports"].as_array().unwrap().iter().filter(|i| i["name"].as_str().unwrap().starts_with("wasi:filesystem/")).collect();
    assert!(!fs.is_empty() && fs.iter().all(|i| i["class"] == "inert" && i["why"].as_str().unwrap().contains("inert")), "{fs:?}");
    assert!(reasons("describe_trap").contains("describe failed"));
    for unreviewed in ["misbehave", "rogue"] {
        assert!(reasons(unreviewed).contains("not in the policy") && reasons(unreviewed).contains("not pinned"), "{unreviewed}");
    }
    let forbidden = report["components"].as_array().unwrap().iter().find(|c| c["plugin"] == "import_sockets").unwrap()["imports"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["class"] == "forbidden")
        .count();
    assert!(forbidden >= 2, "every forbidden import is classified");

    let text = String::from_utf8_lossy(&audit(&config, &paths.iter().map(String::as_str).collect::<Vec<_>>()).stdout).to_string();
    assert!(text.contains("import_sockets  FAIL") && text.contains("FAIL         imports interfaces the host never grants"), "{text}");
}

#[test]
fn a_pin_mismatch_fails_and_a_matching_pin_passes() {
    let dir = tempfile::tempdir().unwrap();
    let stats = wasm("text-stats").display().to_string();
    let wrong = format!("\n[plugins.pinned]\ncomponent = {stats:?}\n[policy.plugins.pinned]\nsha256 = \"{}\"\n", "0".repeat(64));
    let config = example_config(dir.path(), &wrong);
    let report = stdout_json(&audit(&config, &["--json"]));
    let pinned = report["components"].as_array().unwrap().iter().find(|c| c["plugin"] == "pinned").unwrap().clone();
    assert_eq!(pinned["pin"]["status"], "mismatch");
    assert!(pinned["reasons"][0].as_str().unwrap().contains("does not match the pin"));
    let digest = pinned["sha256"].as_str().unwrap().to_string();
    // `text_stats` is already offered by the example's text-stats plugin; give this one its own config.
    let right = format!(
        "data_dir = \"d\"\ncompile_cache = {:?}\n[plugins.pinned]\ncomponent = {stats:?}\n[policy.plugins.pinned]\nsha256 = \"{digest}\"\n[policy.plugins.pinned.tools]\ntext_stats = {{ effect = \"read-only\" }}\n",
        shared_cache().display().to_string()
    );
    std::fs::write(dir.path().join("right.toml"), right).unwrap();
    let out = audit(&dir.path().join("right.toml"), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stdout));
    assert!(String::from_utf8_lossy(&out.stdout).contains("(matches the pin)"));
}

#[test]
fn the_grant_history_records_what_ran_with_which_grants() {
    let dir = tempfile::tempdir().unwrap();
    let config = example_config(dir.path(), "");
    let call = |id: &str| {
        let out = Command::new(BIN)
            .args(["call", "--config", config.to_str().unwrap(), "--session", "h", "--call-id", id, "text_stats", r#"{"text":"a"}"#])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    };
    call("c1");
    call("c2");
    let history = stdout_json(&audit(&config, &["--history", "--json"]));
    let entries = history.as_array().unwrap();
    assert_eq!(entries.len(), 3, "one entry per plugin; an unchanged reload adds none: {history}");
    let payments = entries.iter().find(|e| e["plugin"] == "payments").unwrap();
    assert_eq!(payments["grants"]["budgets"]["max_sends_per_call"], 2);
    assert!(payments["grants"]["credentials"][0]["source"].as_str().unwrap().starts_with("file:"));
    assert_eq!(payments["digest"].as_str().unwrap().len(), 64);

    // The reviewer changes a budget: the next load records the new grants.
    let text = std::fs::read_to_string(&config).unwrap().replace("max_sends_per_call = 2", "max_sends_per_call = 1");
    std::fs::write(&config, text).unwrap();
    call("c3");
    let history = stdout_json(&audit(&config, &["--history", "--json"]));
    let payments: Vec<&Value> = history.as_array().unwrap().iter().filter(|e| e["plugin"] == "payments").collect();
    assert_eq!(payments.len(), 2);
    assert_eq!(payments[1]["grants"]["budgets"]["max_sends_per_call"], 1);
    let table = String::from_utf8_lossy(&audit(&config, &["--history"]).stdout).to_string();
    assert!(table.contains("payments") && table.contains("text-stats"), "{table}");
}
