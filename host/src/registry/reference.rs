//! `oci://REGISTRY/REPOSITORY:TAG` and `oci://REGISTRY/REPOSITORY@sha256:HEX`:
//! a component's address in an OCI registry. The registry is always named
//! (no implicit Docker Hub), and a tag or a digest is always given (no
//! implicit `latest`): the reviewer reads exactly what will be pulled.

use std::fmt;

/// A parsed `oci://` reference.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OciRef {
    /// `host[:port]` of the registry.
    pub registry: String,
    /// The repository path (`team/tool`).
    pub repository: String,
    /// The tag, if given.
    pub tag: Option<String>,
    /// `sha256:<hex>` of the manifest, if given (it then decides; a tag is informational).
    pub digest: Option<String>,
}

impl OciRef {
    /// Parses `oci://…`.
    ///
    /// # Errors
    /// What is malformed, in words an operator can act on.
    pub fn parse(text: &str) -> Result<Self, String> {
        let rest = text.strip_prefix("oci://").ok_or("an OCI reference starts with oci://")?;
        let (rest, digest) = match rest.split_once('@') {
            Some((r, d)) => (r, Some(d.to_string())),
            None => (rest, None),
        };
        if let Some(d) = &digest
            && !is_sha256_digest(d)
        {
            return Err(format!("`@{d}`: a digest is `sha256:` and 64 lower-case hex digits"));
        }
        let (registry, path) = rest.split_once('/').ok_or("expected oci://REGISTRY/REPOSITORY:TAG (or @sha256:DIGEST)")?;
        if registry.is_empty() || !registry.chars().all(|c| c.is_ascii_alphanumeric() || ".-:[]".contains(c)) {
            return Err(format!("`{registry}` is not a registry host[:port]"));
        }
        // A tag follows the last `:` after the last `/`.
        let last = path.rfind('/').map_or(0, |i| i + 1);
        let (repository, tag) = match path[last..].find(':') {
            Some(i) => (&path[..last + i], Some(path[last + i + 1..].to_string())),
            None => (path, None),
        };
        if !repository.split('/').all(valid_component) {
            return Err(format!("`{repository}`: a repository is lower-case path components of a-z 0-9 and single . _ - between them"));
        }
        if let Some(t) = &tag
            && !valid_tag(t)
        {
            return Err(format!("tag `{t}`: 1–128 of A-Z a-z 0-9 _ . -, not starting with . or -"));
        }
        if tag.is_none() && digest.is_none() {
            return Err("name a tag (`:1.2.0`) or a digest (`@sha256:…`); there is no implicit `latest`".into());
        }
        Ok(Self { registry: registry.to_ascii_lowercase(), repository: repository.into(), tag, digest })
    }

    /// The reference a manifest is fetched by: the digest if given, else the tag.
    pub fn manifest_reference(&self) -> &str {
        self.digest.as_deref().or(self.tag.as_deref()).unwrap_or_default()
    }

    /// The same repository at `digest`, keeping the tag it was reached by.
    pub fn at(&self, digest: &str) -> Self {
        Self { digest: Some(digest.to_string()), ..self.clone() }
    }

    /// `registry/repository`, as cosign names an image's identity.
    pub fn name(&self) -> String {
        format!("{}/{}", self.registry, self.repository)
    }

    /// Whether the registry host is loopback (plain HTTP may be allowed there).
    pub fn is_loopback(&self) -> bool {
        url::Url::parse(&format!("http://{}/", self.registry)).is_ok_and(|u| is_loopback_url(&u))
    }
}

/// Whether `url`'s host is loopback (`localhost`, 127.0.0.0/8, `::1`).
pub fn is_loopback_url(url: &url::Url) -> bool {
    match url.host() {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    }
}

impl fmt::Display for OciRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "oci://{}/{}", self.registry, self.repository)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

/// Whether `d` is `sha256:` and 64 lower-case hex digits.
pub fn is_sha256_digest(d: &str) -> bool {
    d.strip_prefix("sha256:").is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
}

fn valid_component(c: &str) -> bool {
    // [a-z0-9]+ ((\.|_|__|-+) [a-z0-9]+)*  (the OCI distribution spec's path component)
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let bytes = c.as_bytes();
    if !bytes.first().is_some_and(|&b| alnum(b)) || !bytes.last().is_some_and(|&b| alnum(b)) {
        return false;
    }
    bytes.windows(2).all(|w| match (w[0], w[1]) {
        (a, b) if alnum(a) || alnum(b) => (alnum(a) || b".-_".contains(&a)) && (alnum(b) || b".-_".contains(&b)),
        (b'-', b'-') | (b'_', b'_') => true,
        _ => false,
    }) && !c.contains("___")
}

fn valid_tag(t: &str) -> bool {
    (1..=128).contains(&t.len()) && t.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-')) && !t.starts_with(['.', '-'])
}

#[cfg(test)]
mod tests {
    use super::OciRef;

    #[test]
    fn tags_digests_and_ports_parse() {
        let r = OciRef::parse("oci://127.0.0.1:5000/tools/text-stats:1.0").unwrap();
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str(), r.tag.as_deref(), r.digest.as_deref()),
            ("127.0.0.1:5000", "tools/text-stats", Some("1.0"), None)
        );
        assert!(r.is_loopback());
        let d = format!("sha256:{}", "a".repeat(64));
        let r = OciRef::parse(&format!("oci://ghcr.io/acme/refund@{d}")).unwrap();
        assert_eq!((r.tag.as_deref(), r.digest.as_deref(), r.is_loopback()), (None, Some(d.as_str()), false));
        assert_eq!(OciRef::parse("oci://localhost:5000/a:b").unwrap().to_string(), "oci://localhost:5000/a:b");
    }

    #[test]
    fn malformed_references_say_what_is_wrong() {
        for (bad, says) in [
            ("ghcr.io/a:b", "oci://"),
            ("oci://ghcr.io/acme/refund", "no implicit `latest`"),
            ("oci://ghcr.io/Acme/refund:1", "lower-case"),
            ("oci://ghcr.io/acme/refund@sha256:abc", "64 lower-case hex"),
            ("oci://ghcr.io/acme/refund:-x", "tag `-x`"),
            ("oci://ghcr.io", "expected oci://"),
            ("oci://ghcr.io/acme//x:1", "repository"),
        ] {
            let e = OciRef::parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
