//! Spending limits of an irreversible tool (`docs/policy.md`, "Limits"):
//! how much its calls may move — a sum over one integer argument (cents),
//! or a count of calls — per tenant, principal or session, or across everyone,
//! per call or per calendar window in UTC (Stripe Issuing's intervals: a
//! day from midnight, a week from Sunday, a month from the 1st, a year from
//! January 1st, or all time), several per tool, a currency argument
//! keeping sums in different currencies apart. Windows are read on the
//! ledger's clock, so the hosts of a fleet agree on them.

use chrono::{DateTime, Datelike, NaiveDate, TimeZone, Utc};
use serde::{Deserialize, Serialize};

/// One limit as written (`limits = [{ sum = "/amount_cents", max = 50000, per = "principal", window = "day" }]`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLimit {
    /// The JSON pointer of the integer argument summed; without it, calls are counted.
    pub sum: Option<String>,
    /// The most the window may hold: in the argument's unit, or calls.
    pub max: u64,
    /// Whose calls count together (default `principal`).
    #[serde(default)]
    pub per: Per,
    /// The window (default `day`).
    #[serde(default)]
    pub window: Window,
    /// The JSON pointer of a string argument naming the currency: sums in
    /// different currencies are kept apart.
    pub currency: Option<String>,
    /// What a call over it gets (default `refuse`).
    #[serde(default)]
    pub over_limit: OverLimit,
    /// Where each send of the call must carry the summed amount: a form
    /// field's name (`amount`) or a JSON pointer into a JSON body
    /// (`/amount`). A send that does not carry exactly it is refused.
    pub sent_as: Option<String>,
}

/// What a call that would pass a limit gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum OverLimit {
    /// Refused before anything is sent.
    #[default]
    Refuse,
    /// Admitted to wait for a person's approval (the tool's consent path,
    /// bound to the call's action); its amount counts, past the limit, once
    /// approved and made.
    Approve,
}

impl OverLimit {
    /// Whether it is the default (left out of the effective policy, so a
    /// policy's digest does not change for a setting it never wrote).
    pub fn is_refuse(&self) -> bool {
        *self == Self::Refuse
    }
}

/// Whose calls a limit counts together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Per {
    /// The caller's tenant (`[mcp.oauth] tenant_claim`: all its principals);
    /// a call without one counts under its principal, or its session.
    Tenant,
    /// The caller's authenticated principal (all its sessions); a call
    /// without one counts under the session.
    #[default]
    Principal,
    /// The MCP session.
    Session,
    /// Every caller of the tool together.
    Everyone,
}

/// The window a limit counts in: calendar-aligned in UTC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Window {
    /// Each call alone (nothing is recorded).
    Call,
    /// A day from midnight UTC.
    #[default]
    Day,
    /// A week from Sunday midnight UTC.
    Week,
    /// A month from the 1st, midnight UTC.
    Month,
    /// A year from January 1st, midnight UTC.
    Year,
    /// Since the ledger began.
    AllTime,
}

/// A checked limit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Limit {
    /// The argument summed, or `None` to count calls.
    pub sum: Option<String>,
    /// The most a window holds.
    pub max: u64,
    /// Whose calls count together.
    pub per: Per,
    /// The window.
    pub window: Window,
    /// The argument naming the currency, if sums are kept apart by it.
    pub currency: Option<String>,
    /// What a call over it gets.
    #[serde(skip_serializing_if = "OverLimit::is_refuse")]
    pub over_limit: OverLimit,
    /// Where each send must carry the summed amount, if bound.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sent_as: Option<String>,
}

impl Limit {
    /// Checks `raw` as written.
    ///
    /// # Errors
    /// What is wrong, in words.
    pub fn new(raw: RawLimit) -> Result<Self, String> {
        if raw.max == 0 {
            return Err("`max` must be at least 1 (a tool nobody may call needs no grant instead)".into());
        }
        if let Some(pointer) = [&raw.sum, &raw.currency].into_iter().flatten().find(|p| !p.starts_with('/')) {
            return Err(format!("`{pointer}` is not a JSON pointer (`/amount_cents`)"));
        }
        if raw.currency.is_some() && raw.sum.is_none() {
            return Err("`currency` keeps sums apart; a limit counting calls has none".into());
        }
        if raw.sent_as.is_some() && raw.sum.is_none() {
            return Err("`sent_as` names where a send carries the summed amount; a limit counting calls sums none".into());
        }
        if raw.sent_as.as_deref().is_some_and(str::is_empty) {
            return Err("`sent_as` is empty: name the form field (`amount`) or the JSON pointer (`/amount`) the amount travels in".into());
        }
        Ok(Self { sum: raw.sum, max: raw.max, per: raw.per, window: raw.window, currency: raw.currency, over_limit: raw.over_limit, sent_as: raw.sent_as })
    }

    /// Checks it against the tool's input schema, when the plugin loads: a
    /// summed argument must be declared an integer, a currency a string.
    ///
    /// # Errors
    /// What the schema does not guarantee, in words.
    pub fn fits(&self, input_schema: &serde_json::Value) -> Result<(), String> {
        for (pointer, kind) in [(&self.sum, "integer"), (&self.currency, "string")] {
            let Some(pointer) = pointer else { continue };
            let declared = declared_type(input_schema, pointer);
            if declared.as_deref() != Some(kind) {
                return Err(format!(
                    "the policy's limit sums `{pointer}`, which the input schema must declare as {kind} (it says {}): a limit counts only what the schema guarantees",
                    declared.unwrap_or_else(|| "nothing".into())
                ));
            }
        }
        Ok(())
    }

    /// What a call with `args` spends: the summed argument (or 1), and the
    /// currency it is kept apart by (upper-cased), if any.
    ///
    /// # Errors
    /// The summed argument is missing, negative or not an integer.
    pub fn amount(&self, args: &serde_json::Value) -> Result<(u64, Option<String>), String> {
        let amount = match &self.sum {
            None => 1,
            Some(p) => args.pointer(p).and_then(serde_json::Value::as_u64).ok_or_else(|| format!("`{p}` is not a non-negative integer in the arguments"))?,
        };
        let currency = self.currency.as_ref().map(|p| args.pointer(p).and_then(serde_json::Value::as_str).unwrap_or("").to_ascii_uppercase());
        Ok((amount, currency))
    }

    /// This limit in words: `sum of /amount_cents ≤ 50000 per principal per day`.
    pub fn describe(&self) -> String {
        let what = self.sum.as_ref().map_or("calls".to_string(), |p| format!("sum of {p}"));
        let currency = self.currency.as_ref().map(|p| format!(" (apart by {p})")).unwrap_or_default();
        let over = if self.over_limit == OverLimit::Approve { ", past it with a person's approval" } else { "" };
        let sent = self.sent_as.as_ref().map(|f| format!(", each send carrying it as {f}")).unwrap_or_default();
        format!("{what} ≤ {} per {} per {}{currency}{over}{sent}", self.max, self.per.as_str(), self.window.as_str())
    }
}

impl Per {
    /// The name as written.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tenant => "tenant",
            Self::Principal => "principal",
            Self::Session => "session",
            Self::Everyone => "everyone",
        }
    }
}

impl Window {
    /// The name as written.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Call => "call",
            Self::Day => "day",
            Self::Week => "week",
            Self::Month => "month",
            Self::Year => "year",
            Self::AllTime => "all_time",
        }
    }

    /// The window holding `at_ms` (Unix ms, the ledger's clock): its start
    /// and its end; `None` for a call's own window.
    pub fn bounds(self, at_ms: u64) -> Option<(u64, u64)> {
        let at = DateTime::from_timestamp_millis(i64::try_from(at_ms).ok()?)?.date_naive();
        let ms = |d: NaiveDate| Utc.from_utc_datetime(&d.and_hms_opt(0, 0, 0).expect("midnight exists")).timestamp_millis().max(0) as u64;
        let (start, end) = match self {
            Self::Call => return None,
            Self::AllTime => return Some((0, u64::MAX)),
            Self::Day => (at, at.succ_opt()?),
            Self::Week => {
                let start = at - chrono::Days::new(u64::from(at.weekday().num_days_from_sunday()));
                (start, start + chrono::Days::new(7))
            }
            Self::Month => {
                let start = at.with_day(1)?;
                (start, start + chrono::Months::new(1))
            }
            Self::Year => {
                let start = NaiveDate::from_ymd_opt(at.year(), 1, 1)?;
                (start, NaiveDate::from_ymd_opt(at.year() + 1, 1, 1)?)
            }
        };
        Some((ms(start), ms(end)))
    }
}

/// The `type` the schema declares at `pointer` (through `properties`).
fn declared_type(schema: &serde_json::Value, pointer: &str) -> Option<String> {
    let mut at = schema;
    for part in pointer.trim_start_matches('/').split('/') {
        at = at.get("properties")?.get(part.replace("~1", "/").replace("~0", "~"))?;
    }
    at.get("type")?.as_str().map(str::to_string)
}

/// Whose uses of one limit count together: the ledger's scope of a
/// limit's uses, written and read only here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    /// The plugin.
    pub plugin: String,
    /// The tool, as served.
    pub tool: String,
    /// The limit's index in the tool's `limits`.
    pub index: usize,
    /// Whose calls: `["tenant", t]`, `["principal", p]`, `["session", s]` or `["everyone"]`.
    pub whose: serde_json::Value,
    /// The currency its sums are kept apart by, if any.
    pub currency: Option<String>,
}

impl Scope {
    /// The ledger's key of it (a JSON array: opaque to the ledger).
    pub fn key(&self) -> String {
        serde_json::json!(["limit", self.plugin, self.tool, self.index, self.whose, self.currency]).to_string()
    }

    /// The scope a key names; `None` for a key this version did not write.
    pub fn parse(key: &str) -> Option<Self> {
        let v: serde_json::Value = serde_json::from_str(key).ok()?;
        match v.as_array()?.as_slice() {
            [kind, plugin, tool, index, whose, currency] if kind == "limit" => Some(Self {
                plugin: plugin.as_str()?.to_string(),
                tool: tool.as_str()?.to_string(),
                index: usize::try_from(index.as_u64()?).ok()?,
                whose: whose.clone(),
                currency: currency.as_str().map(str::to_string),
            }),
            _ => None,
        }
    }
}

/// What one scope of a limit holds in its current window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScopeUse {
    /// The ledger's key of the scope.
    pub key: String,
    /// The scope it names, if this version wrote it.
    pub limit: Option<Scope>,
    /// The sum of its uses.
    pub used: u64,
    /// How many calls made them.
    pub calls: u64,
    /// When its window ends (Unix ms; `u64::MAX`: never).
    pub until_ms: u64,
}

/// The uses the ledger holds (`Ledger::spent`: each one's scope key,
/// amount and window end), summed per scope, in key order.
pub fn in_use<'a>(uses: impl IntoIterator<Item = (&'a str, u64, u64)>) -> Vec<ScopeUse> {
    let mut by_scope: std::collections::BTreeMap<&str, (u64, u64, u64)> = std::collections::BTreeMap::new();
    for (scope, amount, until_ms) in uses {
        let entry = by_scope.entry(scope).or_default();
        *entry = (entry.0.saturating_add(amount), entry.1 + 1, entry.2.max(until_ms));
    }
    by_scope.into_iter().map(|(key, (used, calls, until_ms))| ScopeUse { key: key.to_string(), limit: Scope::parse(key), used, calls, until_ms }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: u64 = 86_400_000;

    #[test]
    fn windows_are_calendar_aligned_in_utc() {
        // 2026-12-09 (a Wednesday) 15:30 UTC.
        let at = 1_796_830_200_000;
        let midnight = at - at % DAY;
        assert_eq!(Window::Day.bounds(at), Some((midnight, midnight + DAY)));
        assert_eq!(Window::Week.bounds(at), Some((midnight - 3 * DAY, midnight + 4 * DAY)), "from Sunday the 6th");
        let (start, end) = Window::Month.bounds(at).unwrap();
        assert_eq!((start, end), (midnight - 8 * DAY, midnight + 23 * DAY), "December 1st to January 1st");
        let (start, end) = Window::Year.bounds(at).unwrap();
        assert_eq!((end - start) / DAY, 365);
        assert_eq!(Window::Year.bounds(start), Some((start, end)), "its first millisecond is in it");
        assert_eq!(Window::Day.bounds(midnight + DAY).unwrap().0, midnight + DAY, "the next day's first millisecond is not");
        assert_eq!(Window::Call.bounds(at), None);
    }

    #[test]
    fn a_summed_argument_must_be_an_integer_the_schema_declares() {
        let schema = serde_json::json!({ "type": "object", "properties": { "amount_cents": { "type": "integer" }, "note": { "type": "string" } } });
        let raw = |sum: &str| RawLimit {
            sum: Some(sum.into()),
            max: 5_000,
            per: Per::Principal,
            window: Window::Day,
            currency: None,
            over_limit: Default::default(),
            sent_as: None,
        };
        let fits = |sum: &str| Limit::new(raw(sum)).unwrap().fits(&schema);
        // Bound to a request field: only a sum, and a field named.
        assert!(Limit::new(RawLimit { sent_as: Some("amount".into()), ..raw("/amount_cents") }).is_ok());
        assert!(Limit::new(RawLimit { sent_as: Some(String::new()), ..raw("/amount_cents") }).unwrap_err().contains("`sent_as` is empty"));
        assert!(Limit::new(RawLimit { sum: None, sent_as: Some("amount".into()), ..raw("/x") }).unwrap_err().contains("counting calls sums none"));
        assert!(fits("/amount_cents").is_ok());
        assert!(fits("/note").unwrap_err().contains("as integer (it says string)"));
        assert!(fits("/missing").unwrap_err().contains("it says nothing"));
        assert!(Limit::new(raw("amount_cents")).unwrap_err().contains("not a JSON pointer"));
        let limit = Limit::new(raw("/amount_cents")).unwrap();
        assert_eq!(limit.amount(&serde_json::json!({ "amount_cents": 1500 })).unwrap(), (1500, None));
        assert!(limit.amount(&serde_json::json!({ "amount_cents": -5 })).is_err());
        assert!(limit.amount(&serde_json::json!({})).is_err());
    }
}
