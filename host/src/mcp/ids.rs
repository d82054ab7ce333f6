//! Which tool call and which session an MCP `tools/call` belongs to — the
//! ids the guard scopes its keys to. Never the JSON-RPC id (it changes on
//! retries) nor `Mcp-Session-Id` (a transport session, not a conversation).

use crate::config::{McpConfig, MissingCallId};
use serde_json::{Map, Value};

/// Our key for the model's tool-call id in `_meta`.
pub const CALL_ID_KEY: &str = "toolguard/toolCallId";
/// Our key for the agent's session (conversation) id in `_meta`.
pub const SESSION_KEY: &str = "toolguard/sessionId";
/// Keys real clients already send for the tool-call id, after ours.
const CALL_ID_FALLBACKS: &[&str] = &["claudecode/toolUseId"];
/// Keys real clients already send for a conversation, after ours.
const SESSION_FALLBACKS: &[&str] = &["threadId", "vscode.conversationId"];

/// The first non-empty string at `key` in `meta`; a dotted key also matches
/// the nested form (`vscode.conversationId` → `{"vscode":{"conversationId":…}}`).
fn lookup(meta: &Map<String, Value>, key: &str) -> Option<String> {
    let flat = meta.get(key).and_then(Value::as_str);
    let nested = || {
        let (head, rest) = key.split_once('.')?;
        meta.get(head)?.as_object()?.get(rest)?.as_str()
    };
    flat.or_else(nested).filter(|v| !v.is_empty()).map(str::to_string)
}

/// The tool-call id the client sent, if any.
pub fn call_id(meta: &Map<String, Value>) -> Option<String> {
    std::iter::once(CALL_ID_KEY).chain(CALL_ID_FALLBACKS.iter().copied()).find_map(|k| lookup(meta, k))
}

/// The session: ours, else a client's conversation key, else the
/// authenticated principal, else the configured default.
pub fn session(meta: &Map<String, Value>, principal: Option<&str>, config: &McpConfig) -> String {
    std::iter::once(SESSION_KEY)
        .chain(SESSION_FALLBACKS.iter().copied())
        .find_map(|k| lookup(meta, k))
        .or_else(|| principal.map(str::to_string))
        .unwrap_or_else(|| config.default_session.clone())
}

/// The call id to use when the client sent none: for a side-effecting tool
/// `None` (refuse) unless the config opts into deriving it from the
/// arguments; for a read-only tool a fresh one (nothing to deduplicate).
pub fn fallback_call_id(side_effects: bool, tool: &str, args_json: &str, config: &McpConfig) -> Option<String> {
    if !side_effects {
        let mut bytes = [0u8; 12];
        let _ = getrandom::fill(&mut bytes);
        return Some(format!("mcp-read-{}", hex::encode(bytes)));
    }
    match config.missing_call_id {
        MissingCallId::Refuse => None,
        MissingCallId::DeriveFromArguments => {
            let args: Value = serde_json::from_str(args_json).ok()?;
            let canonical = crate::guard::keys::canonical_args(&args).ok()?;
            Some(format!("derived-{tool}-{}", &crate::guard::keys::args_digest(&canonical)[..32]))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn meta(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn ours_first_then_known_client_keys() {
        let m = meta(json!({ "toolguard/toolCallId": "t1", "claudecode/toolUseId": "toolu_1" }));
        assert_eq!(call_id(&m).as_deref(), Some("t1"));
        assert_eq!(call_id(&meta(json!({ "claudecode/toolUseId": "toolu_1" }))).as_deref(), Some("toolu_1"));
        assert_eq!(call_id(&meta(json!({ "progressToken": 3 }))), None);
        let c = McpConfig::default();
        assert_eq!(session(&meta(json!({ "toolguard/sessionId": "s", "threadId": "t" })), Some("p"), &c), "s");
        assert_eq!(session(&meta(json!({ "threadId": "t" })), Some("p"), &c), "t");
        assert_eq!(session(&meta(json!({ "vscode": { "conversationId": "v" } })), None, &c), "v");
        assert_eq!(session(&meta(json!({ "vscode.conversationId": "v2" })), None, &c), "v2");
        assert_eq!(session(&meta(json!({})), Some("p"), &c), "p");
        assert_eq!(session(&meta(json!({})), None, &c), "default");
    }

    #[test]
    fn missing_ids_are_refused_for_side_effects_unless_configured() {
        let refuse = McpConfig::default();
        assert_eq!(fallback_call_id(true, "refund", "{}", &refuse), None);
        assert!(fallback_call_id(false, "status", "{}", &refuse).unwrap().starts_with("mcp-read-"));
        let derive = McpConfig { missing_call_id: MissingCallId::DeriveFromArguments, ..McpConfig::default() };
        let a = fallback_call_id(true, "refund", r#"{"b":1,"a":2}"#, &derive).unwrap();
        assert_eq!(Some(a), fallback_call_id(true, "refund", r#"{"a":2, "b":1}"#, &derive));
    }
}
