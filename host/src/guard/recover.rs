//! Recovery: at start-up (and via `toolguard recover`) every attempt left
//! pending or unknown — by a crash, a cut-off invocation or an unknown
//! outcome — is resolved before new work proceeds: re-sent with the *same*
//! key while the downstream still keeps keys, else reconciled by its plugin.
//! Nothing here ever mints a key.

use super::attempt::{Drive, Driven};
use super::claim::blocking;
use super::{Guard, Reconciler};
use crate::ledger::records::now_ms;
use crate::ledger::{AttemptRecord, AttemptState, CallRecord, Claim, Resolution};
use crate::policy::Grant;
use serde::Serialize;
use std::sync::Arc;

/// How long recovery claims a call it resolves: one re-send or reconciliation.
const RECOVERY_LEASE_MS: u64 = 60_000;

/// How many unsettled attempts a recovery pass resolves at once.
const RESOLVED_AT_ONCE: usize = 8;

/// The least a takeover pass waits between two tries at one attempt (a
/// fleet's passes run every 2 s).
const PACE_MIN_MS: u64 = 2_000;
/// The most a takeover pass waits between two tries at one attempt.
const PACE_MAX_MS: u64 = 300_000;

/// How long a takeover pass leaves an attempt of age `age_ms` alone after
/// its last try: a tenth of its age, from 2 s to 5 min (`docs/fleet.md`).
pub fn pause_ms(age_ms: u64) -> u64 {
    (age_ms / 10).clamp(PACE_MIN_MS, PACE_MAX_MS)
}

/// Whether a takeover pass at `now_ms` tries `attempt` again: its last try
/// (by any host: `updated_ms` is in the shared ledger) is [`pause_ms`] ago.
fn due(attempt: &AttemptRecord, now_ms: u64) -> bool {
    now_ms.saturating_sub(attempt.updated_ms) >= pause_ms(now_ms.saturating_sub(attempt.created_ms))
}

/// Whether a recovery pass tries every unsettled attempt, or only those due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pace {
    /// Every attempt now: start-up and `toolguard recover`.
    All,
    /// Only attempts whose last try is a tenth of their age ago: a fleet's
    /// takeover passes, so that one no pass can settle is not re-sent and
    /// looked up every 2 s until the provider's key retention passes.
    Due,
}

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
    /// Keys a takeover pass left for a later one: tried (by some host) less
    /// than a tenth of their age ago ([`Pace::Due`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_due: Vec<String>,
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
    /// Left for a later takeover pass: tried less than a tenth of its age ago.
    NotDue,
}

/// What recovery needs of the tool that made an attempt: the grants its
/// plugin has *now* (a re-send is authorised again against them), and its
/// reconciler, if it has one.
#[derive(Clone)]
pub struct ToolRules {
    /// Where its sends may go (checked again before any re-send).
    pub grants: Arc<[Grant]>,
    /// The downstreams those grants resolve against, as configured now.
    pub wires: Arc<super::Wires>,
    /// Its `reconcile` export, if it has one.
    pub reconciler: Option<Arc<dyn Reconciler>>,
}

impl Guard {
    /// Resolves every pending or unknown attempt (with [`Pace::Due`], only
    /// those due). `rules_for(tool)` gives
    /// the current grants and reconciler of the plugin of a tool (`None`: no
    /// longer loaded, so nothing is sent for it).
    ///
    /// It takes each call's lock, so it never races a run of the same call
    /// (`serve` runs it alongside its calls). It settles sends and nothing else: a call it
    /// settles stays uncompleted and its episode open, so a blind repeat of it
    /// is still held — now with the outcome found here (`docs/guard.md`).
    ///
    /// # Errors
    /// The ledger cannot be read.
    pub async fn recover(
        self: &Arc<Self>,
        rules_for: &(dyn Fn(&str) -> Option<ToolRules> + Sync),
        pace: Pace,
    ) -> Result<RecoveryReport, crate::ledger::LedgerError> {
        let ledger = self.ledger.clone();
        let (changed, unsettled) = blocking(move || -> Result<(Option<String>, Vec<AttemptRecord>), crate::ledger::LedgerError> {
            // A ledger a newer toolguard migrated is left to the upgraded hosts.
            if let Some(newer) = ledger.schema_changed()? {
                return Ok((Some(newer), Vec::new()));
            }
            // Once a pass, the ledger's clock is read again as it drifts (a
            // reading that fails keeps the last one).
            if let Err(e) = ledger.follow_clock() {
                tracing::debug!(error = %e, "cannot read the ledger's clock; keeping the last reading");
            }
            let mut all = ledger.attempts_in_state(AttemptState::Pending)?;
            all.extend(ledger.attempts_in_state(AttemptState::Unknown)?);
            Ok((None, all))
        })
        .await?;
        if self.schema.note(changed) {
            return Ok(RecoveryReport::default());
        }
        let mut report = RecoveryReport { examined: unsettled.len(), ..RecoveryReport::default() };
        // A few at a time (each under its call's lock), so that a provider
        // that is down — every attempt waiting out its retries — does not
        // hold a start-up for the sum of them. Reported in ledger order.
        let resolving = unsettled.into_iter().map(|attempt| async move {
            let key = attempt.key.clone();
            if pace == Pace::Due && !due(&attempt, now_ms()) {
                return Ok((key, Resolved::NotDue));
            }
            let rules = rules_for(&attempt.tool);
            self.resolve_attempt_safely(attempt, rules.as_ref()).await.map(|resolved| (key, resolved))
        });
        let mut resolved = futures_util::StreamExt::buffered(futures_util::stream::iter(resolving), RESOLVED_AT_ONCE);
        while let Some(next) = futures_util::StreamExt::next(&mut resolved).await {
            match next? {
                (key, Resolved::Settled) => report.settled.push(key),
                (key, Resolved::Unresolved(why)) => report.unresolved.push((key, why)),
                (key, Resolved::NeedsOperator(why)) => report.needs_operator.push((key, why)),
                (key, Resolved::RunningElsewhere) => report.running_elsewhere.push(key),
                (key, Resolved::NotDue) => report.not_due.push(key),
            }
        }
        // A fleet runs this every few seconds: only progress is news (what
        // needs an operator is warned about where it is found).
        let (examined, settled, unresolved, needs_operator, not_due) =
            (report.examined, report.settled.len(), report.unresolved.len(), report.needs_operator.len(), report.not_due.len());
        if settled > 0 {
            tracing::info!(examined, settled, unresolved, needs_operator, not_due, "recovery pass finished");
        } else if examined > 0 {
            tracing::debug!(examined, settled, unresolved, needs_operator, not_due, "recovery pass finished");
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
        let downstream = match crate::policy::authorize(&rules.grants, rules.wires.downstreams(), &request.method, &request.url) {
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
        let drive = Drive {
            attempt: &mut attempt,
            downstream: &downstream,
            client: rules.wires.client(&downstream),
            reconciler: rules.reconciler.as_deref(),
            call: &call,
            possibly_sent: true,
        };
        let driven = self.drive(drive, None).await;
        if matches!(driven, Driven::Answered(_)) && call.holds_spending() {
            self.give_back_if_never_took_effect(&call).await;
        }
        self.release(&call).await;
        Ok(match driven {
            Driven::Answered(_) => Resolved::Settled,
            Driven::Unsettled(info) if attempt.resolution == Some(Resolution::ReconciledNotFound) => Resolved::NeedsOperator(info.message),
            Driven::Damaged(info) => Resolved::NeedsOperator(info.message),
            Driven::Unsettled(info) => Resolved::Unresolved(info.message),
            Driven::NotSent(why) => Resolved::Unresolved(why),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::pause_ms;

    #[test]
    fn a_takeover_pass_waits_a_tenth_of_an_attempts_age_from_two_seconds_to_five_minutes() {
        assert_eq!(pause_ms(0), 2_000, "a young attempt: every pass");
        assert_eq!(pause_ms(19_999), 2_000);
        assert_eq!(pause_ms(60_000), 6_000);
        assert_eq!(pause_ms(600_000), 60_000);
        assert_eq!(pause_ms(3_000_000), 300_000);
        assert_eq!(pause_ms(24 * 3_600_000), 300_000, "an old one: every five minutes");
    }
}
