//! `paceline inspect` run as a process on responses our own emitter wrote
//! and on hand-written ones.

use std::io::Write;
use std::process::{Command, Stdio};

use paceline_core::{Limiter, ManualClock, MemoryStore, Nanos, Plan, Policy};
use paceline_wire::emit::{write_headers, Dialects};
use paceline_wire::problem::{Problem, PROBLEM_CONTENT_TYPE};
use serde_json::Value;

/// 2025-06-01T18:40:00Z: 5 h 20 min (19,200 s) before midnight UTC.
const AT_1840: u64 = 1_748_736_000 + 18 * 3_600 + 40 * 60;
const NOW_1840: &str = "2025-06-01T18:40:00Z";

fn run(args: &[&str], stdin: &[u8]) -> (i32, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_paceline"))
        .arg("inspect")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the paceline binary runs");
    // The command may stop reading early (a bad flag): a closed pipe is fine.
    let _ = child.stdin.take().unwrap().write_all(stdin);
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn inspect(raw: &str, now: &str) -> Value {
    let (code, out, err) = run(&["--now", now, "-"], raw.as_bytes());
    assert_eq!(code, 0, "stderr: {err}");
    serde_json::from_str(&out).expect("one JSON object")
}

/// A 429 (or 200) exactly as the server half would write it.
fn emitted(plan: &Plan, limiter: &Limiter<MemoryStore, ManualClock>, key: &str) -> String {
    let d = limiter.check_sync(plan, key, 1).unwrap();
    let mut h = paceline_wire::http::HeaderMap::new();
    write_headers(plan, &d, &Dialects::all(), &mut h);
    let problem = Problem::from_decision(plan, &d, "https://docs.shiplane.example/errors/");
    let status = if problem.is_some() {
        "429 Too Many Requests"
    } else {
        "200 OK"
    };
    let mut raw = format!("HTTP/1.1 {status}\r\n");
    if problem.is_some() {
        raw.push_str(&format!("Content-Type: {PROBLEM_CONTENT_TYPE}\r\n"));
    }
    for (k, v) in &h {
        raw.push_str(&format!("{}: {}\r\n", k, v.to_str().unwrap()));
    }
    raw.push_str("\r\n");
    if let Some(p) = problem {
        raw.push_str(&p.to_json());
    }
    raw
}

fn free(daily: u64) -> Plan {
    Plan::new(
        "Free",
        vec![
            Policy::token_bucket("burst", 20, 2).unwrap(),
            Policy::daily("daily", daily).unwrap(),
        ],
    )
    .unwrap()
}

#[test]
fn burst_429_from_our_emitter_is_rate_limited_and_retryable() {
    let plan = free(10_000);
    let clock = ManualClock::new(Nanos::from_secs(AT_1840));
    let limiter = Limiter::new(MemoryStore::new(), clock.clone());
    for _ in 0..20 {
        assert!(limiter.check_sync(&plan, "k", 1).unwrap().is_allowed());
    }
    let raw = emitted(&plan, &limiter, "k");
    assert!(raw.starts_with("HTTP/1.1 429"));
    let v = inspect(&raw, NOW_1840);
    assert_eq!(v["status"], 429);
    assert_eq!(v["outcome"], "rate_limited");
    assert_eq!(v["retry"], true);
    assert_eq!(v["retry_after_s"], 1);
    assert_eq!(v["limit"], 20);
    assert_eq!(v["remaining"], 0);
    assert!(v["dialects"]
        .as_array()
        .unwrap()
        .iter()
        .any(|d| d == "ietf"));
    assert_eq!(v["policies"].as_array().unwrap().len(), 2);
}

#[test]
fn daily_quota_429_is_quota_exhausted_and_not_retried() {
    let plan = free(5);
    let clock = ManualClock::new(Nanos::from_secs(AT_1840));
    let limiter = Limiter::new(MemoryStore::new(), clock.clone());
    for _ in 0..5 {
        assert!(limiter.check_sync(&plan, "k", 1).unwrap().is_allowed());
    }
    let raw = emitted(&plan, &limiter, "k");
    assert!(
        raw.contains("Retry-After: 19200") || raw.contains("retry-after: 19200"),
        "{raw}"
    );
    let v = inspect(&raw, NOW_1840);
    assert_eq!(v["outcome"], "quota_exhausted");
    assert_eq!(v["retry"], false);
    assert_eq!(v["retry_after_s"], 19_200);
    assert_eq!(v["limit"], 5);
    assert_eq!(v["remaining"], 0);
    assert_eq!(v["reset_in_s"], 19_200);
    assert_eq!(v["problem"]["limit"], "daily");
}

#[test]
fn allowed_response_may_go_now() {
    let plan = free(10_000);
    let limiter = Limiter::new(
        MemoryStore::new(),
        ManualClock::new(Nanos::from_secs(AT_1840)),
    );
    let raw = emitted(&plan, &limiter, "k");
    let v = inspect(&raw, NOW_1840);
    assert_eq!(v["outcome"], "success");
    assert_eq!(v["retry"], false);
    assert!(v["retry_after_s"].is_null());
    assert_eq!(v["remaining"], 19);
    assert_eq!(v["limit"], 20);
    assert!(v["ignored"].as_array().unwrap().is_empty());
}

#[test]
fn lf_crlf_http10_fold_and_missing_body() {
    let lf = "HTTP/1.0 503 Service Unavailable\nRetry-After:\n  7\nX-Other: a\n";
    let v = inspect(lf, NOW_1840);
    assert_eq!(v["status"], 503);
    assert_eq!(v["outcome"], "overloaded");
    assert_eq!(v["retry"], true);
    assert_eq!(v["retry_after_s"], 7);
    let crlf = lf.replace('\n', "\r\n");
    assert_eq!(inspect(&crlf, NOW_1840), v);
}

#[test]
fn reads_a_file_and_prints_pretty_and_human_views() {
    let dir = std::env::temp_dir().join(format!("paceline-inspect-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("resp.txt");
    std::fs::write(
        &file,
        "HTTP/1.1 200 OK\nx-ratelimit-limit: 60\nx-ratelimit-remaining: 0\nx-ratelimit-reset: 1748803260\n\n",
    )
    .unwrap();
    let f = file.to_str().unwrap();
    let (code, out, _) = run(&["--now", NOW_1840, "--pretty", f], b"");
    assert_eq!(code, 0);
    assert!(out.contains("\n  \"status\": 200"), "{out}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["retry_after_s"], 60);
    let (code, out, _) = run(&["--now", NOW_1840, "--human", f], b"");
    assert_eq!(code, 0);
    assert!(out.contains("outcome      success"), "{out}");
    assert!(out.contains("60 s (1m) before the next request"), "{out}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn hostile_values_are_listed_not_trusted() {
    let raw = format!(
        "HTTP/1.1 429 Too Many Requests\nRetry-After: 1e30\nRateLimit: burst;r=1;t=1\nX-RateLimit-Remaining: 5\nX-RateLimit-Remaining: 7\nX-Big: {}\nRateLimit-Policy: \"x\";q={}\n\n",
        "a".repeat(10_000),
        "9".repeat(10_000)
    );
    let v = inspect(&raw, NOW_1840);
    assert_eq!(v["outcome"], "rate_limited");
    assert!(v["retry_after_s"].is_null());
    let ignored: Vec<String> = v["ignored"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["field"].as_str().unwrap().to_string())
        .collect();
    for f in [
        "retry-after",
        "ratelimit",
        "x-ratelimit-remaining",
        "ratelimit-policy",
    ] {
        assert!(ignored.iter().any(|x| x == f), "{f} in {ignored:?}");
    }
}

#[test]
fn cached_response_counters_are_ignored() {
    let raw = "HTTP/1.1 200 OK\nAge: 30\nRateLimit-Policy: \"burst\";q=20;w=2\nRateLimit: \"burst\";r=0;t=2\n\n";
    let v = inspect(raw, NOW_1840);
    assert!(v["policies"].as_array().unwrap().is_empty());
    assert!(v["retry_after_s"].is_null());
    assert_eq!(v["ignored"].as_array().unwrap().len(), 2);
}

#[test]
fn bad_input_fails_with_a_message() {
    let (code, _, err) = run(&["--now", "yesterday", "-"], b"HTTP/1.1 200 OK\n\n");
    assert_eq!(code, 2);
    assert!(err.contains("RFC 3339"), "{err}");
    let (code, _, err) = run(&["-"], b"");
    assert_eq!(code, 2);
    assert!(err.contains("empty"), "{err}");
    let (code, _, err) = run(&["-"], b"<html>nope</html>");
    assert_eq!(code, 2);
    assert!(err.contains("status line"), "{err}");
}

/// The forms the client half learned to read, each with its verdict.
#[test]
fn verdicts_on_fixed_window_dialects_long_lists_caps_and_minute_instants() {
    // draft-7: the dictionary takes the window of its numbered policy
    let v = inspect(
        "HTTP/1.1 200 OK\nRateLimit-Policy: 8;w=2\nRateLimit: limit=8, remaining=7, reset=2\n\n",
        NOW_1840,
    );
    assert_eq!(v["outcome"], "success");
    assert_eq!(v["policies"][0]["window_s"], 2, "{v}");
    assert_eq!(
        (v["limit"].as_u64(), v["remaining"].as_u64()),
        (Some(8), Some(7))
    );

    // draft-8 as express-rate-limit writes it, exhausted
    let v = inspect(
        "HTTP/1.1 429 Too Many Requests\nRetry-After: 2\n\
         RateLimit-Policy: \"jobs\"; q=8; w=2; pk=:MTJjYTE3YjQ5YWYy:\nRateLimit: \"jobs\"; r=0; t=2\n\n",
        NOW_1840,
    );
    assert_eq!(v["outcome"], "rate_limited");
    assert_eq!(v["retry"], true);
    assert_eq!(v["retry_after_s"], 2);

    // a list of 1,024 policies is read whole; the tightest is the one left 0
    let mut pol = Vec::new();
    let mut lim = Vec::new();
    for i in 0..1_024 {
        pol.push(format!("\"p{i}\";q=100;w=60"));
        lim.push(format!("\"p{i}\";r={};t=30", if i == 700 { 0 } else { 50 }));
    }
    let raw = format!(
        "HTTP/1.1 429 Too Many Requests\nRateLimit-Policy: {}\nRateLimit: {}\n\n",
        pol.join(", "),
        lim.join(", ")
    );
    let v = inspect(&raw, NOW_1840);
    assert_eq!(v["policies"].as_array().unwrap().len(), 1_024);
    assert_eq!(
        (v["remaining"].as_u64(), v["retry_after_s"].as_u64()),
        (Some(0), Some(30))
    );
    assert_eq!(v["ignored"], serde_json::json!([]));
    // one more member and the field is ignored whole, with the reason
    let raw = format!(
        "HTTP/1.1 200 OK\nRateLimit-Policy: {}, \"extra\";q=1;w=1\n\n",
        pol.join(", ")
    );
    let v = inspect(&raw, NOW_1840);
    assert_eq!(v["policies"], serde_json::json!([]));
    assert_eq!(v["ignored"][0]["field"], "ratelimit-policy");

    // a reset instant without seconds: 18:42Z is 120 s after 18:40
    let v = inspect(
        "HTTP/1.1 429 Too Many Requests\nX-RateLimit-Limit: 100\nX-RateLimit-Remaining: 0\n\
         X-RateLimit-Reset: 2025-06-01T18:42Z\n\n",
        NOW_1840,
    );
    assert_eq!(v["outcome"], "rate_limited");
    assert_eq!(v["retry_after_s"], 120);

    // a body alone states a monthly cap and its reset date: a quota, no retry
    let v = inspect(
        "HTTP/1.1 429 Too Many Requests\nContent-Type: application/json\n\n\
         {\"error\": {\"code\": \"monthly_limit_exceeded\", \"message\": \"Monthly request limit reached; it resets on 2025-07-01.\"}}",
        NOW_1840,
    );
    assert_eq!(v["outcome"], "quota_exhausted", "{v}");
    assert_eq!(v["retry"], false);
    // 18:40 on June 1 to midnight on July 1: 29 days and 5 h 20 min
    assert_eq!(v["retry_after_s"], 29 * 86_400 + 19_200);
}
