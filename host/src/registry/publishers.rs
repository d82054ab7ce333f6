//! Publisher keys: the public key a reviewer names in `signed_by` (PEM
//! SubjectPublicKeyInfo, as `cosign generate-key-pair` and OpenSSL write
//! it; ECDSA P-256 or Ed25519) and the private key `toolguard sign` signs
//! with (PEM PKCS#8, ECDSA P-256, as `toolguard keygen` writes it).

use base64::Engine as _;
use ring::rand::SystemRandom;
use ring::signature::{self, EcdsaKeyPair, KeyPair as _};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{PrivatePkcs8KeyDer, SubjectPublicKeyInfoDer};
use sha2::{Digest as _, Sha256};
use spki::der::Decode as _;

const EC_PUBLIC_KEY: &str = "1.2.840.10045.2.1";
const P256: &str = "1.2.840.10045.3.1.7";
const ED25519: &str = "1.3.101.112";
/// SubjectPublicKeyInfo of an ECDSA P-256 key, up to the 65-byte point.
const P256_SPKI_PREFIX: [u8; 26] = [
    0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
];

/// A public key a publisher signs with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublisherKey {
    /// How the policy named it (its file).
    pub label: String,
    /// `sha256:` of its SubjectPublicKeyInfo (DER): the key's identity in audits and logs.
    pub fingerprint: String,
    algorithm: Algorithm,
    point: Vec<u8>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Algorithm {
    EcdsaP256,
    Ed25519,
}

impl PublisherKey {
    /// Reads a PEM public key, naming it `label`.
    ///
    /// # Errors
    /// Not a PEM public key, or an algorithm other than ECDSA P-256 and Ed25519.
    pub fn from_pem(label: &str, pem: &[u8]) -> Result<Self, String> {
        let der = SubjectPublicKeyInfoDer::from_pem_slice(pem).map_err(|e| format!("{label}: not a PEM public key (-----BEGIN PUBLIC KEY-----): {e}"))?;
        Self::from_spki_der(label, der.as_ref())
    }

    /// Reads a DER SubjectPublicKeyInfo (a certificate's, a transparency log's), naming it `label`.
    ///
    /// # Errors
    /// Not a SubjectPublicKeyInfo, or an algorithm other than ECDSA P-256 and Ed25519.
    pub fn from_spki_der(label: &str, der: &[u8]) -> Result<Self, String> {
        let info = spki::SubjectPublicKeyInfoRef::from_der(der).map_err(|e| format!("{label}: not a SubjectPublicKeyInfo: {e}"))?;
        let oid = info.algorithm.oid.to_string();
        let parameter = info.algorithm.parameters_oid().map(|o| o.to_string()).ok();
        let algorithm = match (oid.as_str(), parameter.as_deref()) {
            (EC_PUBLIC_KEY, Some(P256)) => Algorithm::EcdsaP256,
            (ED25519, _) => Algorithm::Ed25519,
            _ => {
                return Err(format!(
                    "{label}: a key of algorithm {oid} {}; toolguard verifies ECDSA P-256 (cosign's default) and Ed25519",
                    parameter.unwrap_or_default()
                ));
            }
        };
        let point = info.subject_public_key.raw_bytes().to_vec();
        Ok(Self { label: label.into(), fingerprint: fingerprint_of(der), algorithm, point })
    }

    /// Whether `signature` (DER ECDSA, or raw Ed25519) over `message` is this key's.
    pub fn verifies(&self, message: &[u8], signature: &[u8]) -> bool {
        let algorithm: &dyn signature::VerificationAlgorithm = match self.algorithm {
            Algorithm::EcdsaP256 => &signature::ECDSA_P256_SHA256_ASN1,
            Algorithm::Ed25519 => &signature::ED25519,
        };
        signature::UnparsedPublicKey::new(algorithm, &self.point).verify(message, signature).is_ok()
    }
}

/// A publisher's private key (ECDSA P-256).
pub struct SigningKey {
    pair: EcdsaKeyPair,
}

impl SigningKey {
    /// Reads a PEM PKCS#8 private key.
    ///
    /// # Errors
    /// Not a PEM PKCS#8 ECDSA P-256 key.
    pub fn from_pem(label: &str, pem: &[u8]) -> Result<Self, String> {
        let der = PrivatePkcs8KeyDer::from_pem_slice(pem).map_err(|e| format!("{label}: not a PEM private key (-----BEGIN PRIVATE KEY-----): {e}"))?;
        let pair = EcdsaKeyPair::from_pkcs8(&signature::ECDSA_P256_SHA256_ASN1_SIGNING, der.secret_pkcs8_der(), &SystemRandom::new())
            .map_err(|e| format!("{label}: not an ECDSA P-256 PKCS#8 key: {e}"))?;
        Ok(Self { pair })
    }

    /// A new key pair: (private PEM, public PEM).
    ///
    /// # Errors
    /// The system's random source failed.
    pub fn generate() -> Result<(String, String), String> {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&signature::ECDSA_P256_SHA256_ASN1_SIGNING, &rng).map_err(|e| format!("cannot make a key: {e}"))?;
        let key = Self::from_pem("new key", pem("PRIVATE KEY", pkcs8.as_ref()).as_bytes())?;
        Ok((pem("PRIVATE KEY", pkcs8.as_ref()), key.public_pem()))
    }

    /// Its public key as PEM SubjectPublicKeyInfo.
    pub fn public_pem(&self) -> String {
        pem("PUBLIC KEY", &self.public_der())
    }

    /// Its public key's fingerprint, as [`PublisherKey::fingerprint`] names it.
    pub fn fingerprint(&self) -> String {
        fingerprint_of(&self.public_der())
    }

    fn public_der(&self) -> Vec<u8> {
        let mut der = P256_SPKI_PREFIX.to_vec();
        der.extend_from_slice(self.pair.public_key().as_ref());
        der
    }

    /// An ECDSA P-256 SHA-256 signature (DER) over `message`.
    ///
    /// # Errors
    /// The system's random source failed.
    pub fn sign(&self, message: &[u8]) -> Result<Vec<u8>, String> {
        self.pair.sign(&SystemRandom::new(), message).map(|s| s.as_ref().to_vec()).map_err(|e| format!("cannot sign: {e}"))
    }
}

/// `sha256:` of a SubjectPublicKeyInfo (DER).
fn fingerprint_of(spki_der: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(spki_der)))
}

fn pem(label: &str, der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let lines: Vec<&str> = b64.as_bytes().chunks(64).map(|c| std::str::from_utf8(c).unwrap_or_default()).collect();
    format!("-----BEGIN {label}-----\n{}\n-----END {label}-----\n", lines.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::{PublisherKey, SigningKey};

    #[test]
    fn a_generated_key_signs_what_its_public_key_verifies() {
        let (private, public) = SigningKey::generate().unwrap();
        let key = SigningKey::from_pem("k", private.as_bytes()).unwrap();
        let public_key = PublisherKey::from_pem("k.pub", public.as_bytes()).unwrap();
        let sig = key.sign(b"payload").unwrap();
        assert!(public_key.verifies(b"payload", &sig));
        assert!(!public_key.verifies(b"payloae", &sig));
        let other = PublisherKey::from_pem("o.pub", SigningKey::generate().unwrap().1.as_bytes()).unwrap();
        assert!(!other.verifies(b"payload", &sig));
        assert_ne!(public_key.fingerprint, other.fingerprint);
        assert_eq!(key.fingerprint(), public_key.fingerprint);
    }

    #[test]
    fn keys_of_other_kinds_are_refused_by_name() {
        assert!(PublisherKey::from_pem("x.pub", b"not pem").unwrap_err().contains("x.pub"));
        // An RSA key (SubjectPublicKeyInfo of rsaEncryption).
        let rsa = "-----BEGIN PUBLIC KEY-----\nMIGfMA0GCSqGSIb3DQEBAQUAA4GNADCBiQKBgQDTqCfw2x8UURJroqeEH7Dg0fmD\nqVfU8carkxE9xzI0KY+Kgg7dEZi4tUbczV6BvvsCxVUanxZ4bJjJ1cu/PRRQXv0j\nMXiOAjUqAxmKsVdU9ayf6wvMuSjkxuGTtqjpL9VKrJCBSPPrB1o6kilA1RZ9RM7w\nuohzHFX/Qt8lYaWT1wIDAQAB\n-----END PUBLIC KEY-----\n";
        let e = PublisherKey::from_pem("rsa.pub", rsa.as_bytes()).unwrap_err();
        assert!(e.contains("ECDSA P-256"), "{e}");
    }
}
