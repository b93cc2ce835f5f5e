//! The dashboard in a real browser: `paceline demo` serves it, headless
//! Chromium (Debian's `chromium`, which `scripts/test.sh` installs when
//! missing) loads it, and this test drives it over the Chrome DevTools
//! protocol with a small websocket client of its own: it checks the first
//! race's numbers against the printed table and `race.json`, changes the
//! refill rate and depth, plays the race, sees the counters and the bucket
//! chart move, checks the final numbers against `race.json` and the
//! page's printed table, and saves screenshots under the target directory.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// Kills a child process (by its own handle) when the test ends.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn chromium() -> String {
    for c in ["chromium", "chromium-browser", "google-chrome"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {c}")])
            .output()
            .is_ok_and(|o| o.status.success());
        if found {
            return c.to_string();
        }
    }
    panic!("no Chromium found: install Debian's `chromium` (scripts/test.sh does)");
}

/// Lines of a child's stream, read on a thread.
fn lines(r: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Waits for a line containing `needle`, keeping every line read.
fn wait_for(rx: &mpsc::Receiver<String>, needle: &str, kept: &mut Vec<String>) -> String {
    let deadline = Instant::now() + Duration::from_secs(90);
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match rx.recv_timeout(left) {
            Ok(l) => {
                kept.push(l.clone());
                if l.contains(needle) {
                    return l;
                }
            }
            Err(_) => break,
        }
    }
    panic!("no line with {needle:?}; got {kept:#?}");
}

/// A blocking GET of `path` on `host:port`, the body as text.
fn http_get(addr: &str, path: &str) -> String {
    let mut s = TcpStream::connect(addr).expect("connects");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    // the DevTools server may keep the connection open: read the head,
    // then as many bytes as it announces
    let mut r = BufReader::new(s);
    let mut len = 0;
    loop {
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        if line.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                len = v.trim().parse().unwrap();
            }
        }
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).unwrap();
    String::from_utf8(body).unwrap()
}

/// The smallest websocket client the DevTools protocol needs: one
/// connection, masked text frames out, text frames (maybe continued) in.
struct Ws {
    s: TcpStream,
    next_id: u64,
}

impl Ws {
    fn connect(url: &str) -> Ws {
        let rest = url.strip_prefix("ws://").expect("a ws:// URL");
        let (addr, path) = rest.split_at(rest.find('/').unwrap());
        let mut s = TcpStream::connect(addr).expect("connects to DevTools");
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: cGFjZWxpbmUtZTJlLXRlc3Q=\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        .unwrap();
        // the answer's head ends with a blank line
        let mut head = Vec::new();
        let mut b = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            s.read_exact(&mut b).unwrap();
            head.push(b[0]);
        }
        let head = String::from_utf8_lossy(&head);
        assert!(head.starts_with("HTTP/1.1 101"), "{head}");
        Ws { s, next_id: 1 }
    }

    fn send_text(&mut self, text: &str) {
        let data = text.as_bytes();
        let mut f = vec![0x81u8];
        match data.len() {
            n if n < 126 => f.push(0x80 | n as u8),
            n if n < 65_536 => {
                f.push(0x80 | 126);
                f.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                f.push(0x80 | 127);
                f.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        let mask = [0x12u8, 0x34, 0x56, 0x78];
        f.extend_from_slice(&mask);
        f.extend(data.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        self.s.write_all(&f).unwrap();
    }

    fn read_message(&mut self) -> String {
        let mut msg = Vec::new();
        loop {
            let mut h = [0u8; 2];
            self.s.read_exact(&mut h).unwrap();
            let fin = h[0] & 0x80 != 0;
            let len = match h[1] & 0x7f {
                126 => {
                    let mut l = [0u8; 2];
                    self.s.read_exact(&mut l).unwrap();
                    u16::from_be_bytes(l) as usize
                }
                127 => {
                    let mut l = [0u8; 8];
                    self.s.read_exact(&mut l).unwrap();
                    u64::from_be_bytes(l) as usize
                }
                n => n as usize,
            };
            let mut data = vec![0u8; len];
            self.s.read_exact(&mut data).unwrap();
            msg.extend_from_slice(&data);
            if fin {
                return String::from_utf8(msg).expect("text frames");
            }
        }
    }

    /// Calls a DevTools method and returns its result.
    fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send_text(&json!({"id": id, "method": method, "params": params}).to_string());
        loop {
            let v: Value = serde_json::from_str(&self.read_message()).unwrap();
            if v["id"] == id {
                assert!(v["error"].is_null(), "{method}: {v}");
                return v["result"].clone();
            }
        }
    }

    /// Evaluates `expr` in the page (promises awaited) and returns its value.
    fn eval(&mut self, expr: &str) -> Value {
        let r = self.evaluate(expr);
        assert!(r["exceptionDetails"].is_null(), "{expr}: {r}");
        r["result"]["value"].clone()
    }

    /// The page's whole answer to `expr`, an exception included.
    fn evaluate(&mut self, expr: &str) -> Value {
        self.call(
            "Runtime.evaluate",
            json!({"expression": expr, "awaitPromise": true, "returnByValue": true}),
        )
    }

    /// Evaluates `expr` until it is true, or fails after `secs`. While the
    /// page is still loading (no `document.body` yet, say) the expression
    /// may throw: that counts as not yet.
    fn until(&mut self, expr: &str, secs: u64) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < deadline {
            let r = self.evaluate(expr);
            if r["exceptionDetails"].is_null() && r["result"]["value"] == json!(true) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("never true: {expr}");
    }

    fn screenshot(&mut self, name: &str) -> PathBuf {
        let r = self.call("Page.captureScreenshot", json!({"format": "png"}));
        let png = base64_decode(r["data"].as_str().expect("image data"));
        assert!(png.starts_with(b"\x89PNG"), "a PNG");
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dashboard");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, png).unwrap();
        path
    }
}

fn base64_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let bytes: Vec<u8> = s.bytes().filter(|&c| c != b'=' && c != b'\n').collect();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let v: Vec<u32> = chunk.iter().map(|&c| u32::from(val(c))).collect();
        let n = v.iter().fold(0u32, |acc, &x| acc << 6 | x) << (6 * (4 - v.len()));
        out.extend_from_slice(&n.to_be_bytes()[1..v.len()]);
    }
    out
}

/// The counters table as the page shows it: per row key, both fleets.
const COUNTERS: &str = r#"(() => {
  const o = {};
  for (const tr of document.querySelectorAll('#counters tr[data-k]'))
    o[tr.dataset.k] = [...tr.querySelectorAll('td[data-f]')].map(td => td.textContent);
  return o;
})()"#;

/// `race.json`'s fleets, fetched by the page.
const RACE_JSON: &str = "fetch('/race.json').then(r => r.json()).then(v => v.fleets)";

/// Each counter the page shows equals `race.json`'s.
fn same_as_race_json(page: &Value, fleets: &Value) {
    for (f, fleet) in fleets.as_array().unwrap().iter().enumerate() {
        let n = |k: &str| fleet[k].as_u64().unwrap().to_string();
        let shown = |k: &str| page[k][f].as_str().unwrap().to_string();
        assert_eq!(
            shown("jobs"),
            format!("{}/{}", n("jobs_done"), n("jobs")),
            "{page}"
        );
        for k in ["requests", "rejected_429", "dropped"] {
            assert_eq!(shown(k), n(k), "{k} of fleet {f}: {page} vs {fleet}");
        }
        let fin = fleet["finished_at_s"].as_f64().expect("finished");
        assert_eq!(shown("finished"), format!("{fin:.2} s"), "{page}");
    }
}

/// A row of a printed race table: the label, then one cell per fleet.
fn table_row(table: &str, label: &str) -> Vec<String> {
    let line = table
        .lines()
        .find(|l| l.starts_with(label))
        .unwrap_or_else(|| panic!("no {label:?} row in {table}"));
    line[label.len()..]
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

fn same_as_table(page: &Value, table: &str) {
    for (label, key) in [
        ("jobs done", "jobs"),
        ("requests sent", "requests"),
        ("rejected 429", "rejected_429"),
        ("dropped at the edge", "dropped"),
    ] {
        let row = table_row(table, label);
        let shown: Vec<String> = page[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().replace(',', ""))
            .collect();
        let printed: Vec<String> = row.iter().map(|c| c.replace(',', "")).collect();
        assert_eq!(shown, printed, "{label}: page {page} vs table\n{table}");
    }
}

#[test]
fn the_dashboard_plays_the_race_in_a_real_browser() {
    let browser = chromium();
    let mut demo = Command::new(env!("CARGO_BIN_EXE_paceline"))
        .args([
            "demo",
            "--listen",
            "127.0.0.1:0",
            "--race-listen",
            "127.0.0.1:0",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("paceline runs");
    let out = lines(demo.stdout.take().unwrap());
    let _demo = Killed(demo);
    let mut printed = Vec::new();
    let url = wait_for(&out, "race dashboard on", &mut printed);
    let url = url
        .rsplit(' ')
        .next()
        .unwrap()
        .trim_end_matches('/')
        .to_string();
    // the first race runs at once; its table is printed when it ends
    wait_for(&out, "still serving", &mut printed);
    let table: String = printed
        .iter()
        .skip_while(|l| !l.starts_with("measure"))
        .take_while(|l| !l.starts_with("floor for"))
        .map(|l| format!("{l}\n"))
        .collect();

    let profile = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dashboard-profile");
    let _ = std::fs::remove_dir_all(&profile);
    let mut chrome = Command::new(browser)
        .args([
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--no-first-run",
            "--remote-debugging-port=0",
            "--window-size=1280,1500",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("{url}/"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("chromium runs");
    let err = lines(chrome.stderr.take().unwrap());
    let _chrome = Killed(chrome);
    let mut said = Vec::new();
    let listening = wait_for(&err, "DevTools listening on ws://", &mut said);
    let devtools = listening
        .split("ws://")
        .nth(1)
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let page_ws = {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let list: Value = serde_json::from_str(&http_get(&devtools, "/json/list")).unwrap();
            let found = list.as_array().unwrap().iter().find_map(|t| {
                (t["type"] == "page" && t["url"].as_str().unwrap_or("").starts_with(&url))
                    .then(|| t["webSocketDebuggerUrl"].as_str().unwrap().to_string())
            });
            if let Some(ws) = found {
                break ws;
            }
            assert!(Instant::now() < deadline, "no page in {list}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let mut page = Ws::connect(&page_ws);

    // the first race, as the page got it from the feed's hello
    page.until("document.body.dataset.state === 'done'", 30);
    let first = page.eval(COUNTERS);
    same_as_race_json(&first, &page.eval(RACE_JSON));
    same_as_table(&first, &table);
    assert_eq!(first["rejected_429"][0], "0", "{first}");
    page.screenshot("dashboard-first-race.png");

    // change the refill rate and the depth: the floor is recomputed
    page.eval(
        "(() => { for (const [id, v] of [['refill', 8], ['depth', 16]]) { \
           const e = document.getElementById(id); e.value = v; \
           e.dispatchEvent(new Event('input')); } })()",
    );
    let floor = page.eval("document.getElementById('floor').textContent");
    assert_eq!(floor, "floor 4.3 s", "(50 − 16) / 8 = 4.25 s");

    // play: the counters and the bucket chart move
    let runs = page.eval("Number(document.body.dataset.runs)");
    page.eval("document.getElementById('play').click()");
    page.until(
        &format!("Number(document.body.dataset.runs) > {runs} && document.body.dataset.state === 'running'"),
        30,
    );
    page.until("Number(document.body.dataset.ticks) >= 15", 30);
    let mid = page.eval(COUNTERS);
    let points = |p: &mut Ws| {
        p.eval("Number(document.querySelector('#tokens polyline[data-fleet=\"1\"]').dataset.n)")
            .as_u64()
            .unwrap()
    };
    let before = points(&mut page);
    let sent_mid: u64 = mid["requests"][1].as_str().unwrap().parse().unwrap();
    assert!(sent_mid > 0, "the naive fleet has sent: {mid}");
    assert_eq!(
        mid["tokens"][0].as_str().unwrap().split('/').nth(1),
        Some("16"),
        "{mid}"
    );
    page.screenshot("dashboard-running.png");
    std::thread::sleep(Duration::from_millis(800));
    assert!(points(&mut page) > before, "the bucket chart moves");

    // the end: the page's numbers are race.json's and its printed table's
    page.until("document.body.dataset.state === 'done'", 60);
    let last = page.eval(COUNTERS);
    let fleets = page.eval(RACE_JSON);
    same_as_race_json(&last, &fleets);
    let shown_table = page.eval("document.getElementById('table').textContent");
    same_as_table(&last, shown_table.as_str().unwrap());
    let sent_end: u64 = last["requests"][1].as_str().unwrap().parse().unwrap();
    assert!(sent_end > sent_mid, "the counters moved: {mid} then {last}");
    assert_eq!(fleets[0]["rejected_429"], 0, "{fleets}");
    assert_eq!(fleets[0]["jobs_done"], 50, "{fleets}");
    let fin = fleets[0]["finished_at_s"].as_f64().unwrap();
    assert!((4.25..4.25 * 1.1).contains(&fin), "at the new floor: {fin}");
    page.screenshot("dashboard-race.png");

    // the second view: the simulator's herd and export job
    page.call("Page.navigate", json!({"url": format!("{url}/sim")}));
    page.until(
        "document.body && document.body.dataset.state === 'ready'",
        60,
    );
    let bars = page.eval("document.querySelectorAll('#herd-1 rect').length");
    assert!(
        bars.as_u64().unwrap() >= 5,
        "the jittered herd spreads: {bars}"
    );
    page.screenshot("dashboard-sim.png");
}
