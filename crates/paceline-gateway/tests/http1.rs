//! The gateway's own HTTP/1.1 connection (`gateway.http1_server =
//! "paceline"`, the default) against hyper's (`"hyper"`), on loopback over
//! raw TCP: the same bytes sent to both get the same answers, request by
//! request, whichever of the two serves each one; and what the own
//! connection must do as hyper does (pipelining, handing a connection over
//! mid-way, `HEAD`, `Connection: close`, a client that goes away). Every
//! wait is bounded.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

mod common;

use common::{find, next_head, until_closed, Rig, LIMIT};

const SERVERS: [&str; 2] = ["paceline", "hyper"];

/// One answer read off a connection: its status line, its fields (names
/// lowercased, `date` left out, in order) and its body.
#[derive(Debug, PartialEq)]
struct Answer {
    status: String,
    fields: Vec<(String, String)>,
    body: Vec<u8>,
}

/// Reads answers off `buf` (what a connection sent until it closed) for
/// requests whose methods are `methods`, in order.
fn answers(mut buf: &[u8], methods: &[&str]) -> Vec<Answer> {
    let mut out = Vec::new();
    for method in methods {
        let Some(end) = find(buf, b"\r\n\r\n") else {
            break;
        };
        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
        buf = &buf[end + 4..];
        let mut lines = head.split("\r\n");
        let status = lines.next().unwrap_or_default().to_string();
        let mut fields = Vec::new();
        let mut length = 0;
        let mut chunked = false;
        for l in lines {
            let (n, v) = l.split_once(':').expect("a field");
            let (n, v) = (n.to_ascii_lowercase(), v.trim().to_string());
            if n == "content-length" {
                length = v.parse().unwrap();
            }
            chunked |= n == "transfer-encoding" && v == "chunked";
            if n != "date" {
                fields.push((n, v));
            }
        }
        let mut body = Vec::new();
        if *method != "HEAD" && !status.contains(" 204 ") && !status.contains(" 304 ") {
            if chunked {
                loop {
                    let eol = find(buf, b"\r\n").expect("a chunk size");
                    let size = usize::from_str_radix(std::str::from_utf8(&buf[..eol]).unwrap(), 16)
                        .unwrap();
                    buf = &buf[eol + 2..];
                    if size == 0 {
                        buf = &buf[2..];
                        break;
                    }
                    body.extend_from_slice(&buf[..size]);
                    buf = &buf[size + 2..];
                }
            } else {
                body.extend_from_slice(&buf[..length]);
                buf = &buf[length..];
            }
        }
        out.push(Answer {
            status,
            fields,
            body,
        });
    }
    out
}

/// Sends `bytes` on a new connection to a gateway whose HTTP/1.1 is
/// `server`'s, and reads until the gateway closes it.
async fn exchange(server: &str, bytes: &[u8]) -> (Vec<u8>, usize) {
    let rig = Rig::start(&format!("http1_server = \"{server}\""), 100).await;
    let mut s = TcpStream::connect(rig.addr).await.unwrap();
    s.write_all(bytes).await.unwrap();
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(LIMIT, s.read_to_end(&mut buf))
        .await
        .expect("closed in time");
    let seen = rig.seen.load(Ordering::SeqCst);
    rig.stop().await;
    (buf, seen)
}

const GET: &str = "GET /v1/rates HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer sk_a\r\n\r\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_requests_get_the_same_answers_from_both_servers() {
    // bodiless requests served here, then a body (handed over to hyper
    // mid-connection), then more, the last one closing
    let post = "POST /v1/rates HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer sk_a\r\ncontent-length: 3\r\n\r\nabc";
    let head = "HEAD /v1/rates HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer sk_a\r\n\r\n";
    let unknown = "GET /v1/rates HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer sk_nobody\r\n\r\n";
    let close =
        "GET /v1/rates HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer sk_a\r\nconnection: close\r\n\r\n";
    let bytes = [GET, head, unknown, GET, post, GET, close].concat();
    let methods = ["GET", "HEAD", "GET", "GET", "POST", "GET", "GET"];
    let mut seen = Vec::new();
    for server in SERVERS {
        let (buf, upstream) = exchange(server, bytes.as_bytes()).await;
        let got = answers(&buf, &methods);
        assert_eq!(
            got.len(),
            methods.len(),
            "{server}: {}",
            String::from_utf8_lossy(&buf)
        );
        let statuses: Vec<&str> = got.iter().map(|a| &a.status[9..12]).collect();
        assert_eq!(
            statuses,
            ["200", "200", "401", "200", "200", "200", "200"],
            "{server}"
        );
        // the last answer says the connection ends with it
        assert!(
            got[6]
                .fields
                .contains(&("connection".into(), "close".into())),
            "{server}: {:?}",
            got[6]
        );
        // `HEAD` carries the length of what `GET` would, no body
        assert_eq!(got[1].body, b"");
        assert!(
            got[1]
                .fields
                .contains(&("content-length".into(), "2".into())),
            "{server}: {:?}",
            got[1]
        );
        assert_eq!(got[0].body, b"ok");
        seen.push((got, upstream));
    }
    let (own, hyper) = (&seen[0], &seen[1]);
    assert_eq!(own.1, hyper.1, "the upstream saw as many heads");
    for (i, (a, b)) in own.0.iter().zip(&hyper.0).enumerate() {
        // the fields hyper writes, in the order it writes them, but for
        // the RateLimit fields' reset times (`t`), which move with the
        // clock between the two runs
        let strip = |a: &Answer| Answer {
            status: a.status.clone(),
            fields: a
                .fields
                .iter()
                .filter(|(n, _)| n != "ratelimit")
                .cloned()
                .collect(),
            body: a.body.clone(),
        };
        let (mut a, mut b) = (strip(a), strip(b));
        a.fields.sort();
        b.fields.sort();
        assert_eq!(a, b, "answer {i}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_the_own_connection_does_not_serve_are_served_as_hyper_serves_them() {
    let cases: [(&str, &[&str]); 4] = [
        // HTTP/1.0 without keep-alive: answered, then closed
        (
            "GET /v1/rates HTTP/1.0\r\nauthorization: Bearer sk_a\r\n\r\n",
            &["GET"],
        ),
        // a head hyper refuses, after one served here
        (
            "GET /v1/rates HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer sk_a\r\n\r\nGET /v1/rates HTTP/1.1\r\nhost: gw\r\ncontent-length: x\r\n\r\n",
            &["GET", "GET"],
        ),
        // a body announced with `Expect: 100-continue`, sent at once
        (
            "POST /v1/rates HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer sk_a\r\nexpect: 100-continue\r\ncontent-length: 2\r\nconnection: close\r\n\r\nhi",
            &["POST"],
        ),
        // CONNECT
        (
            "CONNECT gw:443 HTTP/1.1\r\nhost: gw:443\r\nauthorization: Bearer sk_a\r\n\r\n",
            &["CONNECT"],
        ),
    ];
    for (bytes, methods) in cases {
        let mut all = Vec::new();
        for server in SERVERS {
            // each ends with a closed connection
            let (buf, seen) = exchange(server, bytes.as_bytes()).await;
            // an interim 100 is not an answer of its own here
            let text = String::from_utf8_lossy(&buf).replace("HTTP/1.1 100 Continue\r\n\r\n", "");
            let mut got = answers(text.as_bytes(), methods);
            for a in &mut got {
                a.fields.retain(|(n, _)| n != "ratelimit");
                a.fields.sort();
            }
            assert_eq!(got.len(), methods.len(), "{server}: {bytes:?} got {text}");
            all.push((got, seen));
        }
        assert_eq!(all[0], all[1], "{bytes:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_has_its_request_dropped() {
    for server in SERVERS {
        let rig = Rig::start(
            &format!("http1_server = \"{server}\"\n[gateway.shedding]\nmax_in_flight = 100"),
            100,
        )
        .await;
        let shedder = rig.handle.shedder().clone();
        let mut s = TcpStream::connect(rig.addr).await.unwrap();
        let stall = GET.replace("/v1/rates", "/stall");
        s.write_all(stall.as_bytes()).await.unwrap();
        let waited = tokio::time::timeout(LIMIT, async {
            while shedder.in_flight() == 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        assert!(waited.is_ok(), "{server}: the request reached the upstream");
        drop(s);
        let gone = tokio::time::timeout(LIMIT, async {
            while shedder.in_flight() > 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        assert!(
            gone.is_ok(),
            "{server}: the request was dropped with its client"
        );
        rig.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_connection_ends_at_a_graceful_shutdown() {
    for server in SERVERS {
        let rig = Rig::start(&format!("http1_server = \"{server}\""), 100).await;
        let mut s = TcpStream::connect(rig.addr).await.unwrap();
        s.write_all(GET.as_bytes()).await.unwrap();
        let mut buf = vec![0u8; 12];
        tokio::time::timeout(LIMIT, s.read_exact(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&buf, b"HTTP/1.1 200");
        let handle = rig.handle.clone();
        handle.shutdown();
        // the connection waited for its next head: it is closed at once,
        // not at the end of the client header bound (10 s) or of the
        // shutdown's (30 s)
        let mut rest = Vec::new();
        tokio::time::timeout(Duration::from_secs(2), s.read_to_end(&mut rest))
            .await
            .expect("closed at the shutdown")
            .unwrap();
        let served = tokio::time::timeout(LIMIT, rig.served)
            .await
            .expect("the gateway ended");
        assert!(served.unwrap().is_ok(), "{server}");
    }
}

#[test]
fn a_bad_http1_server_is_a_config_error() {
    let text = "[gateway]\nlisten = \"127.0.0.1:0\"\nupstream = \"http://127.0.0.1:1\"\nhttp1_server = \"nginx\"\n";
    let e = paceline_gateway::GatewayConfig::parse(text, "x.toml", None).unwrap_err();
    let said = e.to_string();
    assert!(said.contains("gateway.http1_server"), "{said}");
    assert!(said.contains("\"paceline\" or \"hyper\""), "{said}");
}

/// An upstream that answers every request with a body in chunks of 1, 16
/// and 300 bytes (and, to `HEAD`, the head alone), then keeps the
/// connection.
async fn chunked_upstream() -> std::net::SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    let Some(head) = next_head(&mut s, &mut buf).await else {
                        return;
                    };
                    let mut answer =
                        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
                    if !head.starts_with(b"HEAD ") {
                        for size in [1usize, 16, 300] {
                            answer.extend_from_slice(format!("{size:x}\r\n").as_bytes());
                            answer.extend(std::iter::repeat_n(b'a' + (size % 26) as u8, size));
                            answer.extend_from_slice(b"\r\n");
                        }
                        answer.extend_from_slice(b"0\r\n\r\n");
                    }
                    if s.write_all(&answer).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_of_unknown_length_goes_on_in_chunks_from_both_servers() {
    let up = chunked_upstream().await;
    let bytes = [GET, GET, &GET.replace("GET ", "HEAD "), GET].concat();
    let bytes = bytes.replacen(
        "authorization: Bearer sk_a\r\n\r\n",
        "authorization: Bearer sk_a\r\nconnection: keep-alive\r\n\r\n",
        3,
    ) + "GET /v1/rates HTTP/1.1\r\nhost: gw\r\nconnection: close\r\n\r\n";
    let methods = ["GET", "GET", "HEAD", "GET", "GET"];
    let mut all = Vec::new();
    for server in SERVERS {
        let text = format!(
            "[gateway]\nlisten = \"127.0.0.1:0\"\nupstream = \"http://{up}\"\nwatch = false\nhttp1_server = \"{server}\"\n\n[plans.free]\npolicies = [{{ name = \"burst\", algorithm = \"token_bucket\", q = 100, w = 3600 }}]\n\n[keys]\nsk_a = \"free\"\n"
        );
        let cfg = paceline_gateway::GatewayConfig::parse(&text, "rig.toml", None).unwrap();
        let gw = paceline_gateway::Gateway::bind(cfg).await.unwrap();
        let (addr, handle) = (gw.local_addr(), gw.handle());
        let served = tokio::spawn(gw.run(std::future::pending()));
        let buf = until_closed(addr, bytes.as_bytes()).await;
        handle.shutdown();
        let _ = tokio::time::timeout(LIMIT, served).await;
        let mut got = answers(&buf, &methods);
        assert_eq!(
            got.len(),
            methods.len(),
            "{server}: {}",
            String::from_utf8_lossy(&buf)
        );
        let body: Vec<u8> = [(1usize, b'b'), (16, b'q'), (300, b'o')]
            .iter()
            .flat_map(|&(n, c)| std::iter::repeat_n(c, n))
            .collect();
        for (i, a) in got.iter_mut().enumerate() {
            a.fields.retain(|(n, _)| n != "ratelimit");
            a.fields.sort();
            if methods[i] == "GET" && a.status.contains(" 200 ") {
                assert_eq!(a.body, body, "{server}: answer {i}");
                assert!(
                    a.fields
                        .contains(&("transfer-encoding".into(), "chunked".into())),
                    "{server}: {:?}",
                    a.fields
                );
            }
        }
        // the last request had no key: 401, and the connection closed
        assert!(got[4].status.contains(" 401 "), "{server}: {:?}", got[4]);
        all.push(got);
    }
    for (i, (a, b)) in all[0].iter().zip(&all[1]).enumerate() {
        assert_eq!(
            (&a.status, &a.fields),
            (&b.status, &b.fields),
            "answer {i}, own against hyper"
        );
        assert!(a.body == b.body, "answer {i}'s body, own against hyper");
    }
}

/// A client that sends requests and never reads the answers does not hold
/// its connection, a request always in flight, for ever: once the answers
/// fill the sockets' buffers, the gateway waits `body_idle_ms` for the
/// client to take more of them, then closes it (and the client's next
/// write fails). The own connection bounds its writes, and so does the
/// socket it hands to hyper.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_is_let_go() {
    for server in SERVERS {
        let lines = format!("http1_server = \"{server}\"\ntimeouts = {{ body_idle_ms = 300 }}");
        let rig = Rig::start(&lines, 1).await;
        let mut s = TcpStream::connect(rig.addr).await.unwrap();
        // the key's one request spent, every answer is a 429 of a few
        // hundred bytes: a few megabytes of them fill the buffers
        let burst = GET.repeat(1_000);
        let mut sent = 0usize;
        let started = std::time::Instant::now();
        let refused = tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                if let Err(e) = s.write_all(burst.as_bytes()).await {
                    return e;
                }
                sent += 1_000;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{server}: the gateway let the connection go within 30 s"));
        assert!(
            matches!(
                refused.kind(),
                std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
            ),
            "{server}: {refused:?} after {sent} requests"
        );
        assert!(
            sent >= 1_000,
            "{server}: {sent} requests sent before the close"
        );
        // by the write bound, well before the idle bound (10 s) would
        // close a connection whose answers sit in a buffer, none in flight
        let took = started.elapsed();
        assert!(
            took < Duration::from_secs(5),
            "{server}: closed after {took:?}"
        );
        rig.stop().await;
    }
}
