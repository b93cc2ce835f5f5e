//! The original request, rebuilt from what a proxy says of it.
//!
//! Why this is strict: the check decides for a request it never sees.
//! Whatever it is told of that request is what gets counted, so a
//! description that could be read two ways (two methods, a second target
//! under another convention, a target with spaces) is refused with `400`
//! rather than guessed at: a client able to add a header must not be able
//! to make the check count a cheaper request than the one the upstream
//! serves.
//!
//! What is read, and from where:
//!
//! | part | fields (either convention; both only when they agree) |
//! |---|---|
//! | method | `X-Forwarded-Method` (Caddy, Traefik), `X-Original-Method` (nginx, set by the recipe) |
//! | target | `X-Forwarded-Uri` (Caddy, Traefik), `X-Original-URI` (nginx's `$request_uri`); origin-form (`/path?query`), absolute-form (`http://host/path`) or `*` |
//! | host | `X-Forwarded-Host`, else the authority of an absolute-form target, else the check request's own `Host` (over HTTP/2, the authority of its target) |
//! | fields | every other field of the check request, as the proxy passed it on (`Authorization`, `X-Forwarded-For`, the key header, ...) |
//!
//! Each of the five description fields may come once. The rebuilt request
//! is an HTTP/1.1 head with no body; the gateway's head screening
//! (`front.rs`) then reads it as it reads its own requests.

use http::header::{HeaderName, HeaderValue, CONNECTION, HOST};
use http::uri::{Authority, Uri};
use http::{HeaderMap, Method, Request, Version};

/// `X-Forwarded-Method`: the original method (Caddy's `forward_auth`,
/// Traefik's `ForwardAuth`).
pub const FORWARDED_METHOD: &str = "x-forwarded-method";
/// `X-Forwarded-Uri`: the original request target.
pub const FORWARDED_URI: &str = "x-forwarded-uri";
/// `X-Forwarded-Host`: the original `Host`.
pub const FORWARDED_HOST: &str = "x-forwarded-host";
/// `X-Original-Method`: the original method, nginx's convention (the
/// recipe sets it to `$request_method`).
pub const ORIGINAL_METHOD: &str = "x-original-method";
/// `X-Original-URI`: the original request target, nginx's convention
/// (`$request_uri`).
pub const ORIGINAL_URI: &str = "x-original-uri";

/// The longest original target taken, in bytes.
pub const MAX_TARGET: usize = 8 * 1024;

/// Fields of the check request that describe the request or the hop
/// rather than the original request: never copied into it.
const NOT_COPIED: [&str; 11] = [
    FORWARDED_METHOD,
    FORWARDED_URI,
    FORWARDED_HOST,
    ORIGINAL_METHOD,
    ORIGINAL_URI,
    super::DENY_STATUS,
    super::ANSWER,
    "keep-alive",
    "proxy-connection",
    "te",
    "upgrade",
];

/// Why a proxy's description of the original request is refused; its
/// text is the detail of the `400` problem answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unreadable(String);

impl Unreadable {
    fn new(detail: impl Into<String>) -> Self {
        Unreadable(detail.into())
    }
    /// What is wrong, for the problem body's `detail`.
    pub fn detail(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Unreadable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Unreadable {}

/// Rebuilds the original request from the fields of a check request (see
/// the module documentation): its method, target and `Host` from the
/// description fields, every other end-to-end field as it came. The check
/// request's own method and path play no part.
///
/// ```
/// use http::HeaderMap;
/// use paceline_gateway::check::rebuild;
///
/// // what the nginx recipe sends for `POST /v1/labels?dry=1`
/// let mut check = HeaderMap::new();
/// check.insert("x-original-method", "POST".parse()?);
/// check.insert("x-original-uri", "/v1/labels?dry=1".parse()?);
/// check.insert("x-forwarded-host", "api.example".parse()?);
/// check.insert("authorization", "Bearer sk_1".parse()?);
/// let req = rebuild(&check)?;
/// assert_eq!(req.method(), "POST");
/// assert_eq!(req.uri(), "/v1/labels?dry=1");
/// assert_eq!(req.headers()["host"], "api.example");
/// assert_eq!(req.headers()["authorization"], "Bearer sk_1");
///
/// // a second target under the other convention is not guessed at
/// check.insert("x-forwarded-uri", "/v1/rates".parse()?);
/// assert!(rebuild(&check).is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn rebuild(check: &HeaderMap) -> Result<Request<()>, Unreadable> {
    let d = Described::read(check);
    let method = d.one_of(FORWARDED_METHOD, ORIGINAL_METHOD)?.ok_or_else(|| {
        Unreadable::new(
            "The original method is missing: send X-Forwarded-Method (or nginx's X-Original-Method).",
        )
    })?;
    let method = Method::from_bytes(method.as_bytes())
        .map_err(|_| Unreadable::new("The original method is not an HTTP method token."))?;
    let target = d.one_of(FORWARDED_URI, ORIGINAL_URI)?.ok_or_else(|| {
        Unreadable::new(
            "The original request target is missing: send X-Forwarded-Uri (or nginx's X-Original-URI).",
        )
    })?;
    let (uri, from_target) = read_target(target.as_bytes())?;
    let host = match d.once(FORWARDED_HOST)? {
        Some(h) => {
            let h = read_host(h)?;
            if from_target.as_ref().is_some_and(|t| !same_host(t, &h)) {
                return Err(Unreadable::new(
                    "X-Forwarded-Host and the authority of the original target differ.",
                ));
            }
            Some(HeaderValue::from_str(h.as_str()).expect("an authority is a field value"))
        }
        None => match from_target {
            Some(a) => {
                Some(HeaderValue::from_str(a.as_str()).expect("an authority is a field value"))
            }
            None => check.get(HOST).cloned(),
        },
    };
    let mut req = Request::new(());
    *req.method_mut() = method;
    *req.uri_mut() = uri;
    *req.version_mut() = Version::HTTP_11;
    copy_fields(check, req.headers_mut());
    if let Some(h) = host {
        req.headers_mut().insert(HOST, h);
    }
    Ok(req)
}

/// The fields that describe the original request.
const DESCRIBING: [&str; 5] = [
    FORWARDED_METHOD,
    ORIGINAL_METHOD,
    FORWARDED_URI,
    ORIGINAL_URI,
    FORWARDED_HOST,
];

/// A check request's description fields, read in one pass over its
/// fields: five look-ups by name would hash a name of no standard five
/// times, most of a check's cost of reading its request.
struct Described<'a> {
    /// For each of [`DESCRIBING`]: its first value and how often it came.
    seen: [(Option<&'a HeaderValue>, u32); DESCRIBING.len()],
}

impl<'a> Described<'a> {
    fn read(h: &'a HeaderMap) -> Described<'a> {
        let mut seen = [(None, 0); DESCRIBING.len()];
        for (name, value) in h {
            if let Some(i) = DESCRIBING.iter().position(|d| *d == name.as_str()) {
                let (first, count) = &mut seen[i];
                first.get_or_insert(value);
                *count += 1;
            }
        }
        Described { seen }
    }

    /// The value of `name` (one of [`DESCRIBING`]), refused when the
    /// field comes more than once.
    fn once(&self, name: &str) -> Result<Option<&'a HeaderValue>, Unreadable> {
        let i = DESCRIBING.iter().position(|d| *d == name);
        match i.map(|i| self.seen[i]) {
            Some((_, n)) if n > 1 => {
                Err(Unreadable::new(format!("{} is sent twice.", display(name))))
            }
            Some((first, _)) => Ok(first),
            None => Ok(None),
        }
    }

    /// The value of the one description field present under either name;
    /// both only when they say the same; each at most once.
    fn one_of(
        &self,
        forwarded: &str,
        original: &str,
    ) -> Result<Option<&'a HeaderValue>, Unreadable> {
        match (self.once(forwarded)?, self.once(original)?) {
            (Some(a), Some(b)) if a != b => Err(Unreadable::new(format!(
                "{} and {} describe different requests.",
                display(forwarded),
                display(original)
            ))),
            (a, b) => Ok(a.or(b)),
        }
    }
}

/// The field's name as the documentation spells it.
fn display(name: &str) -> &'static str {
    match name {
        FORWARDED_METHOD => "X-Forwarded-Method",
        FORWARDED_URI => "X-Forwarded-Uri",
        FORWARDED_HOST => "X-Forwarded-Host",
        ORIGINAL_METHOD => "X-Original-Method",
        ORIGINAL_URI => "X-Original-URI",
        _ => "a field",
    }
}

/// The target as an origin-form URI (or `*`), with the authority of an
/// absolute-form one.
fn read_target(t: &[u8]) -> Result<(Uri, Option<Authority>), Unreadable> {
    if t.is_empty() {
        return Err(Unreadable::new("The original request target is empty."));
    }
    if t.len() > MAX_TARGET {
        return Err(Unreadable::new(format!(
            "The original request target is longer than {MAX_TARGET} bytes."
        )));
    }
    // a target is visible ASCII: a space, a tab or a byte past ASCII
    // could end it early for one reader and not for another
    if !t.iter().all(|&b| (0x21..0x7f).contains(&b)) {
        return Err(Unreadable::new(
            "The original request target holds a space, a control character or a byte outside ASCII.",
        ));
    }
    if t.contains(&b'#') {
        return Err(Unreadable::new(
            "The original request target holds a fragment ('#'), which no request carries.",
        ));
    }
    if t == b"*" {
        return Ok((Uri::from_static("*"), None));
    }
    let uri = Uri::try_from(t)
        .map_err(|_| Unreadable::new("The original request target is not a URI."))?;
    match (t[0], uri.scheme_str(), uri.authority()) {
        (b'/', None, None) => Ok((uri, None)),
        (_, Some(s), Some(a))
            if s.eq_ignore_ascii_case("http") || s.eq_ignore_ascii_case("https") =>
        {
            let a = a.clone();
            let pq = uri.path_and_query().map_or("/", |p| p.as_str());
            let pq = if pq.is_empty() { "/" } else { pq };
            let origin = Uri::try_from(pq)
                .map_err(|_| Unreadable::new("The original request target is not a URI."))?;
            Ok((origin, Some(a)))
        }
        _ => Err(Unreadable::new(
            "The original request target is neither a path ('/...'), an http(s) URI nor '*'.",
        )),
    }
}

/// `X-Forwarded-Host` as one authority (a list of hosts, as a chain of
/// proxies may leave, is refused: which one the upstream reads is not
/// known).
fn read_host(h: &HeaderValue) -> Result<Authority, Unreadable> {
    let b = h.as_bytes();
    if b.is_empty() || b.contains(&b',') {
        return Err(Unreadable::new(
            "X-Forwarded-Host must name one host (no list, not empty).",
        ));
    }
    Authority::try_from(b).map_err(|_| Unreadable::new("X-Forwarded-Host is not a host."))
}

/// Whether two authorities name the same host (a port may be left out of
/// one: nginx's `$host` has none).
fn same_host(a: &Authority, b: &Authority) -> bool {
    a.host().eq_ignore_ascii_case(b.host())
}

/// Copies the end-to-end fields of the check request: all but the
/// description fields, `Host` and the hop-by-hop ones (`Connection` and
/// the fields it names).
fn copy_fields(check: &HeaderMap, into: &mut HeaderMap) {
    let named: Vec<HeaderName> = check
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    into.reserve(check.len());
    for (name, value) in check {
        let skip = name == HOST
            || name == CONNECTION
            || NOT_COPIED.contains(&name.as_str())
            || named.contains(name);
        if !skip {
            into.append(name.clone(), value.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(list: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in list {
            h.append(
                HeaderName::from_bytes(n.as_bytes()).unwrap(),
                HeaderValue::from_bytes(v.as_bytes()).unwrap(),
            );
        }
        h
    }

    fn refused(list: &[(&str, &str)]) -> String {
        rebuild(&fields(list)).unwrap_err().0
    }

    #[test]
    fn caddy_and_traefik_convention() {
        let r = rebuild(&fields(&[
            ("host", "127.0.0.1:8081"),
            ("x-forwarded-method", "POST"),
            ("x-forwarded-uri", "/v1/labels?x=1&y=%2F"),
            ("x-forwarded-host", "api.example"),
            ("x-forwarded-proto", "https"),
            ("x-forwarded-for", "192.0.2.7"),
            ("authorization", "Bearer sk_1"),
        ]))
        .unwrap();
        assert_eq!(r.method(), Method::POST);
        assert_eq!(r.uri(), "/v1/labels?x=1&y=%2F");
        assert_eq!(r.uri().query(), Some("x=1&y=%2F"));
        assert_eq!(r.version(), Version::HTTP_11);
        assert_eq!(r.headers()[HOST], "api.example");
        assert_eq!(r.headers()["authorization"], "Bearer sk_1");
        assert_eq!(r.headers()["x-forwarded-for"], "192.0.2.7");
        assert_eq!(r.headers()["x-forwarded-proto"], "https");
        assert!(r.headers().get(FORWARDED_URI).is_none());
        assert!(r.headers().get(FORWARDED_METHOD).is_none());
        assert!(r.headers().get(FORWARDED_HOST).is_none());
    }

    #[test]
    fn nginx_convention() {
        let r = rebuild(&fields(&[
            ("host", "127.0.0.1:8081"),
            ("x-original-method", "GET"),
            ("x-original-uri", "/v1/rates?from=SFO"),
            ("x-forwarded-host", "api.example:8080"),
            ("authorization", "Bearer sk_2"),
            ("connection", "keep-alive, x-hop"),
            ("x-hop", "1"),
            ("keep-alive", "timeout=5"),
            ("paceline-deny-status", "403"),
        ]))
        .unwrap();
        assert_eq!(r.method(), Method::GET);
        assert_eq!(r.uri().path(), "/v1/rates");
        assert_eq!(r.uri().query(), Some("from=SFO"));
        assert_eq!(r.headers()[HOST], "api.example:8080");
        for gone in [
            "connection",
            "x-hop",
            "keep-alive",
            ORIGINAL_URI,
            ORIGINAL_METHOD,
            "paceline-deny-status",
        ] {
            assert!(r.headers().get(gone).is_none(), "{gone} copied");
        }
        // without X-Forwarded-Host: the check request's own Host
        let r = rebuild(&fields(&[
            ("host", "127.0.0.1:8081"),
            ("x-original-method", "GET"),
            ("x-original-uri", "/"),
        ]))
        .unwrap();
        assert_eq!(r.headers()[HOST], "127.0.0.1:8081");
    }

    #[test]
    fn both_conventions_only_when_they_agree() {
        let r = rebuild(&fields(&[
            ("x-forwarded-method", "GET"),
            ("x-original-method", "GET"),
            ("x-forwarded-uri", "/a"),
            ("x-original-uri", "/a"),
        ]))
        .unwrap();
        assert_eq!(r.uri(), "/a");
        let d = refused(&[
            ("x-forwarded-method", "POST"),
            ("x-forwarded-uri", "/v1/labels:batch"),
            ("x-original-uri", "/v1/rates"),
        ]);
        assert_eq!(
            d,
            "X-Forwarded-Uri and X-Original-URI describe different requests."
        );
        let d = refused(&[
            ("x-forwarded-method", "POST"),
            ("x-original-method", "GET"),
            ("x-forwarded-uri", "/"),
        ]);
        assert!(
            d.contains("X-Forwarded-Method and X-Original-Method"),
            "{d}"
        );
    }

    #[test]
    fn absolute_form_targets() {
        let r = rebuild(&fields(&[
            ("x-forwarded-method", "GET"),
            ("x-forwarded-uri", "http://API.example:8080/v1/rates?x=1"),
        ]))
        .unwrap();
        assert_eq!(r.uri(), "/v1/rates?x=1");
        assert_eq!(r.headers()[HOST], "API.example:8080");
        let r = rebuild(&fields(&[
            ("x-forwarded-method", "GET"),
            ("x-forwarded-uri", "https://api.example:8443"),
            ("x-forwarded-host", "api.EXAMPLE"),
        ]))
        .unwrap();
        assert_eq!(r.uri(), "/");
        let d = refused(&[
            ("x-forwarded-method", "GET"),
            ("x-forwarded-uri", "http://other.example/v1"),
            ("x-forwarded-host", "api.example"),
        ]);
        assert!(d.contains("differ"), "{d}");
        // user information reaches the head screening, which refuses it
        let r = rebuild(&fields(&[
            ("x-forwarded-method", "GET"),
            ("x-forwarded-uri", "http://u:p@api.example/v1"),
        ]))
        .unwrap();
        assert!(r.headers()[HOST].as_bytes().contains(&b'@'));
    }

    #[test]
    fn missing_duplicated_and_hostile_descriptions() {
        let d = refused(&[("x-forwarded-uri", "/")]);
        assert!(d.contains("original method is missing"), "{d}");
        let d = refused(&[("x-forwarded-method", "GET")]);
        assert!(d.contains("target is missing"), "{d}");
        assert!(refused(&[]).contains("missing"));
        let d = refused(&[
            ("x-forwarded-method", "GET"),
            ("x-forwarded-uri", "/cheap"),
            ("x-forwarded-uri", "/dear"),
        ]);
        assert_eq!(d, "X-Forwarded-Uri is sent twice.");
        let d = refused(&[
            ("x-forwarded-method", "GET"),
            ("x-forwarded-uri", "/"),
            ("x-forwarded-host", "a.example"),
            ("x-forwarded-host", "b.example"),
        ]);
        assert_eq!(d, "X-Forwarded-Host is sent twice.");
        for (method, target) in [
            ("GET", "/a b"),
            ("GET", "/a\tb"),
            ("GET", "/caf\u{e9}"),
            ("GET", ""),
            ("GET", "/a#frag"),
            ("GET", "v1/labels"),
            ("GET", "ftp://api.example/x"),
            ("G ET", "/"),
            ("", "/"),
            ("GET,POST", "/"),
        ] {
            let r = rebuild(&fields(&[
                ("x-forwarded-method", method),
                ("x-forwarded-uri", target),
            ]));
            assert!(r.is_err(), "{method:?} {target:?} was taken");
        }
        let long = format!("/{}", "a".repeat(MAX_TARGET));
        assert!(
            refused(&[("x-forwarded-method", "GET"), ("x-forwarded-uri", &long)])
                .contains("longer")
        );
        for host in ["a.example, b.example", "", "a b"] {
            let d = refused(&[
                ("x-forwarded-method", "GET"),
                ("x-forwarded-uri", "/"),
                ("x-forwarded-host", host),
            ]);
            assert!(d.contains("X-Forwarded-Host"), "{host:?}: {d}");
        }
    }

    #[test]
    fn the_asterisk_form_is_left_to_the_head_screening() {
        let r = rebuild(&fields(&[
            ("x-forwarded-method", "OPTIONS"),
            ("x-forwarded-uri", "*"),
        ]))
        .unwrap();
        assert_eq!(r.uri(), "*");
    }
}
