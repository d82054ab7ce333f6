//! `[engine]`: settings of the one WebAssembly engine a host runs, with
//! their documented defaults.

use serde::Deserialize;

/// Default engine memory ceiling: no plugin's `memory_mb` may exceed it.
pub const DEFAULT_MEMORY_CEILING_MB: u64 = 256;
/// Default number of invocations the pooling allocator holds at once.
pub const DEFAULT_POOL_INSTANCES: u32 = 256;

/// Engine-wide settings (`[engine]`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineConfig {
    /// Use the pooling allocator (falls back to on-demand, logged, if it cannot be set up).
    pub pooling: bool,
    /// How many invocations the pool holds at once.
    pub pool_instances: u32,
    /// The largest `memory_mb` any plugin may be given.
    pub memory_ceiling_mb: u64,
    /// Core instances one component may create in the pool; raised at start
    /// to what the configured plugins need (docs/plugins.md, "Limits").
    pub component_core_instances: u32,
    /// Linear memories one component may define in the pool; raised likewise.
    pub component_memories: u32,
    /// Tables one component may define in the pool; raised likewise.
    pub component_tables: u32,
}

/// Pool room per component before any plugin is seen: a Rust guest's
/// (main module, shims and fix-ups; one memory; its tables), with headroom.
pub const DEFAULT_COMPONENT_FOOTPRINT: (u32, u32, u32) = (6, 1, 4);

impl Default for EngineConfig {
    fn default() -> Self {
        let (component_core_instances, component_memories, component_tables) = DEFAULT_COMPONENT_FOOTPRINT;
        Self {
            pooling: true,
            pool_instances: DEFAULT_POOL_INSTANCES,
            memory_ceiling_mb: DEFAULT_MEMORY_CEILING_MB,
            component_core_instances,
            component_memories,
            component_tables,
        }
    }
}

/// The pool resources one instantiation of a component takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Footprint {
    /// Core module instances it creates (every `instantiate`, at any depth).
    pub core_instances: u32,
    /// Linear memories its core modules define.
    pub memories: u32,
    /// Tables its core modules define.
    pub tables: u32,
}

impl Footprint {
    /// The larger of each count in `self` and `other`.
    pub fn max(self, other: Self) -> Self {
        Self {
            core_instances: self.core_instances.max(other.core_instances),
            memories: self.memories.max(other.memories),
            tables: self.tables.max(other.tables),
        }
    }
}

impl EngineConfig {
    /// This config with the pool's room per component raised to fit `needs`.
    pub fn fitted_to(&self, needs: Footprint) -> Self {
        Self {
            component_core_instances: self.component_core_instances.max(needs.core_instances),
            component_memories: self.component_memories.max(needs.memories),
            component_tables: self.component_tables.max(needs.tables),
            ..self.clone()
        }
    }

    /// The pool's room per component.
    pub fn component_room(&self) -> Footprint {
        Footprint { core_instances: self.component_core_instances, memories: self.component_memories, tables: self.component_tables }
    }
}

/// The engine is one per host, built at start: only a restart applies any of it.
impl super::RestartOnly for EngineConfig {
    fn restart_only_changes(&self, new: &Self) -> Vec<String> {
        super::restart::differs("[engine]", self, new).into_iter().collect()
    }
}
