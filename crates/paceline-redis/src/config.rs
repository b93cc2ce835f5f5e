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
    /// The degraded local limiter, when wanted.
    pub degraded: Option<Degraded>,
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
            degraded: None,
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
        if self.lease_ttl < Duration::from_secs(1) || self.lease_ttl > MAX_LEASE_TTL {
            return Err(err("lease_ttl_s", "must be between 1 second and 30 days"));
        }
        if let Some(d) = self.degraded {
            if !(d.share > 0.0 && d.share <= 1.0) {
                return Err(err("degraded_share", "must be in (0, 1]"));
            }
        }
        Ok(())
    }
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
