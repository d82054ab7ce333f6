//! Consent (`docs/tasks.md`): a refund above the reviewer's line runs only
//! once a person approved that exact call — the person at the client
//! (inside its task) or an operator (`toolguard approvals`) — and every
//! outcome is counted at the sandbox: approve, deny, expire, replay, a
//! blind repeat while pending, changed arguments.

use crate::common::{BIN, fresh_postgres_database, serve_http, shared_cache, wasm};
use crate::tasks::{Client, task_id};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::Duration;
use toolguard_sandbox::config::PaymentsConfig;
use toolguard_sandbox::{Mode, Sandbox};

/// Refunds above 1000 cents need approval; tasks after 300 ms.
const APPROVAL: &str = r#"approval = { above = { "/amount_cents" = 1000 }, expires_minutes = 1 }"#;

/// A sandbox and the config of a refund host (its ledger `ledger`, or RocksDB).
fn world(dir: &Path, ledger: Option<&str>) -> (tokio::runtime::Runtime, Sandbox, PathBuf) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let sandbox = rt.block_on(Sandbox::start("127.0.0.1:0", Mode::Stripe, toolguard_sandbox::DEFAULT_RETENTION)).unwrap();
    sandbox.add_payment_intent("pi_mcp", 1_000_000);
    let payments = PaymentsConfig {
        timeout_ms: Some(20_000),
        refund_policy: Some(APPROVAL.into()),
        ..PaymentsConfig::new(sandbox.url(), wasm("payments").display().to_string())
    };
    let ledger = ledger.map(|l| format!("ledger = {l:?}\n")).unwrap_or_default();
    let text = format!(
        "{ledger}data_dir = \"data\"\ncompile_cache = {:?}\n{}\n[mcp]\ntask_after_ms = 300\ntask_poll_ms = 100\n",
        shared_cache().display().to_string(),
        payments.toml()
    );
    let config = dir.join("consent.toml");
    std::fs::write(&config, text).unwrap();
    (rt, sandbox, config)
}

/// Polls `task` until its status is `status` (or it ends): its last state.
fn until(client: &Client, task: &str, status: &str) -> Value {
    let mut last = Value::Null;
    let reached = crate::world::wait_for(Duration::from_secs(30), || {
        last = client.task("get", task)["result"].clone();
        last["status"] == status || ["completed", "failed", "cancelled"].contains(&last["status"].as_str().unwrap_or(""))
    });
    assert!(reached && last["status"] == status, "task {task} never {status}: {last}");
    last
}

/// The key of the approval a task in `input_required` asks for.
fn asked(task: &Value) -> String {
    let requests = task["inputRequests"].as_object().unwrap_or_else(|| panic!("no input requests: {task}"));
    assert_eq!(requests.len(), 1, "{task}");
    let (key, request) = requests.iter().next().unwrap();
    assert_eq!(request["method"], "elicitation/create", "{task}");
    assert!(request["params"]["message"].as_str().unwrap().contains("/amount_cents is 5000, above 1000"), "{task}");
    key.clone()
}

fn posts(sandbox: &Sandbox) -> usize {
    sandbox.requests().iter().filter(|r| r.method == "POST").count()
}

#[test]
fn a_refund_above_the_line_waits_for_the_person_at_the_client_and_runs_once_approved() {
    let dir = tempfile::tempdir().unwrap();
    let (_rt, sandbox, config) = world(dir.path(), None);
    let server = serve_http(&config, &[]);
    let client = Client::open(&server.url, None).eliciting();
    let first = task_id(&client.refund("c1", 5_000, true));
    let waiting = until(&client, &first, "input_required");
    let key = asked(&waiting);
    // The model, told nothing definitive, re-issues it: it waits behind the first, asking nothing.
    let repeat = task_id(&client.refund("c2", 5_000, true));
    let behind = client.task("get", &repeat)["result"].clone();
    assert_eq!(behind["status"], "working", "{behind}");
    assert_eq!(posts(&sandbox), 0, "nothing is sent before a decision");
    // The person approves, once.
    let ack = client.answer(&first, &key, json!({ "action": "accept", "content": { "approve": true, "note": "customer called" } }));
    assert_eq!(ack["result"], json!({ "resultType": "complete" }), "{ack}");
    let done = until(&client, &first, "completed");
    let refund_id = done["result"]["structuredContent"]["refund_id"].as_str().unwrap().to_string();
    let held = client.settled(&repeat);
    assert!(held["result"].to_string().contains(&refund_id), "the repeat is told the approved refund: {held}");
    assert_eq!(sandbox.refunds().len(), 1, "one approval, one refund");
    // Approving again changes nothing: the request was decided, its key is no longer outstanding (ignored, as the extension says).
    let again = client.answer(&first, &key, json!({ "action": "accept", "content": { "approve": true } }));
    assert_eq!(again["result"], json!({ "resultType": "complete" }), "{again}");
    assert_eq!(sandbox.refunds().len(), 1, "and nothing more happened");
    // The replay returns the refund without asking; a refund below the line is not asked about.
    assert_eq!(client.refund("c1", 5_000, false)["structuredContent"]["refund_id"], refund_id.as_str());
    assert_eq!(client.refund("c3", 900, true)["isError"], false);
    assert_eq!(sandbox.refunds().len(), 2);
    // Who approved what is in the ledger's export.
    let out = std::process::Command::new(BIN).args(["ledger", "export", "--config", config.to_str().unwrap()]).output().unwrap();
    let export = String::from_utf8_lossy(&out.stdout);
    let c1 = export.lines().find(|l| l.contains(r#""call_id":"c1""#)).expect("c1 in the export");
    for fact in [r#""status":"approved""#, r#""decided_by":"client:unauthenticated""#, r#""note":"customer called""#, r#""policy_digest":""#] {
        assert!(c1.contains(fact), "{fact} in {c1}");
    }
    // And the rule is in the audit.
    let out = std::process::Command::new(BIN).args(["audit", "--config", config.to_str().unwrap()]).output().unwrap();
    let audit = String::from_utf8_lossy(&out.stdout);
    assert!(audit.contains("approval: /amount_cents above 1000; a request waits 1 min"), "{audit}");
}

#[test]
fn a_denial_is_the_answer_and_other_arguments_need_their_own_approval() {
    let dir = tempfile::tempdir().unwrap();
    let (_rt, sandbox, config) = world(dir.path(), None);
    let server = serve_http(&config, &[]);
    let client = Client::open(&server.url, None).eliciting();
    let denied = task_id(&client.refund("d1", 5_000, true));
    let key = asked(&until(&client, &denied, "input_required"));
    client.answer(&denied, &key, json!({ "action": "decline" }));
    let told = until(&client, &denied, "completed");
    assert_eq!(told["result"]["structuredContent"]["kind"], "denied", "{told}");
    assert_eq!(told["result"]["structuredContent"]["detail"]["approval"]["status"], "denied");
    assert_eq!(client.refund("d1", 5_000, false)["structuredContent"]["kind"], "denied", "its replay is the denial");
    // The same refund, told denied, asked again under a new id: a new request, decided anew.
    let other = task_id(&client.refund("d2", 5_000, true));
    let second = asked(&until(&client, &other, "input_required"));
    assert_ne!(second, key, "a new request, not the denied one");
    client.answer(&other, &second, json!({ "action": "accept", "content": { "approve": true } }));
    until(&client, &other, "completed");
    assert_eq!(sandbox.refunds().len(), 1, "the denied call sent nothing; the approved one refunded once");
    // The approval of one action is not another's: other arguments ask again.
    let bigger = task_id(&client.refund("d3", 7_000, true));
    let waiting = until(&client, &bigger, "input_required");
    assert!(waiting["inputRequests"].to_string().contains("7000"), "{waiting}");
    assert_eq!(sandbox.refunds().len(), 1);
}

#[test]
fn an_approval_nobody_gives_in_time_expires_as_a_denial_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (_rt, sandbox, config) = world(dir.path(), None);
    let mut server = serve_http(&config, &[]);
    let client = Client::open(&server.url, None).eliciting();
    let task = task_id(&client.refund("e1", 5_000, true));
    until(&client, &task, "input_required");
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    // Two minutes later (the ledger's clock moved on), past the one-minute expiry.
    let later = serve_http(&config, &[("TOOLGUARD_CLOCK_SKEW_MS", "120000")]);
    let client = Client::open(&later.url, None).eliciting();
    let told = client.settled(&task);
    assert_eq!(told["result"]["structuredContent"]["kind"], "denied", "{told}");
    assert_eq!(told["result"]["structuredContent"]["detail"]["approval"]["status"], "expired", "{told}");
    assert_eq!(posts(&sandbox), 0, "nothing was ever sent");
}

#[test]
fn where_the_client_cannot_ask_an_operator_decides_from_the_command_line_on_a_shared_ledger() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = fresh_postgres_database();
    let (_rt, sandbox, config) = world(dir.path(), Some(&ledger));
    let server = serve_http(&config, &[]);
    let client = Client::open(&server.url, None);
    let task = task_id(&client.refund("o1", 5_000, true));
    let working = client.task("get", &task)["result"].clone();
    assert_eq!(working["status"], "working", "a client that cannot elicit is not asked: {working}");
    assert!(working["statusMessage"].as_str().unwrap().contains("toolguard approvals approve o1"), "{working}");
    let approvals = |args: &[&str]| {
        let out = std::process::Command::new(BIN).arg("approvals").args(args).args(["--config", config.to_str().unwrap()]).output().unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stdout).to_string())
    };
    let (code, listed) = approvals(&["list"]);
    assert_eq!(code, Some(0), "{listed}");
    let listed: Value = serde_json::from_str(&listed).unwrap();
    let waiting = &listed["waiting"][0];
    assert_eq!(listed["waiting"].as_array().map(Vec::len), Some(1), "{listed}");
    assert_eq!((waiting["call_id"].as_str(), waiting["tool"].as_str()), (Some("o1"), Some("refund")));
    assert!(waiting["reason"].as_str().unwrap().contains("above 1000"));
    let (code, decided) = approvals(&["approve", "o1", "--by", "ops-oncall", "--note", "checked"]);
    assert_eq!(code, Some(0), "{decided}");
    let decided: Value = serde_json::from_str(&decided).unwrap();
    assert_eq!(decided["decided"]["decided_by"], "operator:ops-oncall", "{decided}");
    assert_eq!(decided["decided"]["status"], "approved", "{decided}");
    let (code, twice) = approvals(&["deny", "o1"]);
    assert_eq!(code, Some(1), "nothing waits any more: {twice}");
    let done = until(&client, &task, "completed");
    assert_eq!(done["result"]["isError"], false, "{done}");
    assert_eq!(sandbox.refunds().len(), 1);
}

/// Runs the official Python SDK's client against `url` in `mode`, answering
/// the approval it is asked for with `decision`: what it printed.
fn python_decides(url: &str, mode: &str, decision: &str) -> Value {
    let python = std::env::var("TOOLGUARD_PYTHON").expect("TOOLGUARD_PYTHON: run the tests with ./dev.sh test");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/mcp/consent.py");
    let out = std::process::Command::new(python).arg(script).args([url, mode, decision]).output().unwrap();
    assert!(out.status.success(), "python client failed:\n{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn the_python_sdk_asks_its_user_in_both_eras_and_the_answer_decides() {
    let dir = tempfile::tempdir().unwrap();
    let (_rt, sandbox, config) = world(dir.path(), None);
    let server = serve_http(&config, &[]);
    // 2026-07-28: the call answers input_required; the SDK asks its user and retries with the answer.
    let approved = python_decides(&server.url, "auto", "approve");
    assert_eq!(approved["protocol"], "2026-07-28", "{approved}");
    assert!(approved["asked"][0].as_str().unwrap().contains("/amount_cents is 5000, above 1000"), "{approved}");
    assert_eq!(approved["is_error"], false, "{approved}");
    assert_eq!(sandbox.refunds().len(), 1);
    // 2025-11-25: the host asks with elicitation/create while the call waits.
    let denied = python_decides(&server.url, "legacy", "deny");
    assert_eq!(denied["protocol"], "2025-11-25", "{denied}");
    assert_eq!(denied["asked"].as_array().map(Vec::len), Some(1), "{denied}");
    assert_eq!(denied["structured"]["kind"], "denied", "{denied}");
    assert_eq!(denied["structured"]["detail"]["approval"]["decided_by"], "client:unauthenticated", "{denied}");
    let approved = python_decides(&server.url, "legacy", "approve");
    assert_eq!(approved["is_error"], false, "{approved}");
    assert_eq!(sandbox.refunds().len(), 2, "one refund per approval, none for the denial");
}

#[test]
fn an_operator_decides_over_http_on_a_host_that_holds_its_ledger_and_a_client_token_cannot() {
    const OPERATOR: &str = "operator-token-long-enough";
    const CLIENT: &str = "client-token-long-enough";
    let dir = tempfile::tempdir().unwrap();
    let (_rt, sandbox, config) = world(dir.path(), None);
    let text = std::fs::read_to_string(&config).unwrap();
    let mcp = "operator_token_env = \"TG_OPERATOR\"\ntokens = [{ principal = \"agent\", token_env = \"TG_CLIENT\" }]\n";
    std::fs::write(&config, text.replace("[mcp]\n", &format!("[mcp]\n{mcp}"))).unwrap();
    let server = serve_http(&config, &[("TG_OPERATOR", OPERATOR), ("TG_CLIENT", CLIENT)]);
    let client = Client::open(&server.url, Some(CLIENT));
    let task = task_id(&client.refund("h1", 5_000, true));
    let approvals = server.url.replace("/mcp", "/approvals");
    let http = |method: reqwest::Method, token: &str, body: Option<Value>| {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let mut req = reqwest::Client::new().request(method, &approvals).bearer_auth(token);
            if let Some(body) = body {
                req = req.header("content-type", "application/json").body(body.to_string());
            }
            let response = req.send().await.unwrap();
            (response.status().as_u16(), response.text().await.unwrap())
        })
    };
    let (status, listed) = http(reqwest::Method::GET, OPERATOR, None);
    assert_eq!(status, 200, "{listed}");
    let listed: Value = serde_json::from_str(&listed).unwrap();
    let waiting = &listed["waiting"][0];
    assert_eq!(waiting["call_id"], "h1", "{listed}");
    assert_eq!(waiting["session"], "agent/conv", "the client's principal namespaces it: {listed}");
    let decide = json!({ "session": waiting["session"], "call_id": "h1", "request": waiting["request"], "decision": "approve", "by": "ops" });
    // The agent's own token cannot approve its action.
    assert_eq!(http(reqwest::Method::POST, CLIENT, Some(decide.clone())).0, 401);
    assert_eq!(posts(&sandbox), 0);
    let (status, decided) = http(reqwest::Method::POST, OPERATOR, Some(decide.clone()));
    assert_eq!(status, 200, "{decided}");
    assert!(decided.contains(r#""decided_by":"operator:ops""#), "{decided}");
    assert_eq!(http(reqwest::Method::POST, OPERATOR, Some(decide)).0, 409, "decided once");
    let done = until(&client, &task, "completed");
    assert_eq!(done["result"]["isError"], false, "{done}");
    assert_eq!(sandbox.refunds().len(), 1);
}

#[test]
fn an_action_awaiting_approval_is_cancelled_and_can_no_longer_be_approved() {
    let dir = tempfile::tempdir().unwrap();
    let (_rt, sandbox, config) = world(dir.path(), None);
    let server = serve_http(&config, &[]);
    let client = Client::open(&server.url, None).eliciting();
    let task = task_id(&client.refund("x1", 5_000, true));
    let key = asked(&until(&client, &task, "input_required"));
    // Nothing of it left the host: the cancel is honoured.
    assert_eq!(client.task("cancel", &task)["result"], json!({ "resultType": "complete" }));
    let cancelled = until(&client, &task, "cancelled");
    assert!(cancelled.get("result").is_none(), "{cancelled}");
    // The approval it asked for can no longer be given, and its replay says it was cancelled.
    let late = client.answer(&task, &key, json!({ "action": "accept", "content": { "approve": true } }));
    assert_eq!(late["result"], json!({ "resultType": "complete" }), "a key no longer outstanding is ignored: {late}");
    assert_eq!(until(&client, &task, "cancelled")["status"], "cancelled", "and the task stays cancelled");
    assert_eq!(client.refund("x1", 5_000, false)["structuredContent"]["kind"], "cancelled");
    assert_eq!(posts(&sandbox), 0, "nothing was ever sent");
}
