//! The HTTP client of each downstream, built once at start from the
//! reviewer's network policy ([`crate::policy::TlsPolicy`], the proxy):
//! rustls with the platform's verifier (plus the reviewer's CAs) or only the
//! reviewer's CAs, a client certificate for mutual TLS, SPKI pins checked
//! after normal verification, a minimum version; redirects never followed;
//! a proxy only where the policy names one, never from the environment.

use crate::policy::Downstream;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use sha2::{Digest as _, Sha256};
use std::sync::Arc;

/// The client for requests to `d`.
///
/// # Errors
/// A CA file, client certificate or key cannot be read or used, or a proxy
/// URL cannot be used: the host refuses to start.
pub fn client(d: &Downstream) -> Result<reqwest::Client, String> {
    let builder = reqwest::Client::builder()
        // A redirect could lead outside the grants; the plugin sees the 3xx instead.
        .redirect(reqwest::redirect::Policy::none());
    let builder = match &d.proxy {
        Some(proxy) => builder.proxy(reqwest::Proxy::all(proxy.as_str()).map_err(|e| format!("proxy {proxy}: {e}"))?),
        None => builder.no_proxy(),
    };
    let label = format!("downstream `{}`", d.name);
    let builder = if d.origin.scheme() == "https" { builder.tls_backend_preconfigured(rustls_config(&d.tls, &label)?) } else { builder };
    builder.build().map_err(|e| format!("cannot build the HTTP client of {label}: {e}"))
}

/// The rustls configuration `tls` describes, for what `label` names in errors.
///
/// # Errors
/// A CA file, client certificate or key cannot be read or used.
pub fn rustls_config(tls: &crate::policy::TlsPolicy, label: &str) -> Result<rustls::ClientConfig, String> {
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
