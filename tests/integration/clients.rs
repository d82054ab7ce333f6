//! The client surface (`docs/threat-model.md`), tried as a hostile client
//! would, through the real binary and counted at the payments sandbox:
//! another principal holding the owner's identifiers reaches nothing of
//! the owner's (it gets what it would get for an object that does not
//! exist), a model cannot answer its own approval, a repeat is confirmed
//! whatever was denied or cancelled in between, and `Origin` is checked.

use crate::common::{serve_http, shared_cache, wasm};
use crate::mcp::{send, try_send};
use crate::tasks::{Client, task_id};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;
use toolguard_sandbox::config::PaymentsConfig;
use toolguard_sandbox::{Mode, Sandbox};

pub(crate) const A: &str = "tenant-a-token-long-enough";
pub(crate) const B: &str = "tenant-b-token-long-enough";
pub(crate) const OPERATOR: &str = "operator-token-long-enough";

/// The environment of a host serving tenants `a` and `b` and an operator.
pub(crate) fn env() -> Vec<(&'static str, &'static str)> {
    vec![("TG_A", A), ("TG_B", B), ("TG_OPERATOR", OPERATOR)]
}

/// The `[mcp]` lines of that host.
const TENANTS: &str = "tokens = [{ principal = \"tenant-a\", token_env = \"TG_A\" }, { principal = \"tenant-b\", token_env = \"TG_B\" }]\n\
                       operator_token_env = \"TG_OPERATOR\"\ntask_after_ms = 300\ntask_poll_ms = 100\n";

/// A sandbox and the config of a refund host whose refund tool has
/// `policy` (its policy table's extra settings) and `[mcp]` settings
/// `mcp` besides the tenants'; its ledger `ledger`, or RocksDB.
pub(crate) fn world(dir: &Path, policy: &str, mcp: &str, ledger: Option<&str>) -> (tokio::runtime::Runtime, Sandbox, PathBuf) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let sandbox = rt.block_on(Sandbox::start("127.0.0.1:0", Mode::Stripe, toolguard_sandbox::DEFAULT_RETENTION)).unwrap();
    sandbox.add_payment_intent("pi_mcp", 10_000_000);
    let payments = PaymentsConfig {
        timeout_ms: Some(20_000),
        refund_policy: Some(policy.into()),
        ..PaymentsConfig::new(sandbox.url(), wasm("payments").display().to_string())
    };
    let ledger = ledger.map(|l| format!("ledger = {l:?}\n")).unwrap_or_default();
    let text = format!("{ledger}data_dir = \"data\"\ncompile_cache = {:?}\n{}\n[mcp]\n{TENANTS}{mcp}", shared_cache().display().to_string(), payments.toml());
    let config = dir.join("clients.toml");
    std::fs::write(&config, text).unwrap();
    (rt, sandbox, config)
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

/// A 2025-11-25 session opened by `token`'s principal, declaring that it
/// can ask its user (elicitation): its id.
fn open_eliciting(url: &str, token: &str) -> String {
    let auth = bearer(token);
    let init = json!({ "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": { "elicitation": {} }, "clientInfo": { "name": "t", "version": "1" } } });
    let (status, headers, body) = send(url, &[("Authorization", auth.as_str())], init.to_string());
    assert_eq!(status, 200, "{body}");
    let id = headers.get("mcp-session-id").expect("a session id").to_str().unwrap().to_string();
    let initialized = json!({ "jsonrpc": "2.0", "method": "notifications/initialized" }).to_string();
    assert_eq!(send(url, &in_session(&id, &auth), initialized).0, 202);
    id
}

/// The headers of a request in session `id` with authorization `auth`.
fn in_session<'a>(id: &'a str, auth: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![("Mcp-Session-Id", id), ("MCP-Protocol-Version", "2025-11-25"), ("Authorization", auth)]
}

/// A refund of `amount` as tool call `call_id` (JSON-RPC id `id`), meta `extra` merged in.
fn refund(id: u64, call_id: &str, amount: u64) -> String {
    json!({ "jsonrpc": "2.0", "id": id, "method": "tools/call", "params": { "name": "refund",
        "arguments": { "payment_intent": "pi_mcp", "amount_cents": amount, "reason": "duplicate" },
        "_meta": { "toolguard/toolCallId": call_id, "toolguard/sessionId": "conv" } } })
    .to_string()
}

/// A POST whose SSE response is read as it arrives: each JSON-RPC message on the channel.
pub(crate) fn stream(url: &str, headers: &[(&str, &str)], body: String) -> mpsc::Receiver<Value> {
    let (tx, rx) = mpsc::channel();
    let (url, body) = (url.to_string(), body);
    let headers: Vec<(String, String)> = headers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            let mut req =
                reqwest::Client::new().post(&url).header("Content-Type", "application/json").header("Accept", "application/json, text/event-stream").body(body);
            for (k, v) in &headers {
                req = req.header(k, v);
            }
            let Ok(mut response) = req.send().await else { return };
            let mut buffer = String::new();
            while let Ok(Some(chunk)) = response.chunk().await {
                buffer.push_str(&String::from_utf8_lossy(&chunk));
                while let Some(end) = buffer.find('\n') {
                    let line: String = buffer.drain(..=end).collect();
                    if let Some(data) = line.trim().strip_prefix("data:").map(str::trim).filter(|d| !d.is_empty())
                        && let Ok(message) = serde_json::from_str::<Value>(data)
                        && tx.send(message).is_err()
                    {
                        return;
                    }
                }
            }
        });
    });
    rx
}

/// The next message on `rx` that satisfies `is`, within 30 s.
fn next_where(rx: &mpsc::Receiver<Value>, is: impl Fn(&Value) -> bool) -> Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let message = rx.recv_timeout(left).unwrap_or_else(|e| panic!("no such message in 30 s ({e})"));
        if is(&message) {
            return message;
        }
    }
}

/// `method` of the MCP endpoint with `headers` (and `body`): status and body,
/// read until the server closes it or for at most 2 s (a stream that opens
/// is cut off there).
fn http(method: reqwest::Method, url: &str, headers: &[(&str, &str)], body: Option<String>) -> (u16, String) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut req = reqwest::Client::new().request(method, url).header("Accept", "application/json, text/event-stream");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        if let Some(body) = body {
            req = req.header("Content-Type", "application/json").body(body);
        }
        let mut response = req.send().await.unwrap();
        let status = response.status().as_u16();
        let mut text = String::new();
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            while let Ok(Some(chunk)) = response.chunk().await {
                text.push_str(&String::from_utf8_lossy(&chunk));
            }
        })
        .await;
        (status, text)
    })
}

/// The operator's `POST /approvals` deciding `call_id`'s waiting request
/// (found by `GET /approvals`): the status.
pub(crate) fn operator_decides(url: &str, call_id: &str, approve: bool) -> u16 {
    let approvals = url.replace("/mcp", "/approvals");
    let auth = bearer(OPERATOR);
    let (status, listed) = http(reqwest::Method::GET, &approvals, &[("Authorization", &auth)], None);
    assert_eq!(status, 200, "{listed}");
    let listed: Value = serde_json::from_str(&listed).unwrap();
    let Some(waiting) = listed["waiting"].as_array().unwrap().iter().find(|w| w["call_id"] == call_id) else { return 404 };
    let decision = if approve { "approve" } else { "deny" };
    let body = json!({ "session": waiting["session"], "call_id": call_id, "request": waiting["request"], "decision": decision, "by": "ops" });
    http(reqwest::Method::POST, &approvals, &[("Authorization", &auth)], Some(body.to_string())).0
}

fn posts(sandbox: &Sandbox) -> usize {
    sandbox.requests().iter().filter(|r| r.method == "POST").count()
}

/// A session id nobody opened (rmcp's are UUIDs).
const NOBODYS: &str = "0b6f8c1e-4a7d-4d2b-9e55-2f3c1a9d8e77";

#[test]
fn another_principal_holding_a_session_id_can_neither_answer_its_questions_read_it_nor_end_it() {
    let dir = tempfile::tempdir().unwrap();
    let (_rt, sandbox, config) = world(dir.path(), "approval = { always = true }", "", None);
    let server = serve_http(&config, &env());
    let (a, b) = (bearer(A), bearer(B));
    let session = open_eliciting(&server.url, A);
    // Tenant a's refund asks its person, on the call's own stream.
    let call = stream(&server.url, &in_session(&session, &a), refund(5, "a1", 1_500));
    let asked = next_where(&call, |m| m["method"] == "elicitation/create");
    assert!(asked["params"]["message"].as_str().unwrap().contains("a1"), "{asked}");
    let approve = json!({ "jsonrpc": "2.0", "id": asked["id"], "result": { "action": "accept", "content": { "approve": true } } }).to_string();
    // Tenant b, with its own valid token and a's session id, gets what a session nobody opened gets — for every verb.
    let as_nobody = |method: reqwest::Method, session: &str, body: Option<String>| http(method, &server.url, &in_session(session, &b), body);
    for (verb, body) in [(reqwest::Method::POST, Some(approve.clone())), (reqwest::Method::GET, None), (reqwest::Method::DELETE, None)] {
        let theirs = as_nobody(verb.clone(), &session, body.clone());
        let nobodys = as_nobody(verb.clone(), NOBODYS, body);
        assert_eq!(theirs, nobodys, "{verb}: another principal's session is one that does not exist");
        assert_ne!(theirs.0, 200, "{verb}: {theirs:?}");
    }
    assert_eq!(as_nobody(reqwest::Method::POST, &session, Some(approve.clone())).0, 404);
    // Without a token: nothing at all.
    let bare = [("Mcp-Session-Id", session.as_str()), ("MCP-Protocol-Version", "2025-11-25")];
    assert_eq!(http(reqwest::Method::POST, &server.url, &bare, Some(approve.clone())).0, 401);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(posts(&sandbox), 0, "nobody's answer approved a's refund");
    // a's session is whole: b's DELETE closed nothing, and a's own answer is taken.
    let (status, listed) =
        http(reqwest::Method::POST, &server.url, &in_session(&session, &a), Some(r#"{"jsonrpc":"2.0","id":9,"method":"tools/list"}"#.into()));
    assert_eq!(status, 200, "a's session still serves a: {listed}");
    assert_eq!(send(&server.url, &in_session(&session, &a), approve).0, 202);
    let answered = next_where(&call, |m| m["id"] == 5);
    assert_eq!(answered["result"]["isError"], false, "{answered}");
    assert_eq!(sandbox.refunds().len(), 1, "a's person approved: one refund");
    // And b cannot end it either way: a's session still answers after b's DELETE.
    as_nobody(reqwest::Method::DELETE, &session, None);
    let (status, _) = http(reqwest::Method::POST, &server.url, &in_session(&session, &a), Some(r#"{"jsonrpc":"2.0","id":10,"method":"tools/list"}"#.into()));
    assert_eq!(status, 200);
}

/// The error of `tasks/<verb>` of `task` by `client`, with the id itself written as `ID`.
fn task_error(client: &Client, verb: &str, task: &str) -> Value {
    let mut error = client.task(verb, task)["error"].clone();
    assert!(error.is_object(), "{verb} {task}: an error");
    error["message"] = error["message"].as_str().unwrap().replace(task, "ID").into();
    error
}

/// The key of the approval a task in `input_required` asks for.
fn approval_key(task: &Value) -> String {
    let requests = task["inputRequests"].as_object().unwrap_or_else(|| panic!("no input requests: {task}"));
    let key = requests.keys().find(|k| k.starts_with("approval-")).unwrap_or_else(|| panic!("no approval asked: {task}"));
    key.clone()
}

/// Polls `task` until it asks for approval; its state.
fn asking(client: &Client, task: &str) -> Value {
    let mut last = Value::Null;
    let reached = crate::world::wait_for(Duration::from_secs(30), || {
        last = client.task("get", task)["result"].clone();
        last["status"] == "input_required"
    });
    assert!(reached, "task {task} never asked: {last}");
    last
}

#[test]
fn a_task_is_its_principals_alone_its_id_is_sealed_and_only_an_answer_to_the_question_asked_decides() {
    let dir = tempfile::tempdir().unwrap();
    let (_rt, sandbox, config) = world(dir.path(), "approval = { always = true }", "", None);
    let server = serve_http(&config, &env());
    let a = Client::open(&server.url, Some(A)).eliciting();
    let b = Client::open(&server.url, Some(B)).eliciting();
    let task = task_id(&a.refund("t1", 2_000, true));
    assert!(task.starts_with("tg2."), "{task}");
    let first = asking(&a, &task);
    let key = approval_key(&first);
    // Another principal: exactly what a made-up id gets, for every verb.
    let made_up = format!("{}{}", &task[..task.len() - 2], if task.ends_with("AA") { "AB" } else { "AA" });
    for verb in ["get", "cancel"] {
        assert_eq!(task_error(&b, verb, &task), task_error(&b, verb, &made_up), "{verb}");
        assert_eq!(task_error(&b, verb, &task)["code"], -32602);
    }
    let theirs = b.answer(&task, &key, json!({ "action": "accept", "content": { "approve": true } }));
    assert_eq!(theirs["error"]["code"], -32602, "{theirs}");
    // The id cannot be altered into another (the tag), even by its owner.
    assert_eq!(task_error(&a, "get", &made_up)["code"], -32602);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(posts(&sandbox), 0, "nothing b did approved a's refund");
    assert_eq!(approval_key(&asking(&a, &task)), key, "nor moved a's question");
    // An answer that is none is -32602 and the question is put again under a new key.
    for (none, why) in [
        (json!("yes"), "a bare string"),
        (json!({ "action": "accept" }), "accept without approve"),
        (json!({ "action": "accept", "content": { "approve": "yes" } }), "approve not a boolean"),
    ] {
        let now = approval_key(&asking(&a, &task));
        let refused = a.answer(&task, &now, none);
        assert_eq!(refused["error"]["code"], -32602, "{why}: {refused}");
        let again = approval_key(&asking(&a, &task));
        assert_ne!(again, now, "{why}: asked again under a new key");
        assert_eq!(posts(&sandbox), 0, "{why}");
    }
    // A dismissal decides nothing: asked again under a new key, the old one no longer taken.
    let before = approval_key(&asking(&a, &task));
    assert_eq!(a.answer(&task, &before, json!({ "action": "cancel" }))["result"]["resultType"], "complete");
    let after = approval_key(&asking(&a, &task));
    assert_ne!(after, before);
    let stale = a.answer(&task, &before, json!({ "action": "accept", "content": { "approve": true } }));
    assert_eq!(stale["result"]["resultType"], "complete", "a key not outstanding is ignored, as the extension says: {stale}");
    // A key never asked (the request id the model was told, without the key's random part) is ignored too.
    let request = after.trim_start_matches("approval-").split('.').next().unwrap().to_string();
    let guessed = a.answer(&task, &format!("approval-{request}"), json!({ "action": "accept", "content": { "approve": true } }));
    assert_eq!(guessed["result"]["resultType"], "complete", "{guessed}");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(posts(&sandbox), 0, "neither the stale nor the guessed key decided anything");
    assert_eq!(asking(&a, &task)["status"], "input_required");
    // The answer to the question asked now decides.
    let now = approval_key(&asking(&a, &task));
    a.answer(&task, &now, json!({ "action": "accept", "content": { "approve": true } }));
    let done = a.settled(&task);
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["result"]["isError"], false, "{done}");
    assert_eq!(sandbox.refunds().len(), 1);
}

#[test]
fn a_tasks_created_at_is_when_it_was_created_after_a_kill_9_too() {
    let dir = tempfile::tempdir().unwrap();
    let (_rt, _sandbox, config) = world(dir.path(), "approval = { always = true }", "", None);
    let mut server = serve_http(&config, &env());
    let a = Client::open(&server.url, Some(A)).eliciting();
    let handle = a.refund("c1", 2_000, true);
    let task = task_id(&handle);
    let created = asking(&a, &task)["createdAt"].clone();
    assert_eq!(handle["createdAt"], created, "the handle and tasks/get agree");
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let restarted = serve_http(&config, &env());
    let a = Client::open(&restarted.url, Some(A)).eliciting();
    assert_eq!(asking(&a, &task)["createdAt"], created, "createdAt survives the host");
}

#[test]
fn an_approval_given_in_time_is_used_after_the_request_expired_and_one_never_used_is_asked_again() {
    let dir = tempfile::tempdir().unwrap();
    let (_rt, sandbox, config) = world(dir.path(), "approval = { always = true, expires_minutes = 1 }", "", None);
    let skewed = |ms: u64| {
        let mut env = env();
        let skew: &'static str = Box::leak(ms.to_string().into_boxed_str());
        env.push(("TOOLGUARD_CLOCK_SKEW_MS", skew));
        serve_http(&config, &env)
    };
    // Each call its own amount: its own action, never held behind the other.
    let call = |url: &str, call_id: &str| {
        let a = Client::open(url, Some(A));
        let amount = if call_id == "u1" { 3_000 } else { 3_001 };
        a.refund(call_id, amount, false)["structuredContent"].clone()
    };
    // Asked at 0 s; approved at 50 s, inside its minute; the caller comes back at 100 s, past the request's minute.
    let server = skewed(0);
    assert_eq!(call(&server.url, "u1")["kind"], "awaiting-approval");
    drop(server);
    let server = skewed(50_000);
    assert_eq!(operator_decides(&server.url, "u1", true), 200);
    drop(server);
    let server = skewed(100_000);
    let ran = call(&server.url, "u1");
    assert!(ran.get("refund_id").is_some(), "approved in time, used within a minute of its approval: {ran}");
    assert_eq!(sandbox.refunds().len(), 1);
    // Approved at 100 s and not used until 200 s: it lapsed unused, so a person is asked again — not told "not approved in time".
    assert_eq!(call(&server.url, "u2")["kind"], "awaiting-approval");
    assert_eq!(operator_decides(&server.url, "u2", true), 200);
    drop(server);
    let server = skewed(200_000);
    let again = call(&server.url, "u2");
    assert_eq!(again["kind"], "awaiting-approval", "{again}");
    assert!(again["message"].as_str().unwrap().contains("was not used within"), "{again}");
    assert_eq!(sandbox.refunds().len(), 1, "nothing ran on a lapsed approval");
    assert_eq!(operator_decides(&server.url, "u2", true), 200);
    assert!(call(&server.url, "u2").get("refund_id").is_some());
    assert_eq!(sandbox.refunds().len(), 2);
}

/// A stateless 2026-07-28 `tools/call` of a refund as `call_id` by `token`
/// from a client that can elicit, with `extra` params: the response.
fn call_2026(url: &str, token: &str, call_id: &str, extra: Value) -> Value {
    let meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": { "elicitation": {} },
        "toolguard/toolCallId": call_id,
        "toolguard/sessionId": "conv",
    });
    let mut params = json!({ "name": "refund", "arguments": { "payment_intent": "pi_mcp", "amount_cents": 4_000, "reason": "duplicate" }, "_meta": meta });
    for (k, v) in extra.as_object().unwrap() {
        params[k] = v.clone();
    }
    let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params }).to_string();
    let auth = bearer(token);
    let headers = [("MCP-Protocol-Version", "2026-07-28"), ("Mcp-Method", "tools/call"), ("Mcp-Name", "refund"), ("Authorization", auth.as_str())];
    let (status, _, text) = try_send(url, &headers, body).unwrap();
    assert_eq!(status, 200, "{text}");
    let data = text.lines().filter_map(|l| l.strip_prefix("data:")).map(str::trim).find(|d| !d.is_empty());
    serde_json::from_str(data.unwrap_or(&text)).unwrap_or_else(|e| panic!("{e}: {text}"))
}

#[test]
fn a_2026_approval_is_taken_only_under_the_key_its_sealed_state_names_and_only_from_its_principal() {
    let dir = tempfile::tempdir().unwrap();
    let (_rt, sandbox, config) = world(dir.path(), "approval = { always = true }", "", None);
    let server = serve_http(&config, &env());
    let asked = call_2026(&server.url, A, "m1", json!({}))["result"].clone();
    assert_eq!(asked["resultType"], "input_required", "{asked}");
    let key = asked["inputRequests"].as_object().unwrap().keys().next().unwrap().clone();
    let state = asked["requestState"].clone();
    let yes = json!({ "action": "accept", "content": { "approve": true } });
    // Tenant b, with a's state and key, for a call of the same ids: refused, nothing runs.
    let theirs = call_2026(&server.url, B, "m1", json!({ "requestState": state, "inputResponses": { &key: yes } }));
    assert_eq!(theirs["error"]["code"], -32602, "{theirs}");
    // The model's guess — the request id it was told, without the key's random part, no state — decides nothing.
    let request = key.trim_start_matches("approval-").split('.').next().unwrap();
    let guessed = call_2026(&server.url, A, "m1", json!({ "inputResponses": { format!("approval-{request}"): yes } }))["result"].clone();
    assert_eq!(guessed["resultType"], "input_required", "asked again: {guessed}");
    let fresh = guessed["inputRequests"].as_object().unwrap().keys().next().unwrap().clone();
    assert_ne!(fresh, key, "under a new key");
    // An answer that is none: -32602.
    let none = call_2026(&server.url, A, "m1", json!({ "requestState": state, "inputResponses": { &key: "yes" } }));
    assert_eq!(none["error"]["code"], -32602, "{none}");
    assert_eq!(posts(&sandbox), 0);
    // The answer under the key the state names decides.
    let done = call_2026(&server.url, A, "m1", json!({ "requestState": guessed["requestState"], "inputResponses": { &fresh: yes } }))["result"].clone();
    assert_eq!(done["isError"], false, "{done}");
    assert_eq!(sandbox.refunds().len(), 1);
}

#[test]
fn origin_is_checked_only_the_servers_own_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let (_rt, _sandbox, config) = world(dir.path(), "approval = { always = true }", "", None);
    let server = serve_http(&config, &env());
    let a = bearer(A);
    // An initialize: the first thing a client sends.
    let init = json!({ "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": { "name": "t", "version": "1" } } })
    .to_string();
    let with = |origin: Option<&str>| {
        let mut headers = vec![("Authorization", a.as_str())];
        headers.extend(origin.map(|o| ("Origin", o)));
        http(reqwest::Method::POST, &server.url, &headers, Some(init.clone())).0
    };
    assert_eq!(with(None), 200, "clients that are not browsers send no Origin");
    assert_eq!(with(Some("https://evil.example")), 403);
    let own = format!("http://{}", server.url.trim_start_matches("http://").split('/').next().unwrap());
    assert_eq!(with(Some(&own)), 200, "the server's own origin (a page it served would send it)");
    assert_eq!(with(Some("http://localhost:1")), 403, "another port of loopback is another origin");
    assert_eq!(with(Some("null")), 403);
    drop(server);
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, format!("{text}allowed_origins = [\"https://app.example.com\"]\n")).unwrap();
    let server = serve_http(&config, &env());
    let with = |origin: &str| {
        let headers = [("Authorization", a.as_str()), ("Origin", origin)];
        http(reqwest::Method::POST, &server.url, &headers, Some(init.clone())).0
    };
    assert_eq!(with("https://app.example.com"), 200);
    assert_eq!(with("https://app.example.com.evil.example"), 403);
}

/// A request to `url` with no credentials at all: its status.
fn without_token(url: &str, body: Value) -> u16 {
    http(reqwest::Method::POST, url, &[("MCP-Protocol-Version", "2026-07-28")], Some(body.to_string())).0
}

/// Every object a's calls make, every verb on it, for a (owner), b (with
/// a's identifiers) and nobody, with a's objects made on the host at `made`
/// and probed on the host at `probed` (the same host, or another of the
/// fleet). Sessions are a host's own and have their own test above.
fn matrix(sandbox: &Sandbox, made: &str, probed: &str) {
    let a = Client::open(made, Some(A)).eliciting();
    // Three different amounts: three actions, none held behind another.
    let task = task_id(&a.refund("mx-task", 1_101, true));
    let created = asking(&a, &task)["createdAt"].clone();
    let mrtr = call_2026(made, A, "mx-mrtr", json!({}))["result"].clone();
    let (state, key) = (mrtr["requestState"].clone(), mrtr["inputRequests"].as_object().unwrap().keys().next().unwrap().clone());
    let plain = Client::open(made, Some(A)).refund("mx-call", 1_103, false)["structuredContent"].clone();
    assert_eq!(plain["kind"], "awaiting-approval", "{plain}");
    let request = plain["detail"]["approval"]["request"].clone();
    let yes = json!({ "action": "accept", "content": { "approve": true } });
    let (a, b) = (Client::open(probed, Some(A)).eliciting(), Client::open(probed, Some(B)).eliciting());
    let made_up = format!("tg2.{}", task.split_once('.').unwrap().1.chars().rev().collect::<String>());
    // task × get, cancel, update.
    for verb in ["get", "cancel"] {
        assert_eq!(task_error(&b, verb, &task), task_error(&b, verb, &made_up), "task × {verb} × other");
        assert_eq!(without_token(probed, json!({ "jsonrpc": "2.0", "id": 1, "method": format!("tasks/{verb}"), "params": { "taskId": task } })), 401);
    }
    let there = asking(&a, &task);
    assert_eq!(there["status"], "input_required", "task × get × owner, on this host too");
    assert_eq!(there["createdAt"], created, "createdAt is when the task was created, on every host");
    let owner_key = approval_key(&asking(&a, &task));
    let theirs = b.answer(&task, &owner_key, yes.clone());
    assert_eq!(theirs["error"]["code"], -32602, "task × update × other: {theirs}");
    let update = json!({ "jsonrpc": "2.0", "id": 1, "method": "tasks/update", "params": { "taskId": task, "inputResponses": { &owner_key: yes } } });
    assert_eq!(without_token(probed, update), 401, "task × update × nobody");
    // requestState × retry.
    let theirs = call_2026(probed, B, "mx-mrtr", json!({ "requestState": state, "inputResponses": { &key: yes } }));
    assert_eq!(theirs["error"]["code"], -32602, "state × retry × other: {theirs}");
    let retry = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": { "name": "refund", "arguments": {}, "requestState": state } });
    assert_eq!(without_token(probed, retry), 401, "state × retry × nobody");
    // tool-call id × call: the same ids name b's own call, never a's.
    let own = Client::open(probed, Some(B)).refund("mx-call", 1_103, false)["structuredContent"].clone();
    assert_eq!(own["kind"], "awaiting-approval", "{own}");
    assert_ne!(own["detail"]["approval"]["request"], request, "b's call is its own, with its own request");
    let again = Client::open(probed, Some(A)).refund("mx-call", 1_103, false)["structuredContent"].clone();
    assert_eq!(again["detail"]["approval"]["request"], request, "tool-call id × call × owner: the same call");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(posts(sandbox), 0, "nothing b or nobody did sent anything");
    // The owner's answers decide, here.
    let now = approval_key(&asking(&a, &task));
    a.answer(&task, &now, yes.clone());
    assert_eq!(a.settled(&task)["result"]["isError"], false);
    let done = call_2026(probed, A, "mx-mrtr", json!({ "requestState": state, "inputResponses": { &key: yes } }))["result"].clone();
    assert_eq!(done["isError"], false, "{done}");
    assert_eq!(sandbox.refunds().len(), 2, "a's two approved refunds, nothing else");
}

#[test]
fn the_matrix_on_one_host() {
    let dir = tempfile::tempdir().unwrap();
    let (_rt, sandbox, config) = world(dir.path(), "approval = { always = true }", "", None);
    let server = serve_http(&config, &env());
    matrix(&sandbox, &server.url, &server.url);
}

#[test]
fn the_matrix_across_two_hosts_of_a_fleet_on_postgresql() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = crate::common::fresh_postgres_database();
    let (_rt, sandbox, config) = world(dir.path(), "approval = { always = true }", "", Some(&ledger));
    let text = std::fs::read_to_string(&config).unwrap();
    let second = dir.path().join("second.toml");
    std::fs::write(&second, text.replace("data_dir = \"data\"", "data_dir = \"data2\"")).unwrap();
    let (one, two) = (serve_http(&config, &env()), serve_http(&second, &env()));
    matrix(&sandbox, &one.url, &two.url);
}

/// A GET stream held open on a raw connection: its status line, and the
/// connection (the stream lives as long as it does).
fn hold_get(url: &str, headers: &[(&str, &str)]) -> (String, std::net::TcpStream) {
    use std::io::{BufRead as _, Write as _};
    let rest = url.strip_prefix("http://").unwrap();
    let (authority, path) = rest.split_once('/').unwrap();
    let mut tcp = std::net::TcpStream::connect(authority).unwrap();
    let mut request = format!("GET /{path} HTTP/1.1\r\nHost: {authority}\r\nAccept: text/event-stream\r\n");
    for (k, v) in headers {
        request.push_str(&format!("{k}: {v}\r\n"));
    }
    request.push_str("\r\n");
    tcp.write_all(request.as_bytes()).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut status = String::new();
    std::io::BufReader::new(tcp.try_clone().unwrap()).read_line(&mut status).unwrap();
    (status.trim().to_string(), tcp)
}

#[test]
fn one_principal_at_its_quotas_refuses_nobody_else() {
    let dir = tempfile::tempdir().unwrap();
    let quotas = "max_requests_per_principal = 2\nmax_tasks_per_principal = 1\nmax_approval_requests_per_principal_hour = 2\n";
    let (_rt, sandbox, config) = world(dir.path(), "approval = { always = true }", quotas, None);
    let server = serve_http(&config, &env());
    let (a, b) = (bearer(A), bearer(B));
    // Open requests: b's two GET streams are its share; its third request is 429, nothing read; a is served.
    let b_session = crate::mcp::open_session_with(&server.url, &[("Authorization", b.as_str())]);
    // One GET stream per session (a session has one), two sessions.
    let b_sessions = [b_session.clone(), crate::mcp::open_session_with(&server.url, &[("Authorization", b.as_str())])];
    let streams: Vec<_> = b_sessions.iter().map(|s| hold_get(&server.url, &in_session(s, &b))).collect();
    assert!(streams.iter().all(|(status, _)| status.contains("200")), "{:?}", streams.iter().map(|s| &s.0).collect::<Vec<_>>());
    let list = r#"{"jsonrpc":"2.0","id":3,"method":"tools/list"}"#.to_string();
    let (status, said) = http(reqwest::Method::POST, &server.url, &in_session(&b_session, &b), Some(list.clone()));
    assert_eq!(status, 429, "{said}");
    assert!(said.contains("max_requests_per_principal"), "{said}");
    let a_session = crate::mcp::open_session_with(&server.url, &[("Authorization", a.as_str())]);
    assert_eq!(http(reqwest::Method::POST, &server.url, &in_session(&a_session, &a), Some(list.clone())).0, 200, "a has its own share");
    drop(streams);
    assert!(
        crate::world::wait_for(Duration::from_secs(10), || http(reqwest::Method::POST, &server.url, &in_session(&b_session, &b), Some(list.clone())).0 == 200),
        "a closed stream gives its place back"
    );
    // Approval requests: b's calls may open two an hour; the third is busy, nobody asked; a's is asked.
    let b_client = Client::open(&server.url, Some(B));
    for (n, amount) in [(1, 1_001), (2, 1_002)] {
        assert_eq!(b_client.refund(&format!("q{n}"), amount, false)["structuredContent"]["kind"], "awaiting-approval");
    }
    let third = b_client.refund("q3", 1_003, false)["structuredContent"].clone();
    assert_eq!(third["kind"], "busy", "{third}");
    assert!(third["message"].as_str().unwrap().contains("max_approval_requests_per_principal_hour"), "{third}");
    assert_eq!(b_client.refund("q1", 1_001, false)["structuredContent"]["kind"], "awaiting-approval", "a repeat of a call asked spends nothing");
    assert_eq!(operator_decides(&server.url, "q3", true), 404, "the refused call asked nobody");
    let a_client = Client::open(&server.url, Some(A)).eliciting();
    assert_eq!(a_client.refund("qa", 1_004, false)["structuredContent"]["kind"], "awaiting-approval", "a's own quota");
    // Tasks: b's one unsettled task is its share (q1 waits as a task now); a's task is made.
    let b_tasks = Client::open(&server.url, Some(B)).eliciting();
    let handle = b_tasks.refund("q1", 1_001, true);
    assert_eq!(handle["resultType"], "task", "{handle}");
    let refused = b_tasks.refund("q2", 1_002, true);
    assert_eq!(refused["structuredContent"]["kind"], "busy", "{refused}");
    assert!(refused["structuredContent"]["message"].as_str().unwrap().contains("max_tasks_per_principal"), "{refused}");
    assert!(task_id(&a_client.refund("qa", 1_004, true)).starts_with("tg2."), "a's task is made");
    assert_eq!(posts(&sandbox), 0);
}
