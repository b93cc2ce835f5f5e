//! A YAML document as a tree whose every node knows its line, so that the
//! configuration's errors can point at the line at fault.
//!
//! Why not a serde deserializer: envoyproxy/ratelimit's files are small,
//! and a tree of marked nodes gives every error (an unknown key, a key
//! twice at one level, a number out of range) the line of the node itself,
//! not of wherever a deserializer happened to stop. The parsing is
//! `yaml-rust2`'s event parser; this module only builds the tree.

use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::{Marker, TScalarStyle};

/// One node of the tree.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Node {
    /// 1-based line of the node's start.
    pub(crate) line: usize,
    pub(crate) kind: Kind,
}

/// What a node holds.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Kind {
    /// A scalar; `plain` when it was written without quotes (so `true`
    /// and `10` are a boolean and a number, `"10"` a string).
    Scalar { text: String, plain: bool },
    /// A sequence.
    Seq(Vec<Node>),
    /// A mapping: keys (scalars, with their line) in file order.
    Map(Vec<(String, usize, Node)>),
}

/// Why a document could not be read as a tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct YamlError {
    pub(crate) line: usize,
    pub(crate) message: String,
}

/// Reads one YAML document. An empty document is `None`. Anchors and
/// aliases, non-scalar keys, a key twice in one mapping and several
/// documents in one file are errors.
pub(crate) fn parse(text: &str) -> Result<Option<Node>, YamlError> {
    let mut b = Builder::default();
    let mut parser = Parser::new_from_str(text);
    parser.load(&mut b, true).map_err(|e| YamlError {
        line: e.marker().line(),
        message: e.info().to_string(),
    })?;
    if let Some(e) = b.error {
        return Err(e);
    }
    if b.documents > 1 {
        return Err(YamlError {
            line: b.second_document_line,
            message: "one document per file (a domain per file); this is a second one".into(),
        });
    }
    Ok(b.root)
}

enum Open {
    Seq(usize, Vec<Node>),
    /// line, entries, a key waiting for its value
    Map(usize, Vec<(String, usize, Node)>, Option<(String, usize)>),
}

#[derive(Default)]
struct Builder {
    stack: Vec<Open>,
    root: Option<Node>,
    error: Option<YamlError>,
    documents: usize,
    second_document_line: usize,
}

impl Builder {
    fn fail(&mut self, line: usize, message: impl Into<String>) {
        if self.error.is_none() {
            self.error = Some(YamlError {
                line,
                message: message.into(),
            });
        }
    }

    /// A finished node goes into whatever is open (or becomes the root).
    fn push(&mut self, node: Node) {
        let line = node.line;
        match self.stack.last_mut() {
            None => self.root = Some(node),
            Some(Open::Seq(_, items)) => items.push(node),
            Some(Open::Map(_, entries, pending)) => match pending.take() {
                Some((k, kline)) => {
                    if entries.iter().any(|(e, _, _)| *e == k) {
                        let msg = format!("key {k:?} appears twice at this level");
                        self.fail(kline, msg);
                    } else {
                        entries.push((k, kline, node));
                    }
                }
                None => match node.kind {
                    Kind::Scalar { text, .. } => *pending = Some((text, line)),
                    _ => self.fail(line, "a mapping key must be a plain scalar"),
                },
            },
        }
    }
}

impl MarkedEventReceiver for Builder {
    fn on_event(&mut self, ev: Event, mark: Marker) {
        let line = mark.line();
        match ev {
            Event::DocumentStart => {
                self.documents += 1;
                if self.documents == 2 {
                    self.second_document_line = line;
                }
            }
            Event::Alias(_) => self.fail(line, "anchors and aliases are not supported"),
            Event::Scalar(text, style, anchor, _) => {
                if anchor != 0 {
                    self.fail(line, "anchors and aliases are not supported");
                }
                let plain = style == TScalarStyle::Plain;
                self.push(Node {
                    line,
                    kind: Kind::Scalar { text, plain },
                });
            }
            Event::SequenceStart(anchor, _) | Event::MappingStart(anchor, _) if anchor != 0 => {
                self.fail(line, "anchors and aliases are not supported");
                self.stack.push(match ev {
                    Event::SequenceStart(..) => Open::Seq(line, Vec::new()),
                    _ => Open::Map(line, Vec::new(), None),
                });
            }
            Event::SequenceStart(..) => self.stack.push(Open::Seq(line, Vec::new())),
            Event::MappingStart(..) => self.stack.push(Open::Map(line, Vec::new(), None)),
            Event::SequenceEnd | Event::MappingEnd => {
                let node = match self.stack.pop() {
                    Some(Open::Seq(l, items)) => Node {
                        line: l,
                        kind: Kind::Seq(items),
                    },
                    Some(Open::Map(l, entries, _)) => Node {
                        line: l,
                        kind: Kind::Map(entries),
                    },
                    None => return,
                };
                self.push(node);
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_and_kinds() {
        let n = parse("a: 1\nb:\n  - x\n  - \"y\"\n").unwrap().unwrap();
        let Kind::Map(e) = n.kind else { panic!() };
        assert_eq!(e[0].0, "a");
        assert_eq!(e[1].1, 2);
        let Kind::Seq(items) = &e[1].2.kind else {
            panic!()
        };
        assert_eq!(items[1].line, 4);
        assert_eq!(
            items[1].kind,
            Kind::Scalar {
                text: "y".into(),
                plain: false
            }
        );
    }

    #[test]
    fn duplicate_keys_are_errors() {
        let e = parse("a: 1\nb: 2\na: 3\n").unwrap_err();
        assert_eq!(e.line, 3);
        assert!(e.message.contains("twice"), "{}", e.message);
    }

    #[test]
    fn broken_yaml_is_located() {
        let e = parse("a: [1, 2\nb: 3\n").unwrap_err();
        assert!(e.line >= 1);
        assert!(parse("").unwrap().is_none());
        assert!(parse("a: &x 1\nb: *x\n").is_err());
        assert!(parse("a: 1\n---\nb: 2\n").is_err());
    }
}
