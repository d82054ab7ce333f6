//! The resource limiter that enforces an invocation's memory cap (and its
//! store's room in the instance pool); the limits themselves are config
//! ([`crate::config::Limits`]).

/// Enforces the memory cap of one store and remembers whether it refused a
/// growth, so a trap that follows is reported as `limit-exceeded`.
#[derive(Debug)]
pub struct MemoryLimiter {
    cap: usize,
    /// Core instances, memories and tables the store may create.
    room: super::Footprint,
    /// The size of the first growth refused, in bytes.
    pub refused: Option<usize>,
}

impl MemoryLimiter {
    /// A limiter capping each linear memory at `cap` bytes, and the store's
    /// core instances, memories and tables at what the component needs
    /// (`footprint`), never below [`MIN_INSTANCES`].
    pub fn new(cap: usize, footprint: super::Footprint) -> Self {
        let floor = |n: u32| n.max(MIN_INSTANCES);
        let room = super::Footprint { core_instances: floor(footprint.core_instances), memories: floor(footprint.memories), tables: floor(footprint.tables) };
        Self { cap, room, refused: None }
    }
}

/// Tables beyond this many elements are refused (Rust guests use a few hundred).
const MAX_TABLE_ELEMENTS: usize = 100_000;
/// Core instances, memories and tables any store may create, whatever the
/// component's own count (a Rust guest needs a handful).
pub const MIN_INSTANCES: u32 = 32;

impl wasmtime::ResourceLimiter for MemoryLimiter {
    fn memory_growing(&mut self, _current: usize, desired: usize, _max: Option<usize>) -> wasmtime::Result<bool> {
        if desired > self.cap {
            self.refused.get_or_insert(desired);
            return Ok(false);
        }
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _max: Option<usize>) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }

    fn instances(&self) -> usize {
        self.room.core_instances as usize
    }

    fn tables(&self) -> usize {
        self.room.tables as usize
    }

    fn memories(&self) -> usize {
        self.room.memories as usize
    }
}
