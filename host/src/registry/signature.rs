//! Cosign-compatible signatures: a "simple signing" payload naming the
//! signed manifest's digest, signed by the publisher's key, stored as a
//! layer of a manifest tagged `sha256-<hex>.sig` in the same repository,
//! the signature (base64) in the layer's `dev.cosignproject.cosign/signature`
//! annotation. A registry without the OCI 1.1 referrers API (Distribution
//! 2.8 among them) holds cosign's signatures this way.

use super::publishers::PublisherKey;
use base64::Engine as _;

/// The media type of a signature layer.
pub const SIMPLE_SIGNING_MEDIA_TYPE: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
/// The annotation holding a layer's signature.
pub const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
/// The `critical.type` of a cosign image signature.
const SIGNATURE_TYPE: &str = "cosign container image signature";
/// The largest signature payload read.
pub const MAX_PAYLOAD_BYTES: u64 = 64 << 10;

/// The tag a manifest's signatures are stored under: `sha256-<hex>.sig`.
pub fn signature_tag(manifest_digest: &str) -> String {
    format!("{}.sig", manifest_digest.replacen(':', "-", 1))
}

/// The payload a publisher signs for the manifest `digest` of `name`
/// (`registry/repository`), in cosign's field order.
pub fn payload(name: &str, digest: &str) -> Vec<u8> {
    let json = serde_json::json!({
        "critical": {
            "identity": { "docker-reference": name },
            "image": { "docker-manifest-digest": digest },
            "type": SIGNATURE_TYPE,
        },
        "optional": null,
    });
    serde_json::to_vec(&json).unwrap_or_default()
}

/// One signature as stored: the payload's bytes and the base64 signature
/// over them; for a keyless one, the signing certificate and the
/// transparency log's bundle too ([`super::keyless`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SignatureLayer {
    /// The simple signing payload.
    pub payload: Vec<u8>,
    /// The signature, base64, from the layer's annotation.
    pub signature: String,
    /// A keyless signature's certificate (PEM).
    pub certificate: Option<String>,
    /// A keyless signature's transparency-log bundle (JSON).
    pub bundle: Option<String>,
}

/// Why no signature vouches for a manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unverified {
    /// The manifest has no signature.
    Unsigned,
    /// Signatures exist, and none is by an expected key over this digest.
    NoneValid {
        /// How many signatures were examined.
        found: usize,
        /// What each failed on, in order.
        why: Vec<String>,
    },
}

impl std::fmt::Display for Unverified {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unsigned => write!(f, "it is unsigned (no cosign signature under its `sha256-….sig` tag)"),
            Self::NoneValid { found, why } => write!(f, "none of its {found} signature(s) verifies: {}", why.join("; ")),
        }
    }
}

/// The first key of `keys` with a valid signature among `layers` over a
/// payload naming `digest`.
///
/// # Errors
/// [`Unverified`], saying what each signature failed on.
pub fn verify<'k>(layers: &[SignatureLayer], digest: &str, keys: &'k [PublisherKey]) -> Result<&'k PublisherKey, Unverified> {
    if layers.is_empty() {
        return Err(Unverified::Unsigned);
    }
    let mut why = Vec::new();
    for layer in layers {
        match check_payload(&layer.payload, digest) {
            Err(e) => why.push(e),
            Ok(()) => {
                let Ok(signature) = base64::engine::general_purpose::STANDARD.decode(layer.signature.trim()) else {
                    why.push("a signature that is not base64".into());
                    continue;
                };
                match keys.iter().find(|k| k.verifies(&layer.payload, &signature)) {
                    Some(key) => return Ok(key),
                    None => why.push("a signature by a key the policy does not name (or over other bytes)".into()),
                }
            }
        }
    }
    Err(Unverified::NoneValid { found: layers.len(), why })
}

/// Checks that a payload is a cosign image signature of `digest`.
pub(super) fn check_payload(payload: &[u8], digest: &str) -> Result<(), String> {
    let value: serde_json::Value = serde_json::from_slice(payload).map_err(|_| "a payload that is not JSON".to_string())?;
    let critical = &value["critical"];
    if critical["type"] != SIGNATURE_TYPE {
        return Err(format!("a payload of type {} (expected `{SIGNATURE_TYPE}`)", critical["type"]));
    }
    match critical["image"]["docker-manifest-digest"].as_str() {
        Some(d) if d == digest => Ok(()),
        Some(d) => Err(format!("a signature of another manifest ({d})")),
        None => Err("a payload naming no manifest digest".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::{SignatureLayer, Unverified, payload, signature_tag, verify};
    use crate::registry::publishers::{PublisherKey, SigningKey};
    use base64::Engine as _;

    #[test]
    fn a_signature_binds_key_and_digest() {
        let (private, public) = SigningKey::generate().unwrap();
        let key = SigningKey::from_pem("k", private.as_bytes()).unwrap();
        let keys = [PublisherKey::from_pem("k.pub", public.as_bytes()).unwrap()];
        let digest = format!("sha256:{}", "1".repeat(64));
        let body = payload("r.example/a", &digest);
        let layer =
            SignatureLayer { signature: base64::engine::general_purpose::STANDARD.encode(key.sign(&body).unwrap()), payload: body, ..Default::default() };
        assert_eq!(verify(std::slice::from_ref(&layer), &digest, &keys).unwrap().label, "k.pub");
        let other = format!("sha256:{}", "2".repeat(64));
        assert!(matches!(verify(std::slice::from_ref(&layer), &other, &keys), Err(Unverified::NoneValid { .. })));
        assert_eq!(verify(&[], &digest, &keys), Err(Unverified::Unsigned));
        assert_eq!(signature_tag(&digest), format!("sha256-{}.sig", "1".repeat(64)));
    }
}
