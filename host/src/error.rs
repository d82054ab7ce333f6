//! The errors a caller of toolguard sees: why a tool call failed
//! ([`CallError`], with a stable [`ErrorKind`]) and why a plugin was refused
//! at load ([`LoadError`]).

use serde::{Deserialize, Serialize};
use std::fmt;

/// Why a tool call failed, as a stable, machine-readable kind.
///
/// Serialised in kebab-case (`unknown-tool`, `invalid-args`, …); these names
/// are part of the CLI's and the MCP server's contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ErrorKind {
    /// No loaded plugin offers a tool of that name.
    UnknownTool,
    /// The arguments are not JSON, too large, or violate the tool's schema.
    InvalidArgs,
    /// The plugin trapped (panicked, executed `unreachable`, faulted).
    PluginTrap,
    /// The invocation hit one of its limits (CPU, wall clock, memory, stack,
    /// outbound calls, result size).
    LimitExceeded,
    /// The plugin returned a result that is not JSON or breaks its output schema.
    InvalidResult,
    /// The tool ran and reported a failure of its own.
    ToolFailed,
    /// The tool reported a failure of its own after a request of it was
    /// answered 2xx: that request took effect (`detail.effects`).
    FailedAfterEffect,
    /// An outbound request fell outside the plugin's grants; nothing was sent.
    Denied,
    /// The same tool call came with other arguments; nothing was sent.
    Conflict,
    /// A request may have taken effect; its outcome is unknown.
    OutcomeUnknown,
    /// An identical earlier call is unresolved; this one was not executed.
    Held,
    /// A downstream, or the ledger, could not be reached and nothing was committed.
    Transport,
    /// The plugin built a malformed or forbidden request; nothing was sent.
    InvalidRequest,
    /// The tool call is older than the ledger keeps: its record was pruned,
    /// and it is not run again.
    Expired,
    /// Too many of the caller's tool calls are running at once; nothing was run.
    Busy,
    /// A person must approve this action first; nothing was sent.
    AwaitingApproval,
    /// The tool asks the client questions (`toolguard:plugin/client`) before
    /// it goes on; nothing after them has run (`detail`: the round asked).
    InputRequired,
    /// Its caller cancelled it (an MCP task's `tasks/cancel`) before anything
    /// of it left the host; nothing was done.
    Cancelled,
    /// A fault inside the host itself; please report it.
    Internal,
}

impl ErrorKind {
    /// The kebab-case name used on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::UnknownTool => "unknown-tool",
            Self::InvalidArgs => "invalid-args",
            Self::PluginTrap => "plugin-trap",
            Self::LimitExceeded => "limit-exceeded",
            Self::InvalidResult => "invalid-result",
            Self::ToolFailed => "tool-failed",
            Self::FailedAfterEffect => "failed-after-effect",
            Self::Denied => "denied",
            Self::Conflict => "conflict",
            Self::OutcomeUnknown => "outcome-unknown",
            Self::Held => "held",
            Self::Transport => "transport",
            Self::InvalidRequest => "invalid-request",
            Self::Expired => "expired",
            Self::Busy => "busy",
            Self::AwaitingApproval => "awaiting-approval",
            Self::InputRequired => "input-required",
            Self::Cancelled => "cancelled",
            Self::Internal => "internal",
        }
    }
}

impl ErrorKind {
    /// What a caller (a model) should do next, in one sentence.
    pub fn recovery_move(self) -> &'static str {
        match self {
            Self::UnknownTool => "List the tools and call one that exists.",
            Self::InvalidArgs => "Fix the arguments to match the tool's input schema and call again.",
            Self::PluginTrap | Self::InvalidResult => "The tool is faulty; retrying will not help. Report it.",
            Self::LimitExceeded => "The call used up a limit; retry only with smaller input.",
            Self::ToolFailed => "Read the reason; change the request before trying again.",
            Self::FailedAfterEffect => {
                "What `effects` lists happened, whatever the tool said after: check its status first; do not repeat it under a \
                 new tool-call id unless you mean to do it a second time."
            }
            Self::Denied => "The host's policy forbids this; do not retry it.",
            Self::Conflict => "A different request needs a new tool-call id.",
            Self::OutcomeUnknown => "Do not repeat it under a new tool-call id; check its status first. Retrying the same tool-call id is safe.",
            Self::Held => {
                "If it carries the earlier call's outcome, that is what happened: repeat it only to do it a second time, under a new \
                 tool-call id. Otherwise check the earlier call's status first, or retry that earlier tool-call id."
            }
            Self::Transport => "Nothing reached the provider; retrying the same tool call is safe.",
            Self::InvalidRequest => "The tool built a request the host refuses; retrying will not help. Report it.",
            Self::Expired => "The call is too old to replay: check what it did at the provider; use a new tool-call id only for a genuinely new action.",
            Self::Busy => "Nothing was run: retry the same tool call once one of your running calls has finished.",
            Self::AwaitingApproval => {
                "Nothing was sent: wait for the decision (poll its task, or retry the same tool-call id later); do not repeat it under a new id."
            }
            Self::InputRequired => "Answer the questions it asks and call it again with the answers (the same tool-call id).",
            Self::Cancelled => "Nothing was done: make the call again, under a new tool-call id, if it is still wanted.",
            Self::Internal => "The host failed; retry the same tool call later.",
        }
    }
}

impl std::str::FromStr for ErrorKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        const ALL: [ErrorKind; 19] = [
            ErrorKind::UnknownTool,
            ErrorKind::InvalidArgs,
            ErrorKind::PluginTrap,
            ErrorKind::LimitExceeded,
            ErrorKind::InvalidResult,
            ErrorKind::ToolFailed,
            ErrorKind::FailedAfterEffect,
            ErrorKind::Denied,
            ErrorKind::Conflict,
            ErrorKind::OutcomeUnknown,
            ErrorKind::Held,
            ErrorKind::Transport,
            ErrorKind::InvalidRequest,
            ErrorKind::Expired,
            ErrorKind::Busy,
            ErrorKind::AwaitingApproval,
            ErrorKind::InputRequired,
            ErrorKind::Cancelled,
            ErrorKind::Internal,
        ];
        ALL.into_iter().find(|k| k.as_str() == s).ok_or_else(|| format!("unknown error kind `{s}`"))
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A failed tool call: a kind, a message a human (or model) can act on, and
/// optional structured detail (e.g. the attempt of an unknown outcome).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct CallError {
    /// What class of failure this is.
    pub kind: ErrorKind,
    /// What happened and, where there is one, what to do next.
    pub message: String,
    /// Structured facts behind the message, if any.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub detail: Option<serde_json::Value>,
}

impl CallError {
    /// A new error of `kind` with `message` and no detail.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self { kind, message: message.into(), detail: None }
    }

    /// The same error with structured `detail` attached.
    pub fn with_detail(mut self, detail: serde_json::Value) -> Self {
        self.detail = Some(detail);
        self
    }
}

/// Why a plugin was refused at load. Every variant names the plugin.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The component file could not be read.
    #[error("plugin `{plugin}`: cannot read component {path}: {reason}")]
    Read {
        /// The plugin's name.
        plugin: String,
        /// The file.
        path: String,
        /// Why it could not be read.
        reason: String,
    },
    /// The component's sha256 differs from the pin in the config.
    #[error(
        "plugin `{plugin}`: component sha256 is {actual} but the config pins {expected}; \
         if this build is the one you reviewed, update the pin"
    )]
    DigestMismatch {
        /// The plugin's name.
        plugin: String,
        /// The pinned sha256.
        expected: String,
        /// The file's sha256.
        actual: String,
    },
    /// Its registry cannot be reached and this host's cache does not hold
    /// it: the host serves without it (its tools are absent) until a
    /// restart finds the registry again.
    #[error("plugin `{plugin}` is unavailable: {reason}; start again once the registry is reachable, or `toolguard pull` it on a host that reaches it")]
    Unavailable {
        /// The plugin's name.
        plugin: String,
        /// Why.
        reason: String,
    },
    /// The registry refused the pull, or served something wrong.
    #[error("plugin `{plugin}`: cannot pull {reference}: {reason}")]
    Pull {
        /// The plugin's name.
        plugin: String,
        /// The `oci://` reference.
        reference: String,
        /// Why.
        reason: String,
    },
    /// No signature by a publisher the policy names vouches for the component.
    #[error("plugin `{plugin}` is refused: {reference} (manifest {digest}): {reason}; the policy expects a signature by {expected}")]
    Unverified {
        /// The plugin's name.
        plugin: String,
        /// The `oci://` reference.
        reference: String,
        /// The manifest digest that was checked.
        digest: String,
        /// What the signatures failed on.
        reason: String,
        /// The keys the policy names.
        expected: String,
    },
    /// The bytes are not a valid WebAssembly component.
    #[error("plugin `{plugin}` is not a valid WebAssembly component: {reason}")]
    NotAComponent {
        /// The plugin's name.
        plugin: String,
        /// What the parser said.
        reason: String,
    },
    /// The component imports interfaces the host never links.
    #[error(
        "plugin `{plugin}` is refused: it imports {} interface(s) the host never grants: {}. \
         Plugins may import only wasi:io, wasi:cli, wasi:clocks, wasi:random, an inert \
         wasi:filesystem and toolguard:plugin/outbound; reach the network through \
         outbound.send/fetch, or run `toolguard seal` to compose trapping stubs under \
         the sockets/HTTP imports a toolchain added",
        imports.len(), imports.join(", ")
    )]
    ForbiddenImports {
        /// The plugin's name.
        plugin: String,
        /// Every import the host never links.
        imports: Vec<String>,
    },
    /// The component imports (or carries sealed) what its policy's `deny_imports` forbids.
    #[error(
        "plugin `{plugin}` is refused by its policy's deny_imports: it imports or carries sealed {}",
        imports.join(", ")
    )]
    DeniedImports {
        /// The plugin's name.
        plugin: String,
        /// Every import its policy denies.
        imports: Vec<String>,
    },
    /// The component imports `toolguard:plugin/client` but its policy grants no question.
    #[error(
        "plugin `{plugin}` is refused: it imports {import} (questions to the MCP client mid-call) but its policy grants none; \
         a reviewer who accepts that sets `ask_client = [\"elicitation\"]` (or `sampling`, `roots`) in [policy.plugins.{plugin}]"
    )]
    UngrantedQuestions {
        /// The plugin's name.
        plugin: String,
        /// The import as the component names it.
        import: String,
    },
    /// The component, or what a tool tells the model, differs from `toolguard.lock`.
    #[error("plugin `{plugin}` is refused: {what}")]
    Unlocked {
        /// The plugin's name.
        plugin: String,
        /// What differs, and what to do.
        what: String,
    },
    /// The component needs more of the instance pool than one component may take.
    #[error("plugin `{plugin}` does not fit the instance pool: {reason}")]
    TooBig {
        /// The plugin's name.
        plugin: String,
        /// Which limit, and the setting that raises it.
        reason: String,
    },
    /// Compiling or linking the component failed.
    #[error("plugin `{plugin}`: cannot compile or link the component: {reason}")]
    Link {
        /// The plugin's name.
        plugin: String,
        /// What wasmtime said, with advice where known.
        reason: String,
    },
    /// `describe` trapped, hit a limit or returned nothing usable.
    #[error("plugin `{plugin}`: describe failed: {reason}")]
    Describe {
        /// The plugin's name.
        plugin: String,
        /// What went wrong.
        reason: String,
    },
    /// A tool spec is unusable (bad name, schema that does not compile, …).
    #[error("plugin `{plugin}`, tool `{tool}`: {reason}")]
    BadTool {
        /// The plugin's name.
        plugin: String,
        /// The tool's name.
        tool: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Two plugins offer a tool of the same name.
    #[error("tool `{tool}` is offered by both `{first}` and `{second}`; tool names must be unique")]
    DuplicateTool {
        /// The tool's name.
        tool: String,
        /// The plugin that offered it first.
        first: String,
        /// The plugin that offered it again.
        second: String,
    },
}

impl From<&CallError> for crate::ledger::StoredOutcome {
    /// The stored form of a definitive error (a replay answers it again).
    fn from(e: &CallError) -> Self {
        Self::Error { kind: e.kind.as_str().into(), message: e.message.clone(), detail: e.detail.clone() }
    }
}
