//! Recovery: at start-up (and via `toolguard recover`) every attempt left
//! pending or unknown — by a crash, a cut-off invocation or an unknown
//! outcome — is resolved before new work proceeds: re-sent with the *same*
//! key while the downstream still keeps keys, else reconciled by its plugin.
//! Nothing here ever mints a key.

use super::claim::blocking;
use super::drive::{Drive, Driven};
use super::{Guard, Reconciler};
use crate::ledger::records::now_ms;
use crate::ledger::{AttemptRecord, AttemptState, CallRecord, Claim, Resolution};
use crate::policy::Grant;
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
    /// Keys only an operator can settle, each with why: not found past the
    /// provider's retention, no longer granted by the policy, or the host
    /// failed on it.
    pub needs_operator: Vec<(String, String)>,
    /// Keys left alone because another host runs their tool call now (a live
    /// claim on a shared ledger); its run settles them, or its claim lapses.
    pub running_elsewhere: Vec<String>,
}

/// How resolving one unsettled attempt came out.
enum Resolved {
    /// Settled: by the downstream's answer, by reconciliation, or found settled already.
    Settled,
    /// Still unknown, and why.
    Unresolved(String),
    /// Only an operator can settle it, and why.
    NeedsOperator(String),
    /// Another host runs its tool call now.
    RunningElsewhere,
}

/// What recovery needs of the tool that made an attempt: the grants its
/// plugin has *now* (a re-send is authorised again against them), and its
/// reconciler, if it has one.
#[derive(Clone)]
pub struct ToolRules {
    /// Where its sends may go (checked again before any re-send).
    pub grants: Arc<[Grant]>,
    /// Its `reconcile` export, if it has one.
    pub reconciler: Option<Arc<dyn Reconciler>>,
}

impl Guard {
    /// Resolves every pending or unknown attempt. `rules_for(tool)` gives
    /// the current grants and reconciler of the plugin of a tool (`None`: no
    /// longer loaded, so nothing is sent for it).
    ///
    /// Run it before serving: it takes each call's lock, so it never races a
    /// run of the same call. It settles sends and nothing else: a call it
    /// settles stays uncompleted and its episode open, so a blind repeat of it
    /// is still held — now with the outcome found here (`docs/guard.md`).
    ///
    /// # Errors
    /// The ledger cannot be read.
    pub async fn recover(self: &Arc<Self>, rules_for: &(dyn Fn(&str) -> Option<ToolRules> + Sync)) -> Result<RecoveryReport, crate::ledger::LedgerError> {
        let ledger = self.ledger.clone();
        let unsettled = blocking(move || -> Result<Vec<AttemptRecord>, crate::ledger::LedgerError> {
            let mut all = ledger.attempts_in_state(AttemptState::Pending)?;
            all.extend(ledger.attempts_in_state(AttemptState::Unknown)?);
            Ok(all)
        })
        .await?;
        let mut report = RecoveryReport { examined: unsettled.len(), ..RecoveryReport::default() };
        for attempt in unsettled {
            let key = attempt.key.clone();
            let rules = rules_for(&attempt.tool);
            match self.resolve_attempt_safely(attempt, rules.as_ref()).await? {
                Resolved::Settled => report.settled.push(key),
                Resolved::Unresolved(why) => report.unresolved.push((key, why)),
                Resolved::NeedsOperator(why) => report.needs_operator.push((key, why)),
                Resolved::RunningElsewhere => report.running_elsewhere.push(key),
            }
        }
        // A fleet runs this every few seconds: only progress is news (what
        // needs an operator is warned about where it is found).
        let (examined, settled, unresolved, needs_operator) = (report.examined, report.settled.len(), report.unresolved.len(), report.needs_operator.len());
        if settled > 0 {
            tracing::info!(examined, settled, unresolved, needs_operator, "recovery pass finished");
        } else if examined > 0 {
            tracing::debug!(examined, settled, unresolved, needs_operator, "recovery pass finished");
        }
        Ok(report)
    }

    /// Resolves the unsettled sends of `call` as recovery would (the hold
    /// rule's resolution of an executor nobody runs). Failures are logged:
    /// the attempts stay as they were, for the next pass.
    pub(crate) async fn resolve_call(&self, call: &CallRecord, rules: &ToolRules) {
        let (ledger, session, call_id) = (self.ledger.clone(), call.session.clone(), call.call_id.clone());
        let attempts = match blocking(move || ledger.attempts_of_call(&session, &call_id)).await {
            Ok(attempts) => attempts,
            Err(e) => return tracing::warn!(error = %e, call_id = %call.call_id, "could not read a held-behind call's attempts"),
        };
        for attempt in attempts.into_iter().filter(|a| a.state.is_unsettled()) {
            if let Err(e) = self.resolve_attempt_safely(attempt, Some(rules)).await {
                tracing::warn!(error = %e, call_id = %call.call_id, "could not resolve a held-behind call's send");
            }
        }
    }

    /// [`Guard::resolve_attempt`], but a panic while resolving (a bug in the
    /// host, which may well repeat on every try) marks the attempt for the
    /// operator instead of taking the host down: it is never re-sent again.
    async fn resolve_attempt_safely(&self, attempt: AttemptRecord, rules: Option<&ToolRules>) -> Result<Resolved, crate::ledger::LedgerError> {
        let key = attempt.key.clone();
        let resolving = std::panic::AssertUnwindSafe(self.resolve_attempt(attempt, rules, RECOVERY_LEASE_MS));
        match futures_util::FutureExt::catch_unwind(resolving).await {
            Ok(resolved) => resolved,
            Err(panic) => {
                let why = super::panic_message(panic.as_ref());
                tracing::error!(%key, %why, "the host failed while resolving an attempt; it is left for an operator");
                let (ledger, message) = (
                    self.ledger.clone(),
                    format!(
                        "the host failed while resolving it ({why}); it is never sent again on its own: check the provider, \
                     then `toolguard ledger resolve {key} --not-sent` if it never happened"
                    ),
                );
                let note = message.clone();
                blocking(move || -> Result<(), crate::ledger::LedgerError> {
                    let Some(mut attempt) = ledger.attempt(&key)? else { return Ok(()) };
                    attempt.resolution = Some(Resolution::HostFault);
                    attempt.last_error = Some(note);
                    attempt.updated_ms = now_ms();
                    ledger.commit(crate::ledger::LedgerWrite::new().attempt(attempt), crate::ledger::Durability::Synced)
                })
                .await?;
                Ok(Resolved::NeedsOperator(message))
            }
        }
    }

    /// Resolves one unsettled attempt under its call's lock (and, on a shared
    /// ledger, a claim of `lease_ms` on its call): re-sent with the same key
    /// within the downstream's retention, else reconciled. Never a new key.
    ///
    /// A re-send is authorised again against the policy as it is now: if the
    /// stored URL is no longer granted (the downstream moved, the grant was
    /// revoked), nothing is sent — the credential must never go to an origin
    /// that is not granted — and the attempt is left to an operator.
    async fn resolve_attempt(&self, attempt: AttemptRecord, rules: Option<&ToolRules>, lease_ms: u64) -> Result<Resolved, crate::ledger::LedgerError> {
        let _held = self.lock_call(&attempt.session, &attempt.call_id).await;
        let (ledger, session, call_id, key) = (self.ledger.clone(), attempt.session.clone(), attempt.call_id.clone(), attempt.key.clone());
        let (call, current) = blocking(move || Ok::<_, crate::ledger::LedgerError>((ledger.call(&session, &call_id)?, ledger.attempt(&key)?))).await?;
        let Some(call) = call else {
            return Ok(Resolved::Unresolved("its tool call is not in the ledger".into()));
        };
        // A run of its call may have settled it while we waited for the lock.
        let Some(mut attempt) = current.filter(|a| a.state.is_unsettled()) else { return Ok(Resolved::Settled) };
        if attempt.resolution == Some(Resolution::HostFault) {
            return Ok(Resolved::NeedsOperator(attempt.last_error.clone().unwrap_or_default()));
        }
        let Some(rules) = rules else {
            return Ok(Resolved::NeedsOperator(format!("not re-sent: tool `{}` is no longer loaded, so nothing may act for it", attempt.tool)));
        };
        let request = &attempt.request;
        let downstream = match crate::policy::authorize(&rules.grants, &self.downstreams, &request.method, &request.url) {
            Ok((d, _)) if d.name == attempt.downstream => d,
            granted => {
                let why = match granted {
                    Ok((d, _)) => format!("it now falls under downstream `{}`, not `{}`", d.name, attempt.downstream),
                    Err(crate::policy::Refusal::Denied(m) | crate::policy::Refusal::Invalid(m)) => m,
                };
                return Ok(Resolved::NeedsOperator(format!(
                    "not re-sent: the policy no longer grants {} {} ({why}); the downstream moved or the grant was revoked, \
                     and the credential never goes where the policy does not point. Check the provider it was sent to, then \
                     `toolguard ledger resolve {} --not-sent` if it never happened",
                    request.method, request.url, attempt.key
                )));
            }
        };
        // On a shared ledger, take the call over first: a host that runs it
        // now keeps it; one that died has let its claim lapse.
        if let Claim::Busy(_) = self.claim(call.clone(), true, lease_ms).await? {
            return Ok(Resolved::RunningElsewhere);
        }
        let drive = Drive { attempt: &mut attempt, downstream: &downstream, reconciler: rules.reconciler.as_deref(), call: &call, possibly_sent: true };
        let driven = self.drive(drive, None).await;
        self.release(&call).await;
        Ok(match driven {
            Driven::Answered(_) => Resolved::Settled,
            Driven::Unsettled(info) if attempt.resolution == Some(Resolution::ReconciledNotFound) => Resolved::NeedsOperator(info.message),
            Driven::Unsettled(info) => Resolved::Unresolved(info.message),
            Driven::NotSent(why) => Resolved::Unresolved(why),
        })
    }
}
