//! The operator's view: `/metrics` on `toolguard serve --http`, scraped after
//! known calls (the counters must match what was done and what the sandbox
//! saw), and the spans of tool calls and attempts.

use crate::common::{Mcp, serve_http};
use crate::payments::{Downstream, PI, config_text};
use std::sync::Arc;
use toolguard_sandbox::{Fault, Mode, Sandbox};

/// The value of the sample `name{labels}` (labels as printed, e.g. `tool="refund",outcome="ok"`).
fn sample(text: &str, name: &str, labels: &str) -> Option<f64> {
    let prefix = if labels.is_empty() { format!("{name} ") } else { format!("{name}{{{labels}}} ") };
    text.lines().find_map(|l| l.strip_prefix(&prefix)).map(|v| v.trim().parse().unwrap())
}

#[test]
fn metrics_count_the_calls_attempts_and_reconciliations_made() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let sandbox = rt.block_on(Sandbox::start("127.0.0.1:0", Mode::Stripe, toolguard_sandbox::DEFAULT_RETENTION)).unwrap();
    sandbox.add_payment_intent(PI, crate::payments::PI_AMOUNT);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("host.toml");
    std::fs::write(&config, config_text(&sandbox.url(), &dir.path().join("data"), &Downstream::default())).unwrap();
    let server = serve_http(&config, &[]);
    let text = rt.block_on(async {
        let mcp = Mcp::connect(&server.url).await;
        assert_eq!(mcp.refund("c1", 100).await.unwrap()["isError"], false);
        assert_eq!(mcp.refund("c1", 100).await.unwrap()["_meta"]["toolguard/replayed"], true);
        assert_eq!(mcp.refund("c1", 999).await.unwrap()["isError"], true, "a conflict");
        // The provider commits but answers too late: reconciliation finds it.
        sandbox.inject(Fault::DelayAfterCommit { ms: 3_000 });
        assert_eq!(mcp.refund("c2", 200).await.unwrap()["isError"], false);
        let url = server.url.replace(toolguard::mcp::http::PATH, toolguard::mcp::http::METRICS_PATH);
        reqwest::get(url).await.unwrap().text().await.unwrap()
    });
    assert_eq!(sandbox.refunds().len(), 2);
    let calls = |outcome: &str| sample(&text, "toolguard_tool_calls_total", &format!("tool=\"refund\",outcome=\"{outcome}\""));
    assert_eq!(calls("ok"), Some(2.0), "{text}");
    assert_eq!(calls("replayed"), Some(1.0));
    assert_eq!(calls("conflict"), Some(1.0));
    let attempts = |state: &str| sample(&text, "toolguard_attempts_total", &format!("downstream=\"payments\",state=\"{state}\""));
    assert_eq!(attempts("succeeded"), Some(2.0), "one per refund the sandbox made");
    assert_eq!(sample(&text, "toolguard_reconciles_total", "result=\"found\""), Some(1.0));
    assert_eq!(sample(&text, "toolguard_unknown_attempts", ""), Some(0.0));
    let synced = sample(&text, "toolguard_ledger_synced_writes", "").unwrap();
    let fsyncs = sample(&text, "toolguard_ledger_wal_fsyncs", "").unwrap();
    // Two first attempts and two grant-history entries are synced; the
    // outcomes and completions are not, so they cost no fsync. (+1: the
    // ledger's creation.)
    assert_eq!(synced, 4.0);
    assert!((1.0..=synced + 1.0).contains(&fsyncs), "synced {synced}, fsyncs {fsyncs}: a buffered write was fsynced");
    let batch = sample(&text, "toolguard_ledger_writes_per_fsync", "").unwrap();
    assert!((batch - synced / fsyncs).abs() < 1e-9, "{batch}");
    let instantiations = sample(&text, "toolguard_sandbox_instantiate_seconds_count", "").unwrap();
    assert!(instantiations >= 3.0, "describe, two refunds and a reconciliation: {instantiations}");
}

/// The operator's view: each tool call and each send is a span carrying
/// what an operator looks for (logged with `TOOLGUARD_LOG_SPANS=1`, and
/// what an OpenTelemetry layer would export).
#[test]
fn each_tool_call_and_attempt_is_a_span_with_its_key_step_state_and_latency() {
    #[derive(Clone, Default)]
    struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE)
        .with_env_filter("toolguard=info")
        .finish();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let key = tracing::subscriber::with_default(subscriber, || {
        rt.block_on(async {
            let h = crate::payments::harness(Downstream::default()).await;
            h.refund("c1", 500).await.unwrap();
            assert!(h.refund("c1", 500).await.unwrap().replayed);
            assert_eq!(h.refunds(), 1);
            h.ledger().attempts_of_call("s1", "c1").unwrap().remove(0).key
        })
    });
    let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let closes: Vec<&str> = text.lines().filter(|l| l.contains("close")).collect();
    let attempt = closes.iter().find(|l| l.contains("attempt{")).unwrap_or_else(|| panic!("no attempt span:\n{text}"));
    for field in [format!("key={key}"), "step=0".into(), "downstream=payments".into(), "state=\"succeeded\"".into(), "latency_ms=".into()] {
        assert!(attempt.contains(&field), "`{field}` missing from {attempt}");
    }
    assert!(attempt.contains("tool_call{"), "the attempt is a child of its tool call: {attempt}");
    let calls: Vec<&&str> = closes.iter().filter(|l| l.contains("tool_call{") && !l.contains("attempt{")).collect();
    assert_eq!(calls.len(), 2, "{text}");
    assert!(calls[0].contains("outcome=\"ok\"") && calls[0].contains("call_id=c1") && calls[0].contains("latency_ms="), "{}", calls[0]);
    assert!(calls[1].contains("outcome=\"replayed\""), "{}", calls[1]);
}

/// With `OTEL_EXPORTER_OTLP_ENDPOINT` set, `serve` sends the spans to that
/// collector as OTLP/HTTP JSON: a tool call with its attempt as a child.
#[test]
fn spans_reach_an_opentelemetry_collector_over_otlp() {
    spans_reach_a_collector(None);
}

#[test]
fn spans_reach_an_opentelemetry_collector_over_https() {
    spans_reach_a_collector(Some(&crate::tls::Pki::new()));
}

/// A stub collector (over HTTPS under `pki`'s CA when given), a host
/// exporting to it, one call; its spans must arrive.
fn spans_reach_a_collector(pki: Option<&crate::tls::Pki>) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let received: Arc<std::sync::Mutex<Vec<serde_json::Value>>> = Arc::default();
    let collector = {
        let received = received.clone();
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |body: String| {
                let received = received.clone();
                async move {
                    received.lock().unwrap().push(serde_json::from_str(&body).unwrap());
                    "{}"
                }
            }),
        );
        let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
        let addr = listener.local_addr().unwrap();
        match pki {
            Some(pki) => {
                rt.spawn(toolguard_sandbox::serve_https(listener, app, pki.server(false)));
                format!("https://{addr}")
            }
            None => {
                rt.spawn(async move { axum::serve(listener, app).await.unwrap() });
                format!("http://{addr}")
            }
        }
    };
    let sandbox = rt.block_on(Sandbox::start("127.0.0.1:0", Mode::Stripe, toolguard_sandbox::DEFAULT_RETENTION)).unwrap();
    sandbox.add_payment_intent(PI, crate::payments::PI_AMOUNT);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("host.toml");
    std::fs::write(&config, config_text(&sandbox.url(), &dir.path().join("data"), &Downstream::default())).unwrap();
    let ca = pki.map(|p| p.ca_file.display().to_string()).unwrap_or_default();
    let mut env = vec![("OTEL_EXPORTER_OTLP_ENDPOINT", collector.as_str())];
    if pki.is_some() {
        // The collector's CA, as the OpenTelemetry variable names it.
        env.push(("OTEL_EXPORTER_OTLP_CERTIFICATE", ca.as_str()));
    }
    let server = serve_http(&config, &env);
    rt.block_on(async {
        let mcp = Mcp::connect(&server.url).await;
        assert_eq!(mcp.refund("c1", 100).await.unwrap()["isError"], false);
    });
    let key = sandbox.requests()[0].idempotency_key.clone().unwrap();
    let spans = || -> Vec<serde_json::Value> {
        let batches = received.lock().unwrap().clone();
        batches.iter().flat_map(|b| b["resourceSpans"][0]["scopeSpans"][0]["spans"].as_array().cloned().unwrap_or_default()).collect()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    while !spans().iter().any(|s| s["name"] == "tool_call") && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let spans = spans();
    let attr = |s: &serde_json::Value, k: &str| s["attributes"].as_array().unwrap().iter().find(|a| a["key"] == k).map(|a| a["value"].clone());
    let call = spans.iter().find(|s| s["name"] == "tool_call").unwrap_or_else(|| panic!("no tool_call span: {spans:?}"));
    let attempt = spans.iter().find(|s| s["name"] == "attempt").unwrap_or_else(|| panic!("no attempt span: {spans:?}"));
    assert_eq!(attr(call, "call_id").unwrap()["stringValue"], "c1");
    assert_eq!(attr(call, "outcome").unwrap()["stringValue"], "ok");
    assert_eq!(attr(attempt, "key").unwrap()["stringValue"], key.as_str(), "the key the sandbox received");
    assert_eq!(attr(attempt, "state").unwrap()["stringValue"], "succeeded");
    assert!(attr(attempt, "latency_ms").is_some());
    assert_eq!(attempt["traceId"], call["traceId"]);
    assert_eq!(attempt["parentSpanId"], call["spanId"], "the attempt is the tool call's child");
}

/// What a host serves, from its `/info`.
fn info(server: &crate::common::Server) -> serde_json::Value {
    let url = server.url.replace(toolguard::mcp::http::PATH, toolguard::mcp::http::INFO_PATH);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let _ = rustls::crypto::ring::default_provider().install_default();
        serde_json::from_str(&reqwest::get(url).await.unwrap().text().await.unwrap()).unwrap()
    })
}

/// Hosts of a fleet that serve different policies for one plugin show
/// different policy digests (in `/info` and in `toolguard_component_info`);
/// hosts serving the same one show the same.
#[test]
fn a_fleets_hosts_show_which_policy_each_serves() {
    let dir = tempfile::tempdir().unwrap();
    let host = |name: &str, refunds_per_session_hour: u32| {
        let config = dir.path().join(format!("{name}.toml"));
        let d = Downstream { refunds_per_session_hour, ..Downstream::default() };
        std::fs::write(&config, config_text("http://127.0.0.1:9", &dir.path().join(name), &d)).unwrap();
        serve_http(&config, &[])
    };
    let (a, b, c) = (host("a", 1_000), host("b", 1_000), host("c", 5));
    let digest = |s: &crate::common::Server| info(s)["plugins"]["payments"]["policy_digest"].as_str().unwrap().to_string();
    let (da, db, dc) = (digest(&a), digest(&b), digest(&c));
    assert_eq!(da, db, "the same policy, the same digest");
    assert_ne!(da, dc, "a narrower budget is another policy");
    assert_eq!(info(&a)["plugins"]["payments"]["sha256"].as_str().map(str::len), Some(64));
    let url = c.url.replace(toolguard::mcp::http::PATH, toolguard::mcp::http::METRICS_PATH);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let text = rt.block_on(async { reqwest::get(url).await.unwrap().text().await.unwrap() });
    assert!(text.lines().any(|l| l.starts_with("toolguard_component_info{") && l.contains(&format!("policy=\"{dc}\""))), "{text}");
}

/// What the spending limits hold, read from the ledger at scrape time: each
/// limit's max, how many scopes hold a use, the highest use, and the calls
/// that would have passed one.
#[test]
fn metrics_show_each_limits_edge_and_the_calls_over_it() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let sandbox = rt.block_on(Sandbox::start("127.0.0.1:0", Mode::Stripe, toolguard_sandbox::DEFAULT_RETENTION)).unwrap();
    sandbox.add_payment_intent(PI, crate::payments::PI_AMOUNT);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("host.toml");
    let policy = r#"limits = [{ sum = "/amount_cents", max = 2000, per = "session", window = "day" }, { max = 50, window = "week" }]"#;
    std::fs::write(&config, config_text(&sandbox.url(), &dir.path().join("data"), &Downstream { refund_policy: Some(policy), ..Downstream::default() }))
        .unwrap();
    let server = serve_http(&config, &[]);
    let text = rt.block_on(async {
        let mcp = Mcp::connect(&server.url).await;
        assert_eq!(mcp.refund("c1", 1_500).await.unwrap()["isError"], false);
        assert_eq!(mcp.refund("c2", 600).await.unwrap()["structuredContent"]["kind"], "denied", "1,500 + 600 passes 2,000");
        let url = server.url.replace(toolguard::mcp::http::PATH, toolguard::mcp::http::METRICS_PATH);
        reqwest::get(url).await.unwrap().text().await.unwrap()
    });
    let limit = |name: &str, index: usize, currency: bool| {
        let labels = format!("plugin=\"payments\",tool=\"refund\",limit=\"{index}\"{}", if currency { ",currency=\"\"" } else { "" });
        sample(&text, name, &labels)
    };
    assert_eq!((limit("toolguard_limit_max", 0, false), limit("toolguard_limit_max", 1, false)), (Some(2_000.0), Some(50.0)), "{text}");
    assert_eq!(limit("toolguard_limit_scopes", 0, true), Some(1.0), "{text}");
    assert_eq!(limit("toolguard_limit_used_max", 0, true), Some(1_500.0), "the refused 600 holds nothing: {text}");
    assert_eq!(limit("toolguard_limit_used_max", 1, true), Some(1.0), "one call counted in the week: {text}");
    assert_eq!(sample(&text, "toolguard_limit_over_total", "tool=\"refund\",then=\"refused\""), Some(1.0), "{text}");
    assert_eq!(sandbox.refunds().len(), 1);
}
