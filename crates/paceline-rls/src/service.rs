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

    /// Asks the store for every rule that counts, until one refuses; a
    /// refused request then gets its charges back and the standing of the
    /// rules not asked.
    async fn evaluate(
        &self,
        items: &mut [Item],
        fail: FailMode,
        domain: &str,
        now: Nanos,
    ) -> Verdict {
        let store = &self.shared.store;
        for it in items.iter_mut() {
            it.state = match it.m.rule.limit {
                Limit::Unlimited => State::Unlimited,
                Limit::Blocked => State::Blocked,
                Limit::Plan(_) => State::Unknown,
            };
        }
        // a rule that admits nothing refuses before any store is asked
        let mut verdict = items
            .iter()
            .position(Item::refuses)
            .map_or(Verdict::Ok, Verdict::Over);
        if verdict == Verdict::Ok {
            for (i, it) in items.iter_mut().enumerate() {
                let Limit::Plan(plan) = &it.m.rule.limit else {
                    continue;
                };
                let (key, cost) = (&it.m.store_key, Cost::requests(it.cost));
                let r = match store.check_local(plan, key, cost, now) {
                    Some(r) => r,
                    None => store.check_cost(plan, key, cost, now).await,
                };
                match r {
                    Ok(d) => {
                        it.state = State::Decided(d);
                        if it.refuses() {
                            verdict = Verdict::Over(i);
                            break;
                        }
                    }
                    Err(e) => {
                        metrics::store_error(domain);
                        tracing::warn!(domain, error = %e, "rate-limit store failed");
                        if fail == FailMode::Closed {
                            verdict = Verdict::Unavailable;
                            break;
                        }
                    }
                }
            }
        }
        if verdict != Verdict::Ok {
            self.give_back(items, verdict, now).await;
        }
        verdict
    }

    /// A refused request: what it was charged goes back, and the rules
    /// not asked are read (without a charge) for the answer's fields.
    async fn give_back(&self, items: &mut [Item], verdict: Verdict, now: Nanos) {
        let store = &self.shared.store;
        for (i, it) in items.iter_mut().enumerate() {
            let Limit::Plan(plan) = &it.m.rule.limit else {
                continue;
            };
            let key = &it.m.store_key;
            match &mut it.state {
                State::Decided(d) if Verdict::Over(i) != verdict => {
                    if !d.is_allowed() || d.statuses[0].would_deny || it.m.rule.shadow {
                        continue;
                    }
                    let cost = Cost::requests(it.cost);
                    if let Err(e) = store.refund(plan, key, cost, now, now).await {
                        tracing::warn!(error = %e, "giving a refused request's charge back failed");
                        continue;
                    }
                    let st = &mut d.statuses[0];
                    st.remaining = (st.remaining + it.cost).min(plan.policy(0).quota());
                }
                State::Unknown if verdict != Verdict::Unavailable => {
                    let read = match store.peek_local(plan, key, now) {
                        Some(d) => Ok(d),
                        None => store.check_cost(plan, key, Cost::requests(0), now).await,
                    };
                    if let Ok(d) = read {
                        it.state = State::Decided(d);
                    }
                }
                _ => {}
            }
        }
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
            let m = domain.find(entries)?;
            let cost = d.hits_addend.as_ref().map_or(hits, |h| h.value);
            Some(Item {
                descriptor: i,
                m,
                cost,
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
