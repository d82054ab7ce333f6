//! JSON Schema for tool arguments and results, with the `jsonschema` crate
//! (draft 2020-12 by default, drafts 4–2019-09 by `$schema`).
//!
//! Remote references are never resolved: the crate is built without its HTTP
//! and file retrievers, so a plugin's schema cannot make the host fetch
//! anything. `$ref`s inside the schema document work.

mod declared;
mod loose;

use serde_json::{Map, Value};

/// How deep `$ref`s and nested schemas are followed (a recursive schema stops here).
const MAX_DEPTH: u8 = 16;

/// The schemas `node` defers to for the same place in an instance: its
/// local `$ref`'s target and its `allOf`/`anyOf`/`oneOf` branches.
fn deferred<'a>(root: &'a Value, node: &'a Map<String, Value>) -> impl Iterator<Item = &'a Value> {
    let referenced = node.get("$ref").and_then(Value::as_str).and_then(|r| r.strip_prefix('#')).and_then(|p| root.pointer(p));
    let branches = ["allOf", "anyOf", "oneOf"].into_iter().filter_map(|k| node.get(k).and_then(Value::as_array)).flatten();
    referenced.into_iter().chain(branches)
}

/// The most violations listed in one error message.
const MAX_REPORTED: usize = 5;

/// A compiled schema and the JSON it came from.
pub struct Schema {
    json: Value,
    validator: jsonschema::Validator,
}

impl std::fmt::Debug for Schema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Schema").field("json", &self.json).finish_non_exhaustive()
    }
}

impl Schema {
    /// Parses and compiles a schema given as JSON text.
    ///
    /// # Errors
    /// The text is not JSON, not a schema, or references a remote document.
    pub fn compile(text: &str) -> Result<Self, String> {
        let json: Value = serde_json::from_str(text).map_err(|e| format!("the schema is not JSON: {e}"))?;
        if !json.is_object() && !json.is_boolean() {
            return Err("a schema must be a JSON object or boolean".into());
        }
        let validator = jsonschema::validator_for(&json).map_err(|e| format!("the schema does not compile: {e}"))?;
        Ok(Self { json, validator })
    }

    /// The schema as JSON.
    pub fn json(&self) -> &Value {
        &self.json
    }

    /// The arguments this schema lets a caller vary without naming another
    /// action (free text, optional or unlisted properties), each as
    /// `` `POINTER` (why) ``: what the hold rule cannot see through.
    pub fn loose_arguments(&self) -> Vec<String> {
        loose::loose_arguments(&self.json)
    }

    /// Whether `pointer` (RFC 6901, into an instance) names a property or
    /// array item this schema declares.
    pub fn declares(&self, pointer: &str) -> bool {
        declared::declares(&self.json, pointer)
    }

    /// Checks `instance`; on failure lists the first violations, each with
    /// the JSON pointer it concerns.
    ///
    /// # Errors
    /// One line per violation (at most five, then a count of the rest).
    pub fn check(&self, instance: &Value) -> Result<(), String> {
        let errors: Vec<String> = self
            .validator
            .iter_errors(instance)
            .map(|e| {
                let at = e.instance_path().to_string();
                format!("at {}: {e}", if at.is_empty() { "/" } else { &at })
            })
            .collect();
        if errors.is_empty() {
            return Ok(());
        }
        let mut text = errors.iter().take(MAX_REPORTED).cloned().collect::<Vec<_>>().join("; ");
        if errors.len() > MAX_REPORTED {
            text.push_str(&format!("; and {} more", errors.len() - MAX_REPORTED));
        }
        Err(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reports_each_violation_with_its_path() {
        let s = Schema::compile(r#"{"type":"object","properties":{"n":{"type":"integer","minimum":1}},"required":["n"]}"#).unwrap();
        assert!(s.check(&json!({"n": 2})).is_ok());
        let e = s.check(&json!({"n": 0})).unwrap_err();
        assert!(e.contains("at /n"), "{e}");
        assert!(s.check(&json!({})).unwrap_err().contains("\"n\" is a required property"));
    }

    #[test]
    fn refuses_non_schemas_and_remote_refs() {
        assert!(Schema::compile("nope").is_err());
        assert!(Schema::compile("[1]").is_err());
        assert!(Schema::compile(r#"{"type":"nonsense"}"#).is_err());
        let remote = Schema::compile(r#"{"$ref":"http://127.0.0.1:9/schema.json"}"#);
        assert!(remote.is_err(), "a remote $ref must not be resolved");
    }
}
