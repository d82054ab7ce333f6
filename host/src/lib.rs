//! toolguard runs third-party tools for AI agents as WebAssembly components
//! and guarantees that no side effect happens twice or outside the guard.
//!
//! The pieces, one module per concept, each depending only on those listed
//! before it (a test checks the module graph has no cycle;
//! `docs/architecture.md` draws it):
//! - [`error`], [`phases`], [`metrics`], [`schema`], [`imports`], [`builtin`]: leaves.
//! - [`keys`]: what "the same action" means — canonical arguments, digests, keys.
//! - [`ledger`]: tool calls, attempts and episodes, on RocksDB or PostgreSQL.
//! - [`registry`]: `oci://` components: pulls, the cache, cosign-compatible signatures.
//! - [`policy`]: effect classes, downstreams, grants, authorisation, and each
//!   plugin's effective policy.
//! - [`config`]: `toolguard.toml`, the operator's file (and the reviewer's `[policy]`).
//! - [`guard`]: admission, the attempt protocol, reconciliation, recovery.
//! - [`seal`]: trapping stubs composed under a component's network imports.
//! - [`runtime`]: the engine, plugin loading, one sandboxed invocation, and
//!   the `outbound` capability (the plugin's only way out, into the guard).
//! - [`audit`]: what each component can reach, against the policy.
//! - [`reload`]: changing tools and policy while serving: a new generation,
//!   checked whole, swapped in; calls finish under the one that admitted them.
//! - [`local`]: handing a call to the process that holds a data directory.
//! - [`telemetry`]: OpenTelemetry export of the guard's spans.
//! - [`mcp`]: the tools as an MCP server.
//! - [`serve`]: `toolguard serve`'s lifecycle: MCP, the background passes, hand-overs.
//! - [`cli`]: the `toolguard` command line.
#![warn(missing_docs)]

pub mod audit;
pub mod builtin;
pub mod cli;
pub mod config;
pub mod error;
pub mod guard;
pub mod handover;
pub mod imports;
pub mod keys;
pub mod mcp;
pub mod metrics;
pub mod net;
pub mod open_files;
pub mod phases;
pub mod policy;
pub mod receipts;
pub mod registry;
pub mod reload;
pub mod runtime;
pub mod schema;
pub mod seal;
pub mod serve;
pub mod telemetry;

pub use config::Config;
pub use error::{CallError, ErrorKind, LoadError};
pub use runtime::{CallOutput, CallRequest, Runtime, ToolInfo};
/// The ledger: the `toolguard-ledger` crate (`host/ledger`).
pub use toolguard_ledger as ledger;
