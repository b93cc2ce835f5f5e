//! What the service tests share: a served `RlsService` on a free loopback
//! port, Envoy's own generated client, and readers for its answers.
#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    rate_limit_descriptor::Entry, RateLimitDescriptor,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use paceline_core::{Clock, ManualClock, MemoryStore, Store};
use paceline_rls::{RlsConfig, RlsService};
use tokio::sync::oneshot;
use tonic::transport::Channel;

pub use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

/// 2026-09-21T06:40:00Z: an instant inside a second, a minute and a day.
pub const START: u64 = 1_790_232_000;

/// A served service, stopped when dropped.
pub struct Served<S, C> {
    pub addr: SocketAddr,
    pub service: RlsService<S, C>,
    stop: Option<oneshot::Sender<()>>,
}

impl<S, C> Drop for Served<S, C> {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

/// Serves `service` on a free loopback port.
pub async fn serve<S: Store, C: Clock>(service: RlsService<S, C>) -> Served<S, C> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = oneshot::channel();
    let svc = service.clone();
    tokio::spawn(async move {
        let _ = paceline_rls::serve(listener, svc, async {
            let _ = rx.await;
        })
        .await;
    });
    Served {
        addr,
        service,
        stop: Some(tx),
    }
}

/// The YAML as one domain's rules.
pub fn config(yaml: &str) -> RlsConfig {
    RlsConfig::from_str("test.yaml".as_ref(), yaml).unwrap()
}

/// A service on the memory store and a manual clock at [`START`].
pub async fn memory(yaml: &str) -> (Served<MemoryStore, ManualClock>, ManualClock) {
    let clock = ManualClock::at_unix_secs(START);
    let svc = RlsService::new(config(yaml), MemoryStore::new(), clock.clone());
    (serve(svc).await, clock)
}

/// Envoy's generated client, connected.
pub async fn client(addr: SocketAddr) -> RateLimitServiceClient<Channel> {
    let ch = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap();
    RateLimitServiceClient::new(ch)
}

/// A request of `descriptors`, each a list of (key, value).
pub fn request(domain: &str, descriptors: &[&[(&str, &str)]]) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors: descriptors
            .iter()
            .map(|d| RateLimitDescriptor {
                entries: d
                    .iter()
                    .map(|(k, v)| Entry {
                        key: k.to_string(),
                        value: v.to_string(),
                    })
                    .collect(),
                ..Default::default()
            })
            .collect(),
        hits_addend: 0,
    }
}

/// Asks once.
pub async fn ask(
    c: &mut RateLimitServiceClient<Channel>,
    req: &RateLimitRequest,
) -> RateLimitResponse {
    c.should_rate_limit(req.clone()).await.unwrap().into_inner()
}

/// A response header's value.
pub fn header<'a>(r: &'a RateLimitResponse, name: &str) -> Option<&'a str> {
    r.response_headers_to_add
        .iter()
        .find(|h| h.key.eq_ignore_ascii_case(name))
        .map(|h| h.value.as_str())
}

/// The overall code.
pub fn code(r: &RateLimitResponse) -> Code {
    Code::try_from(r.overall_code).unwrap()
}

/// Descriptor `i`'s code.
pub fn status_code(r: &RateLimitResponse, i: usize) -> Code {
    Code::try_from(r.statuses[i].code).unwrap()
}

/// The problem body as JSON.
pub fn problem(r: &RateLimitResponse) -> serde_json::Value {
    serde_json::from_slice(&r.raw_body).unwrap()
}
