//! [`RateLimitLayer`]: the tower `Layer` that wraps a service in
//! [`RateLimit`], so a `ServiceBuilder` can stack it like any other.

use std::fmt;

use tower_layer::Layer;

use super::RateLimit;
use crate::RateLimiter;

/// Wraps a service in [`RateLimit`]; built by [`RateLimiter::layer`].
pub struct RateLimitLayer<S, C> {
    limiter: RateLimiter<S, C>,
}

impl<S, C> RateLimitLayer<S, C> {
    /// A layer enforcing `limiter`.
    pub fn new(limiter: RateLimiter<S, C>) -> Self {
        RateLimitLayer { limiter }
    }
}

impl<S, C> Clone for RateLimitLayer<S, C> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            limiter: self.limiter.clone(),
        }
    }
}

impl<S, C> fmt::Debug for RateLimitLayer<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer").finish_non_exhaustive()
    }
}

impl<I, S, C> Layer<I> for RateLimitLayer<S, C> {
    type Service = RateLimit<I, S, C>;
    fn layer(&self, inner: I) -> Self::Service {
        RateLimit::new(inner, self.limiter.clone())
    }
}
