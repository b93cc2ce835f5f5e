//! `paceline check` behind real proxies: nginx (`auth_request`, the recipe
//! of `examples/nginx-check.conf`) and Caddy (`examples/Caddyfile.check`),
//! each in front of a counting upstream, their configurations the
//! examples with the ports of this run put in. What a client gets through
//! them is compared with what `paceline gateway` answers for the same file
//! and the same requests (each on a manual clock stopped at the same
//! instant, so every field and `Retry-After` must agree to the byte).
//!
//! The proxies come from Debian: `scripts/test.sh` installs nginx and
//! caddy. Without one a run in CI fails; elsewhere it says what is missing
//! and skips.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use paceline_core::{Clock, ManualClock};
use paceline_gateway::check::Check;
use paceline_gateway::{Gateway, GatewayConfig, GatewayHandle};

use common::nginx::{free_port, missing};
use common::{counting_upstream, until_closed, LIMIT};

/// The instant both clocks stand at.
const NOW_S: u64 = 1_790_880_000;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn binary(candidates: &[&'static str]) -> Option<&'static str> {
    candidates.iter().copied().find(|p| Path::new(p).exists())
}

/// A proxy process, stopped (and its directory removed) when dropped.
struct Proxy {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Proxy {
    fn wait_listening(mut self) -> Proxy {
        let deadline = Instant::now() + LIMIT;
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if let Ok(Some(status)) = self.child.try_wait() {
                let log = std::fs::read_to_string(self.dir.join("out.log")).unwrap_or_default();
                panic!("the proxy exited ({status}) before listening:\n{log}");
            }
            assert!(Instant::now() < deadline, "the proxy did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
        self
    }
}

/// The example `name` with its three addresses replaced by this run's.
fn example(name: &str, front: u16, check: u16, api: SocketAddr) -> String {
    let text = std::fs::read_to_string(workspace().join("examples").join(name)).unwrap();
    for addr in ["127.0.0.1:8080", "127.0.0.1:8081", "127.0.0.1:9000"] {
        assert!(text.contains(addr), "{name} names {addr}");
    }
    text.replace("127.0.0.1:8080", &format!("127.0.0.1:{front}"))
        .replace("127.0.0.1:8081", &format!("127.0.0.1:{check}"))
        .replace("127.0.0.1:9000", &api.to_string())
}

fn scratch(what: &str, port: u16) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "paceline-check-{what}-{}-{port}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// nginx with `examples/nginx-check.conf`.
fn nginx(check: u16, api: SocketAddr) -> Option<Proxy> {
    let Some(bin) = binary(&["/usr/sbin/nginx", "/usr/bin/nginx"]) else {
        missing("nginx (Debian package nginx)");
        return None;
    };
    let port = free_port();
    let dir = scratch("nginx", port);
    std::fs::create_dir_all(dir.join("logs")).unwrap();
    std::fs::create_dir_all(dir.join("temp")).unwrap();
    let conf = dir.join("nginx.conf");
    std::fs::write(&conf, example("nginx-check.conf", port, check, api)).unwrap();
    let out = std::fs::File::create(dir.join("out.log")).unwrap();
    let child = Command::new(bin)
        .arg("-p")
        .arg(&dir)
        .arg("-c")
        .arg(&conf)
        .args(["-g", "daemon off; master_process off;"])
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .expect("nginx starts");
    Some(Proxy { child, port, dir }.wait_listening())
}

/// Caddy with `examples/Caddyfile.check`.
fn caddy(check: u16, api: SocketAddr) -> Option<Proxy> {
    let Some(bin) = binary(&["/usr/bin/caddy", "/usr/local/bin/caddy"]) else {
        missing("caddy (Debian package caddy)");
        return None;
    };
    let port = free_port();
    let dir = scratch("caddy", port);
    let conf = dir.join("Caddyfile");
    std::fs::write(&conf, example("Caddyfile.check", port, check, api)).unwrap();
    let out = std::fs::File::create(dir.join("out.log")).unwrap();
    let child = Command::new(bin)
        .args(["run", "--adapter", "caddyfile", "--config"])
        .arg(&conf)
        // its state (autosave, certificates) in the scratch directory
        .env("HOME", &dir)
        .env("XDG_DATA_HOME", &dir)
        .env("XDG_CONFIG_HOME", &dir)
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .expect("caddy starts");
    Some(Proxy { child, port, dir }.wait_listening())
}

/// `examples/shiplane.toml` with the upstream of this run.
fn shiplane(api: SocketAddr) -> GatewayConfig {
    shiplane_with(api, "")
}

fn clock() -> Arc<dyn Clock> {
    Arc::new(ManualClock::at_unix_secs(NOW_S))
}

/// The gateway and the check for `examples/shiplane.toml`, each on its own
/// clock stopped at [`NOW_S`] and its own counters.
struct Rig {
    gateway: SocketAddr,
    gateway_handle: GatewayHandle,
    check: SocketAddr,
    check_handle: GatewayHandle,
    seen: Arc<std::sync::atomic::AtomicUsize>,
    api: SocketAddr,
}

impl Rig {
    async fn start() -> Rig {
        Rig::start_with(shiplane).await
    }

    /// The gateway and the check for the file `config` makes for the
    /// upstream's address.
    async fn start_with(config: fn(SocketAddr) -> GatewayConfig) -> Rig {
        let (api, seen) = counting_upstream().await;
        let gw = Gateway::bind_with_clock(config(api), clock())
            .await
            .unwrap();
        let gateway = gw.local_addr();
        let gateway_handle = gw.handle();
        tokio::spawn(gw.run(std::future::pending()));
        let ck = Check::bind_with_clock(config(api), "127.0.0.1:0".parse().unwrap(), clock())
            .await
            .unwrap();
        let check = ck.local_addr();
        let check_handle = ck.handle();
        tokio::spawn(ck.run(std::future::pending()));
        Rig {
            gateway,
            gateway_handle,
            check,
            check_handle,
            seen,
            api,
        }
    }

    fn stop(self) {
        self.gateway_handle.shutdown();
        self.check_handle.shutdown();
    }
}

type HttpClient = Client<HttpConnector, Full<Bytes>>;

fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

async fn send(
    c: &HttpClient,
    to: SocketAddr,
    method: &str,
    path: &str,
    key: &str,
    body: &'static [u8],
) -> Response<Bytes> {
    let req = Request::builder()
        .method(method)
        .uri(format!("http://{to}{path}"))
        .header("authorization", format!("Bearer {key}"))
        .body(Full::new(Bytes::from_static(body)))
        .unwrap();
    let res = tokio::time::timeout(LIMIT, c.request(req))
        .await
        .expect("an answer in time")
        .expect("an answer");
    let (parts, body) = res.into_parts();
    let body = tokio::time::timeout(LIMIT, body.collect())
        .await
        .expect("a body in time")
        .expect("a body")
        .to_bytes();
    Response::from_parts(parts, body)
}

/// The fields a client reads from a rate-limit answer.
const COMPARED: [&str; 6] = [
    "ratelimit-policy",
    "ratelimit",
    "ratelimit-warning",
    "retry-after",
    "cache-control",
    "www-authenticate",
];

fn field<'a>(r: &'a Response<Bytes>, name: &str) -> Option<&'a str> {
    r.headers().get(name).map(|v| v.to_str().unwrap())
}

/// Asserts that `through` (a proxy calling the check) answered as `direct`
/// (the gateway): the status, the fields a client reads and, for an
/// answer of the gateway's own, the content type and body.
fn same_answer(what: &str, through: &Response<Bytes>, direct: &Response<Bytes>) {
    assert_eq!(through.status(), direct.status(), "{what}: status");
    let compared: &[&str] = match direct.status().is_success() {
        // the upstream's own answer: only the fields the check adds
        true => &COMPARED[..3],
        false => &COMPARED,
    };
    for name in compared {
        assert_eq!(field(through, name), field(direct, name), "{what}: {name}");
    }
    if !direct.status().is_success() {
        assert_eq!(
            field(through, "content-type"),
            Some("application/problem+json"),
            "{what}"
        );
        assert_eq!(through.body(), direct.body(), "{what}: the problem body");
    }
}

/// The Free key's burst of 20, then a 429; an unknown key's 401; through
/// the proxy at `front` and through the gateway, answer by answer.
async fn free_key_through(rig: &Rig, front: u16) {
    let front: SocketAddr = ([127, 0, 0, 1], front).into();
    let c = client();
    let key = "sk_demo_alice";
    for i in 0..20 {
        let through = send(&c, front, "GET", "/v1/rates?from=SFO", key, b"").await;
        let direct = send(&c, rig.gateway, "GET", "/v1/rates?from=SFO", key, b"").await;
        assert_eq!(through.status(), 200, "request {i}: {through:?}");
        assert!(field(&through, "ratelimit").is_some(), "request {i}");
        same_answer(&format!("request {i}"), &through, &direct);
        assert_eq!(
            through.body().as_ref(),
            b"ok",
            "request {i}: the upstream's answer"
        );
    }
    assert_eq!(
        rig.seen.load(Ordering::SeqCst),
        40,
        "each path reached the upstream 20 times"
    );
    // the 21st, a GET and a POST with a body: refused, the upstream untouched
    for (method, body) in [("GET", &b""[..]), ("POST", &b"{\"n\":1}"[..])] {
        let through = send(&c, front, method, "/v1/rates?from=SFO", key, body).await;
        let direct = send(&c, rig.gateway, method, "/v1/rates?from=SFO", key, body).await;
        assert_eq!(through.status(), 429, "{through:?}");
        assert_eq!(field(&through, "retry-after"), Some("1"));
        let problem: serde_json::Value = serde_json::from_slice(through.body()).unwrap();
        assert_eq!(problem["limit"], "burst");
        assert_eq!(problem["retry_after_s"], 1);
        same_answer(&format!("the {method} over the burst"), &through, &direct);
    }
    assert_eq!(
        rig.seen.load(Ordering::SeqCst),
        40,
        "a refused request reached the upstream"
    );
    // charged exactly once each: 20 admitted, the refusals nothing (the
    // sealed answer is not decided again)
    let daily = |h: &GatewayHandle| {
        let (_, d) = h.limiter().peek_key(key).unwrap();
        (d.statuses[0].remaining, d.statuses[1].remaining)
    };
    assert_eq!(daily(&rig.check_handle), (0, 9_980));
    assert_eq!(daily(&rig.gateway_handle), (0, 9_980));
    // an unknown key: 401, the same problem
    let through = send(&c, front, "GET", "/v1/rates", "sk_nobody", b"").await;
    let direct = send(&c, rig.gateway, "GET", "/v1/rates", "sk_nobody", b"").await;
    assert_eq!(through.status(), 401);
    same_answer("an unknown key", &through, &direct);
    // a path spelled another way is counted as its normal form: the
    // batch route, which costs 10
    let batch = "/v1/%6Cabels:batch?dry=1";
    let through = send(&c, front, "POST", batch, "sk_demo_bob", b"[]").await;
    let direct = send(&c, rig.gateway, "POST", batch, "sk_demo_bob", b"[]").await;
    assert!(
        field(&through, "ratelimit").is_some_and(|f| f.starts_with("\"burst\";r=10;")),
        "{through:?}"
    );
    same_answer("another spelling", &through, &direct);
    // the usage document, the check's own answer
    let through = send(&c, front, "GET", "/v1/usage", key, b"").await;
    let direct = send(&c, rig.gateway, "GET", "/v1/usage", key, b"").await;
    assert_eq!(through.status(), 200);
    assert_eq!(through.body(), direct.body(), "the usage document");
    assert_eq!(
        rig.seen.load(Ordering::SeqCst),
        42,
        "bob's two requests, no others"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_auth_request_answers_as_the_gateway() {
    let rig = Rig::start().await;
    let Some(nginx) = nginx(rig.check.port(), rig.api) else {
        return;
    };
    free_key_through(&rig, nginx.port).await;
    drop(nginx);
    rig.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caddy_forward_auth_answers_as_the_gateway() {
    let rig = Rig::start().await;
    let Some(caddy) = caddy(rig.check.port(), rig.api) else {
        return;
    };
    free_key_through(&rig, caddy.port).await;
    drop(caddy);
    rig.stop();
}

/// A call to the check as a proxy makes it: `fields` as given.
async fn call(
    c: &HttpClient,
    check: SocketAddr,
    path: &str,
    fields: &[(&str, &str)],
) -> Response<Bytes> {
    let mut req = Request::get(format!("http://{check}{path}"));
    for (n, v) in fields {
        req = req.header(*n, *v);
    }
    let res = tokio::time::timeout(LIMIT, c.request(req.body(Full::default()).unwrap()))
        .await
        .expect("an answer in time")
        .expect("an answer");
    let (parts, body) = res.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    Response::from_parts(parts, body)
}

fn problem(r: &Response<Bytes>) -> serde_json::Value {
    assert_eq!(
        field(r, "content-type"),
        Some("application/problem+json"),
        "{r:?}"
    );
    serde_json::from_slice(r.body()).unwrap()
}

/// What Traefik's ForwardAuth sends (`examples/traefik-check.yml`, which
/// no test runs Traefik with): the check answers it on the configured path.
#[tokio::test]
async fn traefik_forward_auth_calls_are_answered() {
    let rig = Rig::start().await;
    let text = std::fs::read_to_string(workspace().join("examples/traefik-check.yml")).unwrap();
    assert!(text.contains("address: \"http://127.0.0.1:8081/check\""));
    assert!(text.contains("url: \"http://127.0.0.1:9000\""));
    let c = client();
    let traefik = |key: &'static str| {
        [
            ("x-forwarded-method", "POST"),
            ("x-forwarded-proto", "http"),
            ("x-forwarded-host", "127.0.0.1:8080"),
            ("x-forwarded-uri", "/v1/labels:batch?dry=1"),
            ("x-forwarded-for", "192.0.2.9"),
            ("authorization", key),
        ]
    };
    // the batch route costs 10: two fit the burst of 20, the third does not
    for left in ["10", "0"] {
        let r = call(&c, rig.check, "/check", &traefik("Bearer sk_demo_carol")).await;
        assert_eq!(r.status(), 200);
        assert!(field(&r, "ratelimit")
            .unwrap()
            .starts_with(&format!("\"burst\";r={left};")));
    }
    let r = call(&c, rig.check, "/check", &traefik("Bearer sk_demo_carol")).await;
    assert_eq!(r.status(), 429);
    assert_eq!(problem(&r)["limit"], "burst");
    assert_eq!(rig.seen.load(Ordering::SeqCst), 0);
    rig.stop();
}

#[tokio::test]
async fn a_deny_status_seals_the_refusal_and_the_seal_answers_it_as_made() {
    let rig = Rig::start().await;
    let c = client();
    let nginx = |deny: &'static str| {
        [
            ("x-original-method", "GET"),
            ("x-original-uri", "/v1/rates"),
            ("authorization", "Bearer sk_nobody"),
            ("paceline-deny-status", deny),
        ]
    };
    let plain = call(&c, rig.check, "/.paceline/check", &nginx("403")[..3]).await;
    assert_eq!(plain.status(), 401);
    assert!(plain.headers().get("paceline-answer").is_none());
    let denied = call(&c, rig.check, "/.paceline/check", &nginx("403")).await;
    assert_eq!(denied.status(), 403);
    let sealed = field(&denied, "paceline-answer").unwrap().to_string();
    // sent back, on any path and with anything else: the refusal as made
    let again = call(
        &c,
        rig.check,
        "/v1/rates",
        &[
            ("paceline-answer", &sealed),
            ("authorization", "Bearer sk_demo_alice"),
        ],
    )
    .await;
    assert_eq!(again.status(), 401);
    assert_eq!(again.body(), plain.body());
    assert_eq!(
        field(&again, "www-authenticate"),
        field(&plain, "www-authenticate")
    );
    // a seal altered, or from elsewhere, opens nothing
    let mut forged = sealed.clone();
    forged.insert(forged.len() - 3, 'x');
    let r = call(&c, rig.check, "/", &[("paceline-answer", &forged)]).await;
    assert_eq!(r.status(), 400);
    assert!(problem(&r)["detail"]
        .as_str()
        .unwrap()
        .contains("Paceline-Answer"));
    // 401 and 403 only
    let r = call(&c, rig.check, "/", &nginx("500")).await;
    assert_eq!(r.status(), 400);
    assert_eq!(
        problem(&r)["detail"],
        "Paceline-Deny-Status takes 401 or 403."
    );
    // an admitted request is a 200 whatever the deny status
    let r = call(
        &c,
        rig.check,
        "/",
        &[
            ("x-original-method", "GET"),
            ("x-original-uri", "/v1/rates"),
            ("authorization", "Bearer sk_demo_alice"),
            ("paceline-deny-status", "403"),
        ],
    )
    .await;
    assert_eq!(r.status(), 200);
    assert!(r.headers().get("paceline-answer").is_none());
    rig.stop();
}

#[tokio::test]
async fn descriptions_that_read_two_ways_are_refused_with_a_problem() {
    let rig = Rig::start().await;
    let c = client();
    let key = ("authorization", "Bearer sk_demo_alice");
    for (fields, says) in [
        (vec![key], "original method is missing"),
        (
            vec![key, ("x-forwarded-method", "GET")],
            "target is missing",
        ),
        (
            vec![
                key,
                ("x-forwarded-method", "GET"),
                ("x-forwarded-uri", "/v1/rates"),
                ("x-original-uri", "/v1/usage"),
            ],
            "describe different requests",
        ),
        (
            vec![
                key,
                ("x-forwarded-method", "GET"),
                ("x-forwarded-uri", "/v1/rates"),
                ("x-forwarded-uri", "/v1/rates"),
            ],
            "sent twice",
        ),
        // the head screening of the gateway: an encoded slash, CONNECT
        (
            vec![
                key,
                ("x-forwarded-method", "GET"),
                ("x-forwarded-uri", "/v1/a%2Fb"),
            ],
            "one way only",
        ),
        (
            vec![
                key,
                ("x-forwarded-method", "GET"),
                ("x-forwarded-uri", "http://u:p@api.example/"),
            ],
            "User information",
        ),
    ] {
        let r = call(&c, rig.check, "/check", &fields).await;
        assert_eq!(r.status(), 400, "{fields:?}");
        let p = problem(&r);
        assert!(p["type"].as_str().unwrap().ends_with("bad_request"), "{p}");
        assert!(
            p["detail"].as_str().unwrap().contains(says),
            "{fields:?}: {p}"
        );
        assert!(
            r.headers().get("connection").is_none(),
            "the check's connection stays open"
        );
    }
    let r = call(
        &c,
        rig.check,
        "/",
        &[
            key,
            ("x-forwarded-method", "CONNECT"),
            ("x-forwarded-uri", "/"),
        ],
    )
    .await;
    assert_eq!(r.status(), 405);
    // nothing was charged
    let left = rig
        .check_handle
        .limiter()
        .peek_key("sk_demo_alice")
        .map(|(_, d)| d.statuses[0].remaining);
    assert!(matches!(left, None | Some(20)), "{left:?}");
    rig.stop();
}

/// Callers without a key count per client address: the proxy's
/// `X-Forwarded-For` is read only when the proxy is a trusted one.
#[tokio::test]
async fn per_ip_keys_read_x_forwarded_for_only_from_trusted_proxies() {
    let (api, _) = counting_upstream().await;
    let c = client();
    for (trusted, second_client) in [(true, 200), (false, 429)] {
        let mut cfg = shiplane(api);
        if trusted {
            let text = std::fs::read_to_string(workspace().join("examples/shiplane.toml")).unwrap();
            let text = format!("trusted_proxies = [\"127.0.0.1\"]\n{text}");
            cfg = GatewayConfig::parse(&text, "shiplane.toml", None).unwrap();
        }
        let ck = Check::bind_with_clock(cfg, "127.0.0.1:0".parse().unwrap(), clock())
            .await
            .unwrap();
        let (addr, handle) = (ck.local_addr(), ck.handle());
        tokio::spawn(ck.run(std::future::pending()));
        let from = |ip: &'static str| {
            [
                ("x-forwarded-method", "GET"),
                ("x-forwarded-uri", "/v1/rates"),
                ("x-forwarded-for", ip),
            ]
        };
        // the anonymous plan: a burst of 10 per address, no fields
        for _ in 0..10 {
            let r = call(&c, addr, "/", &from("192.0.2.1")).await;
            assert_eq!(r.status(), 200);
            assert!(r.headers().get("ratelimit").is_none());
        }
        assert_eq!(call(&c, addr, "/", &from("192.0.2.1")).await.status(), 429);
        let r = call(&c, addr, "/", &from("192.0.2.2")).await;
        assert_eq!(r.status(), second_client, "trusted: {trusted}");
        handle.shutdown();
    }
}

/// A small daily quota: the soft-limit warning from 80% of it, then the
/// quota's 429 (Retry-After until midnight UTC).
fn small_quota(api: SocketAddr) -> GatewayConfig {
    let text = format!(
        r#"[gateway]
listen = "127.0.0.1:0"
upstream = "http://{api}"
watch = false

[plans.free]
policies = [
  {{ name = "burst", algorithm = "token_bucket", q = 100, w = 10 }},
  {{ name = "daily", algorithm = "daily", q = 10 }},
]

[keys]
sk_demo_alice = "free"
"#
    );
    GatewayConfig::parse(&text, "small.toml", None).unwrap()
}

/// The soft-limit warning rides on the admitted answer through nginx as
/// through the gateway, and the quota's refusal is the gateway's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_soft_limit_warning_and_the_quota_refusal_through_nginx() {
    let rig = Rig::start_with(small_quota).await;
    let Some(nginx) = nginx(rig.check.port(), rig.api) else {
        return;
    };
    let front: SocketAddr = ([127, 0, 0, 1], nginx.port).into();
    let c = client();
    let mut warned = 0;
    for i in 0..10 {
        let through = send(&c, front, "GET", "/v1/quotes", "sk_demo_alice", b"").await;
        let direct = send(&c, rig.gateway, "GET", "/v1/quotes", "sk_demo_alice", b"").await;
        assert_eq!(through.status(), 200, "request {i}");
        same_answer(&format!("request {i}"), &through, &direct);
        warned += usize::from(field(&through, "ratelimit-warning").is_some());
    }
    assert!(warned >= 2, "the warning came on {warned} answers");
    let through = send(&c, front, "GET", "/v1/quotes", "sk_demo_alice", b"").await;
    let direct = send(&c, rig.gateway, "GET", "/v1/quotes", "sk_demo_alice", b"").await;
    assert_eq!(through.status(), 429);
    assert_eq!(problem(&through)["limit"], "daily");
    same_answer("the quota's refusal", &through, &direct);
    assert_eq!(rig.seen.load(Ordering::SeqCst), 20);
    drop(nginx);
    rig.stop();
}

/// `shiplane.toml` with `lines` added under `[gateway]`.
fn shiplane_with(api: SocketAddr, lines: &str) -> GatewayConfig {
    let text = std::fs::read_to_string(workspace().join("examples/shiplane.toml")).unwrap();
    let text = text
        .replace("listen = \"127.0.0.1:8080\"", "listen = \"127.0.0.1:0\"")
        .replace("http://127.0.0.1:9000", &format!("http://{api}"))
        .replacen("[gateway]\n", &format!("[gateway]\n{lines}\n"), 1);
    assert!(text.contains(&format!("[gateway]\n{lines}\n")));
    GatewayConfig::parse(&text, "shiplane.toml", None).unwrap()
}

/// A check request for `GET /v1/rates` with `key`, as Traefik sends it;
/// `extra` goes before the blank line, `body` after it.
fn check_request(key: &str, extra: &str, body: &str) -> String {
    format!(
        "GET /check HTTP/1.1\r\nhost: check\r\nx-forwarded-method: GET\r\n\
         x-forwarded-uri: /v1/rates\r\nauthorization: Bearer {key}\r\n{extra}\r\n{body}"
    )
}

/// Every answer on one connection, until the check closes it: status and
/// `RateLimit` field of each.
async fn answers_on_one_connection(check: SocketAddr, bytes: &str) -> Vec<(u16, String)> {
    // the check closes the connection after `connection: close`
    let text = String::from_utf8(until_closed(check, bytes.as_bytes()).await).unwrap();
    let mut answers = Vec::new();
    for answer in text.split("HTTP/1.1 ").skip(1) {
        let status = answer[..3].parse().unwrap();
        let ratelimit = answer
            .lines()
            .find_map(|l| l.strip_prefix("ratelimit: "))
            .unwrap_or_default()
            .to_string();
        answers.push((status, ratelimit));
    }
    answers
}

/// The check's connections are the gateway's own while their requests
/// carry no body, and hyper's from the first that does, mid-connection
/// included (`gateway.http1_server`): pipelined check requests get the
/// same answers either way, in order, the one with a body among them.
#[tokio::test]
async fn one_connection_is_answered_alike_by_the_own_server_and_hyper() {
    let (api, _) = counting_upstream().await;
    let pipelined = [
        check_request("sk_demo_carol", "", ""),
        check_request("sk_demo_carol", "", ""),
        // a check request with a body (never read): hyper takes over here
        check_request("sk_demo_carol", "content-length: 2\r\n", "{}"),
        check_request("sk_demo_carol", "connection: close\r\n", ""),
    ]
    .concat();
    let mut seen = Vec::new();
    for server in ["paceline", "hyper"] {
        let cfg = shiplane_with(api, &format!("http1_server = \"{server}\""));
        let ck = Check::bind_with_clock(cfg, "127.0.0.1:0".parse().unwrap(), clock())
            .await
            .unwrap();
        let (addr, handle) = (ck.local_addr(), ck.handle());
        tokio::spawn(ck.run(std::future::pending()));
        let answers = answers_on_one_connection(addr, &pipelined).await;
        let left: Vec<_> = answers
            .iter()
            .map(|(status, rl)| {
                assert_eq!(*status, 200, "{server}: {answers:?}");
                rl.split(';').nth(1).unwrap_or_default().to_string()
            })
            .collect();
        assert_eq!(left, ["r=19", "r=18", "r=17", "r=16"], "{server}");
        seen.push(answers);
        handle.shutdown();
    }
    assert_eq!(seen[0], seen[1]);
}

/// HTTP/2 with prior knowledge reaches the check through the handover.
#[tokio::test]
async fn http2_check_requests_are_answered() {
    let rig = Rig::start().await;
    let c: HttpClient = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    let fields = [
        ("x-forwarded-method", "GET"),
        ("x-forwarded-uri", "/v1/rates"),
        ("authorization", "Bearer sk_demo_carol"),
    ];
    for left in ["r=19", "r=18"] {
        let r = call(&c, rig.check, "/check", &fields).await;
        assert_eq!(r.version(), http::Version::HTTP_2);
        assert_eq!(r.status(), 200, "{r:?}");
        assert!(field(&r, "ratelimit").unwrap().contains(left), "{r:?}");
    }
    rig.stop();
}

/// A connection with no check in flight is closed at the head bound
/// (`timeouts.client_header_ms`): one never used, and one whose head
/// comes a piece at a time and never ends; and at once by a graceful
/// shutdown. Whoever serves it (`gateway.http1_server`).
#[tokio::test]
async fn idle_check_connections_are_closed() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (api, _) = counting_upstream().await;
    let text = std::fs::read_to_string(workspace().join("examples/shiplane.toml")).unwrap();
    assert!(text.contains("client_header_ms = 10000"));
    for server in ["paceline", "hyper"] {
        let line = format!("http1_server = \"{server}\"");
        let mut short = shiplane_with(api, &line);
        short.settings.timeouts.client_header = Duration::from_millis(300);
        for (cfg, how) in [
            (short.clone(), "untouched"),
            (short, "a head in pieces"),
            (shiplane_with(api, &line), "shutdown"),
        ] {
            let ck = Check::bind_with_clock(cfg, "127.0.0.1:0".parse().unwrap(), clock())
                .await
                .unwrap();
            let (addr, handle) = (ck.local_addr(), ck.handle());
            tokio::spawn(ck.run(std::future::pending()));
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            let started = Instant::now();
            match how {
                "a head in pieces" => {
                    // a line every 100 ms, well inside the bound each
                    for piece in ["GET /check HTTP/1.1\r\n", "host: x\r\n", "x-a: 1\r\n"] {
                        s.write_all(piece.as_bytes()).await.unwrap();
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
                "shutdown" => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    handle.shutdown();
                }
                _ => {}
            }
            let mut buf = [0u8; 16];
            let n = tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf))
                .await
                .unwrap_or_else(|_| panic!("{server}, {how}: closed within 2 s"))
                .unwrap_or_else(|e| panic!("{server}, {how}: closed, not reset: {e}"));
            assert_eq!(n, 0, "{server}, {how}: closed without an answer");
            let took = started.elapsed();
            match how {
                "shutdown" => assert!(took < Duration::from_secs(1), "{server}: {took:?}"),
                _ => assert!(
                    took >= Duration::from_millis(250) && took < Duration::from_millis(1500),
                    "{server}, {how}: {took:?}"
                ),
            }
            handle.shutdown();
        }
    }
}
