//! The clients the proxy can run on, held against each other over every
//! transport: the own HTTP/1.1 client in cleartext and over TLS, HTTP/2
//! by prior knowledge (h2c) and over TLS, and `"auto"` over TLS against
//! an upstream that offers `h2` and one that offers `http/1.1` only. Each
//! is built from settings as the proxy builds it ([`UpstreamClient::new`])
//! and sends one corpus of exchanges (bodies both ways, known and unknown
//! lengths, streaming and at once, status codes, `HEAD`, `204`, `304`, a
//! client body that fails) to a hyper server on loopback that answers
//! with what it saw of the request. What the proxy gets must be the same
//! whatever the transport; only the HTTP version the upstream saw differs,
//! and it must be the one the settings ask for.
//!
//! The raw-wire corpus (`differential.rs`) stays HTTP/1.1-only: its cases
//! are bytes no HTTP/2 server would write. What TLS adds to a connection
//! (verification, SNI, the handshake inside the connect deadline, reuse
//! across TLS 1.3 session tickets, a `close_notify` while idle, a body cut
//! without one) has cases of its own here.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode, Uri};
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use paceline_core::SystemClock;
use rustls::ServerConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::error::{BoxError, UpstreamError};
use super::{strip_hop_by_hop, Answer, Outgoing, Upstream, UpstreamClient, Via};
use crate::config::{Timeouts, UpstreamProtocol, UpstreamTlsSettings};

use super::test_certs::{self as certs, server_config};

/// The bound on every wait here.
const LIMIT: Duration = Duration::from_secs(10);

/// The request body the clients are built for.
type ReqBody = BoxBody<Bytes, BoxError>;

/// A body whose chunks come one at a time, each after a pause (the
/// client cannot take it whole with the head), of known length or not.
struct Trickle {
    chunks: VecDeque<Bytes>,
    /// The length it declares, if any.
    length: Option<u64>,
    /// Fails instead of ending.
    fail: bool,
    waited: bool,
}

impl Trickle {
    fn new(chunks: &[&'static [u8]], known: bool) -> Trickle {
        let total = chunks.iter().map(|c| c.len() as u64).sum();
        Trickle {
            chunks: chunks.iter().map(|c| Bytes::from_static(c)).collect(),
            length: known.then_some(total),
            fail: false,
            waited: false,
        }
    }
}

impl Body for Trickle {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        // pending once before every chunk, woken at once
        if !std::mem::replace(&mut self.waited, true) {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        self.waited = false;
        match self.chunks.pop_front() {
            Some(c) => Poll::Ready(Some(Ok(Frame::data(c)))),
            None if self.fail => Poll::Ready(Some(Err("the client went away".into()))),
            None => Poll::Ready(None),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self.length {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::new(),
        }
    }
}

/// A request body of the corpus.
#[derive(Clone, Copy)]
enum Sent {
    None,
    /// At once, known length.
    Whole(&'static [u8]),
    /// In pieces, length declared.
    Known(&'static [&'static [u8]]),
    /// In pieces, no length (chunked over HTTP/1.1).
    Unknown(&'static [&'static [u8]]),
    /// In pieces, then an error.
    Failing(&'static [&'static [u8]]),
}

impl Sent {
    fn body(self) -> ReqBody {
        match self {
            Sent::None => Full::new(Bytes::new()).map_err(|e| match e {}).boxed(),
            Sent::Whole(b) => Full::new(Bytes::from_static(b))
                .map_err(|e| match e {})
                .boxed(),
            Sent::Known(c) => Trickle::new(c, true).boxed(),
            Sent::Unknown(c) => Trickle::new(c, false).boxed(),
            Sent::Failing(c) => {
                let mut t = Trickle::new(c, false);
                t.fail = true;
                t.boxed()
            }
        }
    }

    /// The bytes the upstream should get.
    fn bytes(self) -> Vec<u8> {
        match self {
            Sent::None => Vec::new(),
            Sent::Whole(b) => b.to_vec(),
            Sent::Known(c) | Sent::Unknown(c) | Sent::Failing(c) => c.concat(),
        }
    }
}

/// What the proxy gets: the status, the end-to-end fields but `date`, and
/// the body (`None`: it failed), or the kind of failure.
#[derive(Debug, PartialEq, Eq)]
enum Got {
    Answer {
        status: u16,
        fields: Vec<(String, String)>,
        body: Option<Vec<u8>>,
    },
    Failed(&'static str),
}

struct Case {
    name: &'static str,
    method: Method,
    path: &'static str,
    sent: Sent,
}

fn case(name: &'static str, method: Method, path: &'static str, sent: Sent) -> Case {
    Case {
        name,
        method,
        path,
        sent,
    }
}

const BIG: &[u8] = &[b'x'; 200 * 1024];

fn corpus() -> Vec<Case> {
    vec![
        case("a GET", Method::GET, "/s/200", Sent::None),
        case("a 404", Method::GET, "/s/404", Sent::None),
        case("a 500", Method::GET, "/s/500", Sent::None),
        case(
            "a 201 to a POST",
            Method::POST,
            "/s/201",
            Sent::Whole(b"made"),
        ),
        case("an echo", Method::POST, "/echo", Sent::Whole(b"hello")),
        case("an echo of 200 KiB", Method::PUT, "/echo", Sent::Whole(BIG)),
        case(
            "a streamed body of known length",
            Method::PUT,
            "/echo",
            Sent::Known(&[b"one ", b"two ", b"three"]),
        ),
        case(
            "a streamed body of unknown length",
            Method::POST,
            "/echo",
            Sent::Unknown(&[b"chunk one, ", b"chunk two, ", b"end"]),
        ),
        case("an empty POST", Method::POST, "/echo", Sent::None),
        case("a HEAD", Method::HEAD, "/s/200", Sent::None),
        case("a 204", Method::GET, "/s/204", Sent::None),
        case("a 304", Method::GET, "/s/304", Sent::None),
        case("a big answer", Method::GET, "/big/300000", Sent::None),
        case("a streamed answer", Method::GET, "/stream", Sent::None),
        case(
            "a client body that fails",
            Method::POST,
            "/echo",
            Sent::Failing(&[b"first"]),
        ),
    ]
}

/// What the upstream saw, in fields of its answer.
async fn echo(
    req: Request<Incoming>,
    sni: Option<String>,
) -> Result<Response<BoxBody<Bytes, Infallible>>, Infallible> {
    let version = format!("{:?}", req.version());
    let method = req.method().to_string();
    let path = req.uri().path().to_string();
    let host = req
        .headers()
        .get(http::header::HOST)
        .map(|h| h.to_str().unwrap_or("?").to_string())
        .or_else(|| req.uri().authority().map(|a| a.to_string()))
        .unwrap_or_default();
    let a = req.headers().get("x-a").cloned();
    let xff = req.headers().get("x-forwarded-for").cloned();
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => Bytes::from_static(b"<the request body failed>"),
    };
    let status = path
        .strip_prefix("/s/")
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);
    let head = req_method_is_head(&method);
    let bodiless = status == 204 || status == 304;
    // an HTTP/2 server must leave these bodies out itself (hyper's sends
    // what it is given)
    let answer = match path.as_str() {
        _ if head || bodiless => Full::new(Bytes::new()).boxed(),
        "/echo" => Full::new(body.clone()).boxed(),
        "/stream" => Trickle::new(&[b"streamed ", b"in ", b"pieces"], false)
            .map_err(|_| unreachable!())
            .boxed(),
        p if p.starts_with("/big/") => {
            let n: usize = p[5..].parse().unwrap();
            let data: Vec<u8> = (0..n).map(|i| b'a' + (i % 26) as u8).collect();
            Full::new(Bytes::from(data)).boxed()
        }
        _ => Full::new(Bytes::from_static(b"ok")).boxed(),
    };
    // the length said the same way over both versions (hyper's HTTP/2
    // server leaves out a length of 0), and for `HEAD` the length of the
    // `GET` without its body (hyper's HTTP/2 server would send one)
    let length = match (head, answer.size_hint().exact()) {
        (true, _) => Some(2),
        (false, n) => n,
    };
    let mut res = Response::new(answer);
    *res.status_mut() = StatusCode::from_u16(status).unwrap();
    let h = res.headers_mut();
    if let (Some(n), false) = (length, bodiless) {
        h.insert(http::header::CONTENT_LENGTH, n.into());
    }
    h.insert("x-version", version.parse().unwrap());
    h.insert("x-seen-method", method.parse().unwrap());
    h.insert("x-seen-path", path.parse().unwrap());
    h.insert("x-seen-host", host.parse().unwrap());
    h.insert("x-seen-length", body.len().into());
    if let Some(a) = a {
        h.insert("x-seen-a", a);
    }
    if let Some(xff) = xff {
        h.insert("x-seen-xff", xff);
    }
    if let Some(sni) = sni {
        h.insert("x-sni", sni.parse().unwrap());
    }
    Ok(res)
}

fn req_method_is_head(m: &str) -> bool {
    m == "HEAD"
}

/// A hyper server (HTTP/1.1 and HTTP/2, by ALPN under TLS, by the
/// preface in cleartext) answering with [`echo`]: its address and how
/// many connections it took.
async fn upstream(tls: Option<Arc<ServerConfig>>) -> (SocketAddr, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let conns = Arc::new(AtomicUsize::new(0));
    let count = conns.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = l.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            let tls = tls.clone();
            tokio::spawn(async move {
                let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                match tls {
                    None => {
                        let svc = hyper::service::service_fn(|r| echo(r, None));
                        let _ = builder.serve_connection(TokioIo::new(tcp), svc).await;
                    }
                    Some(cfg) => {
                        let Ok(s) = tokio_rustls::TlsAcceptor::from(cfg).accept(tcp).await else {
                            return;
                        };
                        let sni = s.get_ref().1.server_name().map(str::to_string);
                        let svc = hyper::service::service_fn(move |r| echo(r, sni.clone()));
                        let _ = builder.serve_connection(TokioIo::new(s), svc).await;
                    }
                }
            });
        }
    });
    (addr, conns)
}

/// A scratch directory for this test's certificates.
fn scratch(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("paceline-transports-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn trusting(ca: &Path) -> UpstreamTlsSettings {
    UpstreamTlsSettings {
        ca_file: Some(ca.to_path_buf()),
        ..UpstreamTlsSettings::default()
    }
}

fn client(
    uri: &str,
    tls: &UpstreamTlsSettings,
    protocol: UpstreamProtocol,
) -> UpstreamClient<ReqBody> {
    let uri: Uri = uri.parse().unwrap();
    let t = Timeouts::default();
    UpstreamClient::new(&uri, tls, protocol, &t, Arc::new(SystemClock::new())).unwrap()
}

/// Sends one request: what the proxy gets, and the version the upstream
/// saw (`None` without an answer).
async fn run<U: Upstream<ReqBody>>(
    client: &U,
    method: &Method,
    path: &str,
    sent: Sent,
) -> (Got, Option<String>) {
    let (parts, ()) = Request::builder()
        .method(method.clone())
        .uri(path)
        .header("host", "gateway.test")
        .header("x-a", "1")
        .header("connection", "x-secret")
        .header("x-secret", "not for the upstream")
        .body(())
        .unwrap()
        .into_parts();
    let reached = std::sync::atomic::AtomicBool::new(false);
    let req = Outgoing {
        parts: &parts,
        via: Via::UNKNOWN,
        reached: &reached,
    };
    let exchange = async {
        let answer = match client.send(req, sent.body()).await {
            Ok(a) => a,
            Err(UpstreamError::Connect(_)) => return (Got::Failed("connect"), None),
            Err(UpstreamError::RequestBody(_)) => return (Got::Failed("request body"), None),
            Err(_) => return (Got::Failed("upstream"), None),
        };
        let Answer {
            status,
            mut headers,
            body,
            ..
        } = answer;
        strip_hop_by_hop(&mut headers);
        let version = headers
            .remove("x-version")
            .map(|v| v.to_str().unwrap().to_string());
        let body = body.collect().await.ok().map(|c| c.to_bytes().to_vec());
        let got = Got::Answer {
            status: status.as_u16(),
            fields: fields(&headers),
            body,
        };
        (got, version)
    };
    tokio::time::timeout(LIMIT, exchange)
        .await
        .unwrap_or_else(|_| panic!("{method} {path}: no outcome within {LIMIT:?}"))
}

fn fields(h: &HeaderMap) -> Vec<(String, String)> {
    let mut f: Vec<(String, String)> = h
        .iter()
        .filter(|(n, _)| *n != http::header::DATE)
        .map(|(n, v)| (n.to_string(), String::from_utf8_lossy(v.as_bytes()).into()))
        .collect();
    f.sort();
    f
}

/// What every transport must give for `case`, checked on the answer of
/// the first (cleartext HTTP/1.1): the upstream saw the method, path,
/// host, fields and body the client sent, and the status it was asked
/// for.
fn check_reference(case: &Case, got: &Got) -> Result<(), String> {
    let Got::Answer {
        status,
        fields,
        body,
    } = got
    else {
        return match case.sent {
            Sent::Failing(_) if *got == Got::Failed("request body") => Ok(()),
            _ => Err(format!("{}: no answer: {got:?}", case.name)),
        };
    };
    let field = |n: &str| fields.iter().find(|f| f.0 == n).map(|f| f.1.as_str());
    let want_status = case
        .path
        .strip_prefix("/s/")
        .map_or(200, |s| s.parse().unwrap());
    let seen_len = case.sent.bytes().len().to_string();
    let checks = [
        (*status == want_status, "status"),
        (
            field("x-seen-method") == Some(case.method.as_str()),
            "method",
        ),
        (field("x-seen-path") == Some(case.path), "path"),
        (field("x-seen-host") == Some("gateway.test"), "host"),
        (field("x-seen-a") == Some("1"), "x-a"),
        (field("x-seen-length") == Some(seen_len.as_str()), "length"),
        (field("x-secret").is_none(), "hop-by-hop"),
        (body.is_some(), "body"),
    ];
    for (ok, what) in checks {
        if !ok {
            return Err(format!("{}: wrong {what}: {got:?}", case.name));
        }
    }
    let body = body.as_deref().unwrap_or_default();
    let empty = case.method == Method::HEAD || want_status == 204 || want_status == 304;
    let want: Vec<u8> = match case.path {
        _ if empty => Vec::new(),
        "/echo" => case.sent.bytes(),
        "/stream" => b"streamed in pieces".to_vec(),
        p if p.starts_with("/big/") => (0..p[5..].parse::<usize>().unwrap())
            .map(|i| b'a' + (i % 26) as u8)
            .collect(),
        _ => b"ok".to_vec(),
    };
    match body == want {
        true => Ok(()),
        false => Err(format!(
            "{}: body of {} bytes differs",
            case.name,
            body.len()
        )),
    }
}

/// What must be the same over every transport: all of it but the SNI
/// the upstream saw (there is none in cleartext).
fn comparable(got: &Got) -> Got {
    match got {
        Got::Answer {
            status,
            fields,
            body,
        } => Got::Answer {
            status: *status,
            fields: fields.iter().filter(|f| f.0 != "x-sni").cloned().collect(),
            body: body.clone(),
        },
        Got::Failed(w) => Got::Failed(w),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_transport_gives_the_proxy_the_same_answers() {
    let dir = scratch("same");
    let ca = certs::TestCa::new(&dir, "ca");
    let leaf = ca.server(&dir, "up", &["localhost", "127.0.0.1"]);
    let both = server_config(&leaf, &[b"h2", b"http/1.1"]);
    let h1_only = server_config(&leaf, &[b"http/1.1"]);
    let (plain, _) = upstream(None).await;
    let (tls, _) = upstream(Some(both)).await;
    let (tls_h1, _) = upstream(Some(h1_only)).await;
    let trust = trusting(&ca.cert_file);
    let none = UpstreamTlsSettings::default();
    let p = |a: SocketAddr| format!("http://{a}");
    let s = |a: SocketAddr| format!("https://localhost:{}", a.port());
    use UpstreamProtocol::*;
    let transports = [
        ("http1", client(&p(plain), &none, Http1), "HTTP/1.1"),
        (
            "auto in cleartext",
            client(&p(plain), &none, Auto),
            "HTTP/1.1",
        ),
        ("h2c", client(&p(plain), &none, Http2), "HTTP/2.0"),
        ("http1 over TLS", client(&s(tls), &trust, Http1), "HTTP/1.1"),
        ("http2 over TLS", client(&s(tls), &trust, Http2), "HTTP/2.0"),
        (
            "auto, h2 offered",
            client(&s(tls), &trust, Auto),
            "HTTP/2.0",
        ),
        (
            "auto, http/1.1 only",
            client(&s(tls_h1), &trust, Auto),
            "HTTP/1.1",
        ),
    ];
    let mut wrong = Vec::new();
    for case in corpus() {
        let mut reference = None;
        for (name, client, version) in &transports {
            let (got, seen) = run(client, &case.method, case.path, case.sent).await;
            if seen.is_some() && seen.as_deref() != Some(*version) {
                wrong.push(format!(
                    "{}: {name} spoke {seen:?}, not {version}",
                    case.name
                ));
            }
            match &reference {
                None => {
                    if let Err(e) = check_reference(&case, &got) {
                        wrong.push(format!("{name}: {e}"));
                    }
                    reference = Some(comparable(&got));
                }
                Some(r) if *r != comparable(&got) => wrong.push(format!(
                    "{}: {name} gave {got:?}, cleartext HTTP/1.1 {r:?}",
                    case.name
                )),
                Some(_) => {}
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_connections_are_verified_named_and_reused() {
    let dir = scratch("verify");
    let ca = certs::TestCa::new(&dir, "ca");
    let other = certs::TestCa::new(&dir, "other");
    let leaf = ca.server(&dir, "up", &["localhost", "127.0.0.1"]);
    let named_only = ca.server(&dir, "named", &["localhost"]);
    let (addr, conns) = upstream(Some(server_config(&leaf, &[b"h2", b"http/1.1"]))).await;
    let (named, _) = upstream(Some(server_config(&named_only, &[b"http/1.1"]))).await;
    let by_name = format!("https://localhost:{}", addr.port());
    let by_ip = format!("https://127.0.0.1:{}", addr.port());
    let sni = |got: &Got| match got {
        Got::Answer { fields, .. } => fields.iter().find(|f| f.0 == "x-sni").map(|f| f.1.clone()),
        _ => None,
    };
    for protocol in [UpstreamProtocol::Http1, UpstreamProtocol::Http2] {
        // a DNS name: sent as SNI
        let got = get(&client(&by_name, &trusting(&ca.cert_file), protocol)).await;
        assert_eq!(sni(&got).as_deref(), Some("localhost"), "{got:?}");
        // an address: no SNI, checked against the address in the certificate
        let got = get(&client(&by_ip, &trusting(&ca.cert_file), protocol)).await;
        assert!(matches!(got, Got::Answer { status: 200, .. }), "{got:?}");
        assert_eq!(sni(&got), None);
        // a certificate without the address in it: refused
        let uri = format!("https://127.0.0.1:{}", named.port());
        let got = get(&client(&uri, &trusting(&ca.cert_file), protocol)).await;
        assert_eq!(got, Got::Failed("connect"));
        // a CA that did not sign it: refused, as a connect failure
        let c = client(&by_name, &trusting(&other.cert_file), protocol);
        assert_eq!(get(&c).await, Got::Failed("connect"));
        // unless verification is off
        let skip = UpstreamTlsSettings {
            insecure_skip_verify_for_tests_only: true,
            ..UpstreamTlsSettings::default()
        };
        assert!(matches!(
            get(&client(&by_name, &skip, protocol)).await,
            Got::Answer { .. }
        ));
    }
    // the rustls reason is in the error
    let c = client(
        &by_name,
        &trusting(&other.cert_file),
        UpstreamProtocol::Http1,
    );
    let (parts, ()) = Request::get("/").body(()).unwrap().into_parts();
    let reached = std::sync::atomic::AtomicBool::new(false);
    let req = Outgoing {
        parts: &parts,
        via: Via::UNKNOWN,
        reached: &reached,
    };
    match c.send(req, Sent::None.body()).await {
        Err(e @ UpstreamError::Connect(_)) => {
            assert!(e.to_string().contains("UnknownIssuer"), "{e}")
        }
        Err(e) => panic!("not a connect failure: {e}"),
        Ok(_) => panic!("an answer through a CA that signed nothing"),
    }
    assert!(
        !reached.load(Ordering::Acquire),
        "a failed handshake sent nothing"
    );

    // one connection carries request after request (TLS 1.3 session
    // tickets arriving while it is idle do not make it look closed)
    for protocol in [UpstreamProtocol::Http1, UpstreamProtocol::Http2] {
        let before = conns.load(Ordering::SeqCst);
        let c = client(&by_name, &trusting(&ca.cert_file), protocol);
        for _ in 0..5 {
            assert!(matches!(get(&c).await, Got::Answer { status: 200, .. }));
        }
        assert_eq!(conns.load(Ordering::SeqCst) - before, 1, "{protocol:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_hands_an_http1_connection_to_the_own_client() {
    let dir = scratch("auto");
    let ca = certs::TestCa::new(&dir, "ca");
    let leaf = ca.server(&dir, "up", &["localhost"]);
    let (addr, conns) = upstream(Some(server_config(&leaf, &[b"http/1.1"]))).await;
    let c = client(
        &format!("https://localhost:{}", addr.port()),
        &trusting(&ca.cert_file),
        UpstreamProtocol::Auto,
    );
    for _ in 0..3 {
        let (got, version) = run(&c, &Method::GET, "/s/200", Sent::None).await;
        assert!(matches!(got, Got::Answer { status: 200, .. }), "{got:?}");
        assert_eq!(version.as_deref(), Some("HTTP/1.1"));
    }
    // the connection that found HTTP/1.1 out carried all three
    assert_eq!(conns.load(Ordering::SeqCst), 1);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `GET /s/200` through `c`: what the proxy gets.
async fn get(c: &UpstreamClient<ReqBody>) -> Got {
    run(c, &Method::GET, "/s/200", Sent::None).await.0
}

/// A pooled TLS connection the upstream closed while it sat idle
/// (`close_notify`, then the end of the stream) is seen closed: a `POST`,
/// which is never sent twice, goes on a new connection and succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_close_while_idle_is_seen_before_reuse() {
    let dir = scratch("close");
    let ca = certs::TestCa::new(&dir, "ca");
    let leaf = ca.server(&dir, "up", &["localhost"]);
    let acceptor = tokio_rustls::TlsAcceptor::from(server_config(&leaf, &[b"http/1.1"]));
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let (closed_tx, mut closed) = tokio::sync::mpsc::channel(4);
    tokio::spawn(async move {
        while let Ok((tcp, _)) = l.accept().await {
            let acceptor = acceptor.clone();
            let closed = closed_tx.clone();
            tokio::spawn(async move {
                let Ok(mut s) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                let _ = s.write_all(ok).await;
                let _ = s.flush().await;
                // then it closes, idle: close_notify and FIN
                let _ = s.shutdown().await;
                let _ = closed.send(()).await;
            });
        }
    });
    let c = client(
        &format!("https://localhost:{port}"),
        &trusting(&ca.cert_file),
        UpstreamProtocol::Http1,
    );
    let post = || run(&c, &Method::POST, "/x", Sent::Whole(b"once"));
    let (got, _) = post().await;
    assert!(matches!(got, Got::Answer { status: 200, .. }), "{got:?}");
    tokio::time::timeout(LIMIT, closed.recv()).await.unwrap();
    // the close is on the client's socket once the server is done with
    // it; a moment for the runtime to have seen it readable (the pool
    // looks only at a socket reported readable, as in cleartext)
    tokio::time::sleep(Duration::from_millis(50)).await;
    let (got, _) = post().await;
    assert!(matches!(got, Got::Answer { status: 200, .. }), "{got:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A handshake counts within the connect deadline: an upstream that takes
/// the TCP connection and never answers the `ClientHello` is a connect
/// failure once `timeouts.connect` has passed, over either version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handshake_that_never_ends_is_a_connect_failure_in_time() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((tcp, _)) = l.accept().await {
            held.push(tcp);
        }
    });
    let t = Timeouts {
        connect: Duration::from_millis(200),
        ..Timeouts::default()
    };
    let uri: Uri = format!("https://localhost:{port}").parse().unwrap();
    let skip = UpstreamTlsSettings {
        insecure_skip_verify_for_tests_only: true,
        ..UpstreamTlsSettings::default()
    };
    for protocol in [UpstreamProtocol::Http1, UpstreamProtocol::Http2] {
        let clock = Arc::new(SystemClock::new());
        let c: UpstreamClient<ReqBody> =
            UpstreamClient::new(&uri, &skip, protocol, &t, clock).unwrap();
        let started = std::time::Instant::now();
        assert_eq!(get(&c).await, Got::Failed("connect"), "{protocol:?}");
        let took = started.elapsed();
        assert!(took >= t.connect && took < LIMIT, "{protocol:?}: {took:?}");
    }
}

/// Under TLS the end of the stream without `close_notify` may be an
/// attacker's cut: a body framed by the end of the connection that ends
/// that way fails, where one ended by `close_notify` is whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_delimited_body_needs_close_notify() {
    let dir = scratch("truncated");
    let ca = certs::TestCa::new(&dir, "ca");
    let leaf = ca.server(&dir, "up", &["localhost"]);
    let acceptor = tokio_rustls::TlsAcceptor::from(server_config(&leaf, &[b"http/1.1"]));
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = l.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut s) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let _ = s.write_all(b"HTTP/1.1 200 OK\r\n\r\nuntil the end").await;
                let _ = s.flush().await;
                if buf.starts_with(b"GET /notify ") {
                    let _ = s.shutdown().await;
                } else {
                    // the TCP connection closed under rustls's feet
                    let (mut tcp, _) = s.into_inner();
                    let _ = tcp.shutdown().await;
                }
            });
        }
    });
    let c = client(
        &format!("https://localhost:{port}"),
        &trusting(&ca.cert_file),
        UpstreamProtocol::Http1,
    );
    let (got, _) = run(&c, &Method::GET, "/notify", Sent::None).await;
    let Got::Answer { body, .. } = got else {
        panic!("{got:?}")
    };
    assert_eq!(body.as_deref(), Some(&b"until the end"[..]));
    let (got, _) = run(&c, &Method::GET, "/cut", Sent::None).await;
    let Got::Answer {
        status: 200, body, ..
    } = got
    else {
        panic!("{got:?}")
    };
    assert_eq!(body, None, "a cut body passed as whole");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The choice of client costs the HTTP/1.1 path a tag in its future and
/// nothing more: the HTTP/2 exchange, much larger, is boxed apart.
#[test]
fn the_http1_exchange_does_not_grow_by_the_choice() {
    let t = Timeouts::default();
    let uri: Uri = "http://127.0.0.1:9".parse().unwrap();
    let none = UpstreamTlsSettings::default();
    let chosen = client("http://127.0.0.1:9", &none, UpstreamProtocol::Http1);
    let own = super::Client::plain(&uri, &t, Arc::new(SystemClock::new()));
    let (parts, ()) = Request::get("/").body(()).unwrap().into_parts();
    let reached = std::sync::atomic::AtomicBool::new(false);
    let req = Outgoing {
        parts: &parts,
        via: Via::UNKNOWN,
        reached: &reached,
    };
    let through_choice = std::mem::size_of_val(&chosen.send(req, Sent::None.body()));
    let direct = std::mem::size_of_val(&own.send(req, Sent::None.body()));
    assert!(
        through_choice <= direct + 16,
        "{through_choice} > {direct} + 16"
    );
}
