//! MCP Tasks (the `io.modelcontextprotocol/tasks` extension, SEP-2663)
//! backed by the ledger (`docs/tasks.md`). A client that opted in gets a
//! task instead of an ambiguity: a side-effecting call not settled within
//! `[mcp] task_after_ms` — a slow send, an outcome the provider has not
//! yet shown, a repeat held behind an identical earlier call — is answered
//! with a task handle, and the host goes on settling the call: it runs the
//! call again under its own tool-call id (sends re-sent with their own keys
//! or looked up at the provider; a completed call replays) until its answer
//! is definitive. That answer is the task's result, and the caller is told
//! it (the hold rule's "told") when the `tasks/get` response carrying it is
//! written.
//!
//! The task id is the call's ledger key ([`id`]); this module keeps only
//! what a host is doing about it now ([`Tasks`]), so any host reading the
//! same ledger answers `tasks/get`, after a restart or kill -9 too.

mod answers;
mod driver;
pub mod id;
pub(crate) mod wire;

use crate::error::CallError;
use crate::guard::Gate;
use crate::runtime::questions::journal::Inputs;
use crate::runtime::{CallOutput, CallRequest};
use driver::{Driving, approval_key};
use std::collections::BTreeMap;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

pub(crate) use driver::{HELD, STARTED};

/// A call's answer.
pub(crate) type Answer = Result<CallOutput, CallError>;

/// The longest pause between two tries to settle a call.
const MAX_PAUSE: Duration = Duration::from_secs(60);

/// How many tasks a host keeps in memory before it forgets settled ones
/// past their time to live (their calls stay in the ledger).
const SWEEP_AT: usize = 1_024;

/// Where a task stands, as this host last saw it.
#[derive(Clone)]
pub(crate) enum Progress {
    /// Not settled yet; why, in words for the model.
    Working(String),
    /// The call's definitive answer.
    Settled(Answer),
}

/// A task's state as `tasks/get` reports it.
#[derive(Clone)]
pub(crate) struct Snapshot {
    /// Where it stands.
    pub(crate) progress: Progress,
    /// When this host started it (Unix ms).
    pub(crate) created_ms: u64,
    /// When its progress last changed (Unix ms).
    pub(crate) updated_ms: u64,
    /// Why a `tasks/cancel` could not be honoured, once one was asked.
    pub(crate) cancel_refused: Option<String>,
    /// While its call awaits a person's approval: the request
    /// (`detail.approval` of the `awaiting-approval` answer).
    pub(crate) approval: Option<serde_json::Value>,
    /// The key the approval is asked under now ([`crate::mcp::approval::fresh_key`]):
    /// a new one whenever the question is put again.
    pub(crate) approval_key: Option<String>,
    /// While its tool's questions wait for the client: the round, with the
    /// questions not answered yet.
    pub(crate) asked: Option<crate::runtime::questions::journal::Pending>,
}

impl Snapshot {
    /// The settled answer, if there is one.
    pub(crate) fn settled(&self) -> Option<&Answer> {
        match &self.progress {
            Progress::Settled(answer) => Some(answer),
            Progress::Working(_) => None,
        }
    }
}

/// A task this host drives: its call, and its state as it changes.
pub(crate) struct Watched {
    /// The tool call the task settles.
    pub(crate) request: Arc<CallRequest>,
    /// Its state.
    pub(crate) state: watch::Receiver<Snapshot>,
}

/// One task this host drives.
struct Entry {
    request: Arc<CallRequest>,
    state: watch::Sender<Snapshot>,
    /// What its run's sends pass through, closed by a cancel.
    gate: Arc<Gate>,
    /// Wakes its driver to try again at once (a decision came in).
    wake: Arc<tokio::sync::Notify>,
    /// What its tool asked its client, and was answered.
    answers: Arc<Mutex<answers::Answers>>,
    driver: tokio::task::AbortHandle,
}

impl Entry {
    /// Whether it still tells the truth: settled, or being driven.
    fn live(&self) -> bool {
        self.state.borrow().settled().is_some() || !self.driver.is_finished()
    }

    fn watched(&self) -> Watched {
        Watched { request: self.request.clone(), state: self.state.subscribe() }
    }

    /// Its tool's questions are answered: its driver tries again now.
    fn answered(&self) {
        self.state.send_modify(|s| {
            s.asked = None;
            s.progress = Progress::Working("answered: running the tool call on".into());
        });
        self.wake.notify_one();
    }
}

/// `answers`, locked (a panic while holding it leaves it usable).
fn lock(answers: &Mutex<answers::Answers>) -> std::sync::MutexGuard<'_, answers::Answers> {
    answers.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The tasks this host drives, by call (session, tool-call id).
pub(crate) struct Tasks {
    /// Where a task's driver takes its runtime from: the generation serving
    /// when the task starts, which it keeps.
    views: Arc<super::view::Views>,
    poll: Duration,
    ttl: Duration,
    /// Most unsettled tasks one principal has here (`[mcp] max_tasks_per_principal`).
    per_principal: usize,
    entries: Mutex<HashMap<(String, String), Entry>>,
}

impl Tasks {
    /// No tasks yet; as `[mcp]` says, settling retries start `task_poll_ms`
    /// apart, a task is kept `task_ttl_ms`, and one principal has at most
    /// `max_tasks_per_principal` unsettled.
    pub(crate) fn new(views: Arc<super::view::Views>, config: &crate::config::McpConfig) -> Self {
        let (poll, ttl) = (Duration::from_millis(config.task_poll_ms), Duration::from_millis(config.task_ttl_ms));
        Self { views, poll, ttl, per_principal: config.max_tasks_per_principal.max(1), entries: Mutex::new(HashMap::new()) }
    }

    /// Whether a task may be started for `request`: it has one here
    /// already, or its principal has fewer than its share unsettled here;
    /// else `Err(cap)`. (Requests racing past the check overshoot by at most
    /// the principal's calls in flight.)
    pub(crate) fn room_for(&self, request: &CallRequest) -> Result<(), usize> {
        let Some(principal) = &request.principal else { return Ok(()) };
        let entries = self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if entries.get(&(request.session.clone(), request.call_id.clone())).is_some_and(Entry::live) {
            return Ok(());
        }
        let unsettled = entries
            .values()
            .filter(|e| e.request.principal.as_ref() == Some(principal) && e.state.borrow().settled().is_none() && !e.driver.is_finished())
            .count();
        if unsettled >= self.per_principal { Err(self.per_principal) } else { Ok(()) }
    }

    /// The task of `request`'s call: the one this host is driving (or has
    /// settled), given what `inputs` brings for the questions it asks now;
    /// else a new driver that runs the call, its questions answered from
    /// `inputs`, until its answer is definitive or the task's time to live
    /// has passed.
    /// `created_ms` is when the call was first recorded, if known (a task
    /// taken up again after a restart or on another host): the task's
    /// `createdAt`, from which its time to live counts.
    pub(crate) fn drive(&self, request: CallRequest, inputs: Inputs, created_ms: Option<u64>) -> Watched {
        let mut entries = self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let key = (request.session.clone(), request.call_id.clone());
        if let Some(entry) = entries.get(&key).filter(|e| e.live()) {
            if lock(&entry.answers).brought(&inputs) {
                entry.answered();
            }
            return entry.watched();
        }
        if entries.len() >= SWEEP_AT {
            let expired = crate::ledger::records::now_ms().saturating_sub(self.ttl.as_millis() as u64);
            entries.retain(|_, e| !(e.driver.is_finished() && e.state.borrow().created_ms < expired));
        }
        let now = crate::ledger::records::now_ms();
        let created_ms = created_ms.unwrap_or(now).min(now);
        let snapshot = Snapshot {
            progress: Progress::Working(STARTED.into()),
            created_ms,
            updated_ms: now,
            cancel_refused: None,
            approval: None,
            approval_key: None,
            asked: None,
        };
        let (state, _) = watch::channel(snapshot);
        // The time to live counts from the task's creation, wherever it was.
        let until = Instant::now() + self.ttl.saturating_sub(Duration::from_millis(now - created_ms));
        let (request, gate, wake) = (Arc::new(request), Arc::new(Gate::default()), Arc::new(tokio::sync::Notify::new()));
        let answers = Arc::new(Mutex::new(answers::Answers::new(inputs)));
        let runtime = self.views.current().runtime.clone();
        let driving = Driving { runtime, request: request.clone(), gate: gate.clone(), state: state.clone(), wake: wake.clone(), answers: answers.clone() };
        let driver = tokio::spawn(driving.settle(self.poll, until)).abort_handle();
        let entry = Entry { request, state, gate, wake, answers, driver };
        let watched = entry.watched();
        entries.insert(key, entry);
        watched
    }

    /// The task of call (`session`, `call_id`) if this host is driving it or settled it.
    pub(crate) fn watch(&self, session: &str, call_id: &str) -> Option<Watched> {
        let entries = self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        entries.get(&(session.to_string(), call_id.to_string())).filter(|e| e.live()).map(Entry::watched)
    }

    /// Takes the client's answers (`tasks/update`) to the questions the task
    /// of call (`session`, `call_id`) asks now; once they answer the whole
    /// round its driver tries again at once.
    ///
    /// # Errors
    /// In words: an answer is not the result of its question.
    pub(crate) fn answer(&self, session: &str, call_id: &str, responses: &BTreeMap<String, serde_json::Value>) -> Result<(), String> {
        let entries = self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(entry) = entries.get(&(session.to_string(), call_id.to_string())) else { return Ok(()) };
        let mut answers = lock(&entry.answers);
        let whole = answers.offer(responses)?;
        let open = answers.open();
        entry.state.send_modify(|s| s.asked = open);
        if whole {
            entry.answered();
        }
        Ok(())
    }

    /// Notes when the call of a task this host drives was first recorded:
    /// its `createdAt` from now on, the same every host and every restart reads.
    pub(crate) fn recorded_at(&self, session: &str, call_id: &str, created_ms: u64) {
        let entries = self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(entry) = entries.get(&(session.to_string(), call_id.to_string())) {
            entry.state.send_modify(|s| s.created_ms = created_ms);
        }
    }

    /// Puts the approval question of the task of call (`session`,
    /// `call_id`) again under a new key (its answer under the old one was
    /// delivered and decided nothing).
    pub(crate) fn ask_approval_again(&self, session: &str, call_id: &str) {
        let entries = self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(entry) = entries.get(&(session.to_string(), call_id.to_string())) {
            entry.state.send_modify(|s| s.approval_key = approval_key(s.approval.as_ref()));
        }
    }

    /// Notes that a person decided on the approval the task of call
    /// (`session`, `call_id`) asked for, and has its driver try again now.
    pub(crate) fn decided(&self, session: &str, call_id: &str, approve: bool) {
        let entries = self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(entry) = entries.get(&(session.to_string(), call_id.to_string())) {
            entry.state.send_modify(|s| {
                s.approval = None;
                s.approval_key = None;
                let what = if approve { "approved: running the tool call" } else { "denied: recording the denial" };
                s.progress = Progress::Working(what.into());
            });
            entry.wake.notify_one();
        }
    }

    /// Cancels the task of call (`session`, `call_id`), which this host
    /// drives, if nothing of its call has left the host
    /// ([`crate::guard::Guard::cancel`]);
    /// otherwise the task goes on (driven again if its run was stopped) and
    /// says why it was not cancelled.
    pub(crate) async fn cancel(&self, session: &str, call_id: &str) {
        let key = (session.to_string(), call_id.to_string());
        let found = {
            let entries = self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            entries.get(&key).map(|e| (e.request.clone(), e.gate.clone(), e.driver.clone(), e.state.clone(), e.answers.clone()))
        };
        let runtime = self.views.current().runtime.clone();
        let (Some((request, gate, driver, state, answers)), Some(guard)) = (found, runtime.guard()) else { return };
        if state.borrow().settled().is_some() {
            return;
        }
        let stopped = std::sync::atomic::AtomicBool::new(false);
        let stop = || {
            driver.abort();
            stopped.store(true, std::sync::atomic::Ordering::Relaxed);
        };
        match guard.cancel(&gate, session, call_id, stop).await {
            Ok(cancelled) => state.send_modify(|s| {
                s.progress = Progress::Settled(Err(cancelled));
                s.updated_ms = crate::ledger::records::now_ms();
            }),
            Err(why) => {
                if stopped.load(std::sync::atomic::Ordering::Relaxed) {
                    // Stopped before anything of it passed: run it again.
                    self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&key);
                    let inputs = lock(&answers).inputs();
                    let created = state.borrow().created_ms;
                    self.drive((*request).clone(), inputs, Some(created));
                }
                let entries = self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                if let Some(entry) = entries.get(&key) {
                    entry.state.send_modify(|s| s.cancel_refused = Some(why));
                }
            }
        }
    }
}
