//! The gateway's edge over cleartext HTTP/2 (prior knowledge) on
//! loopback: the head bound announced as `SETTINGS_MAX_HEADER_LIST_SIZE`
//! (and the stream window the body read-ahead counts on), a head past it
//! refused on its own stream with the connection kept for the others, and
//! many streams with such heads holding nothing in the memory gauge. The
//! clients are hyper's HTTP/2 client and, for the settings, raw frames.
//! Every wait is bounded.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::Empty;
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

mod common;

use common::{Rig, LIMIT};

impl Rig {
    /// An HTTP/2 connection with hyper's client.
    async fn h2(&self) -> http2::SendRequest<Empty<Bytes>> {
        let s = TcpStream::connect(self.addr).await.unwrap();
        let (send, conn) = http2::Builder::new(TokioExecutor::new())
            .handshake(TokioIo::new(s))
            .await
            .unwrap();
        tokio::spawn(conn);
        send
    }
}

/// The highest reading of the memory gauge over `polls` readings 5 ms
/// apart, watched from now on.
fn peak_of(rig: &Rig, polls: usize) -> tokio::task::JoinHandle<usize> {
    let handle = rig.handle.clone();
    tokio::spawn(async move {
        let mut peak = 0;
        for _ in 0..polls {
            peak = peak.max(handle.buffered_bytes());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        peak
    })
}

/// A request whose head carries a field of `pad` bytes.
fn get(pad: usize) -> Request<Empty<Bytes>> {
    get_at("/v1/rates", pad)
}

fn get_at(path: &str, pad: usize) -> Request<Empty<Bytes>> {
    Request::get(format!("http://gw{path}"))
        .header("authorization", "Bearer sk_a")
        .header("x-pad", "a".repeat(pad))
        .body(Empty::new())
        .unwrap()
}

/// The status of `req` on `send`, or 0 for a stream reset.
async fn status(send: &mut http2::SendRequest<Empty<Bytes>>, req: Request<Empty<Bytes>>) -> u16 {
    tokio::time::timeout(LIMIT, async {
        send.ready().await.expect("the connection is open");
        match send.send_request(req).await {
            Ok(res) => res.status().as_u16(),
            Err(_) => 0,
        }
    })
    .await
    .expect("an answer in time")
}

/// The settings the gateway sends first on a new HTTP/2 connection, as
/// `(identifier, value)` pairs.
async fn server_settings(addr: SocketAddr) -> Vec<(u16, u32)> {
    let mut s = TcpStream::connect(addr).await.unwrap();
    // the preface, then an empty SETTINGS frame
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    s.write_all(&[0, 0, 0, 0x4, 0, 0, 0, 0, 0]).await.unwrap();
    tokio::time::timeout(LIMIT, async {
        loop {
            let mut head = [0u8; 9];
            s.read_exact(&mut head).await.unwrap();
            let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
            let mut payload = vec![0u8; len];
            s.read_exact(&mut payload).await.unwrap();
            // SETTINGS, not an acknowledgement
            if head[3] == 0x4 && head[4] & 0x1 == 0 {
                return payload
                    .chunks_exact(6)
                    .map(|c| {
                        (
                            u16::from_be_bytes([c[0], c[1]]),
                            u32::from_be_bytes([c[2], c[3], c[4], c[5]]),
                        )
                    })
                    .collect();
            }
        }
    })
    .await
    .expect("settings in time")
}

/// `SETTINGS_INITIAL_WINDOW_SIZE` and `SETTINGS_MAX_HEADER_LIST_SIZE`.
const INITIAL_WINDOW_SIZE: u16 = 0x4;
const MAX_HEADER_LIST_SIZE: u16 = 0x6;

fn setting(all: &[(u16, u32)], id: u16) -> Option<u32> {
    all.iter().find(|(i, _)| *i == id).map(|(_, v)| *v)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_head_bound_and_the_stream_window_are_announced() {
    let rig = Rig::start("", 10000).await;
    let all = server_settings(rig.addr).await;
    assert_eq!(
        setting(&all, MAX_HEADER_LIST_SIZE),
        Some(64 * 1024),
        "{all:?}"
    );
    // what a stream may send before the gateway passed it on
    assert_eq!(
        setting(&all, INITIAL_WINDOW_SIZE),
        Some(64 * 1024),
        "{all:?}"
    );
    rig.stop().await;

    let rig = Rig::start("max_head_bytes = 16384", 10000).await;
    let all = server_settings(rig.addr).await;
    assert_eq!(setting(&all, MAX_HEADER_LIST_SIZE), Some(16384), "{all:?}");
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_past_the_bound_is_refused_on_its_stream_and_the_connection_kept() {
    let rig = Rig::start("max_head_bytes = 16384", 10000).await;
    let mut send = rig.h2().await;
    assert_eq!(
        status(&mut send, get(12 * 1024)).await,
        200,
        "under the bound"
    );
    // the h2 layer answers 431 on the stream (or resets it): either way
    // nothing goes upstream
    let refused = status(&mut send, get(24 * 1024)).await;
    assert!(matches!(refused, 431 | 0), "{refused}");
    // the same connection serves the next request
    assert_eq!(status(&mut send, get(100)).await, 200);
    assert_eq!(rig.seen.load(Ordering::SeqCst), 2);
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_streams_with_huge_heads_hold_nothing() {
    const CAP: usize = 1024 * 1024;
    let rig = Rig::start(
        &format!("max_head_bytes = 16384\n[gateway.limits]\nmax_buffered_bytes = {CAP}\n"),
        10000,
    )
    .await;
    // four connections, fifty streams each, every head 24 KiB: 4.8 MB of
    // heads against a bound of 1 MiB, none of them kept
    let mut conns = Vec::new();
    for _ in 0..4 {
        conns.push(rig.h2().await);
    }
    let watching = peak_of(&rig, 400);
    let mut streams = Vec::new();
    for send in &conns {
        for _ in 0..50 {
            let mut send = send.clone();
            streams.push(tokio::spawn(async move {
                status(&mut send, get(24 * 1024)).await
            }));
        }
    }
    for s in streams {
        let got = s.await.unwrap();
        assert!(matches!(got, 431 | 0), "{got}");
    }
    let peak = watching.await.unwrap();
    assert!(peak <= CAP, "held {peak} bytes, bound {CAP}");
    assert!(
        rig.handle.buffered_bytes() <= 4 * 64 * 1024,
        "what the refused heads left counted: {}",
        rig.handle.buffered_bytes()
    );
    // every flooded connection still serves, and so does a new one
    for send in &mut conns {
        assert_eq!(status(send, get(100)).await, 200);
    }
    let mut fresh = rig.h2().await;
    assert_eq!(status(&mut fresh, get(100)).await, 200);
    assert_eq!(rig.seen.load(Ordering::SeqCst), 5);
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heads_in_flight_are_counted_in_the_memory_bound() {
    const CAP: usize = 1024 * 1024;
    let rig = Rig::start(
        &format!(
            "max_head_bytes = 16384\n[gateway.limits]\nmax_buffered_bytes = {CAP}\n\
             [gateway.timeouts]\nupstream_header_ms = 2000\n"
        ),
        10000,
    )
    .await;
    // two hundred streams over four connections, each head 15 KiB (within
    // the bound) and each request held by the upstream: 3 MB of heads in
    // flight against a bound of 1 MiB
    let mut conns = Vec::new();
    for _ in 0..4 {
        conns.push(rig.h2().await);
    }
    let watching = peak_of(&rig, 200);
    let mut streams = Vec::new();
    for send in &conns {
        for _ in 0..50 {
            let mut send = send.clone();
            streams.push(tokio::spawn(async move {
                status(&mut send, get_at("/stall", 15 * 1024)).await
            }));
        }
    }
    let peak = watching.await.unwrap();
    // refused: a 503 on the stream, or, for a connection that had none
    // of its requests in yet when the bound was reached, the connection
    // closed before more of it is read (0)
    let mut refused = 0;
    for s in streams {
        match s.await.unwrap() {
            503 | 0 => refused += 1,
            504 => {}
            other => panic!("{other}"),
        }
    }
    assert!(peak <= CAP, "held {peak} bytes, bound {CAP}");
    assert!(peak > CAP / 2, "the heads in flight were counted: {peak}");
    assert!(refused >= 100, "{refused} of 200 refused");
    assert!(
        rig.seen.load(Ordering::SeqCst) <= 200 - refused,
        "a refused request never went up"
    );
    // all given back once answered (but the few bytes of control frames
    // a connection read since its last request)
    assert!(
        rig.handle.buffered_bytes() < 1024,
        "{}",
        rig.handle.buffered_bytes()
    );
    rig.stop().await;
}
