//! The gateway in process, against the demo API on loopback: headers and
//! rejections through the proxy, shedding under overload, reload, h2c and
//! graceful shutdown. Every wait is bounded.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use paceline_core::{Clock, ManualClock};
use paceline_demo::api::{self as demo, DemoOptions, DemoUpstream};
use paceline_gateway::{Gateway, GatewayConfig, GatewayHandle, ReloadEvent};
use serde_json::Value;

const LIMIT: Duration = Duration::from_secs(10);

fn config_text(upstream: SocketAddr, burst: u64, minute: u64, max_in_flight: u32) -> String {
    format!(
        r#"[gateway]
listen = "127.0.0.1:0"
upstream = "http://{upstream}"
watch = false

[gateway.shedding]
max_in_flight = {max_in_flight}
reserve = 0.2

[plans.free]
policies = [
  {{ name = "burst", algorithm = "token_bucket", q = {burst}, w = 3600, kind = "burst" }},
  {{ name = "hour", algorithm = "fixed_window", q = {minute}, w = 3600 }},
]

[plans.login]
policies = [{{ name = "login", algorithm = "fixed_window", q = 2, w = 60 }}]

[keys]
sk_a = "free"
sk_b = "free"

[[routes]]
method = "POST"
path = "/v1/labels"
criticality = "CRITICAL"

[[routes]]
method = "GET"
path = "/v1/rates"
criticality = "SHEDDABLE"

[[routes]]
method = "POST"
path = "/v1/login"
anonymous = true
plan = "login"
"#
    )
}

struct Rig {
    api: DemoUpstream,
    addr: SocketAddr,
    handle: GatewayHandle,
    served: tokio::task::JoinHandle<std::io::Result<()>>,
    client: Client<HttpConnector, Full<Bytes>>,
    file: PathBuf,
}

impl Rig {
    async fn start(name: &str, delay: Duration, burst: u64, hour: u64, inflight: u32) -> Rig {
        let api = demo::serve(([127, 0, 0, 1], 0).into(), DemoOptions { delay })
            .await
            .unwrap();
        api.record_headers();
        let dir = std::env::temp_dir().join(format!("pl-gw-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("gateway.toml");
        std::fs::write(&file, config_text(api.addr(), burst, hour, inflight)).unwrap();
        let cfg = GatewayConfig::load(&file).unwrap();
        let clock: Arc<dyn Clock> = Arc::new(ManualClock::at_unix_secs(1_790_000_000));
        let gw = Gateway::bind_with_clock(cfg, clock).await.unwrap();
        let addr = gw.local_addr();
        let handle = gw.handle();
        let served = tokio::spawn(gw.run(std::future::pending()));
        let client = Client::builder(TokioExecutor::new()).build_http();
        Rig {
            api,
            addr,
            handle,
            served,
            client,
            file,
        }
    }

    fn req(&self, method: &str, path: &str, key: Option<&str>) -> http::request::Builder {
        let mut b = Request::builder()
            .method(method)
            .uri(format!("http://{}{path}", self.addr));
        if let Some(k) = key {
            b = b.header("authorization", format!("Bearer {k}"));
        }
        b
    }

    async fn send(&self, req: Request<Full<Bytes>>) -> (Response<()>, Bytes) {
        let res = tokio::time::timeout(LIMIT, self.client.request(req))
            .await
            .expect("answer in time")
            .expect("a response");
        let (parts, body) = res.into_parts();
        let body = tokio::time::timeout(LIMIT, body.collect())
            .await
            .expect("body in time")
            .expect("a body")
            .to_bytes();
        (Response::from_parts(parts, ()), body)
    }

    async fn get(&self, path: &str, key: &str) -> (Response<()>, Bytes) {
        let req = self
            .req("GET", path, Some(key))
            .body(Full::default())
            .unwrap();
        self.send(req).await
    }

    async fn usage_left(&self, key: &str) -> Vec<u64> {
        let (res, body) = self.get("/v1/usage", key).await;
        assert_eq!(res.status(), 200);
        let v: Value = serde_json::from_slice(&body).unwrap();
        v["limits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["r"].as_u64().unwrap())
            .collect()
    }

    async fn stop(self) {
        self.handle.shutdown();
        tokio::time::timeout(LIMIT, self.served)
            .await
            .expect("stops in time")
            .unwrap()
            .unwrap();
        let _ = std::fs::remove_dir_all(self.file.parent().unwrap());
    }
}

fn header<'a>(res: &'a Response<()>, name: &str) -> &'a str {
    res.headers()
        .get(name)
        .map(|v| v.to_str().unwrap())
        .unwrap_or("")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_and_rejections_through_the_proxy() {
    let rig = Rig::start("headers", Duration::ZERO, 3, 1000, 0).await;
    for left in [2, 1, 0] {
        let (res, _) = rig.get("/v1/rates", "sk_a").await;
        assert_eq!(res.status(), 200);
        assert_eq!(
            header(&res, "ratelimit-policy"),
            r#""burst";q=3;w=3600, "hour";q=1000;w=3600"#
        );
        assert!(header(&res, "ratelimit").starts_with(&format!("\"burst\";r={left};")));
    }
    let hits = rig.api.hits();
    let (res, body) = rig.get("/v1/rates", "sk_a").await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&res, "retry-after"), "1200");
    assert_eq!(header(&res, "cache-control"), "no-store");
    assert_eq!(
        header(&res, "content-type"),
        paceline_wire::PROBLEM_CONTENT_TYPE
    );
    let p: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(p["limit"], "burst");
    assert_eq!(p["retry_after_s"], 1200);
    assert!(p["type"].as_str().unwrap().ends_with("rate_limited"));
    assert_eq!(
        rig.api.hits(),
        hits,
        "a rejected request never reaches the upstream"
    );

    // another key is not affected; forwarding headers are right
    let req = rig
        .req("POST", "/v1/labels", Some("sk_b"))
        .header("connection", "x-private")
        .header("x-private", "secret")
        .header("idempotency-key", "k1")
        .body(Full::new(Bytes::from_static(b"{\"shipment\":1}")))
        .unwrap();
    let (res, first) = rig.send(req).await;
    assert_eq!(res.status(), 201);
    let seen = rig.api.last_headers().unwrap();
    assert_eq!(seen["x-forwarded-for"], "127.0.0.1");
    assert!(
        seen.get("x-private").is_none(),
        "named in Connection: dropped"
    );
    assert!(seen.get("connection").is_none());
    // the body streams through: same key, other body is a conflict upstream
    let req = |body: &'static [u8]| {
        rig.req("POST", "/v1/labels", Some("sk_b"))
            .header("idempotency-key", "k1")
            .body(Full::new(Bytes::from_static(body)))
            .unwrap()
    };
    let (res, replay) = rig.send(req(b"{\"shipment\":1}")).await;
    assert_eq!((res.status().as_u16(), &replay), (201, &first));
    let (res, _) = rig.send(req(b"{\"shipment\":2}")).await;
    assert_eq!(res.status(), 409);
    assert_eq!(rig.api.labels_created(), 1);

    // anonymous login limits publish no counters
    for status in [200, 200, 429] {
        let req = rig
            .req("POST", "/v1/login", None)
            .body(Full::default())
            .unwrap();
        let (res, _) = rig.send(req).await;
        assert_eq!(res.status(), status);
        assert!(res.headers().get("ratelimit").is_none());
    }
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_sheds_sheddable_first_and_charges_no_503() {
    // 10 in flight at most: quotes may use 6, labels 9
    let rig = Rig::start("shed", Duration::from_millis(400), 1000, 1000, 10).await;
    let rig = Arc::new(rig);
    let mut quotes = Vec::new();
    for _ in 0..20 {
        let r = rig.clone();
        quotes.push(tokio::spawn(async move {
            r.get("/v1/rates", "sk_a").await.0.status()
        }));
    }
    // wait (bounded) until the quotes that fit are at the upstream
    for _ in 0..200 {
        if rig.handle.shedder().in_flight() >= 6 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut labels = Vec::new();
    for i in 0..3 {
        let r = rig.clone();
        labels.push(tokio::spawn(async move {
            let req = r
                .req("POST", "/v1/labels", Some("sk_a"))
                .header("idempotency-key", format!("shed-{i}"))
                .body(Full::default())
                .unwrap();
            r.send(req).await.0.status()
        }));
    }
    let mut quote_status = Vec::new();
    for q in quotes {
        quote_status.push(q.await.unwrap().as_u16());
    }
    let mut label_status = Vec::new();
    for l in labels {
        label_status.push(l.await.unwrap().as_u16());
    }
    let ok = quote_status.iter().filter(|&&s| s == 200).count();
    let shed = quote_status.iter().filter(|&&s| s == 503).count();
    assert_eq!((ok, shed), (6, 14), "{quote_status:?}");
    assert_eq!(label_status, vec![201, 201, 201], "critical work goes on");
    assert_eq!(rig.api.hits_on("/v1/rates"), 6);
    // 9 admitted, 14 shed: only the admitted ones were charged
    assert_eq!(rig.usage_left("sk_a").await, vec![991, 991]);
    let rig = Arc::try_unwrap(rig).ok().unwrap();
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shed_answer_is_a_proper_503() {
    let rig = Rig::start("shed503", Duration::from_millis(300), 1000, 1000, 1).await;
    let (rig, res, body) = quote_while_one_is_in_flight(rig).await;
    assert_eq!(res.status(), 503);
    assert_eq!(header(&res, "retry-after"), "1");
    assert_eq!(header(&res, "cache-control"), "no-store");
    let p: Value = serde_json::from_slice(&body).unwrap();
    assert!(p["type"].as_str().unwrap().ends_with("overloaded"));
    assert_eq!(p["retry_after_s"], 1);
    // the key's counters, as they stand: the shed request charged nothing
    assert_eq!(
        header(&res, "ratelimit-policy"),
        "\"burst\";q=1000;w=3600, \"hour\";q=1000;w=3600"
    );
    assert!(
        header(&res, "ratelimit").contains("\"hour\";r=999;"),
        "{}",
        header(&res, "ratelimit")
    );
    rig.stop().await;
}

/// Asks for a quote while a slow label request holds the one unit of
/// capacity of a rig started with one in flight and a delay; the label
/// request is seen to succeed.
async fn quote_while_one_is_in_flight(rig: Rig) -> (Rig, Response<()>, Bytes) {
    let rig = Arc::new(rig);
    let r = rig.clone();
    let slow = tokio::spawn(async move { r.get("/v1/labels/lbl_77120", "sk_a").await.0 });
    for _ in 0..200 {
        if rig.handle.shedder().in_flight() >= 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (res, body) = rig.get("/v1/rates", "sk_a").await;
    assert_eq!(slow.await.unwrap().status(), 200);
    let rig = Arc::try_unwrap(rig).ok().unwrap();
    (rig, res, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_changes_a_quota_and_keeps_counters() {
    let rig = Rig::start("reload", Duration::ZERO, 1000, 100, 0).await;
    for _ in 0..5 {
        assert_eq!(rig.get("/v1/rates", "sk_a").await.0.status(), 200);
    }
    assert_eq!(rig.usage_left("sk_a").await, vec![995, 95]);
    let up = rig.api.addr();
    std::fs::write(&rig.file, config_text(up, 1000, 50, 0)).unwrap();
    assert_eq!(rig.handle.reload(), ReloadEvent::Applied { notes: vec![] });
    let (res, _) = rig.get("/v1/rates", "sk_a").await;
    assert!(header(&res, "ratelimit-policy").contains(r#""hour";q=50;w=3600"#));
    assert!(
        header(&res, "ratelimit").contains(r#""hour";r=44;"#),
        "{:?}",
        res.headers()
    );

    // a broken file is refused; the last good one keeps serving
    std::fs::write(&rig.file, config_text(up, 1000, 0, 0)).unwrap();
    match rig.handle.reload() {
        ReloadEvent::Refused(e) => {
            assert_eq!(e.field(), "plans.free.policies[1].q");
            assert_eq!(e.line(), 13);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(rig.usage_left("sk_a").await, vec![994, 44]);
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_saved_before_the_watcher_first_looks_is_reloaded() {
    let dir = std::env::temp_dir().join(format!("pl-gw-early-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("gateway.toml");
    let up: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let text = |hour| config_text(up, 1000, hour, 0).replace("watch = false", "watch = true");
    std::fs::write(&file, text(100)).unwrap();
    let gw = Gateway::bind(GatewayConfig::load(&file).unwrap())
        .await
        .unwrap();
    // saved between reading the file and serving: the watcher must see it
    std::fs::write(&file, text(7)).unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let gw = gw.on_reload(move |e| {
        let _ = tx.send(e.clone());
    });
    let handle = gw.handle();
    let served = tokio::spawn(gw.run(std::future::pending()));
    let event = tokio::time::timeout(LIMIT, rx.recv()).await;
    assert_eq!(
        event.expect("a reload in time"),
        Some(ReloadEvent::Applied { notes: vec![] })
    );
    let hour = handle.limiter().limits().plan("free").unwrap().policies()[1].quota();
    assert_eq!(hour, 7);
    handle.shutdown();
    let _ = tokio::time::timeout(LIMIT, served).await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reloaded_problem_base_reaches_the_shedders_503s() {
    let rig = Rig::start("shed-base", Duration::from_millis(300), 1000, 1000, 1).await;
    let text = config_text(rig.api.addr(), 1000, 1000, 1);
    let base = "https://errors.example.test/p/";
    std::fs::write(&rig.file, format!("problem_base = \"{base}\"\n{text}")).unwrap();
    assert_eq!(rig.handle.reload(), ReloadEvent::Applied { notes: vec![] });
    let (rig, res, body) = quote_while_one_is_in_flight(rig).await;
    assert_eq!(res.status(), 503);
    let p: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(p["type"], format!("{base}overloaded"));
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_names_every_setting_it_cannot_apply() {
    let rig = Rig::start("restart", Duration::ZERO, 1000, 100, 0).await;
    let up = rig.api.addr();
    let text = config_text(up, 1000, 100, 8)
        .replacen("listen = \"127.0.0.1:0\"", "listen = \"127.0.0.1:1\"", 1)
        .replacen(&format!("http://{up}"), "http://127.0.0.1:2", 1)
        .replacen(
            "watch = false",
            "watch = false\nmetrics_listen = \"127.0.0.1:0\"\n\
             soft_limit_webhook = \"http://127.0.0.1:3/hook\"\n\
             [gateway.timeouts]\nconnect_ms = 500",
            1,
        );
    let text = format!("soft_limit = 0.5\n[escalation]\nenabled = false\n{text}");
    std::fs::write(&rig.file, text).unwrap();
    let notes = match rig.handle.reload() {
        ReloadEvent::Applied { notes } => notes,
        other => panic!("{other:?}"),
    };
    let names = [
        "gateway.listen",
        "gateway.upstream",
        "gateway.metrics_listen",
        "gateway.timeouts",
        "escalation",
        "soft_limit",
    ];
    let expected: Vec<String> = names
        .iter()
        .map(|n| format!("{n} changed; restart to apply it"))
        .collect();
    assert_eq!(notes, expected);
    // the rest is applied: shedding, and the limits for the limiter
    assert_eq!(rig.handle.shedder().settings().max_in_flight, 8);
    assert_eq!(rig.handle.limiter().limits().soft_limit(), Some(0.5));
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_removed_by_a_reload_is_not_called() {
    let rig = Rig::start("unhook", Duration::ZERO, 1000, 10, 0).await;
    let up = rig.api.addr();
    let plain = config_text(up, 1000, 10, 0);
    let hooked = plain.replacen(
        "watch = false",
        &format!("watch = false\nsoft_limit_webhook = \"http://{up}/hooks/soft-limit\""),
        1,
    );
    std::fs::write(&rig.file, hooked).unwrap();
    assert_eq!(rig.handle.reload(), ReloadEvent::Applied { notes: vec![] });
    std::fs::write(&rig.file, plain).unwrap();
    assert_eq!(rig.handle.reload(), ReloadEvent::Applied { notes: vec![] });
    let mut warned = 0;
    for _ in 0..9 {
        let (res, _) = rig.get("/v1/rates", "sk_a").await;
        assert_eq!(res.status(), 200);
        warned += usize::from(res.headers().contains_key("ratelimit-warning"));
    }
    assert_eq!(warned, 2, "the soft limit is still published");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(rig.api.soft_limit_events().is_empty());
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2c_clients_are_served() {
    let rig = Rig::start("h2c", Duration::ZERO, 10, 100, 0).await;
    let h2: Client<HttpConnector, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    let req = rig
        .req("GET", "/v1/rates", Some("sk_a"))
        .body(Full::default())
        .unwrap();
    let res = tokio::time::timeout(LIMIT, h2.request(req))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(res.version(), http::Version::HTTP_2);
    assert_eq!(res.status(), 200);
    assert!(res.headers()["ratelimit"].to_str().unwrap().contains("r=9"));
    assert_eq!(
        rig.api.last_headers().unwrap()["host"],
        rig.addr.to_string()
    );
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_finishes_requests_in_flight() {
    let rig = Rig::start("shutdown", Duration::from_millis(300), 10, 100, 100).await;
    let rig = Arc::new(rig);
    let r = rig.clone();
    let slow = tokio::spawn(async move { r.get("/v1/rates", "sk_a").await.0.status() });
    for _ in 0..200 {
        if rig.handle.shedder().in_flight() >= 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    rig.handle.shutdown();
    assert_eq!(slow.await.unwrap(), 200);
    let rig = Arc::try_unwrap(rig).ok().unwrap();
    tokio::time::timeout(LIMIT, rig.served)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    // no longer accepting
    assert!(tokio::net::TcpStream::connect(rig.addr).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soft_limits_fire_the_webhook_and_metrics_are_served() {
    let rig = Rig::start("hook", Duration::ZERO, 1000, 10, 0).await;
    let up = rig.api.addr();
    let text = config_text(up, 1000, 10, 0).replacen(
        "watch = false",
        &format!(
            "watch = false\nsoft_limit_webhook = \"http://{up}/hooks/soft-limit\"\nmetrics_listen = \"127.0.0.1:0\""
        ),
        1,
    );
    std::fs::write(&rig.file, text).unwrap();
    let cfg = GatewayConfig::load(&rig.file).unwrap();
    let gw = Gateway::bind(cfg).await.unwrap();
    let (addr, metrics) = (gw.local_addr(), gw.metrics_addr().unwrap());
    let h = gw.handle();
    let served = tokio::spawn(gw.run(std::future::pending()));
    let get = |path: String| {
        Request::get(path)
            .header("authorization", "Bearer sk_a")
            .body(Full::default())
            .unwrap()
    };
    let mut warned = Vec::new();
    for _ in 0..9 {
        let (res, _) = rig.send(get(format!("http://{addr}/v1/rates"))).await;
        assert_eq!(res.status(), 200);
        warned.push(res.headers().contains_key("ratelimit-warning"));
    }
    // 8 of 10 is the 80% soft limit
    assert_eq!(warned.iter().filter(|&&w| w).count(), 2, "{warned:?}");
    for _ in 0..200 {
        if !rig.api.soft_limit_events().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let events = rig.api.soft_limit_events();
    assert_eq!(events.len(), 1, "once per key and window");
    let ev: Value = serde_json::from_slice(&events[0]).unwrap();
    assert_eq!(
        (ev["policy"].as_str(), ev["used"].as_u64()),
        (Some("hour"), Some(8))
    );

    let (res, body) = rig.send(get(format!("http://{metrics}/metrics"))).await;
    assert_eq!(res.status(), 200);
    let text = String::from_utf8_lossy(&body);
    assert!(text.contains("paceline_decisions_total"), "{text}");
    assert!(text.contains("paceline_gateway_upstream_seconds"), "{text}");
    h.shutdown();
    served.await.unwrap().unwrap();
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_upstream_is_a_502() {
    let rig = Rig::start("bad-up", Duration::ZERO, 10, 100, 0).await;
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let mut cfg = GatewayConfig::load(&rig.file).unwrap();
    cfg.settings.upstream = format!("http://{dead}").parse().unwrap();
    let base = cfg.limits.problem_base().to_string();
    let gw = Gateway::bind(cfg).await.unwrap();
    let addr = gw.local_addr();
    let h = gw.handle();
    let served = tokio::spawn(gw.run(std::future::pending()));
    let req = Request::get(format!("http://{addr}/v1/rates"))
        .header("authorization", "Bearer sk_a")
        .body(Full::default())
        .unwrap();
    let (res, body) = rig.send(req).await;
    assert_eq!(res.status(), 502);
    // the gateway's own answer has a type under the configured base
    let p: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(p["type"], format!("{base}bad_gateway"));
    assert_eq!(p["title"], "Bad Gateway");

    // a reloaded problem base reaches the gateway's own answers too
    let text = std::fs::read_to_string(&rig.file).unwrap();
    let new_base = "https://errors.example.test/gw/";
    std::fs::write(&rig.file, format!("problem_base = \"{new_base}\"\n{text}")).unwrap();
    assert!(matches!(h.reload(), ReloadEvent::Applied { .. }));
    let req = Request::get(format!("http://{addr}/v1/rates"))
        .header("authorization", "Bearer sk_a")
        .body(Full::default())
        .unwrap();
    let (res, body) = rig.send(req).await;
    assert_eq!(res.status(), 502);
    let p: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(p["type"], format!("{new_base}bad_gateway"));
    h.shutdown();
    served.await.unwrap().unwrap();
    rig.stop().await;
}

/// A bare HTTP/1.1 upstream on loopback: it counts the connections it
/// accepts, keeps the head of the last request, and answers every request
/// `ok`, closing each connection after one answer when `close` is set.
async fn bare_upstream(
    close: bool,
) -> (
    SocketAddr,
    Arc<std::sync::atomic::AtomicUsize>,
    Arc<parking_lot::Mutex<String>>,
) {
    use std::sync::atomic::Ordering;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let last = Arc::new(parking_lot::Mutex::new(String::new()));
    let (a, h) = (accepted.clone(), last.clone());
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            a.fetch_add(1, Ordering::SeqCst);
            let h = h.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 1024];
                loop {
                    let Ok(n) = s.read(&mut chunk).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        *h.lock() = String::from_utf8_lossy(&buf[..end]).into_owned();
                        buf.drain(..end + 4);
                        let answer: &[u8] = match close {
                            true => b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok",
                            false => b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
                        };
                        if s.write_all(answer).await.is_err() || close {
                            return;
                        }
                    }
                }
            });
        }
    });
    (addr, accepted, last)
}

async fn through_bare_upstream(name: &str, close: bool) -> (usize, String) {
    through_bare_upstream_with(name, close, false).await
}

async fn through_bare_upstream_with(
    name: &str,
    close: bool,
    client_close: bool,
) -> (usize, String) {
    let rig = Rig::start(name, Duration::ZERO, 100, 1000, 0).await;
    let (up, accepted, last) = bare_upstream(close).await;
    let mut cfg = GatewayConfig::load(&rig.file).unwrap();
    cfg.settings.upstream = format!("http://{up}/base/").parse().unwrap();
    let gw = Gateway::bind(cfg).await.unwrap();
    let addr = gw.local_addr();
    let h = gw.handle();
    let served = tokio::spawn(gw.run(std::future::pending()));
    for _ in 0..5 {
        let mut req = Request::get(format!("http://{addr}/v1/rates?from=NYC"))
            .header("authorization", "Bearer sk_a")
            .header("x-forwarded-for", "10.1.2.3");
        if client_close {
            req = req.header("connection", "close");
        }
        let req = req.body(Full::default()).unwrap();
        let (res, body) = rig.send(req).await;
        assert_eq!(res.status(), 200);
        assert_eq!(&body[..], b"ok");
    }
    h.shutdown();
    served.await.unwrap().unwrap();
    rig.stop().await;
    let head = last.lock().clone();
    (accepted.load(std::sync::atomic::Ordering::SeqCst), head)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_connections_are_reused() {
    let (accepted, head) = through_bare_upstream("reuse", false).await;
    assert_eq!(accepted, 1, "one keep-alive connection serves them all");
    let head = head.to_ascii_lowercase();
    assert!(
        head.starts_with("get /base/v1/rates?from=nyc http/1.1\r\n"),
        "{head}"
    );
    assert!(head.contains("\r\nhost: 127.0.0.1:"), "{head}");
    // the client is no trusted proxy: its own X-Forwarded-For is replaced
    // by its address
    assert!(
        head.contains("\r\nx-forwarded-for: 127.0.0.1\r\n"),
        "{head}"
    );
    assert!(!head.contains("10.1.2.3"), "{head}");
    assert!(head.contains("\r\nx-forwarded-proto: http"), "{head}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_upstream_connections_are_not_reused() {
    let (accepted, _) = through_bare_upstream("close", true).await;
    assert_eq!(accepted, 5, "a new connection for every request");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_finishes_its_head_is_cut_off() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // the upstream takes longer than the header bound: a request in flight
    // is not cut off
    let rig = Rig::start("slow-head", Duration::from_millis(400), 10, 100, 0).await;
    let mut cfg = GatewayConfig::load(&rig.file).unwrap();
    cfg.settings.timeouts.client_header = Duration::from_millis(200);
    let gw = Gateway::bind(cfg).await.unwrap();
    let addr = gw.local_addr();
    let h = gw.handle();
    let served = tokio::spawn(gw.run(std::future::pending()));

    let req = Request::get(format!("http://{addr}/v1/rates"))
        .header("authorization", "Bearer sk_a")
        .body(Full::default())
        .unwrap();
    let (res, _) = rig.send(req).await;
    assert_eq!(res.status(), 200);

    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /v1/rates HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let mut buf = [0u8; 256];
    let n = tokio::time::timeout(LIMIT, s.read(&mut buf))
        .await
        .expect("closed in time")
        .unwrap_or(0);
    assert_eq!(n, 0, "closed without an answer");
    assert!(started.elapsed() >= Duration::from_millis(150));
    h.shutdown();
    served.await.unwrap().unwrap();
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_close_leave_their_upstream_connection_to_others() {
    let (accepted, head) = through_bare_upstream_with("client-close", false, true).await;
    assert!((1..=5).contains(&accepted), "{accepted}");
    assert!(
        !head.to_ascii_lowercase().contains("connection: close"),
        "{head}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_config_refuses_unknown_keys_and_limits_the_keyless_per_ip() {
    let api = demo::serve(([127, 0, 0, 1], 0).into(), DemoOptions::default())
        .await
        .unwrap();
    let cfg = demo::shiplane_config("127.0.0.1:0".parse().unwrap(), api.addr()).unwrap();
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::at_unix_secs(1_790_000_000));
    let gw = Gateway::bind_with_clock(cfg, clock).await.unwrap();
    let rig = Rig {
        addr: gw.local_addr(),
        handle: gw.handle(),
        served: tokio::spawn(gw.run(std::future::pending())),
        client: Client::builder(TokioExecutor::new()).build_http(),
        file: std::env::temp_dir().join(format!("pl-gw-shipped-{}/none", std::process::id())),
        api,
    };
    let code = |body: &Bytes| {
        let v: Value = serde_json::from_slice(body).unwrap();
        v["type"]
            .as_str()
            .unwrap()
            .rsplit('/')
            .next()
            .unwrap()
            .to_string()
    };
    // a key nobody issued gets nothing past the gateway, however often
    for _ in 0..30 {
        let (res, body) = rig.get("/v1/rates", "sk_not_a_key").await;
        assert_eq!(res.status(), 401);
        assert_eq!(code(&body), "unknown_key");
        assert_eq!(header(&res, "ratelimit"), "");
    }
    let (res, body) = rig.get("/v1/usage", "sk_not_a_key").await;
    assert_eq!(
        (res.status().as_u16(), code(&body)),
        (401, "unknown_key".into())
    );
    // no key: the anonymous plan, per IP, publishing nothing
    let keyless = || {
        rig.req("GET", "/v1/rates", None)
            .body(Full::default())
            .unwrap()
    };
    for _ in 0..10 {
        let (res, _) = rig.send(keyless()).await;
        assert_eq!(res.status(), 200);
        assert_eq!(header(&res, "ratelimit"), "");
    }
    let (res, _) = rig.send(keyless()).await;
    assert_eq!(res.status(), 429);
    assert_eq!(header(&res, "ratelimit"), "");
    let usage = rig
        .req("GET", "/v1/usage", None)
        .body(Full::default())
        .unwrap();
    let (res, body) = rig.send(usage).await;
    assert_eq!(
        (res.status().as_u16(), code(&body)),
        (401, "unauthorized".into())
    );
    // a demo key is on the Free plan as before
    let (res, _) = rig.get("/v1/rates", "sk_demo_alice").await;
    assert_eq!(res.status(), 200);
    assert!(header(&res, "ratelimit").starts_with("\"burst\";r=19"));
    rig.stop().await;
}
