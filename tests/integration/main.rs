//! Integration tests of the toolguard host: one test binary (wasmtime and
//! RocksDB make every binary large), one module per area.

mod cli;
mod cli_guard;
mod common;
mod crash;
mod guard_boundary;
mod guard_edges;
mod loading;
mod payments;
mod recovery_edges;
mod sandbox_limits;
mod torture;
