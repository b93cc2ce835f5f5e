//! The request-head parser: an HTTP/1.0 or HTTP/1.1 request head out of
//! the bytes a client sent so far, into the `http` types every stage of
//! the gateway reads, with what it says about its body and its
//! connection.
//!
//! The head is checked as RFC 9112 asks of a server that sits in front of
//! another: a body whose length could be read two ways is refused, not
//! guessed at, since the upstream might guess the other way (request
//! smuggling). So, beyond what hyper refuses:
//!
//! - `Transfer-Encoding` beside `Content-Length` is `400` (§6.3 allows
//!   either refusing it or going by the chunks and closing; the gateway
//!   refuses);
//! - a transfer coding other than `chunked` alone is `400` (the gateway
//!   can frame no other, and none travels on upstream);
//! - `Transfer-Encoding` in an HTTP/1.0 request is `400` (§6.1: its
//!   framing is faulty whatever it says).

use bytes::{Bytes, BytesMut};
use http::request::Parts;
#[cfg(test)]
use http::StatusCode;
use http::{Method, Request, Uri, Version};

use super::places::Places;
use super::scan::Scan;
use crate::edge::MAX_FIELDS;
use crate::upstream::{Chunk, Framing};

/// A request head and what it says about its body and its connection.
#[derive(Debug)]
pub(crate) struct RequestHead {
    /// Method, target, version and fields; the target and the values share
    /// the head's bytes.
    pub(crate) parts: Parts,
    /// How the body is delimited: by a length (`0` when the head announces
    /// none) or by chunks.
    pub(crate) framing: Framing,
    /// The client keeps the connection for another request after this one.
    pub(crate) keep_alive: bool,
    /// Any `Expect` field, or an `Upgrade` field: a request only hyper
    /// serves.
    pub(crate) unusual: bool,
    /// The client accepts trailer fields (`TE: trailers`).
    pub(crate) trailers: bool,
    /// The head's bytes, as read.
    pub(crate) raw: Bytes,
}

/// Why a request head is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HeadError {
    /// Longer than the bound, or more fields than [`MAX_FIELDS`]: `431`.
    TooLarge,
    /// Not a request head that can be read one way only: `400`, with what
    /// is wrong.
    Invalid(&'static str),
}

impl HeadError {
    /// The status the refusal is answered with.
    #[cfg(test)]
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            HeadError::TooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            HeadError::Invalid(_) => StatusCode::BAD_REQUEST,
        }
    }
}

/// Parses a request head at the start of `buf`, at most `max_head` bytes
/// long: `Ok(None)` while more bytes are needed. A complete head is taken
/// out of `buf`; what follows it (the body, a pipelined request) stays. A
/// refused head is left in `buf`.
pub(crate) fn parse_request(
    buf: &mut BytesMut,
    max_head: usize,
) -> Result<Option<RequestHead>, HeadError> {
    // left uninitialised: the parser writes only the fields it finds
    let mut fields =
        [const { std::mem::MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_FIELDS];
    let mut req = httparse::Request::new(&mut []);
    let parsed = httparse::ParserConfig::default().parse_request_with_uninit_headers(
        &mut req,
        buf,
        &mut fields,
    );
    let len = match parsed {
        Ok(httparse::Status::Complete(n)) if n <= max_head => n,
        Ok(httparse::Status::Complete(_)) => return Err(HeadError::TooLarge),
        Ok(httparse::Status::Partial) if buf.len() >= max_head => return Err(HeadError::TooLarge),
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooLarge),
        Err(httparse::Error::Version) => return Err(HeadError::Invalid("unsupported version")),
        Err(_) => return Err(HeadError::Invalid("unparsable head")),
    };
    let version = match req.version {
        Some(0) => Version::HTTP_10,
        _ => Version::HTTP_11,
    };
    let method = req.method.unwrap_or_default();
    let method =
        Method::from_bytes(method.as_bytes()).map_err(|_| HeadError::Invalid("bad method"))?;
    let target = req.path.unwrap_or_default();
    let target_at = target.as_ptr() as usize - buf.as_ptr() as usize;
    let target_end = target_at + target.len();
    // one pass: where each field is (its value will share the head's
    // bytes instead of being copied), and what frames the body
    let mut scan = Scan::default();
    let mut places = Places::default();
    places
        .record(buf, req.headers, &mut scan)
        .map_err(HeadError::Invalid)?;
    if scan.length_listed {
        // one length a field in a request (hyper's rule too), where an
        // answer's may list the same one again
        return Err(HeadError::Invalid("a list in content-length"));
    }
    let framing = match (scan.chunked, scan.length) {
        (Some(_), _) if version == Version::HTTP_10 => {
            return Err(HeadError::Invalid(
                "transfer-encoding in an HTTP/1.0 request",
            ))
        }
        (Some(_), Some(_)) => {
            return Err(HeadError::Invalid(
                "both transfer-encoding and content-length",
            ))
        }
        (Some(false), None) => {
            return Err(HeadError::Invalid("a transfer coding other than chunked"))
        }
        (Some(true), None) => Framing::Chunked(Chunk::Size),
        (None, n) => Framing::Length(n.unwrap_or(0)),
    };
    let head = buf.split_to(len).freeze();
    let read = Uri::from_maybe_shared(head.slice(target_at..target_end))
        .map_err(|_| HeadError::Invalid("bad request target"))
        .and_then(|uri| {
            // room for the fields the stages add on the way; the same
            // length given twice kept once, as hyper keeps it
            let headers = places.map(&head, 4, true);
            Ok((uri, headers.map_err(HeadError::Invalid)?))
        });
    let (uri, headers) = match read {
        Ok(read) => read,
        Err(e) => {
            // a refused head stays where it was, for whoever reads it next
            let mut whole = BytesMut::with_capacity(head.len() + buf.len());
            whole.extend_from_slice(&head);
            whole.extend_from_slice(buf);
            *buf = whole;
            return Err(e);
        }
    };
    let (mut parts, ()) = Request::new(()).into_parts();
    parts.method = method;
    parts.uri = uri;
    parts.version = version;
    parts.headers = headers;
    Ok(Some(RequestHead {
        parts,
        framing,
        keep_alive: scan.keep_alive(version),
        unusual: scan.expects || scan.upgrade,
        trailers: scan.trailers,
        raw: head,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &[u8]) -> Result<Option<RequestHead>, HeadError> {
        parse_request(&mut BytesMut::from(text), 8 * 1024)
    }

    fn head(text: &str) -> RequestHead {
        parse(text.as_bytes()).unwrap().unwrap()
    }

    #[test]
    fn a_head_is_read_into_its_parts_and_the_rest_stays() {
        let mut b = BytesMut::from(
            &b"POST /v1/labels?x=1 HTTP/1.1\r\nHost: api\r\nX-A: 1\r\nx-a: 2\r\nContent-Length: 3\r\n\r\nabcGET"[..],
        );
        let h = parse_request(&mut b, 1024).unwrap().unwrap();
        assert_eq!(h.parts.method, Method::POST);
        assert_eq!(h.parts.uri, "/v1/labels?x=1");
        assert_eq!(h.parts.version, Version::HTTP_11);
        assert_eq!(h.parts.headers["host"], "api");
        assert_eq!(h.parts.headers.get_all("x-a").iter().count(), 2);
        assert_eq!(h.framing, Framing::Length(3));
        assert!(h.keep_alive && !h.unusual && !h.trailers);
        assert_eq!(&b[..], b"abcGET");
        assert_eq!(h.raw.len(), 78);
    }

    #[test]
    fn a_refused_head_stays_in_the_buffer() {
        let target = format!("/{}", "a".repeat(70_000));
        for text in [
            format!("GET {target} HTTP/1.1\r\n\r\nnext"),
            "GET / HTTP/1.1\r\nx: a\x7fb\r\n\r\nnext".to_string(),
            "GET / HTTP/1.1\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\nnext".to_string(),
        ] {
            let mut b = BytesMut::from(text.as_bytes());
            assert!(parse_request(&mut b, 128 * 1024).is_err(), "{text:.40}");
            assert_eq!(&b[..], text.as_bytes());
        }
    }

    #[test]
    fn partial_heads_wait_and_long_ones_are_refused() {
        assert!(parse(b"GET / HTTP/1.1\r\nHost: a\r\n").unwrap().is_none());
        assert!(parse(b"GET / HT").unwrap().is_none());
        let long = format!("GET / HTTP/1.1\r\nx: {}\r\n", "a".repeat(9000));
        assert_eq!(parse(long.as_bytes()).unwrap_err(), HeadError::TooLarge);
        let complete_but_long = format!("{long}\r\n");
        assert_eq!(
            parse(complete_but_long.as_bytes()).unwrap_err(),
            HeadError::TooLarge
        );
        let many: String = (0..=MAX_FIELDS).map(|i| format!("x{i}: 1\r\n")).collect();
        let text = format!("GET / HTTP/1.1\r\n{many}\r\n");
        assert_eq!(parse(text.as_bytes()).unwrap_err(), HeadError::TooLarge);
        assert_eq!(HeadError::TooLarge.status(), 431);
    }

    #[test]
    fn bodies_are_framed_one_way_only() {
        assert_eq!(head("GET / HTTP/1.1\r\n\r\n").framing, Framing::Length(0));
        assert_eq!(
            head("POST / HTTP/1.1\r\ntransfer-encoding: Chunked\r\n\r\n").framing,
            Framing::Chunked(Chunk::Size)
        );
        assert_eq!(
            head("POST / HTTP/1.1\r\ncontent-length: 5\r\ncontent-length: 5\r\n\r\n").framing,
            Framing::Length(5)
        );
        for bad in [
            "POST / HTTP/1.1\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\n",
            "POST / HTTP/1.1\r\ncontent-length: -1\r\n\r\n",
            "POST / HTTP/1.1\r\ncontent-length: 5, 5\r\n\r\n",
            "POST / HTTP/1.1\r\ncontent-length: +5\r\n\r\n",
            "POST / HTTP/1.1\r\ncontent-length: 99999999999999999999\r\n\r\n",
            "POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\ncontent-length: 5\r\n\r\n",
            "POST / HTTP/1.1\r\ntransfer-encoding: gzip, chunked\r\n\r\n",
            "POST / HTTP/1.1\r\ntransfer-encoding: chunked, chunked\r\n\r\n",
            "POST / HTTP/1.1\r\ntransfer-encoding: gzip\r\n\r\n",
            "POST / HTTP/1.0\r\ntransfer-encoding: chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nbad name: 1\r\n\r\n",
            "POST / HTTP/1.1\r\nfolded: 1\r\n 2\r\n\r\n",
            "POST / HTTP/2.0\r\n\r\n",
            "POST  / HTTP/1.1\r\n\r\n",
            "POST /a b HTTP/1.1\r\n\r\n",
        ] {
            let e = parse(bad.as_bytes()).unwrap_err();
            assert_eq!(e.status(), 400, "{bad:?}: {e:?}");
        }
    }

    #[test]
    fn connections_and_expectations() {
        assert!(!head("GET / HTTP/1.1\r\nconnection: Close\r\n\r\n").keep_alive);
        assert!(!head("GET / HTTP/1.0\r\n\r\n").keep_alive);
        assert!(head("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n").keep_alive);
        // what only hyper serves: any expectation, a protocol switch
        for unusual in [
            "POST / HTTP/1.1\r\nexpect: 100-Continue\r\ncontent-length: 1\r\n\r\n",
            "POST / HTTP/1.1\r\nexpect: something\r\n\r\n",
            "GET / HTTP/1.1\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n",
        ] {
            assert!(head(unusual).unusual, "{unusual:?}");
        }
        assert!(!head("GET / HTTP/1.1\r\nte: gzip\r\n\r\n").unusual);
        assert!(!head("GET / HTTP/1.1\r\nte: gzip\r\n\r\n").trailers);
        assert!(head("GET / HTTP/1.1\r\nTE: gzip, Trailers\r\n\r\n").trailers);
        // an empty line before the request line is passed over
        assert_eq!(head("\r\nGET /x HTTP/1.1\r\n\r\n").parts.uri, "/x");
        // the other target forms
        assert_eq!(head("OPTIONS * HTTP/1.1\r\n\r\n").parts.uri, "*");
        let abs = head("GET http://api.example/v1?q HTTP/1.1\r\n\r\n");
        assert_eq!(abs.parts.uri.host(), Some("api.example"));
    }
}
