//! The guard: the one way out of a plugin. It admits each tool call once
//! (replaying completed ones, refusing changed arguments, holding blind
//! repeats of an unresolved action), and for every `send` mints the key,
//! writes the attempt durably *before* the request leaves, sends it with the
//! key the way the downstream expects, and records the outcome. An unknown
//! outcome is resolved against the provider — re-sent with the same key or
//! reconciled by the plugin — never guessed.
//!
//! One file per protocol step, in the order `docs/guard.md` tells them:
//! - [`admit`]: admission — replay, conflict, and (in [`hold`]) the hold rule.
//! - [`call`]: a call in progress ([`CallGuard`], its state private there)
//!   and its sends — mint the key, write the pending attempt, drive it.
//! - [`drive`]: one attempt on the wire and its outcome recorded.
//! - [`reconcile`]: an unknown outcome looked up at the provider.
//! - [`finish`]: the call completed, and what its caller was told.
//! - [`recover`]: unsettled attempts resolved at start-up.
//!
//! Beside them: [`upgrade`] (standing aside when a newer host migrated a
//! shared ledger), [`claim`] (the lock and, on a shared ledger, the claim every
//! step that acts on a call takes), [`landing`] (a completion kept in its
//! call's lock until it lands), [`message`] (the guard's request,
//! response and error types), [`prepare`] (a request's refusals and its
//! key attached), [`transport`] (retries and classification of one send),
//! [`direct`] (`fetch`, unrecorded), `wires` (each downstream with its
//! credential and its HTTP client, built by [`crate::net`]).

mod admit;
mod answers;
mod approval;
mod attempt;
mod call;
mod claim;
mod direct;
mod drive;
mod effects;
mod failpoints;
mod finish;
mod hold;
mod landing;
mod message;
mod outgoing;
pub mod prepare;
mod reconcile;
pub mod recover;
mod replay;
mod spending;
mod start;
mod task;
pub mod transport;
mod unconfirmed;
mod upgrade;
mod wires;

pub use answers::Answered;
pub use approval::{Ask, is_decision as is_consent_decision};
pub use attempt::{Reconciled, Reconciler};
pub use call::CallGuard;
pub use direct::fetch;
#[cfg(feature = "bench")]
pub(crate) use direct::send_unguarded;
pub(crate) use failpoints::{failpoint, write_failpoint};
pub use hold::DEFAULT_HOLD_WAIT;
pub use message::{Request, Response, SendError, Unsettled};
pub use recover::{Pace, RecoveryReport, ToolRules, pause_ms};
pub use spending::{BUDGET_WINDOW_MS, Budget, Carried, Spending};
pub use start::Admission;
pub use task::Gate;
pub use wires::Wires;

use crate::error::{CallError, ErrorKind};
use crate::ledger::Ledger;
use crate::policy::{Effect, Grant};
use serde_json::Value;
use std::sync::{Arc, Mutex};

/// Shared by all tool calls of a host: the ledger, the downstreams and their HTTP clients.
pub struct Guard {
    ledger: Ledger,
    /// One lock per tool call in progress: concurrent duplicates wait for it.
    in_flight: claim::Locks<(String, String), Option<landing::Landing>>,
    /// Irreversible calls' completions waiting to ride with their reports.
    deferrals: landing::Deferrals,
    /// One lock per irreversible action being decided about (hold rule).
    actions: claim::Locks<(String, String, String)>,
    /// One lock per budget being spent: on a host's own ledger, what makes
    /// counting and recording a use one step.
    budgets: claim::Locks<String>,
    /// Definitive answers of irreversible calls on their way to their caller.
    outgoing: outgoing::Outgoing,
    /// Recently completed calls: their outcomes never change, so replaying
    /// one needs no ledger read.
    completed: Mutex<replay::Completed>,
    /// This host's name in claims on a shared ledger: unique per process.
    host: String,
    /// Whether a newer toolguard migrated the ledger since it was opened.
    schema: upgrade::SchemaWatch,
    /// Most approval requests one principal's calls may open per hour
    /// (`[mcp] max_approval_requests_per_principal_hour`; 0: unlimited).
    approval_quota: std::sync::atomic::AtomicU32,
}

/// The tool call as the guard identifies it.
#[derive(Debug, Clone)]
pub struct CallIdentity {
    /// The session the call belongs to.
    pub session: String,
    /// The model's tool-call id.
    pub call_id: String,
    /// The tool's name as the host lists it.
    pub tool: String,
    /// RFC 8785 canonical arguments.
    pub args: Value,
    /// sha256 of the canonical arguments.
    pub args_digest: String,
}

/// The reviewer's rules a tool call runs under.
#[derive(Clone)]
pub struct CallRules {
    /// The tool's effective effect class.
    pub effect: Effect,
    /// What the plugin may reach.
    pub grants: Arc<[Grant]>,
    /// The downstreams of the configuration that admitted the call.
    pub wires: Arc<Wires>,
    /// The digest of the effective policy that admitted the call (each attempt records it).
    pub policy_digest: String,
    /// The plugin's `reconcile`, if it has one.
    pub reconciler: Option<Arc<dyn Reconciler>>,
    /// Sends one tool call may make.
    pub max_sends: u32,
    /// For an irreversible tool: the budgets a call spends when it is
    /// admitted to run (never a replay, never a follower).
    pub budgets: Vec<Budget>,
    /// For an irreversible tool: what a call spends from each of its
    /// spending limits when it is admitted to run (never a replay, never a
    /// follower), given back if it completes without an effect.
    pub spending: Vec<Spending>,
    /// Amounts each send of the call must carry (limits' `sent_as`).
    pub carried: Vec<Carried>,
    /// On a shared ledger, how long this host's claim on the call lasts: the
    /// longest a run can take. Past it, another host may take the call over.
    pub lease_ms: u64,
    /// For an irreversible tool: how long a call held behind an identical
    /// earlier one waits for it to end before answering `held`.
    pub hold_wait: std::time::Duration,
    /// For a call run as an MCP task: the gate its sends pass through, which
    /// a cancel closes ([`Gate`]); the call is recorded as soon as it is
    /// admitted, so the task names a durable call.
    pub gate: Option<Arc<Gate>>,
    /// When the call was first received, if it was recorded before it got
    /// here (`crate::receipts`): the hold rule's arrival of a new call.
    pub arrived_ms: Option<u64>,
}

impl Guard {
    /// A guard over `ledger`; what its calls may reach comes with each
    /// call's rules ([`Wires`]).
    pub fn new(ledger: Ledger) -> Self {
        crate::net::tls::install_crypto();
        Self {
            ledger,
            in_flight: claim::Locks::default(),
            deferrals: landing::Deferrals::default(),
            actions: claim::Locks::default(),
            budgets: claim::Locks::default(),
            outgoing: outgoing::Outgoing::default(),
            completed: Mutex::default(),
            host: claim::host_id(),
            schema: upgrade::SchemaWatch::default(),
            approval_quota: std::sync::atomic::AtomicU32::new(0),
        }
    }

    /// Caps the approval requests one principal's calls may open per hour
    /// at `max` (0: no cap), as `serve` configures from `[mcp]`.
    pub fn limit_approval_requests(&self, max: u32) {
        self.approval_quota.store(max, std::sync::atomic::Ordering::Relaxed);
    }

    /// This host's name in claims on a shared ledger (and in what it notes it serves).
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The ledger the guard records into.
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }
}

/// A ledger failure during admission: nothing was run. An unavailable
/// ledger (unreachable, or its connection lost) is `transport`, which the
/// caller may retry under the same tool-call id; anything else `internal`.
fn internal(e: crate::ledger::LedgerError) -> CallError {
    if e.is_unavailable() {
        return CallError::new(ErrorKind::Transport, format!("the ledger is unavailable ({e}); nothing was run"));
    }
    CallError::new(ErrorKind::Internal, format!("{e}; nothing was run"))
}

/// The message of a caught panic.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| panic.downcast_ref::<String>().cloned()).unwrap_or_else(|| "a panic".into())
}
