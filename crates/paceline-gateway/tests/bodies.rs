//! Slow and hostile request bodies against the gateway on loopback: the
//! per-request body deadlines (least rate, whole-body bound), in-flight
//! places that slow senders cannot hold, and the bound on bytes held for
//! unfinished heads and bodies. An upstream that reads each body whole
//! before answering shows what reached it. Every wait is bounded.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use paceline_gateway::{Gateway, GatewayConfig, GatewayHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const LIMIT: Duration = Duration::from_secs(10);

/// What the upstream saw: connections accepted, connections that ended
/// with a request unfinished, and requests answered.
#[derive(Default)]
struct Seen {
    accepted: AtomicUsize,
    cut: AtomicUsize,
    answered: AtomicUsize,
}

fn find(buf: &[u8], what: &[u8]) -> Option<usize> {
    buf.windows(what.len()).position(|w| w == what)
}

/// An upstream that reads each request's head and its whole
/// `content-length` body, then answers `200 ok`.
async fn reading_upstream() -> (SocketAddr, Arc<Seen>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let seen = Arc::new(Seen::default());
    let s2 = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            s2.accepted.fetch_add(1, Ordering::SeqCst);
            let seen = s2.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    // a head, then its body
                    let end = loop {
                        if let Some(i) = find(&buf, b"\r\n\r\n") {
                            break i + 4;
                        }
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => {
                                if !buf.is_empty() {
                                    seen.cut.fetch_add(1, Ordering::SeqCst);
                                }
                                return;
                            }
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                    let len: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length: "))
                        .map_or(0, |v| v.trim().parse().unwrap());
                    while buf.len() < end + len {
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => {
                                seen.cut.fetch_add(1, Ordering::SeqCst);
                                return;
                            }
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    buf.drain(..end + len);
                    seen.answered.fetch_add(1, Ordering::SeqCst);
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
    seen: Arc<Seen>,
}

impl Rig {
    /// A gateway whose `[gateway]` table ends with `extra`, in front of a
    /// reading upstream; `POST /v1/labels` is critical, `GET /v1/rates`
    /// sheddable, everything else normal.
    async fn start(extra: &str) -> Rig {
        let (up, seen) = reading_upstream().await;
        let text = format!(
            r#"[gateway]
listen = "127.0.0.1:0"
upstream = "http://{up}"
watch = false
{extra}

[plans.free]
policies = [{{ name = "burst", algorithm = "token_bucket", q = 1000, w = 3600 }}]

[keys]
sk_a = "free"

[[routes]]
method = "POST"
path = "/v1/labels"
criticality = "CRITICAL"

[[routes]]
method = "GET"
path = "/v1/rates"
criticality = "SHEDDABLE"
"#
        );
        let cfg = GatewayConfig::parse(&text, "bodies.toml", None).unwrap();
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

    /// A connection that has sent the head of a POST announcing `len`
    /// body bytes, and `first` of them.
    async fn upload(&self, path: &str, len: usize, first: &[u8]) -> TcpStream {
        let mut s = TcpStream::connect(self.addr).await.unwrap();
        let head = format!(
            "POST {path} HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer sk_a\r\ncontent-length: {len}\r\n\r\n"
        );
        s.write_all(head.as_bytes()).await.unwrap();
        s.write_all(first).await.unwrap();
        s
    }

    /// One whole request on a new connection: its status.
    async fn status(&self, req: &[u8]) -> u16 {
        let mut s = TcpStream::connect(self.addr).await.unwrap();
        s.write_all(req).await.unwrap();
        let (status, _) = tokio::time::timeout(LIMIT, read_answer(&mut s))
            .await
            .expect("an answer in time");
        status
    }
}

/// Reads one answer's status and head; then whether the connection was
/// closed after it is up to the caller.
async fn read_answer<R: AsyncReadExt + Unpin>(s: &mut R) -> (u16, String) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let end = loop {
        if let Some(i) = find(&buf, b"\r\n\r\n") {
            break i + 4;
        }
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return (0, String::from_utf8_lossy(&buf).into_owned()),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    (head[9..12].parse().unwrap(), head)
}

/// Reads until the peer closes (true) or `within` passes (false).
async fn closed_within<R: AsyncReadExt + Unpin>(s: &mut R, within: Duration) -> bool {
    let mut chunk = [0u8; 4096];
    tokio::time::timeout(within, async {
        loop {
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok()
}

/// Sends one byte every `every` (at most 200) on the writing half of
/// `s`, until a write fails; the reading half is returned.
fn trickle(
    s: TcpStream,
    every: Duration,
) -> (tokio::net::tcp::OwnedReadHalf, tokio::task::JoinHandle<()>) {
    let (rd, mut wr) = s.into_split();
    let task = tokio::spawn(async move {
        for _ in 0..200 {
            tokio::time::sleep(every).await;
            if wr.write_all(b"x").await.is_err() {
                break;
            }
        }
    });
    (rd, task)
}

const FAST_RATE: &str = r#"
[gateway.timeouts]
body_rate_window_ms = 300
body_rate_grace_ms = 300

[gateway.limits]
min_body_rate = 1000
intake_bytes = 8
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_below_the_least_rate_is_408_in_its_intake_and_never_reaches_the_upstream() {
    let rig = Rig::start(FAST_RATE).await;
    let started = Instant::now();
    let s = rig.upload("/v1/orders", 1000, b"x").await;
    let (mut s, feeding) = trickle(s, Duration::from_millis(50));
    let (status, head) = tokio::time::timeout(LIMIT, read_answer(&mut s))
        .await
        .unwrap();
    assert_eq!(status, 408, "{head}");
    assert!(
        head.to_ascii_lowercase().contains("connection: close"),
        "{head}"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "not before the grace"
    );
    feeding.abort();
    assert!(
        closed_within(&mut s, LIMIT).await,
        "the connection is closed"
    );
    assert_eq!(
        rig.seen.accepted.load(Ordering::SeqCst),
        0,
        "nothing went up"
    );
    assert_eq!(rig.handle.receiving(), 0);
    assert_eq!(rig.handle.buffered_bytes(), 0);
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_slows_down_upstream_is_408_and_its_upstream_connection_is_dropped() {
    let rig = Rig::start(FAST_RATE).await;
    // the intake's 8 bytes come at once: the request goes up, then its
    // body comes at a trickle
    let s = rig.upload("/v1/orders", 1000, b"01234567").await;
    let (mut s, feeding) = trickle(s, Duration::from_millis(50));
    let (status, head) = tokio::time::timeout(LIMIT, read_answer(&mut s))
        .await
        .unwrap();
    feeding.abort();
    assert_eq!(status, 408, "{head}");
    assert!(
        head.to_ascii_lowercase().contains("connection: close"),
        "{head}"
    );
    assert!(
        closed_within(&mut s, LIMIT).await,
        "the client connection is closed"
    );
    // the upstream had the request, unfinished, and its connection ended
    let deadline = Instant::now() + LIMIT;
    while rig.seen.cut.load(Ordering::SeqCst) == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(rig.seen.accepted.load(Ordering::SeqCst), 1);
    assert_eq!(
        rig.seen.cut.load(Ordering::SeqCst),
        1,
        "aborted, not reused"
    );
    // the next request gets a new upstream connection
    let status = rig
        .status(b"GET /v1/x HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer sk_a\r\n\r\n")
        .await;
    assert_eq!(status, 200);
    assert_eq!(rig.seen.accepted.load(Ordering::SeqCst), 2);
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_body_is_bounded_in_time() {
    // fast enough for the rate rule (off), too slow for the whole bound
    let rig = Rig::start(
        "[gateway.timeouts]\nrequest_body_ms = 400\n[gateway.limits]\nmin_body_rate = 0\n",
    )
    .await;
    let started = Instant::now();
    let s = rig.upload("/v1/orders", 1000, b"x").await;
    let (mut s, feeding) = trickle(s, Duration::from_millis(20));
    let (status, head) = tokio::time::timeout(LIMIT, read_answer(&mut s))
        .await
        .unwrap();
    feeding.abort();
    assert_eq!(status, 408, "{head}");
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(400), "{took:?}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert!(closed_within(&mut s, LIMIT).await);
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_uploaders_do_not_take_the_in_flight_places() {
    // four places in flight; twelve clients sending bodies at a byte per
    // 100 ms (the rate rule off: they are as slow as they like)
    let rig =
        Rig::start("[gateway.shedding]\nmax_in_flight = 4\n[gateway.limits]\nmin_body_rate = 0\n")
            .await;
    let mut slow = Vec::new();
    for _ in 0..12 {
        let s = rig.upload("/v1/orders", 100_000, b"x").await;
        slow.push(trickle(s, Duration::from_millis(100)));
    }
    // let them all be read and waiting
    let deadline = Instant::now() + LIMIT;
    while rig.handle.receiving() < 12 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // a critical request with a body, a normal one and a sheddable one
    // are all served
    for _ in 0..3 {
        let label = b"POST /v1/labels HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer sk_a\r\ncontent-length: 5\r\n\r\nhello";
        assert_eq!(rig.status(label).await, 200);
        let normal = b"GET /v1/orders HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer sk_a\r\n\r\n";
        assert_eq!(rig.status(normal).await, 200);
        let quote = b"GET /v1/rates HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer sk_a\r\n\r\n";
        assert_eq!(rig.status(quote).await, 200);
    }
    assert_eq!(rig.handle.receiving(), 12);
    assert_eq!(rig.handle.shedder().in_flight(), 0, "none holds a place");
    for (_, t) in slow {
        t.abort();
    }
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receiving_places_are_bounded_per_client() {
    let rig = Rig::start("[gateway.limits]\nmin_body_rate = 0\nmax_receiving_per_ip = 3\n").await;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(rig.upload("/v1/orders", 100, b"x").await);
    }
    let deadline = Instant::now() + LIMIT;
    while rig.handle.receiving() < 3 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut fourth = rig.upload("/v1/orders", 100, b"x").await;
    let (status, head) = tokio::time::timeout(LIMIT, read_answer(&mut fourth))
        .await
        .unwrap();
    assert_eq!(status, 503, "{head}");
    assert!(
        head.to_ascii_lowercase().contains("connection: close"),
        "{head}"
    );
    // a body that comes whole with its head needs no place
    let whole = b"POST /v1/labels HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer sk_a\r\ncontent-length: 5\r\n\r\nhello";
    assert_eq!(rig.status(whole).await, 200);
    drop(held);
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_held_for_unfinished_heads_stay_under_the_bound() {
    const CAP: usize = 1024 * 1024;
    let rig = Rig::start(&format!("[gateway.limits]\nmax_buffered_bytes = {CAP}\n")).await;
    let piece = format!(
        "GET /v1/x HTTP/1.1\r\nhost: gw\r\nx-pad: {}",
        "a".repeat(60 * 1024)
    );
    let mut conns = Vec::new();
    let mut peak = 0;
    for _ in 0..40 {
        let mut s = TcpStream::connect(rig.addr).await.unwrap();
        // a head never finished
        let _ = s.write_all(piece.as_bytes()).await;
        conns.push(s);
        tokio::time::sleep(Duration::from_millis(5)).await;
        peak = peak.max(rig.handle.buffered_bytes());
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        peak = peak.max(rig.handle.buffered_bytes());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(peak <= CAP, "held {peak} bytes, bound {CAP}");
    assert!(peak > CAP / 2, "the heads were counted: {peak}");
    // the connections past the bound were closed without an answer
    let mut closed = 0;
    for s in &mut conns {
        if closed_within(s, Duration::from_millis(50)).await {
            closed += 1;
        }
    }
    assert!(closed >= 20, "{closed} of 40 closed");
    drop(conns);
    let deadline = Instant::now() + LIMIT;
    while rig.handle.buffered_bytes() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(rig.handle.buffered_bytes(), 0, "all given back");
    // and new work is taken again
    let status = rig
        .status(b"GET /v1/x HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer sk_a\r\n\r\n")
        .await;
    assert_eq!(status, 200);
    rig.stop().await;
}

/// Reads one answer whole (head, then its `content-length` body).
async fn read_whole<R: AsyncReadExt + Unpin>(s: &mut R) -> (u16, String, String) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let end = loop {
        if let Some(i) = find(&buf, b"\r\n\r\n") {
            break i + 4;
        }
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => {
                return (0, String::from_utf8_lossy(&buf).into_owned(), String::new())
            }
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let len = head
        .to_ascii_lowercase()
        .lines()
        .find_map(|l| l.strip_prefix("content-length: ")?.trim().parse().ok())
        .unwrap_or(0usize);
    while buf.len() < end + len {
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let body = String::from_utf8_lossy(&buf[end..]).into_owned();
    (head[9..12].parse().unwrap(), head, body)
}

impl Rig {
    /// The burst left for `sk_a`, read from the usage endpoint.
    async fn left(&self) -> u64 {
        let mut s = TcpStream::connect(self.addr).await.unwrap();
        s.write_all(b"GET /v1/usage HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer sk_a\r\n\r\n")
            .await
            .unwrap();
        let (status, head, body) = tokio::time::timeout(LIMIT, read_whole(&mut s))
            .await
            .unwrap();
        assert_eq!(status, 200, "{head}{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        v["limits"][0]["r"].as_u64().unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_stalls_while_the_upstream_waits_for_it_is_408_not_504() {
    // the upstream has 300 ms to answer; a pause inside the body may last
    // 30 s and the rate is not judged before 10 s: a client that stops
    // after its first 16 KiB (the intake's) runs into the upstream's
    // timer first
    let rig = Rig::start("[gateway.timeouts]\nupstream_header_ms = 300\n").await;
    let before = rig.left().await;
    let started = Instant::now();
    let mut s = rig.upload("/v1/orders", 100_000, &[b'x'; 16 * 1024]).await;
    let (status, head, body) = tokio::time::timeout(LIMIT, read_whole(&mut s))
        .await
        .unwrap();
    assert_eq!(status, 408, "{head}{body}");
    assert!(body.contains("/request_timeout\""), "{body}");
    assert!(
        head.to_ascii_lowercase().contains("connection: close"),
        "{head}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(
        closed_within(&mut s, LIMIT).await,
        "the connection is closed"
    );
    // the upstream had the request, unfinished, and its connection ended
    let deadline = Instant::now() + LIMIT;
    while rig.seen.cut.load(Ordering::SeqCst) == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(rig.seen.accepted.load(Ordering::SeqCst), 1);
    assert_eq!(
        rig.seen.cut.load(Ordering::SeqCst),
        1,
        "dropped, not reused"
    );
    // the client's fault: its charge is kept
    assert_eq!(rig.left().await, before - 1);
    assert_eq!(rig.handle.receiving(), 0);
    assert_eq!(rig.handle.buffered_bytes(), 0);

    // a body still coming at a good rate when the upstream's timer fires
    // is not the client's fault: 504; the upstream had the request, so
    // its charge stands (it may have done the work)
    let before = rig.left().await;
    let stall = b"POST /v1/orders HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer sk_a\r\ncontent-length: 100000\r\n\r\n";
    let mut s = TcpStream::connect(rig.addr).await.unwrap();
    s.write_all(stall).await.unwrap();
    // 1000 bytes every 5 ms, far above the least rate, and 20 KB short
    // of the announced length when the feeding stops
    let (mut rd, mut wr) = s.into_split();
    let feeding = tokio::spawn(async move {
        let piece = vec![b'y'; 1000];
        for _ in 0..80 {
            if wr.write_all(&piece).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        std::future::pending::<()>().await;
    });
    let (status, head, body) = tokio::time::timeout(LIMIT, read_whole(&mut rd))
        .await
        .unwrap();
    feeding.abort();
    assert_eq!(status, 504, "{head}{body}");
    assert_eq!(rig.left().await, before - 1, "the upstream had it: charged");
    rig.stop().await;
}
