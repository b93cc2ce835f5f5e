//! The gateway over TLS, as clients meet it: curl over HTTP/1.1 and
//! HTTP/2 (ALPN) get the Free plan's fields and the 429 of the plain
//! gateway; `openssl s_client` sees TLS 1.3 and the negotiated protocol;
//! with `client_ca_file` a client without a certificate is refused in the
//! handshake, and with `key = "client_cert"` its subject is its key; a
//! certificate replaced on disk is served to new connections while the
//! open ones go on; a broken new certificate keeps the old one. And the
//! hostile side: a thousand handshakes that never finish are closed at
//! their deadline while a polite client keeps its pace, and bytes that
//! are not TLS close their connection.
//!
//! The certificates are made here (`common/certs.rs`). curl and openssl
//! come from Debian (`scripts/test.sh` installs them when missing).

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::certs::{Leaf, TestCa};
use common::tls::{connector, get, h1, tls_connect, tls_gateway};
use common::{counting_upstream, LIMIT};
use paceline_core::{Clock, ManualClock};
use paceline_gateway::{Gateway, GatewayConfig, GatewayHandle};
use rustls::pki_types::CertificateDer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const NOW_S: u64 = 1_790_880_000;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub(crate) fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("paceline-gw-tls-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `examples/shiplane.toml` in front of `api`, listening with TLS on the
/// files of `leaf`, with `more` lines in `[gateway.tls]` and `extra`
/// lines at the top level.
fn shiplane(api: SocketAddr, leaf: &Leaf, more: &str, extra: &str) -> String {
    let text = std::fs::read_to_string(workspace().join("examples/shiplane.toml")).unwrap();
    let text = text
        .replace("listen = \"127.0.0.1:8080\"", "listen = \"127.0.0.1:0\"")
        .replace("http://127.0.0.1:9000", &format!("http://{api}"));
    format!(
        "{extra}\n{text}\n[gateway.tls]\ncert_file = {:?}\nkey_file = {:?}\n{more}\n",
        leaf.cert_file, leaf.key_file
    )
}

struct Rig {
    addr: SocketAddr,
    handle: GatewayHandle,
    served: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Rig {
    async fn start(text: &str) -> Rig {
        let cfg = GatewayConfig::parse(text, "tls.toml", None).unwrap();
        Rig::start_config(cfg).await
    }

    async fn start_config(cfg: GatewayConfig) -> Rig {
        let clock: Arc<dyn Clock> = Arc::new(ManualClock::at_unix_secs(NOW_S));
        let gw = Gateway::bind_with_clock(cfg, clock).await.unwrap();
        let addr = gw.local_addr();
        let handle = gw.handle();
        let served = tokio::spawn(gw.run(std::future::pending()));
        Rig {
            addr,
            handle,
            served,
        }
    }

    async fn stop(self) {
        self.handle.shutdown();
        let _ = tokio::time::timeout(LIMIT, self.served).await;
    }
}

/// A tool from Debian, or a failure in CI and a skip elsewhere.
fn tool(name: &str) -> bool {
    if Command::new(name).arg("--version").output().is_ok()
        || Command::new(name).arg("version").output().is_ok()
    {
        return true;
    }
    common::nginx::missing(name);
    false
}

/// One answer of curl's `-i` output: status line, fields, body.
#[derive(Debug)]
struct Seen {
    status: u16,
    version: String,
    fields: Vec<(String, String)>,
    body: String,
}

impl Seen {
    fn field(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Runs curl over `version` (`--http1.1` or `--http2`) for `n` GETs of
/// `path` on one connection, and splits what it printed into answers
/// (curl's `-w` marks where each body ends).
fn curl(addr: SocketAddr, ca: &Path, version: &str, path: &str, key: &str, n: usize) -> Vec<Seen> {
    let url = format!("https://127.0.0.1:{}{path}", addr.port());
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "-i", version, "--max-time", "10", "--cacert"])
        .arg(ca)
        .args(["-H", &format!("Authorization: Bearer {key}")])
        .args(["-w", "\n--END--\n"]);
    for _ in 0..n {
        cmd.arg(&url);
    }
    let out = cmd.output().expect("curl runs");
    assert!(
        out.status.success(),
        "curl failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    text.split("\n--END--\n")
        .filter(|s| !s.trim().is_empty())
        .map(|one| {
            let (head, body) = one.split_once("\r\n\r\n").expect("a head");
            let mut lines = head.lines();
            let status_line = lines.next().unwrap();
            let mut parts = status_line.split_whitespace();
            let version = parts.next().unwrap().to_string();
            let status = parts.next().unwrap().parse().unwrap();
            let fields = lines
                .filter_map(|l| l.split_once(':'))
                .map(|(n, v)| (n.trim().to_string(), v.trim().to_string()))
                .collect();
            Seen {
                status,
                version,
                fields,
                body: body.to_string(),
            }
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_over_http1_and_http2_gets_the_free_plans_fields_and_its_429() {
    if !tool("curl") {
        return;
    }
    let dir = scratch("curl");
    let ca = TestCa::new(&dir, "ca");
    let leaf = ca.server(&dir, "gw", &["127.0.0.1", "localhost"]);
    let (api, seen) = counting_upstream().await;
    let rig = Rig::start(&shiplane(api, &leaf, "", "")).await;
    for (version, shown, key) in [
        ("--http1.1", "HTTP/1.1", "sk_demo_alice"),
        ("--http2", "HTTP/2", "sk_demo_bob"),
    ] {
        let (addr, ca) = (rig.addr, ca.cert_file.clone());
        let answers =
            tokio::task::spawn_blocking(move || curl(addr, &ca, version, "/v1/rates", key, 21))
                .await
                .unwrap();
        assert_eq!(answers.len(), 21, "{answers:?}");
        for (i, a) in answers.iter().enumerate() {
            assert_eq!(a.version, shown, "answer {i}");
            assert_eq!(
                a.field("ratelimit-policy"),
                Some(r#""burst";q=20;w=2, "daily";q=10000;w=86400"#),
                "answer {i}: {a:?}"
            );
            let limit = a.field("ratelimit").expect("RateLimit on every answer");
            let burst_left = 19i64 - i as i64;
            if i < 20 {
                assert_eq!(a.status, 200, "answer {i}: {a:?}");
                assert!(
                    limit.starts_with(&format!("\"burst\";r={burst_left};")),
                    "answer {i}: {limit}"
                );
            } else {
                assert_eq!(a.status, 429, "answer {i}: {a:?}");
                assert!(limit.starts_with("\"burst\";r=0;t="), "{limit}");
                let retry: u64 = a
                    .field("retry-after")
                    .expect("Retry-After")
                    .parse()
                    .unwrap();
                assert!(retry >= 1, "{retry}");
                assert_eq!(a.field("content-type"), Some("application/problem+json"));
                let problem: serde_json::Value = serde_json::from_str(&a.body).unwrap();
                assert_eq!(problem["status"], 429, "{problem}");
                assert_eq!(problem["limit"], "burst", "{problem}");
            }
        }
    }
    // 20 of each key's 21 reached the API
    assert_eq!(seen.load(std::sync::atomic::Ordering::SeqCst), 40);
    rig.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// `openssl s_client` against `addr` with `args`: what it printed (both
/// streams), and whether the handshake succeeded.
fn s_client(addr: SocketAddr, ca: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new("openssl")
        .args(["s_client", "-connect", &addr.to_string(), "-CAfile"])
        .arg(ca)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("openssl runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (
        out.status.success() && text.contains("Verify return code: 0 (ok)"),
        text,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openssl_sees_tls_1_3_and_the_negotiated_protocol_and_nothing_older_than_1_2() {
    if !tool("openssl") {
        return;
    }
    let dir = scratch("openssl");
    let ca = TestCa::new(&dir, "ca");
    let leaf = ca.server(&dir, "gw", &["127.0.0.1"]);
    let (api, _) = counting_upstream().await;
    let rig = Rig::start(&shiplane(api, &leaf, "", "")).await;
    let (addr, ca_file) = (rig.addr, ca.cert_file.clone());
    tokio::task::spawn_blocking(move || {
        let (ok, text) = s_client(addr, &ca_file, &["-alpn", "h2,http/1.1"]);
        assert!(ok, "{text}");
        assert!(text.contains("New, TLSv1.3, Cipher is"), "{text}");
        assert!(text.contains("ALPN protocol: h2"), "{text}");
        let (ok, text) = s_client(addr, &ca_file, &["-alpn", "http/1.1"]);
        assert!(ok && text.contains("ALPN protocol: http/1.1"), "{text}");
        // TLS 1.2 is offered too, 1.1 and older not
        let (ok, text) = s_client(addr, &ca_file, &["-tls1_2"]);
        assert!(ok && text.contains("New, TLSv1.2, Cipher is"), "{text}");
        let (ok, text) = s_client(
            addr,
            &ca_file,
            &["-tls1_1", "-cipher", "DEFAULT@SECLEVEL=0"],
        );
        assert!(!ok, "TLS 1.1 must be refused: {text}");
    })
    .await
    .unwrap();
    rig.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

fn first_cert(file: &Path) -> CertificateDer<'static> {
    use rustls::pki_types::pem::PemObject;
    CertificateDer::pem_file_iter(file)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_client_ca_only_clients_with_a_valid_certificate_get_in_and_its_subject_is_the_key()
{
    let dir = scratch("mtls");
    let ca = TestCa::new(&dir, "ca");
    let leaf = ca.server(&dir, "gw", &["127.0.0.1"]);
    let billing = ca.client(&dir, "billing", "billing");
    let stranger_ca = TestCa::new(&dir, "other");
    let stranger = stranger_ca.client(&dir, "stranger", "billing");
    let (api, seen) = counting_upstream().await;
    let text = format!(
        r#"key = "client_cert"

[gateway]
listen = "127.0.0.1:0"
upstream = "http://{api}"
watch = false

[gateway.tls]
cert_file = {:?}
key_file = {:?}
client_ca_file = {:?}

[plans.free]
policies = [{{ name = "burst", algorithm = "token_bucket", q = 3, w = 3600 }}]

[keys]
"CN=billing" = "free"
"#,
        leaf.cert_file, leaf.key_file, ca.cert_file
    );
    let rig = Rig::start(&text).await;
    // no certificate: refused in the handshake (TLS 1.3 tells the client
    // at its first read)
    let anon = connector(&ca.cert_file, &[b"http/1.1"], None);
    let refused = match tls_connect(&anon, rig.addr).await {
        Err(_) => true,
        Ok(mut s) => {
            let _ = s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n").await;
            let mut buf = [0u8; 64];
            !matches!(
                tokio::time::timeout(LIMIT, s.read(&mut buf)).await,
                Ok(Ok(n)) if n > 0
            )
        }
    };
    assert!(refused, "a client without a certificate got in");
    // a certificate from a CA the gateway does not trust: refused too
    let other = connector(&ca.cert_file, &[b"http/1.1"], Some(&stranger));
    let refused = match tls_connect(&other, rig.addr).await {
        Err(_) => true,
        Ok(mut s) => {
            let _ = s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n").await;
            let mut buf = [0u8; 64];
            !matches!(
                tokio::time::timeout(LIMIT, s.read(&mut buf)).await,
                Ok(Ok(n)) if n > 0
            )
        }
    };
    assert!(refused, "a client with an untrusted certificate got in");
    assert_eq!(seen.load(std::sync::atomic::Ordering::SeqCst), 0);
    // the trusted client: counted under its subject
    let ok = connector(&ca.cert_file, &[b"http/1.1"], Some(&billing));
    let (mut send, _) = h1(&ok, rig.addr).await;
    for left in [2, 1, 0] {
        let (status, limit) = get(&mut send, "/v1/x", None).await;
        assert_eq!(status, 200);
        let limit = limit.unwrap();
        assert!(
            limit.starts_with(&format!("\"burst\";r={left};")),
            "{limit}"
        );
    }
    let (status, _) = get(&mut send, "/v1/x", None).await;
    assert_eq!(status, 429);
    assert_eq!(seen.load(std::sync::atomic::Ordering::SeqCst), 3);
    rig.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_replaced_on_disk_serves_new_connections_and_drops_no_open_one() {
    let dir = scratch("reload");
    let ca = TestCa::new(&dir, "ca");
    let leaf = ca.server(&dir, "gw", &["127.0.0.1"]);
    let (api, _) = counting_upstream().await;
    // from a file, as a reload reads it again
    let file = dir.join("gw.toml");
    std::fs::write(&file, shiplane(api, &leaf, "", "")).unwrap();
    let rig = Rig::start_config(GatewayConfig::load(&file).unwrap()).await;
    let c = connector(&ca.cert_file, &[b"http/1.1"], None);
    let (mut open, shown) = h1(&c, rig.addr).await;
    assert_eq!(shown, first_cert(&leaf.cert_file));
    assert_eq!(
        get(&mut open, "/v1/rates", Some("sk_demo_alice")).await.0,
        200
    );

    // a new certificate, moved into place as a deployment tool does
    let next = ca.server(&dir, "next", &["127.0.0.1"]);
    let wanted = first_cert(&next.cert_file);
    std::fs::rename(&next.key_file, &leaf.key_file).unwrap();
    std::fs::rename(&next.cert_file, &leaf.cert_file).unwrap();
    let deadline = Instant::now() + LIMIT;
    loop {
        let (_, now) = h1(&c, rig.addr).await;
        if now == wanted {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the new certificate is never served"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // the connection opened before goes on
    assert_eq!(
        get(&mut open, "/v1/rates", Some("sk_demo_alice")).await.0,
        200
    );

    // a broken certificate: the reload is refused and says why, and the
    // certificate in force keeps serving
    std::fs::write(&leaf.cert_file, "not a certificate\n").unwrap();
    match rig.handle.reload() {
        paceline_gateway::ReloadEvent::Refused(e) => {
            assert_eq!(e.field(), "gateway.tls.cert_file", "{e}");
            assert!(e.message().contains("no certificate"), "{e}");
        }
        other => panic!("a broken certificate was applied: {other:?}"),
    }
    let (_, still) = h1(&c, rig.addr).await;
    assert_eq!(still, wanted);
    assert_eq!(
        get(&mut open, "/v1/rates", Some("sk_demo_alice")).await.0,
        200
    );
    rig.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

static PANICS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn count_panics() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        PANICS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        previous(info);
    }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_is_not_a_client_hello_closes_its_connection_without_a_panic() {
    count_panics();
    let dir = scratch("garbage");
    let (addr, handle, ca) = tls_gateway(&dir, "").await;
    let mut noise = vec![0u8; 4096];
    for (i, b) in noise.iter_mut().enumerate() {
        *b = (i * 7919 % 251) as u8;
    }
    let inputs: Vec<Vec<u8>> = vec![
        b"GET / HTTP/1.1\r\nhost: x\r\n\r\n".to_vec(),
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec(),
        noise,
        // a handshake record announcing 16 MiB
        vec![0x16, 0x03, 0x03, 0xff, 0xff, 0x01, 0xff, 0xff, 0xff],
        // a ClientHello that says it is longer than its record and
        // then the record's end: a TLS record of another type
        vec![
            0x16, 0x03, 0x01, 0x00, 0x08, 0x01, 0x00, 0x00, 0x40, 0x03, 0x03, 0, 0, 0x17, 0x03,
            0x03, 0x00, 0x01, 0x00,
        ],
        // an alert before anything
        vec![0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x28],
        Vec::new(),
    ];
    for input in &inputs {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(input).await.unwrap();
        if input.is_empty() {
            s.shutdown().await.unwrap();
        }
        let mut buf = vec![0u8; 1024];
        let t = Instant::now();
        loop {
            match tokio::time::timeout(LIMIT, s.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => break,
                Ok(Ok(_)) => continue,
                Err(_) => panic!("{input:?}: the connection stays open"),
            }
        }
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "{input:?}: closed only after {:?}",
            t.elapsed()
        );
    }
    // and a polite client is still served
    let c = connector(&ca, &[b"http/1.1"], None);
    let (mut send, _) = h1(&c, addr).await;
    assert_eq!(get(&mut send, "/v1/x", Some("sk_a")).await.0, 200);
    assert_eq!(
        PANICS.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "a task panicked"
    );
    assert_eq!(handle.tls_handshakes(), 0);
    handle.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_max_handshakes_the_oldest_unfinished_one_makes_room() {
    let dir = scratch("displace");
    let (addr, handle, ca) = tls_gateway(&dir, "max_handshakes = 50").await;
    let mut stalled = Vec::new();
    for _ in 0..200 {
        stalled.push(TcpStream::connect(addr).await.unwrap());
    }
    // 150 of them (the first to start their handshakes, in whatever order
    // the runtime ran them) are closed at once, not at the 10 s deadline;
    // 50 stay
    let reads: Vec<_> = stalled
        .into_iter()
        .map(|mut s| {
            tokio::spawn(async move {
                let mut buf = [0u8; 16];
                let r = tokio::time::timeout(Duration::from_secs(3), s.read(&mut buf)).await;
                (matches!(r, Ok(Ok(0)) | Ok(Err(_))), s)
            })
        })
        .collect();
    let mut open = Vec::new();
    let mut closed = 0;
    for r in reads {
        let (was_closed, s) = r.await.unwrap();
        match was_closed {
            true => closed += 1,
            false => open.push(s),
        }
    }
    assert_eq!((closed, open.len()), (150, 50), "displaced and kept");
    assert_eq!(handle.tls_handshakes(), 50);
    // a polite client displaces the oldest of the rest and is served
    let c = connector(&ca, &[b"http/1.1"], None);
    let (mut send, _) = h1(&c, addr).await;
    assert_eq!(get(&mut send, "/v1/x", Some("sk_a")).await.0, 200);
    handle.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The `[gateway]` table with TLS lines `tls`, and one plan and key.
fn tls_config(tls: &str) -> String {
    format!(
        r#"[gateway]
listen = "127.0.0.1:0"
upstream = "http://127.0.0.1:9"
watch = false
{tls}

[plans.free]
policies = [{{ name = "burst", algorithm = "token_bucket", q = 5, w = 1 }}]

[keys]
sk_a = "free"
"#
    )
}

#[test]
fn the_check_reads_every_tls_file_and_names_what_is_wrong() {
    let dir = scratch("check");
    let ca = TestCa::new(&dir, "ca");
    let leaf = ca.server(&dir, "gw", &["127.0.0.1"]);
    let other = ca.server(&dir, "other", &["127.0.0.1"]);
    let parse = |tls: &str| GatewayConfig::parse(&tls_config(tls), "c.toml", Some(&dir));
    let ok = parse(
        "[gateway.tls]\ncert_file = \"gw.pem\"\nkey_file = \"gw.key\"\nclient_ca_file = \"ca.pem\"",
    )
    .unwrap();
    assert!(ok.warnings.is_empty(), "{:?}", ok.warnings);
    let t = ok.settings.tls.as_ref().unwrap();
    assert_eq!(t.cert_file, leaf.cert_file);
    assert_eq!(t.handshake, paceline_gateway::DEFAULT_TLS_HANDSHAKE);
    // the TLS files are watched with the configuration
    assert!(ok.sources.contains(&leaf.key_file), "{:?}", ok.sources);

    let err = |tls: &str| parse(tls).unwrap_err();
    let e = err("[gateway.tls]\ncert_file = \"missing.pem\"\nkey_file = \"gw.key\"");
    assert_eq!(e.field(), "gateway.tls.cert_file", "{e}");
    assert!(e.message().contains("cannot read"), "{e}");
    let e = err("[gateway.tls]\ncert_file = \"gw.key\"\nkey_file = \"gw.key\"");
    assert_eq!(e.field(), "gateway.tls.cert_file", "{e}");
    assert!(e.message().contains("no certificate"), "{e}");
    let e = err("[gateway.tls]\ncert_file = \"gw.pem\"\nkey_file = \"gw.pem\"");
    assert_eq!(e.field(), "gateway.tls.key_file", "{e}");
    // a key that belongs to another certificate
    let e = err(&format!(
        "[gateway.tls]\ncert_file = \"gw.pem\"\nkey_file = {:?}",
        other.key_file
    ));
    assert_eq!(e.field(), "gateway.tls.key_file", "{e}");
    assert!(
        e.message().contains("does not belong to the certificate"),
        "{e}"
    );
    assert_eq!(e.line(), 7, "{e}");
    let e = err(
        "[gateway.tls]\ncert_file = \"gw.pem\"\nkey_file = \"gw.key\"\nclient_ca_file = \"gw.key\"",
    );
    assert_eq!(e.field(), "gateway.tls.client_ca_file", "{e}");
    let e = err("[gateway.tls]\ncert_file = \"gw.pem\"\nkey_file = \"gw.key\"\nhandshake_ms = 0");
    assert_eq!(e.field(), "gateway.tls.handshake_ms", "{e}");
    let e = err("[gateway.tls]\ncert_file = \"gw.pem\"\nkey_file = \"gw.key\"\nmax_handshakes = 0");
    assert_eq!(e.field(), "gateway.tls.max_handshakes", "{e}");
    let e = err("[gateway.tls]\ncert_file = \"gw.pem\"");
    assert!(e.message().contains("key_file"), "{e}");
    // handshakes that could take most of the memory bound: a warning
    let c = parse(
        "[gateway.tls]\ncert_file = \"gw.pem\"\nkey_file = \"gw.key\"\nmax_handshakes = 4096",
    )
    .unwrap();
    assert!(
        c.warnings[0].contains("more than half of gateway.limits.max_buffered_bytes"),
        "{:?}",
        c.warnings
    );

    // valid but dated: warnings with the date
    let with_leaf = |l: &Leaf| {
        let tls = format!(
            "[gateway.tls]\ncert_file = {:?}\nkey_file = {:?}",
            l.cert_file, l.key_file
        );
        parse(&tls).unwrap()
    };
    let old = ca.server_dated(&dir, "old", &["127.0.0.1"], (2020, 1, 1), (2021, 3, 4));
    let c = with_leaf(&old);
    assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
    assert!(
        c.warnings[0].contains("expired on Thu, 04 Mar 2021"),
        "{:?}",
        c.warnings
    );
    let early = ca.server_dated(&dir, "early", &["127.0.0.1"], (2090, 5, 6), (2091, 1, 1));
    let c = with_leaf(&early);
    assert!(
        c.warnings[0].contains("not valid before Sat, 06 May 2090"),
        "{:?}",
        c.warnings
    );

    // the upstream side
    let e = GatewayConfig::parse(
        &tls_config("[gateway.upstream_tls]\nca_file = \"ca.pem\""),
        "c.toml",
        Some(&dir),
    )
    .unwrap_err();
    assert_eq!(e.field(), "gateway.upstream_tls", "{e}");
    let https = |tls: &str| {
        GatewayConfig::parse(
            &tls_config(tls).replace("http://127.0.0.1:9", "https://localhost:9"),
            "c.toml",
            Some(&dir),
        )
    };
    let c = https("[gateway.upstream_tls]\nca_file = \"ca.pem\"\ncert_file = \"gw.pem\"\nkey_file = \"gw.key\"").unwrap();
    assert_eq!(
        c.settings.upstream_tls.ca_file.as_ref(),
        Some(&ca.cert_file)
    );
    let e = https("[gateway.upstream_tls]\ncert_file = \"gw.pem\"").unwrap_err();
    assert_eq!(e.field(), "gateway.upstream_tls.key_file", "{e}");
    let e = https("[gateway.upstream_tls]\nca_file = \"nothing.pem\"").unwrap_err();
    assert_eq!(e.field(), "gateway.upstream_tls.ca_file", "{e}");
    let c = https("[gateway.upstream_tls]\ninsecure_skip_verify_for_tests_only = true").unwrap();
    assert!(c.warnings[0].contains("NOT verified"), "{:?}", c.warnings);
    let e = https("upstream_protocol = \"h3\"").unwrap_err();
    assert_eq!(e.field(), "gateway.upstream_protocol", "{e}");
    let c = https("upstream_protocol = \"http2\"").unwrap();
    assert_eq!(
        c.settings.upstream_protocol,
        paceline_gateway::UpstreamProtocol::Http2
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_over_tls_reaches_the_upstream_as_https() {
    let dir = scratch("proto");
    let ca = TestCa::new(&dir, "ca");
    let leaf = ca.server(&dir, "gw", &["127.0.0.1"]);
    let api = common::echo_upstream(&["x-forwarded-proto"]).await;
    let rig = Rig::start(&shiplane(api, &leaf, "", "")).await;
    let c = connector(&ca.cert_file, &[b"http/1.1"], None);
    let (mut send, _) = h1(&c, rig.addr).await;
    let req = http::Request::get("/v1/rates")
        .header("host", "127.0.0.1")
        .header("authorization", "Bearer sk_demo_alice")
        // what a client says of itself is not passed on
        .header("x-forwarded-proto", "http")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    let res = tokio::time::timeout(LIMIT, send.send_request(req))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["seen-x-forwarded-proto"], "https");
    rig.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}
