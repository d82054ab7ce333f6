//! Tools as typed functions, and the list a plugin offers.

use schemars::JsonSchema;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::wit::{Effect, ToolError, ToolSpec};

/// A plugin: the tools it offers. Export it with [`export!`](crate::export).
pub trait Plugin {
    /// The tools, in the order `describe` lists them.
    fn tools() -> Tools;
}

/// Runs a tool on JSON arguments and returns its JSON result.
type Handler = Box<dyn Fn(&str) -> Result<String, ToolError>>;

/// One tool: a typed function and what the host and the model need to know.
pub struct Tool {
    name: String,
    description: String,
    effect: Effect,
    input_schema: fn() -> Value,
    output_schema: fn() -> Value,
    run: Handler,
}

impl Tool {
    /// A tool named `name` running `f`. The input schema is derived from `A`,
    /// the output schema from `R` (omitted unless `R` is a JSON object type).
    /// Use `#[serde(deny_unknown_fields)]` on `A` to refuse unknown arguments.
    pub fn new<A, R, F>(name: &str, effect: Effect, description: &str, f: F) -> Tool
    where
        A: DeserializeOwned + JsonSchema,
        R: Serialize + JsonSchema,
        F: Fn(A) -> Result<R, ToolError> + 'static,
    {
        Tool {
            name: name.into(),
            description: description.into(),
            effect,
            input_schema: schema_of::<A>,
            output_schema: schema_of::<R>,
            run: Box::new(move |args| {
                // The host validated `args` against the schema; this is the type's own check.
                let args: A = serde_json::from_str(args).map_err(|e| ToolError::InvalidArgs(e.to_string()))?;
                let result = f(args)?;
                serde_json::to_string(&result).map_err(|e| ToolError::Failed(format!("the result could not be written as JSON: {e}")))
            }),
        }
    }

    fn spec(&self) -> ToolSpec {
        let output = (self.output_schema)();
        ToolSpec {
            name: self.name.clone(),
            description: self.description.clone(),
            input_schema: (self.input_schema)().to_string(),
            output_schema: (output["type"] == "object").then(|| output.to_string()),
            effect: self.effect,
        }
    }
}

/// The JSON Schema (draft 2020-12) of `T`.
fn schema_of<T: JsonSchema>() -> Value {
    schemars::schema_for!(T).to_value()
}

/// The tools a plugin offers, built one effect class at a time.
#[derive(Default)]
pub struct Tools(Vec<Tool>);

impl Tools {
    /// No tools yet.
    pub fn new() -> Tools {
        Tools(Vec::new())
    }

    /// Adds a tool that only reads (`fetch`); its `send` is denied by the host.
    pub fn read_only<A, R, F>(self, name: &str, description: &str, f: F) -> Tools
    where
        A: DeserializeOwned + JsonSchema,
        R: Serialize + JsonSchema,
        F: Fn(A) -> Result<R, ToolError> + 'static,
    {
        self.tool(Tool::new(name, Effect::ReadOnly, description, f))
    }

    /// Adds a tool whose repetition with the same arguments leaves the world as one call would.
    pub fn idempotent<A, R, F>(self, name: &str, description: &str, f: F) -> Tools
    where
        A: DeserializeOwned + JsonSchema,
        R: Serialize + JsonSchema,
        F: Fn(A) -> Result<R, ToolError> + 'static,
    {
        self.tool(Tool::new(name, Effect::Idempotent, description, f))
    }

    /// Adds a tool every execution of which is a new effect (a refund, a message).
    pub fn irreversible<A, R, F>(self, name: &str, description: &str, f: F) -> Tools
    where
        A: DeserializeOwned + JsonSchema,
        R: Serialize + JsonSchema,
        F: Fn(A) -> Result<R, ToolError> + 'static,
    {
        self.tool(Tool::new(name, Effect::Irreversible, description, f))
    }

    /// Adds a tool built with [`Tool::new`].
    pub fn tool(mut self, tool: Tool) -> Tools {
        self.0.push(tool);
        self
    }
}

/// `describe`: the specs of `P`'s tools.
pub fn describe<P: Plugin>() -> Vec<ToolSpec> {
    P::tools().0.iter().map(Tool::spec).collect()
}

/// `invoke`: runs `P`'s tool `name` on `args`.
pub fn invoke<P: Plugin>(name: &str, args: &str) -> Result<String, ToolError> {
    let tools = P::tools();
    let tool = tools.0.iter().find(|t| t.name == name).ok_or_else(|| ToolError::InvalidArgs(format!("unknown tool {name}")))?;
    (tool.run)(args)
}
