//! The gateway's configuration file.
//!
//! Why one file with precise errors: a gateway is configured by people who
//! did not write it, often under pressure. Every mistake, from a TOML
//! syntax error to a key on a plan that does not exist, is reported as
//! `file:line:column: field: what is wrong and what is expected`, and
//! `paceline gateway --check FILE` reports it without serving.
//!
//! The file has a `[gateway]` table (listen address, upstream, store,
//! timeouts, shedding, the bounds on what clients may make it hold
//! (`[gateway.limits]`), webhook, metrics, the key-hash secret's file) and,
//! at the top level, the limits
//! model of `paceline-server` (`plans`, `keys`, `routes`, `trusted_proxies`,
//! `dialects`, ...): this module reads the `[gateway]` table and hands the
//! rest of the file to [`LimitsConfig`] as it is, so the limits' fields and
//! defaults are defined there alone. Keys may also come from a separate
//! file (`gateway.keys_file`, a TOML table of `key = "plan"`; an entry may
//! be `sha256:<hex>`, the key hashed), and from a Redis hash
//! (`[gateway.keys_redis]`, looked up before the limiter: see `keys.rs`).
//! The files the limits name (`[jwt]`'s key set or secret) are read
//! relative to the configuration's directory, and watched with it.
//!
//! Every error carries a [`ConfigErrorKind`], so a caller can tell a
//! missing plan from a malformed file without reading the message.
//!
//! ```
//! use paceline_gateway::GatewayConfig;
//!
//! let text = r#"
//! [gateway]
//! listen = "127.0.0.1:8080"
//! upstream = "http://127.0.0.1:9000"
//!
//! [plans.free]
//! policies = [{ name = "burst", algorithm = "token_bucket", q = 20, w = 2 }]
//!
//! [keys]
//! sk_1 = "free"
//! sk_2 = "gold"
//! "#;
//! let err = GatewayConfig::parse(text, "gw.toml", None).unwrap_err();
//! assert_eq!(err.to_string(), r#"gw.toml:11:1: keys.sk_2: no plan named "gold"; plans are ["free"]"#);
//! assert_eq!(err.kind(), paceline_server::ConfigErrorKind::UnknownPlan);
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use http::uri::{Authority, Scheme};
use http::Uri;
use paceline_server::{ConfigErrorKind as Kind, KeyHasher, Limits, LimitsConfig};
use serde::{Deserialize, Deserializer};

use crate::locate::Doc;
use crate::split::{split, Expected};

/// A configuration mistake, located in its file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigFileError {
    kind: Kind,
    file: String,
    line: usize,
    column: usize,
    field: String,
    message: String,
}

impl ConfigFileError {
    /// What kind of mistake it is.
    pub fn kind(&self) -> Kind {
        self.kind
    }
    /// The file at fault (as given).
    pub fn file(&self) -> &str {
        &self.file
    }
    /// The 1-based line (0 when the file could not be read).
    pub fn line(&self) -> usize {
        self.line
    }
    /// The 1-based column (0 when unknown).
    pub fn column(&self) -> usize {
        self.column
    }
    /// The field at fault, as a path (`plans.free.policies[1].w`); empty for
    /// a syntax error outside any value.
    pub fn field(&self) -> &str {
        &self.field
    }
    /// What is wrong and what is expected.
    pub fn message(&self) -> &str {
        &self.message
    }

    fn unreadable(file: &str, e: &std::io::Error) -> Self {
        ConfigFileError {
            kind: Kind::Unreadable,
            file: file.to_string(),
            line: 0,
            column: 0,
            field: String::new(),
            message: format!("cannot read the file: {e}"),
        }
    }
}

impl fmt::Display for ConfigFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if self.line > 0 {
            write!(f, ":{}:{}", self.line, self.column)?;
        }
        if !self.field.is_empty() {
            write!(f, ": {}", self.field)?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for ConfigFileError {}

/// The store holding the counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreKind {
    /// In this process (counters survive reloads, not restarts).
    Memory,
    /// In Redis (`[gateway.redis]`): every instance on it shares one count.
    Redis,
}

/// The `[gateway.redis]` table: where the shared counters live and how
/// calls to it are bounded.
#[derive(Clone, PartialEq)]
pub struct RedisSettings {
    /// Server URLs (`url` or `urls`): `redis://[user:password@]host:port`,
    /// or `rediss://` in a build with TLS.
    pub urls: Vec<String>,
    /// Whether the URLs name a Redis Cluster.
    pub cluster: bool,
    /// The deadline of a store call (`deadline_ms`).
    pub deadline: Duration,
    /// The longest a connection attempt takes (`connect_timeout_ms`).
    pub connect_timeout: Duration,
    /// Multiplexed connections per server.
    pub connections: usize,
    /// The most decisions in one call.
    pub batch_max: usize,
    /// How long a batch waits for more (`batch_linger_us`).
    pub batch_linger: Duration,
    /// The most calls in flight.
    pub max_in_flight: usize,
    /// The most decisions queued.
    pub queue: usize,
    /// The most keys the local deny cache holds.
    pub deny_cache: usize,
    /// What row names start with.
    pub prefix: String,
    /// The degraded limiter's share of each quota, if wanted.
    pub degraded_share: Option<f64>,
    /// How long a slice of a leased policy's budget lives, and how long
    /// after a failed call decisions skip Redis before one probes it
    /// (`slice_ms`).
    pub slice: Duration,
    /// The most keys whose last answer is kept for a shed answer's fields
    /// (`standing_keys`; 0: none).
    pub standing_keys: usize,
    /// The deadline of one idempotency step in Redis
    /// (`idempotency_deadline_ms`): past it a keyed write is answered
    /// `503`.
    pub idempotency_deadline: Duration,
    /// The CA certificates (PEM) a `rediss://` server's certificate must
    /// chain to, read from `tls_ca_file` (relative to the config's
    /// directory); `None`: the built-in web roots.
    pub tls_ca: Option<Vec<u8>>,
    /// The secret of the keyed hash naming rows (set by the deployment,
    /// not read from the file).
    pub key_secret: Vec<u8>,
    /// Decide on the gateway's clock instead of the Redis server's (for
    /// tests on a virtual clock; not read from the file).
    pub caller_clock: bool,
    /// Whether `GET /readyz` says ready while Redis is unreachable and the
    /// degraded limiter decides (`ready_when_degraded`; needs
    /// `degraded_share`). Off by default: an orchestrator then routes
    /// around an instance that cannot reach the shared count.
    pub ready_when_degraded: bool,
}

impl fmt::Debug for RedisSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // URLs may carry passwords
        f.debug_struct("RedisSettings")
            .field("servers", &self.urls.len())
            .field("cluster", &self.cluster)
            .field("deadline", &self.deadline)
            .field("tls_ca", &self.tls_ca.is_some())
            .finish_non_exhaustive()
    }
}

#[cfg(feature = "redis")]
impl RedisSettings {
    /// The store's settings.
    pub fn store_config(&self) -> paceline_redis::RedisStoreConfig {
        paceline_redis::RedisStoreConfig {
            urls: self.urls.clone(),
            cluster: self.cluster,
            deadline: self.deadline,
            connect_timeout: self.connect_timeout,
            key_secret: self.key_secret.clone(),
            prefix: self.prefix.clone(),
            connections: self.connections,
            batch_max: self.batch_max,
            batch_linger: self.batch_linger,
            max_in_flight: self.max_in_flight,
            queue: self.queue,
            deny_cache: self.deny_cache,
            degraded: self
                .degraded_share
                .map(|share| paceline_redis::Degraded { share }),
            standing_keys: self.standing_keys,
            idempotency_deadline: self.idempotency_deadline,
            slice: self.slice,
            tls_ca: self.tls_ca.clone(),
            clock: match self.caller_clock {
                true => paceline_redis::ClockSource::Caller,
                false => paceline_redis::ClockSource::Server,
            },
            ..paceline_redis::RedisStoreConfig::default()
        }
    }
}

/// Timeouts for every phase of a proxied exchange.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// Reading a request head from a client: a client connection with no
    /// request in flight for this long (one that never finishes its head,
    /// or an idle keep-alive) is closed.
    pub client_header: Duration,
    /// Connecting to the upstream.
    pub connect: Duration,
    /// Waiting for the upstream's response head once the request is sent.
    pub upstream_header: Duration,
    /// The longest pause inside a streamed body, either way.
    pub body_idle: Duration,
    /// Keeping an idle pooled upstream connection open.
    pub pool_idle: Duration,
    /// Waiting for in-flight requests on shutdown.
    pub shutdown: Duration,
    /// The longest a whole request body may take to arrive, counted from
    /// its head (`request_body_ms`): past it the request is answered `408`
    /// (or, once an answer has started, cut off) and the connection closed.
    pub request_body: Duration,
    /// The window a request body's rate is measured over
    /// (`body_rate_window_ms`; see [`GatewayLimits::min_body_rate`]).
    pub body_rate_window: Duration,
    /// How long a request body may take before its rate is first measured
    /// (`body_rate_grace_ms`): a client's first bytes are not held to the
    /// minimum rate.
    pub body_rate_grace: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            client_header: Duration::from_secs(10),
            connect: Duration::from_secs(2),
            upstream_header: Duration::from_secs(30),
            body_idle: Duration::from_secs(30),
            pool_idle: Duration::from_secs(60),
            shutdown: Duration::from_secs(30),
            request_body: Duration::from_secs(300),
            body_rate_window: Duration::from_secs(10),
            body_rate_grace: Duration::from_secs(10),
        }
    }
}

/// Bounds on what clients may make the gateway hold (the
/// `[gateway.limits]` table): memory in unfinished heads and request
/// bodies, and how many requests may still be receiving their bodies.
///
/// A request whose body has not all arrived with its head first goes
/// through an intake: it takes a *receiving* place (at most
/// [`max_receiving`](Self::max_receiving) overall and
/// [`max_receiving_per_ip`](Self::max_receiving_per_ip) per client
/// address) and only once [`intake_bytes`](Self::intake_bytes) of its body
/// (or all of it) have arrived is it handed to the shedder, which counts
/// it in flight, and on to the upstream. A sender too slow to fill its
/// intake in time never holds an in-flight place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GatewayLimits {
    /// The most bytes held at once across all connections in unfinished
    /// request heads and request bodies waiting in their intake
    /// (`max_buffered_bytes`). Past it a connection with no request in
    /// flight is closed before more is read, and a new body intake is
    /// answered `503 overloaded`.
    pub max_buffered_bytes: usize,
    /// The most requests receiving their bodies at once (`max_receiving`);
    /// past it a request whose body has still to arrive is answered `503`.
    pub max_receiving: u32,
    /// The most requests from one client address receiving their bodies
    /// at once (`max_receiving_per_ip`).
    pub max_receiving_per_ip: u32,
    /// How much of a body must arrive before its request is handed on
    /// (`intake_bytes`; a shorter body: all of it).
    pub intake_bytes: usize,
    /// The least rate a request body must keep, in bytes per second,
    /// measured over [`Timeouts::body_rate_window`] once
    /// [`Timeouts::body_rate_grace`] has passed (`min_body_rate`); 0 turns
    /// the rule off. A body slower than this is answered `408`.
    pub min_body_rate: u64,
}

impl Default for GatewayLimits {
    fn default() -> Self {
        GatewayLimits {
            max_buffered_bytes: DEFAULT_MAX_BUFFERED_BYTES,
            max_receiving: 1024,
            max_receiving_per_ip: 64,
            intake_bytes: 16 * 1024,
            min_body_rate: 1024,
        }
    }
}

/// The default of `gateway.limits.max_buffered_bytes`: 64 MiB.
pub const DEFAULT_MAX_BUFFERED_BYTES: usize = 64 * 1024 * 1024;

/// When to shed load, and what to keep for critical work.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SheddingSettings {
    /// The most requests in flight to the upstream; 0 turns shedding off.
    pub max_in_flight: u32,
    /// The smoothed upstream latency above which everything below
    /// `CRITICAL` is shed; `None` ignores latency.
    pub max_latency: Option<Duration>,
    /// The share of `max_in_flight` kept for critical routes (0.2 = 20%).
    pub reserve: f64,
    /// `Retry-After` on a shed request, in seconds (at least 1).
    pub retry_after_s: u64,
    /// The most requests a second passed on, the heaviest caller's excess
    /// dropped first; 0 turns it off (see [`crate::shed::RateShed`]).
    pub max_rps: u32,
}

/// How request paths are read before any route is matched (the
/// `[gateway.paths]` table): brought to their normal form and forwarded
/// so, or refused unless they are in it already. See
/// [`paceline_server::path`] for the forms.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PathSettings {
    /// `mode = "strict"`: a path not in normal form is answered `400`
    /// instead of being normalised.
    pub strict: bool,
    /// The normal form's rules (`merge_slashes`, `encoded_slash`).
    pub rules: paceline_server::path::PathRules,
}

/// The largest `gateway.shedding.max_rps`.
pub(crate) const MAX_MAX_RPS: u32 = 10_000_000;

impl Default for SheddingSettings {
    fn default() -> Self {
        SheddingSettings {
            max_in_flight: 0,
            max_latency: None,
            reserve: 0.2,
            retry_after_s: 1,
            max_rps: 0,
        }
    }
}

/// The default bound on a client's request head, in bytes: the bound the
/// gateway keeps on its upstream's answer heads.
pub const DEFAULT_MAX_HEAD_BYTES: usize = 64 * 1024;

/// The smallest request-head bound `gateway.max_head_bytes` takes (the
/// HTTP/1 server reads in buffers of this size).
pub const MIN_MAX_HEAD_BYTES: usize = 8 * 1024;

/// The largest request-head bound `gateway.max_head_bytes` takes.
pub const MAX_MAX_HEAD_BYTES: usize = 1024 * 1024;

/// The gateway's own settings (the `[gateway]` table).
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// Where to listen.
    pub listen: SocketAddr,
    /// The upstream base URI (`http://host:port`).
    pub upstream: Uri,
    /// Where the counters live.
    pub store: StoreKind,
    /// The Redis store's settings, with `store = "redis"`.
    pub redis: Option<RedisSettings>,
    /// Where to serve Prometheus metrics (`GET /metrics`), if anywhere.
    pub metrics_listen: Option<SocketAddr>,
    /// Where to POST soft-limit events, if anywhere.
    pub soft_limit_webhook: Option<Uri>,
    /// Timeouts.
    pub timeouts: Timeouts,
    /// Load shedding.
    pub shedding: SheddingSettings,
    /// Whether to watch the file and reload when it changes.
    pub watch: bool,
    /// The largest request head a client may send, in bytes (request line
    /// and fields; for HTTP/2, the field list): a longer one is answered
    /// `431` and the connection closed. `gateway.max_head_bytes`, by
    /// default [`DEFAULT_MAX_HEAD_BYTES`].
    pub max_head_bytes: usize,
    /// Bounds on buffered bytes and bodies still arriving.
    pub limits: GatewayLimits,
    /// How request paths are normalised.
    pub paths: PathSettings,
    /// TLS toward clients (`[gateway.tls]`); cleartext without it.
    pub tls: Option<TlsSettings>,
    /// TLS toward an `https://` upstream (`[gateway.upstream_tls]`).
    pub upstream_tls: UpstreamTlsSettings,
    /// The HTTP version spoken to the upstream (`gateway.upstream_protocol`).
    pub upstream_protocol: UpstreamProtocol,
    /// Who serves clients' HTTP/1.1 connections (`gateway.http1_server`).
    pub http1_server: Http1Server,
    /// API keys looked up in Redis (`[gateway.keys_redis]`).
    pub keys_redis: Option<KeysRedisSettings>,
    /// The plan of `[plans]` charged once for every request the limiter
    /// passes, under one key for all gateways on the store
    /// (`gateway.global_plan`): "at most 5,000 requests a second reach
    /// the upstream". Past it a request is answered `503 overloaded` and
    /// its key's charge given back. Applied on reload.
    pub global_plan: Option<String>,
}

/// The `[gateway.keys_redis]` table: API keys not listed in the file (nor
/// its keys file) are looked up in a Redis hash, field the key and value
/// its plan's name (`HSET paceline:keys sk_live_1 gold`), on the
/// connections of the gateway's Redis store (`store = "redis"`). Keys are
/// then created and revoked in Redis, without touching the file.
///
/// Each answer, found or not, is cached for [`ttl`](Self::ttl): a key
/// added is admitted, and one removed refused, within that time. A Redis
/// that does not answer within the store's deadline leaves the cached
/// answer in force for [`stale`](Self::stale) more; with nothing cached,
/// the request gets [`unavailable`](Self::unavailable)'s treatment.
///
/// ```toml
/// [gateway.keys_redis]
/// hash = "paceline:keys"   # the Redis hash: key (or its SHA-256) -> plan name
/// field = "key"            # or "sha256": fields are the keys' SHA-256 in hex
/// ttl_s = 30               # an answer is used this long (revocation takes at most this)
/// stale_s = 300            # and this much longer while Redis does not answer
/// cache_size = 100000      # keys cached, found and not found apiece
/// unavailable = "reject"   # 503 when Redis does not answer and nothing is cached;
///                          # or "unknown": read as a key not listed (default_plan, or unknown_key)
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeysRedisSettings {
    /// The Redis hash (`hash`).
    pub hash: String,
    /// Whether the hash's fields are the keys' SHA-256 in lowercase hex
    /// (`field = "sha256"`), so Redis holds no key, rather than the keys
    /// themselves (`field = "key"`, the default).
    pub hashed_fields: bool,
    /// How long an answer from Redis is used before Redis is asked again
    /// (`ttl_s`, 30 s by default).
    pub ttl: Duration,
    /// How long past its `ttl` a cached answer is still used while Redis
    /// does not answer (`stale_s`, 300 s by default).
    pub stale: Duration,
    /// The most keys cached (`cache_size`, 100,000 by default): keys found
    /// and keys not found are cached apart, each up to this many, so a
    /// flood of made-up keys cannot push out the real ones.
    pub cache_size: usize,
    /// What a key gets when Redis does not answer and nothing is cached
    /// for it (`unavailable`).
    pub unavailable: KeysUnavailable,
}

/// What a key gets when Redis does not answer and nothing is cached.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeysUnavailable {
    /// `503` with a problem body and `Retry-After: 1` (`"reject"`, the
    /// default): fail closed.
    #[default]
    Reject,
    /// Read as a key not listed (`"unknown"`): `default_plan` if set,
    /// else `unknown_key`'s treatment.
    Unknown,
}

/// The defaults of `[gateway.keys_redis]`.
pub const DEFAULT_KEYS_REDIS_TTL: Duration = Duration::from_secs(30);
/// The default of `gateway.keys_redis.stale_s`.
pub const DEFAULT_KEYS_REDIS_STALE: Duration = Duration::from_secs(300);
/// The default of `gateway.keys_redis.cache_size`.
pub const DEFAULT_KEYS_REDIS_CACHE: usize = 100_000;

/// TLS toward clients: the `[gateway.tls]` table.
///
/// The files are read when the gateway starts and again at every reload
/// (SIGHUP, or a change to any of them while watching): new connections
/// get the new certificate, the ones already open keep theirs. A file
/// that is broken at a reload refuses the reload, and the certificate in
/// force keeps serving.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsSettings {
    /// The certificate chain, PEM, the leaf first (`cert_file`).
    pub cert_file: PathBuf,
    /// Its private key, PEM (`key_file`).
    pub key_file: PathBuf,
    /// The CAs a client certificate must chain to (`client_ca_file`): with
    /// it, a client without a valid certificate is refused in the
    /// handshake (mutual TLS).
    pub client_ca_file: Option<PathBuf>,
    /// The longest a handshake may take from the connection's accept
    /// (`handshake_ms`, by default 10 s).
    pub handshake: Duration,
    /// The most handshakes in progress at once (`max_handshakes`, by
    /// default 1,024); a new connection past it closes the oldest
    /// unfinished one, so a flood of half-open handshakes cannot keep
    /// anyone out.
    pub max_handshakes: u32,
}

/// TLS toward the upstream: the `[gateway.upstream_tls]` table, read for
/// an `https://` upstream.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UpstreamTlsSettings {
    /// CAs trusted besides the system's roots (`ca_file`, PEM).
    pub ca_file: Option<PathBuf>,
    /// A client certificate chain for upstreams that require mutual TLS
    /// (`cert_file`, PEM; with `key_file`).
    pub cert_file: Option<PathBuf>,
    /// The client certificate's key (`key_file`, PEM).
    pub key_file: Option<PathBuf>,
    /// `insecure_skip_verify_for_tests_only = true`: the upstream's
    /// certificate is not verified at all. For tests against throwaway
    /// certificates, never for a real upstream; the gateway warns at
    /// every start.
    pub insecure_skip_verify_for_tests_only: bool,
}

/// Who serves a client's HTTP/1.1 connection.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Http1Server {
    /// The gateway's own connection (`"paceline"`, the default) for
    /// requests without a body, handing a connection over to hyper at
    /// the first request it does not serve (a body, `Expect`, HTTP/1.0,
    /// a head it refuses).
    #[default]
    Paceline,
    /// hyper's, for every request (`"hyper"`).
    Hyper,
}

/// The HTTP version spoken to the upstream.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum UpstreamProtocol {
    /// HTTP/1.1 on pooled keep-alive connections (`"http1"`, the default).
    #[default]
    Http1,
    /// HTTP/2 (`"http2"`): negotiated by ALPN over TLS, by prior
    /// knowledge in cleartext (h2c); requests multiplexed on one
    /// connection.
    Http2,
    /// HTTP/2 where the upstream offers it by ALPN, HTTP/1.1 otherwise
    /// (`"auto"`); in cleartext, HTTP/1.1.
    Auto,
}

/// The default of `gateway.tls.handshake_ms`.
pub const DEFAULT_TLS_HANDSHAKE: Duration = Duration::from_secs(10);

/// The default of `gateway.tls.max_handshakes`.
pub const DEFAULT_MAX_HANDSHAKES: u32 = 1024;

/// A loaded, validated configuration.
#[derive(Clone, Debug)]
pub struct GatewayConfig {
    /// The gateway's own settings.
    pub settings: Settings,
    /// The validated limits.
    pub limits: Limits,
    /// The configuration file, when it was read from one
    /// ([`GatewayConfig::load`]): what a reload reads again.
    pub file: Option<PathBuf>,
    /// The files it came from (the config, then the keys file and the TLS
    /// files if any): a change to any of them reloads.
    pub sources: Vec<PathBuf>,
    /// What is valid but should be looked at: a certificate expired, not
    /// valid yet or expiring within 30 days, upstream verification turned
    /// off. `paceline gateway --check` prints them; the gateway logs them
    /// when it starts.
    pub warnings: Vec<String>,
}

// ---------------------------------------------------------------------------
// The file model
// ---------------------------------------------------------------------------

/// The whole file: the `[gateway]` table, and the limits at the top level.
struct FileModel {
    gateway: GatewayModel,
    limits: LimitsConfig,
}

/// The top-level fields, `gateway` first (see [`split`]).
static TOP_FIELDS: Expected = Expected::new();

impl<'de> Deserialize<'de> for FileModel {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let (gateway, limits) = split(d, "gateway", &TOP_FIELDS)?;
        Ok(FileModel { gateway, limits })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GatewayModel {
    listen: String,
    upstream: String,
    #[serde(default)]
    store: Option<String>,
    #[serde(default)]
    redis: Option<RedisModel>,
    #[serde(default)]
    metrics_listen: Option<String>,
    #[serde(default)]
    soft_limit_webhook: Option<String>,
    #[serde(default)]
    keys_file: Option<String>,
    #[serde(default)]
    key_hash_secret_file: Option<String>,
    #[serde(default = "yes")]
    watch: bool,
    #[serde(default)]
    max_head_bytes: Option<u64>,
    #[serde(default)]
    timeouts: TimeoutsModel,
    #[serde(default)]
    shedding: SheddingModel,
    #[serde(default)]
    limits: LimitsModel,
    #[serde(default)]
    paths: PathsModel,
    #[serde(default)]
    tls: Option<TlsModel>,
    #[serde(default)]
    upstream_tls: Option<UpstreamTlsModel>,
    #[serde(default)]
    upstream_protocol: Option<String>,
    #[serde(default)]
    http1_server: Option<String>,
    #[serde(default)]
    keys_redis: Option<KeysRedisModel>,
    #[serde(default)]
    global_plan: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeysRedisModel {
    hash: String,
    field: Option<String>,
    ttl_s: Option<u64>,
    stale_s: Option<u64>,
    cache_size: Option<u64>,
    unavailable: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TlsModel {
    cert_file: String,
    key_file: String,
    client_ca_file: Option<String>,
    handshake_ms: Option<u64>,
    max_handshakes: Option<u32>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct UpstreamTlsModel {
    ca_file: Option<String>,
    cert_file: Option<String>,
    key_file: Option<String>,
    #[serde(default)]
    insecure_skip_verify_for_tests_only: bool,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct PathsModel {
    mode: Option<String>,
    merge_slashes: Option<bool>,
    encoded_slash: Option<paceline_server::path::EncodedSlash>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct LimitsModel {
    max_buffered_bytes: Option<u64>,
    max_receiving: Option<u32>,
    max_receiving_per_ip: Option<u32>,
    intake_bytes: Option<u64>,
    min_body_rate: Option<u64>,
}

fn yes() -> bool {
    true
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct TimeoutsModel {
    client_header_ms: Option<u64>,
    connect_ms: Option<u64>,
    upstream_header_ms: Option<u64>,
    body_idle_ms: Option<u64>,
    pool_idle_ms: Option<u64>,
    shutdown_ms: Option<u64>,
    request_body_ms: Option<u64>,
    body_rate_window_ms: Option<u64>,
    body_rate_grace_ms: Option<u64>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
struct RedisModel {
    url: Option<String>,
    urls: Option<Vec<String>>,
    cluster: Option<bool>,
    deadline_ms: Option<u64>,
    connect_timeout_ms: Option<u64>,
    connections: Option<u64>,
    batch_max: Option<u64>,
    batch_linger_us: Option<u64>,
    max_in_flight: Option<u64>,
    queue: Option<u64>,
    deny_cache: Option<u64>,
    prefix: Option<String>,
    degraded_share: Option<f64>,
    slice_ms: Option<u64>,
    standing_keys: Option<u64>,
    idempotency_deadline_ms: Option<u64>,
    tls_ca_file: Option<String>,
    ready_when_degraded: Option<bool>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct SheddingModel {
    max_in_flight: Option<u32>,
    max_latency_ms: Option<u64>,
    reserve: Option<f64>,
    retry_after_s: Option<u64>,
    max_rps: Option<u32>,
}

/// One file's text and name, for locating errors.
struct Source<'a> {
    name: &'a str,
    text: &'a str,
    doc: Doc<'a>,
}

impl<'a> Source<'a> {
    fn new(name: &'a str, text: &'a str) -> Self {
        Source {
            name,
            text,
            doc: Doc::parse(text),
        }
    }

    fn at_offset(
        &self,
        kind: Kind,
        offset: usize,
        field: Option<String>,
        msg: String,
    ) -> ConfigFileError {
        let (line, column) = self.doc.line_col(offset);
        ConfigFileError {
            kind,
            file: self.name.to_string(),
            line,
            column,
            field: field.unwrap_or_else(|| self.doc.path_at(offset)),
            message: msg,
        }
    }

    fn at_field(&self, kind: Kind, field: &str, msg: impl Into<String>) -> ConfigFileError {
        let (line, column) = self
            .doc
            .span_of(field)
            .map_or((1, 1), |s| self.doc.line_col(s.start));
        ConfigFileError {
            kind,
            file: self.name.to_string(),
            line,
            column,
            field: field.to_string(),
            message: msg.into(),
        }
    }

    fn toml_error(&self, e: &toml::de::Error) -> ConfigFileError {
        let mut msg = e.message().trim().to_string();
        if let (true, Some(span)) = (msg.is_empty(), e.span()) {
            msg = crate::locate::unexpected_at(self.text, span.start);
        }
        match e.span() {
            // a syntax error (the text did not parse) has no field
            Some(span) if !self.doc.is_parsed() => {
                let field = self.field_of_unreadable_value(&span);
                self.at_offset(Kind::Syntax, span.start, Some(field), msg)
            }
            // the deserializer fails on a key only when the field is unknown
            Some(span) if self.doc.is_key(&span) => {
                self.at_offset(Kind::UnknownField, span.start, None, msg)
            }
            Some(span) => self.at_offset(Kind::Mismatch, span.start, None, msg),
            None => ConfigFileError {
                kind: match self.doc.is_parsed() {
                    true => Kind::Mismatch,
                    false => Kind::Syntax,
                },
                file: self.name.to_string(),
                line: 1,
                column: 1,
                field: String::new(),
                message: msg,
            },
        }
    }

    /// The field whose value at `span` does not parse (a number too large
    /// for any field, say): the text with a 0 in place of the value's
    /// token locates it, when that parses; empty when it does not (a
    /// broken table header).
    fn field_of_unreadable_value(&self, span: &std::ops::Range<usize>) -> String {
        let start = span.start;
        // the parser points at the value's first character: take its token
        let token = self.text.get(start..).map_or(0, |rest| {
            rest.find(|c: char| !(c.is_ascii_alphanumeric() || "_+-.:".contains(c)))
                .unwrap_or(rest.len())
        });
        let end = span.end.max(start + token).min(self.text.len());
        let (Some(before), Some(after)) = (self.text.get(..start), self.text.get(end..)) else {
            return String::new();
        };
        if start >= end {
            return String::new();
        }
        let patched = format!("{before}0{after}");
        let doc = Doc::parse(&patched);
        match doc.is_parsed() {
            true => doc.path_at(start),
            false => String::new(),
        }
    }

    fn parse<T: for<'de> Deserialize<'de>>(&self) -> Result<T, ConfigFileError> {
        toml::from_str(self.text).map_err(|e| self.toml_error(&e))
    }
}

impl GatewayConfig {
    /// Reads and validates the file at `path` (and its keys file, relative
    /// to the config's directory).
    pub fn load(path: &Path) -> Result<GatewayConfig, ConfigFileError> {
        let name = path.display().to_string();
        let text =
            std::fs::read_to_string(path).map_err(|e| ConfigFileError::unreadable(&name, &e))?;
        let mut cfg = GatewayConfig::parse(&text, &name, path.parent())?;
        cfg.sources.insert(0, path.to_path_buf());
        cfg.file = Some(path.to_path_buf());
        Ok(cfg)
    }

    /// Validates a configuration text named `name`; a keys file and a
    /// key-hash secret file are looked up relative to `dir` (or the
    /// working directory), and the environment is read for
    /// [`KEY_HASH_SECRET_ENV`].
    pub fn parse(
        text: &str,
        name: &str,
        dir: Option<&Path>,
    ) -> Result<GatewayConfig, ConfigFileError> {
        GatewayConfig::parse_with_env(text, name, dir, &|var| std::env::var(var).ok())
    }

    /// [`GatewayConfig::parse`] with the environment read through `env`.
    ///
    /// The secret keys are hashed under, for logs, soft-limit events and
    /// store key names: the file `gateway.key_hash_secret_file` names if
    /// set, else [`KEY_HASH_SECRET_ENV`] if set, else a random secret made
    /// once per process (stated when the gateway starts). A secret shorter
    /// than [`paceline_server::MIN_KEY_HASH_SECRET_BYTES`] is refused.
    pub fn parse_with_env(
        text: &str,
        name: &str,
        dir: Option<&Path>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<GatewayConfig, ConfigFileError> {
        let src = Source::new(name, text);
        let FileModel {
            gateway,
            limits: mut model,
        } = src.parse()?;
        let settings = settings(&src, &gateway, dir)?;
        let warnings = tls_checks(&src, &settings)?;
        let mut sources = Vec::new();
        let keys_text;
        let keys_name;
        let mut keys_src = None;
        if let Some(file) = &gateway.keys_file {
            let path = dir.unwrap_or(Path::new("")).join(file);
            keys_name = path.display().to_string();
            keys_text = std::fs::read_to_string(&path).map_err(|e| {
                src.at_field(
                    Kind::Unreadable,
                    "gateway.keys_file",
                    format!("cannot read {keys_name}: {e}; expected a TOML file of key = \"plan\" lines"),
                )
            })?;
            let ks = Source::new(&keys_name, &keys_text);
            let extra: BTreeMap<String, String> = ks.parse()?;
            for (k, p) in extra {
                if model.keys.contains_key(&k) {
                    return Err(ks.at_field(
                        Kind::Duplicate,
                        &k,
                        "this key is also listed under [keys]",
                    ));
                }
                model.keys.insert(k, p);
            }
            sources.push(path);
            keys_src = Some(ks);
        }
        let hasher = key_hasher(&src, gateway.key_hash_secret_file.as_deref(), dir, env)?;
        if settings.store == StoreKind::Redis
            && matches!(hasher.origin(), paceline_server::SecretOrigin::Random)
        {
            // a random secret per process would give every instance its own
            // key names, and each would count alone
            return Err(src.at_field(
                Kind::Missing,
                "gateway.key_hash_secret_file",
                format!(
                    "store = \"redis\" names keys by their hash under the key-hash secret, so every instance needs the same one: give gateway.key_hash_secret_file (a file holding at least 16 bytes) or set {KEY_HASH_SECRET_ENV}"
                ),
            ));
        }
        // the key files of [jwt] are read with the configuration, and
        // watched with it
        let limit_files = model.files(dir);
        let limits = model.build_with_files(hasher, dir).map_err(|e| {
            let field = e.field();
            // a key that came from the keys file is reported there
            if let (Some(ks), Some(k)) = (&keys_src, field.strip_prefix("keys.")) {
                if !src.doc.has(field) && ks.doc.has(k) {
                    let mut err = ks.at_field(e.kind(), k, e.message());
                    err.field = field.to_string();
                    return err;
                }
            }
            src.at_field(e.kind(), field, e.message())
        })?;
        #[cfg(feature = "redis")]
        if settings.store == StoreKind::Redis {
            for plan in limits.plans() {
                paceline_redis::supports(plan).map_err(|m| {
                    src.at_field(
                        Kind::InvalidValue,
                        &format!("plans.{}", plan.name()),
                        format!("{m} (store = \"redis\")"),
                    )
                })?;
            }
        }
        if settings.keys_redis.is_some()
            && !matches!(
                limits.key_source(),
                paceline_server::KeySource::ApiKey | paceline_server::KeySource::Header(_)
            )
        {
            return Err(src.at_field(
                Kind::InvalidValue,
                "gateway.keys_redis",
                "Redis looks up API keys: it needs key = \"api_key\" (the default) or key = \"header:<name>\"",
            ));
        }
        if let Some(name) = &settings.global_plan {
            if limits.plan(name).is_none() {
                let known: Vec<&str> = limits.plans().map(|p| p.name()).collect();
                return Err(src.at_field(
                    Kind::UnknownPlan,
                    "gateway.global_plan",
                    format!(
                        "{name:?} is not a plan of [plans] (there are: {})",
                        known.join(", ")
                    ),
                ));
            }
        }
        sources.extend(limit_files);
        sources.extend(settings.tls.iter().flat_map(|t| {
            [
                Some(&t.cert_file),
                Some(&t.key_file),
                t.client_ca_file.as_ref(),
            ]
            .into_iter()
            .flatten()
            .cloned()
        }));
        Ok(GatewayConfig {
            settings,
            limits,
            file: None,
            sources,
            warnings,
        })
    }
}

/// The environment variable a key-hash secret may come from.
pub const KEY_HASH_SECRET_ENV: &str = "PACELINE_KEY_HASH_SECRET";

fn key_hasher(
    src: &Source<'_>,
    file: Option<&str>,
    dir: Option<&Path>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<KeyHasher, ConfigFileError> {
    const FIELD: &str = "gateway.key_hash_secret_file";
    if let Some(file) = file {
        let path = dir.unwrap_or(Path::new("")).join(file);
        let shown = path.display().to_string();
        let bytes = std::fs::read(&path).map_err(|e| {
            src.at_field(
                Kind::Unreadable,
                FIELD,
                format!("cannot read {shown}: {e}; expected a file holding the secret"),
            )
        })?;
        // a line ending is not part of the secret
        let end = bytes
            .iter()
            .rposition(|b| !matches!(b, b'\n' | b'\r'))
            .map_or(0, |i| i + 1);
        return KeyHasher::from_secret(&bytes[..end], &format!("{FIELD} ({shown})"))
            .map_err(|e| src.at_field(Kind::OutOfRange, FIELD, format!("{shown}: {e}")));
    }
    if let Some(v) = env(KEY_HASH_SECRET_ENV) {
        return KeyHasher::from_secret(
            v.as_bytes(),
            &format!("the environment ({KEY_HASH_SECRET_ENV})"),
        )
        .map_err(|e| ConfigFileError {
            kind: Kind::OutOfRange,
            file: src.name.to_string(),
            line: 0,
            column: 0,
            field: KEY_HASH_SECRET_ENV.to_string(),
            message: e.to_string(),
        });
    }
    Ok(KeyHasher::per_process().clone())
}

fn settings(
    src: &Source<'_>,
    g: &GatewayModel,
    dir: Option<&Path>,
) -> Result<Settings, ConfigFileError> {
    let addr = |field: &str, s: &str| {
        s.parse::<SocketAddr>().map_err(|_| {
            src.at_field(
                Kind::InvalidValue,
                field,
                format!(
                    "{s:?} is not a socket address; expected IP:PORT such as \"127.0.0.1:8080\""
                ),
            )
        })
    };
    let listen = addr("gateway.listen", &g.listen)?;
    let upstream = upstream_uri(&g.upstream).map_err(|m| {
        src.at_field(
            Kind::InvalidValue,
            "gateway.upstream",
            format!("{:?}: {m}", g.upstream),
        )
    })?;
    let store = match g.store.as_deref() {
        None | Some("memory") => StoreKind::Memory,
        Some("redis") => StoreKind::Redis,
        Some(other) => {
            return Err(src.at_field(
                Kind::InvalidValue,
                "gateway.store",
                format!("{other:?}: the gateway supports store = \"memory\" or \"redis\""),
            ))
        }
    };
    let redis =
        match (store, &g.redis) {
            (StoreKind::Redis, Some(r)) => Some(redis_settings(src, r, dir)?),
            (StoreKind::Redis, None) => return Err(src.at_field(
                Kind::InvalidValue,
                "gateway.store",
                "store = \"redis\" needs a [gateway.redis] table with url = \"redis://host:port\"",
            )),
            (_, Some(_)) => {
                return Err(src.at_field(
                    Kind::InvalidValue,
                    "gateway.redis",
                    "[gateway.redis] is read only with store = \"redis\"",
                ))
            }
            (_, None) => None,
        };
    let metrics_listen = g
        .metrics_listen
        .as_deref()
        .map(|s| addr("gateway.metrics_listen", s))
        .transpose()?;
    let soft_limit_webhook = g
        .soft_limit_webhook
        .as_deref()
        .map(|s| {
            http_uri(s).map_err(|m| {
                src.at_field(
                    Kind::InvalidValue,
                    "gateway.soft_limit_webhook",
                    format!("{s:?}: {m}"),
                )
            })
        })
        .transpose()?;
    Ok(Settings {
        listen,
        upstream,
        store,
        redis,
        metrics_listen,
        soft_limit_webhook,
        timeouts: timeouts(src, &g.timeouts)?,
        shedding: shedding(src, &g.shedding)?,
        watch: g.watch,
        max_head_bytes: max_head_bytes(src, g.max_head_bytes)?,
        limits: limits(src, &g.limits)?,
        paths: paths(src, &g.paths)?,
        tls: g.tls.as_ref().map(|t| tls(src, t, dir)).transpose()?,
        upstream_tls: upstream_tls(src, g.upstream_tls.as_ref(), dir)?,
        keys_redis: g
            .keys_redis
            .as_ref()
            .map(|k| keys_redis(src, k, store))
            .transpose()?,
        global_plan: g.global_plan.clone(),
        http1_server: match g.http1_server.as_deref() {
            None | Some("paceline") => Http1Server::Paceline,
            Some("hyper") => Http1Server::Hyper,
            Some(other) => {
                return Err(src.at_field(
                    Kind::InvalidValue,
                    "gateway.http1_server",
                    format!("{other:?}: expected \"paceline\" or \"hyper\""),
                ))
            }
        },
        upstream_protocol: match g.upstream_protocol.as_deref() {
            None | Some("http1") => UpstreamProtocol::Http1,
            Some("http2") => UpstreamProtocol::Http2,
            Some("auto") => UpstreamProtocol::Auto,
            Some(other) => {
                return Err(src.at_field(
                    Kind::InvalidValue,
                    "gateway.upstream_protocol",
                    format!("{other:?}: expected \"http1\", \"http2\" or \"auto\""),
                ))
            }
        },
    })
}

/// The `[gateway.keys_redis]` table, each error at its field.
fn keys_redis(
    src: &Source<'_>,
    k: &KeysRedisModel,
    store: StoreKind,
) -> Result<KeysRedisSettings, ConfigFileError> {
    let field = |f: &str| format!("gateway.keys_redis.{f}");
    if store != StoreKind::Redis {
        return Err(src.at_field(
            Kind::InvalidValue,
            "gateway.keys_redis",
            "[gateway.keys_redis] looks keys up on the Redis store's connections: it needs store = \"redis\" and [gateway.redis]",
        ));
    }
    if k.hash.is_empty() {
        return Err(src.at_field(
            Kind::InvalidValue,
            &field("hash"),
            "name the Redis hash holding key = plan (HSET paceline:keys sk_live_1 gold)",
        ));
    }
    let hashed_fields = match k.field.as_deref() {
        None | Some("key") => false,
        Some("sha256") => true,
        Some(other) => {
            return Err(src.at_field(
                Kind::InvalidValue,
                &field("field"),
                format!("{other:?}: expected \"key\" (the hash's fields are the keys) or \"sha256\" (their SHA-256 in hex)"),
            ))
        }
    };
    let ttl = match k.ttl_s {
        None => DEFAULT_KEYS_REDIS_TTL,
        Some(s @ 1..=86_400) => Duration::from_secs(s),
        Some(s) => {
            return Err(src.at_field(
                Kind::OutOfRange,
                &field("ttl_s"),
                format!(
                "{s} is outside 1..=86400 seconds; revocation takes effect within it (default 30)"
            ),
            ))
        }
    };
    let stale = match k.stale_s {
        None => DEFAULT_KEYS_REDIS_STALE,
        Some(s @ 0..=604_800) => Duration::from_secs(s),
        Some(s) => {
            return Err(src.at_field(
                Kind::OutOfRange,
                &field("stale_s"),
                format!("{s} is over a week (604800 s); default 300"),
            ))
        }
    };
    let cache_size = match k.cache_size {
        None => DEFAULT_KEYS_REDIS_CACHE,
        Some(n @ 1..=10_000_000) => n as usize,
        Some(n) => {
            return Err(src.at_field(
                Kind::OutOfRange,
                &field("cache_size"),
                format!("{n} is outside 1..=10000000 keys (default {DEFAULT_KEYS_REDIS_CACHE})"),
            ))
        }
    };
    let unavailable = match k.unavailable.as_deref() {
        None | Some("reject") => KeysUnavailable::Reject,
        Some("unknown") => KeysUnavailable::Unknown,
        Some(other) => {
            return Err(src.at_field(
                Kind::InvalidValue,
                &field("unavailable"),
                format!("{other:?}: expected \"reject\" (503 while Redis does not answer) or \"unknown\" (read as a key not listed)"),
            ))
        }
    };
    Ok(KeysRedisSettings {
        hash: k.hash.clone(),
        hashed_fields,
        ttl,
        stale,
        cache_size,
        unavailable,
    })
}

/// A file named in the configuration, relative to its directory.
fn file_in(dir: Option<&Path>, name: &str) -> PathBuf {
    dir.unwrap_or(Path::new("")).join(name)
}

fn tls(src: &Source<'_>, t: &TlsModel, dir: Option<&Path>) -> Result<TlsSettings, ConfigFileError> {
    let handshake = match t.handshake_ms {
        None => DEFAULT_TLS_HANDSHAKE,
        Some(0) => {
            return Err(src.at_field(
                Kind::OutOfRange,
                "gateway.tls.handshake_ms",
                "a handshake deadline of 0 ms would close every connection; expected a number of milliseconds above 0",
            ))
        }
        Some(ms) => Duration::from_millis(ms),
    };
    let max_handshakes = match t.max_handshakes {
        None => DEFAULT_MAX_HANDSHAKES,
        Some(0) => {
            return Err(src.at_field(
                Kind::OutOfRange,
                "gateway.tls.max_handshakes",
                "0 handshakes at once would refuse every connection; expected a number above 0",
            ))
        }
        Some(n) => n,
    };
    Ok(TlsSettings {
        cert_file: file_in(dir, &t.cert_file),
        key_file: file_in(dir, &t.key_file),
        client_ca_file: t.client_ca_file.as_deref().map(|f| file_in(dir, f)),
        handshake,
        max_handshakes,
    })
}

fn upstream_tls(
    src: &Source<'_>,
    t: Option<&UpstreamTlsModel>,
    dir: Option<&Path>,
) -> Result<UpstreamTlsSettings, ConfigFileError> {
    let Some(t) = t else {
        return Ok(UpstreamTlsSettings::default());
    };
    if t.cert_file.is_some() != t.key_file.is_some() {
        let field = match t.cert_file {
            Some(_) => "gateway.upstream_tls.key_file",
            None => "gateway.upstream_tls.cert_file",
        };
        return Err(src.at_field(
            Kind::Missing,
            field,
            "a client certificate needs both cert_file and key_file",
        ));
    }
    Ok(UpstreamTlsSettings {
        ca_file: t.ca_file.as_deref().map(|f| file_in(dir, f)),
        cert_file: t.cert_file.as_deref().map(|f| file_in(dir, f)),
        key_file: t.key_file.as_deref().map(|f| file_in(dir, f)),
        insecure_skip_verify_for_tests_only: t.insecure_skip_verify_for_tests_only,
    })
}

/// Reads every TLS file the settings name, as the gateway will: an
/// unreadable or mismatched file is an error at its field; what is
/// valid but dated comes back as warnings.
fn tls_checks(src: &Source<'_>, s: &Settings) -> Result<Vec<String>, ConfigFileError> {
    let now = std::time::SystemTime::now();
    let mut warnings = Vec::new();
    let err = |field: &str, m: String| src.at_field(Kind::Unreadable, field, m);
    if let Some(t) = &s.tls {
        let certs =
            crate::tls::read_certs(&t.cert_file).map_err(|m| err("gateway.tls.cert_file", m))?;
        crate::tls::certified_key(&t.cert_file, &t.key_file)
            .map_err(|m| err("gateway.tls.key_file", m))?;
        warnings.extend(crate::tls::validity_warnings(&t.cert_file, &certs, now));
        let held = t.max_handshakes as usize * crate::tls::server::HANDSHAKE_BYTES;
        if held > s.limits.max_buffered_bytes / 2 {
            warnings.push(format!(
                "gateway.tls.max_handshakes = {}: unfinished handshakes may hold {} KiB, more than half of gateway.limits.max_buffered_bytes ({} KiB), leaving little for request heads and bodies",
                t.max_handshakes,
                held / 1024,
                s.limits.max_buffered_bytes / 1024
            ));
        }
        if let Some(ca) = &t.client_ca_file {
            let certs =
                crate::tls::read_certs(ca).map_err(|m| err("gateway.tls.client_ca_file", m))?;
            crate::tls::server::client_verifier(ca)
                .map_err(|m| err("gateway.tls.client_ca_file", m))?;
            warnings.extend(crate::tls::validity_warnings(ca, &certs, now));
        }
    }
    let u = &s.upstream_tls;
    let https = s.upstream.scheme() == Some(&Scheme::HTTPS);
    if !https && *u != UpstreamTlsSettings::default() {
        return Err(src.at_field(
            Kind::InvalidValue,
            "gateway.upstream_tls",
            format!(
                "[gateway.upstream_tls] is read only for an https:// upstream; the upstream is {}",
                s.upstream
            ),
        ));
    }
    if let Some(ca) = &u.ca_file {
        let certs =
            crate::tls::read_certs(ca).map_err(|m| err("gateway.upstream_tls.ca_file", m))?;
        crate::tls::read_roots(ca).map_err(|m| err("gateway.upstream_tls.ca_file", m))?;
        warnings.extend(crate::tls::validity_warnings(ca, &certs, now));
    }
    if let (Some(c), Some(k)) = (&u.cert_file, &u.key_file) {
        let certs =
            crate::tls::read_certs(c).map_err(|m| err("gateway.upstream_tls.cert_file", m))?;
        crate::tls::certified_key(c, k).map_err(|m| err("gateway.upstream_tls.key_file", m))?;
        warnings.extend(crate::tls::validity_warnings(c, &certs, now));
    }
    if u.insecure_skip_verify_for_tests_only {
        warnings.push(format!(
            "gateway.upstream_tls.insecure_skip_verify_for_tests_only = true: the certificate of {} is NOT verified; anyone on the path can read and change the traffic",
            s.upstream
        ));
    }
    Ok(warnings)
}

fn paths(src: &Source<'_>, p: &PathsModel) -> Result<PathSettings, ConfigFileError> {
    let d = paceline_server::path::PathRules::default();
    let strict = match p.mode.as_deref() {
        None | Some("normalize") => false,
        Some("strict") => true,
        Some(other) => {
            return Err(src.at_field(
                Kind::InvalidValue,
                "gateway.paths.mode",
                format!("{other:?}: expected \"normalize\" (the default: paths are brought to their normal form and forwarded so) or \"strict\" (a path not in normal form gets 400)"),
            ))
        }
    };
    Ok(PathSettings {
        strict,
        rules: paceline_server::path::PathRules {
            merge_slashes: p.merge_slashes.unwrap_or(d.merge_slashes),
            encoded_slash: p.encoded_slash.unwrap_or(d.encoded_slash),
        },
    })
}

/// The smallest `gateway.limits.max_buffered_bytes`: one largest head.
pub const MIN_MAX_BUFFERED_BYTES: usize = MAX_MAX_HEAD_BYTES;

fn limits(src: &Source<'_>, l: &LimitsModel) -> Result<GatewayLimits, ConfigFileError> {
    let d = GatewayLimits::default();
    let field = |f: &str| format!("gateway.limits.{f}");
    let max_buffered_bytes = match l.max_buffered_bytes {
        None => d.max_buffered_bytes,
        Some(n) if n >= MIN_MAX_BUFFERED_BYTES as u64 && n <= usize::MAX as u64 => n as usize,
        Some(n) => {
            return Err(src.at_field(
                Kind::OutOfRange,
                &field("max_buffered_bytes"),
                format!(
                    "{n} bytes is below {MIN_MAX_BUFFERED_BYTES} (one largest request head); the default is {DEFAULT_MAX_BUFFERED_BYTES} (64 MiB)"
                ),
            ))
        }
    };
    let count = |f: &str, v: Option<u32>, default: u32| match v {
        None => Ok(default),
        Some(0) => Err(src.at_field(
            Kind::OutOfRange,
            &field(f),
            format!(
                "0 would refuse every request with a body; expected at least 1 (default {default})"
            ),
        )),
        Some(n) => Ok(n),
    };
    let max_receiving = count("max_receiving", l.max_receiving, d.max_receiving)?;
    let max_receiving_per_ip = count(
        "max_receiving_per_ip",
        l.max_receiving_per_ip,
        d.max_receiving_per_ip,
    )?;
    let intake_bytes = match l.intake_bytes {
        None => d.intake_bytes,
        Some(n) if (1..=max_buffered_bytes as u64).contains(&n) => n as usize,
        Some(n) => {
            return Err(src.at_field(
                Kind::OutOfRange,
                &field("intake_bytes"),
                format!(
                "{n} is outside 1..={max_buffered_bytes} (max_buffered_bytes); the default is {}",
                d.intake_bytes
            ),
            ))
        }
    };
    Ok(GatewayLimits {
        max_buffered_bytes,
        max_receiving,
        max_receiving_per_ip,
        intake_bytes,
        min_body_rate: l.min_body_rate.unwrap_or(d.min_body_rate),
    })
}

#[cfg(not(feature = "redis"))]
fn redis_settings(
    src: &Source<'_>,
    _: &RedisModel,
    _: Option<&Path>,
) -> Result<RedisSettings, ConfigFileError> {
    Err(src.at_field(
        Kind::InvalidValue,
        "gateway.store",
        "this build has no Redis support: build paceline with the `redis` feature",
    ))
}

/// The `[gateway.redis]` table, checked by the store's own bounds (each
/// error names its field).
#[cfg(feature = "redis")]
fn redis_settings(
    src: &Source<'_>,
    r: &RedisModel,
    dir: Option<&Path>,
) -> Result<RedisSettings, ConfigFileError> {
    let d = paceline_redis::RedisStoreConfig::default();
    const CA_FIELD: &str = "gateway.redis.tls_ca_file";
    let tls_ca = match &r.tls_ca_file {
        None => None,
        Some(file) => {
            let path = dir.unwrap_or(Path::new("")).join(file);
            let shown = path.display().to_string();
            let pem = std::fs::read(&path).map_err(|e| {
                src.at_field(
                    Kind::Unreadable,
                    CA_FIELD,
                    format!("cannot read {shown}: {e}; expected a PEM file of CA certificates"),
                )
            })?;
            paceline_redis::check_ca(&pem).map_err(|e| {
                src.at_field(
                    Kind::InvalidValue,
                    CA_FIELD,
                    format!("{shown}: {}", e.message),
                )
            })?;
            Some(pem)
        }
    };
    let url_field = match (&r.url, &r.urls) {
        (Some(_), Some(_)) => {
            return Err(src.at_field(
                Kind::InvalidValue,
                "gateway.redis.urls",
                "give url or urls, not both",
            ))
        }
        (_, Some(_)) => "gateway.redis.urls",
        _ => "gateway.redis.url",
    };
    let urls = match (&r.url, &r.urls) {
        (Some(u), _) => vec![u.clone()],
        (_, Some(us)) => us.clone(),
        (None, None) => {
            return Err(src.at_field(
                Kind::InvalidValue,
                "gateway.redis",
                "needs url = \"redis://host:port\" (or urls = [...] for a cluster)",
            ))
        }
    };
    let n =
        |v: Option<u64>, default: usize| v.map_or(default, |v| v.min(usize::MAX as u64) as usize);
    let settings = RedisSettings {
        urls,
        cluster: r.cluster.unwrap_or(false),
        deadline: r.deadline_ms.map_or(d.deadline, Duration::from_millis),
        connect_timeout: r
            .connect_timeout_ms
            .map_or(d.connect_timeout, Duration::from_millis),
        connections: n(r.connections, d.connections),
        batch_max: n(r.batch_max, d.batch_max),
        batch_linger: r
            .batch_linger_us
            .map_or(d.batch_linger, Duration::from_micros),
        max_in_flight: n(r.max_in_flight, d.max_in_flight),
        queue: n(r.queue, d.queue),
        deny_cache: n(r.deny_cache, d.deny_cache),
        prefix: r.prefix.clone().unwrap_or(d.prefix.clone()),
        degraded_share: r.degraded_share,
        slice: r.slice_ms.map_or(d.slice, Duration::from_millis),
        standing_keys: n(r.standing_keys, d.standing_keys),
        idempotency_deadline: r
            .idempotency_deadline_ms
            .map_or(d.idempotency_deadline, Duration::from_millis),
        tls_ca,
        key_secret: Vec::new(),
        caller_clock: false,
        ready_when_degraded: r.ready_when_degraded.unwrap_or(false),
    };
    if settings.ready_when_degraded && settings.degraded_share.is_none() {
        return Err(src.at_field(
            Kind::InvalidValue,
            "gateway.redis.ready_when_degraded",
            "there is no degraded mode to be ready in: set degraded_share too",
        ));
    }
    settings.store_config().validate().map_err(|e| {
        let field = match e.field {
            "urls" => url_field.to_string(),
            "tls_ca" => CA_FIELD.to_string(),
            f => format!("gateway.redis.{f}"),
        };
        src.at_field(Kind::InvalidValue, &field, e.message)
    })?;
    Ok(settings)
}

fn max_head_bytes(src: &Source<'_>, v: Option<u64>) -> Result<usize, ConfigFileError> {
    let Some(n) = v else {
        return Ok(DEFAULT_MAX_HEAD_BYTES);
    };
    let range = MIN_MAX_HEAD_BYTES as u64..=MAX_MAX_HEAD_BYTES as u64;
    match range.contains(&n) {
        true => Ok(n as usize),
        false => Err(src.at_field(
            Kind::OutOfRange,
            "gateway.max_head_bytes",
            format!(
                "{n} bytes is outside {MIN_MAX_HEAD_BYTES}..={MAX_MAX_HEAD_BYTES}; the default is {DEFAULT_MAX_HEAD_BYTES} (64 KiB)"
            ),
        )),
    }
}

fn timeouts(src: &Source<'_>, t: &TimeoutsModel) -> Result<Timeouts, ConfigFileError> {
    let d = Timeouts::default();
    let ms = |field: &str, v: Option<u64>, default: Duration| match v {
        None => Ok(default),
        Some(0) => Err(src.at_field(
            Kind::OutOfRange,
            &format!("gateway.timeouts.{field}"),
            "a timeout of 0 ms would fail every request; expected a number of milliseconds above 0",
        )),
        Some(ms) => Ok(Duration::from_millis(ms)),
    };
    Ok(Timeouts {
        client_header: ms("client_header_ms", t.client_header_ms, d.client_header)?,
        connect: ms("connect_ms", t.connect_ms, d.connect)?,
        upstream_header: ms(
            "upstream_header_ms",
            t.upstream_header_ms,
            d.upstream_header,
        )?,
        body_idle: ms("body_idle_ms", t.body_idle_ms, d.body_idle)?,
        pool_idle: ms("pool_idle_ms", t.pool_idle_ms, d.pool_idle)?,
        shutdown: ms("shutdown_ms", t.shutdown_ms, d.shutdown)?,
        request_body: ms("request_body_ms", t.request_body_ms, d.request_body)?,
        body_rate_window: ms(
            "body_rate_window_ms",
            t.body_rate_window_ms,
            d.body_rate_window,
        )?,
        body_rate_grace: ms(
            "body_rate_grace_ms",
            t.body_rate_grace_ms,
            d.body_rate_grace,
        )?,
    })
}

fn shedding(src: &Source<'_>, s: &SheddingModel) -> Result<SheddingSettings, ConfigFileError> {
    let d = SheddingSettings::default();
    let reserve = s.reserve.unwrap_or(d.reserve);
    if !(0.0..=0.9).contains(&reserve) {
        return Err(src.at_field(
            Kind::OutOfRange,
            "gateway.shedding.reserve",
            format!("{reserve} is not a share between 0 and 0.9; use 0.2 to keep 20% for critical routes"),
        ));
    }
    let retry_after_s = s.retry_after_s.unwrap_or(d.retry_after_s);
    if retry_after_s == 0 {
        return Err(src.at_field(
            Kind::OutOfRange,
            "gateway.shedding.retry_after_s",
            "Retry-After must be at least 1 second",
        ));
    }
    Ok(SheddingSettings {
        max_in_flight: s.max_in_flight.unwrap_or(d.max_in_flight),
        max_latency: s
            .max_latency_ms
            .filter(|&ms| ms > 0)
            .map(Duration::from_millis),
        reserve,
        retry_after_s,
        max_rps: max_rps(src, s.max_rps)?,
    })
}

fn max_rps(src: &Source<'_>, v: Option<u32>) -> Result<u32, ConfigFileError> {
    match v.unwrap_or(0) {
        n if n <= MAX_MAX_RPS => Ok(n),
        n => Err(src.at_field(
            Kind::OutOfRange,
            "gateway.shedding.max_rps",
            format!("{n} requests a second is over {MAX_MAX_RPS}; use 0 (or leave it out) for no capacity"),
        )),
    }
}

/// Parses an `http://` or `https://` `host[:port][/base]` URI.
fn upstream_uri(s: &str) -> Result<Uri, String> {
    match s.get(..8) {
        Some(p) if p.eq_ignore_ascii_case("https://") => {
            let uri: Uri = s
                .parse()
                .map_err(|_| "not a URI; expected https://HOST[:PORT]".to_string())?;
            match uri.authority().map(Authority::host) {
                Some(h) if !h.is_empty() => Ok(uri),
                _ => Err("no host; expected https://HOST[:PORT]".into()),
            }
        }
        _ => http_uri(s),
    }
}

/// Parses an `http://host:port[/base]` URI.
fn http_uri(s: &str) -> Result<Uri, String> {
    let uri: Uri = s
        .parse()
        .map_err(|_| "not a URI; expected http://HOST:PORT".to_string())?;
    match uri.scheme() {
        Some(sc) if *sc == Scheme::HTTP => {}
        Some(sc) if *sc == Scheme::HTTPS => {
            return Err("https is not supported here; expected http://HOST:PORT".into())
        }
        _ => return Err("expected http://HOST:PORT".into()),
    }
    let host_ok = uri
        .authority()
        .map(Authority::host)
        .is_some_and(|h| !h.is_empty());
    if !host_ok {
        return Err("no host; expected http://HOST:PORT".into());
    }
    Ok(uri)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"[gateway]
listen = "127.0.0.1:0"
upstream = "http://127.0.0.1:9"

[gateway.shedding]
max_in_flight = 64

[plans.free]
policies = [
  { name = "burst", algorithm = "token_bucket", q = 20, w = 2 },
  { name = "daily", algorithm = "daily", q = 10000 },
]

[plans.login]
policies = [{ name = "login", algorithm = "fixed_window", q = 5, w = 60 }]

[keys]
sk_1 = "free"

[[routes]]
method = "POST"
path = "/v1/login"
anonymous = true
plan = "login"

[[routes]]
method = "GET"
path = "/v1/rates"
criticality = "SHEDDABLE"
"#;

    fn err(text: &str) -> ConfigFileError {
        GatewayConfig::parse(text, "t.toml", None).unwrap_err()
    }

    fn patched(from: &str, to: &str) -> ConfigFileError {
        assert!(GOOD.contains(from), "{from}");
        err(&GOOD.replacen(from, to, 1))
    }

    #[test]
    fn the_good_config_loads() {
        let c = GatewayConfig::parse(GOOD, "t.toml", None).unwrap();
        assert_eq!(c.settings.max_head_bytes, 64 * 1024);
        assert_eq!(c.settings.shedding.max_in_flight, 64);
        assert_eq!(c.settings.shedding.reserve, 0.2);
        assert_eq!(c.limits.plans().len(), 2);
        assert_eq!(c.settings.upstream.port_u16(), Some(9));
    }

    #[test]
    fn a_zero_window_names_line_and_field() {
        let e = patched("q = 20, w = 2", "q = 20, w = 0");
        assert_eq!((e.line(), e.field()), (10, "plans.free.policies[0].w"));
        assert!(e.to_string().starts_with("t.toml:10:"), "{e}");
    }

    #[test]
    fn an_unknown_field_is_located() {
        let e = patched("max_in_flight = 64", "max_inflight = 64");
        assert_eq!(e.line(), 6);
        assert!(e.message().contains("unknown field `max_inflight`"), "{e}");
        assert!(e.message().contains("max_in_flight"), "{e}");
        assert_eq!(e.field(), "gateway.shedding.max_inflight");
    }

    #[test]
    fn a_wrong_type_is_located() {
        let e = patched("q = 10000", "q = \"lots\"");
        assert_eq!(e.line(), 11);
        assert_eq!(e.field(), "plans.free.policies[1].q");
    }

    #[test]
    fn a_bad_criticality_is_located() {
        let e = patched("\"SHEDDABLE\"", "\"LOW\"");
        assert_eq!((e.line(), e.field()), (29, "routes[1].criticality"));
        assert!(e.message().contains("SHEDDABLE_PLUS"), "{e}");
    }

    #[test]
    fn a_syntax_error_is_located() {
        let e = patched("[keys]", "[keys");
        assert_eq!(e.line(), 17);
    }

    #[test]
    fn gateway_settings_are_checked() {
        let e = patched("127.0.0.1:0", "localhost");
        assert_eq!((e.line(), e.field()), (2, "gateway.listen"));
        assert!(e.message().contains("IP:PORT"));
        let e = patched("http://127.0.0.1:9", "ftp://x");
        assert_eq!(e.field(), "gateway.upstream");
        let e = patched("max_in_flight = 64", "max_in_flight = 64\nreserve = 2.0");
        assert_eq!((e.line(), e.field()), (7, "gateway.shedding.reserve"));
        let e = patched("[gateway]\n", "[gateway]\nstore = \"redis\"\n");
        assert_eq!((e.line(), e.field()), (2, "gateway.store"));
    }

    #[test]
    fn the_redis_table_is_checked_by_field() {
        let redis = "[gateway]\nstore = \"redis\"\n";
        let table = "[gateway.shedding]\nmax_in_flight = 64\n\n[gateway.redis]\nurl = \"redis://127.0.0.1:6379\"\ndeadline_ms = 5\n";
        let text = GOOD.replacen("[gateway]\n", redis, 1).replacen(
            "[gateway.shedding]\nmax_in_flight = 64\n",
            table,
            1,
        );
        #[cfg(feature = "redis")]
        {
            // every instance must name keys alike: no random secret
            let e = err(&text);
            assert_eq!(
                (e.kind(), e.field()),
                (Kind::Missing, "gateway.key_hash_secret_file")
            );
            assert!(e.message().contains(KEY_HASH_SECRET_ENV), "{e}");
            let env =
                |v: &str| (v == KEY_HASH_SECRET_ENV).then(|| "a shared secret of 24 b".to_string());
            let parse = |t: &str| GatewayConfig::parse_with_env(t, "t.toml", None, &env);
            let c = parse(&text).unwrap();
            assert_eq!(c.settings.store, StoreKind::Redis);
            let r = c.settings.redis.unwrap();
            assert_eq!(r.deadline, Duration::from_millis(5));
            assert_eq!(r.urls, vec!["redis://127.0.0.1:6379".to_string()]);
            let bad = |from: &str, to: &str| parse(&text.replacen(from, to, 1)).unwrap_err();
            let e = bad("deadline_ms = 5", "deadline_ms = 0");
            assert_eq!((e.line(), e.field()), (11, "gateway.redis.deadline_ms"));
            let e = bad("redis://127.0.0.1:6379", "http://127.0.0.1:6379");
            assert_eq!((e.line(), e.field()), (10, "gateway.redis.url"));
            let e = bad("deadline_ms = 5", "deadline = 5");
            assert_eq!(e.field(), "gateway.redis.deadline");
            let e = bad("deadline_ms = 5", "urls = [\"redis://a:1\"]");
            assert!(e.message().contains("not both"), "{}", e.message());
            let two = "urls = [\"redis://a:1\", \"redis://b:1\"]";
            let e = bad("url = \"redis://127.0.0.1:6379\"", two);
            assert_eq!(e.field(), "gateway.redis.urls");
            assert!(e.message().contains("cluster"), "{}", e.message());
            // a plan the store cannot hold exactly is refused by name
            let e = bad("q = 20, w = 2 }", "q = 20, w = 3000000 }");
            assert_eq!(e.field(), "plans.free");
            assert!(e.message().contains("30 days"), "{}", e.message());
        }
        #[cfg(not(feature = "redis"))]
        {
            let e = err(&text);
            assert_eq!(e.field(), "gateway.store");
            assert!(e.message().contains("`redis` feature"), "{}", e.message());
        }
        // the table without the store
        let e = err(&GOOD.replacen("[gateway.shedding]\nmax_in_flight = 64\n", table, 1));
        assert_eq!(e.field(), "gateway.redis");
    }

    #[cfg(feature = "redis")]
    #[test]
    fn the_redis_table_bounds_its_idempotency_deadline_and_views_and_reads_its_ca() {
        const PEM: &[u8] = b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        let env =
            |v: &str| (v == KEY_HASH_SECRET_ENV).then(|| "a shared secret of 24 b".to_string());
        let text = |url: &str, extra: &str| {
            GOOD.replacen("[gateway]\n", "[gateway]\nstore = \"redis\"\n", 1)
                .replacen(
                    "[gateway.shedding]\nmax_in_flight = 64\n",
                    &format!(
                        "[gateway.shedding]\nmax_in_flight = 64\n\n[gateway.redis]\nurl = \"{url}\"\n{extra}"
                    ),
                    1,
                )
        };
        let dir = std::env::temp_dir().join(format!("pl-gw-redis-ca-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let parse = |t: &str| GatewayConfig::parse_with_env(t, "t.toml", Some(&dir), &env);
        let plain = "redis://127.0.0.1:6379";
        let r = parse(&text(plain, "")).unwrap().settings.redis.unwrap();
        assert_eq!(r.idempotency_deadline, Duration::from_millis(250));
        assert_eq!(r.standing_keys, 10_000);
        assert!(r.tls_ca.is_none());
        let set = "idempotency_deadline_ms = 40\nstanding_keys = 0\n";
        let r = parse(&text(plain, set)).unwrap().settings.redis.unwrap();
        assert_eq!(r.idempotency_deadline, Duration::from_millis(40));
        assert_eq!(
            r.store_config().idempotency_deadline,
            Duration::from_millis(40)
        );
        assert_eq!(r.standing_keys, 0);
        for bad in [
            "idempotency_deadline_ms = 0\n",
            "idempotency_deadline_ms = 10001\n",
        ] {
            let e = parse(&text(plain, bad)).unwrap_err();
            assert_eq!(e.field(), "gateway.redis.idempotency_deadline_ms", "{e}");
        }
        let e = parse(&text(plain, "standing_keys = 10000001\n")).unwrap_err();
        assert_eq!(e.field(), "gateway.redis.standing_keys");
        // the CA file: read relative to the config, checked as PEM
        let tls = "rediss://127.0.0.1:6380";
        let e = parse(&text(tls, "tls_ca_file = \"missing.pem\"\n")).unwrap_err();
        assert_eq!(
            (e.kind(), e.field()),
            (Kind::Unreadable, "gateway.redis.tls_ca_file")
        );
        std::fs::write(dir.join("ca.pem"), PEM).unwrap();
        std::fs::write(dir.join("bad.pem"), "not a certificate").unwrap();
        let ca = "tls_ca_file = \"ca.pem\"\n";
        #[cfg(feature = "redis-tls")]
        {
            let r = parse(&text(tls, ca)).unwrap().settings.redis.unwrap();
            assert_eq!(r.tls_ca.as_deref(), Some(PEM));
            assert_eq!(r.store_config().tls_ca.as_deref(), Some(PEM));
            // a CA is for rediss:// servers only
            let e = parse(&text(plain, ca)).unwrap_err();
            assert_eq!(e.field(), "gateway.redis.tls_ca_file");
            assert!(e.message().contains("rediss://"), "{e}");
            let e = parse(&text(tls, "tls_ca_file = \"bad.pem\"\n")).unwrap_err();
            assert_eq!(e.field(), "gateway.redis.tls_ca_file");
            assert!(e.message().contains("no PEM certificate"), "{e}");
        }
        #[cfg(not(feature = "redis-tls"))]
        {
            let e = parse(&text(tls, ca)).unwrap_err();
            assert_eq!(e.field(), "gateway.redis.tls_ca_file");
            assert!(e.message().contains("`tls` feature"), "{e}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_head_bound_is_checked() {
        for bad in ["0", "8191", "1048577"] {
            let e = patched(
                "[gateway]\n",
                &format!("[gateway]\nmax_head_bytes = {bad}\n"),
            );
            assert_eq!((e.line(), e.field()), (2, "gateway.max_head_bytes"), "{e}");
            assert_eq!(e.kind(), Kind::OutOfRange);
            assert!(e.message().contains("65536"), "{e}");
        }
        let text = GOOD.replacen("[gateway]\n", "[gateway]\nmax_head_bytes = 16384\n", 1);
        let c = GatewayConfig::parse(&text, "t.toml", None).unwrap();
        assert_eq!(c.settings.max_head_bytes, 16384);
    }

    #[test]
    fn the_body_and_memory_bounds_have_defaults_and_are_checked() {
        let c = GatewayConfig::parse(GOOD, "t.toml", None).unwrap();
        let (t, l) = (c.settings.timeouts, c.settings.limits);
        assert_eq!(t.request_body, Duration::from_secs(300));
        assert_eq!(t.body_rate_window, Duration::from_secs(10));
        assert_eq!(t.body_rate_grace, Duration::from_secs(10));
        assert_eq!(l, GatewayLimits::default());
        assert_eq!(l.max_buffered_bytes, 64 * 1024 * 1024);
        assert_eq!(
            (
                l.max_receiving,
                l.max_receiving_per_ip,
                l.intake_bytes,
                l.min_body_rate
            ),
            (1024, 64, 16 * 1024, 1024)
        );
        let with =
            |table: &str| GOOD.replacen("[plans.free]", &format!("{table}\n[plans.free]"), 1);
        let text = with("[gateway.limits]\nmax_buffered_bytes = 2097152\nmin_body_rate = 0\nintake_bytes = 100\n[gateway.timeouts]\nrequest_body_ms = 1500");
        let c = GatewayConfig::parse(&text, "t.toml", None).unwrap();
        assert_eq!(c.settings.limits.max_buffered_bytes, 2 * 1024 * 1024);
        assert_eq!(c.settings.limits.min_body_rate, 0);
        assert_eq!(c.settings.limits.intake_bytes, 100);
        assert_eq!(
            c.settings.timeouts.request_body,
            Duration::from_millis(1500)
        );
        for (table, field) in [
            (
                "[gateway.limits]\nmax_buffered_bytes = 1000",
                "gateway.limits.max_buffered_bytes",
            ),
            (
                "[gateway.limits]\nmax_receiving = 0",
                "gateway.limits.max_receiving",
            ),
            (
                "[gateway.limits]\nmax_receiving_per_ip = 0",
                "gateway.limits.max_receiving_per_ip",
            ),
            (
                "[gateway.limits]\nintake_bytes = 0",
                "gateway.limits.intake_bytes",
            ),
            (
                "[gateway.timeouts]\nrequest_body_ms = 0",
                "gateway.timeouts.request_body_ms",
            ),
            (
                "[gateway.timeouts]\nbody_rate_window_ms = 0",
                "gateway.timeouts.body_rate_window_ms",
            ),
        ] {
            let e = err(&with(table));
            assert_eq!((e.kind(), e.field()), (Kind::OutOfRange, field), "{e}");
        }
        let e = err(&with("[gateway.limits]\nmax_bufered_bytes = 1"));
        assert_eq!(e.kind(), Kind::UnknownField, "{e}");
    }

    #[test]
    fn the_key_hash_secret_comes_from_the_file_then_the_environment() {
        let dir = std::env::temp_dir().join(format!("pl-gw-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file_secret = "file-secret-0123456789";
        let env_secret = "env-secret-0123456789";
        std::fs::write(dir.join("secret"), format!("{file_secret}\n")).unwrap();
        let with_file = GOOD.replacen(
            "[gateway]\n",
            "[gateway]\nkey_hash_secret_file = \"secret\"\n",
            1,
        );
        let env = |v: &str| (v == KEY_HASH_SECRET_ENV).then(|| env_secret.to_string());
        let none = |_: &str| None;
        let hash = |text: &str, env: &dyn Fn(&str) -> Option<String>| {
            let c = GatewayConfig::parse_with_env(text, "t.toml", Some(&dir), env).unwrap();
            c.limits.key_hasher().hash("sk_1")
        };
        let by = |s: &str| {
            KeyHasher::from_secret(s.as_bytes(), "x")
                .unwrap()
                .hash("sk_1")
        };
        // the file beats the environment, which beats the random default
        assert_eq!(hash(&with_file, &env), by(file_secret));
        assert_eq!(hash(&with_file, &none), by(file_secret));
        assert_eq!(hash(GOOD, &env), by(env_secret));
        assert_eq!(hash(GOOD, &none), KeyHasher::per_process().hash("sk_1"));
        assert_ne!(by(file_secret), by(env_secret));
        // the configured keys are hashed with it too: the same on a reload
        assert_eq!(hash(GOOD, &env), hash(GOOD, &env));
        // too short, from either place: refused (as --check does)
        std::fs::write(dir.join("secret"), "short\n").unwrap();
        let e = GatewayConfig::parse_with_env(&with_file, "t.toml", Some(&dir), &none).unwrap_err();
        assert_eq!(
            (e.kind(), e.field()),
            (Kind::OutOfRange, "gateway.key_hash_secret_file"),
            "{e}"
        );
        assert!(e.message().contains("at least 16"), "{e}");
        assert!(!e.to_string().contains("short\n"), "{e}");
        let short = |_: &str| Some("tiny".to_string());
        let e = GatewayConfig::parse_with_env(GOOD, "t.toml", Some(&dir), &short).unwrap_err();
        assert_eq!(
            (e.kind(), e.field()),
            (Kind::OutOfRange, KEY_HASH_SECRET_ENV),
            "{e}"
        );
        assert!(!e.to_string().contains("tiny"), "{e}");
        std::fs::remove_file(dir.join("secret")).unwrap();
        let e = GatewayConfig::parse_with_env(&with_file, "t.toml", Some(&dir), &none).unwrap_err();
        assert_eq!(
            (e.kind(), e.field()),
            (Kind::Unreadable, "gateway.key_hash_secret_file")
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_missing_table_is_named() {
        let e = err("[plans]\n");
        assert!(e.message().contains("gateway"), "{e}");
    }

    #[test]
    fn semantic_errors_from_the_limits_model_are_located() {
        let e = patched("sk_1 = \"free\"", "sk_1 = \"gold\"");
        assert_eq!((e.line(), e.field()), (18, "keys.sk_1"));
        let e = patched("plan = \"login\"", "plan = \"nope\"");
        assert_eq!((e.line(), e.field()), (24, "routes[0].plan"));
    }

    #[test]
    fn every_error_has_its_kind() {
        let cases = [
            ("[keys]", "[keys", Kind::Syntax),
            (
                "max_in_flight = 64",
                "max_inflight = 64",
                Kind::UnknownField,
            ),
            ("[keys]", "[kesy]", Kind::UnknownField),
            (
                "[plans.login]",
                "[plans.free.x]\n[plans.login]",
                Kind::UnknownField,
            ),
            ("q = 10000", "q = \"lots\"", Kind::Mismatch),
            ("path = \"/v1/rates\"", "", Kind::Mismatch),
            ("sk_1 = \"free\"", "sk_1 = \"gold\"", Kind::UnknownPlan),
            ("q = 20, w = 2", "q = 20, w = 0", Kind::InvalidPolicy),
            ("anonymous = true\n", "", Kind::InvalidValue),
            ("plan = \"login\"", "", Kind::Missing),
            ("127.0.0.1:0", "localhost", Kind::InvalidValue),
            (
                "max_in_flight = 64",
                "max_in_flight = 64\nreserve = 2.0",
                Kind::OutOfRange,
            ),
            (
                "[gateway]\n",
                "soft_limit = 2.0\n[gateway]\n",
                Kind::OutOfRange,
            ),
        ];
        for (from, to, kind) in cases {
            assert_eq!(patched(from, to).kind(), kind, "{from:?} to {to:?}");
        }
        assert_eq!(err("[plans]\n").kind(), Kind::Mismatch);
        let missing = GatewayConfig::load(Path::new("/nonexistent/paceline/gw.toml"));
        assert_eq!(missing.unwrap_err().kind(), Kind::Unreadable);
    }

    #[test]
    fn an_unknown_top_level_field_names_the_gateway_table_too() {
        let e = patched("[gateway]\n", "plan = 1\n[gateway]\n");
        assert_eq!((e.line(), e.column(), e.field()), (1, 1, "plan"));
        assert!(
            e.message()
                .starts_with("unknown field `plan`, expected one of `gateway`, `plans`, `keys`"),
            "{e}"
        );
    }

    #[test]
    fn the_rate_capacity_is_read_and_bounded() {
        let c = GatewayConfig::parse(GOOD, "t.toml", None).unwrap();
        assert_eq!(c.settings.shedding.max_rps, 0, "off by default");
        let on = GOOD.replacen("max_in_flight = 64", "max_in_flight = 64\nmax_rps = 40", 1);
        let c = GatewayConfig::parse(&on, "t.toml", None).unwrap();
        assert_eq!(c.settings.shedding.max_rps, 40);
        let e = patched(
            "max_in_flight = 64",
            "max_in_flight = 64\nmax_rps = 10000001",
        );
        assert_eq!((e.line(), e.field()), (7, "gateway.shedding.max_rps"));
        assert_eq!(e.kind(), Kind::OutOfRange);
        let e = patched("max_in_flight = 64", "max_in_flight = 64\nmax_rps = -1");
        assert_eq!(
            (e.line(), e.field()),
            (7, "gateway.shedding.max_rps"),
            "{e}"
        );
    }

    #[test]
    fn a_number_too_large_names_its_field() {
        let e = patched("q = 20, w = 2", "q = 99999999999999999999, w = 2");
        assert_eq!(e.field(), "plans.free.policies[0].q", "{e}");
        assert_eq!(e.line(), 10, "{e}");
        let e = patched("max_in_flight = 64", "max_in_flight = 99999999999999999999");
        assert_eq!(e.field(), "gateway.shedding.max_in_flight", "{e}");
    }

    #[test]
    fn what_cannot_work_is_refused_with_its_field() {
        // a route cost no plan can hold
        let e = patched(
            "path = \"/v1/rates\"\n",
            "path = \"/v1/rates\"\ncost = 25\n",
        );
        assert_eq!(
            (e.kind(), e.field()),
            (Kind::OutOfRange, "routes[1].cost"),
            "{e}"
        );
        // an unknown method
        let e = patched("method = \"GET\"", "method = \"FETCH\"");
        assert_eq!(
            (e.kind(), e.field()),
            (Kind::InvalidValue, "routes[1].method"),
            "{e}"
        );
        // no plan at all
        let start = GOOD.find("[plans.free]").unwrap();
        let end = GOOD.find("[keys]").unwrap();
        let none = format!("{}{}", &GOOD[..start], &GOOD[end..]).replace("sk_1 = \"free\"\n", "");
        let none = none.replace("anonymous = true\nplan = \"login\"\n", "");
        let e = err(&none);
        assert_eq!((e.kind(), e.field()), (Kind::Missing, "plans"), "{e}");
    }

    #[test]
    fn the_limits_defaults_are_the_server_models() {
        let c = GatewayConfig::parse(GOOD, "t.toml", None).unwrap();
        // the model's defaults, with the one plan a configuration must give
        let mut m = LimitsConfig::default();
        let plan = r#"policies = [{ name = "b", algorithm = "token_bucket", q = 1, w = 1 }]"#;
        m.plans.insert("p".into(), toml::from_str(plan).unwrap());
        let d = m.build().unwrap();
        assert_eq!(c.limits.problem_base(), d.problem_base());
        assert_eq!(c.limits.soft_limit(), d.soft_limit());
        assert_eq!(c.limits.usage_path(), d.usage_path());
        assert_eq!(c.limits.dialects(), d.dialects());
        assert_eq!(c.limits.escalation(), d.escalation());
    }

    #[test]
    fn keys_can_come_from_a_file() {
        let dir = std::env::temp_dir().join(format!("pl-gw-keys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("keys.toml"), "sk_2 = \"free\"\nsk_3 = \"gold\"\n").unwrap();
        let text = GOOD.replacen("[gateway]\n", "[gateway]\nkeys_file = \"keys.toml\"\n", 1);
        let e = GatewayConfig::parse(&text, "t.toml", Some(&dir)).unwrap_err();
        assert!(e.file().ends_with("keys.toml"), "{e}");
        assert_eq!((e.line(), e.field()), (2, "keys.sk_3"));
        assert_eq!(e.kind(), Kind::UnknownPlan);
        std::fs::write(dir.join("keys.toml"), "sk_1 = \"free\"\n").unwrap();
        let e = GatewayConfig::parse(&text, "t.toml", Some(&dir)).unwrap_err();
        assert_eq!((e.kind(), e.line()), (Kind::Duplicate, 1));
        std::fs::remove_file(dir.join("keys.toml")).unwrap();
        let e = GatewayConfig::parse(&text, "t.toml", Some(&dir)).unwrap_err();
        assert_eq!(
            (e.kind(), e.field()),
            (Kind::Unreadable, "gateway.keys_file")
        );
        std::fs::write(dir.join("keys.toml"), "sk_2 = \"free\"\n").unwrap();
        let c = GatewayConfig::parse(&text, "t.toml", Some(&dir)).unwrap();
        assert_eq!(c.limits.plan_for_key("sk_2").unwrap().name(), "free");
        assert_eq!(c.sources.len(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
