//! `toolguard ledger`: what an operator or reviewer reads after an incident.
//! Opens the ledger read-only, so it works while a host is running.

use crate::ledger::{AttemptRecord, AttemptState, CallRecord, CallState, Ledger};
use serde_json::{Value, json};
use std::path::Path;

/// A state to filter `ledger list` by: a call's or one of its attempts'.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StateFilter {
    Admitted,
    Completed,
    Pending,
    Succeeded,
    Failed,
    Unknown,
}

impl StateFilter {
    fn matches(self, call: &CallRecord, attempts: &[AttemptRecord]) -> bool {
        let attempt = |s: AttemptState| attempts.iter().any(|a| a.state == s);
        match self {
            Self::Admitted => call.state == CallState::Admitted,
            Self::Completed => call.state == CallState::Completed,
            Self::Pending => attempt(AttemptState::Pending),
            Self::Succeeded => attempt(AttemptState::Succeeded),
            Self::Failed => attempt(AttemptState::Failed),
            Self::Unknown => attempt(AttemptState::Unknown),
        }
    }
}

/// What to do with the ledger.
#[derive(Debug, clap::Subcommand)]
pub enum LedgerCommand {
    /// Tool calls with their attempts, oldest session first.
    List {
        /// Only this session's calls.
        #[arg(long)]
        session: Option<String>,
        /// Only calls in this state, or with an attempt in it.
        #[arg(long, value_enum)]
        state: Option<StateFilter>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// One attempt (by idempotency key) or tool call (by call id), in full.
    Show {
        /// An idempotency key (`tg1_…`, or a UUID for a downstream with `key_format = "uuid"`) or a tool-call id.
        key_or_call_id: String,
        /// The tool call's session: a direct look-up. Without it a call id is
        /// searched for in every session (a scan of the whole ledger).
        #[arg(long)]
        session: Option<String>,
    },
    /// Every record as JSON lines: calls, then attempts.
    Export,
    /// What the ledger holds: counts by state, bytes, the oldest call.
    Stats {
        /// Print JSON instead of lines.
        #[arg(long)]
        json: bool,
    },
    /// What each spending limit holds in its window now: per limit and
    /// scope (tool, whose calls, currency), the amount used, the calls that
    /// used it, and when the window ends (`docs/operations.md`).
    Limits {
        /// Print JSON instead of lines.
        #[arg(long)]
        json: bool,
    },
    /// Remove what `[retention]` lets go, now (a serving host does this by
    /// itself every `retention.every_minutes`). Needs the ledger unlocked
    /// on RocksDB (stop the host first).
    Prune,
    /// Settle an unknown attempt on an operator's word. Needs the ledger
    /// unlocked (stop the host first).
    Resolve {
        /// The attempt's idempotency key.
        key: String,
        /// The request never took effect: the next run of its tool call
        /// sends it again under a new key. The only resolution offered: a
        /// found refund settles itself through reconciliation.
        #[arg(long, required = true)]
        not_sent: bool,
        /// Why (recorded with the attempt).
        #[arg(long, default_value = "declared by an operator")]
        note: String,
    },
}

/// Runs a ledger subcommand; returns the exit status.
pub fn run(config: &Path, command: LedgerCommand) -> u8 {
    if let LedgerCommand::Resolve { key, not_sent: _, note } = &command {
        return resolve(config, key, note);
    }
    if let LedgerCommand::Prune = &command {
        return prune(config);
    }
    let ledger = match open(config) {
        Ok(l) => l,
        Err(message) => {
            super::print_json(&json!({ "kind": "config-error", "message": message }));
            return super::EXIT_CONFIG;
        }
    };
    match command_output(&ledger, command) {
        Ok(code) => code,
        Err(e) => {
            super::print_json(&json!({ "kind": "internal", "message": e.to_string() }));
            super::EXIT_CALL_FAILED
        }
    }
}

fn resolve(config: &Path, key: &str, note: &str) -> u8 {
    let result = crate::Config::load(config)
        .map_err(|e| e.to_string())
        .and_then(|c| c.open_ledger(false).map_err(|e| e.to_string()))
        .and_then(|l| l.resolve_not_sent(key, note).map_err(|e| e.to_string()));
    match result {
        Ok(attempt) => {
            super::print_json(&json!({ "resolved": attempt }));
            0
        }
        Err(message) => {
            super::print_json(&json!({ "kind": "not-resolved", "message": message }));
            super::EXIT_CALL_FAILED
        }
    }
}

fn prune(config: &Path) -> u8 {
    let result = crate::Config::load(config).map_err(|e| e.to_string()).and_then(|c| {
        let Some(retention) = c.retention else {
            return Err("the config has no [retention]: the ledger keeps everything. Set `[retention] hours = N` to prune".into());
        };
        let ledger = c.open_ledger(false).map_err(|e| e.to_string())?;
        let now = crate::ledger::records::now_ms();
        ledger.prune(now.saturating_sub(retention.hours * 3_600_000), now).map_err(|e| e.to_string())
    });
    match result {
        Ok(report) => {
            super::print_json(&json!({ "pruned": report }));
            0
        }
        Err(message) => {
            super::print_json(&json!({ "kind": "not-pruned", "message": message }));
            super::EXIT_CALL_FAILED
        }
    }
}

fn open(config: &Path) -> Result<Ledger, String> {
    let config = crate::Config::load(config).map_err(|e| e.to_string())?;
    config.open_ledger(true).map_err(|e| e.to_string())
}

fn command_output(ledger: &Ledger, command: LedgerCommand) -> Result<u8, crate::ledger::LedgerError> {
    match command {
        LedgerCommand::List { session, state, json } => {
            let mut rows = Vec::new();
            for call in ledger.calls(session.as_deref())? {
                let attempts = ledger.attempts_of_call(&call.session, &call.call_id)?;
                if state.is_none_or(|s| s.matches(&call, &attempts)) {
                    rows.push((call, attempts));
                }
            }
            if json {
                let list: Vec<Value> = rows.iter().map(|(c, a)| json!({ "call": c, "attempts": a })).collect();
                super::print_json(&Value::Array(list));
            } else {
                print_table(&rows);
            }
            Ok(0)
        }
        LedgerCommand::Show { key_or_call_id, session } => {
            if let Some(attempt) = ledger.attempt(&key_or_call_id)? {
                let call = ledger.call(&attempt.session, &attempt.call_id)?;
                super::print_json(&json!({ "attempt": attempt, "call": call }));
                return Ok(0);
            }
            let found = match &session {
                Some(session) => ledger.call(session, &key_or_call_id)?.into_iter().collect(),
                None => ledger.calls(None)?,
            };
            let calls: Vec<Value> = found
                .into_iter()
                .filter(|c| c.call_id == key_or_call_id)
                .map(|c| {
                    let attempts = ledger.attempts_of_call(&c.session, &c.call_id).unwrap_or_default();
                    json!({ "call": c, "attempts": attempts })
                })
                .collect();
            if calls.is_empty() {
                let message = format!("no attempt with key `{key_or_call_id}` and no tool call with that id");
                super::print_json(&json!({ "kind": "not-found", "message": message }));
                return Ok(super::EXIT_CALL_FAILED);
            }
            super::print_json(&Value::Array(calls));
            Ok(0)
        }
        LedgerCommand::Resolve { .. } | LedgerCommand::Prune => unreachable!("handled before the ledger is opened read-only"),
        LedgerCommand::Stats { json } => {
            let (stats, serving, now) = (ledger.stats()?, ledger.serving()?, crate::ledger::records::now_ms());
            // On a shared ledger, the whole fleet's use.
            let limits = limits_in_use(&ledger.spent(now)?);
            if json {
                let mut value = serde_json::to_value(&stats).unwrap_or_default();
                value["serving"] = super::serving::json(&serving, now);
                value["limits"] = Value::Array(limits);
                super::print_json(&value);
            } else {
                print_stats(&stats);
                super::serving::print(&serving, now);
                print_limits(&limits);
            }
            Ok(0)
        }
        LedgerCommand::Limits { json } => {
            let uses = limits_in_use(&ledger.spent(crate::ledger::records::now_ms())?);
            if json {
                super::print_json(&Value::Array(uses));
            } else if uses.is_empty() {
                outln!("no spending limit holds a use in its current window");
            } else {
                print_limits(&uses);
            }
            Ok(0)
        }
        LedgerCommand::Export => {
            for call in ledger.calls(None)? {
                outln!("{}", super::json_for_terminal(&json!({ "type": "call", "record": call }).to_string()));
            }
            for attempt in ledger.attempts()? {
                outln!("{}", super::json_for_terminal(&json!({ "type": "attempt", "record": attempt }).to_string()));
            }
            Ok(0)
        }
    }
}

/// The uses of each limit and scope, summed: `limit` (the scope as the
/// guard built it: tool, limit index, whose calls, currency), `used`,
/// `calls`, `window_ends` (RFC 3339).
fn limits_in_use(uses: &[crate::ledger::records::SpentUse]) -> Vec<Value> {
    crate::policy::limits::in_use(uses.iter().map(|u| (u.scope.as_str(), u.amount, u.until_ms)))
        .into_iter()
        .map(|u| {
            let limit: Value = serde_json::from_str(&u.key).unwrap_or(Value::String(u.key));
            let ends = i64::try_from(u.until_ms).ok().and_then(chrono::DateTime::from_timestamp_millis).map_or_else(|| "never".to_string(), |t| t.to_rfc3339());
            json!({ "limit": limit, "used": u.used, "calls": u.calls, "window_ends": ends })
        })
        .collect()
}

/// [`limits_in_use`], for a person: one line per limit and scope.
fn print_limits(uses: &[Value]) {
    for u in uses {
        outln!(
            "{}",
            super::json_for_terminal(&format!("limit       {}  used {} in {} call(s); window ends {}", u["limit"], u["used"], u["calls"], u["window_ends"]))
        );
    }
}

fn print_stats(s: &crate::ledger::retention::LedgerStats) {
    let by_state = |m: &std::collections::BTreeMap<String, u64>| {
        if m.is_empty() { "none".to_string() } else { m.iter().map(|(k, v)| format!("{v} {k}")).collect::<Vec<_>>().join(", ") }
    };
    outln!("calls       {} ({})", s.total_calls(), by_state(&s.calls));
    outln!("attempts    {} ({})", s.attempts.values().sum::<u64>(), by_state(&s.attempts));
    outln!("episodes    {} open, {} closed", s.episodes_open, s.episodes_closed);
    outln!("retiring    {} final units in the retire index", s.retiring);
    outln!("tombstones  {} pruned calls", s.tombstones);
    outln!("budget uses {}", s.budget_uses);
    let per_call = s.bytes.checked_div(s.total_calls()).map_or_else(String::new, |b| format!(" ({b} per call)"));
    outln!("bytes       {}{per_call}", s.bytes);
    let oldest = s.oldest_call_ms.map_or_else(
        || "none".into(),
        |t| {
            let age_h = crate::ledger::records::now_ms().saturating_sub(t) as f64 / 3.6e6;
            format!("{t} ms since the epoch ({age_h:.1} h ago)")
        },
    );
    outln!("oldest call {oldest}");
}

fn print_table(rows: &[(CallRecord, Vec<AttemptRecord>)]) {
    outln!("{:<16} {:<20} {:<14} {:<10} {:<10} {:<12} ATTEMPTS (step key state tries)", "SESSION", "CALL ID", "TOOL", "STATE", "TOLD", "EPISODE");
    for (call, attempts) in rows {
        let state = match call.state {
            CallState::Admitted => "admitted",
            CallState::Completed => "completed",
        };
        // The call's place in the hold rule's episode of its action, if it has one.
        let episode = match (call.episode, &call.superseded_by) {
            (None, _) => "-".to_string(),
            (Some(n), Some(by)) => format!("{n} (by {by})"),
            (Some(n), None) if call.follower => format!("{n} follows"),
            (Some(n), None) => format!("{n} acts"),
        };
        let attempts: Vec<String> = attempts.iter().map(|a| format!("{} {} {} {}", a.step, a.key, a.state.as_str(), a.tries)).collect();
        let attempts = if attempts.is_empty() { "-".to_string() } else { attempts.join("; ") };
        outln!(
            "{:<16} {:<20} {:<14} {:<10} {:<10} {:<12} {}",
            super::terminal_safe(&call.session),
            super::terminal_safe(&call.call_id),
            super::terminal_safe(&call.tool),
            state,
            call.reported.as_str(),
            super::terminal_safe(&episode),
            super::terminal_safe(&attempts)
        );
    }
}
