//! The scopes a request needs: `[mcp.oauth.scopes] any` for every
//! request, and for a `tools/call` those of its tool, its plugin and its
//! effect class (each that the rules name; all of them are needed).

use crate::config::ScopeRules;
use std::collections::{BTreeMap, BTreeSet};

/// Each served tool's needed scopes.
#[derive(Debug, Clone, Default)]
pub struct ScopeMap {
    any: Option<String>,
    tools: BTreeMap<String, Vec<String>>,
}

impl ScopeMap {
    /// The map for `tools` (name, plugin, effect class) under `rules`.
    pub fn new<'a>(rules: &ScopeRules, tools: impl Iterator<Item = (&'a str, &'a str, &'a str)>) -> Self {
        let tools = tools.map(|(name, plugin, effect)| (name.to_string(), rules.needed(name, plugin, effect))).collect();
        Self { any: rules.any.clone(), tools }
    }

    /// The scopes of those `body` (a JSON-RPC message, or a batch) needs that `granted` lacks.
    pub fn missing(&self, body: &[u8], granted: &BTreeSet<String>) -> Vec<String> {
        let mut needed: BTreeSet<&str> = self.any.iter().map(String::as_str).collect();
        if let Ok(value) = serde_json::from_slice::<serde_json::Value>(body) {
            let messages = match &value {
                serde_json::Value::Array(batch) => batch.iter().collect(),
                one => vec![one],
            };
            for m in messages.into_iter().filter(|m| m["method"] == "tools/call") {
                if let Some(scopes) = m["params"]["name"].as_str().and_then(|name| self.tools.get(name)) {
                    needed.extend(scopes.iter().map(String::as_str));
                }
            }
        }
        needed.into_iter().filter(|s| !granted.contains(*s)).map(String::from).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::ScopeMap;
    use crate::config::ScopeRules;

    #[test]
    fn a_call_needs_its_tools_plugins_and_classes_scopes() {
        let rules = ScopeRules {
            any: Some("mcp".into()),
            tools: [("refund".to_string(), "payments:refund".to_string())].into(),
            plugins: [("payments".to_string(), "payments".to_string())].into(),
            effects: [("irreversible".to_string(), "tools:write".to_string())].into(),
        };
        let map = ScopeMap::new(&rules, [("refund", "payments", "irreversible"), ("text_stats", "text", "read-only")].into_iter());
        let granted = |s: &[&str]| s.iter().map(|s| s.to_string()).collect();
        let call = |tool: &str| format!(r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"{tool}","arguments":{{}}}}}}"#).into_bytes();
        assert_eq!(map.missing(&call("refund"), &granted(&["mcp", "payments"])), ["payments:refund", "tools:write"]);
        assert!(map.missing(&call("refund"), &granted(&["mcp", "payments", "payments:refund", "tools:write"])).is_empty());
        assert!(map.missing(&call("text_stats"), &granted(&["mcp"])).is_empty());
        assert_eq!(map.missing(br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#, &granted(&[])), ["mcp"]);
    }
}
