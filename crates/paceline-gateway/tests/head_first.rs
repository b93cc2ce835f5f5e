//! A rejection is decided from the head, whatever the body does: a key
//! over its limit that announces a large body (and sends none of it) gets
//! its `429` at once, with `Expect: 100-continue` instead of `100
//! Continue`, and over HTTP/2 before any of its body is read; an admitted
//! request gets `100 Continue` and its answer; one admitted whose body
//! then stalls gets `408` and its charge back. Every wait is bounded.

mod common;

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{Rig, LIMIT};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How soon a decision from the head must be on the wire.
const AT_ONCE: Duration = Duration::from_millis(100);

/// Reads from `s` until `what` has come (or the connection ends): the
/// text read, and how long it took.
async fn read_until(s: &mut TcpStream, what: &str) -> (String, Duration) {
    let started = Instant::now();
    let mut out = Vec::new();
    let mut chunk = [0u8; 4096];
    while !String::from_utf8_lossy(&out).contains(what) {
        match tokio::time::timeout(LIMIT, s.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => out.extend_from_slice(&chunk[..n]),
            Err(_) => panic!(
                "nothing more in {LIMIT:?}: {}",
                String::from_utf8_lossy(&out)
            ),
        }
    }
    (
        String::from_utf8_lossy(&out).into_owned(),
        started.elapsed(),
    )
}

/// Spends `sk_a`'s whole burst of `n` with plain GETs on one connection.
async fn spend(rig: &Rig, n: u64) {
    let mut s = TcpStream::connect(rig.addr).await.unwrap();
    for _ in 0..n {
        s.write_all(b"GET /v1/x HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer sk_a\r\n\r\n")
            .await
            .unwrap();
        let (text, _) = read_until(&mut s, "\r\n\r\nok").await;
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    }
}

/// `sk_a`'s burst left, read from the usage endpoint.
async fn left(rig: &Rig) -> u64 {
    let mut s = TcpStream::connect(rig.addr).await.unwrap();
    s.write_all(b"GET /v1/usage HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer sk_a\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(LIMIT, s.read_to_end(&mut out))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&out);
    let body = text.split_once("\r\n\r\n").unwrap().1;
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    v["limits"][0]["r"].as_u64().unwrap()
}

const UPLOAD: &str = "POST /v1/labels HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer sk_a\r\ncontent-length: 50000000\r\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_over_limit_upload_is_refused_before_its_body() {
    let rig = Rig::start("", 2).await;
    spend(&rig, 2).await;
    let seen = rig.seen.load(std::sync::atomic::Ordering::SeqCst);
    for expect in ["", "expect: 100-continue\r\n"] {
        let mut s = TcpStream::connect(rig.addr).await.unwrap();
        s.write_all(format!("{UPLOAD}{expect}\r\n").as_bytes())
            .await
            .unwrap();
        let (text, took) = read_until(&mut s, "\r\n\r\n").await;
        assert!(text.starts_with("HTTP/1.1 429"), "{expect:?}: {text}");
        assert!(!text.contains("100 Continue"), "{text}");
        assert!(took < AT_ONCE, "{expect:?}: the 429 took {took:?}");
        assert!(text.to_ascii_lowercase().contains("retry-after:"), "{text}");
        if !text.contains("\"status\":429") {
            read_until(&mut s, "\"status\":429").await;
        }
    }
    assert_eq!(rig.seen.load(std::sync::atomic::Ordering::SeqCst), seen);
    assert_eq!(rig.handle.receiving(), 0, "no receiving place was taken");
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admitted_upload_gets_100_continue_then_its_answer() {
    let rig = Rig::start("", 5).await;
    let mut s = TcpStream::connect(rig.addr).await.unwrap();
    s.write_all(b"POST /v1/labels HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer sk_a\r\ncontent-length: 5\r\nexpect: 100-continue\r\n\r\n")
        .await
        .unwrap();
    let (text, took) = read_until(&mut s, "\r\n\r\n").await;
    assert!(text.starts_with("HTTP/1.1 100 Continue"), "{text}");
    assert!(took < LIMIT);
    s.write_all(b"hello").await.unwrap();
    let (text, _) = read_until(&mut s, "\r\n\r\nok").await;
    assert!(text.contains("HTTP/1.1 200"), "{text}");
    assert!(text.to_ascii_lowercase().contains("ratelimit:"), "{text}");
    assert_eq!(left(&rig).await, 4, "charged once");
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admitted_body_that_stalls_is_408_and_given_back() {
    let rig = Rig::start("[gateway.timeouts]\nbody_idle_ms = 200\n", 5).await;
    assert_eq!(left(&rig).await, 5);
    let mut s = TcpStream::connect(rig.addr).await.unwrap();
    s.write_all(format!("{UPLOAD}\r\nsome of it").as_bytes())
        .await
        .unwrap();
    let (text, _) = read_until(&mut s, "\r\n\r\n").await;
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    let lower = text.to_ascii_lowercase();
    assert!(lower.contains("connection: close"), "{text}");
    // decided by the limiter first: the answer tells the budget, which
    // has the charge back
    assert!(lower.contains("ratelimit: \"burst\";r=5;"), "{text}");
    assert_eq!(left(&rig).await, 5, "its charge given back");
    assert_eq!(rig.seen.load(std::sync::atomic::Ordering::SeqCst), 0);
    assert_eq!(rig.handle.receiving(), 0);
    rig.stop().await;
}

/// A request body that never sends anything.
struct Never;

impl Body for Never {
    type Data = Bytes;
    type Error = std::convert::Infallible;
    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Poll::Pending
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_http2_the_429_comes_before_any_body() {
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    let rig = Rig::start("", 1).await;
    spend(&rig, 1).await;
    let client = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<Never>();
    let url = format!("http://{}/v1/labels", rig.addr);
    // the connection made first, so the time is the decision's
    let warm = http::Request::get(&url)
        .header("authorization", "Bearer sk_a")
        .body(Never)
        .unwrap();
    let _ = tokio::time::timeout(LIMIT, client.request(warm)).await;
    let req = http::Request::post(&url)
        .header("authorization", "Bearer sk_a")
        .header("content-length", "50000000")
        .body(Never)
        .unwrap();
    let started = Instant::now();
    let res = tokio::time::timeout(LIMIT, client.request(req))
        .await
        .expect("an answer in time")
        .expect("an answer");
    let took = started.elapsed();
    assert_eq!(res.status(), 429);
    assert!(took < AT_ONCE, "the 429 took {took:?}");
    let body = tokio::time::timeout(LIMIT, res.into_body().collect())
        .await
        .unwrap()
        .unwrap()
        .to_bytes();
    assert!(String::from_utf8_lossy(&body).contains("\"status\":429"));
    assert_eq!(rig.handle.receiving(), 0);
    rig.stop().await;
}
