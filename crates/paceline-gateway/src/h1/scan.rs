//! What a head's fields say about its body and its connection, read the
//! same way for the requests the gateway takes in and the answers its
//! upstream client reads: `Content-Length`, `Transfer-Encoding`,
//! `Connection` and `Expect`.

use http::Version;

/// The framing fields of one head, scanned field by field.
#[derive(Debug, Default)]
pub(crate) struct Scan {
    /// The body's length, when given (every value the same).
    pub(crate) length: Option<u64>,
    /// `Some(true)` when `Transfer-Encoding` is `chunked` alone,
    /// `Some(false)` when it names anything else.
    pub(crate) chunked: Option<bool>,
    /// `Connection: close`.
    pub(crate) close: bool,
    /// `Connection: keep-alive`.
    pub(crate) keep_alive: bool,
    /// An `Expect` field, whatever it expects.
    pub(crate) expects: bool,
    /// An `Upgrade` field.
    pub(crate) upgrade: bool,
    /// `TE` lists `trailers`.
    pub(crate) trailers: bool,
    /// A `Content-Length` value listing more than one length.
    pub(crate) length_listed: bool,
}

impl Scan {
    /// Reads one field; a length that is no number, or two that differ,
    /// is an error naming what is wrong.
    pub(crate) fn field(&mut self, name: &[u8], value: &[u8]) -> Result<(), &'static str> {
        if name.eq_ignore_ascii_case(b"content-length") {
            self.length_listed |= value.contains(&b',');
            for part in value.split(|&b| b == b',') {
                let n = parse_decimal(trim(part)).ok_or("bad content-length")?;
                if self.length.is_some_and(|l| l != n) {
                    return Err("conflicting content-length");
                }
                self.length = Some(n);
            }
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            // chunked alone: a body under another coding could be neither
            // framed nor passed on as it is (the field does not travel)
            for t in value
                .split(|&b| b == b',')
                .map(trim)
                .filter(|t| !t.is_empty())
            {
                let first = self.chunked.is_none();
                self.chunked = Some(first && t.eq_ignore_ascii_case(b"chunked"));
            }
            self.chunked = self.chunked.or(Some(false));
        } else if name.eq_ignore_ascii_case(b"connection") {
            self.close |= lists(value, b"close");
            self.keep_alive |= lists(value, b"keep-alive");
        } else if name.eq_ignore_ascii_case(b"expect") {
            self.expects = true;
        } else if name.eq_ignore_ascii_case(b"upgrade") {
            self.upgrade = true;
        } else if name.eq_ignore_ascii_case(b"te") {
            self.trailers |= lists(value, b"trailers");
        }
        Ok(())
    }

    /// Whether the sender keeps the connection open after this message:
    /// HTTP/1.1 unless it says `close`, HTTP/1.0 only when it asks for
    /// `keep-alive`.
    pub(crate) fn keep_alive(&self, version: Version) -> bool {
        match version {
            Version::HTTP_10 => self.keep_alive && !self.close,
            _ => !self.close,
        }
    }
}

/// Whether the comma-separated `value` lists `token` (in any case).
pub(crate) fn lists(value: &[u8], token: &[u8]) -> bool {
    value
        .split(|&b| b == b',')
        .any(|t| trim(t).eq_ignore_ascii_case(token))
}

/// `b` without the whitespace around it.
pub(crate) fn trim(b: &[u8]) -> &[u8] {
    let start = b
        .iter()
        .position(|c| !c.is_ascii_whitespace())
        .unwrap_or(b.len());
    let end = b
        .iter()
        .rposition(|c| !c.is_ascii_whitespace())
        .map_or(start, |e| e + 1);
    &b[start..end]
}

/// A decimal of digits only (no sign, no space), at most 19 of them.
pub(crate) fn parse_decimal(b: &[u8]) -> Option<u64> {
    if b.is_empty() || b.len() > 19 {
        return None;
    }
    b.iter().try_fold(0u64, |n, &c| {
        c.is_ascii_digit().then(|| n * 10 + u64::from(c - b'0'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_lengths() {
        assert_eq!(parse_decimal(b"0"), Some(0));
        assert_eq!(parse_decimal(b"18446744073709551615"), None, "20 digits");
        assert_eq!(
            parse_decimal(b"1844674407370955161"),
            Some(1844674407370955161)
        );
        assert_eq!(parse_decimal(b"+1"), None);
        assert_eq!(parse_decimal(b""), None);
    }
}
