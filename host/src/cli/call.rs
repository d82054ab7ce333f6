//! `toolguard call`: one tool call; the result (or a JSON error with a
//! `kind`) on stdout.

use crate::CallRequest;
use std::io::Read;
use std::path::Path;

/// Runs the call and prints its outcome; returns the exit status.
pub async fn run(config: &Path, session: String, call_id: String, tool: String, args: String) -> u8 {
    let args_json = if args == "-" {
        let mut text = String::new();
        if let Err(e) = std::io::stdin().read_to_string(&mut text) {
            super::print_json(&serde_json::json!({ "kind": "invalid-args", "message": format!("cannot read stdin: {e}") }));
            return super::EXIT_CALL_FAILED;
        }
        text
    } else {
        args
    };
    let runtime = match super::load(config).await {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    match runtime.call(&CallRequest { session, call_id, tool, args_json }).await {
        Ok(output) => {
            if output.replayed {
                tracing::info!("replayed: the stored result of the completed tool call (no plugin ran, nothing was sent)");
            }
            super::print_json(&output.value);
            0
        }
        Err(e) => {
            super::print_json(&serde_json::to_value(&e).unwrap_or_default());
            super::EXIT_CALL_FAILED
        }
    }
}
