//! The audit of a registry component: where it was pulled from, what the
//! tag resolved to (and whether it moved), when this host pulled it, and
//! who signed it — or why no signature vouches for it.

use crate::config::PluginConfig;
use crate::registry::Fetched;
use crate::runtime::source::{self, Provenance};
use serde::Serialize;

/// A registry component's provenance, as the audit reports it.
#[derive(Debug, Clone, Serialize)]
pub struct RegistryReport {
    /// The `oci://` reference as configured.
    pub reference: String,
    /// `host[:port]`.
    pub registry: String,
    /// The repository.
    pub repository: String,
    /// The tag, if the reference names one.
    pub tag: Option<String>,
    /// The manifest digest the reference resolved to.
    pub manifest_digest: String,
    /// When this host's cache stored it (RFC 3339, UTC).
    pub pulled: String,
    /// Why the cache answered instead of the registry, if it did.
    pub from_cache: Option<String>,
    /// The manifest the tag resolved to before it moved, if it did.
    pub moved_from: Option<String>,
    /// Who vouches for it.
    pub signature: SignatureReport,
}

/// The signature check of a registry component.
#[derive(Debug, Clone, Serialize)]
pub struct SignatureReport {
    /// `verified`, `unverified` (the policy names publishers and none
    /// signed these bytes), or `not-required` (no `signed_by`).
    pub status: &'static str,
    /// The key whose signature verified.
    pub signer: Option<String>,
    /// Its fingerprint (`sha256:` of its SubjectPublicKeyInfo).
    pub fingerprint: Option<String>,
    /// The publishers the policy names, as `file (fingerprint)`.
    pub expected: Vec<String>,
}

/// The report of a pulled component, and the provenance to load it with if
/// its signature admits it; a refusal goes to `reasons`.
pub(super) fn report(plugin: &PluginConfig, fetched: &Fetched, reasons: &mut Vec<String>) -> (RegistryReport, Option<Provenance>) {
    let expected = plugin.policy.publishers();
    // The pin is reported on its own; here only the signature decides.
    let (provenance, status) = match source::vouch(plugin, fetched.clone()) {
        Ok(p) => {
            let status = if p.signer.is_some() { "verified" } else { "not-required" };
            (Some(p), status)
        }
        Err(e) => {
            reasons.push(e.to_string());
            (None, "unverified")
        }
    };
    let signer = provenance.as_ref().and_then(|p| p.signer.clone());
    let r = &fetched.reference;
    let report = RegistryReport {
        reference: r.to_string(),
        registry: r.registry.clone(),
        repository: r.repository.clone(),
        tag: r.tag.clone(),
        manifest_digest: fetched.manifest_digest.clone(),
        pulled: rfc3339(fetched.pulled_ms),
        from_cache: fetched.offline.clone(),
        moved_from: fetched.moved_from.clone(),
        signature: SignatureReport { status, signer: signer.as_ref().map(|s| s.key.clone()), fingerprint: signer.map(|s| s.fingerprint), expected },
    };
    (report, provenance)
}

fn rfc3339(ms: u64) -> String {
    let at = chrono::DateTime::from_timestamp_millis(i64::try_from(ms).unwrap_or(i64::MAX)).unwrap_or_default();
    at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}
