//! A flood of TLS handshakes that never finish, on loopback: a thousand
//! connections are closed at the deadline while a polite client keeps its
//! pace. One test in a binary of its own, so no other test shares its two
//! cores while it measures. (The other hostile TLS cases, which measure
//! nothing, are in `tls.rs`.)

mod common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::tls::{connector, get, h1, tls_gateway};
use common::LIMIT;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("paceline-gw-tlsh-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The 99th percentile of `n` requests, each on a new TLS connection.
async fn polite_p99(c: &tokio_rustls::TlsConnector, addr: SocketAddr, n: usize) -> Duration {
    let mut took = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let (mut send, _) = h1(c, addr).await;
        assert_eq!(get(&mut send, "/v1/x", Some("sk_a")).await.0, 200);
        took.push(t.elapsed());
    }
    took.sort();
    took[(n * 99).div_ceil(100) - 1]
}

/// How many descriptors this process may open.
fn open_files_limit() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_unfinished_handshakes_are_closed_at_the_deadline_and_a_polite_client_keeps_its_p99(
) {
    const FLOOD: usize = 1000;
    const SAMPLES: usize = 200;
    if let Some(n) = open_files_limit() {
        assert!(
            n >= 2 * FLOOD as u64 + 200,
            "this test holds both ends of {FLOOD} connections: raise the open files limit ({n})"
        );
    }
    let dir = scratch("flood");
    let deadline = Duration::from_secs(6);
    let (addr, handle, ca) =
        tls_gateway(&dir, &format!("handshake_ms = {}", deadline.as_millis())).await;
    let c = connector(&ca, &[b"http/1.1"], None);
    // warm up, then the pace with no flood
    polite_p99(&c, addr, 20).await;
    // twice: the slower of the two is what this machine gives with
    // nothing changed (on a machine with stolen time two calm runs' p99s
    // differ by up to a third), and the bound below is over it
    let calm_runs = [
        polite_p99(&c, addr, SAMPLES).await,
        polite_p99(&c, addr, SAMPLES).await,
    ];
    let calm = calm_runs[0].max(calm_runs[1]);

    // half send nothing, half the first bytes of a ClientHello record
    // that announces more than they will ever send
    let opened = Instant::now();
    let mut flood = Vec::with_capacity(FLOOD);
    for i in 0..FLOOD {
        let mut s = TcpStream::connect(addr).await.unwrap();
        if i % 2 == 1 {
            s.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc])
                .await
                .unwrap();
        }
        flood.push(s);
    }
    let until = Instant::now() + LIMIT;
    while handle.tls_handshakes() < FLOOD && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        handle.tls_handshakes(),
        FLOOD,
        "every flood connection is in its handshake"
    );
    // the best of three runs beside the flood (each about half a second,
    // all within the deadline): one run's p99 on a shared 2-core machine
    // moves by 10-15% on its own
    let mut stormy = Duration::MAX;
    for _ in 0..3 {
        stormy = stormy.min(polite_p99(&c, addr, SAMPLES).await);
        if stormy.as_secs_f64() <= calm.as_secs_f64() * 1.2 {
            break;
        }
    }
    assert!(
        opened.elapsed() < deadline,
        "measured past the deadline ({:?}): the flood was gone",
        opened.elapsed()
    );
    eprintln!(
        "polite p99 over {SAMPLES} new TLS connections: {calm_runs:?} alone, {stormy:?} beside {FLOOD} unfinished handshakes"
    );
    assert!(
        stormy.as_secs_f64() <= calm.as_secs_f64() * 1.2,
        "the flood slowed the polite client: p99 {calm:?} alone, {stormy:?} with the flood"
    );

    // every flood connection is closed at the deadline, not before it
    let mut closed = 0;
    for mut s in flood {
        let mut buf = [0u8; 64];
        let left =
            (opened + deadline + Duration::from_secs(3)).saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => closed += 1,
            // an alert first, then the end
            Ok(Ok(_)) => {
                if matches!(
                    tokio::time::timeout(LIMIT, s.read(&mut buf)).await,
                    Ok(Ok(0)) | Ok(Err(_))
                ) {
                    closed += 1;
                }
            }
            Err(_) => {}
        }
    }
    let took = opened.elapsed();
    assert_eq!(closed, FLOOD, "all closed within the deadline and 3 s");
    assert!(
        took >= deadline - Duration::from_millis(500),
        "closed early: {took:?}"
    );
    assert_eq!(handle.tls_handshakes(), 0);
    assert_eq!(handle.buffered_bytes(), 0, "their memory is given back");
    handle.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}
