//! Host bindings generated from `wit/plugin.wit` (world `plugin`).
//!
//! Every import is async (outbound calls wait on the network without
//! blocking a worker) and trappable (a host-side limit can stop the guest).

wasmtime::component::bindgen!({
    path: "../wit",
    world: "plugin",
    imports: { default: async | trappable },
    exports: { default: async },
});

pub use self::exports::toolguard::plugin::tool;
pub use self::toolguard::plugin::{outbound, types};
