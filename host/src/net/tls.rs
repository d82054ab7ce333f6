//! TLS as a reviewer sets it, for every peer the host talks to ([`TlsPolicy`]:
//! `[policy.downstreams.NAME.tls]`, a registry's, an issuer's, the OTLP
//! collector's), and the rustls configuration it comes to: the platform's
//! verifier (plus the reviewer's CAs) or only the reviewer's CAs, a client
//! certificate for mutual TLS, SPKI pins checked after normal verification,
//! a minimum version.

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use url::Url;

/// Installs the process's rustls crypto provider (ring) once: reqwest
/// needs one even for plain HTTP, and the host uses ring throughout.
pub fn install_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// `[policy.downstreams.NAME.tls]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TlsPolicy {
    /// CA certificates (PEM) to trust for this downstream: beside the
    /// platform's roots, or instead of them with `platform_roots = false`.
    pub ca_file: Option<PathBuf>,
    /// Whether the platform's roots are trusted too (default true).
    #[serde(default = "yes")]
    pub platform_roots: bool,
    /// A client certificate chain (PEM) for mutual TLS…
    pub client_cert_file: Option<PathBuf>,
    /// … and its private key (PEM), from a file or an environment variable.
    /// Read at start, never visible to a plugin.
    pub client_key_file: Option<PathBuf>,
    /// The environment variable holding the client certificate's private key (PEM).
    pub client_key_env: Option<String>,
    /// SHA-256 pins of certificates' SubjectPublicKeyInfo, base64 (an
    /// optional `sha256/` prefix is accepted): a certificate of the chain the
    /// server presents must match one, on top of normal verification.
    #[serde(default)]
    pub spki_sha256: Vec<String>,
    /// The lowest TLS version accepted: `"1.2"` (default) or `"1.3"`.
    pub min_version: Option<String>,
}

fn yes() -> bool {
    true
}

impl Default for TlsPolicy {
    fn default() -> Self {
        Self {
            ca_file: None,
            platform_roots: true,
            client_cert_file: None,
            client_key_file: None,
            client_key_env: None,
            spki_sha256: Vec::new(),
            min_version: None,
        }
    }
}

impl TlsPolicy {
    /// Checks it for a downstream at `origin`, resolving paths against `base`.
    ///
    /// # Errors
    /// `(field, message)` for the first problem, the field under `tls`.
    pub fn checked(mut self, origin: &Url, base: &Path) -> Result<Self, (String, String)> {
        let at = |f: &str| format!("tls.{f}");
        if origin.scheme() != "https" && self != Self::default() {
            return Err(("tls".into(), "TLS settings need an https:// URL".into()));
        }
        let resolve = |p: PathBuf| if p.is_absolute() { p } else { base.join(p) };
        self.ca_file = self.ca_file.map(resolve);
        self.client_cert_file = self.client_cert_file.map(resolve);
        self.client_key_file = self.client_key_file.map(resolve);
        if !self.platform_roots && self.ca_file.is_none() {
            return Err((at("platform_roots"), "without the platform's roots, give `ca_file`: otherwise nothing is trusted".into()));
        }
        let key_given = self.client_key_file.is_some() || self.client_key_env.is_some();
        if self.client_key_file.is_some() && self.client_key_env.is_some() {
            return Err((at("client_key_env"), "give the client key in `client_key_file` or `client_key_env`, not both".into()));
        }
        if self.client_cert_file.is_some() != key_given {
            return Err((at("client_cert_file"), "mutual TLS needs both a client certificate and its key".into()));
        }
        for (i, pin) in self.spki_sha256.iter().enumerate() {
            decode_pin(pin).map_err(|m| (at(&format!("spki_sha256[{i}]")), m))?;
        }
        match self.min_version.as_deref() {
            None | Some("1.2" | "1.3") => {}
            Some(other) => return Err((at("min_version"), format!("`{other}`: use \"1.2\" or \"1.3\""))),
        }
        Ok(self)
    }

    /// The pins, decoded.
    pub fn pins(&self) -> Vec<[u8; 32]> {
        self.spki_sha256.iter().filter_map(|p| decode_pin(p).ok()).collect()
    }

    /// Whether anything differs from the platform's defaults.
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// A pin (`sha256/BASE64` or `BASE64`) as 32 bytes.
fn decode_pin(pin: &str) -> Result<[u8; 32], String> {
    use base64::Engine as _;
    let text = pin.strip_prefix("sha256/").unwrap_or(pin);
    let bytes = base64::engine::general_purpose::STANDARD.decode(text).map_err(|e| format!("`{pin}` is not base64: {e}"))?;
    bytes.try_into().map_err(|_| format!("`{pin}` is not a SHA-256 digest (32 bytes)"))
}

/// The rustls configuration `tls` describes, for what `label` names in errors.
///
/// # Errors
/// A CA file, client certificate or key cannot be read or used.
pub fn rustls_config(tls: &TlsPolicy, label: &str) -> Result<rustls::ClientConfig, String> {
    let fail = |what: &str, e: &dyn std::fmt::Display| format!("{label}: {what}: {e}");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cas: Vec<CertificateDer<'static>> = match &tls.ca_file {
        Some(path) => CertificateDer::pem_file_iter(path)
            .and_then(Iterator::collect)
            .map_err(|e| fail(&format!("cannot read CA certificates from {}", path.display()), &e))?,
        None => Vec::new(),
    };
    if tls.ca_file.is_some() && cas.is_empty() {
        return Err(fail("no CA certificate in `tls.ca_file`", &"empty"));
    }
    let verifier: Arc<dyn ServerCertVerifier> = if tls.platform_roots {
        Arc::new(rustls_platform_verifier::Verifier::new_with_extra_roots(cas, provider.clone()).map_err(|e| fail("the platform's roots", &e))?)
    } else {
        let mut roots = rustls::RootCertStore::empty();
        for ca in cas {
            roots.add(ca).map_err(|e| fail("a CA certificate of `tls.ca_file`", &e))?;
        }
        rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone()).build().map_err(|e| fail("the CA certificates", &e))?
    };
    let pins = tls.pins();
    let verifier: Arc<dyn ServerCertVerifier> = if pins.is_empty() { verifier } else { Arc::new(Pinned { inner: verifier, pins }) };
    let versions: &[&rustls::SupportedProtocolVersion] = match tls.min_version.as_deref() {
        Some("1.3") => &[&rustls::version::TLS13],
        _ => &[&rustls::version::TLS13, &rustls::version::TLS12],
    };
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .map_err(|e| fail("TLS versions", &e))?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    match &tls.client_cert_file {
        None => Ok(builder.with_no_client_auth()),
        Some(cert) => {
            let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
                .and_then(Iterator::collect)
                .map_err(|e| fail(&format!("cannot read the client certificate {}", cert.display()), &e))?;
            let key = match (&tls.client_key_file, &tls.client_key_env) {
                (Some(path), _) => PrivateKeyDer::from_pem_file(path).map_err(|e| fail(&format!("cannot read the client key {}", path.display()), &e))?,
                (None, Some(var)) => {
                    let pem = std::env::var(var).map_err(|_| fail("the client key", &format!("environment variable `{var}` is not set")))?;
                    PrivateKeyDer::from_pem_slice(pem.as_bytes()).map_err(|e| fail(&format!("the client key in `{var}`"), &e))?
                }
                (None, None) => return Err(fail("the client key", &"none given")),
            };
            builder.with_client_auth_cert(chain, key).map_err(|e| fail("the client certificate and key do not fit together", &e))
        }
    }
}

/// Normal verification, then: a certificate of the presented chain must
/// have one of the pinned SubjectPublicKeyInfo digests.
#[derive(Debug)]
struct Pinned {
    inner: Arc<dyn ServerCertVerifier>,
    pins: Vec<[u8; 32]>,
}

impl ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let verified = self.inner.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)?;
        let pinned = std::iter::once(end_entity).chain(intermediates).any(|cert| {
            webpki::EndEntityCert::try_from(cert).is_ok_and(|c| {
                let digest: [u8; 32] = Sha256::digest(c.subject_public_key_info().as_ref()).into();
                self.pins.contains(&digest)
            })
        });
        if !pinned {
            return Err(rustls::Error::General("no certificate of the server's chain has a pinned public key (tls.spki_sha256)".into()));
        }
        Ok(verified)
    }

    fn verify_tls12_signature(&self, message: &[u8], cert: &CertificateDer<'_>, dss: &DigitallySignedStruct) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(&self, message: &[u8], cert: &CertificateDer<'_>, dss: &DigitallySignedStruct) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// The SPKI pin (`sha256/BASE64`) of a certificate, as `tls.spki_sha256` takes it.
///
/// # Errors
/// The bytes are not a certificate.
pub fn spki_pin(cert: &CertificateDer<'_>) -> Result<String, String> {
    use base64::Engine as _;
    let c = webpki::EndEntityCert::try_from(cert).map_err(|e| format!("not a certificate: {e}"))?;
    Ok(format!("sha256/{}", base64::engine::general_purpose::STANDARD.encode(Sha256::digest(c.subject_public_key_info().as_ref()))))
}
