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

/// The tool-call id the client sent, if any. (The runtime refuses one that
/// is not a usable id: [`crate::runtime::check_id`].)
pub fn call_id(meta: &Map<String, Value>) -> Option<String> {
    std::iter::once(CALL_ID_KEY).chain(CALL_ID_FALLBACKS.iter().copied()).find_map(|k| lookup(meta, k))
}

/// The session: ours, else a client's conversation key, else the configured
/// default — inside the namespace of the authenticated principal, if the
/// client presented a token (`principal/session`): a token's holders can
/// neither read nor replay nor spend the budget of another token's sessions,
/// whatever session id they send.
///
/// # Errors
/// The session id the client sent is not a usable id ([`crate::runtime::check_id`]).
pub fn session(meta: &Map<String, Value>, principal: Option<&str>, config: &McpConfig) -> Result<String, String> {
    let named = std::iter::once(SESSION_KEY).chain(SESSION_FALLBACKS.iter().copied()).find_map(|k| lookup(meta, k));
    let session = named.unwrap_or_else(|| config.default_session.clone());
    crate::runtime::check_id("session id", &session)?;
    Ok(match principal {
        Some(p) => format!("{p}/{session}"),
        None => session,
    })
}

/// What a call id minted for a read-only call starts with.
const READ_ID: &str = "mcp-read-";

/// Whether `call_id` was minted here for a read-only call the client sent
/// without one (so a retry of that call comes with another).
pub fn minted_for_read(call_id: &str) -> bool {
    call_id.starts_with(READ_ID)
}

/// The call id to use when the client sent none: for a side-effecting tool
/// `None` (refuse) unless the config opts into deriving it from the
/// arguments; for a read-only tool a fresh one (nothing to deduplicate).
pub fn fallback_call_id(side_effects: bool, tool: &str, args_json: &str, config: &McpConfig) -> Option<String> {
    if !side_effects {
        let mut bytes = [0u8; 12];
        let _ = getrandom::fill(&mut bytes);
        return Some(format!("{READ_ID}{}", hex::encode(bytes)));
    }
    match config.missing_call_id {
        MissingCallId::Refuse => None,
        MissingCallId::DeriveFromArguments => {
            let args: Value = serde_json::from_str(args_json).ok()?;
            let canonical = crate::keys::canonical_args(&args).ok()?;
            Some(format!("derived-{tool}-{}", &crate::keys::args_digest(&canonical)[..32]))
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
        let session = |m: Value, p: Option<&str>| session(&meta(m), p, &c).unwrap();
        assert_eq!(session(json!({ "toolguard/sessionId": "s", "threadId": "t" }), None), "s");
        assert_eq!(session(json!({ "threadId": "t" }), None), "t");
        assert_eq!(session(json!({ "vscode": { "conversationId": "v" } }), None), "v");
        assert_eq!(session(json!({ "vscode.conversationId": "v2" }), None), "v2");
        assert_eq!(session(json!({}), None), "default");
    }

    #[test]
    fn an_authenticated_principal_namespaces_every_session() {
        let c = McpConfig::default();
        assert_eq!(session(&meta(json!({ "toolguard/sessionId": "s" })), Some("ops"), &c).unwrap(), "ops/s");
        assert_eq!(session(&meta(json!({})), Some("ops"), &c).unwrap(), "ops/default");
        // Another principal's session cannot be named: it lands in one's own namespace.
        assert_eq!(session(&meta(json!({ "toolguard/sessionId": "support/s" })), Some("ops"), &c).unwrap(), "ops/support/s");
        assert!(session(&meta(json!({ "toolguard/sessionId": "a\u{1b}[2J" })), Some("ops"), &c).is_err());
        assert!(session(&meta(json!({ "toolguard/sessionId": "x".repeat(300) })), None, &c).is_err());
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
