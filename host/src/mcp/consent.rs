//! The person at the client decides: a call awaiting a person's approval
//! (`guard/consent.rs`) is put to the client as an elicitation — inside its
//! task (`input_required`, answered by `tasks/update`); for a 2026-07-28
//! client that can elicit, as an `input_required` answer to the
//! `tools/call` itself, which the client retries with its `inputResponses`
//! (multi-round-trip requests); for a 2025-era session whose client can
//! elicit, as an `elicitation/create` request made while the `tools/call`
//! waits. The answer is recorded as the decision of
//! `client:<principal>`; where the client cannot be asked, an operator
//! decides (`toolguard approvals`).

use super::McpHost;
use crate::error::ErrorKind;
use crate::runtime::CallRequest;
use rmcp::RoleServer;
use rmcp::model::ElicitRequestParams;
use rmcp::service::RequestContext;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

/// What the key of an input request asking for approval starts with.
pub(crate) const APPROVAL_KEY: &str = "approval-";

/// The key of the input request that asks for approval `request`.
pub(crate) fn approval_key(request: &str) -> String {
    format!("{APPROVAL_KEY}{request}")
}

/// The approval request (`detail.approval`) an `awaiting-approval` answer carries.
pub(crate) fn awaited(answer: &Result<crate::CallOutput, crate::CallError>) -> Option<&Value> {
    match answer {
        Err(e) if e.kind == ErrorKind::AwaitingApproval => e.detail.as_ref()?.get("approval"),
        _ => None,
    }
}

/// The one input request asking the person at the client to decide
/// `approval` (`detail.approval`), under its key; with the request's id.
pub(crate) fn approval_requests(approval: &Value) -> Option<(String, rmcp::model::InputRequests)> {
    let request = approval["request"].as_str()?;
    let elicitation = json!({ "method": "elicitation/create", "params": question(approval) });
    let input = serde_json::from_value::<rmcp::model::InputRequest>(elicitation).ok()?;
    Some((request.to_string(), rmcp::model::InputRequests::from([(approval_key(request), input)])))
}

/// The longest a `tools/call` waits for the person at the client to answer.
const MAX_ASK: Duration = Duration::from_secs(600);

/// The decision an elicitation answer (`ElicitResult` as JSON) carries:
/// approve or not, with the person's note; `None` when dismissed (no
/// decision: the request stays open until it expires).
pub(crate) fn decision_of(answer: &Value) -> Option<(bool, Option<String>)> {
    let note = answer["content"]["note"].as_str().map(str::to_string);
    match answer["action"].as_str() {
        Some("accept") => Some((answer["content"]["approve"].as_bool().unwrap_or(false), note)),
        Some("decline") => Some((false, note)),
        _ => None,
    }
}

/// What the person is asked about approval `approval` (`detail.approval`).
pub(crate) fn question(approval: &Value) -> Value {
    let message = format!(
        "Approve this action? Tool call `{}` needs a person's approval: {}. Nothing has been sent.",
        approval["call_id"].as_str().unwrap_or(""),
        approval["reason"].as_str().unwrap_or("")
    );
    json!({ "message": message, "requestedSchema": { "type": "object", "required": ["approve"], "properties": {
        "approve": { "type": "boolean", "title": "Approve", "description": "Carry out exactly this action, once" },
        "note": { "type": "string", "title": "Note", "description": "Why (recorded with the decision)" } } } })
}

impl McpHost {
    /// Records `answer` (an elicitation answer, as JSON) of the person at
    /// the client as the decision on approval `request` of `call`, by
    /// `client:<principal>`: `Some(approved)`, or `None` when the person
    /// dismissed it (no decision; the request stays open until it expires).
    ///
    /// # Errors
    /// In words: no such request waiting, or the ledger failed.
    pub(super) async fn decide_at_client(&self, call: &CallRequest, request: &str, answer: &Value) -> Result<Option<bool>, String> {
        let (Some((approve, note)), Some(guard)) = (decision_of(answer), self.runtime().guard().cloned()) else { return Ok(None) };
        let by = format!("client:{}", call.principal.as_deref().unwrap_or("unauthenticated"));
        let decision = crate::ledger::Decision { approve, by: &by, note: note.as_deref() };
        guard.decide_approval(&call.session, &call.call_id, request, decision).await?;
        Ok(Some(approve))
    }

    /// Records the decisions a retried `tools/call` carries in its
    /// `inputResponses` (answers to the approval it was asked for). Only a
    /// request still waiting for this very call is decided; the other keys
    /// answer the tool's own questions ([`super::questions`]).
    ///
    /// # Errors
    /// `-32602` for an answer to no approval of this call.
    pub(super) async fn record_responses(&self, call: &CallRequest, responses: &rmcp::model::InputResponses) -> Result<(), rmcp::ErrorData> {
        for (key, answer) in responses {
            let Some(request) = key.strip_prefix(APPROVAL_KEY) else { continue };
            self.decide_at_client(call, request, answer).await.map_err(|e| rmcp::ErrorData::invalid_params(e, None))?;
        }
        Ok(())
    }

    /// `answer` to `call`, or, if it awaits approval and the client can be
    /// asked while the call waits, the answer of the call run again after
    /// the person at the client decided.
    pub(super) async fn ask_at_client(
        &self,
        cx: &RequestContext<RoleServer>,
        (call, runtime): (&CallRequest, &crate::Runtime),
        inputs: &Arc<crate::runtime::client::journal::Inputs>,
        answer: Result<crate::CallOutput, crate::CallError>,
    ) -> Result<crate::CallOutput, crate::CallError> {
        let approval = awaited(&answer).cloned();
        let can_ask = cx.meta.protocol_version().is_none() && cx.client_capabilities().is_some_and(|c| c.elicitation.is_some());
        let (Some(approval), true) = (approval, can_ask) else { return answer };
        let Ok(params) = serde_json::from_value::<ElicitRequestParams>(question(&approval)) else { return answer };
        let left = approval["expires_ms"].as_u64().unwrap_or(0).saturating_sub(crate::ledger::records::now_ms());
        let asked = cx.peer.create_elicitation_with_timeout(params, Some(Duration::from_millis(left).min(MAX_ASK))).await;
        let Some(said) = asked.ok().and_then(|r| serde_json::to_value(r).ok()) else { return answer };
        match self.decide_at_client(call, approval["request"].as_str().unwrap_or_default(), &said).await {
            Ok(Some(_)) => {}
            Ok(None) => return answer,
            Err(why) => {
                tracing::warn!(call_id = %call.call_id, %why, "the client's decision was not recorded");
                return answer;
            }
        }
        runtime.call_answering(call, inputs.clone()).await
    }
}
