//! The person at the client decides: a call awaiting a person's approval
//! (`guard/approval.rs`) is put to the client as an elicitation — inside its
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

/// A key never used before for putting approval `request` to a client:
/// `approval-<request>.<random>`. Each time the question is put again (the
/// person dismissed it, or the answer was not one), it gets a new key, as
/// the Tasks extension requires of a key whose answer was delivered; and
/// the random part is not in what the model is told (`detail.approval`
/// names only the request), so only the client that was asked can answer.
pub(crate) fn fresh_key(request: &str) -> String {
    let mut nonce = [0u8; 8];
    getrandom::fill(&mut nonce).expect("the OS provides randomness");
    format!("{APPROVAL_KEY}{request}.{}", hex::encode(nonce))
}

/// The approval request a key made by [`fresh_key`] asks about.
pub(crate) fn request_of(key: &str) -> Option<&str> {
    key.strip_prefix(APPROVAL_KEY)?.split_once('.').map(|(request, _)| request)
}

/// The approval request (`detail.approval`) an `awaiting-approval` answer carries.
pub(crate) fn awaited(answer: &Result<crate::CallOutput, crate::CallError>) -> Option<&Value> {
    match answer {
        Err(e) if e.kind == ErrorKind::AwaitingApproval => e.detail.as_ref()?.get("approval"),
        _ => None,
    }
}

/// The one input request asking the person at the client to decide
/// `approval` (`detail.approval`), under `key`.
pub(crate) fn approval_requests(approval: &Value, key: &str) -> Option<rmcp::model::InputRequests> {
    let elicitation = json!({ "method": "elicitation/create", "params": question(approval) });
    let input = serde_json::from_value::<rmcp::model::InputRequest>(elicitation).ok()?;
    Some(rmcp::model::InputRequests::from([(key.to_string(), input)]))
}

/// The longest a `tools/call` waits for the person at the client to answer.
const MAX_ASK: Duration = Duration::from_secs(600);

/// What an elicitation answer to an approval question says.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Said {
    /// Approve (or not), with the person's note.
    Decided(bool, Option<String>),
    /// Dismissed (`cancel`): no decision; the question is put again until it expires.
    Dismissed,
}

/// What an elicitation answer (`ElicitResult` as JSON) to an approval
/// question says.
///
/// # Errors
/// In words, for anything that is not an answer to that question: not an
/// object, an unknown action, `accept` whose `content.approve` is missing or
/// not a boolean. Nothing is decided on such an answer.
pub(crate) fn decision_of(answer: &Value) -> Result<Said, String> {
    let note = answer["content"]["note"].as_str().map(str::to_string);
    match answer["action"].as_str() {
        Some("accept") => match answer["content"]["approve"].as_bool() {
            Some(approve) => Ok(Said::Decided(approve, note)),
            None => Err("an `accept` answer to an approval carries `content.approve`, true or false".into()),
        },
        Some("decline") => Ok(Said::Decided(false, note)),
        Some("cancel") => Ok(Said::Dismissed),
        _ => {
            Err("an answer to an approval is an elicitation result: {\"action\": \"accept\", \"content\": {\"approve\": true}}, or `decline`, or `cancel`"
                .into())
        }
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
    /// In words: not an answer to the question ([`decision_of`]), no such
    /// request waiting, or the ledger failed.
    pub(super) async fn decide_at_client(&self, call: &CallRequest, request: &str, answer: &Value) -> Result<Option<bool>, String> {
        let Said::Decided(approve, note) = decision_of(answer)? else { return Ok(None) };
        let Some(guard) = self.runtime().guard().cloned() else { return Ok(None) };
        let by = format!("client:{}", call.principal.as_deref().unwrap_or("unauthenticated"));
        let decision = crate::ledger::Decision { approve, by: &by, note: note.as_deref() };
        guard.decide_approval(&call.session, &call.call_id, request, decision).await?;
        Ok(Some(approve))
    }

    /// Records the decision a retried `tools/call` carries in its
    /// `inputResponses` for the approval question its `requestState` says
    /// was put to this client (`asked`, the key). Answers under any other
    /// `approval-` key are ignored: never asked of this client, or asked
    /// before and answered then. The other keys answer the tool's own
    /// questions ([`super::questions`]).
    ///
    /// # Errors
    /// `-32602` for an answer that is not one to the question asked.
    pub(super) async fn record_responses(
        &self,
        call: &CallRequest,
        responses: &rmcp::model::InputResponses,
        asked: Option<&str>,
    ) -> Result<(), rmcp::ErrorData> {
        let Some((key, answer)) = asked.and_then(|key| responses.get_key_value(key)) else { return Ok(()) };
        let Some(request) = request_of(key) else { return Ok(()) };
        self.decide_at_client(call, request, answer).await.map_err(|e| rmcp::ErrorData::invalid_params(format!("`{key}`: {e}; nothing was decided"), None))?;
        Ok(())
    }

    /// `answer` to `call`, or, if it awaits approval and the client can be
    /// asked while the call waits, the answer of the call run again after
    /// the person at the client decided.
    pub(super) async fn ask_at_client(
        &self,
        cx: &RequestContext<RoleServer>,
        (call, runtime): (&CallRequest, &crate::Runtime),
        inputs: &Arc<crate::runtime::questions::journal::Inputs>,
        answer: Result<crate::CallOutput, crate::CallError>,
    ) -> Result<crate::CallOutput, crate::CallError> {
        let approval = awaited(&answer).cloned();
        let can_ask = cx.meta.protocol_version().is_none() && cx.client_capabilities().is_some_and(|c| c.elicitation.is_some());
        let (Some(approval), true) = (approval, can_ask) else { return answer };
        let Ok(params) = serde_json::from_value::<ElicitRequestParams>(question(&approval)) else { return answer };
        let left = approval["expires_ms"].as_u64().unwrap_or(0).saturating_sub(crate::ledger::records::now_ms());
        let asked = cx.peer.create_elicitation_with_timeout(params, Some(Duration::from_millis(left).min(MAX_ASK))).await;
        let Some(said) = asked.ok().and_then(|r| serde_json::to_value(r).ok()) else { return answer };
        // A dismissal, or an answer that is none, decides nothing: the call still awaits approval.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_answer_to_the_question_decides() {
        let said = |v: Value| decision_of(&v);
        assert_eq!(said(json!({ "action": "accept", "content": { "approve": true, "note": "ok" } })), Ok(Said::Decided(true, Some("ok".into()))));
        assert_eq!(said(json!({ "action": "accept", "content": { "approve": false } })), Ok(Said::Decided(false, None)));
        assert_eq!(said(json!({ "action": "decline" })), Ok(Said::Decided(false, None)));
        assert_eq!(said(json!({ "action": "cancel" })), Ok(Said::Dismissed));
        for bad in [
            json!("yes"),
            json!({ "action": "accept" }),
            json!({ "action": "accept", "content": { "approve": "yes" } }),
            json!({ "action": "ok" }),
            json!(null),
        ] {
            assert!(said(bad.clone()).is_err(), "{bad}");
        }
    }

    #[test]
    fn each_key_is_new_and_names_its_request() {
        let (a, b) = (fresh_key("r1"), fresh_key("r1"));
        assert_ne!(a, b, "a question put again gets a new key");
        assert_eq!((request_of(&a), request_of(&b)), (Some("r1"), Some("r1")));
        assert_eq!(request_of("approval-r1"), None, "the unkeyed layout of before names nothing");
    }
}
