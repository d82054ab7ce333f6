//! Containment: each misbehaviour ends in the right error kind, and the next
//! call to a good tool on the same host succeeds.

use crate::common::{self, call, plugin};
use toolguard::config::Limits;
use toolguard::{ErrorKind, Runtime};

/// text-stats (well-behaved) and misbehave (tight limits) on one host.
async fn host(misbehave_limits: Limits) -> Runtime {
    common::runtime(&[plugin("text-stats", "text-stats", Limits::default()), plugin("misbehave", "misbehave", misbehave_limits)]).await
}

fn tight() -> Limits {
    Limits { cpu_ms: 200, wall_ms: 2_000, memory_mb: 16, max_outbound_calls: 3, max_result_bytes: 4096, ..Limits::default() }
}

/// Calls `tool` on misbehave, expects `kind` with `fragment` in the message,
/// then checks the good tool still answers.
async fn contained(rt: &Runtime, tool: &str, args: &str, kind: ErrorKind, fragment: &str) {
    let err = call(rt, tool, args).await.expect_err(tool);
    assert_eq!(err.kind, kind, "{tool}: {err}");
    assert!(err.message.contains(fragment), "{tool}: expected `{fragment}` in: {}", err.message);
    common::assert_good_tool_works(rt).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_misbehaviour_is_contained_and_the_host_keeps_serving() {
    let rt = host(tight()).await;
    contained(&rt, "spin", "{}", ErrorKind::LimitExceeded, "CPU budget of 200 ms").await;
    contained(&rt, "bomb", "{}", ErrorKind::LimitExceeded, "over its limit of 16 MiB").await;
    contained(&rt, "trap", "{}", ErrorKind::PluginTrap, "the trap tool always panics").await;
    contained(&rt, "recurse", "{}", ErrorKind::LimitExceeded, "exhausted its call stack").await;
    contained(&rt, "sleep", r#"{"n":60000}"#, ErrorKind::LimitExceeded, "wall-clock budget of 2000 ms").await;
    contained(&rt, "fetch_many", r#"{"n":10}"#, ErrorKind::LimitExceeded, "more than 3 outbound calls").await;
    contained(&rt, "big_result", r#"{"n":100000}"#, ErrorKind::LimitExceeded, "max_result_bytes").await;
    contained(&rt, "bad_json", "{}", ErrorKind::InvalidResult, "not JSON").await;
    // The same tools within their limits work: the limits are what stopped them.
    assert_eq!(call(&rt, "sleep", r#"{"n":5}"#).await.unwrap()["slept_ms"], 5);
    assert_eq!(call(&rt, "big_result", r#"{"n":100}"#).await.unwrap().as_str().unwrap().len(), 100);
}

#[tokio::test]
async fn outbound_is_denied_until_granted_and_nothing_is_sent() {
    let rt = host(tight()).await;
    let out = call(&rt, "fetch_many", r#"{"n":2}"#).await.unwrap();
    assert_eq!(out, serde_json::json!({ "calls": 2, "errors": 2 }));
}

#[tokio::test]
async fn bad_arguments_never_create_an_instance() {
    let rt = host(Limits { max_args_bytes: 1024, ..Limits::default() }).await;
    let before = rt.sandboxes_created();
    let oversized = format!(r#"{{"n":1,"pad":"{}"}}"#, "x".repeat(2000));
    let cases = [
        ("text_stats", r#"{"text": 5}"#, "at /text"),
        ("text_stats", r#"{"txt": "a"}"#, "\"text\" is a required property"),
        ("text_stats", r#"{"text": "a", "extra": 1}"#, "extra"),
        ("text_stats", "{not json", "not valid JSON"),
        ("text_stats", "[1,2]", "must be a JSON object"),
        ("echo", oversized.as_str(), "max_args_bytes"),
    ];
    for (tool, args, fragment) in cases {
        let err = call(&rt, tool, args).await.expect_err(args);
        assert_eq!(err.kind, ErrorKind::InvalidArgs, "{args}: {err}");
        assert!(err.message.contains(fragment), "{args}: expected `{fragment}` in {}", err.message);
    }
    let err = call(&rt, "no_such_tool", "{}").await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::UnknownTool);
    assert!(err.message.contains("text_stats"), "lists what exists: {}", err.message);
    assert_eq!(rt.sandboxes_created(), before, "no instance may be created for rejected calls");
    common::assert_good_tool_works(&rt).await;
    assert_eq!(rt.sandboxes_created(), before + 1);
}

#[tokio::test]
async fn the_plugin_sees_no_environment_no_arguments_and_only_its_settings() {
    let mut p = plugin("misbehave", "misbehave", Limits::default());
    p.settings.insert("greeting".into(), "hi".into());
    let rt = common::runtime(&[p]).await;
    let seen = call(&rt, "env", "{}").await.unwrap();
    assert_eq!(seen["vars"], serde_json::json!([]), "empty environment");
    assert_eq!(seen["args"], serde_json::json!([]), "no arguments");
    assert_eq!(seen["config_greeting"], "hi");
    assert_eq!(seen["config_secret"], serde_json::Value::Null);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_each_get_a_fresh_sandbox() {
    let rt = std::sync::Arc::new(host(Limits::default()).await);
    let before = rt.sandboxes_created();
    let calls = (0..24).map(|i| {
        let rt = rt.clone();
        tokio::spawn(async move {
            let text = "w ".repeat(i + 1);
            let out = call(&rt, "text_stats", &serde_json::json!({ "text": text }).to_string()).await.unwrap();
            assert_eq!(out["words"], i + 1);
        })
    });
    for c in calls {
        c.await.unwrap();
    }
    assert_eq!(rt.sandboxes_created(), before + 24);
}
