//! Consent, between admission and the run (`docs/tasks.md`, "Consent"): a
//! call of an irreversible tool whose action the reviewer wants a person to
//! approve runs only with an approval of *that* call — bound to its
//! principal and session (its record's key), its action digest (its
//! record's), the effective policy's digest and an expiry — recorded
//! durably in its record before anything is sent. Until then it answers
//! `awaiting-approval` and sends nothing; a denial, or no decision before
//! the expiry, completes it as `denied`, a definitive answer. Identical
//! calls made meanwhile wait behind it under the hold rule: one approval,
//! at most one side effect.

use super::Guard;
use crate::error::{CallError, ErrorKind};
use crate::ledger::records::{Approval, ApprovalStatus, CallRecord, now_ms};
use crate::ledger::{Durability, LedgerWrite};
use serde_json::json;

/// What the guard needs to ask a person about one call.
#[derive(Debug, Clone)]
pub struct Ask {
    /// Why the rule asks, in words.
    pub reason: String,
    /// sha256 of the plugin's effective policy now.
    pub policy_digest: String,
    /// How long a request waits, and an approval stays usable (ms).
    pub expires_ms: u64,
    /// The caller's authenticated principal, if any.
    pub principal: Option<String>,
}

/// What [`Guard::consent`] decided for a call.
pub(super) enum Consent {
    /// Approved under this policy and usable: the call runs.
    Run,
    /// The call's answer now: `awaiting-approval`, `busy`, `denied`, or the
    /// ledger's failure; `recorded` when the call's record was written with it.
    Answer {
        /// What the caller is told.
        error: CallError,
        /// Whether `record` (the approval request in it) is in the ledger now.
        recorded: bool,
    },
}

impl Consent {
    fn answer(error: CallError) -> Self {
        Self::Answer { error, recorded: false }
    }
}

impl Guard {
    /// Lets the call `record` run if a person approved it under this policy
    /// and the approval has not expired; otherwise asks (once per request,
    /// `record`'s approval written synced) and answers `awaiting-approval`,
    /// or answers the decision: `denied` when denied or never decided in
    /// time. Reads and writes only `record` (its approval) and the ledger.
    ///
    /// The answers: `awaiting-approval` (nothing sent; retry the same call
    /// or poll its task), `busy` (the principal's approval requests of the
    /// hour are spent: nobody asked, nothing sent), `denied` (definitive:
    /// the guard completes the call with it), or `transport`/`internal` when
    /// the request could not be recorded.
    pub(super) async fn consent(&self, record: &mut CallRecord, mut ask: Ask) -> Consent {
        let now = now_ms();
        match record.approval.clone() {
            Some(a) if a.status == ApprovalStatus::Approved && a.policy_digest == ask.policy_digest && now < a.usable_until() => return Consent::Run,
            // Approved and used: a send of it is recorded, so its run goes on (re-run after a
            // crash, say) whatever the clock or the policy says now; it is never denied after it acted.
            Some(a) if a.status == ApprovalStatus::Approved => match self.sent_anything(record).await {
                Ok(true) => return Consent::Run,
                Ok(false) if a.policy_digest == ask.policy_digest => {
                    // Approved in time but not used within its time: asked again (it was approved, not refused).
                    ask.reason = format!(
                        "{}; an approval given earlier was not used within its {} min, so a person is asked again",
                        ask.reason,
                        a.expires_ms.saturating_sub(a.requested_ms) / 60_000
                    );
                }
                Ok(false) => {}
                Err(e) => return Consent::answer(e),
            },
            Some(a) if a.status == ApprovalStatus::Denied => return Consent::answer(denied(&record.call_id, &a, "denied")),
            Some(a) if a.status == ApprovalStatus::Pending && a.policy_digest == ask.policy_digest => {
                return Consent::answer(if a.waiting(now) { awaiting(&record.call_id, &a) } else { denied(&record.call_id, &a, "expired") });
            }
            // Never asked, or asked under another policy: ask now.
            _ => {}
        }
        let mut request = [0u8; 12];
        if let Err(e) = getrandom::fill(&mut request) {
            return Consent::answer(CallError::new(ErrorKind::Internal, format!("no randomness for an approval request: {e}")));
        }
        let approval = Approval {
            request: hex::encode(request),
            status: ApprovalStatus::Pending,
            reason: ask.reason,
            policy_digest: ask.policy_digest,
            principal: ask.principal.clone(),
            requested_ms: now,
            expires_ms: now + ask.expires_ms,
            decided_by: None,
            decided_ms: None,
            note: None,
        };
        let before = record.approval.replace(approval.clone());
        // A principal's calls may open only so many approval requests an hour
        // (a repeat of this call spends nothing more): counted in this write.
        let quota: Vec<super::Budget> = ask.principal.as_deref().and_then(|p| self.approval_budget(p)).into_iter().collect();
        let asked = LedgerWrite::new().call(record.clone());
        let (write, _spending) = self.charged(asked, super::spending::Costs { budgets: &quota, spending: &[] }, record, false).await;
        match self.ledger.commit_async(write, Durability::Synced).await {
            Ok(()) => Consent::Answer { error: awaiting(&record.call_id, &approval), recorded: true },
            Err(e) if e.is_refused() => {
                record.approval = before;
                let message = format!("{}; nobody was asked and nothing was sent", e.message());
                Consent::answer(CallError::new(ErrorKind::Busy, message))
            }
            Err(e) => {
                record.approval = before;
                Consent::answer(super::internal(e))
            }
        }
    }

    /// Whether the ledger holds any attempt of call `record` (from any run).
    async fn sent_anything(&self, record: &CallRecord) -> Result<bool, CallError> {
        let (s, c) = (record.session.clone(), record.call_id.clone());
        let attempts = self.ledger.read(move |l| l.attempts_of_call(&s, &c)).await.map_err(super::internal)?;
        Ok(!attempts.is_empty())
    }
}

/// How many earlier episodes of an action a repeat looks back through for
/// one that was carried out within the window. Past it (that many
/// identical calls denied, cancelled or expired within the window) the
/// repeat is asked about anyway: conservative, never a way around consent.
const MAX_LOOK_BACK: u64 = 64;

impl Guard {
    /// For a new call of an action carried out (with an effect, its caller
    /// told a definitive outcome) less than `window_ms` ago, why a person
    /// must confirm this call is meant a second time: the repeat no host can
    /// link (a call killed before it was recorded, re-issued under a new id
    /// and also resumed under its old one). The look goes back through every
    /// episode of the action closed within the window, whatever they came
    /// to — a repeat that was denied, cancelled or expired in between leaves
    /// the action that was carried out as the one the next repeat is asked
    /// about. `None` for the first of its action, or when nothing of it was
    /// carried out within the window.
    ///
    /// # Errors
    /// The ledger could not be read.
    pub async fn repeat_to_confirm(&self, record: &crate::ledger::CallRecord, window_ms: u64) -> Result<Option<String>, CallError> {
        let Some(n) = record.episode.filter(|n| *n > 0) else { return Ok(None) };
        let (s, t, d) = (record.session.clone(), record.tool.clone(), record.args_digest.clone());
        let since = now_ms().saturating_sub(window_ms);
        let found = self
            .ledger
            .read(move |l| {
                for k in (n.saturating_sub(MAX_LOOK_BACK)..n).rev() {
                    let Some(e) = l.episode(&s, &t, &d, Some(k))? else { return Ok(Carried::No) };
                    // Episodes close in order: one closed before the window ends the look.
                    let ended = e.closed_ms.unwrap_or(0);
                    if !e.closed || ended < since {
                        return Ok(Carried::No);
                    }
                    let Some(executor) = l.call(&s, &e.executor)? else { continue };
                    if had_effect(&executor) {
                        return Ok(Carried::At(executor.call_id, ended));
                    }
                }
                Ok(if n > MAX_LOOK_BACK { Carried::TooMany } else { Carried::No })
            })
            .await
            .map_err(super::internal)?;
        Ok(match found {
            Carried::No => None,
            Carried::At(call_id, ended) => Some(format!(
                "an identical action was carried out {} min ago as tool call `{call_id}`; this call runs only if a person confirms a \
                 second one is meant (confirm_repeat_within_minutes)",
                now_ms().saturating_sub(ended) / 60_000
            )),
            Carried::TooMany => Some(format!(
                "more than {MAX_LOOK_BACK} identical calls of this action were made within confirm_repeat_within_minutes; this call \
                 runs only if a person confirms it is meant"
            )),
        })
    }
}

/// What a look back through an action's episodes found.
enum Carried {
    /// Nothing of it carried out within the window.
    No,
    /// Carried out by that call, its episode closed then (Unix ms).
    At(String, u64),
    /// The look back ran out before the window did.
    TooMany,
}

/// Whether a call's recorded outcome says its action took effect.
fn had_effect(call: &crate::ledger::CallRecord) -> bool {
    match &call.outcome {
        Some(crate::ledger::StoredOutcome::Result(_)) => true,
        Some(crate::ledger::StoredOutcome::Error { kind, .. }) => kind == "failed-after-effect",
        None => false,
    }
}

/// Whether `e` is a person's (or the clock's) answer to an approval request:
/// a definitive `denied` that completes its call.
pub fn is_decision(e: &CallError) -> bool {
    e.kind == ErrorKind::Denied && e.detail.as_ref().is_some_and(|d| d.get("approval").is_some())
}

fn view(call_id: &str, a: &Approval) -> serde_json::Value {
    json!({ "call_id": call_id, "request": a.request, "reason": a.reason, "requested_ms": a.requested_ms, "expires_ms": a.expires_ms,
            "status": a.status, "decided_by": a.decided_by, "note": a.note })
}

fn awaiting(call_id: &str, a: &Approval) -> CallError {
    let message = format!(
        "this action needs a person's approval ({}); nothing was sent. It waits for a decision until it expires: the person at \
         the client is asked where the client can be, otherwise an operator decides (`toolguard approvals approve {call_id} {}`)",
        a.reason, a.request
    );
    CallError::new(ErrorKind::AwaitingApproval, message).with_detail(json!({ "approval": view(call_id, a) }))
}

fn denied(call_id: &str, a: &Approval, how: &str) -> CallError {
    let message = match how {
        "expired" => format!("this action was not approved in time ({}); nothing was sent", a.reason),
        _ => format!(
            "a person denied this action ({}){}; nothing was sent",
            a.decided_by.as_deref().unwrap_or("someone"),
            a.note.as_deref().map(|n| format!(": {n}")).unwrap_or_default()
        ),
    };
    let mut approval = view(call_id, a);
    approval["status"] = how.into();
    CallError::new(ErrorKind::Denied, message).with_detail(json!({ "approval": approval }))
}

impl Guard {
    /// Records a person's decision on approval `request` of tool call
    /// (`session`, `call_id`), under the call's lock (so no run of it here
    /// interleaves; on a shared ledger the write is conditional on the
    /// request still pending). Returns the approval as decided.
    ///
    /// # Errors
    /// In words: no such request waiting, or the ledger failed.
    pub async fn decide_approval(&self, session: &str, call_id: &str, request: &str, decision: crate::ledger::Decision<'_>) -> Result<Approval, String> {
        let _lock = self.lock_call(session, call_id).await;
        let (s, c, r) = (session.to_string(), call_id.to_string(), request.to_string());
        let (approve, by, note) = (decision.approve, decision.by.to_string(), decision.note.map(str::to_string));
        let decided = self
            .ledger
            .read(move |l| l.decide_approval(&s, &c, &r, crate::ledger::Decision { approve, by: &by, note: note.as_deref() }))
            .await
            .map_err(|e| e.to_string())?;
        decided.approval.ok_or_else(|| "the decided call holds no approval".into())
    }
}
