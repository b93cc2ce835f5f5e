//! Costs settled from the answer: a plan of 10,000 tokens a minute in
//! front of upstreams that report what each request used, in a header, in
//! a JSON answer and in the last event of a stream. Admission charges the
//! route's estimate (500); the answer's report charges the rest or gives
//! it back. 100 requests of varied size, sent one after another on a
//! virtual clock, each retried after the `Retry-After` it was given:
//!
//! - the tokens admitted in every minute stay within the plan plus the
//!   largest single request's overshoot (charging the estimate alone would
//!   let each minute take about 2.5 times the plan);
//! - a key in debt is refused with a truthful `Retry-After`: one second
//!   before it, the request is still refused; at it, admitted;
//! - a request whose estimate can never fit is `cost_exceeds_burst`;
//! - the same on the memory store and on Redis.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use paceline_core::{Clock, ManualClock, Nanos};
use paceline_gateway::{Gateway, GatewayConfig};
use tokio::net::TcpListener;

const PLAN: u64 = 10_000;
const ESTIMATE: u64 = 500;

/// An upstream that uses as many tokens as the request's `x-want` says,
/// and reports them the way its path asks.
async fn llm_upstream() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(
                    |req: Request<hyper::body::Incoming>| async move {
                        let n: u64 = req
                            .headers()
                            .get("x-want")
                            .and_then(|v| v.to_str().ok()?.parse().ok())
                            .unwrap_or(0);
                        let res = match req.uri().path() {
                            "/v1/header" => Response::builder()
                                .header("x-usage-tokens", n.to_string())
                                .body(Full::new(Bytes::from_static(b"{\"ok\":true}"))),
                            "/v1/json" => Response::builder()
                                .header("content-type", "application/json")
                                .body(Full::new(Bytes::from(format!(
                                    r#"{{"id":"x","choices":[{{"text":"..."}}],"usage":{{"prompt_tokens":1,"total_tokens":{n}}}}}"#
                                )))),
                            _ => Response::builder()
                                .header("content-type", "text/event-stream")
                                .body(Full::new(Bytes::from(format!(
                                    "data: {{\"choices\":[{{\"delta\":\"a\"}}]}}\n\n\
                                     data: {{\"choices\":[],\"usage\":{{\"total_tokens\":{n}}}}}\n\n\
                                     data: [DONE]\n\n"
                                )))),
                        };
                        Ok::<_, std::convert::Infallible>(res.unwrap())
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

fn config(upstream: SocketAddr, store: &str) -> String {
    format!(
        r#"[gateway]
listen = "127.0.0.1:0"
upstream = "http://{upstream}"
watch = false
{store}

[gateway.shedding]
max_in_flight = 0

[plans.llm]
policies = [
  {{ name = "rpm", algorithm = "token_bucket", q = 1000, w = 60 }},
  {{ name = "tpm", algorithm = "fixed_window", q = {PLAN}, w = 60, unit = "tokens" }},
]

# a plan whose tokens a minute hold no request's estimate
[plans.small]
policies = [
  {{ name = "tpm", algorithm = "fixed_window", q = 400, w = 60, unit = "tokens" }},
]

[keys]
sk_one = "llm"
sk_small = "small"

[[routes]]
method = "POST"
path = "/v1/header"
cost = {{ estimate = {ESTIMATE}, from_header = "x-usage-tokens" }}

[[routes]]
method = "POST"
path = "/v1/json"
cost = {{ estimate = {ESTIMATE}, from_json = "usage.total_tokens" }}

[[routes]]
method = "POST"
path = "/v1/stream"
cost = {{ estimate = {ESTIMATE}, from_json = "usage.total_tokens" }}

[escalation]
enabled = false
"#
    )
}

async fn post(
    client: &Client<HttpConnector, Full<Bytes>>,
    addr: SocketAddr,
    path: &str,
    key: &str,
    want: u64,
) -> Response<Bytes> {
    let req = Request::post(format!("http://{addr}{path}"))
        .header("authorization", format!("Bearer {key}"))
        .header("x-want", want.to_string())
        .body(Full::default())
        .unwrap();
    let res = tokio::time::timeout(common::LIMIT, client.request(req))
        .await
        .expect("answer in time")
        .expect("a response");
    let (parts, body) = res.into_parts();
    let body = tokio::time::timeout(common::LIMIT, body.collect())
        .await
        .expect("body in time")
        .expect("a body")
        .to_bytes();
    Response::from_parts(parts, body)
}

fn retry_after(res: &Response<Bytes>) -> u64 {
    res.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// The `r` of the `tpm` item of the `RateLimit` field.
fn tpm_left(res: &Response<Bytes>) -> Option<u64> {
    let f = res.headers().get("ratelimit")?.to_str().ok()?;
    let item = f.split(',').find(|i| i.trim().starts_with("\"tpm\""))?;
    let r = item.split(';').find_map(|p| p.trim().strip_prefix("r="))?;
    r.parse().ok()
}

/// 100 sizes from 50 to 2,500 tokens, the same every run.
fn sizes() -> Vec<u64> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..100)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            50 + x % 2_451
        })
        .collect()
}

/// Runs the 100 requests against `path`; returns the tokens admitted per
/// minute (the fixed window's index) and the number of debts met.
async fn run(store: &str, path: &str) -> (BTreeMap<u64, u64>, usize) {
    let upstream = llm_upstream().await;
    let clock = ManualClock::at_unix_secs(1_790_000_000);
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    // Redis names keys under a key-hash secret every instance shares
    let env = |v: &str| {
        (v == paceline_gateway::KEY_HASH_SECRET_ENV).then(|| "a secret for this test".to_string())
    };
    let text = config(upstream, store);
    let mut cfg = GatewayConfig::parse_with_env(&text, "gateway.toml", None, &env).unwrap();
    // the virtual clock decides on Redis too
    if let Some(r) = cfg.settings.redis.as_mut() {
        r.caller_clock = true;
    }
    let gw = Gateway::bind_with_clock(cfg, shared).await.unwrap();
    let addr = gw.local_addr();
    let handle = gw.handle();
    tokio::spawn(gw.run(std::future::pending()));
    let client = Client::builder(TokioExecutor::new()).build_http();

    let huge = post(&client, addr, path, "sk_small", 10).await;
    assert_eq!(huge.status(), 400, "{path}: an estimate past the plan");
    assert!(String::from_utf8_lossy(huge.body()).contains("cost_exceeds_burst"));

    let minute = |c: &ManualClock| c.now().as_u64() / 60_000_000_000;
    let mut per_minute: BTreeMap<u64, u64> = BTreeMap::new();
    let mut debts = 0;
    for (i, &want) in sizes().iter().enumerate() {
        let mut res = post(&client, addr, path, "sk_one", want).await;
        if res.status() == 429 {
            let wait = retry_after(&res);
            assert!((1..=60).contains(&wait), "{path} #{i}: Retry-After {wait}");
            // in debt (or with no room for the estimate) until the minute ends
            let owed = per_minute.get(&minute(&clock)).copied().unwrap_or(0);
            assert!(
                owed + ESTIMATE > PLAN,
                "{path} #{i}: refused with {owed} used"
            );
            debts += usize::from(owed > PLAN);
            if wait > 1 {
                clock.advance(Nanos::from_secs(wait - 1));
                let early = post(&client, addr, path, "sk_one", want).await;
                assert_eq!(early.status(), 429, "{path} #{i}: admitted a second early");
                clock.advance(Nanos::from_secs(1));
            } else {
                clock.advance(Nanos::from_secs(wait));
            }
            res = post(&client, addr, path, "sk_one", want).await;
        }
        assert_eq!(res.status(), 200, "{path} #{i}: admitted after Retry-After");
        let used = per_minute.entry(minute(&clock)).or_default();
        *used += want;
        if path == "/v1/header" {
            // settled before the fields were written: they tell the truth
            assert_eq!(
                tpm_left(&res),
                Some(PLAN.saturating_sub(*used)),
                "{path} #{i}"
            );
        }
        clock.advance(Nanos::from_secs(1));
    }
    handle.shutdown();
    (per_minute, debts)
}

fn check(store: &str, path: &str, per_minute: &BTreeMap<u64, u64>, debts: usize) {
    let largest = sizes().into_iter().max().unwrap();
    let bound = PLAN + largest;
    let total: u64 = per_minute.values().sum();
    println!(
        "{store} {path}: {total} tokens over {} minutes, at most {} in one (bound {bound}), {debts} debts",
        per_minute.len(),
        per_minute.values().max().unwrap()
    );
    for (m, &used) in per_minute {
        assert!(used <= bound, "{store} {path}: minute {m} admitted {used}");
    }
    // the plan was the limit: most minutes came near it
    assert!(per_minute.len() >= 10, "{store} {path}: {per_minute:?}");
    assert!(debts > 0, "{store} {path}: no request ever ran into debt");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_settled_from_the_answer_hold_the_plan_on_the_memory_store() {
    for path in ["/v1/header", "/v1/json", "/v1/stream"] {
        let (per_minute, debts) = run("store = \"memory\"", path).await;
        check("memory", path, &per_minute, debts);
    }
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_settled_from_the_answer_hold_the_plan_on_redis() {
    let server = paceline_redis::testing::RedisServer::start();
    for path in ["/v1/header", "/v1/json", "/v1/stream"] {
        let table = format!(
            "store = \"redis\"\n\n[gateway.redis]\nurl = \"{}\"\ndeadline_ms = 2000\ndeny_cache = 0\nprefix = \"{}:\"\n",
            server.url(),
            &path[4..]
        );
        let (per_minute, debts) = run(&table, path).await;
        check("redis", path, &per_minute, debts);
    }
}
