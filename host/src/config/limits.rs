//! Per-invocation limits and their documented defaults (`[limits]`, host-wide
//! and per plugin); the runtime enforces them (`runtime::limits`).

use serde::Deserialize;

/// Default linear-memory cap per invocation: 64 MiB.
pub const DEFAULT_MEMORY_MB: u64 = 64;
/// Default CPU budget per invocation: 1 s of guest execution (epoch ticks).
pub const DEFAULT_CPU_MS: u64 = 1_000;
/// Default wall-clock budget per invocation, outbound waits included: 30 s.
pub const DEFAULT_WALL_MS: u64 = 30_000;
/// Default number of outbound calls (`send` + `fetch`) per invocation.
pub const DEFAULT_MAX_OUTBOUND_CALLS: u32 = 16;
/// Default cap on the arguments' JSON text: 64 KiB.
pub const DEFAULT_MAX_ARGS_BYTES: usize = 64 << 10;
/// Default cap on the result's JSON text: 1 MiB.
pub const DEFAULT_MAX_RESULT_BYTES: usize = 1 << 20;
/// How often the engine's epoch advances; the CPU budget's resolution.
pub const EPOCH_TICK_MS: u64 = 10;

/// The limits one tool invocation runs under. Every field has a documented
/// default and may be overridden host-wide and per plugin in the config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Limits {
    /// Cap on each linear memory, in MiB.
    pub memory_mb: u64,
    /// CPU budget: guest execution time before the invocation is interrupted.
    pub cpu_ms: u64,
    /// Wall-clock budget for the whole invocation, including outbound waits.
    pub wall_ms: u64,
    /// Most outbound calls (`send` and `fetch` together) one invocation may make.
    pub max_outbound_calls: u32,
    /// Largest arguments JSON text accepted, in bytes.
    pub max_args_bytes: usize,
    /// Largest result JSON text accepted, in bytes.
    pub max_result_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            memory_mb: DEFAULT_MEMORY_MB,
            cpu_ms: DEFAULT_CPU_MS,
            wall_ms: DEFAULT_WALL_MS,
            max_outbound_calls: DEFAULT_MAX_OUTBOUND_CALLS,
            max_args_bytes: DEFAULT_MAX_ARGS_BYTES,
            max_result_bytes: DEFAULT_MAX_RESULT_BYTES,
        }
    }
}

impl Limits {
    /// These limits with every field set in `o` replaced.
    pub fn with(self, o: &LimitOverrides) -> Self {
        Self {
            memory_mb: o.memory_mb.unwrap_or(self.memory_mb),
            cpu_ms: o.cpu_ms.unwrap_or(self.cpu_ms),
            wall_ms: o.wall_ms.unwrap_or(self.wall_ms),
            max_outbound_calls: o.max_outbound_calls.unwrap_or(self.max_outbound_calls),
            max_args_bytes: o.max_args_bytes.unwrap_or(self.max_args_bytes),
            max_result_bytes: o.max_result_bytes.unwrap_or(self.max_result_bytes),
        }
    }

    /// The memory cap in bytes.
    pub fn memory_bytes(&self) -> usize {
        usize::try_from(self.memory_mb << 20).unwrap_or(usize::MAX)
    }

    /// The CPU budget in epoch ticks (at least one).
    pub fn cpu_ticks(&self) -> u64 {
        self.cpu_ms.div_ceil(EPOCH_TICK_MS).max(1)
    }
}

/// Limits as written in the config: any subset of [`Limits`]' fields.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitOverrides {
    /// See [`Limits::memory_mb`].
    pub memory_mb: Option<u64>,
    /// See [`Limits::cpu_ms`].
    pub cpu_ms: Option<u64>,
    /// See [`Limits::wall_ms`].
    pub wall_ms: Option<u64>,
    /// See [`Limits::max_outbound_calls`].
    pub max_outbound_calls: Option<u32>,
    /// See [`Limits::max_args_bytes`].
    pub max_args_bytes: Option<usize>,
    /// See [`Limits::max_result_bytes`].
    pub max_result_bytes: Option<usize>,
}
