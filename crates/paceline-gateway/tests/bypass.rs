//! No way around the limit: what an attacker tried against the gateway,
//! each way a test. A credential the limiter cannot read is refused, not
//! counted as no key; every spelling of a route's path is charged as the
//! route and reaches the upstream in one form; an IPv6 host's addresses
//! share one per-IP bucket; and the heads the upstream could read another
//! way (no `Host`, user information, `*`, `CONNECT`, HTTP/2 field floods
//! and cookie crumbs, `Expect`) are refused or made plain. Refunds for
//! work the upstream did are in `refunds.rs` and `bodies.rs`.
//!
//! Charges are read from the usage endpoint; what the upstream saw, from
//! the heads it recorded. Every wait is bounded.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use paceline_gateway::{Gateway, GatewayConfig, GatewayHandle};
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const LIMIT: Duration = Duration::from_secs(10);

/// Heads the upstream received, each as text.
type Seen = Arc<Mutex<Vec<String>>>;

/// An HTTP/1.1 upstream that records every head, reads its body (by
/// `content-length`) and answers `200 ok`.
async fn recording_upstream() -> (SocketAddr, Seen) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let seen: Seen = Arc::default();
    let heads = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let heads = heads.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    let end = loop {
                        if let Some(i) = find(&buf, b"\r\n\r\n") {
                            break i + 4;
                        }
                        let mut chunk = [0u8; 4096];
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                    buf.drain(..end);
                    let len = head
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length: ")
                                .map(|v| v.trim().parse::<usize>().unwrap())
                        })
                        .unwrap_or(0);
                    while buf.len() < len {
                        let mut chunk = [0u8; 4096];
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    buf.drain(..len);
                    heads.lock().push(head);
                    let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                    if s.write_all(ok).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, seen)
}

fn find(buf: &[u8], what: &[u8]) -> Option<usize> {
    buf.windows(what.len()).position(|w| w == what)
}

/// The shipped example's identities and routes, with budgets large
/// enough that only the charges show.
fn config(upstream: SocketAddr, extra: &str) -> String {
    format!(
        r#"anonymous_plan = "anonymous"
missing_key = "anonymous"
trusted_proxies = ["127.0.0.1"]
{extra}

[gateway]
listen = "127.0.0.1:0"
upstream = "http://{upstream}"
watch = false

[plans.free]
policies = [
  {{ name = "burst", algorithm = "token_bucket", q = 1000, w = 1 }},
  {{ name = "daily", algorithm = "daily", q = 100000 }},
]
[plans.anonymous]
policies = [{{ name = "anonymous", algorithm = "token_bucket", q = 1000, w = 1 }}]
[plans.login]
policies = [{{ name = "login", algorithm = "fixed_window", q = 5, w = 60 }}]

[keys]
sk_demo_alice = "free"

[[routes]]
method = "POST"
path = "/v1/labels:batch"
cost = 10

[[routes]]
method = "POST"
path = "/v1/login"
anonymous = true
plan = "login"
"#
    )
}

struct Rig {
    addr: SocketAddr,
    handle: GatewayHandle,
    served: tokio::task::JoinHandle<std::io::Result<()>>,
    seen: Seen,
}

impl Rig {
    /// A gateway whose file starts with `extra` (top-level settings, or
    /// tables after the example's).
    async fn start(extra: &str) -> Rig {
        let (up, seen) = recording_upstream().await;
        let cfg = GatewayConfig::parse(&config(up, extra), "bypass.toml", None).unwrap();
        let gw = Gateway::bind(cfg).await.unwrap();
        let addr = gw.local_addr();
        let handle = gw.handle();
        let served = tokio::spawn(gw.run(std::future::pending()));
        Rig {
            addr,
            handle,
            served,
            seen,
        }
    }

    async fn stop(self) {
        self.handle.shutdown();
        let _ = tokio::time::timeout(LIMIT, self.served).await;
    }

    /// Sends `raw` on a new connection and reads until it closes: every
    /// answer's status, and the whole text.
    async fn raw(&self, raw: &[u8]) -> (Vec<u16>, String) {
        let mut s = TcpStream::connect(self.addr).await.unwrap();
        s.write_all(raw).await.unwrap();
        let mut out = Vec::new();
        let _ = tokio::time::timeout(LIMIT, s.read_to_end(&mut out))
            .await
            .expect("the connection ends in time");
        let text = String::from_utf8_lossy(&out).into_owned();
        let statuses = text
            .match_indices("HTTP/1.1 ")
            .filter_map(|(i, _)| text.get(i + 9..i + 12)?.parse().ok())
            .filter(|&s| s != 100)
            .collect();
        (statuses, text)
    }

    /// Alice's daily quota left.
    async fn alice_left(&self) -> u64 {
        let (st, text) = self
            .raw(b"GET /v1/usage HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer sk_demo_alice\r\nconnection: close\r\n\r\n")
            .await;
        assert_eq!(st, [200], "{text}");
        let body = text.split_once("\r\n\r\n").unwrap().1;
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        v["limits"][1]["r"].as_u64().unwrap()
    }

    fn seen(&self) -> Vec<String> {
        self.seen.lock().clone()
    }
}

/// `POST target` with `field` as its credential, closing after.
fn post(target: &str, field: &[u8]) -> Vec<u8> {
    let mut r =
        format!("POST {target} HTTP/1.1\r\nhost: gw\r\ncontent-length: 0\r\nconnection: close\r\n")
            .into_bytes();
    if !field.is_empty() {
        r.extend_from_slice(b"authorization: ");
        r.extend_from_slice(field);
        r.extend_from_slice(b"\r\n");
    }
    r.extend_from_slice(b"\r\n");
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_credential_the_limiter_cannot_read_is_refused_and_never_forwarded() {
    let rig = Rig::start("").await;
    let before = rig.alice_left().await;
    // what Flask's `split()` and Node's `/^Bearer\s+(\S+)/` read as alice
    let forms: [&[u8]; 6] = [
        b"Bearer\tsk_demo_alice",
        b"Bearer\xc2\xa0sk_demo_alice",
        b"Bearer sk_demo_alice\xc2\xa0",
        b"Token sk_demo_alice",
        // base64("sk_demo_alice:")
        b"Basic c2tfZGVtb19hbGljZTo=",
        b"Bearer sk_demo_alice extra",
    ];
    for field in forms {
        let (st, text) = rig.raw(&post("/v1/labels:batch", field)).await;
        assert_eq!(st, [401], "{:?}: {text}", String::from_utf8_lossy(field));
        assert!(text.contains("/unknown_key\""), "{text}");
    }
    assert!(rig.seen().is_empty(), "forwarded: {:?}", rig.seen());
    assert_eq!(rig.alice_left().await, before);
    // the plain form is read, charged and forwarded as it came
    let (st, _) = rig
        .raw(&post("/v1/labels:batch", b"Bearer sk_demo_alice"))
        .await;
    assert_eq!(st, [200]);
    assert_eq!(rig.alice_left().await, before - 10);
    let seen = rig.seen();
    assert!(
        seen[0].contains("\r\nauthorization: Bearer sk_demo_alice\r\n"),
        "{seen:?}"
    );
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_credentials_are_read_when_the_file_says_so() {
    let rig = Rig::start("basic_auth = \"user\"").await;
    let before = rig.alice_left().await;
    let (st, text) = rig
        .raw(&post("/v1/labels:batch", b"Basic c2tfZGVtb19hbGljZTo="))
        .await;
    assert_eq!(st, [200], "{text}");
    assert_eq!(rig.alice_left().await, before - 10);
    rig.stop().await;
}

/// The spellings of `/v1/labels:batch` an upstream reads as that route.
const BATCH_FORMS: [&str; 6] = [
    "/v1/labels%3Abatch",
    "/v1/%6Cabels:batch",
    "/v1/labels:batc%68",
    "//v1/labels:batch",
    "/v1/x/../labels:batch",
    "/v1/%2e%2e/v1/labels:batch",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_spelling_of_a_path_is_charged_as_its_route_and_forwarded_normal() {
    let rig = Rig::start("").await;
    for form in BATCH_FORMS {
        let before = rig.alice_left().await;
        let (st, text) = rig.raw(&post(form, b"Bearer sk_demo_alice")).await;
        assert_eq!(st, [200], "{form}: {text}");
        assert_eq!(
            rig.alice_left().await,
            before - 10,
            "{form} charged as the batch"
        );
        let last = rig.seen().pop().unwrap();
        assert!(
            last.starts_with("POST /v1/labels:batch HTTP/1.1\r\n"),
            "{form}: {last}"
        );
    }
    // an encoded slash has no one reading
    let (st, _) = rig
        .raw(&post("/v1%2Flabels:batch", b"Bearer sk_demo_alice"))
        .await;
    assert_eq!(st, [400]);
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_strict_mode_a_path_not_in_normal_form_is_400() {
    let rig = Rig::start("[gateway.paths]\nmode = \"strict\"\n").await;
    let before = rig.alice_left().await;
    for form in BATCH_FORMS {
        let (st, text) = rig.raw(&post(form, b"Bearer sk_demo_alice")).await;
        assert_eq!(st, [400], "{form}: {text}");
        assert!(
            text.contains("/v1/labels:batch"),
            "the detail names the normal form: {text}"
        );
    }
    assert!(rig.seen().is_empty());
    assert_eq!(rig.alice_left().await, before);
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_logins_in_another_spelling_meet_the_login_limit() {
    let rig = Rig::start("").await;
    for key in ["", "Bearer sk_demo_alice"] {
        let mut raw = Vec::new();
        for i in 0..30 {
            let close = if i == 29 { "connection: close\r\n" } else { "" };
            // spellings Flask, Node and Express all route to the login
            let path = ["/v1/%6Cogin", "/V1/Login/", "//v1/./login"][i % 3];
            raw.extend_from_slice(
                format!("POST {path} HTTP/1.1\r\nhost: gw\r\ncontent-length: 0\r\n{close}")
                    .as_bytes(),
            );
            if !key.is_empty() {
                raw.extend_from_slice(format!("authorization: {key}\r\n").as_bytes());
            }
            raw.extend_from_slice(b"\r\n");
        }
        let (st, _) = rig.raw(&raw).await;
        assert_eq!(st.len(), 30);
    }
    // five a minute from this address, whatever the key
    let seen = rig.seen();
    assert_eq!(seen.len(), 5, "{seen:?}");
    for head in &seen {
        let path = head.split(' ').nth(1).unwrap().to_ascii_lowercase();
        assert_eq!(path.trim_end_matches('/'), "/v1/login", "{head}");
    }
    rig.stop().await;
}

/// A login from `client`, behind the trusted proxy the test plays.
fn login_from(client: &str) -> Vec<u8> {
    format!("POST /v1/login HTTP/1.1\r\nhost: gw\r\nx-forwarded-for: {client}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n").into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_ipv6_addresses_in_one_64_share_a_per_ip_bucket() {
    let rig = Rig::start("").await;
    for i in 0..5 {
        let (st, _) = rig
            .raw(&login_from(&format!("2001:db8:0:1::{}", i + 1)))
            .await;
        assert_eq!(st, [200]);
    }
    let (st, _) = rig
        .raw(&login_from("2001:db8:0:1:ffff:ffff:ffff:ffff"))
        .await;
    assert_eq!(st, [429], "the sixth from the same /64");
    let (st, _) = rig.raw(&login_from("2001:db8:0:2::1")).await;
    assert_eq!(st, [200], "another /64 has its own");
    rig.stop().await;

    // a configured prefix of 128 counts each address alone
    let rig = Rig::start("ipv6_prefix = 128").await;
    for i in 0..6 {
        let (st, _) = rig
            .raw(&login_from(&format!("2001:db8:0:1::{}", i + 1)))
            .await;
        assert_eq!(st, [200]);
    }
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strikes_on_one_plan_do_not_hold_an_address_on_another() {
    let rig = Rig::start("[escalation]\nextend_after = 1\nblock_after = 2\n").await;
    let client = "203.0.113.7";
    // the login limit spent, then struck at inside its wait until blocked
    let mut statuses = Vec::new();
    for _ in 0..9 {
        statuses.extend(rig.raw(&login_from(client)).await.0);
    }
    assert_eq!(statuses[..5], [200; 5]);
    assert!(statuses[5..].iter().all(|&s| s == 429), "{statuses:?}");
    // the same address, with no key, on the anonymous plan: its own count
    let anon = format!("GET /v1/rates HTTP/1.1\r\nhost: gw\r\nx-forwarded-for: {client}\r\nconnection: close\r\n\r\n");
    let (st, text) = rig.raw(anon.as_bytes()).await;
    assert_eq!(st, [200], "{text}");
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heads_an_upstream_could_read_another_way_are_refused_before_the_limiter() {
    let rig = Rig::start("").await;
    let before = rig.alice_left().await;
    let key = "authorization: Bearer sk_demo_alice\r\n";
    for (raw, want) in [
        (format!("POST /v1/labels:batch HTTP/1.1\r\n{key}content-length: 0\r\n\r\n"), 400),
        (format!("POST http://u:p@gw/v1/labels:batch HTTP/1.1\r\nhost: gw\r\n{key}content-length: 0\r\n\r\n"), 400),
        (format!("POST /v1/labels:batch HTTP/1.1\r\nhost: u:p@gw\r\n{key}content-length: 0\r\n\r\n"), 400),
        (format!("POST * HTTP/1.1\r\nhost: gw\r\n{key}content-length: 0\r\n\r\n"), 400),
        (format!("CONNECT gw:443 HTTP/1.1\r\nhost: gw:443\r\n{key}\r\n"), 405),
    ] {
        let (st, text) = rig.raw(raw.as_bytes()).await;
        assert_eq!(st, [want], "{raw}: {text}");
        assert!(text.contains("application/problem+json"), "{text}");
    }
    assert!(rig.seen().is_empty(), "{:?}", rig.seen());
    assert_eq!(rig.alice_left().await, before, "nothing charged");
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expect_is_answered_here_and_not_forwarded() {
    let rig = Rig::start("").await;
    let raw = b"POST /v1/labels HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer sk_demo_alice\r\nexpect: 100-continue\r\ncontent-length: 5\r\nconnection: close\r\n\r\nhello";
    let (st, text) = rig.raw(raw).await;
    assert_eq!(st, [200], "{text}");
    let seen = rig.seen();
    assert_eq!(seen.len(), 1);
    assert!(
        !seen[0].to_ascii_lowercase().contains("expect:"),
        "{}",
        seen[0]
    );
    rig.stop().await;
}

mod h2 {
    use super::*;
    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;

    async fn send(req: http::Request<Full<Bytes>>) -> u16 {
        let client = Client::builder(TokioExecutor::new())
            .http2_only(true)
            .build_http::<Full<Bytes>>();
        let res = tokio::time::timeout(LIMIT, client.request(req))
            .await
            .expect("an answer in time")
            .expect("an answer");
        let status = res.status().as_u16();
        let _ = tokio::time::timeout(LIMIT, res.into_body().collect()).await;
        status
    }

    fn get(rig: &Rig) -> http::request::Builder {
        http::Request::get(format!("http://{}/v1/rates", rig.addr))
            .header("authorization", "Bearer sk_demo_alice")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_field_bound_for_both_protocols() {
        let rig = Rig::start("").await;
        let mut b = get(&rig);
        for i in 0..150 {
            b = b.header(format!("x-f{i}"), "v");
        }
        assert_eq!(send(b.body(Full::default()).unwrap()).await, 431);
        assert!(rig.seen().is_empty());
        rig.stop().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cookie_crumbs_go_up_as_one_field() {
        let rig = Rig::start("").await;
        let req = get(&rig)
            .header("cookie", "a=1")
            .header("cookie", "b=2")
            .body(Full::default())
            .unwrap();
        assert_eq!(send(req).await, 200);
        let seen = rig.seen();
        let cookies: Vec<&str> = seen[0]
            .lines()
            .filter(|l| l.starts_with("cookie:"))
            .collect();
        assert_eq!(cookies, ["cookie: a=1; b=2"], "{}", seen[0]);
        rig.stop().await;
    }
}
