//! An outbound attempt: one send of a tool call, keyed by its idempotency
//! key — the request as recorded before it left, where it stands, and what
//! came back.

use super::{CallRecord, now_ms};
use serde::{Deserialize, Serialize};
use serde_json::Value;

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
    /// The digest of the effective policy of its plugin that admitted its
    /// call (a reload changes what new calls run under, not this).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub policy: Option<String>,
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
    /// The answers its tool's questions to the client got before it was
    /// made (the call's journal of answered rounds, as the host keeps it):
    /// durable before the send leaves, so a later run of the call answers
    /// those rounds from here instead of asking again.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub answers: Option<Value>,
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
            policy: None,
            request,
            state: AttemptState::Pending,
            response: None,
            last_error: None,
            tries: 0,
            provider_replayed: false,
            resolution: None,
            answers: None,
            created_ms: now,
            updated_ms: now,
        }
    }
}
