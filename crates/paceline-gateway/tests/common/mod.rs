//! What the gateway's tests share: a bounded `GET`, a counting upstream
//! and a gateway started in front of it on loopback (each test binary
//! that needs them declares `mod common;`).

#![allow(dead_code)]

pub(crate) mod certs;
pub(crate) mod nginx;
pub(crate) mod tls;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use paceline_gateway::{Gateway, GatewayConfig, GatewayHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// The bound on every wait of these tests.
pub(crate) const LIMIT: Duration = Duration::from_secs(10);

/// Sends `bytes` on a new connection to `addr` and reads what comes back
/// until the server closes it, within [`LIMIT`].
pub(crate) async fn until_closed(addr: SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(bytes).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(LIMIT, s.read_to_end(&mut out))
        .await
        .expect("the connection closed in time")
        .unwrap();
    out
}

/// `GET path` with `Bearer key`, the answer and its whole body, each
/// within [`LIMIT`].
pub(crate) async fn get(
    client: &Client<HttpConnector, Full<Bytes>>,
    addr: SocketAddr,
    path: &str,
    key: &str,
) -> Response<Bytes> {
    let req = Request::get(format!("http://{addr}{path}"))
        .header("authorization", format!("Bearer {key}"))
        .body(Full::default())
        .unwrap();
    let res = tokio::time::timeout(LIMIT, client.request(req))
        .await
        .expect("answer in time")
        .expect("a response");
    let (parts, body) = res.into_parts();
    let body = tokio::time::timeout(LIMIT, body.collect())
        .await
        .expect("body in time")
        .expect("a body")
        .to_bytes();
    Response::from_parts(parts, body)
}

/// Where `what` first occurs in `buf`.
pub(crate) fn find(buf: &[u8], what: &[u8]) -> Option<usize> {
    buf.windows(what.len()).position(|w| w == what)
}

/// The next request head a test upstream reads on `s` (with what is
/// left of the last read in `buf`), taken out of `buf`; `None` once the
/// client is gone.
pub(crate) async fn next_head(s: &mut tokio::net::TcpStream, buf: &mut Vec<u8>) -> Option<Vec<u8>> {
    loop {
        if let Some(end) = find(buf, b"\r\n\r\n") {
            return Some(buf.drain(..end + 4).collect());
        }
        let mut chunk = [0u8; 4096];
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// An HTTP/1.1 upstream that counts every head and answers it `200 ok`,
/// but for `/stall`, which it never answers.
pub(crate) async fn counting_upstream() -> (SocketAddr, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let seen = Arc::new(AtomicUsize::new(0));
    let count = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let count = count.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    let Some(head) = next_head(&mut s, &mut buf).await else {
                        return;
                    };
                    count.fetch_add(1, Ordering::SeqCst);
                    if head.starts_with(b"GET /stall ") {
                        std::future::pending::<()>().await;
                    }
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

/// A gateway in front of a [`counting_upstream`], with one key `sk_a` on a
/// plan of `quota` requests an hour.
pub(crate) struct Rig {
    pub(crate) addr: SocketAddr,
    pub(crate) handle: GatewayHandle,
    pub(crate) served: tokio::task::JoinHandle<std::io::Result<()>>,
    /// Heads the upstream has seen.
    pub(crate) seen: Arc<AtomicUsize>,
}

impl Rig {
    /// Starts one; `gateway` is more lines of its `[gateway]` table.
    pub(crate) async fn start(gateway: &str, quota: u64) -> Rig {
        let (up, seen) = counting_upstream().await;
        let text = format!(
            r#"[gateway]
listen = "127.0.0.1:0"
upstream = "http://{up}"
watch = false
{gateway}

[plans.free]
policies = [{{ name = "burst", algorithm = "token_bucket", q = {quota}, w = 3600 }}]

[keys]
sk_a = "free"
"#
        );
        let cfg = GatewayConfig::parse(&text, "rig.toml", None).unwrap();
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

    /// Shuts it down, waiting at most [`LIMIT`].
    pub(crate) async fn stop(self) {
        self.handle.shutdown();
        let _ = tokio::time::timeout(LIMIT, self.served).await;
    }
}

/// An HTTP/1.1 upstream that answers every request `200 {}` and says, in
/// `seen-<name>`, the value of each of the request fields `names` that
/// reached it (`-` when none did).
pub(crate) async fn echo_upstream(names: &'static [&'static str]) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(
                    move |req: Request<hyper::body::Incoming>| async move {
                        let mut res = Response::builder();
                        for name in names {
                            let seen = req
                                .headers()
                                .get(*name)
                                .map_or("-".to_string(), |v| v.to_str().unwrap_or("?").to_string());
                            res = res.header(format!("seen-{name}"), seen);
                        }
                        let res = res.body(Full::new(Bytes::from_static(b"{}"))).unwrap();
                        Ok::<_, std::convert::Infallible>(res)
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    addr
}
