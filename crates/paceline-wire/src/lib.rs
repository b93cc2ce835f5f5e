//! # paceline-wire
//!
//! The rate-limit contract as it travels over HTTP, with no I/O: emit the
//! headers and problem bodies a server publishes, and parse what any server
//! publishes back into one normalised view.
//!
//! Why a separate crate: the server layer, the gateway, the client SDK, the
//! simulator and `paceline inspect` all speak the same wire format, so it is
//! written (and tested, fuzzed and benchmarked) once.
//!
//! - [`emit`]: `RateLimit-Policy` / `RateLimit` (IETF draft, structured
//!   fields), the older `X-RateLimit-*` and draft-03 fields, `Retry-After`;
//!   and [`emit::PreparedPlan`], the same made ready once per plan for a
//!   server's hot path.
//! - [`problem`]: RFC 9457 problem bodies for every answer the project
//!   sends with one, and the one writer of such an answer.
//! - [`usage`]: the usage document (`GET /v1/usage`), written by the server
//!   and read by the client.
//! - [`time`]: RFC 3339 and HTTP dates, written and read.
//! - [`ip`]: client addresses as header text.
//! - [`parse`]: every common dialect, `Retry-After` in all its forms, vendor
//!   retry hints and the problem body, into a [`parse::ResponseView`].
//! - [`raw`]: a raw HTTP/1.x response as text (`curl -i`, `curl -v`, a
//!   capture) split into status, headers and body.
//!
//! ## The parts
//!
//! ```text
//!  server side (emit)                          client side (parse)
//!  ──────────────────                          ───────────────────
//!  emit/prepared.rs  PreparedPlan: the        parse/mod.rs   parse_response:
//!    │  plan's fields and 429, made once        │  one ResponseView from any
//!    ├─► emit/mod.rs      RateLimit(-Policy)    ├─► parse/ietf.rs   RateLimit,
//!    ├─► emit/dialects.rs X-RateLimit-*,        │     RateLimit-Policy, drafts
//!    │     draft-03, the binding policy         ├─► parse/vendor.rs GitHub,
//!    └─► problem/        the one problem         │     Discord, Shopify, OpenAI…
//!          kind.rs  every answer's code,         ├─► parse/body.rs  problem+json
//!                   status and title             └─► parse/time.rs  resets ──┐
//!          write.rs the one writer                                          │
//!  usage.rs  the usage document, both ways     time.rs  dates, both ways ◄─┘
//!  ip.rs     addresses as header text          raw.rs   a raw response as text
//! ```
//!
//! ## A 429, inside this crate
//!
//! The server's limiter hands a denial to [`emit::PreparedPlan::rejection`]
//! (`emit/prepared.rs`): the plan's prepared head is copied, its
//! `RateLimit` value is written into a stack buffer, `Retry-After` comes
//! from a table of small numbers, the older dialects are added when the
//! deployment asks for them (`emit/dialects.rs`), and the body is the
//! policy's prepared problem (made once from `problem/kind.rs` and
//! `problem/mod.rs`) with the wait and the violated policies spliced in.
//! Every other answer with a problem body goes through
//! [`problem::answer`] (`problem/write.rs`).
//!
//! ```
//! use paceline_core::{Limiter, ManualClock, MemoryStore, Nanos, Plan, Policy};
//! use paceline_wire::{emit, parse};
//!
//! let plan = Plan::new("free", vec![
//!     Policy::token_bucket("burst", 20, 2).unwrap(),
//!     Policy::daily("daily", 10_000).unwrap(),
//! ]).unwrap();
//! let clock = ManualClock::at_unix_secs(1_790_000_000);
//! let limiter = Limiter::new(MemoryStore::new(), clock.clone());
//! let mut last = None;
//! for _ in 0..21 {
//!     last = Some(limiter.check_sync(&plan, "key", 1).unwrap());
//! }
//! let d = last.unwrap();
//! let mut headers = http::HeaderMap::new();
//! emit::write_headers(&plan, &d, &emit::Dialects::default(), &mut headers);
//!
//! let view = parse::parse_response(429, &headers, None, Nanos::from_secs(1_790_000_000));
//! assert_eq!(view.outcome, parse::OutcomeKind::RateLimited);
//! assert!(view.retry);
//! assert_eq!(view.retry_after, Some(Nanos::SECOND));
//! ```

#![forbid(unsafe_code)]

pub mod emit;
pub mod ip;
pub mod parse;
pub mod problem;
pub mod raw;
pub mod time;
pub mod usage;

pub use emit::Dialects;
/// The `http` crate whose `HeaderMap` the emitters and parsers use.
pub use http;
pub use parse::{parse_response, parse_retry_after, OutcomeKind, PolicyView, ResponseView};
pub use problem::{Problem, ProblemKind, PROBLEM_CONTENT_TYPE};
