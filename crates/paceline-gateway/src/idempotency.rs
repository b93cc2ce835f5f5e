//! The idempotency layer of `paceline-server` in the gateway's stack: one
//! layer and one in-memory store for the gateway's life, built from the
//! `[idempotency]` settings at start, scoped per connection by the
//! limiter's identities and each route's `idempotency` mode (which
//! reloads with the routes).

use std::net::SocketAddr;
use std::sync::Arc;

use paceline_core::Clock;
use paceline_server::idempotency::{IdempotencyLayer, LimiterScope, MemoryIdempotencyStore};

use crate::server::GatewayLimiter;
use crate::store::GatewayStore;

/// The layer for one connection.
pub(crate) type ConnIdempotency = IdempotencyLayer<MemoryIdempotencyStore, Arc<dyn Clock>, Scope>;

type Scope = LimiterScope<GatewayStore, Arc<dyn Clock>>;

/// The gateway's idempotency layer, before it knows its connection.
#[derive(Clone)]
pub(crate) struct GatewayIdempotency {
    layer: IdempotencyLayer<MemoryIdempotencyStore, Arc<dyn Clock>, ()>,
    scope: Scope,
}

/// The layer for the gateway of `limiter`: its store bounded by the
/// settings' `max_store_bytes`, its time the limiter's clock.
pub(crate) fn layer(limiter: &GatewayLimiter) -> GatewayIdempotency {
    let settings = limiter.limits().idempotency().clone();
    let store = MemoryIdempotencyStore::new(settings.max_store_bytes);
    GatewayIdempotency {
        layer: IdempotencyLayer::new(store, limiter.clock().clone(), (), settings),
        scope: LimiterScope::new(limiter.clone()),
    }
}

impl GatewayIdempotency {
    /// The layer for the connection from `peer`.
    pub(crate) fn for_peer(&self, peer: SocketAddr) -> ConnIdempotency {
        self.layer.with_scope(self.scope.clone().with_peer(peer))
    }
}
