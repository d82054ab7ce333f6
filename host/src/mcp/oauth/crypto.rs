//! jsonwebtoken's signature checks on `ring`, the crypto library rustls
//! already builds: verification only (a resource server never signs), and
//! only the asymmetric algorithms `[mcp.oauth] algorithms` may list.

use jsonwebtoken::crypto::{CryptoProvider, JwtSigner, JwtVerifier, KeyUtils};
use jsonwebtoken::errors::{Error, ErrorKind};
use jsonwebtoken::jwk::{EllipticCurve, ThumbprintHash};
use jsonwebtoken::{Algorithm, AlgorithmFamily, DecodingKey, DecodingKeyKind, EncodingKey};
use ring::signature as sig;

/// The provider, installed once per process before any token is checked.
pub static RING: CryptoProvider = CryptoProvider {
    signer_factory: no_signer,
    verifier_factory: verifier,
    key_utils: KeyUtils {
        rsa_pub_components_from_private_key: |_| Err(unsupported()),
        rsa_pub_components_from_public_key: |_| Err(unsupported()),
        ec_pub_components_from_private_key: |_, _| Err(unsupported()),
        ed_pub_components_from_private_key: |_, _: &EllipticCurve| Err(unsupported()),
        compute_digest: digest,
    },
};

/// Installs [`RING`] as jsonwebtoken's provider (once; later calls do nothing).
pub fn install() {
    let _ = RING.install_default();
}

fn unsupported() -> Error {
    ErrorKind::InvalidKeyFormat.into()
}

fn no_signer(_: &Algorithm, _: &EncodingKey) -> jsonwebtoken::errors::Result<Box<dyn JwtSigner>> {
    Err(ErrorKind::InvalidAlgorithm.into())
}

fn digest(data: &[u8], hash: ThumbprintHash) -> jsonwebtoken::errors::Result<Vec<u8>> {
    let algorithm = match hash {
        ThumbprintHash::SHA256 => &ring::digest::SHA256,
        ThumbprintHash::SHA384 => &ring::digest::SHA384,
        ThumbprintHash::SHA512 => &ring::digest::SHA512,
        _ => return Err(unsupported()),
    };
    Ok(ring::digest::digest(algorithm, data).as_ref().to_vec())
}

/// How one algorithm is checked with ring.
#[derive(Clone, Copy)]
enum Check {
    Rsa(&'static sig::RsaParameters),
    Other(&'static dyn sig::VerificationAlgorithm),
}

struct Verifier {
    algorithm: Algorithm,
    check: Check,
    key: DecodingKey,
}

fn verifier(algorithm: &Algorithm, key: &DecodingKey) -> jsonwebtoken::errors::Result<Box<dyn JwtVerifier>> {
    let (family, check) = match algorithm {
        Algorithm::RS256 => (AlgorithmFamily::Rsa, Check::Rsa(&sig::RSA_PKCS1_2048_8192_SHA256)),
        Algorithm::RS384 => (AlgorithmFamily::Rsa, Check::Rsa(&sig::RSA_PKCS1_2048_8192_SHA384)),
        Algorithm::RS512 => (AlgorithmFamily::Rsa, Check::Rsa(&sig::RSA_PKCS1_2048_8192_SHA512)),
        Algorithm::PS256 => (AlgorithmFamily::Rsa, Check::Rsa(&sig::RSA_PSS_2048_8192_SHA256)),
        Algorithm::PS384 => (AlgorithmFamily::Rsa, Check::Rsa(&sig::RSA_PSS_2048_8192_SHA384)),
        Algorithm::PS512 => (AlgorithmFamily::Rsa, Check::Rsa(&sig::RSA_PSS_2048_8192_SHA512)),
        Algorithm::ES256 => (AlgorithmFamily::Ec, Check::Other(&sig::ECDSA_P256_SHA256_FIXED)),
        Algorithm::ES384 => (AlgorithmFamily::Ec, Check::Other(&sig::ECDSA_P384_SHA384_FIXED)),
        Algorithm::EdDSA => (AlgorithmFamily::Ed, Check::Other(&sig::ED25519)),
        // HMAC: a resource server holds no shared secret, and a public key must never verify a MAC.
        _ => return Err(ErrorKind::InvalidAlgorithm.into()),
    };
    if key.family() != family {
        return Err(ErrorKind::InvalidAlgorithm.into());
    }
    Ok(Box::new(Verifier { algorithm: *algorithm, check, key: key.clone() }))
}

impl jsonwebtoken::signature::Verifier<Vec<u8>> for Verifier {
    fn verify(&self, message: &[u8], signature: &Vec<u8>) -> Result<(), jsonwebtoken::signature::Error> {
        let ok = match (self.check, self.key.kind()) {
            (Check::Rsa(params), DecodingKeyKind::RsaModulusExponent { n, e }) => {
                sig::RsaPublicKeyComponents { n: n.as_slice(), e: e.as_slice() }.verify(params, message, signature).is_ok()
            }
            (Check::Rsa(params), DecodingKeyKind::SecretOrDer(der)) => sig::UnparsedPublicKey::new(params, der).verify(message, signature).is_ok(),
            (Check::Other(algorithm), DecodingKeyKind::SecretOrDer(point)) => sig::UnparsedPublicKey::new(algorithm, point).verify(message, signature).is_ok(),
            (Check::Other(_), DecodingKeyKind::RsaModulusExponent { .. }) => false,
        };
        if ok { Ok(()) } else { Err(jsonwebtoken::signature::Error::new()) }
    }
}

impl JwtVerifier for Verifier {
    fn algorithm(&self) -> Algorithm {
        self.algorithm
    }
}
