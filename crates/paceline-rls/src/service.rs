//! `ShouldRateLimit`: a request's descriptors to their rules, the rules to
//! the store, the decisions to Envoy's answer.
//!
//! Why not envoyproxy/ratelimit's way: it charges every descriptor's
//! counter and answers `OVER_LIMIT` if any is over, so a request refused
//! by one limit still spends the others. Here a request is admitted only
//! if every rule admits it: its rules go to the store as one group
//! ([`Store::check_all`]), which the store decides as one step (the
//! memory store holding the keys' stripes, Redis in one atomic call), so a
//! refused request spends nothing and no other request ever sees its
//! charges.

use std::future::Future;
use std::sync::Arc;

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use paceline_core::{Clock, Cost, FailMode, GroupItem, Nanos, Plan, Store};
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

    /// Asks the store for every rule that counts, as one group: admitted
    /// by all of them and charged to all, or refused and charged nothing
    /// (the store decides the group as one step, so no other request sees
    /// a charge of a refused one). A refused request then reads the
    /// standing of the rules the store did not answer for.
    async fn evaluate(
        &self,
        items: &mut [Item],
        fail: FailMode,
        domain: &str,
        now: Nanos,
    ) -> Verdict {
        for it in items.iter_mut() {
            it.state = match it.m.rule.limit {
                Limit::Unlimited => State::Unlimited,
                Limit::Blocked => State::Blocked,
                Limit::Plan(_) => State::Unknown,
            };
        }
        self.give_negative_hits(items, now).await;
        // a rule that admits nothing refuses before any store is asked
        if let Some(i) = items.iter().position(Item::refuses) {
            self.read_unknown(items, now).await;
            return Verdict::Over(i);
        }
        let asked: Vec<usize> = (0..items.len())
            .filter(|&i| plan_of(&items[i]).is_some() && !items[i].negative)
            .collect();
        if asked.is_empty() {
            return Verdict::Ok;
        }
        let group: Vec<GroupItem<'_>> = asked
            .iter()
            .filter_map(|&i| {
                let it = &items[i];
                Some(GroupItem::new(
                    plan_of(it)?,
                    &it.m.store_key,
                    Cost::requests(it.cost),
                ))
            })
            .collect();
        let decided = self.shared.store.check_all(&group, now).await;
        drop(group);
        match decided {
            Ok(g) => {
                for (&i, d) in asked.iter().zip(g.decisions) {
                    if let Some(d) = d {
                        items[i].state = State::Decided(d);
                    }
                }
            }
            Err(e) => {
                metrics::store_error(domain);
                tracing::warn!(domain, error = %e, "rate-limit store failed");
                return match fail {
                    FailMode::Closed => Verdict::Unavailable,
                    _ => Verdict::Ok,
                };
            }
        }
        // the first refusal in the request's order decides
        match items.iter().position(Item::refuses) {
            Some(i) => {
                self.read_unknown(items, now).await;
                Verdict::Over(i)
            }
            None => Verdict::Ok,
        }
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

    /// A refused request: the rules the store did not answer for are read
    /// (without a charge) for the answer's fields: what a remote store
    /// last heard of a key at once, the rest as one group of reads.
    async fn read_unknown(&self, items: &mut [Item], now: Nanos) {
        let store = &self.shared.store;
        let remote = store.memory().is_none();
        let mut unknown = Vec::new();
        for (i, it) in items.iter_mut().enumerate() {
            let (State::Unknown, Some(plan)) = (&it.state, plan_of(it)) else {
                continue;
            };
            match remote.then(|| store.peek_local(plan, &it.m.store_key, now)) {
                Some(Some(d)) => it.state = State::Decided(d),
                _ => unknown.push(i),
            }
        }
        if unknown.is_empty() {
            return;
        }
        let reads: Vec<GroupItem<'_>> = unknown
            .iter()
            .filter_map(|&i| {
                let it = &items[i];
                Some(GroupItem::new(
                    plan_of(it)?,
                    &it.m.store_key,
                    Cost::requests(0),
                ))
            })
            .collect();
        let read = store.check_all(&reads, now).await;
        drop(reads);
        if let Ok(g) = read {
            for (&i, d) in unknown.iter().zip(g.decisions) {
                if let Some(d) = d {
                    items[i].state = State::Decided(d);
                }
            }
        }
    }
}

/// The plan of an item whose rule counts in the store.
fn plan_of(it: &Item) -> Option<&Plan> {
    match &it.m.rule.limit {
        Limit::Plan(p) => Some(p),
        _ => None,
    }
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
