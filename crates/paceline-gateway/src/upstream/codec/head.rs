//! The answer-head parser: a final response head out of the bytes read so
//! far, interim (`1xx`) heads skipped, and what the head says about how
//! its body is framed (RFC 9112 §6.3) and whether the connection lives on.

use bytes::{Buf, BytesMut};
use http::header::HeaderMap;
use http::{Method, StatusCode, Version};

use super::framing::{Chunk, Framing};
use crate::h1::{Places, Scan};
use crate::upstream::error::UpstreamError;

/// The longest response head accepted.
pub(crate) const MAX_HEAD: usize = 64 * 1024;
/// The most fields in a response head.
const MAX_FIELDS: usize = 100;

/// A final response head and how its body is framed.
#[derive(Debug)]
pub(crate) struct Head {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) framing: Framing,
    /// The connection may carry another request once the body is read.
    pub(crate) keep_alive: bool,
}

/// Parses a response head at the start of `buf`: `Ok(None)` when more
/// bytes are needed. Interim (`1xx`) heads are consumed and skipped.
pub(crate) fn parse_head(
    buf: &mut BytesMut,
    method: &Method,
) -> Result<Option<Head>, UpstreamError> {
    loop {
        // left uninitialised: the parser writes only the fields it finds
        let mut fields =
            [const { std::mem::MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_FIELDS];
        let mut res = httparse::Response::new(&mut []);
        let parsed = httparse::ParserConfig::default().parse_response_with_uninit_headers(
            &mut res,
            buf,
            &mut fields,
        );
        let len = match parsed {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(httparse::Error::TooManyHeaders) => {
                return Err(UpstreamError::Protocol("too many fields"))
            }
            Err(_) => return Err(UpstreamError::Protocol("unparsable head")),
        };
        let code = res.code.unwrap_or(0);
        let status =
            StatusCode::from_u16(code).map_err(|_| UpstreamError::Protocol("bad status code"))?;
        if status == StatusCode::SWITCHING_PROTOCOLS {
            return Err(UpstreamError::Protocol("protocol switch not supported"));
        }
        if status.is_informational() {
            buf.advance(len);
            continue;
        }
        let version = match res.version {
            Some(0) => Version::HTTP_10,
            _ => Version::HTTP_11,
        };
        // one pass: where each field is (its value will share the head's
        // bytes instead of being copied), and what frames the body
        let mut scan = Scan::default();
        let mut places = Places::default();
        places
            .record(buf, res.headers, &mut scan)
            .map_err(UpstreamError::Protocol)?;
        if scan.chunked.is_some() && version == Version::HTTP_10 {
            return Err(UpstreamError::Protocol(
                "transfer-encoding in an HTTP/1.0 answer",
            ));
        }
        if scan.chunked == Some(false) {
            return Err(UpstreamError::Protocol(
                "a transfer coding other than chunked",
            ));
        }
        let head = buf.split_to(len).freeze();
        // room for the fields the layers add on the way back
        let mut headers = places
            .map(&head, 6, false)
            .map_err(UpstreamError::Protocol)?;
        if scan.chunked.is_some() {
            // the chunks frame the body; a length beside them means nothing
            // and must not reach the client (RFC 9112 §6.3)
            headers.remove(http::header::CONTENT_LENGTH);
        }
        let framing = framing(&scan, status, method);
        let keep_alive = scan.keep_alive(version) && framing != Framing::Close;
        return Ok(Some(Head {
            status,
            headers,
            framing,
            keep_alive,
        }));
    }
}

/// How a response body is delimited (RFC 9112 §6.3).
fn framing(scan: &Scan, status: StatusCode, method: &Method) -> Framing {
    if method == Method::HEAD
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        return Framing::Length(0);
    }
    match (scan.chunked, scan.length) {
        (Some(_), _) => Framing::Chunked(Chunk::Size),
        (None, Some(n)) => Framing::Length(n),
        (None, None) => Framing::Close,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::h1::FEW;

    fn head(text: &str, method: Method) -> Result<Option<Head>, UpstreamError> {
        let mut b = BytesMut::from(text);
        parse_head(&mut b, &method)
    }

    #[test]
    fn heads_are_parsed_with_their_framing() {
        let h = head(
            "HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-a: 1\r\nx-a: 2\r\n\r\nok",
            Method::GET,
        )
        .unwrap()
        .unwrap();
        assert_eq!(h.status, 200);
        assert_eq!(h.framing, Framing::Length(2));
        assert!(h.keep_alive);
        assert_eq!(h.headers.get_all("x-a").iter().count(), 2);

        let h = head(
            "HTTP/1.1 200 OK\r\ntransfer-encoding: Chunked\r\n\r\n",
            Method::GET,
        )
        .unwrap()
        .unwrap();
        assert_eq!(h.framing, Framing::Chunked(Chunk::Size));
        // any other coding, a repeated one, or a coding in a 1.0 answer
        // is refused
        for te in ["gzip", "gzip, chunked", "chunked, chunked", ""] {
            let text = format!("HTTP/1.1 200 OK\r\ntransfer-encoding: {te}\r\n\r\n");
            assert!(head(&text, Method::GET).is_err(), "{te:?}");
        }
        let text = "HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\n\r\n";
        assert!(head(text, Method::GET).is_err());
        // chunks win over a length, which is dropped
        let h = head(
            "HTTP/1.1 200 OK\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n",
            Method::GET,
        )
        .unwrap()
        .unwrap();
        assert_eq!(h.framing, Framing::Chunked(Chunk::Size));
        assert!(h.headers.get("content-length").is_none());
        let h = head("HTTP/1.1 200 OK\r\n\r\n", Method::GET)
            .unwrap()
            .unwrap();
        assert_eq!(h.framing, Framing::Close);
        let h = head("HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\n", Method::HEAD)
            .unwrap()
            .unwrap();
        assert_eq!(h.framing, Framing::Length(0));
        let h = head("HTTP/1.1 304 Not Modified\r\n\r\n", Method::GET)
            .unwrap()
            .unwrap();
        assert_eq!(h.framing, Framing::Length(0));
        assert!(h.keep_alive);
        let h = head("HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n", Method::GET)
            .unwrap()
            .unwrap();
        assert!(!h.keep_alive, "1.0 closes unless asked to keep alive");
        let h = head(
            "HTTP/1.0 200 OK\r\ncontent-length: 0\r\nconnection: keep-alive\r\n\r\n",
            Method::GET,
        )
        .unwrap()
        .unwrap();
        assert!(h.keep_alive);
        let h = head(
            "HTTP/1.1 200 OK\r\nconnection: Close\r\ncontent-length: 0\r\n\r\n",
            Method::GET,
        )
        .unwrap()
        .unwrap();
        assert!(!h.keep_alive);
    }

    #[test]
    fn interim_answers_are_skipped_and_partial_heads_wait() {
        let mut b = BytesMut::from(
            "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\ncontent-length: 0\r\n\r\n",
        );
        let h = parse_head(&mut b, &Method::POST).unwrap().unwrap();
        assert_eq!(h.status, 201);
        assert!(b.is_empty());
        assert!(head("HTTP/1.1 200 OK\r\ncontent-le", Method::GET)
            .unwrap()
            .is_none());
        assert!(head("HTTP/1.1 100 Continue\r\n\r\n", Method::GET)
            .unwrap()
            .is_none());
    }

    #[test]
    fn malformed_heads_are_refused() {
        for text in [
            "HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: 1.5\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: 99999999999999999999\r\n\r\n",
            "HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\n\r\n",
            "HTTP/1.1 2x0 What\r\n\r\n",
            "SMTP ready\r\n\r\n",
        ] {
            assert!(head(text, Method::GET).is_err(), "{text:?}");
        }
        // repeated but equal lengths are one length
        let h = head(
            "HTTP/1.1 200 OK\r\ncontent-length: 2, 2\r\n\r\n",
            Method::GET,
        )
        .unwrap()
        .unwrap();
        assert_eq!(h.framing, Framing::Length(2));
    }

    #[test]
    fn heads_of_many_fields_are_read_whole() {
        for n in [FEW - 1, FEW, FEW + 1, MAX_FIELDS - 1] {
            let mut text = String::from("HTTP/1.1 200 OK\r\n");
            for i in 0..n {
                text.push_str(&format!("x-f{i}: {i}\r\n"));
            }
            text.push_str("content-length: 2\r\n\r\nok");
            let h = head(&text, Method::GET).unwrap().unwrap();
            assert_eq!(h.headers.len(), n + 1);
            assert_eq!(
                h.headers[format!("x-f{}", n - 1).as_str()],
                (n - 1).to_string().as_str()
            );
            assert_eq!(h.framing, Framing::Length(2));
        }
    }
}
