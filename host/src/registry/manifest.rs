//! The OCI image manifest, as far as a Wasm component artifact needs it: the
//! CNCF Wasm layout (config `application/vnd.wasm.config.v0+json`, exactly
//! one `application/wasm` layer) that `wkg` and `toolguard push` write, and
//! the shape of cosign's signature manifests.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// An OCI image manifest.
pub const MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
/// Docker's schema 2 manifest, which registries and older tools still write.
pub const DOCKER_MANIFEST_MEDIA_TYPE: &str = "application/vnd.docker.distribution.manifest.v2+json";
/// The Wasm artifact's config.
pub const WASM_CONFIG_MEDIA_TYPE: &str = "application/vnd.wasm.config.v0+json";
/// The Wasm artifact's one layer: the component's bytes.
pub const WASM_LAYER_MEDIA_TYPE: &str = "application/wasm";
/// What a manifest request accepts (an image index is refused, with a reason).
pub const ACCEPT: &str = "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json, \
                          application/vnd.oci.image.index.v1+json;q=0.5";

/// A content descriptor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    /// What the content is.
    pub media_type: String,
    /// `sha256:<hex>` of the content.
    pub digest: String,
    /// Its length in bytes.
    pub size: u64,
    /// Annotations (cosign puts the signature here).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// An image manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    /// Always 2.
    pub schema_version: u32,
    /// The manifest's own media type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    /// The config blob.
    pub config: Descriptor,
    /// The layers.
    pub layers: Vec<Descriptor>,
    /// Annotations.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

impl Manifest {
    /// Parses a manifest fetched from a registry.
    ///
    /// # Errors
    /// Not JSON, an image index (several platforms), or not an image manifest.
    pub fn parse(bytes: &[u8]) -> Result<Self, String> {
        let value: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| format!("the manifest is not JSON: {e}"))?;
        if value.get("manifests").is_some() {
            return Err(
                "the reference names an image index (a list of manifests), not a Wasm component artifact: reference the component's own manifest".into()
            );
        }
        let m: Self = serde_json::from_value(value).map_err(|e| format!("not an OCI image manifest: {e}"))?;
        if m.schema_version != 2 {
            return Err(format!("schemaVersion {} (expected 2)", m.schema_version));
        }
        Ok(m)
    }

    /// The component's layer: the one `application/wasm` layer.
    ///
    /// # Errors
    /// None or several Wasm layers, or layers of another kind beside it.
    pub fn wasm_layer(&self) -> Result<&Descriptor, String> {
        match self.layers.as_slice() {
            [one] if one.media_type == WASM_LAYER_MEDIA_TYPE => Ok(one),
            layers => Err(format!(
                "not a Wasm component artifact: expected exactly one `{WASM_LAYER_MEDIA_TYPE}` layer, found [{}]",
                layers.iter().map(|l| l.media_type.as_str()).collect::<Vec<_>>().join(", ")
            )),
        }
    }

    /// The canonical bytes this project writes for a manifest.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// The Wasm config blob `toolguard push` writes (the CNCF layout's fields;
/// no creation time, so pushing the same component twice gives the same
/// manifest digest and its signatures stay valid).
pub fn wasm_config(layer_digest: &str, imports: &[String], exports: &[String]) -> Vec<u8> {
    let config = serde_json::json!({
        "architecture": "wasm",
        "os": "wasip2",
        "layerDigests": [layer_digest],
        "component": { "exports": exports, "imports": imports, "target": null },
    });
    serde_json::to_vec(&config).unwrap_or_default()
}

/// `sha256:<hex>` of `bytes`.
pub fn digest_of(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(bytes)))
}

/// A manifest of one config and the given layers.
pub fn manifest(config: Descriptor, layers: Vec<Descriptor>) -> Manifest {
    Manifest { schema_version: 2, media_type: Some(MANIFEST_MEDIA_TYPE.into()), config, layers, annotations: BTreeMap::new() }
}

/// A descriptor of `bytes` as `media_type`.
pub fn describe(media_type: &str, bytes: &[u8]) -> Descriptor {
    Descriptor { media_type: media_type.into(), digest: digest_of(bytes), size: bytes.len() as u64, annotations: BTreeMap::new() }
}
