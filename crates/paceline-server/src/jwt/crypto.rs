//! `jsonwebtoken`'s cryptography on `ring`.
//!
//! Why: `jsonwebtoken` 10 leaves its backend to the program (`aws-lc-rs`,
//! which needs cmake, or a set of RustCrypto crates); `ring` is in the
//! workspace already (rustls runs on it), so one provider serves TLS and
//! tokens alike. The provider answers for every algorithm `jsonwebtoken`
//! names: HMAC (`HS256`/`384`/`512`), RSA PKCS#1 v1.5 and PSS
//! (`RS256`.., `PS256`.., keys of 2048 to 8192 bits), ECDSA (`ES256`,
//! `ES384`) and `EdDSA` (Ed25519). Signing is there for tests and tools
//! that make tokens (PKCS#8 keys for ECDSA and Ed25519, PKCS#8 or PKCS#1
//! DER for RSA).

use jsonwebtoken::crypto::{CryptoProvider, JwkUtils, JwtSigner, JwtVerifier};
use jsonwebtoken::errors::{Error, ErrorKind};
use jsonwebtoken::jwk::ThumbprintHash;
use jsonwebtoken::signature::{self, Signer, Verifier};
use jsonwebtoken::{Algorithm, AlgorithmFamily, DecodingKey, DecodingKeyKind, EncodingKey};
use ring::signature as rs;

/// The provider: [`install`] makes it `jsonwebtoken`'s process default.
static RING: CryptoProvider = CryptoProvider {
    signer_factory: new_signer,
    verifier_factory: new_verifier,
    jwk_utils: JwkUtils {
        extract_rsa_public_key_components: |_| Err(unsupported()),
        extract_ec_public_key_coordinates: |_, _| Err(unsupported()),
        compute_digest,
    },
};

/// Installs the `ring` provider as `jsonwebtoken`'s process-wide default,
/// once. A program that installed another provider before keeps its
/// own (the first install wins): tokens are then verified by that one.
pub(crate) fn install() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = RING.install_default();
    });
}

fn unsupported() -> Error {
    ErrorKind::Provider("not supported by paceline's ring provider".into()).into()
}

fn compute_digest(data: &[u8], hash: ThumbprintHash) -> Vec<u8> {
    let alg = match hash {
        ThumbprintHash::SHA256 => &ring::digest::SHA256,
        ThumbprintHash::SHA384 => &ring::digest::SHA384,
        ThumbprintHash::SHA512 => &ring::digest::SHA512,
    };
    ring::digest::digest(alg, data).as_ref().to_vec()
}

/// The public-key verification algorithm of `alg` (none for HMAC).
fn public_alg(alg: Algorithm) -> Option<&'static dyn rs::VerificationAlgorithm> {
    if let Some(rsa) = rsa_params(alg) {
        return Some(rsa);
    }
    Some(match alg {
        Algorithm::ES256 => &rs::ECDSA_P256_SHA256_FIXED,
        Algorithm::ES384 => &rs::ECDSA_P384_SHA384_FIXED,
        Algorithm::EdDSA => &rs::ED25519,
        _ => return None,
    })
}

fn hmac_alg(alg: Algorithm) -> Option<ring::hmac::Algorithm> {
    match alg {
        Algorithm::HS256 => Some(ring::hmac::HMAC_SHA256),
        Algorithm::HS384 => Some(ring::hmac::HMAC_SHA384),
        Algorithm::HS512 => Some(ring::hmac::HMAC_SHA512),
        _ => None,
    }
}

fn family(alg: Algorithm) -> AlgorithmFamily {
    match alg {
        Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512 => AlgorithmFamily::Hmac,
        Algorithm::ES256 | Algorithm::ES384 => AlgorithmFamily::Ec,
        Algorithm::EdDSA => AlgorithmFamily::Ed,
        _ => AlgorithmFamily::Rsa,
    }
}

/// Verifies one algorithm with one key.
enum Verify {
    Hmac(Algorithm, ring::hmac::Key),
    Public(Algorithm, &'static dyn rs::VerificationAlgorithm, Vec<u8>),
    RsaParts(Algorithm, &'static rs::RsaParameters, Vec<u8>, Vec<u8>),
}

impl Verifier<Vec<u8>> for Verify {
    fn verify(&self, msg: &[u8], sig: &Vec<u8>) -> Result<(), signature::Error> {
        let ok = match self {
            Verify::Hmac(_, key) => ring::hmac::verify(key, msg, sig).is_ok(),
            Verify::Public(_, alg, der) => rs::UnparsedPublicKey::new(*alg, der)
                .verify(msg, sig)
                .is_ok(),
            Verify::RsaParts(_, params, n, e) => rs::RsaPublicKeyComponents { n, e }
                .verify(params, msg, sig)
                .is_ok(),
        };
        match ok {
            true => Ok(()),
            false => Err(signature::Error::new()),
        }
    }
}

impl JwtVerifier for Verify {
    fn algorithm(&self) -> Algorithm {
        match self {
            Verify::Hmac(a, _) | Verify::Public(a, _, _) | Verify::RsaParts(a, _, _, _) => *a,
        }
    }
}

/// The RSA parameters of `alg`, for a key given as its modulus and
/// exponent.
fn rsa_params(alg: Algorithm) -> Option<&'static rs::RsaParameters> {
    Some(match alg {
        Algorithm::RS256 => &rs::RSA_PKCS1_2048_8192_SHA256,
        Algorithm::RS384 => &rs::RSA_PKCS1_2048_8192_SHA384,
        Algorithm::RS512 => &rs::RSA_PKCS1_2048_8192_SHA512,
        Algorithm::PS256 => &rs::RSA_PSS_2048_8192_SHA256,
        Algorithm::PS384 => &rs::RSA_PSS_2048_8192_SHA384,
        Algorithm::PS512 => &rs::RSA_PSS_2048_8192_SHA512,
        _ => return None,
    })
}

fn new_verifier(alg: &Algorithm, key: &DecodingKey) -> Result<Box<dyn JwtVerifier>, Error> {
    let alg = *alg;
    if key.family() != family(alg) {
        return Err(ErrorKind::InvalidAlgorithm.into());
    }
    if let Some(h) = hmac_alg(alg) {
        let secret = key.try_get_hmac_secret()?;
        return Ok(Box::new(Verify::Hmac(alg, ring::hmac::Key::new(h, secret))));
    }
    Ok(Box::new(match key.kind() {
        DecodingKeyKind::SecretOrDer(der) => {
            let public = public_alg(alg).ok_or_else(unsupported)?;
            Verify::Public(alg, public, der.clone())
        }
        DecodingKeyKind::RsaModulusExponent { n, e } => {
            let params = rsa_params(alg).ok_or_else(unsupported)?;
            Verify::RsaParts(alg, params, n.clone(), e.clone())
        }
    }))
}

/// Signs one algorithm with one key.
enum Sign {
    Hmac(Algorithm, ring::hmac::Key),
    Ecdsa(Algorithm, rs::EcdsaKeyPair),
    Ed(rs::Ed25519KeyPair),
    Rsa(
        Algorithm,
        &'static dyn rs::RsaEncoding,
        std::sync::Arc<rs::RsaKeyPair>,
    ),
}

impl Signer<Vec<u8>> for Sign {
    fn try_sign(&self, msg: &[u8]) -> Result<Vec<u8>, signature::Error> {
        let rng = ring::rand::SystemRandom::new();
        match self {
            Sign::Hmac(_, key) => Ok(ring::hmac::sign(key, msg).as_ref().to_vec()),
            Sign::Ecdsa(_, pair) => pair
                .sign(&rng, msg)
                .map(|s| s.as_ref().to_vec())
                .map_err(|_| signature::Error::new()),
            Sign::Ed(pair) => Ok(pair.sign(msg).as_ref().to_vec()),
            Sign::Rsa(_, enc, pair) => {
                let mut sig = vec![0; pair.public().modulus_len()];
                pair.sign(*enc, &rng, msg, &mut sig)
                    .map_err(|_| signature::Error::new())?;
                Ok(sig)
            }
        }
    }
}

impl JwtSigner for Sign {
    fn algorithm(&self) -> Algorithm {
        match self {
            Sign::Hmac(a, _) | Sign::Ecdsa(a, _) | Sign::Rsa(a, _, _) => *a,
            Sign::Ed(_) => Algorithm::EdDSA,
        }
    }
}

fn new_signer(alg: &Algorithm, key: &EncodingKey) -> Result<Box<dyn JwtSigner>, Error> {
    let alg = *alg;
    if key.family() != family(alg) {
        return Err(ErrorKind::InvalidAlgorithm.into());
    }
    if let Some(h) = hmac_alg(alg) {
        let secret = key.try_get_hmac_secret()?;
        return Ok(Box::new(Sign::Hmac(alg, ring::hmac::Key::new(h, secret))));
    }
    let der = key.inner();
    let rng = ring::rand::SystemRandom::new();
    let signer = match alg {
        Algorithm::ES256 | Algorithm::ES384 => {
            let fixed = match alg {
                Algorithm::ES256 => &rs::ECDSA_P256_SHA256_FIXED_SIGNING,
                _ => &rs::ECDSA_P384_SHA384_FIXED_SIGNING,
            };
            let pair = rs::EcdsaKeyPair::from_pkcs8(fixed, der, &rng)
                .map_err(|_| Error::from(ErrorKind::InvalidEcdsaKey))?;
            Sign::Ecdsa(alg, pair)
        }
        Algorithm::EdDSA => Sign::Ed(
            rs::Ed25519KeyPair::from_pkcs8_maybe_unchecked(der)
                .map_err(|_| Error::from(ErrorKind::InvalidEddsaKey))?,
        ),
        _ => {
            let enc: &'static dyn rs::RsaEncoding = match alg {
                Algorithm::RS256 => &rs::RSA_PKCS1_SHA256,
                Algorithm::RS384 => &rs::RSA_PKCS1_SHA384,
                Algorithm::RS512 => &rs::RSA_PKCS1_SHA512,
                Algorithm::PS256 => &rs::RSA_PSS_SHA256,
                Algorithm::PS384 => &rs::RSA_PSS_SHA384,
                _ => &rs::RSA_PSS_SHA512,
            };
            let pair = rs::RsaKeyPair::from_pkcs8(der)
                .or_else(|_| rs::RsaKeyPair::from_der(der))
                .map_err(|e| Error::from(ErrorKind::InvalidRsaKey(e.to_string())))?;
            Sign::Rsa(alg, enc, std::sync::Arc::new(pair))
        }
    };
    Ok(Box::new(signer))
}
