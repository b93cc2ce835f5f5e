//! A `redis-server` of the demo's own, on a free loopback port, for
//! `paceline demo --store redis` without `--redis-url`: started when the
//! demo starts, stopped (killed) when it ends.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;

/// How long the server gets to answer its first ping.
pub const START_TIMEOUT: Duration = Duration::from_secs(10);

/// A running `redis-server`, stopped on drop.
pub struct LocalRedis {
    child: Child,
    port: u16,
    dir: std::path::PathBuf,
}

/// Whether a `redis-server` can be run.
pub fn available() -> bool {
    Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

impl LocalRedis {
    /// Starts `redis-server` on a free loopback port, without persistence,
    /// and waits until it answers.
    pub fn start() -> anyhow::Result<LocalRedis> {
        anyhow::ensure!(
            available(),
            "--store redis needs a Redis: give --redis-url redis://host:port, or install \
             redis-server (e.g. apt-get install redis-server) and the demo starts its own"
        );
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .context("finding a free port for redis-server")?
            .port();
        let dir =
            std::env::temp_dir().join(format!("paceline-demo-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).context("a directory for redis-server")?;
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&dir)
            .args(["--daemonize", "no", "--loglevel", "warning"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting redis-server")?;
        let mut r = LocalRedis { child, port, dir };
        let until = Instant::now() + START_TIMEOUT;
        while !ping(port) {
            if let Ok(Some(status)) = r.child.try_wait() {
                anyhow::bail!("redis-server on port {port} exited at once ({status})");
            }
            anyhow::ensure!(
                Instant::now() < until,
                "redis-server on port {port} did not answer within {START_TIMEOUT:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(r)
    }

    /// Its URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for LocalRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// How long [`reachable`] waits for a connection.
pub const REACH_TIMEOUT: Duration = Duration::from_secs(2);

/// Checks that something listens at a Redis URL's host and port, so a
/// wrong `--redis-url` is told at once (a gateway whose Redis is down
/// decides without it, and the race would show nothing shared).
pub fn reachable(url: &str) -> anyhow::Result<()> {
    use std::net::ToSocketAddrs;
    let parsed = reqwest::Url::parse(url)
        .ok()
        .filter(|u| matches!(u.scheme(), "redis" | "rediss"))
        .with_context(|| format!("{url:?} is not a Redis URL: expected redis://host:port"))?;
    let host = parsed.host_str().unwrap_or("127.0.0.1");
    let port = parsed.port().unwrap_or(6379);
    let addr = (host, port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .with_context(|| format!("cannot resolve {host}:{port} (from --redis-url)"))?;
    std::net::TcpStream::connect_timeout(&addr, REACH_TIMEOUT)
        .with_context(|| format!("nothing answers at {addr} (from --redis-url {url:?})"))?;
    Ok(())
}

/// Whether a server on `port` answers `PING`.
fn ping(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    if s.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 7];
    s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_answers_and_stops() {
        if !available() {
            eprintln!("redis-server is not installed: skipped here, run by the CLI's test");
            return;
        }
        let r = LocalRedis::start().unwrap();
        let port = r.port;
        assert!(ping(port));
        assert!(r.url().starts_with("redis://127.0.0.1:"));
        reachable(&r.url()).unwrap();
        drop(r);
        assert!(!ping(port), "stopped with the demo");
    }

    #[test]
    fn a_url_nothing_answers_at_is_told() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let e = reachable(&format!("redis://127.0.0.1:{port}")).unwrap_err();
        assert!(format!("{e:#}").contains("nothing answers"), "{e:#}");
        let e = reachable("http://127.0.0.1:6379").unwrap_err();
        assert!(format!("{e:#}").contains("not a Redis URL"), "{e:#}");
    }
}
