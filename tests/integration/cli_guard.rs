//! The real binary with the guard: `demo`, `call` against the sandbox, the
//! `ledger` commands, and `sandbox` standalone.

use crate::common::{BIN, stdout_json};
use crate::payments::{Downstream, PI, config_text, refund_args};
use serde_json::Value;
use std::io::BufRead;
use std::process::{Command, Output, Stdio};

fn toolguard(args: &[&str]) -> Output {
    Command::new(BIN).args(args).env_remove("TOOLGUARD_LOG").output().expect("run toolguard")
}

#[test]
fn the_demo_runs_its_scenario_and_its_counts_hold() {
    let out = toolguard(&["demo"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    for line in [
        "outcome-unknown: The outcome of this refund is unknown",
        "✓ refunds at the provider: 1 (the provider did commit it)",
        "recovery settled 1 attempt(s)",
        "Idempotent-Replayed: true",
        "held: Not executed: an identical earlier call of `refund` (tool call `call_1`) already acted",
        "Nothing new was sent",
        "✓ refunds at the provider: 1 (held, carrying call_1's real outcome: never executed blind)",
        "✓ refunds at the provider: 1 (the original refund, not a new one)",
        "(replayed from the ledger; no plugin ran)",
        "✓ refunds at the provider: 2 (a new tool-call id after a definitive answer is a new refund)",
        "conflict: tool call `call_2`",
        "✓ refunds at the provider: 2 (a conflict, nothing sent)",
        "\"status\":\"succeeded\"",
        "✓ refunds at the provider: 3 (the real outcome, found by reconciliation)",
        "→ a task, \"working\"",
        "\"completed\", {\"amount_cents\":700",
        "✓ refunds at the provider: 4 (one refund, its real outcome delivered through the task)",
        "tool call call_4 (refund, completed; the model was told: definitive)",
        "denied: over a spending limit: `refund`'s limit (sum of /amount_cents ≤ 4500 per everyone per day): 4200 of 4500 is used in this window, and this call would add 500",
        "✓ refunds at the provider: 4 (over the daily limit, nothing sent)",
        "Every count as expected.",
    ] {
        assert!(text.contains(line), "missing `{line}` in:\n{text}");
    }
    assert!(!text.contains("UNEXPECTED"));
    assert_eq!(text.matches("requests sent to the provider for it: 0").count(), 4, "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn call_then_read_the_ledger_through_the_cli() {
    let sandbox = toolguard_sandbox::Sandbox::start("127.0.0.1:0", toolguard_sandbox::Mode::Stripe, toolguard_sandbox::DEFAULT_RETENTION).await.unwrap();
    sandbox.add_payment_intent(PI, 10_000);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("toolguard.toml");
    std::fs::write(&config, config_text(&sandbox.url(), &dir.path().join("data"), &Downstream::default())).unwrap();
    let cfg = config.to_str().unwrap().to_string();
    let call = |call_id: &'static str, amount: u64| {
        let cfg = cfg.clone();
        tokio::task::spawn_blocking(move || toolguard(&["call", "--config", &cfg, "--session", "ops", "--call-id", call_id, "refund", &refund_args(amount)]))
    };
    let first = call("c1", 300).await.unwrap();
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    let again = call("c1", 300).await.unwrap();
    assert_eq!(stdout_json(&again), stdout_json(&first), "a replay through a new process returns the same result");
    assert!(String::from_utf8_lossy(&again.stderr).contains("replayed"), "and says so");
    assert_eq!(sandbox.refunds().len(), 1);
    let conflict = call("c1", 301).await.unwrap();
    assert_eq!(conflict.status.code(), Some(1));
    assert_eq!(stdout_json(&conflict)["kind"], "conflict");

    let list = stdout_json(&toolguard(&["ledger", "list", "--config", &cfg, "--json"]));
    let rows = list.as_array().unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["call"]["call_id"], "c1");
    assert_eq!(rows[0]["call"]["state"], "completed");
    let key = rows[0]["attempts"][0]["key"].as_str().unwrap().to_string();
    assert_eq!(sandbox.refunds()[0].metadata["toolguard_key"], key);
    assert_eq!(rows[0]["attempts"][0]["state"], "succeeded");

    let unknown = stdout_json(&toolguard(&["ledger", "list", "--config", &cfg, "--state", "unknown", "--json"]));
    assert_eq!(unknown, Value::Array(vec![]));
    let table = toolguard(&["ledger", "list", "--config", &cfg, "--session", "ops"]);
    assert!(String::from_utf8_lossy(&table.stdout).contains(&key));

    let shown = stdout_json(&toolguard(&["ledger", "show", "--config", &cfg, &key]));
    assert_eq!(shown["attempt"]["request"]["method"], "POST");
    assert_eq!(shown["call"]["session"], "ops");
    let by_call = stdout_json(&toolguard(&["ledger", "show", "--config", &cfg, "c1"]));
    assert_eq!(by_call[0]["attempts"][0]["key"], key.as_str());
    let direct = stdout_json(&toolguard(&["ledger", "show", "--config", &cfg, "c1", "--session", "ops"]));
    assert_eq!(direct, by_call, "a look-up in its session finds the same call");
    let elsewhere = toolguard(&["ledger", "show", "--config", &cfg, "c1", "--session", "other"]);
    assert_eq!(elsewhere.status.code(), Some(1), "not in that session");
    let missing = toolguard(&["ledger", "show", "--config", &cfg, "nope"]);
    assert_eq!(missing.status.code(), Some(1));

    let export = toolguard(&["ledger", "export", "--config", &cfg]);
    let lines: Vec<Value> = String::from_utf8_lossy(&export.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.iter().map(|l| l["type"].as_str().unwrap()).collect::<Vec<_>>(), ["call", "attempt"]);
    assert_eq!(lines[1]["record"]["key"], key.as_str());
}

/// `toolguard sandbox` with `extra` arguments: the child and its URL.
fn standalone_sandbox(extra: &[&str]) -> (std::process::Child, String) {
    let mut child = Command::new(BIN).args(["sandbox", "--addr", "127.0.0.1:0"]).args(extra).stdout(Stdio::piped()).spawn().unwrap();
    let mut first = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
    let url = first.trim().rsplit(' ').next().unwrap().to_string();
    assert!(url.starts_with("http://127.0.0.1:"), "{first}");
    (child, url)
}

/// A refund of 100 cents of `pi_demo` under `key` at the sandbox at `url`: the status and body.
async fn standalone_refund(url: &str, key: &str) -> (u16, Value) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let created = reqwest::Client::new()
        .post(format!("{url}/v1/refunds"))
        .header("Idempotency-Key", key)
        .header("Content-Type", "application/x-www-form-urlencoded")
        .body("payment_intent=pi_demo&amount=100")
        .send()
        .await
        .unwrap();
    (created.status().as_u16(), serde_json::from_slice(&created.bytes().await.unwrap()).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sandbox_runs_standalone() {
    let (mut child, url) = standalone_sandbox(&[]);
    let (status, body) = standalone_refund(&url, "k1").await;
    child.kill().unwrap();
    let _ = child.wait();
    assert_eq!(status, 200);
    assert_eq!(body["amount"], 100);
    // As a provider that takes only UUID keys.
    let (mut child, url) = standalone_sandbox(&["--uuid-keys"]);
    let refused = standalone_refund(&url, "k1").await;
    let taken = standalone_refund(&url, "5f0c3e2a-9b1d-4c8e-a7f6-0123456789ab").await;
    child.kill().unwrap();
    let _ = child.wait();
    assert_eq!(refused.0, 400, "{}", refused.1);
    assert_eq!(taken.0, 200, "{}", taken.1);
}
