//! Integration tests of the toolguard host: one test binary (wasmtime and
//! RocksDB make every binary large), one module per area.
//!
//! They crash, fail and skew real `toolguard` processes through its test
//! hooks, which only the `test-hooks` feature compiles in: run them with
//! `./dev.sh test` (or `cargo test --features toolguard/test-hooks`).

#[cfg(not(feature = "test-hooks"))]
compile_error!(
    "the integration tests drive toolguard's test hooks (failpoints, a skewed clock), which only the `test-hooks` feature compiles in: \
     run them with `./dev.sh test`, or `cargo test --features toolguard/test-hooks`"
);

mod architecture;
mod audit;
mod cli;
mod cli_guard;
mod clients;
mod common;
mod consent;
mod crash;
mod desk_torture;
mod fleet;
mod fleet_chaos;
mod fleet_torture;
mod foreign;
mod guard_boundary;
mod guard_damaged;
mod guard_edges;
mod hold;
mod hold_cli;
mod hostile;
mod keyless;
mod ledger_outage;
mod limits;
mod limits_approval;
mod limits_fleet;
mod limits_settled;
mod loading;
mod lock;
mod mcp;
mod metrics;
mod migration;
mod oauth;
mod payments;
mod properties;
mod questions;
mod recovery_edges;
mod registry;
mod registry_deadlines;
mod registry_faults;
mod reload;
mod reload_versions;
mod repeats;
mod retention;
mod review;
mod sandbox_limits;
mod security;
mod shipped;
mod surface;
mod tasks;
mod tasks_torture;
mod tls;
mod torture;
mod torture_limits;
mod upgrade;
mod world;
