//! What the ledger stores: tool calls and their outbound attempts.
//! Serialised as JSON, so `toolguard ledger export` output is the record.

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use crate::clock::now_ms;

mod approval;
mod attempt;
mod episode;

pub use approval::{Approval, ApprovalStatus};
pub use attempt::{AttemptRecord, AttemptState, PlannedSend, Resolution, StoredBody, StoredRequest, StoredResponse};
pub use episode::{EpisodeId, EpisodeRecord};

/// Where a tool call stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CallState {
    /// Accepted and (being) executed; no final result yet.
    Admitted,
    /// Finished; `outcome` is what the model was told and what replays return.
    Completed,
}

/// One tool call: the model's request, keyed by (session, call id).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallRecord {
    /// The session it belongs to.
    pub session: String,
    /// The model's tool-call id.
    pub call_id: String,
    /// The tool called.
    pub tool: String,
    /// sha256 of the RFC 8785 canonical arguments.
    pub args_digest: String,
    /// The canonical arguments themselves (for resume and reconciliation).
    pub args: Value,
    /// Where it stands.
    pub state: CallState,
    /// The result returned to the model, once completed.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub outcome: Option<StoredOutcome>,
    /// When it was first recorded (Unix ms).
    pub created_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    /// When it completed (Unix ms).
    pub completed_ms: Option<u64>,
    /// On a shared ledger: the host running the call now, …
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub owner: Option<String>,
    /// … and until when its claim holds (ms since the epoch). A host that
    /// dies leaves its claim to lapse; then another host may take the call over.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub lease_until_ms: Option<u64>,
    /// For a call of an irreversible tool: the episode of its action (same
    /// session, tool and arguments) it belongs to ([`EpisodeRecord`]).
    /// `None` on calls of other tools and on calls recorded before episodes.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub episode: Option<u64>,
    /// Admitted behind an earlier identical call (its episode's executor)
    /// instead of running: it never sends unless it supersedes that call.
    #[serde(skip_serializing_if = "std::ops::Not::not", default)]
    pub follower: bool,
    /// The identical later call that took this call's place as its
    /// episode's executor, because this one provably sent nothing and was
    /// not running: this call never runs again.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub superseded_by: Option<String>,
    /// What the caller was last told about this call, written when the
    /// answer left the host.
    #[serde(skip_serializing_if = "Reported::is_nothing", default)]
    pub reported: Reported,
    /// For an action the reviewer requires approval of: its request and
    /// decision ([`Approval`]).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub approval: Option<Approval>,
    /// The spending limits' scopes its amount was taken from when it was
    /// admitted: one use of each at `created_ms` ([`crate::Spend`]).
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub spent: Vec<String>,
    /// Its uses of `spent` were given back: it settled as never having taken
    /// effect. A later run of it spends again before it may send.
    #[serde(skip_serializing_if = "std::ops::Not::not", default)]
    pub released: bool,
    /// Admitted past a spending limit a person may approve (`over_limit =
    /// "approve"`): which, and by how much. It runs only with an approval.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub over_limit: Option<String>,
}

impl CallRecord {
    /// A tool call just admitted: nothing run, nothing claimed yet.
    pub fn admitted(session: String, call_id: String, tool: String, args_digest: String, args: Value) -> Self {
        Self {
            session,
            call_id,
            tool,
            args_digest,
            args,
            state: CallState::Admitted,
            outcome: None,
            created_ms: now_ms(),
            completed_ms: None,
            owner: None,
            lease_until_ms: None,
            episode: None,
            follower: false,
            superseded_by: None,
            reported: Reported::Nothing,
            approval: None,
            spent: Vec::new(),
            released: false,
            over_limit: None,
        }
    }

    /// Whether this call may run its plugin: it is not a follower and was not
    /// superseded (for calls outside episodes, always).
    pub fn is_executor(&self) -> bool {
        !self.follower && self.superseded_by.is_none()
    }

    /// Whether it waits for a person's decision at `now_ms` (never run before one).
    pub fn awaiting_approval(&self, now_ms: u64) -> bool {
        self.state == CallState::Admitted && self.approval.as_ref().is_some_and(|a| a.waiting(now_ms))
    }

    /// What an operator sees of a call waiting for a decision at `now_ms`
    /// (`toolguard approvals list`, `GET /approvals`); `None` if it waits for none.
    pub fn waiting_view(&self, now_ms: u64) -> Option<Value> {
        let a = self.approval.as_ref().filter(|_| self.awaiting_approval(now_ms))?;
        Some(serde_json::json!({ "session": self.session, "call_id": self.call_id, "tool": self.tool, "args": self.args,
            "request": a.request, "reason": a.reason, "principal": a.principal, "requested_ms": a.requested_ms, "expires_ms": a.expires_ms }))
    }

    /// Whether it still holds uses of spending limits it could give back.
    pub fn holds_spending(&self) -> bool {
        !self.spent.is_empty() && !self.released
    }

    /// Whether any host holds a live claim on this call at `now_ms`.
    pub fn leased_at(&self, now_ms: u64) -> bool {
        self.owner.is_some() && self.lease_until_ms.is_some_and(|t| t > now_ms)
    }

    /// Whether a host other than `host` holds a live claim on this call at `now_ms`.
    pub fn leased_elsewhere(&self, host: &str, now_ms: u64) -> bool {
        self.owner.as_deref().is_some_and(|o| o != host) && self.lease_until_ms.is_some_and(|t| t > now_ms)
    }
}

/// What the caller of a tool call was last told, as far as the host knows:
/// recorded when the answer left the host (the CLI printed it, the MCP
/// response was written), never before.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reported {
    /// Nothing yet: the call is in flight, or its host died before answering.
    #[default]
    Nothing,
    /// An answer that did not settle the action: `outcome-unknown`, `held`
    /// without an earlier outcome, or a host error.
    Unknown,
    /// A definitive outcome: the tool's result, a failure it reported, or
    /// `held` carrying the outcome of the identical call that acted.
    Definitive,
}

impl Reported {
    /// Whether nothing was reported.
    pub fn is_nothing(&self) -> bool {
        *self == Self::Nothing
    }

    /// The kebab-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Nothing => "nothing",
            Self::Unknown => "unknown",
            Self::Definitive => "definitive",
        }
    }
}

/// A final answer: a result, or an error the caller should see again on replay.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StoredOutcome {
    /// The tool's JSON result.
    Result(Value),
    /// A definitive error (kind, message, detail).
    Error {
        /// The error kind the caller saw.
        kind: String,
        /// Its message.
        message: String,
        /// Structured detail (e.g. the earlier outcome of a held call).
        detail: Option<Value>,
    },
}

/// One entry of the grant history: a plugin's component and the grants it
/// ran with, from `recorded_ms` until its next entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GrantRecord {
    /// The plugin the grants were for.
    pub plugin: String,
    /// sha256 of the component.
    pub digest: String,
    /// The effective grants: tools and classes, outbound grants, credentials by name, budgets.
    pub grants: Value,
    /// When this grant set was first seen (Unix ms).
    pub recorded_ms: u64,
}

/// What one host serves: each plugin's component and effective policy,
/// written when it starts and on every reload. A fleet's hosts share the
/// ledger, so `toolguard ledger stats` shows which policy each serves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServingRecord {
    /// The host (its claims' name: machine, process, nonce).
    pub host: String,
    /// Its generation: 1 at start, one more per reload.
    pub generation: u64,
    /// Each plugin's component sha256 and effective policy digest, by plugin.
    pub plugins: std::collections::BTreeMap<String, ServedPlugin>,
    /// When it was written (Unix ms, the ledger's clock).
    pub seen_ms: u64,
}

/// One plugin as a host serves it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServedPlugin {
    /// sha256 of its component.
    pub sha256: String,
    /// Digest of its effective policy.
    pub policy_digest: String,
}

/// A use of a spending limit as the ledger holds it (`toolguard ledger limits`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SpentUse {
    /// The limit's scope.
    pub scope: String,
    /// When it was spent.
    pub at_ms: u64,
    /// The call that spent it.
    pub call_id: String,
    /// How much.
    pub amount: u64,
    /// When its window ends.
    pub until_ms: u64,
}
