//! `toolguard tools`: the tools of the configured plugins, with their schemas.

use serde_json::{Value, json};
use std::path::Path;

/// Lists the tools as text, or as a JSON array with `json`.
pub async fn run(config: &Path, json: bool) -> u8 {
    let runtime = match super::load(config).await {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let tools: Vec<Value> = runtime
        .tools()
        .map(|t| {
            json!({
                "name": t.name,
                "plugin": t.plugin,
                "description": t.description,
                "effect": t.effect,
                "input_schema": t.input_schema.json(),
                "output_schema": t.output_schema.as_ref().map(|s| s.json()),
            })
        })
        .collect();
    for missing in runtime.unavailable() {
        eprintln!("toolguard tools: {missing}");
    }
    if json {
        super::print_json(&Value::Array(tools));
        return 0;
    }
    for t in &tools {
        let text = |key: &str| t[key].as_str().unwrap_or_default().to_string();
        outln!("{}  (plugin {}, {})", text("name"), text("plugin"), text("effect"));
        outln!("  {}", text("description"));
        outln!("  input schema:  {}", t["input_schema"]);
        if !t["output_schema"].is_null() {
            outln!("  output schema: {}", t["output_schema"]);
        }
    }
    0
}
