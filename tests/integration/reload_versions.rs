//! Rolling out a new version while serving (`docs/operations.md`): a
//! component replaced (a new pin) while calls to it are in flight, a tool
//! removed with an unsettled call, and a rolling reload of a fleet over
//! PostgreSQL, whose `ledger stats` shows the hosts serving different
//! policies until the roll is done. Effects are counted at the sandbox.

use crate::common::{BIN, Mcp, fresh_postgres_database, serve_http, stdout_json, wasm};
use crate::payments::{Downstream, HEADER_ONLY, PI};
use crate::reload::{Host, patient, refund};

use serde_json::{Value, json};
use sha2::Digest as _;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;
use toolguard::mcp::client::McpClient;
use toolguard_sandbox::{Fault, Mode, Sandbox};

/// The payments component at `path`, pinned: the host's config text with
/// its component and `sha256` in place of the built one's.
fn pinned(text: &str, path: &std::path::Path) -> String {
    let digest = hex::encode(sha2::Sha256::digest(std::fs::read(path).unwrap()));
    let built = format!("component = {:?}", wasm("payments").display().to_string());
    assert!(text.contains(&built), "the config names the built payments component");
    text.replace(&built, &format!("component = {:?}", path.display().to_string()))
        .replace("[policy.plugins.payments]\n", &format!("[policy.plugins.payments]\nsha256 = {digest:?}\n"))
}

/// A new version of a component: the same code with a custom section
/// appended (a new sha256, as a rebuild would have).
fn new_version(from: &std::path::Path, to: &std::path::Path) {
    let mut bytes = std::fs::read(from).unwrap();
    let (name, payload) = (b"toolguard-test-version", b"2");
    let body = [&[name.len() as u8][..], name, payload].concat();
    bytes.extend_from_slice(&[0, body.len() as u8]);
    bytes.extend_from_slice(&body);
    std::fs::write(to, bytes).unwrap();
}

/// Eight refunds held at the provider while their component is replaced by
/// a new version (a new pin): each finishes on the version that admitted it,
/// once; calls after the reload run the new one.
#[test]
fn a_component_replaced_by_a_new_version_while_calls_to_it_are_in_flight() {
    let host = Host::start(&patient(), "", &[]);
    let (v1, v2) = (host.dir.path().join("payments-v1.wasm"), host.dir.path().join("payments-v2.wasm"));
    std::fs::copy(wasm("payments"), &v1).unwrap();
    new_version(&v1, &v2);
    let text = std::fs::read_to_string(&host.config).unwrap();
    std::fs::write(&host.config, pinned(&text, &v1)).unwrap();
    let (answer, ok) = host.reload();
    assert!(ok, "{answer:#}");
    let sha = |v: &Value| v["plugins"]["payments"]["sha256"].as_str().unwrap().to_string();
    let first = sha(&host.info());
    let client = Arc::new(host.rt.block_on(McpClient::connect(&host.url)).unwrap());
    let held = host.hold(&client, 8, "v1");
    std::fs::write(&host.config, pinned(&text, &v2)).unwrap();
    let (answer, ok) = host.reload();
    assert!(ok, "{answer:#}");
    assert_eq!(answer["report"]["changed"], json!(["payments"]));
    let second = sha(&answer["report"]);
    assert_ne!(first, second, "the new version serves");
    assert_eq!(sha(&host.info()), second);
    // The old pin no longer admits anything: v1 with v2's pin is refused.
    std::fs::write(&host.config, pinned(&text, &v2).replace(&v2.display().to_string(), &v1.display().to_string())).unwrap();
    let (answer, ok) = host.reload();
    assert!(!ok && answer["error"].as_str().unwrap().contains("sha256"), "{answer:#}");
    host.sandbox.release();
    for answer in held {
        let result = host.rt.block_on(answer).unwrap();
        assert_eq!(result["isError"], false, "{result:#}");
    }
    host.rt.block_on(async {
        for i in 0..8 {
            assert_eq!(refund(&client, &format!("s-{i}"), &format!("v2-{i}")).await["isError"], false);
            assert_eq!(refund(&client, &format!("s-{i}"), &format!("v1-{i}")).await["_meta"]["toolguard/replayed"], true);
        }
    });
    assert_eq!(host.sandbox.refunds().len(), 16, "each refund once: 8 on the old version, 8 on the new");
}

/// A tool removed while a call of it is unsettled: the reload warns, naming
/// the attempt, and nothing re-sends it under a policy that no longer grants it.
#[test]
fn a_tool_removed_with_an_unsettled_call_is_named_and_never_re_sent() {
    let d = Downstream { key: HEADER_ONLY, max_retries: 0, ..Downstream::default() };
    let host = Host::start(&d, "", &[]);
    host.sandbox.inject(Fault::CommitStuckInFlight);
    let client = host.rt.block_on(McpClient::connect(&host.url)).unwrap();
    let answer = host.rt.block_on(refund(&client, "s-stuck", "c-stuck"));
    assert_eq!(answer["isError"], true, "{answer:#}");
    let unsettled: Vec<Value> = host.attempts().into_iter().filter(|a| a["state"] == "pending" || a["state"] == "unknown").collect();
    assert_eq!(unsettled.len(), 1, "{answer:#}");
    let key = unsettled[0]["key"].as_str().unwrap().to_string();
    let text = std::fs::read_to_string(&host.config).unwrap();
    std::fs::write(&host.config, crate::reload::without_payments(&text)).unwrap();
    let (answer, ok) = host.reload();
    assert!(ok, "{answer:#}");
    let warnings = answer["report"]["warnings"].to_string();
    assert!(warnings.contains(&key) && warnings.contains("`refund` was removed"), "{answer:#}");
    let posts = host.sandbox.requests().iter().filter(|r| r.method == "POST").count();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(host.sandbox.requests().iter().filter(|r| r.method == "POST").count(), posts, "nothing re-sent");
    assert!(host.attempts().iter().any(|a| a["key"] == key.as_str() && (a["state"] == "pending" || a["state"] == "unknown")), "still unsettled");
}

/// `toolguard ledger stats --json` of `config`: its `serving` section.
fn serving(config: &std::path::Path) -> Value {
    let out = Command::new(BIN).args(["ledger", "stats", "--json", "--config", config.to_str().unwrap()]).output().unwrap();
    stdout_json(&out)["serving"].clone()
}

/// A rolling reload of two hosts over one PostgreSQL ledger: while only one
/// has the new policy, `ledger stats` shows the payments plugin served under
/// two policies, naming the hosts; once both have it, one. Calls made on
/// both hosts throughout — the same tool call on both at once included —
/// each refund once.
#[test]
fn a_rolling_reload_over_postgresql_shows_the_fleets_policies_and_doubles_nothing() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let sandbox = rt.block_on(Sandbox::start("127.0.0.1:0", Mode::Stripe, toolguard_sandbox::DEFAULT_RETENTION)).unwrap();
    sandbox.add_payment_intent(PI, 1_000_000);
    let dir = tempfile::tempdir().unwrap();
    let d = Downstream { refunds_per_session_hour: 1_000, ..Downstream::default() };
    let configs = crate::fleet::host_configs(&sandbox.url(), &fresh_postgres_database(), dir.path(), &d);
    let hosts = [serve_http(&configs[0], &[]), serve_http(&configs[1], &[])];
    let clients = rt.block_on(async { [Mcp::connect(&hosts[0].url).await, Mcp::connect(&hosts[1].url).await] });
    let mut amount = 0;
    let mut both = |label: &str| {
        // The same tool call through both hosts at once (a retry through a load balancer).
        amount += 1;
        let id = format!("{label}-{amount}");
        let (a, b) = rt.block_on(async { tokio::join!(clients[0].refund(&id, amount), clients[1].refund(&id, amount)) });
        assert!(a.is_ok() && b.is_ok(), "{a:?} {b:?}");
    };
    both("before");
    let start = serving(&configs[0]);
    assert_eq!(start["hosts"].as_array().unwrap().len(), 2, "{start:#}");
    assert_eq!(start["policies_differ"], json!({}), "{start:#}");
    let flip = |path: &std::path::Path| {
        let text = std::fs::read_to_string(path).unwrap();
        let budget = "max_irreversible_calls_per_session_hour = 1000\n";
        assert!(text.contains(budget));
        std::fs::write(path, text.replace(budget, "max_irreversible_calls_per_session_hour = 999\n")).unwrap();
        let out = Command::new(BIN).args(["reload", "--config", path.to_str().unwrap()]).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    };
    flip(&configs[0]);
    both("halfway");
    let halfway = serving(&configs[1]);
    let differ = &halfway["policies_differ"]["payments"];
    assert_eq!(differ.as_object().map(|m| m.len()), Some(2), "one host on each policy: {halfway:#}");
    let text = Command::new(BIN).args(["ledger", "stats", "--config", configs[1].to_str().unwrap()]).output().unwrap();
    assert!(String::from_utf8_lossy(&text.stdout).contains("DIFFERS     `payments` is served under 2 policies"), "{}", String::from_utf8_lossy(&text.stdout));
    flip(&configs[1]);
    both("after");
    let after = serving(&configs[0]);
    assert_eq!(after["policies_differ"], json!({}), "{after:#}");
    let generations: Vec<u64> = after["hosts"].as_array().unwrap().iter().map(|h| h["record"]["generation"].as_u64().unwrap()).collect();
    assert_eq!(generations, vec![2, 2], "{after:#}");
    assert_eq!(sandbox.refunds().len(), 3, "one refund per tool call, though each was sent to both hosts");
}

/// A downstream credential rotated in its file: a reload reads it again.
/// A refund held at the provider keeps the credential it started with; the
/// next one sends the new, and the old is never sent after the reload.
#[test]
fn a_rotated_credential_file_is_read_again_by_a_reload() {
    let host = Host::start(&patient(), "", &[]);
    // A credential added by a reload; its file beside the config (relative paths are the config's).
    let key_file = host.config.parent().unwrap().join("api-key");
    std::fs::write(&key_file, "sk_test_first_key_123456\n").unwrap();
    host.rewrite(&Downstream { extra: r#"credential = { prefix = "Bearer ", file = "api-key" }"#, ..patient() }, "");
    let (answer, ok) = host.reload();
    assert!(ok, "{answer:#}");
    host.sandbox.require_api_key(Some("sk_test_first_key_123456"));
    let client = Arc::new(host.rt.block_on(McpClient::connect(&host.url)).unwrap());
    let held = host.hold(&client, 1, "c-before").remove(0);
    std::fs::write(&key_file, "sk_test_second_key_654321\n").unwrap();
    let (answer, ok) = host.reload();
    assert!(ok, "{answer:#}");
    host.sandbox.release();
    assert_eq!(host.rt.block_on(held).unwrap()["isError"], false);
    host.sandbox.require_api_key(Some("sk_test_second_key_654321"));
    let after = host.rt.block_on(refund(&client, "s-rot", "c-after"));
    assert_eq!(after["isError"], false, "the new key is sent: {after:#}");
    assert_eq!(host.sandbox.refunds().len(), 2);
}
