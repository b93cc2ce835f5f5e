//! `paceline rls` as a process: Envoy's generated client gets its answers,
//! a file saved while serving is picked up without a counter lost, and a
//! broken file is reported with its line. Every wait is bounded; the
//! process is killed when a test ends.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use paceline_rls::envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    rate_limit_descriptor::Entry, RateLimitDescriptor,
};
use paceline_rls::envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use paceline_rls::envoy_types::pb::envoy::service::ratelimit::v3::{
    RateLimitRequest, RateLimitResponse,
};

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("pl-bin-rls-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn yaml(rpu: u32) -> String {
    format!("domain: mail\ndescriptors:\n  - key: to_number\n    rate_limit:\n      unit: day\n      requests_per_unit: {rpu}\n")
}

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(config: &std::path::Path) -> (Proc, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_paceline"))
        .args([
            "rls",
            "--listen",
            "127.0.0.1:0",
            "--reload-ms",
            "50",
            "--config",
        ])
        .arg(config)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    let line = rx
        .recv_timeout(Duration::from_secs(15))
        .expect("no line from paceline rls");
    let addr = line
        .split_whitespace()
        .find(|w| w.starts_with("127.0.0.1:"))
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string();
    (Proc(child), addr)
}

fn request(n: &str) -> RateLimitRequest {
    RateLimitRequest {
        domain: "mail".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "to_number".into(),
                value: n.into(),
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    }
}

fn header<'a>(r: &'a RateLimitResponse, name: &str) -> Option<&'a str> {
    r.response_headers_to_add
        .iter()
        .find(|h| h.key == name)
        .map(|h| h.value.as_str())
}

#[tokio::test]
async fn serves_envoy_and_reloads_a_saved_file_without_losing_counts() {
    let d = dir("serve");
    let file = d.join("mail.yaml");
    std::fs::write(&file, yaml(3)).unwrap();
    let (_proc, addr) = start(&d);
    let mut c = RateLimitServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let mut ask = async |n: &str| c.should_rate_limit(request(n)).await.unwrap().into_inner();
    for left in [2, 1, 0] {
        let r = ask("206").await;
        assert_eq!(r.overall_code, 1);
        assert_eq!(r.statuses[0].limit_remaining, left);
        assert!(header(&r, "ratelimit").is_some());
    }
    let no = ask("206").await;
    assert_eq!(no.overall_code, 2);
    assert!(header(&no, "retry-after").is_some());
    assert!(!no.raw_body.is_empty());
    std::fs::write(&file, yaml(5)).unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let r = ask("other").await;
        if r.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit
            == 5
        {
            break;
        }
        assert!(Instant::now() < until, "the saved file was not picked up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // 3 counted before (the refused one charged nothing), 1 now
    assert_eq!(ask("206").await.statuses[0].limit_remaining, 1);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn check_names_the_line_of_a_broken_file() {
    let d = dir("check");
    let file = d.join("bad.yaml");
    std::fs::write(&file, yaml(3).replace("day", "fortnight")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_paceline"))
        .args(["rls", "--check", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.yaml:5: unknown unit \"fortnight\""),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&d);
}
