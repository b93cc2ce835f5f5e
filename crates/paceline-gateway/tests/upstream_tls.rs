//! The gateway in front of a real nginx serving HTTPS, HTTP/1.1 and
//! HTTP/2 (by ALPN), with certificates made here: requests proxied with
//! bodies both ways (nginx's WebDAV `PUT` stores a body, of known length
//! or chunked, and a `GET` brings it back; a static file of known size
//! for a big answer), in the HTTP version `upstream_protocol` asks for
//! (nginx says which it spoke in `X-Proto`), with SNI from the upstream's
//! host name (`X-SNI`), a client certificate for the server that
//! requires one (`X-Client-DN`), and nginx retiring connections every
//! five requests (`keepalive_requests`, a `GOAWAY` over HTTP/2) without a
//! request failing. An upstream whose certificate does not chain to the
//! configured CA is a `502` that costs nothing and says why in the log.
//! HTTP/2 in cleartext (h2c by prior knowledge) runs against a hyper
//! server here.
//!
//! nginx comes from Debian: `scripts/test.sh` installs it. Without it a
//! run in CI fails; elsewhere the tests say what is missing and skip.

mod common;

use common::{certs, nginx};

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioIo};
use paceline_gateway::{Gateway, GatewayConfig, GatewayHandle};
use parking_lot::Mutex;

use common::LIMIT;

type Body = BoxBody<Bytes, Infallible>;

/// The size of the static file nginx serves.
const BIG: usize = 1024 * 1024 + 17;

/// nginx with three TLS servers, all for `localhost` and `127.0.0.1`,
/// each saying in its answers which HTTP version it spoke (`X-Proto`),
/// the SNI it got (`X-SNI`) and the client certificate's subject
/// (`X-Client-DN`): `open` (HTTP/2 and HTTP/1.1 by ALPN; WebDAV `PUT` under
/// `/files/`, `/big.bin`, `/hello`), `mtls` (the same, and a client
/// certificate from the CA required) and `h1` (HTTP/1.1 only).
struct Upstream {
    nginx: nginx::Nginx,
    open: u16,
    mtls: u16,
    h1: u16,
    /// The CA that signed nginx's certificate (and the gateway's client
    /// certificate).
    ca: certs::TestCa,
    /// A client certificate for the gateway.
    client: certs::Leaf,
    /// Another CA, which signed nothing nginx shows.
    other: certs::TestCa,
    big: Vec<u8>,
}

impl Upstream {
    fn start() -> Option<Upstream> {
        let bin = nginx::binary()?;
        let dir = nginx::scratch("upstream-tls");
        let certs_dir = dir.join("certs");
        let ca = certs::TestCa::new(&certs_dir, "ca");
        let other = certs::TestCa::new(&certs_dir, "other");
        let leaf = ca.server(&certs_dir, "nginx", &["localhost", "127.0.0.1"]);
        let client = ca.client(&certs_dir, "gateway", "gateway-client");
        let big: Vec<u8> = (0..BIG).map(|i| (i % 251) as u8).collect();
        std::fs::write(dir.join("www/big.bin"), &big).unwrap();
        std::fs::create_dir_all(dir.join("www/files")).unwrap();
        let (open, mtls, h1) = (nginx::free_port(), nginx::free_port(), nginx::free_port());
        let common = format!(
            "server_name localhost;\n\
             ssl_certificate {};\nssl_certificate_key {};\n\
             root {}/www;\n\
             add_header X-Proto $server_protocol always;\n\
             add_header X-SNI $ssl_server_name always;\n\
             add_header X-Client-DN $ssl_client_s_dn always;\n\
             location /files/ {{ dav_methods PUT; create_full_put_path on; client_max_body_size 16m; }}\n\
             location = /hello {{ return 200 \"hello\\n\"; }}\n",
            leaf.cert_file.display(),
            leaf.key_file.display(),
            dir.display(),
        );
        let http = format!(
            "keepalive_requests 5;\n\
             server {{ {} {common} }}\n\
             server {{ {} {common} ssl_client_certificate {}; ssl_verify_client on; }}\n\
             server {{ {} {common} }}\n",
            nginx::listen_tls(bin, open, true),
            nginx::listen_tls(bin, mtls, true),
            ca.cert_file.display(),
            nginx::listen_tls(bin, h1, false),
        );
        let nginx = nginx::Nginx::start(bin, dir, &http, &[open, mtls, h1]);
        Some(Upstream {
            nginx,
            open,
            mtls,
            h1,
            ca,
            client,
            other,
            big,
        })
    }
}

/// A gateway in front of `upstream` with `lines` more in its `[gateway]`
/// table and `tls` as its `[gateway.upstream_tls]`, one key `sk_a` on a
/// plan of 1,000 requests an hour.
struct Rig {
    addr: SocketAddr,
    handle: GatewayHandle,
    served: tokio::task::JoinHandle<std::io::Result<()>>,
    client: Client<HttpConnector, Body>,
}

impl Rig {
    async fn start(upstream: &str, lines: &str, tls: &str) -> Rig {
        let text = format!(
            r#"[gateway]
listen = "127.0.0.1:0"
upstream = "{upstream}"
watch = false
{lines}

[gateway.upstream_tls]
{tls}

[plans.free]
policies = [{{ name = "burst", algorithm = "token_bucket", q = 1000, w = 3600 }}]

[keys]
sk_a = "free"
"#
        );
        let cfg = GatewayConfig::parse(&text, "upstream_tls.toml", None).unwrap();
        let gw = Gateway::bind(cfg).await.unwrap();
        let addr = gw.local_addr();
        let handle = gw.handle();
        let served = tokio::spawn(gw.run(std::future::pending()));
        let client = Client::builder(TokioExecutor::new()).build(HttpConnector::new());
        Rig {
            addr,
            handle,
            served,
            client,
        }
    }

    async fn stop(self) {
        self.handle.shutdown();
        let _ = tokio::time::timeout(LIMIT, self.served).await;
    }

    /// `method path` with `body` and the key: the answer and its whole
    /// body, within [`LIMIT`] each.
    async fn send(&self, method: Method, path: &str, body: Body) -> Response<Bytes> {
        send(
            self.client.clone(),
            self.addr,
            method,
            path.to_string(),
            body,
        )
        .await
    }

    async fn get(&self, path: &str) -> Response<Bytes> {
        self.send(Method::GET, path, empty()).await
    }

    /// What is left of `sk_a`'s budget.
    async fn left(&self) -> u64 {
        let res = self.get("/v1/usage").await;
        assert_eq!(res.status(), 200, "{:?}", res.body());
        let v: serde_json::Value = serde_json::from_slice(res.body()).unwrap();
        v["limits"][0]["r"].as_u64().unwrap()
    }
}

/// `method path` to the gateway at `addr` with `body` and the key: the
/// answer and its whole body, within [`LIMIT`] each.
async fn send(
    client: Client<HttpConnector, Body>,
    addr: SocketAddr,
    method: Method,
    path: String,
    body: Body,
) -> Response<Bytes> {
    let req = Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"))
        .header("authorization", "Bearer sk_a")
        .body(body)
        .unwrap();
    let res = tokio::time::timeout(LIMIT, client.request(req))
        .await
        .expect("an answer in time")
        .expect("an answer");
    let (parts, body) = res.into_parts();
    let body = tokio::time::timeout(LIMIT, body.collect())
        .await
        .expect("the body in time")
        .expect("the body")
        .to_bytes();
    Response::from_parts(parts, body)
}

fn empty() -> Body {
    Full::new(Bytes::new()).boxed()
}

fn whole(data: &[u8]) -> Body {
    Full::new(Bytes::copy_from_slice(data)).boxed()
}

/// A body of `data` in pieces of `piece` bytes, its length not said (the
/// gateway gets it chunked).
fn streamed(data: &[u8], piece: usize) -> Body {
    let (tx, rx) = tokio::sync::mpsc::channel(2);
    let pieces: Vec<Bytes> = data.chunks(piece).map(Bytes::copy_from_slice).collect();
    tokio::spawn(async move {
        for p in pieces {
            if tx.send(p).await.is_err() {
                return;
            }
            tokio::task::yield_now().await;
        }
    });
    Streamed(rx).boxed()
}

/// A body of what comes through a channel, of no declared length.
struct Streamed(tokio::sync::mpsc::Receiver<Bytes>);

impl http_body::Body for Streamed {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Infallible>>> {
        self.0
            .poll_recv(cx)
            .map(|d| d.map(|d| Ok(http_body::Frame::data(d))))
    }
}

fn field<'a>(res: &'a Response<Bytes>, name: &str) -> &'a str {
    res.headers()
        .get(name)
        .map_or("", |v| v.to_str().unwrap_or("?"))
}

fn ca_only(ca: &Path) -> String {
    format!("ca_file = {:?}", ca.display().to_string())
}

/// Everything one gateway should get through from nginx's open server
/// in `version` (`"HTTP/1.1"` or `"HTTP/2.0"`); `tag` names its files.
async fn round_trips(rig: &Rig, up: &Upstream, version: &str, tag: &str) {
    let res = rig.get("/hello").await;
    assert_eq!(res.status(), 200, "{res:?}\n{}", up.nginx.log());
    assert_eq!(res.body().as_ref(), b"hello\n");
    assert_eq!(field(&res, "x-proto"), version);
    assert_eq!(field(&res, "x-sni"), "localhost");
    assert!(res.headers().get("ratelimit").is_some(), "{res:?}");

    // bodies up: known length and chunked, each fetched back whole
    let up_known: Vec<u8> = (0..300 * 1024).map(|i| (i % 13) as u8 + b'a').collect();
    let up_chunked: Vec<u8> = (0..200 * 1024).map(|i| (i % 7) as u8 + b'A').collect();
    for (name, data, body) in [
        ("known", &up_known, whole(&up_known)),
        ("chunked", &up_chunked, streamed(&up_chunked, 50 * 1024)),
    ] {
        let path = format!("/files/{tag}-{name}.bin");
        let res = rig.send(Method::PUT, &path, body).await;
        assert!(
            matches!(res.status().as_u16(), 201 | 204),
            "PUT {path}: {res:?}\n{}",
            up.nginx.log()
        );
        assert_eq!(field(&res, "x-proto"), version);
        let res = rig.get(&path).await;
        assert_eq!(res.status(), 200, "GET {path}");
        assert!(
            res.body().as_ref() == data.as_slice(),
            "{path} came back changed"
        );
    }

    // a big answer, and the head of it
    let res = rig.get("/big.bin").await;
    assert_eq!(res.status(), 200);
    assert_eq!(res.body().len(), BIG);
    assert!(res.body().as_ref() == up.big.as_slice());
    let res = rig.send(Method::HEAD, "/big.bin", empty()).await;
    assert_eq!(res.status(), 200);
    assert_eq!(field(&res, "content-length"), BIG.to_string());
    assert!(res.body().is_empty());

    // nginx retires a connection every five requests: requests at once
    // and bodies streamed one after another all get through
    let mut many = tokio::task::JoinSet::new();
    for _ in 0..24 {
        let (client, addr) = (rig.client.clone(), rig.addr);
        many.spawn(send(client, addr, Method::GET, "/hello".into(), empty()));
    }
    while let Some(res) = many.join_next().await {
        let res = res.unwrap();
        assert_eq!(res.status(), 200, "{res:?}\n{}", up.nginx.log());
        assert_eq!(field(&res, "x-proto"), version);
    }
    for i in 0..12 {
        let path = format!("/files/{tag}-seq-{i}.bin");
        let res = rig
            .send(Method::PUT, &path, streamed(&up_chunked[..100_000], 30_000))
            .await;
        assert!(
            matches!(res.status().as_u16(), 201 | 204),
            "PUT {path}: {res:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_speaks_http1_http2_and_auto_to_an_https_nginx() {
    let Some(up) = Upstream::start() else {
        return;
    };
    let url = format!("https://localhost:{}", up.open);
    let ca = ca_only(&up.ca.cert_file);
    let cases = [
        ("upstream_protocol = \"http1\"", "HTTP/1.1", "h1"),
        ("", "HTTP/1.1", "default"),
        ("upstream_protocol = \"http2\"", "HTTP/2.0", "h2"),
        ("upstream_protocol = \"auto\"", "HTTP/2.0", "auto"),
    ];
    for (line, version, tag) in cases {
        let rig = Rig::start(&url, line, &ca).await;
        round_trips(&rig, &up, version, tag).await;
        rig.stop().await;
    }
    // auto, to a server that offers HTTP/1.1 only
    let url = format!("https://localhost:{}", up.h1);
    let rig = Rig::start(&url, "upstream_protocol = \"auto\"", &ca).await;
    let res = rig.get("/hello").await;
    assert_eq!(
        (res.status(), field(&res, "x-proto")),
        (StatusCode::OK, "HTTP/1.1")
    );
    // and http2 to it fails, saying so
    rig.stop().await;
    let rig = Rig::start(&url, "upstream_protocol = \"http2\"", &ca).await;
    assert_eq!(rig.get("/hello").await.status(), 502);
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_requires_a_client_certificate_gets_it() {
    let Some(up) = Upstream::start() else {
        return;
    };
    let url = format!("https://localhost:{}", up.mtls);
    let with_cert = format!(
        "{}\ncert_file = {:?}\nkey_file = {:?}",
        ca_only(&up.ca.cert_file),
        up.client.cert_file.display().to_string(),
        up.client.key_file.display().to_string(),
    );
    for protocol in ["http1", "http2"] {
        let line = format!("upstream_protocol = \"{protocol}\"");
        let rig = Rig::start(&url, &line, &with_cert).await;
        let res = rig.get("/hello").await;
        assert_eq!(res.status(), 200, "{res:?}\n{}", up.nginx.log());
        assert_eq!(field(&res, "x-client-dn"), "CN=gateway-client");
        rig.stop().await;
        // without one nginx refuses the request
        let rig = Rig::start(&url, &line, &ca_only(&up.ca.cert_file)).await;
        let res = rig.get("/hello").await;
        assert_eq!(res.status(), 400, "{res:?}");
        rig.stop().await;
    }
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
async fn a_certificate_from_another_ca_is_a_502_that_costs_nothing() {
    let Some(up) = Upstream::start() else {
        return;
    };
    let logs = Captured::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let url = format!("https://localhost:{}", up.open);
    for protocol in ["http1", "http2", "auto"] {
        let line = format!("upstream_protocol = \"{protocol}\"");
        let rig = Rig::start(&url, &line, &ca_only(&up.other.cert_file)).await;
        let before = rig.left().await;
        let res = rig.get("/hello").await;
        assert_eq!(res.status(), 502, "{protocol}: {res:?}");
        let res = rig.get("/hello").await;
        assert_eq!(res.status(), 502, "{protocol}: {res:?}");
        // the usage answer itself is not charged either
        assert_eq!(
            rig.left().await,
            before,
            "{protocol}: a refused handshake was charged"
        );
        rig.stop().await;
    }
    let logs = String::from_utf8_lossy(&logs.0.lock()).into_owned();
    assert!(
        logs.contains("invalid peer certificate: UnknownIssuer"),
        "the cause is logged: {logs}"
    );
}

/// HTTP/2 by prior knowledge in cleartext, to a hyper server that speaks
/// only that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2c_reaches_a_cleartext_http2_upstream() {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = l.accept().await {
            tokio::spawn(async move {
                let svc =
                    hyper::service::service_fn(|req: Request<hyper::body::Incoming>| async move {
                        let version = format!("{:?}", req.version());
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        let mut res = Response::new(Full::new(body));
                        res.headers_mut()
                            .insert("x-proto", version.parse().unwrap());
                        Ok::<_, Infallible>(res)
                    });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    let rig = Rig::start(&format!("http://{up}"), "upstream_protocol = \"http2\"", "").await;
    let data: Vec<u8> = (0..100_000).map(|i| (i % 256) as u8).collect();
    for body in [whole(&data), streamed(&data, 16 * 1024)] {
        let res = rig.send(Method::POST, "/echo", body).await;
        assert_eq!(res.status(), 200, "{res:?}");
        assert_eq!(field(&res, "x-proto"), "HTTP/2.0");
        assert!(res.body().as_ref() == data.as_slice());
    }
    rig.stop().await;
}
