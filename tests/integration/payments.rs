//! Shared set-up for the guard tests: a payments sandbox, a host whose
//! `payments` and `rogue` plugins are granted it, and helpers that count
//! what actually reached the sandbox.

use crate::common::{shared_cache, wasm};
use toolguard::{CallError, CallOutput, CallRequest, Config, Runtime};
use toolguard_sandbox::{Mode, PaymentsConfig, Sandbox};

/// The payment intent most tests refund against, and its amount.
pub const PI: &str = "pi_1001";
pub const PI_AMOUNT: u64 = 10_000;

/// Knobs of the payments downstream.
pub struct Downstream {
    pub mode: Mode,
    pub timeout_ms: u64,
    pub max_retries: u32,
    /// How long an unknown outcome is reconciled before answering.
    pub reconcile_ms: u64,
    /// How long the host assumes the provider keeps keys.
    pub retention_hours: u64,
    /// First backoff between tries.
    pub backoff_ms: u64,
    /// The plugins' wall-clock budget per invocation.
    pub wall_ms: u64,
    /// The payments plugin's `max_irreversible_calls_per_session_hour` (0: none).
    pub refunds_per_session_hour: u32,
    /// TOML array of key transports.
    pub key: &'static str,
    /// Further lines of the downstream's table (TOML), e.g. `key_format`.
    pub extra: &'static str,
    /// The refund's declared `action` (a TOML array of JSON pointers), if any.
    pub refund_action: Option<&'static str>,
    /// More of the refund's policy (inline-table entries), if any.
    pub refund_policy: Option<&'static str>,
}

/// The refund's action as its intent and amount: a reason in other words is the same refund.
pub const INTENT_AND_AMOUNT: &str = r#"["/payment_intent", "/amount_cents"]"#;

/// The key as a header only: the provider stores nothing the plugin could
/// reconcile by, so unknown outcomes stay unknown.
pub const HEADER_ONLY: &str = r#"[{ transport = "header", name = "Idempotency-Key" }]"#;

impl Default for Downstream {
    fn default() -> Self {
        Self {
            mode: Mode::Stripe,
            timeout_ms: 1_000,
            max_retries: 3,
            reconcile_ms: 300,
            retention_hours: 24,
            backoff_ms: 10,
            wall_ms: 30_000,
            refunds_per_session_hour: 1_000,
            key: r#"[{ transport = "header", name = "Idempotency-Key" }, { transport = "form-field", name = "metadata[toolguard_key]" }]"#,
            extra: "",
            refund_action: None,
            refund_policy: None,
        }
    }
}

/// A sandbox and a host wired to it, with their data in a temp dir.
pub struct Harness {
    pub sandbox: Sandbox,
    pub rt: Runtime,
    pub dir: tempfile::TempDir,
}

/// The config text of a host granted the sandbox at `url`.
pub fn config_text(url: &str, data_dir: &std::path::Path, d: &Downstream) -> String {
    let payments = PaymentsConfig {
        timeout_ms: Some(d.timeout_ms),
        max_retries: Some(d.max_retries),
        backoff_ms: Some(d.backoff_ms),
        reconcile_ms: Some(d.reconcile_ms),
        retention_hours: Some(d.retention_hours),
        key: d.key.into(),
        refunds_per_session_hour: Some(d.refunds_per_session_hour).filter(|n| *n > 0),
        downstream_extra: d.extra.into(),
        refund_action: d.refund_action.map(Into::into),
        refund_policy: d.refund_policy.map(Into::into),
        ..PaymentsConfig::new(url, wasm("payments").display().to_string())
    };
    format!(
        r#"
data_dir = {data:?}
compile_cache = {cache:?}

[limits]
wall_ms = {wall}

[plugins.rogue]
component = {rogue:?}
[plugins.rogue.limits]
max_args_bytes = 4194304
{payments}
[policy.plugins.rogue]
max_sends_per_call = 4
[[policy.plugins.rogue.grants]]
downstream = "payments"
methods = ["POST", "GET"]
path_prefix = "/v1/refunds"
"#,
        data = data_dir.display().to_string(),
        cache = shared_cache().display().to_string(),
        wall = d.wall_ms,
        payments = payments.toml(),
        rogue = wasm("rogue").display().to_string(),
    )
}

pub async fn harness(d: Downstream) -> Harness {
    let sandbox = Sandbox::start("127.0.0.1:0", d.mode, toolguard_sandbox::DEFAULT_RETENTION).await.unwrap();
    sandbox.add_payment_intent(PI, PI_AMOUNT);
    let dir = tempfile::tempdir().unwrap();
    let mut text = config_text(&sandbox.url(), &dir.path().join("data"), &d);
    // `./dev.sh test` runs the guard's tests a second time on a PostgreSQL ledger.
    if std::env::var("TOOLGUARD_TEST_LEDGER").as_deref() == Ok("postgres") {
        text = format!("ledger = {:?}\n{text}", crate::common::fresh_postgres_database());
    }
    let config = Config::parse(&text, "test.toml", dir.path()).unwrap();
    let rt = Runtime::from_config(&config).await.unwrap();
    Harness { sandbox, rt, dir }
}

impl Harness {
    /// Calls `tool` in session `s1` under `call_id`; the caller hears the answer.
    pub async fn call(&self, call_id: &str, tool: &str, args: &str) -> Result<CallOutput, CallError> {
        let req = CallRequest { session: "s1".into(), call_id: call_id.into(), tool: tool.into(), args_json: args.into(), principal: None, tenant: None };
        let answer = self.rt.call(&req).await;
        self.rt.report(&req, &answer).await;
        answer
    }

    /// Like [`Harness::call`], but the answer never reaches the caller (a lost response).
    pub async fn call_unheard(&self, call_id: &str, tool: &str, args: &str) -> Result<CallOutput, CallError> {
        let req = CallRequest { session: "s1".into(), call_id: call_id.into(), tool: tool.into(), args_json: args.into(), principal: None, tenant: None };
        self.rt.call(&req).await
    }

    /// Calls `refund` for `amount` cents of [`PI`].
    pub async fn refund(&self, call_id: &str, amount: u64) -> Result<CallOutput, CallError> {
        self.call(call_id, "refund", &refund_args(amount)).await
    }

    /// Refunds in the sandbox's own ledger.
    pub fn refunds(&self) -> usize {
        self.sandbox.refunds().len()
    }

    /// `POST /v1/refunds` requests the sandbox received.
    pub fn posts(&self) -> Vec<toolguard_sandbox::Observed> {
        self.sandbox.requests().into_iter().filter(|r| r.method == "POST").collect()
    }

    /// The host's ledger.
    pub fn ledger(&self) -> toolguard::ledger::Ledger {
        self.rt.guard().expect("from_config sets a guard").ledger().clone()
    }
}

pub fn refund_args(amount: u64) -> String {
    format!(r#"{{"payment_intent":"{PI}","amount_cents":{amount},"reason":"requested_by_customer"}}"#)
}

/// A `rogue` request list as JSON text.
pub fn rogue_args(requests: serde_json::Value, swallow: bool) -> String {
    serde_json::json!({ "requests": requests, "swallow_errors": swallow }).to_string()
}
