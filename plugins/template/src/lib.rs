//! A toolguard plugin to copy: rename the crate and the tool, write the function.
//! Build: `cargo build --release --target wasm32-wasip2`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use toolguard_sdk::{Plugin, ToolError, Tools, config};

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Greet {
    /// Who to greet.
    #[schemars(length(min = 1))]
    name: String,
}

#[derive(Serialize, JsonSchema)]
struct Greeting {
    greeting: String,
}

fn greet(args: Greet) -> Result<Greeting, ToolError> {
    // Non-secret settings come from the host config; this one is optional.
    let salutation = config("salutation").unwrap_or_else(|| "Hello".into());
    Ok(Greeting { greeting: format!("{salutation}, {}!", args.name) })
}

struct Template;

impl Plugin for Template {
    fn tools() -> Tools {
        Tools::new().read_only("greet", "Greets someone by name.", greet)
    }
}

toolguard_sdk::export!(Template);
