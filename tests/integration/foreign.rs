//! Plugins in Python and JavaScript, built with their languages' standard
//! toolchains and no flags (plugins/build-foreign.sh, run by dev.sh), made
//! loadable with `toolguard seal`, and run through the real binary under the
//! same guarantees as the Rust plugins — counted at the sandbox, or at a
//! listener that must never see a connection.

use crate::common::{BIN, Mcp, serve_http, shared_cache, stdout_json};
use crate::payments::Downstream;
use crate::world::{PI, World};
use serde_json::{Value, json};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use toolguard_sandbox::Fault;

/// A plugin as its toolchain built it (unsealed).
fn built(name: &str) -> PathBuf {
    let dir = std::env::var("TOOLGUARD_FOREIGN_PLUGINS")
        .unwrap_or_else(|_| panic!("TOOLGUARD_FOREIGN_PLUGINS is not set: run the tests with ./dev.sh test, which builds the Python and JavaScript plugins"));
    Path::new(&dir).join(format!("{name}.wasm"))
}

/// The plugin sealed by `toolguard seal` (once per test process).
pub(crate) fn sealed(name: &str) -> PathBuf {
    static DONE: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("sealed-{}-{name}.wasm", std::process::id()));
    let mut done = DONE.lock().unwrap();
    if !done.iter().any(|d| d == name) {
        let run = toolguard(&["seal", built(name).to_str().unwrap(), "-o", out.to_str().unwrap()]);
        assert!(run.status.success(), "seal {name}: {}", String::from_utf8_lossy(&run.stderr));
        done.push(name.into());
    }
    out
}

fn toolguard(args: &[&str]) -> Output {
    Command::new(BIN).args(args).env_remove("TOOLGUARD_LOG").output().expect("run toolguard")
}

/// The Python payments plugin, sealed, with its tools prefixed `py_`.
fn python_payments() -> String {
    format!(
        r#"
[plugins.pypay]
component = {path:?}
tool_prefix = "py_"
[plugins.pypay.config]
api_base = "{{url}}"
[policy.plugins.pypay.tools]
refund = {{ effect = "irreversible" }}
refund_status = {{ effect = "read-only" }}
[[policy.plugins.pypay.grants]]
downstream = "payments"
methods = ["POST", "GET"]
path_prefix = "/v1/refunds"
"#,
        path = sealed("py_payments").display().to_string()
    )
}

/// A plugin `name` from `component`, reviewed, with no grants.
fn ungranted(name: &str, component: &Path) -> String {
    format!("\n[plugins.{name}]\ncomponent = {:?}\n[policy.plugins.{name}]\n", component.display().to_string())
}

fn refund(amount: u64) -> Value {
    json!({ "payment_intent": PI, "amount_cents": amount, "reason": "requested_by_customer" })
}

#[test]
fn a_python_refund_tool_refunds_once_replays_and_conflicts() {
    let w = World::with_extra(Downstream::default(), &python_payments());
    let (ok, first, log) = w.call("k1", "py_refund", &refund(500));
    assert!(ok, "{first}\n{log}");
    assert_eq!(first["status"], "succeeded", "{first}");
    assert_eq!(w.refunds_of(500), 1);
    // Its print() reached the host's log, tagged with the plugin, with a real time.
    let line = log.lines().find(|l| l.contains("refund pi_") && l.contains("pypay")).unwrap_or_else(|| panic!("no print line in:\n{log}"));
    let stamp: f64 = line.split(" at ").nth(1).and_then(|t| t.split_whitespace().next()).and_then(|t| t.parse().ok()).expect(line);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    assert!((now - stamp).abs() < 600.0, "time.time() is real: {stamp} vs {now}");

    let (ok, again, _) = w.call("k1", "py_refund", &refund(500));
    assert!(ok, "{again}");
    assert_eq!(again["refund_id"], first["refund_id"], "the same call id replays the recorded outcome");
    assert_eq!(w.refunds_of(500), 1, "a replay sends nothing");

    let (ok, conflict, _) = w.call("k1", "py_refund", &refund(600));
    assert!(!ok);
    assert_eq!(conflict["kind"], "conflict", "{conflict}");
    assert_eq!(w.refunds_of(600), 0);

    let (ok, status, status_log) = w.call("s1", "py_refund_status", &json!({ "payment_intent": PI }));
    assert!(ok, "{status}");
    assert_eq!(status["refunded_cents"], 500, "{status}");
    // `random` is seeded per run, not fixed when componentize-py snapshotted the module.
    let trace = |log: &str, tool: &str| {
        log.lines()
            .find(|l| l.contains(&format!("{tool} pi_")))
            .and_then(|l| l.split("trace ").nth(1))
            .map(|t| t.split_whitespace().next().unwrap_or_default().to_string())
    };
    let (a, b) = (trace(&log, "refund").expect("refund's trace"), trace(&status_log, "refund_status").expect("refund_status's trace"));
    assert_ne!(a, b, "two runs drew the same random number: {log}\n{status_log}");
    // The key the provider got was minted by the host, never by the plugin.
    let posts: Vec<_> = w.sandbox.requests().into_iter().filter(|r| r.method == "POST").collect();
    assert_eq!(posts.len(), 1);
    assert!(!posts[0].idempotency_key.as_deref().unwrap_or_default().is_empty(), "{:?}", posts[0]);
}

#[test]
fn a_python_refund_whose_outcome_is_unknown_holds_the_blind_repeat() {
    let d = Downstream { timeout_ms: 500, reconcile_ms: 200, ..Downstream::default() };
    let w = World::with_extra(d, &python_payments());
    w.sandbox.set_list_lag(Duration::from_secs(600));
    w.sandbox.inject(Fault::DelayAfterCommit { ms: 2_000 });
    let (ok, first, _) = w.call("k1", "py_refund", &refund(700));
    assert!(!ok);
    assert_eq!(first["kind"], "outcome-unknown", "{first}");
    // The model re-issues it under a new id: held with the earlier outcome, nothing sent.
    let (ok, repeat, _) = w.call("k1-retry", "py_refund", &refund(700));
    assert!(!ok, "{repeat}");
    assert_eq!(repeat["kind"], "held", "{repeat}");
    assert_eq!(w.refunds_of(700), 1, "the provider committed once; the repeat made nothing");
    let keys: Vec<_> = w.sandbox.requests().into_iter().filter(|r| r.method == "POST").map(|r| r.idempotency_key).collect();
    assert!(keys.iter().all(|k| *k == keys[0]), "only k1's key ever went out: {keys:?}");
}

#[test]
fn a_python_reconciliation_reads_past_the_first_page_of_refunds() {
    let d = Downstream { reconcile_ms: 200, ..Downstream::default() };
    let w = World::with_extra(d, &python_payments());
    // Committed behind a 500, and not listed yet: unknown …
    w.sandbox.set_list_lag(Duration::from_secs(600));
    w.sandbox.inject(Fault::HiddenCommit500);
    let (ok, first, _) = w.call("k1", "py_refund", &refund(700));
    assert!(!ok);
    assert_eq!(first["kind"], "outcome-unknown", "{first}");
    // … and by the next look 150 newer refunds of the payment list before it.
    let newer: Vec<u64> = (1..=150).collect();
    for amount in &newer {
        assert_eq!(w.sandbox.refund_elsewhere(PI, *amount).0, 200);
    }
    w.sandbox.set_list_lag(Duration::ZERO);
    // A listing that ignores its cursor cannot be read to its end: "can't tell", not "not found".
    w.sandbox.set_list_ignores_cursor(true);
    let (ok, stuck, _) = w.call("k1", "py_refund", &refund(700));
    assert!(!ok);
    assert!(stuck["message"].as_str().unwrap().contains("does not page past"), "{stuck}");
    w.sandbox.set_list_ignores_cursor(false);
    let (ok, again, log) = w.call("k1", "py_refund", &refund(700));
    assert!(ok, "found on the listing's second page: {again}\n{log}");
    assert_eq!(again["refund_id"], w.sandbox.refunds()[0].id.as_str(), "{again}");
    assert_eq!(w.refunds_of(700), 1, "found, never made again");
    let (ok, status, _) = w.call("st", "py_refund_status", &json!({ "payment_intent": PI }));
    assert!(ok, "{status}");
    assert_eq!(status["refunds"].as_array().map(Vec::len), Some(151), "every page is read");
    assert_eq!(status["refunded_cents"], 700 + newer.iter().sum::<u64>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_refund_over_mcp_refunds_once() {
    let w = tokio::task::spawn_blocking(|| World::with_extra(Downstream::default(), &python_payments())).await.unwrap();
    let server = serve_http(&w.config, &[]);
    let mcp = Mcp::connect(&server.url).await;
    let first = mcp.call("py_refund", "m1", refund(800)).await.unwrap();
    assert_eq!(first["isError"], false, "{first}");
    let again = mcp.call("py_refund", "m1", refund(800)).await.unwrap();
    assert_eq!(again["structuredContent"]["refund_id"], first["structuredContent"]["refund_id"], "{again}");
    assert_eq!(w.refunds_of(800), 1);
    drop(server);
    tokio::task::spawn_blocking(move || drop(w)).await.unwrap();
}

#[test]
fn a_plain_python_build_is_refused_until_sealed_and_filesystem_is_inert() {
    let w = World::with_extra(Downstream::default(), &ungranted("raw", &built("py_socket")));
    let out = toolguard(&["tools", "--config", w.config.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = stdout_json(&out)["message"].as_str().unwrap_or_default().to_string();
    assert!(err.contains("wasi:sockets/tcp"), "{err}");
    assert!(err.contains("toolguard seal"), "the refusal says what to do: {err}");
    let refused = err.split("the host never grants:").nth(1).and_then(|r| r.split(". ").next()).unwrap_or_default();
    assert!(!refused.contains("wasi:filesystem"), "the filesystem is linked inert, not refused: {err}");
}

/// A loopback listener that counts the connections it ever accepts.
fn counting_listener() -> (u16, std::sync::Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = std::sync::Arc::new(AtomicUsize::new(0));
    let count = seen.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            if conn.is_ok() {
                count.fetch_add(1, Ordering::SeqCst);
            }
        }
    });
    (port, seen)
}

#[test]
fn a_sealed_python_socket_reaches_nothing_and_the_host_keeps_serving() {
    let (port, seen) = counting_listener();
    let extra = format!("{}{}", ungranted("sock", &sealed("py_socket")), python_payments());
    let w = World::with_extra(Downstream::default(), &extra);
    let (ok, v, log) = w.call("c1", "connect", &json!({ "host": "127.0.0.1", "port": port }));
    assert!(!ok, "{v}");
    assert!(v["message"].as_str().unwrap_or_default().contains("trap"), "the sealed socket call trapped: {v}");
    assert!(log.contains("opening a socket to"), "its print ran first: {log}");
    let (ok, status, _) = w.call("c2", "py_refund_status", &json!({ "payment_intent": PI }));
    assert!(ok, "another tool of the same host still works: {status}");
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(seen.load(Ordering::SeqCst), 0, "no connection ever reached the listener");
    assert!(w.sandbox.requests().iter().all(|r| r.method == "GET"), "nothing was sent to the provider");
}

#[test]
fn a_javascript_tool_runs_with_its_console_real_time_and_randomness() {
    let w = World::with_extra(Downstream::default(), &ungranted("jstext", &sealed("js_text")));
    let before = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    let (ok, a, log) = w.call("j1", "js_text_stats", &json!({ "text": "one two\nthree elephants" }));
    assert!(ok, "{a}\n{log}");
    let after = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    assert_eq!((a["words"].as_i64(), a["lines"].as_i64(), a["longest_word"].as_str()), (Some(4), Some(2), Some("elephants")), "{a}");
    let at = a["at_ms"].as_i64().unwrap();
    assert!((before..=after).contains(&at), "Date.now() is real: {at} not in {before}..{after}");
    let trace = |log: &str| log.lines().find(|l| l.contains("js_text_stats on")).map(|l| l.rsplit("trace ").next().unwrap().trim().to_string());
    let first = trace(&log).unwrap_or_else(|| panic!("console.log reached the log: {log}"));
    let (_, _, log2) = w.call("j2", "js_text_stats", &json!({ "text": "again" }));
    assert_ne!(trace(&log2).unwrap(), first, "Math.random() is not fixed at build time");
}

#[test]
fn a_sealed_javascript_fetch_reaches_nothing() {
    let (port, seen) = counting_listener();
    let w = World::with_extra(Downstream::default(), &ungranted("jsfetch", &sealed("js_fetch")));
    let (ok, v, log) = w.call("f1", "fetch_itself", &json!({ "url": format!("http://127.0.0.1:{port}/v1/refunds") }));
    assert!(log.contains("calling fetch"), "{log}");
    assert!(!ok || v["outcome"] != "answered", "fetch must not get an answer: {v}");
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(seen.load(Ordering::SeqCst), 0, "no connection ever reached the listener");
}

#[test]
fn the_audit_shows_inert_and_sealed_imports_and_the_policy_can_deny_them() {
    let w = World::with_extra(Downstream::default(), &python_payments());
    let out = toolguard(&["audit", "--config", w.config.to_str().unwrap(), "--json"]);
    let report = stdout_json(&out);
    let py = report["components"].as_array().unwrap().iter().find(|c| c["plugin"] == "pypay").expect("pypay audited").clone();
    let class_of = |prefix: &str| -> Vec<String> {
        py["imports"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|i| i["name"].as_str().unwrap().starts_with(prefix))
            .map(|i| i["class"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(class_of("wasi:filesystem/"), ["inert", "inert"], "{py}");
    let sockets = class_of("wasi:sockets/");
    assert!(sockets.len() >= 2 && sockets.iter().all(|c| c == "sealed"), "{sockets:?}");
    assert!(class_of("wasi:").iter().all(|c| c != "forbidden"));
    let why = py["imports"].as_array().unwrap().iter().find(|i| i["name"].as_str().unwrap().starts_with("wasi:filesystem/preopens")).unwrap()["why"].clone();
    assert!(why.as_str().unwrap().contains("no preopened"), "{why}");
    assert_eq!(py["verdict"], "FAIL", "unpinned: {py}"); // pinning is the reviewer's next step

    // The reviewer forbids the inert filesystem, and separately the sealed sockets.
    for deny in ["wasi:filesystem", "wasi:sockets"] {
        let text = std::fs::read_to_string(&w.config)
            .unwrap()
            .replace("[policy.plugins.pypay.tools]", &format!("[policy.plugins.pypay]\ndeny_imports = [\"{deny}\"]\n[policy.plugins.pypay.tools]"));
        let config = w.config.with_file_name(format!("deny-{}.toml", deny.replace(':', "-")));
        std::fs::write(&config, text).unwrap();
        let out = toolguard(&["tools", "--config", config.to_str().unwrap()]);
        assert!(!out.status.success());
        let err = stdout_json(&out)["message"].as_str().unwrap_or_default().to_string();
        assert!(err.contains("deny_imports") && err.contains(&format!("{deny}/")), "{err}");
    }
}

#[test]
fn a_component_larger_than_the_pool_allows_is_refused_naming_the_setting() {
    // A runtime whose pool was sized for Rust guests, then handed a Python one.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut runtime = toolguard::Runtime::new(&crate::common::engine(), shared_cache()).unwrap();
        let plugin = toolguard::config::PluginConfig {
            name: "pypay".into(),
            component: toolguard::config::ComponentSource::File(sealed("py_payments")),
            ..crate::common::plugin("x", "text-stats", Default::default())
        };
        let err = runtime.add_plugin(&plugin).await.unwrap_err().to_string();
        assert!(err.contains("does not fit the instance pool") && err.contains("[engine] component_"), "{err}");
        // Sized to it, it loads.
        let needs = toolguard::runtime::footprint_of(std::slice::from_ref(&plugin));
        let mut runtime = toolguard::Runtime::new(&crate::common::engine().fitted_to(needs), shared_cache()).unwrap();
        runtime.add_plugin(&plugin).await.unwrap();
        assert!(runtime.tools().any(|t| t.name == "refund"));
    });
}

/// The JavaScript ticket plugin, sealed, against the sandbox's ticket desk,
/// which ignores idempotency keys: the key travels in the body's `external_ref`.
pub(crate) fn js_tickets() -> String {
    format!(
        r#"
[plugins.tickets]
component = {path:?}
[plugins.tickets.config]
api_base = "{{url}}"
[policy.downstreams.desk]
url = "{{url}}"
honours_keys = false
timeout_ms = 500
max_retries = 3
reconcile_ms = 3000
key = [{{ transport = "json-field", name = "external_ref" }}]
[policy.plugins.tickets.tools]
create_ticket = {{ effect = "irreversible" }}
[[policy.plugins.tickets.grants]]
downstream = "desk"
methods = ["POST", "GET"]
path_prefix = "/v1/tickets"
"#,
        path = sealed("js_tickets").display().to_string()
    )
}

fn ticket(subject: &str) -> Value {
    json!({ "subject": subject, "body": "The refund has not arrived." })
}

#[test]
fn a_javascript_ticket_tool_against_a_desk_that_ignores_keys_opens_one_ticket() {
    let w = World::with_extra(Downstream::default(), &js_tickets());
    let tickets = |subject: &str| w.sandbox.tickets().into_iter().filter(|t| t.subject == subject).collect::<Vec<_>>();
    let posts = |subject: &str| w.sandbox.requests().into_iter().filter(|r| r.method == "POST" && r.body.contains(subject)).count();

    let (ok, first, log) = w.call("t1", "create_ticket", &ticket("first"));
    assert!(ok, "{first}\n{log}");
    assert!(log.contains("create_ticket \"first\""), "console.log reached the log: {log}");
    let opened = tickets("first");
    assert_eq!(opened.len(), 1);
    assert_eq!(first["ticket_id"], opened[0].id.as_str());
    assert!(opened[0].external_ref.as_deref().is_some_and(|k| !k.is_empty()), "the host put its key in the ticket: {opened:?}");

    let (ok, again, _) = w.call("t1", "create_ticket", &ticket("first"));
    assert!(ok, "{again}");
    assert_eq!(again["ticket_id"], first["ticket_id"], "a repeat replays the recorded ticket");
    assert_eq!((tickets("first").len(), posts("first")), (1, 1), "nothing was sent again");

    // The desk opens the ticket but answers after the host's deadline: the
    // host never re-sends to a desk that ignores keys; it reconciles through
    // the plugin's search and answers with the real ticket.
    w.sandbox.inject(Fault::DelayAfterCommit { ms: 2_000 });
    let (ok, late, log) = w.call("t2", "create_ticket", &ticket("late"));
    assert_eq!((tickets("late").len(), posts("late")), (1, 1), "one ticket, one request: {late}\n{log}");
    assert!(ok, "reconciliation found the ticket: {late}\n{log}");
    assert_eq!(late["ticket_id"], tickets("late")[0].id.as_str());
}

#[test]
fn a_typescript_ticket_left_unknown_is_held_conflicts_and_is_reconciled_later() {
    let w = World::with_extra(Downstream::default(), &js_tickets());
    let tickets = || w.sandbox.tickets().into_iter().filter(|t| t.subject == "lost").collect::<Vec<_>>();
    let posts = || w.sandbox.requests().into_iter().filter(|r| r.method == "POST").count();
    // The desk opens the ticket, answers after the deadline, and its search
    // does not show the ticket yet: the TypeScript reconciler cannot tell.
    w.sandbox.set_list_lag(Duration::from_secs(600));
    w.sandbox.inject(Fault::DelayAfterCommit { ms: 2_000 });
    let (ok, first, log) = w.call("u1", "create_ticket", &ticket("lost"));
    assert!(!ok, "{first}");
    assert_eq!(first["kind"], "outcome-unknown", "{first}\n{log}");
    assert_eq!((tickets().len(), posts()), (1, 1));

    // The model re-issues it under a new id: held, nothing sent.
    let (ok, repeat, _) = w.call("u1-again", "create_ticket", &ticket("lost"));
    assert!(!ok);
    assert_eq!(repeat["kind"], "held", "{repeat}");
    // The same id again: never re-sent to a desk that ignores keys.
    let (ok, same, _) = w.call("u1", "create_ticket", &ticket("lost"));
    assert!(!ok, "{same}");
    // The same id with other arguments: a conflict, nothing sent.
    let (ok, conflict, _) = w.call("u1", "create_ticket", &ticket("other"));
    assert!(!ok);
    assert_eq!(conflict["kind"], "conflict", "{conflict}");
    assert_eq!((tickets().len(), posts()), (1, 1), "one ticket, one request, whatever the model retried");

    // Once the desk's search shows it, recovery finds it through the
    // plugin's reconciler, and the call answers with the real ticket.
    w.sandbox.set_list_lag(Duration::ZERO);
    let out = toolguard(&["recover", "--config", w.config.to_str().unwrap()]);
    assert!(out.status.success(), "{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let (ok, settled, _) = w.call("u1", "create_ticket", &ticket("lost"));
    assert!(ok, "{settled}");
    assert_eq!(settled["ticket_id"], tickets()[0].id.as_str());
    assert_eq!((tickets().len(), posts()), (1, 1));
}

#[test]
fn a_ticket_left_to_an_operator_is_looked_up_once_a_pass_not_for_a_whole_window() {
    let w = World::with_extra(Downstream::default(), &js_tickets());
    let recover = || {
        let out = toolguard(&["recover", "--config", w.config.to_str().unwrap()]);
        (out.status.success(), stdout_json(&out))
    };
    let gets = || w.sandbox.requests().iter().filter(|r| r.method == "GET").count();
    // Opened, answered too late, and not listed for a long while.
    w.sandbox.set_list_lag(Duration::from_secs(600));
    w.sandbox.inject(Fault::DelayAfterCommit { ms: 2_000 });
    let (ok, first, _) = w.call("o1", "create_ticket", &ticket("unlisted"));
    assert!(!ok && first["kind"] == "outcome-unknown", "{first}");
    // A pass waits out the window once more (no send since, but none has
    // yet followed a whole window from a pass), then leaves it to an operator.
    let (ok, report) = recover();
    assert!(!ok, "{report}");
    assert_eq!(report["needs_operator"].as_array().map(Vec::len), Some(1), "{report}");
    // Every later pass (each start-up) looks once: the listing had its window.
    for _ in 0..2 {
        let before = gets();
        let (ok, report) = recover();
        assert!(!ok && report["needs_operator"].as_array().map(Vec::len) == Some(1), "{report}");
        assert_eq!(gets() - before, 1, "one look-up, not a window's worth of them");
    }
    // Once the desk lists it, the next pass finds it: one ticket, one POST.
    w.sandbox.set_list_lag(Duration::ZERO);
    let (ok, report) = recover();
    assert!(ok, "{report}");
    let (ok, settled, _) = w.call("o1", "create_ticket", &ticket("unlisted"));
    assert!(ok, "{settled}");
    let posts = w.sandbox.requests().iter().filter(|r| r.method == "POST").count();
    assert_eq!((w.sandbox.tickets().len(), posts), (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_typescript_ticket_and_the_read_only_examples_answer_over_mcp() {
    let extra = format!("{}{}{}", js_tickets(), ungranted("pytext", &sealed("py_text")), ungranted("jstext", &sealed("js_text")));
    let w = tokio::task::spawn_blocking(move || World::with_extra(Downstream::default(), &extra)).await.unwrap();
    let server = serve_http(&w.config, &[]);
    let mcp = Mcp::connect(&server.url).await;
    let first = mcp.call("create_ticket", "m1", ticket("mcp")).await.unwrap();
    assert_eq!(first["isError"], false, "{first}");
    let again = mcp.call("create_ticket", "m1", ticket("mcp")).await.unwrap();
    assert_eq!(again["structuredContent"]["ticket_id"], first["structuredContent"]["ticket_id"], "{again}");
    assert_eq!(w.sandbox.tickets().iter().filter(|t| t.subject == "mcp").count(), 1);
    for (tool, id) in [("py_text_stats", "m2"), ("js_text_stats", "m3")] {
        let r = mcp.call(tool, id, json!({ "text": "one two\nthree" })).await.unwrap();
        assert_eq!(r["isError"], false, "{tool}: {r}");
        assert_eq!(r["structuredContent"]["words"], 3, "{tool}: {r}");
    }
    drop(server);
    tokio::task::spawn_blocking(move || drop(w)).await.unwrap();
}

/// The Python text tool (plain build, sealed) and the Rust template plugin.
fn sdk_examples() -> String {
    format!(
        "{}{}{}\n[plugins.template]\ncomponent = \"builtin:template\"\n[policy.plugins.template.tools]\ngreet = {{ effect = \"read-only\" }}\n",
        python_payments(),
        js_tickets(),
        ungranted("pytext", &sealed("py_text"))
    )
}

#[test]
fn each_language_sdk_derives_the_schema_the_host_enforces() {
    let w = World::with_extra(Downstream::default(), &sdk_examples());
    let out = toolguard(&["tools", "--config", w.config.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    let tools = stdout_json(&out);
    let tool = |name: &str| tools.as_array().unwrap().iter().find(|t| t["name"] == name).unwrap_or_else(|| panic!("no {name} in {tools}")).clone();

    // Rust (toolguard-sdk, schemars): from the argument and result types.
    let greet = tool("greet");
    assert_eq!(greet["input_schema"]["properties"]["name"]["minLength"], 1, "{greet}");
    assert_eq!(greet["input_schema"]["additionalProperties"], false, "deny_unknown_fields: {greet}");
    assert_eq!(greet["output_schema"]["required"], json!(["greeting"]), "{greet}");
    let refund = tool("refund");
    assert_eq!(refund["effect"], "irreversible");
    assert_eq!(refund["input_schema"]["properties"]["amount_cents"]["minimum"], 1, "{refund}");
    assert_eq!(refund["input_schema"]["properties"]["reason"]["enum"], json!(["duplicate", "fraudulent", "requested_by_customer"]), "{refund}");
    // Python (toolguard_sdk, type hints): Annotated/Field, Literal, TypedDict, defaults.
    let py = tool("py_refund");
    assert_eq!(py["effect"], "irreversible");
    let props = &py["input_schema"]["properties"];
    assert_eq!((props["amount_cents"]["minimum"].clone(), props["amount_cents"]["maximum"].clone()), (json!(1), json!(100_000_000)), "{py}");
    assert_eq!(props["payment_intent"]["pattern"], refund["input_schema"]["properties"]["payment_intent"]["pattern"], "{py}");
    assert_eq!(props["reason"]["enum"], refund["input_schema"]["properties"]["reason"]["enum"], "{py}");
    assert_eq!(py["input_schema"]["additionalProperties"], false);
    assert_eq!(py["output_schema"]["properties"]["reason"]["anyOf"], json!([{ "type": "string" }, { "type": "null" }]), "{py}");
    assert_eq!(tool("py_text_stats")["input_schema"]["properties"]["text"]["maxLength"], 65536);
    assert_eq!(tool("py_refund_status")["effect"], "read-only");
    // TypeScript: the schema object beside the function.
    assert_eq!(tool("create_ticket")["input_schema"]["properties"]["subject"]["minLength"], 1);

    // What the derived schemas promise, the host enforces before any plugin runs.
    for (id, name, args) in [
        ("b1", "greet", json!({ "name": "" })),
        ("b2", "greet", json!({ "name": "Ada", "title": "Countess" })),
        ("b3", "refund", json!({ "payment_intent": PI, "amount_cents": 5, "reason": "because" })),
        ("b4", "py_refund", json!({ "payment_intent": PI, "amount_cents": 0, "reason": "duplicate" })),
        ("b5", "py_refund", json!({ "payment_intent": "ch_1", "amount_cents": 5, "reason": "duplicate" })),
        ("b6", "py_refund", json!({ "payment_intent": PI, "amount_cents": 5, "reason": "duplicate", "note": "x" })),
        ("b7", "create_ticket", json!({ "subject": "", "body": "x" })),
    ] {
        let (ok, v, _) = w.call(id, name, &args);
        assert!(!ok, "{name} {args}: {v}");
        assert_eq!(v["kind"], "invalid-args", "{name} {args}: {v}");
    }
    assert!(w.sandbox.requests().is_empty(), "nothing reached the provider");

    // And what they accept runs: a Python read-only tool, a Rust one.
    let (ok, stats, _) = w.call("g1", "py_text_stats", &json!({ "text": "one two\nthree" }));
    assert!(ok, "{stats}");
    assert_eq!((stats["words"].as_i64(), stats["lines"].as_i64(), stats["longest_word"].as_str()), (Some(3), Some(2), Some("three")));
    let (ok, hi, _) = w.call("g2", "greet", &json!({ "name": "Ada" }));
    assert!(ok, "{hi}");
    assert_eq!(hi["greeting"], "Hello, Ada!");
}

#[test]
fn a_quickjs_tool_with_several_memories_loads_without_a_seal_and_runs() {
    // componentize-qjs (QuickJS) builds use more than one linear memory; the
    // pool is sized to the component at load instead of refusing it.
    let component = built("qjs_text");
    let needs = toolguard::runtime::footprint_of(&[toolguard::config::PluginConfig {
        name: "qjs".into(),
        component: toolguard::config::ComponentSource::File(component.clone()),
        ..crate::common::plugin("x", "text-stats", Default::default())
    }]);
    assert!(needs.memories >= 2, "a QuickJS build has several memories: {needs:?}");
    let extra = format!("\n[plugins.qjs]\ncomponent = {:?}\ntool_prefix = \"qjs_\"\n[policy.plugins.qjs]\n", component.display().to_string());
    let w = World::with_extra(Downstream::default(), &extra);
    let (ok, v, log) = w.call("q1", "qjs_js_text_stats", &json!({ "text": "alpha beta\ngamma" }));
    assert!(ok, "{v}\n{log}");
    assert_eq!((v["words"].as_i64(), v["lines"].as_i64(), v["longest_word"].as_str()), (Some(3), Some(2), Some("alpha")), "{v}");
}

#[test]
fn a_component_using_the_async_abi_is_refused_saying_how_to_build_it() {
    let w = World::with_extra(Downstream::default(), &ungranted("qjsasync", &built("qjs_async")));
    let out = toolguard(&["tools", "--config", w.config.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = stdout_json(&out)["message"].as_str().unwrap_or_default().to_string();
    assert!(err.contains("async ABI") && err.contains("--sync"), "{err}");
}
