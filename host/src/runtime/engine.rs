//! The one wasmtime [`Engine`] per process: trimmed features, epoch
//! interruption driven by a ticker thread, and the pooling allocator with a
//! logged fallback to on-demand allocation.

use crate::config::EngineConfig;
use crate::config::limits::EPOCH_TICK_MS;
use std::time::Duration;
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

/// Bytes of each memory and table slot reset in place rather than decommitted
/// (64 KiB measured best: larger spends more on memset than it saves).
const KEEP_RESIDENT: usize = 64 << 10;

/// Sandboxes reserved for reconciliations, beyond the invocation slots: a
/// reconcile runs while its invocation holds a slot, so it must never wait
/// for one.
pub const RECONCILE_SLOTS: u32 = 16;

/// How the engine allocates instances.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allocator {
    /// Pre-reserved slots: a fresh instance costs tens of microseconds.
    Pooling,
    /// Allocate per instance (pooling disabled or unavailable here).
    OnDemand,
}

/// Builds the engine for `cfg` and starts its epoch ticker.
///
/// # Errors
/// wasmtime rejects the configuration even with on-demand allocation.
pub fn build(cfg: &EngineConfig) -> anyhow::Result<(Engine, Allocator)> {
    let mut config = Config::new();
    config.epoch_interruption(true);
    let (engine, allocator) = if cfg.pooling {
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool(cfg)));
        match Engine::new(&config) {
            Ok(engine) => (engine, Allocator::Pooling),
            Err(e) => {
                tracing::warn!(error = %e, "pooling allocator unavailable; falling back to on-demand allocation");
                config.allocation_strategy(InstanceAllocationStrategy::OnDemand);
                (Engine::new(&config)?, Allocator::OnDemand)
            }
        }
    } else {
        (Engine::new(&config)?, Allocator::OnDemand)
    };
    start_ticker(&engine);
    Ok((engine, allocator))
}

fn pool(cfg: &EngineConfig) -> PoolingAllocationConfig {
    // Invocations plus the reconciliations that may run while they wait.
    // Room for `n` of the largest component loaded (see `EngineConfig::fitted_to`).
    let n = cfg.pool_instances + RECONCILE_SLOTS;
    let room = cfg.component_room();
    let mut p = PoolingAllocationConfig::new();
    p.total_component_instances(n)
        .total_core_instances(n.saturating_mul(room.core_instances))
        .total_memories(n.saturating_mul(room.memories))
        .total_tables(n.saturating_mul(room.tables))
        .total_stacks(n)
        .max_core_instances_per_component(room.core_instances)
        .max_memories_per_component(room.memories)
        .max_tables_per_component(room.tables)
        .max_memory_size(usize::try_from(cfg.memory_ceiling_mb << 20).unwrap_or(usize::MAX))
        // Reset small slots with memset instead of madvise: no syscall, and no
        // TLB-shootdown IPIs to the other core, per invocation.
        .linear_memory_keep_resident(KEEP_RESIDENT)
        .table_keep_resident(KEEP_RESIDENT)
        // Where Linux has PAGEMAP_SCAN (6.7+), reset only the pages the run
        // dirtied: a fresh instance costs about half as much (docs/benchmarks.md).
        .pagemap_scan(wasmtime::Enabled::Auto);
    p
}

/// Advances the epoch every tick until the engine is dropped.
fn start_ticker(engine: &Engine) {
    let weak = engine.weak();
    std::thread::Builder::new()
        .name("toolguard-epoch".into())
        .spawn(move || {
            while let Some(engine) = weak.upgrade() {
                engine.increment_epoch();
                drop(engine);
                std::thread::sleep(Duration::from_millis(EPOCH_TICK_MS));
            }
        })
        .expect("spawning the epoch ticker thread");
}
