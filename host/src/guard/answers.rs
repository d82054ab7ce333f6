//! What a call's tool was answered before a send (its questions to the MCP
//! client, `docs/questions.md`), carried by the send's attempt: the answers
//! that led to a side effect are durable before it leaves, and a later run
//! of the call — after a crash, on another host — answers those rounds from
//! the ledger instead of asking again (where a person could now answer
//! otherwise). The guard keeps them as opaque JSON: the questions
//! capability (`runtime::client`) owns their shape.

use serde_json::Value;
use std::sync::{Arc, Mutex, PoisonError};

/// The most bytes of answers an attempt carries; past it the answers are
/// not recorded (a later run asks those rounds again).
const MAX_RECORDED_BYTES: usize = 64 << 10;

/// The rounds a run's questions were answered so far, shared by the
/// questions capability (which sets them) and the run's sends (which record them).
#[derive(Clone, Default)]
pub struct Answered(Arc<Mutex<Option<Value>>>);

impl Answered {
    /// The run's answered rounds are now `journal`.
    pub fn set(&self, journal: Value) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(journal);
    }

    /// What a new attempt records: the answered rounds, if there are any and they fit.
    pub(super) fn to_record(&self) -> Option<Value> {
        let journal = self.0.lock().unwrap_or_else(PoisonError::into_inner).clone()?;
        if journal.as_array().is_none_or(Vec::is_empty) {
            return None;
        }
        if journal.to_string().len() > MAX_RECORDED_BYTES {
            tracing::warn!("a call's answers are over {MAX_RECORDED_BYTES} bytes: not recorded with its send; a later run asks again");
            return None;
        }
        Some(journal)
    }
}
