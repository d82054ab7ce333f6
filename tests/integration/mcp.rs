//! `toolguard serve` against real MCP clients: the official conformance
//! suite (Node), the official Python SDK over stdio and HTTP (counting
//! refunds at the sandbox), stdio over a pipe, a socket and a file, stdio
//! given lines it cannot read, and the HTTP hardening.
//!
//! The external tools come from `./dev.sh test`, which installs them into a
//! cache and exports `TOOLGUARD_NODE`, `TOOLGUARD_CONFORMANCE`,
//! `TOOLGUARD_CONFORMANCE_2026` and `TOOLGUARD_PYTHON`.

use crate::common::{BIN, serve_http, shared_cache, wasm};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use toolguard_sandbox::config::{KEY_HEADER_ONLY, PaymentsConfig};
use toolguard_sandbox::{Mode, Sandbox};

fn tool(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| panic!("{var} is not set: run the tests with ./dev.sh test, which installs the MCP clients"))
}

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn conformance_config(dir: &Path) -> PathBuf {
    let text = format!(
        "data_dir = \"data\"\ncompile_cache = {:?}\n[plugins.conformance]\ncomponent = {:?}\nlimits = {{ wall_ms = 130000 }}\n[policy.plugins.conformance]\nask_client = [\"elicitation\", \"sampling\", \"roots\"]\n",
        shared_cache().display().to_string(),
        wasm("conformance").display().to_string()
    );
    write(dir, "conformance.toml", &text)
}

/// Runs one conformance suite against a fresh server; panics with its output unless it passes.
fn run_conformance(cli: &str, args: &[&str], baseline: &str) {
    let dir = tempfile::tempdir().unwrap();
    let server = serve_conformance_with(dir.path(), "");
    let out = Command::new(tool("TOOLGUARD_NODE"))
        .arg(cli)
        .args(["server", "--url", &server.url])
        .args(args)
        .arg("--expected-failures")
        .arg(repo(baseline))
        .arg("-o")
        .arg(dir.path().join("results"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "conformance failed:\n{text}");
    assert!(text.contains("Baseline check passed"), "{text}");
    // The suite's own baseline check lets a scenario with failed checks pass
    // when it also has passing ones; here every failing scenario must be excused.
    let excused = std::fs::read_to_string(repo(baseline)).unwrap();
    let excused: Vec<&str> = excused.lines().filter_map(|l| l.trim().strip_prefix("- ")).collect();
    for failed in text.lines().filter_map(|l| l.strip_prefix("✗ ")).filter_map(|l| l.split(':').next()) {
        assert!(excused.contains(&failed), "{failed} failed and {baseline} does not excuse it:\n{text}");
    }
    for must in ["server-initialize", "ping", "tools-list", "tools-call-simple-text", "tools-call-image", "tools-call-error", "dns-rebinding-protection"] {
        if text.contains(&format!("{must}:")) {
            assert!(text.contains(&format!("✓ {must}:")), "{must} must pass:\n{text}");
        }
    }
    println!("{}", text.lines().filter(|l| l.starts_with('✓') || l.starts_with('✗') || l.starts_with("Total")).collect::<Vec<_>>().join("\n"));
}

#[test]
fn conformance_2025_11_25_passes_with_only_unserved_features_in_the_baseline() {
    run_conformance(&tool("TOOLGUARD_CONFORMANCE"), &["--suite", "all"], "tests/conformance/baseline.yml");
}

#[test]
fn conformance_2026_07_28_passes_with_only_unserved_features_in_the_baseline() {
    run_conformance(&tool("TOOLGUARD_CONFORMANCE_2026"), &["--requirements", "2026-07-28"], "tests/conformance/baseline-2026-07-28.yml");
}

#[test]
fn the_baselines_hold_no_scenario_a_tool_host_must_serve() {
    for baseline in ["tests/conformance/baseline.yml", "tests/conformance/baseline-2026-07-28.yml"] {
        let text = std::fs::read_to_string(repo(baseline)).unwrap();
        let listed: Vec<&str> = text.lines().filter_map(|l| l.trim().strip_prefix("- ")).collect();
        assert!(!listed.is_empty());
        for served in [
            "server-initialize",
            "ping",
            "tools-list",
            "tools-call-simple-text",
            "tools-call-image",
            "tools-call-audio",
            "tools-call-embedded-resource",
            "tools-call-mixed-content",
            "tools-call-error",
            "json-schema-2020-12",
            "dns-rebinding-protection",
            "http-header-validation",
            "server-sse-multiple-streams",
            // Tasks backed by the ledger (docs/tasks.md).
            "tasks-lifecycle",
            "tasks-capability-negotiation",
            "tasks-wire-fields",
            "tasks-request-state-removal",
            "tasks-request-headers",
            // A tool's own questions (docs/questions.md).
            "tools-call-elicitation",
            "tools-call-sampling",
            "elicitation-sep1034-defaults",
            "elicitation-sep1330-enums",
            "input-required-result-basic-elicitation",
            "input-required-result-multi-round",
            "input-required-result-tampered-state",
            "tasks-mrtr-input",
            "tasks-mrtr-composition",
            "tasks-dispatch-and-envelope",
            "tasks-required-task-error",
        ] {
            assert!(!listed.contains(&served), "{baseline} must not excuse {served}");
        }
        // Every listed scenario sits under a comment that gives its reason.
        let mut reason = false;
        for line in text.lines().map(str::trim) {
            match line {
                l if l.starts_with('#') => reason = true,
                l if l.starts_with("- ") => assert!(reason, "{baseline}: `{l}` has no reason above it"),
                _ => reason = false,
            }
        }
    }
}

/// A sandbox and a refund host config for the Python client (key as a header only, so
/// reconciliation cannot settle a timeout and the hold rule has something to hold).
pub(crate) fn refund_world(dir: &Path) -> (tokio::runtime::Runtime, Sandbox, PathBuf) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let sandbox = rt.block_on(Sandbox::start("127.0.0.1:0", Mode::Stripe, toolguard_sandbox::DEFAULT_RETENTION)).unwrap();
    sandbox.add_payment_intent("pi_mcp", 100_000);
    let url = sandbox.url();
    let payments = PaymentsConfig {
        timeout_ms: Some(500),
        reconcile_ms: Some(200),
        key: KEY_HEADER_ONLY.into(),
        ..PaymentsConfig::new(&url, wasm("payments").display().to_string())
    };
    let text = format!("data_dir = \"data\"\ncompile_cache = {:?}\n{}", shared_cache().display().to_string(), payments.toml());
    let config = write(dir, "refunds.toml", &text);
    (rt, sandbox, config)
}

/// `serve --http` of refunds to a sandbox that waits up to 20 s for a held
/// answer, with `[mcp]` settings `mcp` (TOML lines) and environment `env`.
pub(crate) fn serve_patient_refunds(dir: &Path, mcp: &str, env: &[(&str, &str)]) -> (tokio::runtime::Runtime, Sandbox, crate::common::Server) {
    let (rt, sandbox, _) = refund_world(dir);
    let payments = PaymentsConfig { timeout_ms: Some(20_000), ..PaymentsConfig::new(sandbox.url(), wasm("payments").display().to_string()) };
    let text = format!("data_dir = \"data\"\ncompile_cache = {:?}\n{}\n[mcp]\n{mcp}\n", shared_cache().display().to_string(), payments.toml());
    let server = serve_http(&write(dir, "patient.toml", &text), env);
    (rt, sandbox, server)
}

/// Runs the Python client; its steps by name.
fn python_client(args: &[&str]) -> std::collections::BTreeMap<String, Value> {
    let out = Command::new(tool("TOOLGUARD_PYTHON")).arg(repo("tests/mcp/client.py")).args(args).output().unwrap();
    assert!(out.status.success(), "python client failed:\n{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .map(|v| (v["step"].as_str().unwrap().to_string(), v))
        .collect()
}

fn check_refund_scenario(steps: &std::collections::BTreeMap<String, Value>, sandbox: &Sandbox, era: &str) {
    let list = &steps["list"];
    assert_eq!(list["protocol"], era);
    assert_eq!(list["tools"]["refund"]["readOnlyHint"], false);
    assert_eq!(list["tools"]["refund"]["destructiveHint"], true);
    assert_eq!(list["tools"]["refund"]["idempotentHint"], false);
    assert_eq!(list["tools"]["refund_status"]["readOnlyHint"], true);
    let ok = |name: &str| {
        assert_eq!(steps[name]["is_error"], false, "{name}: {}", steps[name]);
        &steps[name]["structured"]
    };
    let error = |name: &str, kind: &str| {
        assert_eq!(steps[name]["is_error"], true, "{name}: {}", steps[name]);
        assert_eq!(steps[name]["structured"]["kind"], kind, "{name}: {}", steps[name]);
        steps[name]["text"].as_str().unwrap().to_string()
    };
    assert_eq!(ok("first")["status"], "succeeded");
    assert!(error("no-id", "invalid-args").contains("toolguard/toolCallId"));
    assert!(error("timeout", "outcome-unknown").contains("refund_status"));
    // call-B has the same arguments as call-A: it runs only because call-A's
    // answer was recorded as delivered when the response was written.
    let held = error("blind-repeat", "held");
    assert!(held.contains("call-B") && held.contains("Nothing new was sent"), "{held}");
    let earlier = &steps["blind-repeat"]["structured"]["detail"]["earlier_outcome"];
    let retried = ok("retry").clone();
    assert_eq!(earlier["sends"][0]["body"]["id"], retried["refund_id"], "the held answer carries call-B's refund: {earlier}");
    assert_eq!(ok("replay"), &retried, "the replay returns the same refund");
    assert_eq!(steps["replay"]["meta"]["toolguard/replayed"], true);
    error("blind-repeat-again", "held");
    assert_eq!(steps["blind-repeat-again"]["structured"]["detail"]["earlier_outcome"], *earlier);
    assert_ne!(ok("repeat-after-resolution")["refund_id"], retried["refund_id"], "a deliberate repeat once told");
    assert_eq!(ok("status")["refunds"].as_array().unwrap().len(), 3);
    // At the provider: call-A, call-B (once, despite its timeout, the repeat and the retries), call-D.
    assert_eq!(sandbox.refunds().len(), 3);
    let b_posts: Vec<_> = sandbox.requests().into_iter().filter(|r| r.method == "POST").map(|r| r.idempotency_key).collect();
    assert_eq!(b_posts.len(), 4, "A, B, B re-sent with its key before answering call-C, D: {b_posts:?}");
    assert_eq!(b_posts[1], b_posts[2]);
}

#[test]
fn the_python_sdk_over_stdio_in_the_2026_era() {
    let dir = tempfile::tempdir().unwrap();
    let (_rt, sandbox, config) = refund_world(dir.path());
    let steps = python_client(&["stdio", config.to_str().unwrap(), BIN, "auto", &sandbox.url()]);
    check_refund_scenario(&steps, &sandbox, "2026-07-28");
}

#[test]
fn the_python_sdk_over_http_in_the_2025_era() {
    let dir = tempfile::tempdir().unwrap();
    let (_rt, sandbox, config) = refund_world(dir.path());
    let server = serve_http(&config, &[]);
    let steps = python_client(&["http", &server.url, "legacy", &sandbox.url()]);
    check_refund_scenario(&steps, &sandbox, "2025-11-25");
}

/// POSTs `body` to the MCP endpoint with extra headers; the status code.
fn post(url: &str, headers: &[(&str, &str)], body: String) -> u16 {
    send(url, headers, body).0
}

/// POSTs `body` to the MCP endpoint with extra headers; the status, headers and body.
pub(crate) fn send(url: &str, headers: &[(&str, &str)], body: String) -> (u16, reqwest::header::HeaderMap, String) {
    try_send(url, headers, body).unwrap_or_else(|e| panic!("{e}"))
}

/// [`send`], or why no whole answer came (the connection failed or was cut).
pub(crate) fn try_send(url: &str, headers: &[(&str, &str)], body: String) -> Result<(u16, reqwest::header::HeaderMap, String), String> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut req =
            reqwest::Client::new().post(url).header("Content-Type", "application/json").header("Accept", "application/json, text/event-stream").body(body);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        // A response that never comes fails the test instead of hanging it.
        let answered = async {
            let response = req.send().await.map_err(|e| e.to_string())?;
            let (status, headers) = (response.status().as_u16(), response.headers().clone());
            Ok((status, headers, response.text().await.map_err(|e| e.to_string())?))
        };
        tokio::time::timeout(std::time::Duration::from_secs(120), answered).await.map_err(|_| "no whole answer in 120 s".to_string())?
    })
}

const INITIALIZE: &str =
    r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;

/// The headers of a request in session `id` (2025-11-25).
pub(crate) fn in_session(id: &str) -> [(&str, &str); 2] {
    [("Mcp-Session-Id", id), ("MCP-Protocol-Version", "2025-11-25")]
}

/// A `tools/call` of `refund` (JSON-RPC id `id`) of `amount` cents of
/// `pi_mcp`, as tool call `call_id` of conversation `conv`.
pub(crate) fn refund_request(id: u64, call_id: &str, amount: u64) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"refund","arguments":{{"payment_intent":"pi_mcp","amount_cents":{amount},"reason":"duplicate"}},"_meta":{{"toolguard/toolCallId":"{call_id}","toolguard/sessionId":"conv"}}}}}}"#
    )
}

/// A new session at the MCP endpoint `url`, initialized: its id.
fn open_session(url: &str) -> String {
    open_session_with(url, &[])
}

/// [`open_session`], each request with the extra headers `with` (a token).
pub(crate) fn open_session_with(url: &str, with: &[(&str, &str)]) -> String {
    let (status, headers, body) = send(url, with, INITIALIZE.into());
    assert_eq!(status, 200, "{body}");
    let id = headers.get("mcp-session-id").expect("a session id").to_str().unwrap().to_string();
    let initialized = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    assert_eq!(send(url, &[&in_session(&id)[..], with].concat(), initialized.into()).0, 202);
    id
}

/// `serve --http` on the conformance fixture with `[mcp]` settings `mcp`
/// (TOML lines) besides those the suite needs: its clients send no
/// tool-call id, and its task-supporting tools answer with a task at once
/// (two of them only as tasks).
fn serve_conformance_with(dir: &Path, mcp: &str) -> crate::common::Server {
    let suite = "missing_call_id = \"derive-from-arguments\"\ntask_after_ms = 0\ntasks_required = [\"failing_job\", \"test_tool_with_task\"]\n";
    let text = format!("{}[mcp]\n{suite}{mcp}", std::fs::read_to_string(conformance_config(dir)).unwrap());
    serve_http(&write(dir, "mcp.toml", &text), &[])
}

#[test]
fn http_is_hardened() {
    let dir = tempfile::tempdir().unwrap();
    let mut text = std::fs::read_to_string(conformance_config(dir.path())).unwrap();
    text.push_str("[mcp]\ntoken_env = \"TG_TEST_TOKEN\"\nmax_request_bytes = 4096\n");
    let config = write(dir.path(), "hardened.toml", &text);

    // Beyond loopback without allowed hosts: refused at start.
    let out = Command::new(BIN)
        .args(["serve", "--config", config.to_str().unwrap(), "--http", "0.0.0.0:0"])
        .env("TG_TEST_TOKEN", "t0ken-long-enough-16")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("allowed_hosts"), "{}", String::from_utf8_lossy(&out.stderr));
    let plain = write(dir.path(), "plain.toml", &std::fs::read_to_string(conformance_config(dir.path())).unwrap());
    let out = Command::new(BIN).args(["serve", "--config", plain.to_str().unwrap(), "--http", "0.0.0.0:0"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("needs client authentication"), "{}", String::from_utf8_lossy(&out.stderr));

    let server = serve_http(&config, &[("TG_TEST_TOKEN", "t0ken-long-enough-16")]);
    assert_eq!(post(&server.url, &[], INITIALIZE.into()), 401, "no token");
    assert_eq!(post(&server.url, &[("Authorization", "Bearer wrong")], INITIALIZE.into()), 401, "wrong token");
    assert_eq!(post(&server.url, &[("Authorization", "Bearer t0ken-long-enough-16")], INITIALIZE.into()), 200);
    let rebinding = post(&server.url, &[("Authorization", "Bearer t0ken-long-enough-16"), ("Host", "evil.example:80")], INITIALIZE.into());
    assert!(rebinding == 403 || rebinding == 421 || rebinding == 400, "a foreign Host is refused: {rebinding}");
    let huge = INITIALIZE.replace("\"t\",", &format!("\"{}\",", "x".repeat(8_000)));
    assert_eq!(post(&server.url, &[("Authorization", "Bearer t0ken-long-enough-16")], huge), 413, "bodies over max_request_bytes");
}

/// A client looping on `initialize` cannot hold the server's memory: past
/// `[mcp] max_sessions` a new session closes the oldest, whose client gets
/// 404 (and, as the protocol says, starts a new one), while the others and
/// the new one serve.
#[test]
fn http_sessions_are_capped_by_closing_the_oldest() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve_conformance_with(dir.path(), "max_sessions = 3\n");
    let open = || open_session(&server.url);
    // Asked for the tools: the status of the list.
    let list = |id: &str| {
        let (status, _, body) = send(&server.url, &in_session(id), r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#.into());
        assert!(status != 200 || body.contains("\"tools\""), "{status}: {body}");
        status
    };
    let ids: Vec<String> = (0..4).map(|_| open()).collect();
    assert_eq!(list(&ids[0]), 404, "the oldest session was closed for the fourth");
    for id in &ids[1..] {
        assert_eq!(list(id), 200, "the others serve");
    }
    let again = open();
    assert_eq!(list(&again), 200, "its client starts a new one");
    assert_eq!(list(&ids[1]), 404, "which closes the next oldest");
}

/// One token holder looping on `initialize` closes only its own sessions:
/// past `[mcp] max_sessions_per_principal` its own oldest, never another
/// principal's (the global cap alone once closed the oldest, whoever's).
#[test]
fn a_principal_looping_on_initialize_closes_only_its_own_sessions() {
    const ALICE: &str = "alice-token-long-enough";
    const MALLORY: &str = "mallory-token-long-enough";
    let dir = tempfile::tempdir().unwrap();
    let tokens = r#"tokens = [{ principal = "alice", token_env = "TG_ALICE" }, { principal = "mallory", token_env = "TG_MALLORY" }]"#;
    let text =
        format!("{}[mcp]\nmax_sessions = 6\nmax_sessions_per_principal = 2\n{tokens}\n", std::fs::read_to_string(conformance_config(dir.path())).unwrap());
    let server = serve_http(&write(dir.path(), "principals.toml", &text), &[("TG_ALICE", ALICE), ("TG_MALLORY", MALLORY)]);
    let open = |token: &str| open_session_with(&server.url, &[("Authorization", &format!("Bearer {token}"))]);
    let list = |token: &str, id: &str| {
        let auth = format!("Bearer {token}");
        let [a, b] = in_session(id);
        send(&server.url, &[a, b, ("Authorization", &auth)], r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#.into()).0
    };
    let alice = open(ALICE);
    let flood: Vec<String> = (0..20).map(|_| open(MALLORY)).collect();
    assert_eq!(list(ALICE, &alice), 200, "another principal's loop closed none of alice's sessions");
    assert_eq!((list(MALLORY, &flood[19]), list(MALLORY, &flood[18])), (200, 200), "mallory keeps its newest two");
    assert_eq!(list(MALLORY, &flood[17]), 404, "and its older ones were closed for them");
}

/// One token holder's slow calls cannot queue another's behind them: past
/// `[mcp] max_calls_per_principal` (2 here) its next call is answered `busy`
/// at once and never reaches the provider, while another principal's call
/// runs; retried under its id once a place is free, it refunds once.
#[test]
fn a_principal_at_its_call_cap_is_told_busy_and_another_principal_is_served() {
    use toolguard_sandbox::Fault;
    const ALICE: &str = "alice-token-long-enough";
    const MALLORY: &str = "mallory-token-long-enough";
    let dir = tempfile::tempdir().unwrap();
    let tokens = r#"tokens = [{ principal = "alice", token_env = "TG_ALICE" }, { principal = "mallory", token_env = "TG_MALLORY" }]"#;
    let mcp = format!("max_calls_per_principal = 2\n{tokens}");
    let (_rt, sandbox, server) = serve_patient_refunds(dir.path(), &mcp, &[("TG_ALICE", ALICE), ("TG_MALLORY", MALLORY)]);
    let sessions = [ALICE, MALLORY].map(|token| open_session_with(&server.url, &[("Authorization", &format!("Bearer {token}"))]));
    let refund = |token: &str, call_id: &str, amount: u64| {
        let (auth, session) = (format!("Bearer {token}"), if token == ALICE { &sessions[0] } else { &sessions[1] });
        // JSON-RPC ids differ within a session (two calls in flight answer on their own streams).
        send(&server.url, &[&in_session(session)[..], &[("Authorization", auth.as_str())]].concat(), refund_request(amount, call_id, amount)).2
    };
    let posts = || sandbox.requests().iter().filter(|r| r.method == "POST").count();
    sandbox.inject(Fault::PauseAfterCommit);
    sandbox.inject(Fault::PauseAfterCommit);
    std::thread::scope(|scope| {
        let slow = [("m1", 101), ("m2", 102)].map(|(id, amount)| scope.spawn(move || refund(MALLORY, id, amount)));
        assert!(crate::world::wait_for(std::time::Duration::from_secs(20), || sandbox.paused() == 2), "mallory's two refunds reached the provider");
        let third = refund(MALLORY, "m3", 103);
        assert!(third.contains(r#""kind":"busy""#), "mallory's third call is refused at once: {third}");
        assert_eq!(posts(), 2, "and it never reached the provider");
        let alice = refund(ALICE, "a1", 201);
        assert!(alice.contains("refund_id"), "alice is served while mallory's calls hang: {alice}");
        assert!(alice.contains(r#""toolguard/toolCallId":"a1""#), "the result names the tool call it answers: {alice}");
        sandbox.release();
        for call in slow {
            let answered = call.join().unwrap();
            assert!(answered.contains("refund_id"), "{answered}");
        }
    });
    let again = refund(MALLORY, "m3", 103);
    assert!(again.contains("refund_id"), "the refused call, retried under its id, runs: {again}");
    let mut amounts: Vec<u64> = sandbox.refunds().iter().map(|r| r.amount).collect();
    amounts.sort_unstable();
    assert_eq!(amounts, [101, 102, 103, 201], "one refund per call, none for the refusal");
}

/// A refund in flight in a session that is closed to make room for another
/// still happens once, and its answer, never delivered, counts as not
/// told: a repeat of it in the new session is held and carries its refund.
#[test]
fn a_refund_in_flight_when_its_session_is_closed_is_held_with_its_refund_on_repeat() {
    use toolguard_sandbox::Fault;
    let dir = tempfile::tempdir().unwrap();
    let (_rt, sandbox, server) = serve_patient_refunds(dir.path(), "max_sessions = 1", &[]);
    let open = || open_session(&server.url);
    let refund = |session: &str, call_id: &str| send(&server.url, &in_session(session), refund_request(7, call_id, 500)).2;
    let first = open();
    sandbox.inject(Fault::PauseAfterCommit);
    let in_flight = std::thread::scope(|scope| {
        let call = scope.spawn(|| refund(&first, "a1"));
        assert!(crate::world::wait_for(std::time::Duration::from_secs(20), || sandbox.paused() == 1), "the refund reached the provider");
        let second = open();
        sandbox.release();
        (call.join().unwrap(), second)
    });
    let (answered, second) = in_flight;
    assert!(!answered.contains("refund_id"), "the closed session's client heard nothing: {answered}");
    let made: Vec<String> = sandbox.refunds().iter().map(|r| r.id.clone()).collect();
    assert_eq!(made.len(), 1);
    let repeat = refund(&second, "b1");
    assert!(repeat.contains(r#""kind":"held""#) && repeat.contains(&made[0]), "held, with the first call's refund: {repeat}");
    assert_eq!(sandbox.refunds().len(), 1, "nothing new was refunded");
}

/// A server of two connections at most, two clients that each send it
/// `sent` and then nothing, and a third client's `initialize`, which must
/// be served (once the server has cut a slow client off); the server and
/// the slow clients' connections.
fn served_after_two_slow_clients(dir: &Path, sent: &str) -> (crate::common::Server, Vec<std::net::TcpStream>) {
    use std::io::Write;
    let server = serve_conformance_with(dir, "max_connections = 2\n");
    let addr = server.url.trim_start_matches("http://").split('/').next().unwrap().to_string();
    let slow: Vec<std::net::TcpStream> = (0..2)
        .map(|_| {
            let mut tcp = std::net::TcpStream::connect(&addr).unwrap();
            tcp.write_all(sent.as_bytes()).unwrap();
            tcp
        })
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(post(&server.url, &[], INITIALIZE.into()), 200, "the waiting client is served");
    (server, slow)
}

/// Slow clients cannot hold the server: at `[mcp] max_connections` (2
/// here) a new connection waits, a client that trickles its headers is cut
/// off after the header timeout, and the waiting client is then served.
#[test]
fn http_connections_are_capped_and_slow_headers_time_out() {
    use std::io::Read;
    let dir = tempfile::tempdir().unwrap();
    // Two connections that send half a request's headers and then nothing.
    let (_server, slow) = served_after_two_slow_clients(dir.path(), "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n");
    // The server closes a slow connection before it takes the waiting one,
    // and on loopback the close reaches the client at once: by the time the
    // answer is here, a slow client's socket already reads its end. (Read
    // now, without waiting: which thread the OS ran first proves nothing.)
    let closed = |mut tcp: &std::net::TcpStream| {
        tcp.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 256];
        loop {
            match tcp.read(&mut buf) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e) => return e.kind() != std::io::ErrorKind::WouldBlock,
            }
        }
    };
    assert!(slow.iter().filter(|tcp| closed(tcp)).count() >= 1, "it was served once a slow client was cut off, not before");
}

/// Clients that send a request's headers whole and then trickle its body
/// cannot hold the server either: each has ten seconds to send the body,
/// is then answered 408 and cut off, and the waiting client is served.
#[test]
fn http_slow_bodies_time_out() {
    use std::io::Read;
    let dir = tempfile::tempdir().unwrap();
    // Two connections that promise a body of 1,000 bytes and send ten.
    let head = "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
                Accept: application/json, text/event-stream\r\nContent-Length: 1000\r\n\r\n{\"jsonrpc\"";
    let (_server, slow) = served_after_two_slow_clients(dir.path(), head);
    for mut tcp in slow {
        tcp.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
        let mut answer = String::new();
        let _ = tcp.read_to_string(&mut answer);
        assert!(answer.starts_with("HTTP/1.1 408"), "a slow body is answered 408 and its connection closed: {answer:?}");
    }
}

/// A host allowed few open files serves at most half as many connections
/// (the ledger needs the rest): a crowd of idle connections waits to be
/// accepted instead of running the process out of descriptors.
#[test]
fn http_connections_stay_within_half_the_open_file_limit() {
    use std::io::BufRead as _;
    use std::os::unix::process::CommandExt as _;
    let dir = tempfile::tempdir().unwrap();
    let config = conformance_config(dir.path());
    let mut command = Command::new(BIN);
    command.args(["serve", "--config", config.to_str().unwrap(), "--http", "127.0.0.1:0"]).current_dir(dir.path());
    command.env("TOOLGUARD_LOG", "warn").stderr(std::process::Stdio::piped());
    // SAFETY: only setrlimit, which is async-signal-safe, between fork and exec.
    unsafe {
        command.pre_exec(|| {
            let limit = libc::rlimit { rlim_cur: 128, rlim_max: 128 };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
        });
    }
    let mut child = command.spawn().unwrap();
    let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let url = lines.by_ref().map(Result::unwrap).find_map(|l| l.strip_prefix("toolguard: MCP on ").map(str::to_string)).expect("serve started");
    let addr = url.trim_start_matches("http://").split('/').next().unwrap().to_string();
    let idle: Vec<_> = (0..120).map(|_| std::net::TcpStream::connect(&addr).unwrap()).collect();
    std::thread::sleep(std::time::Duration::from_millis(500));
    let open = std::fs::read_dir(format!("/proc/{}/fd", child.id())).unwrap().count();
    drop(idle);
    let _ = child.kill();
    let _ = child.wait();
    let said: Vec<String> = lines.map_while(Result::ok).collect();
    assert!(!said.iter().any(|l| l.contains("accepting an MCP connection failed")), "it ran out of descriptors: {said:?}");
    assert!(open < 128, "{open} descriptors open");
}

/// The JSON-RPC lines a client sends to list the tools: initialize, initialized, tools/list.
const LIST_TOOLS: &str = concat!(
    r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
    "\n",
    r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
    "\n",
    r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
    "\n"
);

/// Reads `serve`'s stdout until the answer to id 2; the tool names it lists.
fn listed_tools(stdout: impl std::io::Read) -> Vec<String> {
    use std::io::BufRead;
    for line in std::io::BufReader::new(stdout).lines() {
        let v: Value = serde_json::from_str(&line.unwrap()).unwrap();
        if v["id"] == 2 {
            return v["result"]["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap().to_string()).collect();
        }
    }
    panic!("serve closed stdout before answering tools/list")
}

#[test]
fn stdio_serves_a_pipe_a_socket_and_a_file_alike() {
    use std::io::Write;
    use std::process::Stdio;
    let dir = tempfile::tempdir().unwrap();
    let config = conformance_config(dir.path());
    let serve = || {
        let mut command = Command::new(BIN);
        command.args(["serve", "--config", config.to_str().unwrap()]).current_dir(dir.path()).stderr(Stdio::null());
        command
    };
    // Pipes (what Python's and most clients' spawn gives): the non-blocking transport.
    let mut child = serve().stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    child.stdin.as_mut().unwrap().write_all(LIST_TOOLS.as_bytes()).unwrap();
    let piped = listed_tools(child.stdout.take().unwrap());
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
    assert!(!piped.is_empty(), "{piped:?}");
    // A socket pair (what Node's libuv spawn gives): the blocking fallback.
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    let mut child = serve()
        .stdin(Stdio::from(std::os::fd::OwnedFd::from(theirs.try_clone().unwrap())))
        .stdout(Stdio::from(std::os::fd::OwnedFd::from(theirs)))
        .spawn()
        .unwrap();
    (&ours).write_all(LIST_TOOLS.as_bytes()).unwrap();
    assert_eq!(listed_tools(&ours), piped);
    ours.shutdown(std::net::Shutdown::Both).unwrap();
    assert!(child.wait().unwrap().success());
    // A regular file as stdin: every request at once, then end of input.
    let requests = write(dir.path(), "requests.jsonl", LIST_TOOLS);
    let out = serve().stdin(std::fs::File::open(requests).unwrap()).stdout(Stdio::piped()).output().unwrap();
    assert_eq!(listed_tools(&out.stdout[..]), piped);
}

/// `toolguard serve` over stdio on `config`, in `dir`, its stdin and stdout piped.
fn serve_piped(config: &Path, dir: &Path) -> std::process::Child {
    use std::process::Stdio;
    let mut command = Command::new(BIN);
    command.args(["serve", "--config", config.to_str().unwrap()]).current_dir(dir);
    command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap()
}

/// A stdio client that writes lines the server cannot read as JSON gets
/// no answer to them (rmcp and the official SDKs ignore unparsable input:
/// there is no id to answer), one whose JSON is not a JSON-RPC message gets
/// Invalid Request, and the server goes on answering the next request.
#[test]
fn stdio_ignores_unreadable_lines_refuses_malformed_messages_and_goes_on() {
    use std::io::{BufRead, Write};
    let dir = tempfile::tempdir().unwrap();
    let config = conformance_config(dir.path());
    let mut child = serve_piped(&config, dir.path());
    let deep = format!(r#"{{"jsonrpc":"2.0","id":3,"method":"tools/list","params":{{"x":{}{}}}}}"#, "[".repeat(200), "]".repeat(200));
    let surrogate = r#"{"jsonrpc":"2.0","id":4,"method":"tools/list","params":{"x":"\udc00"}}"#;
    let wrong_shape = r#"{"jsonrpc":"2.0","id":5,"method":{}}"#;
    let (handshake, list) = LIST_TOOLS.split_at(LIST_TOOLS.find(r#"{"jsonrpc":"2.0","id":2"#).unwrap());
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(handshake.as_bytes()).unwrap();
    for line in ["not json at all", &deep, surrogate, wrong_shape] {
        writeln!(stdin, "{line}").unwrap();
    }
    stdin.write_all(list.as_bytes()).unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut answers: Vec<Value> = Vec::new();
    while !answers.iter().any(|a| a["id"] == 2) {
        let line = lines.next().expect("serve closed stdout before answering tools/list").unwrap();
        answers.push(serde_json::from_str(&line).unwrap());
    }
    drop(stdin);
    answers.extend(lines.map(|l| serde_json::from_str::<Value>(&l.unwrap()).unwrap()));
    assert!(child.wait().unwrap().success());
    assert!(answers.iter().any(|a| a["id"] == 2 && a["result"]["tools"].is_array()), "the server went on: {answers:?}");
    assert!(!answers.iter().any(|a| a["id"] == 3 || a["id"] == 4), "unreadable lines are not answered: {answers:?}");
    assert!(answers.iter().any(|a| a["id"].is_null() && a["error"]["code"] == -32600), "the wrong shape is Invalid Request: {answers:?}");
}

#[test]
fn stdio_runs_one_async_worker_unless_told_otherwise() {
    use std::io::Write;
    use std::process::Stdio;
    let dir = tempfile::tempdir().unwrap();
    let config = conformance_config(dir.path());
    for (extra, expected) in [(&[][..], 1), (&["--workers", "3"][..], 3)] {
        let mut child = Command::new(BIN)
            .args(["serve", "--config", config.to_str().unwrap()])
            .args(extra)
            .current_dir(dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.as_mut().unwrap().write_all(LIST_TOOLS.as_bytes()).unwrap();
        assert!(!listed_tools(child.stdout.take().unwrap()).is_empty());
        let said = std::io::BufRead::lines(std::io::BufReader::new(child.stderr.take().unwrap())).next().unwrap().unwrap();
        assert_eq!(said, format!("toolguard: MCP on stdio, {expected} async worker(s)"), "serve {extra:?}");
        drop(child.stdin.take());
        assert!(child.wait().unwrap().success());
    }
}

#[test]
fn on_one_worker_a_spinning_plugin_does_not_hold_up_another_call() {
    use std::io::{BufRead, Write};
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "data_dir = \"data\"\ncompile_cache = {:?}\n[plugins.text-stats]\ncomponent = \"builtin:text-stats\"\n\
         [plugins.misbehave]\ncomponent = {:?}\n[plugins.misbehave.limits]\ncpu_ms = 3000\n\
         [policy.plugins.text-stats.tools]\ntext_stats = {{ effect = \"read-only\" }}\n[policy.plugins.misbehave]\n",
        shared_cache().display().to_string(),
        wasm("misbehave").display().to_string()
    );
    let config = write(dir.path(), "spin.toml", &text);
    let mut child = serve_piped(&config, dir.path());
    let call = |id: u32, tool: &str, args: &str| {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"{tool}","arguments":{args},"_meta":{{"toolguard/toolCallId":"c{id}"}}}}}}"#
        )
    };
    let requests = [LIST_TOOLS.to_string(), call(10, "spin", "{}"), call(11, "text_stats", r#"{"text":"one two"}"#)].join("\n");
    child.stdin.as_mut().unwrap().write_all(format!("{requests}\n").as_bytes()).unwrap();
    // Answers in the order they come: the text call's before the spin's, which ends at its CPU budget.
    let mut answered = Vec::new();
    for line in std::io::BufReader::new(child.stdout.take().unwrap()).lines() {
        let v: Value = serde_json::from_str(&line.unwrap()).unwrap();
        if let Some(id @ (10 | 11)) = v["id"].as_u64() {
            answered.push((id, v["result"]["isError"].as_bool()));
            if answered.len() == 2 {
                break;
            }
        }
    }
    assert_eq!(answered, [(11, Some(false)), (10, Some(true))], "the spin held up the text call");
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
}

/// A client that sends a second request under a JSON-RPC id still in
/// flight in its session (the protocol forbids it) is refused at once with
/// a clear error, and its first request is answered as if the second had
/// never come: one refund, on the first request's own stream. Once that is
/// answered, the id may be used again.
#[test]
fn a_request_reusing_an_id_still_in_flight_is_refused_and_the_first_is_answered() {
    use toolguard_sandbox::Fault;
    let dir = tempfile::tempdir().unwrap();
    let (_rt, sandbox, server) = serve_patient_refunds(dir.path(), "", &[]);
    let session = open_session(&server.url);
    let refund = |call_id: &str, amount: u64| send(&server.url, &in_session(&session), refund_request(7, call_id, amount));
    sandbox.inject(Fault::PauseAfterCommit);
    std::thread::scope(|scope| {
        let first = scope.spawn(|| refund("a1", 301));
        assert!(crate::world::wait_for(std::time::Duration::from_secs(20), || sandbox.paused() == 1), "the first refund reached the provider");
        let (status, _, body) = refund("b1", 302);
        assert_eq!(status, 409, "the second request under id 7 is refused: {body}");
        assert!(body.contains("request id 7 is already in flight") && body.contains("\"id\":null"), "with a JSON-RPC error naming the id: {body}");
        assert_eq!(sandbox.requests().iter().filter(|r| r.method == "POST").count(), 1, "and it never reached the provider");
        sandbox.release();
        let (status, _, answered) = first.join().unwrap();
        assert_eq!(status, 200);
        assert!(answered.contains("refund_id") && answered.contains(r#""toolguard/toolCallId":"a1""#), "the first is answered on its own stream: {answered}");
    });
    let (_, _, again) = refund("b1", 302);
    assert!(again.contains("refund_id"), "id 7, free again, serves the refused call: {again}");
    let mut amounts: Vec<u64> = sandbox.refunds().iter().map(|r| r.amount).collect();
    amounts.sort_unstable();
    assert_eq!(amounts, [301, 302], "one refund per tool call");
}

/// A client that cancels a refund in flight (`notifications/cancelled`, as
/// the SDKs send when their request times out) cannot make it happen twice
/// nor be told of it wrongly: the call runs to its end (stopping a send on
/// the wire would leave its outcome unknown), once; its response is not
/// sent, so it counts as not told — a blind repeat under a new tool-call id
/// is held and carries its refund, and a retry of the cancelled tool-call
/// id replays it.
#[test]
fn a_cancelled_refund_runs_once_untold_and_its_repeat_is_held_with_its_refund() {
    use std::io::{BufRead, Write};
    use toolguard_sandbox::Fault;
    let dir = tempfile::tempdir().unwrap();
    let (_rt, sandbox, _) = refund_world(dir.path());
    let payments = PaymentsConfig { timeout_ms: Some(20_000), ..PaymentsConfig::new(sandbox.url(), wasm("payments").display().to_string()) };
    let text = format!("data_dir = \"data\"\ncompile_cache = {:?}\n{}", shared_cache().display().to_string(), payments.toml());
    let mut child = serve_piped(&write(dir.path(), "cancel.toml", &text), dir.path());
    let mut stdin = child.stdin.take().unwrap();
    let (handshake, _) = LIST_TOOLS.split_at(LIST_TOOLS.find(r#"{"jsonrpc":"2.0","id":2"#).unwrap());
    stdin.write_all(handshake.as_bytes()).unwrap();
    let (tx, answers) = std::sync::mpsc::channel::<Value>();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(serde_json::from_str(&line).unwrap());
        }
    });
    // The answer to request `id`, and every other message that came before it.
    let answer_to = |id: u64| {
        let mut before = Vec::new();
        loop {
            let message = answers.recv_timeout(std::time::Duration::from_secs(60)).expect("an answer within 60 s");
            if message["id"] == id {
                return (message, before);
            }
            before.push(message);
        }
    };
    answer_to(1);
    sandbox.inject(Fault::PauseAfterCommit);
    writeln!(stdin, "{}", refund_request(5, "c1", 401)).unwrap();
    assert!(crate::world::wait_for(std::time::Duration::from_secs(20), || sandbox.paused() == 1), "the refund reached the provider");
    writeln!(stdin, r#"{{"jsonrpc":"2.0","method":"notifications/cancelled","params":{{"requestId":5,"reason":"timed out"}}}}"#).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    sandbox.release();
    assert!(crate::world::wait_for(std::time::Duration::from_secs(20), || sandbox.refunds().len() == 1), "the cancelled call ran to its end");
    let made = sandbox.refunds()[0].id.clone();

    writeln!(stdin, "{}", refund_request(6, "c2", 401)).unwrap();
    let (repeat, before) = answer_to(6);
    let repeat = repeat.to_string();
    assert!(repeat.contains(r#""kind":"held""#), "the blind repeat is held: {repeat}");
    assert!(repeat.contains(&made), "and carries the cancelled call's refund: {repeat}");
    writeln!(stdin, "{}", refund_request(7, "c1", 401)).unwrap();
    let (retry, more) = answer_to(7);
    assert!(retry.to_string().contains(&made), "a retry of the cancelled tool call replays its refund: {retry}");
    assert!(before.iter().chain(&more).all(|m| m["id"] != 5), "the cancelled request got no answer: {before:?} {more:?}");
    assert_eq!(sandbox.refunds().len(), 1, "one refund in all");
    drop(stdin);
    let _ = child.wait();
}

/// The same over HTTP: the cancelled request's stream ends at once without
/// an answer, the call runs once, and a blind repeat is held with its refund.
#[test]
fn a_refund_cancelled_over_http_runs_once_and_its_repeat_is_held_with_its_refund() {
    use toolguard_sandbox::Fault;
    let dir = tempfile::tempdir().unwrap();
    let (_rt, sandbox, server) = serve_patient_refunds(dir.path(), "", &[]);
    let session = open_session(&server.url);
    sandbox.inject(Fault::PauseAfterCommit);
    std::thread::scope(|scope| {
        let first = scope.spawn(|| send(&server.url, &in_session(&session), refund_request(5, "h1", 402)));
        assert!(crate::world::wait_for(std::time::Duration::from_secs(20), || sandbox.paused() == 1), "the refund reached the provider");
        let cancel = r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":5,"reason":"timed out"}}"#;
        assert_eq!(post(&server.url, &in_session(&session), cancel.into()), 202);
        let (_, _, told) = first.join().unwrap();
        assert!(!told.contains("\"result\""), "the cancelled request's stream ended without an answer: {told}");
        sandbox.release();
    });
    assert!(crate::world::wait_for(std::time::Duration::from_secs(20), || sandbox.refunds().len() == 1), "the cancelled call ran to its end");
    let repeat = send(&server.url, &in_session(&session), refund_request(6, "h2", 402)).2;
    assert!(repeat.contains(r#""kind":"held""#) && repeat.contains(&sandbox.refunds()[0].id), "held, with the refund: {repeat}");
    assert_eq!(sandbox.refunds().len(), 1, "one refund in all");
}
