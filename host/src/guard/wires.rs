//! What the guard sends through, per configuration: each downstream with its
//! credential read and its HTTP client built. A reload builds new wires and
//! hands them to the calls it admits; calls admitted before keep theirs.

use crate::policy::{Downstream, Downstreams, Grant};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Every downstream of one configuration, credentials read, clients built.
#[derive(Default)]
pub struct Wires {
    downstreams: Downstreams,
    /// One HTTP client per downstream, by name: each with its own TLS and proxy.
    clients: BTreeMap<String, reqwest::Client>,
}

impl Wires {
    /// No downstream at all: every send and fetch is refused as not granted.
    pub fn none() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Reads each downstream's credential (now, once: a missing one refuses
    /// the start or the reload) and builds its HTTP client.
    ///
    /// # Errors
    /// A credential cannot be read or sent, or an HTTP client cannot be
    /// built (no TLS roots, for instance).
    pub fn new(downstreams: &Downstreams) -> Result<Self, String> {
        let mut resolved = Downstreams::new();
        for (name, d) in downstreams {
            let mut d = (**d).clone();
            if let Some(spec) = &d.credential {
                let secret = spec.resolve().map_err(|e| format!("the credential of downstream `{name}` ({}): {e}", spec.source()))?;
                if http::HeaderValue::from_str(secret.expose()).is_err() {
                    return Err(format!(
                        "the credential of downstream `{name}` ({}) cannot be sent as a header value: it has a control character \
                         (a newline inside it, or a NUL); fix the secret",
                        spec.source()
                    ));
                }
                d.secret = Some(secret);
            }
            resolved.insert(name.clone(), Arc::new(d));
        }
        let clients = resolved.iter().map(|(name, d)| Ok((name.clone(), client(d)?))).collect::<Result<_, String>>()?;
        Ok(Self { downstreams: resolved, clients })
    }

    /// The downstreams, credentials included.
    pub fn downstreams(&self) -> &Downstreams {
        &self.downstreams
    }

    /// The HTTP client of downstream `d` (each is built with the wires).
    pub(crate) fn client(&self, d: &Downstream) -> &reqwest::Client {
        self.clients.get(&d.name).expect("every downstream of these wires has its client")
    }

    /// How long a call held behind an identical earlier one waits for it:
    /// the longest reconcile window among the downstreams `grants` reach
    /// (the time the host itself gives a provider to tell), or
    /// [`super::DEFAULT_HOLD_WAIT`] without any.
    pub fn hold_wait(&self, grants: &[Grant]) -> std::time::Duration {
        grants.iter().filter_map(|g| self.downstreams.get(&g.downstream)).map(|d| d.reconcile_window).max().unwrap_or(super::DEFAULT_HOLD_WAIT)
    }
}

/// The HTTP client of downstream `d`: its TLS and proxy as the reviewer
/// set them, no redirect followed (the plugin sees the 3xx: a redirect
/// could lead outside the grants), each try within `timeout_ms`.
///
/// # Errors
/// A CA file, client certificate or key cannot be read or used, or the
/// proxy URL cannot be used: the host refuses to start.
fn client(d: &Downstream) -> Result<reqwest::Client, String> {
    let label = format!("downstream `{}`", d.name);
    let tls = if d.origin.scheme() == "https" { Some(crate::net::tls::rustls_config(&d.tls, &label)?) } else { None };
    let peer = crate::net::Peer { proxy: d.proxy.as_ref(), ..crate::net::Peer::direct(&label, tls, crate::net::Deadlines::within(d.timeout)) };
    crate::net::client(peer)
}
