//! Keyless signatures, as cosign makes them: no publisher key, but a
//! short-lived certificate a sigstore certificate authority (Fulcio) issued
//! for an identity — an OIDC issuer and a subject (an email, or a CI
//! workflow's URI) — and a transparency log's (Rekor's) signed entry
//! timestamp proving the signature was logged while that certificate was
//! valid. Stored on the signature layer as cosign does: the certificate,
//! the chain and the log's bundle in annotations beside the signature.
//!
//! Verified offline against the operator's trusted root, in this order:
//! the payload names the manifest; the log's timestamp is signed by a log
//! the root names, within its validity; the logged entry is this signature,
//! by this certificate, over these bytes; the certificate chains to an
//! authority of the root valid at the logged time, for code signing; the
//! signature verifies with the certificate's key; and the certificate names
//! an identity the policy lists.

use super::publishers::PublisherKey;
use super::signature::SignatureLayer;
use super::trusted_root::TrustedRoot;
use base64::Engine as _;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, UnixTime};
use sha2::{Digest as _, Sha256};
use std::sync::Arc;
use x509_cert::der::{Decode as _, Encode as _};

/// The annotation holding the signing certificate (PEM).
pub const CERTIFICATE_ANNOTATION: &str = "dev.sigstore.cosign/certificate";
/// The annotation holding the transparency log's bundle (JSON).
pub const BUNDLE_ANNOTATION: &str = "dev.sigstore.cosign/bundle";

/// Extended key usage: code signing (1.3.6.1.5.5.7.3.3), as DER content.
const CODE_SIGNING: &[u8] = &[0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x03, 0x03];
/// Fulcio's OIDC issuer extension, raw (1.3.6.1.4.1.57264.1.1)…
const ISSUER_V1: &str = "1.3.6.1.4.1.57264.1.1";
/// … and as a DER UTF8String (1.3.6.1.4.1.57264.1.8).
const ISSUER_V2: &str = "1.3.6.1.4.1.57264.1.8";
/// Subject alternative name.
const SUBJECT_ALT_NAME: &str = "2.5.29.17";

/// A keyless publisher the policy names: who (issuer and subject), checked
/// against which trusted root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The OIDC issuer, exactly (`https://token.actions.githubusercontent.com`).
    pub issuer: String,
    /// The subject, exactly: an email, or a URI (a workflow's ref).
    pub subject: String,
    /// The trusted root its certificates and timestamps are checked against.
    pub root: Arc<TrustedRoot>,
}

impl Identity {
    /// How audits and errors name it.
    pub fn label(&self) -> String {
        format!("{} from {} (keyless)", self.subject, self.issuer)
    }
}

/// What a verified keyless signature proves: who signed, and the certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// The identity of the policy it matched.
    pub label: String,
    /// `sha256:` of the signing certificate (DER).
    pub fingerprint: String,
}

/// The log's bundle, as cosign stores it.
#[derive(serde::Deserialize)]
struct Bundle {
    #[serde(rename = "SignedEntryTimestamp")]
    signed_entry_timestamp: String,
    #[serde(rename = "Payload")]
    payload: LoggedEntry,
}

/// The first identity of `identities` a keyless signature among `layers`
/// over `digest` verifies for; why each failed otherwise.
///
/// # Errors
/// What each keyless signature failed on (an empty list: none was keyless).
pub fn verify(layers: &[SignatureLayer], digest: &str, identities: &[Identity]) -> Result<Verified, Vec<String>> {
    let mut why = Vec::new();
    for layer in layers.iter().filter(|l| l.certificate.is_some()) {
        match verify_one(layer, digest, identities) {
            Ok(found) => return Ok(found),
            Err(e) => why.push(format!("a keyless signature {e}")),
        }
    }
    Err(why)
}

fn verify_one(layer: &SignatureLayer, digest: &str, identities: &[Identity]) -> Result<Verified, String> {
    super::signature::check_payload(&layer.payload, digest)?;
    let pem = layer.certificate.as_deref().unwrap_or_default();
    let leaf = CertificateDer::from_pem_slice(pem.as_bytes()).map_err(|e| format!("whose certificate is not PEM: {e}"))?;
    let bundle = layer.bundle.as_deref().ok_or("without the transparency log's bundle (its time cannot be proven offline)")?;
    let bundle: Bundle = serde_json::from_str(bundle).map_err(|e| format!("whose log bundle is not cosign's: {e}"))?;
    let signature = base64::engine::general_purpose::STANDARD.decode(layer.signature.trim()).map_err(|_| "whose signature is not base64")?;
    let logged = |body: &serde_json::Value| logged_is(body, (&leaf, &layer.payload, &signature));
    let signed = Signed { leaf: &leaf, message: &layer.payload, signature: &signature, logged: &logged };
    identify(identities, &bundle.payload, &bundle.signed_entry_timestamp, &signed)
}

/// A signature to prove: by the certificate `leaf`, `signature` over
/// `message`; `logged` checks that the log's entry body is this signature.
pub(super) struct Signed<'a> {
    /// The signing certificate (DER).
    pub leaf: &'a CertificateDer<'a>,
    /// The bytes the signature is over.
    pub message: &'a [u8],
    /// The signature.
    pub signature: &'a [u8],
    /// Whether the log's entry body (JSON) records this signature.
    pub logged: &'a dyn Fn(&serde_json::Value) -> Result<(), String>,
}

/// The entry a transparency log signed a timestamp for.
#[derive(serde::Deserialize, serde::Serialize)]
pub(super) struct LoggedEntry {
    /// The entry's body, base64 JSON.
    pub body: String,
    /// When the log integrated it (Unix seconds).
    #[serde(rename = "integratedTime")]
    pub integrated_time: u64,
    /// Its index in the log.
    #[serde(rename = "logIndex")]
    pub log_index: u64,
    /// The log's id, hex.
    #[serde(rename = "logID")]
    pub log_id: String,
}

/// The identity of `identities` that `signed`, logged as `entry` with the
/// log's signed entry timestamp `set` (base64), proves; else why not.
pub(super) fn identify(identities: &[Identity], entry: &LoggedEntry, set: &str, signed: &Signed<'_>) -> Result<Verified, String> {
    let mut tried = Vec::new();
    let mut roots: Vec<&Arc<TrustedRoot>> = identities.iter().map(|i| &i.root).collect();
    roots.dedup_by(|a, b| Arc::ptr_eq(a, b));
    for root in roots {
        match proven(root, entry, set, signed) {
            Ok(names) => {
                let found = identities.iter().filter(|i| Arc::ptr_eq(&i.root, root)).find(|i| names.matches(i));
                return match found {
                    Some(identity) => {
                        Ok(Verified { label: identity.label(), fingerprint: format!("sha256:{}", hex::encode(Sha256::digest(signed.leaf.as_ref()))) })
                    }
                    None => Err(format!("by {}, whom the policy does not name", names.describe())),
                };
            }
            Err(e) => tried.push(e),
        }
    }
    Err(tried.join("; "))
}

/// Checks everything but the identity against `root`: the log's timestamp,
/// that the entry is this signature, the chain at the logged time, the
/// signature itself. Answers the names the certificate vouches for.
fn proven(root: &TrustedRoot, entry: &LoggedEntry, set: &str, signed: &Signed<'_>) -> Result<Names, String> {
    let log_id = hex::decode(&entry.log_id).map_err(|_| "whose log id is not hex")?;
    let log = root.log(&log_id).ok_or_else(|| format!("logged by a transparency log {} does not name ({})", root.source, entry.log_id))?;
    if !log.valid.covers(entry.integrated_time) {
        return Err(format!("logged at {} s, outside the time {} trusts its log for", entry.integrated_time, root.source));
    }
    let canonical = serde_json_canonicalizer::to_vec(entry).map_err(|e| e.to_string())?;
    let set = base64::engine::general_purpose::STANDARD.decode(set).map_err(|_| "whose log timestamp is not base64")?;
    let log_key = PublisherKey::from_spki_der("the log's key", &log.key)?;
    if !log_key.verifies(&canonical, &set) {
        return Err("whose log timestamp is not signed by the log (forged or damaged)".into());
    }
    let body = base64::engine::general_purpose::STANDARD.decode(&entry.body).ok().and_then(|b| serde_json::from_slice(&b).ok());
    (signed.logged)(&body.ok_or("whose log entry cannot be read")?)?;
    chains(root, signed.leaf, entry.integrated_time)?;
    let cert = x509_cert::Certificate::from_der(signed.leaf.as_ref()).map_err(|e| format!("whose certificate cannot be read: {e}"))?;
    let spki = cert.tbs_certificate.subject_public_key_info.to_der().map_err(|e| e.to_string())?;
    if !PublisherKey::from_spki_der("the certificate's key", &spki)?.verifies(signed.message, signed.signature) {
        return Err("that does not verify with its certificate's key (over other bytes?)".into());
    }
    Names::of(&cert)
}

/// Checks that the logged entry (a `hashedrekord` or `rekord`) is this
/// signature, by this certificate, over these bytes.
fn logged_is(body: &serde_json::Value, (leaf, payload, signature): (&CertificateDer<'_>, &[u8], &[u8])) -> Result<(), String> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let spec = &body["spec"];
    let hash = spec["data"]["hash"]["value"].as_str().unwrap_or_default();
    let logged_signature = spec["signature"]["content"].as_str().and_then(|s| b64.decode(s).ok()).unwrap_or_default();
    let logged_cert = spec["signature"]["publicKey"]["content"].as_str().and_then(|s| b64.decode(s).ok()).unwrap_or_default();
    if hash != hex::encode(Sha256::digest(payload)) {
        return Err("whose log entry is over other bytes".into());
    }
    if logged_signature != signature || !same_certificate(&logged_cert, leaf) {
        return Err("whose log entry is another signature or certificate".into());
    }
    Ok(())
}

/// Whether `pem` (as a log entry holds it) is the certificate `leaf`.
pub(super) fn same_certificate(pem: &[u8], leaf: &CertificateDer<'_>) -> bool {
    CertificateDer::from_pem_slice(pem).is_ok_and(|c| c.as_ref() == leaf.as_ref())
}

/// Checks that `leaf` chains, for code signing, to an authority of `root`
/// trusted at `at` (the logged time: the certificate lives minutes).
fn chains(root: &TrustedRoot, leaf: &CertificateDer<'_>, at: u64) -> Result<(), String> {
    let end_entity = webpki::EndEntityCert::try_from(leaf).map_err(|e| format!("whose certificate cannot be read: {e:?}"))?;
    let algorithms = [
        webpki::ring::ECDSA_P256_SHA256,
        webpki::ring::ECDSA_P256_SHA384,
        webpki::ring::ECDSA_P384_SHA256,
        webpki::ring::ECDSA_P384_SHA384,
        webpki::ring::ED25519,
    ];
    let time = UnixTime::since_unix_epoch(std::time::Duration::from_secs(at));
    let mut why = Vec::new();
    for authority in root.authorities.iter().filter(|a| a.valid.covers(at)) {
        let certs: Vec<CertificateDer<'_>> = authority.chain.iter().map(|c| CertificateDer::from(c.as_slice())).collect();
        let Some((top, intermediates)) = certs.split_last() else { continue };
        let anchor = match webpki::anchor_from_trusted_cert(top) {
            Ok(anchor) => anchor,
            Err(e) => {
                why.push(format!("{e:?}"));
                continue;
            }
        };
        match end_entity.verify_for_usage(&algorithms, &[anchor], intermediates, time, webpki::KeyUsage::required(CODE_SIGNING), None, None) {
            Ok(_) => return Ok(()),
            Err(e) => why.push(format!("{e:?}")),
        }
    }
    if why.is_empty() {
        return Err(format!("logged at {at} s, when no certificate authority of {} was trusted", root.source));
    }
    Err(format!("whose certificate does not chain to a certificate authority of {} at the logged time ({})", root.source, why.join(", ")))
}

/// What a signing certificate names: its subjects and its OIDC issuer.
struct Names {
    subjects: Vec<String>,
    issuer: Option<String>,
}

impl Names {
    fn of(cert: &x509_cert::Certificate) -> Result<Self, String> {
        let mut names = Self { subjects: Vec::new(), issuer: None };
        for ext in cert.tbs_certificate.extensions.iter().flatten() {
            let value = ext.extn_value.as_bytes();
            match ext.extn_id.to_string().as_str() {
                SUBJECT_ALT_NAME => {
                    let san = x509_cert::ext::pkix::SubjectAltName::from_der(value).map_err(|e| format!("whose subject names cannot be read: {e}"))?;
                    for name in san.0 {
                        match name {
                            x509_cert::ext::pkix::name::GeneralName::Rfc822Name(n) => names.subjects.push(n.to_string()),
                            x509_cert::ext::pkix::name::GeneralName::UniformResourceIdentifier(n) => names.subjects.push(n.to_string()),
                            _ => {}
                        }
                    }
                }
                ISSUER_V2 => names.issuer = Some(x509_cert::der::asn1::Utf8StringRef::from_der(value).map_err(|e| e.to_string())?.as_str().to_string()),
                ISSUER_V1 if names.issuer.is_none() => names.issuer = Some(String::from_utf8_lossy(value).into_owned()),
                _ => {}
            }
        }
        Ok(names)
    }

    fn matches(&self, identity: &Identity) -> bool {
        self.issuer.as_deref() == Some(identity.issuer.as_str()) && self.subjects.contains(&identity.subject)
    }

    fn describe(&self) -> String {
        let issuer = self.issuer.as_deref().unwrap_or("no OIDC issuer (a certificate older than Fulcio's issuer extension)");
        format!("{} from {issuer}", if self.subjects.is_empty() { "no subject".to_string() } else { self.subjects.join(", ") })
    }
}
