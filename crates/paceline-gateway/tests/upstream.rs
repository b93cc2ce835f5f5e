//! The gateway's HTTP/1.1 client against a scripted upstream on loopback:
//! request bodies of known and unknown length, chunked and close-delimited
//! answers, interim answers, `HEAD`, connections the upstream closed while
//! pooled, and answers that break the protocol. Every wait is bounded.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use paceline_gateway::{Gateway, GatewayConfig};
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const LIMIT: Duration = Duration::from_secs(10);

type Body = BoxBody<Bytes, std::io::Error>;

/// What the scripted upstream does with one request.
struct Answer {
    /// Written one after another, with a short pause between them.
    pieces: Vec<&'static [u8]>,
    /// Close the connection afterwards (without saying so).
    close: bool,
}

fn answer(piece: &'static [u8]) -> Answer {
    Answer {
        pieces: vec![piece],
        close: false,
    }
}

/// Paths answered as soon as their head is read, body unread, and the
/// connection closed.
const EARLY: &str = "/early";

/// One request as the upstream read it.
#[derive(Clone, Debug)]
struct Seen {
    head: String,
    body: Vec<u8>,
}

struct Upstream {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

/// An upstream that reads each request whole (`Content-Length` or
/// chunked) and answers it as `script` says, by request path.
async fn upstream(script: fn(&str) -> Answer) -> Upstream {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (a, s) = (accepted.clone(), seen.clone());
    tokio::spawn(async move {
        while let Ok((conn, _)) = l.accept().await {
            a.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(serve(conn, script, s.clone()));
        }
    });
    Upstream {
        addr,
        accepted,
        seen,
    }
}

async fn serve(mut conn: TcpStream, script: fn(&str) -> Answer, seen: Arc<Mutex<Vec<Seen>>>) {
    let mut buf = Vec::new();
    loop {
        let Some(req) = read_request(&mut conn, &mut buf).await else {
            return;
        };
        let path = req.head.split(' ').nth(1).unwrap_or("").to_string();
        if path == EARLY {
            seen.lock().push(req);
            let _ = conn.write_all(script(EARLY).pieces[0]).await;
            return;
        }
        seen.lock().push(req);
        let a = script(&path);
        for (i, p) in a.pieces.iter().enumerate() {
            if i > 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            if conn.write_all(p).await.is_err() {
                return;
            }
        }
        if a.close {
            return;
        }
    }
}

async fn fill(conn: &mut TcpStream, buf: &mut Vec<u8>) -> Option<()> {
    let mut chunk = [0u8; 4096];
    match conn.read(&mut chunk).await {
        Ok(0) | Err(_) => None,
        Ok(n) => {
            buf.extend_from_slice(&chunk[..n]);
            Some(())
        }
    }
}

fn find(buf: &[u8], what: &[u8]) -> Option<usize> {
    buf.windows(what.len()).position(|w| w == what)
}

async fn read_request(conn: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Seen> {
    let end = loop {
        if let Some(e) = find(buf, b"\r\n\r\n") {
            break e;
        }
        fill(conn, buf).await?;
    };
    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
    buf.drain(..end + 4);
    let mut body = Vec::new();
    if head.split(' ').nth(1) == Some(EARLY) {
        return Some(Seen { head, body });
    }
    if let Some(n) = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .map(|v| v.trim().parse::<usize>().unwrap())
    {
        while buf.len() < n {
            fill(conn, buf).await?;
        }
        body.extend(buf.drain(..n));
    } else if head.contains("transfer-encoding: chunked") {
        loop {
            let eol = loop {
                if let Some(e) = find(buf, b"\r\n") {
                    break e;
                }
                fill(conn, buf).await?;
            };
            let size =
                usize::from_str_radix(std::str::from_utf8(&buf[..eol]).unwrap(), 16).unwrap();
            while buf.len() < eol + 2 + size + 2 {
                fill(conn, buf).await?;
            }
            body.extend_from_slice(&buf[eol + 2..eol + 2 + size]);
            buf.drain(..eol + 2 + size + 2);
            if size == 0 {
                break;
            }
        }
    }
    Some(Seen { head, body })
}

struct Rig {
    addr: SocketAddr,
    handle: paceline_gateway::GatewayHandle,
    served: tokio::task::JoinHandle<std::io::Result<()>>,
    client: Client<HttpConnector, Body>,
    dir: std::path::PathBuf,
}

impl Rig {
    async fn start(name: &str, up: &Upstream) -> Rig {
        let dir = std::env::temp_dir().join(format!("pl-up-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("gateway.toml");
        let text = format!(
            r#"key = "ip"
default_plan = "open"

[gateway]
listen = "127.0.0.1:0"
upstream = "http://{}"
watch = false

# a request goes on once its first bytes are in: an upstream may answer
# before the rest of its body comes
[gateway.limits]
intake_bytes = 1

[plans.open]
policies = [{{ name = "burst", algorithm = "token_bucket", q = 1000000, w = 1 }}]
"#,
            up.addr
        );
        std::fs::write(&file, text).unwrap();
        let gw = Gateway::bind(GatewayConfig::load(&file).unwrap())
            .await
            .unwrap();
        let addr = gw.local_addr();
        let handle = gw.handle();
        let served = tokio::spawn(gw.run(std::future::pending()));
        let client = Client::builder(TokioExecutor::new()).build_http();
        Rig {
            addr,
            handle,
            served,
            client,
            dir,
        }
    }

    async fn send(
        &self,
        method: &str,
        path: &str,
        body: Body,
    ) -> (Response<()>, Result<Bytes, String>) {
        let req = Request::builder()
            .method(method)
            .uri(format!("http://{}{path}", self.addr))
            .body(body)
            .unwrap();
        let res = tokio::time::timeout(LIMIT, self.client.request(req))
            .await
            .expect("answer in time")
            .expect("a response");
        let (parts, body) = res.into_parts();
        let body = tokio::time::timeout(LIMIT, body.collect())
            .await
            .expect("body in time")
            .map(|b| b.to_bytes())
            .map_err(|e| e.to_string());
        (Response::from_parts(parts, ()), body)
    }

    async fn get(&self, path: &str) -> (Response<()>, Result<Bytes, String>) {
        self.send("GET", path, full("")).await
    }

    async fn stop(self) {
        self.handle.shutdown();
        tokio::time::timeout(LIMIT, self.served)
            .await
            .expect("stops in time")
            .unwrap()
            .unwrap();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn full(s: &'static str) -> Body {
    Full::new(Bytes::from_static(s.as_bytes()))
        .map_err(|never: Infallible| match never {})
        .boxed()
}

const OK: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_bodies_arrive_whole_with_or_without_a_length() {
    let up = upstream(|_| answer(OK)).await;
    let rig = Rig::start("bodies", &up).await;

    let (res, body) = rig.send("POST", "/v1/labels", full("hello")).await;
    assert_eq!(res.status(), 200);
    assert_eq!(body.unwrap(), "ok");

    // a body of unknown length, its pieces some time apart
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(4);
    tokio::spawn(async move {
        for piece in ["abc", "defg", "hi"] {
            tokio::time::sleep(Duration::from_millis(30)).await;
            tx.send(Bytes::from_static(piece.as_bytes())).await.unwrap();
        }
    });
    let (res, body) = rig
        .send("PUT", "/v1/labels/1", ChannelBody(rx).boxed())
        .await;
    assert_eq!(res.status(), 200);
    assert_eq!(body.unwrap(), "ok");

    // an empty POST still says it has no body
    let (res, _) = rig.send("POST", "/v1/login", full("")).await;
    assert_eq!(res.status(), 200);

    let seen = up.seen.lock().clone();
    assert_eq!(seen.len(), 3);
    assert!(
        seen[0].head.contains("\r\ncontent-length: 5"),
        "{}",
        seen[0].head
    );
    assert_eq!(seen[0].body, b"hello");
    assert!(
        seen[1].head.contains("\r\ntransfer-encoding: chunked"),
        "{}",
        seen[1].head
    );
    assert_eq!(seen[1].body, b"abcdefghi");
    assert!(
        seen[2].head.contains("\r\ncontent-length: 0"),
        "{}",
        seen[2].head
    );
    assert_eq!(
        up.accepted.load(Ordering::SeqCst),
        1,
        "one connection for all"
    );
    rig.stop().await;
}

/// A body of unknown length fed through a channel.
struct ChannelBody(tokio::sync::mpsc::Receiver<Bytes>);

impl http_body::Body for ChannelBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, std::io::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|b| b.map(|b| Ok(http_body::Frame::data(b))))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_and_close_delimited_answers_come_through() {
    let up = upstream(|path| match path {
        "/chunked" => Answer {
            pieces: vec![
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n",
                b"1;x=y\r\n \r\n",
                b"6\r\nworld!\r\n0\r\nx-t: 1\r\n\r\n",
            ],
            close: false,
        },
        "/close" => Answer {
            pieces: vec![b"HTTP/1.1 200 OK\r\n\r\nuntil ", b"the end"],
            close: true,
        },
        _ => answer(OK),
    })
    .await;
    let rig = Rig::start("answers", &up).await;
    let (res, body) = rig.get("/chunked").await;
    assert_eq!(res.status(), 200);
    assert!(res
        .headers()
        .get("transfer-encoding")
        .is_none_or(|v| v == "chunked"));
    assert_eq!(body.unwrap(), "hello world!");
    let (_, body) = rig.get("/chunked").await;
    assert_eq!(body.unwrap(), "hello world!");
    assert_eq!(
        up.accepted.load(Ordering::SeqCst),
        1,
        "a chunked answer keeps the connection"
    );

    let (res, body) = rig.get("/close").await;
    assert_eq!(res.status(), 200);
    assert_eq!(body.unwrap(), "until the end");
    let (_, body) = rig.get("/other").await;
    assert_eq!(body.unwrap(), "ok");
    assert_eq!(
        up.accepted.load(Ordering::SeqCst),
        2,
        "a close-delimited answer uses up its connection"
    );
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interim_answers_are_skipped_and_head_answers_have_no_body() {
    let up = upstream(|path| match path {
        "/continue" => answer(
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\ncontent-length: 4\r\n\r\ndone",
        ),
        _ => answer(b"HTTP/1.1 200 OK\r\ncontent-length: 7\r\n\r\n"),
    })
    .await;
    let rig = Rig::start("interim", &up).await;
    let (res, body) = rig.send("POST", "/continue", full("x")).await;
    assert_eq!(res.status(), 201);
    assert_eq!(body.unwrap(), "done");
    // the answer to HEAD carries a length but no body: nothing is waited for
    let (res, body) = rig.send("HEAD", "/head", full("")).await;
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["content-length"], "7");
    assert_eq!(body.unwrap(), "");
    let (res, _) = rig.send("HEAD", "/head", full("")).await;
    assert_eq!(res.status(), 200);
    assert_eq!(up.accepted.load(Ordering::SeqCst), 1);
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_the_upstream_closed_while_pooled_are_not_used() {
    // every answer claims keep-alive, then the upstream hangs up
    let up = upstream(|_| Answer {
        pieces: vec![OK],
        close: true,
    })
    .await;
    let rig = Rig::start("stale", &up).await;
    for i in 0..4 {
        let (res, body) = rig.get("/v1/rates").await;
        assert_eq!(res.status(), 200, "request {i}");
        assert_eq!(body.unwrap(), "ok");
        if i % 2 == 1 {
            // let the close be seen before the next request
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    // a POST goes too, though it is not sent twice blindly
    let (res, _) = rig.send("POST", "/v1/labels", full("{}")).await;
    assert_eq!(res.status(), 200);
    assert_eq!(up.accepted.load(Ordering::SeqCst), 5);
    assert_eq!(
        up.seen.lock().len(),
        5,
        "no request reached the upstream twice"
    );
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_that_break_the_protocol_fail_cleanly() {
    let up = upstream(|path| match path {
        "/garbage" => Answer {
            pieces: vec![b"SMTP ready\r\n\r\n"],
            close: true,
        },
        "/lengths" => {
            answer(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\nok")
        }
        "/short" => Answer {
            pieces: vec![b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc"],
            close: true,
        },
        "/bad-chunk" => Answer {
            pieces: vec![b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n"],
            close: false,
        },
        _ => answer(OK),
    })
    .await;
    let rig = Rig::start("broken", &up).await;
    for path in ["/garbage", "/lengths"] {
        let (res, body) = rig.get(path).await;
        assert_eq!(res.status(), 502, "{path}");
        assert!(body.unwrap().starts_with(b"{"), "a problem document");
    }
    for path in ["/short", "/bad-chunk"] {
        // the head may or may not have left before the body failed; either
        // way the client sees a failure, never a short body taken as whole
        let req = Request::get(format!("http://{}{path}", rig.addr))
            .body(full(""))
            .unwrap();
        let got = tokio::time::timeout(LIMIT, async {
            let res = rig.client.request(req).await.map_err(|e| e.to_string())?;
            assert_eq!(res.status(), 200, "{path}");
            res.into_body().collect().await.map_err(|e| e.to_string())
        })
        .await
        .expect("in time");
        assert!(got.is_err(), "{path}: {got:?}");
    }
    // nothing broken went back to the pool (a new client: the gateway
    // closed the connections whose answers failed)
    let rig = Rig {
        client: Client::builder(TokioExecutor::new()).build_http(),
        ..rig
    };
    let (res, body) = rig.get("/fine").await;
    assert_eq!(res.status(), 200);
    assert_eq!(body.unwrap(), "ok");
    assert_eq!(up.accepted.load(Ordering::SeqCst), 5);
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_early_answer_reaches_the_client_while_its_body_still_flows() {
    let up = upstream(|path| match path {
        EARLY => answer(
            b"HTTP/1.1 413 Content Too Large\r\ncontent-length: 3\r\nconnection: close\r\n\r\nbig",
        ),
        _ => answer(OK),
    })
    .await;
    let rig = Rig::start("early", &up).await;
    // a body that sends one piece, then holds the rest back
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(4);
    tx.send(Bytes::from_static(b"first piece")).await.unwrap();
    let (res, body) = rig.send("PUT", EARLY, ChannelBody(rx).boxed()).await;
    assert_eq!(res.status(), 413, "the upstream's answer, not a timeout");
    assert_eq!(body.unwrap(), "big");
    drop(tx);
    // the connection it was answered on is not used again
    let (res, _) = rig.get("/after").await;
    assert_eq!(res.status(), 200);
    assert_eq!(up.accepted.load(Ordering::SeqCst), 2);
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_length_beside_chunks_is_not_passed_on() {
    let up = upstream(|path| match path {
        "/both" => answer(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\nb\r\nhello world\r\n0\r\n\r\n",
        ),
        "/gzip" => answer(b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\nxyz"),
        _ => answer(OK),
    })
    .await;
    let rig = Rig::start("both", &up).await;
    let (res, body) = rig.get("/both").await;
    assert_eq!(res.status(), 200);
    assert!(
        res.headers().get("content-length").is_none(),
        "{:?}",
        res.headers()
    );
    assert_eq!(
        body.unwrap(),
        "hello world",
        "the whole body, not the first 3 bytes"
    );
    // a coding the gateway cannot frame or pass on is refused
    let (res, _) = rig.get("/gzip").await;
    assert_eq!(res.status(), 502);
    rig.stop().await;
}
