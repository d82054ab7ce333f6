//! The guard: the one way out of a plugin. It admits each tool call once
//! (replaying completed ones, refusing changed arguments, holding blind
//! repeats of an unresolved action), and for every `send` mints the key,
//! writes the attempt durably *before* the request leaves, sends it with the
//! key the way the downstream expects, and records the outcome. An unknown
//! outcome is resolved against the provider — re-sent with the same key or
//! reconciled by the plugin — never guessed.
//!
//! - [`keys`]: what "the same action" means.
//! - [`wire`]: refusals and key injection.
//! - [`transport`]: retries and classification of one send.
//! - [`hold`]: the hold rule — episodes of identical irreversible calls.
//! - [`attempt`]: the attempt protocol of `send`, and `fetch`.
//! - [`recover`]: resolving unsettled attempts at start-up.

mod attempt;
mod hold;
pub mod keys;
mod outgoing;
mod replay;
pub mod tls;
pub mod recover;
pub mod transport;
pub mod wire;

pub use attempt::{CallGuard, fetch};
pub(crate) use attempt::{send_unguarded, wit_state};
pub use hold::DEFAULT_HOLD_WAIT;
pub use recover::{RecoveryReport, ToolRules};

use crate::error::{CallError, ErrorKind};
use crate::ledger::records::{CallRecord, CallState, StoredOutcome, StoredResponse, now_ms};
use crate::ledger::{AttemptRecord, Claim, Durability, Ledger, LedgerWrite};
use crate::policy::{Downstreams, Grant};
use crate::runtime::Effect;
use crate::runtime::bindings::types::AttemptInfo;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

/// The lock a run of one tool call (session, call id) holds; also the lock
/// under which the guard decides about one action (session, tool, digest).
type CallLock = Arc<tokio::sync::Mutex<()>>;

/// Locks by name, each dropped from the map once nobody holds or waits for it.
#[derive(Default)]
struct Locks<K>(Mutex<HashMap<K, CallLock>>);

impl<K: std::hash::Hash + Eq> Locks<K> {
    fn get(&self, key: K) -> CallLock {
        let mut map = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        map.retain(|_, l| Arc::strong_count(l) > 1);
        map.entry(key).or_default().clone()
    }

    /// Whether the lock of `key` is held right now.
    fn held(&self, key: &K) -> bool {
        let map = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        map.get(key).is_some_and(|l| l.try_lock().is_err())
    }
}

/// Shared by all tool calls of a host: the ledger, the downstreams and their HTTP clients.
pub struct Guard {
    ledger: Ledger,
    /// One HTTP client per downstream, by name: each with its own TLS and proxy.
    clients: BTreeMap<String, reqwest::Client>,
    downstreams: Downstreams,
    /// One lock per tool call in progress: concurrent duplicates wait for it.
    in_flight: Locks<(String, String)>,
    /// One lock per irreversible action being decided about (hold rule).
    actions: Locks<(String, String, String)>,
    /// One lock per budget being spent: on a host's own ledger, what makes
    /// counting and recording a use one step.
    budgets: Locks<String>,
    /// Definitive answers of irreversible calls on their way to their caller.
    outgoing: outgoing::Outgoing,
    /// Recently completed calls: their outcomes never change, so replaying
    /// one needs no ledger read.
    completed: Mutex<replay::Completed>,
    /// This host's name in claims on a shared ledger: unique per process.
    host: String,
}

/// How often a host waits for another host's run of the same tool call.
const CLAIM_POLL: std::time::Duration = std::time::Duration::from_millis(50);

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
    /// The plugin's `reconcile`, if it has one.
    pub reconciler: Option<Arc<dyn Reconciler>>,
    /// Sends one tool call may make.
    pub max_sends: u32,
    /// For an irreversible tool: the budgets a call spends when it is
    /// admitted to run (never a replay, never a follower).
    pub budgets: Vec<Budget>,
    /// On a shared ledger, how long this host's claim on the call lasts: the
    /// longest a run can take. Past it, another host may take the call over.
    pub lease_ms: u64,
    /// For an irreversible tool: how long a call held behind an identical
    /// earlier one waits for it to end before answering `held`.
    pub hold_wait: std::time::Duration,
}

/// A budget of calls of a plugin's irreversible tools per hour: per session
/// (`max_irreversible_calls_per_session_hour`) or per authenticated
/// principal (`max_irreversible_calls_per_principal_hour`).
#[derive(Debug, Clone)]
pub struct Budget {
    /// Whose uses count together (opaque; stored with each use).
    pub scope: String,
    /// Uses allowed in any hour.
    pub max: u32,
    /// What it is, in words, naming its policy setting.
    pub what: String,
}

/// The window of every budget.
pub const BUDGET_WINDOW_MS: u64 = 3_600_000;

/// What admission decided.
#[allow(clippy::large_enum_variant, reason = "one per tool call, moved once into the run")]
pub enum Admission {
    /// The call completed before: its stored outcome, no plugin run.
    Replay(StoredOutcome),
    /// Run the plugin under this call guard.
    Run(CallGuard),
}

/// How starting a run came out (on a shared ledger, after claiming the call).
#[allow(clippy::large_enum_variant, reason = "one per tool call")]
enum Started {
    Admitted(Admission),
    /// Another host runs this call now; the lock back, to wait and retry.
    Busy(tokio::sync::OwnedMutexGuard<()>),
    /// An identical later call superseded it meanwhile; the lock back, to decide again.
    Superseded(tokio::sync::OwnedMutexGuard<()>),
}

/// What looking an attempt up at its provider found.
#[derive(Debug, Clone, PartialEq)]
pub enum Reconciled {
    /// The provider has it; the response it stands for.
    Found(StoredResponse),
    /// The provider has no record of it.
    NotFound,
    /// The look-up failed or could not tell; why.
    StillUnknown(String),
}

/// Looks attempts up at their provider: a plugin's `reconcile` export.
pub trait Reconciler: Send + Sync {
    /// Looks `attempt`, made by `tool` with canonical `args`, up.
    fn reconcile<'a>(&'a self, tool: &'a str, args: &'a Value, attempt: &'a AttemptRecord) -> Pin<Box<dyn Future<Output = Reconciled> + Send + 'a>>;
}

/// Runs a ledger operation `f` on the blocking pool, so it never blocks an
/// async worker. The hot path uses [`Ledger::read`] and
/// [`Ledger::commit_async`] instead; this serves claims and recovery.
pub(crate) async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.expect("a ledger task panicked")
}

impl Guard {
    /// A guard over `ledger` that may reach `downstreams`.
    ///
    /// # Errors
    /// The HTTP client cannot be built (no TLS roots, for instance).
    pub fn new(ledger: Ledger, downstreams: Downstreams) -> Result<Self, String> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        // Credentials are read now, once: a missing one stops the host at start.
        let mut resolved = Downstreams::new();
        for (name, d) in downstreams {
            let mut d = (*d).clone();
            if let Some(spec) = &d.credential {
                let secret = spec.resolve().map_err(|e| format!("the credential of downstream `{name}` ({}): {e}", spec.source()))?;
                if http::HeaderValue::from_str(secret.expose()).is_err() {
                    return Err(format!(
                        "the credential of downstream `{name}` ({}) cannot be sent as a header value: it has a control character \
                         (a newline inside it, or a NUL); fix the secret",
                        spec.source()
                    ));
                }
                d.secret = Some(secret);
            }
            resolved.insert(name, Arc::new(d));
        }
        let downstreams = resolved;
        let clients = downstreams.iter().map(|(name, d)| Ok((name.clone(), tls::client(d)?))).collect::<Result<_, String>>()?;
        let host = host_id();
        Ok(Self { ledger, clients, downstreams, in_flight: Locks::default(), actions: Locks::default(), budgets: Locks::default(), outgoing: outgoing::Outgoing::default(), completed: Mutex::default(), host })
    }

    /// The ledger the guard records into.
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// The HTTP client of downstream `d` (each is built at start).
    fn client(&self, d: &crate::policy::Downstream) -> &reqwest::Client {
        self.clients.get(&d.name).expect("every configured downstream has its client")
    }

    /// How long a call held behind an identical earlier one waits for it:
    /// the longest reconcile window among the downstreams `grants` reach
    /// (the time the host itself gives a provider to tell), or
    /// [`DEFAULT_HOLD_WAIT`] without any.
    pub fn hold_wait(&self, grants: &[Grant]) -> std::time::Duration {
        grants.iter().filter_map(|g| self.downstreams.get(&g.downstream)).map(|d| d.reconcile_window).max().unwrap_or(DEFAULT_HOLD_WAIT)
    }

    /// Admits a tool call: waits for a duplicate in progress, then replays a
    /// completed call, refuses changed arguments, applies the hold rule to an
    /// irreversible one ([`hold`]), or lets the plugin run.
    ///
    /// # Errors
    /// `conflict` when the call id was used with another tool or arguments;
    /// `held` under the hold rule; `internal` when the ledger cannot be read.
    pub async fn admit(self: &Arc<Self>, id: CallIdentity, rules: CallRules) -> Result<Admission, CallError> {
        let cached = self.completed.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(&id.session, &id.call_id);
        // A hit with other arguments falls through to the ledger, which holds
        // what the conflict error shows.
        if let Some(done) = cached
            && done.tool == id.tool
            && done.args_digest == id.args_digest
        {
            return Ok(Admission::Replay((*done.outcome).clone()));
        }
        let mut lock = self.call_lock(&id.session, &id.call_id).lock_owned().await;
        if rules.effect == Effect::Irreversible {
            return self.admit_irreversible(id, rules, lock).await;
        }
        loop {
            let (session, call_id) = (id.session.clone(), id.call_id.clone());
            let existing = self
                .ledger
                .read(move |ledger| match ledger.call(&session, &call_id)? {
                    None => Ok(ledger.expired(&session, &call_id)?.map_or(Lookup::New, Lookup::Expired)),
                    Some(r) => Ok(Lookup::Found(Box::new(r))),
                })
                .await
                .map_err(internal)?;
            let (record, persisted) = match existing {
                Lookup::Expired(at) => return Err(expired(&id.call_id, at)),
                Lookup::Found(r) if r.tool != id.tool || r.args_digest != id.args_digest => return Err(conflict(&id, &r)),
                Lookup::Found(r) if r.state == CallState::Completed && r.outcome.is_some() => return Ok(self.replay(*r)),
                Lookup::Found(r) => (*r, true),
                Lookup::New => (CallRecord::admitted(id.session.clone(), id.call_id.clone(), id.tool.clone(), id.args_digest.clone(), id.args.clone()), false),
            };
            match self.start(record, persisted, &rules, lock).await? {
                Started::Admitted(admission) => return Ok(admission),
                Started::Busy(back) | Started::Superseded(back) => {
                    lock = back;
                    tokio::time::sleep(CLAIM_POLL).await;
                }
            }
        }
    }

    /// Starts the run of `record` under `lock`: at once on a host's own
    /// ledger (the lock is the claim); on a shared one after claiming the
    /// call, so no other host runs it at the same time.
    async fn start(self: &Arc<Self>, record: CallRecord, persisted: bool, rules: &CallRules, lock: tokio::sync::OwnedMutexGuard<()>) -> Result<Started, CallError> {
        if !self.ledger.shared() {
            return Ok(Started::Admitted(Admission::Run(CallGuard::new(self.clone(), record, persisted, rules.clone(), lock))));
        }
        let claim = CallRecord { owner: Some(self.host.clone()), lease_until_ms: Some(now_ms() + rules.lease_ms), ..record };
        let ledger = self.ledger.clone();
        Ok(match blocking(move || ledger.claim_call(&claim, now_ms())).await.map_err(internal)? {
            Claim::Run { record, persisted } => Started::Admitted(Admission::Run(CallGuard::new(self.clone(), record, persisted, rules.clone(), lock))),
            Claim::Completed(r) => Started::Admitted(self.replay(r)),
            Claim::Conflict(r) => return Err(conflict_with(&r.call_id, &r)),
            Claim::Busy(_) => Started::Busy(lock),
            Claim::Superseded(_) => Started::Superseded(lock),
        })
    }

    /// The lock of tool call (session, call id).
    fn call_lock(&self, session: &str, call_id: &str) -> CallLock {
        self.in_flight.get((session.to_string(), call_id.to_string()))
    }

    /// The lock under which the guard decides about `id`'s action.
    fn action_lock(&self, id: &CallIdentity) -> CallLock {
        self.actions.get((id.session.clone(), id.tool.clone(), id.args_digest.clone()))
    }

    /// A completed call's stored outcome, remembered for the next replay.
    fn replay(&self, record: CallRecord) -> Admission {
        self.remember(&record);
        Admission::Replay(record.outcome.expect("completed calls carry their outcome"))
    }

    /// Keeps a completed call's outcome for fast replays.
    fn remember(&self, record: &CallRecord) {
        self.completed.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(record);
    }

    /// Ends this host's claim on a call that did not complete, so another host
    /// may retry it at once (a no-op on a host's own ledger).
    pub(crate) async fn release(&self, record: &CallRecord) {
        if !self.ledger.shared() {
            return;
        }
        let (ledger, session, call_id, host) = (self.ledger.clone(), record.session.clone(), record.call_id.clone(), self.host.clone());
        if let Err(e) = blocking(move || ledger.release_call(&session, &call_id, &host)).await {
            tracing::warn!(error = %e, call_id = %record.call_id, "could not release a tool call's claim; it lapses with its lease");
        }
    }

    /// Ends a run that did not complete its call: its outcome writes land,
    /// then its claim (on a shared ledger) is released.
    async fn end_uncompleted(&self, call: &mut CallGuard) {
        call.flush().await;
        self.release(call.record()).await;
    }

    /// Whether a run of tool call (session, call id) holds its lock right now.
    fn in_progress(&self, session: &str, call_id: &str) -> bool {
        self.in_flight.held(&(session.to_string(), call_id.to_string()))
    }

    /// Ends a tool call: an unsettled send makes it `outcome-unknown` whatever
    /// the plugin returned; a result (or a tool-reported failure) completes it.
    pub async fn finish(&self, mut call: CallGuard, result: Result<Value, CallError>) -> Result<Value, CallError> {
        if let Some(info) = call.take_unsettled() {
            self.end_uncompleted(&mut call).await;
            let message = match &result {
                Err(e) if e.kind == ErrorKind::OutcomeUnknown => e.message.clone(),
                _ => info.message.clone(),
            };
            return Err(CallError::new(ErrorKind::OutcomeUnknown, message).with_detail(attempt_detail(&info)));
        }
        let outcome = match &result {
            Ok(value) => StoredOutcome::Result(value.clone()),
            Err(e) if e.kind == ErrorKind::ToolFailed => StoredOutcome::error(e),
            Err(_) => {
                self.end_uncompleted(&mut call).await;
                return result;
            }
        };
        let mut record = call.record().clone();
        record.state = CallState::Completed;
        record.outcome = Some(outcome);
        record.completed_ms = Some(now_ms());
        // Completed: no claim is needed any more.
        (record.owner, record.lease_until_ms) = (None, None);
        // Buffered: a lost completion is rebuilt by re-running the plugin,
        // whose sends replay from their recorded attempts.
        // Queued behind the outcomes of the call's sends, so waiting for it
        // usually finds those written already.
        let completion = self.ledger.queue(LedgerWrite::new().call(record.clone()), Durability::Buffered);
        call.flush().await;
        match completion.wait().await {
            Ok(()) => self.remember(&record),
            Err(e) => tracing::warn!(error = %e, call_id = %record.call_id, "could not record the completed tool call; a replay will re-run it"),
        }
        if record.episode.is_some() {
            self.outgoing.leaving((record.session.clone(), record.tool.clone(), record.args_digest.clone()), &record.call_id);
        }
        result
    }
}

/// What the ledger holds under a tool call's id.
enum Lookup {
    Found(Box<CallRecord>),
    /// Pruned at this time.
    Expired(u64),
    New,
}

/// The refusal of a call whose record was pruned at `pruned_ms`.
fn expired(call_id: &str, pruned_ms: u64) -> CallError {
    CallError::new(
        ErrorKind::Expired,
        format!(
            "tool call `{call_id}` is older than the ledger keeps (its record was pruned at {pruned_ms} ms since the epoch, \
             by the retention policy); it was not run again, and its outcome is no longer kept. Nothing was sent"
        ),
    )
    .with_detail(json!({ "pruned_ms": pruned_ms }))
}

fn conflict(id: &CallIdentity, first: &CallRecord) -> CallError {
    conflict_with(&id.call_id, first)
}

fn conflict_with(call_id: &str, first: &CallRecord) -> CallError {
    CallError::new(
        ErrorKind::Conflict,
        format!(
            "tool call `{call_id}` was first made as `{}` with other arguments; a changed request needs a new tool-call id. Nothing was sent",
            first.tool
        ),
    )
    .with_detail(json!({ "first_args": first.args, "first_tool": first.tool }))
}

/// `hostname-pid-random`: names this process in claims, unique even when a
/// host restarts with the same pid.
fn host_id() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").map_or_else(|_| "host".into(), |s| s.trim().to_string());
    let mut nonce = [0u8; 4];
    let _ = getrandom::fill(&mut nonce);
    format!("{name}-{}-{}", std::process::id(), hex::encode(nonce))
}

fn internal(e: crate::ledger::LedgerError) -> CallError {
    CallError::new(ErrorKind::Internal, format!("{e}; nothing was run"))
}

/// The structured detail of an `outcome-unknown` error.
pub(crate) fn attempt_detail(info: &AttemptInfo) -> Value {
    use crate::runtime::bindings::types::AttemptState as S;
    let state = match info.state {
        S::Pending => "pending",
        S::Succeeded => "succeeded",
        S::Failed => "failed",
        S::Unknown => "unknown",
    };
    json!({ "key": info.key, "step": info.step, "state": state, "tries": info.tries })
}

/// Test-only crash points: when `TOOLGUARD_FAILPOINT` names this point, the
/// process aborts here, as a `kill -9` would; `panic:NAME` panics here
/// instead (a bug in the host, which must fail only the call it hit).
/// Unset, it costs one lookup.
pub(crate) fn failpoint(name: &str) {
    static POINT: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    let Some(point) = POINT.get_or_init(|| std::env::var("TOOLGUARD_FAILPOINT").ok()).as_deref() else { return };
    if point == name {
        eprintln!("toolguard: failpoint `{name}` reached; aborting");
        std::process::abort();
    }
    if point.strip_prefix("panic:") == Some(name) {
        panic!("failpoint `{name}` reached");
    }
}

/// The message of a caught panic.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| panic.downcast_ref::<String>().cloned()).unwrap_or_else(|| "a panic".into())
}
