//! Refund tools that speak Stripe's wire format for this subset, so the same
//! component works against Stripe's test mode (the host injects the API key)
//! and against toolguard's payments sandbox:
//!
//! - `refund` (irreversible): form-encoded `POST /v1/refunds` with
//!   `payment_intent`, `amount`, `reason`.
//! - `refund_status` (read-only): `GET /v1/refunds?payment_intent=…`, every
//!   page of it (Stripe's `has_more` and `starting_after`).
//!
//! The provider's base URL comes from the plugin setting `api_base`. The
//! idempotency key is the host's business: this plugin never sees it when
//! sending. When the outcome of a refund is unknown, the tool says so plainly
//! and tells the model to check `refund_status` before anything else.
//!
//! It also reconciles: given an attempt whose outcome is unknown, it lists the
//! payment intent's refunds, page after page, and looks for the one whose
//! metadata carries the attempt's key (the host puts it there; the metadata
//! field is the setting `key_metadata_field`, default `toolguard_key`). A
//! refund older than the newest hundred is still found.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use toolguard_sdk::{Attempt, AttemptInfo, OutboundError, Plugin, Reconcile, Reconciliation, Request, Response, ToolError, Tools, config, found};

/// A payment intent id, e.g. `pi_123`.
const PAYMENT_INTENT: &str = "^pi_[A-Za-z0-9_]{1,64}$";

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct RefundArgs {
    /// The payment intent to refund, e.g. pi_123.
    #[schemars(regex(pattern = PAYMENT_INTENT))]
    payment_intent: String,
    /// Amount to refund, in cents.
    #[schemars(range(min = 1, max = 100_000_000))]
    amount_cents: u64,
    reason: Reason,
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy)]
#[serde(rename_all = "snake_case")]
#[schemars(inline)]
enum Reason {
    Duplicate,
    Fraudulent,
    RequestedByCustomer,
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct StatusArgs {
    /// The payment intent to refund, e.g. pi_123.
    #[schemars(regex(pattern = PAYMENT_INTENT))]
    payment_intent: String,
}

/// A Stripe refund object, as much of it as these tools read.
#[derive(Serialize, Deserialize)]
struct StripeRefund {
    id: String,
    status: String,
    amount: u64,
    payment_intent: String,
    reason: Option<String>,
    #[serde(default)]
    metadata: BTreeMap<String, String>,
    /// Everything else, kept so a reconciled refund is the provider's whole object.
    #[serde(flatten)]
    rest: serde_json::Map<String, serde_json::Value>,
}

/// The fields of a refund the model needs.
#[derive(Serialize, JsonSchema)]
struct RefundSummary {
    refund_id: String,
    /// pending, requires_action, succeeded, failed or canceled.
    status: String,
    amount_cents: u64,
    payment_intent: String,
    reason: Option<String>,
}

impl From<&StripeRefund> for RefundSummary {
    fn from(r: &StripeRefund) -> Self {
        RefundSummary {
            refund_id: r.id.clone(),
            status: r.status.clone(),
            amount_cents: r.amount,
            payment_intent: r.payment_intent.clone(),
            reason: r.reason.clone(),
        }
    }
}

#[derive(Serialize, JsonSchema)]
struct Status {
    payment_intent: String,
    refunded_cents: u64,
    /// Newest first.
    refunds: Vec<RefundSummary>,
}

fn api_base() -> Result<String, ToolError> {
    let base = config("api_base").ok_or_else(|| ToolError::Failed("the plugin setting `api_base` is not configured".into()))?;
    Ok(base.trim_end_matches('/').to_string())
}

fn refund(args: RefundArgs) -> Result<RefundSummary, ToolError> {
    let base = api_base()?;
    let pi = &args.payment_intent;
    let amount = args.amount_cents.to_string();
    let reason = serde_json::to_value(args.reason).unwrap_or_default();
    let request =
        Request::post(format!("{base}/v1/refunds")).form(&[("payment_intent", pi), ("amount", &amount), ("reason", reason.as_str().unwrap_or_default())]);
    match request.send() {
        Ok(response) if response.is_success() => Ok(RefundSummary::from(&response.json::<StripeRefund>()?)),
        Ok(response) if error_code(&response) == "charge_already_refunded" => Err(already_refunded(&base, pi)),
        Ok(response) => Err(ToolError::Failed(declined(&response))),
        Err(OutboundError::OutcomeUnknown(info)) => Err(OutboundError::OutcomeUnknown(AttemptInfo {
            message: format!(
                "The outcome of this refund is unknown: the payment provider may already have made it. \
                 Do not call refund again. Call refund_status for payment intent {pi} first, and refund \
                 only if no matching refund is listed. (Host: {})",
                info.message
            ),
            ..info
        })
        .into()),
        Err(other) => Err(other.into()),
    }
}

/// A full refund was refused because the payment is already refunded: that
/// may be this very request's earlier attempt. Never a success; say what exists.
fn already_refunded(base: &str, pi: &str) -> ToolError {
    // The newest page is enough to say what exists.
    let existing = match list_refunds_until(base, pi, |_| true) {
        Ok(list) => list.iter().map(|r| format!("{} ({} cents, {})", r.id, r.amount, r.status)).collect::<Vec<_>>().join(", "),
        Err(_) => "unknown (the listing failed)".into(),
    };
    ToolError::Failed(format!(
        "The provider says payment {pi} is already fully refunded, possibly by an earlier attempt of this same refund. \
         Nothing new was refunded. Refunds on record: {existing}. Call refund_status before doing anything else."
    ))
}

/// The most pages of refunds one look-up reads: 15 pages of 100, the
/// refunds of any real payment many times over, within the host's default
/// budget of 16 outbound calls per invocation (`max_outbound_calls`). Past
/// it, the look-up fails rather than answer from part of the list.
const MAX_PAGES: usize = 15;

/// The refunds of `pi`, newest first: page after page (Stripe's
/// `starting_after` cursor) until `enough` says a refund read is the one
/// sought, or the list ends. Never a "not there" from the first page alone.
fn list_refunds_until(base: &str, pi: &str, enough: impl Fn(&StripeRefund) -> bool) -> Result<Vec<StripeRefund>, ToolError> {
    #[derive(Deserialize)]
    struct Page {
        data: Vec<StripeRefund>,
        #[serde(default)]
        has_more: bool,
    }
    let mut refunds: Vec<StripeRefund> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for _ in 0..MAX_PAGES {
        let mut query = vec![("payment_intent", pi), ("limit", "100")];
        let cursor = refunds.last().map(|r| r.id.clone());
        if let Some(after) = &cursor {
            query.push(("starting_after", after));
        }
        let response = Request::get(format!("{base}/v1/refunds")).query(&query).fetch()?;
        if !response.is_success() {
            return Err(ToolError::Failed(declined(&response)));
        }
        let page = response.json::<Page>()?;
        // A listing that does not move past its cursor cannot be read to its end.
        let repeated = page.data.iter().find(|r| !seen.insert(r.id.clone()));
        if repeated.is_some() || (page.has_more && page.data.is_empty()) {
            let sent = repeated.map_or_else(|| "an empty page".to_string(), |r| format!("{} again", r.id));
            return Err(ToolError::Failed(format!("the provider's listing of {pi} does not page past {cursor:?}: it sent {sent}")));
        }
        let done = !page.has_more || page.data.iter().any(&enough);
        refunds.extend(page.data);
        if done {
            return Ok(refunds);
        }
    }
    Err(ToolError::Failed(format!("payment {pi} has more than {} refunds; not all of them were read", MAX_PAGES * 100)))
}

/// All the refunds of `pi`, newest first.
fn list_refunds(base: &str, pi: &str) -> Result<Vec<StripeRefund>, ToolError> {
    list_refunds_until(base, pi, |_| false)
}

fn refund_status(args: StatusArgs) -> Result<Status, ToolError> {
    let refunds: Vec<RefundSummary> = list_refunds(&api_base()?, &args.payment_intent)?.iter().map(RefundSummary::from).collect();
    let refunded_cents = refunds.iter().filter(|r| !matches!(r.status.as_str(), "failed" | "canceled")).map(|r| r.amount_cents).sum();
    Ok(Status { payment_intent: args.payment_intent, refunded_cents, refunds })
}

/// Stripe's error envelope, in one line.
fn declined(response: &Response) -> String {
    let body: serde_json::Value = serde_json::from_slice(response.body()).unwrap_or_default();
    let error = &body["error"];
    let code = error["code"].as_str().unwrap_or("unknown");
    let message = error["message"].as_str().unwrap_or("no message");
    format!("the provider declined (HTTP {}, {code}): {message}", response.status())
}

fn error_code(response: &Response) -> String {
    let body: serde_json::Value = serde_json::from_slice(response.body()).unwrap_or_default();
    body["error"]["code"].as_str().unwrap_or_default().to_string()
}

struct Payments;

impl Plugin for Payments {
    fn tools() -> Tools {
        Tools::new()
            .irreversible(
                "refund",
                "Refunds part or all of a payment. Irreversible: every successful call moves money. \
                 If the outcome is reported unknown, do not call refund again: call refund_status first.",
                refund,
            )
            .read_only("refund_status", "Lists the refunds of a payment intent, newest first, with the total refunded. Read-only.", refund_status)
    }
}

impl Reconcile for Payments {
    /// Finds the refund whose metadata carries the attempt's key.
    fn reconcile(tool: &str, args: &str, attempt: &Attempt) -> Reconciliation {
        if tool != "refund" {
            return Reconciliation::StillUnknown(format!("`{tool}` has no side effects to reconcile"));
        }
        #[derive(Deserialize)]
        struct Args {
            payment_intent: String,
        }
        let Ok(args) = serde_json::from_str::<Args>(args) else {
            return Reconciliation::StillUnknown("the arguments are not those of a refund".into());
        };
        let Ok(base) = api_base() else {
            return Reconciliation::StillUnknown("the plugin setting `api_base` is not configured".into());
        };
        let field = config("key_metadata_field").unwrap_or_else(|| "toolguard_key".into());
        let made_by = |r: &StripeRefund| r.metadata.get(&field) == Some(&attempt.key);
        match list_refunds_until(&base, &args.payment_intent, made_by) {
            Err(e) => Reconciliation::StillUnknown(format!("listing the refunds of {} failed: {e:?}", args.payment_intent)),
            Ok(refunds) => match refunds.iter().find(|r| made_by(r)) {
                Some(refund) => found(refund),
                None => Reconciliation::NotFound,
            },
        }
    }
}

toolguard_sdk::export!(Payments with Reconcile);
