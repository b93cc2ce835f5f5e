//! The layer over real sockets on loopback, with a manual clock.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use paceline_core::{Clock, ManualClock, MemoryStore, Nanos, Plan, Policy};
use paceline_server::{
    Limits, LimitsBuilder, PeerAddr, RateLimiter, Route, SoftLimitHook, TrustedProxies,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tower::{Layer, Service, ServiceExt};

/// 2026-09-30T18:40:00Z
const AT_1840: u64 = 1_790_793_600;
/// 2026-09-30T12:00:00Z
const NOON: u64 = 1_790_769_600;

fn free() -> Plan {
    Plan::new(
        "free",
        vec![
            Policy::token_bucket("burst", 20, 2).unwrap(),
            Policy::daily("daily", 10_000).unwrap(),
        ],
    )
    .unwrap()
}

fn login() -> Plan {
    Plan::new("login", vec![Policy::fixed_window("login", 5, 60).unwrap()]).unwrap()
}

/// A plan whose burst holds the batch route's cost of 50 (no key is on
/// it): the route can be served, so the limits build, and a Free key is
/// still refused it with 400.
fn bulk() -> Plan {
    Plan::new("bulk", vec![Policy::token_bucket("burst", 100, 2).unwrap()]).unwrap()
}

fn base_limits() -> LimitsBuilder {
    Limits::builder()
        .plan(free())
        .plan(login())
        .plan(bulk())
        .key("sk_free", "free")
        .key("sk_other", "free")
        .route(
            Route::new("POST", "/v1/login")
                .unwrap()
                .anonymous(Some("login")),
        )
        .route(
            Route::new("POST", "/v1/labels:batch")
                .unwrap()
                .with_cost(50),
        )
}

/// The inner service: counts its calls, answers 200 "ok".
#[derive(Clone, Default)]
struct Counter(Arc<AtomicUsize>);

impl Counter {
    fn calls(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
    fn service(
        &self,
    ) -> impl Service<
        Request<Incoming>,
        Response = Response<Full<Bytes>>,
        Error = Infallible,
        Future: Send,
    > + Clone
           + Send
           + 'static {
        let calls = self.0.clone();
        tower::service_fn(move |_req: Request<Incoming>| {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok")))) }
        })
    }
}

struct Server {
    addr: SocketAddr,
    inner: Counter,
    limiter: RateLimiter<MemoryStore, ManualClock>,
    clock: ManualClock,
}

/// Serves the layer on 127.0.0.1 with hyper-util's auto builder (HTTP/1.1
/// and h2c prior knowledge).
async fn serve(limits: Limits, start_s: u64) -> Server {
    let clock = ManualClock::at_unix_secs(start_s);
    let limiter = RateLimiter::new(limits, MemoryStore::new(), clock.clone());
    let inner = Counter::default();
    let svc = limiter.layer().layer(inner.service());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, peer)) = listener.accept().await else {
                return;
            };
            let svc = svc.clone();
            tokio::spawn(async move {
                let hyper_svc = hyper::service::service_fn(move |mut req: Request<Incoming>| {
                    req.extensions_mut().insert(PeerAddr(peer));
                    svc.clone().oneshot(req)
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), hyper_svc)
                    .await;
            });
        }
    });
    Server {
        addr,
        inner,
        limiter,
        clock,
    }
}

struct Got {
    status: StatusCode,
    headers: http::HeaderMap,
    body: String,
}

impl Got {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }
    fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap()
    }
}

/// One HTTP/1.1 connection, reused for every request.
struct H1(hyper::client::conn::http1::SendRequest<Empty<Bytes>>);

impl H1 {
    async fn connect(addr: SocketAddr) -> H1 {
        let stream = TcpStream::connect(addr).await.unwrap();
        let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(conn);
        H1(send)
    }
    async fn send(&mut self, req: http::request::Builder) -> Got {
        let req = req.header("host", "localhost").body(Empty::new()).unwrap();
        self.0.ready().await.unwrap();
        let res = self.0.send_request(req).await.unwrap();
        let (parts, body) = res.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        Got {
            status: parts.status,
            headers: parts.headers,
            body: String::from_utf8(body.to_vec()).unwrap(),
        }
    }
}

fn get(path: &str, key: &str) -> http::request::Builder {
    Request::get(path).header("authorization", format!("Bearer {key}"))
}

fn burst_r(g: &Got) -> u64 {
    param(g.header("ratelimit").unwrap(), "burst", "r")
}

/// Reads one parameter of one item of a RateLimit field.
fn param(field: &str, item: &str, key: &str) -> u64 {
    let it = field
        .split(", ")
        .find(|i| i.starts_with(&format!("\"{item}\"")))
        .unwrap_or_else(|| panic!("no {item} in {field}"));
    it.split(';')
        .find_map(|p| p.strip_prefix(&format!("{key}=")))
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn free_key_25_rapid_requests() {
    let srv = serve(base_limits().build().unwrap(), NOON).await;
    let mut c = H1::connect(srv.addr).await;
    for i in 1..=25u64 {
        let g = c.send(get("/v1/rates", "sk_free")).await;
        assert_eq!(
            g.header("ratelimit-policy"),
            Some(r#""burst";q=20;w=2, "daily";q=10000;w=86400"#)
        );
        let rl = g.header("ratelimit").unwrap();
        if i <= 20 {
            assert_eq!(g.status, 200, "request {i}");
            assert_eq!(burst_r(&g), 20 - i);
            assert_eq!(param(rl, "daily", "r"), 10_000 - i);
            // fully restored after i tokens at 10/s, rounded up
            assert_eq!(param(rl, "burst", "t"), (i as f64 / 10.0).ceil() as u64);
            assert_eq!(param(rl, "daily", "t"), 12 * 3600);
            assert_eq!(g.body, "ok");
        } else {
            assert_eq!(g.status, 429, "request {i}");
            assert_eq!(g.header("retry-after"), Some("1"));
            assert_eq!(g.header("cache-control"), Some("no-store"));
            assert_eq!(
                g.header("content-type"),
                Some(paceline_wire::PROBLEM_CONTENT_TYPE)
            );
            assert_eq!(burst_r(&g), 0);
            assert_eq!(param(rl, "daily", "r"), 9_980, "a denial spends nothing");
            let p = g.json();
            assert!(p["type"].as_str().unwrap().ends_with("rate_limited"));
            assert_eq!(p["status"], 429);
            assert_eq!(p["limit"], "burst");
            assert_eq!(p["retry_after_s"], 1);
        }
    }
    assert_eq!(srv.inner.calls(), 20);
    srv.clock.advance(Nanos::from_secs(1));
    let g = c.send(get("/v1/rates", "sk_free")).await;
    assert_eq!(g.status, 200);
    assert_eq!(burst_r(&g), 9);
    // another key has its own budget
    let g = c.send(get("/v1/rates", "sk_other")).await;
    assert_eq!((g.status.as_u16(), burst_r(&g)), (200, 19));
}

async fn exhaust(srv: &Server, key: &str) {
    let mut c = H1::connect(srv.addr).await;
    for _ in 0..20 {
        assert_eq!(c.send(get("/v1/rates", key)).await.status, 200);
    }
}

/// Reads until the end of the response head.
async fn read_head(s: &mut TcpStream) -> String {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = s.read(&mut byte).await.unwrap();
        assert!(n > 0, "EOF before the response head");
        buf.extend_from_slice(&byte[..n]);
    }
    String::from_utf8_lossy(&buf).to_string()
}

#[tokio::test]
async fn http1_rejection_never_reads_the_body_and_closes() {
    let srv = serve(base_limits().build().unwrap(), NOON).await;
    exhaust(&srv, "sk_free").await;
    let mut s = TcpStream::connect(srv.addr).await.unwrap();
    let head = "POST /v1/labels HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer sk_free\r\n\
                Content-Type: application/json\r\nContent-Length: 50000000\r\n\r\n";
    let t0 = Instant::now();
    s.write_all(head.as_bytes()).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(2), read_head(&mut s))
        .await
        .unwrap();
    let took = t0.elapsed();
    assert!(got.starts_with("HTTP/1.1 429"), "{got}");
    assert!(took < Duration::from_millis(50), "429 took {took:?}");
    let lower = got.to_ascii_lowercase();
    assert!(lower.contains("connection: close"), "{got}");
    assert!(lower.contains("retry-after: 1\r\n"), "{got}");
    // the server closes: the client reads the rest of the problem, then EOF
    let mut rest = Vec::new();
    let eof = tokio::time::timeout(Duration::from_secs(2), s.read_to_end(&mut rest)).await;
    assert!(eof.is_ok(), "connection left open");
    let all = format!("{got}{}", String::from_utf8_lossy(&rest));
    assert!(all.contains("rate_limited"), "{all}");
    assert_eq!(srv.inner.calls(), 20, "the inner service was called");
    println!("HTTP/1.1 429 for a 50 MB upload after {took:?}");
}

#[tokio::test]
async fn h2c_rejection_answers_and_ends_the_stream() {
    let srv = serve(base_limits().build().unwrap(), NOON).await;
    exhaust(&srv, "sk_free").await;
    let stream = TcpStream::connect(srv.addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http2::handshake::<_, _, ChannelBody>(
        TokioExecutor::new(),
        TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(1);
    let body = ChannelBody(rx);
    let req = Request::post(format!("http://{}/v1/labels", srv.addr))
        .header("authorization", "Bearer sk_free")
        .header("content-length", "50000000")
        .body(body)
        .unwrap();
    let t0 = Instant::now();
    let res = tokio::time::timeout(Duration::from_secs(2), send.send_request(req))
        .await
        .unwrap()
        .unwrap();
    let took = t0.elapsed();
    assert_eq!(res.status(), 429);
    assert!(took < Duration::from_millis(50), "429 took {took:?}");
    assert_eq!(res.headers()["retry-after"], "1");
    assert!(res.headers().get("connection").is_none());
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&body).contains("rate_limited"));
    // the server reset the stream: the client stops wanting the body
    tokio::time::timeout(Duration::from_secs(2), tx.closed())
        .await
        .expect("the request stream was never ended");
    assert_eq!(srv.inner.calls(), 20);
    println!("h2c 429 for a 50 MB upload after {took:?}");
}

/// A request body fed by a channel: it sends nothing unless told to.
struct ChannelBody(tokio::sync::mpsc::Receiver<Bytes>);

impl http_body::Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b))))
    }
}

/// Spends `n` requests of `key` in process (same layer, no sockets), a
/// tenth of a second apart so the burst never binds.
async fn spend(srv: &Server, key: &str, n: u64) {
    let svc = srv
        .limiter
        .layer()
        .layer(tower::service_fn(|_r: Request<()>| async {
            Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new()))
        }));
    for _ in 0..n {
        let req = Request::get("/v1/rates")
            .header("authorization", format!("Bearer {key}"))
            .body(())
            .unwrap();
        let res = svc.clone().oneshot(req).await.unwrap();
        assert_eq!(res.status(), 200);
        srv.clock.advance(Nanos::from_millis(100));
    }
}

#[tokio::test]
async fn daily_quota_runs_out_at_1840() {
    let srv = serve(
        base_limits().soft_limit(None).build().unwrap(),
        AT_1840 - 1000,
    )
    .await;
    spend(&srv, "sk_free", 10_000).await;
    assert_eq!(srv.clock.now(), Nanos::from_secs(AT_1840));
    let mut c = H1::connect(srv.addr).await;
    let g = c.send(get("/v1/labels", "sk_free")).await;
    assert_eq!(g.status, 429);
    assert_eq!(g.header("retry-after"), Some("19200"));
    assert_eq!(g.header("cache-control"), Some("no-store"));
    let p = g.json();
    assert!(p["type"].as_str().unwrap().ends_with("quota_exhausted"));
    assert_eq!(p["limit"], "daily");
    assert_eq!(p["retry_after_s"], 19_200);
    assert_eq!(p["violated-policies"][0], "daily");
    let rl = g.header("ratelimit").unwrap();
    assert_eq!(param(rl, "daily", "r"), 0);
    assert_eq!(param(rl, "daily", "t"), 19_200);
    // at midnight the quota is back
    srv.clock.set(Nanos::from_secs(AT_1840 + 19_200));
    assert_eq!(c.send(get("/v1/labels", "sk_free")).await.status, 200);
}

#[tokio::test]
async fn usage_endpoint_reports_and_costs_nothing() {
    let srv = serve(base_limits().build().unwrap(), AT_1840).await;
    let mut c = H1::connect(srv.addr).await;
    for _ in 0..13 {
        c.send(get("/v1/rates", "sk_free")).await;
    }
    for _ in 0..3 {
        let g = c.send(get("/v1/usage", "sk_free")).await;
        assert_eq!(g.status, 200);
        assert_eq!(g.header("cache-control"), Some("no-store"));
        assert_eq!(g.header("content-type"), Some("application/json"));
        let u = g.json();
        assert_eq!(
            u,
            serde_json::json!({"plan": "free", "limits": [
                {"name": "burst", "q": 20, "w": 2, "r": 7, "reset_at": "2026-09-30T18:40:02Z"},
                {"name": "daily", "q": 10000, "w": 86400, "r": 9987, "reset_at": "2026-10-01T00:00:00Z"}
            ]})
        );
        assert_eq!(param(g.header("ratelimit").unwrap(), "daily", "r"), 9_987);
    }
    // a fresh key: its bucket is full now, its day ends at midnight all the same
    let fresh = c.send(get("/v1/usage", "sk_other")).await.json();
    assert_eq!(
        fresh,
        serde_json::json!({"plan": "free", "limits": [
            {"name": "burst", "q": 20, "w": 2, "r": 20, "reset_at": "2026-09-30T18:40:00Z"},
            {"name": "daily", "q": 10000, "w": 86400, "r": 10000, "reset_at": "2026-10-01T00:00:00Z"}
        ]})
    );
    assert_eq!(
        srv.inner.calls(),
        13,
        "usage never reaches the inner service"
    );
    let anon = c.send(Request::get("/v1/usage")).await;
    assert_eq!(anon.status, 401);
    assert_eq!(anon.header("cache-control"), Some("no-store"));
}

#[tokio::test]
async fn soft_limit_warns_and_fires_once_per_window() {
    let small = Plan::new(
        "small",
        vec![
            Policy::token_bucket("burst", 1000, 1).unwrap(),
            Policy::daily("daily", 10).unwrap(),
        ],
    )
    .unwrap();
    let limits = Limits::builder()
        .plan(small)
        .key("sk_s", "small")
        .build()
        .unwrap();
    let srv = serve(limits, NOON).await;
    let fired = Arc::new(std::sync::Mutex::new(Vec::new()));
    let f2 = fired.clone();
    srv.limiter
        .set_soft_limit_hook(SoftLimitHook::new(move |e| {
            f2.lock().unwrap().push(e.clone())
        }));
    let mut c = H1::connect(srv.addr).await;
    for day in 0..2u64 {
        for i in 1..=10u64 {
            let g = c.send(get("/v1/rates", "sk_s")).await;
            assert_eq!(g.status, 200);
            let w = g.header("ratelimit-warning");
            if i < 8 {
                assert_eq!(w, None, "day {day} request {i}");
            } else {
                assert_eq!(w, Some(format!("\"daily\";used={i};q=10").as_str()));
            }
        }
        let g = c.send(get("/v1/rates", "sk_s")).await;
        assert_eq!(g.status, 429);
        assert_eq!(fired.lock().unwrap().len() as u64, day + 1);
        srv.clock.advance(Nanos::from_secs(86_400));
    }
    let e = fired.lock().unwrap()[0].clone();
    assert_eq!(
        (e.plan.as_str(), e.policy.as_str(), e.used, e.quota),
        ("small", "daily", 8, 10)
    );
    assert_eq!(e.window_ends, Nanos::from_secs(NOON + 12 * 3600));
}

fn login_req(xff: Option<&str>) -> http::request::Builder {
    let r = Request::post("/v1/login");
    match xff {
        Some(x) => r.header("x-forwarded-for", x),
        None => r,
    }
}

#[tokio::test]
async fn anonymous_route_publishes_no_counters_and_ignores_spoofed_xff() {
    let limits = base_limits()
        .trusted_proxies(TrustedProxies::parse(["10.0.0.0/8"]).unwrap())
        .build()
        .unwrap();
    let srv = serve(limits, NOON).await;
    let mut c = H1::connect(srv.addr).await;
    for i in 1..=6u32 {
        // a different spoofed address every time: all the same client
        let g = c.send(login_req(Some(&format!("203.0.113.{i}")))).await;
        assert!(g.header("ratelimit").is_none());
        assert!(g.header("ratelimit-policy").is_none());
        if i <= 5 {
            assert_eq!(g.status, 200, "request {i}");
        } else {
            assert_eq!(g.status, 429);
            let ra: u64 = g.header("retry-after").unwrap().parse().unwrap();
            assert!((1..=60).contains(&ra));
            assert!(!g.body.contains("5 of 5"), "{}", g.body);
        }
    }
    assert_eq!(srv.inner.calls(), 5);
}

#[tokio::test]
async fn forwarded_for_is_believed_from_a_trusted_proxy() {
    let limits = base_limits()
        .trusted_proxies(TrustedProxies::parse(["127.0.0.0/8"]).unwrap())
        .build()
        .unwrap();
    let srv = serve(limits, NOON).await;
    let mut c = H1::connect(srv.addr).await;
    for _ in 0..5 {
        assert_eq!(c.send(login_req(Some("203.0.113.1"))).await.status, 200);
    }
    assert_eq!(c.send(login_req(Some("203.0.113.1"))).await.status, 429);
    // another client behind the same proxy has its own budget
    assert_eq!(c.send(login_req(Some("203.0.113.2"))).await.status, 200);
}

#[tokio::test]
async fn cost_exceeding_the_burst_is_400() {
    let srv = serve(base_limits().build().unwrap(), NOON).await;
    let mut c = H1::connect(srv.addr).await;
    let g = c
        .send(Request::post("/v1/labels:batch").header("authorization", "Bearer sk_free"))
        .await;
    assert_eq!(g.status, 400);
    assert!(g.header("retry-after").is_none());
    assert_eq!(g.header("cache-control"), Some("no-store"));
    let p = g.json();
    assert!(p["type"].as_str().unwrap().ends_with("cost_exceeds_burst"));
    assert_eq!(p["limit"], "burst");
    // nothing was spent
    let g = c.send(get("/v1/rates", "sk_free")).await;
    assert_eq!(burst_r(&g), 19);
}

#[tokio::test]
async fn several_denials_take_the_longest_wait_and_shadow_never_rejects() {
    let plan = Plan::new(
        "p",
        vec![
            Policy::token_bucket("burst", 3, 3).unwrap(),
            Policy::fixed_window("minute", 3, 60).unwrap(),
            Policy::token_bucket("trial", 1, 10)
                .unwrap()
                .with_shadow(true),
        ],
    )
    .unwrap();
    let limits = Limits::builder().plan(plan).key("k", "p").build().unwrap();
    let srv = serve(limits, NOON + 30).await;
    let mut c = H1::connect(srv.addr).await;
    for i in 1..=3u64 {
        let g = c.send(get("/x", "k")).await;
        assert_eq!(g.status, 200, "the shadow policy never rejects");
        assert_eq!(param(g.header("ratelimit").unwrap(), "trial", "r"), 0);
        assert_eq!(param(g.header("ratelimit").unwrap(), "minute", "r"), 3 - i);
    }
    let g = c.send(get("/x", "k")).await;
    assert_eq!(g.status, 429);
    // burst frees a token in 1 s, the minute window in 30 s: the minute names it
    assert_eq!(g.header("retry-after"), Some("30"));
    let p = g.json();
    assert_eq!(p["limit"], "minute");
    assert_eq!(p["retry_after_s"], 30);
}

#[tokio::test]
async fn a_key_that_keeps_hammering_is_escalated_then_blocked() {
    let limits = base_limits()
        .escalation(paceline_server::EscalationConfig {
            extend_after: 5,
            extend_factor: 4,
            block_after: 15,
            block_for_s: 120,
            ..Default::default()
        })
        .build()
        .unwrap();
    let srv = serve(limits, NOON).await;
    exhaust(&srv, "sk_free").await;
    let mut c = H1::connect(srv.addr).await;
    let mut waits = Vec::new();
    for _ in 0..16 {
        let g = c.send(get("/v1/rates", "sk_free")).await;
        assert_eq!(g.status, 429);
        waits.push(g.header("retry-after").unwrap().parse::<u64>().unwrap());
    }
    assert_eq!(waits[..5], [1, 1, 1, 1, 1]);
    assert!(waits[5..15].iter().all(|&w| w == 4), "{waits:?}");
    assert_eq!(waits[15], 120, "{waits:?}");
    // blocked even after the limit itself has refilled
    srv.clock.advance(Nanos::from_secs(60));
    let g = c.send(get("/v1/rates", "sk_free")).await;
    assert_eq!(
        (g.status.as_u16(), g.header("retry-after")),
        (429, Some("60"))
    );
    // other keys are untouched
    assert_eq!(c.send(get("/v1/rates", "sk_other")).await.status, 200);
    // after the block a patient key is served again
    srv.clock.advance(Nanos::from_secs(61));
    assert_eq!(c.send(get("/v1/rates", "sk_free")).await.status, 200);
    assert_eq!(srv.inner.calls(), 20 + 1 + 1);
}

#[tokio::test]
async fn concurrency_units_come_back_when_the_response_ends_or_is_cancelled() {
    let plan = Plan::new(
        "c",
        vec![
            Policy::concurrency("inflight", 1).unwrap(),
            Policy::daily("daily", 100).unwrap(),
        ],
    )
    .unwrap();
    let limits = Limits::builder().plan(plan).key("k", "c").build().unwrap();
    let limiter = RateLimiter::new(limits, MemoryStore::new(), ManualClock::at_unix_secs(NOON));
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let entered = Arc::new(tokio::sync::Notify::new());
    let (g, e) = (gate.clone(), entered.clone());
    let svc = limiter
        .layer()
        .layer(tower::service_fn(move |_r: Request<()>| {
            let (g, e) = (g.clone(), e.clone());
            async move {
                e.notify_one();
                g.acquire().await.unwrap().forget();
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"done"))))
            }
        }));
    let req = || {
        Request::get("/slow")
            .header("authorization", "Bearer k")
            .body(())
            .unwrap()
    };
    // one in flight: a second is refused
    let first = tokio::spawn(svc.clone().oneshot(req()));
    entered.notified().await;
    let second = svc.clone().oneshot(req()).await.unwrap();
    assert_eq!(second.status(), 429);
    // the first finishes; its unit comes back once its body is done
    gate.add_permits(1);
    let res = first.await.unwrap().unwrap();
    assert_eq!(res.status(), 200);
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"done");
    // a cancelled request gives its unit back too
    let third = tokio::spawn(svc.clone().oneshot(req()));
    entered.notified().await;
    third.abort();
    assert!(third.await.unwrap_err().is_cancelled());
    gate.add_permits(1);
    let fourth = svc.clone().oneshot(req()).await.unwrap();
    assert_eq!(fourth.status(), 200);
}

#[tokio::test]
async fn reload_keeps_counters_and_older_dialects_are_optional() {
    let srv = serve(base_limits().build().unwrap(), NOON).await;
    exhaust(&srv, "sk_free").await;
    let mut c = H1::connect(srv.addr).await;
    assert_eq!(c.send(get("/v1/rates", "sk_free")).await.status, 429);
    // the same plan with a deeper burst, and every dialect
    let deeper = Plan::new(
        "free",
        vec![
            Policy::token_bucket("burst", 30, 3).unwrap(),
            Policy::daily("daily", 10_000).unwrap(),
        ],
    )
    .unwrap();
    let limits = Limits::builder()
        .plan(deeper)
        .key("sk_free", "free")
        .dialects(paceline_server::Dialects::all())
        .build()
        .unwrap();
    srv.limiter.reload(limits);
    let g = c.send(get("/v1/rates", "sk_free")).await;
    assert_eq!(g.status, 200, "ten more tokens of depth");
    assert_eq!(burst_r(&g), 9);
    assert_eq!(param(g.header("ratelimit").unwrap(), "daily", "r"), 9_979);
    assert_eq!(g.header("x-ratelimit-limit"), Some("30"));
    assert_eq!(g.header("x-ratelimit-remaining"), Some("9"));
    assert_eq!(g.header("ratelimit-limit"), Some("30"));
    assert_eq!(g.header("ratelimit-remaining"), Some("9"));
}
