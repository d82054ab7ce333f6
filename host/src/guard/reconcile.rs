//! An unknown outcome is looked up at the provider — through the plugin's
//! `reconcile` export, within the downstream's reconcile window — before
//! anyone is told it is unknown.

use super::attempt::{Drive, Driven, Reconciled, Reconciler, settle, settled_durability};
use super::{Guard, Unsettled};
use crate::ledger::Durability;
use crate::ledger::records::{AttemptRecord, AttemptState, CallRecord, Resolution, StoredResponse};
use std::time::{Duration, Instant};

impl Guard {
    /// Marks `d.attempt` unknown (for `reason`) and looks it up at the
    /// provider. `may_resend`: the attempt is still within what the
    /// downstream deduplicates, so "not found" can be re-sent later with
    /// the same key; past it, "not found" is for an operator to settle.
    pub(super) async fn reconcile_unknown(&self, d: &mut Drive<'_>, may_resend: bool, reason: String) -> (Durability, Driven) {
        let attempt = &mut *d.attempt;
        attempt.state = AttemptState::Unknown;
        attempt.last_error = Some(reason.clone());
        // The window waits out a listing that lags a send. Once a whole
        // window after the last send found nothing, and nothing was sent
        // since, one look-up per pass is enough: otherwise every start-up
        // would wait a window for each attempt left to an operator.
        let waited_already = !may_resend && attempt.resolution == Some(Resolution::ReconciledNotFound);
        let window = if waited_already { Duration::ZERO } else { d.downstream.reconcile_window };
        let found = match d.reconciler {
            Some(r) => reconcile_within(r, d.call, attempt, window).await,
            None => Reconciled::StillUnknown("the plugin cannot reconcile".into()),
        };
        crate::metrics::reconcile(found.label());
        let durability = settled_durability(d.downstream);
        match found {
            Reconciled::Found(response) => {
                tracing::info!(key = %attempt.key, "reconciled: the provider has it");
                (durability, settle_found(attempt, response))
            }
            Reconciled::NotFound if !may_resend => {
                attempt.resolution = Some(Resolution::ReconciledNotFound);
                let message = format!(
                    "{} {} got no definitive answer ({reason}); the provider has no record of it and no longer keeps its key, \
                     so it cannot be re-sent safely. Do not repeat it under a new tool-call id. An operator must resolve it \
                     (`toolguard ledger resolve {} --not-sent` if it was never made)",
                    attempt.request.method, attempt.request.url, attempt.key
                );
                tracing::warn!(key = %attempt.key, "reconciled: not found past the provider's retention; an operator must resolve it");
                (Durability::Synced, Driven::Unsettled(Unsettled { message, ..Unsettled::of(attempt, &reason) }))
            }
            Reconciled::NotFound => (durability, Driven::Unsettled(Unsettled::of(attempt, &format!("{reason}; the provider lists no such request yet")))),
            Reconciled::StillUnknown(why) => (durability, Driven::Unsettled(Unsettled::of(attempt, &format!("{reason}; reconciling: {why}")))),
        }
    }

    /// Looks up, once, an attempt its provider still reports in flight (a
    /// request with its key executing there). Found, it is settled: the
    /// effect happened, whatever the provider's idempotency record says —
    /// one stuck "in progress" would otherwise keep it pending until the
    /// key's retention passes. Anything else leaves it pending (`None`):
    /// "not found" proves nothing while the request may still be executing.
    pub(super) async fn reconcile_pending(&self, d: &mut Drive<'_>) -> Option<(Durability, Driven)> {
        let found = d.reconciler?.reconcile(&d.call.tool, &d.call.args, d.attempt).await;
        crate::metrics::reconcile(found.label());
        let Reconciled::Found(response) = found else { return None };
        tracing::info!(key = %d.attempt.key, "reconciled: the provider has what it still reports in flight");
        Some((settled_durability(d.downstream), settle_found(d.attempt, response)))
    }
}

/// Settles `attempt` with the response reconciliation found for it.
fn settle_found(attempt: &mut AttemptRecord, response: StoredResponse) -> Driven {
    let state = if (200..300).contains(&response.status) { AttemptState::Succeeded } else { AttemptState::Failed };
    settle(attempt, state, response, Some(Resolution::ReconciledFound))
}

/// Asks the plugin until it finds the attempt, cannot tell, or the window
/// closes (a provider's listing may lag its writes).
async fn reconcile_within(r: &dyn Reconciler, call: &CallRecord, attempt: &AttemptRecord, window: Duration) -> Reconciled {
    let deadline = Instant::now() + window;
    let mut pause = Duration::from_millis(50);
    loop {
        let found = r.reconcile(&call.tool, &call.args, attempt).await;
        if found != Reconciled::NotFound || Instant::now() + pause >= deadline {
            return found;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(500));
    }
}
