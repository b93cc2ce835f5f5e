//! # paceline-gateway
//!
//! A rate-limiting reverse proxy: the server layers of `paceline-server`
//! in front of any HTTP API, configured by one TOML file.
//!
//! Why a gateway: not every API can take a tower layer. Put the gateway in
//! front and every response publishes its budget, 429s are answered from
//! the request head without touching the API, overload sheds the least
//! critical work first, and the configuration reloads without losing a
//! counter or a connection.
//!
//! The pieces:
//! - [`GatewayConfig`]: the file, with errors naming file, line and field.
//! - [`Gateway`]: binds, serves (HTTP/1.1 and HTTP/2, in cleartext or
//!   over TLS), reloads, shuts down gracefully; [`GatewayHandle`]
//!   controls it.
//! - [`shed`]: load shedding by criticality, as a tower layer.
//! - [`check`]: the forward-auth endpoint (`paceline check`): the same
//!   decisions for nginx `auth_request`, Caddy `forward_auth` and Traefik
//!   `ForwardAuth`, from the request they describe.
//! - the forwarding service (`proxy.rs`, private), with its own HTTP/1.1
//!   client to the upstream (pooled keep-alive connections driven in the
//!   request's task, in cleartext or over TLS) and hyper's HTTP/2 client
//!   for `upstream_protocol = "http2"` or `"auto"`.
//!
//! ## The parts
//!
//! ```text
//!  config.rs ─ split.rs ─ locate.rs     the file: [gateway] here, the rest to
//!     │                                  paceline-server's model; located errors
//!     ▼
//!  server.rs   bind, accept, one stack per connection, reload, shutdown
//!     │  tls/server.rs (the handshake: deadline, how many at once, memory;
//!     │                 the certificate swapped at a reload)
//!     │  idle.rs (a connection with nothing in flight too long is closed)
//!     │  edge.rs (the socket: hyper's own refusals, unfinished heads counted)
//!     ▼
//!  front.rs    the head read once: the path in normal form, the forms an
//!     │        upstream could read two ways refused
//!     ▼
//!  shed/ service.rs (LoadShed: classify once, room from the head or 503,
//!     │              hold the unit admitted.rs takes, time the upstream)
//!     │  mod.rs     (Shedder: in-flight units by criticality, latency rule)
//!     ▼
//!  keys.rs     with [gateway.keys_redis]: an API key the file does not list
//!     │        looked up (bounded cache, then HGET) and handed on as a KeyLookup
//!     ▼
//!  paceline-server RateLimit  (decide from the head; 429 without going on)
//!     │
//!     ▼
//!  admitted.rs intake.rs: a body still to come takes a receiving place,
//!     │        its first bytes in, its deadlines (least rate, whole body),
//!     │        the memory bound; then the in-flight unit is taken
//!     ▼
//!  idempotency.rs  paceline-server's idempotency layer on the routes that
//!     │            take keys (replay, 409, never a second execution)
//!     ▼
//!  proxy.rs ─► upstream/ choice.rs (which client the settings ask for)
//!                        client.rs (pool.rs, conn.rs, body.rs, idle.rs):
//!                          the own HTTP/1.1 client
//!                        h2.rs (hyper's HTTP/2 connection, shared, renewed)
//!                        dial.rs (TCP, then TLS with tls/client.rs: SNI,
//!                          ALPN, the client certificate)
//!                        codec/ request.rs and fields.rs (the head going
//!                               up), head.rs and framing.rs (the answer
//!                               coming back), hop.rs
//!                        hyper.rs, differential.rs, transports.rs (tests:
//!                          every transport held against the others)
//!  tls/mod.rs  PEM files, key pairs, validity dates, the ring provider
//!  ops.rs      /metrics, /healthz, /readyz    metrics.rs  the gateway's series
//!  webhook.rs  soft-limit events
//!
//!  check/      the forward-auth endpoint: rebuild.rs (the described
//!              request) ─► front.rs ─► shed/ ─► the limit layer ─► an
//!              empty 200 with the fields; seal.rs (a refusal carried
//!              through nginx's auth_request)
//! ```
//!
//! ## A 429, socket to header
//!
//! `server.rs` accepts the connection and builds its stack; hyper reads
//! the head; `shed/service.rs` classifies the request once (its route,
//! through `paceline-server`'s `config/mod.rs` and `route.rs`) and, with
//! room to spare, hands it with that classification to the limit layer
//! (`paceline-server`'s `layer/service.rs`); `limiter.rs` there reads the
//! key (`identity.rs`), asks the store (`paceline-core`'s `store.rs` and
//! `check.rs`) and turns the denial into the plan's prepared answer
//! (`paceline-wire`'s `emit/prepared.rs`: head, `RateLimit`, `Retry-After`
//! and the problem body); the answer goes back through `shed/service.rs`
//! (which records no upstream latency for it) to hyper, which writes it.
//! `proxy.rs` and the upstream are never touched.
//!
//! ```no_run
//! use paceline_gateway::{Gateway, GatewayConfig};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let config = GatewayConfig::load("examples/shiplane.toml".as_ref())?;
//! let gateway = Gateway::bind(config).await?;
//! println!("listening on http://{}", gateway.local_addr());
//! gateway.run(paceline_gateway::shutdown_signal()).await?;
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]

mod admitted;
pub mod check;
mod config;
mod edge;
mod front;
mod global;
mod h1;
mod idempotency;
mod idle;
mod intake;
mod keys;
mod locate;
pub mod metrics;
mod ops;
mod proxy;
mod server;
pub mod shed;
mod split;
mod store;
mod tls;
mod upstream;
mod webhook;

pub use config::{
    ConfigFileError, GatewayConfig, GatewayLimits, Http1Server, KeysRedisSettings, KeysUnavailable,
    PathSettings, RedisSettings, Settings, SheddingSettings, StoreKind, Timeouts, TlsSettings,
    UpstreamProtocol, UpstreamTlsSettings, DEFAULT_KEYS_REDIS_CACHE, DEFAULT_KEYS_REDIS_STALE,
    DEFAULT_KEYS_REDIS_TTL, DEFAULT_MAX_BUFFERED_BYTES, DEFAULT_MAX_HANDSHAKES,
    DEFAULT_MAX_HEAD_BYTES, DEFAULT_TLS_HANDSHAKE, KEY_HASH_SECRET_ENV, MAX_MAX_HEAD_BYTES,
    MIN_MAX_BUFFERED_BYTES, MIN_MAX_HEAD_BYTES,
};
pub use global::GLOBAL_KEY;
pub use keys::MAX_LOOKUP_KEY;
pub use server::{
    serve_metrics, shutdown_signal, Gateway, GatewayHandle, GatewayLimiter, ReloadCallback,
    ReloadEvent,
};
pub use store::GatewayStore;
