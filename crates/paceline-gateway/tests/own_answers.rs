//! The answers hyper would write by itself to HTTP/1.1 heads it refuses,
//! against a real gateway on loopback over raw TCP: each one is the
//! gateway's problem answer instead, naming the bound the head broke (the
//! head's bytes, its fields, the request target's length), and nothing of
//! it reaches the upstream. Every wait is bounded.

use std::sync::atomic::Ordering;

use paceline_wire::problem::PROBLEM_CONTENT_TYPE;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

mod common;

use common::{find, Rig, LIMIT};

impl Rig {
    /// Sends `head` on a new connection and reads to the close: the
    /// answer's status, head and body.
    async fn raw(&self, head: &[u8]) -> (u16, String, serde_json::Value) {
        let mut s = TcpStream::connect(self.addr).await.unwrap();
        // a client that sends past the point of refusal may see its write
        // fail: what matters is the answer
        let _ = s.write_all(head).await;
        let mut buf = Vec::new();
        let _ = tokio::time::timeout(LIMIT, s.read_to_end(&mut buf))
            .await
            .expect("answered and closed in time");
        let end = find(&buf, b"\r\n\r\n").expect("an answer head") + 4;
        let text = String::from_utf8_lossy(&buf[..end]).into_owned();
        let status = text[9..12].parse().unwrap();
        let body = serde_json::from_slice(&buf[end..]).unwrap_or(serde_json::Value::Null);
        (status, text, body)
    }
}

/// Asserts a problem answer of `status` and `code` whose detail says
/// `detail`.
fn problem(answer: &(u16, String, serde_json::Value), status: u16, code: &str, detail: &str) {
    let (got, head, body) = answer;
    assert_eq!(*got, status, "{head}{body}");
    let head = head.to_ascii_lowercase();
    assert!(
        head.contains(&format!("content-type: {PROBLEM_CONTENT_TYPE}")),
        "{head}"
    );
    assert!(head.contains("connection: close"), "{head}");
    let ty = body["type"].as_str().unwrap_or_default();
    assert!(ty.ends_with(&format!("/{code}")), "{ty}");
    assert_eq!(body["status"], status);
    let said = body["detail"].as_str().unwrap_or_default();
    assert!(said.contains(detail), "{said:?} should name {detail:?}");
}

fn get(target: &str, fields: &str) -> Vec<u8> {
    format!("GET {target} HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer sk_a\r\n{fields}\r\n")
        .into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_past_the_bound_is_431_naming_the_bound() {
    let rig = Rig::start("", 100).await;
    let pad = format!("x-pad: {}\r\n", "a".repeat(70 * 1024));
    let a = rig.raw(&get("/v1/rates", &pad)).await;
    problem(&a, 431, "head_too_large", "65536 bytes");
    rig.stop().await;

    let rig = Rig::start("max_head_bytes = 16384", 100).await;
    let pad = format!("x-pad: {}\r\n", "a".repeat(20 * 1024));
    let a = rig.raw(&get("/v1/rates", &pad)).await;
    problem(&a, 431, "head_too_large", "16384 bytes");
    assert_eq!(rig.seen.load(Ordering::SeqCst), 0);
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_with_too_many_fields_is_431_not_a_bad_length() {
    let rig = Rig::start("", 100).await;
    // well under the byte bound, over hyper's count of fields
    let fields: String = (0..120).map(|i| format!("x-f{i}: v\r\n")).collect();
    let a = rig.raw(&get("/v1/rates", &fields)).await;
    problem(&a, 431, "head_too_large", "100 fields");
    // a head with fields to spare passes
    let fields: String = (0..90).map(|i| format!("x-f{i}: v\r\n")).collect();
    let mut s = TcpStream::connect(rig.addr).await.unwrap();
    s.write_all(&get("/v1/rates", &fields)).await.unwrap();
    let mut buf = [0u8; 12];
    tokio::time::timeout(LIMIT, s.read_exact(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&buf, b"HTTP/1.1 200");
    // and the largest lengths are still a bad length, not too many fields
    let a = rig
        .raw(b"POST /v1/rates HTTP/1.1\r\nhost: gw\r\ncontent-length: 18446744073709551615\r\n\r\n")
        .await;
    problem(&a, 400, "bad_request", "Content-Length");
    assert_eq!(rig.seen.load(Ordering::SeqCst), 1);
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_past_hypers_bound_is_414_naming_it() {
    // hyper takes request targets up to 65,534 bytes whatever the head
    // bound: with a head bound above that, a longer target is refused by
    // that bound
    let rig = Rig::start("max_head_bytes = 262144", 100).await;
    let target = format!("/v1/{}", "a".repeat(70_000));
    let a = rig.raw(&get(&target, "")).await;
    problem(&a, 414, "uri_too_long", "65534 bytes");
    // one within it goes on
    let target = format!("/v1/{}", "a".repeat(60_000));
    let mut s = TcpStream::connect(rig.addr).await.unwrap();
    s.write_all(&get(&target, "")).await.unwrap();
    let mut buf = [0u8; 12];
    tokio::time::timeout(LIMIT, s.read_exact(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&buf, b"HTTP/1.1 200");
    assert_eq!(rig.seen.load(Ordering::SeqCst), 1);
    rig.stop().await;
}
