//! Which requests the layer applies to, and as whom: [`IdempotencyScope`].
//!
//! A scope names the caller and the route a key belongs to, so the same
//! key string from two callers, or from one caller on two routes, is two
//! keys. The layer takes any scope: [`BearerScope`] for a service on its
//! own (the bearer token, else the client address; the route as matched
//! before, else the path), [`LimiterScope`] next to the rate limiter (the
//! identity it counts, and each route's configured mode), or a closure.

use std::net::IpAddr;

use http::request::Parts;
use siphasher::sip128::SipHasher13;

use super::fingerprint::{scope_hasher, EntryKey};
use super::IdempotencyMode;
use crate::identity::{bearer_token, peer_ip};
use crate::{RateLimiter, RouteInfo};

/// A request's scope: whether keys are required or optional, and the
/// caller and route its key belongs to (hashed, nothing kept).
#[derive(Clone, Debug)]
pub struct Scope {
    mode: IdempotencyMode,
    hasher: SipHasher13,
}

impl Scope {
    /// The scope of `caller` on `route`.
    pub fn new(mode: IdempotencyMode, caller: &str, route: &str) -> Scope {
        Scope {
            mode,
            hasher: scope_hasher(caller, route),
        }
    }
    /// Whether a key is required.
    pub fn mode(&self) -> IdempotencyMode {
        self.mode
    }
    /// The store's entry for `key` in this scope.
    pub fn entry(&self, key: &str) -> EntryKey {
        EntryKey::finish(self.hasher, key)
    }
}

/// Says whether the layer applies to a request, and in which scope.
pub trait IdempotencyScope: Clone + Send + Sync + 'static {
    /// The scope of the request with head `parts`; `None` when the layer
    /// leaves it alone.
    fn scope(&self, parts: &Parts) -> Option<Scope>;

    /// The base URI of the problem types the layer answers with now, when
    /// it is not the settings' own (it follows a reloaded configuration).
    fn problem_base(&self) -> Option<String> {
        None
    }
}

impl<F> IdempotencyScope for F
where
    F: Fn(&Parts) -> Option<Scope> + Clone + Send + Sync + 'static,
{
    fn scope(&self, parts: &Parts) -> Option<Scope> {
        self(parts)
    }
}

/// The caller as the request shows it: its bearer token, else its
/// socket peer (from the extensions, else `peer`), else nobody in
/// particular.
fn shown_caller(parts: &Parts, peer: Option<IpAddr>) -> String {
    if let Some(t) = bearer_token(&parts.headers) {
        return format!("key:{t}");
    }
    match peer_ip(&parts.extensions).or(peer) {
        Some(ip) => format!("ip:{ip}"),
        None => String::from("anonymous"),
    }
}

/// The route a request was matched to before (a [`RouteInfo`] in its
/// extensions), else its path.
fn route_of(parts: &Parts) -> &str {
    parts
        .extensions
        .get::<RouteInfo>()
        .and_then(|r| r.pattern.as_deref())
        .unwrap_or_else(|| parts.uri.path())
}

/// Every request, in one mode, scoped by its bearer token (or client
/// address) and its route (or path): for the layer on its own.
#[derive(Clone, Debug)]
pub struct BearerScope {
    mode: IdempotencyMode,
}

impl BearerScope {
    /// Applies to every request, in `mode`.
    pub fn new(mode: IdempotencyMode) -> Self {
        BearerScope { mode }
    }
}

impl IdempotencyScope for BearerScope {
    fn scope(&self, parts: &Parts) -> Option<Scope> {
        Some(Scope::new(
            self.mode,
            &shown_caller(parts, None),
            route_of(parts),
        ))
    }
}

/// The routes the limiter's configuration marks (`idempotency =
/// "required"` or `"optional"`), scoped by the identity the limiter
/// counts (its key, or the client address of an anonymous caller) and
/// the route's pattern. Requests of other routes are left alone.
pub struct LimiterScope<S, C> {
    limiter: RateLimiter<S, C>,
    peer: Option<IpAddr>,
}

impl<S, C> Clone for LimiterScope<S, C> {
    fn clone(&self) -> Self {
        LimiterScope {
            limiter: self.limiter.clone(),
            peer: self.peer,
        }
    }
}

impl<S, C> std::fmt::Debug for LimiterScope<S, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LimiterScope")
            .field("peer", &self.peer)
            .finish_non_exhaustive()
    }
}

impl<S, C> LimiterScope<S, C> {
    /// The scope of `limiter`'s routes and identities.
    pub fn new(limiter: RateLimiter<S, C>) -> Self {
        LimiterScope {
            limiter,
            peer: None,
        }
    }
    /// The same, for one connection whose socket peer is `peer`.
    pub fn with_peer(mut self, peer: std::net::SocketAddr) -> Self {
        self.peer = Some(peer.ip());
        self
    }
}

impl<S, C> IdempotencyScope for LimiterScope<S, C>
where
    S: paceline_core::Store,
    C: paceline_core::Clock,
{
    fn scope(&self, parts: &Parts) -> Option<Scope> {
        // the classification the limit layer in front left, else our own
        let own;
        let route = match parts.extensions.get::<RouteInfo>() {
            Some(r) => r,
            None => {
                own = self
                    .limiter
                    .limits()
                    .classify_parts(&parts.method, parts.uri.path());
                &own
            }
        };
        let mode = route.idempotency?;
        let caller = self
            .limiter
            .caller(parts, route, self.peer)
            .unwrap_or_else(|| shown_caller(parts, self.peer));
        let path = route.pattern.as_deref().unwrap_or_else(|| parts.uri.path());
        Some(Scope::new(mode, &caller, path))
    }

    fn problem_base(&self) -> Option<String> {
        Some(self.limiter.limits().problem_base().to_string())
    }
}
