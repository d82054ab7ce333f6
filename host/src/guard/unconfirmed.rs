//! Ledger writes that failed but may have landed all the same (a
//! connection to PostgreSQL lost between a commit and its
//! acknowledgement, an fsync that failed after the append), and writes that
//! failed for certain where the sender was about to hear "not sent". Either
//! way recovery finds a `pending` send and sends it; so the sender is told
//! "nothing was sent" only once the ledger says so, and otherwise that the
//! outcome is unknown. `docs/guard.md` (`send`, steps 4 and 8).

use super::{Guard, SendError, Unsettled};
use crate::ledger::records::{AttemptRecord, AttemptState, CallRecord, now_ms};
use crate::ledger::{Durability, LedgerError, LedgerWrite, Prior};

/// Why the synced write of a pending attempt did not land for sure.
pub(super) enum Unwritten {
    /// Refused whole (another writer recorded the step first): nothing of
    /// it landed, and this is what the plugin is told.
    Refused(SendError),
    /// Failed with this error, and may have landed all the same: see [`settle_pending`].
    Unconfirmed(String),
}

/// How the synced write of a pending attempt went. The
/// `lost-ack:attempt-write(s)` failpoints make a landed write unconfirmed.
pub(super) fn pending_written(written: Result<(), LedgerError>) -> Result<(), Unwritten> {
    match written {
        Err(e) if e.is_conflict() => Err(Unwritten::Refused(ledger_down(e))),
        Err(e) => Err(Unwritten::Unconfirmed(e.to_string())),
        Ok(()) => lost_ack("attempt-write").and_then(|()| lost_ack("attempt-writes")).map_err(Unwritten::Unconfirmed),
    }
}

/// A read or write the ledger failed, as the plugin is told it: nothing was sent.
pub(super) fn ledger_down(e: LedgerError) -> SendError {
    SendError::Transport(format!("the ledger is unavailable ({e}); nothing was sent"))
}

/// Records `attempt`, whose synced pending write failed with `error`, as
/// not sent (`failed`, synced; with `call`, the call's record not yet
/// written): then the plugin is told `transport` — nothing was sent, for
/// good. If that write fails too, nothing says the pending record did not
/// land: `outcome-unknown`.
pub(super) async fn settle_pending(guard: &Guard, call: Option<CallRecord>, attempt: &AttemptRecord, error: &str) -> SendError {
    let mut failed = attempt.clone();
    failed.state = AttemptState::Failed;
    failed.response = None;
    failed.last_error = Some(format!("not sent: the ledger did not confirm the pending record ({error})"));
    failed.updated_ms = now_ms();
    let mut write = LedgerWrite::new().attempt_over(failed, Prior::Unread);
    if let Some(call) = call {
        write = write.call(call);
    }
    let settled = match lost_ack("attempt-writes") {
        Ok(()) => guard.ledger.commit_async(write, Durability::Synced).await.map_err(|e| e.to_string()),
        Err(e) => Err(e),
    };
    match settled {
        Ok(()) => SendError::Transport(format!("the ledger did not confirm the attempt's record ({error}); it is recorded as not sent now; nothing was sent")),
        Err(again) => SendError::OutcomeUnknown(Unsettled::maybe_pending(
            attempt,
            0,
            format!(
                "{} {} was not sent: the ledger did not confirm its record ({error}), nor its settling as not sent ({again}). \
                 The record may have landed, and recovery would then send it with its idempotency key",
                attempt.request.method, attempt.request.url
            ),
        )),
    }
}

/// A send that reached nobody, whose settling as not sent could not be
/// written (`error`): the ledger still holds it as pending, and recovery
/// would send it, so "nothing was sent" (`told`) would not stay true. The
/// sender hears that the outcome is unknown instead.
pub(super) fn unrecorded_not_sent(attempt: &AttemptRecord, told: &str, error: &str) -> Unsettled {
    let what = format!(
        "{told}; but recording that it was not sent failed ({error}), and the ledger still holds it as pending: recovery may \
         send it with its idempotency key"
    );
    Unsettled::maybe_pending(attempt, attempt.tries, what)
}

/// The `lost-ack:NAME` failpoint as the error of a write that landed but
/// was not acknowledged (tests only; unset, `Ok`).
fn lost_ack(name: &str) -> Result<(), String> {
    if super::write_failpoint("lost-ack", name) {
        return Err(format!("failpoint lost-ack:{name}: the write's acknowledgement was lost"));
    }
    Ok(())
}
