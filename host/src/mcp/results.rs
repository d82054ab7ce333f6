//! A tool call's outcome as an MCP result: `structuredContent` plus a text
//! rendering on success; `isError: true` with the kind, the message and the
//! recovery move for failures the model can act on. Unknown tools are
//! JSON-RPC errors (see `mod.rs`).

use crate::error::CallError;
use crate::runtime::CallOutput;
use rmcp::model::{CallToolResult, ContentBlock, MetaObject};
use serde_json::{Map, Value, json};

/// A result object may carry its own MCP content blocks under this key
/// (images, audio, embedded resources); the rest of the object is the
/// structured content.
pub const CONTENT_KEY: &str = "toolguard/content";

/// The MCP result of a successful call.
pub fn success(out: CallOutput) -> CallToolResult {
    let mut value = out.value;
    let blocks = value.as_object_mut().and_then(|o| o.remove(CONTENT_KEY));
    let mut result = match blocks {
        Some(blocks) => match serde_json::from_value::<Vec<ContentBlock>>(blocks) {
            Ok(content) => {
                let mut r = CallToolResult::success(content);
                r.structured_content = value.as_object().filter(|o| !o.is_empty()).map(|_| value.clone());
                r
            }
            Err(e) => {
                let message = format!("the tool returned `{CONTENT_KEY}` that are not MCP content blocks: {e}");
                return error_result(&CallError::new(crate::error::ErrorKind::InvalidResult, message));
            }
        },
        None => {
            let text = serde_json::to_string(&value).unwrap_or_default();
            let mut r = CallToolResult::success(vec![ContentBlock::text(text)]);
            r.structured_content = value.is_object().then_some(value);
            r
        }
    };
    result.meta = Some(meta(out.replayed));
    result
}

/// The `isError` result of a failed call.
pub fn error_result(e: &CallError) -> CallToolResult {
    let text = format!("{}: {}. {}", e.kind, e.message.trim_end_matches('.'), e.kind.recovery_move());
    let mut r = CallToolResult::error(vec![ContentBlock::text(text)]);
    r.structured_content = Some(json!({ "kind": e.kind, "message": e.message, "detail": e.detail }));
    let replayed = e.detail.as_ref().and_then(|d| d.get("replayed")).and_then(Value::as_bool).unwrap_or(false);
    r.meta = Some(meta(replayed));
    r
}

/// `result` naming in `_meta` the tool-call id the guard scoped its call by
/// (the host's own for a read-only call sent without one): clients see which
/// call it answers, and delivery tells responses apart by it.
pub fn naming(mut result: CallToolResult, call_id: &str) -> CallToolResult {
    result.meta.get_or_insert_default().0.insert(super::ids::CALL_ID_KEY.into(), call_id.into());
    result
}

fn meta(replayed: bool) -> MetaObject {
    let mut m = Map::new();
    m.insert("toolguard/replayed".into(), Value::Bool(replayed));
    MetaObject(m)
}
