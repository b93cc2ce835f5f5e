//! The request head the codec writes, as hyper's clients take it: a URI
//! and fields. The head is written by [`write_head`] and read back, so
//! every rule of what goes upstream (hop-by-hop fields left behind,
//! `X-Forwarded-*`, `Host`, the framing field) has one implementation for
//! every client, the own one and hyper's alike.
//!
//! For HTTP/2 the head is then fitted to the version: the `Host` the
//! codec chose becomes the `:authority` (RFC 9113 §8.3.1: an intermediary
//! takes it from `Host`), and `Transfer-Encoding`, which HTTP/2 forbids,
//! is left out (DATA frames delimit the body; a length stays as the
//! codec wrote it).

use bytes::{BufMut, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::uri::Authority;
use http::Uri;

use super::forwarded::Via;
use super::request::{write_head, BodyFraming, Target};
use crate::upstream::error::UpstreamError;

/// The HTTP version the head is fitted to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Version {
    /// HTTP/1.1: `Host` stays a field; the URI names the upstream
    /// (hyper's HTTP/1.1 client, which the tests hold the own one
    /// against).
    #[cfg_attr(not(test), allow(dead_code))]
    Http1,
    /// HTTP/2: `Host` becomes the URI's authority (`:authority`).
    Http2,
}

/// The head the codec writes for `parts` (`framing`: its body's, if it
/// has one), as an absolute URI and fields for hyper.
pub(crate) fn hyper_head(
    target: &Target,
    parts: &http::request::Parts,
    via: Via<'_>,
    framing: Option<BodyFraming>,
    version: Version,
) -> Result<(Uri, HeaderMap), UpstreamError> {
    let mut head = BytesMut::with_capacity(512);
    write_head(&mut head, target, parts, via, framing);
    let mut fields = vec![httparse::EMPTY_HEADER; parts.headers.len() + 8];
    let mut parsed = httparse::Request::new(&mut fields);
    if !matches!(parsed.parse(&head), Ok(httparse::Status::Complete(_))) {
        return Err(UpstreamError::Protocol("request head not written whole"));
    }
    let mut headers = HeaderMap::with_capacity(parsed.headers.len());
    let mut host = None;
    for f in parsed.headers.iter() {
        let name = HeaderName::from_bytes(f.name.as_bytes());
        let value = HeaderValue::from_bytes(f.value);
        let (Ok(name), Ok(value)) = (name, value) else {
            continue;
        };
        if version == Version::Http2 {
            if name == header::HOST {
                host = Authority::try_from(value.as_bytes()).ok();
                continue;
            }
            if name == header::TRANSFER_ENCODING {
                continue;
            }
        }
        headers.append(name, value);
    }
    // hyper takes the absolute form: it writes the origin form over
    // HTTP/1.1, `:scheme`, `:authority` and `:path` over HTTP/2
    let authority = host.as_ref().unwrap_or(target.authority());
    let mut uri = BytesMut::with_capacity(64);
    uri.put_slice(target.scheme().as_bytes());
    uri.put_slice(b"://");
    uri.put_slice(authority.as_str().as_bytes());
    target.put_target(&parts.uri, &mut uri);
    let uri = Uri::from_maybe_shared(uri.freeze())
        .map_err(|_| UpstreamError::Protocol("request target not in absolute form"))?;
    Ok((uri, headers))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Request;

    fn head(
        req: http::request::Builder,
        framing: Option<BodyFraming>,
        v: Version,
    ) -> (Uri, HeaderMap) {
        let (parts, ()) = req.body(()).unwrap().into_parts();
        let target = Target::new(&"https://up.example:8443/base".parse().unwrap());
        hyper_head(&target, &parts, Via::UNKNOWN, framing, v).unwrap()
    }

    #[test]
    fn http2_takes_host_as_its_authority_and_drops_chunked() {
        let req = Request::post("/x?q=1")
            .header("host", "api.example")
            .header("transfer-encoding", "chunked")
            .header("connection", "close")
            .header("x-a", "1");
        let (uri, h) = head(req, Some(BodyFraming::Chunked), Version::Http2);
        assert_eq!(uri, "https://api.example/base/x?q=1");
        assert!(h.get("host").is_none());
        assert!(h.get("transfer-encoding").is_none());
        assert!(h.get("connection").is_none());
        assert_eq!(h["x-a"], "1");
        assert_eq!(h["x-forwarded-proto"], "http");
    }

    #[test]
    fn http1_keeps_host_and_framing_and_names_the_upstream() {
        let req = Request::post("/x").header("host", "api.example");
        let (uri, h) = head(req, Some(BodyFraming::Length(3)), Version::Http1);
        assert_eq!(uri, "https://up.example:8443/base/x");
        assert_eq!(h["host"], "api.example");
        assert_eq!(h["content-length"], "3");
    }

    #[test]
    fn http2_without_a_host_names_the_upstream() {
        let (uri, h) = head(Request::get("/x"), None, Version::Http2);
        assert_eq!(uri, "https://up.example:8443/base/x");
        assert!(h.get("host").is_none());
    }
}
