//! Test support: `redis-server` processes of their own, on free loopback
//! ports, without persistence, stopped (killed) when dropped, optionally
//! with a TLS port beside the plain one; and a three-master Redis Cluster
//! built with `redis-cli --cluster create`.
#![allow(unreachable_pub)]
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Whether `redis-server` can be started here.
pub fn available() -> bool {
    Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn need() {
    assert!(
        available(),
        "redis-server is not installed: these tests start their own Redis. \
         Install the Debian package (apt-get install redis-server), or run \
         scripts/test.sh, which installs it"
    );
}

/// A free loopback port whose cluster bus port (+10000) is free too.
fn free_port() -> u16 {
    for _ in 0..100 {
        let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind a loopback port");
        let port = l.local_addr().expect("local address").port();
        if port < 55_000 && TcpListener::bind((Ipv4Addr::LOCALHOST, port + 10_000)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port pair found");
}

/// One `redis-server`, killed on drop.
pub struct RedisServer {
    port: u16,
    tls_port: Option<u16>,
    dir: PathBuf,
    extra: Vec<String>,
    child: Option<Child>,
}

/// The files of a TLS port: the server's certificate and key, and the
/// CA it trusts (PEM).
pub struct TlsFiles {
    /// The server's certificate chain.
    pub cert: PathBuf,
    /// The server's private key.
    pub key: PathBuf,
    /// The CA certificate.
    pub ca: PathBuf,
}

/// Whether this `redis-server` was built with TLS (`--tls-port` works).
pub fn tls_available() -> bool {
    // the configuration is read in order and the first bad directive
    // named: a build without TLS stops at tls-port, one with it at the
    // made-up directive after it (and neither starts)
    let Ok(out) = Command::new("redis-server")
        .args(["--port", "0", "--tls-port", "0"])
        .args(["--paceline-no-such-directive", "1"])
        .stdin(Stdio::null())
        .output()
    else {
        return false;
    };
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    text.contains("paceline-no-such-directive") && !text.contains("'tls-port")
}

impl RedisServer {
    /// Starts a server on a free port and waits until it answers.
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    /// Starts a server with extra `--flag value` arguments.
    pub fn start_with(extra: &[&str]) -> RedisServer {
        need();
        let port = free_port();
        let dir =
            std::env::temp_dir().join(format!("paceline-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create a scratch directory");
        let mut s = RedisServer {
            port,
            tls_port: None,
            dir,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            child: None,
        };
        s.spawn();
        s
    }

    /// Starts a server with a TLS port as well (clients not asked for a
    /// certificate); the plain port stays for readiness and [`Self::cli`].
    pub fn start_tls(files: &TlsFiles, extra: &[&str]) -> RedisServer {
        need();
        let tls_port = free_port();
        let path = |p: &PathBuf| p.to_str().expect("a UTF-8 path").to_string();
        let mut args: Vec<String> = vec![
            "--tls-port".into(),
            tls_port.to_string(),
            "--tls-cert-file".into(),
            path(&files.cert),
            "--tls-key-file".into(),
            path(&files.key),
            "--tls-ca-cert-file".into(),
            path(&files.ca),
            "--tls-auth-clients".into(),
            "no".into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut s = RedisServer::start_with(&refs);
        s.tls_port = Some(tls_port);
        s
    }

    /// `rediss://127.0.0.1:<tls port>`, for a server started with TLS.
    pub fn tls_url(&self) -> String {
        let port = self.tls_port.expect("a server started with start_tls");
        format!("rediss://127.0.0.1:{port}")
    }

    /// The scratch directory the server runs in (its files, if any).
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    fn spawn(&mut self) {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(["--dir", self.dir.to_str().expect("a UTF-8 temp dir")])
            .args(["--daemonize", "no", "--loglevel", "warning"])
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        self.child = Some(child);
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until {
            if ping(self.port) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!(
            "redis-server on port {} did not answer within 10 s",
            self.port
        );
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the server (SIGKILL) and waits for it to go.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stops the process (SIGSTOP): connections stay open, nothing answers.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Lets a paused process go on (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, sig: &str) {
        if let Some(c) = &self.child {
            let _ = Command::new("kill")
                .arg(sig)
                .arg(c.id().to_string())
                .status();
        }
    }

    /// Starts it again on the same port (empty: nothing was saved).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Sends one inline command and returns the raw reply.
    pub fn cli(&self, command: &str) -> String {
        raw(self.port, command)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.resume();
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn ping(port: u16) -> bool {
    TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_ok()
        && raw(port, "PING").starts_with("+PONG")
}

/// One inline command over a fresh connection; the first reply bytes.
fn raw(port: u16, command: &str) -> String {
    let Ok(mut s) = TcpStream::connect((Ipv4Addr::LOCALHOST, port)) else {
        return String::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(format!("{command}\r\n").as_bytes()).is_err() {
        return String::new();
    }
    let mut buf = vec![0u8; 64 * 1024];
    let n = s.read(&mut buf).unwrap_or(0);
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// Three masters with `--cluster-enabled yes`, slots spread by
/// `redis-cli --cluster create`; all killed on drop.
pub struct RedisCluster {
    /// The masters.
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts the three masters and creates the cluster.
    pub fn start() -> RedisCluster {
        need();
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| {
                RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                ])
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .arg("--cluster-yes")
            .stdin(Stdio::null())
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let until = Instant::now() + Duration::from_secs(20);
        while Instant::now() < until {
            if nodes
                .iter()
                .all(|n| n.cli("CLUSTER INFO").contains("cluster_state:ok"))
            {
                return RedisCluster { nodes };
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("the cluster did not become ready within 20 s");
    }

    /// The nodes' URLs.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.url()).collect()
    }
}
