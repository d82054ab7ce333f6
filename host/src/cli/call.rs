//! `toolguard call`: one tool call; the result (or a JSON error with a
//! `kind`) on stdout. Once the answer is printed, the host records that the
//! caller was told it (the hold rule counts on it: `docs/guard.md`).
//!
//! Several `toolguard call`s may run at once on one data directory: the
//! first to open the ledger holds it and serves the others' calls over a
//! local socket while it runs ([`crate::handover`]).
//!
//! The record that the caller was told is the last thing the process does:
//! it then exits at once, without tearing anything down (nothing durable is
//! left to do). A process that lived on after that record would leave a
//! window in which a kill takes the clean exit from a caller that trusts
//! only one, while the ledger says it was told — and its blind repeat would
//! run instead of being held (`docs/guard.md`, "The hold rule").

use crate::handover::{self, HandOff};
use crate::runtime::StartError;
use crate::{CallError, CallOutput, CallRequest, Config, Runtime};
use std::io::Read;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// Runs the call, prints its outcome, records that the caller was told it
/// and exits the process with the call's exit status; returns the status
/// only for an answer that was not run (bad input, a config error).
pub async fn run(config: &Path, session: String, call_id: String, tool: String, args: String) -> u8 {
    let args_json = if args == "-" {
        let mut text = String::new();
        if let Err(e) = std::io::stdin().read_to_string(&mut text) {
            super::print_json(&serde_json::json!({ "kind": "invalid-args", "message": format!("cannot read stdin: {e}") }));
            return super::EXIT_CALL_FAILED;
        }
        text
    } else {
        args
    };
    let config = match Config::load(config) {
        Ok(c) => c,
        Err(e) => return super::config_error(e.to_string()),
    };
    let request = CallRequest { session, call_id, tool, args_json, principal: None, tenant: None };
    // Received: said before anything is loaded, so a repeat of this call can be linked to it.
    let receipts = config.ledger_dir().map(crate::receipts::Receipts::beside);
    if let Some(receipts) = &receipts
        && let Err(e) = receipts.note(&request.session, &request.call_id)
    {
        tracing::warn!(error = %e, "could not keep the call's receipt; it runs as if received when admitted");
    }
    let socket = config.ledger_dir().and_then(handover::socket_path);
    let digest = handover::config_digest(&config);
    let deadline = Instant::now() + super::LEDGER_WAIT;
    loop {
        match Runtime::from_config(&config).await {
            Ok(runtime) => hold_and_call(Arc::new(runtime), socket, config.clone(), &request, receipts.as_ref()).await,
            Err(StartError::LedgerBusy(why)) => {
                if let Some(path) = &socket {
                    match handover::hand_over(path, &digest, &request).await {
                        Ok(handed) => {
                            let answer = handed.answer.clone();
                            if let Some(receipts) = &receipts {
                                receipts.forget(&request.session, &request.call_id);
                            }
                            let (printed, code) = print(&answer);
                            if printed {
                                // The holder records it as told, then closes.
                                handed.delivered().await;
                            }
                            super::exit_now(code);
                        }
                        Err(HandOff::Refused(message)) => return super::config_error(message),
                        Err(HandOff::NoHolder) => {}
                    }
                }
                if Instant::now() >= deadline {
                    return super::config_error(super::busy_message(&why));
                }
                tokio::time::sleep(super::LEDGER_POLL).await;
            }
            Err(e) => return super::config_error(e.to_string()),
        }
    }
}

/// This process holds the ledger: it serves calls handed to it while it
/// runs its own; once its own is answered it takes no more, finishes those
/// it took, records that its caller was told, and exits at once.
async fn hold_and_call(
    runtime: Arc<Runtime>,
    socket: Option<std::path::PathBuf>,
    config: crate::Config,
    request: &CallRequest,
    receipts: Option<&crate::receipts::Receipts>,
) -> ! {
    let listener = socket.and_then(|path| match handover::Listener::start(path, crate::reload::Live::pinned(runtime.clone(), config)) {
        Ok(l) => Some(l),
        Err(e) => {
            tracing::warn!(error = %e, "cannot take calls from other toolguard processes on this data directory; they will wait");
            None
        }
    });
    let answer = runtime.call(request).await;
    // Answered: the ledger holds whatever of it there is to link a repeat to.
    if let Some(receipts) = receipts {
        receipts.forget(&request.session, &request.call_id);
    }
    let (printed, code) = print(&answer);
    if let Some(listener) = listener {
        listener.finish().await;
    }
    super::flush_traces();
    if printed {
        crate::guard::failpoint("after-print");
        runtime.report(request, &answer).await;
    }
    super::exit_now(code)
}

/// Prints the answer; whether it got out, and the exit status.
fn print(answer: &Result<CallOutput, CallError>) -> (bool, u8) {
    let (json, code) = match answer {
        Ok(output) => {
            if output.replayed {
                tracing::info!("replayed: the stored result of the completed tool call (no plugin ran, nothing was sent)");
            }
            (output.value.clone(), 0)
        }
        Err(e) => (serde_json::to_value(e).unwrap_or_default(), super::EXIT_CALL_FAILED),
    };
    // If nobody read it, the caller was not told, and the ledger must not say so.
    (super::write_json(&json).is_ok(), code)
}
