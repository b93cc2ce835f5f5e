//! `ShouldRateLimit`: a request's descriptors to their rules, the rules to
//! the store, the decisions to Envoy's answer.
//!
//! Why not envoyproxy/ratelimit's way: it charges every descriptor's
//! counter and answers `OVER_LIMIT` if any is over, so a request refused
//! by one limit still spends the others. Here a request is admitted only
//! if every rule admits it; a refused request gives back what it was
//! charged, so it spends nothing.

use std::future::Future;
use std::sync::Arc;

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use paceline_core::{Clock, Cost, FailMode, Nanos, Store};
use tonic::{Request, Response, Status};

use crate::answer::{self, Item, State, Verdict};
use crate::config::{Limit, RlsConfig};
use crate::metrics::{self, Took};

/// The problem `type` base of the service's answers.
pub const DEFAULT_PROBLEM_BASE: &str = "https://paceline.invalid/problems/";

/// Envoy's rate-limit service over a [`Store`] (memory or Redis) and a
/// [`Clock`]. Clones share everything; [`RlsService::reload`] swaps the
/// rules and keeps every counter whose rule kept its name and algorithm.
pub struct RlsService<S, C> {
    shared: Arc<Shared<S, C>>,
}

impl<S, C> Clone for RlsService<S, C> {
    fn clone(&self) -> Self {
        RlsService {
            shared: self.shared.clone(),
        }
    }
}

impl<S, C> std::fmt::Debug for RlsService<S, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RlsService").finish_non_exhaustive()
    }
}

struct Shared<S, C> {
    config: ArcSwap<RlsConfig>,
    store: S,
    clock: C,
    problem_base: String,
    /// On the memory store, a request holds the stripes of its keys while
    /// it decides, so that no other request sees a charge that a refusal
    /// is about to give back: all or nothing, as one step.
    stripes: Box<[tokio::sync::Mutex<()>]>,
}

/// Stripes of keys (a power of two).
const STRIPES: usize = 256;

fn stripe(key: &str) -> usize {
    use std::hash::{BuildHasher, BuildHasherDefault};
    let h =
        BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default().hash_one(key);
    (h as usize) & (STRIPES - 1)
}

impl<S: Store, C: Clock> RlsService<S, C> {
    /// A service deciding `config`'s rules over `store`, on `clock`'s time.
    pub fn new(config: RlsConfig, store: S, clock: C) -> Self {
        RlsService::with_problem_base(config, store, clock, DEFAULT_PROBLEM_BASE)
    }

    /// As [`RlsService::new`], with problem types under `base`.
    pub fn with_problem_base(config: RlsConfig, store: S, clock: C, base: &str) -> Self {
        RlsService {
            shared: Arc::new(Shared {
                config: ArcSwap::from_pointee(config),
                store,
                clock,
                problem_base: base.to_string(),
                stripes: (0..STRIPES).map(|_| tokio::sync::Mutex::new(())).collect(),
            }),
        }
    }

    /// Swaps in new rules; the counters stay in the store.
    pub fn reload(&self, config: RlsConfig) {
        self.shared.config.store(Arc::new(config));
    }

    /// The rules in force.
    pub fn config(&self) -> Arc<RlsConfig> {
        self.shared.config.load_full()
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.shared.store
    }

    /// The gRPC service, for a tonic server.
    pub fn server(&self) -> RateLimitServiceServer<Self> {
        RateLimitServiceServer::new(self.clone())
    }

    /// Decides one request, as `ShouldRateLimit` answers it.
    pub async fn decide(&self, req: &RateLimitRequest) -> Result<RateLimitResponse, Status> {
        if req.domain.is_empty() {
            return Err(Status::invalid_argument(
                "rate limit domain must not be empty",
            ));
        }
        if req.descriptors.is_empty() {
            return Err(Status::invalid_argument(
                "rate limit descriptor list must not be empty",
            ));
        }
        let sh = &*self.shared;
        let config = sh.config.load_full();
        let now = sh.clock.now();
        let n = req.descriptors.len();
        let Some(domain) = config.domain(&req.domain) else {
            return Ok(answer::response(n, &[], Verdict::Ok, now, &sh.problem_base));
        };
        let mut items = matched(domain, req);
        let verdict = self
            .evaluate(&mut items, domain.fail_mode(), domain.name(), now)
            .await;
        for (i, it) in items.iter().enumerate() {
            metrics::record(
                domain.name(),
                &it.m.metric_key,
                it.cost,
                took(it, i, verdict),
            );
        }
        Ok(answer::response(n, &items, verdict, now, &sh.problem_base))
    }

    /// Asks the store for every rule that counts; a refused request then
    /// gets its charges back and the standing of the rules not asked.
    async fn evaluate(
        &self,
        items: &mut [Item],
        fail: FailMode,
        domain: &str,
        now: Nanos,
    ) -> Verdict {
        let store = &self.shared.store;
        // in this process's memory, the whole request is one step: its
        // keys' stripes held, in one order, until it is decided
        let mut held = Vec::new();
        if store.memory().is_some() {
            let mut ids: Vec<usize> = items.iter().map(|it| stripe(&it.m.store_key)).collect();
            ids.sort_unstable();
            ids.dedup();
            for i in ids {
                held.push(self.shared.stripes[i].lock().await);
            }
        }
        for it in items.iter_mut() {
            it.state = match it.m.rule.limit {
                Limit::Unlimited => State::Unlimited,
                Limit::Blocked => State::Blocked,
                Limit::Plan(_) => State::Unknown,
            };
        }
        self.give_negative_hits(items, now).await;
        // a rule that admits nothing refuses before any store is asked
        let mut verdict = items
            .iter()
            .position(Item::refuses)
            .map_or(Verdict::Ok, Verdict::Over);
        // what this process can answer at once (the memory store always;
        // Redis for a key its deny cache holds), one rule after another,
        // stopping at the first refusal; the rest asked of the store
        // together, so a request costs one round trip, not one per rule
        let mut remote = Vec::new();
        if verdict == Verdict::Ok {
            for (i, it) in items.iter_mut().enumerate() {
                let Limit::Plan(plan) = &it.m.rule.limit else {
                    continue;
                };
                if it.negative {
                    continue;
                }
                let (key, cost) = (&it.m.store_key, Cost::requests(it.cost));
                match store.check_local(plan, key, cost, now) {
                    Some(r) => verdict = settle(it, i, r, fail, domain),
                    None => remote.push(i),
                }
                if verdict != Verdict::Ok {
                    break;
                }
            }
        }
        if verdict == Verdict::Ok && !remote.is_empty() {
            let asked = join_all(remote.iter().map(|&i| {
                let it = &items[i];
                let Limit::Plan(plan) = &it.m.rule.limit else {
                    unreachable!("only rules with a plan are asked");
                };
                store.check_cost(plan, &it.m.store_key, Cost::requests(it.cost), now)
            }))
            .await;
            for (&i, r) in remote.iter().zip(asked) {
                let v = settle(&mut items[i], i, r, fail, domain);
                // the first refusal in the request's order decides
                if verdict == Verdict::Ok {
                    verdict = v;
                }
            }
        }
        if verdict != Verdict::Ok {
            self.give_back(items, verdict, now).await;
        }
        drop(held);
        verdict
    }

    /// `is_negative_hits`: the hits go back to the rule (as a refund of a
    /// charge made now: a window's count, a bucket's tokens), whatever the
    /// other descriptors say; the rule is then read for the answer.
    async fn give_negative_hits(&self, items: &mut [Item], now: Nanos) {
        let store = &self.shared.store;
        for it in items.iter_mut().filter(|it| it.negative) {
            let Limit::Plan(plan) = &it.m.rule.limit else {
                continue;
            };
            let key = &it.m.store_key;
            if let Err(e) = store
                .refund(plan, key, Cost::requests(it.cost), now, now)
                .await
            {
                tracing::warn!(error = %e, "negative hits not given back");
            }
            let read = match store.check_local(plan, key, Cost::requests(0), now) {
                Some(r) => r,
                None => store.check_cost(plan, key, Cost::requests(0), now).await,
            };
            if let Ok(d) = read {
                it.state = State::Decided(d);
            }
        }
    }

    /// A refused request: what it was charged goes back, and the rules
    /// not asked are read (without a charge) for the answer's fields; the
    /// refunds together, then the reads together (at most two rounds).
    async fn give_back(&self, items: &mut [Item], verdict: Verdict, now: Nanos) {
        let store = &self.shared.store;
        let plan = |it: &Item| match &it.m.rule.limit {
            Limit::Plan(p) => Some(p.clone()),
            _ => None,
        };
        let charged: Vec<usize> = (0..items.len())
            .filter(|&i| Verdict::Over(i) != verdict && was_charged(&items[i]))
            .collect();
        let refunds = join_all(charged.iter().filter_map(|&i| {
            let it = &items[i];
            let p = plan(it)?;
            let cost = Cost::requests(it.cost);
            Some(async move { store.refund(&p, &it.m.store_key, cost, now, now).await })
        }))
        .await;
        for (&i, r) in charged.iter().zip(refunds) {
            let it = &mut items[i];
            let (Some(p), State::Decided(d)) = (plan(it), &mut it.state) else {
                continue;
            };
            match r {
                Ok(()) => {
                    let st = &mut d.statuses[0];
                    st.remaining = (st.remaining + it.cost).min(p.policy(0).quota());
                }
                Err(e) => {
                    tracing::warn!(error = %e, "giving a refused request's charge back failed")
                }
            }
        }
        if verdict == Verdict::Unavailable {
            return;
        }
        let unknown: Vec<usize> = (0..items.len())
            .filter(|&i| matches!(items[i].state, State::Unknown) && plan(&items[i]).is_some())
            .collect();
        let reads = join_all(unknown.iter().filter_map(|&i| {
            let it = &items[i];
            let p = plan(it)?;
            Some(async move {
                match store.peek_local(&p, &it.m.store_key, now) {
                    Some(d) => Ok(d),
                    None => {
                        store
                            .check_cost(&p, &it.m.store_key, Cost::requests(0), now)
                            .await
                    }
                }
            })
        }))
        .await;
        for (&i, r) in unknown.iter().zip(reads) {
            if let Ok(d) = r {
                items[i].state = State::Decided(d);
            }
        }
    }
}

/// Whether the store charged this item (admitted by a rule that counts).
fn was_charged(it: &Item) -> bool {
    match &it.state {
        State::Decided(d) => {
            d.is_allowed() && !d.statuses[0].would_deny && !it.m.rule.shadow && !it.negative
        }
        _ => false,
    }
}

/// Takes the store's answer for item `i`: the verdict it makes alone.
fn settle(
    it: &mut Item,
    i: usize,
    r: Result<paceline_core::Decision, paceline_core::StoreError>,
    fail: FailMode,
    domain: &str,
) -> Verdict {
    match r {
        Ok(d) => {
            it.state = State::Decided(d);
            match it.refuses() {
                true => Verdict::Over(i),
                false => Verdict::Ok,
            }
        }
        Err(e) => {
            metrics::store_error(domain);
            tracing::warn!(domain, error = %e, "rate-limit store failed");
            match fail {
                FailMode::Closed => Verdict::Unavailable,
                _ => Verdict::Ok,
            }
        }
    }
}

/// Runs every future at once on this task; their outputs in order.
async fn join_all<F: Future>(futures: impl Iterator<Item = F>) -> Vec<F::Output> {
    let mut futures: Vec<_> = futures.map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, o) in futures.iter_mut().zip(out.iter_mut()) {
            if o.is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => *o = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        match pending {
            true => std::task::Poll::Pending,
            false => std::task::Poll::Ready(()),
        }
    })
    .await;
    out.into_iter().flatten().collect()
}

/// The rules the request's descriptors reach, less those another of them
/// replaces.
fn matched(domain: &crate::config::Domain, req: &RateLimitRequest) -> Vec<Item> {
    let hits = u64::from(req.hits_addend.max(1));
    let mut items: Vec<Item> = req
        .descriptors
        .iter()
        .enumerate()
        .filter_map(|(i, d)| {
            let entries = d.entries.iter().map(|e| (e.key.as_str(), e.value.as_str()));
            let m = match &d.limit {
                Some(o) => domain.override_rule(entries, o.requests_per_unit, o.unit)?,
                None => domain.find(entries)?,
            };
            let cost = d.hits_addend.as_ref().map_or(hits, |h| h.value);
            Some(Item {
                descriptor: i,
                m,
                cost,
                negative: d.is_negative_hits,
                state: State::Unknown,
            })
        })
        .collect();
    let replaced: Vec<String> = items
        .iter()
        .flat_map(|it| it.m.rule.replaces.iter().cloned())
        .collect();
    if !replaced.is_empty() {
        items.retain(|it| {
            !it.m
                .rule
                .given_name
                .as_ref()
                .is_some_and(|n| replaced.contains(n))
        });
    }
    items
}

fn took(it: &Item, i: usize, verdict: Verdict) -> Took {
    if it.negative {
        return Took::Hit;
    }
    if verdict == Verdict::Over(i) {
        return Took::Over;
    }
    let shadow = it.m.rule.shadow;
    match &it.state {
        State::Blocked if shadow => Took::Shadow,
        State::Decided(d) if shadow && d.statuses[0].would_deny => Took::Shadow,
        State::Decided(d) if verdict == Verdict::Ok && d.is_allowed() => {
            let st = d.statuses[0];
            let q = match &it.m.rule.limit {
                Limit::Plan(p) => p.policy(0).quota(),
                _ => 0,
            };
            Took::Within {
                near: st.remaining.saturating_mul(5) < q,
            }
        }
        State::Unlimited if verdict == Verdict::Ok => Took::Within { near: false },
        _ => Took::Hit,
    }
}

#[tonic::async_trait]
impl<S: Store, C: Clock> RateLimitService for RlsService<S, C> {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        self.decide(request.get_ref()).await.map(Response::new)
    }
}

/// Serves `service` on `listener` (gRPC over HTTP/2 cleartext) until
/// `shutdown` completes.
pub async fn serve<S: Store, C: Clock>(
    listener: tokio::net::TcpListener,
    service: RlsService<S, C>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    tonic::transport::Server::builder()
        .serve_with_incoming_shutdown(service.server(), incoming, shutdown)
        .await
}
