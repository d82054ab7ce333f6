//! An episode of an irreversible action: the identical calls (same session,
//! tool and arguments digest) whose lifetimes overlap, one of which executes.

use super::{CallRecord, now_ms};
use serde::{Deserialize, Serialize};

/// One episode of an irreversible action: identical calls (same session,
/// tool and canonical arguments) whose lifetimes overlap, from the first
/// one's admission until a definitive outcome of one of them reached the
/// caller. Exactly one of them, the executor, may send; the others follow it
/// and are answered with its outcome. Keyed by (session, tool, args digest,
/// episode number); see `docs/guard.md`, "The hold rule".
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpisodeRecord {
    /// The session of the action.
    pub session: String,
    /// The tool of the action.
    pub tool: String,
    /// The digest of its canonical arguments.
    pub args_digest: String,
    /// Numbered from 1 per action; a new one opens only after the last closed.
    pub episode: u64,
    /// The call id of the one call of this episode that may send.
    pub executor: String,
    /// A definitive outcome of this episode reached the caller: an identical
    /// call admitted from now on is a new action.
    pub closed: bool,
    /// When it opened (Unix ms).
    pub opened_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    /// When it closed (Unix ms), if it has.
    pub closed_ms: Option<u64>,
}

/// Which episode: an action (session, tool, args digest) and its number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EpisodeId {
    /// The session of the action.
    pub session: String,
    /// The tool of the action.
    pub tool: String,
    /// The digest of its canonical arguments.
    pub args_digest: String,
    /// The episode's number within the action.
    pub episode: u64,
}

impl EpisodeId {
    /// The episode `call` belongs to, if it belongs to one.
    pub fn of_call(call: &CallRecord) -> Option<Self> {
        let episode = call.episode?;
        Some(Self { session: call.session.clone(), tool: call.tool.clone(), args_digest: call.args_digest.clone(), episode })
    }
}

impl EpisodeRecord {
    /// Which episode this is.
    pub fn id(&self) -> EpisodeId {
        EpisodeId { session: self.session.clone(), tool: self.tool.clone(), args_digest: self.args_digest.clone(), episode: self.episode }
    }

    /// Episode `episode` of `call`'s action, opened now with `call` as its executor.
    pub fn open(call: &CallRecord, episode: u64) -> Self {
        Self {
            session: call.session.clone(),
            tool: call.tool.clone(),
            args_digest: call.args_digest.clone(),
            episode,
            executor: call.call_id.clone(),
            closed: false,
            opened_ms: now_ms(),
            closed_ms: None,
        }
    }
}
