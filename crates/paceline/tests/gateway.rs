//! `paceline gateway` as a process, in front of the demo API on loopback:
//! rejections never reach the upstream, a broken config is reported
//! precisely, SIGHUP changes a quota without resetting counters, SIGTERM
//! finishes requests in flight, and overload sheds quotes, not labels.
//! Every wait is bounded; the process is killed when a test ends.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use paceline_demo::api::{self as demo, DemoOptions, DemoUpstream};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(15);

fn config(upstream: &str, hour: u64, watch: bool, max_in_flight: u32) -> String {
    format!(
        r#"[gateway]
listen = "127.0.0.1:0"
upstream = "http://{upstream}"
watch = {watch}

[gateway.shedding]
max_in_flight = {max_in_flight}

[plans.free]
policies = [
  {{ name = "burst", algorithm = "token_bucket", q = 1000, w = 3600, kind = "burst" }},
  {{ name = "hour", algorithm = "fixed_window", q = {hour}, w = 3600 }},
]

[keys]
sk_a = "free"

[[routes]]
method = "GET"
path = "/v1/rates"
criticality = "SHEDDABLE"

[[routes]]
method = "POST"
path = "/v1/labels"
criticality = "CRITICAL"
"#
    )
}

struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("pl-bin-gw-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    fn file(&self, name: &str, text: &str) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The gateway process, with its output lines.
struct Proc {
    child: Child,
    out: Receiver<String>,
    err: Receiver<String>,
    url: String,
}

fn lines(r: impl std::io::Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

fn wait_line(rx: &Receiver<String>, what: &str) -> String {
    let end = Instant::now() + WAIT;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) if l.contains(what) => return l,
            Ok(_) => continue,
            Err(e) => panic!("no line with {what:?}: {e}"),
        }
    }
}

impl Proc {
    fn start(config: &Path) -> Proc {
        Proc::start_with_env(config, &[])
    }

    fn start_with_env(config: &Path, env: &[(&str, &str)]) -> Proc {
        let mut child = Command::new(env!("CARGO_BIN_EXE_paceline"))
            .args(["gateway", "--config"])
            .arg(config)
            .env("PACELINE_LOG", "info")
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let out = lines(child.stdout.take().unwrap());
        let err = lines(child.stderr.take().unwrap());
        let ready = wait_line(&out, "listening on ");
        let url = ready
            .split_whitespace()
            .find(|w| w.starts_with("http://"))
            .unwrap()
            .to_string();
        Proc {
            child,
            out,
            err,
            url,
        }
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.child.id().to_string())
            .status()
            .unwrap()
            .success();
        assert!(ok);
    }

    fn wait_exit(&mut self) -> i32 {
        let end = Instant::now() + WAIT;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s.code().unwrap_or(-1);
            }
            assert!(Instant::now() < end, "the gateway did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

async fn rates(c: &reqwest::Client, url: &str) -> reqwest::Response {
    c.get(format!("{url}/v1/rates"))
        .header("authorization", "Bearer sk_a")
        .send()
        .await
        .unwrap()
}

fn field(res: &reqwest::Response, name: &str) -> String {
    res.headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default()
}

async fn upstream(delay: Duration) -> DemoUpstream {
    let api = demo::serve(([127, 0, 0, 1], 0).into(), DemoOptions { delay })
        .await
        .unwrap();
    api.record_headers();
    api
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejections_are_answered_by_the_gateway_alone() {
    let api = upstream(Duration::ZERO).await;
    let dir = TempDir::new("reject");
    let file = dir.file("gw.toml", &config(&api.addr().to_string(), 3, false, 0));
    let gw = Proc::start(&file);
    let c = client();
    for left in [2, 1, 0] {
        let res = rates(&c, &gw.url).await;
        assert_eq!(res.status(), 200);
        assert_eq!(
            field(&res, "ratelimit-policy"),
            r#""burst";q=1000;w=3600, "hour";q=3;w=3600"#
        );
        assert!(field(&res, "ratelimit").contains(&format!(r#""hour";r={left};"#)));
    }
    let before = api.hits();
    for _ in 0..5 {
        let res = rates(&c, &gw.url).await;
        assert_eq!(res.status(), 429);
        assert_eq!(field(&res, "cache-control"), "no-store");
        let retry: u64 = field(&res, "retry-after").parse().unwrap();
        assert!((1..=3600).contains(&retry));
        let p: Value = serde_json::from_slice(&res.bytes().await.unwrap()).unwrap();
        assert_eq!(p["limit"], "hour");
        assert_eq!(p["retry_after_s"], retry);
        assert!(p["type"].as_str().unwrap().ends_with("quota_exhausted"));
    }
    assert_eq!(
        api.hits(),
        before,
        "no rejected request reached the upstream"
    );
    let seen = api.last_headers().unwrap();
    assert_eq!(seen["x-forwarded-for"], "127.0.0.1");
    // one log line per rejection, naming the policy, never the key
    let line = wait_line(&gw.err, "request rejected");
    assert!(line.contains("policy=hour"), "{line}");
    assert!(line.contains("outcome=\"quota_exhausted\""), "{line}");
    assert!(!line.contains("sk_a"), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_are_one_object_a_line() {
    let up = upstream(Duration::ZERO).await;
    let dir = TempDir::new("json");
    let cfg = dir.file("gw.toml", &config(&up.addr().to_string(), 1, false, 0));
    let gw = Proc::start_with_env(&cfg, &[("PACELINE_LOG_FORMAT", "json")]);
    let c = client();
    // the hour's one request, then a rejection, logged at info
    assert_eq!(rates(&c, &gw.url).await.status(), 200);
    assert_eq!(rates(&c, &gw.url).await.status(), 429);
    let end = Instant::now() + WAIT;
    let mut seen = 0;
    let mut rejection = false;
    while !rejection {
        let left = end.saturating_duration_since(Instant::now());
        let line = gw.err.recv_timeout(left).expect("log lines");
        let v: Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("not one JSON object ({e}): {line}"));
        assert!(v["timestamp"].is_string(), "{line}");
        assert!(v["level"].is_string(), "{line}");
        assert!(v["fields"].is_object(), "{line}");
        seen += 1;
        rejection = line.contains("429") || line.to_ascii_lowercase().contains("reject");
    }
    assert!(seen >= 1);
}

#[test]
fn a_broken_config_is_reported_with_file_line_and_field() {
    let dir = TempDir::new("check");
    let good = config("127.0.0.1:9", 7, false, 0);
    let ok = dir.file("good.toml", &good);
    let out = Command::new(env!("CARGO_BIN_EXE_paceline"))
        .args(["gateway", "--check"])
        .arg(&ok)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("ok"));

    let cases = [
        ("q = 7", "q = 0", ":12:", "plans.free.policies[1].q"),
        ("sk_a = \"free\"", "sk_a = \"gold\"", ":16:", "keys.sk_a"),
        ("\"SHEDDABLE\"", "\"LOW\"", ":21:", "routes[0].criticality"),
        (
            "max_in_flight",
            "max_inflight",
            ":7:",
            "gateway.shedding.max_inflight",
        ),
        (
            "max_in_flight = 0",
            "max_in_flight = 0\nmax_rps = 20000000",
            ":8:",
            "gateway.shedding.max_rps",
        ),
        (
            "max_in_flight = 0",
            "max_in_flight = 0\nmax_rps = -40",
            ":8:",
            "gateway.shedding.max_rps",
        ),
    ];
    for (from, to, line, field) in cases {
        assert_eq!(good.matches(from).count(), 1, "{from}");
        let text = good.replace(from, to);
        let bad = dir.file("bad.toml", &text);
        for flag in ["--check", "--config"] {
            let out = Command::new(env!("CARGO_BIN_EXE_paceline"))
                .args(["gateway", flag])
                .arg(&bad)
                .output()
                .unwrap();
            assert_eq!(out.status.code(), Some(1), "{flag} {to}");
            let err = String::from_utf8_lossy(&out.stderr);
            let want = format!("{}{line}", bad.display());
            assert!(err.contains(&want), "{err} lacks {want}");
            assert!(err.contains(field), "{err} lacks {field}");
        }
    }
}

#[test]
fn check_refuses_a_short_key_hash_secret_from_the_file_or_the_environment() {
    let dir = TempDir::new("secret");
    let good = config("127.0.0.1:9", 7, false, 0);
    let with_file = good.replacen(
        "[gateway]\n",
        "[gateway]\nkey_hash_secret_file = \"secret.txt\"\n",
        1,
    );
    let file = dir.file("gw.toml", &with_file);
    let check = |env: Option<&str>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_paceline"));
        cmd.args(["gateway", "--check"]).arg(&file);
        cmd.env_remove("PACELINE_KEY_HASH_SECRET");
        if let Some(v) = env {
            cmd.env("PACELINE_KEY_HASH_SECRET", v);
        }
        cmd.output().unwrap()
    };
    dir.file("secret.txt", "too-short\n");
    let out = check(None);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("gateway.key_hash_secret_file"), "{err}");
    assert!(!err.contains("too-short"), "the secret is not shown: {err}");
    dir.file("secret.txt", "a-secret-long-enough-0123456789\n");
    assert_eq!(check(None).status.code(), Some(0));
    // the environment, when the file names none
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_paceline"));
    let out = cmd
        .args(["gateway", "--check"])
        .arg(dir.file("gw2.toml", &good))
        .env("PACELINE_KEY_HASH_SECRET", "short")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("PACELINE_KEY_HASH_SECRET"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_changes_a_quota_without_resetting_counters() {
    let api = upstream(Duration::ZERO).await;
    let dir = TempDir::new("hup");
    let up = api.addr().to_string();
    let file = dir.file("gw.toml", &config(&up, 100, false, 0));
    let gw = Proc::start(&file);
    let c = client();
    for _ in 0..5 {
        assert_eq!(rates(&c, &gw.url).await.status(), 200);
    }
    std::fs::write(&file, config(&up, 50, false, 0)).unwrap();
    gw.signal("HUP");
    wait_line(&gw.out, "configuration reloaded");
    let res = rates(&c, &gw.url).await;
    assert!(field(&res, "ratelimit-policy").contains(r#""hour";q=50;"#));
    assert!(field(&res, "ratelimit").contains(r#""hour";r=44;"#));

    // a broken file is refused, and the old configuration keeps serving
    std::fs::write(&file, config(&up, 50, false, 0).replace("q = 50", "q = -1")).unwrap();
    gw.signal("HUP");
    let refused = wait_line(&gw.err, "reload refused");
    assert!(refused.contains(":12:"), "{refused}");
    let res = rates(&c, &gw.url).await;
    assert_eq!(res.status(), 200);
    assert!(field(&res, "ratelimit").contains(r#""hour";r=43;"#));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saved_file_is_reloaded() {
    let api = upstream(Duration::ZERO).await;
    let dir = TempDir::new("watch");
    let up = api.addr().to_string();
    let file = dir.file("gw.toml", &config(&up, 100, true, 0));
    let gw = Proc::start(&file);
    let c = client();
    assert_eq!(rates(&c, &gw.url).await.status(), 200);
    std::fs::write(&file, config(&up, 7, true, 0)).unwrap();
    wait_line(&gw.out, "configuration reloaded");
    let res = rates(&c, &gw.url).await;
    assert!(field(&res, "ratelimit").contains(r#""hour";r=5;"#));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_requests_in_flight() {
    let api = upstream(Duration::from_millis(600)).await;
    let dir = TempDir::new("term");
    let file = dir.file("gw.toml", &config(&api.addr().to_string(), 100, false, 0));
    let mut gw = Proc::start(&file);
    let c = client();
    let url = gw.url.clone();
    let slow = tokio::spawn(async move { rates(&c, &url).await.status() });
    let end = Instant::now() + WAIT;
    while api.hits() == 0 {
        assert!(Instant::now() < end);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    gw.signal("TERM");
    assert_eq!(slow.await.unwrap(), 200);
    assert_eq!(gw.wait_exit(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_sheds_quotes_keeps_labels_and_charges_no_503() {
    let api = upstream(Duration::from_millis(500)).await;
    let dir = TempDir::new("shed");
    let file = dir.file("gw.toml", &config(&api.addr().to_string(), 1000, false, 10));
    let gw = Proc::start(&file);
    let c = client();
    let mut quotes = Vec::new();
    for _ in 0..20 {
        let (c, url) = (c.clone(), gw.url.clone());
        quotes.push(tokio::spawn(async move {
            rates(&c, &url).await.status().as_u16()
        }));
    }
    let end = Instant::now() + WAIT;
    while api.hits_on("/v1/rates") < 6 {
        assert!(Instant::now() < end);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut labels = Vec::new();
    for i in 0..3 {
        let (c, url) = (c.clone(), gw.url.clone());
        labels.push(tokio::spawn(async move {
            c.post(format!("{url}/v1/labels"))
                .header("authorization", "Bearer sk_a")
                .header("idempotency-key", format!("k{i}"))
                .body("{}")
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }));
    }
    let mut q = Vec::new();
    for t in quotes {
        q.push(t.await.unwrap());
    }
    let mut l = Vec::new();
    for t in labels {
        l.push(t.await.unwrap());
    }
    q.sort();
    assert_eq!(q.iter().filter(|&&s| s == 200).count(), 6, "{q:?}");
    assert_eq!(q.iter().filter(|&&s| s == 503).count(), 14, "{q:?}");
    assert_eq!(l, vec![201, 201, 201]);
    let usage: Value = serde_json::from_slice(
        &c.get(format!("{}/v1/usage", gw.url))
            .header("authorization", "Bearer sk_a")
            .send()
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap(),
    )
    .unwrap();
    // 6 quotes and 3 labels were charged; the 14 shed quotes were not
    assert_eq!(usage["limits"][1]["r"], 1000 - 9);
}

#[test]
fn the_redis_example_passes_check() {
    let example =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/shiplane-redis.toml");
    let check = |secret: Option<&str>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_paceline"));
        cmd.args(["gateway", "--check"]).arg(&example);
        cmd.env_remove("PACELINE_KEY_HASH_SECRET");
        if let Some(s) = secret {
            cmd.env("PACELINE_KEY_HASH_SECRET", s);
        }
        cmd.output().unwrap()
    };
    if cfg!(feature = "redis") {
        // without a shared secret each instance would name keys its own way
        let out = check(None);
        assert_eq!(out.status.code(), Some(1));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("gateway.key_hash_secret_file"), "{err}");
    }
    let out = check(Some("0123456789abcdef0123456789abcdef"));
    let err = String::from_utf8_lossy(&out.stderr);
    if cfg!(feature = "redis") {
        assert_eq!(out.status.code(), Some(0), "{err}");
        assert!(String::from_utf8_lossy(&out.stdout).contains("ok"));
    } else {
        assert_eq!(out.status.code(), Some(1));
        assert!(err.contains("gateway.store"), "{err}");
    }
}

#[test]
fn the_jwt_example_passes_check() {
    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let out = Command::new(env!("CARGO_BIN_EXE_paceline"))
        .args(["gateway", "--check"])
        .arg(examples.join("shiplane-jwt.toml"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("ok"));
    // its key set is read: a copy of the example without it fails at the
    // field that names it
    let dir = std::env::temp_dir().join(format!("paceline-jwt-example-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(examples.join("shiplane-jwt.toml"), dir.join("g.toml")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_paceline"))
        .args(["gateway", "--check"])
        .arg(dir.join("g.toml"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("jwt.jwks_file"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn check_states_the_overshoot_bound_of_each_leased_policy() {
    let dir = TempDir::new("leased");
    let text = r#"[gateway]
listen = "127.0.0.1:0"
upstream = "http://127.0.0.1:9"
watch = false
store = "redis"

[gateway.redis]
url = "redis://127.0.0.1:9"

[plans.big]
policies = [
  { name = "rps", algorithm = "token_bucket", q = 2000, w = 1, share = "leased", max_slice = 40 },
]

[keys]
sk_big = "big"
"#;
    let file = dir.file("leased.toml", text);
    let run = |text_file: &std::path::Path, extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_paceline"))
            .args(["gateway", "--check"])
            .arg(text_file)
            .args(extra)
            .env("PACELINE_KEY_HASH_SECRET", "a secret of the deployment")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let out = run(&file, &["--instances", "3"]);
    assert!(
        out.contains("leased: plan \"big\" policy \"rps\": slices of at most 40; with 3 instances at most 240 admitted beyond exact counting over any window (12.0% of q = 2000)"),
        "{out}"
    );
    assert!(run(&file, &[]).contains("with 1 instance at most 80"));
    let memory = text
        .replace("store = \"redis\"", "")
        .replace("[gateway.redis]\nurl = \"redis://127.0.0.1:9\"\n", "");
    let file = dir.file("memory.toml", &memory);
    assert!(run(&file, &[]).contains("warning: plan \"big\" policy \"rps\" is leased"));
    // a global plan: said, and warned of when every request would be a
    // round trip to one key
    let global = text.replace(
        "store = \"redis\"",
        "store = \"redis\"\nglobal_plan = \"up\"",
    );
    let exact = format!(
        "{global}\n[plans.up]\npolicies = [{{ name = \"up\", algorithm = \"token_bucket\", q = 5000, w = 1 }}]\n"
    );
    let out = run(&dir.file("exact.toml", &exact), &[]);
    assert!(
        out.contains("warning: global_plan \"up\" is counted exactly"),
        "{out}"
    );
    let leased = exact.replace("w = 1 }]", "w = 1, share = \"leased\" }]");
    let out = run(&dir.file("global.toml", &leased), &[]);
    assert!(
        out.contains("global: every request passed on is charged to plan \"up\""),
        "{out}"
    );
}
