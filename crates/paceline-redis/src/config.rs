//! The store's settings, with their defaults and bounds.

use std::fmt;
use std::time::Duration;

/// Whose clock a decision reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ClockSource {
    /// The Redis server's `TIME` (the default): instances with skewed
    /// clocks still share one timeline.
    #[default]
    Server,
    /// The `now` each call passes in. For tests (a virtual clock) and for
    /// comparing against the memory store decision by decision.
    Caller,
}

/// How the server-side step is invoked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Scripting {
    /// Redis 7 Functions, falling back to `EVALSHA` when the server has no
    /// `FUNCTION` command (the default).
    #[default]
    Auto,
    /// Functions only (`FUNCTION LOAD` + `FCALL`).
    Functions,
    /// Scripts only (`EVALSHA`, reloading with `EVAL` on `NOSCRIPT`).
    Eval,
    /// Scripts only, and without the flat path compiled per plan (every
    /// plan interpreted, as on a server without `loadstring`): a test aid
    /// that keeps that path proven, slower than [`Scripting::Eval`].
    #[doc(hidden)]
    EvalInterpreted,
}

/// The degraded local limiter: while Redis cannot be reached, an
/// instance decides alone on a share of every quota.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Degraded {
    /// The share of each quota this instance grants alone, in (0, 1]
    /// (for `n` instances, `1/n` keeps the total near the published limit).
    pub share: f64,
}

/// Settings of a [`crate::RedisStore`].
#[derive(Clone)]
pub struct RedisStoreConfig {
    /// Server URLs (`redis://[user:password@]host:port[/db]`, or `rediss://`
    /// with the `tls` feature). One for a single server; for a cluster,
    /// any of its nodes.
    pub urls: Vec<String>,
    /// Whether the URLs name a Redis Cluster.
    pub cluster: bool,
    /// The longest a decision waits for Redis; past it the call fails as
    /// unavailable (and each policy's fail mode applies).
    pub deadline: Duration,
    /// The longest a connection attempt takes.
    pub connect_timeout: Duration,
    /// The secret of the keyed hash that names rows (client keys never
    /// appear in Redis).
    pub key_secret: Vec<u8>,
    /// What every row's name starts with.
    pub prefix: String,
    /// Whose clock decisions read.
    pub clock: ClockSource,
    /// How the server-side step is invoked.
    pub scripting: Scripting,
    /// Multiplexed connections to each server.
    pub connections: usize,
    /// The most decisions sent in one call.
    pub batch_max: usize,
    /// How long a batch waits for more decisions before it is sent (zero:
    /// send what is queued at once; batches still form while calls are in
    /// flight).
    pub batch_linger: Duration,
    /// The most calls in flight at once.
    pub max_in_flight: usize,
    /// The most decisions queued for sending; past it a decision fails as
    /// unavailable at once.
    pub queue: usize,
    /// The most keys the local deny cache holds (0 turns it off).
    pub deny_cache: usize,
    /// How much longer than it matters a row is kept.
    pub ttl_slack: Duration,
    /// How long a concurrency lease lives at most: one left behind by an
    /// instance that died (or whose release never arrived) is given back
    /// after it, even on a key that stays busy. Longer requests than this
    /// lose their lease early. At most 30 days.
    pub lease_ttl: Duration,
    /// How long a slice of a leased policy's budget lives (and how much
    /// a slice holds: what the instance uses of the key in that time, up
    /// to the policy's `max_slice`). Between 1 ms and 10 s; 100 ms by
    /// default. Also how long, after a call fails, decisions are answered
    /// without Redis (the degraded limiter, or each policy's fail mode)
    /// before one probes it again.
    pub slice: Duration,
    /// The degraded local limiter, when wanted.
    pub degraded: Option<Degraded>,
    /// The most keys whose last answer is kept for a peek without a round
    /// trip (the fields of an answer that did not ask Redis, such as a
    /// shed `503`); 0 turns the view off. At most 10,000,000.
    pub standing_keys: usize,
    /// The deadline of one step of the idempotency store made on this
    /// store's connections ([`crate::RedisStore::idempotency_store`]).
    /// Between 1 ms and 10 s; [`crate::DEFAULT_IDEMPOTENCY_DEADLINE`] by
    /// default.
    pub idempotency_deadline: Duration,
    /// The certificates (PEM) a `rediss://` server's must chain to, in
    /// place of the built-in web roots: a private CA's, say. Needs the
    /// `tls` feature and `rediss://` URLs.
    pub tls_ca: Option<Vec<u8>>,
}

impl fmt::Debug for RedisStoreConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // URLs may hold passwords and the secret is one
        f.debug_struct("RedisStoreConfig")
            .field("servers", &self.urls.len())
            .field("cluster", &self.cluster)
            .field("deadline", &self.deadline)
            .field("clock", &self.clock)
            .field("scripting", &self.scripting)
            .field("batch_max", &self.batch_max)
            .field("tls_ca", &self.tls_ca.is_some())
            .finish_non_exhaustive()
    }
}

/// The default deadline of a store call.
pub const DEFAULT_DEADLINE: Duration = Duration::from_millis(5);
/// The most decisions one call may carry.
pub const MAX_BATCH: usize = 1024;
/// The longest linger allowed.
pub const MAX_LINGER: Duration = Duration::from_millis(10);
/// The longest a lease may live.
pub const MAX_LEASE_TTL: Duration = Duration::from_secs(30 * 86_400);
/// The longest deadline allowed.
pub const MAX_DEADLINE: Duration = Duration::from_secs(10);

impl Default for RedisStoreConfig {
    fn default() -> Self {
        RedisStoreConfig {
            urls: vec!["redis://127.0.0.1:6379".to_string()],
            cluster: false,
            deadline: DEFAULT_DEADLINE,
            connect_timeout: Duration::from_millis(250),
            key_secret: Vec::new(),
            prefix: "pl".to_string(),
            clock: ClockSource::Server,
            scripting: Scripting::Auto,
            connections: 2,
            batch_max: 64,
            batch_linger: Duration::ZERO,
            max_in_flight: 16,
            queue: 4096,
            deny_cache: 10_000,
            ttl_slack: Duration::from_secs(1),
            lease_ttl: Duration::from_secs(600),
            slice: Duration::from_millis(100),
            degraded: None,
            standing_keys: 10_000,
            idempotency_deadline: crate::DEFAULT_IDEMPOTENCY_DEADLINE,
            tls_ca: None,
        }
    }
}

/// Why a store could not be set up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// The setting at fault.
    pub field: &'static str,
    /// What is wrong with it.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

impl std::error::Error for ConfigError {}

fn err(field: &'static str, message: impl Into<String>) -> ConfigError {
    ConfigError {
        field,
        message: message.into(),
    }
}

impl RedisStoreConfig {
    /// Checks every setting against its bounds.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.urls.is_empty() {
            return Err(err("urls", "at least one server URL is needed"));
        }
        for u in &self.urls {
            check_url(u)?;
        }
        if !self.cluster && self.urls.len() > 1 {
            return Err(err(
                "urls",
                "several URLs name a cluster: set cluster = true, or give one URL",
            ));
        }
        if self.deadline.is_zero() || self.deadline > MAX_DEADLINE {
            return Err(err("deadline_ms", "must be between 1 ms and 10 s"));
        }
        if self.connect_timeout.is_zero() || self.connect_timeout > MAX_DEADLINE {
            return Err(err("connect_timeout_ms", "must be between 1 ms and 10 s"));
        }
        if !(1..=64).contains(&self.connections) {
            return Err(err("connections", "must be between 1 and 64"));
        }
        if !(1..=MAX_BATCH).contains(&self.batch_max) {
            return Err(err(
                "batch_max",
                format!("must be between 1 and {MAX_BATCH}"),
            ));
        }
        if self.batch_linger > MAX_LINGER {
            return Err(err("batch_linger_us", "must be at most 10 ms"));
        }
        if !(1..=1024).contains(&self.max_in_flight) {
            return Err(err("max_in_flight", "must be between 1 and 1024"));
        }
        if !(1..=1_000_000).contains(&self.queue) {
            return Err(err("queue", "must be between 1 and 1,000,000"));
        }
        if self.deny_cache > 10_000_000 {
            return Err(err("deny_cache", "must be at most 10,000,000"));
        }
        if self.prefix.is_empty() || self.prefix.contains(['{', '}']) || self.prefix.len() > 64 {
            return Err(err("prefix", "must be 1-64 characters without '{' or '}'"));
        }
        if self.slice < Duration::from_millis(1) || self.slice > Duration::from_secs(10) {
            return Err(err("slice_ms", "must be between 1 and 10,000"));
        }
        if self.lease_ttl < Duration::from_secs(1) || self.lease_ttl > MAX_LEASE_TTL {
            return Err(err("lease_ttl_s", "must be between 1 second and 30 days"));
        }
        if let Some(d) = self.degraded {
            if !(d.share > 0.0 && d.share <= 1.0) {
                return Err(err("degraded_share", "must be in (0, 1]"));
            }
        }
        if self.standing_keys > 10_000_000 {
            return Err(err("standing_keys", "must be at most 10,000,000"));
        }
        if self.idempotency_deadline.is_zero() || self.idempotency_deadline > MAX_DEADLINE {
            return Err(err(
                "idempotency_deadline_ms",
                "must be between 1 ms and 10 s",
            ));
        }
        if let Some(ca) = &self.tls_ca {
            check_ca(ca)?;
            if let Some(u) = self.urls.iter().find(|u| !u.starts_with("rediss://")) {
                return Err(err(
                    "tls_ca",
                    format!(
                        "a CA is for rediss:// servers, but {:?} is not one",
                        redact(u)
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The client of one server URL, trusting [`Self::tls_ca`] when set.
    pub(crate) fn client(&self, url: &str) -> Result<redis::Client, redis::RedisError> {
        #[cfg(feature = "tls")]
        {
            if let Some(ca) = &self.tls_ca {
                return redis::Client::build_with_tls(url, certificates(ca));
            }
        }
        redis::Client::open(url)
    }

    /// The cluster client's builder for [`Self::urls`], trusting
    /// [`Self::tls_ca`] when set.
    pub(crate) fn cluster_builder(&self) -> redis::cluster::ClusterClientBuilder {
        let b = redis::cluster::ClusterClient::builder(self.urls.clone());
        #[cfg(feature = "tls")]
        {
            if let Some(ca) = &self.tls_ca {
                return b.certs(certificates(ca));
            }
        }
        b
    }
}

/// The client's certificates: no client certificate, `ca` as the roots.
#[cfg(feature = "tls")]
fn certificates(ca: &[u8]) -> redis::TlsCertificates {
    redis::TlsCertificates {
        client_tls: None,
        root_cert: Some(ca.to_vec()),
    }
}

/// Checks a CA bundle: TLS built in, and at least one PEM certificate,
/// every one readable.
#[cfg(feature = "tls")]
pub fn check_ca(pem: &[u8]) -> Result<(), ConfigError> {
    use rustls_pki_types::pem::PemObject;
    let mut n = 0;
    for c in rustls_pki_types::CertificateDer::pem_slice_iter(pem) {
        c.map_err(|e| err("tls_ca", format!("a certificate does not read as PEM: {e}")))?;
        n += 1;
    }
    match n {
        0 => Err(err(
            "tls_ca",
            "holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
        )),
        _ => Ok(()),
    }
}

/// Checks a CA bundle: this build has no TLS, so none can be used.
#[cfg(not(feature = "tls"))]
pub fn check_ca(pem: &[u8]) -> Result<(), ConfigError> {
    let _ = pem;
    Err(err(
        "tls_ca",
        "a CA for rediss:// needs a build with the `tls` feature",
    ))
}

/// Checks one server URL: scheme, host, and TLS only when built in.
pub fn check_url(url: &str) -> Result<(), ConfigError> {
    let rest = if let Some(r) = url.strip_prefix("redis://") {
        r
    } else if let Some(r) = url.strip_prefix("rediss://") {
        if !cfg!(feature = "tls") {
            return Err(err(
                "urls",
                "rediss:// needs a build with the `tls` feature",
            ));
        }
        r
    } else {
        return Err(err(
            "urls",
            format!("{:?} must start with redis:// or rediss://", redact(url)),
        ));
    };
    let host = rest.rsplit('@').next().unwrap_or("");
    let host = host.split('/').next().unwrap_or("");
    if host.is_empty() {
        return Err(err("urls", format!("{:?} names no host", redact(url))));
    }
    redis::Client::open(url)
        .map(|_| ())
        .map_err(|e| err("urls", format!("{:?}: {e}", redact(url))))
}

/// A URL with any password replaced, for messages.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let creds = &url[s + 3..at];
            let user = creds.split(':').next().unwrap_or("");
            format!("{}{user}:***{}", &url[..s + 3], &url[at..])
        }
        _ => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_bounds_are_named() {
        RedisStoreConfig::default().validate().unwrap();
        let bad = |f: fn(&mut RedisStoreConfig)| {
            let mut c = RedisStoreConfig::default();
            f(&mut c);
            c.validate().unwrap_err().field
        };
        assert_eq!(bad(|c| c.urls.clear()), "urls");
        assert_eq!(bad(|c| c.urls = vec!["http://x".into()]), "urls");
        assert_eq!(bad(|c| c.urls = vec!["redis://".into()]), "urls");
        assert_eq!(
            bad(|c| c.urls = vec!["redis://a:1".into(), "redis://b:1".into()]),
            "urls"
        );
        assert_eq!(bad(|c| c.deadline = Duration::ZERO), "deadline_ms");
        assert_eq!(bad(|c| c.batch_max = 0), "batch_max");
        assert_eq!(bad(|c| c.batch_max = MAX_BATCH + 1), "batch_max");
        assert_eq!(
            bad(|c| c.batch_linger = Duration::from_secs(1)),
            "batch_linger_us"
        );
        assert_eq!(bad(|c| c.queue = 0), "queue");
        assert_eq!(bad(|c| c.connections = 0), "connections");
        assert_eq!(bad(|c| c.prefix = "a{b".into()), "prefix");
        assert_eq!(bad(|c| c.lease_ttl = MAX_LEASE_TTL * 2), "lease_ttl_s");
        assert_eq!(
            bad(|c| c.degraded = Some(Degraded { share: 0.0 })),
            "degraded_share"
        );
        assert_eq!(bad(|c| c.standing_keys = 10_000_001), "standing_keys");
        assert_eq!(
            bad(|c| c.idempotency_deadline = Duration::ZERO),
            "idempotency_deadline_ms"
        );
        assert_eq!(
            bad(|c| c.idempotency_deadline = MAX_DEADLINE * 2),
            "idempotency_deadline_ms"
        );
        assert_eq!(
            bad(|c| c.tls_ca = Some(b"not a certificate".to_vec())),
            "tls_ca"
        );
    }

    #[test]
    fn the_defaults_of_the_views_and_the_idempotency_deadline() {
        let d = RedisStoreConfig::default();
        assert_eq!(d.standing_keys, 10_000);
        assert_eq!(d.idempotency_deadline, Duration::from_millis(250));
        assert!(d.tls_ca.is_none());
    }

    #[cfg(feature = "tls")]
    #[test]
    fn a_ca_is_read_as_pem_and_only_for_rediss() {
        // a syntactically valid PEM block (the contents are not checked here)
        let pem = b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        check_ca(pem).unwrap();
        assert!(check_ca(b"")
            .unwrap_err()
            .message
            .contains("no PEM certificate"));
        let c = RedisStoreConfig {
            tls_ca: Some(pem.to_vec()),
            ..RedisStoreConfig::default()
        };
        let e = c.validate().unwrap_err();
        assert_eq!(e.field, "tls_ca");
        assert!(e.message.contains("rediss://"), "{e}");
        RedisStoreConfig {
            urls: vec!["rediss://127.0.0.1:6380".into()],
            ..c
        }
        .validate()
        .unwrap();
    }

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact("redis://user:hunter2@host:6379/0"),
            "redis://user:***@host:6379/0"
        );
        assert_eq!(redact("redis://host:6379"), "redis://host:6379");
    }

    #[cfg(not(feature = "tls"))]
    #[test]
    fn tls_needs_the_feature() {
        assert!(check_url("rediss://host:6380")
            .unwrap_err()
            .message
            .contains("tls"));
    }
}
