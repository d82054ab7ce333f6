//! Sigstore bundles (`application/vnd.dev.sigstore.bundle.v0.3+json`), as
//! cosign 3 stores an image's keyless signature by default: an OCI
//! referrer of the manifest, whose one layer is the bundle — the signing
//! certificate, the transparency log's entry with its signed entry
//! timestamp, and a DSSE envelope around an in-toto statement naming the
//! manifest's digest with cosign's signing predicate
//! (`https://sigstore.dev/cosign/sign/v1`). Verified with the same steps as
//! cosign's annotation layout ([`super::keyless`]): only the packaging differs.
//! A statement of another predicate (a provenance attestation, say) is not
//! a signature of the component and admits nothing.

use super::keyless::{Identity, LoggedEntry, Signed, Verified, identify, same_certificate};
use base64::Engine as _;
use rustls::pki_types::CertificateDer;
use serde::Deserialize;
use sha2::{Digest as _, Sha256};

/// The media types of sigstore bundles start so (the layer's and the artifact's).
pub const MEDIA_TYPE_PREFIX: &str = "application/vnd.dev.sigstore.bundle";
/// The bundle version cosign 3 writes, and the one [`super::attach_bundle`] stores as.
pub const MEDIA_TYPE: &str = "application/vnd.dev.sigstore.bundle.v0.3+json";
/// The predicate of cosign's signature statements.
const SIGN_PREDICATE: &str = "https://sigstore.dev/cosign/sign/v1";
/// The payload type of an in-toto statement in DSSE.
const IN_TOTO: &str = "application/vnd.in-toto+json";

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Bundle {
    media_type: String,
    verification_material: Material,
    dsse_envelope: Option<Envelope>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Material {
    certificate: Option<RawBytes>,
    x509_certificate_chain: Option<Chain>,
    #[serde(default)]
    tlog_entries: Vec<TlogEntry>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawBytes {
    raw_bytes: String,
}

#[derive(Deserialize)]
struct Chain {
    certificates: Vec<RawBytes>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TlogEntry {
    log_index: serde_json::Value,
    log_id: KeyId,
    integrated_time: serde_json::Value,
    inclusion_promise: Option<Promise>,
    canonicalized_body: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct KeyId {
    key_id: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Promise {
    signed_entry_timestamp: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Envelope {
    payload: String,
    payload_type: String,
    signatures: Vec<EnvelopeSignature>,
}

#[derive(Deserialize)]
struct EnvelopeSignature {
    sig: String,
}

/// The first identity of `identities` one of `bundles` (JSON) proves for
/// manifest `digest`; why each failed otherwise.
///
/// # Errors
/// What each bundle failed on.
pub fn verify(bundles: &[Vec<u8>], digest: &str, identities: &[Identity]) -> Result<Verified, Vec<String>> {
    let mut why = Vec::new();
    for bundle in bundles {
        match verify_one(bundle, digest, identities) {
            Ok(found) => return Ok(found),
            Err(e) => why.push(format!("a sigstore bundle {e}")),
        }
    }
    Err(why)
}

fn verify_one(bundle: &[u8], digest: &str, identities: &[Identity]) -> Result<Verified, String> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let bundle: Bundle = serde_json::from_slice(bundle).map_err(|e| format!("that cannot be read: {e}"))?;
    if !bundle.media_type.starts_with(MEDIA_TYPE_PREFIX) {
        return Err(format!("of media type `{}`", bundle.media_type));
    }
    let material = bundle.verification_material;
    let leaf = material.certificate.or_else(|| material.x509_certificate_chain.and_then(|c| c.certificates.into_iter().next()));
    let leaf = leaf.ok_or("without a signing certificate (a bundle signed with a key, not keyless)")?;
    let leaf = CertificateDer::from(b64.decode(&leaf.raw_bytes).map_err(|_| "whose certificate is not base64")?);
    let envelope = bundle.dsse_envelope.ok_or("without a DSSE envelope (a message signature is not how cosign signs an image)")?;
    let payload = b64.decode(&envelope.payload).map_err(|_| "whose statement is not base64")?;
    states_signature_of(&envelope.payload_type, &payload, digest)?;
    let signature = envelope.signatures.first().ok_or("whose envelope holds no signature")?;
    let signature = b64.decode(&signature.sig).map_err(|_| "whose signature is not base64")?;
    let entry = material.tlog_entries.into_iter().next().ok_or("without a transparency log entry (its time cannot be proven offline)")?;
    let set = entry.inclusion_promise.ok_or("without the log's signed entry timestamp (an inclusion proof alone is not verified yet)")?;
    let number = |v: &serde_json::Value| v.as_u64().or_else(|| v.as_str().and_then(|s| s.parse().ok()));
    let logged = LoggedEntry {
        body: entry.canonicalized_body,
        integrated_time: number(&entry.integrated_time).ok_or("whose log time is not a number")?,
        log_index: number(&entry.log_index).ok_or("whose log index is not a number")?,
        log_id: hex::encode(b64.decode(&entry.log_id.key_id).map_err(|_| "whose log id is not base64")?),
    };
    let message = pae(&envelope.payload_type, &payload);
    let check = |body: &serde_json::Value| logged_is(body, (&leaf, &payload, &signature));
    identify(identities, &logged, &set.signed_entry_timestamp, &Signed { leaf: &leaf, message: &message, signature: &signature, logged: &check })
}

/// Checks that the statement is cosign's signature of manifest `digest`.
fn states_signature_of(payload_type: &str, payload: &[u8], digest: &str) -> Result<(), String> {
    if payload_type != IN_TOTO {
        return Err(format!("whose envelope holds `{payload_type}`, not an in-toto statement"));
    }
    let statement: serde_json::Value = serde_json::from_slice(payload).map_err(|_| "whose statement is not JSON")?;
    if statement["predicateType"] != SIGN_PREDICATE {
        return Err(format!("whose statement is a {} (not cosign's signature, {SIGN_PREDICATE})", statement["predicateType"]));
    }
    let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
    let subjects = statement["subject"].as_array().map(Vec::as_slice).unwrap_or_default();
    if subjects.iter().any(|s| s["digest"]["sha256"] == hex) { Ok(()) } else { Err("whose statement names another manifest".into()) }
}

/// DSSE's pre-authentication encoding: what the signature is over.
fn pae(payload_type: &str, payload: &[u8]) -> Vec<u8> {
    let mut message = format!("DSSEv1 {} {payload_type} {} ", payload_type.len(), payload.len()).into_bytes();
    message.extend_from_slice(payload);
    message
}

/// Checks that the logged entry (a `dsse` one) is this envelope's
/// signature, by this certificate, over this statement.
fn logged_is(body: &serde_json::Value, (leaf, payload, signature): (&CertificateDer<'_>, &[u8], &[u8])) -> Result<(), String> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let spec = &body["spec"];
    if body["kind"] != "dsse" || spec["payloadHash"]["value"] != hex::encode(Sha256::digest(payload)).as_str() {
        return Err("whose log entry is over another statement".into());
    }
    let signatures = spec["signatures"].as_array().map(Vec::as_slice).unwrap_or_default();
    let this = signatures.iter().any(|s| {
        let sig = s["signature"].as_str().and_then(|v| b64.decode(v).ok());
        let verifier = s["verifier"].as_str().and_then(|v| b64.decode(v).ok()).unwrap_or_default();
        sig.as_deref() == Some(signature) && same_certificate(&verifier, leaf)
    });
    if this { Ok(()) } else { Err("whose log entry is another signature or certificate".into()) }
}
