//! Feeds arbitrary request heads to key extraction: the rate-limit layer of
//! `paceline-server` (identity, the head checks) under six deployments
//! (bearer keys, a key header, client addresses behind trusted proxies,
//! keyless callers limited per address, JWTs signed with an HMAC secret,
//! consumer headers from an authentication layer), from trusted and
//! untrusted peers.
//!
//! The bytes are a selector (deployment, peer) and a request head, parsed
//! as the gateway's HTTP/1 server parses it. A selector below 0x80 picks
//! one of the first four deployments (its low two bits) and a peer (the
//! next bits); from 0x80, the low bit picks the JWT or the consumer-header
//! deployment. Nothing may panic, and:
//! - a request with two credentials is refused with 400 and never passed on;
//! - what is passed on carries at most one credential, one `Host`, only the
//!   chunked coding (once) and agreeing decimal lengths;
//! - where keys are required, what is passed on carries a configured key,
//!   the one the limiter counted (its answer publishes `RateLimit`);
//! - where the key is the bearer token, an `Authorization` field passed on
//!   is one the limiter read, and a service splitting it on whitespace
//!   reads the same key (one it cannot read is refused, never counted as
//!   no key);
//! - a 200 that is not passed on is the layer's usage document;
//! - the client address is the socket peer unless the peer is a trusted
//!   proxy, and is always known;
//! - with JWTs, what is passed on carries a token whose signature verifies
//!   under the secret (checked apart, by `jsonwebtoken` itself), counted;
//! - with consumer headers, a request from a peer that is not trusted is
//!   passed on without them, and is never counted as a consumer.

#![no_main]

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, OnceLock};

use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, Request, Response};
use libfuzzer_sys::fuzz_target;
use paceline_core::{ManualClock, MemoryStore};
use paceline_server::{
    bearer_token, client_ip, read_authorization, BasicAuth, Credential, KeyHasher, Limits,
    LimitsConfig, RateLimiter,
};
use tower::{Service, ServiceExt};

const KEYS: [&str; 2] = ["sk_a", "sk_b"];

const PLANS: &str = r#"
trusted_proxies = ["10.0.0.0/8", "127.0.0.1", "fd00::/8"]
[plans.free]
policies = [{ name = "burst", algorithm = "token_bucket", q = 5, w = 1 }]
[plans.anonymous]
policies = [{ name = "anonymous", algorithm = "token_bucket", q = 5, w = 1 }]
[keys]
sk_a = "free"
sk_b = "free"
"#;

/// The HMAC secret of the JWT deployment (the seeds' tokens are signed
/// with it).
const JWT_SECRET: &str = "paceline fuzz secret, 32 bytes+!";

/// The deployments: (extra top-level fields, whether a configured key is
/// required to pass).
const DEPLOYMENTS: [(&str, bool); 6] = [
    ("", true),
    ("key = \"header:x-api-key\"\n", true),
    ("key = \"ip\"\ndefault_plan = \"free\"\n", false),
    (
        "anonymous_plan = \"anonymous\"\nmissing_key = \"anonymous\"\n",
        false,
    ),
    // a verified token is required (its subject on the default plan)
    (
        "key = \"jwt\"\ndefault_plan = \"free\"\n[jwt]\nsecret_file = \"jwt.secret\"\nplan_claim = \"plan\"\n",
        false,
    ),
    // consumers named by the layer in front; anyone else per address
    (
        "key = \"consumer_header\"\nanonymous_plan = \"anonymous\"\nmissing_key = \"anonymous\"\ndefault_plan = \"free\"\n[consumer_header]\n",
        false,
    ),
];

const JWT: usize = 4;
const CONSUMER: usize = 5;

const PEERS: [&str; 6] = [
    "10.0.0.7:5000",
    "198.51.100.4:5000",
    "127.0.0.1:6000",
    "[::ffff:10.1.2.3]:7000",
    "[fd00::9]:80",
    "[2001:db8::1]:443",
];

fn limits() -> &'static [Limits] {
    static L: OnceLock<Vec<Limits>> = OnceLock::new();
    L.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("paceline-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        std::fs::write(dir.join("jwt.secret"), JWT_SECRET).expect("the secret file");
        DEPLOYMENTS
            .iter()
            .map(|(extra, _)| {
                // top-level fields first, tables after
                let (top, table) = match extra.find('[') {
                    Some(i) => extra.split_at(i),
                    None => (*extra, ""),
                };
                let text = format!("{top}{PLANS}{table}");
                toml::from_str::<LimitsConfig>(&text)
                    .expect("model")
                    .build_with_files(KeyHasher::per_process().clone(), Some(&dir))
                    .expect("limits")
            })
            .collect()
    })
}

/// Whether `token`'s signature verifies under the fuzz secret, by
/// `jsonwebtoken` alone (times are the limiter's business).
fn genuine(token: &str) -> bool {
    let mut v = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::HS256);
    v.required_spec_claims.clear();
    v.validate_exp = false;
    v.validate_nbf = false;
    v.validate_aud = false;
    let key = jsonwebtoken::DecodingKey::from_secret(JWT_SECRET.as_bytes());
    jsonwebtoken::decode::<serde_json::Value>(token, &key, &v).is_ok()
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    })
}

/// The head as the gateway's server would hand it on, or `None` when it
/// would refuse to parse it.
fn request(head: &[u8]) -> Option<Request<()>> {
    let mut fields = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut fields);
    match req.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        _ => return None,
    }
    let mut b = Request::builder()
        .method(req.method?)
        .uri(req.path?)
        .version(http::Version::HTTP_11);
    for f in req.headers.iter() {
        let name = HeaderName::from_bytes(f.name.as_bytes()).ok()?;
        let value = HeaderValue::from_bytes(f.value).ok()?;
        b = b.header(name, value);
    }
    b.body(()).ok()
}

fn count(h: &HeaderMap, name: &str) -> usize {
    h.get_all(name).iter().count()
}

/// Whether a head passed on is one an upstream reads as the limiter did.
fn assert_unambiguous(h: &HeaderMap) {
    assert!(count(h, "authorization") <= 1, "{h:?}");
    assert!(count(h, "host") <= 1, "{h:?}");
    if let Some(v) = h.get("host") {
        assert!(!v.as_bytes().contains(&b','), "{h:?}");
    }
    if let Some(v) = h.get("authorization") {
        let b = v.as_bytes();
        let bearer = b.len() > 6 && b[..6].eq_ignore_ascii_case(b"bearer");
        assert!(!(bearer && b[6..].contains(&b',')), "{h:?}");
    }
    let mut chunked = 0;
    for v in h.get_all("transfer-encoding") {
        for coding in v.as_bytes().split(|&b| b == b',') {
            let coding = coding.trim_ascii();
            if coding.is_empty() {
                continue;
            }
            assert!(coding.eq_ignore_ascii_case(b"chunked"), "{h:?}");
            chunked += 1;
        }
    }
    assert!(chunked <= 1, "{h:?}");
    let mut length: Option<u64> = None;
    for v in h.get_all("content-length") {
        for item in v.as_bytes().split(|&b| b == b',') {
            let s = std::str::from_utf8(item.trim_ascii()).expect("digits");
            assert!(
                !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()),
                "{h:?}"
            );
            let n: u64 = s.parse().expect("fits in 64 bits");
            assert!(length.is_none_or(|l| l == n), "{h:?}");
            length = Some(n);
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let [sel, rest @ ..] = data else {
        return;
    };
    let deployment = match sel & 0x80 {
        0 => usize::from(sel & 0x3),
        _ => JWT + usize::from(sel & 0x1),
    };
    let peer: SocketAddr = PEERS[usize::from((sel & 0x7f) >> 2) % PEERS.len()]
        .parse()
        .unwrap();
    // the bytes as a whole head, or as the fields after a fixed request line
    let mut framed = b"GET /v1/rates HTTP/1.1\r\n".to_vec();
    framed.extend_from_slice(rest);
    let Some(req) = request(rest).or_else(|| request(&framed)) else {
        return;
    };
    let limits = &limits()[deployment];
    let (_, keys_required) = DEPLOYMENTS[deployment];
    let trusted = limits.trusted_proxies();

    // the client address
    let ip = client_ip(req.headers(), Some(peer.ip()), trusted).expect("always known");
    if !trusted.contains(peer.ip()) {
        assert_eq!(ip, canonical(peer.ip()), "an untrusted peer is the client");
    }
    if let Some(t) = bearer_token(req.headers()) {
        assert!(!t.is_empty() && t.trim_ascii() == t, "{t:?}");
    }

    // the layer, in front of a service that records what it is handed
    let seen: Arc<Mutex<Option<HeaderMap>>> = Arc::default();
    let record = seen.clone();
    let inner = tower::service_fn(move |r: Request<()>| {
        *record.lock().unwrap() = Some(r.headers().clone());
        async { Ok::<_, std::convert::Infallible>(Response::new(String::new())) }
    });
    let limiter = RateLimiter::new(
        limits.clone(),
        MemoryStore::new(),
        ManualClock::at_unix_secs(1_790_000_000),
    );
    let svc = limiter.layer();
    let mut svc = tower::Layer::layer(&svc, inner).with_peer(peer);
    // the layer answers its usage endpoint itself
    let usage = req.method() == http::Method::GET && req.uri().path() == "/v1/usage";
    let two_credentials = count(req.headers(), "authorization") > 1
        || (deployment == 1 && count(req.headers(), "x-api-key") > 1);
    let sent_consumer = req.headers().contains_key("x-consumer-id");
    let res = runtime()
        .block_on(async { svc.ready().await.unwrap().call(req).await })
        .unwrap();
    let status = res.status().as_u16();
    assert!(
        matches!(status, 200 | 400 | 401 | 429 | 501),
        "status {status}"
    );
    let passed = seen.lock().unwrap().take();
    if two_credentials {
        assert_eq!(status, 400);
        assert!(passed.is_none(), "two credentials passed on");
    }
    match passed {
        Some(h) => {
            assert_eq!(status, 200);
            assert_unambiguous(&h);
            if deployment == 1 {
                assert!(count(&h, "x-api-key") <= 1, "{h:?}");
            }
            if let (0 | 3, Some(v)) = (deployment, h.get("authorization")) {
                let Credential::Key(k) = read_authorization(v, BasicAuth::Refuse) else {
                    panic!("an unreadable credential passed on: {h:?}");
                };
                let text = String::from_utf8_lossy(v.as_bytes());
                let words: Vec<&str> = text.split_whitespace().collect();
                assert_eq!(words.get(1).copied(), Some(&*k), "{h:?}");
                assert_eq!(words.len(), 2, "{h:?}");
            }
            if deployment == JWT {
                let token = bearer_token(&h).expect("a token passed on");
                assert!(genuine(token), "a token that does not verify passed: {h:?}");
                assert!(res.headers().contains_key("ratelimit"), "counted");
            }
            if deployment == CONSUMER && !trusted.contains(peer.ip()) {
                assert!(!h.contains_key("x-consumer-id"), "{h:?}");
                assert!(!h.contains_key("x-plan"), "{h:?}");
                // per address, anonymously: no counters published
                assert!(!res.headers().contains_key("ratelimit"), "{h:?}");
            }
            if deployment == CONSUMER && trusted.contains(peer.ip()) && sent_consumer {
                assert!(h.contains_key("x-consumer-id"), "{h:?}");
            }
            if keys_required {
                let key = match deployment {
                    0 => bearer_token(&h),
                    _ => h.get("x-api-key").and_then(|v| v.to_str().ok()),
                };
                assert!(key.is_some_and(|k| KEYS.contains(&k)), "{h:?}");
                assert!(res.headers().contains_key("ratelimit"), "counted");
            }
        }
        None if status == 200 => {
            // only the usage document, of a caller the limiter counts
            assert!(usage, "a 200 not passed on");
            let ct = res.headers().get("content-type").map(|v| v.as_bytes());
            assert_eq!(ct, Some(&b"application/json"[..]));
            assert!(res.headers().contains_key("ratelimit"), "counted");
        }
        None => {
            if status != 429 {
                let ct = res.headers().get("content-type").map(|v| v.as_bytes());
                assert_eq!(
                    ct,
                    Some(&b"application/problem+json"[..]),
                    "status {status}"
                );
            }
        }
    }
});

fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map(IpAddr::V4)
            .unwrap_or(IpAddr::V6(v6)),
        v4 => v4,
    }
}
