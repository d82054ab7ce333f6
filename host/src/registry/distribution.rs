//! The OCI distribution API, as far as pulling and pushing a component
//! needs: manifests and blobs read with a size bound and checked against
//! their digests while they stream, monolithic blob uploads, manifest
//! uploads, and the registries' two ways of asking for credentials (Basic,
//! and Bearer tokens from the realm the registry names). It runs on the
//! host's own HTTP client, so the reviewer's TLS settings (private CA, SPKI
//! pins, minimum version) apply as they do to downstreams.

use super::manifest::{ACCEPT, Descriptor, digest_of};
use super::{Credentials, RegistryError};
use sha2::{Digest as _, Sha256};
use std::io::Write as _;
use std::path::Path;
use tokio::sync::Mutex;
use url::Url;

/// The largest manifest read (the distribution reference implementation's own limit).
pub const MAX_MANIFEST_BYTES: u64 = 4 << 20;
/// The largest token response read.
const MAX_TOKEN_BYTES: u64 = 64 << 10;

use crate::net::deadlines::blob as deadline;

/// A client of one registry.
pub struct Client {
    base: Url,
    http: reqwest::Client,
    credentials: Option<Credentials>,
    /// The bearer token last issued, with the scope it was asked for.
    token: Mutex<Option<(String, String)>>,
    /// How long one exchange may take in all ([`crate::net::deadlines::REGISTRY`]).
    timeout: std::time::Duration,
    /// Why the registry is not asked any more, once an exchange found it
    /// unreachable: a client serves one load, whose later lookups the cache
    /// answers (`super::fetch`).
    gone: std::sync::Mutex<Option<String>>,
}

impl std::fmt::Debug for Client {
    /// The registry it reaches (never its credentials or token).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("base", &self.base.as_str()).field("gone", &self.gone()).finish_non_exhaustive()
    }
}

impl Client {
    /// A client of `registry` (`host[:port]`) over HTTPS with `tls`, or over
    /// plain HTTP where `tls` is `None` (the caller allows that only on
    /// loopback), each exchange given `timeout` in all (a blob more:
    /// [`crate::net::deadlines::blob`]).
    ///
    /// # Errors
    /// The HTTP client cannot be built.
    pub fn new(registry: &str, tls: Option<rustls::ClientConfig>, credentials: Option<Credentials>, timeout: std::time::Duration) -> Result<Self, String> {
        let scheme = if tls.is_some() { "https" } else { "http" };
        let base = Url::parse(&format!("{scheme}://{registry}/")).map_err(|e| format!("registry `{registry}`: {e}"))?;
        // Blobs are often served from a storage service the registry redirects to;
        // reqwest drops the Authorization header when a redirect changes host.
        // Never from HTTPS down to plain HTTP, and plain HTTP only on loopback.
        let redirect = reqwest::redirect::Policy::custom(|attempt| {
            let (safe, url) = (safe_to_reach(attempt.url()), attempt.url().to_string());
            if attempt.previous().len() >= 5 {
                attempt.error("more than 5 redirects")
            } else if safe {
                attempt.follow()
            } else {
                attempt.error(format!("a redirect to {url}, which is neither https nor loopback"))
            }
        });
        let label = format!("registry `{registry}`");
        let http = crate::net::client(crate::net::Peer { redirect, ..crate::net::Peer::direct(&label, tls, crate::net::Deadlines::within(timeout)) })?;
        Ok(Self { base, http, credentials, token: Mutex::new(None), timeout, gone: std::sync::Mutex::default() })
    }

    /// Why the registry is not asked any more, if an exchange found it unreachable.
    pub fn gone(&self) -> Option<String> {
        self.gone.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// `result` of an exchange; an unreachable registry is noted ([`Client::gone`]).
    pub(super) fn noting<T>(&self, result: Result<T, RegistryError>) -> Result<T, RegistryError> {
        if let Err(e) = &result
            && e.failure == super::Failure::Unreachable
        {
            self.gone.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get_or_insert_with(|| e.message.clone());
        }
        result
    }

    fn url(&self, path: &str) -> Result<Url, RegistryError> {
        self.base.join(path).map_err(|e| RegistryError::invalid(format!("{path}: {e}")))
    }

    /// The manifest `reference` (a tag or digest) of `repository`, its bytes
    /// and digest, or `None` if the registry has no such manifest. A digest
    /// reference must match the bytes; a tag's bytes must match the digest
    /// the registry names for them, if it names one.
    ///
    /// # Errors
    /// Unreachable, refused, over [`MAX_MANIFEST_BYTES`], or a digest mismatch.
    pub async fn manifest(&self, repository: &str, reference: &str) -> Result<Option<(Vec<u8>, String)>, RegistryError> {
        let url = self.url(&format!("v2/{repository}/manifests/{reference}"))?;
        let response = self.send(repository, false, self.timeout, |c| c.get(url.clone()).header("accept", ACCEPT)).await?;
        if response.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let response = success(response, &format!("manifest {repository}:{reference}")).await?;
        let named = response.headers().get("docker-content-digest").and_then(|v| v.to_str().ok()).map(str::to_string);
        let mut bytes = Vec::new();
        read_bounded(response, MAX_MANIFEST_BYTES, "manifest", |chunk| {
            bytes.extend_from_slice(chunk);
            Ok(())
        })
        .await?;
        let digest = digest_of(&bytes);
        let expected = if super::reference::is_sha256_digest(reference) { Some(reference.to_string()) } else { named.filter(|d| d.starts_with("sha256:")) };
        if let Some(expected) = expected
            && expected != digest
        {
            return Err(RegistryError::invalid(format!(
                "manifest {repository}:{reference}: its bytes have digest {digest}, but {expected} was expected: the registry (or something between) changed them"
            )));
        }
        Ok(Some((bytes, digest)))
    }

    /// The referrers of manifest `digest` (an OCI image index) through the
    /// OCI 1.1 referrers API, or `None` where the registry has no such API
    /// (Distribution 2.8: then the referrers tag schema stands in).
    ///
    /// # Errors
    /// Unreachable, or over [`MAX_MANIFEST_BYTES`].
    pub async fn referrers(&self, repository: &str, digest: &str) -> Result<Option<Vec<u8>>, RegistryError> {
        let url = self.url(&format!("v2/{repository}/referrers/{digest}"))?;
        let response = self.send(repository, false, self.timeout, |c| c.get(url.clone()).header("accept", "application/vnd.oci.image.index.v1+json")).await?;
        if !response.status().is_success() {
            return Ok(None);
        }
        let mut bytes = Vec::new();
        read_bounded(response, MAX_MANIFEST_BYTES, "referrers index", |chunk| {
            bytes.extend_from_slice(chunk);
            Ok(())
        })
        .await?;
        Ok(Some(bytes))
    }

    /// Streams blob `digest` of `repository` into `dest` (created), at most
    /// `max` bytes, checking the digest as it goes, within [`deadline`] of
    /// `max`; `dest` is removed on failure.
    ///
    /// # Errors
    /// Unreachable, refused, too large, or the bytes do not have the digest.
    pub async fn blob_to_file(&self, repository: &str, digest: &str, max: u64, dest: &Path) -> Result<(), RegistryError> {
        let result = self.blob_to_file_inner(repository, digest, max, dest).await;
        if result.is_err() {
            let _ = std::fs::remove_file(dest);
        }
        result
    }

    async fn blob_to_file_inner(&self, repository: &str, digest: &str, max: u64, dest: &Path) -> Result<(), RegistryError> {
        let url = self.url(&format!("v2/{repository}/blobs/{digest}"))?;
        let within = deadline(self.timeout, max);
        let response = success(self.send(repository, false, within, |c| c.get(url.clone())).await?, &format!("blob {digest}")).await?;
        let mut file = std::fs::File::create(dest).map_err(|e| RegistryError::local(format!("cannot write {}: {e}", dest.display())))?;
        let mut hasher = Sha256::new();
        read_bounded(response, max, &format!("blob {digest}"), |chunk| {
            hasher.update(chunk);
            file.write_all(chunk)
        })
        .await?;
        file.sync_all().map_err(|e| RegistryError::local(format!("cannot write {}: {e}", dest.display())))?;
        let actual = format!("sha256:{}", hex::encode(hasher.finalize()));
        if actual != digest {
            return Err(RegistryError::invalid(format!("blob {digest} of {repository}: its bytes have digest {actual}: the registry served other content")));
        }
        Ok(())
    }

    /// Uploads `bytes` as a blob of `repository` unless it is there already.
    ///
    /// # Errors
    /// Unreachable or refused.
    pub async fn push_blob(&self, repository: &str, media_type: &str, bytes: &[u8]) -> Result<Descriptor, RegistryError> {
        let descriptor = super::manifest::describe(media_type, bytes);
        let head = self.url(&format!("v2/{repository}/blobs/{}", descriptor.digest))?;
        if self.send(repository, true, self.timeout, |c| c.head(head.clone())).await?.status().is_success() {
            return Ok(descriptor);
        }
        let start = self.url(&format!("v2/{repository}/blobs/uploads/"))?;
        let started = success(self.send(repository, true, self.timeout, |c| c.post(start.clone()).header("content-length", "0")).await?, "blob upload").await?;
        let location = started
            .headers()
            .get("location")
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| RegistryError::invalid("the registry started an upload without a Location"))?;
        let mut upload = self.base.join(location).map_err(|e| RegistryError::invalid(format!("upload location {location}: {e}")))?;
        upload.query_pairs_mut().append_pair("digest", &descriptor.digest);
        let body = bytes.to_vec();
        let put = |c: &reqwest::Client| c.put(upload.clone()).header("content-type", "application/octet-stream").body(body.clone());
        success(self.send(repository, true, deadline(self.timeout, bytes.len() as u64), put).await?, "blob upload").await?;
        Ok(descriptor)
    }

    /// Uploads a manifest as `reference` (a tag or its digest); answers its digest.
    ///
    /// # Errors
    /// Unreachable or refused.
    pub async fn push_manifest(&self, repository: &str, reference: &str, media_type: &str, bytes: &[u8]) -> Result<String, RegistryError> {
        let url = self.url(&format!("v2/{repository}/manifests/{reference}"))?;
        let body = bytes.to_vec();
        let put = |c: &reqwest::Client| c.put(url.clone()).header("content-type", media_type).body(body.clone());
        success(self.send(repository, true, self.timeout, put).await?, &format!("manifest {repository}:{reference}")).await?;
        Ok(digest_of(bytes))
    }

    /// Sends a request (to push, or only to pull), answering a credentials
    /// challenge once; each try must be answered, body and all, `within` its
    /// deadline.
    async fn send(
        &self,
        repository: &str,
        push: bool,
        within: std::time::Duration,
        request: impl Fn(&reqwest::Client) -> reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, RegistryError> {
        let scope = format!("repository:{repository}:{}", if push { "pull,push" } else { "pull" });
        let token = self.token.lock().await.as_ref().filter(|(s, _)| *s == scope).map(|(_, t)| t.clone());
        let request = |c: &reqwest::Client| request(c).timeout(within);
        let first = match &token {
            Some(t) => request(&self.http).bearer_auth(t),
            None => request(&self.http),
        };
        let response = first.send().await.map_err(RegistryError::transport)?;
        if response.status() != reqwest::StatusCode::UNAUTHORIZED {
            return Ok(response);
        }
        let challenge = response.headers().get("www-authenticate").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
        let retry = match challenge.split_once(' ').map(|(s, rest)| (s.to_ascii_lowercase(), rest)) {
            Some((scheme, _)) if scheme == "basic" => {
                let c = self.credentials.as_ref().ok_or_else(|| RegistryError::refused("the registry asks for credentials and none are configured for it"))?;
                request(&self.http).basic_auth(&c.username, Some(&c.password))
            }
            Some((scheme, params)) if scheme == "bearer" => {
                let token = self.fetch_token(params, &scope).await?;
                *self.token.lock().await = Some((scope, token.clone()));
                request(&self.http).bearer_auth(token)
            }
            _ => return Err(RegistryError::refused(format!("the registry answered 401 with a challenge toolguard does not know: `{challenge}`"))),
        };
        let response = retry.send().await.map_err(RegistryError::transport)?;
        if response.status() == reqwest::StatusCode::UNAUTHORIZED || response.status() == reqwest::StatusCode::FORBIDDEN {
            return Err(RegistryError::refused(format!("the registry refused the credentials ({})", response.status())));
        }
        Ok(response)
    }

    /// A bearer token from the realm of a `Bearer realm=…,service=…,scope=…` challenge.
    async fn fetch_token(&self, params: &str, scope: &str) -> Result<String, RegistryError> {
        let params = challenge_params(params);
        let realm =
            params.iter().find(|(k, _)| k == "realm").map(|(_, v)| v.as_str()).ok_or_else(|| RegistryError::refused("a Bearer challenge without a realm"))?;
        let mut url = Url::parse(realm).map_err(|e| RegistryError::refused(format!("token realm `{realm}`: {e}")))?;
        // Credentials go to the realm: never over plain HTTP beyond loopback.
        let loopback =
            url.host_str().is_some_and(|h| h == "localhost" || h.trim_matches(['[', ']']).parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback()));
        if url.scheme() != "https" && !(url.scheme() == "http" && loopback) {
            return Err(RegistryError::refused(format!("the registry names token realm `{realm}`, which is not https: credentials are not sent there")));
        }
        {
            let mut q = url.query_pairs_mut();
            if let Some((_, service)) = params.iter().find(|(k, _)| k == "service") {
                q.append_pair("service", service);
            }
            q.append_pair("scope", params.iter().find(|(k, _)| k == "scope").map_or(scope, |(_, s)| s.as_str()));
        }
        let request = self.http.get(url).timeout(self.timeout);
        let request = match &self.credentials {
            Some(c) => request.basic_auth(&c.username, Some(&c.password)),
            None => request,
        };
        let response = request.send().await.map_err(RegistryError::transport)?;
        if !response.status().is_success() {
            return Err(RegistryError::refused(format!("the token service answered {}", response.status())));
        }
        let mut body = Vec::new();
        read_bounded(response, MAX_TOKEN_BYTES, "token response", |c| {
            body.extend_from_slice(c);
            Ok(())
        })
        .await?;
        #[derive(serde::Deserialize)]
        struct Token {
            token: Option<String>,
            access_token: Option<String>,
        }
        let t: Token = serde_json::from_slice(&body).map_err(|e| RegistryError::refused(format!("the token service's answer is not a token: {e}")))?;
        t.token.or(t.access_token).ok_or_else(|| RegistryError::refused("the token service's answer holds no token"))
    }
}

/// Whether the host may follow a registry to `url`: https, or plain http on loopback.
fn safe_to_reach(url: &Url) -> bool {
    url.scheme() == "https" || (url.scheme() == "http" && super::reference::is_loopback_url(url))
}

/// `key="value", key2=value2` of an auth challenge.
fn challenge_params(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = text.trim();
    while let Some((key, after)) = rest.split_once('=') {
        let key = key.trim().trim_start_matches(',').trim().to_ascii_lowercase();
        let after = after.trim_start();
        let (value, tail) = match after.strip_prefix('"') {
            Some(quoted) => quoted.split_once('"').unwrap_or((quoted, "")),
            None => after.split_once(',').unwrap_or((after, "")),
        };
        out.push((key, value.to_string()));
        rest = tail.trim_start_matches([',', ' ']);
    }
    out
}

/// The response if it succeeded; otherwise an error with its status and a bounded piece of its body.
async fn success(response: reqwest::Response, what: &str) -> Result<reqwest::Response, RegistryError> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let mut body = Vec::new();
    let _ = read_bounded(response, 2048, what, |c| {
        body.extend_from_slice(c);
        Ok(())
    })
    .await;
    let text = String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned();
    let message = format!("{what}: the registry answered {status}: {text}");
    Err(if status.is_server_error() || status == reqwest::StatusCode::TOO_MANY_REQUESTS {
        RegistryError::unreachable(message)
    } else {
        RegistryError::refused(message)
    })
}

/// Reads a body chunk by chunk into `sink`, failing once it passes `max` bytes.
async fn read_bounded(response: reqwest::Response, max: u64, what: &str, sink: impl FnMut(&[u8]) -> std::io::Result<()>) -> Result<u64, RegistryError> {
    crate::net::body::read_within(response, max, sink).await.map_err(|e| match e {
        crate::net::body::BodyError::TooLarge => RegistryError::invalid(format!("{what} is larger than the {max} bytes toolguard reads")),
        crate::net::body::BodyError::Transport(e) => {
            let cut = RegistryError::transport(e);
            RegistryError::unreachable(format!("{what}: {} (the whole answer must arrive within its deadline)", cut.message))
        }
        crate::net::body::BodyError::Sink(e) => RegistryError::local(format!("{what}: {e}")),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn challenges_parse_quoted_and_bare_values() {
        let p = super::challenge_params(r#"realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull,push""#);
        assert_eq!(p[0], ("realm".into(), "https://auth.example/token".into()));
        assert_eq!(p[2], ("scope".into(), "repository:a/b:pull,push".into()));
        assert_eq!(super::challenge_params("realm=x, service=y")[1], ("service".into(), "y".into()));
    }
}
