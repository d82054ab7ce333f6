//! The payments plugin's part of a toolguard config, pointed at a sandbox:
//! `[plugins.payments]`, the `payments` downstream and the reviewer's policy
//! for the plugin. One definition for the demo, the benchmarks and the
//! tests; each sets only the knobs it exercises, and adds its own plugins.

/// How the demo and most tests send the key: Stripe's header, and the same
/// key in the refund's metadata, so the plugin's reconciler can find it.
pub const KEY_HEADER_AND_METADATA: &str =
    r#"[{ transport = "header", name = "Idempotency-Key" }, { transport = "form-field", name = "metadata[toolguard_key]" }]"#;

/// The key as Stripe's header only: a reconciler cannot find such a refund.
pub const KEY_HEADER_ONLY: &str = r#"[{ transport = "header" }]"#;

/// The payments plugin and its policy, for a sandbox at `url`. Unset
/// downstream settings take the host's defaults.
#[derive(Debug, Clone)]
pub struct PaymentsConfig {
    /// The sandbox's base URL (the plugin's `api_base` and the downstream's `url`).
    pub url: String,
    /// The component: `builtin:payments` or a path to the built plugin.
    pub component: String,
    /// The downstream's per-try deadline.
    pub timeout_ms: Option<u64>,
    /// Re-sends with the same key after a transport failure.
    pub max_retries: Option<u32>,
    /// Wait before the first re-send.
    pub backoff_ms: Option<u64>,
    /// How long an unknown outcome is reconciled before answering.
    pub reconcile_ms: Option<u64>,
    /// How long the provider keeps keys.
    pub retention_hours: Option<u64>,
    /// `key = …` (TOML): how the key travels.
    pub key: String,
    /// Further lines of the downstream's table (TOML), e.g. a credential or TLS.
    pub downstream_extra: String,
    /// The methods granted under `/v1/refunds`.
    pub methods: Vec<&'static str>,
    /// `max_irreversible_calls_per_session_hour`, if limited.
    pub refunds_per_session_hour: Option<u32>,
    /// The refund's declared `action` (a TOML array of JSON pointers), if any.
    pub refund_action: Option<String>,
    /// More of the refund's policy, as inline-table entries (`approval = { … }`), if any.
    pub refund_policy: Option<String>,
}

impl PaymentsConfig {
    /// The plugin `component` against the sandbox at `url`: key in the header
    /// and the metadata, POST and GET granted, every other setting the host's default.
    pub fn new(url: impl Into<String>, component: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            component: component.into(),
            timeout_ms: None,
            max_retries: None,
            backoff_ms: None,
            reconcile_ms: None,
            retention_hours: None,
            key: KEY_HEADER_AND_METADATA.into(),
            downstream_extra: String::new(),
            methods: vec!["POST", "GET"],
            refunds_per_session_hour: None,
            refund_action: None,
            refund_policy: None,
        }
    }

    /// The TOML: `[plugins.payments]` with its `api_base`,
    /// `[policy.downstreams.payments]`, and `[policy.plugins.payments]` with
    /// `refund` irreversible, `refund_status` read-only and the grant.
    pub fn toml(&self) -> String {
        let optional = |name: &str, value: Option<String>| value.map(|v| format!("{name} = {v}\n")).unwrap_or_default();
        let downstream = [
            optional("timeout_ms", self.timeout_ms.map(|v| v.to_string())),
            optional("max_retries", self.max_retries.map(|v| v.to_string())),
            optional("backoff_ms", self.backoff_ms.map(|v| v.to_string())),
            optional("reconcile_ms", self.reconcile_ms.map(|v| v.to_string())),
            optional("retention_hours", self.retention_hours.map(|v| v.to_string())),
        ]
        .concat();
        let budget = optional("max_irreversible_calls_per_session_hour", self.refunds_per_session_hour.map(|v| v.to_string()));
        let methods = self.methods.iter().map(|m| format!("{m:?}")).collect::<Vec<_>>().join(", ");
        format!(
            r#"
[plugins.payments]
component = {component:?}
[plugins.payments.config]
api_base = "{url}"

[policy.downstreams.payments]
url = "{url}"
{downstream}key = {key}
{extra}

[policy.plugins.payments]
{budget}[policy.plugins.payments.tools]
refund = {{ effect = "irreversible"{action}{policy} }}
refund_status = {{ effect = "read-only" }}
[[policy.plugins.payments.grants]]
downstream = "payments"
methods = [{methods}]
path_prefix = "/v1/refunds"
"#,
            component = self.component,
            url = self.url,
            key = self.key,
            extra = self.downstream_extra,
            action = self.refund_action.as_ref().map(|a| format!(", action = {a}")).unwrap_or_default(),
            policy = self.refund_policy.as_ref().map(|p| format!(", {p}")).unwrap_or_default(),
        )
    }
}
