//! Request paths in one normal form, so the limiter and the service behind
//! it read the same route.
//!
//! Why: RFC 3986 makes `/v1/%6Cabels`, `/v1/labels` and
//! `/v1/x/../labels` one resource, and the services behind a limiter read
//! them so (Flask decodes every percent-encoding, Node's `new URL()`
//! removes dot segments, nginx merges slashes). A limiter that matched its
//! routes on the raw bytes would charge a batch as the default route while
//! the service ran the batch. So a path is brought to one form before any
//! route is matched, and that form is what goes on:
//!
//! - a percent-encoded byte that is a letter, a digit or one of
//!   `-._~!$&'()*+,;=:@` is decoded (none of them changes how a path
//!   splits); any other keeps its encoding, with upper-case hex digits;
//! - `%2F` (an encoded `/`) is refused by default: some services decode it
//!   into a separator and some do not, so no single reading is safe
//!   ([`EncodedSlash::Keep`] passes it on as it came);
//! - dot segments are removed (RFC 3986 §5.2.4), after decoding, so
//!   `%2e%2e` is one too;
//! - runs of `/` become one, unless [`PathRules::merge_slashes`] is off;
//! - a `%` not followed by two hex digits, and a raw `\` (which some
//!   servers read as `/`), are refused.
//!
//! ```
//! use paceline_server::path::{normalize_path, PathRules};
//!
//! let rules = PathRules::default();
//! for p in ["/v1/%6Cabels:batch", "/v1/labels%3Abatch", "//v1/labels:batch", "/v1/x/../labels:batch", "/v1/%2e%2e/v1/labels:batch"] {
//!     assert_eq!(normalize_path(p, &rules).unwrap(), "/v1/labels:batch");
//! }
//! assert!(normalize_path("/v1%2Flabels", &rules).is_err());
//! ```

use std::borrow::Cow;
use std::fmt;

/// What to do with `%2F`, an encoded `/`, in a path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum EncodedSlash {
    /// Refuse the request (the default): the service behind may split the
    /// path there or not.
    #[default]
    Reject,
    /// Keep it encoded, for services that never decode it (identifiers
    /// holding `/`, as GitLab's project paths).
    Keep,
}

/// How paths are brought to their normal form.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathRules {
    /// Whether runs of `/` become one (the default, as nginx's
    /// `merge_slashes on`).
    pub merge_slashes: bool,
    /// What `%2F` gets.
    pub encoded_slash: EncodedSlash,
}

impl Default for PathRules {
    fn default() -> Self {
        PathRules {
            merge_slashes: true,
            encoded_slash: EncodedSlash::Reject,
        }
    }
}

/// Why a path has no normal form.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PathError {
    /// It does not start with `/`.
    NotAbsolute,
    /// A `%` not followed by two hex digits.
    BadEncoding,
    /// An encoded `/` under [`EncodedSlash::Reject`].
    EncodedSlash,
    /// A raw `\`.
    Backslash,
}

impl fmt::Display for PathError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PathError::NotAbsolute => "the path does not start with '/'",
            PathError::BadEncoding => "the path has a '%' not followed by two hex digits",
            PathError::EncodedSlash => {
                "the path has an encoded '/' (%2F), which services read in different ways"
            }
            PathError::Backslash => "the path has a '\\', which some services read as '/'",
        })
    }
}

impl std::error::Error for PathError {}

/// The normal form of `path` (no query) under `rules`: borrowed when it is
/// already normal, which is the common case and costs one scan.
pub fn normalize_path<'a>(path: &'a str, rules: &PathRules) -> Result<Cow<'a, str>, PathError> {
    if !path.starts_with('/') {
        return Err(PathError::NotAbsolute);
    }
    if is_normal(path.as_bytes(), rules.merge_slashes) {
        return Ok(Cow::Borrowed(path));
    }
    let mut out: Vec<String> = Vec::new();
    let mut trailing = false;
    let segments: Vec<&str> = path[1..].split('/').collect();
    let last = segments.len() - 1;
    for (i, raw) in segments.into_iter().enumerate() {
        let seg = decode_segment(raw, rules.encoded_slash)?;
        trailing = i == last;
        match seg.as_str() {
            "." => {}
            ".." => {
                out.pop();
            }
            "" if rules.merge_slashes || i == last => {}
            _ => {
                out.push(seg);
                trailing = false;
            }
        }
    }
    let mut s = String::with_capacity(path.len());
    for seg in &out {
        s.push('/');
        s.push_str(seg);
    }
    if trailing || out.is_empty() {
        s.push('/');
    }
    Ok(Cow::Owned(s))
}

/// Whether `p` (starting with `/`) needs no work: no `%`, no `\`, no dot
/// segment and, when merging, no empty segment but a trailing one. One
/// pass over the bytes: it runs for every request.
fn is_normal(p: &[u8], merge: bool) -> bool {
    // where the segment being read starts (after its `/`)
    let mut start = 1;
    for (i, &b) in p.iter().enumerate().skip(1) {
        match b {
            b'%' | b'\\' => return false,
            // a segment that is not the last
            b'/' => {
                let seg = &p[start..i];
                if (seg.is_empty() && merge) || is_dots(seg) {
                    return false;
                }
                start = i + 1;
            }
            _ => {}
        }
    }
    // the last segment: empty (a trailing `/`) is normal
    !is_dots(&p[start.min(p.len())..])
}

/// `.` or `..`.
fn is_dots(seg: &[u8]) -> bool {
    matches!(seg, b"." | b"..")
}

/// One segment with its safe encodings decoded and the rest in upper case.
fn decode_segment(raw: &str, slash: EncodedSlash) -> Result<String, PathError> {
    let b = raw.as_bytes();
    let mut out = String::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'\\' => return Err(PathError::Backslash),
            b'%' => {
                let hex = |c: u8| (c as char).to_digit(16);
                let (Some(h), Some(l)) = (
                    b.get(i + 1).and_then(|&c| hex(c)),
                    b.get(i + 2).and_then(|&c| hex(c)),
                ) else {
                    return Err(PathError::BadEncoding);
                };
                let byte = (h * 16 + l) as u8;
                if byte == b'/' && slash == EncodedSlash::Reject {
                    return Err(PathError::EncodedSlash);
                }
                match decodes(byte) {
                    true => out.push(byte as char),
                    false => {
                        out.push('%');
                        out.push_str(&format!("{byte:02X}"));
                    }
                }
                i += 3;
            }
            c => {
                // the rest of a valid target is ASCII
                out.push(c as char);
                i += 1;
            }
        }
    }
    Ok(out)
}

/// Whether an encoded byte is decoded: RFC 3986's unreserved characters
/// and the sub-delimiters, `:` and `@` (all allowed raw in a segment).
fn decodes(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@".contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn norm(p: &str) -> Result<String, PathError> {
        normalize_path(p, &PathRules::default()).map(Cow::into_owned)
    }

    #[test]
    fn the_forms_of_one_path() {
        for (from, to) in [
            ("/", "/"),
            ("/v1/labels", "/v1/labels"),
            ("/v1/labels/", "/v1/labels/"),
            ("/v1/%6cabels", "/v1/labels"),
            ("/v1/labels:batc%68", "/v1/labels:batch"),
            ("/v1/labels%3abatch", "/v1/labels:batch"),
            ("//v1//labels:batch", "/v1/labels:batch"),
            ("/v1/x/../labels:batch", "/v1/labels:batch"),
            ("/v1/./labels", "/v1/labels"),
            ("/v1/%2E%2e/v1/labels", "/v1/labels"),
            ("/..", "/"),
            ("/../../a", "/a"),
            ("/a/b/..", "/a/"),
            ("/a/.", "/a/"),
            ("//", "/"),
            ("/a%20b", "/a%20b"),
            ("/a%c3%a9", "/a%C3%A9"),
            ("/a%25", "/a%25"),
            ("/a%3F", "/a%3F"),
        ] {
            assert_eq!(norm(from).as_deref(), Ok(to), "{from}");
        }
    }

    #[test]
    fn what_has_no_normal_form() {
        assert_eq!(norm("v1"), Err(PathError::NotAbsolute));
        assert_eq!(norm("*"), Err(PathError::NotAbsolute));
        assert_eq!(norm("/a%2"), Err(PathError::BadEncoding));
        assert_eq!(norm("/a%zz"), Err(PathError::BadEncoding));
        assert_eq!(norm("/a%2fb"), Err(PathError::EncodedSlash));
        assert_eq!(norm("/a\\b"), Err(PathError::Backslash));
        let keep = PathRules {
            encoded_slash: EncodedSlash::Keep,
            ..PathRules::default()
        };
        assert_eq!(normalize_path("/a%2fb", &keep).unwrap(), "/a%2Fb");
    }

    /// The one-pass check, against the definition it stands for.
    fn is_normal_by_segments(p: &[u8], merge: bool) -> bool {
        if p.iter().any(|&b| b == b'%' || b == b'\\') {
            return false;
        }
        let segments: Vec<&[u8]> = p[1..].split(|&b| b == b'/').collect();
        segments.iter().enumerate().all(|(i, seg)| match *seg {
            b"." | b".." => false,
            b"" => !merge || i == segments.len() - 1,
            _ => true,
        })
    }

    proptest! {
        #[test]
        fn the_quick_check_is_the_segment_one(rest in "[a./%\\\\]{0,8}", merge in any::<bool>()) {
            let p = format!("/{rest}");
            prop_assert_eq!(is_normal(p.as_bytes(), merge), is_normal_by_segments(p.as_bytes(), merge), "{}", p);
        }
    }

    #[test]
    fn slashes_can_be_kept() {
        let keep = PathRules {
            merge_slashes: false,
            ..PathRules::default()
        };
        assert_eq!(normalize_path("/a//b/", &keep).unwrap(), "/a//b/");
        assert_eq!(normalize_path("/a//b/../c", &keep).unwrap(), "/a//c");
        assert!(matches!(
            normalize_path("/a//b", &keep),
            Ok(Cow::Borrowed(_))
        ));
    }

    /// A segment of a path and some way of writing it.
    fn written() -> impl Strategy<Value = (String, String)> {
        let seg = "[a-zA-Z0-9_:~.-]{1,6}";
        (seg, any::<u64>()).prop_map(|(s, bits)| {
            // each character encoded or not, in upper or lower case
            let mut w = String::new();
            for (i, c) in s.chars().enumerate() {
                match (bits >> (2 * (i % 32))) & 3 {
                    0 | 1 => w.push(c),
                    2 => w.push_str(&format!("%{:02X}", c as u32)),
                    _ => w.push_str(&format!("%{:02x}", c as u32)),
                }
            }
            (s, w)
        })
    }

    proptest! {
        #[test]
        fn any_writing_of_a_path_has_the_normal_form_of_the_path(
            parts in proptest::collection::vec((written(), 0u8..6), 1..6),
        ) {
            // the path as a service reads it, and as a client may write
            // it: with encodings, dot segments and extra slashes
            let mut plain: Vec<String> = Vec::new();
            let mut w = String::new();
            for ((s, enc), extra) in parts {
                if s == "." || s == ".." {
                    continue;
                }
                match extra {
                    0 => w.push_str("/x/.."),
                    1 => w.push_str("/."),
                    2 => w.push('/'),
                    3 => w.push_str("/%2e"),
                    _ => {}
                }
                w.push('/');
                w.push_str(&enc);
                plain.push(s);
            }
            let want = if plain.is_empty() { "/".to_string() } else { format!("/{}", plain.join("/")) };
            if w.is_empty() {
                w.push('/');
            }
            let got = norm(&w).unwrap();
            prop_assert_eq!(&got, &want, "{}", w);
            // and the normal form is its own
            prop_assert!(matches!(normalize_path(&got, &PathRules::default()), Ok(Cow::Borrowed(_))));
        }

        #[test]
        fn normalizing_twice_changes_nothing(p in "/[a-z%0-9A-F./\\\\:]{0,24}") {
            if let Ok(once) = norm(&p) {
                prop_assert_eq!(norm(&once).unwrap(), once);
            }
        }
    }
}
