//! Integration tests of the toolguard host: one test binary (wasmtime and
//! RocksDB make every binary large), one module per area.

mod cli;
mod common;
mod loading;
mod sandbox_limits;
