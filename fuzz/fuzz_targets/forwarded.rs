//! Feeds arbitrary check requests to the forward-auth check's reading of
//! the original request (`paceline_gateway::check::rebuild`): the fields a
//! proxy sends (`X-Forwarded-Method`/`-Uri`/`-Host`, nginx's
//! `X-Original-Method`/`-URI`) and any others, as the check's HTTP/1
//! server parses them.
//!
//! Nothing may panic, and a request rebuilt from them:
//! - was described once: each description field came at most once, and
//!   the two conventions, when both came, said the same;
//! - has the described method and, for an origin-form target, exactly the
//!   described target (query kept); an absolute-form one keeps its path
//!   and query, its authority becoming `Host`;
//! - has a target of visible ASCII only, starting with '/' (or `*`);
//! - carries none of the description fields, no hop-by-hop field and at
//!   most one `Host`.

#![no_main]

use http::header::{HeaderName, HeaderValue};
use http::HeaderMap;
use libfuzzer_sys::fuzz_target;
use paceline_gateway::check::{
    rebuild, FORWARDED_HOST, FORWARDED_METHOD, FORWARDED_URI, ORIGINAL_METHOD, ORIGINAL_URI,
};

fn fields(head: &[u8]) -> Option<HeaderMap> {
    let mut fields = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut fields);
    match req.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        _ => return None,
    }
    let mut map = HeaderMap::new();
    for f in req.headers.iter() {
        let name = HeaderName::from_bytes(f.name.as_bytes()).ok()?;
        let value = HeaderValue::from_bytes(f.value).ok()?;
        map.append(name, value);
    }
    Some(map)
}

/// The one value of either name (the rebuilt request says both agreed).
fn described<'a>(h: &'a HeaderMap, a: &str, b: &str) -> &'a [u8] {
    let mut all = h.get_all(a).iter().chain(h.get_all(b).iter());
    let first = all.next().expect("a described part");
    for other in all {
        assert_eq!(other, first, "{a} and {b} disagree, or one came twice");
    }
    assert!(h.get_all(a).iter().count() <= 1, "{a} came twice");
    assert!(h.get_all(b).iter().count() <= 1, "{b} came twice");
    first.as_bytes()
}

fuzz_target!(|data: &[u8]| {
    // the bytes as a whole head, or as the fields after a fixed request line
    let mut framed = b"GET /check HTTP/1.1\r\n".to_vec();
    framed.extend_from_slice(data);
    let Some(check) = fields(data).or_else(|| fields(&framed)) else {
        return;
    };
    let Ok(req) = rebuild(&check) else {
        return;
    };
    let method = described(&check, FORWARDED_METHOD, ORIGINAL_METHOD);
    assert_eq!(req.method().as_str().as_bytes(), method);
    let target = described(&check, FORWARDED_URI, ORIGINAL_URI);
    assert!(target.iter().all(|&b| (0x21..0x7f).contains(&b)));
    let rebuilt = req.uri().to_string();
    assert!(rebuilt == "*" || rebuilt.starts_with('/'), "{rebuilt}");
    if target.starts_with(b"/") {
        assert_eq!(rebuilt.as_bytes(), target, "the target changed");
    } else if target != b"*" {
        // absolute-form: the path and query kept, the authority as Host
        let text = std::str::from_utf8(target).unwrap();
        let uri: http::Uri = text.parse().unwrap();
        let pq = uri.path_and_query().map_or("/", |p| p.as_str());
        assert_eq!(rebuilt, if pq.is_empty() { "/" } else { pq });
        assert!(req.headers().contains_key("host"));
    }
    if let Some(h) = check.get(FORWARDED_HOST) {
        assert_eq!(req.headers().get("host"), Some(h));
    }
    assert!(req.headers().get_all("host").iter().count() <= 1);
    for gone in [
        FORWARDED_METHOD,
        FORWARDED_URI,
        FORWARDED_HOST,
        ORIGINAL_METHOD,
        ORIGINAL_URI,
        "connection",
        "keep-alive",
        "te",
        "upgrade",
        "proxy-connection",
        "paceline-answer",
        "paceline-deny-status",
    ] {
        assert!(!req.headers().contains_key(gone), "{gone} was copied");
    }
});
