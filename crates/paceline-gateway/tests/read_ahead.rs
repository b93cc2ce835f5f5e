//! Request bodies streaming at an upstream that stopped reading, against a
//! real gateway on loopback: what the gateway holds of them (each body's
//! read-ahead) is counted in `gateway.limits.max_buffered_bytes`, so the
//! gauge and the process's resident memory (within a margin) stay under
//! the bound, and the bodies past it are refused `503`. The test is alone
//! in its file, so the resident memory is its own. Every wait is bounded.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use paceline_gateway::{Gateway, GatewayConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const LIMIT: Duration = Duration::from_secs(10);
/// The bound on buffered bytes.
const CAP: usize = 2 * 1024 * 1024;
/// Connections, each announcing a body of `BODY` bytes.
const N: usize = 60;
/// More than the kernel's socket buffers take on the way: the bodies are
/// still streaming when the test looks.
const BODY: usize = 16 * 1024 * 1024;

fn find(buf: &[u8], what: &[u8]) -> Option<usize> {
    buf.windows(what.len()).position(|w| w == what)
}

/// An upstream that reads each request's head and then nothing more,
/// holding the connection open: the bodies back up into the gateway.
async fn stalled_upstream() -> (SocketAddr, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let heads = Arc::new(AtomicUsize::new(0));
    let h2 = heads.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let heads = h2.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                while find(&buf, b"\r\n\r\n").is_none() {
                    let mut chunk = [0u8; 4096];
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                heads.fetch_add(1, Ordering::SeqCst);
                // held, unread, until the test ends
                std::future::pending::<()>().await;
                drop(s);
            });
        }
    });
    (addr, heads)
}

/// The process's resident memory, where the system tells it.
fn rss() -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_at_a_stalled_upstream_stay_under_the_memory_bound() {
    let (up, heads) = stalled_upstream().await;
    let text = format!(
        r#"[gateway]
listen = "127.0.0.1:0"
upstream = "http://{up}"
watch = false
[gateway.timeouts]
upstream_header_ms = 30000
shutdown_ms = 500
[gateway.limits]
max_buffered_bytes = {CAP}
min_body_rate = 0

[plans.free]
policies = [{{ name = "burst", algorithm = "token_bucket", q = 1000, w = 3600 }}]

[keys]
sk_a = "free"
"#
    );
    let cfg = GatewayConfig::parse(&text, "read_ahead.toml", None).unwrap();
    let gw = Gateway::bind(cfg).await.unwrap();
    let addr = gw.local_addr();
    let handle = gw.handle();
    let served = tokio::spawn(gw.run(std::future::pending()));

    let piece: Arc<Vec<u8>> = Arc::new(vec![b'x'; 64 * 1024]);
    let base = rss();
    let refused = Arc::new(AtomicUsize::new(0));
    let ended = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..N {
        let s = TcpStream::connect(addr).await.unwrap();
        let (mut rd, mut wr) = s.into_split();
        let piece = piece.clone();
        tasks.push(tokio::spawn(async move {
            let head = format!(
                "POST /v1/upload HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer sk_a\r\ncontent-length: {BODY}\r\n\r\n"
            );
            if wr.write_all(head.as_bytes()).await.is_err() {
                return;
            }
            let mut sent = 0;
            while sent < BODY {
                if wr.write_all(&piece).await.is_err() {
                    return;
                }
                sent += piece.len();
            }
            std::future::pending::<()>().await;
        }));
        let (refused, ended) = (refused.clone(), ended.clone());
        tasks.push(tokio::spawn(async move {
            // a refused body gets its 503 and the connection closed (a
            // client still writing may see the close as a reset first); a
            // streaming one hears nothing for as long as the upstream waits
            let mut buf = [0u8; 12];
            if rd.read_exact(&mut buf).await.is_ok() && &buf == b"HTTP/1.1 503" {
                refused.fetch_add(1, Ordering::SeqCst);
            }
            ended.fetch_add(1, Ordering::SeqCst);
        }));
    }
    // let the bodies back up, watching what is held
    let (mut peak, mut peak_rss) = (0, 0);
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        peak = peak.max(handle.buffered_bytes());
        peak_rss = peak_rss.max(rss().unwrap_or(0));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (refused, ended, streaming) = (
        refused.load(Ordering::SeqCst),
        ended.load(Ordering::SeqCst),
        heads.load(Ordering::SeqCst),
    );
    let held = handle.buffered_bytes();
    assert!(peak <= CAP, "held {peak} bytes, bound {CAP}");
    assert!(
        held >= streaming * 64 * 1024,
        "the streaming bodies are counted: {held} bytes for {streaming}"
    );
    assert!(streaming >= 1, "some bodies go up");
    assert!(
        streaming <= CAP / (64 * 1024),
        "{streaming} bodies streaming up under a bound of {CAP} bytes"
    );
    assert!(
        ended >= N / 2,
        "the bodies past the bound are refused: {ended} of {N} ended ({refused} read their 503)"
    );
    assert!(refused >= 1, "refused with 503");
    if let Some(base) = base {
        let grown = peak_rss.saturating_sub(base);
        assert!(
            grown <= CAP + 24 * 1024 * 1024,
            "resident memory grew by {grown} bytes under a bound of {CAP}"
        );
        eprintln!(
            "{N} bodies at a stalled upstream: {streaming} streaming, {refused} refused, gauge peak {peak} bytes, resident memory +{grown} bytes"
        );
    }
    for t in tasks {
        t.abort();
    }
    handle.shutdown();
    let _ = tokio::time::timeout(LIMIT, served).await;
}
