//! `text_stats`: a read-only example tool. It counts characters, words and
//! lines of a text and reports its most frequent words. No outbound calls.

wit_bindgen::generate!({ world: "plugin", path: "../../wit" });

use exports::toolguard::plugin::tool::Guest;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use toolguard::plugin::outbound;
use toolguard::plugin::types::{Effect, ToolError, ToolSpec};

struct TextStats;

impl Guest for TextStats {
    fn describe() -> Vec<ToolSpec> {
        vec![ToolSpec {
            name: "text_stats".into(),
            description: "Counts the characters, words and lines of a text and lists its most frequent words."
                .into(),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "text": { "type": "string", "description": "The text to analyse." },
                    "top": { "type": "integer", "minimum": 0, "maximum": 50, "default": 3,
                             "description": "How many of the most frequent words to list." }
                },
                "required": ["text"],
                "additionalProperties": false
            })
            .to_string(),
            output_schema: Some(
                json!({
                    "type": "object",
                    "properties": {
                        "characters": { "type": "integer" },
                        "words": { "type": "integer" },
                        "lines": { "type": "integer" },
                        "top_words": { "type": "array", "items": {
                            "type": "object",
                            "properties": { "word": { "type": "string" }, "count": { "type": "integer" } },
                            "required": ["word", "count"]
                        } }
                    },
                    "required": ["characters", "words", "lines", "top_words"]
                })
                .to_string(),
            ),
            effect: Effect::ReadOnly,
        }]
    }

    fn invoke(tool: String, args: String) -> Result<String, ToolError> {
        if tool != "text_stats" {
            return Err(ToolError::InvalidArgs(format!("unknown tool {tool}")));
        }
        let args: Value = serde_json::from_str(&args).map_err(|e| ToolError::InvalidArgs(e.to_string()))?;
        let text = args["text"].as_str().unwrap_or_default();
        // The operator may lower the default list length in the host config.
        let default_top = outbound::config("default_top").and_then(|v| v.parse().ok()).unwrap_or(3);
        let top = args["top"].as_u64().unwrap_or(default_top) as usize;
        Ok(stats(text, top).to_string())
    }
}

/// Counts and ranks; ties are broken alphabetically so results are stable.
fn stats(text: &str, top: usize) -> Value {
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    let mut words = 0;
    for word in text.split(|c: char| !c.is_alphanumeric() && c != '\'').filter(|w| !w.is_empty()) {
        words += 1;
        *counts.entry(word.to_lowercase()).or_default() += 1;
    }
    let mut ranked: Vec<(String, u64)> = counts.into_iter().collect();
    ranked.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let top_words: Vec<Value> =
        ranked.into_iter().take(top).map(|(word, count)| json!({ "word": word, "count": count })).collect();
    json!({
        "characters": text.chars().count(),
        "words": words,
        "lines": text.lines().count(),
        "top_words": top_words,
    })
}

export!(TextStats);
