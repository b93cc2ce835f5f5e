//! Where a field lives in a TOML text: field paths to lines and back.
//!
//! Validation speaks in field paths (`plans.free.policies[1].w`); people
//! read files by line. This module parses the text a second time into a
//! tree that remembers the byte span of every value, so a path can be
//! turned into a line and column, and a byte offset into the path of the
//! innermost value around it.

use std::ops::Range;

use toml_edit::{ImDocument, Item, Value};

/// One value of the document: its path, the span of its key and of the
/// value itself (either may be unknown, as for implicit tables).
#[derive(Debug)]
struct Entry {
    path: String,
    key: Option<Range<usize>>,
    value: Option<Range<usize>>,
}

/// A parsed document: every value's path and spans.
pub(crate) struct Doc<'a> {
    text: &'a str,
    parsed: bool,
    entries: Vec<Entry>,
}

fn walk_item(path: &str, key: Option<Range<usize>>, item: &Item, out: &mut Vec<Entry>) {
    out.push(Entry {
        path: path.to_string(),
        key,
        value: item.span(),
    });
    match item {
        Item::Table(t) => {
            for (k, v) in t.iter() {
                let ks = t.key(k).and_then(|k| k.span());
                walk_item(&child(path, k), ks, v, out);
            }
        }
        Item::ArrayOfTables(a) => {
            for (i, t) in a.iter().enumerate() {
                let p = format!("{path}[{i}]");
                out.push(Entry {
                    path: p.clone(),
                    key: t.span(),
                    value: t.span(),
                });
                for (k, v) in t.iter() {
                    let ks = t.key(k).and_then(|k| k.span());
                    walk_item(&child(&p, k), ks, v, out);
                }
            }
        }
        Item::Value(v) => walk_value(path, v, out),
        Item::None => {}
    }
}

fn walk_value(path: &str, v: &Value, out: &mut Vec<Entry>) {
    match v {
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                let p = format!("{path}[{i}]");
                out.push(Entry {
                    path: p.clone(),
                    key: None,
                    value: x.span(),
                });
                walk_value(&p, x, out);
            }
        }
        Value::InlineTable(t) => {
            for (k, x) in t.iter() {
                let p = child(path, k);
                out.push(Entry {
                    path: p.clone(),
                    key: t.key(k).and_then(|k| k.span()),
                    value: x.span(),
                });
                walk_value(&p, x, out);
            }
        }
        _ => {}
    }
}

fn child(path: &str, key: &str) -> String {
    match path.is_empty() {
        true => key.to_string(),
        false => format!("{path}.{key}"),
    }
}

/// The parent of a path (`a.b[1].c` → `a.b[1]` → `a.b` → `a` → ``).
fn parent(path: &str) -> Option<&str> {
    if path.is_empty() {
        return None;
    }
    let cut = path.rfind(['.', '[']).unwrap_or(0);
    Some(&path[..cut])
}

impl<'a> Doc<'a> {
    /// Parses `text`; a text that does not parse gives a doc that locates
    /// nothing.
    pub(crate) fn parse(text: &'a str) -> Self {
        let mut entries = Vec::new();
        let parsed = match ImDocument::parse(text) {
            Ok(doc) => {
                for (k, v) in doc.as_table().iter() {
                    let ks = doc.as_table().key(k).and_then(|k| k.span());
                    walk_item(k, ks, v, &mut entries);
                }
                true
            }
            Err(_) => false,
        };
        Doc {
            text,
            parsed,
            entries,
        }
    }

    /// Whether the text parsed.
    pub(crate) fn is_parsed(&self) -> bool {
        self.parsed
    }

    /// Whether `span` is exactly where a key is written (and not also the
    /// span of its value, as for a table of an array of tables).
    pub(crate) fn is_key(&self, span: &Range<usize>) -> bool {
        self.entries
            .iter()
            .any(|e| e.key.as_ref() == Some(span) && e.value.as_ref() != Some(span))
    }

    /// Whether the document holds a value at exactly `path`.
    pub(crate) fn has(&self, path: &str) -> bool {
        self.entries.iter().any(|e| e.path == path)
    }

    /// Where the value at `path` is written (its key, or the value when it
    /// has no key), or its nearest ancestor that is.
    pub(crate) fn span_of(&self, path: &str) -> Option<Range<usize>> {
        let mut p = Some(path);
        while let Some(cur) = p {
            let found = self
                .entries
                .iter()
                .filter(|e| e.path == cur)
                .find_map(|e| e.key.clone().or_else(|| e.value.clone()));
            if found.is_some() {
                return found;
            }
            p = parent(cur);
        }
        None
    }

    /// The path of the innermost value whose key or value holds `offset`.
    pub(crate) fn path_at(&self, offset: usize) -> String {
        let holds = |r: &Option<Range<usize>>| r.as_ref().is_some_and(|r| r.contains(&offset));
        self.entries
            .iter()
            .filter(|e| holds(&e.key) || holds(&e.value))
            .max_by_key(|e| e.path.len())
            .map(|e| e.path.clone())
            .unwrap_or_default()
    }

    /// The 1-based line and column of a byte offset.
    pub(crate) fn line_col(&self, offset: usize) -> (usize, usize) {
        line_col(self.text, offset)
    }
}

/// The 1-based line and column of a byte offset in `text`.
pub(crate) fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = &text.as_bytes()[..offset];
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let start = before
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |i| i + 1);
    let col = String::from_utf8_lossy(&before[start..]).chars().count() + 1;
    (line, col)
}

/// What is wrong at byte `offset` of `text` when the TOML parser says
/// nothing (it gives no message for some characters, such as a control
/// character in a comment on the last line): the character found there.
pub(crate) fn unexpected_at(text: &str, offset: usize) -> String {
    match text.get(offset..).and_then(|rest| rest.chars().next()) {
        Some(c) if c.is_control() => format!(
            "unexpected control character {c:?}; comments, keys and strings may not hold one (write it as an escape in a string)"
        ),
        Some(c) => format!("unexpected character {c:?}"),
        None => "unexpected end of the file".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"[gateway]
listen = "127.0.0.1:0"

[plans.free]
policies = [
  { name = "burst", algorithm = "token_bucket", q = 20, w = 2 },
  { name = "daily", algorithm = "daily", q = 10000 },
]

[keys]
"sk.dotted" = "free"

[[routes]]
path = "/v1/login"
"#;

    #[test]
    fn paths_find_their_lines() {
        let d = Doc::parse(TEXT);
        let at = |p: &str| d.line_col(d.span_of(p).unwrap().start).0;
        assert_eq!(at("gateway.listen"), 2);
        assert_eq!(at("plans.free.policies[1].q"), 7);
        // a missing field falls back to its table
        assert_eq!(at("plans.free.policies[1].w"), 7);
        assert_eq!(at("keys.sk.dotted"), 11);
        assert_eq!(at("routes[0].path"), 14);
        assert!(d.span_of("nothing.here").is_none());
    }

    #[test]
    fn offsets_find_their_paths() {
        let d = Doc::parse(TEXT);
        let off = TEXT.find("10000").unwrap();
        assert_eq!(d.path_at(off), "plans.free.policies[1].q");
        assert_eq!(d.path_at(TEXT.find("/v1/login").unwrap()), "routes[0].path");
    }

    #[test]
    fn line_and_column() {
        assert_eq!(line_col("ab\ncd", 0), (1, 1));
        assert_eq!(line_col("ab\ncd", 4), (2, 2));
        assert_eq!(line_col("ab", 99), (1, 3));
    }

    #[test]
    fn a_syntax_error_the_parser_leaves_unsaid_is_described() {
        assert!(unexpected_at("#\0", 1).contains("control character '\\0'"));
        assert_eq!(unexpected_at("a", 0), "unexpected character 'a'");
        assert_eq!(unexpected_at("a", 1), "unexpected end of the file");
        assert_eq!(unexpected_at("a", 7), "unexpected end of the file");
        // through the whole parser: a message, on the line and column
        for text in ["#\0", "[gateway]\n# \u{7}"] {
            let e = crate::GatewayConfig::parse(text, "gw.toml", None).unwrap_err();
            assert!(e.message().contains("control character"), "{e}");
            assert_eq!(e.kind(), paceline_server::ConfigErrorKind::Syntax);
        }
        let e = crate::GatewayConfig::parse("#\0", "gw.toml", None).unwrap_err();
        assert_eq!((e.line(), e.column()), (1, 2));
    }

    #[test]
    fn parents() {
        assert_eq!(parent("a.b[2].c"), Some("a.b[2]"));
        assert_eq!(parent("a.b[2]"), Some("a.b"));
        assert_eq!(parent("a"), Some(""));
        assert_eq!(parent(""), None);
    }
}
