//! The `toolguard:plugin/client` capability — questions to the MCP client
//! mid-call — in one place: its per-invocation state ([`Asking`]) and its
//! linking. Deny by default: only the kinds the plugin's policy grants
//! (`ask_client`) and its call's client can answer are asked; a component
//! importing the interface without any grant never loads.
//!
//! A question never keeps a plugin waiting on a person: a round the
//! client has not answered ends the run (it traps, [`Asking::pending`]
//! says why) and the call answers `input-required` with the round; the MCP
//! side puts it to the client and runs the call again with the answers
//! ([`journal`]).

pub mod journal;

use super::bindings::client;
use crate::policy::QuestionKind;
use journal::{Inputs, Pending, Question, Round};
use serde_json::Value;
use std::sync::Arc;
use wasmtime::component::{HasData, Linker};

/// The most rounds of questions one tool call may ask.
pub const MAX_ROUNDS: usize = 10;
/// The most questions in one round.
const MAX_QUESTIONS: usize = 8;
/// The largest params of one question, as JSON text.
const MAX_PARAMS_BYTES: usize = 16 << 10;
/// What a question's key may not start with: the host's own approval questions.
const RESERVED: &str = "approval-";

/// The questions capability's state for one invocation.
#[derive(Default)]
pub struct Asking {
    /// The kinds the plugin's policy grants.
    granted: Vec<QuestionKind>,
    /// What the call's client can answer, and has answered.
    inputs: Arc<Inputs>,
    /// The rounds this run asked and got answers for, in order.
    answered: Vec<Round>,
    /// The round this run stopped at, if it did.
    pub(crate) pending: Option<Pending>,
    /// Where the run's sends find its answered rounds, to record them.
    recording: Option<crate::guard::Answered>,
}

impl Asking {
    /// The capability for a run of a plugin granted `granted`, answering from `inputs`.
    pub(crate) fn new(granted: &[QuestionKind], inputs: Arc<Inputs>) -> Self {
        Self { granted: granted.to_vec(), inputs, answered: Vec::new(), pending: None, recording: None }
    }

    /// Shares each round answered with the run's sends, which record them (`guard::Answered`).
    pub(crate) fn recording(self, recording: Option<crate::guard::Answered>) -> Self {
        Self { recording, ..self }
    }

    /// The rounds answered so far are now `answered`.
    fn answered(&mut self, answered: Vec<Round>) {
        if let Some(recording) = &self.recording {
            recording.set(serde_json::to_value(&answered).unwrap_or_default());
        }
        self.answered = answered;
    }

    /// The kinds the plugin may ask and its client can answer.
    fn can_ask(&self) -> Vec<QuestionKind> {
        self.granted.iter().copied().filter(|k| self.inputs.askable.contains(k)).collect()
    }

    /// One round: its answers from the journal or the client's offer, else
    /// the run stops ([`Asking::pending`]).
    fn round(&mut self, questions: Vec<Question>) -> wasmtime::Result<Result<Vec<Value>, client::AskError>> {
        if let Err(e) = self.check(&questions) {
            return Ok(Err(e));
        }
        let digest = journal::digest(&questions);
        let round = self.answered.len();
        if let Some(known) = self.inputs.journal.get(round).filter(|r| r.digest == digest && r.answers.len() == questions.len()) {
            let answers = known.answers.clone();
            let mut answered = std::mem::take(&mut self.answered);
            answered.push(known.clone());
            self.answered(answered);
            return Ok(Ok(answers));
        }
        let pending = Pending { round, digest, questions, journal: self.answered.clone() };
        let offered_here = match &self.inputs.offered_for {
            Some(d) => *d == pending.digest,
            None => round == self.inputs.journal.len(),
        };
        if let Some(journal) = pending.answered_by(&self.inputs.offered).filter(|_| offered_here) {
            let answers = journal.last().map(|r| r.answers.clone()).unwrap_or_default();
            self.answered(journal);
            return Ok(Ok(answers));
        }
        let asked = pending.questions.len();
        self.pending = Some(pending);
        Err(wasmtime::Error::msg(format!("the run stops at {asked} question(s) for the client; the call goes on once they are answered")))
    }

    /// Why `questions` may not be asked, if they may not.
    fn check(&self, questions: &[Question]) -> Result<(), client::AskError> {
        let invalid = |m: String| Err(client::AskError::Invalid(m));
        if questions.is_empty() || questions.len() > MAX_QUESTIONS {
            return invalid(format!("a round asks 1 to {MAX_QUESTIONS} questions, not {}", questions.len()));
        }
        if self.answered.len() >= MAX_ROUNDS {
            return invalid(format!("a tool call asks at most {MAX_ROUNDS} rounds of questions"));
        }
        for (i, q) in questions.iter().enumerate() {
            let good_key = (1..=64).contains(&q.key.len())
                && q.key.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
                && !q.key.starts_with(RESERVED);
            if !good_key {
                return invalid(format!("question key `{}`: use 1–64 of A-Z a-z 0-9 _ . - (not starting with `{RESERVED}`)", q.key));
            }
            if questions[..i].iter().any(|p| p.key == q.key) {
                return invalid(format!("question key `{}` twice in one round", q.key));
            }
            if !self.granted.contains(&q.kind) {
                return Err(client::AskError::Denied(format!("the plugin's policy does not grant asking `{}` (ask_client)", q.kind.as_str())));
            }
            if !self.inputs.askable.contains(&q.kind) {
                return Err(client::AskError::Unsupported(format!(
                    "this call's client cannot answer `{}` (it did not declare it, or there is no MCP client)",
                    q.kind.method()
                )));
            }
        }
        Ok(())
    }
}

/// What a guarded run of a plugin granted `granted` answers its questions
/// from — `inputs`, the rounds its call's earlier runs recorded with their
/// sends first — and, for its questions capability, where its sends find
/// the rounds it answers to record them (`guard::Answered`).
///
/// # Errors
/// The ledger could not be read.
pub(crate) async fn recorded(
    call: Option<&mut crate::guard::CallGuard>,
    granted: &[QuestionKind],
    inputs: Arc<Inputs>,
) -> Result<(Arc<Inputs>, Option<crate::guard::Answered>), crate::error::CallError> {
    let Some(call) = call.filter(|_| !granted.is_empty()) else { return Ok((inputs, None)) };
    let recorded: Vec<Round> = call.earlier_answers().await?.and_then(|v| serde_json::from_value(v).ok()).unwrap_or_default();
    let answered = crate::guard::Answered::default();
    call.record_answers(answered.clone());
    Ok((Arc::new(inputs.with_recorded(recorded)), Some(answered)))
}

/// A question as the plugin wrote it, checked: params a JSON object within size.
fn question(q: client::Question) -> Result<Question, client::AskError> {
    let kind = match q.kind {
        client::QuestionKind::Elicitation => QuestionKind::Elicitation,
        client::QuestionKind::Sampling => QuestionKind::Sampling,
        client::QuestionKind::Roots => QuestionKind::Roots,
    };
    if q.params_json.len() > MAX_PARAMS_BYTES {
        return Err(client::AskError::Invalid(format!("question `{}`: params over {MAX_PARAMS_BYTES} bytes", q.key)));
    }
    match serde_json::from_str::<Value>(&q.params_json) {
        Ok(params) if params.is_object() => Ok(Question { key: q.key, kind, params }),
        _ => Err(client::AskError::Invalid(format!("question `{}`: params must be a JSON object", q.key))),
    }
}

impl client::Host for Asking {
    async fn askable(&mut self) -> wasmtime::Result<Vec<client::QuestionKind>> {
        let kind = |k| match k {
            QuestionKind::Elicitation => client::QuestionKind::Elicitation,
            QuestionKind::Sampling => client::QuestionKind::Sampling,
            QuestionKind::Roots => client::QuestionKind::Roots,
        };
        Ok(self.can_ask().into_iter().map(kind).collect())
    }

    async fn ask(&mut self, questions: Vec<client::Question>) -> wasmtime::Result<Result<Vec<String>, client::AskError>> {
        let questions = match questions.into_iter().map(question).collect::<Result<Vec<_>, _>>() {
            Ok(questions) => questions,
            Err(e) => return Ok(Err(e)),
        };
        let answered = self.round(questions)?;
        Ok(answered.map(|answers| answers.iter().map(Value::to_string).collect()))
    }
}

/// A store's state that carries the questions capability.
pub trait ClientView: Send {
    /// The capability of the invocation this store runs.
    fn asking(&mut self) -> &mut Asking;
}

/// Projects a store's state onto its questions capability.
struct HasAsking;

impl HasData for HasAsking {
    type Data<'a> = &'a mut Asking;
}

/// Links `toolguard:plugin/client` into `linker`.
///
/// # Errors
/// The interface is already defined in the linker.
pub fn add_to_linker<T: ClientView + 'static>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    client::add_to_linker::<T, HasAsking>(linker, T::asking)
}
