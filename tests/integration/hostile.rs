//! The hostile-component suite: one host serving a good plugin, a payments
//! sandbox that requires the host-injected API key, and one hostile
//! component (or tool) per way of misbehaving. Each is contained with the
//! right error; the good plugin answers correctly between them; nothing
//! hostile reaches the sandbox. Also: credentials reach the provider and no
//! plugin can see them.

use crate::common::{assert_good_tool_works, shared_cache, wasm};
use serde_json::json;
use toolguard::config::Limits;
use toolguard::config::{ComponentSource, PluginConfig};
use toolguard::{CallRequest, Config, ErrorKind, LoadError, Runtime};
use toolguard_sandbox::{Mode, PaymentsConfig, Sandbox};

/// The provider's API key: only the host holds it (in a file the plugins cannot read).
const SECRET: &str = "sk_test_5ecret_n0t_f0r_plug1ns";

struct Hostile {
    sandbox: Sandbox,
    rt: Runtime,
    _dir: tempfile::TempDir,
}

async fn hostile_host() -> Hostile {
    let sandbox = Sandbox::start("127.0.0.1:0", Mode::Stripe, toolguard_sandbox::DEFAULT_RETENTION).await.unwrap();
    sandbox.require_api_key(Some(SECRET));
    sandbox.add_payment_intent("pi_1", 10_000);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("api-key"), format!("{SECRET}\n")).unwrap();
    let url = sandbox.url();
    let payments = PaymentsConfig {
        timeout_ms: Some(2000),
        downstream_extra: r#"credential = { prefix = "Bearer ", file = "api-key" }"#.into(),
        ..PaymentsConfig::new(&url, wasm("payments").display().to_string())
    };
    let text = format!(
        r#"
data_dir = "data"
compile_cache = {cache:?}
{payments}
[plugins.text-stats]
component = {text_stats:?}
[plugins.rogue]
component = {rogue:?}
[plugins.rogue.config]
greeting = "hello"
[plugins.misbehave]
component = {misbehave:?}
[plugins.misbehave.limits]
cpu_ms = 200
memory_mb = 16
max_result_bytes = 4096

[policy.plugins.text-stats.tools]
text_stats = {{ effect = "read-only" }}
[policy.plugins.rogue]
max_sends_per_call = 2
[policy.plugins.rogue.tools]
send_all = {{ effect = "irreversible" }}
observe = {{ effect = "irreversible" }}
send_with_nonce = {{ effect = "irreversible" }}
fetch_all = {{ effect = "read-only" }}
send_from_read_only = {{ effect = "read-only" }}
[[policy.plugins.rogue.grants]]
downstream = "payments"
methods = ["POST", "GET"]
path_prefix = "/v1/refunds"
[policy.plugins.misbehave]
"#,
        cache = shared_cache().display().to_string(),
        text_stats = wasm("text-stats").display().to_string(),
        payments = payments.toml(),
        rogue = wasm("rogue").display().to_string(),
        misbehave = wasm("misbehave").display().to_string(),
    );
    let config = Config::parse(&text, "hostile.toml", dir.path()).unwrap();
    let rt = Runtime::from_config(&config).await.unwrap();
    Hostile { sandbox, rt, _dir: dir }
}

impl Hostile {
    async fn call(&self, call_id: &str, tool: &str, args: &str) -> Result<serde_json::Value, toolguard::CallError> {
        let req = CallRequest { session: "hostile".into(), call_id: call_id.into(), tool: tool.into(), args_json: args.into(), principal: None, tenant: None };
        self.rt.call(&req).await.map(|o| o.value)
    }

    /// Loads a hostile component under `name`; it must be refused.
    async fn refused(&mut self, name: &str, crate_name: &str, pin: Option<String>) -> LoadError {
        let mut plugin = PluginConfig {
            name: name.into(),
            component: ComponentSource::File(wasm(crate_name)),
            limits: Limits::default(),
            settings: Default::default(),
            tool_prefix: String::new(),
            policy: Default::default(),
        };
        plugin.policy.sha256 = pin;
        self.rt.add_plugin(&plugin).await.expect_err(name)
    }

    fn requests(&self) -> usize {
        self.sandbox.requests().len()
    }
}

fn send(url: String, headers: serde_json::Value) -> String {
    let req = json!({ "method": "POST", "url": url, "headers": headers, "body": "payment_intent=pi_1&amount=1" });
    json!({ "requests": [req] }).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_hostile_component_is_contained_and_the_good_one_keeps_answering() {
    let mut h = hostile_host().await;
    let url = h.sandbox.url();
    let refunds = format!("{url}/v1/refunds");
    assert_good_tool_works_on(&h).await;

    // Refused at load, each naming its reason.
    for (name, fixture, family) in [("sockets", "import-sockets", "wasi:sockets/"), ("http", "import-http", "wasi:http/")] {
        let err = h.refused(name, fixture, None).await;
        assert!(matches!(&err, LoadError::ForbiddenImports { imports, .. } if imports.iter().all(|i| i.starts_with(family))), "{err}");
        assert_good_tool_works_on(&h).await;
    }
    let err = h.refused("describe-trap", "describe-trap", None).await;
    assert!(matches!(&err, LoadError::Describe { .. }) && err.to_string().contains("describe always traps"), "{err}");
    assert_good_tool_works_on(&h).await;
    let err = h.refused("pinned", "text-stats", Some("ab".repeat(32))).await;
    assert!(matches!(err, LoadError::DigestMismatch { .. }), "{err}");
    assert_good_tool_works_on(&h).await;

    // Contained at run time: (tool, args, kind, what the message must say).
    let cases: Vec<(&str, String, ErrorKind, &str)> = vec![
        ("spin", "{}".into(), ErrorKind::LimitExceeded, "CPU budget"),
        ("bomb", "{}".into(), ErrorKind::LimitExceeded, "memory"),
        ("recurse", "{}".into(), ErrorKind::LimitExceeded, "call stack"),
        ("big_result", r#"{"n":100000}"#.into(), ErrorKind::LimitExceeded, "max_result_bytes"),
        ("send_all", send(refunds.clone(), json!({ "Idempotency-Key": "mine" })), ErrorKind::InvalidRequest, "Idempotency-Key"),
        ("send_all", send(refunds.clone(), json!({ "Authorization": "Bearer stolen" })), ErrorKind::InvalidRequest, "Authorization"),
        ("send_all", send("http://203.0.113.7/v1/refunds".into(), json!({})), ErrorKind::Denied, "no outbound grant"),
        ("send_all", send(format!("{url}/v1/charges"), json!({})), ErrorKind::Denied, "no outbound grant"),
        ("send_from_read_only", send(refunds.clone(), json!({})), ErrorKind::Denied, "read-only"),
    ];
    for (i, (tool, args, kind, says)) in cases.into_iter().enumerate() {
        let before = h.requests();
        let err = h.call(&format!("h{i}"), tool, &args).await.expect_err(tool);
        assert_eq!(err.kind, kind, "{tool}: {err}");
        assert!(err.message.contains(says), "{tool}: expected `{says}` in {}", err.message);
        assert_eq!(h.requests(), before, "{tool}: nothing reached the sandbox");
        assert_good_tool_works_on(&h).await;
    }

    // Reading the environment for secrets finds nothing.
    let seen = h.call("env", "env", "{}").await.unwrap();
    assert_eq!(seen["vars"], json!([]));
    assert!(!seen.to_string().contains(SECRET));
    assert_good_tool_works_on(&h).await;

    // Exceeding the send budget: the sends within it go out, the one over it does not.
    let form = json!({ "Content-Type": "application/x-www-form-urlencoded" });
    let three = (1..=3).map(|a| json!({ "method": "POST", "url": refunds, "headers": form, "body": format!("payment_intent=pi_1&amount={a}") }));
    let before = h.requests();
    let err = h.call("budget", "send_all", &json!({ "requests": three.collect::<Vec<_>>() }).to_string()).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::Denied, "{err}");
    assert!(err.message.contains("send budget"), "{}", err.message);
    assert_eq!(h.requests(), before + 2, "the budget of 2 went out; the third never did");
    assert!(h.sandbox.refunds().iter().all(|r| r.amount != 3));
    assert_good_tool_works_on(&h).await;
}

async fn assert_good_tool_works_on(h: &Hostile) {
    assert_good_tool_works(&h.rt).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_credential_reaches_the_provider_and_no_plugin_sees_it() {
    let h = hostile_host().await;
    let refund = h.call("r1", "refund", r#"{"payment_intent":"pi_1","amount_cents":100,"reason":"duplicate"}"#).await.unwrap();
    assert_eq!(refund["status"], "succeeded", "the sandbox requires the key, so the host sent it");
    let post = h.sandbox.requests().into_iter().find(|r| r.method == "POST").unwrap();
    assert!(post.headers.contains(&("authorization".into(), format!("Bearer {SECRET}"))), "{:?}", post.headers);

    // A plugin that reports everything it can observe shows no trace of it.
    let form = json!({ "Content-Type": "application/x-www-form-urlencoded" });
    let args = json!({
        "requests": [
            { "method": "POST", "url": format!("{}/v1/refunds", h.sandbox.url()), "headers": form, "body": "payment_intent=pi_1&amount=200" },
            { "method": "GET", "url": format!("{}/v1/refunds?payment_intent=pi_1", h.sandbox.url()) }
        ],
        "config_names": ["api_key", "secret", "token", "authorization", "credential", "PAYMENTS_API_KEY", "greeting"]
    });
    let observed = h.call("o1", "observe", &args.to_string()).await.unwrap();
    assert_eq!(observed["responses"][0]["status"], 200, "it did reach the provider: {observed}");
    assert_eq!(observed["config"]["greeting"], "hello", "it sees its own settings");
    let text = observed.to_string();
    assert!(!text.contains(SECRET) && !text.contains("5ecret"), "the secret leaked to the plugin: {text}");
    assert_eq!(observed["responses"][1]["status"], 200, "and read from it");

    // Nor is it recorded in the ledger.
    let ledger = h.rt.guard().unwrap().ledger();
    let recorded = serde_json::to_string(&ledger.attempts().unwrap()).unwrap();
    assert!(!recorded.contains(SECRET), "the ledger must never hold the credential");
}
