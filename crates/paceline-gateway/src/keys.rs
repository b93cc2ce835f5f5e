//! API keys looked up in Redis (`[gateway.keys_redis]`), before the
//! limit layer.
//!
//! Why before: the limiter decides from the request head synchronously,
//! and a Redis round trip is not. So a step in front of it reads the key
//! the way the limiter will ([`Limits::unlisted_key`]: only a key the
//! file does not list), finds its plan in a bounded cache or, past the
//! cache's time, with one `HGET` on the Redis store's connections, and
//! hands the answer to the limiter as a [`KeyLookup`] in the request's
//! extensions, which the limiter honours for that very key (the way a
//! TLS acceptor hands it a `ClientCert`).
//!
//! - An answer, found or not, is used for `ttl_s`: a key added to the hash
//!   is admitted, and one removed from it refused, within that time.
//! - When Redis does not answer within the store's deadline, a cached
//!   answer up to `stale_s` past its time is used; with none, the request
//!   gets the configured treatment: `503` with a problem body (`reject`,
//!   the default: fail closed), or read as a key not listed (`unknown`).
//! - Keys found and keys not found are cached apart, each up to
//!   `cache_size` (the oldest answer goes first), so a flood of made-up
//!   keys costs a lookup each but never pushes out the real ones. A key
//!   longer than [`MAX_LOOKUP_KEY`] bytes is never looked up.
//! - Time is the gateway's clock (the limiter's), never the system's.
//!
//! With no `[gateway.keys_redis]` the step passes every request on as it
//! is: one test per request, no allocation.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use paceline_server::RouteInfo;
use tower_service::Service;

use crate::server::GatewayLimiter;
use crate::shed::CallClassified;

/// The longest key looked up in Redis, in bytes: a longer one is read as
/// not found without asking (real keys are far shorter, and the cache
/// holds each key it is asked about).
pub const MAX_LOOKUP_KEY: usize = 256;

/// The step's shared state: none without `[gateway.keys_redis]`.
#[derive(Clone, Default)]
pub(crate) struct Keys(Option<Arc<imp::KeysRedis>>);

impl Keys {
    /// The lookup `settings` describe, on `store`'s connections, timed by
    /// `limiter`'s clock.
    pub(crate) fn new(
        settings: Option<&crate::config::KeysRedisSettings>,
        store: &crate::store::GatewayStore,
        limiter: &GatewayLimiter,
    ) -> Keys {
        Keys(imp::KeysRedis::new(settings, store, limiter).map(Arc::new))
    }

    /// `inner` behind this step.
    pub(crate) fn layer<S>(&self, inner: S) -> Resolve<S> {
        Resolve {
            inner,
            keys: self.0.clone(),
        }
    }
}

/// The step as a service: a [`KeyLookup`](paceline_server::KeyLookup) in
/// the request, then `inner` (the limit layer).
#[derive(Clone)]
pub(crate) struct Resolve<S> {
    inner: S,
    keys: Option<Arc<imp::KeysRedis>>,
}

pin_project_lite::pin_project! {
    /// The future of [`Resolve`]: the inner call as it is, or the lookup
    /// and then the inner call. (Typed by the inner future alone: a
    /// second type parameter for its output trips the compiler's proof
    /// that a connection's task is `Send`.)
    #[project = ResolvedProj]
    pub(crate) enum Resolved<F>
    where
        F: Future,
    {
        /// Nothing to look up, or the answer cached: the inner call.
        Now { #[pin] call: F },
        /// Redis asked first.
        Later { call: Pin<Box<dyn Future<Output = F::Output> + Send + 'static>> },
    }
}

impl<F: Future> Future for Resolved<F> {
    type Output = F::Output;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            ResolvedProj::Now { call } => call.poll(cx),
            ResolvedProj::Later { call } => call.as_mut().poll(cx),
        }
    }
}

/// What the step does with one request.
enum Step<B> {
    /// On at once (with its lookup, if one was cached).
    Now(Request<B>),
    /// Redis first.
    Ask(Request<B>, Arc<imp::KeysRedis>, String),
}

impl<S> Resolve<S> {
    fn step<B>(&self, mut req: Request<B>) -> Step<B> {
        let Some(keys) = &self.keys else {
            return Step::Now(req);
        };
        match keys.cached(req.headers()) {
            imp::Cached::Nothing => Step::Now(req),
            imp::Cached::Fresh(lookup) => {
                req.extensions_mut().insert(lookup);
                Step::Now(req)
            }
            imp::Cached::Ask(key) => Step::Ask(req, keys.clone(), key),
        }
    }
}

impl<S, B, T> Service<Request<B>> for Resolve<S>
where
    S: Service<Request<B>, Response = Response<T>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Send + 'static,
    T: Send + 'static,
{
    type Response = Response<T>;
    type Error = S::Error;
    type Future = Resolved<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        match self.step(req) {
            Step::Now(req) => Resolved::Now {
                call: self.inner.call(req),
            },
            Step::Ask(mut req, keys, key) => {
                // the one polled ready serves this call
                let clone = self.inner.clone();
                let mut inner = std::mem::replace(&mut self.inner, clone);
                Resolved::Later {
                    call: Box::pin(async move {
                        let lookup = keys.fetch(key).await;
                        req.extensions_mut().insert(lookup);
                        inner.call(req).await
                    }),
                }
            }
        }
    }
}

impl<S, B, T> CallClassified<B> for Resolve<S>
where
    S: CallClassified<B, Response = Response<T>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Send + 'static,
    T: Send + 'static,
{
    fn call_classified(&mut self, req: Request<B>, route: RouteInfo) -> Self::Future {
        match self.step(req) {
            Step::Now(req) => Resolved::Now {
                call: self.inner.call_classified(req, route),
            },
            Step::Ask(mut req, keys, key) => {
                let clone = self.inner.clone();
                let mut inner = std::mem::replace(&mut self.inner, clone);
                Resolved::Later {
                    call: Box::pin(async move {
                        let lookup = keys.fetch(key).await;
                        req.extensions_mut().insert(lookup);
                        inner.call_classified(req, route).await
                    }),
                }
            }
        }
    }

    fn standing(&self, req: &Request<B>, route: &RouteInfo) -> Option<http::HeaderMap> {
        self.inner.standing(req, route)
    }

    fn call_shared(&self, req: Request<B>, route: Option<RouteInfo>) -> Self::Future {
        if self.keys.is_none() {
            // no lookup: the request goes on as it is, not through `step`
            // (a few hundred bytes copied in and out)
            return Resolved::Now {
                call: self.inner.call_shared(req, route),
            };
        }
        match self.step(req) {
            Step::Now(req) => Resolved::Now {
                call: self.inner.call_shared(req, route),
            },
            Step::Ask(mut req, keys, key) => {
                let inner = self.inner.clone();
                Resolved::Later {
                    call: Box::pin(async move {
                        let lookup = keys.fetch(key).await;
                        req.extensions_mut().insert(lookup);
                        inner.call_shared(req, route).await
                    }),
                }
            }
        }
    }
}

#[cfg(feature = "redis")]
mod imp {
    use std::collections::{HashMap, VecDeque};
    use std::sync::Arc;

    use paceline_core::{Clock, Nanos};
    use paceline_server::{KeyLookup, LookedUp};
    use parking_lot::Mutex;

    use crate::config::{KeysRedisSettings, KeysUnavailable};
    use crate::server::GatewayLimiter;

    /// What the cache tells of a request's key.
    pub(crate) enum Cached {
        /// No key to look up (none sent, or one the file lists).
        Nothing,
        /// An answer within its time.
        Fresh(KeyLookup),
        /// Redis must be asked about this key.
        Ask(String),
    }

    pub(crate) struct KeysRedis {
        settings: KeysRedisSettings,
        store: paceline_redis::RedisStore,
        limiter: GatewayLimiter,
        found: Mutex<Cache>,
        missing: Mutex<Cache>,
    }

    impl KeysRedis {
        pub(crate) fn new(
            settings: Option<&KeysRedisSettings>,
            store: &crate::store::GatewayStore,
            limiter: &GatewayLimiter,
        ) -> Option<KeysRedis> {
            let settings = settings?;
            let crate::store::GatewayStore::Redis(store) = store else {
                // the configuration makes sure of a Redis store
                tracing::error!("gateway.keys_redis without a Redis store: keys are not looked up");
                return None;
            };
            Some(KeysRedis {
                found: Mutex::new(Cache::new(settings.cache_size)),
                missing: Mutex::new(Cache::new(settings.cache_size)),
                settings: settings.clone(),
                store: store.clone(),
                limiter: limiter.clone(),
            })
        }

        fn now(&self) -> Nanos {
            self.limiter.clock().now()
        }

        /// The cached answer for the key `headers` send, if one is in
        /// its time; else whether Redis must be asked.
        pub(crate) fn cached(&self, headers: &http::HeaderMap) -> Cached {
            let Some(key) = self.limiter.limits().unlisted_key(headers) else {
                return Cached::Nothing;
            };
            if key.len() > super::MAX_LOOKUP_KEY {
                return Cached::Fresh(lookup(&key, LookedUp::NotFound));
            }
            let ttl = Nanos::from_duration(self.settings.ttl);
            match self.entry(&key, self.now(), ttl) {
                Some(found) => Cached::Fresh(lookup(&key, found)),
                None => Cached::Ask(key),
            }
        }

        /// The answer cached for `key` no older than `within`.
        fn entry(&self, key: &str, now: Nanos, within: Nanos) -> Option<LookedUp> {
            let young = |at: Nanos| now.saturating_sub(at) < within;
            if let Some((plan, at)) = self.found.lock().get(key) {
                if young(at) {
                    return Some(LookedUp::Plan(plan?));
                }
            }
            match self.missing.lock().get(key) {
                Some((_, at)) if young(at) => Some(LookedUp::NotFound),
                _ => None,
            }
        }

        /// Asks Redis about `key`: what it says (and the cache keeps), or
        /// what a Redis that does not answer leaves.
        pub(crate) async fn fetch(&self, key: String) -> KeyLookup {
            let s = &self.settings;
            let asked = self.now();
            let field = match s.hashed_fields {
                true => paceline_server::hashed_key_entry(&key)["sha256:".len()..].to_string(),
                false => key.clone(),
            };
            let key: Arc<str> = Arc::from(key);
            let found = match self.store.hget(&s.hash, &field).await {
                Ok(Some(plan)) => {
                    let plan: Arc<str> = Arc::from(plan.trim());
                    self.missing.lock().remove(&key);
                    self.found
                        .lock()
                        .put(key.clone(), Some(plan.clone()), asked);
                    outcome("found");
                    LookedUp::Plan(plan)
                }
                Ok(None) => {
                    self.found.lock().remove(&key);
                    self.missing.lock().put(key.clone(), None, asked);
                    outcome("not_found");
                    LookedUp::NotFound
                }
                Err(e) => {
                    let within = Nanos::from_duration(s.ttl.saturating_add(s.stale));
                    match self.entry(&key, self.now(), within) {
                        Some(stale) => {
                            outcome("stale");
                            tracing::debug!(error = %e, "key lookup: Redis did not answer; a cached answer serves");
                            stale
                        }
                        None => {
                            outcome("unavailable");
                            tracing::warn!(error = %e, "key lookup: Redis did not answer and nothing is cached");
                            match s.unavailable {
                                KeysUnavailable::Unknown => LookedUp::NotFound,
                                _ => LookedUp::Unavailable,
                            }
                        }
                    }
                }
            };
            KeyLookup { key, found }
        }
    }

    fn lookup(key: &str, found: LookedUp) -> KeyLookup {
        KeyLookup {
            key: Arc::from(key),
            found,
        }
    }

    fn outcome(o: &'static str) {
        metrics::counter!(crate::metrics::KEY_LOOKUPS, "outcome" => o).increment(1);
    }

    /// A bounded map of answers, the oldest put out first.
    pub(crate) struct Cache {
        map: HashMap<Arc<str>, Entry>,
        /// Puts in order (a key put again is here twice; the stale one is
        /// skipped by its sequence number).
        order: VecDeque<(Arc<str>, u64)>,
        seq: u64,
        cap: usize,
    }

    struct Entry {
        plan: Option<Arc<str>>,
        at: Nanos,
        seq: u64,
    }

    impl Cache {
        pub(crate) fn new(cap: usize) -> Cache {
            Cache {
                map: HashMap::new(),
                order: VecDeque::new(),
                seq: 0,
                cap: cap.max(1),
            }
        }

        /// The plan and when it was asked, for `key`.
        pub(crate) fn get(&self, key: &str) -> Option<(Option<Arc<str>>, Nanos)> {
            self.map.get(key).map(|e| (e.plan.clone(), e.at))
        }

        pub(crate) fn remove(&mut self, key: &str) {
            self.map.remove(key);
        }

        pub(crate) fn put(&mut self, key: Arc<str>, plan: Option<Arc<str>>, at: Nanos) {
            self.seq += 1;
            let seq = self.seq;
            self.order.push_back((key.clone(), seq));
            self.map.insert(key, Entry { plan, at, seq });
            while self.map.len() > self.cap {
                let Some((k, s)) = self.order.pop_front() else {
                    break;
                };
                if self.map.get(&k).is_some_and(|e| e.seq == s) {
                    self.map.remove(&k);
                }
            }
            // the order keeps at most one stale place per live entry
            if self.order.len() > 2 * self.cap + 16 {
                let map = &self.map;
                self.order
                    .retain(|(k, s)| map.get(k).is_some_and(|e| e.seq == *s));
            }
        }

        #[cfg(test)]
        pub(crate) fn len(&self) -> (usize, usize) {
            (self.map.len(), self.order.len())
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            /// Whatever is put, the cache holds at most its bound, its
            /// order stays bounded, and the last answer put for a key it
            /// holds is the one it gives.
            #[test]
            fn the_cache_stays_bounded_and_gives_the_last_answer(
                cap in 1usize..8,
                puts in proptest::collection::vec((0u8..12, any::<bool>()), 0..200),
            ) {
                let mut c = Cache::new(cap);
                let mut last: HashMap<u8, bool> = HashMap::new();
                for (i, (k, found)) in puts.iter().enumerate() {
                    let key: Arc<str> = Arc::from(k.to_string());
                    let plan = found.then(|| Arc::from("p"));
                    c.put(key, plan, Nanos::new(i as u64));
                    last.insert(*k, *found);
                    let (len, order) = c.len();
                    prop_assert!(len <= cap);
                    prop_assert!(order <= 2 * cap + 17);
                }
                for (k, found) in last {
                    if let Some((plan, _)) = c.get(&k.to_string()) {
                        prop_assert_eq!(plan.is_some(), found);
                    }
                }
                // the newest put is always there
                if let Some((k, found)) = puts.last() {
                    let (plan, _) = c.get(&k.to_string()).expect("the newest stays");
                    prop_assert_eq!(plan.is_some(), *found);
                }
            }
        }
    }
}

#[cfg(not(feature = "redis"))]
mod imp {
    use paceline_server::KeyLookup;

    use crate::server::GatewayLimiter;

    /// What the cache tells of a request's key (never made here).
    #[allow(dead_code)]
    pub(crate) enum Cached {
        Nothing,
        Fresh(KeyLookup),
        Ask(String),
    }

    /// Without Redis there is nothing to look keys up in (the
    /// configuration refuses `[gateway.keys_redis]` in such a build).
    pub(crate) enum KeysRedis {}

    impl KeysRedis {
        pub(crate) fn new(
            _: Option<&crate::config::KeysRedisSettings>,
            _: &crate::store::GatewayStore,
            _: &GatewayLimiter,
        ) -> Option<KeysRedis> {
            None
        }
        pub(crate) fn cached(&self, _: &http::HeaderMap) -> Cached {
            match *self {}
        }
        pub(crate) async fn fetch(&self, _: String) -> KeyLookup {
            match *self {}
        }
    }
}
