//! Write toolguard plugins in Rust.
//!
//! A tool is a typed function: its arguments and result are Rust types, and
//! their JSON Schemas are derived from those types (`schemars`), so the schema
//! the model sees and the code that reads the arguments can never disagree.
//! The only way out of the sandbox is the host's guard: [`Request::send`]
//! (side effects: keyed, recorded, replayed by the host) and
//! [`Request::fetch`] (reads). A plugin never sees or chooses an idempotency
//! key when it sends.
//!
//! ```ignore
//! #[derive(serde::Deserialize, schemars::JsonSchema)]
//! struct Greet { name: String }
//! #[derive(serde::Serialize, schemars::JsonSchema)]
//! struct Greeting { greeting: String }
//!
//! fn greet(args: Greet) -> Result<Greeting, ToolError> {
//!     Ok(Greeting { greeting: format!("Hello, {}!", args.name) })
//! }
//!
//! struct Hello;
//! impl Plugin for Hello {
//!     fn tools() -> Tools { Tools::new().read_only("greet", "Greets someone.", greet) }
//! }
//! toolguard_sdk::export!(Hello);
//! ```
//!
//! A plugin that can look unknown outcomes up at its provider also implements
//! [`Reconcile`] and is exported with `toolguard_sdk::export!(Type with Reconcile)`.

extern crate self as toolguard_sdk;

mod http;
mod reconcile;
mod tool;

pub use http::{Request, Response};
pub use reconcile::{Reconcile, found};
pub use tool::{Plugin, Tool, Tools};

/// The plugin contract's own types (`wit/plugin.wit`), for what the SDK does not wrap.
pub mod wit {
    pub use crate::bindings::plugin::toolguard::plugin::outbound;
    pub use crate::bindings::plugin::toolguard::plugin::types::*;
}

pub use wit::{Attempt, AttemptInfo, AttemptState, Effect, HeldInfo, OutboundError, Reconciliation, ToolError};

/// A non-secret setting from the host config for this plugin, if set.
/// Secrets never reach a plugin; the host injects credentials itself.
pub fn config(name: &str) -> Option<String> {
    wit::outbound::config(name)
}

impl From<OutboundError> for ToolError {
    /// Passes an outbound error on unchanged, so the host and the model see its exact kind.
    fn from(error: OutboundError) -> Self {
        ToolError::Outbound(error)
    }
}

/// Bindings generated from the embedded contract, in two parts with disjoint
/// exports so a component exports exactly what its author wrote: `plugin`
/// (imports `outbound`, exports `tool`) and a world exporting only
/// `reconciler`. [`export!`] exports the first, or both; the union of the two
/// is the contract's `reconciling-plugin` world.
#[doc(hidden)]
pub mod bindings {
    /// The `plugin` world; its `types` and `outbound` are the SDK's.
    pub mod plugin {
        wit_bindgen::generate!({
            world: "plugin",
            path: "wit",
            pub_export_macro: true,
            export_macro_name: "__export_plugin",
            default_bindings_module: "toolguard_sdk::bindings::plugin",
            runtime_path: "toolguard_sdk::__wit_bindgen::rt",
        });
    }
    /// The `reconciler` export alone, reusing the types above.
    pub mod reconciler {
        wit_bindgen::generate!({
            inline: "package toolguard:sdk; world reconciler { export toolguard:plugin/reconciler@0.1.0; }",
            path: "wit",
            world: "toolguard:sdk/reconciler",
            pub_export_macro: true,
            export_macro_name: "__export_reconciler",
            default_bindings_module: "toolguard_sdk::bindings::reconciler",
            runtime_path: "toolguard_sdk::__wit_bindgen::rt",
            with: { "toolguard:plugin/types@0.1.0": crate::bindings::plugin::toolguard::plugin::types },
        });
    }
}

#[doc(hidden)]
pub use wit_bindgen as __wit_bindgen;

/// Exports a [`Plugin`] as the component's `tool` interface; with
/// `with Reconcile`, also its [`Reconcile`] implementation as `reconciler`.
/// Invoke once, at the crate root of a `cdylib`.
#[macro_export]
macro_rules! export {
    ($plugin:ident) => {
        impl $crate::bindings::plugin::exports::toolguard::plugin::tool::Guest for $plugin {
            fn describe() -> ::std::vec::Vec<$crate::wit::ToolSpec> {
                $crate::__describe::<$plugin>()
            }
            fn invoke(tool: ::std::string::String, args: ::std::string::String) -> ::std::result::Result<::std::string::String, $crate::ToolError> {
                $crate::__invoke::<$plugin>(&tool, &args)
            }
        }
        $crate::bindings::plugin::__export_plugin!($plugin);
    };
    ($plugin:ident with Reconcile) => {
        $crate::export!($plugin);
        impl $crate::bindings::reconciler::exports::toolguard::plugin::reconciler::Guest for $plugin {
            fn reconcile(tool: ::std::string::String, args: ::std::string::String, attempt: $crate::Attempt) -> $crate::Reconciliation {
                <$plugin as $crate::Reconcile>::reconcile(&tool, &args, &attempt)
            }
        }
        $crate::bindings::reconciler::__export_reconciler!($plugin);
    };
}

#[doc(hidden)]
pub use tool::{describe as __describe, invoke as __invoke};
