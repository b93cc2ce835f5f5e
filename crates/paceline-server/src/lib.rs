//! # paceline-server
//!
//! Tower layers for the server half of the HTTP rate-limit contract: decide
//! from the request head, publish the budget on every response, and say no
//! cheaply and precisely.
//!
//! Why a layer: any axum or hyper service gets the whole contract in a few
//! lines — keys and plans, route costs, the IETF `RateLimit` fields,
//! problem+json rejections with `Retry-After`, a usage endpoint, soft
//! limits, escalation for clients that do not listen, shadow policies, and
//! metrics — while the numbers come from `paceline-core`, so the simulator
//! and the tests run the same decisions.
//!
//! The pieces:
//! - [`Limits`] (built with [`LimitsBuilder`] or from a file through
//!   [`LimitsConfig`]): plans, keys, routes, trusted proxies, dialects.
//! - [`RateLimiter`]: the engine over any [`paceline_core::Store`] and
//!   [`paceline_core::Clock`]; [`RateLimiter::layer`] makes the
//!   [`RateLimitLayer`].
//! - [`route`]: costs and criticality, and [`RouteInfo`], a request's
//!   classification; [`telemetry`]: the metric names.
//! - [`idempotency`]: a second layer, usable alone, that replays the
//!   stored answer of a retried write instead of running it twice
//!   ([`IdempotencyLayer`], its store trait and a bounded in-memory store).
//!
//! ## The parts
//!
//! ```text
//!  config/ model.rs (the serde model) ─► compile.rs (LimitsBuilder,
//!          error.rs (typed kinds)          CompiledPlan: a plan and its
//!          mod.rs (Limits, classify)       prepared answers, metric keys)
//!                                   │ Limits, swapped whole on reload
//!                                   ▼
//!  layer/ layer.rs ─► service.rs (RateLimit: call) ─► body.rs (releases held units)
//!                                   │
//!                                   ▼
//!  limiter.rs (prepare, stage, decide, conclude)
//!     ├─► route.rs     the route: cost, criticality, anonymity (once)
//!     ├─► identity.rs  who: API key (clear or hashed), header, client IP,
//!     │                consumer headers from a trusted proxy, a lookup
//!     │                made before (KeyLookup)
//!     ├─► jwt/         who: a verified bearer JWT (jsonwebtoken on ring)
//!     ├─► escalation.rs holds for keys that keep retrying   ─┐ state.rs
//!     ├─► soft.rs      warnings past a share of a quota     ─┘ (bounded maps)
//!     ├─► paceline-core  the decision (any Store, any Clock)
//!     ├─► telemetry.rs metrics and tracing
//!     └─► respond.rs + paceline-wire  the fields, the answers
//!
//!  idempotency/ service.rs (IdempotencyLayer, Idempotency: run, replay, refuse)
//!     ├─► key.rs         Idempotency-Key: structured-field string or bare
//!     ├─► scope.rs       whose key, on which route (BearerScope, LimiterScope)
//!     ├─► fingerprint.rs entry keys, head and body digests (while streaming)
//!     ├─► store.rs       the five steps ─► memory.rs (bounded in bytes, TTL)
//!     └─► replay.rs + body.rs  stored answers again, problems, the body
//! ```
//!
//! ## A 429, file by file
//!
//! `layer/service.rs` hands the request head to `limiter.rs`, which takes
//! its [`RouteInfo`] (`route.rs`: made by a layer in front, such as the
//! gateway's shedder, or matched here), reads the key (`identity.rs`),
//! checks for an escalation hold (`escalation.rs`) and asks the store
//! (`paceline-core`, `store.rs` and `check.rs` there) with the compiled
//! plan (`config/compile.rs`); the denial goes to the plan's prepared
//! answer (`paceline-wire`'s `emit/prepared.rs`), is counted
//! (`telemetry.rs`) and returned by `layer/service.rs` as a ready future,
//! the request body unread (the connection closes when one was sent).
//!
//! ```
//! use paceline_core::{ManualClock, MemoryStore, Plan, Policy};
//! use paceline_server::{Limits, RateLimiter};
//! use tower::{Service, ServiceExt};
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let free = Plan::new("free", vec![
//!     Policy::token_bucket("burst", 2, 2).unwrap(),
//!     Policy::daily("daily", 10_000).unwrap(),
//! ]).unwrap();
//! let limits = Limits::builder().plan(free).key("sk_1", "free").build().unwrap();
//! let limiter = RateLimiter::new(limits, MemoryStore::new(), ManualClock::at_unix_secs(1_790_000_000));
//!
//! let hello = tower::service_fn(|_req: http::Request<()>| async {
//!     Ok::<_, std::convert::Infallible>(http::Response::new(http_body_util::Empty::<bytes::Bytes>::new()))
//! });
//! let mut svc = tower::ServiceBuilder::new().layer(limiter.layer()).service(hello);
//! let req = || http::Request::get("/v1/rates").header("authorization", "Bearer sk_1").body(()).unwrap();
//!
//! let ok = svc.ready().await.unwrap().call(req()).await.unwrap();
//! assert_eq!(ok.headers()["ratelimit"], r#""burst";r=1;t=1, "daily";r=9999;t=35200"#);
//! svc.ready().await.unwrap().call(req()).await.unwrap();
//! let no = svc.ready().await.unwrap().call(req()).await.unwrap();
//! assert_eq!(no.status(), 429);
//! assert_eq!(no.headers()["retry-after"], "1");
//! # });
//! ```

#![forbid(unsafe_code)]

mod config;
mod escalation;
mod head;
pub mod idempotency;
mod identity;
mod jwt;
mod layer;
mod limiter;
pub mod path;
mod respond;
pub mod route;
mod soft;
mod state;
pub mod telemetry;
pub mod usage;

pub use config::{
    ConfigError, ConfigErrorKind, ConsumerHeaderConfig, IdempotencyConfig, JwtConfig, Limits,
    LimitsBuilder, LimitsConfig, PlanConfig, PolicyConfig, RouteConfig, DEFAULT_PROBLEM_BASE,
    DEFAULT_SOFT_LIMIT, DEFAULT_USAGE_PATH,
};
pub use escalation::{EscalationConfig, Level};
pub use idempotency::{Idempotency, IdempotencyLayer, IdempotencyMode, IdempotencySettings};
pub use identity::{
    bearer_token, client_ip, hashed_key_entry, peer_ip, read_authorization, BasicAuth, ClientCert,
    ConsumerHeaders, Credential, IpNet, IpPrefixes, KeyHash, KeyHasher, KeyLookup, KeySource,
    KeyTreatment, LookedUp, PeerAddr, SecretOrigin, ShortSecret, TrustedProxies,
    MIN_KEY_HASH_SECRET_BYTES,
};
pub use jwt::{Jwt, TokenError, DEFAULT_LEEWAY_S, MAX_JWT_KEY_BYTES, MIN_JWT_SECRET_BYTES};
pub use layer::{
    HttpFuture, RateLimit, RateLimitBody, RateLimitLayer, ReleaseGuard, ResponseFuture,
    RouteWanted, UpstreamFailed,
};
pub use limiter::RateLimiter;
pub use paceline_wire::emit::Dialects;
pub use route::{Criticality, Route, RouteInfo};
pub use soft::{SoftLimitEvent, SoftLimitHook, WARNING_HEADER};
