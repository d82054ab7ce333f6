//! A tool call's questions and answers: the rounds the client answered (the
//! call's journal), the answers it offers for the round asked next, and the
//! round a run stopped at. A run answers each round it asks again from the
//! journal, so a tool re-run from the start after its answers came in sees
//! the same answers (`docs/questions.md`).

use crate::policy::QuestionKind;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest as _, Sha256};
use std::collections::BTreeMap;

/// One question as a plugin asked it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Question {
    /// Its name within its round (the MCP input request's key).
    pub key: String,
    /// What is asked.
    pub kind: QuestionKind,
    /// The MCP request's params.
    pub params: Value,
}

/// A round the client answered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Round {
    /// What was asked ([`digest`] of its questions).
    pub digest: String,
    /// The answers, in the order of the questions.
    pub answers: Vec<Value>,
}

/// What one run of a tool call may answer its questions with.
#[derive(Debug, Clone, Default)]
pub struct Inputs {
    /// The kinds the call's client can answer (empty: no client to ask).
    pub askable: Vec<QuestionKind>,
    /// The rounds answered so far, in order.
    pub journal: Vec<Round>,
    /// Answers the client offers for the round asked next, by key.
    pub offered: BTreeMap<String, Value>,
    /// The round they answer ([`digest`]); `None`: whichever round follows the journal.
    pub offered_for: Option<String>,
}

impl Inputs {
    /// These inputs with the rounds an earlier run of the call recorded
    /// with its sends (`guard::Answered`) first: answers that led to a side
    /// effect are never answered otherwise. Rounds of this journal past
    /// them are kept if it agrees with them; answers offered for "the next
    /// round" are dropped when the recorded rounds reach past this journal.
    pub fn with_recorded(&self, recorded: Vec<Round>) -> Inputs {
        if recorded.is_empty() {
            return self.clone();
        }
        let agrees = self.journal.iter().zip(&recorded).all(|(mine, theirs)| mine == theirs);
        let reaches_past = recorded.len() > self.journal.len();
        let mut journal = recorded;
        if agrees && self.journal.len() > journal.len() {
            journal.extend_from_slice(&self.journal[journal.len()..]);
        }
        let mut inputs = Inputs { journal, ..self.clone() };
        if reaches_past && inputs.offered_for.is_none() {
            inputs.offered.clear();
        }
        inputs
    }
}

/// Where a run stopped: the round its client has not answered yet (the
/// `detail` of an `input-required` answer).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Pending {
    /// Which round of the call (from 0).
    pub round: usize,
    /// [`digest`] of its questions.
    pub digest: String,
    /// The questions.
    pub questions: Vec<Question>,
    /// The rounds answered before it.
    pub journal: Vec<Round>,
}

impl Pending {
    /// The pending round an `input-required` answer's detail carries.
    pub fn of(detail: Option<&Value>) -> Option<Self> {
        serde_json::from_value(detail?.get("asked")?.clone()).ok()
    }

    /// The journal once `answers` (by key) answer this round, if they answer all of it.
    pub fn answered_by(&self, answers: &BTreeMap<String, Value>) -> Option<Vec<Round>> {
        let answers = self.questions.iter().map(|q| answers.get(&q.key).filter(|a| answers_kind(q.kind, a)).cloned()).collect::<Option<Vec<_>>>()?;
        let mut journal = self.journal.clone();
        journal.push(Round { digest: self.digest.clone(), answers });
        Some(journal)
    }
}

/// A round's identity: sha256 over its questions (keys, kinds, params) as JSON.
pub fn digest(questions: &[Question]) -> String {
    let text = serde_json::to_string(questions).unwrap_or_default();
    hex::encode(&Sha256::digest(text.as_bytes())[..16])
}

/// Whether `answer` is the shape of an MCP result to a question of `kind`:
/// an elicitation's `action` (and for `accept`, its `content` object), a
/// sampling's `role` and `content`, the roots' `roots` list.
pub fn answers_kind(kind: QuestionKind, answer: &Value) -> bool {
    match kind {
        QuestionKind::Elicitation => match answer["action"].as_str() {
            Some("accept") => answer.get("content").is_none_or(Value::is_object),
            Some("decline" | "cancel") => true,
            _ => false,
        },
        QuestionKind::Sampling => answer["role"].is_string() && answer.get("content").is_some_and(|c| c.is_object() || c.is_array()),
        QuestionKind::Roots => answer["roots"].is_array(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pending() -> Pending {
        let questions = vec![
            Question { key: "name".into(), kind: QuestionKind::Elicitation, params: json!({ "message": "Name?" }) },
            Question { key: "roots".into(), kind: QuestionKind::Roots, params: json!({}) },
        ];
        Pending { round: 0, digest: digest(&questions), questions, journal: Vec::new() }
    }

    #[test]
    fn a_round_is_answered_only_by_every_key_in_the_shape_of_its_kind() {
        let p = pending();
        let accept = json!({ "action": "accept", "content": { "name": "Ada" } });
        let roots = json!({ "roots": [] });
        assert!(p.answered_by(&BTreeMap::from([("name".into(), accept.clone())])).is_none(), "one key missing");
        assert!(p.answered_by(&BTreeMap::from([("name".into(), json!(12345)), ("roots".into(), roots.clone())])).is_none(), "not an elicitation result");
        let all = BTreeMap::from([("name".into(), accept.clone()), ("roots".into(), roots.clone()), ("extra".into(), json!(1))]);
        let journal = p.answered_by(&all).expect("answered; the extra key is ignored");
        assert_eq!(journal, vec![Round { digest: p.digest.clone(), answers: vec![accept, roots] }]);
    }

    #[test]
    fn rounds_recorded_with_a_send_take_precedence_over_what_the_client_brings() {
        let round = |digest: &str, answer: &str| Round { digest: digest.into(), answers: vec![json!(answer)] };
        let brought = Inputs { journal: vec![round("a", "no"), round("b", "x")], ..Inputs::default() };
        let merged = brought.with_recorded(vec![round("a", "yes")]);
        assert_eq!(merged.journal, vec![round("a", "yes")], "the recorded answer wins; what followed the other answer is dropped");
        let agreeing = Inputs { journal: vec![round("a", "yes"), round("b", "x")], ..Inputs::default() };
        assert_eq!(agreeing.with_recorded(vec![round("a", "yes")]).journal, agreeing.journal, "kept where it agrees");
        let offered = Inputs { offered: BTreeMap::from([("k".into(), json!(1))]), ..Inputs::default() };
        assert!(offered.with_recorded(vec![round("a", "yes")]).offered.is_empty(), "offered for a round now answered from the ledger");
        assert_eq!(offered.with_recorded(Vec::new()).offered.len(), 1, "nothing recorded: unchanged");
    }

    #[test]
    fn another_question_is_another_round() {
        let mut other = pending();
        other.questions[0].params = json!({ "message": "Surname?" });
        assert_ne!(digest(&other.questions), pending().digest);
    }
}
