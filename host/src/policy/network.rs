//! How the host reaches a downstream over the network, as the reviewer sets
//! it: TLS (extra or only CA roots, a client certificate for mutual TLS, SPKI
//! pins, a minimum version), an egress proxy, and whether plain HTTP is
//! allowed at all. Never from the environment: an environment variable must
//! not redirect or downgrade guarded traffic.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use url::Url;

/// `[policy.downstreams.NAME.tls]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TlsPolicy {
    /// CA certificates (PEM) to trust for this downstream: beside the
    /// platform's roots, or instead of them with `platform_roots = false`.
    pub ca_file: Option<PathBuf>,
    /// Whether the platform's roots are trusted too (default true).
    #[serde(default = "yes")]
    pub platform_roots: bool,
    /// A client certificate chain (PEM) for mutual TLS…
    pub client_cert_file: Option<PathBuf>,
    /// … and its private key (PEM), from a file or an environment variable.
    /// Read at start, never visible to a plugin.
    pub client_key_file: Option<PathBuf>,
    /// The environment variable holding the client certificate's private key (PEM).
    pub client_key_env: Option<String>,
    /// SHA-256 pins of certificates' SubjectPublicKeyInfo, base64 (an
    /// optional `sha256/` prefix is accepted): a certificate of the chain the
    /// server presents must match one, on top of normal verification.
    #[serde(default)]
    pub spki_sha256: Vec<String>,
    /// The lowest TLS version accepted: `"1.2"` (default) or `"1.3"`.
    pub min_version: Option<String>,
}

fn yes() -> bool {
    true
}

impl Default for TlsPolicy {
    fn default() -> Self {
        Self {
            ca_file: None,
            platform_roots: true,
            client_cert_file: None,
            client_key_file: None,
            client_key_env: None,
            spki_sha256: Vec::new(),
            min_version: None,
        }
    }
}

impl TlsPolicy {
    /// Checks it for a downstream at `origin`, resolving paths against `base`.
    ///
    /// # Errors
    /// `(field, message)` for the first problem, the field under `tls`.
    pub fn checked(mut self, origin: &Url, base: &Path) -> Result<Self, (String, String)> {
        let at = |f: &str| format!("tls.{f}");
        if origin.scheme() != "https" && self != Self::default() {
            return Err(("tls".into(), "TLS settings need an https:// URL".into()));
        }
        let resolve = |p: PathBuf| if p.is_absolute() { p } else { base.join(p) };
        self.ca_file = self.ca_file.map(resolve);
        self.client_cert_file = self.client_cert_file.map(resolve);
        self.client_key_file = self.client_key_file.map(resolve);
        if !self.platform_roots && self.ca_file.is_none() {
            return Err((at("platform_roots"), "without the platform's roots, give `ca_file`: otherwise nothing is trusted".into()));
        }
        let key_given = self.client_key_file.is_some() || self.client_key_env.is_some();
        if self.client_key_file.is_some() && self.client_key_env.is_some() {
            return Err((at("client_key_env"), "give the client key in `client_key_file` or `client_key_env`, not both".into()));
        }
        if self.client_cert_file.is_some() != key_given {
            return Err((at("client_cert_file"), "mutual TLS needs both a client certificate and its key".into()));
        }
        for (i, pin) in self.spki_sha256.iter().enumerate() {
            spki_pin(pin).map_err(|m| (at(&format!("spki_sha256[{i}]")), m))?;
        }
        match self.min_version.as_deref() {
            None | Some("1.2" | "1.3") => {}
            Some(other) => return Err((at("min_version"), format!("`{other}`: use \"1.2\" or \"1.3\""))),
        }
        Ok(self)
    }

    /// The pins, decoded.
    pub fn pins(&self) -> Vec<[u8; 32]> {
        self.spki_sha256.iter().filter_map(|p| spki_pin(p).ok()).collect()
    }

    /// Whether anything differs from the platform's defaults.
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// A pin (`sha256/BASE64` or `BASE64`) as 32 bytes.
fn spki_pin(pin: &str) -> Result<[u8; 32], String> {
    use base64::Engine as _;
    let text = pin.strip_prefix("sha256/").unwrap_or(pin);
    let bytes = base64::engine::general_purpose::STANDARD.decode(text).map_err(|e| format!("`{pin}` is not base64: {e}"))?;
    bytes.try_into().map_err(|_| format!("`{pin}` is not a SHA-256 digest (32 bytes)"))
}

/// Checks the way to a downstream at `origin`: plain HTTP only to loopback
/// unless `insecure_http`, and a proxy only on an `https://` downstream (the
/// proxy then carries a tunnel, and never sees the request or its
/// credential).
///
/// # Errors
/// `(field, message)` for the first problem.
pub(super) fn checked_route(origin: &Url, proxy: Option<&str>, insecure_http: bool) -> Result<Option<Url>, (String, String)> {
    if origin.scheme() == "http" && !is_loopback(origin) && !insecure_http {
        return Err((
            "url".into(),
            "plain http:// is allowed only to loopback; use https://, or set `insecure_http = true` if a reviewer accepts \
             requests and credentials in clear on this network"
                .into(),
        ));
    }
    let Some(proxy) = proxy else { return Ok(None) };
    let url = Url::parse(proxy).map_err(|e| ("proxy".to_string(), format!("not a URL: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() || !matches!(url.path(), "" | "/") || url.query().is_some() {
        return Err(("proxy".into(), "expected http://host:port or https://host:port of an HTTP CONNECT proxy".into()));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(("proxy".into(), "no credentials in the proxy URL: the policy is not a place for secrets".into()));
    }
    if origin.scheme() != "https" {
        return Err(("proxy".into(), "a proxy needs an https:// downstream: over plain http the proxy would read the request and its credential".into()));
    }
    Ok(Some(url))
}

/// Whether `url`'s host is loopback (`localhost`, 127.0.0.0/8, `::1`): one
/// rule for downstreams, registries and authorization servers.
pub use crate::registry::reference::is_loopback_url as is_loopback;

#[cfg(test)]
mod tests {
    use super::*;

    fn url(u: &str) -> Url {
        Url::parse(u).unwrap()
    }

    #[test]
    fn plain_http_only_to_loopback_unless_allowed_and_proxies_only_for_https() {
        for ok in ["http://127.0.0.1:4242", "http://localhost:1", "http://[::1]:8", "https://api.example.com"] {
            assert!(checked_route(&url(ok), None, false).is_ok(), "{ok}");
        }
        assert_eq!(checked_route(&url("http://api.example.com"), None, false).unwrap_err().0, "url");
        assert!(checked_route(&url("http://api.example.com"), None, true).is_ok());
        assert!(checked_route(&url("https://api.example.com"), Some("http://proxy:3128"), false).unwrap().is_some());
        for bad in ["http://u:p@proxy:3128", "socks5://proxy:1080", "http://proxy:3128/path", "not a url"] {
            assert_eq!(checked_route(&url("https://a.example"), Some(bad), false).unwrap_err().0, "proxy", "{bad}");
        }
        assert_eq!(checked_route(&url("http://127.0.0.1:1"), Some("http://proxy:3128"), false).unwrap_err().0, "proxy");
    }

    #[test]
    fn tls_settings_are_checked() {
        let https = url("https://bank.example");
        let base = Path::new("/cfg");
        let t = TlsPolicy { ca_file: Some("ca.pem".into()), ..TlsPolicy::default() }.checked(&https, base).unwrap();
        assert_eq!(t.ca_file.as_deref(), Some(Path::new("/cfg/ca.pem")));
        let only_platform_off = TlsPolicy { platform_roots: false, ..TlsPolicy::default() };
        assert_eq!(only_platform_off.checked(&https, base).unwrap_err().0, "tls.platform_roots");
        let half = TlsPolicy { client_cert_file: Some("c.pem".into()), ..TlsPolicy::default() };
        assert_eq!(half.checked(&https, base).unwrap_err().0, "tls.client_cert_file");
        let pin = TlsPolicy { spki_sha256: vec!["sha256/not-base64!".into()], ..TlsPolicy::default() };
        assert_eq!(pin.checked(&https, base).unwrap_err().0, "tls.spki_sha256[0]");
        let good_pin = TlsPolicy { spki_sha256: vec![format!("sha256/{}", "A".repeat(43) + "=")], ..TlsPolicy::default() };
        assert_eq!(good_pin.checked(&https, base).unwrap().pins().len(), 1);
        let version = TlsPolicy { min_version: Some("1.1".into()), ..TlsPolicy::default() };
        assert_eq!(version.checked(&https, base).unwrap_err().0, "tls.min_version");
        let on_http = TlsPolicy { ca_file: Some("ca.pem".into()), ..TlsPolicy::default() };
        assert_eq!(on_http.checked(&url("http://127.0.0.1:1"), base).unwrap_err().0, "tls");
    }
}
