//! The round-robin front of a fleet of gateways: one listening port that
//! sends each request to the next instance in turn, as a load balancer in
//! front of several gateway processes would.
//!
//! It forwards the method, path, fields and body, and gives back the
//! instance's answer as it came (status, fields, body). It keeps no
//! state of its own beyond the turn, so whatever the instances count is
//! what they count alone (the memory store) or together (Redis).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use paceline_wire::problem::ProblemKind;

use crate::api::problem;

/// The most request body the front forwards.
pub const MAX_BODY_BYTES: usize = 1 << 20;

/// How long the front waits for an instance's whole answer.
pub const INSTANCE_TIMEOUT: Duration = Duration::from_secs(30);

/// Fields that belong to one connection, not passed on.
const HOP_BY_HOP: [&str; 6] = [
    "connection",
    "keep-alive",
    "transfer-encoding",
    "upgrade",
    "te",
    "content-length",
];

struct Turns {
    instances: Vec<String>,
    next: AtomicUsize,
    http: reqwest::Client,
}

/// A running front.
pub struct Front {
    addr: SocketAddr,
    served: tokio::task::JoinHandle<()>,
}

impl Front {
    /// Starts a front on `listen` over `instances` (base URLs, at least one).
    pub async fn start(listen: SocketAddr, instances: Vec<String>) -> anyhow::Result<Front> {
        anyhow::ensure!(!instances.is_empty(), "a front needs at least one instance");
        let http = reqwest::Client::builder()
            .timeout(INSTANCE_TIMEOUT)
            .build()
            .context("the front's client")?;
        let turns = Arc::new(Turns {
            instances,
            next: AtomicUsize::new(0),
            http,
        });
        let app = axum::Router::new().fallback(forward).with_state(turns);
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("binding the front on {listen}"))?;
        let addr = listener.local_addr()?;
        let served = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                eprintln!("paceline: the front stopped: {e}");
            }
        });
        Ok(Front { addr, served })
    }

    /// Where clients send.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops listening.
    pub fn stop(self) {
        self.served.abort();
    }
}

async fn forward(State(turns): State<Arc<Turns>>, req: Request) -> Response {
    let i = turns.next.fetch_add(1, Ordering::Relaxed) % turns.instances.len();
    let (head, body) = req.into_parts();
    let path = head.uri.path_and_query().map_or("/", |p| p.as_str());
    let url = format!("{}{path}", turns.instances[i]);
    let body = match axum::body::to_bytes(body, MAX_BODY_BYTES).await {
        Ok(b) => b,
        Err(_) => {
            return problem(
                ProblemKind::PayloadTooLarge,
                &format!("The front forwards bodies of at most {MAX_BODY_BYTES} bytes."),
            )
        }
    };
    let mut out = turns.http.request(head.method, url).body(body);
    for (k, v) in &head.headers {
        if k != http::header::HOST && !HOP_BY_HOP.contains(&k.as_str()) {
            out = out.header(k, v);
        }
    }
    let answer = match out.send().await {
        Ok(a) => a,
        Err(e) => return problem(ProblemKind::BadGateway, &format!("Gateway {}: {e}", i + 1)),
    };
    let status = answer.status();
    let headers = answer.headers().clone();
    let bytes = match answer.bytes().await {
        Ok(b) => b,
        Err(e) => return problem(ProblemKind::BadGateway, &format!("Gateway {}: {e}", i + 1)),
    };
    let mut resp = Response::new(Body::from(bytes));
    *resp.status_mut() = status;
    for (k, v) in &headers {
        if !HOP_BY_HOP.contains(&k.as_str()) {
            resp.headers_mut().append(k, v.clone());
        }
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An instance that answers with its own number.
    async fn instance(n: usize) -> String {
        let app = axum::Router::new().fallback(move || async move { format!("{n}") });
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
        url
    }

    #[tokio::test]
    async fn each_request_goes_to_the_next_instance() {
        let urls = vec![instance(1).await, instance(2).await, instance(3).await];
        let front = Front::start("127.0.0.1:0".parse().unwrap(), urls)
            .await
            .unwrap();
        let http = reqwest::Client::new();
        let mut seen = Vec::new();
        for _ in 0..6 {
            let r = http
                .get(format!("http://{}/x?y=1", front.addr()))
                .timeout(Duration::from_secs(5))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            seen.push(r.text().await.unwrap());
        }
        assert_eq!(seen, ["1", "2", "3", "1", "2", "3"]);
        front.stop();
    }

    #[tokio::test]
    async fn an_instance_that_is_gone_is_a_502() {
        let front = Front::start(
            "127.0.0.1:0".parse().unwrap(),
            vec!["http://127.0.0.1:9".to_string()],
        )
        .await
        .unwrap();
        let r = reqwest::get(format!("http://{}/", front.addr()))
            .await
            .unwrap();
        assert_eq!(r.status(), 502);
        assert_eq!(
            r.headers()["content-type"],
            paceline_wire::problem::PROBLEM_CONTENT_TYPE
        );
        front.stop();
    }
}
