//! The gateway's edge against raw TCP clients on loopback, as a hostile
//! client would probe it: one credential per request, a bounded request
//! head, forwarding fields a client cannot choose, and strict body
//! framing. A recording upstream shows what got through. Every wait is
//! bounded.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use paceline_gateway::{Gateway, GatewayConfig, GatewayHandle};
use paceline_wire::problem::PROBLEM_CONTENT_TYPE;
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

mod common;

use common::{find, next_head};

const LIMIT: Duration = Duration::from_secs(10);

/// An upstream that records every request head it reads and answers each
/// `200 ok` (the test requests carry no body).
async fn recording_upstream() -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let heads = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = l.accept().await else {
                return;
            };
            let heads = heads.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    let Some(head) = next_head(&mut s, &mut buf).await else {
                        return;
                    };
                    heads
                        .lock()
                        .push(String::from_utf8_lossy(&head).into_owned());
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

struct Rig {
    addr: SocketAddr,
    handle: GatewayHandle,
    served: tokio::task::JoinHandle<std::io::Result<()>>,
    seen: Arc<Mutex<Vec<String>>>,
}

impl Rig {
    /// A gateway with a Free-like plan, a per-IP login route (2 a minute)
    /// and `extra` added to the top of the file.
    async fn start(gateway: &str, top: &str) -> Rig {
        let (up, seen) = recording_upstream().await;
        let text = format!(
            r#"{top}
[gateway]
listen = "127.0.0.1:0"
upstream = "http://{up}"
watch = false
{gateway}

[plans.free]
policies = [{{ name = "burst", algorithm = "token_bucket", q = 100, w = 3600 }}]

[plans.login]
policies = [{{ name = "login", algorithm = "fixed_window", q = 2, w = 60 }}]

[keys]
sk_a = "free"

[[routes]]
method = "POST"
path = "/v1/login"
anonymous = true
plan = "login"
"#
        );
        let cfg = GatewayConfig::parse(&text, "edge.toml", None).unwrap();
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

    /// Sends `head` (and nothing more) on a new connection; the answer's
    /// status, head and body.
    async fn raw(&self, head: &[u8]) -> Answer {
        let mut s = TcpStream::connect(self.addr).await.unwrap();
        s.write_all(head).await.unwrap();
        tokio::time::timeout(LIMIT, read_answer(&mut s))
            .await
            .expect("an answer in time")
    }

    /// The burst left for `sk_a`, read from the usage endpoint.
    async fn left(&self) -> u64 {
        let a = self
            .raw(b"GET /v1/usage HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer sk_a\r\n\r\n")
            .await;
        assert_eq!(a.status, 200, "{}", a.head);
        let v: serde_json::Value = serde_json::from_str(&a.body).unwrap();
        v["limits"][0]["r"].as_u64().unwrap()
    }
}

#[derive(Debug)]
struct Answer {
    status: u16,
    head: String,
    body: String,
}

impl Answer {
    /// Asserts a problem answer of `status` whose type ends in `code`.
    fn problem(&self, status: u16, code: &str) {
        assert_eq!(self.status, status, "{}{}", self.head, self.body);
        let head = self.head.to_ascii_lowercase();
        assert!(
            head.contains(&format!("content-type: {PROBLEM_CONTENT_TYPE}")),
            "{head}"
        );
        let v: serde_json::Value = serde_json::from_str(&self.body).unwrap();
        let ty = v["type"].as_str().unwrap();
        assert!(ty.ends_with(&format!("/{code}")), "{ty}");
        assert_eq!(v["status"], status);
    }
}

/// Reads one answer: the head, then a body of its `content-length` (or
/// up to the close).
async fn read_answer(s: &mut TcpStream) -> Answer {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let end = loop {
        if let Some(i) = find(&buf, b"\r\n\r\n") {
            break i + 4;
        }
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => panic!(
                "closed before an answer: {:?}",
                String::from_utf8_lossy(&buf)
            ),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let status = head[9..12].parse().unwrap();
    let len = head.to_ascii_lowercase().lines().find_map(|l| {
        l.strip_prefix("content-length: ")
            .map(|v| v.trim().parse::<usize>().unwrap())
    });
    let mut body = buf[end..].to_vec();
    loop {
        if len.is_some_and(|n| body.len() >= n) {
            break;
        }
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => body.extend_from_slice(&chunk[..n]),
        }
    }
    Answer {
        status,
        head,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

fn count(head: &str, field: &str) -> usize {
    head.to_ascii_lowercase()
        .lines()
        .filter(|l| l.starts_with(&format!("{field}:")))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_credential_per_request() {
    let rig = Rig::start("", "").await;
    let before = rig.left().await;
    // the first field unknown, the second a real key: refused, not charged
    for first in ["Bearer x", "Bearer sk_a"] {
        let head = format!(
            "GET /v1/rates HTTP/1.1\r\nhost: gw\r\nauthorization: {first}\r\nauthorization: Bearer sk_a\r\n\r\n"
        );
        rig.raw(head.as_bytes())
            .await
            .problem(400, "duplicate_credentials");
    }
    // two tokens in one field are two credentials as well
    rig.raw(b"GET /v1/rates HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer x, Bearer sk_a\r\n\r\n")
        .await
        .problem(400, "duplicate_credentials");
    assert!(rig.seen.lock().is_empty(), "nothing reached the upstream");
    assert_eq!(rig.left().await, before, "nothing was charged");
    // one credential passes, charged, and goes upstream exactly as it came
    let a = rig
        .raw(b"GET /v1/rates HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer sk_a\r\n\r\n")
        .await;
    assert_eq!(a.status, 200, "{}", a.head);
    assert!(
        a.head.to_ascii_lowercase().contains("\r\nratelimit: "),
        "{}",
        a.head
    );
    assert_eq!(rig.left().await, before - 1);
    let seen = rig.seen.lock().clone();
    assert_eq!(seen.len(), 1);
    assert_eq!(count(&seen[0], "authorization"), 1, "{}", seen[0]);
    assert!(
        seen[0].contains("\r\nauthorization: Bearer sk_a\r\n"),
        "{}",
        seen[0]
    );
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_header_is_one_too() {
    let rig = Rig::start("", "key = \"header:x-api-key\"\n").await;
    rig.raw(b"GET /v1/rates HTTP/1.1\r\nhost: gw\r\nx-api-key: x\r\nx-api-key: sk_a\r\n\r\n")
        .await
        .problem(400, "duplicate_credentials");
    assert!(rig.seen.lock().is_empty());
    let a = rig
        .raw(b"GET /v1/rates HTTP/1.1\r\nhost: gw\r\nx-api-key: sk_a\r\n\r\n")
        .await;
    assert_eq!(a.status, 200, "{}", a.head);
    rig.stop().await;
}

fn head_of(size: usize) -> Vec<u8> {
    let mut h =
        b"GET /v1/rates HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer sk_a\r\nx-pad: ".to_vec();
    let pad = size.saturating_sub(h.len() + 4);
    h.extend(std::iter::repeat_n(b'a', pad));
    h.extend_from_slice(b"\r\n\r\n");
    h
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_heads_are_bounded_by_default() {
    let rig = Rig::start("", "").await;
    let a = rig.raw(&head_of(60 * 1024)).await;
    assert_eq!(a.status, 200, "a head under 64 KiB passes");
    rig.raw(&head_of(70 * 1024))
        .await
        .problem(431, "head_too_large");
    assert_eq!(
        rig.seen.lock().len(),
        1,
        "the long head did not go upstream"
    );
    rig.stop().await;

    let rig = Rig::start("max_head_bytes = 16384", "").await;
    assert_eq!(rig.raw(&head_of(12 * 1024)).await.status, 200);
    rig.raw(&head_of(20 * 1024))
        .await
        .problem(431, "head_too_large");
    assert_eq!(rig.seen.lock().len(), 1);
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unfinished_long_head_is_answered_at_the_bound() {
    // a client that keeps sending one head gets 431 once the bound is
    // reached, while its head is still unfinished
    let rig = Rig::start("", "").await;
    let s = TcpStream::connect(rig.addr).await.unwrap();
    let (mut rd, mut wr) = s.into_split();
    let writer = tokio::spawn(async move {
        let _ = wr
            .write_all(b"GET /v1/rates HTTP/1.1\r\nhost: gw\r\nx-pad: ")
            .await;
        let pad = vec![b'a'; 8 * 1024];
        // 256 KiB of one field, never finished
        for _ in 0..32 {
            if wr.write_all(&pad).await.is_err() {
                return;
            }
        }
        // held open, head unfinished, until the test ends
        std::future::pending::<()>().await;
    });
    let mut buf = Vec::new();
    let read = tokio::time::timeout(LIMIT, rd.read_to_end(&mut buf)).await;
    let text = String::from_utf8_lossy(&buf);
    assert!(read.is_ok(), "answered and closed in time");
    assert!(text.starts_with("HTTP/1.1 431 "), "{text}");
    assert!(text.contains("/head_too_large\""), "{text}");
    assert!(rig.seen.lock().is_empty());
    writer.abort();
    rig.stop().await;
}

fn login(forwarded: Option<&str>, xff: Option<&str>) -> Vec<u8> {
    let mut h = String::from("POST /v1/login HTTP/1.1\r\nhost: gw\r\ncontent-length: 0\r\n");
    if let Some(f) = forwarded {
        h.push_str(&format!("forwarded: {f}\r\n"));
    }
    if let Some(x) = xff {
        h.push_str(&format!("x-forwarded-for: {x}\r\n"));
    }
    h.push_str("\r\n");
    h.into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_cannot_name_its_own_address() {
    // no trusted proxy: what the client sent is replaced by its address
    let rig = Rig::start("", "").await;
    let a = rig
        .raw(&login(
            Some("for=198.51.100.1;proto=https"),
            Some("198.51.100.1"),
        ))
        .await;
    assert_eq!(a.status, 200, "{}", a.head);
    let head = rig.seen.lock()[0].to_ascii_lowercase();
    assert!(
        head.contains("\r\nx-forwarded-for: 127.0.0.1\r\n"),
        "{head}"
    );
    assert!(head.contains("\r\nforwarded: for=127.0.0.1\r\n"), "{head}");
    assert!(!head.contains("198.51.100.1"), "{head}");
    rig.stop().await;

    // behind a trusted proxy that appends X-Forwarded-For: a client's own
    // Forwarded does not pick its bucket
    let rig = Rig::start("", "trusted_proxies = [\"127.0.0.0/8\"]\n").await;
    let mut statuses = Vec::new();
    for i in 0..4 {
        let fake = format!("for=198.51.100.{i}");
        let a = rig.raw(&login(Some(&fake), Some("203.0.113.9"))).await;
        statuses.push(a.status);
    }
    assert_eq!(statuses, [200, 200, 429, 429]);
    // each client the proxy names still counts alone
    let a = rig.raw(&login(None, Some("203.0.113.10"))).await;
    assert_eq!(a.status, 200);
    // and the upstream gets the trusted chain with the proxy appended
    let head = rig.seen.lock()[0].to_ascii_lowercase();
    assert!(
        head.contains("\r\nx-forwarded-for: 203.0.113.9, 127.0.0.1\r\n"),
        "{head}"
    );
    assert!(
        head.contains("\r\nforwarded: for=198.51.100.0, for=127.0.0.1\r\n"),
        "{head}"
    );
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn framing_is_strict() {
    let rig = Rig::start("", "").await;
    let key = "authorization: Bearer sk_a\r\n";
    let before = rig.left().await;
    let te = format!(
        "POST /v1/rates HTTP/1.1\r\nhost: gw\r\n{key}transfer-encoding: gzip, chunked\r\n\r\n0\r\n\r\n"
    );
    let a = rig.raw(te.as_bytes()).await;
    a.problem(501, "not_implemented");
    assert!(
        a.head.to_ascii_lowercase().contains("connection: close"),
        "{}",
        a.head
    );
    let hosts = format!("GET /v1/rates HTTP/1.1\r\nhost: gw\r\nhost: other\r\n{key}\r\n");
    rig.raw(hosts.as_bytes()).await.problem(400, "bad_request");
    assert!(rig.seen.lock().is_empty(), "nothing reached the upstream");
    assert_eq!(rig.left().await, before, "nothing was charged");
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_lengths_that_do_not_parse_are_400() {
    // HTTP/1.1 heads are parsed by hyper before the gateway sees them; its
    // refusals (the two largest 64-bit values among them, which it keeps
    // as markers and would answer 431) become problem answers
    let rig = Rig::start("", "").await;
    for len in [
        "18446744073709551615",
        "18446744073709551614",
        "18446744073709551616",
        "1e3",
        "5, 6",
        "-1",
    ] {
        let head = format!("POST /v1/rates HTTP/1.1\r\nhost: gw\r\ncontent-length: {len}\r\n\r\n");
        let a = rig.raw(head.as_bytes()).await;
        a.problem(400, "bad_request");
        assert!(a.body.contains("Content-Length"), "{len}: {}", a.body);
    }
    // two fields that disagree
    let head =
        "POST /v1/rates HTTP/1.1\r\nhost: gw\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\n";
    rig.raw(head.as_bytes()).await.problem(400, "bad_request");
    // a head hyper cannot parse at all is a problem answer too
    rig.raw(b"GET /v1/rates HTTP/1.1\r\nhost: gw\r\nbad field\r\n\r\n")
        .await
        .problem(400, "bad_request");
    assert!(rig.seen.lock().is_empty());
    rig.stop().await;
}
