//! `paceline demo --json`: the race over real HTTP through the real
//! gateway, end to end, through the real binary (about 11 s of real time: the floor is the point).

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
