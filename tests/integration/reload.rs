//! Changing tools and policy while serving (`docs/operations.md`), through
//! the real binary: `toolguard reload` and SIGHUP against a `serve --http`
//! with calls in flight at the sandbox, each effect counted there, and each
//! attempt's policy digest read back from the ledger.

use crate::common::{BIN, stdout_json};
use crate::payments::{Downstream, INTENT_AND_AMOUNT, config_text};
use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use toolguard::mcp::client::McpClient;
use toolguard_sandbox::{Fault, Mode, Sandbox};

/// The payment intent every refund here is made against (room for thousands).
pub const INTENT: &str = "pi_reload";

/// A `serve --http` on a config file the test rewrites, and its sandbox.
pub struct Host {
    pub rt: tokio::runtime::Runtime,
    pub sandbox: Sandbox,
    pub dir: tempfile::TempDir,
    server: crate::common::Server,
    pub url: String,
    log: Arc<Mutex<String>>,
    pub config: PathBuf,
}

impl Host {
    /// Serves the payments config of `d` plus `extra` TOML, with `env`.
    pub fn start(d: &Downstream, extra: &str, env: &[(&str, &str)]) -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let sandbox = rt.block_on(Sandbox::start("127.0.0.1:0", Mode::Stripe, toolguard_sandbox::DEFAULT_RETENTION)).unwrap();
        sandbox.add_payment_intent(INTENT, 100_000_000);
        let _ = rustls::crypto::ring::default_provider().install_default();
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("host.toml");
        std::fs::write(&config, Self::text_for((&sandbox, &dir), d, extra)).unwrap();
        let (server, log) = crate::common::serve_http_logged(&config, env);
        let url = server.url.clone();
        Self { rt, sandbox, dir, server, url, log, config }
    }

    fn text_for((sandbox, dir): (&Sandbox, &tempfile::TempDir), d: &Downstream, extra: &str) -> String {
        format!("{}\n{extra}\n", config_text(&sandbox.url(), &dir.path().join("data"), d))
    }

    /// Rewrites the config file (nothing changes until a reload).
    pub fn rewrite(&self, d: &Downstream, extra: &str) {
        std::fs::write(&self.config, Self::text_for((&self.sandbox, &self.dir), d, extra)).unwrap();
    }

    /// The process id of the serve.
    pub fn pid(&self) -> u32 {
        self.server.child.id()
    }

    /// `n` refunds (sessions `s-I`, call ids `PREFIX-I`) held at the
    /// provider once this returns: their answers, to come.
    pub fn hold(&self, client: &Arc<McpClient>, n: usize, prefix: &str) -> Vec<tokio::task::JoinHandle<Value>> {
        for _ in 0..n {
            self.sandbox.inject(Fault::PauseAfterCommit);
        }
        let held = (0..n)
            .map(|i| {
                let (client, call) = (client.clone(), format!("{prefix}-{i}"));
                self.rt.spawn(async move { refund(&client, &format!("s-{i}"), &call).await })
            })
            .collect();
        wait_until(120, &format!("{n} refund(s) held at the provider"), || self.sandbox.paused() == n);
        held
    }

    /// `toolguard reload` of this host: what it printed, and whether it exited 0.
    pub fn reload(&self) -> (Value, bool) {
        let out = Command::new(BIN).args(["reload", "--config", self.config.to_str().unwrap()]).output().unwrap();
        (stdout_json(&out), out.status.success())
    }

    /// `GET /info`.
    pub fn info(&self) -> Value {
        let url = self.url.replace(toolguard::mcp::http::PATH, toolguard::mcp::http::INFO_PATH);
        self.rt.block_on(async {
            let _ = rustls::crypto::ring::default_provider().install_default();
            serde_json::from_str(&reqwest::get(url).await.unwrap().text().await.unwrap()).unwrap()
        })
    }

    /// The policy digest the payments plugin is served with now.
    pub fn payments_policy(&self) -> String {
        self.info()["plugins"]["payments"]["policy_digest"].as_str().unwrap().to_string()
    }

    /// The host's log so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Every attempt in the ledger (`toolguard ledger export`).
    pub fn attempts(&self) -> Vec<Value> {
        let out = Command::new(BIN).args(["ledger", "export", "--config", self.config.to_str().unwrap()]).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let lines = String::from_utf8(out.stdout).unwrap();
        lines.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()).filter(|v| v["type"] == "attempt").map(|v| v["record"].clone()).collect()
    }
}

/// A refund of one cent in session `session` under tool-call id `call_id`: the `tools/call` result.
pub async fn refund(client: &McpClient, session: &str, call_id: &str) -> Value {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let params = json!({
        "name": "refund",
        "arguments": { "payment_intent": INTENT, "amount_cents": 1, "reason": "requested_by_customer" },
        "_meta": { "toolguard/toolCallId": call_id, "toolguard/sessionId": session },
    });
    client.request(id, "tools/call", params).await.unwrap()["result"].clone()
}

/// Waits until `done` holds (polling), failing the test after `secs` seconds.
pub fn wait_until(secs: u64, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !done() {
        assert!(Instant::now() < deadline, "waited {secs} s for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A downstream patient enough for a request held at the provider.
pub fn patient() -> Downstream {
    Downstream { timeout_ms: 120_000, max_retries: 0, ..Downstream::default() }
}

/// 64 refunds held at the provider while the policy changes: each finishes
/// under the policy that admitted it (its attempt says so), none is lost or
/// made twice; calls after the reload run under the new one.
#[test]
fn a_reload_during_64_calls_in_flight_loses_none_and_makes_none_twice() {
    let host = Host::start(&patient(), "", &[]);
    let before = host.payments_policy();
    let client = Arc::new(host.rt.block_on(McpClient::connect(&host.url)).unwrap());
    let first = host.hold(&client, 64, "c");
    // A narrower budget: another effective policy, the same identity of every action.
    host.rewrite(&Downstream { refunds_per_session_hour: 999, ..patient() }, "");
    let (report, ok) = host.reload();
    assert!(ok, "{report:#}\n{}", host.log());
    assert_eq!(report["reloaded"], true, "{report:#}");
    assert_eq!(report["report"]["generation"], 2);
    assert_eq!(report["report"]["changed"], json!(["payments"]));
    assert_eq!(report["report"]["tools_changed"], false, "a budget is not what clients see");
    let after = host.payments_policy();
    assert_ne!(before, after, "the new policy serves");
    assert_eq!(host.info()["generation"], 2);
    host.sandbox.release();
    for answer in first {
        let result = host.rt.block_on(answer).unwrap();
        assert_eq!(result["isError"], false, "{result:#}");
    }
    assert_eq!(host.sandbox.refunds().len(), 64, "each held refund made once");
    // After the reload: new calls, under the new policy; the old ids replay.
    host.rt.block_on(async {
        for i in 0..64 {
            let result = refund(&client, &format!("s-{i}"), &format!("c2-{i}")).await;
            assert_eq!(result["isError"], false, "{result:#}");
            let replay = refund(&client, &format!("s-{i}"), &format!("c-{i}")).await;
            assert_eq!(replay["_meta"]["toolguard/replayed"], true, "{replay:#}");
        }
    });
    assert_eq!(host.sandbox.refunds().len(), 128, "64 new refunds, no replay made one");
    let attempts = host.attempts();
    assert_eq!(attempts.len(), 128, "one attempt per refund");
    for attempt in &attempts {
        let call = attempt["call_id"].as_str().unwrap();
        let expected = if call.starts_with("c2-") { &after } else { &before };
        assert_eq!(attempt["policy"].as_str(), Some(expected.as_str()), "call {call} ran under exactly the policy that admitted it");
    }
}

/// A reload that fails any check changes nothing: the old generation keeps
/// serving, with its policy, and the refusal says what is wrong.
#[test]
fn a_bad_reload_is_refused_whole_and_the_old_policy_keeps_serving() {
    let host = Host::start(&Downstream::default(), "", &[]);
    let before = host.payments_policy();
    let good = Downstream::default();
    let hostile = crate::common::wasm("import-sockets").display().to_string();
    let cases: Vec<(&str, String, &str)> = vec![
        ("not TOML", "this is = = not toml".into(), "host.toml"),
        ("a wrong pin", "[plugins.extra]\ncomponent = \"builtin:text-stats\"\nsha256 = \"00\"\n".into(), "sha256"),
        ("a component importing sockets", format!("[plugins.extra]\ncomponent = {hostile:?}\n"), "wasi:sockets"),
        ("a missing credential", "[policy.downstreams.other]\nurl = \"http://127.0.0.1:9\"\ncredential = { env = \"TG_RELOAD_UNSET\" }\nkey = [{ transport = \"header\", name = \"Idempotency-Key\" }]\n".into(), "TG_RELOAD_UNSET"),
        ("a setting only a restart applies", "[mcp]\nmax_sessions = 7\n".into(), "restart"),
    ];
    for (what, extra, named) in cases {
        host.rewrite(&good, &extra);
        let (answer, ok) = host.reload();
        assert!(!ok, "{what}: {answer:#}");
        let said = answer.to_string();
        assert!(said.contains(named) && said.contains("refused"), "{what}: the refusal names it: {answer:#}");
        assert_eq!(host.info()["generation"], 1, "{what}: nothing was swapped in");
        assert_eq!(host.payments_policy(), before, "{what}");
        assert!(host.info()["plugins"].get("extra").is_none(), "{what}");
    }
    // The old generation still serves calls.
    let client = host.rt.block_on(McpClient::connect(&host.url)).unwrap();
    let result = host.rt.block_on(refund(&client, "s", "after-refusals"));
    assert_eq!(result["isError"], false, "{result:#}");
    assert_eq!(host.sandbox.refunds().len(), 1);
    // And a good one then goes through.
    host.rewrite(&good, "[plugins.extra]\ncomponent = \"builtin:text-stats\"\n");
    let (answer, ok) = host.reload();
    assert!(ok, "{answer:#}");
    assert_eq!(answer["report"]["added"], json!(["extra"]));
    assert_eq!(answer["report"]["tools_changed"], true);
}

/// Changing what makes two refunds the same action, while a refund is
/// unresolved, is refused naming that call; once it is settled the same
/// change goes through.
#[test]
fn a_change_to_an_actions_identity_waits_until_its_calls_are_settled() {
    let declared = Downstream { refund_action: Some(INTENT_AND_AMOUNT), ..patient() };
    let host = Host::start(&declared, "", &[]);
    let client = Arc::new(host.rt.block_on(McpClient::connect(&host.url)).unwrap());
    let held = host.hold(&client, 1, "c-unresolved").remove(0);
    host.rewrite(&patient(), "");
    let (answer, ok) = host.reload();
    assert!(!ok, "{answer:#}");
    let said = answer["error"].as_str().unwrap();
    assert!(said.contains("`action`") && said.contains("c-unresolved"), "names the change and the call: {said}");
    // Pending at the provider and running now: one call, named once with both facts.
    assert_eq!(said.matches("c-unresolved").count(), 1, "each call named once: {said}");
    assert!(said.contains("1 call(s)") && said.contains("running now") && said.contains("attempt"), "{said}");
    assert_eq!(host.info()["generation"], 1);
    // A transport change of the downstream it goes to is refused the same way.
    host.rewrite(&Downstream { key: crate::payments::HEADER_ONLY, refund_action: Some(INTENT_AND_AMOUNT), ..patient() }, "");
    let (answer, ok) = host.reload();
    assert!(!ok && answer["error"].as_str().unwrap().contains("downstream `payments`"), "{answer:#}");
    host.sandbox.release();
    let result = host.rt.block_on(held).unwrap();
    assert_eq!(result["isError"], false, "{result:#}");
    host.rewrite(&patient(), "");
    let (answer, ok) = host.reload();
    assert!(ok, "settled, the change goes through: {answer:#}");
    assert_eq!(host.sandbox.refunds().len(), 1);
}

/// SIGHUP reloads too; a reload that removes a tool leaves its running call
/// to finish under the policy that admitted it.
#[test]
fn sighup_reloads_and_a_removed_tool_finishes_its_running_call() {
    let host = Host::start(&patient(), "", &[]);
    let client = Arc::new(host.rt.block_on(McpClient::connect(&host.url)).unwrap());
    let held = host.hold(&client, 1, "c-gone").remove(0);
    // Only the rogue plugin is left (the downstream stays: rogue's grant names it).
    let text = std::fs::read_to_string(&host.config).unwrap();
    std::fs::write(&host.config, without_payments(&text)).unwrap();
    let status = Command::new("kill").args(["-HUP", &host.pid().to_string()]).status().unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(60);
    while host.info()["generation"] != 2 {
        assert!(Instant::now() < deadline, "no SIGHUP reload in 60 s:\n{}", host.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(host.info()["plugins"].get("payments").is_none(), "{}", host.log());
    host.sandbox.release();
    let result = host.rt.block_on(held).unwrap();
    assert_eq!(result["isError"], false, "the running call finished under the generation that admitted it: {result:#}");
    assert_eq!(host.sandbox.refunds().len(), 1);
    // A new call of the removed tool is refused, nothing sent.
    let again = host.rt.block_on(async { client.request(99, "tools/call", json!({ "name": "refund", "arguments": {} })).await.unwrap() });
    assert!(again.to_string().contains("Unknown tool"), "{again:#}");
    assert_eq!(host.sandbox.refunds().len(), 1);
}

/// The config text without the payments plugin and its policy (its
/// downstream stays: the rogue plugin's grant names it).
pub fn without_payments(text: &str) -> String {
    let without = strip_tables(&strip_tables(text, "[plugins.payments"), "[policy.plugins.payments");
    strip_tables(&without, "[[policy.plugins.payments")
}

/// Drops every TOML table whose header starts with `prefix` (up to the next table).
fn strip_tables(text: &str, prefix: &str) -> String {
    let mut kept = String::new();
    let mut skipping = false;
    for line in text.lines() {
        if line.starts_with('[') {
            skipping = line.starts_with(prefix);
        }
        if !skipping {
            kept.push_str(line);
            kept.push('\n');
        }
    }
    kept
}

/// A token removed from `[mcp] tokens` by a reload is refused on its next
/// request; the others go on.
#[test]
fn a_token_removed_by_a_reload_is_refused_on_its_next_request() {
    let tokens = |both: bool| {
        let mut t = "[[mcp.tokens]]\nprincipal = \"agent-a\"\ntoken_env = \"TG_RELOAD_A\"\n".to_string();
        if both {
            t.push_str("[[mcp.tokens]]\nprincipal = \"agent-b\"\ntoken_env = \"TG_RELOAD_B\"\n");
        }
        t
    };
    let env = [("TG_RELOAD_A", "token-of-agent-a-long"), ("TG_RELOAD_B", "token-of-agent-b-long")];
    let host = Host::start(&Downstream::default(), &tokens(true), &env);
    let status = |token: &str| crate::mcp::send(&host.url, &[("Authorization", &format!("Bearer {token}"))], INIT.into()).0;
    assert_eq!(status("token-of-agent-b-long"), 200);
    host.rewrite(&Downstream::default(), &tokens(false));
    let (answer, ok) = host.reload();
    assert!(ok, "{answer:#}");
    assert_eq!(status("token-of-agent-b-long"), 401, "revoked: refused on its next request");
    assert_eq!(status("token-of-agent-a-long"), 200, "the others go on");
}

const INIT: &str =
    r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;

/// The official Python SDK, connected before a reload that adds a tool, is
/// told the list changed and lists the new tool: in a 2025-11-25 session
/// (`notifications/tools/list_changed`) and listening on 2026-07-28's
/// `subscriptions/listen`.
#[test]
fn the_python_sdk_hears_the_tool_list_changed() {
    for mode in ["legacy", "auto"] {
        let host = Host::start(&Downstream::default(), "", &[]);
        let python = std::env::var("TOOLGUARD_PYTHON").expect("TOOLGUARD_PYTHON: run the tests with ./dev.sh test");
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/mcp/list_changed.py");
        let mut child = Command::new(python).arg(script).args([&host.url, mode]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let listed: Value = serde_json::from_str(&lines.next().expect("the client listed the tools").unwrap()).unwrap();
        assert!(!listed["tools"].as_array().unwrap().contains(&json!("text_stats")), "{mode}: {listed}");
        if mode == "auto" {
            assert_eq!(listed["protocol"], "2026-07-28", "{listed}");
        }
        host.rewrite(&Downstream::default(), "[plugins.extra]\ncomponent = \"builtin:text-stats\"\n");
        let (answer, ok) = host.reload();
        assert!(ok, "{answer:#}");
        let changed = lines.next().map(|l| l.unwrap());
        let status = child.wait().unwrap();
        let stderr = std::io::read_to_string(child.stderr.take().unwrap()).unwrap_or_default();
        let changed: Value = serde_json::from_str(&changed.unwrap_or_else(|| panic!("{mode}: no second line; {status}\n{stderr}"))).unwrap();
        assert_eq!(changed["step"], "changed", "{mode}: {changed}\n{stderr}");
        assert!(changed["tools"].as_array().unwrap().contains(&json!("text_stats")), "{mode}: {changed}");
    }
}
