//! What the ledger stores: tool calls and their outbound attempts.
//! Serialised as JSON, so `toolguard ledger export` output is the record.

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use crate::clock::now_ms;

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
        }
    }

    /// Whether this call may run its plugin: it is not a follower and was not
    /// superseded (for calls outside episodes, always).
    pub fn is_executor(&self) -> bool {
        !self.follower && self.superseded_by.is_none()
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

/// Where an outbound attempt stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AttemptState {
    /// Written (synced) before the request left; no answer recorded yet.
    Pending,
    /// The downstream answered with a definitive success (2xx).
    Succeeded,
    /// The downstream answered with a definitive failure (4xx).
    Failed,
    /// The request may have taken effect; no definitive answer.
    Unknown,
}

impl AttemptState {
    /// Every state, for index maintenance.
    pub const ALL: [Self; 4] = [Self::Pending, Self::Succeeded, Self::Failed, Self::Unknown];

    /// Whether the outcome is settled (a recorded response answers repeats).
    pub fn is_final(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed)
    }

    /// Whether the request may have taken effect without a recorded answer.
    pub fn is_unsettled(self) -> bool {
        matches!(self, Self::Pending | Self::Unknown)
    }

    /// The one-byte tag used in the by-state index.
    pub(crate) fn tag(self) -> u8 {
        match self {
            Self::Pending => b'p',
            Self::Succeeded => b's',
            Self::Failed => b'f',
            Self::Unknown => b'u',
        }
    }

    /// The kebab-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Unknown => "unknown",
        }
    }
}

/// An HTTP message body as stored: UTF-8 text as is, anything else base64.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredBody {
    /// The body as text, or base64 when `base64`.
    pub text: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    /// Whether `text` is base64 (the body was not UTF-8).
    pub base64: bool,
}

impl StoredBody {
    /// Stores `bytes`.
    pub fn from_bytes(bytes: &[u8]) -> Self {
        use base64::Engine as _;
        match std::str::from_utf8(bytes) {
            Ok(text) => Self { text: text.into(), base64: false },
            Err(_) => Self { text: base64::engine::general_purpose::STANDARD.encode(bytes), base64: true },
        }
    }

    /// The original bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        use base64::Engine as _;
        if self.base64 { base64::engine::general_purpose::STANDARD.decode(&self.text).unwrap_or_default() } else { self.text.clone().into_bytes() }
    }
}

/// The request as the plugin built it (no key, no credentials).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredRequest {
    /// The HTTP method.
    pub method: String,
    /// The URL.
    pub url: String,
    /// Headers as the plugin built them (no key, no credentials).
    pub headers: Vec<(String, String)>,
    /// The body as the plugin built it.
    pub body: StoredBody,
}

/// A downstream response as received.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredResponse {
    /// The HTTP status.
    pub status: u16,
    /// The response headers.
    pub headers: Vec<(String, String)>,
    /// The response body.
    pub body: StoredBody,
}

/// How an attempt was settled other than by the downstream's own answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Resolution {
    /// The plugin's `reconcile` found it at the provider; `response` is what it found.
    ReconciledFound,
    /// The plugin's `reconcile` did not find it, and the provider no longer
    /// keeps its key: only an operator can settle it.
    ReconciledNotFound,
    /// An operator declared it never sent (`toolguard ledger resolve KEY
    /// --not-sent`); the next run of its tool call mints a new key.
    OperatorNotSent,
    /// The host itself failed (a panic) while sending or resolving it: it is
    /// never sent again on its own; an operator must look at it.
    HostFault,
}

/// One guarded send, keyed by its idempotency key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttemptRecord {
    /// The idempotency key sent downstream.
    pub key: String,
    /// The session of the call that made it.
    pub session: String,
    /// The tool-call id that made it.
    pub call_id: String,
    /// The tool that made it.
    pub tool: String,
    /// The argument digest of its tool call (for the hold rule's index).
    #[serde(default)]
    pub args_digest: String,
    /// Ordinal of this send within its tool call.
    pub step: u32,
    /// How many keys this step had before this one (raised only by an operator).
    #[serde(default)]
    pub generation: u32,
    /// sha256 of the request as the plugin built it; a differing request at
    /// the same step is a conflict.
    pub fingerprint: String,
    /// The configured downstream it went to.
    pub downstream: String,
    /// The request, without key or credentials.
    pub request: StoredRequest,
    /// Where it stands.
    pub state: AttemptState,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    /// The downstream's answer, once there is one.
    pub response: Option<StoredResponse>,
    /// Why the outcome is not settled (timeout, dropped connection, …).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub last_error: Option<String>,
    /// Times the request was put on the wire.
    pub tries: u32,
    /// Whether the downstream said its answer was a replay of an earlier one.
    #[serde(default)]
    pub provider_replayed: bool,
    /// How it was settled, if not by the downstream's answer.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub resolution: Option<Resolution>,
    /// When it was recorded (Unix ms).
    pub created_ms: u64,
    /// When it last changed (Unix ms).
    pub updated_ms: u64,
}

/// A send about to be recorded: where it stands in its tool call, the
/// request as the plugin made it (the host's headers are added on the wire)
/// with its fingerprint, and the downstream it goes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedSend {
    /// Its step within the tool call.
    pub step: u32,
    /// Its key generation (0 unless an operator declared an earlier key never sent).
    pub generation: u32,
    /// The request's fingerprint (the host's `keys::request_fingerprint`).
    pub fingerprint: String,
    /// The downstream's name.
    pub downstream: String,
    /// The request.
    pub request: StoredRequest,
}

impl AttemptRecord {
    /// A new attempt of `call`, sent as `send` with idempotency key `key`,
    /// pending and never tried: what is written before its request leaves.
    pub fn pending(call: &CallRecord, key: String, send: PlannedSend) -> Self {
        let now = now_ms();
        let PlannedSend { step, generation, fingerprint, downstream, request } = send;
        Self {
            key,
            session: call.session.clone(),
            call_id: call.call_id.clone(),
            tool: call.tool.clone(),
            args_digest: call.args_digest.clone(),
            step,
            generation,
            fingerprint,
            downstream,
            request,
            state: AttemptState::Pending,
            response: None,
            last_error: None,
            tries: 0,
            provider_replayed: false,
            resolution: None,
            created_ms: now,
            updated_ms: now,
        }
    }
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
