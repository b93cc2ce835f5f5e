//! `paceline check` as a process: it says where it listens, answers a
//! described request with the fields, refuses a broken file with its
//! location, and stops on SIGTERM. Every wait is bounded.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(15);

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_paceline"))
}

fn shiplane() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/shiplane.toml")
}

/// One HTTP/1.1 exchange with `head` (closing), the whole answer as text.
fn exchange(addr: &str, head: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    s.write_all(head.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn serves_a_described_request_and_stops_on_sigterm() {
    let mut child = bin()
        .args(["check", "--listen", "127.0.0.1:0", "--config"])
        .arg(shiplane())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let addr = line
        .trim()
        .strip_prefix("paceline check: listening on http://")
        .unwrap_or_else(|| panic!("said {line:?}"))
        .to_string();
    let answer = exchange(
        &addr,
        "GET /check HTTP/1.1\r\nHost: check\r\nConnection: close\r\n\
         X-Forwarded-Method: GET\r\nX-Forwarded-Uri: /v1/rates?from=SFO\r\n\
         Authorization: Bearer sk_demo_alice\r\n\r\n",
    );
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
    assert!(answer.contains("ratelimit: \"burst\";r=19;"), "{answer}");
    let answer = exchange(
        &addr,
        "GET /check HTTP/1.1\r\nHost: check\r\nConnection: close\r\n\r\n",
    );
    assert!(answer.starts_with("HTTP/1.1 400 "), "{answer}");
    assert!(answer.contains("X-Forwarded-Method"), "{answer}");
    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "{status}");
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("did not stop on SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    assert!(rest.contains("paceline check: stopped"), "{rest}");
}

#[test]
fn a_broken_file_is_refused_with_its_location() {
    let dir = std::env::temp_dir().join(format!("pl-bin-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("broken.toml");
    std::fs::write(
        &file,
        "[gateway]\nlisten = \"127.0.0.1:0\"\nupstream = \"http://127.0.0.1:9\"\n\n[plans.free]\npolicies = []\n\n[keys]\nsk_1 = \"gold\"\n",
    )
    .unwrap();
    let out = bin()
        .args(["check", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("paceline check: "), "{err}");
    assert!(err.contains("broken.toml:"), "{err}");
}
