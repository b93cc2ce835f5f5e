//! The rate-limit layer.
//!
//! Why a layer that answers by itself: a rejection is worth making only if
//! it is much cheaper than the work it refuses. [`RateLimit`] decides from
//! the request head (key, route, cost) before the inner service is called
//! and without touching the request body; a rejected request's body is
//! dropped unread, so on HTTP/1.1 the response carries `Connection: close`
//! (hyper then closes instead of reading what the client is still
//! sending), and on HTTP/2 the stream is reset after the answer.
//!
//! Every response of a key that publishes counters carries
//! `RateLimit-Policy` and `RateLimit` (and the older dialects when
//! configured); every rejection carries a problem+json body,
//! `Cache-Control: no-store` and, for 429, `Retry-After`.
//!
//! The request's classification by route (cost, criticality) is a
//! [`RouteInfo`](crate::RouteInfo), made once: a layer before this one
//! that needs it (a load shedder) makes it with
//! [`Limits::classify`](crate::Limits::classify) and inserts it into the
//! request's extensions or hands it over with
//! [`RateLimit::call_classified`], and this layer uses it instead of
//! matching the routes again; without one, this layer classifies by
//! itself. A request it lets through carries the classification its
//! decision was made with, for the handlers after it.
//!
//! An inner service that answers for an upstream whose answer never came
//! (a proxy's own `502` or `504`) marks its response with
//! [`UpstreamFailed`], saying whether the request had reached the
//! upstream. One that never left (the connection refused, none to be
//! had) has its charge given back ([`paceline_core::Store::refund`])
//! unless its plan says `charge_upstream_failures = true`; one whose head
//! was sent keeps its charge, since the upstream may have done the work,
//! unless its plan says `refund_sent_failures = true`.

mod body;
#[allow(clippy::module_inception)]
mod layer;
mod service;

pub use body::{RateLimitBody, ReleaseGuard};
pub use layer::RateLimitLayer;
pub use service::{RateLimit, ResponseFuture, RouteWanted};

/// A future of an HTTP response or an error, naming the response's body
/// and the error as its own types; every such future is one.
///
/// The futures of the layers here that wrap an inner service's future
/// (and hold an answer of their own or a box beside it) take their body
/// and error types from it through this trait rather than as parameters
/// of their own: a future that named them separately would not be
/// provably `Send` inside a task whose types hold trait objects (a boxed
/// body's error, say).
pub trait HttpFuture:
    std::future::Future<Output = Result<http::Response<Self::Body>, Self::Error>>
{
    /// The response's body.
    type Body;
    /// The error.
    type Error;
}

impl<F, B, E> HttpFuture for F
where
    F: std::future::Future<Output = Result<http::Response<B>, E>>,
{
    type Body = B;
    type Error = E;
}

/// Marks, in a response's extensions, an answer an inner service wrote
/// itself because the upstream's answer never came, and says whether the
/// request had reached the upstream: the limit layer gives the charge of
/// one that never did back (unless its plan charges upstream failures),
/// and keeps that of one that did (unless its plan refunds those too).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum UpstreamFailed {
    /// Nothing of the request reached the upstream: no connection could
    /// be had, or it failed before the whole head was written.
    NeverSent,
    /// The head was sent, and then the answer failed (timed out, broke
    /// the protocol, was too large): the upstream may have done the work.
    AfterSending,
    /// A stage after the limit layer shed the request for load before it
    /// went anywhere (`503 overloaded`): the client did nothing wrong,
    /// and the charge goes back whatever the plan says.
    Shed,
}
