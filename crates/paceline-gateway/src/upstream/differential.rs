//! The own client and hyper's held against each other: one corpus of
//! scripted upstream answers, well-formed and hostile, each sent through
//! both [`Upstream`]s to a raw TCP upstream on loopback, comparing what the
//! proxy would get of it: the status, the end-to-end fields, the body
//! bytes and trailers, or the kind of failure. Where the two differ on
//! purpose, the case says what each gives and why. The own client runs
//! the corpus over TLS too, where it must give what it gives in
//! cleartext. (The corpus is HTTP/1.1 bytes on the wire: the HTTP/2
//! client is held against the others in `transports.rs` instead.)

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Uri};
use http_body_util::{BodyExt, Full};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use super::hyper::HyperClient;
use super::{strip_hop_by_hop, Answer, Client, Outgoing, Upstream, UpstreamError, Via};
use crate::config::Timeouts;

/// The bound on one case through one client, from connecting to the end
/// of the body.
const LIMIT: Duration = Duration::from_secs(5);

/// Field names and values, in order.
type Fields = Vec<(String, String)>;

/// What the proxy gets from an upstream client.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Got {
    /// A final answer.
    Answer {
        status: u16,
        /// The end-to-end fields, as the proxy passes them on, in order.
        fields: Fields,
        /// The body's bytes and trailer fields, or `None` when the body
        /// failed.
        body: Option<(Vec<u8>, Fields)>,
    },
    /// No answer; the proxy answers for it.
    Failed(Class),
}

/// The kinds of failure the proxy answers differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// No connection: `502`, "could not be reached".
    Unreachable,
    /// The upstream failed or broke the protocol before a usable answer:
    /// `502`, "failed before answering".
    Upstream,
}

/// One scripted exchange.
struct Case {
    name: &'static str,
    method: Method,
    /// The request body.
    body: &'static [u8],
    /// What the upstream writes once it has read the request head.
    wire: Vec<u8>,
    /// The upstream closes the connection after writing (else it holds it
    /// open until the client goes).
    close: bool,
    /// What the proxy gets from the own client.
    own: Got,
    /// What it gets from hyper's, where that differs, and why.
    hyper: Option<(Got, &'static str)>,
}

fn fields(list: &[(&str, &str)]) -> Fields {
    list.iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect()
}

/// An answer whose body arrives whole.
fn whole(status: u16, f: &[(&str, &str)], body: &[u8]) -> Got {
    Got::Answer {
        status,
        fields: fields(f),
        body: Some((body.to_vec(), Vec::new())),
    }
}

/// An answer whose body fails.
fn broken(status: u16, f: &[(&str, &str)]) -> Got {
    Got::Answer {
        status,
        fields: fields(f),
        body: None,
    }
}

const FAILED: Got = Got::Failed(Class::Upstream);

fn case(name: &'static str, wire: &[u8], own: Got) -> Case {
    Case {
        name,
        method: Method::GET,
        body: b"",
        wire: wire.to_vec(),
        close: false,
        own,
        hyper: None,
    }
}

impl Case {
    fn closing(mut self) -> Case {
        self.close = true;
        self
    }

    fn method(mut self, m: Method) -> Case {
        self.method = m;
        self
    }

    fn post(mut self, body: &'static [u8]) -> Case {
        self.method = Method::POST;
        self.body = body;
        self
    }

    fn hyper(mut self, got: Got, why: &'static str) -> Case {
        self.hyper = Some((got, why));
        self
    }
}

fn corpus() -> Vec<Case> {
    let big_field = |kib: usize| {
        let mut w = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-big: ".to_vec();
        w.extend(std::iter::repeat_n(b'a', kib * 1024));
        w.extend_from_slice(b"\r\n\r\nok");
        w
    };
    let many_fields = {
        let mut w = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n".to_vec();
        for i in 0..120 {
            w.extend_from_slice(format!("x-f{i}: {i}\r\n").as_bytes());
        }
        w.extend_from_slice(b"\r\nok");
        w
    };
    let long_trailers = {
        let mut w =
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n".to_vec();
        for i in 0..400 {
            w.extend_from_slice(format!("x-t{i}: {}\r\n", "v".repeat(40)).as_bytes());
        }
        w.extend_from_slice(b"\r\n");
        w
    };
    vec![
        case(
            "content-length",
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-a: 1\r\nx-a: 2\r\n\r\nok",
            whole(
                200,
                &[("content-length", "2"), ("x-a", "1"), ("x-a", "2")],
                b"ok",
            ),
        ),
        case(
            "a POST with a body",
            b"HTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\nok",
            whole(201, &[("content-length", "2")], b"ok"),
        )
        .post(b"hello"),
        case(
            "an empty POST",
            b"HTTP/1.1 204 No Content\r\n\r\n",
            whole(204, &[], b""),
        )
        .post(b""),
        case(
            "no reason phrase",
            b"HTTP/1.1 201\r\ncontent-length: 0\r\n\r\n",
            whole(201, &[("content-length", "0")], b""),
        ),
        case(
            "chunked with extensions and trailers",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n\
              1;a=\"b\"\r\n \r\n6\r\nworld!\r\n0\r\nx-t: 1\r\n\r\n",
            whole(200, &[], b"hello world!"),
        )
        .hyper(
            Got::Answer {
                status: 200,
                fields: Vec::new(),
                body: Some((b"hello world!".to_vec(), fields(&[("x-t", "1")]))),
            },
            "hyper hands trailer fields on; the own client skips them (their \
             bytes bounded), as nothing declared them to the client",
        ),
        case(
            "close-delimited",
            b"HTTP/1.1 200 OK\r\nx-a: 1\r\n\r\nuntil the end",
            whole(200, &[("x-a", "1")], b"until the end"),
        )
        .closing(),
        case(
            "HTTP/1.0 with a length",
            b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nok",
            whole(200, &[("content-length", "2")], b"ok"),
        )
        .closing(),
        case(
            "interim answers first",
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n\
              HTTP/1.1 201 Created\r\ncontent-length: 4\r\n\r\ndone",
            whole(201, &[("content-length", "4")], b"done"),
        ),
        case(
            "204 without a body",
            b"HTTP/1.1 204 No Content\r\nx-a: 1\r\n\r\n",
            whole(204, &[("x-a", "1")], b""),
        ),
        case(
            "304 with a length and no body",
            b"HTTP/1.1 304 Not Modified\r\ncontent-length: 5\r\n\r\n",
            whole(304, &[("content-length", "5")], b""),
        ),
        case(
            "HEAD with a length and no body",
            b"HTTP/1.1 200 OK\r\ncontent-length: 7\r\n\r\n",
            whole(200, &[("content-length", "7")], b""),
        )
        .method(Method::HEAD),
        case(
            "hop-by-hop fields stay behind",
            b"HTTP/1.1 200 OK\r\nconnection: keep-alive, x-secret\r\nkeep-alive: timeout=5\r\n\
              x-secret: 1\r\nproxy-authenticate: Basic\r\ncontent-length: 2\r\nx-a: 1\r\n\r\nok",
            whole(200, &[("content-length", "2"), ("x-a", "1")], b"ok"),
        ),
        case(
            "connection: close",
            b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok",
            whole(200, &[("content-length", "2")], b"ok"),
        )
        .closing(),
        case(
            "duplicated equal lengths",
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 2\r\n\r\nok",
            whole(
                200,
                &[("content-length", "2"), ("content-length", "2")],
                b"ok",
            ),
        ),
        case(
            "a list of equal lengths",
            b"HTTP/1.1 200 OK\r\ncontent-length: 2, 2\r\n\r\nok",
            whole(200, &[("content-length", "2, 2")], b"ok"),
        ),
        case(
            "conflicting lengths",
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\nok",
            FAILED,
        ),
        case(
            "a negative length",
            b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
            FAILED,
        ),
        case(
            "a signed length",
            b"HTTP/1.1 200 OK\r\ncontent-length: +2\r\n\r\nok",
            FAILED,
        ),
        case(
            "a length past u64",
            b"HTTP/1.1 200 OK\r\ncontent-length: 99999999999999999999\r\n\r\n",
            FAILED,
        ),
        case(
            "a length beside chunks",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n\
              b\r\nhello world\r\n0\r\n\r\n",
            whole(200, &[], b"hello world"),
        )
        .hyper(
            whole(200, &[("content-length", "3")], b"hello world"),
            "both frame the body by its chunks, but hyper leaves the length in \
             the fields, where it would misframe the body on its way to the \
             client; the own client drops it (RFC 9112 §6.3)",
        ),
        case(
            "a bad chunk size",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
            broken(200, &[]),
        ),
        case(
            "a chunk size past u64",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n11111111111111111\r\n",
            broken(200, &[]),
        ),
        case(
            "a chunk without its CRLF",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhelloX\r\n0\r\n\r\n",
            broken(200, &[]),
        ),
        case(
            "a bare LF after a chunk size",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n",
            broken(200, &[]),
        ),
        case(
            "trailers past their bound",
            &long_trailers,
            broken(200, &[]),
        ),
        case(
            "a body cut short of its length",
            b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc",
            broken(200, &[("content-length", "10")]),
        )
        .closing(),
        case(
            "chunks cut short",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhel",
            broken(200, &[]),
        )
        .closing(),
        case(
            "closed before any byte",
            b"",
            FAILED,
        )
        .closing(),
        case(
            "closed inside the head",
            b"HTTP/1.1 200 OK\r\ncontent-le",
            FAILED,
        )
        .closing(),
        case("a head past 64 KiB", &big_field(256), FAILED).hyper(
            whole(
                200,
                &[("content-length", "2"), ("x-big", "<262144 bytes>")],
                b"ok",
            ),
            "hyper buffers heads up to 400 KiB; the own client gives up on a \
             head still incomplete past 64 KiB",
        ),
        case("a head past 400 KiB", &big_field(512), FAILED),
        case("too many fields", &many_fields, FAILED),
        case(
            "a transfer coding other than chunked",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\nxyz",
            FAILED,
        )
        .closing()
        .hyper(
            whole(200, &[], b"xyz"),
            "hyper reads the coded body to the close and hands it on, its \
             coding named only in a hop-by-hop field that does not travel: \
             the client would take gzip for the body; the own client refuses",
        ),
        case(
            "a coding under the chunks",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n3\r\nxyz\r\n0\r\n\r\n",
            FAILED,
        )
        .hyper(
            whole(200, &[], b"xyz"),
            "hyper takes off the chunks and hands on the gzip under them, \
             unnamed once the hop-by-hop field is gone; the own client refuses",
        ),
        case(
            "chunked twice",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked, chunked\r\n\r\n3\r\nxyz\r\n0\r\n\r\n",
            FAILED,
        )
        .hyper(
            whole(200, &[], b"xyz"),
            "hyper decodes one layer of chunks; chunked applied twice is not \
             allowed (RFC 9112 §7), so the own client refuses the framing",
        ),
        case(
            "transfer-encoding in HTTP/1.0",
            b"HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nxyz\r\n0\r\n\r\n",
            FAILED,
        )
        .closing(),
        case(
            "obs-fold",
            b"HTTP/1.1 200 OK\r\nx-a: 1\r\n  continued\r\ncontent-length: 2\r\n\r\nok",
            FAILED,
        ),
        case(
            "a space before the colon",
            b"HTTP/1.1 200 OK\r\ncontent-length : 2\r\n\r\nok",
            FAILED,
        ),
        case(
            "switching protocols",
            b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n",
            FAILED,
        )
        .hyper(
            whole(101, &[], b""),
            "hyper gives the switch as an answer for its caller to upgrade; \
             the proxy tunnels nothing, so the own client refuses it",
        ),
        case("a bad status", b"HTTP/1.1 2x0 What\r\n\r\n", FAILED),
        case("not HTTP", b"SMTP ready\r\n\r\n", FAILED).closing(),
    ]
}

/// Accepts one connection (under TLS if `tls` says so), reads a request
/// head and hands it to `seen`, writes `wire`, and closes or holds the
/// connection as `close` says.
async fn scripted(
    l: TcpListener,
    tls: Option<TlsAcceptor>,
    wire: Vec<u8>,
    close: bool,
    seen: tokio::sync::oneshot::Sender<Vec<u8>>,
) {
    let Ok((conn, _)) = l.accept().await else {
        return;
    };
    match tls {
        None => script(conn, wire, close, seen).await,
        Some(tls) => {
            if let Ok(conn) = tls.accept(conn).await {
                script(conn, wire, close, seen).await
            }
        }
    }
}

/// The upstream's side of one scripted exchange on `conn`.
async fn script<S: AsyncRead + AsyncWrite + Unpin>(
    mut conn: S,
    wire: Vec<u8>,
    close: bool,
    seen: tokio::sync::oneshot::Sender<Vec<u8>>,
) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match conn.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap_or(0);
    buf.truncate(end + 4);
    let _ = seen.send(buf);
    if conn.write_all(&wire).await.is_err() {
        return;
    }
    if close {
        // the end of the stream (under TLS, `close_notify` first)
        let _ = conn.shutdown().await;
        return;
    }
    hold(conn).await;
}

/// Keeps a connection open until the other side goes.
async fn hold<S: AsyncRead + Unpin>(mut conn: S) {
    let mut chunk = [0u8; 4096];
    while let Ok(n) = conn.read(&mut chunk).await {
        if n == 0 {
            return;
        }
    }
}

/// The fields of `h` in order; a long value stands as its length.
fn pairs(h: &http::HeaderMap) -> Fields {
    h.iter()
        .map(|(n, v)| {
            let v = match v.len() {
                0..=100 => String::from_utf8_lossy(v.as_bytes()).into_owned(),
                n => format!("<{n} bytes>"),
            };
            (n.as_str().to_string(), v)
        })
        .collect()
}

/// What the proxy gets from `client` for a `method` request.
async fn run<U: Upstream<Full<Bytes>>>(client: &U, method: &Method, body: &'static [u8]) -> Got {
    let (parts, ()) = Request::builder()
        .method(method.clone())
        .uri("/x")
        .header("host", "gateway.test")
        .body(())
        .unwrap()
        .into_parts();
    let reached = std::sync::atomic::AtomicBool::new(false);
    let req = Outgoing {
        parts: &parts,
        via: Via::UNKNOWN,
        reached: &reached,
    };
    let answer = match client.send(req, Full::new(Bytes::from_static(body))).await {
        Ok(a) => a,
        Err(UpstreamError::Connect(_)) => return Got::Failed(Class::Unreachable),
        Err(UpstreamError::RequestBody(e)) => panic!("no request body to fail: {e}"),
        Err(_) => return FAILED,
    };
    let Answer {
        status,
        mut headers,
        body,
        ..
    } = answer;
    strip_hop_by_hop(&mut headers);
    let body = body.collect().await.ok().map(|c| {
        let trailers = c.trailers().map(pairs).unwrap_or_default();
        (c.to_bytes().to_vec(), trailers)
    });
    Got::Answer {
        status: status.as_u16(),
        fields: pairs(&headers),
        body,
    }
}

/// Runs a case through one client made by `make` for its upstream: what
/// the proxy gets, and the request head the upstream read.
async fn through<U, F>(case: &Case, make: F) -> (Got, Vec<u8>)
where
    U: Upstream<Full<Bytes>>,
    F: FnOnce(&Uri, &Timeouts) -> U,
{
    through_on(case, None, make).await
}

/// [`through`], the upstream `https://localhost` with `tls` when given.
async fn through_on<U, F>(case: &Case, tls: Option<TlsAcceptor>, make: F) -> (Got, Vec<u8>)
where
    U: Upstream<Full<Bytes>>,
    F: FnOnce(&Uri, &Timeouts) -> U,
{
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let uri: Uri = match tls {
        None => format!("http://127.0.0.1:{port}"),
        Some(_) => format!("https://localhost:{port}"),
    }
    .parse()
    .unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let upstream = tokio::spawn(scripted(l, tls, case.wire.clone(), case.close, tx));
    let client = make(&uri, &Timeouts::default());
    let got = tokio::time::timeout(LIMIT, run(&client, &case.method, case.body))
        .await
        .unwrap_or_else(|_| panic!("{}: no outcome within {LIMIT:?}", case.name));
    upstream.abort();
    // the head was read before any answer was written
    let head = rx.await.unwrap_or_default();
    (got, head)
}

fn own(uri: &Uri, t: &Timeouts) -> Client {
    Client::plain(
        uri,
        t,
        std::sync::Arc::new(paceline_core::SystemClock::new()),
    )
}

fn hyper(uri: &Uri, t: &Timeouts) -> HyperClient<Full<Bytes>> {
    HyperClient::new(uri, t)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_clients_give_the_proxy_what_the_corpus_says() {
    let mut wrong = Vec::new();
    for case in corpus() {
        let (ours, sent) = through(&case, own).await;
        let (theirs, hyper_sent) = through(&case, hyper).await;
        if !sent.starts_with(case.method.as_str().as_bytes()) || !sent.ends_with(b"\r\n\r\n") {
            wrong.push(format!("{}: no request head read", case.name));
        }
        if sent != hyper_sent {
            wrong.push(format!(
                "{}: the own client sent {:?}, hyper {:?}",
                case.name,
                String::from_utf8_lossy(&sent),
                String::from_utf8_lossy(&hyper_sent)
            ));
        }
        let (expected, why) = match &case.hyper {
            Some((got, why)) => (got, *why),
            None => (&case.own, "the same"),
        };
        if ours != case.own {
            wrong.push(format!(
                "{}: own client gave {ours:?}, expected {:?}",
                case.name, case.own
            ));
        }
        if theirs != *expected {
            wrong.push(format!(
                "{}: hyper gave {theirs:?}, expected {expected:?} ({why})",
                case.name
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[tokio::test]
async fn an_upstream_that_is_not_there_is_unreachable_for_both() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let uri: Uri = format!("http://{}", l.local_addr().unwrap())
        .parse()
        .unwrap();
    drop(l);
    let t = Timeouts::default();
    let ours = tokio::time::timeout(LIMIT, run(&own(&uri, &t), &Method::GET, b"")).await;
    let theirs = tokio::time::timeout(LIMIT, run(&hyper(&uri, &t), &Method::GET, b"")).await;
    assert_eq!(ours.unwrap(), Got::Failed(Class::Unreachable));
    assert_eq!(theirs.unwrap(), Got::Failed(Class::Unreachable));
}

/// The own client reads the same bytes the same way under TLS: every
/// case over TLS (the upstream ending its stream with `close_notify`)
/// gives what it gives in cleartext, from the same request head.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_own_client_over_tls_gives_the_proxy_what_the_corpus_says() {
    use crate::config::{UpstreamProtocol, UpstreamTlsSettings};
    use crate::upstream::test_certs::{server_config, TestCa};
    use crate::upstream::UpstreamClient;

    let dir = std::env::temp_dir().join(format!("paceline-differential-{}", std::process::id()));
    let ca = TestCa::new(&dir, "ca");
    let leaf = ca.server(&dir, "up", &["localhost"]);
    let acceptor = TlsAcceptor::from(server_config(&leaf, &[b"http/1.1"]));
    let trust = UpstreamTlsSettings {
        ca_file: Some(ca.cert_file.clone()),
        ..UpstreamTlsSettings::default()
    };
    let tls_client = |uri: &Uri, t: &Timeouts| {
        let clock = std::sync::Arc::new(paceline_core::SystemClock::new());
        UpstreamClient::<Full<Bytes>>::new(uri, &trust, UpstreamProtocol::Http1, t, clock).unwrap()
    };
    let mut wrong = Vec::new();
    for case in corpus() {
        let (_, plain_sent) = through(&case, own).await;
        let (got, sent) = through_on(&case, Some(acceptor.clone()), tls_client).await;
        if sent != plain_sent {
            wrong.push(format!(
                "{}: over TLS the head was {:?}, in cleartext {:?}",
                case.name,
                String::from_utf8_lossy(&sent),
                String::from_utf8_lossy(&plain_sent)
            ));
        }
        if got != case.own {
            wrong.push(format!(
                "{}: over TLS the own client gave {got:?}, expected {:?}",
                case.name, case.own
            ));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Cases whose answers differ name why, and only they do.
#[test]
fn every_difference_says_why() {
    for case in corpus() {
        if let Some((got, why)) = &case.hyper {
            assert_ne!(*got, case.own, "{}: a difference that is none", case.name);
            assert!(!why.is_empty(), "{}", case.name);
        }
    }
}
