//! Components from OCI registries: `oci://` references, the distribution
//! API (pull and push, bounded and digest-checked), the content-addressed
//! cache under the data directory, and cosign-compatible signatures with
//! publisher keys. Whether a fetched component may load — its pin, its
//! signature — is decided in one place, `runtime::source`; this module only
//! fetches, caches and verifies what it is asked to.

pub mod bundle;
pub mod cache;
pub mod credentials;
mod distribution;
pub mod keyless;
pub mod manifest;
pub mod prune;
pub mod publishers;
pub mod reference;
mod referrers;
pub mod signature;
pub mod trusted_root;

pub use cache::Cache;
pub use credentials::Credentials;
pub use distribution::{Client, MAX_MANIFEST_BYTES};
pub use reference::OciRef;
pub use referrers::attach_bundle;
use std::collections::BTreeMap;

use manifest::Manifest;
use signature::{SIGNATURE_ANNOTATION, SIMPLE_SIGNING_MEDIA_TYPE, SignatureLayer};

/// The most signatures of one manifest examined.
pub const MAX_SIGNATURES: usize = 16;

/// The largest component pulled unless the policy says otherwise.
pub const DEFAULT_MAX_COMPONENT_BYTES: u64 = 256 << 20;

/// What kind of failure a registry operation met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The registry could not be reached or is failing (a cache may stand in).
    Unreachable,
    /// The registry refused (not found, credentials, a challenge toolguard cannot answer).
    Refused,
    /// What it served is wrong: a digest mismatch, too large, malformed.
    Invalid,
    /// The local cache could not be written.
    Local,
}

/// A registry operation that failed, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct RegistryError {
    /// The kind of failure.
    pub failure: Failure,
    /// What happened, for the operator.
    pub message: String,
}

impl RegistryError {
    fn new(failure: Failure, message: impl Into<String>) -> Self {
        Self { failure, message: message.into() }
    }
    fn unreachable(message: impl Into<String>) -> Self {
        Self::new(Failure::Unreachable, message)
    }
    fn refused(message: impl Into<String>) -> Self {
        Self::new(Failure::Refused, message)
    }
    fn invalid(message: impl Into<String>) -> Self {
        Self::new(Failure::Invalid, message)
    }
    fn local(message: impl Into<String>) -> Self {
        Self::new(Failure::Local, message)
    }
    fn transport(e: reqwest::Error) -> Self {
        let mut message = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            message = format!("{message}: {s}");
            source = s.source();
        }
        Self::unreachable(format!("cannot reach the registry: {message}"))
    }
}

/// A component fetched (or found in the cache), with what identifies it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched {
    /// The reference as configured.
    pub reference: OciRef,
    /// The manifest's digest: what a signature signs, and what a tag resolved to.
    pub manifest_digest: String,
    /// The component's bytes (the one `application/wasm` layer, digest-checked).
    pub component: Vec<u8>,
    /// The signatures stored for the manifest (fetched only when asked for).
    pub signatures: Vec<SignatureLayer>,
    /// The sigstore bundles referring to the manifest (JSON; fetched with the signatures).
    pub bundles: Vec<Vec<u8>>,
    /// When the manifest entered this host's cache (ms since the epoch).
    pub pulled_ms: u64,
    /// Why the registry was not consulted for the tag, if the cache stood in.
    pub offline: Option<String>,
    /// The manifest digest the tag resolved to before it moved, if it did.
    pub moved_from: Option<String>,
}

/// Fetches the component `r` names, from `cache` where it can and from the
/// registry otherwise; a tag is resolved at the registry when it answers and
/// from the cache when it cannot be reached. With `signatures`, also the
/// manifest's cosign signatures and sigstore bundles. Once `client` has
/// found the registry unreachable — in this fetch, or an earlier one of the
/// same load ([`Client::gone`]) — every later step is answered from the
/// cache, so a silent registry costs a load one [`crate::net::deadlines::REGISTRY`] (its
/// `timeout_seconds`) at most, not one per lookup.
///
/// # Errors
/// The registry cannot be reached and the cache cannot stand in; or it
/// refused, or served something wrong (see [`Failure`]).
pub async fn fetch(client: &Client, cache: &Cache, r: &OciRef, signatures: bool, max_component: u64) -> Result<Fetched, RegistryError> {
    let at = At { client, cache, r };
    let Resolved { bytes, digest, moved_from, .. } =
        at.resolve(r.manifest_reference()).await?.ok_or_else(|| RegistryError::refused(format!("{r}: the registry has no such manifest")))?;
    let manifest = Manifest::parse(&bytes).map_err(|e| RegistryError::invalid(format!("{r}: {e}")))?;
    let layer = manifest.wasm_layer().map_err(|e| RegistryError::invalid(format!("{r}: {e}")))?;
    if layer.size > max_component {
        return Err(RegistryError::invalid(format!("{r}: the component is {} bytes, over the {max_component} bytes allowed", layer.size)));
    }
    // Its size as the manifest declares it bounds the download (and its deadline); the digest checks it.
    let component = at.blob(&layer.digest, layer.size.max(1)).await?;
    let (signatures, bundles) = match signatures {
        true => (at.signatures_of(&digest).await?, at.bundles_of(&digest).await?),
        false => (Vec::new(), Vec::new()),
    };
    let pulled_ms = cache.stored_ms(&digest).unwrap_or_else(crate::ledger::records::now_ms);
    let offline = client.gone();
    Ok(Fetched { reference: r.clone(), manifest_digest: digest, component, signatures, bundles, pulled_ms, offline, moved_from })
}

/// A manifest found for a reference.
struct Resolved {
    bytes: Vec<u8>,
    digest: String,
    /// The digest a tag resolved to before it moved.
    moved_from: Option<String>,
}

/// One repository, reached through a registry client and the cache.
struct At<'a> {
    client: &'a Client,
    cache: &'a Cache,
    r: &'a OciRef,
}

impl At<'_> {
    /// Why the registry is not asked any more, if it is not ([`Client::gone`]).
    fn gone(&self) -> Option<String> {
        self.client.gone()
    }

    /// `result` of a registry exchange; an unreachable registry is noted, so
    /// that the rest of the load is answered from the cache.
    fn noting<T>(&self, result: Result<T, RegistryError>) -> Result<T, RegistryError> {
        self.client.noting(result)
    }

    /// The manifest `reference` names, or `None` if the registry has none.
    /// Digests come from the cache first; tags from the registry first, and
    /// from the cache when the registry cannot be reached.
    async fn resolve(&self, reference: &str) -> Result<Option<Resolved>, RegistryError> {
        let Self { client, cache, r, .. } = self;
        let local = |e: String| RegistryError::local(e);
        if reference::is_sha256_digest(reference) {
            if let Some(bytes) = cache.get(reference) {
                return Ok(Some(Resolved { bytes, digest: reference.into(), moved_from: None }));
            }
            if let Some(why) = self.gone() {
                return Err(RegistryError::unreachable(format!(
                    "{r}: manifest {reference} is not in this host's cache and the registry cannot be reached: {why}"
                )));
            }
            let Some((bytes, digest)) = self.noting(client.manifest(&r.repository, reference).await)? else { return Ok(None) };
            cache.put(&bytes).map_err(local)?;
            return Ok(Some(Resolved { bytes, digest, moved_from: None }));
        }
        let answered = match self.gone() {
            Some(why) => Err(RegistryError::unreachable(why)),
            None => self.noting(client.manifest(&r.repository, reference).await),
        };
        match answered {
            Ok(Some((bytes, digest))) => {
                cache.put(&bytes).map_err(local)?;
                let record = cache.set_tag(&r.registry, &r.repository, reference, &digest).map_err(local)?;
                Ok(Some(Resolved { bytes, digest, moved_from: record.previous }))
            }
            Ok(None) => {
                cache.forget_tag(&r.registry, &r.repository, reference);
                Ok(None)
            }
            Err(e) if e.failure == Failure::Unreachable => {
                let cached = cache.tag(&r.registry, &r.repository, reference).and_then(|t| cache.get(&t.digest).map(|b| (b, t)));
                let missing = || RegistryError::unreachable(format!("{r}: {} — and `{reference}` is not in this host's cache", e.message));
                let (bytes, tag) = cached.ok_or_else(missing)?;
                Ok(Some(Resolved { bytes, digest: tag.digest, moved_from: tag.previous }))
            }
            Err(e) => Err(e),
        }
    }

    /// Blob `digest`, at most `size` bytes: from the cache, else downloaded
    /// into it within its deadline ([`crate::net::deadlines::blob`]).
    async fn blob(&self, digest: &str, size: u64) -> Result<Vec<u8>, RegistryError> {
        let Self { client, cache, r, .. } = self;
        let repository = &r.repository;
        // A digest is a path in the cache and in the registry's URL: only the one form is taken.
        if !reference::is_sha256_digest(digest) {
            return Err(RegistryError::invalid(format!("{r}: a descriptor names `{digest}`, which is not a sha256 digest")));
        }
        if let Some(bytes) = cache.get(digest) {
            return Ok(bytes);
        }
        if let Some(why) = self.gone() {
            return Err(RegistryError::unreachable(format!("blob {digest} is not in this host's cache and the registry cannot be reached: {why}")));
        }
        let temp = cache.temp_path().map_err(RegistryError::local)?;
        self.noting(client.blob_to_file(repository, digest, size, &temp).await)?;
        let path = cache.commit(&temp, digest).map_err(RegistryError::local)?;
        std::fs::read(&path).map_err(|e| RegistryError::local(format!("cannot read {}: {e}", path.display())))
    }

    /// The cosign signatures stored for manifest `digest` of the repository
    /// (from the cache once the registry is gone: [`At::resolve`] of their tag).
    async fn signatures_of(&self, digest: &str) -> Result<Vec<SignatureLayer>, RegistryError> {
        let r = self.r;
        let tag = signature::signature_tag(digest);
        let found = match self.resolve(&tag).await {
            Ok(found) => found,
            // Gone, and no signature manifest cached (the registry had none when it answered): none known.
            Err(e) if e.failure == Failure::Unreachable => None,
            Err(e) => return Err(e),
        };
        let Some(bytes) = found.map(|found| found.bytes) else { return Ok(Vec::new()) };
        let manifest = Manifest::parse(&bytes).map_err(|e| RegistryError::invalid(format!("{r}: its signature manifest: {e}")))?;
        let mut layers = Vec::new();
        // A registry listing thousands of "signatures" would cost as many requests: the first few are read.
        for layer in manifest.layers.iter().filter(|l| l.media_type == SIMPLE_SIGNING_MEDIA_TYPE).take(MAX_SIGNATURES) {
            let Some(sig) = layer.annotations.get(SIGNATURE_ANNOTATION) else { continue };
            let payload = self.blob(&layer.digest, signature::MAX_PAYLOAD_BYTES).await?;
            let annotation = |name: &str| layer.annotations.get(name).cloned();
            let (certificate, bundle) = (annotation(keyless::CERTIFICATE_ANNOTATION), annotation(keyless::BUNDLE_ANNOTATION));
            layers.push(SignatureLayer { payload, signature: sig.clone(), certificate, bundle });
        }
        Ok(layers)
    }
}

/// Pushes `component` as a Wasm OCI artifact at `r` (its tag); answers the manifest digest.
///
/// # Errors
/// The registry cannot be reached or refused.
pub async fn push(client: &Client, r: &OciRef, component: &[u8], imports: &[String], exports: &[String]) -> Result<String, RegistryError> {
    let layer = client.push_blob(&r.repository, manifest::WASM_LAYER_MEDIA_TYPE, component).await?;
    let config = client.push_blob(&r.repository, manifest::WASM_CONFIG_MEDIA_TYPE, &manifest::wasm_config(&layer.digest, imports, exports)).await?;
    let m = manifest::manifest(config, vec![layer]);
    client.push_manifest(&r.repository, r.manifest_reference(), manifest::MANIFEST_MEDIA_TYPE, &m.to_bytes()).await
}

/// Signs manifest `digest` of `r`'s repository with `key`, adding the
/// signature to those already stored under its `sha256-….sig` tag.
///
/// # Errors
/// The registry cannot be reached or refused, or signing failed.
pub async fn sign(client: &Client, r: &OciRef, digest: &str, key: &publishers::SigningKey) -> Result<(), RegistryError> {
    use base64::Engine as _;
    let payload = signature::payload(&r.name(), digest);
    let signature = base64::engine::general_purpose::STANDARD.encode(key.sign(&payload).map_err(RegistryError::local)?);
    let annotations = BTreeMap::from([(SIGNATURE_ANNOTATION.to_string(), signature)]);
    attach(client, r, digest, &payload, annotations).await
}

/// Adds a signature layer — `payload` with `annotations` (the signature,
/// and for a keyless one its certificate, chain and log bundle, as cosign
/// writes them) — to those stored under manifest `digest`'s `sha256-….sig` tag.
///
/// # Errors
/// The registry cannot be reached or refused.
pub async fn attach(client: &Client, r: &OciRef, digest: &str, payload: &[u8], annotations: BTreeMap<String, String>) -> Result<(), RegistryError> {
    let tag = signature::signature_tag(digest);
    let mut layers = match client.manifest(&r.repository, &tag).await? {
        Some((bytes, _)) => Manifest::parse(&bytes).map_err(|e| RegistryError::invalid(format!("the existing signature manifest: {e}")))?.layers,
        None => Vec::new(),
    };
    let mut layer = client.push_blob(&r.repository, SIMPLE_SIGNING_MEDIA_TYPE, payload).await?;
    layer.annotations = annotations;
    layers.push(layer);
    let diff_ids: Vec<&str> = layers.iter().map(|l| l.digest.as_str()).collect();
    let config = serde_json::json!({ "architecture": "", "os": "", "config": {}, "rootfs": { "type": "layers", "diff_ids": diff_ids } });
    let config = client.push_blob(&r.repository, "application/vnd.oci.image.config.v1+json", &serde_json::to_vec(&config).unwrap_or_default()).await?;
    let m = manifest::manifest(config, layers);
    client.push_manifest(&r.repository, &tag, manifest::MANIFEST_MEDIA_TYPE, &m.to_bytes()).await.map(|_| ())
}
