//! A tool's own questions to the client (`toolguard:plugin/client`,
//! `docs/questions.md`). A run that stops at a round of questions answers
//! `input-required` ([`crate::runtime::client`]); here the round is put to
//! the client and the call run again with the answers: for a 2025-11-25
//! session, as `elicitation/create`, `sampling/createMessage` and
//! `roots/list` requests made while the `tools/call` waits; for a
//! 2026-07-28 client, as an `input_required` answer the client retries with
//! its `inputResponses` and the `requestState` we sealed — the rounds it
//! answered so far, bound to the principal and the exact call, and
//! verified before anything in it is believed; inside a task, through the
//! task (`tasks/update`).

use super::McpHost;
use crate::error::ErrorKind;
use crate::policy::QuestionKind;
use crate::runtime::CallRequest;
use crate::runtime::questions::MAX_ROUNDS;
use crate::runtime::questions::journal::{Inputs, Pending, Question, Round};
use rmcp::model::{InputRequest, InputRequests, RequestStateCodec, SealOptions, ServerRequest};
use rmcp::service::PeerRequestOptions;
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// A call's answer.
type Answer = Result<crate::CallOutput, crate::CallError>;

/// How long a sealed `requestState` stays good.
const STATE_TTL: Duration = Duration::from_secs(3_600);

/// The longest a `tools/call` waits for a 2025-era client to answer one question.
const MAX_WAIT: Duration = Duration::from_secs(600);

/// What a 2026-07-28 client echoes between rounds (sealed).
#[derive(Serialize, Deserialize)]
struct State {
    /// The rounds answered so far.
    journal: Vec<Round>,
    /// The round the client is asked now ([`crate::runtime::questions::journal::digest`]).
    asked: Option<String>,
    /// The key under which a person's approval was asked of this client
    /// now ([`super::approval::fresh_key`]): the only approval answer taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    approval: Option<String>,
}

/// The kinds of question the client of `cx` declared it answers.
pub(crate) fn askable(cx: &RequestContext<RoleServer>) -> Vec<QuestionKind> {
    let Some(caps) = cx.client_capabilities() else { return Vec::new() };
    let declared = [
        (QuestionKind::Elicitation, caps.elicitation.is_some()),
        (QuestionKind::Sampling, caps.sampling.is_some()),
        (QuestionKind::Roots, caps.roots.is_some()),
    ];
    declared.into_iter().filter_map(|(kind, yes)| yes.then_some(kind)).collect()
}

/// The round an `input-required` answer stopped at.
pub(crate) fn asked(answer: &Answer) -> Option<Pending> {
    match answer {
        Err(e) if e.kind == ErrorKind::InputRequired => Pending::of(e.detail.as_ref()),
        _ => None,
    }
}

/// One question as the MCP request that asks it.
fn request(question: &Question) -> Result<InputRequest, String> {
    let wire = match question.kind {
        QuestionKind::Roots => json!({ "method": question.kind.method() }),
        kind => json!({ "method": kind.method(), "params": question.params }),
    };
    serde_json::from_value(wire).map_err(|e| format!("question `{}` is not a valid {} request: {e}", question.key, question.kind.method()))
}

/// The round's questions as input requests, by key.
///
/// # Errors
/// A question that is no valid MCP request, in words.
pub(crate) fn requests(pending: &Pending) -> Result<InputRequests, String> {
    pending.questions.iter().map(|q| Ok((q.key.clone(), request(q)?))).collect()
}

/// `answer` with its message saying why its questions got no answer.
fn unanswered(answer: Answer, why: &str) -> Answer {
    answer.map_err(|mut e| {
        e.message = format!("{why}; nothing after the questions has run. {}", e.message);
        e
    })
}

impl McpHost {
    /// The codec sealing `requestState` ([`super::handles`]).
    fn codec(&self) -> &RequestStateCodec {
        self.handles.states(|| self.runtime())
    }

    /// What the state sealed for `call` is bound to: its principal, session,
    /// tool and arguments, and its tool-call id (unless minted here for a
    /// read-only call sent without one: its retry gets another).
    fn bound_to(call: &CallRequest) -> Vec<u8> {
        let args = serde_json::from_str::<Value>(&call.args_json).ok().and_then(|a| crate::keys::canonical_args(&a).ok()).unwrap_or_default();
        let id = Some(&call.call_id).filter(|id| !super::ids::minted_for_read(id));
        serde_json::to_vec(&json!([call.principal, call.session, id, call.tool, crate::keys::args_digest(&args)])).unwrap_or_default()
    }

    /// `requestState` for `call`: its `journal`, and the round asked now.
    pub(super) fn seal(&self, call: &CallRequest, journal: Vec<Round>, asked: Option<String>) -> String {
        self.seal_state(call, &State { journal, asked, approval: None })
    }

    /// `state`, sealed for `call`.
    fn seal_state(&self, call: &CallRequest, state: &State) -> String {
        let bound = Self::bound_to(call);
        let options = SealOptions::new().associated_data(&bound).ttl(STATE_TTL);
        self.codec().seal_json_with(state, &options).unwrap_or_default()
    }

    /// What a run of `call` may answer its questions with: the client's
    /// capabilities, the rounds its `requestState` carries (verified), the
    /// answers its `inputResponses` offer for the round asked; and the key
    /// of the approval question the state says was put to this client.
    ///
    /// # Errors
    /// `-32602` for a `requestState` this host did not seal for this very
    /// call (tampered, expired, another principal's or another call's).
    pub(super) fn inputs(
        &self,
        cx: &RequestContext<RoleServer>,
        call: &CallRequest,
        (state, responses): (Option<&String>, Option<&rmcp::model::InputResponses>),
    ) -> Result<(Inputs, Option<String>), ErrorData> {
        let mut inputs = Inputs { askable: askable(cx), ..Inputs::default() };
        let mut approval = None;
        if let Some(sealed) = state {
            let state: State = self.codec().open_json_with(sealed, &Self::bound_to(call)).map_err(|e| {
                ErrorData::invalid_params(format!("requestState was not issued by this host for this call ({e}); call again without it to start over"), None)
            })?;
            (inputs.journal, inputs.offered_for, approval) = (state.journal, state.asked, state.approval);
        }
        let offered = responses.into_iter().flatten().filter(|(key, _)| !key.starts_with(super::approval::APPROVAL_KEY));
        inputs.offered = offered.map(|(k, v)| (k.clone(), v.clone())).collect();
        Ok((inputs, approval))
    }

    /// For a 2025-era session: `answer`, or while it stops at questions,
    /// the answer of `call` run again once the client answered them (each
    /// round asked while the `tools/call` waits).
    pub(super) async fn ask_live(
        &self,
        cx: &RequestContext<RoleServer>,
        (call, runtime): (&CallRequest, &crate::Runtime),
        inputs: &Inputs,
        mut answer: Answer,
    ) -> Answer {
        if cx.meta.protocol_version().is_some() {
            return answer;
        }
        for _ in 0..=MAX_ROUNDS {
            let Some(pending) = asked(&answer) else { return answer };
            let mut answers = BTreeMap::new();
            for question in &pending.questions {
                let asked = match request(question) {
                    Ok(InputRequest::Elicitation(r)) => ServerRequest::ElicitRequest(r),
                    Ok(InputRequest::CreateMessage(r)) => ServerRequest::CreateMessageRequest(r),
                    Ok(InputRequest::ListRoots(r)) => ServerRequest::ListRootsRequest(r),
                    Ok(_) => return unanswered(answer, "the tool asked what MCP cannot ask"),
                    Err(why) => return unanswered(answer, &why),
                };
                let sent = cx.peer.send_request_with_option(asked, PeerRequestOptions::with_timeout(MAX_WAIT)).await;
                match sent {
                    Ok(handle) => match handle.await_response().await {
                        Ok(said) => answers.insert(question.key.clone(), serde_json::to_value(said).unwrap_or_default()),
                        Err(e) => return unanswered(answer, &format!("the client did not answer `{}` ({e})", question.key)),
                    },
                    Err(e) => return unanswered(answer, &format!("`{}` could not be put to the client ({e})", question.key)),
                };
            }
            let Some(journal) = pending.answered_by(&answers) else {
                return unanswered(answer, "the client's answers are not results of the requests asked");
            };
            let next = Inputs { askable: inputs.askable.clone(), journal, ..Inputs::default() };
            answer = runtime.call_answering(call, Arc::new(next)).await;
        }
        answer
    }

    /// For a 2026-07-28 client, the `input_required` answer to a call that
    /// awaits a person's approval (if the client can elicit) or stops at its
    /// tool's questions: the input requests, and the `requestState` sealed
    /// for this call (the rounds answered so far, the round asked now).
    pub(super) fn input_required(
        &self,
        cx: &RequestContext<RoleServer>,
        (call, inputs): (&CallRequest, &crate::runtime::questions::journal::Inputs),
        answer: &Result<crate::CallOutput, crate::CallError>,
    ) -> Option<rmcp::model::InputRequiredResult> {
        // Only a 2026-07-28 request can be answered `input_required`.
        cx.meta.protocol_version()?;
        if let Some(pending) = asked(answer) {
            let requests = requests(&pending).ok()?;
            let state = self.seal(call, pending.journal, Some(pending.digest));
            return Some(rmcp::model::InputRequiredResult::new(Some(requests), Some(state)));
        }
        let approval = super::approval::awaited(answer)?;
        if cx.client_capabilities().is_none_or(|c| c.elicitation.is_none()) {
            return None;
        }
        // Asked under a new key each time: the only approval answer the retry may carry.
        let key = super::approval::fresh_key(approval["request"].as_str()?);
        let requests = super::approval::approval_requests(approval, &key)?;
        let state = State { journal: inputs.journal.clone(), asked: inputs.offered_for.clone(), approval: Some(key) };
        Some(rmcp::model::InputRequiredResult::new(Some(requests), Some(self.seal_state(call, &state))))
    }
}
