//! `paceline bulk` against a small loopback API (the real limiter and
//! header emitter behind a minimal HTTP/1.1 server).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;

use paceline_core::{Limiter, MemoryStore, Plan, Policy, SystemClock};
use paceline_wire::emit;

/// One request as the server saw it.
#[derive(Clone, Debug)]
struct Seen {
    method: String,
    path: String,
    headers: HashMap<String, String>,
    body: Vec<u8>,
    status: u16,
}

struct Api {
    limiter: Limiter<MemoryStore, SystemClock>,
    plan: Plan,
    seen: Mutex<Vec<Seen>>,
    burst_from: Mutex<Option<std::time::Instant>>,
}

fn spawn_api(plan: Plan) -> (SocketAddr, Arc<Api>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let api = Arc::new(Api {
        limiter: Limiter::new(MemoryStore::new(), SystemClock::new()),
        plan,
        seen: Mutex::new(Vec::new()),
        burst_from: Mutex::new(None),
    });
    let a = api.clone();
    thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { break };
            let a = a.clone();
            thread::spawn(move || serve(conn, &a));
        }
    });
    (addr, api)
}

fn serve(conn: TcpStream, api: &Api) {
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut out = conn;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut parts = line.split_whitespace();
        let method = parts.next().unwrap_or("").to_string();
        let path = parts.next().unwrap_or("").to_string();
        let mut headers = HashMap::new();
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
            }
        }
        let len: usize = headers
            .get("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let mut body = vec![0; len];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let flaky_first =
            path == "/flaky" && !api.seen.lock().unwrap().iter().any(|s| s.path == "/flaky");
        let key = headers.get("authorization").cloned().unwrap_or_default();
        let mut extra = Vec::new();
        // from the second request to /burst/ on, 8 s of outage (the first
        // answer seeds the client's pacing, so a wave goes out at once)
        let burst_left = path.starts_with("/burst/") && {
            let mut from = api.burst_from.lock().unwrap();
            let earlier = api
                .seen
                .lock()
                .unwrap()
                .iter()
                .any(|s| s.path.starts_with("/burst/"));
            match *from {
                None if earlier => {
                    *from = Some(std::time::Instant::now());
                    true
                }
                None => false,
                Some(t) => t.elapsed() < std::time::Duration::from_secs(8),
            }
        };
        let status = if flaky_first || path.starts_with("/down/") {
            extra.push(("retry-after".to_string(), "1".to_string()));
            503
        } else if burst_left {
            // an outage that still publishes the budget (the client paces)
            let d = api.limiter.check_sync(&api.plan, &key, 0).unwrap();
            let mut h = http::HeaderMap::new();
            emit::write_headers(&api.plan, &d, &emit::Dialects::default(), &mut h);
            for (k, v) in &h {
                extra.push((k.to_string(), v.to_str().unwrap().to_string()));
            }
            extra.push(("retry-after".to_string(), "1".to_string()));
            503
        } else if path.starts_with("/missing/") {
            404
        } else if path.starts_with("/conflict/") {
            // the same key with another body: definitive
            409
        } else if path.starts_with("/limited/") {
            extra.push(("retry-after".to_string(), "1".to_string()));
            429
        } else {
            let d = api.limiter.check_sync(&api.plan, &key, 1).unwrap();
            let mut h = http::HeaderMap::new();
            emit::write_headers(&api.plan, &d, &emit::Dialects::default(), &mut h);
            for (k, v) in &h {
                extra.push((k.to_string(), v.to_str().unwrap().to_string()));
            }
            if d.is_allowed() {
                200
            } else {
                429
            }
        };
        api.seen.lock().unwrap().push(Seen {
            method,
            path,
            headers,
            body,
            status,
        });
        let mut resp = format!("HTTP/1.1 {status} X\r\ncontent-length: 2\r\n");
        for (k, v) in extra {
            resp.push_str(&format!("{k}: {v}\r\n"));
        }
        resp.push_str("\r\nok");
        if out.write_all(resp.as_bytes()).is_err() {
            return;
        }
    }
}

fn race_plan() -> Plan {
    Plan::new("race", vec![Policy::token_bucket("burst", 8, 2).unwrap()]).unwrap()
}

fn bulk(args: &[&str], stdin: &str) -> (i32, serde_json::Value, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_paceline"))
        .arg("bulk")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let json = serde_json::from_str(stdout.trim()).unwrap_or(serde_json::Value::Null);
    (out.status.code().unwrap_or(-1), json, stderr + &stdout)
}

fn urls(addr: SocketAddr, n: usize) -> String {
    (0..n)
        .map(|i| format!("http://{addr}/v1/jobs/{i}\n"))
        .collect()
}

#[test]
fn the_sdk_finishes_at_the_floor_with_no_429() {
    let (addr, _api) = spawn_api(race_plan());
    let (code, s, out) = bulk(&["-", "--workers", "10", "--json"], &urls(addr, 20));
    assert_eq!(code, 0, "{out}");
    assert_eq!(s["jobs"], 20, "{out}");
    assert_eq!(s["jobs_done"], 20);
    assert_eq!(s["requests"], 20);
    assert_eq!(s["by_status"], serde_json::json!({"200": 20}));
    assert_eq!(s["retries"], 0);
    assert_eq!(s["local_drops"], 0);
    // 8 at once, then 12 at 4/s
    assert_eq!(s["floor_s"], 3.0);
    let elapsed = s["elapsed_s"].as_f64().unwrap();
    assert!((2.9..=3.3).contains(&elapsed), "{elapsed}");
}

#[test]
fn naive_mode_hammers_the_same_list() {
    let (addr, _api) = spawn_api(race_plan());
    let (code, s, out) = bulk(
        &[
            "--workers",
            "10",
            "--json",
            "--naive",
            "--rate",
            "4",
            "--burst",
            "8",
        ],
        &urls(addr, 20),
    );
    assert_eq!(code, 0, "{out}");
    assert_eq!(s["jobs_done"], 20);
    assert_eq!(s["mode"], "naive");
    let r429 = s["by_status"]["429"].as_u64().unwrap_or(0);
    assert!(r429 > 20, "{s}");
    assert_eq!(s["requests"].as_u64().unwrap(), 20 + r429);
    assert_eq!(s["retries"].as_u64().unwrap(), r429);
    assert_eq!(s["floor_s"], 3.0);
}

#[test]
fn json_lines_keys_and_idempotent_retries() {
    let (addr, api) = spawn_api(race_plan());
    let file = std::env::temp_dir().join(format!("paceline-bulk-{}.jsonl", std::process::id()));
    let list = format!(
        "{{\"method\":\"POST\",\"url\":\"http://{addr}/flaky\",\"body\":{{\"shipment\":\"shp_1\"}}}}\n\
         {{\"method\":\"PUT\",\"url\":\"http://{addr}/v1/x\",\"headers\":{{\"x-trace\":\"t1\"}},\"body\":\"raw\"}}\n\
         http://{addr}/v1/y\n"
    );
    std::fs::write(&file, list).unwrap();
    let (code, s, out) = bulk(
        &[
            file.to_str().unwrap(),
            "--key",
            "sk_test_1",
            "--json",
            "--workers",
            "1",
        ],
        "",
    );
    std::fs::remove_file(&file).ok();
    assert_eq!(code, 0, "{out}");
    assert_eq!(s["jobs_done"], 3, "{out}");
    assert_eq!(s["retries"], 1);
    assert_eq!(s["by_status"], serde_json::json!({"200": 3, "503": 1}));
    let seen = api.seen.lock().unwrap().clone();
    assert!(seen
        .iter()
        .all(|r| r.headers.get("authorization").map(String::as_str) == Some("Bearer sk_test_1")));
    let flaky: Vec<_> = seen.iter().filter(|r| r.path == "/flaky").collect();
    assert_eq!(flaky.len(), 2);
    assert_eq!(flaky[0].method, "POST");
    assert_eq!((flaky[0].status, flaky[1].status), (503, 200));
    assert_eq!(flaky[0].body, br#"{"shipment":"shp_1"}"#);
    let k0 = flaky[0]
        .headers
        .get("idempotency-key")
        .expect("a key on the POST");
    assert_eq!(
        Some(k0),
        flaky[1].headers.get("idempotency-key"),
        "same key on the retry"
    );
    assert_eq!(flaky[1].body, flaky[0].body);
    let put = seen.iter().find(|r| r.path == "/v1/x").unwrap();
    assert_eq!(put.headers.get("x-trace").map(String::as_str), Some("t1"));
    assert_eq!(put.body, b"raw");
}

#[test]
fn a_retried_post_keeps_its_key_and_a_conflict_is_not_retried() {
    let (addr, api) = spawn_api(race_plan());
    let list = format!(
        "{{\"method\":\"POST\",\"url\":\"http://{addr}/down/1\",\"body\":{{\"n\":1}}}}\n\
         {{\"method\":\"PATCH\",\"url\":\"http://{addr}/conflict/1\",\"body\":{{\"n\":2}}}}\n\
         {{\"method\":\"POST\",\"url\":\"http://{addr}/v1/ok\",\"headers\":{{\"idempotency-key\":\"mine\"}}}}\n"
    );
    let (code, s, out) = bulk(
        &[
            "--workers",
            "1",
            "--json",
            "--no-progress",
            "--max-wait",
            "4",
        ],
        &list,
    );
    assert_eq!(code, 1, "{out}");
    let seen = api.seen.lock().unwrap().clone();
    let down: Vec<_> = seen.iter().filter(|r| r.path == "/down/1").collect();
    assert!(down.len() > 1, "{}", down.len());
    let key = down[0].headers.get("idempotency-key").expect("a key");
    assert!(
        down.iter()
            .all(|r| r.headers.get("idempotency-key") == Some(key)),
        "one key across every attempt and requeue"
    );
    let conflict: Vec<_> = seen.iter().filter(|r| r.path == "/conflict/1").collect();
    assert_eq!(conflict.len(), 1, "a conflict is not retried");
    assert!(conflict[0].headers.contains_key("idempotency-key"));
    let f = s["failures"].as_array().unwrap();
    assert!(f.iter().any(|f| f["reason"] == "status_409"), "{out}");
    let mine = seen.iter().find(|r| r.path == "/v1/ok").unwrap();
    assert_eq!(
        mine.headers.get("idempotency-key").map(String::as_str),
        Some("mine")
    );
}

fn paths(addr: SocketAddr, prefix: &str, n: usize) -> String {
    (0..n)
        .map(|i| format!("http://{addr}/{prefix}/{i}\n"))
        .collect()
}

#[test]
fn no_job_is_lost_to_an_outage_longer_than_a_call_s_attempts() {
    // 8 s of 503s with Retry-After: 1, right after the first answer
    // seeded the pacing: every job is done, none failed
    let (addr, _api) = spawn_api(race_plan());
    let (code, s, out) = bulk(
        &["--workers", "10", "--json", "--no-progress"],
        &paths(addr, "burst", 40),
    );
    assert_eq!(code, 0, "{out}");
    assert_eq!(s["jobs_done"], 40, "{out}");
    assert_eq!(s["jobs_failed"], 0, "{out}");
    assert!(s["by_status"]["503"].as_u64().unwrap() >= 5, "{out}");
    assert_eq!(s["failures"], serde_json::json!([]));
    assert!(s["elapsed_s"].as_f64().unwrap() >= 8.0, "{out}");
}

#[test]
fn a_job_fails_only_on_a_definitive_answer_and_the_summary_says_why() {
    let (addr, _api) = spawn_api(race_plan());
    let list = format!(
        "http://{addr}/v1/ok\nhttp://{addr}/missing/1\nhttp://{addr}/down/1\nhttp://{addr}/v1/ok2\n"
    );
    let started = std::time::Instant::now();
    let (code, s, out) = bulk(
        &[
            "--workers",
            "2",
            "--json",
            "--no-progress",
            // one call of the down job takes about 5 s (five retries at
            // Retry-After: 1), more on a loaded machine: 8 s leaves room
            // for it to be requeued at least once
            "--max-wait",
            "8",
        ],
        &list,
    );
    assert_eq!(code, 1, "{out}");
    assert_eq!(
        (s["jobs_done"].as_u64(), s["jobs_failed"].as_u64()),
        (Some(2), Some(2)),
        "{out}"
    );
    let f = s["failures"].as_array().unwrap();
    assert_eq!(f[0]["job"], 2);
    assert_eq!(f[0]["reason"], "status_404");
    assert_eq!(f[0]["status"], 404);
    assert_eq!(f[1]["job"], 3);
    let reason = f[1]["reason"].as_str().unwrap();
    assert!(reason.starts_with("max_wait_exceeded"), "{reason}");
    assert!(f[1]["requeued"].as_u64().unwrap() > 0, "{out}");
    assert_eq!(f[1]["status"], 503);
    // bounded by --max-wait and the one call that may start before it
    let took = started.elapsed().as_secs_f64();
    assert!(took < 20.0, "{took} s: {out}");
}

#[test]
fn naive_mode_against_a_server_that_never_lets_up_is_bounded() {
    let (addr, api) = spawn_api(race_plan());
    let (code, s, out) = bulk(
        &[
            "--workers",
            "3",
            "--json",
            "--no-progress",
            "--naive",
            "--naive-attempts",
            "4",
        ],
        &paths(addr, "limited", 3),
    );
    assert_eq!(code, 1, "{out}");
    assert_eq!(s["jobs_failed"], 3, "{out}");
    assert_eq!(s["requests"], 12, "{out}");
    assert_eq!(api.seen.lock().unwrap().len(), 12);
    for f in s["failures"].as_array().unwrap() {
        assert_eq!(f["reason"], "naive_attempts_exhausted");
        assert_eq!(f["status"], 429);
    }
}

#[test]
fn a_bad_list_is_a_clear_error() {
    let (code, _, out) = bulk(&["-"], "http://127.0.0.1:9/ok\nftp://nope\n");
    assert_eq!(code, 2);
    assert!(out.contains("line 2"), "{out}");
}
