//! Whether a JSON pointer into the arguments names something the schema
//! declares: a reviewer's `action` pointer with a typo would name nothing,
//! read `null` in every call, and make every call of the tool one action.

use super::{MAX_DEPTH, deferred};
use serde_json::Value;

/// Whether `pointer` (RFC 6901) names a property (or an array item) that
/// `schema` declares, through `properties`, `items`, local `$ref`s and
/// `allOf`/`anyOf`/`oneOf` branches.
pub(super) fn declares(schema: &Value, pointer: &str) -> bool {
    let Some(rest) = pointer.strip_prefix('/') else { return pointer.is_empty() };
    let tokens: Vec<String> = rest.split('/').map(|t| t.replace("~1", "/").replace("~0", "~")).collect();
    reach(schema, schema, &tokens, 0)
}

/// Whether `node` declares the path `tokens`.
fn reach(root: &Value, node: &Value, tokens: &[String], depth: u8) -> bool {
    let Some((first, rest)) = tokens.split_first() else { return true };
    if depth > MAX_DEPTH {
        return false;
    }
    let Value::Object(node) = node else { return false };
    if deferred(root, node).any(|d| reach(root, d, tokens, depth + 1)) {
        return true;
    }
    if let Some(sub) = node.get("properties").and_then(|p| p.get(first.as_str())) {
        return reach(root, sub, rest, depth + 1);
    }
    match node.get("items") {
        Some(items) if first.parse::<usize>().is_ok() => reach(root, items, rest, depth + 1),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::declares;
    use serde_json::json;

    #[test]
    fn declared_properties_items_refs_and_branches_are_found_and_typos_are_not() {
        let schema = json!({
            "type": "object",
            "properties": {
                "payment_intent": {"type": "string"},
                "to": {"type": "array", "items": {"$ref": "#/$defs/Party"}},
                "a/b": {"anyOf": [{"type": "object", "properties": {"c": {"type": "integer"}}}, {"type": "null"}]}
            },
            "$defs": {"Party": {"type": "object", "properties": {"id": {"type": "string"}}}}
        });
        for found in ["/payment_intent", "/to/0/id", "/to/3", "/a~1b/c", "/a~1b"] {
            assert!(declares(&schema, found), "{found}");
        }
        for missing in ["/paymnet_intent", "/to/x", "/to/0/name", "/a/b", "/payment_intent/0", "payment_intent"] {
            assert!(!declares(&schema, missing), "{missing}");
        }
    }
}
