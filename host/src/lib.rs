//! toolguard runs third-party tools for AI agents as WebAssembly components
//! and guarantees that no side effect happens twice or outside the guard.
//!
//! The pieces, one module per concept:
//! - [`config`]: `toolguard.toml`, the operator's file (and the reviewer's `[policy]`).
//! - [`audit`]: what each component can reach, against the policy.
//! - [`imports`]: what a component imports, classified against the allowlist.
//! - [`runtime`]: the engine, plugin loading and one sandboxed invocation.
//! - [`outbound`]: the host side of the plugin's only way out.
//! - [`guard`]: keys, admission, the attempt protocol, outbound HTTP.
//! - [`ledger`]: tool calls, attempts and episodes, on RocksDB or PostgreSQL.
//! - [`local`]: handing a call to the process that holds a data directory.
//! - [`policy`]: downstreams and each plugin's outbound grants.
//! - [`schema`]: JSON Schema validation of tool arguments and results.
//! - [`error`]: the error kinds a caller sees.
//! - [`builtin`]: the example plugins embedded in the binary.
//! - [`mcp`]: `toolguard serve`, the tools as an MCP server.
//! - [`bench`]: `toolguard bench`, the performance figures ([`phases`]: its per-phase clocks).
//! - [`cli`]: the `toolguard` command line.
#![warn(missing_docs)]

pub mod audit;
pub mod bench;
pub mod builtin;
pub mod cli;
pub mod config;
pub mod error;
pub mod guard;
pub mod imports;
pub mod ledger;
pub mod local;
pub mod mcp;
pub mod metrics;
pub mod outbound;
pub mod phases;
pub mod policy;
pub mod runtime;
pub mod schema;
pub mod seal;
pub mod telemetry;

pub use config::Config;
pub use error::{CallError, ErrorKind, LoadError};
pub use runtime::{CallOutput, CallRequest, Runtime, ToolInfo};
