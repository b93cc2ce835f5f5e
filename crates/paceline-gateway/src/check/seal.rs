//! A refusal carried through a proxy that cannot carry it: sealed into one
//! field, opened again by the check.
//!
//! Why: nginx's `auth_request` passes on only `401` and `403` from the
//! check (anything else is its own `500`) and drops the check's body. So,
//! when the proxy asks for it (the `Paceline-Deny-Status` field), the check
//! answers a refusal with that status and the whole refusal it made
//! (status, fields, problem body) sealed into `Paceline-Answer`. The
//! proxy's error page sends that field back to the check, which opens it
//! and answers the refusal as it was made: nothing is decided or charged
//! a second time, and the client gets the `429`, its `Retry-After`, the
//! fields and the problem body as `paceline gateway` would have sent them.
//!
//! A sealed answer is authenticated (a 128-bit SipHash-1-3 tag under a key
//! derived from the deployment's key-hash secret, so every check instance
//! sharing that secret opens the others' answers), expires
//! [`SEALED_FOR_S`] seconds after it was made, and holds only refusals
//! (a status of 400 or more): opening one can never admit a request, and
//! a client that sends one back only refuses itself.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::{Response, StatusCode};
use paceline_core::Nanos;

/// How long a sealed answer can be opened, in seconds.
pub const SEALED_FOR_S: u64 = 30;

/// The longest sealed answer opened, in bytes.
const MAX_SEALED: usize = 16 * 1024;

/// The version prefix of a sealed answer.
const VERSION: &str = "1";

/// Seals and opens refusals under one key.
#[derive(Clone)]
pub(crate) struct Seal {
    keys: (u64, u64),
}

impl std::fmt::Debug for Seal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Seal").finish_non_exhaustive()
    }
}

/// Why a sealed answer is not opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unopened {
    /// Not one this deployment made (or altered, or cut short).
    Forged,
    /// Made more than [`SEALED_FOR_S`] seconds ago.
    Expired,
}

impl Seal {
    /// A seal under the 16 bytes `key`.
    pub(crate) fn new(key: [u8; 16]) -> Seal {
        let (a, b) = key.split_at(8);
        Seal {
            keys: (
                u64::from_le_bytes(a.try_into().expect("8 bytes")),
                u64::from_le_bytes(b.try_into().expect("8 bytes")),
            ),
        }
    }

    /// `res` (a refusal: status 400 or more) as one field value, made at
    /// `now`.
    pub(crate) fn seal(&self, res: &Response<Bytes>, now: Nanos) -> HeaderValue {
        debug_assert!(res.status().as_u16() >= 400, "only refusals are sealed");
        let mut plain = Vec::with_capacity(256 + res.body().len());
        plain.extend_from_slice(res.status().as_str().as_bytes());
        plain.push(b'\n');
        for (name, value) in res.headers() {
            plain.extend_from_slice(name.as_str().as_bytes());
            plain.extend_from_slice(b": ");
            plain.extend_from_slice(value.as_bytes());
            plain.push(b'\n');
        }
        plain.push(b'\n');
        plain.extend_from_slice(res.body());
        let expires = (now.as_secs_floor() + SEALED_FOR_S).to_string();
        let tag = self.tag(&expires, &plain);
        let text = format!(
            "{VERSION}.{expires}.{}.{}",
            URL_SAFE_NO_PAD.encode(&plain),
            URL_SAFE_NO_PAD.encode(tag)
        );
        HeaderValue::from_str(&text).expect("base64 is a field value")
    }

    /// The refusal sealed in `value`, if this deployment sealed it and it
    /// has not expired at `now`.
    pub(crate) fn open(&self, value: &[u8], now: Nanos) -> Result<Response<Bytes>, Unopened> {
        if value.len() > MAX_SEALED {
            return Err(Unopened::Forged);
        }
        let text = std::str::from_utf8(value).map_err(|_| Unopened::Forged)?;
        let mut parts = text.split('.');
        let (Some(VERSION), Some(expires), Some(plain), Some(tag), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(Unopened::Forged);
        };
        let plain = URL_SAFE_NO_PAD
            .decode(plain)
            .map_err(|_| Unopened::Forged)?;
        let tag = URL_SAFE_NO_PAD.decode(tag).map_err(|_| Unopened::Forged)?;
        if !same(&tag, &self.tag(expires, &plain)) {
            return Err(Unopened::Forged);
        }
        let expires: u64 = expires.parse().map_err(|_| Unopened::Forged)?;
        if now.as_secs_floor() > expires {
            return Err(Unopened::Expired);
        }
        unseal(&plain).ok_or(Unopened::Forged)
    }

    fn tag(&self, expires: &str, plain: &[u8]) -> [u8; 16] {
        use siphasher::sip128::Hasher128;
        use std::hash::Hasher;
        let mut h = siphasher::sip128::SipHasher13::new_with_keys(self.keys.0, self.keys.1);
        h.write(VERSION.as_bytes());
        h.write(b".");
        h.write(expires.as_bytes());
        h.write(b".");
        h.write(plain);
        h.finish128().as_bytes()
    }
}

/// Compares two tags in time that does not depend on where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// The response written by [`Seal::seal`]; `None` when it is not one (or
/// not a refusal).
fn unseal(plain: &[u8]) -> Option<Response<Bytes>> {
    let end = plain.windows(2).position(|w| w == b"\n\n")?;
    let (head, body) = (&plain[..end], &plain[end + 2..]);
    let mut lines = head.split(|&b| b == b'\n');
    let status = StatusCode::from_bytes(lines.next()?).ok()?;
    if status.as_u16() < 400 {
        return None;
    }
    let mut res = Response::new(Bytes::copy_from_slice(body));
    *res.status_mut() = status;
    for line in lines {
        let at = line.windows(2).position(|w| w == b": ")?;
        let name = HeaderName::from_bytes(&line[..at]).ok()?;
        let value = HeaderValue::from_bytes(&line[at + 2..]).ok()?;
        res.headers_mut().append(name, value);
    }
    Some(res)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal() -> Response<Bytes> {
        Response::builder()
            .status(429)
            .header("retry-after", "2")
            .header("ratelimit", "\"burst\";r=0;t=2")
            .header("content-type", "application/problem+json")
            .body(Bytes::from_static(b"{\"status\":429}\n\n{}"))
            .unwrap()
    }

    #[test]
    fn a_sealed_refusal_opens_as_it_was_made() {
        let seal = Seal::new([7; 16]);
        let now = Nanos::from_secs(1_790_000_000);
        let v = seal.seal(&refusal(), now);
        let back = seal.open(v.as_bytes(), now).unwrap();
        assert_eq!(back.status(), 429);
        assert_eq!(back.headers(), refusal().headers());
        assert_eq!(back.body(), refusal().body());
        let later = now.saturating_add(Nanos::from_secs(SEALED_FOR_S));
        assert!(seal.open(v.as_bytes(), later).is_ok());
        let too_late = now.saturating_add(Nanos::from_secs(SEALED_FOR_S + 1));
        assert_eq!(
            seal.open(v.as_bytes(), too_late).unwrap_err(),
            Unopened::Expired
        );
    }

    #[test]
    fn another_key_a_changed_byte_or_a_success_never_opens() {
        let now = Nanos::from_secs(1_790_000_000);
        let v = Seal::new([7; 16]).seal(&refusal(), now);
        let other = Seal::new([8; 16]);
        assert_eq!(other.open(v.as_bytes(), now).unwrap_err(), Unopened::Forged);
        let seal = Seal::new([7; 16]);
        let mut bytes = v.as_bytes().to_vec();
        for i in 0..bytes.len() {
            let was = bytes[i];
            bytes[i] = if was == b'A' { b'B' } else { b'A' };
            assert!(
                seal.open(&bytes, now).is_err(),
                "byte {i} changed and opened"
            );
            bytes[i] = was;
        }
        // a later expiry under the same tag
        let text = v
            .to_str()
            .unwrap()
            .replacen(".1790000030.", ".1790009999.", 1);
        assert_eq!(
            seal.open(text.as_bytes(), now).unwrap_err(),
            Unopened::Forged
        );
        // a success sealed by a forger who knew the key is still not opened
        let plain = b"200\n\n";
        let expires = "1790000030";
        let tag = seal.tag(expires, plain);
        let forged = format!(
            "1.{expires}.{}.{}",
            URL_SAFE_NO_PAD.encode(plain),
            URL_SAFE_NO_PAD.encode(tag)
        );
        assert_eq!(
            seal.open(forged.as_bytes(), now).unwrap_err(),
            Unopened::Forged
        );
        assert!(seal.open(b"", now).is_err());
        assert!(seal.open(b"1.2.3", now).is_err());
    }
}
