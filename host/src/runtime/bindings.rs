//! Host bindings generated from `wit/plugin.wit` (world `asking-plugin`:
//! the plugin world with the optional `client` import).
//!
//! Every import is async (outbound calls wait on the network without
//! blocking a worker) and trappable (a host-side limit can stop the guest).

wasmtime::component::bindgen!({
    path: "../wit",
    world: "asking-plugin",
    imports: { default: async | trappable },
    exports: { default: async },
});

pub use self::exports::toolguard::plugin::tool;
pub use self::toolguard::plugin::{client, outbound, types};

/// A plugin instance's exports.
pub type Plugin = AskingPlugin;
/// A plugin component ready to instantiate.
pub type PluginPre<T> = AskingPluginPre<T>;
