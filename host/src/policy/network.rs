//! How the host reaches a downstream over the network, as the reviewer sets
//! it: an egress proxy, and whether plain HTTP is allowed at all (its TLS,
//! [`crate::net::TlsPolicy`], is the network layer's). Never from the environment: an environment variable must
//! not redirect or downgrade guarded traffic.

use url::Url;

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
    use crate::net::TlsPolicy;
    use std::path::Path;

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
