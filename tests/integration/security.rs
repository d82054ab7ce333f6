//! Findings of the security review of the plugin → host and client → host
//! paths (issue "Hostile input…"), each reproduced the way it was found —
//! through the real binary where it was found that way — and counted at the
//! sandbox: what must not leave the host never reaches it.

use crate::common::{BIN, stdout_json};
use crate::payments::{Downstream, harness, rogue_args};
use crate::world::{PI, World};
use serde_json::{Value, json};
use std::io::Write as _;
use std::process::{Command, Stdio};
use toolguard::ErrorKind;
use toolguard::ledger::{AttemptState, Resolution};

/// `toolguard call` of the rogue plugin's `send_all` with `requests`, the
/// arguments on stdin (they may be larger than a command line takes).
fn rogue_call(w: &World, call_id: &str, requests: Value, env: &[(&str, &str)]) -> std::process::Output {
    let mut child = Command::new(BIN)
        .args(["call", "--config", w.config.to_str().unwrap(), "--session", "sec", "--call-id", call_id, "send_all", "-"])
        .env("TOOLGUARD_LOG", "warn")
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(rogue_args(requests, false).as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

fn refund_request(url: &str, headers: Value) -> Value {
    json!({ "method": "POST", "url": format!("{url}/v1/refunds"), "headers": headers, "body": format!("payment_intent={PI}&amount=42") })
}

#[test]
fn thousands_of_headers_are_refused_before_the_attempt_is_written_and_the_host_lives() {
    let w = World::new();
    let headers: serde_json::Map<String, Value> = (0..40_000).map(|i| (format!("x-h{i}"), Value::from("v"))).collect();
    let out = rogue_call(&w, "h1", json!([refund_request(&w.sandbox.url(), Value::Object(headers))]), &[]);
    assert_eq!(out.status.code(), Some(1), "an error, not a crash: {}", String::from_utf8_lossy(&out.stderr));
    let answer = stdout_json(&out);
    assert_eq!(answer["kind"], "invalid-request", "{answer}");
    assert!(answer["message"].as_str().unwrap().contains("at most 64"), "{answer}");
    assert!(w.sandbox.requests().is_empty(), "nothing left the host");
    assert!(w.ledger().attempts().unwrap().is_empty(), "nothing was recorded, so nothing is re-sent at the next start");
    // The next start (and its recovery pass) is fine, and so are other calls.
    let recover = w.toolguard(&["recover"]);
    assert!(recover.status.success(), "{}", String::from_utf8_lossy(&recover.stdout));
    assert!(w.refund("after", 43).0);
}

#[test]
fn a_header_value_with_a_line_break_is_invalid_not_an_unknown_outcome() {
    let w = World::new();
    for (i, (name, value)) in [("X-Note", "a\r\nInjected: yes"), ("X-Note", "a\u{0}b"), ("Bad Name", "v")].into_iter().enumerate() {
        let out = rogue_call(&w, &format!("crlf{i}"), json!([refund_request(&w.sandbox.url(), json!({ name: value }))]), &[]);
        let answer = stdout_json(&out);
        assert_eq!(answer["kind"], "invalid-request", "{name:?}={value:?}: {answer}");
    }
    assert!(w.sandbox.requests().is_empty());
    assert!(w.ledger().attempts().unwrap().is_empty(), "not recorded: an identical call is never held behind it");
}

#[test]
fn a_credential_that_is_not_a_header_value_is_refused_at_start() {
    let w = World::new();
    let secret = w.dir.path().join("secret");
    std::fs::write(&secret, "sk_test_one\nsk_test_two\n").unwrap();
    let mut text = std::fs::read_to_string(&w.config).unwrap();
    text = text.replace(
        "retention_hours = 24\n",
        &format!("retention_hours = 24\ncredential = {{ prefix = \"Bearer \", file = {:?} }}\n", secret.display().to_string()),
    );
    std::fs::write(&w.config, text).unwrap();
    let (ok, answer) = w.refund("c1", 44);
    assert!(!ok);
    assert_eq!(answer["kind"], "config-error", "{answer}");
    assert!(answer["message"].as_str().unwrap().contains("cannot be sent as a header value"), "{answer}");
    assert!(w.sandbox.requests().is_empty());
}

#[test]
fn a_panic_while_driving_a_call_fails_that_call_and_recovery_leaves_the_attempt_to_an_operator() {
    let w = World::new();
    let panic = [("TOOLGUARD_FAILPOINT", "panic:after-answer")];
    // The request reaches the provider; then the host fails (a bug, simulated).
    let mut cmd = Command::new(BIN);
    cmd.args(["call", "--config", w.config.to_str().unwrap(), "--session", "crash", "--call-id", "p1", "refund"])
        .arg(format!(r#"{{"payment_intent":"{PI}","amount_cents":45,"reason":"duplicate"}}"#))
        .env("TOOLGUARD_LOG", "warn")
        .envs(panic);
    let out = cmd.output().unwrap();
    assert_eq!(out.status.code(), Some(1), "the call failed, the process did not crash: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(stdout_json(&out)["kind"], "internal");
    assert_eq!(w.refunds_of(45), 1);
    // Recovery hits the same bug on it: the attempt is left to an operator, and recovery goes on.
    let recover = Command::new(BIN).args(["recover", "--config", w.config.to_str().unwrap()]).env("TOOLGUARD_LOG", "warn").envs(panic).output().unwrap();
    assert_eq!(recover.status.code(), Some(1), "{}", String::from_utf8_lossy(&recover.stderr));
    assert_eq!(stdout_json(&recover)["needs_operator"].as_array().unwrap().len(), 1, "{}", String::from_utf8_lossy(&recover.stdout));
    let attempt = w.ledger().attempts().unwrap().remove(0);
    assert_eq!(attempt.resolution, Some(Resolution::HostFault));
    // From now on it is never sent again on its own — not by recovery, not by a retry.
    let posts = w.posts_of(45).len();
    let again = w.toolguard(&["recover"]);
    assert_eq!(stdout_json(&again)["needs_operator"].as_array().unwrap().len(), 1);
    let (ok, retry) = w.refund("p1", 45);
    assert!(!ok);
    assert_eq!(retry["kind"], "outcome-unknown", "{retry}");
    assert_eq!(w.posts_of(45).len(), posts, "nothing sent again");
    assert_eq!(w.ledger().attempt(&attempt.key).unwrap().unwrap().state, AttemptState::Pending);
    assert_eq!(w.refunds_of(45), 1);
}

#[test]
fn an_admission_that_loses_every_race_fails_clearly_and_sends_nothing() {
    let w = World::new();
    // Every conditional admission write fails as if another writer had won (a fault, simulated).
    let mut child = w.spawn_refund("r1", 46, Some("conflict:admission-write"));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the admission kept retrying a write that always loses");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let answer = stdout_json(&out);
    assert_eq!(answer["kind"], "internal", "{answer}");
    let message = answer["message"].as_str().unwrap();
    assert!(message.contains("lost 100 races in a row") && message.contains("retrying the same tool call is safe"), "{message}");
    assert!(w.sandbox.requests().is_empty(), "nothing left the host");
    // Without the fault the same call goes through, once.
    let (ok, answer) = w.refund("r1", 46);
    assert!(ok, "{answer}");
    assert_eq!(w.refunds_of(46), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encoded_separators_in_a_path_never_leave_the_host() {
    let h = harness(Downstream::default()).await;
    let url = h.sandbox.url();
    for path in
        ["/v1/refunds/..%2Fcharges", "/v1/refunds/..;/charges", "/v1/refunds/%2e%2e/charges", "/v1/refunds/..%5Ccharges", "/v1/refunds/%252e%252e%252fcharges"]
    {
        let request = json!({ "method": "POST", "url": format!("{url}{path}"), "body": "amount=1" });
        let err = h.call(&format!("p{path}"), "send_all", &rogue_args(json!([request]), false)).await.unwrap_err();
        assert_eq!(err.kind, ErrorKind::Denied, "{path}: {err}");
    }
    assert!(h.sandbox.requests().is_empty(), "{:?}", h.sandbox.requests());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_sends_no_body_and_bodies_are_capped() {
    let h = harness(Downstream::default()).await;
    let url = h.sandbox.url();
    let get = json!({ "method": "GET", "url": format!("{url}/v1/refunds?payment_intent={}", crate::payments::PI), "body": "smuggled" });
    let out = h.call("f1", "fetch_all", &rogue_args(json!([get]), true)).await.unwrap();
    assert!(out.value[0]["error"].as_str().unwrap().starts_with("invalid: fetch sends no body"), "{}", out.value);
    let big = json!({ "method": "POST", "url": format!("{url}/v1/refunds"), "body": "a".repeat((1 << 20) + 1) });
    let err = h.call("f2", "send_all", &rogue_args(json!([big]), false)).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidRequest, "{err}");
    assert!(err.message.contains("max_request_bytes"), "{}", err.message);
    assert!(h.sandbox.requests().is_empty());
    assert!(h.ledger().attempts().unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trace_grant_is_refused_at_load() {
    let dir = tempfile::tempdir().unwrap();
    let text = "[policy.downstreams.d]\nurl = \"http://127.0.0.1:1\"\n[[policy.plugins.p.grants]]\ndownstream = \"d\"\nmethods = [\"GET\", \"TRACE\"]\n";
    let err = toolguard::Config::parse(text, "t.toml", dir.path()).unwrap_err().to_string();
    assert!(err.contains("grants[0].methods") && err.contains("never TRACE"), "{err}");
}

#[test]
fn recovery_never_resends_to_an_origin_the_policy_no_longer_grants() {
    let w = World::new();
    let out = w.spawn_refund("m1", 46, Some("after-attempt-write")).wait_with_output().unwrap();
    assert!(!out.status.success(), "aborted after the attempt was written, before it was sent");
    // The operator moves the downstream (sandbox → production) and rotates its key.
    let old = w.sandbox.url();
    let text = std::fs::read_to_string(&w.config).unwrap().replace(&old, "http://127.0.0.1:9");
    std::fs::write(w.dir.path().join("api-key"), "sk_live_rotated\n").unwrap();
    let text = text.replace("retention_hours = 24\n", "retention_hours = 24\ncredential = { prefix = \"Bearer \", file = \"api-key\" }\n");
    std::fs::write(&w.config, text).unwrap();
    let recover = w.toolguard(&["recover"]);
    assert_eq!(recover.status.code(), Some(1), "left for the operator: {}", String::from_utf8_lossy(&recover.stdout));
    let report = stdout_json(&recover);
    let why = report["needs_operator"][0][1].as_str().unwrap_or_default();
    assert!(why.contains("no longer grants") && why.contains(&old), "{report}");
    assert!(w.sandbox.requests().is_empty(), "nothing went to the old origin (with the new key): {:?}", w.sandbox.requests());
    // Revoking the grant instead: the same.
    let text = std::fs::read_to_string(&w.config).unwrap().replace("http://127.0.0.1:9", &old).replace(
        "methods = [\"POST\", \"GET\"]\npath_prefix = \"/v1/refunds\"\n\n[policy.plugins.rogue]",
        "methods = [\"GET\"]\npath_prefix = \"/v1/refunds\"\n\n[policy.plugins.rogue]",
    );
    std::fs::write(&w.config, text).unwrap();
    let recover = w.toolguard(&["recover"]);
    assert!(
        stdout_json(&recover)["needs_operator"][0][1].as_str().unwrap_or_default().contains("no longer grants"),
        "{}",
        String::from_utf8_lossy(&recover.stdout)
    );
    assert!(w.sandbox.requests().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn integers_that_would_lose_precision_are_refused_not_rounded() {
    let h = harness(Downstream::default()).await;
    for big in ["1234567890123456789", "-1234567890123456789", "123456789012345678901234567890"] {
        let err = h.call(&format!("n{big}"), "send_all", &format!(r#"{{"requests":[],"id":{big}}}"#)).await.unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidArgs, "{big}: {err}");
        assert!(err.message.contains("`/id`") && err.message.contains("send it as a string"), "{}", err.message);
    }
    h.call("n-ok", "send_all", r#"{"requests":[],"id":9007199254740991}"#).await.expect("2^53 - 1 is exact");
    assert!(h.ledger().calls(None).unwrap().iter().all(|c| c.call_id == "n-ok"), "nothing recorded for the refused ones");
}

// --- Client → host: MCP principals, ids, /metrics ---

const TOKEN_A: &str = "token-of-principal-a-0123456789";
const TOKEN_B: &str = "token-of-principal-b-0123456789";

/// A refund host over MCP with two tokens (principals `a` and `b`) and a
/// budget of 2 irreversible calls per principal and hour.
fn two_principals() -> (tokio::runtime::Runtime, toolguard_sandbox::Sandbox, crate::common::Server, tempfile::TempDir) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let sandbox = rt.block_on(toolguard_sandbox::Sandbox::start("127.0.0.1:0", toolguard_sandbox::Mode::Stripe, toolguard_sandbox::DEFAULT_RETENTION)).unwrap();
    sandbox.add_payment_intent(crate::payments::PI, crate::payments::PI_AMOUNT);
    let dir = tempfile::tempdir().unwrap();
    let text = crate::payments::config_text(&sandbox.url(), &dir.path().join("data"), &Downstream::default())
        .replace("[policy.plugins.payments]\n", "[policy.plugins.payments]\nmax_irreversible_calls_per_principal_hour = 2\n");
    let text = format!("{text}\n[mcp]\ntokens = [{{ principal = \"a\", token_env = \"TG_A\" }}, {{ principal = \"b\", token_env = \"TG_B\" }}]\n");
    let path = dir.path().join("mcp.toml");
    std::fs::write(&path, text).unwrap();
    let server = crate::common::serve_http(&path, &[("TG_A", TOKEN_A), ("TG_B", TOKEN_B)]);
    (rt, sandbox, server, dir)
}

/// One `tools/call` of `refund` in a fresh MCP session (2025-11-25 handshake), as `token`'s holder.
async fn refund_as(url: &str, token: &str, session: &str, call_id: &str, amount: u64) -> Value {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::new();
    let post = |body: String, mcp_session: Option<String>| {
        let mut req = http
            .post(url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-11-25")
            .header("authorization", format!("Bearer {token}"))
            .body(body);
        if let Some(s) = mcp_session {
            req = req.header("mcp-session-id", s);
        }
        req.send()
    };
    let init =
        r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
    let response = post(init.into(), None).await.unwrap();
    let mcp_session = response.headers().get("mcp-session-id").map(|v| v.to_str().unwrap().to_string());
    response.bytes().await.unwrap();
    post(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#.into(), mcp_session.clone()).await.unwrap().bytes().await.unwrap();
    let args: Value = serde_json::from_str(&crate::payments::refund_args(amount)).unwrap();
    let call = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "refund", "arguments": args, "_meta": { "toolguard/toolCallId": call_id, "toolguard/sessionId": session } } });
    let text = post(call.to_string(), mcp_session).await.unwrap().text().await.unwrap();
    let data = text.lines().filter_map(|l| l.strip_prefix("data:")).map(str::trim).find(|d| !d.is_empty()).unwrap_or(&text).to_string();
    serde_json::from_str::<Value>(&data).unwrap_or_else(|e| panic!("{e}: {text}"))["result"].clone()
}

#[test]
fn each_token_is_its_own_principal_and_cannot_reach_anothers_sessions() {
    let (rt, sandbox, server, _dir) = two_principals();
    let first = rt.block_on(refund_as(&server.url, TOKEN_A, "conv-1", "c1", 500));
    assert_eq!(first["isError"], false, "{first}");
    // `b` names a's session and call id with other arguments: no conflict, so
    // nothing of a's call (its arguments) is shown; it is b's own call.
    let other = rt.block_on(refund_as(&server.url, TOKEN_B, "conv-1", "c1", 700));
    assert_eq!(other["isError"], false, "{other}");
    assert!(!other.to_string().contains("first_args"), "{other}");
    // And replaying a's call id as b is not a replay of a's result.
    let replay_as_b = rt.block_on(refund_as(&server.url, TOKEN_B, "conv-1", "c1", 700));
    assert_eq!(replay_as_b["structuredContent"], other["structuredContent"]);
    assert_ne!(other["structuredContent"]["refund_id"], first["structuredContent"]["refund_id"]);
    assert_eq!(sandbox.refunds().len(), 2);
}

#[test]
fn rotating_session_ids_does_not_escape_a_principals_budget() {
    let (rt, sandbox, server, _dir) = two_principals();
    for (i, session) in ["s1", "s2"].iter().enumerate() {
        let ok = rt.block_on(refund_as(&server.url, TOKEN_A, session, &format!("c{i}"), 100 + i as u64));
        assert_eq!(ok["isError"], false, "{ok}");
    }
    let third = rt.block_on(refund_as(&server.url, TOKEN_A, "s3", "c3", 103));
    assert_eq!(third["structuredContent"]["kind"], "denied", "{third}");
    assert!(third["structuredContent"]["message"].as_str().unwrap().contains("max_irreversible_calls_per_principal_hour"), "{third}");
    let other = rt.block_on(refund_as(&server.url, TOKEN_B, "s3", "c3", 104));
    assert_eq!(other["isError"], false, "another principal has its own budget: {other}");
    assert_eq!(sandbox.refunds().len(), 3);
}

#[test]
fn ids_that_could_steer_a_terminal_or_grow_the_ledger_are_refused() {
    let (rt, sandbox, server, _dir) = two_principals();
    for (session, call_id) in [("s", "c\u{1b}]0;pwned\u{7}"), ("s\u{9b}31m", "c"), ("s", &"x".repeat(300)), ("s", "c\u{202e}dnuf")] {
        let answer = rt.block_on(refund_as(&server.url, TOKEN_A, session, call_id, 100));
        assert_eq!(answer["structuredContent"]["kind"], "invalid-args", "{session:?} {call_id:?}: {answer}");
    }
    assert!(sandbox.requests().is_empty());
}

#[test]
fn metrics_need_the_token_and_a_served_host() {
    let (rt, _sandbox, server, _dir) = two_principals();
    let metrics = server.url.replace("/mcp", "/metrics");
    let get = |headers: &[(&str, &str)]| {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut req = reqwest::Client::new().get(&metrics);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        rt.block_on(req.send()).unwrap().status().as_u16()
    };
    assert_eq!(get(&[]), 401);
    let bearer = format!("Bearer {TOKEN_A}");
    assert_eq!(get(&[("Authorization", &bearer)]), 200);
    assert_eq!(get(&[("Authorization", &bearer), ("Host", "evil.example")]), 403, "DNS rebinding cannot read them either");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_cannot_slip_past_the_session_budget() {
    let h = std::sync::Arc::new(harness(Downstream { refunds_per_session_hour: 3, ..Downstream::default() }).await);
    let calls: Vec<_> = (0..12u64)
        .map(|i| {
            let h = h.clone();
            tokio::spawn(async move { h.refund(&format!("b{i}"), 100 + i).await })
        })
        .collect();
    let mut ran = 0;
    for call in calls {
        match call.await.unwrap() {
            Ok(_) => ran += 1,
            Err(e) => assert_eq!(e.kind, ErrorKind::Denied, "{e}"),
        }
    }
    assert_eq!((ran, h.refunds()), (3, 3), "exactly the budget, however the calls interleave");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hosts_on_one_ledger_spend_one_session_budget_together() {
    let ledger = crate::common::fresh_postgres_database();
    let sandbox = toolguard_sandbox::Sandbox::start("127.0.0.1:0", toolguard_sandbox::Mode::Stripe, toolguard_sandbox::DEFAULT_RETENTION).await.unwrap();
    sandbox.add_payment_intent(crate::payments::PI, crate::payments::PI_AMOUNT);
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let d = Downstream { refunds_per_session_hour: 3, ..Downstream::default() };
    let mut hosts = Vec::new();
    for dir in &dirs {
        let text = format!("ledger = {ledger:?}\n{}", crate::payments::config_text(&sandbox.url(), &dir.path().join("data"), &d));
        let config = toolguard::Config::parse(&text, "fleet.toml", dir.path()).unwrap();
        hosts.push(std::sync::Arc::new(toolguard::Runtime::from_config(&config).await.unwrap()));
    }
    let calls: Vec<_> = (0..10u64)
        .map(|i| {
            let host = hosts[i as usize % 2].clone();
            tokio::spawn(async move {
                let req = toolguard::CallRequest {
                    session: "s1".into(),
                    call_id: format!("b{i}"),
                    tool: "refund".into(),
                    args_json: crate::payments::refund_args(100 + i),
                    principal: None,
                    tenant: None,
                };
                host.call(&req).await
            })
        })
        .collect();
    let mut ran = 0;
    for call in calls {
        if call.await.unwrap().is_ok() {
            ran += 1;
        }
    }
    assert_eq!((ran, sandbox.refunds().len()), (3, 3));
}

#[test]
fn what_plugins_stored_cannot_steer_the_operators_terminal() {
    let w = World::new();
    // A plugin's request body (stored as sent) with an escape sequence and a C1 control.
    let body = format!("payment_intent={PI}&amount=47&note=\u{1b}]0;pwned\u{7}\u{9b}31m\u{202e}");
    let request = json!({ "method": "POST", "url": format!("{}/v1/refunds", w.sandbox.url()), "body": body });
    let out = rogue_call(&w, "esc", json!([request]), &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for args in [&["ledger", "show", "esc"][..], &["ledger", "export"], &["ledger", "list"]] {
        let out = w.toolguard(args);
        assert!(out.status.success(), "{args:?}");
        let text = String::from_utf8(out.stdout).unwrap();
        let raw: Vec<char> = text.chars().filter(|c| (c.is_control() && *c != '\n') || matches!(c, '\u{202a}'..='\u{202e}')).collect();
        assert!(raw.is_empty(), "{args:?} printed {raw:?}");
    }
    let shown = stdout_json(&w.toolguard(&["ledger", "show", "esc"]));
    assert!(
        shown[0]["attempts"][0]["request"]["body"]["text"].as_str().unwrap().contains("\u{1b}]0;pwned"),
        "escaped, not altered: the JSON value is the same"
    );
}
