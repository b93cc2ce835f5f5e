//! The request-head parser against hyper's server: the same bytes given to
//! both, every head either both take (with the same method, target,
//! version, fields and body) or both refuse, except where the gateway is
//! stricter on purpose (the framing refusals of `request.rs`).

use std::convert::Infallible;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use http::{Request, Response};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use proptest::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::request::parse_request;
use crate::upstream::{Framing, Step};

const MAX_HEAD: usize = 16 * 1024;

/// What a server made of the bytes: a request with its whole body, or
/// nothing it would serve (refused, or incomplete when the client stopped).
#[derive(Debug, PartialEq)]
enum Read {
    Request {
        method: String,
        target: String,
        version: http::Version,
        fields: Vec<(String, Vec<u8>)>,
        body: Vec<u8>,
    },
    Nothing,
}

fn read_of(parts: &http::request::Parts, body: &[u8]) -> Read {
    Read::Request {
        method: parts.method.to_string(),
        target: parts.uri.to_string(),
        version: parts.version,
        fields: parts
            .headers
            .iter()
            .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
            .collect(),
        body: body.to_vec(),
    }
}

/// What the gateway's parser and framing make of `bytes`.
fn ours(bytes: &[u8]) -> Read {
    let mut buf = BytesMut::from(bytes);
    let Ok(Some(head)) = parse_request(&mut buf, MAX_HEAD) else {
        return Read::Nothing;
    };
    let mut framing = head.framing.clone();
    let mut body = Vec::new();
    loop {
        match framing.decode(&mut buf) {
            Ok(Step::Data(d)) => body.extend_from_slice(&d),
            Ok(Step::End) => break,
            Ok(Step::NeedMore) | Err(_) => return Read::Nothing,
        }
    }
    debug_assert!(!matches!(framing, Framing::Close));
    read_of(&head.parts, &body)
}

/// What hyper's HTTP/1 server, set up as the gateway sets it up, hands its
/// service for `bytes` (the client's side shut after them).
async fn hypers(bytes: &[u8]) -> Read {
    let (mut client, server) = tokio::io::duplex(1 << 20);
    let seen: Arc<Mutex<Option<Read>>> = Arc::default();
    let saw = seen.clone();
    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
        let saw = saw.clone();
        async move {
            let (parts, body) = req.into_parts();
            if let Ok(b) = body.collect().await {
                *saw.lock() = Some(read_of(&parts, &b.to_bytes()));
            }
            Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new()))
        }
    });
    // the client shuts its side once it has sent everything: hyper must
    // not take that for the client going away before it served the head
    let conn = hyper::server::conn::http1::Builder::new()
        .max_buf_size(MAX_HEAD)
        .half_close(true)
        .serve_connection(TokioIo::new(server), svc);
    let task = tokio::spawn(conn);
    client.write_all(bytes).await.unwrap();
    client.shutdown().await.unwrap();
    let mut out = Vec::new();
    let _ = client.read_to_end(&mut out).await;
    let _ = task.await;
    let read = seen.lock().take();
    read.unwrap_or(Read::Nothing)
}

/// Heads the gateway refuses on purpose where hyper goes on: a body whose
/// framing could be read two ways.
fn stricter_on_purpose(bytes: &[u8]) -> bool {
    let text = String::from_utf8_lossy(bytes).to_ascii_lowercase();
    let head = text.split("\r\n\r\n").next().unwrap_or("");
    let te: Vec<&str> = head
        .lines()
        .filter_map(|l| l.strip_prefix("transfer-encoding:"))
        .map(str::trim)
        .collect();
    !te.is_empty()
        && (head.contains("\r\ncontent-length:")
            || head.lines().next().is_some_and(|l| l.ends_with("http/1.0"))
            || te != ["chunked"])
}

fn compare(bytes: &[u8], rt: &tokio::runtime::Runtime) -> Result<(), TestCaseError> {
    let (o, h) = (ours(bytes), rt.block_on(hypers(bytes)));
    let text = String::from_utf8_lossy(bytes);
    match (&o, &h) {
        (Read::Nothing, Read::Request { .. }) if stricter_on_purpose(bytes) => Ok(()),
        _ => {
            prop_assert_eq!(&o, &h, "{:?}", text);
            Ok(())
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Fields a client may well send.
const FIELDS: &[&str] = &[
    "Host: api.example",
    "host: other",
    "content-length: 3",
    "Content-Length:  3 ",
    "content-length: 0",
    "Transfer-Encoding: chunked",
    "Connection: close",
    "connection: keep-alive",
    "Expect: 100-continue",
    "x-empty:",
    "x-space:   a  b  ",
    "x-tab: a\tb",
    "X-Api-Key: sk_demo_alice",
    "Authorization: Bearer sk_demo_alice",
    "x-utf8: caf\u{e9}",
];

/// Fields that are wrong, or framing that could be read two ways.
const ODD_FIELDS: &[&str] = &[
    "content-length: 3, 3",
    "content-length: 3,4",
    "content-length: +3",
    "content-length: ",
    "content-length: 4",
    "transfer-encoding: gzip, chunked",
    "transfer-encoding: identity",
    "transfer-encoding: chunked",
    "bad name: 1",
    "x-folded: a\r\n b",
    ": no name",
    "x-nul: a\0b",
];

const BODIES: &[&str] = &["", "abc", "3\r\nabc\r\n0\r\n\r\n", "zz\r\n", "abcdef"];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn heads_are_read_as_hyper_reads_them(
        method in prop::sample::select(vec!["GET", "POST", "POST", "HEAD", "OPTIONS", "M-SEARCH", "get", "G(T"]),
        target in prop::sample::select(vec!["/", "/v1/labels?x=1", "/v1/labels?x=1", "*", "http://api.example/x", "/a%20b", "api.example:443", "/a\"b", "//x/../y"]),
        version in prop::sample::select(vec!["HTTP/1.1", "HTTP/1.1", "HTTP/1.1", "HTTP/1.0", "HTTP/1.2", "http/1.1"]),
        mut fields in prop::collection::vec(prop::sample::select(FIELDS.to_vec()), 0..6),
        odd in prop::option::weighted(0.3, prop::sample::select(ODD_FIELDS.to_vec())),
        at in 0usize..6,
        body in prop::sample::select(BODIES.to_vec()),
        leading in prop::bool::ANY,
    ) {
        if let Some(odd) = odd {
            fields.insert(at.min(fields.len()), odd);
        }
        let mut text = String::new();
        if leading {
            text.push_str("\r\n");
        }
        text.push_str(&format!("{method} {target} {version}\r\n"));
        for f in &fields {
            text.push_str(f);
            text.push_str("\r\n");
        }
        text.push_str("\r\n");
        text.push_str(body);
        compare(text.as_bytes(), &runtime())?;
    }
}

#[test]
fn the_examples_are_read_as_hyper_reads_them() {
    let rt = runtime();
    for text in [
        "GET / HTTP/1.1\r\nHost: a\r\n\r\n",
        "POST /v1/labels HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc",
        "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\n0\r\nx-t: 1\r\n\r\n",
        "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n",
        "POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\nabc",
        "GET / HTTP/1.1\r\nHost: a\r\n",
    ] {
        compare(text.as_bytes(), &rt).unwrap();
    }
    let long = format!("GET / HTTP/1.1\r\nx: {}\r\n\r\n", "a".repeat(MAX_HEAD));
    compare(long.as_bytes(), &rt).unwrap();
    assert_eq!(ours(long.as_bytes()), Read::Nothing);
}
