//! The request head as the gateway reads it once, before any stage looks
//! at it: the forms the limiter and the upstream could read two ways are
//! refused or brought to one.
//!
//! Why: every later stage (the shedder's classification, the limiter's
//! route and key, the idempotency layer, the head written upstream) reads
//! the request the gateway holds. If the upstream can read the same bytes
//! as another route, another host or another request, the limit counts
//! one thing while the upstream does another. So, before the intake:
//!
//! - the path is brought to its normal form ([`paceline_server::path`])
//!   and the request carries that form from here on, upstream included;
//!   with `gateway.paths.mode = "strict"`, a path not in normal form is
//!   answered `400` instead;
//! - `CONNECT` is answered `405` (the gateway opens no tunnels), charged
//!   to nothing;
//! - `*` as a target is taken only with `OPTIONS` (RFC 9112 §3.2.4);
//! - an HTTP/1.1 request without `Host` is refused (RFC 9112 §3.2), and
//!   so is user information in the target's authority or in `Host`
//!   (`http://user:pass@host/`, which RFC 9110 §4.2.4 forbids);
//! - an HTTP/2 request with more than [`MAX_FIELDS`] fields gets `431`,
//!   the bound HTTP/1.1's parser keeps;
//! - HTTP/2's cookie crumbs (one `cookie` field per pair) are joined into
//!   one field, as RFC 9113 §8.2.3 asks before HTTP/1.1;
//! - `Expect` is dropped: the gateway answers it itself (`100 Continue`
//!   once the request is admitted), and an upstream that saw it would
//!   answer it again.
//!
//! Each refusal is a problem answer that closes an HTTP/1 connection (the
//! body it left unread cannot be skipped safely).

use bytes::Bytes;
use http::header::{HeaderValue, CONNECTION, COOKIE, EXPECT, HOST};
use http::uri::{PathAndQuery, Uri};
use http::{Method, Request, Response, Version};
use paceline_server::path::normalize_path;
use paceline_wire::problem::{self, Problem, ProblemKind};

use crate::config::PathSettings;
use crate::edge::MAX_FIELDS;

/// Why a head is refused here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// `CONNECT`.
    Connect,
    /// A head the gateway will not read one way only: the detail says why.
    BadRequest(String),
    /// More fields than [`MAX_FIELDS`] (HTTP/2).
    TooManyFields,
}

/// Reads `req`'s head once (see the module documentation): brings its path
/// to normal form, joins cookie crumbs, drops `Expect`; or says why it is
/// refused.
pub(crate) fn screen<B>(req: &mut Request<B>, paths: &PathSettings) -> Result<(), Refused> {
    if req.method() == Method::CONNECT {
        return Err(Refused::Connect);
    }
    if req.version() >= Version::HTTP_2 && req.headers().len() > MAX_FIELDS {
        return Err(Refused::TooManyFields);
    }
    let (expect, cookies) = {
        let fields = Fields::of(req.headers());
        check_authority(req, fields.host)?;
        (fields.expect, fields.cookies)
    };
    normalize_target(req, paths)?;
    let headers = req.headers_mut();
    if expect {
        headers.remove(EXPECT);
    }
    if cookies > 1 {
        join_cookies(headers);
    }
    Ok(())
}

/// The fields the front reads: a short head's in one pass over it (what
/// most requests send, and cheaper than a lookup per name), a longer
/// one's by name.
struct Fields<'a> {
    /// The first `Host` value.
    host: Option<&'a HeaderValue>,
    expect: bool,
    /// `Cookie` values, counted up to two.
    cookies: usize,
}

/// The most fields a head is walked for (see [`Fields`]).
const SHORT_HEAD: usize = 8;

impl<'a> Fields<'a> {
    fn of(headers: &'a http::HeaderMap) -> Fields<'a> {
        if headers.len() > SHORT_HEAD {
            return Fields {
                host: headers.get(HOST),
                expect: headers.contains_key(EXPECT),
                cookies: headers.get_all(COOKIE).iter().take(2).count(),
            };
        }
        let mut f = Fields {
            host: None,
            expect: false,
            cookies: 0,
        };
        for (name, value) in headers {
            if name == HOST {
                f.host.get_or_insert(value);
            } else if name == EXPECT {
                f.expect = true;
            } else if name == COOKIE {
                f.cookies += 1;
            }
        }
        f
    }
}

/// `Host` (`host`, its first value) present on HTTP/1.1, and no user
/// information anywhere.
fn check_authority<B>(req: &Request<B>, host: Option<&HeaderValue>) -> Result<(), Refused> {
    if req.version() == Version::HTTP_11 && host.is_none() {
        return Err(bad("An HTTP/1.1 request must send Host."));
    }
    let in_target = req
        .uri()
        .authority()
        .is_some_and(|a| a.as_str().contains('@'));
    let in_host = host.is_some_and(|h| h.as_bytes().contains(&b'@'));
    if in_target || in_host {
        return Err(bad(
            "User information in the request target or Host is not accepted.",
        ));
    }
    Ok(())
}

/// The target's path in normal form (rewritten in place when it was not).
fn normalize_target<B>(req: &mut Request<B>, paths: &PathSettings) -> Result<(), Refused> {
    let uri = req.uri();
    if uri.path_and_query().is_some_and(|pq| pq.as_str() == "*") {
        return match req.method() == Method::OPTIONS {
            true => Ok(()),
            false => Err(bad("The target * is taken only with OPTIONS.")),
        };
    }
    let path = uri.path();
    let normal = match normalize_path(path, &paths.rules) {
        Ok(std::borrow::Cow::Borrowed(_)) => return Ok(()),
        Ok(std::borrow::Cow::Owned(n)) => n,
        Err(e) => {
            return Err(bad(&format!(
                "The request path cannot be read one way only: {e}."
            )))
        }
    };
    if paths.strict {
        return Err(bad(&format!(
            "The request path is not in normal form; send it as {normal}."
        )));
    }
    let pq = match uri.query() {
        Some(q) => format!("{normal}?{q}"),
        None => normal,
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(
        PathAndQuery::try_from(pq)
            .map_err(|_| bad("The request path cannot be read one way only."))?,
    );
    *req.uri_mut() = Uri::from_parts(parts).map_err(|_| bad("The request target is invalid."))?;
    Ok(())
}

/// Joins HTTP/2 cookie crumbs into one field (RFC 9113 §8.2.3).
fn join_cookies(headers: &mut http::HeaderMap) {
    let mut joined = Vec::new();
    for v in headers.get_all(COOKIE) {
        if !joined.is_empty() {
            joined.extend_from_slice(b"; ");
        }
        joined.extend_from_slice(v.as_bytes());
    }
    if let Ok(v) = HeaderValue::from_bytes(&joined) {
        headers.insert(COOKIE, v);
    }
}

fn bad(detail: &str) -> Refused {
    Refused::BadRequest(detail.to_string())
}

/// The answer to a refused head, its type under `base`; it closes an
/// HTTP/1 connection.
pub(crate) fn answer(r: &Refused, base: &str) -> Response<Bytes> {
    let p = match r {
        Refused::Connect => Problem::new(
            ProblemKind::MethodNotAllowed,
            base,
            "CONNECT is not forwarded.",
        ),
        Refused::BadRequest(detail) => Problem::new(ProblemKind::BadRequest, base, detail.clone()),
        Refused::TooManyFields => Problem::new(
            ProblemKind::HeadTooLarge,
            base,
            format!("The request has more than {MAX_FIELDS} header fields."),
        ),
    };
    let mut res = problem::answer(&p);
    res.headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
    res
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use paceline_server::path::EncodedSlash;

    fn req(method: &str, target: &str, version: Version) -> Request<()> {
        let mut b = Request::builder()
            .method(method)
            .uri(target)
            .version(version);
        if version == Version::HTTP_11 {
            b = b.header("host", "api.example");
        }
        b.body(()).unwrap()
    }

    fn screened(mut r: Request<()>) -> Result<Request<()>, Refused> {
        screen(&mut r, &PathSettings::default()).map(|()| r)
    }

    #[test]
    fn paths_go_on_in_normal_form_with_their_query() {
        let r = screened(req("POST", "/v1/%6Cabels:batch?x=%2F", Version::HTTP_11)).unwrap();
        assert_eq!(
            r.uri().path_and_query().unwrap().as_str(),
            "/v1/labels:batch?x=%2F"
        );
        let r = screened(req("GET", "http://api.example//v1/./x", Version::HTTP_11)).unwrap();
        assert_eq!(r.uri().to_string(), "http://api.example/v1/x");
        let strict = PathSettings {
            strict: true,
            ..PathSettings::default()
        };
        let mut r = req("GET", "/v1/%6Cabels", Version::HTTP_11);
        assert!(
            matches!(screen(&mut r, &strict), Err(Refused::BadRequest(d)) if d.contains("/v1/labels"))
        );
        let mut r = req("GET", "/v1/labels", Version::HTTP_11);
        assert_eq!(screen(&mut r, &strict), Ok(()));
        assert!(screened(req("GET", "/a%2Fb", Version::HTTP_11)).is_err());
        let keep = PathSettings {
            rules: paceline_server::path::PathRules {
                encoded_slash: EncodedSlash::Keep,
                ..Default::default()
            },
            ..PathSettings::default()
        };
        let mut r = req("GET", "/a%2fb", Version::HTTP_11);
        screen(&mut r, &keep).unwrap();
        assert_eq!(r.uri().path(), "/a%2Fb");
    }

    #[test]
    fn the_lesser_forms() {
        assert_eq!(
            screened(req("CONNECT", "api.example:443", Version::HTTP_11)).unwrap_err(),
            Refused::Connect
        );
        assert!(screened(req("POST", "*", Version::HTTP_11)).is_err());
        assert!(screened(req("OPTIONS", "*", Version::HTTP_11)).is_ok());
        assert!(screened(req("POST", "http://u:p@api.example/v1", Version::HTTP_11)).is_err());
        let mut no_host = Request::post("/v1/x").body(()).unwrap();
        assert!(screen(&mut no_host, &PathSettings::default()).is_err());
        let mut old = Request::post("/v1/x")
            .version(Version::HTTP_10)
            .body(())
            .unwrap();
        assert!(
            screen(&mut old, &PathSettings::default()).is_ok(),
            "HTTP/1.0 needs no Host"
        );
        let mut at_host = req("GET", "/", Version::HTTP_11);
        at_host
            .headers_mut()
            .insert(HOST, HeaderValue::from_static("u@api.example"));
        assert!(screen(&mut at_host, &PathSettings::default()).is_err());
    }

    #[test]
    fn h2_fields_are_bounded_and_cookies_joined_and_expect_dropped() {
        let fields = |n: usize| {
            let mut r = req("GET", "/", Version::HTTP_2);
            for i in 0..n {
                r.headers_mut().append("x-f", HeaderValue::from(i));
            }
            r
        };
        assert_eq!(screened(fields(MAX_FIELDS)).map(|_| ()), Ok(()));
        assert_eq!(
            screened(fields(MAX_FIELDS + 1)).unwrap_err(),
            Refused::TooManyFields
        );
        // a short head (read in one pass) and a long one (by name)
        for extra in [0, SHORT_HEAD] {
            let mut r = fields(extra);
            r.headers_mut()
                .append(COOKIE, HeaderValue::from_static("a=1"));
            r.headers_mut()
                .append(COOKIE, HeaderValue::from_static("b=2"));
            r.headers_mut()
                .append(EXPECT, HeaderValue::from_static("100-continue"));
            let r = screened(r).unwrap();
            let cookies: Vec<_> = r.headers().get_all(COOKIE).iter().collect();
            assert_eq!(cookies, ["a=1; b=2"], "{extra}");
            assert!(r.headers().get(EXPECT).is_none(), "{extra}");
            let mut one = fields(extra);
            one.headers_mut()
                .append(COOKIE, HeaderValue::from_static("a=1"));
            let one = screened(one).unwrap();
            let cookies: Vec<_> = one.headers().get_all(COOKIE).iter().collect();
            assert_eq!(cookies, ["a=1"], "{extra}");
        }
        // the first Host is the one read here, in either kind of head (a
        // second is the limiter's to refuse)
        for extra in [0, SHORT_HEAD] {
            let with_hosts = |first: &'static str, second: &'static str| {
                let mut r = req("GET", "/", Version::HTTP_11);
                for i in 0..extra {
                    r.headers_mut().append("x-f", HeaderValue::from(i));
                }
                r.headers_mut()
                    .insert(HOST, HeaderValue::from_static(first));
                r.headers_mut()
                    .append(HOST, HeaderValue::from_static(second));
                screened(r)
            };
            assert!(
                with_hosts("u@api.example", "api.example").is_err(),
                "{extra}"
            );
            assert!(
                with_hosts("api.example", "u@api.example").is_ok(),
                "{extra}"
            );
            let mut r = req("GET", "/", Version::HTTP_11);
            for i in 0..extra {
                r.headers_mut().append("x-f", HeaderValue::from(i));
            }
            r.headers_mut().remove(HOST);
            assert!(screened(r).is_err(), "no Host, {extra}");
        }
    }

    /// The path an upstream that decodes every percent-encoding (Flask),
    /// removes dot segments (Node's `new URL()`), merges slashes (nginx)
    /// and ignores case and a trailing slash (Express) routes on, given
    /// the bytes the gateway forwards.
    pub(crate) fn as_an_upstream_reads(forwarded: &str) -> String {
        let b = forwarded.as_bytes();
        let mut decoded = Vec::new();
        let mut i = 0;
        while i < b.len() {
            let hex = |c: Option<&u8>| c.and_then(|&c| (c as char).to_digit(16));
            match (b[i], hex(b.get(i + 1)), hex(b.get(i + 2))) {
                (b'%', Some(h), Some(l)) => {
                    decoded.push((h * 16 + l) as u8);
                    i += 3;
                }
                (c, _, _) => {
                    decoded.push(c);
                    i += 1;
                }
            }
        }
        let text = String::from_utf8_lossy(&decoded);
        let mut out: Vec<&str> = Vec::new();
        for seg in text.split('/') {
            match seg {
                "" | "." => {}
                ".." => {
                    out.pop();
                }
                s => out.push(s),
            }
        }
        format!("/{}", out.join("/")).to_ascii_lowercase()
    }

    pub(crate) fn limits() -> paceline_server::Limits {
        let text = r#"
            [plans.free]
            policies = [{ name = "b", algorithm = "token_bucket", q = 10, w = 1 }]
            [[routes]]
            method = "POST"
            path = "/v1/labels:batch"
            cost = 10
            [[routes]]
            path = "/v1/labels/{id}"
            cost = 2
            [[routes]]
            path = "/v1/files/{*rest}"
            cost = 3
            [[routes]]
            path = "/v1/login"
            cost = 4
        "#;
        toml::from_str::<paceline_server::LimitsConfig>(text)
            .unwrap()
            .build()
            .unwrap()
    }

    /// Path segments a client may write: the example's routes in any
    /// case, dot segments, empty ones and a few characters more.
    pub(crate) fn path_segments() -> impl proptest::strategy::Strategy<Value = Vec<String>> {
        use proptest::strategy::Just;
        proptest::collection::vec(
            proptest::prop_oneof![
                Just("v1".to_string()),
                Just("labels:batch".to_string()),
                Just("labels".to_string()),
                Just("files".to_string()),
                Just("login".to_string()),
                Just("LOGIN".to_string()),
                Just("Labels:Batch".to_string()),
                Just("..".to_string()),
                Just(".".to_string()),
                Just(String::new()),
                "[a-zA-Z:.~_-]{1,4}",
            ],
            1..7,
        )
    }

    /// The path of `segs` as a client may spell it: each character but
    /// `/` written plain or percent-encoded in either case, as the bits of
    /// `encode` say.
    pub(crate) fn spelled(segs: &[String], encode: u64) -> String {
        let plain = format!("/{}", segs.join("/"));
        let mut written = String::new();
        for (i, c) in plain.chars().enumerate() {
            match (c, (encode >> (2 * (i % 32))) & 3) {
                ('/', _) | (_, 0) | (_, 3) => written.push(c),
                (_, 1) => written.push_str(&format!("%{:02X}", c as u32)),
                _ => written.push_str(&format!("%{:02x}", c as u32)),
            }
        }
        written
    }

    proptest::proptest! {
        #[test]
        fn what_the_gateway_charges_for_is_what_the_upstream_routes_on(
            segs in path_segments(),
            encode in proptest::prelude::any::<u64>(),
        ) {
            let written = spelled(&segs, encode);
            let limits = limits();
            let mut req = Request::post(&written).header("host", "gw").body(()).unwrap();
            if screen(&mut req, &PathSettings::default()).is_ok() {
                let charged = limits.classify(&req);
                let forwarded = req.uri().path().to_string();
                let routed = Request::post(as_an_upstream_reads(&forwarded)).body(()).unwrap();
                proptest::prop_assert_eq!(&charged, &limits.classify(&routed), "{} went up as {}", written, forwarded);
                // and a path is classified as its normal form is
                let again = Request::post(&forwarded).body(()).unwrap();
                proptest::prop_assert_eq!(&charged, &limits.classify(&again));
            }
        }
    }
}
