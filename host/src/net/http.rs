//! The one way the host builds an HTTP client: rustls with the reviewer's
//! settings (or plain HTTP where the caller allows it), a proxy only where
//! the configuration names one (never from the environment), redirects
//! only as the caller says (none by default: a redirect could lead outside
//! the grants), and every [`Deadlines`] bound set. Also the limits on a
//! request's headers every sender applies.

use super::Deadlines;

/// Who the client talks to and how.
pub struct Peer<'a> {
    /// What the peer is, for error messages (`downstream `pay``).
    pub label: &'a str,
    /// TLS for `https://`, or `None` for a plain-HTTP peer.
    pub tls: Option<rustls::ClientConfig>,
    /// The proxy (`http://host:port`) the configuration names, if any.
    pub proxy: Option<&'a url::Url>,
    /// Which redirects are followed: [`reqwest::redirect::Policy::none`] unless the caller has a reason.
    pub redirect: reqwest::redirect::Policy,
    /// The exchange's deadlines.
    pub deadlines: Deadlines,
}

impl<'a> Peer<'a> {
    /// A peer reached directly, no redirects followed, within `deadlines`.
    pub fn direct(label: &'a str, tls: Option<rustls::ClientConfig>, deadlines: Deadlines) -> Self {
        Self { label, tls, proxy: None, redirect: reqwest::redirect::Policy::none(), deadlines }
    }
}

/// The client for `peer`.
///
/// # Errors
/// The proxy URL cannot be used, or the client cannot be built.
pub fn client(peer: Peer<'_>) -> Result<reqwest::Client, String> {
    super::tls::install_crypto();
    let Deadlines { connect, read, total } = peer.deadlines;
    let builder = reqwest::Client::builder().redirect(peer.redirect).connect_timeout(connect).read_timeout(read).timeout(total);
    let builder = match peer.proxy {
        Some(proxy) => builder.proxy(reqwest::Proxy::all(proxy.as_str()).map_err(|e| format!("{}: proxy {proxy}: {e}", peer.label))?),
        None => builder.no_proxy(),
    };
    let builder = match peer.tls {
        Some(config) => builder.tls_backend_preconfigured(config),
        None => builder,
    };
    builder.build().map_err(|e| format!("cannot build the HTTP client of {}: {e}", peer.label))
}

/// The most headers a request may carry.
pub const MAX_HEADERS: usize = 64;
/// The longest header name, in bytes.
pub const MAX_HEADER_NAME_BYTES: usize = 256;
/// The longest header value, in bytes.
pub const MAX_HEADER_VALUE_BYTES: usize = 8 << 10;
/// All header names and values of one request together, in bytes.
pub const MAX_HEADER_BYTES: usize = 64 << 10;
