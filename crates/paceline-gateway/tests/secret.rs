//! The key-hash secret through a running gateway: the hashes in its logs
//! and its soft-limit events are made under the configured secret, the
//! secret (and the key) never appear in what it logs, and a gateway with
//! no secret says at start that its hashes are per process.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use paceline_gateway::{Gateway, GatewayConfig};
use paceline_server::{KeyHasher, SoftLimitHook};
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const LIMIT: Duration = Duration::from_secs(10);
const SECRET: &str = "a-deployment-secret-0123456789";

/// Everything logged, as text.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock()).into_owned()
    }
}

fn config(dir: &std::path::Path, with_secret: bool) -> GatewayConfig {
    let secret = match with_secret {
        true => "key_hash_secret_file = \"secret\"\n",
        false => "",
    };
    let text = format!(
        r#"[gateway]
listen = "127.0.0.1:0"
upstream = "http://127.0.0.1:9"
watch = false
{secret}
[plans.free]
charge_upstream_failures = true
policies = [{{ name = "burst", algorithm = "token_bucket", q = 2, w = 3600 }}]

[keys]
sk_alice_0123 = "free"
"#
    );
    let none = |_: &str| None;
    GatewayConfig::parse_with_env(&text, "secret.toml", Some(dir), &none).unwrap()
}

async fn get(addr: std::net::SocketAddr) -> u16 {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /v1/usage HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer sk_alice_0123\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(LIMIT, s.read_to_end(&mut out))
        .await
        .unwrap()
        .unwrap();
    String::from_utf8_lossy(&out)[9..12].parse().unwrap()
}

async fn rates(addr: std::net::SocketAddr) -> u16 {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /v1/rates HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer sk_alice_0123\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(LIMIT, s.read_to_end(&mut out))
        .await
        .unwrap()
        .unwrap();
    String::from_utf8_lossy(&out)[9..12].parse().unwrap()
}

#[tokio::test]
async fn hashes_use_the_secret_and_the_secret_is_never_logged() {
    let dir = std::env::temp_dir().join(format!("pl-gw-secret-log-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("secret"), format!("{SECRET}\n")).unwrap();
    let logs = Captured::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .finish();
    // this test's runtime runs on this one thread: everything is captured
    let _guard = tracing::subscriber::set_default(subscriber);

    let gw = Gateway::bind(config(&dir, true)).await.unwrap();
    let addr = gw.local_addr();
    let h = gw.handle();
    let events = Arc::new(Mutex::new(Vec::new()));
    let seen = events.clone();
    h.limiter()
        .set_soft_limit_hook(SoftLimitHook::new(move |ev| seen.lock().push(ev.key_hash)));
    let served = tokio::spawn(gw.run(std::future::pending()));
    assert_eq!(get(addr).await, 200);
    // two admitted (the upstream is unreachable: 502) and one rejected
    for _ in 0..3 {
        rates(addr).await;
    }
    h.shutdown();
    let _ = tokio::time::timeout(LIMIT, served).await;

    let want = KeyHasher::from_secret(SECRET.as_bytes(), "x")
        .unwrap()
        .hash("k:sk_alice_0123")
        .to_string();
    let text = logs.text();
    assert!(text.contains("gateway.key_hash_secret_file"), "{text}");
    assert!(
        text.contains(&want),
        "the rejection names the key by its hash: {text}"
    );
    assert!(!text.contains(SECRET), "{text}");
    assert!(!text.contains("sk_alice_0123"), "{text}");
    let events = events.lock().clone();
    assert!(!events.is_empty(), "a soft-limit event");
    assert!(
        events.iter().all(|e| e.to_string() == want),
        "{events:?} {want}"
    );
    // a random secret gives another hash, and is stated at start
    let logs2 = Captured::default();
    let writer = logs2.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard2 = tracing::subscriber::set_default(subscriber);
    let cfg = config(&dir, false);
    assert_ne!(
        cfg.limits.key_hasher().hash("k:sk_alice_0123").to_string(),
        want
    );
    let gw = Gateway::bind(cfg).await.unwrap();
    drop(gw);
    let text = logs2.text();
    assert!(text.contains("random per-process secret"), "{text}");
    assert!(text.contains("will not match across restarts"), "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
}
