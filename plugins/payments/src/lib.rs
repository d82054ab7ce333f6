//! Refund tools that speak Stripe's wire format for this subset, so the same
//! component works against Stripe's test mode (the host injects the API key)
//! and against toolguard's payments sandbox:
//!
//! - `refund` (irreversible): form-encoded `POST /v1/refunds` with
//!   `payment_intent`, `amount`, `reason`.
//! - `refund_status` (read-only): `GET /v1/refunds?payment_intent=…`.
//!
//! The provider's base URL comes from the plugin setting `api_base`. The
//! idempotency key is the host's business: this plugin never sees it when
//! sending. When the outcome of a refund is unknown, the tool says so plainly
//! and tells the model to check `refund_status` before anything else.
//!
//! It also exports `reconcile`: given an attempt whose outcome is unknown, it
//! lists the payment intent's refunds and looks for the one whose metadata
//! carries the attempt's key (the host puts it there; the metadata field is
//! the setting `key_metadata_field`, default `toolguard_key`).

wit_bindgen::generate!({ world: "reconciling-plugin", path: "../../wit" });

use exports::toolguard::plugin::tool::Guest;
use serde_json::{Value, json};
use toolguard::plugin::outbound;
use toolguard::plugin::types::{
    Attempt, AttemptInfo, Effect, Header, OutboundError, Reconciliation, Request, Response, ToolError, ToolSpec,
};

struct Payments;

const REASONS: [&str; 3] = ["duplicate", "fraudulent", "requested_by_customer"];

fn refund_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "refund_id": { "type": "string" },
            "status": { "type": "string", "enum": ["pending", "requires_action", "succeeded", "failed", "canceled"] },
            "amount_cents": { "type": "integer" },
            "payment_intent": { "type": "string" },
            "reason": { "type": ["string", "null"] }
        },
        "required": ["refund_id", "status", "amount_cents", "payment_intent"]
    })
}

impl Guest for Payments {
    fn describe() -> Vec<ToolSpec> {
        let pi = json!({ "type": "string", "pattern": "^pi_[A-Za-z0-9_]{1,64}$", "description": "The payment intent to refund, e.g. pi_123." });
        vec![
            ToolSpec {
                name: "refund".into(),
                description: "Refunds part or all of a payment. Irreversible: every successful call moves money. \
                              If the outcome is reported unknown, do not call refund again: call refund_status first."
                    .into(),
                input_schema: json!({
                    "type": "object",
                    "properties": {
                        "payment_intent": pi,
                        "amount_cents": { "type": "integer", "minimum": 1, "maximum": 100_000_000, "description": "Amount to refund, in cents." },
                        "reason": { "type": "string", "enum": REASONS }
                    },
                    "required": ["payment_intent", "amount_cents", "reason"],
                    "additionalProperties": false
                })
                .to_string(),
                output_schema: Some(refund_schema().to_string()),
                effect: Effect::Irreversible,
            },
            ToolSpec {
                name: "refund_status".into(),
                description: "Lists the refunds of a payment intent, newest first, with the total refunded. Read-only.".into(),
                input_schema: json!({
                    "type": "object",
                    "properties": { "payment_intent": pi },
                    "required": ["payment_intent"],
                    "additionalProperties": false
                })
                .to_string(),
                output_schema: Some(
                    json!({
                        "type": "object",
                        "properties": {
                            "payment_intent": { "type": "string" },
                            "refunded_cents": { "type": "integer" },
                            "refunds": { "type": "array", "items": refund_schema() }
                        },
                        "required": ["payment_intent", "refunded_cents", "refunds"]
                    })
                    .to_string(),
                ),
                effect: Effect::ReadOnly,
            },
        ]
    }

    fn invoke(tool: String, args: String) -> Result<String, ToolError> {
        let args: Value = serde_json::from_str(&args).map_err(|e| ToolError::InvalidArgs(e.to_string()))?;
        let base = outbound::config("api_base")
            .ok_or_else(|| ToolError::Failed("the plugin setting `api_base` is not configured".into()))?;
        let pi = args["payment_intent"].as_str().unwrap_or_default();
        let out = match tool.as_str() {
            "refund" => refund(&base, pi, &args)?,
            "refund_status" => status(&base, pi)?,
            other => return Err(ToolError::InvalidArgs(format!("unknown tool {other}"))),
        };
        Ok(out.to_string())
    }
}

fn refund(base: &str, pi: &str, args: &Value) -> Result<Value, ToolError> {
    let body = form_urlencoded::Serializer::new(String::new())
        .append_pair("payment_intent", pi)
        .append_pair("amount", &args["amount_cents"].as_u64().unwrap_or_default().to_string())
        .append_pair("reason", args["reason"].as_str().unwrap_or_default())
        .finish();
    let request = Request {
        method: "POST".into(),
        url: format!("{}/v1/refunds", base.trim_end_matches('/')),
        headers: vec![Header { name: "Content-Type".into(), value: "application/x-www-form-urlencoded".into() }],
        body: body.into_bytes(),
    };
    match outbound::send(&request) {
        Ok(response) if (200..300).contains(&response.status) => Ok(summary(&json_body(&response)?)),
        Ok(response) if error_code(&response) == "charge_already_refunded" => Err(already_refunded(base, pi)),
        Ok(response) => Err(ToolError::Failed(declined(&response))),
        Err(OutboundError::OutcomeUnknown(info)) => Err(ToolError::Outbound(OutboundError::OutcomeUnknown(AttemptInfo {
            message: format!(
                "The outcome of this refund is unknown: the payment provider may already have made it. \
                 Do not call refund again. Call refund_status for payment intent {pi} first, and refund \
                 only if no matching refund is listed. (Host: {})",
                info.message
            ),
            ..info
        }))),
        Err(other) => Err(ToolError::Outbound(other)),
    }
}

/// A full refund was refused because the payment is already refunded: that
/// may be this very request's earlier attempt. Never a success; say what exists.
fn already_refunded(base: &str, pi: &str) -> ToolError {
    let existing = match list_refunds(base, pi) {
        Ok(list) => list.iter().map(|r| format!("{} ({} cents, {})", r["id"].as_str().unwrap_or("?"), r["amount"], r["status"].as_str().unwrap_or("?"))).collect::<Vec<_>>().join(", "),
        Err(_) => "unknown (the listing failed)".into(),
    };
    ToolError::Failed(format!(
        "The provider says payment {pi} is already fully refunded, possibly by an earlier attempt of this same refund. \
         Nothing new was refunded. Refunds on record: {existing}. Call refund_status before doing anything else."
    ))
}

/// The raw Stripe refund objects of `pi`, newest first.
fn list_refunds(base: &str, pi: &str) -> Result<Vec<Value>, ToolError> {
    let query = form_urlencoded::Serializer::new(String::new()).append_pair("payment_intent", pi).append_pair("limit", "100").finish();
    let request = Request {
        method: "GET".into(),
        url: format!("{}/v1/refunds?{query}", base.trim_end_matches('/')),
        headers: vec![],
        body: vec![],
    };
    let response = outbound::fetch(&request).map_err(ToolError::Outbound)?;
    if !(200..300).contains(&response.status) {
        return Err(ToolError::Failed(declined(&response)));
    }
    Ok(json_body(&response)?["data"].as_array().cloned().unwrap_or_default())
}

fn status(base: &str, pi: &str) -> Result<Value, ToolError> {
    let refunds: Vec<Value> = list_refunds(base, pi)?.iter().map(summary).collect();
    let refunded: u64 = refunds
        .iter()
        .filter(|r| !matches!(r["status"].as_str(), Some("failed" | "canceled")))
        .filter_map(|r| r["amount_cents"].as_u64())
        .sum();
    Ok(json!({ "payment_intent": pi, "refunded_cents": refunded, "refunds": refunds }))
}

/// The fields of a Stripe refund object the model needs.
fn summary(refund: &Value) -> Value {
    json!({
        "refund_id": refund["id"],
        "status": refund["status"],
        "amount_cents": refund["amount"],
        "payment_intent": refund["payment_intent"],
        "reason": refund["reason"],
    })
}

fn json_body(response: &Response) -> Result<Value, ToolError> {
    serde_json::from_slice(&response.body).map_err(|e| ToolError::Failed(format!("the provider answered with something that is not JSON: {e}")))
}

fn error_code(response: &Response) -> String {
    let body: Value = serde_json::from_slice(&response.body).unwrap_or(Value::Null);
    body["error"]["code"].as_str().unwrap_or_default().to_string()
}

impl exports::toolguard::plugin::reconciler::Guest for Payments {
    /// Finds the refund whose metadata carries the attempt's key.
    fn reconcile(tool: String, args: String, attempt: Attempt) -> Reconciliation {
        if tool != "refund" {
            return Reconciliation::StillUnknown(format!("`{tool}` has no side effects to reconcile"));
        }
        let Ok(args) = serde_json::from_str::<Value>(&args) else {
            return Reconciliation::StillUnknown("the arguments are not JSON".into());
        };
        let Some(base) = outbound::config("api_base") else {
            return Reconciliation::StillUnknown("the plugin setting `api_base` is not configured".into());
        };
        let field = outbound::config("key_metadata_field").unwrap_or_else(|| "toolguard_key".into());
        let pi = args["payment_intent"].as_str().unwrap_or_default();
        match list_refunds(&base, pi) {
            Err(e) => Reconciliation::StillUnknown(format!("listing the refunds of {pi} failed: {e:?}")),
            Ok(refunds) => match refunds.iter().find(|r| r["metadata"][&field].as_str() == Some(attempt.key.as_str())) {
                Some(refund) => Reconciliation::Found(Response {
                    status: 200,
                    headers: vec![Header { name: "content-type".into(), value: "application/json".into() }],
                    body: refund.to_string().into_bytes(),
                }),
                None => Reconciliation::NotFound,
            },
        }
    }
}

/// Stripe's error envelope, in one line.
fn declined(response: &Response) -> String {
    let body: Value = serde_json::from_slice(&response.body).unwrap_or(Value::Null);
    let error = &body["error"];
    let code = error["code"].as_str().unwrap_or("unknown");
    let message = error["message"].as_str().unwrap_or("no message");
    format!("the provider declined (HTTP {}, {code}): {message}", response.status)
}

export!(Payments);
