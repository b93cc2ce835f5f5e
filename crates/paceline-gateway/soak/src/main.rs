//! The soak driver: mixed traffic with faults through a real
//! `paceline gateway` process, then an account of every request.
//!
//! It starts a scripted upstream on loopback (which answers, refuses,
//! stalls or answers garbage by path, and now and then stops accepting
//! connections for a moment), writes a configuration, starts the gateway
//! binary it is given, and sends for the given time: polite keys under
//! their limits, a key far over its limit (429), pipelined batches with
//! refusals among them, uploads whole and aborted half way, slow heads and
//! slow bodies, framing a strict server refuses, and requests to the
//! faulty paths. Every request carries an id in its path; the upstream
//! records the ids it reads.
//!
//! At the end it prints what was admitted, rejected (by kind), closed and
//! lost. Lost must be zero: every request got an answer, or (where a close
//! is the documented outcome: a slow head, a slow body, an upload the
//! client itself aborted) a clean close; no answer went to the wrong
//! request; and the upstream read exactly the admitted requests, each
//! once, and no rejected one. The exit status is 0 only then.
//!
//! ```text
//! paceline-soak --gateway target/release/paceline --secs 120
//! ```

#![forbid(unsafe_code)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpSocket, TcpStream};

/// How long a client waits for an answer (or a close) before the request
/// counts as lost.
const PATIENCE: Duration = Duration::from_secs(15);
const POLITE_KEYS: usize = 4;
/// The upstream stops accepting for `OUTAGE` every `OUTAGE_EVERY`.
const OUTAGE_EVERY: Duration = Duration::from_secs(15);
const OUTAGE: Duration = Duration::from_millis(500);

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn next_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

// ---------------------------------------------------------------------------
// The account
// ---------------------------------------------------------------------------

/// Where a request ended, from the client's side.
#[derive(Default)]
struct Account {
    /// Outcome label → count (`admitted: 200`, `rejected: 429`, ...).
    outcomes: BTreeMap<String, u64>,
    /// Requests the gateway let through (answered by, or on behalf of, the
    /// upstream).
    admitted: HashSet<u64>,
    /// Requests answered 502 (some of them while the upstream was not
    /// accepting connections, and so never read by it).
    unreachable: HashSet<u64>,
    /// Requests the gateway refused.
    rejected: HashSet<u64>,
    /// Requests that ended in a close the client was told about, and that
    /// may or may not have reached the upstream (aborted, slow bodies).
    closed: HashSet<u64>,
    /// Every request's outcome label, for the notes.
    labels: HashMap<u64, String>,
    lost: u64,
    unexpected: u64,
    /// The first few problems, for the report.
    notes: Vec<String>,
    connections: u64,
}

type Shared = Arc<Mutex<Account>>;

impl Account {
    fn note(&mut self, s: String) {
        if self.notes.len() < 20 {
            self.notes.push(s);
        }
    }
    fn count(&mut self, label: String) {
        *self.outcomes.entry(label).or_default() += 1;
    }
}

/// What a client expects of one request.
#[derive(Clone, Copy)]
struct Expect {
    what: &'static str,
    /// Statuses that are a correct answer.
    statuses: &'static [u16],
    /// Whether a close without an answer is a correct outcome.
    close_ok: bool,
}

/// An answer: status, problem type (for a problem body), body.
#[derive(Debug)]
struct Answer {
    status: u16,
    problem: Option<String>,
    body: Vec<u8>,
}

#[derive(Debug)]
enum Ended {
    /// The connection closed (or was reset) before any byte of an answer.
    Closed,
    /// It closed inside an answer.
    Broken,
    /// Nothing within `PATIENCE`.
    Timeout,
}

fn record(acc: &Shared, id: u64, e: Expect, got: Result<Answer, Ended>) {
    let mut a = acc.lock().unwrap();
    match got {
        Ok(ans) => {
            if !e.statuses.contains(&ans.status) {
                a.unexpected += 1;
                a.note(format!(
                    "{} #{id}: unexpected {} {:?}",
                    e.what, ans.status, ans.problem
                ));
                a.count(format!("unexpected: {} {}", e.what, ans.status));
                return;
            }
            match ans.status {
                200 => {
                    if ans.body != id.to_string().as_bytes() {
                        a.lost += 1;
                        a.note(format!(
                            "{} #{id}: the answer of another request: {:?}",
                            e.what,
                            String::from_utf8_lossy(&ans.body)
                        ));
                        return;
                    }
                    a.admitted.insert(id);
                    a.count("admitted: 200".into());
                }
                502 | 504 => {
                    a.admitted.insert(id);
                    if ans.status == 502 {
                        a.unreachable.insert(id);
                    }
                    let label = format!(
                        "admitted: {} {} ({})",
                        ans.status,
                        ans.problem.as_deref().unwrap_or("?"),
                        e.what
                    );
                    a.count(label);
                }
                s => {
                    // a slow body is refused (408) after its head went on:
                    // the upstream may have read it
                    match e.close_ok {
                        true => a.closed.insert(id),
                        false => a.rejected.insert(id),
                    };
                    let problem = ans.problem.as_deref().unwrap_or("?");
                    let label = match e.close_ok {
                        true => format!("closed: {}, answered {s} {problem}", e.what),
                        false => format!("rejected: {s} {problem}"),
                    };
                    a.labels.insert(id, format!("{label} ({})", e.what));
                    a.count(label);
                }
            }
        }
        Err(Ended::Closed) if e.close_ok => {
            a.closed.insert(id);
            a.count(format!("closed: {}", e.what));
        }
        Err(end) => {
            a.lost += 1;
            a.note(format!("{} #{id}: {end:?}", e.what));
            a.count(format!("lost: {} ({end:?})", e.what));
        }
    }
}

// ---------------------------------------------------------------------------
// HTTP/1.1 on raw sockets
// ---------------------------------------------------------------------------

fn find(buf: &[u8], what: &[u8]) -> Option<usize> {
    buf.windows(what.len()).position(|w| w == what)
}

fn field<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().skip(1).find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// Reads one answer from `s` (head, then its `content-length` body),
/// keeping what follows in `buf`.
async fn read_answer(s: &mut TcpStream, buf: &mut Vec<u8>) -> Result<Answer, Ended> {
    let read = async {
        let mut chunk = [0u8; 16 * 1024];
        loop {
            if let Some(end) = find(buf, b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                let status: u16 = head
                    .get(9..12)
                    .and_then(|s| s.parse().ok())
                    .ok_or(Ended::Broken)?;
                let len: usize = field(&head, "content-length")
                    .map_or(Ok(0), |v| v.parse())
                    .map_err(|_| Ended::Broken)?;
                while buf.len() < end + 4 + len {
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return Err(Ended::Broken),
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let body = buf[end + 4..end + 4 + len].to_vec();
                buf.drain(..end + 4 + len);
                let problem = field(&head, "content-type")
                    .filter(|t| t.contains("problem+json"))
                    .and_then(|_| problem_type(&body));
                return Ok(Answer {
                    status,
                    problem,
                    body,
                });
            }
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) if buf.is_empty() => return Err(Ended::Closed),
                Ok(0) | Err(_) => return Err(Ended::Broken),
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    };
    tokio::time::timeout(PATIENCE, read)
        .await
        .unwrap_or(Err(Ended::Timeout))
}

/// The last segment of a problem document's `type`.
fn problem_type(body: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(body).ok()?;
    let at = text.find("\"type\":\"")? + 8;
    let ty = &text[at..at + text[at..].find('"')?];
    Some(ty.rsplit('/').next()?.to_string())
}

fn get(path: &str, id: u64, key: &str) -> String {
    format!("GET {path}/{id} HTTP/1.1\r\nhost: soak\r\nauthorization: Bearer {key}\r\n\r\n")
}

async fn connect(gw: SocketAddr, acc: &Shared) -> Option<TcpStream> {
    acc.lock().unwrap().connections += 1;
    match TcpStream::connect(gw).await {
        Ok(s) => {
            let _ = s.set_nodelay(true);
            Some(s)
        }
        Err(e) => {
            let mut a = acc.lock().unwrap();
            a.lost += 1;
            a.note(format!("connect to the gateway: {e}"));
            None
        }
    }
}

/// Sends `wire` on a new connection and reads one answer per `(id,
/// expect)`, in order.
async fn exchange(gw: SocketAddr, acc: &Shared, wire: &[u8], reqs: &[(u64, Expect)]) {
    let Some(mut s) = connect(gw, acc).await else {
        return;
    };
    // a server may answer (and close) before it has read everything: the
    // answer is read whether the write went through or not
    let _ = s.write_all(wire).await;
    let mut buf = Vec::new();
    for (i, &(id, e)) in reqs.iter().enumerate() {
        let got = read_answer(&mut s, &mut buf).await;
        let ended = got.is_err();
        record(acc, id, e, got);
        if ended {
            // nothing more will come on this connection
            for &(id, e) in &reqs[i + 1..] {
                record(acc, id, e, Err(Ended::Closed));
            }
            return;
        }
    }
}

// ---------------------------------------------------------------------------
// The clients
// ---------------------------------------------------------------------------

const OK: Expect = Expect {
    what: "polite",
    // 502 while the upstream is not accepting connections
    statuses: &[200, 502],
    close_ok: false,
};
const TIGHT: Expect = Expect {
    what: "over its limit",
    statuses: &[200, 429, 502],
    close_ok: false,
};

/// A polite key: keep-alive connections of 50 requests, 50 a second
/// (its limit is 100 a second).
async fn polite(gw: SocketAddr, acc: Shared, key: String, run: Arc<AtomicBool>) {
    while run.load(Ordering::Relaxed) {
        let Some(mut s) = connect(gw, &acc).await else {
            return;
        };
        let mut buf = Vec::new();
        for _ in 0..50 {
            let id = next_id();
            if s.write_all(get("/ok", id, &key).as_bytes()).await.is_err() {
                record(&acc, id, OK, Err(Ended::Closed));
                break;
            }
            let got = read_answer(&mut s, &mut buf).await;
            let ended = got.is_err();
            record(&acc, id, OK, got);
            if ended {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// A key at 8 times its limit of 5 a second, on one keep-alive connection.
async fn over_limit(gw: SocketAddr, acc: Shared, run: Arc<AtomicBool>) {
    while run.load(Ordering::Relaxed) {
        let Some(mut s) = connect(gw, &acc).await else {
            return;
        };
        let mut buf = Vec::new();
        for _ in 0..200 {
            let id = next_id();
            let _ = s
                .write_all(get("/ok", id, "sk_soak_tight").as_bytes())
                .await;
            let got = read_answer(&mut s, &mut buf).await;
            let ended = got.is_err();
            record(&acc, id, TIGHT, got);
            if ended {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
}

/// Six requests in one write, refusals among them, answered in order.
async fn pipelined(gw: SocketAddr, acc: Shared, run: Arc<AtomicBool>) {
    const REFUSED: Expect = Expect {
        what: "pipelined refusal",
        statuses: &[400, 401],
        close_ok: false,
    };
    const PASSED: Expect = Expect {
        what: "pipelined",
        statuses: &[200, 502],
        close_ok: false,
    };
    while run.load(Ordering::Relaxed) {
        let key = "sk_soak_pipe";
        let ids: Vec<u64> = (0..6).map(|_| next_id()).collect();
        let mut wire = String::new();
        wire += &get("/ok", ids[0], key);
        wire += &get("/ok", ids[1], "sk_soak_nobody");
        wire += &format!(
            "GET /ok/{} HTTP/1.1\r\nhost: soak\r\nauthorization: Bearer {key}\r\nauthorization: Bearer sk_soak_0\r\n\r\n",
            ids[2]
        );
        wire += &get("/ok", ids[3], key);
        wire += &format!(
            "GET /ok/{} HTTP/1.1\r\nhost: soak\r\nhost: other\r\nauthorization: Bearer {key}\r\n\r\n",
            ids[4]
        );
        wire += &get("/ok", ids[5], key);
        let expect = [PASSED, REFUSED, REFUSED, PASSED, REFUSED, PASSED];
        let reqs: Vec<(u64, Expect)> = ids.iter().copied().zip(expect).collect();
        exchange(gw, &acc, wire.as_bytes(), &reqs).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Requests to the upstream's faulty paths.
async fn faults(gw: SocketAddr, acc: Shared, run: Arc<AtomicBool>) {
    let kinds: [(&str, Expect); 3] = [
        (
            "/refuse",
            Expect {
                what: "upstream refuses",
                statuses: &[502],
                close_ok: false,
            },
        ),
        (
            "/garbage",
            Expect {
                what: "upstream garbage",
                statuses: &[502],
                close_ok: false,
            },
        ),
        (
            "/stall",
            Expect {
                what: "upstream stalls",
                // 502 while the upstream is not accepting connections
                statuses: &[504, 502],
                close_ok: false,
            },
        ),
    ];
    let mut i = 0;
    while run.load(Ordering::Relaxed) {
        let (path, e) = kinds[i % kinds.len()];
        i += 1;
        let id = next_id();
        exchange(
            gw,
            &acc,
            get(path, id, "sk_soak_fault").as_bytes(),
            &[(id, e)],
        )
        .await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Uploads: whole ones, and ones the client aborts half way.
async fn uploads(gw: SocketAddr, acc: Shared, run: Arc<AtomicBool>) {
    const WHOLE: Expect = Expect {
        what: "upload",
        statuses: &[200, 502],
        close_ok: false,
    };
    let mut n = 0u64;
    while run.load(Ordering::Relaxed) {
        n += 1;
        let id = next_id();
        let head = |len: usize| {
            format!(
                "POST /upload/{id} HTTP/1.1\r\nhost: soak\r\nauthorization: Bearer sk_soak_up\r\ncontent-length: {len}\r\n\r\n"
            )
        };
        if n.is_multiple_of(2) {
            let mut wire = head(5000).into_bytes();
            wire.extend_from_slice(&[b'u'; 5000]);
            exchange(gw, &acc, &wire, &[(id, WHOLE)]).await;
        } else if let Some(mut s) = connect(gw, &acc).await {
            let _ = s.write_all(head(20_000).as_bytes()).await;
            let _ = s.write_all(&[b'u'; 3000]).await;
            tokio::time::sleep(Duration::from_millis(5)).await;
            drop(s);
            let mut a = acc.lock().unwrap();
            a.closed.insert(id);
            a.count("closed: upload aborted by the client".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A slow head (a byte every 300 ms, past the 2 s head bound) and a slow
/// body (a byte every 1.5 s, past the 1 s body pause bound).
async fn slow(gw: SocketAddr, acc: Shared, run: Arc<AtomicBool>) {
    const HEAD: Expect = Expect {
        what: "slow head cut off",
        statuses: &[408],
        close_ok: true,
    };
    const BODY: Expect = Expect {
        what: "slow body cut off",
        statuses: &[408, 400, 502, 504],
        close_ok: true,
    };
    let mut tasks = tokio::task::JoinSet::new();
    while run.load(Ordering::Relaxed) {
        let (acc1, acc2) = (acc.clone(), acc.clone());
        tasks.spawn(async move {
            let id = next_id();
            let Some(mut s) = connect(gw, &acc1).await else {
                return;
            };
            let head = get("/ok", id, "sk_soak_slow");
            let mut got = None;
            for b in head.as_bytes() {
                if s.write_all(&[*b]).await.is_err() {
                    got = Some(Err(Ended::Closed));
                    break;
                }
                // a close shows as a read of 0 bytes
                let mut one = [0u8; 1];
                let peeked = tokio::time::timeout(Duration::from_millis(300), s.peek(&mut one));
                if peeked.await.is_ok() {
                    got = Some(read_answer(&mut s, &mut Vec::new()).await);
                    break;
                }
            }
            let got = match got {
                Some(g) => g,
                None => read_answer(&mut s, &mut Vec::new()).await,
            };
            record(&acc1, id, HEAD, got);
        });
        tasks.spawn(async move {
            let id = next_id();
            let Some(mut s) = connect(gw, &acc2).await else {
                return;
            };
            let head = format!(
                "POST /upload/{id} HTTP/1.1\r\nhost: soak\r\nauthorization: Bearer sk_soak_slow\r\ncontent-length: 100\r\n\r\n"
            );
            let _ = s.write_all(head.as_bytes()).await;
            let mut buf = Vec::new();
            let got = loop {
                // a byte, then a pause longer than the gateway allows
                if s.write_all(b"s").await.is_err() {
                    break read_answer(&mut s, &mut buf).await;
                }
                match tokio::time::timeout(Duration::from_millis(1500), read_answer(&mut s, &mut buf)).await {
                    Ok(got) => break got,
                    Err(_) => continue,
                }
            };
            record(&acc2, id, BODY, got);
        });
        tokio::time::sleep(Duration::from_millis(700)).await;
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
}

/// Heads a strict server refuses: an unsupported coding, a length past 64
/// bits, two hosts, a head past the 64 KiB bound.
async fn framing(gw: SocketAddr, acc: Shared, run: Arc<AtomicBool>) {
    let key = "sk_soak_frame";
    let mut n = 0u64;
    while run.load(Ordering::Relaxed) {
        n += 1;
        let id = next_id();
        let (wire, e) = match n % 4 {
            0 => (
                format!("POST /upload/{id} HTTP/1.1\r\nhost: soak\r\nauthorization: Bearer {key}\r\ntransfer-encoding: gzip, chunked\r\n\r\n0\r\n\r\n"),
                Expect { what: "unsupported coding", statuses: &[501], close_ok: false },
            ),
            1 => (
                format!("POST /upload/{id} HTTP/1.1\r\nhost: soak\r\nauthorization: Bearer {key}\r\ncontent-length: 18446744073709551616\r\n\r\n"),
                Expect { what: "length past 64 bits", statuses: &[400], close_ok: false },
            ),
            2 => (
                format!("GET /ok/{id} HTTP/1.1\r\nhost: soak\r\nhost: soak2\r\nauthorization: Bearer {key}\r\n\r\n"),
                Expect { what: "two hosts", statuses: &[400], close_ok: false },
            ),
            _ => (
                format!(
                    "GET /ok/{id} HTTP/1.1\r\nhost: soak\r\nauthorization: Bearer {key}\r\nx-pad: {}\r\n\r\n",
                    "p".repeat(70 * 1024)
                ),
                Expect { what: "head past the bound", statuses: &[431], close_ok: false },
            ),
        };
        exchange(gw, &acc, wire.as_bytes(), &[(id, e)]).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

// ---------------------------------------------------------------------------
// The scripted upstream
// ---------------------------------------------------------------------------

/// The ids the upstream read (a head with that id arrived), how often,
/// and on which path.
type Seen = Arc<Mutex<HashMap<u64, (u32, String)>>>;

fn listener(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let s = TcpSocket::new_v4()?;
    s.set_reuseaddr(true)?;
    s.bind(addr)?;
    s.listen(1024)
}

/// Listens on a free port; every `OUTAGE_EVERY` it stops accepting (new
/// connections are refused) for `OUTAGE`. Connections already open go on.
async fn upstream(seen: Seen, run: Arc<AtomicBool>) -> SocketAddr {
    let first = listener("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = first.local_addr().unwrap();
    tokio::spawn(async move {
        let mut l = Some(first);
        let mut next_outage = Instant::now() + OUTAGE_EVERY;
        loop {
            let lst = match l.take() {
                Some(l) => l,
                None => match listener(addr) {
                    Ok(l) => l,
                    Err(e) => {
                        eprintln!("soak: upstream cannot listen again: {e}");
                        return;
                    }
                },
            };
            let until = tokio::time::sleep_until(next_outage.into());
            tokio::pin!(until);
            loop {
                tokio::select! {
                    r = lst.accept() => {
                        let Ok((s, _)) = r else { continue };
                        let seen = seen.clone();
                        tokio::spawn(serve(s, seen));
                    }
                    _ = &mut until => break,
                }
            }
            drop(lst);
            if !run.load(Ordering::Relaxed) {
                // after the run: no more outages
                next_outage = Instant::now() + Duration::from_secs(3600);
                continue;
            }
            tokio::time::sleep(OUTAGE).await;
            next_outage = Instant::now() + OUTAGE_EVERY;
        }
    });
    addr
}

async fn serve(mut s: TcpStream, seen: Seen) {
    let _ = s.set_nodelay(true);
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        let end = loop {
            if let Some(e) = find(&buf, b"\r\n\r\n") {
                break e;
            }
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
        buf.drain(..end + 4);
        let path = head.split(' ').nth(1).unwrap_or("").to_string();
        let (dir, id) = path.rsplit_once('/').unwrap_or(("", ""));
        let id: u64 = id.parse().unwrap_or(0);
        seen.lock()
            .unwrap()
            .entry(id)
            .or_insert_with(|| (0, dir.to_string()))
            .0 += 1;
        let len: usize = field(&head, "content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        while buf.len() < len {
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        buf.drain(..len);
        match dir {
            "/refuse" => return,
            "/garbage" => {
                let _ = s.write_all(b"220 smtp.soak ESMTP ready\r\n\r\n").await;
                return;
            }
            "/stall" => {
                // never answers; holds the connection until the gateway
                // gives up on it
                while matches!(s.read(&mut chunk).await, Ok(n) if n > 0) {}
                return;
            }
            _ => {
                let body = id.to_string();
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                );
                if s.write_all(answer.as_bytes()).await.is_err() {
                    return;
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------
// The gateway process and the run
// ---------------------------------------------------------------------------

fn config(up: SocketAddr) -> String {
    let mut keys = String::new();
    for i in 0..POLITE_KEYS {
        keys += &format!("sk_soak_{i} = \"free\"\n");
    }
    for k in ["pipe", "fault", "up", "slow", "frame"] {
        keys += &format!("sk_soak_{k} = \"free\"\n");
    }
    format!(
        r#"# written by the soak driver
[gateway]
listen = "127.0.0.1:0"
upstream = "http://{up}"
watch = false

[gateway.timeouts]
client_header_ms = 2000
connect_ms = 500
upstream_header_ms = 500
body_idle_ms = 1000

[plans.free]
policies = [{{ name = "burst", algorithm = "token_bucket", q = 100, w = 1 }}]

[plans.tight]
policies = [{{ name = "burst", algorithm = "token_bucket", q = 5, w = 1 }}]

[keys]
sk_soak_tight = "tight"
{keys}"#
    )
}

struct Args {
    gateway: PathBuf,
    secs: u64,
}

fn args() -> Result<Args, String> {
    let mut gateway = None;
    let mut secs = 120;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--gateway" => gateway = it.next().map(PathBuf::from),
            "--secs" => {
                secs = it
                    .next()
                    .and_then(|s| s.parse().ok())
                    .ok_or("--secs takes a number of seconds")?
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    let gateway = gateway.ok_or("usage: paceline-soak --gateway PATH_TO_paceline [--secs N]")?;
    Ok(Args { gateway, secs })
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let seen: Seen = Arc::default();
    let run = Arc::new(AtomicBool::new(true));
    let up = upstream(seen.clone(), run.clone()).await;
    let dir = std::env::temp_dir().join(format!("paceline-soak-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("soak.toml");
    std::fs::write(&file, config(up)).unwrap();

    let mut child = tokio::process::Command::new(&args.gateway)
        .arg("gateway")
        .arg("--config")
        .arg(&file)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", args.gateway.display()));
    let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
    let gw: SocketAddr = loop {
        let line = tokio::time::timeout(Duration::from_secs(10), out.next_line())
            .await
            .expect("the gateway starts in time")
            .unwrap()
            .expect("the gateway says where it listens");
        if let Some(rest) = line.split("listening on http://").nth(1) {
            break rest.split(' ').next().unwrap().parse().unwrap();
        }
    };
    let panics = Arc::new(AtomicU64::new(0));
    let stopped = Arc::new(AtomicBool::new(false));
    let log_lines = Arc::new(AtomicU64::new(0));
    {
        let (p, st) = (panics.clone(), stopped.clone());
        tokio::spawn(async move {
            while let Ok(Some(l)) = out.next_line().await {
                p.fetch_add(l.contains("panicked") as u64, Ordering::Relaxed);
                st.fetch_or(l.contains("paceline gateway: stopped"), Ordering::Relaxed);
            }
        });
        let mut err = BufReader::new(child.stderr.take().unwrap()).lines();
        let (p, n) = (panics.clone(), log_lines.clone());
        tokio::spawn(async move {
            while let Ok(Some(l)) = err.next_line().await {
                p.fetch_add(l.contains("panicked") as u64, Ordering::Relaxed);
                n.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    println!(
        "soak: {} s of mixed traffic through {} (pid {}) at {gw}, upstream {up}",
        args.secs,
        args.gateway.display(),
        child.id().unwrap_or(0)
    );

    let acc: Shared = Arc::default();
    let started = Instant::now();
    let mut clients = tokio::task::JoinSet::new();
    for i in 0..POLITE_KEYS {
        clients.spawn(polite(gw, acc.clone(), format!("sk_soak_{i}"), run.clone()));
    }
    clients.spawn(over_limit(gw, acc.clone(), run.clone()));
    clients.spawn(pipelined(gw, acc.clone(), run.clone()));
    clients.spawn(faults(gw, acc.clone(), run.clone()));
    clients.spawn(uploads(gw, acc.clone(), run.clone()));
    clients.spawn(slow(gw, acc.clone(), run.clone()));
    clients.spawn(framing(gw, acc.clone(), run.clone()));
    let mut last = Instant::now();
    while started.elapsed() < Duration::from_secs(args.secs) {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if last.elapsed() >= Duration::from_secs(10) {
            last = Instant::now();
            let a = acc.lock().unwrap();
            let n: u64 = a.outcomes.values().sum();
            println!(
                "soak: {:>4} s  {n} requests, {} lost so far",
                started.elapsed().as_secs(),
                a.lost
            );
        }
    }
    run.store(false, Ordering::Relaxed);
    // every client finishes what it has in flight
    let drain = async { while clients.join_next().await.is_some() {} };
    if tokio::time::timeout(PATIENCE + Duration::from_secs(5), drain)
        .await
        .is_err()
    {
        let mut a = acc.lock().unwrap();
        a.lost += 1;
        a.note("clients still waiting after the run".into());
    }
    let elapsed = started.elapsed();
    // the upstream has read all it will read
    tokio::time::sleep(Duration::from_millis(500)).await;

    // the gateway is alive, then stops cleanly on SIGTERM
    let alive = child.try_wait().ok().flatten().is_none();
    if let Some(pid) = child.id() {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status();
    }
    let status = tokio::time::timeout(Duration::from_secs(35), child.wait()).await;
    let clean_stop = matches!(&status, Ok(Ok(s)) if s.success());

    let a = acc.lock().unwrap();
    let seen = seen.lock().unwrap();
    let twice: Vec<u64> = seen
        .iter()
        .filter(|(_, (n, _))| *n > 1)
        .map(|(&id, _)| id)
        .collect();
    let mut twice_by_path: BTreeMap<&str, u64> = BTreeMap::new();
    for id in &twice {
        *twice_by_path.entry(&seen[id].1).or_default() += 1;
    }
    // a GET the upstream read and then closed on without an answer goes
    // again when its connection was a reused one (the documented retry of
    // an idempotent request over a connection that may have gone stale):
    // read twice, answered once; anything else read twice is a loss
    let retried = twice.iter().filter(|id| seen[id].1 == "/refuse").count();
    let twice_lost = twice.len() - retried;
    let let_in: Vec<u64> = a
        .rejected
        .iter()
        .copied()
        .filter(|id| seen.contains_key(id))
        .collect();
    let unaccounted: Vec<u64> = seen
        .keys()
        .copied()
        .filter(|id| !a.admitted.contains(id) && !a.closed.contains(id))
        .collect();
    // an admitted request the upstream never read is a 502 raised while
    // it refused connections; anything else is an answer from nowhere
    let unread: Vec<u64> = a
        .admitted
        .iter()
        .copied()
        .filter(|id| !seen.contains_key(id))
        .collect();
    let from_nowhere = unread
        .iter()
        .filter(|id| !a.unreachable.contains(id))
        .count();
    let unreachable = unread.len() - from_nowhere;
    let total: u64 = a.outcomes.values().sum();
    let sum = |prefix: &str| -> u64 {
        a.outcomes
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(_, v)| v)
            .sum()
    };
    println!();
    println!(
        "soak: {total} requests on {} connections in {:.0} s ({:.0}/s)",
        a.connections,
        elapsed.as_secs_f64(),
        total as f64 / elapsed.as_secs_f64()
    );
    for (title, prefix) in [
        ("admitted", "admitted: "),
        ("rejected", "rejected: "),
        ("closed", "closed: "),
        ("unexpected", "unexpected: "),
        ("lost", "lost: "),
    ] {
        let n = sum(prefix);
        if n == 0 && matches!(prefix, "unexpected: " | "lost: ") {
            continue;
        }
        println!("  {title:<10} {n:>8}");
        for (k, v) in a.outcomes.iter().filter(|(k, _)| k.starts_with(prefix)) {
            println!("    {v:>8}  {}", &k[prefix.len()..]);
        }
    }
    println!(
        "  upstream read {} requests: {} admitted and answered, {} of {} closed ones (aborted or slow); admitted it never read: {unreachable} (502 while it refused connections)",
        seen.len(),
        seen.keys().filter(|id| a.admitted.contains(id)).count(),
        seen.keys().filter(|id| a.closed.contains(id)).count(),
        a.closed.len()
    );
    println!(
        "  rejected that reached it: {}; read twice: {twice_lost} (and {retried} GETs to the refusing path, sent again after a reused connection closed without an answer); read but never answered as admitted: {}; admitted answers it never gave: {from_nowhere}",
        let_in.len(),
        unaccounted.len()
    );
    println!(
        "  gateway: alive at the end: {alive}; panics: {}; log lines: {}; clean stop on SIGTERM: {}",
        panics.load(Ordering::Relaxed),
        log_lines.load(Ordering::Relaxed),
        clean_stop && stopped.load(Ordering::Relaxed)
    );
    for id in let_in.iter().take(5) {
        println!(
            "  note: #{id} was answered {:?} and read by the upstream on {}",
            a.labels.get(id),
            seen[id].1
        );
    }
    if twice_lost > 0 {
        println!("  read twice, by path: {twice_by_path:?}");
    }
    for n in &a.notes {
        println!("  note: {n}");
    }
    let lost = a.lost
        + let_in.len() as u64
        + twice_lost as u64
        + unaccounted.len() as u64
        + from_nowhere as u64;
    println!("soak: lost {lost}, unexpected {}", a.unexpected);
    let _ = std::fs::remove_dir_all(&dir);
    let ok = lost == 0
        && a.unexpected == 0
        && alive
        && clean_stop
        && panics.load(Ordering::Relaxed) == 0;
    std::process::exit(if ok { 0 } else { 1 });
}
