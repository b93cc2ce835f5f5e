//! Refunds only for work that was never done: for every policy kind, a
//! request admitted and answered `502` because the upstream refused the
//! connection (its head never left) leaves the key's budget as it was,
//! while one whose head reached the upstream before the answer failed
//! (`502` for a malformed answer, `504` for none in time) stays charged,
//! since the upstream may have done the work. A plan with
//! `charge_upstream_failures = true` is charged for both; one with
//! `refund_sent_failures = true` for neither. Budgets are read from the
//! usage endpoint. Every wait is bounded.

use std::net::SocketAddr;
use std::time::Duration;

use paceline_gateway::{Gateway, GatewayConfig, GatewayHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const LIMIT: Duration = Duration::from_secs(10);

/// The policy kinds, as a file gives them.
const KINDS: [(&str, &str); 6] = [
    (
        "tb",
        r#"{ name = "tb", algorithm = "token_bucket", q = 10, w = 3600 }"#,
    ),
    (
        "fw",
        r#"{ name = "fw", algorithm = "fixed_window", q = 10, w = 3600 }"#,
    ),
    ("day", r#"{ name = "day", algorithm = "daily", q = 10 }"#),
    (
        "sc",
        r#"{ name = "sc", algorithm = "sliding_counter", q = 10, w = 3600 }"#,
    ),
    (
        "sl",
        r#"{ name = "sl", algorithm = "sliding_log", q = 10, w = 3600 }"#,
    ),
    (
        "cc",
        r#"{ name = "cc", algorithm = "concurrency", q = 10 }"#,
    ),
];

/// An upstream that answers `/malformed` with bytes that are no HTTP and
/// never answers `/slow`.
async fn faulty_upstream() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                if buf.starts_with(b"GET /malformed ") {
                    let _ = s.write_all(b"HTTP/1.1 2x0 What\r\n\r\n").await;
                    return;
                }
                // slow: hold the connection, answer nothing
                tokio::time::sleep(LIMIT).await;
            });
        }
    });
    addr
}

/// A port nothing listens on.
async fn refused_port() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    l.local_addr().unwrap()
}

struct Rig {
    addr: SocketAddr,
    handle: GatewayHandle,
    served: tokio::task::JoinHandle<std::io::Result<()>>,
}

/// What a plan says of upstream failures, by the suffix of its name.
const SETTINGS: [(&str, &str); 3] = [
    ("free", ""),
    ("charged", "charge_upstream_failures = true"),
    ("refunded", "refund_sent_failures = true"),
];

/// Every kind alone, and all of them in one plan; under each setting.
fn config(upstream: SocketAddr) -> String {
    let mut text = format!(
        "[gateway]\nlisten = \"127.0.0.1:0\"\nupstream = \"http://{upstream}\"\nwatch = false\n\
         [gateway.timeouts]\nupstream_header_ms = 300\n\n"
    );
    let all: Vec<&str> = KINDS.iter().map(|k| k.1).collect();
    let mut plans: Vec<(String, String)> = KINDS
        .iter()
        .map(|(n, p)| (n.to_string(), p.to_string()))
        .collect();
    plans.push(("all".to_string(), all.join(", ")));
    let mut keys = String::from("[keys]\n");
    for (name, policies) in &plans {
        for (suffix, setting) in SETTINGS {
            text.push_str(&format!(
                "[plans.{name}_{suffix}]\n{setting}\npolicies = [{policies}]\n\n"
            ));
            keys.push_str(&format!("sk_{name}_{suffix} = \"{name}_{suffix}\"\n"));
        }
    }
    text.push_str(&keys);
    text
}

impl Rig {
    async fn start(upstream: SocketAddr) -> Rig {
        let cfg = GatewayConfig::parse(&config(upstream), "refunds.toml", None).unwrap();
        let gw = Gateway::bind(cfg).await.unwrap();
        let addr = gw.local_addr();
        let handle = gw.handle();
        let served = tokio::spawn(gw.run(std::future::pending()));
        Rig {
            addr,
            handle,
            served,
        }
    }

    async fn stop(self) {
        self.handle.shutdown();
        let _ = tokio::time::timeout(LIMIT, self.served).await;
    }

    /// `GET path` with `key`: the status and body.
    async fn get(&self, path: &str, key: &str) -> (u16, String) {
        let mut s = TcpStream::connect(self.addr).await.unwrap();
        let req = format!(
            "GET {path} HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer {key}\r\nconnection: close\r\n\r\n"
        );
        s.write_all(req.as_bytes()).await.unwrap();
        let mut out = Vec::new();
        tokio::time::timeout(LIMIT, s.read_to_end(&mut out))
            .await
            .expect("an answer in time")
            .unwrap();
        let text = String::from_utf8_lossy(&out).into_owned();
        let status = text[9..12].parse().unwrap();
        let body = text.split_once("\r\n\r\n").map_or("", |x| x.1).to_string();
        (status, body)
    }

    /// What is left of every policy of `key`'s plan.
    async fn left(&self, key: &str) -> Vec<u64> {
        let (status, body) = self.get("/v1/usage", key).await;
        assert_eq!(status, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        v["limits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["r"].as_u64().unwrap())
            .collect()
    }

    /// Sends a request to `path` for every plan and checks each budget
    /// against what the plan says about upstream failures, the request
    /// having reached the upstream (`sent`) or not.
    async fn check_every_plan(&self, path: &str, status: u16, sent: bool) {
        let mut names: Vec<&str> = KINDS.iter().map(|k| k.0).collect();
        names.push("all");
        for name in names {
            for (suffix, _) in SETTINGS {
                let charged = match suffix {
                    "charged" => true,
                    "refunded" => false,
                    _ => sent,
                };
                let key = format!("sk_{name}_{suffix}");
                let before = self.left(&key).await;
                let (got, body) = self.get(path, &key).await;
                assert_eq!(got, status, "{key} {path}: {body}");
                let after = self.left(&key).await;
                let spent: Vec<u64> = before.iter().zip(&after).map(|(b, a)| b - a).collect();
                // a concurrency cap is given back by its lease either way
                let want: Vec<u64> = match (name, charged) {
                    (_, false) | ("cc", true) => vec![0; before.len()],
                    ("all", true) => vec![1, 1, 1, 1, 1, 0],
                    (_, true) => vec![1],
                };
                assert_eq!(
                    spent, want,
                    "{key} {path}: before {before:?} after {after:?}"
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_upstream_costs_nothing_unless_the_plan_says_so() {
    let rig = Rig::start(refused_port().await).await;
    rig.check_every_plan("/v1/x", 502, false).await;
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_answer_after_the_head_went_up_stays_charged_unless_the_plan_says_so() {
    let rig = Rig::start(faulty_upstream().await).await;
    rig.check_every_plan("/malformed", 502, true).await;
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_timeout_after_the_head_went_up_stays_charged_unless_the_plan_says_so() {
    let rig = Rig::start(faulty_upstream().await).await;
    rig.check_every_plan("/slow", 504, true).await;
    rig.stop().await;
}
