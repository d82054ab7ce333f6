//! What a call spends when it is admitted to run, charged in the ledger
//! write that admits it: budgets (uses per hour: irreversible calls per
//! session or principal, approval requests per principal) and spending
//! limits (amounts per window, `crate::policy::limits`). Each budget's and
//! limit's scope is locked in name order while it is counted and written,
//! so concurrent calls never both spend a last use.

use super::Guard;

/// A budget of calls of a plugin's irreversible tools per hour: per session
/// (`max_irreversible_calls_per_session_hour`) or per authenticated
/// principal (`max_irreversible_calls_per_principal_hour`).
#[derive(Debug, Clone)]
pub struct Budget {
    /// Whose uses count together (opaque; stored with each use).
    pub scope: String,
    /// Uses allowed in any hour.
    pub max: u32,
    /// What it is, in words, naming its policy setting.
    pub what: String,
}

/// What one call spends from one spending limit (`crate::policy::limits`).
#[derive(Debug, Clone)]
pub struct Spending {
    /// Whose calls count together, and in what currency (opaque; stored with each use).
    pub scope: String,
    /// The most its window holds.
    pub max: u64,
    /// What this call spends.
    pub amount: u64,
    /// The window, calendar-aligned in UTC on the ledger's clock.
    pub window: crate::policy::limits::Window,
    /// The limit in words, naming its tool and setting.
    pub what: String,
    /// Over it, a person may approve the call instead of a refusal (`over_limit = "approve"`).
    pub approvable: bool,
}

impl Spending {
    /// The use call `call` (admitted at its `created_ms`) makes of it, if
    /// its window records uses; `past` an approvable limit, unchecked (a
    /// person will decide, and the use counts).
    pub(crate) fn spend(&self, call: &crate::ledger::CallRecord, past: bool) -> Option<crate::ledger::Spend> {
        let (_, until_ms) = self.window.bounds(call.created_ms)?;
        Some(crate::ledger::Spend {
            scope: self.scope.clone(),
            max: if past && self.approvable { u64::MAX } else { self.max },
            until_ms,
            at_ms: call.created_ms,
            call_id: call.call_id.clone(),
            amount: self.amount,
            what: self.what.clone(),
        })
    }
}

/// `call`, recording the scopes it takes its amount from under `spending`
/// (those whose window records uses), so that what it spent can be given
/// back from its record alone ([`crate::ledger::LedgerWrite::release_spent`]).
/// A call over an approvable limit of each call alone is marked so here
/// (`over_limit`); one over a window's, when the ledger finds it.
pub(super) fn spent(spending: &[Spending], call: crate::ledger::CallRecord) -> crate::ledger::CallRecord {
    let spent = spending.iter().filter(|s| s.amount > 0 && s.window.bounds(call.created_ms).is_some()).map(|s| s.scope.clone()).collect();
    let over: Vec<String> = spending
        .iter()
        .filter(|s| s.approvable && s.window == crate::policy::limits::Window::Call && s.amount > s.max)
        .map(|s| format!("over a spending limit: {}: this call would move {}", s.what, s.amount))
        .collect();
    let over_limit = if over.is_empty() { call.over_limit.clone() } else { Some(over.join("; ")) };
    crate::ledger::CallRecord { spent, over_limit, ..call }
}

/// An amount each send of a call must carry (a limit's `sent_as`): the
/// limit counts the call's argument, so the request must move exactly it.
#[derive(Debug, Clone)]
pub struct Carried {
    /// A form field's name, or a JSON pointer (`/amount`) into a JSON body.
    pub field: String,
    /// The amount the limit counted.
    pub amount: u64,
    /// The limit in words.
    pub what: String,
}

/// Whether `request` (a send that changes something) carries each of
/// `carried`'s amounts where its limit says; the refusal's reason if not.
pub(super) fn carries(carried: &[Carried], request: &crate::ledger::records::StoredRequest) -> Result<(), String> {
    let body = request.body.to_bytes();
    for c in carried {
        let found = match c.field.strip_prefix('/') {
            Some(_) => serde_json::from_slice::<serde_json::Value>(&body).ok().and_then(|v| v.pointer(&c.field).and_then(serde_json::Value::as_u64)),
            None => form_urlencoded::parse(&body).filter(|(k, _)| *k == c.field).map(|(_, v)| v.parse::<u64>().ok()).last().flatten(),
        };
        if found != Some(c.amount) {
            let sent = found.map_or_else(|| "nothing readable".to_string(), |v| v.to_string());
            return Err(format!(
                "{}: the call's argument is {}, but this request carries {sent} as `{}`; a limit counts the argument, so each send must move exactly it. Nothing was sent",
                c.what, c.amount, c.field
            ));
        }
    }
    Ok(())
}

/// The window of every budget.
pub const BUDGET_WINDOW_MS: u64 = 3_600_000;

/// What admitting one call costs: one use of each budget, and its amount
/// from each spending limit.
#[derive(Debug, Clone, Copy)]
pub(super) struct Costs<'a> {
    /// The budgets it spends a use of.
    pub budgets: &'a [Budget],
    /// The limits it spends its amount from.
    pub spending: &'a [Spending],
}

impl super::CallRules {
    /// What admitting a call under these rules costs.
    pub(super) fn costs(&self) -> Costs<'_> {
        Costs { budgets: &self.budgets, spending: &self.spending }
    }
}

/// One cost, under its scope's lock.
enum Cost<'a> {
    Budget(&'a Budget),
    Spend(crate::ledger::Spend),
}

impl Guard {
    /// The budget of approval requests of `principal`'s calls, if capped.
    pub(super) fn approval_budget(&self, principal: &str) -> Option<Budget> {
        let max = Some(self.approval_quota.load(std::sync::atomic::Ordering::Relaxed)).filter(|m| *m > 0)?;
        Some(Budget {
            scope: serde_json::json!(["approval-requests", principal]).to_string(),
            max,
            what: format!("principal `{principal}`'s approval requests ([mcp] max_approval_requests_per_principal_hour = {max})"),
        })
    }

    /// `write`, charging `call` (admitted at `now_ms()`) with `costs` — one
    /// use of each budget, its amount from each limit (`past` approvable
    /// limits: unchecked) — and the locks of their scopes, taken together
    /// in name order. Held until the write is committed, they make counting
    /// and recording a use one step, so concurrent calls never both spend a
    /// last use (the write is refused whole if one is spent or passed).
    pub(super) async fn charged(
        &self,
        mut write: crate::ledger::LedgerWrite,
        costs: Costs<'_>,
        call: &crate::ledger::CallRecord,
        past: bool,
    ) -> (crate::ledger::LedgerWrite, Vec<tokio::sync::OwnedMutexGuard<()>>) {
        let at_ms = crate::ledger::records::now_ms();
        let mut charges: Vec<(&str, Cost)> = costs.budgets.iter().map(|b| (b.scope.as_str(), Cost::Budget(b))).collect();
        charges.extend(costs.spending.iter().filter_map(|s| Some((s.scope.as_str(), Cost::Spend(s.spend(call, past)?)))));
        charges.sort_by(|a, b| a.0.cmp(b.0));
        let mut held = Vec::new();
        for (scope, cost) in charges {
            held.push(self.budgets.get(scope.to_string()).lock_owned().await);
            write = match cost {
                Cost::Budget(budget) => write.charge(crate::ledger::Charge {
                    scope: budget.scope.clone(),
                    max: budget.max,
                    since_ms: at_ms.saturating_sub(BUDGET_WINDOW_MS),
                    at_ms,
                    call_id: call.call_id.clone(),
                    what: budget.what.clone(),
                }),
                Cost::Spend(spend) => write.spend(spend),
            };
        }
        (write, held)
    }

    /// Gives back what `call` took from spending limits if its sends, all
    /// settled now, never took effect (its claim and lock held). A failure
    /// is logged: the use keeps counting, which is the safe side.
    pub(super) async fn give_back_if_never_took_effect(&self, call: &crate::ledger::CallRecord) {
        let (ledger, session, call_id, host) = (self.ledger.clone(), call.session.clone(), call.call_id.clone(), self.host.clone());
        match super::claim::blocking(move || ledger.give_back_if_never_took_effect(&session, &call_id, Some(&host))).await {
            Ok(true) => tracing::info!(call_id = %call.call_id, "its sends never took effect: what it spent from spending limits was given back"),
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %e, call_id = %call.call_id, "could not give back a spending limit's use; it keeps counting"),
        }
    }
}
