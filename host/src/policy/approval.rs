//! When a person must approve an irreversible action before it runs
//! (`approval` on a tool in the policy; `docs/policy.md`, `docs/tasks.md`).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

/// How long an approval request waits for a decision, and an approval
/// stays usable, unless the reviewer says otherwise.
pub const DEFAULT_APPROVAL_MINUTES: u64 = 15;

/// `approval = { … }` as the reviewer writes it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawApproval {
    /// Every call needs approval.
    #[serde(default)]
    pub always: bool,
    /// A call needs approval when an argument (a JSON pointer) is above a number.
    #[serde(default)]
    pub above: BTreeMap<String, f64>,
    /// How long a request waits for a decision, and an approval stays usable.
    pub expires_minutes: Option<u64>,
}

/// The checked rule.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ApprovalRule {
    /// Every call needs approval.
    pub always: bool,
    /// Arguments (JSON pointers) and the number above which a call needs approval.
    pub above: Vec<(String, f64)>,
    /// How long a request waits, and an approval stays usable (minutes).
    pub expires_minutes: u64,
}

impl ApprovalRule {
    /// The rule `raw` says.
    ///
    /// # Errors
    /// It asks for nothing, a pointer is not one, or the expiry is 0.
    pub fn new(raw: RawApproval) -> Result<Self, String> {
        if !raw.always && raw.above.is_empty() {
            return Err("say when a person must approve: `always = true`, or `above = { \"/amount_cents\" = 10000 }`".into());
        }
        if let Some(bad) = raw.above.keys().find(|p| !p.starts_with('/')) {
            return Err(format!("`{bad}` is not a JSON pointer (they start with `/`)"));
        }
        let expires_minutes = raw.expires_minutes.unwrap_or(DEFAULT_APPROVAL_MINUTES);
        if expires_minutes == 0 {
            return Err("expires_minutes must be at least 1".into());
        }
        Ok(Self { always: raw.always, above: raw.above.into_iter().collect(), expires_minutes })
    }

    /// Why a call with `args` needs approval, in words; `None` if it does
    /// not. An argument the rule names that is missing or not a number
    /// asks too: the rule cannot tell the action is below its line.
    pub fn asks(&self, args: &Value) -> Option<String> {
        if self.always {
            return Some("every call of this tool needs a person's approval".into());
        }
        self.above.iter().find_map(|(pointer, line)| match args.pointer(pointer).and_then(Value::as_f64) {
            Some(v) if v <= *line => None,
            Some(v) => Some(format!("{pointer} is {v}, above {line}")),
            None => Some(format!("{pointer} is missing or not a number (approval is asked above {line})")),
        })
    }

    /// The pointers it reads.
    pub fn pointers(&self) -> impl Iterator<Item = &str> {
        self.above.iter().map(|(p, _)| p.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rule(text: &str) -> Result<ApprovalRule, String> {
        ApprovalRule::new(toml::from_str(text).map_err(|e| e.to_string())?)
    }

    #[test]
    fn a_rule_asks_above_its_line_or_always() {
        let above = rule(r#"above = { "/amount_cents" = 10000 }"#).unwrap();
        assert_eq!(above.asks(&json!({ "amount_cents": 10000 })), None, "at the line: no");
        assert!(above.asks(&json!({ "amount_cents": 10001 })).unwrap().contains("above 10000"));
        assert!(above.asks(&json!({ "amount_cents": "a lot" })).unwrap().contains("not a number"), "unreadable: asks");
        assert!(above.asks(&json!({})).is_some(), "missing: asks");
        assert_eq!(above.expires_minutes, DEFAULT_APPROVAL_MINUTES);
        assert!(rule("always = true\nexpires_minutes = 5").unwrap().asks(&json!({})).is_some());
    }

    #[test]
    fn a_rule_that_asks_nothing_or_names_no_pointer_is_refused() {
        assert!(rule("").unwrap_err().contains("say when"));
        assert!(rule(r#"above = { "amount" = 1 }"#).unwrap_err().contains("not a JSON pointer"));
        assert!(rule("always = true\nexpires_minutes = 0").unwrap_err().contains("at least 1"));
        assert!(rule("always = true\nsometimes = true").is_err(), "unknown fields are refused");
    }
}
