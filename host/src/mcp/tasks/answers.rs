//! What a task's tool asked its client and was answered: the call's
//! journal, the answers `tasks/update` (or a retried `tools/call`) offered
//! for the round asked now, and that round. Each try of the task's call
//! runs with them ([`Answers::inputs`]); the task shows the questions not
//! answered yet (`input_required`).

use crate::policy::QuestionKind;
use crate::runtime::questions::journal::{Inputs, Pending, Round, answers_kind};
use serde_json::Value;
use std::collections::BTreeMap;

/// A task's questions and answers.
#[derive(Default)]
pub(crate) struct Answers {
    askable: Vec<QuestionKind>,
    journal: Vec<Round>,
    offered: BTreeMap<String, Value>,
    /// The round `offered` answers.
    offered_for: Option<String>,
    /// The round the last try stopped at, if it did.
    pending: Option<Pending>,
}

impl Answers {
    /// Starting from what the call's first request brought.
    pub(crate) fn new(inputs: Inputs) -> Self {
        let Inputs { askable, journal, offered, offered_for } = inputs;
        Self { askable, journal, offered, offered_for, pending: None }
    }

    /// What the next try answers its questions with.
    pub(crate) fn inputs(&self) -> Inputs {
        Inputs { askable: self.askable.clone(), journal: self.journal.clone(), offered: self.offered.clone(), offered_for: self.offered_for.clone() }
    }

    /// Notes where a try stopped (`None`: it went past its questions).
    pub(crate) fn stopped_at(&mut self, pending: Option<Pending>) {
        if let Some(p) = &pending {
            if self.offered_for.as_ref() != Some(&p.digest) {
                self.offered.clear();
                self.offered_for = Some(p.digest.clone());
            }
            self.journal.clone_from(&p.journal);
        }
        self.pending = pending;
    }

    /// The round asked now with the questions still unanswered, if any.
    pub(crate) fn open(&self) -> Option<Pending> {
        let mut open = self.pending.clone()?;
        open.questions.retain(|q| !self.offered.get(&q.key).is_some_and(|a| answers_kind(q.kind, a)));
        (!open.questions.is_empty()).then_some(open)
    }

    /// Takes the answers `responses` offers to the round asked now (keys it
    /// does not ask are ignored, as MCP asks); whether the round is now answered whole.
    ///
    /// # Errors
    /// In words: an answer is not the result of the question it answers.
    pub(crate) fn offer(&mut self, responses: &BTreeMap<String, Value>) -> Result<bool, String> {
        let Some(pending) = &self.pending else { return Ok(false) };
        for q in &pending.questions {
            let Some(answer) = responses.get(&q.key) else { continue };
            if !answers_kind(q.kind, answer) {
                return Err(format!("`{}` is not a result of the {} request asked", q.key, q.kind.method()));
            }
            self.offered.insert(q.key.clone(), answer.clone());
        }
        Ok(pending.answered_by(&self.offered).is_some())
    }

    /// Takes what a retried `tools/call` brings for the round asked now:
    /// its answers, if they are for that round; whether it is answered whole.
    pub(crate) fn brought(&mut self, inputs: &Inputs) -> bool {
        let for_now = self.pending.as_ref().is_some_and(|p| inputs.offered_for.as_ref() == Some(&p.digest));
        for_now && !inputs.offered.is_empty() && self.offer(&inputs.offered).unwrap_or(false)
    }
}
