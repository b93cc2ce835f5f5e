//! Hostile clients and failing upstreams against a real gateway on
//! loopback, over raw TCP: pipelined requests answered in order (the
//! refused ones among them), an upload aborted half way that leaves no
//! upstream connection half used, an upstream that refuses, stalls or
//! answers garbage, and keys that never reach the metrics or the logs. A
//! scripted upstream records what got through, connection by connection.
//! Every wait is bounded.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use paceline_gateway::{Gateway, GatewayConfig, GatewayHandle};
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const LIMIT: Duration = Duration::from_secs(10);

/// One request the upstream read: on which of its connections, its path,
/// and whether its whole body arrived.
#[derive(Clone, Debug)]
struct Seen {
    conn: usize,
    path: String,
    whole: bool,
}

/// The scripted upstream: per path, `/stall` is read and never answered,
/// `/refuse` is read and the connection closed, `/garbage` gets bytes that
/// are no HTTP; anything else is answered `200` with its path as the body
/// (after reading a `content-length` body whole).
struct Upstream {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    /// Connections accepted, and connections the gateway closed.
    accepted: Arc<AtomicUsize>,
    closed: Arc<AtomicUsize>,
}

async fn upstream() -> Upstream {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let accepted = Arc::new(AtomicUsize::new(0));
    let closed = Arc::new(AtomicUsize::new(0));
    let (s2, a2, c2) = (seen.clone(), accepted.clone(), closed.clone());
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let conn = a2.fetch_add(1, Ordering::SeqCst);
            let (seen, closed) = (s2.clone(), c2.clone());
            tokio::spawn(async move {
                serve(s, conn, seen).await;
                closed.fetch_add(1, Ordering::SeqCst);
            });
        }
    });
    Upstream {
        addr,
        seen,
        accepted,
        closed,
    }
}

async fn serve(mut s: TcpStream, conn: usize, seen: Arc<Mutex<Vec<Seen>>>) {
    let mut buf = Vec::new();
    loop {
        let Some(end) = fill_until(&mut s, &mut buf, |b| find(b, b"\r\n\r\n")).await else {
            return;
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
        buf.drain(..end + 4);
        let path = head.split(' ').nth(1).unwrap_or("").to_string();
        let len = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .and_then(|v| v.trim().parse::<usize>().ok())
            .unwrap_or(0);
        let i = {
            let mut seen = seen.lock();
            seen.push(Seen {
                conn,
                path: path.clone(),
                whole: len == 0,
            });
            seen.len() - 1
        };
        if len > 0 {
            if fill_until(&mut s, &mut buf, |b| (b.len() >= len).then_some(len))
                .await
                .is_none()
            {
                return;
            }
            buf.drain(..len);
            seen.lock()[i].whole = true;
        }
        match path.as_str() {
            "/stall" => {
                // hold the connection, answer nothing, until the gateway
                // gives up on it
                let mut sink = [0u8; 256];
                while matches!(s.read(&mut sink).await, Ok(n) if n > 0) {}
                return;
            }
            "/refuse" => return,
            "/garbage" => {
                let _ = s.write_all(b"SSH-2.0-OpenSSH\r\n\r\n").await;
                return;
            }
            _ => {
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{path}",
                    path.len()
                );
                if s.write_all(answer.as_bytes()).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Reads into `buf` until `done` finds what it needs; `None` at the end
/// of the stream.
async fn fill_until(
    s: &mut TcpStream,
    buf: &mut Vec<u8>,
    done: impl Fn(&[u8]) -> Option<usize>,
) -> Option<usize> {
    loop {
        if let Some(i) = done(buf) {
            return Some(i);
        }
        let mut chunk = [0u8; 4096];
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

fn find(buf: &[u8], what: &[u8]) -> Option<usize> {
    buf.windows(what.len()).position(|w| w == what)
}

struct Rig {
    addr: SocketAddr,
    metrics: SocketAddr,
    handle: GatewayHandle,
    served: tokio::task::JoinHandle<std::io::Result<()>>,
    up: Upstream,
}

impl Rig {
    /// A gateway in front of the scripted upstream: `sk_small` may make 3
    /// requests an hour, `sk_big` 1000; the upstream has 300 ms to start
    /// its answer.
    async fn start() -> Rig {
        let up = upstream().await;
        let text = format!(
            r#"[gateway]
listen = "127.0.0.1:0"
upstream = "http://{}"
metrics_listen = "127.0.0.1:0"
watch = false
[gateway.timeouts]
upstream_header_ms = 300

[plans.small]
policies = [{{ name = "hour", algorithm = "fixed_window", q = 3, w = 3600 }}]
[plans.big]
policies = [{{ name = "hour", algorithm = "fixed_window", q = 1000, w = 3600 }}]

[keys]
sk_small_7f3a = "small"
sk_big_91c2 = "big"
"#,
            up.addr
        );
        let cfg = GatewayConfig::parse(&text, "hostile.toml", None).unwrap();
        let gw = Gateway::bind(cfg).await.unwrap();
        let (addr, metrics) = (gw.local_addr(), gw.metrics_addr().unwrap());
        let handle = gw.handle();
        let served = tokio::spawn(gw.run(std::future::pending()));
        Rig {
            addr,
            metrics,
            handle,
            served,
            up,
        }
    }

    async fn stop(self) {
        self.handle.shutdown();
        let _ = tokio::time::timeout(LIMIT, self.served).await;
    }

    fn seen(&self) -> Vec<Seen> {
        self.up.seen.lock().clone()
    }

    /// One request on a new connection: the answer.
    async fn one(&self, path: &str, key: &str) -> Answer {
        let mut s = TcpStream::connect(self.addr).await.unwrap();
        s.write_all(get(path, key).as_bytes()).await.unwrap();
        let mut buf = Vec::new();
        read_answer(&mut s, &mut buf).await.expect("an answer")
    }
}

fn get(path: &str, key: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer {key}\r\n\r\n")
}

#[derive(Debug)]
struct Answer {
    status: u16,
    head: String,
    body: String,
}

/// Reads one answer (head, then a `content-length` body) from `s`, keeping
/// what follows it in `buf`; `None` when the connection closes first.
async fn read_answer(s: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Answer> {
    tokio::time::timeout(LIMIT, async {
        let end = fill_until(s, buf, |b| find(b, b"\r\n\r\n")).await? + 4;
        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
        let status = head.get(9..12)?.parse().ok()?;
        let len = head
            .to_ascii_lowercase()
            .lines()
            .find_map(|l| l.strip_prefix("content-length: ")?.trim().parse().ok())
            .unwrap_or(0usize);
        fill_until(s, buf, |b| (b.len() >= end + len).then_some(0)).await?;
        let body = String::from_utf8_lossy(&buf[end..end + len]).into_owned();
        buf.drain(..end + len);
        Some(Answer { status, head, body })
    })
    .await
    .expect("an answer or a close in time")
}

/// The problem type's last segment of a problem answer.
fn problem_type(a: &Answer) -> String {
    assert!(
        a.head
            .to_ascii_lowercase()
            .contains("content-type: application/problem+json"),
        "{a:?}"
    );
    let v: serde_json::Value = serde_json::from_str(&a.body).expect("a problem document");
    let ty = v["type"].as_str().unwrap();
    ty.rsplit('/').next().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_requests_are_answered_in_order_refusals_included() {
    let rig = Rig::start().await;
    let mut wire = String::new();
    wire += &get("/p1", "sk_big_91c2");
    wire += "GET /p2 HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer sk_big_91c2\r\nauthorization: Bearer sk_small_7f3a\r\n\r\n";
    wire += &get("/p3", "sk_nobody");
    wire += &get("/p4", "sk_big_91c2");
    for i in 1..=4 {
        wire += &get(&format!("/s{i}"), "sk_small_7f3a");
    }
    wire += &get("/p5", "sk_big_91c2");
    let mut s = TcpStream::connect(rig.addr).await.unwrap();
    // all of it in one write: the gateway reads them back to back
    s.write_all(wire.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let mut got = Vec::new();
    for _ in 0..9 {
        let a = read_answer(&mut s, &mut buf)
            .await
            .expect("one answer per request");
        got.push((a.status, a.body.clone(), a));
    }
    let statuses: Vec<u16> = got.iter().map(|g| g.0).collect();
    assert_eq!(statuses, [200, 400, 401, 200, 200, 200, 200, 429, 200]);
    assert_eq!(problem_type(&got[1].2), "duplicate_credentials");
    assert_eq!(problem_type(&got[2].2), "unknown_key");
    assert_eq!(problem_type(&got[7].2), "quota_exhausted");
    let bodies: Vec<&str> = [0, 3, 4, 5, 6, 8].iter().map(|&i| &*got[i].1).collect();
    assert_eq!(bodies, ["/p1", "/p4", "/s1", "/s2", "/s3", "/p5"]);
    // the upstream saw exactly the admitted ones, in order
    let paths: Vec<String> = rig.seen().into_iter().map(|s| s.path).collect();
    assert_eq!(paths, ["/p1", "/p4", "/s1", "/s2", "/s3", "/p5"]);
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_aborted_half_way_leaves_no_upstream_connection_half_used() {
    let rig = Rig::start().await;
    // warm the pool: one idle upstream connection
    assert_eq!(rig.one("/warm", "sk_big_91c2").await.status, 200);
    for round in 0..3 {
        let mut s = TcpStream::connect(rig.addr).await.unwrap();
        let head = "POST /upload HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer sk_big_91c2\r\ncontent-length: 100000\r\n\r\n";
        s.write_all(head.as_bytes()).await.unwrap();
        // past the intake's first 16 KiB, so the request goes upstream
        s.write_all(&[b'x'; 20_000]).await.unwrap();
        // the head reached the upstream, its body is under way: abort
        let started = Instant::now();
        while !rig.seen().iter().any(|x| x.path == "/upload") {
            assert!(started.elapsed() < LIMIT, "the upload reached the upstream");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        drop(s);
        // requests after it are answered whole, never on the connection
        // that carried the unfinished body
        for _ in 0..3 {
            let a = rig.one("/after", "sk_big_91c2").await;
            assert_eq!((a.status, &*a.body), (200, "/after"), "round {round}");
        }
        let seen = rig.seen();
        let at = seen.iter().position(|x| x.path == "/upload").unwrap();
        let upload = &seen[at];
        assert!(!upload.whole, "the body never arrived whole");
        assert!(
            seen[at + 1..]
                .iter()
                .all(|x| x.path == "/after" && x.conn != upload.conn),
            "a request went on the aborted upload's connection: {seen:?}"
        );
        rig.up.seen.lock().clear();
    }
    // and the gateway closed each aborted upload's connection
    let started = Instant::now();
    while rig.up.closed.load(Ordering::SeqCst) < 3 {
        assert!(started.elapsed() < LIMIT, "aborted connections closed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_refuses_stalls_or_answers_garbage_is_answered_cleanly() {
    let rig = Rig::start().await;
    for (path, status, kind) in [
        ("/refuse", 502, "bad_gateway"),
        ("/garbage", 502, "bad_gateway"),
        ("/stall", 504, "gateway_timeout"),
    ] {
        let started = Instant::now();
        let a = rig.one(path, "sk_big_91c2").await;
        assert_eq!(a.status, status, "{path}: {a:?}");
        assert_eq!(problem_type(&a), kind, "{path}");
        if path == "/stall" {
            // the upstream header bound (300 ms), not the test's patience
            let took = started.elapsed();
            assert!(
                took >= Duration::from_millis(250) && took < Duration::from_secs(5),
                "{took:?}"
            );
        }
        // the next request gets a whole answer from a working connection
        let a = rig.one("/fine", "sk_big_91c2").await;
        assert_eq!((a.status, &*a.body), (200, "/fine"), "after {path}");
    }
    // every fault was one request at the upstream (none was retried)
    let seen = rig.seen();
    for path in ["/refuse", "/garbage", "/stall"] {
        assert_eq!(seen.iter().filter(|x| x.path == path).count(), 1, "{path}");
    }
    // a pipelined request behind a stalled one is answered after it, and
    // in order
    let mut s = TcpStream::connect(rig.addr).await.unwrap();
    let wire = get("/stall", "sk_big_91c2") + &get("/behind", "sk_big_91c2");
    s.write_all(wire.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let first = read_answer(&mut s, &mut buf).await.expect("the 504");
    assert_eq!(first.status, 504);
    let second = read_answer(&mut s, &mut buf).await.expect("the next");
    assert_eq!((second.status, &*second.body), (200, "/behind"));
    assert!(rig.up.accepted.load(Ordering::SeqCst) >= 4);
    rig.stop().await;
}

/// A writer that keeps everything the log subscriber writes.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

// one thread: the subscriber set for this test sees every task it spawns
#[tokio::test(flavor = "current_thread")]
async fn keys_reach_neither_the_metrics_nor_the_logs() {
    let logs = Captured::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let rig = Rig::start().await;
    let keys = ["sk_small_7f3a", "sk_big_91c2", "sk_nobody_c0ffee"];
    for _ in 0..5 {
        for k in keys {
            let _ = rig.one("/v1/rates", k).await;
        }
    }
    // a fault and a refusal too, which log the most
    let _ = rig.one("/refuse", "sk_big_91c2").await;
    let _ = rig
        .one(
            "/v1/rates",
            "sk_big_91c2\r\nauthorization: Bearer sk_small_7f3a",
        )
        .await;
    let mut s = TcpStream::connect(rig.metrics).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nhost: m\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut metrics = Vec::new();
    tokio::time::timeout(LIMIT, s.read_to_end(&mut metrics))
        .await
        .expect("metrics in time")
        .unwrap();
    let metrics = String::from_utf8_lossy(&metrics);
    assert!(metrics.contains("paceline_decisions_total"), "{metrics}");
    rig.stop().await;
    let logs = String::from_utf8_lossy(&logs.0.lock()).into_owned();
    assert!(
        logs.contains("request rejected"),
        "the refusals were logged: {logs}"
    );
    for k in keys {
        // neither the key nor the part after its prefix
        for needle in [k, &k[3..]] {
            assert!(!metrics.contains(needle), "{needle} in the metrics");
            assert!(!logs.contains(needle), "{needle} in the logs");
        }
    }
}
