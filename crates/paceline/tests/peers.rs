//! `paceline bulk` against rate limiters nobody here wrote: express with
//! express-rate-limit (a fixed window publishing the IETF fields of
//! draft-6, draft-7 and draft-8, or the older `X-RateLimit-*`), and nginx
//! `limit_req` (which publishes nothing). Each run is 40 jobs with 10
//! workers; the SDK must finish every job near the floor with at most one
//! 429 where the server publishes its budget, and the naive mode's figures
//! are printed beside it.
//!
//! The peers come from the package registries: `scripts/test.sh` installs
//! nginx (Debian) and the npm packages (into `target/peers`). Without them
//! a run in CI fails; elsewhere it says what is missing and skips.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Says why a peer is missing: a failure in CI, a printed skip elsewhere.
fn missing(what: &str) {
    let ci = std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0");
    if ci {
        panic!("{what} is missing: run scripts/test.sh, which installs it");
    }
    eprintln!("skipped: {what} is missing (scripts/test.sh installs it)");
}

/// A peer server, stopped when dropped.
struct Peer {
    child: Child,
    port: u16,
    _dir: Option<TempDir>,
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn node_modules() -> PathBuf {
    std::env::var_os("PACELINE_PEERS_NODE_MODULES")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target/peers/node_modules"))
}

/// express-rate-limit: 8 requests per 2 s window, one header dialect.
fn express(dialect: &str) -> Option<Peer> {
    let modules = node_modules();
    if !modules.join("express-rate-limit").is_dir() || !modules.join("express").is_dir() {
        missing("express and express-rate-limit (npm)");
        return None;
    }
    let mut child = match Command::new("node")
        .arg(workspace().join("scripts/peers/express-limiter.js"))
        .args([dialect, "8", "2000"])
        .env("PEERS_NODE_MODULES", &modules)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
    {
        Ok(c) => c,
        Err(_) => {
            missing("node");
            return None;
        }
    };
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port = line
        .trim()
        .strip_prefix("listening ")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("express peer said {line:?}"));
    Some(Peer {
        child,
        port,
        _dir: None,
    })
}

/// nginx `limit_req`: 4 requests a second with a burst of 8, no headers.
fn nginx() -> Option<Peer> {
    let bin = ["/usr/sbin/nginx", "/usr/bin/nginx"]
        .into_iter()
        .find(|p| Path::new(p).exists());
    let Some(bin) = bin else {
        missing("nginx (Debian package nginx)");
        return None;
    };
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = std::env::temp_dir().join(format!("paceline-nginx-{}-{port}", std::process::id()));
    std::fs::create_dir_all(dir.join("logs")).unwrap();
    let conf = format!(
        "daemon off;\nmaster_process off;\nworker_processes 1;\npid {d}/nginx.pid;\n\
         error_log {d}/logs/error.log;\nevents {{ worker_connections 256; }}\n\
         http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n\
         fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n\
         limit_req_zone $binary_remote_addr zone=jobs:1m rate=4r/s;\n  limit_req_status 429;\n\
         server {{\n    listen 127.0.0.1:{port};\n    location / {{\n      limit_req zone=jobs burst=8 nodelay;\n\
         root {d}/www;\n      default_type text/plain;\n      try_files /ok.txt =404;\n    }}\n  }}\n}}\n",
        d = dir.display()
    );
    std::fs::write(dir.join("nginx.conf"), conf).unwrap();
    // a static answer: `return` would answer before limit_req is asked
    std::fs::create_dir_all(dir.join("www")).unwrap();
    std::fs::write(dir.join("www/ok.txt"), "ok").unwrap();
    let child = Command::new(bin)
        .args(["-p"])
        .arg(&dir)
        .arg("-c")
        .arg(dir.join("nginx.conf"))
        .stdin(Stdio::null())
        .spawn()
        .expect("nginx starts");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nginx did not listen on {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
    Some(Peer {
        child,
        port,
        _dir: Some(TempDir(dir)),
    })
}

fn bulk(port: u16, extra: &[&str]) -> serde_json::Value {
    let list: String = (0..40)
        .map(|i| format!("http://127.0.0.1:{port}/v1/jobs/{i}\n"))
        .collect();
    let mut child = Command::new(env!("CARGO_BIN_EXE_paceline"))
        .args(["bulk", "-", "--workers", "10", "--json", "--no-progress"])
        .args(["--rate", "4", "--burst", "8", "--max-wait", "60"])
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(list.as_bytes())
        .unwrap();
    // bounded: 40 jobs at 8 per 2 s take about 8 s
    let deadline = Instant::now() + Duration::from_secs(90);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("paceline bulk did not finish within 90 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.trim()).unwrap_or_else(|_| {
        panic!(
            "no summary: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn count(s: &serde_json::Value, status: &str) -> u64 {
    s["by_status"][status].as_u64().unwrap_or(0)
}

/// The SDK's run: every job done, none failed, the finish within 10% of
/// the floor; at most `max_429` rejections.
fn assert_polite(peer: &str, s: &serde_json::Value, max_429: Option<u64>) {
    println!("{peer} sdk: {s}");
    assert_eq!(s["jobs_done"], 40, "{peer}: {s}");
    assert_eq!(s["jobs_failed"], 0, "{peer}: {s}");
    if let Some(m) = max_429 {
        assert!(count(s, "429") <= m, "{peer}: {s}");
    }
    let floor = s["floor_s"].as_f64().expect("a floor");
    assert_eq!(floor, 8.0);
    let elapsed = s["elapsed_s"].as_f64().unwrap();
    assert!(
        elapsed <= floor * 1.10,
        "{peer}: {elapsed} s against a floor of {floor} s"
    );
}

fn naive_beside(peer: &str, s: &serde_json::Value) {
    println!("{peer} naive: {s}");
    assert_eq!(s["mode"], "naive");
    // the naive figures are for comparison; they stay bounded
    let jobs = s["jobs_done"].as_u64().unwrap() + s["jobs_failed"].as_u64().unwrap();
    assert_eq!(jobs, 40, "{peer}: {s}");
    assert!(
        count(s, "429") > 0,
        "{peer}: the naive client drew no 429: {s}"
    );
}

#[test]
fn express_rate_limit_ietf_drafts() {
    let peers: Vec<_> = ["draft-6", "draft-7", "draft-8"]
        .into_iter()
        .filter_map(|d| Some((d, express(d)?)))
        .collect();
    if peers.len() < 3 {
        return;
    }
    let runs: Vec<_> = peers
        .iter()
        .map(|(d, p)| {
            let port = p.port;
            (*d, std::thread::spawn(move || bulk(port, &[])))
        })
        .collect();
    for (d, h) in runs {
        let s = h.join().unwrap();
        assert_polite(&format!("express-rate-limit {d}"), &s, Some(1));
    }
}

#[test]
fn express_rate_limit_x_ratelimit_headers() {
    let Some(p) = express("legacy") else { return };
    let s = bulk(p.port, &[]);
    // no window published and the reset in whole epoch seconds: the
    // window's length is read off the answers
    assert_polite("express-rate-limit x-ratelimit", &s, Some(1));
}

#[test]
fn express_rate_limit_naive() {
    let Some(p) = express("draft-8") else { return };
    let s = bulk(p.port, &["--naive"]);
    naive_beside("express-rate-limit draft-8", &s);
}

#[test]
fn nginx_limit_req_without_headers() {
    let Some(p) = nginx() else { return };
    let s = bulk(p.port, &[]);
    // nothing published: paced from a conservative start, speeding up
    // while nothing is rejected
    assert_polite("nginx limit_req", &s, None);
    let n = nginx().expect("nginx again");
    let naive = bulk(n.port, &["--naive"]);
    naive_beside("nginx limit_req", &naive);
}
