//! What one component needs from the instance pool: core instances, linear
//! memories and tables, read off its bytes before anything is compiled, so
//! the pool can be sized to the plugins a host loads and a component that
//! does not fit is refused with the setting to change.
//!
//! A Rust guest needs a handful of core instances and one memory; a Python
//! build (componentize-py) dozens of core instances; a QuickJS build three
//! memories; composing a seal adds one memory and a few instances.

use wasmparser::{Instance, Parser, Payload};

pub use crate::config::Footprint;

impl Footprint {
    /// Reads the footprint of a component's bytes: an upper bound on what
    /// wasmtime's pooling allocator will count for it.
    ///
    /// Each core module is counted once per `instantiate` of it. A composed
    /// component (one whose nested components carry core code, as a sealed
    /// one does) also gets wasmtime's fused adapter modules: wasmtime groups
    /// the adapters between core instantiations and starts a new group only
    /// when an adapter needs an instance created after the current group
    /// began, so there are at most one more groups than core instantiations.
    /// Adapter modules define no memories or tables.
    ///
    /// # Errors
    /// The bytes do not parse.
    pub fn of(bytes: &[u8]) -> Result<Self, String> {
        let mut f = Footprint::default();
        let (mut composed, mut nested) = (false, Vec::new());
        for payload in Parser::new(0).parse_all(bytes) {
            match payload.map_err(|e| e.to_string())? {
                Payload::InstanceSection(reader) => {
                    for instance in reader {
                        if let Instance::Instantiate { .. } = instance.map_err(|e| e.to_string())? {
                            f.core_instances += 1;
                        }
                    }
                }
                // `nested` holds, per open nested section, whether it is a component.
                Payload::ComponentSection { .. } => nested.push(true),
                Payload::ModuleSection { .. } => {
                    // Core code inside a nested component: components are wired
                    // together, and calls between them go through fused adapters.
                    // (A nested component without core code, as wit-component
                    // emits to ascribe export types, adds none.)
                    composed |= nested.iter().any(|&component| component);
                    nested.push(false);
                }
                Payload::End(_) => drop(nested.pop()),
                Payload::MemorySection(reader) => f.memories += reader.count(),
                Payload::TableSection(reader) => f.tables += reader.count(),
                _ => {}
            }
        }
        if composed {
            f.core_instances = 2 * f.core_instances + 1;
        }
        Ok(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_the_builtin_rust_plugins() {
        for name in crate::builtin::names() {
            let bytes = crate::builtin::component(name).expect("builtin");
            let f = Footprint::of(bytes).expect("parses");
            assert_eq!(f.memories, 1, "{name}: a Rust guest has one memory");
            // main module, the WASI adapter and its shim; not a composition.
            assert_eq!(f.core_instances, 3, "{name}: {f:?}");
            assert!(f.tables >= 1, "{name}: {f:?}");
        }
    }
}
