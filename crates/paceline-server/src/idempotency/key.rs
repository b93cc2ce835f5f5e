//! The `Idempotency-Key` field: read as the IETF draft's structured-field
//! string (`"8e03978e-40d5-43e8-bc93-6894a57f9324"`) or bare, as Stripe
//! clients send it (`8e03978e-40d5-43e8-bc93-6894a57f9324`).
//!
//! Either way the key is printable ASCII without spaces, between one and a
//! bounded number of characters long, and sent once: a request with two
//! `Idempotency-Key` fields names no single key, so it is refused rather
//! than guessed at.

use http::header::{HeaderMap, HeaderName};

/// The field's name.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// The longest key accepted by default (Stripe's bound).
pub const DEFAULT_MAX_KEY_LEN: usize = 255;

/// What a request's `Idempotency-Key` field says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum KeyField<'a> {
    /// No field.
    Absent,
    /// One valid key.
    Key(KeyText<'a>),
    /// A field that names no valid key, with the reason in words.
    Invalid(&'static str),
}

/// A key as sent: borrowed from a bare value, owned when a structured
/// string had escapes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum KeyText<'a> {
    Borrowed(&'a str),
    Owned(String),
}

impl KeyText<'_> {
    pub(crate) fn as_str(&self) -> &str {
        match self {
            KeyText::Borrowed(s) => s,
            KeyText::Owned(s) => s,
        }
    }
}

/// Reads the key of `headers`, at most `max_len` characters long.
pub(crate) fn read_key(headers: &HeaderMap, max_len: usize) -> KeyField<'_> {
    let mut all = headers.get_all(IDEMPOTENCY_KEY).iter();
    let Some(value) = all.next() else {
        return KeyField::Absent;
    };
    if all.next().is_some() {
        return KeyField::Invalid("Send one Idempotency-Key field, not several.");
    }
    let Ok(text) = value.to_str() else {
        return KeyField::Invalid("The Idempotency-Key must be printable ASCII.");
    };
    let text = text.trim_matches(|c| c == ' ' || c == '\t');
    let key = match text.starts_with('"') {
        true => match structured(text) {
            Some(k) => k,
            None => {
                return KeyField::Invalid("The Idempotency-Key is not a structured-field string.")
            }
        },
        false => KeyText::Borrowed(text),
    };
    let s = key.as_str();
    if s.is_empty() {
        return KeyField::Invalid("The Idempotency-Key is empty.");
    }
    if s.len() > max_len {
        return KeyField::Invalid("The Idempotency-Key is longer than allowed.");
    }
    if !s.bytes().all(|b| b.is_ascii_graphic()) {
        return KeyField::Invalid("The Idempotency-Key must be printable ASCII without spaces.");
    }
    KeyField::Key(key)
}

/// The string of a structured-field item (RFC 8941), parameters ignored.
fn structured(text: &str) -> Option<KeyText<'_>> {
    let item = sfv::Parser::new(text).parse_item::<sfv::Item>().ok()?;
    let s = item.bare_item.as_string()?.as_str();
    // without escapes the key is the value between the quotes: no copy
    let inner = text.strip_prefix('"').and_then(|t| t.split('"').next());
    Some(match inner {
        Some(i) if i == s => KeyText::Borrowed(i),
        _ => KeyText::Owned(s.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(values: &[&str]) -> KeyField<'static> {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(IDEMPOTENCY_KEY, v.parse().unwrap());
        }
        let h: &'static HeaderMap = Box::leak(Box::new(h));
        read_key(h, 16)
    }

    fn key(s: &str) -> KeyField<'static> {
        KeyField::Key(KeyText::Owned(s.to_string()))
    }

    #[test]
    fn structured_and_bare_keys_read_the_same() {
        let k = |f: KeyField<'_>| match f {
            KeyField::Key(k) => k.as_str().to_string(),
            other => panic!("{other:?}"),
        };
        assert_eq!(k(read(&["\"abc-1\""])), "abc-1");
        assert_eq!(k(read(&["abc-1"])), "abc-1");
        assert_eq!(k(read(&["\"abc-1\";p=1"])), "abc-1");
        assert_eq!(k(read(&[r#""a\"b""#])), "a\"b");
        assert_eq!(read(&[]), KeyField::Absent);
        let _ = key("x");
    }

    #[test]
    fn bad_keys_are_refused_with_a_reason() {
        for bad in [
            &["\"\""][..],
            &["\"abc"],
            &["a b"],
            &["\"a b\""],
            &["0123456789abcdefX"],
            &["a", "b"],
        ] {
            assert!(matches!(read(bad), KeyField::Invalid(_)), "{bad:?}");
        }
        // the bound is the setting's: 16 here
        assert!(matches!(read(&["0123456789abcdef"]), KeyField::Key(_)));
    }
}
