//! Recovery: at start-up (and via `toolguard recover`) every attempt left
//! pending or unknown — by a crash, a cut-off invocation or an unknown
//! outcome — is resolved before new work proceeds: re-sent with the *same*
//! key while the downstream still keeps keys, else reconciled by its plugin.
//! Nothing here ever mints a key.

use super::{Guard, Reconciler, blocking};
use crate::ledger::records::now_ms;
use crate::ledger::{AttemptRecord, AttemptState, CallRecord, Claim, Resolution};
use serde::Serialize;
use std::sync::Arc;

/// How long recovery claims a call it resolves: one re-send or reconciliation.
const RECOVERY_LEASE_MS: u64 = 60_000;

/// What a recovery pass found and did.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RecoveryReport {
    /// Unsettled attempts examined.
    pub examined: usize,
    /// Keys settled (by the downstream's answer or reconciliation).
    pub settled: Vec<String>,
    /// Keys still unknown, each with why.
    pub unresolved: Vec<(String, String)>,
    /// Keys only an operator can settle (not found past the provider's retention).
    pub needs_operator: Vec<String>,
    /// Keys left alone because another host runs their tool call now (a live
    /// claim on a shared ledger); its run settles them, or its claim lapses.
    pub running_elsewhere: Vec<String>,
}

impl Guard {
    /// Resolves every pending or unknown attempt. `reconciler_for(tool)`
    /// gives the plugin that can reconcile a tool's attempts, if any.
    ///
    /// Run it before serving: it takes each call's lock, so it never races a
    /// run of the same call, but new calls could otherwise hit the hold rule.
    ///
    /// # Errors
    /// The ledger cannot be read.
    pub async fn recover(
        self: &Arc<Self>,
        reconciler_for: &(dyn Fn(&str) -> Option<Arc<dyn Reconciler>> + Sync),
    ) -> Result<RecoveryReport, crate::ledger::LedgerError> {
        let ledger = self.ledger.clone();
        let unsettled = blocking(move || -> Result<Vec<AttemptRecord>, crate::ledger::LedgerError> {
            let mut all = ledger.attempts_in_state(AttemptState::Pending)?;
            all.extend(ledger.attempts_in_state(AttemptState::Unknown)?);
            Ok(all)
        })
        .await?;
        let mut report = RecoveryReport { examined: unsettled.len(), ..RecoveryReport::default() };
        for mut attempt in unsettled {
            let key = attempt.key.clone();
            let lock = {
                let mut map = self.in_flight.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                map.entry((attempt.session.clone(), attempt.call_id.clone())).or_default().clone()
            };
            let _held = lock.lock_owned().await;
            let ledger = self.ledger.clone();
            let (session, call_id) = (attempt.session.clone(), attempt.call_id.clone());
            let call = blocking(move || ledger.call(&session, &call_id)).await?;
            let Some(call) = call else {
                report.unresolved.push((key, "its tool call is not in the ledger".into()));
                continue;
            };
            // On a shared ledger, take the call over first: a host that runs it
            // now keeps it; one that died has let its claim lapse.
            let claimed = self.ledger.shared();
            if claimed {
                let claim = CallRecord { owner: Some(self.host.clone()), lease_until_ms: Some(now_ms() + RECOVERY_LEASE_MS), ..call.clone() };
                let ledger = self.ledger.clone();
                if let Claim::Busy(_) = blocking(move || ledger.claim_call(&claim, now_ms())).await? {
                    report.running_elsewhere.push(key);
                    continue;
                }
            }
            let Some(downstream) = self.downstreams.get(&attempt.downstream).cloned() else {
                let why = format!("downstream `{}` is no longer configured", attempt.downstream);
                report.unresolved.push((key, why));
                continue;
            };
            let reconciler = reconciler_for(&attempt.tool);
            let driven = self.drive(&mut attempt, &downstream, reconciler.as_deref(), &call, true, &mut None, None).await;
            if claimed {
                self.release(&call).await;
            }
            match driven {
                super::attempt::Driven::Answered(_) => report.settled.push(key),
                _ if attempt.resolution == Some(Resolution::ReconciledNotFound) => report.needs_operator.push(key),
                super::attempt::Driven::Unsettled(info) => report.unresolved.push((key, info.message)),
                super::attempt::Driven::NotSent(why) => report.unresolved.push((key, why)),
            }
        }
        // A fleet runs this every few seconds: only progress is news (what
        // needs an operator is warned about where it is found).
        let (examined, settled, unresolved, needs_operator) =
            (report.examined, report.settled.len(), report.unresolved.len(), report.needs_operator.len());
        if settled > 0 {
            tracing::info!(examined, settled, unresolved, needs_operator, "recovery pass finished");
        } else if examined > 0 {
            tracing::debug!(examined, settled, unresolved, needs_operator, "recovery pass finished");
        }
        Ok(report)
    }
}
