//! The host's network layer, below the guard, the registry, telemetry and
//! MCP: every HTTP client the host builds comes from [`http::client`] with
//! its TLS ([`tls`]), its proxy (only where configured, never from the
//! environment) and its [`deadlines`] — a total one and per-read ones for
//! every exchange, named in one place with their defaults
//! (`docs/network.md`) — and every body it reads is read within a bound
//! ([`body`]). What a request *means* (keys, credentials, grants) is the
//! guard's; how it travels is this module's.

pub mod body;
pub mod deadlines;
pub mod http;
pub mod tls;

pub use deadlines::Deadlines;
pub use http::{Peer, client};
pub use tls::TlsPolicy;
