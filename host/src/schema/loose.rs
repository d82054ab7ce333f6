//! The arguments a schema lets a caller vary without naming another action:
//! free text, optional properties, properties it does not list. The hold rule
//! knows a blind repeat only by identical arguments (`docs/guard.md`, "What
//! 'identical' leaves out"), so `toolguard audit` names these for each
//! irreversible tool. A reading of the schema's own document: local `$ref`s
//! are followed, `allOf`/`anyOf`/`oneOf` branches read alike.

use super::{MAX_DEPTH, deferred};
use serde_json::Value;

/// Each loose argument of `schema`, as `` `POINTER` (why) ``, once each.
pub(super) fn loose_arguments(schema: &Value) -> Vec<String> {
    let mut out = Vec::new();
    walk(schema, schema, "", 0, &mut out);
    out
}

/// Adds what `node`, the schema of the arguments at `at`, leaves loose.
fn walk(root: &Value, node: &Value, at: &str, depth: u8, out: &mut Vec<String>) {
    if depth > MAX_DEPTH {
        return;
    }
    let Value::Object(node) = node else {
        // `true` (or an unreadable schema) below the root: any value at all.
        if node == &Value::Bool(true) && !at.is_empty() {
            note(out, at, "any value");
        }
        return;
    };
    deferred(root, node).for_each(|d| walk(root, d, at, depth + 1, out));
    if node.contains_key("enum") || node.contains_key("const") {
        return;
    }
    let is = |t: &str| match node.get("type") {
        Some(Value::String(s)) => s == t,
        Some(Value::Array(ts)) => ts.iter().any(|x| x == t),
        _ => false,
    };
    if is("string") && !node.contains_key("pattern") && !node.contains_key("format") {
        note(out, if at.is_empty() { "/" } else { at }, "free text");
    }
    let properties = node.get("properties").and_then(Value::as_object);
    let required: Vec<&str> = node.get("required").and_then(Value::as_array).map(|r| r.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
    for (name, sub) in properties.into_iter().flatten() {
        let here = format!("{at}/{}", name.replace('~', "~0").replace('/', "~1"));
        if !required.contains(&name.as_str()) {
            note(out, &here, "optional");
        }
        walk(root, sub, &here, depth + 1, out);
    }
    let closed = ["additionalProperties", "unevaluatedProperties"].iter().any(|k| node.get(*k) == Some(&Value::Bool(false)));
    if (properties.is_some() || is("object")) && !closed {
        note(out, &format!("{at}/*"), "properties it does not list");
    }
    if let Some(items) = node.get("items") {
        walk(root, items, &format!("{at}/*"), depth + 1, out);
    }
}

/// Adds `` `at` (why) `` unless already there.
fn note(out: &mut Vec<String>, at: &str, why: &str) {
    let line = format!("`{at}` ({why})");
    if !out.contains(&line) {
        out.push(line);
    }
}

#[cfg(test)]
mod tests {
    use super::loose_arguments;
    use serde_json::json;

    #[test]
    fn ids_amounts_and_enumerations_that_are_all_required_leave_nothing_loose() {
        let refund = json!({
            "type": "object", "additionalProperties": false,
            "required": ["payment_intent", "amount_cents", "reason"],
            "properties": {
                "payment_intent": {"type": "string", "pattern": "^pi_[A-Za-z0-9_]{1,64}$"},
                "amount_cents": {"type": "integer", "minimum": 1},
                "reason": {"$ref": "#/$defs/Reason"}
            },
            "$defs": {"Reason": {"type": "string", "enum": ["duplicate", "fraudulent"]}}
        });
        assert_eq!(loose_arguments(&refund), Vec::<String>::new());
    }

    #[test]
    fn free_text_optional_and_unlisted_properties_are_named_by_pointer() {
        let ticket = json!({
            "type": "object",
            "required": ["subject", "to"],
            "properties": {
                "subject": {"type": "string", "maxLength": 200},
                "to": {"$ref": "#/$defs/Email"},
                "priority": {"type": "integer", "default": 3},
                "meta": {"type": "object", "unevaluatedProperties": false, "properties": {"a/b": {"anyOf": [{"type": "string"}, {"type": "null"}]}}},
                "extra": true,
                "tags": {"type": "array", "items": {"type": "string"}}
            },
            "$defs": {"Email": {"type": "string", "format": "email"}}
        });
        let mut loose = loose_arguments(&ticket);
        loose.sort();
        let mut expected = [
            "`/subject` (free text)",
            "`/priority` (optional)",
            "`/meta` (optional)",
            "`/meta/a~1b` (optional)",
            "`/meta/a~1b` (free text)",
            "`/extra` (optional)",
            "`/extra` (any value)",
            "`/tags` (optional)",
            "`/tags/*` (free text)",
            "`/*` (properties it does not list)",
        ];
        expected.sort();
        assert_eq!(loose, expected);
    }

    #[test]
    fn a_recursive_schema_stops_at_the_depth_limit() {
        let tree = json!({"$ref": "#/$defs/T", "$defs": {"T": {"type": "object", "additionalProperties": false, "required": ["next"], "properties": {"next": {"$ref": "#/$defs/T"}}}}});
        let loose = loose_arguments(&tree);
        assert!(loose.is_empty(), "{loose:?}");
    }
}
