//! TLS to the fleet's PostgreSQL, with rustls (no OpenSSL), set the way
//! libpq users know: `sslmode` and `sslrootcert` in the ledger URL.
//!
//! | `sslmode` | What is checked |
//! | --- | --- |
//! | absent, `disable` | no TLS (as before; keep the database on loopback or a private network) |
//! | `prefer`, `require` | encrypted, server not verified (libpq: with `sslrootcert`, `require` verifies as `verify-ca`) |
//! | `verify-ca` | the server's chain against `sslrootcert` (or the platform's roots), not its name |
//! | `verify-full` | the chain and that the certificate names the host of the URL |

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use std::sync::Arc;
use tokio_postgres_rustls::MakeRustlsConnect;

/// How closely the server is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Check {
    None,
    Chain,
    ChainAndName,
}

/// The connection config for `url` (its `sslmode` and `sslrootcert` taken
/// out and applied) and the TLS connector to use with it.
///
/// # Errors
/// An unknown `sslmode`, or a root certificate file that cannot be read.
pub(super) fn config(url: &str) -> Result<(r2d2_postgres::postgres::Config, MakeRustlsConnect), String> {
    let mut parsed = url::Url::parse(url).map_err(|e| format!("not a PostgreSQL URL: {e}"))?;
    let mut mode = None;
    let mut root = None;
    let rest: Vec<(String, String)> = parsed
        .query_pairs()
        .filter_map(|(k, v)| match k.as_ref() {
            "sslmode" => {
                mode = Some(v.into_owned());
                None
            }
            "sslrootcert" => {
                root = Some(v.into_owned());
                None
            }
            _ => Some((k.into_owned(), v.into_owned())),
        })
        .collect();
    parsed.query_pairs_mut().clear().extend_pairs(rest);
    let (tokio_mode, check) = match (mode.as_deref(), root.is_some()) {
        (None | Some("disable"), _) => ("disable", Check::None),
        (Some("prefer"), false) => ("prefer", Check::None),
        (Some("require"), false) => ("require", Check::None),
        (Some("prefer"), true) => ("prefer", Check::Chain),
        (Some("require" | "verify-ca"), _) => ("require", Check::Chain),
        (Some("verify-full"), _) => ("require", Check::ChainAndName),
        (Some(other), _) => return Err(format!("sslmode `{other}`: use disable, prefer, require, verify-ca or verify-full")),
    };
    parsed.query_pairs_mut().append_pair("sslmode", tokio_mode);
    let text = parsed.as_str().trim_end_matches('?').to_string();
    let config: r2d2_postgres::postgres::Config = text.parse().map_err(|e| format!("not a PostgreSQL URL: {e}"))?;
    Ok((config, connector(check, root.as_deref())?))
}

fn connector(check: Check, root: Option<&str>) -> Result<MakeRustlsConnect, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain: Arc<dyn ServerCertVerifier> = match root {
        Some(path) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_file_iter(path).map_err(|e| format!("sslrootcert {path}: {e}"))? {
                roots.add(cert.map_err(|e| format!("sslrootcert {path}: {e}"))?).map_err(|e| format!("sslrootcert {path}: {e}"))?;
            }
            rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone()).build().map_err(|e| e.to_string())?
        }
        None => Arc::new(rustls_platform_verifier::Verifier::new(provider.clone()).map_err(|e| e.to_string())?),
    };
    let verifier: Arc<dyn ServerCertVerifier> = match check {
        Check::ChainAndName => chain,
        Check::Chain => Arc::new(Lenient { chain, names: false }),
        Check::None => Arc::new(Lenient { chain, names: true }),
    };
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Ok(MakeRustlsConnect::new(config))
}

/// What `require` and `verify-ca` accept: everything (`names: true`, the
/// chain unchecked), or a verified chain whatever name it carries.
/// Signatures of the handshake are always checked.
#[derive(Debug)]
struct Lenient {
    chain: Arc<dyn ServerCertVerifier>,
    /// Whether the chain is skipped altogether (`require` without a root).
    names: bool,
}

impl ServerCertVerifier for Lenient {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if self.names {
            return Ok(ServerCertVerified::assertion());
        }
        match self.chain.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
            Err(rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName))
            | Err(rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForNameContext { .. })) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(&self, message: &[u8], cert: &CertificateDer<'_>, dss: &DigitallySignedStruct) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.chain.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(&self, message: &[u8], cert: &CertificateDer<'_>, dss: &DigitallySignedStruct) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.chain.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.chain.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libpq_ssl_settings_are_taken_out_of_the_url_and_applied() {
        let (full, _) = config("postgres://u:pw@db.example:5432/ledger?application_name=tg&sslmode=verify-full").unwrap();
        assert_eq!(full.get_ssl_mode(), r2d2_postgres::postgres::config::SslMode::Require);
        assert_eq!(full.get_application_name(), Some("tg"));
        let (plain, _) = config("postgres://u@localhost/ledger").unwrap();
        assert_eq!(plain.get_ssl_mode(), r2d2_postgres::postgres::config::SslMode::Disable, "no TLS unless asked, as before");
        let refused = |url: &str| config(url).err().unwrap_or_default();
        assert!(refused("postgres://u@localhost/ledger?sslmode=allow").contains("sslmode `allow`"));
        assert!(refused("postgres://u@localhost/ledger?sslmode=verify-full&sslrootcert=/nonexistent.pem").contains("sslrootcert"));
    }
}
