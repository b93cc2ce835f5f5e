//! The noisy neighbour: one key floods the gateway at 20 times its limit
//! while another, polite key stays under its own; the polite key's p99
//! latency may rise by at most 20% against the same traffic without the
//! flood.
//!
//! Why rounds: on a shared two-core machine one measurement of a p99 says
//! more about the neighbours than about the gateway. Rounds with and
//! without the flood alternate (after a warm-up), each pair gives one
//! ratio of p99s, and the test bounds the median ratio, so a burst of
//! outside load spoils one pair, not the verdict. The gateway, the
//! upstream, the polite client and the flood each run on their own
//! runtime, as separate processes would. Loopback only; about 25 s.
//!
//! `NOISY_PAIRS` and `NOISY_ROUND_MS` change the number and length of the
//! rounds (for the figures in BENCHMARKS.md).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use paceline_gateway::{Gateway, GatewayConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The flooding key's limit, per second.
const FLOOD_LIMIT: u64 = 50;
/// The flood: 20 times that (`NOISY_TIMES` changes the 20, to see the
/// test fail under a heavier flood), spread over a few connections.
const FLOOD_TIMES: u64 = 20;
const FLOOD_CONNS: u64 = 8;
/// The polite key: this many requests a second, one connection, under its
/// limit of 200 a second.
const POLITE_RATE: u64 = 100;
/// The bound: the polite key's p99 with the flood, over its p99 without.
const MAX_RATIO: f64 = 1.2;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn runtime(threads: usize) -> tokio::runtime::Runtime {
    let mut b = match threads {
        0 => tokio::runtime::Builder::new_current_thread(),
        n => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(n);
            b
        }
    };
    b.enable_all().build().unwrap()
}

/// An upstream answering every request `200 ok` at once.
async fn upstream() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let _ = s.set_nodelay(true);
            tokio::spawn(async move {
                let mut buf = Vec::with_capacity(8192);
                let mut chunk = [0u8; 8192];
                loop {
                    while let Some(end) = find(&buf, b"\r\n\r\n") {
                        buf.drain(..end + 4);
                        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                        if s.write_all(ok).await.is_err() {
                            return;
                        }
                    }
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
            });
        }
    });
    addr
}

fn find(buf: &[u8], what: &[u8]) -> Option<usize> {
    buf.windows(what.len()).position(|w| w == what)
}

fn request(key: &str) -> Vec<u8> {
    format!("GET /v1/rates HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer {key}\r\n\r\n")
        .into_bytes()
}

/// Reads one answer's head and `content-length` body; its status.
async fn read_answer(s: &mut TcpStream, buf: &mut Vec<u8>) -> Option<u16> {
    let mut chunk = [0u8; 8192];
    loop {
        if let Some(end) = find(buf, b"\r\n\r\n") {
            let head = std::str::from_utf8(&buf[..end]).ok()?;
            let status = head.get(9..12)?.parse().ok()?;
            let len = head
                .lines()
                .find_map(|l| {
                    let (n, v) = l.split_once(':')?;
                    n.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse::<usize>().ok())?
                })
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                buf.drain(..end + 4 + len);
                return Some(status);
            }
        }
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// What the flood did: requests sent, answers 429 and others.
#[derive(Default)]
struct FloodCount {
    sent: AtomicU64,
    limited: AtomicU64,
    other: AtomicU64,
}

/// One flooding connection: requests at its share of the flood rate while
/// `on` holds, sent without waiting for the answers (a reader drains
/// them), so the rate is the rate whatever the answers' latency.
async fn flood_conn(
    gw: SocketAddr,
    rate: u64,
    on: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    n: Arc<FloodCount>,
) {
    let s = TcpStream::connect(gw).await.unwrap();
    s.set_nodelay(true).unwrap();
    let (mut rd, mut wr) = s.into_split();
    let counts = n.clone();
    let reader = tokio::spawn(async move {
        let mut buf = Vec::with_capacity(16384);
        let mut chunk = [0u8; 16384];
        loop {
            // count answers by their status lines
            while let Some(i) = find(&buf, b"HTTP/1.1 ") {
                if buf.len() < i + 12 {
                    break;
                }
                match &buf[i + 9..i + 12] {
                    b"429" => counts.limited.fetch_add(1, Ordering::Relaxed),
                    _ => counts.other.fetch_add(1, Ordering::Relaxed),
                };
                buf.drain(..i + 12);
            }
            match rd.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(k) => buf.extend_from_slice(&chunk[..k]),
            }
        }
    });
    let req = request("sk_flood");
    let every = Duration::from_micros(1_000_000 * FLOOD_CONNS / rate);
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        if on.load(Ordering::Relaxed) {
            if wr.write_all(&req).await.is_err() {
                break;
            }
            n.sent.fetch_add(1, Ordering::Relaxed);
        }
    }
    drop(wr);
    reader.abort();
}

/// The polite key for `dur`: one keep-alive connection, one request every
/// `1/POLITE_RATE` s; every request's latency in microseconds.
async fn polite(s: &mut TcpStream, dur: Duration) -> Vec<u64> {
    let req = request("sk_polite");
    let mut buf = Vec::with_capacity(8192);
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / POLITE_RATE));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut lat = Vec::new();
    let end = Instant::now() + dur;
    while Instant::now() < end {
        tick.tick().await;
        let t = Instant::now();
        s.write_all(&req).await.unwrap();
        let status = read_answer(s, &mut buf).await.expect("an answer");
        lat.push(t.elapsed().as_micros() as u64);
        assert_eq!(status, 200, "the polite key stays under its limit");
    }
    lat
}

fn pct(v: &mut [u64], p: f64) -> u64 {
    v.sort_unstable();
    let i = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
    v[i]
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    match n % 2 {
        1 => v[n / 2],
        _ => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

#[test]
#[ignore = "the gateway misses this bound today: on a quiet 2-core machine the median p99 ratio is 1.3 in release and 1.9 in a debug build (BENCHMARKS.md); run with --ignored"]
fn a_flood_at_twenty_times_its_limit_barely_moves_a_polite_keys_p99() {
    let pairs = env_or("NOISY_PAIRS", 6) as usize;
    let round = Duration::from_millis(env_or("NOISY_ROUND_MS", 1800));
    let flood_rate = env_or("NOISY_TIMES", FLOOD_TIMES) * FLOOD_LIMIT;

    let up_rt = runtime(1);
    let up = up_rt.block_on(upstream());
    let text = format!(
        r#"[gateway]
listen = "127.0.0.1:0"
upstream = "http://{up}"
watch = false

[plans.flood]
policies = [{{ name = "second", algorithm = "token_bucket", q = {FLOOD_LIMIT}, w = 1 }}]
[plans.polite]
policies = [{{ name = "second", algorithm = "token_bucket", q = {}, w = 1 }}]

[keys]
sk_flood = "flood"
sk_polite = "polite"
"#,
        2 * POLITE_RATE
    );
    let gw_rt = runtime(2);
    let cfg = GatewayConfig::parse(&text, "noisy.toml", None).unwrap();
    let gw = gw_rt.block_on(Gateway::bind(cfg)).unwrap();
    let addr = gw.local_addr();
    let handle = gw.handle();
    let served = gw_rt.spawn(gw.run(std::future::pending()));

    // the flood, on its own thread, switched on and off by the rounds
    let (on, stop) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let counts = Arc::new(FloodCount::default());
    let flood = {
        let (on, stop, counts) = (on.clone(), stop.clone(), counts.clone());
        std::thread::spawn(move || {
            runtime(0).block_on(async move {
                let conns: Vec<_> = (0..FLOOD_CONNS)
                    .map(|_| {
                        tokio::spawn(flood_conn(
                            addr,
                            flood_rate,
                            on.clone(),
                            stop.clone(),
                            counts.clone(),
                        ))
                    })
                    .collect();
                for c in conns {
                    let _ = c.await;
                }
            })
        })
    };

    let polite_rt = runtime(0);
    let mut conn = polite_rt.block_on(async {
        let s = TcpStream::connect(addr).await.unwrap();
        s.set_nodelay(true).unwrap();
        s
    });
    // warm-up: both keys, so pools, caches and the store are filled
    on.store(true, Ordering::Relaxed);
    polite_rt.block_on(polite(&mut conn, Duration::from_millis(600)));
    on.store(false, Ordering::Relaxed);
    polite_rt.block_on(polite(&mut conn, Duration::from_millis(300)));

    let mut ratios = Vec::new();
    let (mut all_quiet, mut all_noisy) = (Vec::new(), Vec::new());
    let flood_start = counts.sent.load(Ordering::Relaxed);
    let mut flood_time = Duration::ZERO;
    println!("pair  quiet p50/p99 us  flood p50/p99 us  ratio p99");
    for pair in 0..pairs {
        // alternate which comes first, so a trend in outside load does
        // not favour one side
        let mut one = |flooding: bool| {
            on.store(flooding, Ordering::Relaxed);
            let t = Instant::now();
            let lat = polite_rt.block_on(polite(&mut conn, round));
            on.store(false, Ordering::Relaxed);
            if flooding {
                flood_time += t.elapsed();
            }
            lat
        };
        let (mut quiet, mut noisy) = match pair % 2 {
            0 => {
                let q = one(false);
                (q, one(true))
            }
            _ => {
                let n = one(true);
                (one(false), n)
            }
        };
        all_quiet.extend_from_slice(&quiet);
        all_noisy.extend_from_slice(&noisy);
        let (q50, q99) = (pct(&mut quiet, 0.5), pct(&mut quiet, 0.99));
        let (n50, n99) = (pct(&mut noisy, 0.5), pct(&mut noisy, 0.99));
        let r = n99 as f64 / q99 as f64;
        ratios.push(r);
        println!("{pair:>4}  {q50:>6} / {q99:<8}  {n50:>6} / {n99:<8}  {r:.3}");
    }
    stop.store(true, Ordering::Relaxed);
    flood.join().unwrap();
    handle.shutdown();
    let _ = gw_rt.block_on(async { tokio::time::timeout(Duration::from_secs(10), served).await });

    let sent = counts.sent.load(Ordering::Relaxed) - flood_start;
    let rate = sent as f64 / flood_time.as_secs_f64();
    let limited = counts.limited.load(Ordering::Relaxed);
    let other = counts.other.load(Ordering::Relaxed);
    let m = median(ratios.clone());
    println!(
        "flood: {rate:.0} requests/s at {FLOOD_LIMIT}/s allowed ({:.1}x); answers {limited} x 429, {other} other",
        rate / FLOOD_LIMIT as f64
    );
    println!(
        "polite: {} + {} samples; pooled p99 quiet {} us, flood {} us; median of {pairs} pair ratios {m:.3} (bound {MAX_RATIO})",
        all_quiet.len(),
        all_noisy.len(),
        pct(&mut all_quiet, 0.99),
        pct(&mut all_noisy, 0.99)
    );
    assert!(
        rate > 0.8 * flood_rate as f64,
        "the flood ran at {rate:.0}/s, short of {flood_rate}/s: the test says nothing"
    );
    assert!(
        limited > other,
        "the flood was mostly refused: {limited} 429, {other} other"
    );
    assert!(
        m <= MAX_RATIO,
        "the polite key's p99 rose {m:.2}x under the flood (bound {MAX_RATIO}x): {ratios:?}"
    );
}
