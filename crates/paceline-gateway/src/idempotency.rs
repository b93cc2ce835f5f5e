//! The idempotency layer of `paceline-server` in the gateway's stack: one
//! layer and one store for the gateway's life, built from the
//! `[idempotency]` settings at start, scoped per connection by the
//! limiter's identities and each route's `idempotency` mode (which
//! reloads with the routes).
//!
//! The store follows the limiter's: in memory, or with `store = "redis"`
//! in Redis on the limiter's connections (entries named under a secret
//! derived from the key-hash secret for this purpose alone), so a retry
//! that lands on another instance finds the first answer.

use std::net::SocketAddr;
use std::sync::Arc;

use paceline_core::{Clock, Nanos, StoreError};
use paceline_server::idempotency::{
    Begin, Completed, Entry, EntryKey, IdempotencyLayer, IdempotencyStore, LimiterScope,
    MemoryIdempotencyStore,
};

use crate::server::GatewayLimiter;
use crate::store::GatewayStore;

/// The layer for one connection.
pub(crate) type ConnIdempotency = IdempotencyLayer<GatewayIdempotencyStore, Arc<dyn Clock>, Scope>;

type Scope = LimiterScope<GatewayStore, Arc<dyn Clock>>;

/// Where the gateway keeps idempotency keys: beside its counters.
#[derive(Clone, Debug)]
pub(crate) enum GatewayIdempotencyStore {
    /// In this process.
    Memory(MemoryIdempotencyStore),
    /// In Redis, shared by every instance on it.
    #[cfg(feature = "redis")]
    Redis(paceline_redis::RedisIdempotencyStore),
}

impl IdempotencyStore for GatewayIdempotencyStore {
    async fn begin(
        &self,
        key: EntryKey,
        head: u64,
        lease: Nanos,
        now: Nanos,
    ) -> Result<Begin, StoreError> {
        match self {
            Self::Memory(m) => m.begin(key, head, lease, now).await,
            #[cfg(feature = "redis")]
            Self::Redis(r) => r.begin(key, head, lease, now).await,
        }
    }

    async fn complete(
        &self,
        key: EntryKey,
        token: u64,
        done: Completed,
        ttl: Nanos,
        now: Nanos,
    ) -> Result<bool, StoreError> {
        match self {
            Self::Memory(m) => m.complete(key, token, done, ttl, now).await,
            #[cfg(feature = "redis")]
            Self::Redis(r) => r.complete(key, token, done, ttl, now).await,
        }
    }

    async fn fetch(&self, key: EntryKey, now: Nanos) -> Result<Option<Entry>, StoreError> {
        match self {
            Self::Memory(m) => m.fetch(key, now).await,
            #[cfg(feature = "redis")]
            Self::Redis(r) => r.fetch(key, now).await,
        }
    }

    async fn release(&self, key: EntryKey, token: u64) -> Result<(), StoreError> {
        match self {
            Self::Memory(m) => m.release(key, token).await,
            #[cfg(feature = "redis")]
            Self::Redis(r) => r.release(key, token).await,
        }
    }

    async fn expire(&self, now: Nanos) -> Result<u64, StoreError> {
        match self {
            Self::Memory(m) => m.expire(now).await,
            #[cfg(feature = "redis")]
            Self::Redis(r) => r.expire(now).await,
        }
    }
}

/// The gateway's idempotency layer, before it knows its connection.
#[derive(Clone)]
pub(crate) struct GatewayIdempotency {
    layer: IdempotencyLayer<GatewayIdempotencyStore, Arc<dyn Clock>, ()>,
    scope: Scope,
}

/// The layer for the gateway of `limiter`: its store in Redis when the
/// limiter's is (answers bounded by the settings, each step cut at
/// `gateway.redis.idempotency_deadline_ms`), else in memory bounded
/// by the settings' `max_store_bytes`; its time the limiter's clock.
pub(crate) fn layer(limiter: &GatewayLimiter) -> GatewayIdempotency {
    let limits = limiter.limits();
    let settings = limits.idempotency().clone();
    let store = match limiter.store() {
        #[cfg(feature = "redis")]
        GatewayStore::Redis(r) => {
            let secret = limits.key_hasher().derive("redis idempotency");
            GatewayIdempotencyStore::Redis(r.idempotency_store(&secret).for_settings(&settings))
        }
        _ => GatewayIdempotencyStore::Memory(MemoryIdempotencyStore::new(settings.max_store_bytes)),
    };
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
