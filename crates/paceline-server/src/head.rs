//! The request heads refused before any limit is looked at: more than one
//! credential, more than one `Host`, and bodies framed in a way that cannot
//! be read faithfully (RFC 9112 §6).
//!
//! Why here: the limiter and the service behind it must read the same
//! request. A head with two `Authorization` fields lets the limiter count
//! one credential while the service honours the other; a body whose
//! transfer coding is dropped or whose length does not parse is read one
//! way here and another way further on. Such a head is answered at once
//! (400, or 501 for a transfer coding other than `chunked`), with a
//! problem body, and charged to nothing.
//!
//! The checks ride on the one pass the limiter already makes over the
//! head's fields: a few comparisons per field, no allocation.

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, AUTHORIZATION};
use http::{HeaderMap, Response};
use paceline_wire::problem::{self, Problem, ProblemKind};

use crate::identity::KeySource;

/// What was seen of the fields that decide whether a head is refused.
#[derive(Default)]
pub(crate) struct HeadCheck {
    authorizations: u8,
    /// An `Authorization: Bearer` value that lists more than one token.
    listed_credentials: bool,
    hosts: u8,
    /// A `Host` value that is a list.
    listed_host: bool,
    chunked: u8,
    other_coding: bool,
    /// The announced length, once one parsed.
    length: Option<u64>,
    bad_length: bool,
    /// Anything above that refuses the head: the common head is passed
    /// with one test.
    odd: bool,
}

/// Why a head is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// More than one credential: two `Authorization` fields, one that
    /// lists two bearer tokens, or the key header twice.
    DuplicateCredentials,
    /// More than one `Host` (RFC 9112 §3.2).
    DuplicateHost,
    /// A transfer coding other than `chunked` (RFC 9112 §6.1: 501).
    UnsupportedCoding,
    /// `chunked` applied more than once (RFC 9112 §6.1).
    ChunkedTwice,
    /// A `Content-Length` that is not a number, overflows, or disagrees
    /// with another (RFC 9112 §6.3).
    InvalidLength,
}

impl HeadCheck {
    /// One `Authorization` field.
    #[inline]
    pub(crate) fn authorization(&mut self, v: &HeaderValue) {
        self.authorizations = self.authorizations.saturating_add(1);
        // a bearer token (RFC 6750 b64token) holds no comma: one that does
        // is two credentials in one field, and so is `Bearer,` itself (an
        // empty bearer credential, then a list of others)
        let b = v.as_bytes();
        if b.len() > 6 && b[..6].eq_ignore_ascii_case(b"bearer") && b[6..].contains(&b',') {
            self.listed_credentials = true;
        }
        self.odd |= self.authorizations > 1 || self.listed_credentials;
    }

    /// One `Host` field.
    #[inline]
    pub(crate) fn host(&mut self, v: &HeaderValue) {
        self.hosts = self.hosts.saturating_add(1);
        if v.as_bytes().contains(&b',') {
            self.listed_host = true;
        }
        self.odd |= self.hosts > 1 || self.listed_host;
    }

    /// One `Transfer-Encoding` field: its codings, in order.
    pub(crate) fn transfer_encoding(&mut self, v: &HeaderValue) {
        for coding in v.as_bytes().split(|&b| b == b',') {
            let coding = coding.trim_ascii();
            if coding.is_empty() {
                continue;
            }
            match coding.eq_ignore_ascii_case(b"chunked") {
                true => self.chunked = self.chunked.saturating_add(1),
                false => self.other_coding = true,
            }
        }
        self.odd |= self.chunked > 1 || self.other_coding;
    }

    /// One `Content-Length` field: digits, or a list of equal ones.
    pub(crate) fn content_length(&mut self, v: &HeaderValue) {
        for item in v.as_bytes().split(|&b| b == b',') {
            match parse_length(item.trim_ascii()) {
                Some(n) if self.length.is_none_or(|l| l == n) => self.length = Some(n),
                _ => self.bad_length = true,
            }
        }
        self.odd |= self.bad_length;
    }

    /// Why the head is refused, if it is; `headers` is looked up only when
    /// the key comes from a header other than `Authorization`.
    #[inline]
    pub(crate) fn refusal(&self, headers: &HeaderMap, source: &KeySource) -> Option<Refusal> {
        match self.odd || matches!(source, KeySource::Header(_)) {
            true => self.refusal_of(headers, source),
            false => None,
        }
    }

    fn refusal_of(&self, headers: &HeaderMap, source: &KeySource) -> Option<Refusal> {
        if self.authorizations > 1 || self.listed_credentials || duplicate_key(headers, source) {
            return Some(Refusal::DuplicateCredentials);
        }
        if self.other_coding {
            return Some(Refusal::UnsupportedCoding);
        }
        if self.chunked > 1 {
            return Some(Refusal::ChunkedTwice);
        }
        if self.bad_length {
            return Some(Refusal::InvalidLength);
        }
        if self.hosts > 1 || self.listed_host {
            return Some(Refusal::DuplicateHost);
        }
        None
    }
}

/// Whether the key header of `source` (a header other than
/// `Authorization`) is sent more than once.
fn duplicate_key(headers: &HeaderMap, source: &KeySource) -> bool {
    match source {
        KeySource::Header(name) if *name != AUTHORIZATION => several(headers, name),
        _ => false,
    }
}

fn several(headers: &HeaderMap, name: &HeaderName) -> bool {
    let mut values = headers.get_all(name).iter();
    values.next().is_some() && values.next().is_some()
}

/// `1*DIGIT` as a `u64`; `None` when empty, not digits, or past `u64`.
fn parse_length(s: &[u8]) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    s.iter().try_fold(0u64, |n, &b| {
        let d = b.checked_sub(b'0').filter(|d| *d < 10)?;
        n.checked_mul(10)?.checked_add(u64::from(d))
    })
}

impl Refusal {
    /// Whether the connection cannot be read further after this head: its
    /// body's framing is not known.
    pub(crate) fn breaks_framing(&self) -> bool {
        matches!(
            self,
            Refusal::UnsupportedCoding | Refusal::ChunkedTwice | Refusal::InvalidLength
        )
    }

    /// The problem answer, its type under `base`.
    pub(crate) fn answer(&self, base: &str) -> Response<Bytes> {
        let (kind, detail) = match self {
            Refusal::DuplicateCredentials => (
                ProblemKind::DuplicateCredentials,
                "Send exactly one credential: one Authorization field (or one key header) with one token.",
            ),
            Refusal::DuplicateHost => (
                ProblemKind::BadRequest,
                "A request carries exactly one Host field with one host.",
            ),
            Refusal::UnsupportedCoding => (
                ProblemKind::NotImplemented,
                "Only the chunked transfer coding is supported.",
            ),
            Refusal::ChunkedTwice => (
                ProblemKind::BadRequest,
                "The chunked transfer coding is applied at most once.",
            ),
            Refusal::InvalidLength => (
                ProblemKind::BadRequest,
                "Content-Length must be one decimal number of at most 20 digits that fits in 64 bits.",
            ),
        };
        problem::answer(&Problem::new(kind, base, detail))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(fields: &[(&str, &str)], source: &KeySource) -> Option<Refusal> {
        let mut h = HeaderMap::new();
        for (n, v) in fields {
            h.append(
                HeaderName::from_bytes(n.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        let mut c = HeadCheck::default();
        for (n, v) in &h {
            match n.as_str() {
                "authorization" => c.authorization(v),
                "host" => c.host(v),
                "transfer-encoding" => c.transfer_encoding(v),
                "content-length" => c.content_length(v),
                _ => {}
            }
        }
        c.refusal(&h, source)
    }

    #[test]
    fn one_of_each_passes() {
        let k = KeySource::ApiKey;
        assert_eq!(check(&[], &k), None);
        let fields = [
            ("host", "api.example:8080"),
            ("authorization", "Bearer sk_1"),
            ("content-length", "12"),
            ("x-api-key", "a"),
            ("x-api-key", "b"),
        ];
        assert_eq!(check(&fields, &k), None);
        assert_eq!(check(&[("transfer-encoding", "Chunked")], &k), None);
        assert_eq!(check(&[("content-length", "5, 5")], &k), None);
        assert_eq!(
            check(&[("content-length", "5"), ("content-length", "5")], &k),
            None
        );
        let digest = r#"Digest username="a", realm="b", nonce="c""#;
        assert_eq!(check(&[("authorization", digest)], &k), None);
    }

    #[test]
    fn credentials_are_one() {
        use Refusal::DuplicateCredentials as D;
        let k = KeySource::ApiKey;
        let two = [("authorization", "Bearer x"), ("authorization", "Bearer y")];
        assert_eq!(check(&two, &k), Some(D));
        // refused whatever the key source: the service behind would see two
        assert_eq!(check(&two, &KeySource::ClientIp), Some(D));
        assert_eq!(
            check(&[("authorization", "Bearer x, Bearer y")], &k),
            Some(D)
        );
        let header = KeySource::Header(HeaderName::from_static("x-api-key"));
        let keys = [("x-api-key", "a"), ("x-api-key", "b")];
        assert_eq!(check(&keys, &header), Some(D));
        assert_eq!(check(&keys[..1], &header), None);
    }

    #[test]
    fn framing_is_strict() {
        let k = KeySource::ApiKey;
        let te = |v| check(&[("transfer-encoding", v)], &k);
        assert_eq!(te("gzip, chunked"), Some(Refusal::UnsupportedCoding));
        assert_eq!(te("identity"), Some(Refusal::UnsupportedCoding));
        assert_eq!(te("chunked, chunked"), Some(Refusal::ChunkedTwice));
        let two = [
            ("transfer-encoding", "chunked"),
            ("transfer-encoding", "chunked"),
        ];
        assert_eq!(check(&two, &k), Some(Refusal::ChunkedTwice));
        let cl = |v| check(&[("content-length", v)], &k);
        assert_eq!(cl("18446744073709551615"), None);
        assert_eq!(cl("18446744073709551616"), Some(Refusal::InvalidLength));
        for bad in ["", "-1", "+1", "1e3", "0x10", "1 2", "5, 6", "abc"] {
            assert_eq!(cl(bad), Some(Refusal::InvalidLength), "{bad:?}");
        }
        let two = [("content-length", "5"), ("content-length", "6")];
        assert_eq!(check(&two, &k), Some(Refusal::InvalidLength));
        let hosts = [("host", "a"), ("host", "b")];
        assert_eq!(check(&hosts, &k), Some(Refusal::DuplicateHost));
        assert_eq!(check(&[("host", "a, b")], &k), Some(Refusal::DuplicateHost));
    }

    #[test]
    fn answers_are_problems() {
        let r = Refusal::UnsupportedCoding.answer("https://e/");
        assert_eq!(r.status(), 501);
        let r = Refusal::DuplicateCredentials.answer("https://e/");
        assert_eq!(r.status(), 400);
        let body = std::str::from_utf8(r.body()).unwrap();
        assert!(
            body.contains("\"type\":\"https://e/duplicate_credentials\""),
            "{body}"
        );
        assert_eq!(r.headers()["content-type"], problem::PROBLEM_CONTENT_TYPE);
    }
}
