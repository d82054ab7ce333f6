//! MCP Tasks backed by the ledger (`docs/tasks.md`), through `serve --http`
//! and counted at the sandbox: a call not settled in time is answered with
//! a task, the task's result is the call's one real outcome, the hold rule
//! counts its delivery as what the caller was told, a cancel is refused
//! once something may have left, and a task outlives a kill -9 of its host
//! and is visible only to its principal.

use crate::mcp::{in_session, open_session_with, serve_patient_refunds, try_send};
use serde_json::{Value, json};
use std::time::Duration;
use toolguard_sandbox::Fault;

/// The per-request capability that opts a request into tasks.
pub(crate) fn opted_in() -> Value {
    json!({ "io.modelcontextprotocol/clientCapabilities": { "extensions": { "io.modelcontextprotocol/tasks": {} } } })
}

/// An initialised 2025-11-25 session at an MCP endpoint, with a bearer token
/// or none, declaring per request the capabilities `caps` (the tasks
/// extension; and elicitation, for a client that can ask its user).
pub(crate) struct Client {
    url: String,
    session: String,
    auth: Option<String>,
    caps: Value,
}

impl Client {
    pub(crate) fn open(url: &str, token: Option<&str>) -> Client {
        let auth = token.map(|t| format!("Bearer {t}"));
        let with: Vec<(&str, &str)> = auth.iter().map(|a| ("Authorization", a.as_str())).collect();
        let session = open_session_with(url, &with);
        Client { url: url.into(), session, auth, caps: opted_in() }
    }

    /// The same client, declaring that it can ask its user (elicitation).
    pub(crate) fn eliciting(mut self) -> Client {
        self.caps["io.modelcontextprotocol/clientCapabilities"]["elicitation"] = json!({});
        self
    }

    /// Sends request `method` with `params` (and `meta` in its `_meta`); the whole JSON-RPC response.
    pub(crate) fn request(&self, method: &str, params: Value, meta: Value) -> Value {
        self.try_request(method, params, meta).unwrap_or_else(|e| panic!("{method}: {e}"))
    }

    /// [`Client::request`], or why no whole JSON-RPC response came (the host went away).
    pub(crate) fn try_request(&self, method: &str, mut params: Value, meta: Value) -> Result<Value, String> {
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(100);
        let id = NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        params["_meta"] = meta;
        let body = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }).to_string();
        let mut headers = in_session(&self.session).to_vec();
        if let Some(auth) = &self.auth {
            headers.push(("Authorization", auth.as_str()));
        }
        let (status, _, text) = try_send(&self.url, &headers, body)?;
        if status != 200 {
            return Err(format!("HTTP {status}: {text}"));
        }
        let data = text.lines().filter_map(|l| l.strip_prefix("data:")).map(str::trim).find(|d| !d.is_empty());
        serde_json::from_str(data.unwrap_or(&text)).map_err(|e| format!("{e}: {text}"))
    }

    /// A refund of `amount` cents as tool call `call_id`, opted into tasks or not: the result.
    pub(crate) fn refund(&self, call_id: &str, amount: u64, tasks: bool) -> Value {
        self.try_refund(call_id, amount, tasks).unwrap_or_else(|e| panic!("refund {call_id}: {e}"))
    }

    /// [`Client::refund`], or why no answer came (the host went away).
    pub(crate) fn try_refund(&self, call_id: &str, amount: u64, tasks: bool) -> Result<Value, String> {
        let mut meta = if tasks { self.caps.clone() } else { json!({}) };
        meta["toolguard/toolCallId"] = call_id.into();
        meta["toolguard/sessionId"] = "conv".into();
        let args = json!({ "payment_intent": "pi_mcp", "amount_cents": amount, "reason": "duplicate" });
        Ok(self.try_request("tools/call", json!({ "name": "refund", "arguments": args }), meta)?["result"].clone())
    }

    /// `tasks/<verb>` of `task` (opted in): the whole response.
    pub(crate) fn task(&self, verb: &str, task: &str) -> Value {
        self.request(&format!("tasks/{verb}"), json!({ "taskId": task }), self.caps.clone())
    }

    /// `tasks/update` of `task` answering input request `key` with `answer`: the whole response.
    pub(crate) fn answer(&self, task: &str, key: &str, answer: Value) -> Value {
        self.request("tasks/update", json!({ "taskId": task, "inputResponses": { key: answer } }), self.caps.clone())
    }

    /// Polls `task` until it is no longer working: its last `tasks/get` result.
    pub(crate) fn settled(&self, task: &str) -> Value {
        let mut last = Value::Null;
        let done = crate::world::wait_for(Duration::from_secs(60), || {
            last = self.task("get", task)["result"].clone();
            last["status"] != "working"
        });
        assert!(done, "task {task} still working: {last}");
        last
    }
}

/// The task id of a `tools/call` result that must be a task handle.
pub(crate) fn task_id(result: &Value) -> String {
    assert_eq!(result["resultType"], "task", "a task handle: {result}");
    assert_eq!(result["status"], "working", "{result}");
    assert!(result["ttlMs"].as_u64().is_some() && result["pollIntervalMs"].as_u64().is_some(), "{result}");
    assert!(result.get("content").is_none(), "a handle carries no result: {result}");
    result["taskId"].as_str().unwrap().to_string()
}

#[test]
fn a_slow_refund_becomes_a_task_its_repeat_waits_in_its_own_and_each_tells_the_one_real_refund() {
    let dir = tempfile::tempdir().unwrap();
    let (_rt, sandbox, server) = serve_patient_refunds(dir.path(), "task_after_ms = 300\ntask_poll_ms = 100", &[]);
    let client = Client::open(&server.url, None);
    sandbox.inject(Fault::PauseAfterCommit);
    let first = task_id(&client.refund("c1", 900, true));
    assert!(crate::world::wait_for(Duration::from_secs(20), || sandbox.paused() == 1), "the refund reached the provider");
    let working = client.task("get", &first)["result"].clone();
    assert_eq!(working["status"], "working", "{working}");
    assert!(working.get("result").is_none(), "{working}");
    // The model re-issues it blindly under a new id: held, as its own task.
    let repeat = task_id(&client.refund("c2", 900, true));
    let waiting = client.task("get", &repeat)["result"].clone();
    assert!(waiting["statusMessage"].as_str().unwrap().contains("identical earlier call"), "{waiting}");
    // Its refund may have left: a cancel is acknowledged, refused, and says why.
    let ack = client.task("cancel", &first);
    assert_eq!(ack["result"], json!({ "resultType": "complete" }), "{ack}");
    let after_cancel = client.task("get", &first)["result"].clone();
    assert_eq!(after_cancel["status"], "working");
    let said = after_cancel["statusMessage"].as_str().unwrap();
    assert!(said.contains("Not cancelled") && said.contains("may have taken effect"), "{said}");
    sandbox.release();
    let done = client.settled(&first);
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["result"]["isError"], false, "{done}");
    let refund_id = done["result"]["structuredContent"]["refund_id"].as_str().unwrap().to_string();
    assert_eq!(done["_meta"]["toolguard/toolCallId"], "c1");
    let held = client.settled(&repeat);
    assert_eq!(held["result"]["structuredContent"]["kind"], "held", "{held}");
    assert!(held["result"].to_string().contains(&refund_id), "the repeat is told the first call's refund: {held}");
    assert_eq!(sandbox.refunds().len(), 1, "one refund for the call, its cancel and its blind repeat");
    // A settled task: cancel is the same empty acknowledgement, and changes nothing.
    assert_eq!(client.task("cancel", &first)["result"], json!({ "resultType": "complete" }));
    assert_eq!(client.settled(&first)["result"]["structuredContent"]["refund_id"], refund_id.as_str());
    // The task's delivery told the caller: the same refund asked again now is a new one,
    // and, settled within the budget, it is answered directly.
    let again = client.refund("c3", 900, true);
    assert_eq!(again["isError"], false, "{again}");
    assert_ne!(again["structuredContent"]["refund_id"], refund_id.as_str());
    assert_eq!(sandbox.refunds().len(), 2);
}

#[test]
fn an_outcome_the_provider_has_not_yet_listed_settles_through_the_task_and_without_opting_in_stays_unknown() {
    let dir = tempfile::tempdir().unwrap();
    let (_rt, sandbox, server) = serve_patient_refunds(dir.path(), "task_after_ms = 300\ntask_poll_ms = 1000", &[]);
    sandbox.set_list_lag(Duration::from_secs(3_600));
    let client = Client::open(&server.url, None);
    // Without the opt-in: today's answer, an unknown outcome for the model to reason about.
    sandbox.inject(Fault::DropAfterCommit);
    let plain = client.refund("p1", 300, false);
    assert_eq!(plain["structuredContent"]["kind"], "outcome-unknown", "{plain}");
    // Opted in: a task, settled by the host (its key re-sent), with the real refund.
    sandbox.inject(Fault::DropAfterCommit);
    let task = task_id(&client.refund("t1", 400, true));
    let done = client.settled(&task);
    assert_eq!(done["status"], "completed", "{done}");
    let refund_id = done["result"]["structuredContent"]["refund_id"].as_str().unwrap();
    let made: Vec<_> = sandbox.refunds().into_iter().filter(|r| r.amount == 400).collect();
    assert_eq!(made.len(), 1, "one refund for the task");
    assert_eq!(made[0].id, refund_id, "the task's result is the refund the provider made");
}

#[test]
fn a_task_outlives_a_kill_9_of_its_host_and_only_its_principal_sees_it() {
    const ALICE: &str = "alice-token-long-enough";
    const MALLORY: &str = "mallory-token-long-enough";
    let env = [("TG_ALICE", ALICE), ("TG_MALLORY", MALLORY)];
    let dir = tempfile::tempdir().unwrap();
    let tokens = r#"tokens = [{ principal = "alice", token_env = "TG_ALICE" }, { principal = "mallory", token_env = "TG_MALLORY" }]"#;
    let (_rt, sandbox, server) = serve_patient_refunds(dir.path(), &format!("task_after_ms = 300\ntask_poll_ms = 100\n{tokens}"), &env);
    let alice = Client::open(&server.url, Some(ALICE));
    sandbox.inject(Fault::PauseAfterCommit);
    let task = task_id(&alice.refund("a1", 1_200, true));
    assert!(crate::world::wait_for(Duration::from_secs(20), || sandbox.paused() == 1));
    let mallory = Client::open(&server.url, Some(MALLORY));
    let refused = mallory.task("get", &task);
    assert_eq!(refused["error"]["code"], -32602, "another principal cannot see the task: {refused}");
    assert_eq!(mallory.task("cancel", &task)["error"]["code"], -32602, "nor cancel it");
    // Without the extension in the request, tasks/* are refused as the extension says.
    let bare = alice.request("tasks/get", json!({ "taskId": task }), json!({}));
    assert_eq!(bare["error"]["code"], -32021, "{bare}");
    // The host dies with the refund committed at the provider and unanswered.
    let mut server = server;
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    sandbox.release();
    let restarted = crate::common::serve_http(&dir.path().join("patient.toml"), &env);
    let alice = Client::open(&restarted.url, Some(ALICE));
    let done = alice.settled(&task);
    assert_eq!(done["status"], "completed", "{done}");
    let made = sandbox.refunds();
    assert_eq!(made.len(), 1, "one refund across the crash");
    assert_eq!(done["result"]["structuredContent"]["refund_id"], made[0].id.as_str(), "the task's result is that refund");
    let mallory = Client::open(&restarted.url, Some(MALLORY));
    assert_eq!(mallory.task("get", &task)["error"]["code"], -32602, "still only alice's");
}

#[test]
fn a_blind_repeat_waiting_in_its_task_is_cancelled_and_the_refund_still_happens_once() {
    let dir = tempfile::tempdir().unwrap();
    let (_rt, sandbox, server) = serve_patient_refunds(dir.path(), "task_after_ms = 300\ntask_poll_ms = 100", &[]);
    let client = Client::open(&server.url, None);
    sandbox.inject(Fault::PauseAfterCommit);
    let first = task_id(&client.refund("c1", 500, true));
    assert!(crate::world::wait_for(Duration::from_secs(20), || sandbox.paused() == 1));
    let repeat = task_id(&client.refund("c2", 500, true));
    // Held behind c1, the repeat never sent anything: its cancel is honoured.
    assert_eq!(client.task("cancel", &repeat)["result"], json!({ "resultType": "complete" }));
    let cancelled = client.settled(&repeat);
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    assert!(cancelled.get("result").is_none() && cancelled.get("error").is_none(), "{cancelled}");
    // It stays cancelled: its replay under its own id says so and runs nothing.
    let replay = client.refund("c2", 500, false);
    assert_eq!(replay["structuredContent"]["kind"], "cancelled", "{replay}");
    sandbox.release();
    let done = client.settled(&first);
    assert_eq!(done["status"], "completed", "the first call goes on: {done}");
    assert_eq!(sandbox.refunds().len(), 1, "one refund: the held repeat was cancelled, not run");
    assert_eq!(sandbox.requests().iter().filter(|r| r.method == "POST").count(), 1, "and it never reached the provider");
}

#[test]
fn a_task_begun_on_a_host_killed_mid_send_is_finished_by_another_host_of_the_fleet() {
    use crate::payments::Downstream;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let sandbox = rt.block_on(toolguard_sandbox::Sandbox::start("127.0.0.1:0", toolguard_sandbox::Mode::Stripe, toolguard_sandbox::DEFAULT_RETENTION)).unwrap();
    sandbox.add_payment_intent("pi_mcp", 100_000);
    let dir = tempfile::tempdir().unwrap();
    let ledger = crate::common::fresh_postgres_database();
    let configs = crate::fleet::host_configs(&sandbox.url(), &ledger, dir.path(), &Downstream { wall_ms: 1_500, ..Downstream::default() });
    for config in &configs {
        let text = std::fs::read_to_string(config).unwrap();
        std::fs::write(config, format!("{text}\n[mcp]\ntask_after_ms = 300\ntask_poll_ms = 100\n")).unwrap();
    }
    let mut a = crate::common::serve_http(&configs[0], &[]);
    let b = crate::common::serve_http(&configs[1], &[]);
    sandbox.inject(Fault::PauseAfterCommit);
    let task = task_id(&Client::open(&a.url, None).refund("f1", 800, true));
    assert!(crate::world::wait_for(Duration::from_secs(20), || sandbox.paused() == 1), "host A's refund reached the provider");
    // Host B knows the task from the ledger alone, while A still runs it.
    let on_b = Client::open(&b.url, None);
    assert_eq!(on_b.task("get", &task)["result"]["status"], "working");
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    sandbox.release();
    // B waits out A's claim, re-sends A's attempt with its key, and the task has the one refund.
    let done = on_b.settled(&task);
    assert_eq!(done["status"], "completed", "{done}");
    let made = sandbox.refunds();
    assert_eq!(made.len(), 1, "one refund across the fleet");
    assert_eq!(done["result"]["structuredContent"]["refund_id"], made[0].id.as_str());
    let keys: Vec<_> = sandbox.requests().into_iter().filter(|r| r.method == "POST").map(|r| r.idempotency_key).collect();
    assert!(keys.len() <= 2 && keys.windows(2).all(|w| w[0] == w[1]), "B sent only A's key again: {keys:?}");
}
