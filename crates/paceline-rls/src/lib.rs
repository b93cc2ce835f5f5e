//! # paceline-rls
//!
//! Envoy's rate-limit service (`envoy.service.ratelimit.v3.RateLimitService`,
//! `ShouldRateLimit`, gRPC over HTTP/2 cleartext) on paceline's limiter:
//! a deployment that already writes envoyproxy/ratelimit's YAML keeps its
//! files and its Envoy configuration, and gets paceline's decisions and
//! answers.
//!
//! Why: Envoy asks a rate-limit service before it forwards a request, and
//! forwards whatever the service says to add. envoyproxy/ratelimit answers
//! `OK` or `OVER_LIMIT`; this service answers the same, and also gives the
//! client the budget (`RateLimit-Policy`/`RateLimit` for every
//! descriptor's limit, on both answers), the wait (`Retry-After`) and the
//! problem body (`raw_body`), written by `paceline-wire` as the gateway
//! writes them.
//!
//! ## What differs from envoyproxy/ratelimit, deliberately
//!
//! - A request is `OK` only if every descriptor's rule admits it, and a
//!   refused request charges nothing: what it was charged before the
//!   refusing rule is given back (envoyproxy/ratelimit charges every
//!   descriptor, so a refused request still spends the others' limits).
//! - Both answers carry the IETF fields for every descriptor's limit;
//!   `OVER_LIMIT` carries `Retry-After` (whole seconds, at least 1) and an
//!   `application/problem+json` body naming the rule (`limit`), typed
//!   `quota_exhausted` for windows of an hour or more, `rate_limited`
//!   for shorter ones.
//! - The YAML may use paceline's algorithms (`algorithm: token_bucket` with
//!   a `burst`, `sliding_window`, `sliding_log`, `reset_at` for a day) and a
//!   per-domain `fail_mode` (see [`config`]); unknown keys, a key twice at
//!   one level and a descriptor twice in one list are errors with the
//!   file and line, where envoyproxy/ratelimit ignores or merges some.
//! - A descriptor's `limit` override is a fixed window, as there; its
//!   `is_negative_hits` gives the hits back as a refund of a charge made
//!   now (a window's count while it is current, a bucket's tokens), never
//!   past the full limit, whatever the other descriptors say.
//!
//! ## The parts
//!
//! ```text
//!  config.rs (the YAML → Domain: descriptor trees of Rules, each a Plan)
//!     ▲ yaml.rs (a tree of nodes with their lines)     watch.rs (reload)
//!     │
//!  service.rs (ShouldRateLimit: descriptors → rules → Store, all or none)
//!     │ metrics.rs (envoyproxy/ratelimit's counters, labelled)
//!     ▼
//!  answer.rs (statuses; the rules as one plan → paceline-wire's fields,
//!             Retry-After and problem body)
//! ```
//!
//! ## The library
//!
//! The gRPC types and the service trait are `envoy-types`' (Envoy's own
//! protos, generated ahead of time and shipped as Rust, so a fresh
//! machine needs no `protoc`), served with `tonic`, the gRPC stack those
//! types are generated for; `tonic`'s router (and with it `axum`) is left
//! out: the one service is served as is.
//!
//! ```
//! # #[cfg(feature = "grpc")] {
//! use paceline_core::{ManualClock, MemoryStore};
//! use paceline_rls::{RlsConfig, RlsService};
//! use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
//!     rate_limit_descriptor::Entry, RateLimitDescriptor,
//! };
//! use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
//!
//! let yaml = "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n";
//! let config = RlsConfig::from_str("edge.yaml".as_ref(), yaml).unwrap();
//! let service = RlsService::new(config, MemoryStore::new(), ManualClock::at_unix_secs(1_790_000_000));
//! let req = RateLimitRequest {
//!     domain: "edge".into(),
//!     descriptors: vec![RateLimitDescriptor {
//!         entries: vec![Entry { key: "remote_address".into(), value: "10.0.0.1".into() }],
//!         ..Default::default()
//!     }],
//!     ..Default::default()
//! };
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! assert_eq!(service.decide(&req).await.unwrap().overall_code, 1); // OK
//! let no = service.decide(&req).await.unwrap();
//! assert_eq!(no.overall_code, 2); // OVER_LIMIT
//! let retry = no.response_headers_to_add.iter().find(|h| h.key == "retry-after");
//! assert_eq!(retry.unwrap().value, "1");
//! # });
//! # }
//! ```

#![forbid(unsafe_code)]

#[cfg(feature = "grpc")]
mod answer;
pub mod config;
#[cfg(feature = "grpc")]
pub mod metrics;
#[cfg(feature = "grpc")]
mod service;
#[cfg(feature = "grpc")]
pub mod watch;
mod yaml;

pub use config::{ConfigError, Domain, Limit, Match, RlsConfig, Rule, Unit};
#[cfg(feature = "grpc")]
pub use envoy_types;
#[cfg(feature = "grpc")]
pub use service::{serve, RlsService, DEFAULT_PROBLEM_BASE};
#[cfg(feature = "grpc")]
pub use watch::{Reload, Watcher};
