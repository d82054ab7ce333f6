//! A sigstore trusted root (`trusted_root.json`, the format sigstore's
//! clients ship and a private deployment publishes): the certificate
//! authorities that issue keyless signing certificates (Fulcio) and the
//! transparency logs whose signed entry timestamps prove when a signature
//! was made (Rekor), each with the time it may be trusted for. The host
//! verifies keyless signatures against it alone, offline.

use base64::Engine as _;
use serde::Deserialize;

/// A certificate authority: its chain (the issuing certificate first, the
/// root last, DER) and when it may issue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authority {
    /// The chain, DER, issuing certificate first and root last.
    pub chain: Vec<Vec<u8>>,
    /// From when, and until when, it is trusted (Unix seconds).
    pub valid: Validity,
}

/// A transparency log: its key and when it is trusted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Log {
    /// Its log id: sha256 of its key's SubjectPublicKeyInfo (DER).
    pub id: Vec<u8>,
    /// Its public key, SubjectPublicKeyInfo DER.
    pub key: Vec<u8>,
    /// From when, and until when, its timestamps are trusted.
    pub valid: Validity,
}

/// When something in a trusted root may be trusted (Unix seconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Validity {
    /// The first second.
    pub start: u64,
    /// The last second, if it ends.
    pub end: Option<u64>,
}

impl Validity {
    /// Whether `at` (Unix seconds) is within it.
    pub fn covers(&self, at: u64) -> bool {
        at >= self.start && self.end.is_none_or(|end| at <= end)
    }
}

/// The authorities and logs an operator trusts for keyless signatures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrustedRoot {
    /// Where it was read from (for messages).
    pub source: String,
    /// The certificate authorities.
    pub authorities: Vec<Authority>,
    /// The transparency logs.
    pub logs: Vec<Log>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawRoot {
    #[serde(default)]
    tlogs: Vec<RawLog>,
    #[serde(default)]
    certificate_authorities: Vec<RawAuthority>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawLog {
    public_key: RawKey,
    log_id: RawLogId,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawKey {
    raw_bytes: String,
    valid_for: Option<RawValidity>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawLogId {
    key_id: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawAuthority {
    cert_chain: RawChain,
    valid_for: Option<RawValidity>,
}

#[derive(Deserialize)]
struct RawChain {
    certificates: Vec<RawCert>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawCert {
    raw_bytes: String,
}

#[derive(Deserialize)]
struct RawValidity {
    start: Option<String>,
    end: Option<String>,
}

impl TrustedRoot {
    /// Reads a trusted root; `source` names it in messages.
    ///
    /// # Errors
    /// Not a trusted root: what is wrong, and where.
    pub fn parse(source: &str, json: &[u8]) -> Result<Self, String> {
        let raw: RawRoot = serde_json::from_slice(json).map_err(|e| format!("{source}: not a sigstore trusted root: {e}"))?;
        let b64 = |what: &str, s: &str| base64::engine::general_purpose::STANDARD.decode(s).map_err(|e| format!("{source}: {what} is not base64: {e}"));
        let mut logs = Vec::new();
        for (i, log) in raw.tlogs.into_iter().enumerate() {
            let valid = validity(source, log.public_key.valid_for.as_ref())?;
            logs.push(Log {
                id: b64(&format!("tlogs[{i}].logId"), &log.log_id.key_id)?,
                key: b64(&format!("tlogs[{i}].publicKey"), &log.public_key.raw_bytes)?,
                valid,
            });
        }
        let mut authorities = Vec::new();
        for (i, ca) in raw.certificate_authorities.into_iter().enumerate() {
            let chain = ca.cert_chain.certificates.iter().map(|c| b64(&format!("certificateAuthorities[{i}]"), &c.raw_bytes)).collect::<Result<Vec<_>, _>>()?;
            if chain.is_empty() {
                return Err(format!("{source}: certificateAuthorities[{i}] has no certificate"));
            }
            authorities.push(Authority { chain, valid: validity(source, ca.valid_for.as_ref())? });
        }
        if authorities.is_empty() || logs.is_empty() {
            return Err(format!("{source}: a trusted root for keyless signatures needs a certificate authority and a transparency log"));
        }
        Ok(Self { source: source.into(), authorities, logs })
    }

    /// The log whose id is `id`.
    pub fn log(&self, id: &[u8]) -> Option<&Log> {
        self.logs.iter().find(|l| l.id == id)
    }
}

fn validity(source: &str, raw: Option<&RawValidity>) -> Result<Validity, String> {
    let at = |t: &Option<String>| -> Result<Option<u64>, String> {
        t.as_deref()
            .map(|t| {
                let parsed = chrono::DateTime::parse_from_rfc3339(t).map_err(|e| format!("{source}: `{t}` is not an RFC 3339 time: {e}"))?;
                u64::try_from(parsed.timestamp()).map_err(|_| format!("{source}: `{t}` is before 1970"))
            })
            .transpose()
    };
    let raw = raw.ok_or_else(|| format!("{source}: an entry without `validFor`"))?;
    Ok(Validity { start: at(&raw.start)?.unwrap_or(0), end: at(&raw.end)? })
}
