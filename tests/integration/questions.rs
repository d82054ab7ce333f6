//! A tool's own questions to the MCP client (`toolguard:plugin/client`,
//! docs/questions.md), through the real binary and the official Python SDK,
//! counting refunds at the sandbox: the person's answer decides what the
//! tool does, a replay asks nothing, a send made before a question is made
//! once however many rounds the call takes, a `requestState` the host did
//! not seal for the call is refused with nothing run, and the capability is
//! deny-by-default (refused at load and by the audit without `ask_client`,
//! `unsupported` without an MCP client).

use crate::common::{BIN, serve_http, shared_cache, wasm};
use crate::mcp::try_send;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Command;
use toolguard_sandbox::config::PaymentsConfig;
use toolguard_sandbox::{Mode, Sandbox};

/// The asking-refund fixture as plugin `asking`, granted `ask_client` if
/// `grant`, beside the payments sandbox: the runtime, the sandbox, the config.
fn world(dir: &Path, grant: bool) -> (tokio::runtime::Runtime, Sandbox, PathBuf) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let sandbox = rt.block_on(Sandbox::start("127.0.0.1:0", Mode::Stripe, toolguard_sandbox::DEFAULT_RETENTION)).unwrap();
    sandbox.add_payment_intent("pi_ask", 1_000_000);
    let payments = PaymentsConfig::new(sandbox.url(), wasm("payments").display().to_string());
    let grant = if grant { "ask_client = [\"elicitation\"]\n" } else { "" };
    let text = format!(
        "data_dir = \"data\"\ncompile_cache = {:?}\n{}\n[plugins.asking]\ncomponent = {:?}\n[plugins.asking.config]\napi_base = {:?}\n\
         [policy.plugins.asking]\n{grant}[policy.plugins.asking.tools]\nrefund_if_confirmed = {{ effect = \"irreversible\" }}\n\
         refund_then_note = {{ effect = \"irreversible\" }}\n[[policy.plugins.asking.grants]]\ndownstream = \"payments\"\nmethods = [\"POST\"]\n\
         path_prefix = \"/v1/refunds\"\n",
        shared_cache().display().to_string(),
        payments.toml(),
        wasm("asking-refund").display().to_string(),
        sandbox.url()
    );
    let config = dir.join("asking.toml");
    std::fs::write(&config, text).unwrap();
    (rt, sandbox, config)
}

/// The official Python SDK calls `tool` as `call_id` in `mode`, its user answering `answer`: what it printed.
fn python(url: &str, mode: &str, (tool, call_id): (&str, &str), answer: &str) -> Value {
    let python = std::env::var("TOOLGUARD_PYTHON").expect("TOOLGUARD_PYTHON: run the tests with ./dev.sh test");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/mcp/questions.py");
    let out = Command::new(python).arg(script).args([url, mode, tool, call_id, answer]).output().unwrap();
    assert!(out.status.success(), "python client failed:\n{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A stateless 2026-07-28 `tools/call` of `tool` as `call_id` from a client that can elicit, with `extra` params: the JSON-RPC response.
fn call_2026(url: &str, (tool, call_id): (&str, &str), extra: Value) -> Value {
    let meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": { "elicitation": {} },
        "toolguard/toolCallId": call_id,
        "toolguard/sessionId": "raw",
    });
    let mut params = json!({ "name": tool, "arguments": { "payment_intent": "pi_ask", "amount_cents": 2500 }, "_meta": meta });
    for (k, v) in extra.as_object().unwrap() {
        params[k] = v.clone();
    }
    let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params }).to_string();
    let headers = [("MCP-Protocol-Version", "2026-07-28"), ("Mcp-Method", "tools/call"), ("Mcp-Name", tool)];
    let (status, _, text) = try_send(url, &headers, body).unwrap();
    assert_eq!(status, 200, "{text}");
    let data = text.lines().filter_map(|l| l.strip_prefix("data:")).map(str::trim).find(|d| !d.is_empty());
    serde_json::from_str(data.unwrap_or(&text)).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// An elicitation answer confirming (or not) the refund.
fn confirming(yes: bool) -> Value {
    json!({ "action": "accept", "content": { "confirm": yes } })
}

/// Appended to a config: a task as soon as a call is not done, polled every 100 ms.
const TASKS_AT_ONCE: &str = "[mcp]\ntask_after_ms = 0\ntask_poll_ms = 100\n";

/// `tool` called as `call_id` by `client`, opted into tasks and able to elicit: its task's id.
fn task_of(client: &crate::tasks::Client, tool: &str, call_id: &str) -> String {
    let meta = json!({
        "io.modelcontextprotocol/clientCapabilities": { "extensions": { "io.modelcontextprotocol/tasks": {} }, "elicitation": {} },
        "toolguard/toolCallId": call_id,
        "toolguard/sessionId": "conv",
    });
    let args = json!({ "name": tool, "arguments": { "payment_intent": "pi_ask", "amount_cents": 2500 } });
    crate::tasks::task_id(&client.request("tools/call", args, meta)["result"])
}

/// Task `task` as `client` gets it once it asks its questions.
fn once_asking(client: &crate::tasks::Client, task: &str) -> Value {
    let mut last = Value::Null;
    let asked = crate::world::wait_for(std::time::Duration::from_secs(30), || {
        last = client.task("get", task)["result"].clone();
        last["status"] == "input_required"
    });
    assert!(asked, "never asked: {last}");
    last
}

#[test]
fn the_person_at_the_client_decides_what_a_tool_does_and_a_replay_asks_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (_rt, sandbox, config) = world(dir.path(), true);
    let server = serve_http(&config, &[]);
    // 2026-07-28: the call answers input_required; the SDK asks its user and retries with the answer.
    let done = python(&server.url, "auto", ("refund_if_confirmed", "q1"), "confirm");
    assert_eq!(done["protocol"], "2026-07-28", "{done}");
    assert_eq!(done["asked"], json!(["Refund 2500 cents on pi_ask?"]), "{done}");
    assert_eq!(done["structured"]["refunded"], true, "{done}");
    let refund_id = done["structured"]["refund_id"].as_str().unwrap().to_string();
    assert_eq!(sandbox.refunds().len(), 1);
    // The same tool call again: its recorded outcome, nobody asked, nothing sent.
    let again = python(&server.url, "auto", ("refund_if_confirmed", "q1"), "refuse");
    assert_eq!(again["asked"], json!([]), "{again}");
    assert_eq!(again["structured"]["refund_id"], refund_id.as_str(), "{again}");
    assert_eq!(sandbox.refunds().len(), 1, "a replay refunds nothing");
    // A new call the person refuses, and one they dismiss: no refund.
    assert_eq!(python(&server.url, "auto", ("refund_if_confirmed", "q2"), "refuse")["structured"]["refunded"], false);
    assert_eq!(python(&server.url, "auto", ("refund_if_confirmed", "q3"), "decline")["structured"]["refunded"], false);
    assert_eq!(sandbox.refunds().len(), 1);
    // 2025-11-25: the host asks with elicitation/create while the call waits.
    let legacy = python(&server.url, "legacy", ("refund_if_confirmed", "q4"), "confirm");
    assert_eq!(legacy["protocol"], "2025-11-25", "{legacy}");
    assert_eq!(legacy["asked"].as_array().map(Vec::len), Some(1), "{legacy}");
    assert_eq!(legacy["structured"]["refunded"], true, "{legacy}");
    assert_eq!(python(&server.url, "legacy", ("refund_if_confirmed", "q5"), "refuse")["structured"]["refunded"], false);
    assert_eq!(sandbox.refunds().len(), 2, "one refund per confirmation, none otherwise");
}

#[test]
fn a_send_before_a_question_is_made_once_however_many_rounds_the_call_takes() {
    let dir = tempfile::tempdir().unwrap();
    let (_rt, sandbox, config) = world(dir.path(), true);
    let server = serve_http(&config, &[]);
    // Round 1 refunds, then asks: input_required, one refund at the sandbox.
    let first = call_2026(&server.url, ("refund_then_note", "n1"), json!({}));
    assert_eq!(first["result"]["resultType"], "input_required", "{first}");
    assert_eq!(first["result"]["inputRequests"]["note"]["method"], "elicitation/create", "{first}");
    assert_eq!(sandbox.refunds().len(), 1);
    // The client starts over without answering, twice: the refund replays, the question is asked again.
    for _ in 0..2 {
        let over = call_2026(&server.url, ("refund_then_note", "n1"), json!({}));
        assert_eq!(over["result"]["resultType"], "input_required", "{over}");
    }
    let state = first["result"]["requestState"].clone();
    let answer = json!({ "note": { "action": "accept", "content": { "note": "sorry" } } });
    let done = call_2026(&server.url, ("refund_then_note", "n1"), json!({ "inputResponses": answer, "requestState": state }));
    assert_eq!(done["result"]["structuredContent"]["note"], "sorry", "{done}");
    assert_eq!(sandbox.refunds().len(), 1, "four runs of the call, one refund");
    assert_eq!(sandbox.requests().iter().filter(|r| r.method == "POST").count(), 1, "and one POST");
    // The official SDK, both eras: one refund per call however it is asked.
    let auto = python(&server.url, "auto", ("refund_then_note", "n2"), "confirm");
    let legacy = python(&server.url, "legacy", ("refund_then_note", "n3"), "confirm");
    assert_eq!((auto["structured"]["refunded"].clone(), legacy["structured"]["refunded"].clone()), (json!(true), json!(true)), "{auto} {legacy}");
    assert_eq!(sandbox.refunds().len(), 3);
}

#[test]
fn a_request_state_the_host_did_not_seal_for_the_call_is_refused_and_nothing_runs() {
    let dir = tempfile::tempdir().unwrap();
    let (_rt, sandbox, config) = world(dir.path(), true);
    let server = serve_http(&config, &[]);
    let asked = call_2026(&server.url, ("refund_if_confirmed", "t1"), json!({}));
    let state = asked["result"]["requestState"].as_str().unwrap().to_string();
    let other = call_2026(&server.url, ("refund_if_confirmed", "t2"), json!({}))["result"]["requestState"].as_str().unwrap().to_string();
    let yes = json!({ "confirm": confirming(true) });
    for (why, forged) in [("tampered", format!("{state}x")), ("another call's", other), ("not ours", "rs1.e30.AAAA".to_string())] {
        let refused = call_2026(&server.url, ("refund_if_confirmed", "t1"), json!({ "inputResponses": yes, "requestState": forged }));
        assert_eq!(refused["error"]["code"], -32602, "{why}: {refused}");
    }
    // Answers not shaped like an elicitation's result are no answer: asked again.
    let wrong = call_2026(&server.url, ("refund_if_confirmed", "t1"), json!({ "inputResponses": { "confirm": 12345 }, "requestState": state }));
    assert_eq!(wrong["result"]["resultType"], "input_required", "{wrong}");
    assert_eq!(sandbox.refunds().len(), 0, "nothing ran on a forged state or a malformed answer");
    let done = call_2026(&server.url, ("refund_if_confirmed", "t1"), json!({ "inputResponses": yes, "requestState": state }));
    assert_eq!(done["result"]["structuredContent"]["refunded"], true, "{done}");
    assert_eq!(sandbox.refunds().len(), 1);
}

#[test]
fn asking_is_denied_by_default_refused_at_load_and_unsupported_without_a_client() {
    let dir = tempfile::tempdir().unwrap();
    let (_rt, sandbox, config) = world(dir.path(), false);
    let cfg = config.to_str().unwrap();
    let tools = Command::new(BIN).args(["tools", "--config", cfg]).output().unwrap();
    let said = String::from_utf8_lossy(&tools.stderr).to_string() + &String::from_utf8_lossy(&tools.stdout);
    assert!(!tools.status.success() && said.contains("toolguard:plugin/client") && said.contains("ask_client"), "{said}");
    let audit = Command::new(BIN).args(["audit", "--config", cfg, "--json"]).output().unwrap();
    let report: Value = serde_json::from_slice(&audit.stdout).unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&audit.stderr)));
    let asking = report["components"].as_array().unwrap().iter().find(|c| c["plugin"] == "asking").unwrap();
    assert_eq!(asking["verdict"], "FAIL", "{asking}");
    assert!(asking["reasons"].to_string().contains("ask_client grants none"), "{asking}");
    // Granted, the audit shows the grant; `toolguard call` has no client to ask: the tool is told so and refunds nothing.
    let granted_dir = dir.path().join("granted");
    std::fs::create_dir_all(&granted_dir).unwrap();
    let (_rt2, sandbox2, granted) = world(&granted_dir, true);
    let gcfg = granted.to_str().unwrap();
    let audit = Command::new(BIN).args(["audit", "--config", gcfg, "--json"]).output().unwrap();
    let report: Value = serde_json::from_slice(&audit.stdout).unwrap();
    let asking = report["components"].as_array().unwrap().iter().find(|c| c["plugin"] == "asking").unwrap();
    assert_eq!(asking["ask_client"], json!(["elicitation"]), "{asking}");
    let args = r#"{"payment_intent":"pi_ask","amount_cents":2500}"#;
    let call = Command::new(BIN).args(["call", "--config", gcfg, "--session", "s", "--call-id", "c1", "refund_if_confirmed", args]).output().unwrap();
    let out = String::from_utf8_lossy(&call.stdout).to_string() + &String::from_utf8_lossy(&call.stderr);
    assert!(!call.status.success() && out.contains("Unsupported"), "{out}");
    assert_eq!(sandbox.refunds().len() + sandbox2.refunds().len(), 0);
}

#[test]
fn a_task_waiting_for_answers_outlives_a_kill_9_and_its_refund_is_made_once() {
    use crate::tasks::Client;
    let dir = tempfile::tempdir().unwrap();
    let (_rt, sandbox, config) = world(dir.path(), true);
    std::fs::write(&config, std::fs::read_to_string(&config).unwrap() + TASKS_AT_ONCE).unwrap();
    let server = serve_http(&config, &[]);
    let client = Client::open(&server.url, None).eliciting();
    let task = task_of(&client, "refund_then_note", "k1");
    let asked = once_asking(&client, &task);
    assert_eq!(asked["inputRequests"]["note"]["method"], "elicitation/create", "{asked}");
    assert_eq!(sandbox.refunds().len(), 1, "the refund is made before the question");
    // The host dies while the person is answering; the answers were in its memory only.
    let mut server = server;
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    let restarted = serve_http(&config, &[]);
    let client = Client::open(&restarted.url, None).eliciting();
    // The task's call is run again from the ledger: the refund replays, the question is asked again.
    let asked = once_asking(&client, &task);
    assert_eq!(asked["inputRequests"]["note"]["method"], "elicitation/create", "{asked}");
    // A partial or foreign answer is acknowledged and changes nothing; the real one finishes the task.
    assert_eq!(client.answer(&task, "other", json!({ "action": "accept", "content": {} }))["result"], json!({ "resultType": "complete" }));
    assert_eq!(client.answer(&task, "note", json!(42))["error"]["code"], -32602, "an answer of the wrong shape is refused");
    assert_eq!(client.answer(&task, "note", json!({ "action": "accept", "content": { "note": "sorry" } }))["result"], json!({ "resultType": "complete" }));
    let done = client.settled(&task);
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["result"]["structuredContent"]["note"], "sorry", "{done}");
    let made = sandbox.refunds();
    assert_eq!(made.len(), 1, "one refund across the crash and both rounds");
    assert_eq!(done["result"]["structuredContent"]["refund_id"], made[0].id.as_str());
}

#[test]
fn an_answer_that_led_to_a_refund_is_never_answered_otherwise_after_a_kill_9() {
    use toolguard_sandbox::Fault;
    let dir = tempfile::tempdir().unwrap();
    let (_rt, sandbox, config) = world(dir.path(), true);
    let server = serve_http(&config, &[]);
    let asked = call_2026(&server.url, ("refund_if_confirmed", "d1"), json!({}));
    let state = asked["result"]["requestState"].clone();
    // The person confirms; the refund is made, and the host dies before it hears so.
    sandbox.inject(Fault::PauseAfterCommit);
    let url = server.url.clone();
    let (yes, retry) = (json!({ "confirm": confirming(true) }), state.clone());
    let confirmed = std::thread::spawn(move || call_2026(&url, ("refund_if_confirmed", "d1"), json!({ "inputResponses": yes, "requestState": retry })));
    assert!(crate::world::wait_for(std::time::Duration::from_secs(30), || sandbox.paused() == 1), "the refund never reached the provider");
    let mut server = server;
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    sandbox.release();
    let _ = confirmed.join();
    assert_eq!(sandbox.refunds().len(), 1);
    // The client retries the same call with the same state, and this time the
    // answer is no. The confirmation the refund was sent on is in the ledger
    // with its send: the tool gets it again, and the refund replays.
    let server = serve_http(&config, &[]);
    let no = json!({ "confirm": confirming(false) });
    let told = call_2026(&server.url, ("refund_if_confirmed", "d1"), json!({ "inputResponses": no, "requestState": state }));
    assert_eq!(told["result"]["structuredContent"]["refunded"], true, "{told}");
    let made = sandbox.refunds();
    assert_eq!(made.len(), 1);
    assert_eq!(told["result"]["structuredContent"]["refund_id"], made[0].id.as_str(), "{told}");
    let export = Command::new(BIN).args(["ledger", "export", "--config", config.to_str().unwrap()]).output().unwrap();
    assert!(String::from_utf8_lossy(&export.stdout).contains("\"answers\""), "the answers travel with the send's attempt");
}

#[test]
fn a_task_whose_answer_led_to_a_refund_is_not_asked_again_after_a_kill_9() {
    use crate::tasks::Client;
    use toolguard_sandbox::Fault;
    let dir = tempfile::tempdir().unwrap();
    let (_rt, sandbox, config) = world(dir.path(), true);
    std::fs::write(&config, std::fs::read_to_string(&config).unwrap() + TASKS_AT_ONCE).unwrap();
    let server = serve_http(&config, &[]);
    let client = Client::open(&server.url, None).eliciting();
    let task = task_of(&client, "refund_if_confirmed", "k2");
    once_asking(&client, &task);
    // Confirmed; the refund reaches the provider, and the host dies before it hears back.
    sandbox.inject(Fault::PauseAfterCommit);
    assert_eq!(client.answer(&task, "confirm", confirming(true))["result"], json!({ "resultType": "complete" }));
    assert!(crate::world::wait_for(std::time::Duration::from_secs(30), || sandbox.paused() == 1), "the refund never reached the provider");
    let mut server = server;
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    sandbox.release();
    // Another host process takes the task up from the ledger: the confirmation
    // is read back with the refund's attempt, nobody is asked again.
    let restarted = serve_http(&config, &[]);
    let client = Client::open(&restarted.url, None).eliciting();
    let done = client.settled(&task);
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["result"]["structuredContent"]["refunded"], true, "{done}");
    let made = sandbox.refunds();
    assert_eq!(made.len(), 1, "one refund across the crash");
    assert_eq!(done["result"]["structuredContent"]["refund_id"], made[0].id.as_str());
}

#[test]
fn a_fleet_host_finishing_a_task_begun_elsewhere_reads_its_answers_from_postgresql() {
    use crate::tasks::Client;
    use toolguard_sandbox::Fault;
    let dir = tempfile::tempdir().unwrap();
    let (_rt, sandbox, config) = world(dir.path(), true);
    let ledger = crate::common::fresh_postgres_database();
    let text = std::fs::read_to_string(&config).unwrap();
    let hosts = [0, 1].map(|i| {
        let path = dir.path().join(format!("host{i}.toml"));
        let own = text.replace("data_dir = \"data\"", &format!("data_dir = \"data{i}\""));
        std::fs::write(&path, format!("ledger = {ledger:?}\n{own}\n[limits]\nwall_ms = 1500\n{TASKS_AT_ONCE}")).unwrap();
        path
    });
    let mut a = serve_http(&hosts[0], &[]);
    let b = serve_http(&hosts[1], &[]);
    let on_a = Client::open(&a.url, None).eliciting();
    let task = task_of(&on_a, "refund_if_confirmed", "f1");
    once_asking(&on_a, &task);
    // Confirmed on host A; its refund reaches the provider, and host A dies.
    sandbox.inject(Fault::PauseAfterCommit);
    assert_eq!(on_a.answer(&task, "confirm", confirming(true))["result"], json!({ "resultType": "complete" }));
    assert!(crate::world::wait_for(std::time::Duration::from_secs(30), || sandbox.paused() == 1), "the refund never reached the provider");
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    sandbox.release();
    // Host B finishes the task from the shared ledger: the confirmation comes with the refund's attempt.
    let on_b = Client::open(&b.url, None).eliciting();
    let done = on_b.settled(&task);
    assert_eq!(done["status"], "completed", "not asked again on host B: {done}");
    assert_eq!(done["result"]["structuredContent"]["refunded"], true, "{done}");
    let made = sandbox.refunds();
    assert_eq!(made.len(), 1, "one refund across the fleet");
    assert_eq!(done["result"]["structuredContent"]["refund_id"], made[0].id.as_str());
}
