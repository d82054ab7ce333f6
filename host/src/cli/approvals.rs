//! `toolguard approvals`: an operator decides on actions awaiting a
//! person's approval (`docs/tasks.md`, "Consent") where the client cannot
//! ask its user. Writes the ledger: a shared (PostgreSQL) ledger at any
//! time — the decision lands only on a request still waiting — and a
//! host's own (RocksDB) ledger when no host holds it.

use crate::ledger::{CallRecord, Decision, Ledger, records::now_ms};
use serde_json::json;
use std::path::Path;

/// What to do about approvals.
#[derive(Debug, clap::Subcommand)]
pub enum ApprovalsCommand {
    /// The tool calls waiting for a decision, with why they ask and until when.
    List,
    /// Approve a waiting call: it runs once, as asked.
    Approve(Decide),
    /// Deny a waiting call: its caller is told so, and nothing is sent.
    Deny(Decide),
}

/// Which call, and who decides.
#[derive(Debug, clap::Args)]
pub struct Decide {
    /// The tool-call id.
    call_id: String,
    /// Its approval request (from `approvals list`); by default the one waiting.
    request: Option<String>,
    /// The call's session, if the call id is not unique.
    #[arg(long)]
    session: Option<String>,
    /// Who decides (recorded as `operator:<by>`) [default: $USER].
    #[arg(long)]
    by: Option<String>,
    /// Why (recorded with the decision).
    #[arg(long)]
    note: Option<String>,
}

/// Runs an approvals subcommand; returns the exit status.
pub fn run(config: &Path, command: ApprovalsCommand) -> u8 {
    let ledger = match crate::Config::load(config).map_err(|e| e.to_string()).and_then(|c| c.open_ledger(false).map_err(|e| e.to_string())) {
        Ok(l) => l,
        Err(message) => {
            super::print_json(&json!({ "kind": "config-error", "message": message }));
            return super::EXIT_CONFIG;
        }
    };
    let result = match command {
        ApprovalsCommand::List => list(&ledger),
        ApprovalsCommand::Approve(d) => decide(&ledger, &d, true),
        ApprovalsCommand::Deny(d) => decide(&ledger, &d, false),
    };
    match result {
        Ok(()) => 0,
        Err(message) => {
            super::print_json(&json!({ "kind": "not-decided", "message": message }));
            super::EXIT_CALL_FAILED
        }
    }
}

fn list(ledger: &Ledger) -> Result<(), String> {
    let now = now_ms();
    let waiting: Vec<_> = ledger.calls(None).map_err(|e| e.to_string())?.iter().filter_map(|c| c.waiting_view(now)).collect();
    super::print_json(&json!({ "waiting": waiting }));
    Ok(())
}

fn decide(ledger: &Ledger, d: &Decide, approve: bool) -> Result<(), String> {
    let call = find(ledger, &d.call_id, d.session.as_deref())?;
    let waiting = call.approval.as_ref().filter(|_| call.awaiting_approval(now_ms()));
    let request = match (&d.request, waiting) {
        (Some(r), _) => r.clone(),
        (None, Some(a)) => a.request.clone(),
        (None, None) => return Err(format!("tool call `{}` waits for no decision", d.call_id)),
    };
    let by = format!("operator:{}", d.by.clone().or_else(|| std::env::var("USER").ok()).unwrap_or_else(|| "unknown".into()));
    let decided =
        ledger.decide_approval(&call.session, &call.call_id, &request, Decision { approve, by: &by, note: d.note.as_deref() }).map_err(|e| e.to_string())?;
    super::print_json(&json!({ "decided": decided.approval, "call_id": decided.call_id, "session": decided.session }));
    Ok(())
}

/// The call `call_id` (in `session`, if given; else the only one with that id).
fn find(ledger: &Ledger, call_id: &str, session: Option<&str>) -> Result<CallRecord, String> {
    if let Some(s) = session {
        return ledger.call(s, call_id).map_err(|e| e.to_string())?.ok_or_else(|| format!("no tool call `{call_id}` in session `{s}`"));
    }
    let mut found: Vec<CallRecord> = ledger.calls(None).map_err(|e| e.to_string())?.into_iter().filter(|c| c.call_id == call_id).collect();
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => Err(format!("no tool call `{call_id}`")),
        n => Err(format!("{n} sessions have a tool call `{call_id}`: name one with --session")),
    }
}
