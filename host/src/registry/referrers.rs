//! Artifacts that refer to a manifest (OCI 1.1 referrers): where cosign 3
//! stores a sigstore bundle signing it. Read through the referrers API
//! where the registry has it, else through the referrers tag schema (an
//! image index tagged `sha256-<hex>`, which cosign writes on registries
//! without the API, Distribution 2.8 among them); the index is cached under
//! that tag either way, so a warm cache verifies offline.

use super::manifest::{self, Manifest, digest_of};
use super::{At, Client, OciRef, RegistryError, bundle};
use serde::Deserialize;

/// An OCI image index.
const INDEX_MEDIA_TYPE: &str = "application/vnd.oci.image.index.v1+json";
/// The largest bundle read.
const MAX_BUNDLE_BYTES: u64 = 1 << 20;
/// The most bundles read for one manifest.
const MAX_BUNDLES: usize = 8;

#[derive(Deserialize)]
struct Index {
    #[serde(default)]
    manifests: Vec<Entry>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Entry {
    digest: String,
    #[serde(default)]
    artifact_type: Option<String>,
}

/// The referrers tag of manifest `digest`: `sha256-<hex>`.
pub(super) fn referrers_tag(digest: &str) -> String {
    digest.replacen(':', "-", 1)
}

impl At<'_> {
    /// The sigstore bundles referring to manifest `digest` (JSON each).
    pub(super) async fn bundles_of(&self, digest: &str) -> Result<Vec<Vec<u8>>, RegistryError> {
        let Some(index) = self.referrers_index(digest).await? else { return Ok(Vec::new()) };
        let Ok(index) = serde_json::from_slice::<Index>(&index) else { return Ok(Vec::new()) };
        let mut bundles = Vec::new();
        let listed = index.manifests.iter().filter(|e| e.artifact_type.as_deref().is_some_and(|t| t.starts_with(bundle::MEDIA_TYPE_PREFIX)));
        for entry in listed.take(MAX_BUNDLES) {
            if !super::reference::is_sha256_digest(&entry.digest) {
                continue;
            }
            let Some(found) = self.resolve(&entry.digest).await? else { continue };
            let Ok(m) = Manifest::parse(&found.bytes) else { continue };
            let Some(layer) = m.layers.iter().find(|l| l.media_type.starts_with(bundle::MEDIA_TYPE_PREFIX)) else { continue };
            bundles.push(self.blob(&layer.digest, MAX_BUNDLE_BYTES).await?);
        }
        Ok(bundles)
    }

    /// The index of `digest`'s referrers: the API's answer (cached under the
    /// referrers tag), else the referrers tag's. With the registry gone, what
    /// the cache holds under that tag — nothing when it had none to cache (a
    /// registry without the API and without referrers, Distribution 2.8's
    /// usual case): no referrers known, so a warm cache still starts offline.
    async fn referrers_index(&self, digest: &str) -> Result<Option<Vec<u8>>, RegistryError> {
        let Self { client, cache, r, .. } = self;
        let tag = referrers_tag(digest);
        let cached = || cache.tag(&r.registry, &r.repository, &tag).and_then(|t| cache.get(&t.digest));
        if self.gone().is_some() {
            return Ok(cached());
        }
        match self.noting(client.referrers(&r.repository, digest).await) {
            Ok(Some(bytes)) => {
                let local = |e: String| RegistryError::local(e);
                let stored = cache.put(&bytes).map_err(local)?;
                cache.set_tag(&r.registry, &r.repository, &tag, &stored).map_err(local)?;
                return Ok(Some(bytes));
            }
            Ok(None) => {}
            Err(e) if e.failure == super::Failure::Unreachable => return Ok(cached()),
            Err(e) => return Err(e),
        }
        match self.resolve(&tag).await {
            Ok(found) => Ok(found.map(|found| found.bytes)),
            Err(e) if e.failure == super::Failure::Unreachable => Ok(cached()),
            Err(e) => Err(e),
        }
    }
}

/// Stores sigstore `bundle` (JSON) as a referrer of manifest `digest` of
/// `r`'s repository, as cosign 3 does on a registry without the referrers
/// API: a manifest whose subject is `digest` and whose one layer is the
/// bundle, listed in the index under the referrers tag.
///
/// # Errors
/// The registry cannot be reached or refused, or has no manifest `digest`.
pub async fn attach_bundle(client: &Client, r: &OciRef, digest: &str, bundle: &[u8]) -> Result<(), RegistryError> {
    let repository = &r.repository;
    let (subject, _) = client.manifest(repository, digest).await?.ok_or_else(|| RegistryError::refused(format!("{r}: no manifest {digest}")))?;
    let layer = client.push_blob(repository, bundle::MEDIA_TYPE, bundle).await?;
    let config = client.push_blob(repository, "application/vnd.oci.empty.v1+json", b"{}").await?;
    let referrer = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": manifest::MANIFEST_MEDIA_TYPE,
        "artifactType": bundle::MEDIA_TYPE,
        "config": config,
        "layers": [layer],
        "subject": { "mediaType": manifest::MANIFEST_MEDIA_TYPE, "digest": digest, "size": subject.len() },
    });
    let bytes = serde_json::to_vec(&referrer).unwrap_or_default();
    let referrer_digest = client.push_manifest(repository, &digest_of(&bytes), manifest::MANIFEST_MEDIA_TYPE, &bytes).await?;
    let tag = referrers_tag(digest);
    let mut index = match client.manifest(repository, &tag).await? {
        Some((bytes, _)) => serde_json::from_slice::<serde_json::Value>(&bytes).unwrap_or_default(),
        None => serde_json::json!({ "schemaVersion": 2, "mediaType": INDEX_MEDIA_TYPE, "manifests": [] }),
    };
    let entry =
        serde_json::json!({ "mediaType": manifest::MANIFEST_MEDIA_TYPE, "digest": referrer_digest, "size": bytes.len(), "artifactType": bundle::MEDIA_TYPE });
    match index["manifests"].as_array_mut() {
        Some(list) => list.push(entry),
        None => index["manifests"] = serde_json::json!([entry]),
    }
    client.push_manifest(repository, &tag, INDEX_MEDIA_TYPE, &serde_json::to_vec(&index).unwrap_or_default()).await.map(|_| ())
}
