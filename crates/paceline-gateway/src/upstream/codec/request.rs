//! The request-head writer: the request line in origin form under the
//! upstream's base path, the client's end-to-end fields with `Host` and
//! `X-Forwarded-*` (by the rules of [`super::forwarded`]), and the framing
//! of the body that follows (its length, or chunks, each written by
//! [`put_data`]).

use bytes::{BufMut, BytesMut};
use http::header::{self, HeaderName};
use http::uri::{Authority, PathAndQuery};
use http::{Method, Uri};
use http_body::Body;

use super::forwarded::{Chains, Via};
use super::hop::{connection_named, is_hop_by_hop};

/// Where requests go: the upstream's scheme, authority and base path.
#[derive(Debug)]
pub(crate) struct Target {
    /// The authority, without the scheme's default port (`Host` is
    /// written from it when the client sent none).
    authority: Authority,
    /// The port connected to.
    port: u16,
    /// `https://`.
    https: bool,
    /// The upstream's base path without a trailing `/` (often empty).
    base: String,
}

impl Target {
    /// The target of `upstream` (`http[s]://host[:port][/base]`; the port
    /// by default 80, or 443 for `https`).
    pub(crate) fn new(upstream: &Uri) -> Target {
        let https = upstream.scheme() == Some(&http::uri::Scheme::HTTPS);
        let default = if https { 443 } else { 80 };
        let parts = upstream.clone().into_parts();
        let authority = parts
            .authority
            .unwrap_or_else(|| Authority::from_static("127.0.0.1"));
        let port = authority.port_u16().unwrap_or(default);
        // `host:443` of an https upstream is written `host`
        let authority = match authority.port_u16() == Some(default) {
            true => Authority::try_from(authority.host()).unwrap_or(authority),
            false => authority,
        };
        Target {
            authority,
            port,
            https,
            base: parts
                .path_and_query
                .map(|p| p.path().trim_end_matches('/').to_string())
                .unwrap_or_default(),
        }
    }

    /// The upstream's authority (without the scheme's default port).
    pub(crate) fn authority(&self) -> &Authority {
        &self.authority
    }

    /// Whether the upstream is `https://`.
    pub(crate) fn is_https(&self) -> bool {
        self.https
    }

    /// The upstream's scheme, as an absolute URI or `:scheme` names it.
    pub(crate) fn scheme(&self) -> &'static str {
        match self.https {
            true => "https",
            false => "http",
        }
    }

    /// The host to connect to (an IPv6 address without its brackets).
    pub(crate) fn host(&self) -> &str {
        let host = self.authority.host();
        host.strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host)
    }

    /// The port to connect to.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// Writes the request target sent upstream, in origin form: the
    /// upstream's base path, then the client's path and query.
    pub(crate) fn put_target(&self, uri: &Uri, out: &mut BytesMut) {
        let pq = uri.path_and_query().map_or("/", PathAndQuery::as_str);
        // `OPTIONS *` asks about the server as a whole: no base path
        if pq != "*" {
            out.put_slice(self.base.as_bytes());
        }
        out.put_slice(pq.as_bytes());
    }
}

/// How a streamed request body is framed upstream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BodyFraming {
    /// `Content-Length` of this many bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
}

impl BodyFraming {
    /// How `body` goes upstream; `None`: there is none.
    pub(crate) fn of<B: Body>(body: &B) -> Option<BodyFraming> {
        match (body.is_end_stream(), body.size_hint().exact()) {
            (true, _) => None,
            (false, Some(n)) => Some(BodyFraming::Length(n)),
            (false, None) => Some(BodyFraming::Chunked),
        }
    }
}

/// Writes a whole request head to `out`: the request line, the fields
/// ([`put_fields`]), the field that frames the body (its length, or
/// `chunked`; a request without a body says `content-length: 0` when the
/// client sent a length or its method expects a body) and the empty line.
pub(crate) fn write_head(
    out: &mut BytesMut,
    target: &Target,
    parts: &http::request::Parts,
    via: Via<'_>,
    framing: Option<BodyFraming>,
) {
    out.put_slice(parts.method.as_str().as_bytes());
    out.put_u8(b' ');
    target.put_target(&parts.uri, out);
    out.put_slice(b" HTTP/1.1\r\n");
    let had_length = put_fields(parts, target.authority(), via, out);
    match framing {
        None if had_length || expects_body(&parts.method) => {
            out.put_slice(b"content-length: 0\r\n")
        }
        None => {}
        Some(BodyFraming::Length(n)) => {
            out.put_slice(b"content-length: ");
            out.put_slice(itoa::Buffer::new().format(n).as_bytes());
            out.put_slice(b"\r\n");
        }
        Some(BodyFraming::Chunked) => out.put_slice(b"transfer-encoding: chunked\r\n"),
    }
    out.put_slice(b"\r\n");
}

/// Methods whose requests are expected to carry a body.
fn expects_body(m: &Method) -> bool {
    m == Method::POST || m == Method::PUT || m == Method::PATCH
}

/// Appends one piece of body to `out`, chunk-framed when `chunked`.
pub(crate) fn put_data(out: &mut BytesMut, data: &[u8], chunked: bool) {
    if data.is_empty() {
        return;
    }
    if chunked {
        use std::fmt::Write;
        // BytesMut grows as it is written to: this cannot fail
        let _ = write!(out, "{:x}\r\n", data.len());
        out.put_slice(data);
        out.put_slice(b"\r\n");
    } else {
        out.put_slice(data);
    }
}

/// Writes the request's fields as they go upstream: `Host` first (the
/// authority of an HTTP/2 or absolute-form request, or the client's
/// `Host`, or the upstream's), then the client's end-to-end fields, then
/// `X-Forwarded-For` with the client appended (and `Forwarded`, when the
/// client sent one), each passed on only from a trusted proxy, and
/// `X-Forwarded-Proto`.
/// Hop-by-hop fields (RFC 9110 §7.6.1, with any named in `Connection`) and
/// the client's framing fields stay behind; the caller writes the framing.
/// True when the client sent a `Content-Length`.
fn put_fields(
    parts: &http::request::Parts,
    upstream: &Authority,
    via: Via<'_>,
    out: &mut BytesMut,
) -> bool {
    let headers = &parts.headers;
    out.put_slice(b"host: ");
    // the target's authority wins over `Host` (RFC 9112 §3.2.2)
    match (parts.uri.authority(), headers.get(header::HOST)) {
        (Some(a), _) => out.put_slice(a.as_str().as_bytes()),
        (None, Some(h)) => out.put_slice(h.as_bytes()),
        (None, None) => out.put_slice(upstream.as_str().as_bytes()),
    }
    out.put_slice(b"\r\n");
    // fields the client named in `Connection` (rare: looked up only then)
    let named: Vec<HeaderName> = match headers.contains_key(header::CONNECTION) {
        false => Vec::new(),
        true => connection_named(headers),
    };
    let mut had_length = false;
    let mut chains = Chains::default();
    for (name, value) in headers {
        if name == header::HOST || name == X_FORWARDED_PROTO || is_hop_by_hop(name) {
            continue;
        }
        if name == header::CONTENT_LENGTH {
            had_length = true;
            continue;
        }
        if !named.is_empty() && named.contains(name) {
            continue;
        }
        if name == X_FORWARDED_FOR || name == header::FORWARDED {
            chains.field(&via, name == header::FORWARDED, value);
            continue;
        }
        out.put_slice(name.as_str().as_bytes());
        out.put_slice(b": ");
        out.put_slice(value.as_bytes());
        out.put_slice(b"\r\n");
    }
    chains.write(&via, out);
    out.put_slice(match via.tls {
        true => b"x-forwarded-proto: https\r\n".as_slice(),
        false => b"x-forwarded-proto: http\r\n".as_slice(),
    });
    had_length
}

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

#[cfg(test)]
mod tests {
    use super::*;
    use http::Request;

    /// The fields `put_fields` writes for a request with `fields` from a
    /// trusted peer.
    fn sent(fields: &[(&str, &str)], peer: Option<&str>) -> String {
        sent_via(fields, peer, true)
    }

    fn sent_via(fields: &[(&str, &str)], peer: Option<&str>, trusted: bool) -> String {
        let mut req = Request::get("/x");
        for (n, v) in fields {
            req = req.header(*n, *v);
        }
        let (parts, ()) = req.body(()).unwrap().into_parts();
        let mut out = BytesMut::new();
        let upstream = Authority::from_static("up:80");
        let trust = move |_| trusted;
        let via = Via {
            peer: peer.map(|p| p.parse().unwrap()),
            trusted: &trust,
            tls: fields.iter().any(|(n, v)| *n == "test-tls" && *v == "1"),
        };
        let len = put_fields(&parts, &upstream, via, &mut out);
        let text = String::from_utf8(out.to_vec()).unwrap();
        format!("{text}length={len}")
    }

    #[test]
    fn forwarded_for_is_appended_and_hop_by_hop_fields_stay_behind() {
        assert_eq!(
            sent(&[("host", "api.example")], Some("10.0.0.1")),
            "host: api.example\r\nx-forwarded-for: 10.0.0.1\r\nx-forwarded-proto: http\r\nlength=false"
        );
        let text = sent(
            &[
                ("x-forwarded-for", "10.0.0.1"),
                ("x-forwarded-for", "10.0.0.2"),
                ("connection", "keep-alive, x-secret"),
                ("x-secret", "1"),
                ("keep-alive", "timeout=5"),
                ("te", "trailers"),
                ("transfer-encoding", "chunked"),
                ("upgrade", "websocket"),
                ("x-forwarded-proto", "https"),
                ("content-length", "3"),
                ("authorization", "Bearer k"),
            ],
            Some("::1"),
        );
        assert_eq!(
            text,
            "host: up:80\r\nauthorization: Bearer k\r\n\
             x-forwarded-for: 10.0.0.1, 10.0.0.2, ::1\r\nx-forwarded-proto: http\r\nlength=true"
        );
        // without a known peer nothing the client sent is passed on
        assert!(!sent(&[("x-forwarded-for", "10.0.0.9")], None).contains("10.0.0.9"));
    }

    #[test]
    fn forwarding_fields_go_on_only_from_a_trusted_peer() {
        let spoof = [
            ("x-forwarded-for", "1.1.1.1"),
            ("forwarded", "for=1.1.1.1;proto=https"),
        ];
        // from a client: replaced by what the gateway saw
        assert_eq!(
            sent_via(&spoof, Some("203.0.113.7"), false),
            "host: up:80\r\nx-forwarded-for: 203.0.113.7\r\nforwarded: for=203.0.113.7\r\n\
             x-forwarded-proto: http\r\nlength=false"
        );
        // from a trusted proxy: appended to
        assert_eq!(
            sent_via(&spoof, Some("10.0.0.1"), true),
            "host: up:80\r\nx-forwarded-for: 1.1.1.1, 10.0.0.1\r\n\
             forwarded: for=1.1.1.1;proto=https, for=10.0.0.1\r\n\
             x-forwarded-proto: http\r\nlength=false"
        );
        // an IPv6 node is quoted in brackets
        assert!(sent_via(&spoof[1..], Some("2001:db8::7"), false)
            .contains("\r\nforwarded: for=\"[2001:db8::7]\"\r\n"));
        // no Forwarded field is made up for a request that sent none
        assert!(!sent_via(&[], Some("10.0.0.1"), false).contains("forwarded:"));
    }

    #[test]
    fn https_targets_default_to_443_and_leave_it_out_of_host() {
        let t = Target::new(&"https://api.example:443/v2".parse().unwrap());
        assert_eq!(
            (t.host(), t.port(), t.is_https()),
            ("api.example", 443, true)
        );
        assert_eq!(t.authority().as_str(), "api.example");
        assert_eq!(t.scheme(), "https");
        let t = Target::new(&"https://api.example".parse().unwrap());
        assert_eq!((t.port(), t.authority().as_str()), (443, "api.example"));
        let t = Target::new(&"https://[::1]:8443".parse().unwrap());
        assert_eq!((t.host(), t.port()), ("::1", 8443));
        assert_eq!(t.authority().as_str(), "[::1]:8443");
        let t = Target::new(&"http://up".parse().unwrap());
        assert_eq!((t.port(), t.is_https(), t.scheme()), (80, false, "http"));
        let t = Target::new(&"http://up:80".parse().unwrap());
        assert_eq!((t.port(), t.authority().as_str()), (80, "up"));
    }

    #[test]
    fn upstream_uris_keep_path_and_query() {
        let t = Target::new(&"http://127.0.0.1:9/api/".parse().unwrap());
        let target = |t: &Target, uri: &str| {
            let mut out = BytesMut::new();
            t.put_target(&uri.parse().unwrap(), &mut out);
            String::from_utf8(out.to_vec()).unwrap()
        };
        assert_eq!(target(&t, "/v1/rates?from=NYC"), "/api/v1/rates?from=NYC");
        let t = Target::new(&"http://127.0.0.1:9".parse().unwrap());
        assert_eq!(
            target(&t, "http://example.com/v1/rates?x=1"),
            "/v1/rates?x=1"
        );
    }

    #[test]
    fn a_tls_client_connection_is_forwarded_as_https_whatever_the_client_says() {
        let text = sent(&[("test-tls", "1"), ("x-forwarded-proto", "http")], None);
        assert!(text.contains("\r\nx-forwarded-proto: https\r\n"), "{text}");
        assert!(!text.contains("x-forwarded-proto: http\r\n"), "{text}");
        let text = sent(&[("x-forwarded-proto", "https")], None);
        assert!(text.contains("\r\nx-forwarded-proto: http\r\n"), "{text}");
    }
}
