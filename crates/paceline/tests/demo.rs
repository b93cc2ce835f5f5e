//! `paceline demo --json`: the race over real HTTP through the real
//! gateway, end to end, through the real binary (about 11 s of real time
//! each: the floor is the point); with three instances behind a front,
//! counting alone and in a real `redis-server`.

use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn demo_json_reports_the_race() {
    let start = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_paceline"))
        .args([
            "demo",
            "--json",
            "--listen",
            "127.0.0.1:0",
            "--race-listen",
            "127.0.0.1:0",
        ])
        .output()
        .expect("paceline runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(start.elapsed() < Duration::from_secs(60));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    assert_eq!(v["floor_s"], 10.5);
    let fleets = v["fleets"].as_array().expect("fleets");
    assert_eq!(fleets.len(), 2);
    let (coop, naive) = (&fleets[0], &fleets[1]);
    assert_eq!(coop["name"], "cooperative");
    assert_eq!(naive["name"], "naive");
    for f in fleets {
        for field in [
            "jobs",
            "jobs_done",
            "requests",
            "rejected_429",
            "dropped",
            "finished_at_s",
        ] {
            assert!(!f[field].is_null(), "{field} missing in {f}");
        }
        assert_eq!(f["jobs_done"], 50);
        // what the demo API served (behind the gateway) is one per job,
        // and every request the gateway answered is served, 429 or dropped
        assert_eq!(f["served"], 50, "{f}");
        let n = |k: &str| f[k].as_u64().unwrap();
        assert_eq!(
            n("requests"),
            n("served") + n("rejected_429") + n("dropped"),
            "{f}"
        );
    }
    // the cooperative fleet paces: no 429, one request per job, at the floor
    assert_eq!(coop["rejected_429"], 0, "{coop}");
    assert_eq!(coop["requests"], 50, "{coop}");
    let fin = coop["finished_at_s"].as_f64().unwrap();
    assert!((10.4..=11.5).contains(&fin), "finished at {fin}");
    // the naive fleet pays for the same jobs in requests
    assert!(naive["requests"].as_u64().unwrap() > 200, "{naive}");
    // the gateway's edge (max_rps = 40, the heaviest caller first) drops
    // the naive fleet's excess, never a paced request
    assert_eq!(coop["dropped"], 0, "{coop}");
    assert!(naive["dropped"].as_u64().unwrap() > 0, "{naive}");
}

#[test]
fn no_race_serves_the_demo_api_behind_the_gateway() {
    use std::io::{BufRead, BufReader, Read, Write};
    let mut child = Command::new(env!("CARGO_BIN_EXE_paceline"))
        .args(["demo", "--no-race", "--listen", "127.0.0.1:0"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("paceline runs");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let addr = line
        .trim()
        .strip_prefix("paceline demo: gateway on http://")
        .unwrap_or_else(|| panic!("{line}"))
        .to_string();
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET /v1/rates HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer sk_demo_alice\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    let _ = child.kill();
    let _ = child.wait();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let lower = answer.to_ascii_lowercase();
    assert!(
        lower.contains("ratelimit: \"burst\";r=19"),
        "the gateway's fields: {answer}"
    );
    assert!(
        answer.contains("rate_ups_ground"),
        "the API's body: {answer}"
    );
}

/// `paceline demo --json` with extra arguments: its JSON, or why it failed.
fn demo_json(extra: &[&str]) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_paceline"))
        .args([
            "demo",
            "--json",
            "--listen",
            "127.0.0.1:0",
            "--race-listen",
            "127.0.0.1:0",
        ])
        .args(extra)
        .output()
        .expect("paceline runs");
    assert!(
        out.status.success(),
        "paceline demo {extra:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON on stdout")
}

/// The naive fleet's entry in `admitted`, checked against its finish.
fn naive_admitted(v: &serde_json::Value) -> (f64, f64) {
    let a = &v["admitted"][1];
    assert_eq!(a["name"], "naive", "{v}");
    assert_eq!(a["admitted"], 50, "{a}");
    let fin = v["fleets"][1]["finished_at_s"].as_f64().expect("finished");
    // one limit (depth 8, refill 4/s) allows 8 + 4 t over a run of t s
    let allows = a["one_limit_allows"].as_f64().unwrap();
    assert!((allows - (8.0 + 4.0 * fin)).abs() <= 0.06, "{a} at {fin}");
    (a["times_the_limit"].as_f64().unwrap(), fin)
}

// Bounds, from the race's numbers (depth 8, refill 4/s, 50 jobs, the naive
// fleet retrying every 100 ms): with `n` buckets counting alone, 50 jobs
// cannot be done before (50 - 8n) / 4n s; one limit allows 8 + 4t over t
// s, so `times_the_limit` = 50 / (8 + 4t) is at most 50 / (8 + 4 (50 - 8n)
// / 4n) = n at that earliest finish (+0.01 for rounding), and falls as the
// fleet finishes later than that (its retries are 100 ms apart, the
// machine may be busy). Three alone: at most 3.0; at least 2.0 means a
// finish within 4.25 s, 2 s after the earliest. One shared count: at most
// 1.0 (the floor, 10.5 s); at least 0.85 means within 12.7 s, 2.2 s late.
#[test]
fn three_instances_count_alone_in_memory_and_as_one_in_redis() {
    let installed = Command::new("redis-server")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        installed,
        "this test needs redis-server on PATH (Debian: apt-get install redis-server; \
         the README's test command installs it)"
    );
    let start = Instant::now();
    let alone = demo_json(&["--instances", "3"]);
    assert_eq!(
        (alone["instances"].as_u64(), alone["store"].as_str()),
        (Some(3), Some("memory"))
    );
    let (times, fin) = naive_admitted(&alone);
    assert!(
        (2.0..=3.01).contains(&times),
        "{times}x the limit, finished at {fin}: {alone}"
    );
    assert!(fin < 10.5 / 2.0, "three buckets finish early: {fin}");

    let shared = demo_json(&["--instances", "3", "--store", "redis"]);
    assert_eq!(
        (shared["instances"].as_u64(), shared["store"].as_str()),
        (Some(3), Some("redis"))
    );
    let (times, fin) = naive_admitted(&shared);
    assert!(
        (0.85..=1.01).contains(&times),
        "{times}x the limit, finished at {fin}: {shared}"
    );
    assert!(
        fin >= 10.45,
        "one shared bucket: not before the floor, {fin}"
    );
    // the same contract for everyone: the paced fleet still takes no 429
    // and does its jobs
    for v in [&alone, &shared] {
        let coop = &v["fleets"][0];
        assert_eq!(
            (coop["jobs_done"].as_u64(), coop["served"].as_u64()),
            (Some(50), Some(50)),
            "{coop}"
        );
    }
    assert_eq!(shared["fleets"][0]["rejected_429"], 0, "{shared}");
    assert!(start.elapsed() < Duration::from_secs(90));
}

#[test]
fn many_instances_are_bounded_and_redis_is_asked_for_clearly() {
    let run = |args: &[&str], path: Option<&str>| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_paceline"));
        c.args([
            "demo",
            "--json",
            "--listen",
            "127.0.0.1:0",
            "--race-listen",
            "127.0.0.1:0",
        ]);
        c.args(args);
        if let Some(p) = path {
            c.env("PATH", p);
        }
        let out = c.output().expect("paceline runs");
        assert!(!out.status.success(), "{args:?} is refused");
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    assert!(run(&["--instances", "0"], None).contains("1..=16"));
    assert!(run(&["--instances", "17"], None).contains("1..=16"));
    // no redis-server to start, no --redis-url
    let e = run(&["--store", "redis"], Some("/nonexistent"));
    assert!(
        e.contains("--redis-url") && e.contains("redis-server"),
        "{e}"
    );
    // a URL nothing answers at
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("redis://127.0.0.1:{port}");
    let e = run(&["--store", "redis", "--redis-url", &url], None);
    assert!(e.contains("nothing answers"), "{e}");
    let e = run(&["--redis-url", &url], None);
    assert!(e.contains("only with --store redis"), "{e}");
}

/// `paceline demo --no-race` with `extra`: the `RateLimit` field of each
/// of `n` requests with one key, sent to the address it prints.
fn no_race_fields(extra: &[&str], n: usize) -> Vec<String> {
    use std::io::{BufRead, BufReader, Read, Write};
    let mut child = Command::new(env!("CARGO_BIN_EXE_paceline"))
        .args(["demo", "--no-race", "--listen", "127.0.0.1:0"])
        .args(extra)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("paceline runs");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let addr = line
        .trim()
        .strip_prefix("paceline demo: gateway on http://")
        .unwrap_or_else(|| panic!("{line}"))
        .to_string();
    let fields = (0..n)
        .map(|_| {
            let mut s = std::net::TcpStream::connect(&addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            write!(
                s,
                "GET /v1/rates HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer sk_demo_bob\r\nConnection: close\r\n\r\n"
            )
            .unwrap();
            let mut answer = String::new();
            let _ = s.read_to_string(&mut answer);
            assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
            answer
                .lines()
                .find_map(|l| l.to_ascii_lowercase().strip_prefix("ratelimit: ").map(str::to_string))
                .unwrap_or_else(|| panic!("no RateLimit field: {answer}"))
        })
        .collect();
    // SIGTERM: the demo stops its gateways and its redis-server
    let _ = Command::new("kill").arg(child.id().to_string()).status();
    let _ = child.wait();
    fields
}

#[test]
fn a_curl_user_meets_the_front_over_three_instances() {
    let burst = |f: &String| {
        f.split("r=")
            .nth(1)
            .and_then(|r| r.split(';').next())
            .unwrap()
            .parse::<u64>()
            .unwrap()
    };
    // three in a row, round robin: each instance has seen one
    let alone = no_race_fields(&["--instances", "3"], 3);
    assert_eq!(
        alone.iter().map(burst).collect::<Vec<_>>(),
        [19, 19, 19],
        "{alone:?}"
    );
    if !Command::new("redis-server")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        panic!("this test needs redis-server on PATH (Debian: apt-get install redis-server)");
    }
    // one count: the burst spent one by one (20 refill in 2 s: none back
    // between three quick requests, at most one on a slow machine)
    let shared = no_race_fields(&["--instances", "3", "--store", "redis"], 3);
    let left: Vec<u64> = shared.iter().map(burst).collect();
    assert_eq!(left[0], 19, "{shared:?}");
    assert!(left[2] <= 18 && left[1] < 19, "{shared:?}");
}
