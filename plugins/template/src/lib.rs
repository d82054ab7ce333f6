//! A toolguard plugin to copy. Rename the crate, the tool and its schema, and
//! write `invoke`. Build: `cargo build --release --target wasm32-wasip2`.

wit_bindgen::generate!({ world: "plugin", path: "../../wit" });

use exports::toolguard::plugin::tool::Guest;
use serde_json::{Value, json};
use toolguard::plugin::outbound;
use toolguard::plugin::types::{Effect, ToolError, ToolSpec};

struct Template;

impl Guest for Template {
    /// Called once at load: the tools this plugin offers.
    fn describe() -> Vec<ToolSpec> {
        vec![ToolSpec {
            name: "greet".into(),
            description: "Greets someone by name.".into(),
            input_schema: json!({
                "type": "object",
                "properties": { "name": { "type": "string", "minLength": 1 } },
                "required": ["name"],
                "additionalProperties": false
            })
            .to_string(),
            output_schema: Some(
                json!({
                    "type": "object",
                    "properties": { "greeting": { "type": "string" } },
                    "required": ["greeting"]
                })
                .to_string(),
            ),
            effect: Effect::ReadOnly,
        }]
    }

    /// Runs a tool. The host has already validated `args` against the schema.
    fn invoke(tool: String, args: String) -> Result<String, ToolError> {
        let args: Value = serde_json::from_str(&args).map_err(|e| ToolError::InvalidArgs(e.to_string()))?;
        match tool.as_str() {
            "greet" => {
                // Non-secret settings come from the host config; this one is optional.
                let salutation = outbound::config("salutation").unwrap_or_else(|| "Hello".into());
                let name = args["name"].as_str().unwrap_or_default();
                Ok(json!({ "greeting": format!("{salutation}, {name}!") }).to_string())
            }
            other => Err(ToolError::InvalidArgs(format!("unknown tool {other}"))),
        }
    }
}

export!(Template);
