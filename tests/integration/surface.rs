//! Fuzzing the JSON-RPC surface of `serve --http` with two principals
//! (`docs/fuzzing.md`, `docs/threat-model.md`). Tenant `a` has a refund
//! waiting for its person three ways — a 2025 `elicitation/create` on its
//! session's open `tools/call`, a task asking for approval, and a
//! 2026-07-28 `input_required` with its sealed `requestState` — and tenant
//! `b` (or nobody) sends generated messages: requests, notifications,
//! answers to server-to-client requests, batches and garbage, naming a's
//! session, task id, state and approval keys, its own, or made-up ones,
//! under every protocol header. Each must be answered without a server
//! error, without anything of a's in the answer, and without anything
//! sent to the sandbox; afterwards a's three questions are still waiting,
//! a's session still serves, and a's answer is still the one that decides.
//!
//! A short pass runs in the test command; `TOOLGUARD_FUZZ_SECONDS` runs it
//! longer (`crate::properties::check`).

use crate::clients::{A, B, env, world};
use crate::common::serve_http;
use crate::tasks::{Client, task_id};
use proptest::prelude::*;
use serde_json::{Value, json};
use std::time::Duration;

/// The identifiers of a's that the generator names, as placeholders.
const PLACEHOLDERS: [&str; 6] = ["@a-session", "@a-task", "@a-state", "@a-key", "@b-session", "@a-elicit-id"];

/// A JSON value naming a's identifiers now and then.
fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        (0u64..8).prop_map(Value::from),
        prop::sample::select(PLACEHOLDERS.to_vec()).prop_map(Value::from),
        ".{0,10}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(prop_oneof![".{0,6}".boxed(), Just("approve".to_string()).boxed(), Just("@a-key".to_string()).boxed()], inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// An id a message may carry: small numbers (the server's own requests to a
/// session count from 0), a's question's id, strings, odd types.
fn id() -> impl Strategy<Value = Option<Value>> {
    prop_oneof![
        Just(None),
        (0u64..6).prop_map(|n| Some(Value::from(n))),
        Just(Some(Value::from("@a-elicit-id"))),
        ".{0,6}".prop_map(|s| Some(Value::String(s))),
        Just(Some(Value::Null)),
        Just(Some(json!({ "x": 1 }))),
    ]
}

/// The params of a request, shaped for its method often enough to reach past the parsers.
fn params() -> impl Strategy<Value = Value> {
    let approve = json!({ "action": "accept", "content": { "approve": true } });
    prop_oneof![
        value(),
        (prop::sample::select(vec!["@a-task", "tg2.x.y.z", "tg1.YQ.Yg", ""]), value()).prop_map({
            let approve = approve.clone();
            move |(task, v)| json!({ "taskId": task, "inputResponses": { "@a-key": approve.clone(), "x": v } })
        }),
        (prop::sample::select(vec!["refund", "refund_status", "nope"]), 0u64..3_000, value(), any::<bool>()).prop_map(move |(name, amount, v, mrtr)| {
            let mut p = json!({ "name": name, "arguments": { "payment_intent": "pi_mcp", "amount_cents": amount, "reason": "duplicate" },
                "_meta": { "toolguard/toolCallId": "m1", "toolguard/sessionId": "conv", "extra": v } });
            if mrtr {
                p["requestState"] = "@a-state".into();
                p["inputResponses"] = json!({ "@a-key": approve.clone() });
                p["_meta"]["io.modelcontextprotocol/protocolVersion"] = "2026-07-28".into();
                p["_meta"]["io.modelcontextprotocol/clientCapabilities"] = json!({ "elicitation": {}, "extensions": { "io.modelcontextprotocol/tasks": {} } });
            }
            p
        }),
    ]
}

/// One JSON-RPC message (or something that is almost one).
fn message() -> impl Strategy<Value = Value> {
    let method = prop::sample::select(vec![
        "initialize",
        "notifications/initialized",
        "ping",
        "tools/list",
        "tools/call",
        "tasks/get",
        "tasks/update",
        "tasks/cancel",
        "tasks/list",
        "resources/list",
        "prompts/get",
        "logging/setLevel",
        "server/discover",
        "notifications/cancelled",
        "x/unknown",
    ]);
    let request = (method, id(), params()).prop_map(|(method, id, params)| {
        let mut m = json!({ "jsonrpc": "2.0", "method": method, "params": params });
        if let Some(id) = id {
            m["id"] = id;
        }
        m
    });
    let answer = (id(), prop_oneof![Just(json!({ "action": "accept", "content": { "approve": true } })).boxed(), value().boxed()])
        .prop_map(|(id, result)| json!({ "jsonrpc": "2.0", "id": id.unwrap_or(Value::from(0)), "result": result }));
    let error = id().prop_map(|id| json!({ "jsonrpc": "2.0", "id": id, "error": { "code": -1, "message": "no" } }));
    prop_oneof![4 => request, 3 => answer, 1 => error, 1 => value()]
}

/// One probe: who sends it, in which session, under which protocol header, what.
#[derive(Debug, Clone)]
struct Probe {
    sender: u8,
    session: u8,
    version: u8,
    origin: bool,
    body: Body,
}

#[derive(Debug, Clone)]
enum Body {
    One(Value),
    Batch(Vec<Value>),
    Raw(String),
}

fn probe() -> impl Strategy<Value = Probe> {
    let body = prop_oneof![
        6 => message().prop_map(Body::One),
        1 => prop::collection::vec(message(), 0..4).prop_map(Body::Batch),
        1 => ".{0,40}".prop_map(Body::Raw),
    ];
    (0u8..10, 0u8..4, 0u8..4, prop::bool::weighted(0.05), body).prop_map(|(sender, session, version, origin, body)| Probe {
        sender,
        session,
        version,
        origin,
        body,
    })
}

/// a's identifiers, by placeholder.
struct Theirs {
    session: String,
    task: String,
    state: String,
    key: String,
    b_session: String,
    elicit_id: Value,
}

impl Theirs {
    fn fill(&self, text: &str) -> String {
        let elicit = self.elicit_id.to_string();
        text.replace("\"@a-elicit-id\"", &elicit)
            .replace("@a-session", &self.session)
            .replace("@a-task", &self.task)
            .replace("@a-state", &self.state)
            .replace("@a-key", &self.key)
            .replace("@b-session", &self.b_session)
    }
}

#[test]
fn generated_messages_from_another_principal_never_reach_the_owners_objects() {
    let dir = tempfile::tempdir().unwrap();
    let (_rt, sandbox, config) = world(dir.path(), "approval = { always = true }", "", None);
    let server = serve_http(&config, &env());
    let (auth_a, auth_b) = (format!("Bearer {A}"), format!("Bearer {B}"));
    // a's three waiting questions.
    let init = json!({ "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": { "elicitation": {} }, "clientInfo": { "name": "a", "version": "1" } } })
    .to_string();
    let (status, headers, _) = crate::mcp::send(&server.url, &[("Authorization", auth_a.as_str())], init);
    assert_eq!(status, 200);
    let session = headers.get("mcp-session-id").unwrap().to_str().unwrap().to_string();
    let in_a = |extra: &[(&str, &str)]| {
        let mut h = vec![
            ("Mcp-Session-Id".to_string(), session.clone()),
            ("MCP-Protocol-Version".into(), "2025-11-25".into()),
            ("Authorization".into(), auth_a.clone()),
        ];
        h.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        h
    };
    let initialized = json!({ "jsonrpc": "2.0", "method": "notifications/initialized" }).to_string();
    let pairs = in_a(&[]);
    let as_refs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    assert_eq!(crate::mcp::send(&server.url, &as_refs, initialized).0, 202);
    let refund = json!({ "jsonrpc": "2.0", "id": 50, "method": "tools/call", "params": { "name": "refund",
        "arguments": { "payment_intent": "pi_mcp", "amount_cents": 7_777, "reason": "duplicate" },
        "_meta": { "toolguard/toolCallId": "a-live", "toolguard/sessionId": "conv" } } });
    let live_headers = in_a(&[]);
    let live_refs: Vec<(&str, &str)> = live_headers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let live = crate::clients::stream(&server.url, &live_refs, refund.to_string());
    let asked = loop {
        let m = live.recv_timeout(Duration::from_secs(30)).expect("a's question");
        if m["method"] == "elicitation/create" {
            break m;
        }
    };
    let client_a = Client::open(&server.url, Some(A)).eliciting();
    // Each of a's three refunds its own amount: three actions, none held behind another.
    let task = task_id(&client_a.refund("a-task", 7_778, true));
    let until = std::time::Instant::now() + Duration::from_secs(30);
    let key = loop {
        assert!(std::time::Instant::now() < until, "a's task never asked");
        let t = client_a.task("get", &task)["result"].clone();
        if let Some(k) = t["inputRequests"].as_object().and_then(|r| r.keys().next().cloned()) {
            break k;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mrtr = {
        let meta = json!({ "io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": { "elicitation": {} },
            "toolguard/toolCallId": "a-mrtr", "toolguard/sessionId": "conv" });
        let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": { "name": "refund",
            "arguments": { "payment_intent": "pi_mcp", "amount_cents": 7_779, "reason": "duplicate" }, "_meta": meta } });
        let headers = [("MCP-Protocol-Version", "2026-07-28"), ("Mcp-Method", "tools/call"), ("Mcp-Name", "refund"), ("Authorization", auth_a.as_str())];
        let (_, _, text) = crate::mcp::send(&server.url, &headers, body.to_string());
        let data = text.lines().filter_map(|l| l.strip_prefix("data:")).map(str::trim).find(|d| !d.is_empty()).map(str::to_string);
        serde_json::from_str::<Value>(&data.unwrap_or(text)).unwrap()["result"].clone()
    };
    assert_eq!(mrtr["resultType"], "input_required", "{mrtr}");
    let b_session = crate::mcp::open_session_with(&server.url, &[("Authorization", auth_b.as_str())]);
    let theirs = Theirs {
        session: session.clone(),
        task: task.clone(),
        state: mrtr["requestState"].as_str().unwrap().to_string(),
        key: key.clone(),
        b_session,
        elicit_id: asked["id"].clone(),
    };
    let secrets = [theirs.session.clone(), theirs.task.clone(), theirs.state.clone(), theirs.key.clone(), "a-live".into(), "a-mrtr".into(), "a-task".into()];
    let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let wrong = "Bearer not-a-token-of-anyone-here".to_string();
    crate::properties::check("the JSON-RPC surface", probe(), |p| {
        let body = match &p.body {
            Body::One(v) => theirs.fill(&v.to_string()),
            Body::Batch(vs) => theirs.fill(&Value::Array(vs.clone()).to_string()),
            Body::Raw(s) => s.clone(),
        };
        let mut req =
            http.post(&server.url).header("Content-Type", "application/json").header("Accept", "application/json, text/event-stream").body(body.clone());
        req = match p.sender {
            0 => req,
            1 => req.header("Authorization", &wrong),
            _ => req.header("Authorization", &auth_b),
        };
        req = match p.session {
            0 => req.header("Mcp-Session-Id", &theirs.session),
            1 => req.header("Mcp-Session-Id", &theirs.b_session),
            2 => req.header("Mcp-Session-Id", "0b6f8c1e-4a7d-4d2b-9e55-2f3c1a9d8e77"),
            _ => req,
        };
        req = match p.version {
            0 => req.header("MCP-Protocol-Version", "2025-11-25"),
            1 => req.header("MCP-Protocol-Version", "2026-07-28"),
            2 => req.header("MCP-Protocol-Version", "1999-01-01"),
            _ => req,
        };
        if p.origin {
            req = req.header("Origin", "https://evil.example");
        }
        let answered = rt.block_on(async {
            let response = req.send().await?;
            let status = response.status().as_u16();
            // A stream that stays open (a request that waits) is read for what it says so far.
            let text = match tokio::time::timeout(Duration::from_secs(3), response.text()).await {
                Ok(text) => text.unwrap_or_default(),
                Err(_) => String::new(),
            };
            Ok::<_, reqwest::Error>((status, text))
        });
        let (status, text) = match answered {
            Ok(a) => a,
            Err(e) if e.is_timeout() => (0, String::new()),
            Err(e) => return Err(TestCaseError::fail(format!("the host did not answer {body}: {e}"))),
        };
        prop_assert!(status < 500, "HTTP {status} for {p:?} {body}: {text}");
        // Nothing of a's comes back that the message did not itself carry (an error may echo what it was sent).
        for secret in &secrets {
            prop_assert!(!text.contains(secret.as_str()) || body.contains(secret.as_str()), "a's `{secret}` in the answer to {p:?} {body}: {text}");
        }
        prop_assert_eq!(sandbox.requests().iter().filter(|r| r.method == "POST").count(), 0, "something was sent after {:?} {}", p, body);
        Ok(())
    });
    // Afterwards: nothing was sent, a's task still waits for a's person, and a's own answers decide.
    assert_eq!(sandbox.requests().iter().filter(|r| r.method == "POST").count(), 0);
    let a_now = Client::open(&server.url, Some(A)).eliciting();
    let waiting = a_now.task("get", &task)["result"].clone();
    assert_eq!(waiting["status"], "input_required", "{waiting}");
    let now = waiting["inputRequests"].as_object().unwrap().keys().next().unwrap().clone();
    a_now.answer(&task, &now, json!({ "action": "accept", "content": { "approve": true } }));
    assert_eq!(a_now.settled(&task)["result"]["isError"], false);
    assert_eq!(sandbox.refunds().len(), 1, "a's own answer made its refund");
    // In the short pass a's live question is still open (a long run outlasts its ten minutes and the session's idle time).
    if std::env::var("TOOLGUARD_FUZZ_SECONDS").is_err() {
        let pairs = in_a(&[]);
        let as_refs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let approve = json!({ "jsonrpc": "2.0", "id": asked["id"], "result": { "action": "accept", "content": { "approve": true } } });
        assert_eq!(crate::mcp::send(&server.url, &as_refs, approve.to_string()).0, 202, "a's session still takes a's answer");
        let answered = loop {
            let m = live.recv_timeout(Duration::from_secs(30)).expect("a's call answers");
            if m["id"] == 50 {
                break m;
            }
        };
        assert_eq!(answered["result"]["isError"], false, "{answered}");
        assert_eq!(sandbox.refunds().len(), 2, "only a's own answers made refunds");
    }
}
