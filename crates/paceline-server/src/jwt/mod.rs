//! Identity from JWT bearer tokens (`key = "jwt"`).
//!
//! A request sends `Authorization: Bearer <JWT>`; the limiter verifies its
//! signature (an HMAC secret, or the public keys of a JWKS), checks `exp`
//! and `nbf` against the limiter's own [`Clock`](paceline_core::Clock)
//! (never the system time, so a test on a manual clock decides as a
//! server would), `iss` and `aud` when configured, and counts the request
//! under one claim (`sub` by default) on the plan another claim names.
//! A token that fails any of it is refused with 401 and a problem body
//! saying which ([`TokenError`]); `alg: none` is never accepted, and an
//! algorithm is accepted only when configured and of the key's own kind
//! (an RSA public key never serves as an HMAC secret).
//!
//! ```
//! use paceline_core::{ManualClock, MemoryStore, Plan, Policy};
//! use paceline_server::{Jwt, KeySource, Limits, RateLimiter};
//!
//! let secret = b"a secret of at least thirty-two bytes!";
//! let jwt = Jwt::hmac(secret).unwrap().plan_claim("tier").plan("pro", "gold");
//! let gold = Plan::new("gold", vec![Policy::token_bucket("burst", 100, 1).unwrap()]).unwrap();
//! let free = Plan::new("free", vec![Policy::token_bucket("burst", 10, 1).unwrap()]).unwrap();
//! let limits = Limits::builder()
//!     .plan(gold)
//!     .plan(free)
//!     .key_source(KeySource::Jwt)
//!     .jwt(jwt)
//!     .default_plan("free")
//!     .build()
//!     .unwrap();
//! # let _ = RateLimiter::new(limits, MemoryStore::new(), ManualClock::at_unix_secs(1_790_000_000));
//! ```

pub(crate) mod crypto;

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use jsonwebtoken::jwk::{JwkSet, KeyAlgorithm, PublicKeyUse};
use jsonwebtoken::{Algorithm, AlgorithmFamily, DecodingKey, Validation};
use serde_json::{Map, Value};

/// The fewest bytes of an HMAC secret (RFC 7518 §3.2: at least the hash's
/// own size).
pub const MIN_JWT_SECRET_BYTES: usize = 32;

/// The longest key a token's key claim may hold, in bytes.
pub const MAX_JWT_KEY_BYTES: usize = 256;

/// Why a bearer token is refused (401, the reason in the problem's
/// detail and in `WWW-Authenticate`'s `error_description`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TokenError {
    /// Not a JWT: not three base64url parts, or a header or claims that do
    /// not parse.
    Malformed,
    /// Its `alg` is not accepted (`none`, one not configured, or one not
    /// of its key's kind).
    Algorithm,
    /// It names a key (`kid`) the key set does not hold, or names none
    /// where the set holds several.
    UnknownKey,
    /// Its signature does not verify.
    Signature,
    /// Its `exp` has passed.
    Expired,
    /// Its `nbf` has not come.
    NotYetValid,
    /// It has no `exp` (required unless `require_exp = false`), or a time
    /// claim that is not a number.
    BadTime,
    /// Its `iss` is not the configured issuer.
    Issuer,
    /// Its `aud` does not name the configured audience.
    Audience,
    /// Its key claim is missing, not a string, empty or too long.
    NoKey,
}

impl TokenError {
    /// The reason, as the answer gives it.
    pub fn description(&self) -> &'static str {
        match self {
            TokenError::Malformed => "the token is not a JWT that can be read",
            TokenError::Algorithm => "the token's algorithm is not accepted",
            TokenError::UnknownKey => "the token is signed with a key not in the key set",
            TokenError::Signature => "the token's signature does not verify",
            TokenError::Expired => "the token has expired",
            TokenError::NotYetValid => "the token is not valid yet",
            TokenError::BadTime => "the token has no valid exp (or nbf) claim",
            TokenError::Issuer => "the token's issuer is not accepted",
            TokenError::Audience => "the token is not meant for this audience",
            TokenError::NoKey => "the token does not name its caller",
        }
    }
}

impl fmt::Display for TokenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.description())
    }
}

/// One verification key.
#[derive(Clone)]
struct Key {
    kid: Option<String>,
    key: DecodingKey,
    family: AlgorithmFamily,
    /// The one algorithm the key is for, when its JWK says so.
    alg: Option<Algorithm>,
}

/// How tokens are verified and read: the keys, the accepted algorithms,
/// the claims checked and the claims that name the caller and its plan.
/// Built in code ([`Jwt::hmac`], [`Jwt::jwks`]) or from the `[jwt]` table
/// of a configuration file ([`JwtConfig`](crate::JwtConfig)); handed to
/// [`LimitsBuilder::jwt`](crate::LimitsBuilder::jwt).
#[derive(Clone)]
pub struct Jwt {
    keys: Vec<Key>,
    algorithms: Vec<Algorithm>,
    issuer: Option<String>,
    audience: Option<String>,
    key_claim: String,
    plan_claim: Option<String>,
    plans: BTreeMap<String, String>,
    leeway_s: u64,
    require_exp: bool,
}

impl fmt::Debug for Jwt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // never the secret
        f.debug_struct("Jwt")
            .field("keys", &self.keys.len())
            .field("algorithms", &self.algorithms)
            .field("key_claim", &self.key_claim)
            .field("plan_claim", &self.plan_claim)
            .finish_non_exhaustive()
    }
}

/// The algorithm names a configuration may list.
pub(crate) const ALGORITHMS: &str =
    "HS256, HS384, HS512, RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384 or EdDSA";

fn family(alg: Algorithm) -> AlgorithmFamily {
    match alg {
        Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512 => AlgorithmFamily::Hmac,
        Algorithm::ES256 | Algorithm::ES384 => AlgorithmFamily::Ec,
        Algorithm::EdDSA => AlgorithmFamily::Ed,
        _ => AlgorithmFamily::Rsa,
    }
}

impl Jwt {
    fn with_keys(keys: Vec<Key>, algorithms: Vec<Algorithm>) -> Jwt {
        crypto::install();
        Jwt {
            keys,
            algorithms,
            issuer: None,
            audience: None,
            key_claim: "sub".into(),
            plan_claim: None,
            plans: BTreeMap::new(),
            leeway_s: DEFAULT_LEEWAY_S,
            require_exp: true,
        }
    }

    /// Installs paceline's `ring` provider as `jsonwebtoken`'s process-wide
    /// cryptography (building any [`Jwt`] does it too): call it first to
    /// sign tokens with `jsonwebtoken::encode` in a process that has built
    /// none (a test, a tool that issues tokens). A provider installed
    /// before stays: the first install wins.
    pub fn install_provider() {
        crypto::install();
    }

    /// Tokens signed with an HMAC `secret` (at least
    /// [`MIN_JWT_SECRET_BYTES`]), `HS256` accepted.
    pub fn hmac(secret: &[u8]) -> Result<Jwt, String> {
        if secret.len() < MIN_JWT_SECRET_BYTES {
            return Err(format!(
                "the secret has {} bytes; an HMAC secret needs at least {MIN_JWT_SECRET_BYTES}",
                secret.len()
            ));
        }
        let key = Key {
            kid: None,
            key: DecodingKey::from_secret(secret),
            family: AlgorithmFamily::Hmac,
            alg: None,
        };
        Ok(Jwt::with_keys(vec![key], vec![Algorithm::HS256]))
    }

    /// Tokens signed with a key of the JSON Web Key Set `json` (RFC 7517:
    /// `{"keys": [...]}`), `RS256` and `ES256` accepted. A key whose
    /// `use` is `enc` is left out; a key with an `alg` serves that
    /// algorithm alone.
    pub fn jwks(json: &str) -> Result<Jwt, String> {
        let set: JwkSet =
            serde_json::from_str(json).map_err(|e| format!("not a JSON Web Key Set: {e}"))?;
        let mut keys = Vec::new();
        for (i, jwk) in set.keys.iter().enumerate() {
            if jwk.common.public_key_use == Some(PublicKeyUse::Encryption) {
                continue;
            }
            let alg = match jwk.common.key_algorithm {
                None => None,
                Some(ka) => Some(signing_alg(ka).ok_or_else(|| {
                    format!("keys[{i}]: its alg {ka:?} is not a signature algorithm")
                })?),
            };
            let key = DecodingKey::from_jwk(jwk).map_err(|e| format!("keys[{i}]: {e}"))?;
            let family = key.family();
            if alg.is_some_and(|a| self::family(a) != family) {
                return Err(format!("keys[{i}]: its alg does not fit its kind of key"));
            }
            keys.push(Key {
                kid: jwk.common.key_id.clone(),
                key,
                family,
                alg,
            });
        }
        if keys.is_empty() {
            return Err("the key set holds no signature key".into());
        }
        Ok(Jwt::with_keys(
            keys,
            vec![Algorithm::RS256, Algorithm::ES256],
        ))
    }

    /// The algorithms accepted, by name (`HS256`, `RS256`, `ES256`, ...):
    /// each must fit a key of the set (an HMAC algorithm an HMAC secret,
    /// and so on). `none` is not an algorithm.
    pub fn algorithms<S: AsRef<str>>(mut self, names: &[S]) -> Result<Jwt, String> {
        let mut algs = Vec::new();
        for n in names {
            let n = n.as_ref();
            let alg = Algorithm::from_str(n)
                .map_err(|_| format!("{n:?} is not an algorithm; use {ALGORITHMS}"))?;
            if !self.keys.iter().any(|k| k.family == family(alg)) {
                return Err(format!("{n}: no key of the set is of its kind"));
            }
            if !algs.contains(&alg) {
                algs.push(alg);
            }
        }
        if algs.is_empty() {
            return Err("name at least one algorithm".into());
        }
        self.algorithms = algs;
        Ok(self)
    }

    /// Only tokens whose `iss` is `issuer`.
    pub fn issuer(mut self, issuer: &str) -> Jwt {
        self.issuer = Some(issuer.to_string());
        self
    }

    /// Only tokens whose `aud` is (or lists) `audience`.
    pub fn audience(mut self, audience: &str) -> Jwt {
        self.audience = Some(audience.to_string());
        self
    }

    /// The claim whose value is the caller's key (`sub` by default).
    pub fn key_claim(mut self, claim: &str) -> Jwt {
        self.key_claim = claim.to_string();
        self
    }

    /// The claim whose value names the caller's plan (none by default: the
    /// plan is the key's under `[keys]`, else the default plan).
    pub fn plan_claim(mut self, claim: &str) -> Jwt {
        self.plan_claim = Some(claim.to_string());
        self
    }

    /// Maps the plan claim's value `value` to the plan named `plan`. With
    /// no mapping the claim's value is the plan's name; with any, a value
    /// not mapped names no plan.
    pub fn plan(mut self, value: &str, plan: &str) -> Jwt {
        self.plans.insert(value.to_string(), plan.to_string());
        self
    }

    /// The seconds of clock skew allowed on `exp` and `nbf`
    /// ([`DEFAULT_LEEWAY_S`] by default).
    pub fn leeway_s(mut self, seconds: u64) -> Jwt {
        self.leeway_s = seconds;
        self
    }

    /// Whether a token without `exp` is refused (`true` by default: such
    /// a token would be good forever).
    pub fn require_exp(mut self, required: bool) -> Jwt {
        self.require_exp = required;
        self
    }

    /// The plan mapping: claim value to plan name.
    pub(crate) fn plan_map(&self) -> &BTreeMap<String, String> {
        &self.plans
    }

    /// Verifies `token` at `now_s` (seconds since the Unix epoch, from the
    /// limiter's clock): the caller's key and, if the token names one,
    /// its plan claim's value.
    pub(crate) fn verify(
        &self,
        token: &str,
        now_s: u64,
    ) -> Result<(String, Option<String>), TokenError> {
        let header = jsonwebtoken::decode_header(token).map_err(|_| header_error(token))?;
        let alg = header.alg;
        if !self.algorithms.contains(&alg) {
            return Err(TokenError::Algorithm);
        }
        let key = self.key_for(header.kid.as_deref(), alg)?;
        let mut v = Validation::new(alg);
        v.required_spec_claims.clear();
        v.validate_exp = false;
        v.validate_nbf = false;
        v.validate_aud = false;
        v.leeway = 0;
        let data =
            jsonwebtoken::decode::<Map<String, Value>>(token, &key.key, &v).map_err(|e| match e
                .kind()
            {
                jsonwebtoken::errors::ErrorKind::InvalidSignature => TokenError::Signature,
                jsonwebtoken::errors::ErrorKind::InvalidAlgorithm => TokenError::Algorithm,
                _ => TokenError::Malformed,
            })?;
        self.check_claims(&data.claims, now_s)
    }

    /// The key `kid` names, fit for `alg`.
    fn key_for(&self, kid: Option<&str>, alg: Algorithm) -> Result<&Key, TokenError> {
        let fits = |k: &&Key| k.family == family(alg) && k.alg.is_none_or(|a| a == alg);
        let key = match kid {
            // a secret is one key, whatever the token calls it
            _ if self.keys.len() == 1 && self.keys[0].kid.is_none() => Some(&self.keys[0]),
            Some(kid) => self.keys.iter().find(|k| k.kid.as_deref() == Some(kid)),
            None if self.keys.len() == 1 => Some(&self.keys[0]),
            None => None,
        };
        let key = key.ok_or(TokenError::UnknownKey)?;
        match fits(&key) {
            true => Ok(key),
            false => Err(TokenError::Algorithm),
        }
    }

    fn check_claims(
        &self,
        claims: &Map<String, Value>,
        now_s: u64,
    ) -> Result<(String, Option<String>), TokenError> {
        let time = |name: &str| match claims.get(name) {
            None => Ok(None),
            Some(Value::Number(n)) => n.as_f64().map(Some).ok_or(TokenError::BadTime),
            // a string or anything else is not a date: never "absent"
            Some(_) => Err(TokenError::BadTime),
        };
        let (now, leeway) = (now_s as f64, self.leeway_s as f64);
        match time("exp")? {
            Some(exp) if now >= exp + leeway => return Err(TokenError::Expired),
            None if self.require_exp => return Err(TokenError::BadTime),
            _ => {}
        }
        if let Some(nbf) = time("nbf")? {
            if now + leeway < nbf {
                return Err(TokenError::NotYetValid);
            }
        }
        if let Some(iss) = &self.issuer {
            if claims.get("iss").and_then(Value::as_str) != Some(iss) {
                return Err(TokenError::Issuer);
            }
        }
        if let Some(aud) = &self.audience {
            let ok = match claims.get("aud") {
                Some(Value::String(s)) => s == aud,
                Some(Value::Array(a)) => a.iter().any(|v| v.as_str() == Some(aud)),
                _ => false,
            };
            if !ok {
                return Err(TokenError::Audience);
            }
        }
        let key = match claims.get(&self.key_claim) {
            Some(Value::String(s)) if !s.is_empty() && s.len() <= MAX_JWT_KEY_BYTES => s.clone(),
            _ => return Err(TokenError::NoKey),
        };
        let plan = self
            .plan_claim
            .as_ref()
            .and_then(|c| claims.get(c))
            .and_then(Value::as_str)
            .map(str::to_string);
        Ok((key, plan))
    }
}

/// The default of [`Jwt::leeway_s`]: 30 seconds.
pub const DEFAULT_LEEWAY_S: u64 = 30;

/// Why a header did not parse: an `alg` of `none` (or another name no
/// signature has) is an algorithm refused, anything else is malformed.
fn header_error(token: &str) -> TokenError {
    use base64::Engine;
    let Some(head) = token.split('.').next() else {
        return TokenError::Malformed;
    };
    let decoded =
        base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(head.trim_end_matches('='));
    let alg = decoded
        .ok()
        .and_then(|b| serde_json::from_slice::<Map<String, Value>>(&b).ok())
        .and_then(|h| h.get("alg").and_then(Value::as_str).map(str::to_string));
    match alg {
        // `none`, or a name no signature has
        Some(a) if Algorithm::from_str(&a).is_err() => TokenError::Algorithm,
        _ => TokenError::Malformed,
    }
}

/// The signature algorithm of a JWK's `alg`.
fn signing_alg(ka: KeyAlgorithm) -> Option<Algorithm> {
    let name = serde_json::to_value(ka).ok()?;
    Algorithm::from_str(name.as_str()?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{encode, EncodingKey, Header};

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";
    const NOW: u64 = 1_790_000_000;

    fn hs(claims: &Value) -> String {
        crypto::install();
        encode(
            &Header::new(Algorithm::HS256),
            claims,
            &EncodingKey::from_secret(SECRET),
        )
        .unwrap()
    }

    #[test]
    fn a_good_token_names_its_key_and_plan() {
        let jwt = Jwt::hmac(SECRET).unwrap().plan_claim("plan");
        let t = hs(&serde_json::json!({"sub": "u1", "plan": "gold", "exp": NOW + 60}));
        assert_eq!(
            jwt.verify(&t, NOW),
            Ok(("u1".to_string(), Some("gold".to_string())))
        );
        // the leeway: 30 s past exp is still good, 31 s is not
        assert!(jwt.verify(&t, NOW + 60 + 29).is_ok());
        assert_eq!(jwt.verify(&t, NOW + 60 + 30), Err(TokenError::Expired));
    }

    #[test]
    fn every_flaw_has_its_reason() {
        let jwt = Jwt::hmac(SECRET).unwrap().issuer("idp").audience("api");
        let good =
            serde_json::json!({"sub": "u", "exp": NOW + 60, "iss": "idp", "aud": ["x", "api"]});
        assert!(jwt.verify(&hs(&good), NOW).is_ok());
        let with = |k: &str, v: Value| {
            let mut c = good.clone();
            c[k] = v;
            jwt.verify(&hs(&c), NOW)
        };
        assert_eq!(with("exp", (NOW - 100).into()), Err(TokenError::Expired));
        assert_eq!(with("exp", "never".into()), Err(TokenError::BadTime));
        assert_eq!(
            with("nbf", (NOW + 100).into()),
            Err(TokenError::NotYetValid)
        );
        assert_eq!(with("nbf", "99999999999".into()), Err(TokenError::BadTime));
        assert_eq!(with("iss", "other".into()), Err(TokenError::Issuer));
        assert_eq!(with("aud", "web".into()), Err(TokenError::Audience));
        assert_eq!(with("sub", 7.into()), Err(TokenError::NoKey));
        assert_eq!(with("sub", "".into()), Err(TokenError::NoKey));
        let mut no_exp = good.clone();
        no_exp.as_object_mut().unwrap().remove("exp");
        assert_eq!(jwt.verify(&hs(&no_exp), NOW), Err(TokenError::BadTime));
        let lax = jwt.clone().require_exp(false);
        assert!(lax.verify(&hs(&no_exp), NOW).is_ok());
        // a signature by another secret
        let other = encode(
            &Header::new(Algorithm::HS256),
            &good,
            &EncodingKey::from_secret(b"another secret of thirty-two bytes!!"),
        )
        .unwrap();
        assert_eq!(jwt.verify(&other, NOW), Err(TokenError::Signature));
        // alg none, unsigned
        use base64::Engine;
        let b64 = |v: &Value| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string().as_bytes())
        };
        let none = format!(
            "{}.{}.",
            b64(&serde_json::json!({"alg": "none", "typ": "JWT"})),
            b64(&good)
        );
        assert_eq!(jwt.verify(&none, NOW), Err(TokenError::Algorithm));
        // HS384 is not configured
        let hs384 = encode(
            &Header::new(Algorithm::HS384),
            &good,
            &EncodingKey::from_secret(SECRET),
        )
        .unwrap();
        assert_eq!(jwt.verify(&hs384, NOW), Err(TokenError::Algorithm));
        for junk in ["", "a.b", "a.b.c", "....", "eyJ.eyJ.x"] {
            assert_eq!(
                jwt.verify(junk, NOW),
                Err(TokenError::Malformed),
                "{junk:?}"
            );
        }
    }

    #[test]
    fn a_short_secret_and_an_empty_set_are_refused() {
        assert!(Jwt::hmac(b"short").unwrap_err().contains("32"));
        assert!(Jwt::jwks(r#"{"keys": []}"#).is_err());
        assert!(Jwt::jwks("not json")
            .unwrap_err()
            .contains("JSON Web Key Set"));
        let jwt = Jwt::hmac(SECRET).unwrap();
        assert!(jwt.clone().algorithms(&["RS256"]).is_err());
        assert!(jwt.clone().algorithms(&["none"]).is_err());
        assert!(jwt.clone().algorithms(&["HS512", "HS256"]).is_ok());
    }

    proptest::proptest! {
        /// Whatever a client sends as a token, verification answers (never
        /// panics), and only the genuine token verifies: a token with any
        /// one byte changed, dropped or added is refused.
        #[test]
        fn only_the_genuine_token_verifies(
            junk in "[A-Za-z0-9_.=+/-]{0,120}",
            at in 0usize..400,
            byte in proptest::prelude::any::<u8>(),
            how in 0u8..3,
        ) {
            let jwt = Jwt::hmac(SECRET).unwrap();
            proptest::prop_assert!(jwt.verify(&junk, NOW).is_err());
            let good = hs(&serde_json::json!({"sub": "u1", "exp": NOW + 60}));
            proptest::prop_assert!(jwt.verify(&good, NOW).is_ok());
            let mut b = good.clone().into_bytes();
            let i = at % b.len();
            match how {
                0 => {
                    proptest::prop_assume!(b[i] != byte && byte.is_ascii_graphic());
                    b[i] = byte;
                }
                1 => { b.remove(i); }
                _ => {
                    proptest::prop_assume!(byte.is_ascii_graphic());
                    b.insert(i, byte);
                }
            }
            let changed = String::from_utf8(b).unwrap();
            // base64url may decode a changed last character to the same
            // bytes only when its unused bits change: refused all the same
            if let Ok((key, _)) = jwt.verify(&changed, NOW) {
                proptest::prop_assert!(false, "{changed:?} verified as {key}");
            }
        }
    }

    /// RFC 7515, Appendix A.2: an RS256 JWS and its key.
    #[test]
    fn the_rfc_7515_rs256_example_verifies() {
        let jwks = r#"{"keys": [{"kty": "RSA", "kid": "rfc",
 "n": "ofgWCuLjybRlzo0tZWJjNiuSfb4p4fAkd_wWJcyQoTbji9k0l8W26mPddxHmfHQp-Vaw-4qPCJrcS2mJPMEzP1Pt0Bm4d4QlL-yRT-SFd2lZS-pCgNMsD1W_YpRPEwOWvG6b32690r2jZ47soMZo9wGzjb_7OMg0LOL-bSf63kpaSHSXndS5z5rexMdbBYUsLA9e-KXBdQOS-UTo7WTBEMa2R2CapHg665xsmtdVMTBQY4uDZlxvb3qCo5ZwKh9kG4LT6_I5IhlJH7aGhyxXFvUK-DWNmoudF8NAco9_h9iaGNj8q2ethFkMLs91kzk2PAcDTW9gb54h4FRWyuXpoQ",
 "e": "AQAB"}]}"#;
        let token = "eyJhbGciOiJSUzI1NiJ9.eyJpc3MiOiJqb2UiLA0KICJleHAiOjEzMDA4MTkzODAsDQogImh0dHA6Ly9leGFtcGxlLmNvbS9pc19yb290Ijp0cnVlfQ.cC4hiUPoj9Eetdgtv3hF80EGrhuB__dzERat0XF9g2VtQgr9PJbu3XOiZj5RZmh7AAuHIm4Bh-0Qc_lF5YKt_O8W2Fp5jujGbds9uJdbF9CUAr7t1dnZcAcQjbKBYNX4BAynRFdiuB--f_nZLgrnbyTyWzO75vRK5h6xBArLIARNPvkSjtQBMHlb1L07Qe7K0GarZRmB_eSN9383LcOLn6_dO--xi12jzDwusC-eOkHWEsqtFZESc6BfI7noOPqvhJ1phCnvWh6IeYI2w9QOYEUipUTI8np6LbgGY9Fs98rqVt5AXLIhWkWywlVmtVrBp0igcN_IoypGlUPQGe77Rw";
        let jwt = Jwt::jwks(jwks).unwrap().key_claim("iss");
        let at = 1_300_819_000;
        assert_eq!(jwt.verify(token, at), Ok(("joe".to_string(), None)));
        assert_eq!(
            jwt.verify(token, 1_300_819_380 + 30),
            Err(TokenError::Expired)
        );
        // one byte of the signature changed
        let mut forged = token.as_bytes().to_vec();
        let i = forged.len() - 20;
        forged[i] = if forged[i] == b'A' { b'B' } else { b'A' };
        let forged = String::from_utf8(forged).unwrap();
        assert_eq!(jwt.verify(&forged, at), Err(TokenError::Signature));
        // RS256 only: the same key cannot serve an HMAC, nor PS256 unconfigured
        assert!(jwt.clone().algorithms(&["HS256"]).is_err());
    }
}
