//! A real nginx for the tests that need one: started in a scratch
//! directory on ports of this run with a configuration the test writes,
//! stopped (and its directory removed) when dropped.
//!
//! nginx comes from Debian: `scripts/test.sh` installs it. Without it a
//! run in CI fails; elsewhere the test says what is missing and skips.

use std::net::TcpListener as StdListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long nginx may take to listen.
const START: Duration = Duration::from_secs(10);

/// Says why a peer (nginx, Caddy, curl, ...) is missing: a failure in CI,
/// a printed skip elsewhere.
pub(crate) fn missing(what: &str) {
    let ci = std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0");
    if ci {
        panic!("{what} is missing: run scripts/test.sh, which installs it");
    }
    eprintln!("SKIPPED: {what} is missing (scripts/test.sh installs it)");
}

/// The nginx binary, or `None` (and [`missing`] said so).
pub(crate) fn binary() -> Option<&'static str> {
    let found = ["/usr/sbin/nginx", "/usr/bin/nginx"]
        .into_iter()
        .find(|p| Path::new(p).exists());
    if found.is_none() {
        missing("nginx (Debian package nginx)");
    }
    found
}

/// The version of the nginx at `bin` (`nginx -v`), as (major, minor).
pub(crate) fn version(bin: &str) -> (u32, u32) {
    let out = Command::new(bin).arg("-v").output().expect("nginx -v runs");
    let text = String::from_utf8_lossy(&out.stderr).into_owned();
    let v = text
        .split("nginx/")
        .nth(1)
        .unwrap_or_else(|| panic!("no version in {text:?}"));
    let mut parts = v.trim().split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

/// The directives that make a TLS `listen` on `port` speak HTTP/2 as
/// well (by ALPN) in this nginx's syntax: `http2` on the `listen` line
/// before 1.25.1, `http2 on;` since (the old form is deprecated there).
pub(crate) fn listen_tls(bin: &str, port: u16, http2: bool) -> String {
    let modern = version(bin) >= (1, 25);
    match (http2, modern) {
        (false, _) => format!("listen 127.0.0.1:{port} ssl;"),
        (true, false) => format!("listen 127.0.0.1:{port} ssl http2;"),
        (true, true) => format!("listen 127.0.0.1:{port} ssl; http2 on;"),
    }
}

/// A port free on loopback now.
pub(crate) fn free_port() -> u16 {
    StdListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A running nginx.
pub(crate) struct Nginx {
    child: Child,
    /// Its directory: the configuration, `logs/`, `temp/`, `www/`.
    pub(crate) dir: PathBuf,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A scratch directory named for `what` (with `logs/`, `temp/` and
/// `www/` in it), for [`Nginx::start`].
pub(crate) fn scratch(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "paceline-nginx-{what}-{}-{}",
        std::process::id(),
        free_port()
    ));
    for sub in ["logs", "temp", "www"] {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
    }
    dir
}

/// The lines of an `http` block that keep every file nginx writes in
/// `dir`.
pub(crate) fn http_paths(dir: &Path) -> String {
    let d = dir.display();
    format!(
        "access_log {d}/logs/access.log;\n\
         client_body_temp_path {d}/temp/body;\n\
         proxy_temp_path {d}/temp/proxy;\n\
         fastcgi_temp_path {d}/temp/fastcgi;\n\
         uwsgi_temp_path {d}/temp/uwsgi;\n\
         scgi_temp_path {d}/temp/scgi;\n"
    )
}

impl Nginx {
    /// nginx `bin` with `http` (the inside of the `http` block) in `dir`,
    /// once it listens on every one of `ports`.
    pub(crate) fn start(bin: &str, dir: PathBuf, http: &str, ports: &[u16]) -> Nginx {
        let d = dir.display();
        let conf = format!(
            "pid {d}/nginx.pid;\nerror_log {d}/logs/error.log info;\n\
             events {{ worker_connections 256; }}\n\
             http {{\n{}{http}\n}}\n",
            http_paths(&dir)
        );
        let path = dir.join("nginx.conf");
        std::fs::write(&path, conf).unwrap();
        let out = std::fs::File::create(dir.join("out.log")).unwrap();
        let child = Command::new(bin)
            .arg("-p")
            .arg(&dir)
            .arg("-c")
            .arg(&path)
            .args(["-g", "daemon off; master_process off;"])
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("nginx starts");
        let mut nginx = Nginx { child, dir };
        let deadline = Instant::now() + START;
        for port in ports {
            while std::net::TcpStream::connect(("127.0.0.1", *port)).is_err() {
                if let Ok(Some(status)) = nginx.child.try_wait() {
                    panic!("nginx exited ({status}) before listening:\n{}", nginx.log());
                }
                assert!(
                    Instant::now() < deadline,
                    "nginx did not listen:\n{}",
                    nginx.log()
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        nginx
    }

    /// What nginx said on its output and in its error log.
    pub(crate) fn log(&self) -> String {
        let out = std::fs::read_to_string(self.dir.join("out.log")).unwrap_or_default();
        let err = std::fs::read_to_string(self.dir.join("logs/error.log")).unwrap_or_default();
        format!("{out}{err}")
    }
}
