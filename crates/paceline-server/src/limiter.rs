//! The engine behind the layer: resolve who is asking, check, escalate,
//! warn, and say what to do with the request.

use std::fmt;
use std::net::IpAddr;
use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwap;

use bytes::Bytes;
use http::header::{HeaderValue, AUTHORIZATION, CONTENT_LENGTH, HOST, TRANSFER_ENCODING};
use http::{HeaderMap, Method, Request, Response, Version};
use paceline_core::{
    Clock, Cost, Decision, Denial, FailMode, Nanos, Outcome, Plan, PolicyKind, Store, StoreError,
};
use parking_lot::RwLock;
use tracing::Instrument;

use crate::config::{key_prefix, Limits, LimitsInner};
use crate::escalation::{Escalator, Level};
use crate::head::{HeadCheck, Refusal};
use crate::identity::{
    client_ip, peer_ip, read_authorization, read_key_field, BasicAuth, Credential, IpPrefixes,
    KeyHash, KeyLookup, KeySource, KeyTreatment, LookedUp, Stranger,
};
use crate::layer::ReleaseGuard;
use crate::respond;
use crate::route::RouteInfo;
use crate::soft::{SoftLimitEvent, SoftLimitHook, SoftLimits, WARNING_HEADER};
use crate::telemetry::{self, OutcomeLabel, PlanKeys};
use crate::usage::{Meter, Settler};
use paceline_wire::emit::Hold;

/// Checks requests against [`Limits`], with a store and a clock. Clones
/// share everything: the store, the escalation and soft-limit state, and
/// the limits (so [`RateLimiter::reload`] reaches every clone).
///
/// ```
/// use paceline_core::{ManualClock, MemoryStore, Nanos, Plan, Policy};
/// use paceline_server::{Limits, RateLimiter};
///
/// let plan = Plan::new("free", vec![Policy::token_bucket("burst", 20, 2).unwrap()]).unwrap();
/// let limits = Limits::builder().plan(plan).key("sk_1", "free").build().unwrap();
/// let limiter = RateLimiter::new(limits, MemoryStore::new(), ManualClock::at_unix_secs(1_000));
/// let layer = limiter.layer(); // add it to an axum Router or a tower stack
/// # let _ = layer;
/// ```
pub struct RateLimiter<S, C> {
    shared: Arc<Shared<S, C>>,
}

impl<S, C> Clone for RateLimiter<S, C> {
    fn clone(&self) -> Self {
        RateLimiter {
            shared: self.shared.clone(),
        }
    }
}

impl<S, C> fmt::Debug for RateLimiter<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimiter")
            .field("limits", &*self.shared.limits.load())
            .finish_non_exhaustive()
    }
}

struct Shared<S, C> {
    store: S,
    clock: C,
    /// Read on every request, swapped on reload: readers take no lock.
    limits: ArcSwap<LimitsInner>,
    escalator: Escalator,
    soft: SoftLimits,
    hook: RwLock<Option<SoftLimitHook>>,
}

/// Who a request is, for limiting.
struct Who {
    key: StoreKey,
    hash: KeyHash,
    plan: usize,
    publish: bool,
}

/// The key a request is counted under.
enum StoreKey {
    /// A configured key: its entry in the limits, prepared at build time.
    Configured(usize),
    /// Any other key (default plan, client addresses), built per request.
    Owned(String),
    /// The per-IP key of a connection's peer, made once for the connection
    /// (see [`Peer`]).
    Shared(Arc<str>),
}

/// The socket peer of the one connection a service serves, and the per-IP
/// key its requests are counted under: made at the first request that
/// needs it, for the limits then in force (a request decided by limits
/// since replaced makes its own), so that the requests of a keep-alive
/// connection neither write the address nor hash it again.
#[derive(Clone, Debug)]
pub(crate) struct Peer {
    /// The address as [`client_ip`] reads it (an IPv4-mapped IPv6 address
    /// as the IPv4 one).
    ip: IpAddr,
    key: OnceLock<PeerKey>,
}

/// The per-IP key of a [`Peer`], by the limits of one generation.
#[derive(Clone, Debug)]
struct PeerKey {
    generation: u64,
    /// The configured key the address itself is, with `key = "ip"`.
    exact: Option<usize>,
    /// `ip:` and the address's network (see [`ip_key`]).
    key: Arc<str>,
    hash: KeyHash,
}

impl Peer {
    pub(crate) fn new(ip: IpAddr) -> Peer {
        Peer {
            ip: crate::identity::canonical(ip),
            key: OnceLock::new(),
        }
    }

    /// The socket peer's address.
    pub(crate) fn ip(&self) -> IpAddr {
        self.ip
    }

    /// The per-IP key of `ip` under `lim`, when `ip` is this peer's and
    /// the key was (or is now) made by the same limits.
    fn key(&self, ip: IpAddr, lim: &LimitsInner) -> Option<&PeerKey> {
        if ip != self.ip {
            return None;
        }
        let k = self.key.get_or_init(|| {
            let key: Arc<str> = ip_key(ip, &lim.ip_prefixes).into();
            PeerKey {
                generation: lim.generation,
                exact: configured_ip(lim, ip),
                hash: lim.hasher.hash(&key),
                key,
            }
        });
        (k.generation == lim.generation).then_some(k)
    }
}

/// The configured key an address is, with `key = "ip"` (looked up in its
/// `Display` text).
fn configured_ip(lim: &LimitsInner, ip: IpAddr) -> Option<usize> {
    if lim.keys.is_empty() {
        return None;
    }
    paceline_wire::ip::with_ip(ip, |text| lim.keys.get(text).copied())
}

impl Who {
    fn configured(lim: &LimitsInner, entry: usize) -> Who {
        let e = &lim.key_entries[entry];
        Who {
            key: StoreKey::Configured(entry),
            hash: e.hash,
            plan: e.plan,
            publish: true,
        }
    }
    fn owned(key: String, plan: usize, publish: bool, hasher: &crate::KeyHasher) -> Who {
        Who {
            hash: hasher.hash(&key),
            key: StoreKey::Owned(key),
            plan,
            publish,
        }
    }
    /// Counted under the per-IP key of `ip`: the connection's own when
    /// `ip` is its peer's, else one made now.
    fn ip(ip: IpAddr, peer: Option<&Peer>, plan: usize, publish: bool, lim: &LimitsInner) -> Who {
        match peer.and_then(|p| p.key(ip, lim)) {
            Some(k) => Who {
                key: StoreKey::Shared(k.key.clone()),
                hash: k.hash,
                plan,
                publish,
            },
            None => Who::owned(ip_key(ip, &lim.ip_prefixes), plan, publish, &lim.hasher),
        }
    }
    /// What escalation counts strikes under: the key within its plan, so
    /// an address's strikes on one plan (a login route's) do not hold it
    /// on another (the anonymous plan's), where others behind the same
    /// address may be.
    fn strikes(&self) -> KeyHash {
        let plan = (self.plan as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        KeyHash(self.hash.0 ^ plan.rotate_left(29))
    }
    fn key<'a>(&'a self, lim: &'a LimitsInner) -> &'a str {
        self.key.of(lim)
    }
}

impl StoreKey {
    /// The key as the store knows it, by the limits it was made under.
    fn of<'a>(&'a self, lim: &'a LimitsInner) -> &'a str {
        match self {
            StoreKey::Configured(i) => &lim.key_entries[*i].stored,
            StoreKey::Owned(k) => k,
            StoreKey::Shared(k) => k,
        }
    }
}

/// What was read from the request head, owned (so no borrow of the request
/// lives across the store's await).
pub(crate) struct Prepared {
    limits: Limits,
    /// The classification to leave in the request's extensions when it
    /// passes: made here or handed over (`None` when one was found there).
    pub(crate) route: Option<RouteInfo>,
    /// The request's cost, by its classification.
    cost: u64,
    /// What named-unit policies are charged at admission.
    units: u64,
    /// Where the answer reports the request's real use of the named unit.
    reported: Option<Arc<crate::usage::UsageSource>>,
    usage: bool,
    who: Option<Who>,
    /// Why the request has no known key, when it has none (whatever its
    /// treatment).
    stranger: Option<Stranger>,
    /// A rejection leaves a request body unread: close the connection.
    pub(crate) close: bool,
    /// The announced body length, charged to content-bytes policies.
    bytes: u64,
    /// A body whose length is not announced (chunked).
    unknown_len: bool,
    /// A head refused whoever sent it (see [`crate::head`]).
    refused: Option<Refusal>,
    /// The consumer headers come from a peer that is not trusted: they
    /// are removed before the request goes on.
    strip: bool,
}

impl Prepared {
    /// What the request is charged at admission.
    fn charge(&self) -> Cost {
        Cost::requests(self.cost)
            .with_bytes(self.bytes)
            .with_units(self.units)
    }

    /// Removes the consumer headers of a request from an untrusted peer
    /// (see [`KeySource::ConsumerHeader`]), so that no service behind the
    /// layer reads a forged one.
    #[inline]
    pub(crate) fn strip_untrusted(&self, headers: &mut HeaderMap) {
        if !self.strip {
            return;
        }
        if let Some(c) = &self.limits.inner.consumer {
            headers.remove(&c.headers.key);
            if let Some(p) = &c.headers.plan {
                headers.remove(p);
            }
        }
    }
}

/// What to do with a request.
pub(crate) enum Verdict {
    /// No limit applies: call the inner service as is.
    Pass,
    /// Admitted: call the inner service, then decorate its response.
    Admit(Admitted),
    /// Answer without calling the inner service.
    Respond(Response<Bytes>),
    /// Refuse without calling the inner service (and without reading the
    /// request body).
    Reject(Response<Bytes>),
}

/// Where a decision stands before the store is asked.
enum Stage {
    /// Decided without the store.
    Done(Verdict),
    /// The store must be asked.
    Ask(Ask),
}

/// What to ask the store, and what to remember meanwhile.
/// A decision that must wait for the store (see
/// [`RateLimiter::decide_now`]).
pub(crate) struct Later(Ask, tracing::Span);

struct Ask {
    plan: usize,
    cost: Cost,
    /// When the decision began, by the limiter's clock (also the start of
    /// the latency histogram's measure).
    now: Nanos,
    /// An escalation hold: the answer is a denial whatever the store says.
    hold: Option<Held>,
}

/// An escalation hold on a request, and the policy it holds.
struct Held {
    policy: usize,
    hold: crate::escalation::Hold,
}

/// Marks policy `i` of `d` as what the answer says it is: refusing until
/// `wait` has passed, so `RateLimit` agrees with `Retry-After`; under a
/// hold (`held`) nothing of it is usable before then, so nothing is left.
fn mark_held(d: &mut Decision, i: usize, wait: Nanos, held: bool) {
    if let Some(s) = d.statuses.get_mut(i) {
        if held {
            s.remaining = 0;
        }
        s.reset_after = s.reset_after.max(wait);
        s.would_deny = true;
    }
}

/// Whether a hold of `wait` says more than the policies' own `real` wait,
/// in the whole seconds `Retry-After` announces.
fn hold_binds(wait: Nanos, real: Nanos) -> bool {
    wait.as_secs_ceil().max(1) > real.as_secs_ceil().max(1)
}

fn wire_hold(level: Level) -> Hold {
    match level {
        Level::Blocked => Hold::Blocked,
        _ => Hold::Extended,
    }
}

impl Ask {
    fn plan<'a>(&self, p: &'a Prepared) -> &'a paceline_core::Plan {
        &p.limits.inner.plans[self.plan].plan
    }
    fn key<'a>(&self, p: &'a Prepared) -> &'a str {
        p.who.as_ref().map_or("", |w| w.key(&p.limits.inner))
    }
}

/// An admitted request's decision, for the response headers.
pub(crate) struct Admitted {
    limits: Limits,
    plan: usize,
    decision: Decision,
    publish: bool,
    warning: Option<HeaderValue>,
    /// The key the request was counted under, moved out of the decision
    /// (no copy is made for a release or a refund that may never come).
    key: StoreKey,
    /// The concurrency units to give back when the answer is done.
    release: Option<u64>,
    /// What to give back if the upstream's answer never comes: the cost
    /// and when it was charged (none when the plan charges upstream
    /// failures, or nothing was charged).
    refund: Option<(Cost, Nanos)>,
    /// Where the answer reports the request's real use of the named unit,
    /// to settle the charge (see [`crate::usage`]).
    reported: Option<Arc<crate::usage::UsageSource>>,
}

impl<S: Store, C: Clock> RateLimiter<S, C> {
    /// A limiter enforcing `limits` over `store`, reading time from `clock`.
    pub fn new(limits: Limits, store: S, clock: C) -> Self {
        let esc = limits.escalation().clone();
        let soft = SoftLimits::new(limits.soft_limit().unwrap_or(2.0), esc.max_keys);
        RateLimiter {
            shared: Arc::new(Shared {
                store,
                clock,
                escalator: Escalator::new(esc),
                soft,
                limits: ArcSwap::new(limits.inner),
                hook: RwLock::new(None),
            }),
        }
    }

    /// Sets the callback fired once per key, policy and window when use
    /// crosses the soft limit.
    pub fn set_soft_limit_hook(&self, hook: SoftLimitHook) {
        *self.shared.hook.write() = Some(hook);
    }

    /// Removes the soft-limit callback: crossings are still counted and
    /// published, and no callback is fired.
    pub fn clear_soft_limit_hook(&self) {
        *self.shared.hook.write() = None;
    }

    /// Swaps in new limits. Counters survive for every plan whose state
    /// layout did not change (same name, same algorithms in the same order).
    /// Escalation and soft-limit settings stay as they were at construction.
    pub fn reload(&self, limits: Limits) {
        self.shared.limits.store(limits.inner);
    }

    /// The limits in force.
    pub fn limits(&self) -> Limits {
        Limits {
            inner: self.shared.limits.load_full(),
        }
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.shared.store
    }

    /// The clock.
    pub fn clock(&self) -> &C {
        &self.shared.clock
    }

    /// Classifies a request by the routes of the limits in force (see
    /// [`Limits::classify`]): a layer before the limit layer that needs
    /// the route (a load shedder, for its criticality) inserts the result
    /// into the request's extensions, and the limit layer does not match
    /// the routes again.
    pub fn classify<B>(&self, req: &Request<B>) -> RouteInfo {
        self.shared.limits.load().classify_in(req)
    }

    /// The identity a request is counted under (a configured key, or the
    /// client address of an anonymous caller), as the store knows it:
    /// what another layer scopes by, such as the idempotency layer's
    /// [`LimiterScope`](crate::idempotency::LimiterScope). `None` for a
    /// request the limiter refuses (no known key) or does not count (an
    /// unlimited route). `peer` is the socket peer when the extensions
    /// name none.
    pub fn caller(
        &self,
        parts: &http::request::Parts,
        route: &RouteInfo,
        peer: Option<std::net::IpAddr>,
    ) -> Option<String> {
        let limits = self.limits();
        let fields = HeadFields::of(&parts.headers);
        let peer = peer.map(Peer::new);
        let (who, _) = who(
            &limits,
            &parts.headers,
            &parts.extensions,
            peer.as_ref(),
            &fields,
            route,
            false,
            || self.shared.clock.now(),
        );
        who.map(|w| w.key(&limits.inner).to_string())
    }

    /// A tower layer enforcing this limiter.
    pub fn layer(&self) -> crate::RateLimitLayer<S, C> {
        crate::RateLimitLayer::new(self.clone())
    }

    /// Reads everything the decision needs from the request head; `peer` is
    /// the connection's socket peer when the request's extensions name none,
    /// `given` a classification handed over by a layer before.
    pub(crate) fn prepare<B>(
        &self,
        req: &Request<B>,
        peer: Option<&Peer>,
        given: Option<RouteInfo>,
    ) -> Prepared {
        let limits = self.limits();
        let path = req.uri().path();
        let lim = &limits.inner;
        // a classification made before this layer by these same limits is
        // used as it is, handed over or found in the extensions; any other
        // (none, or one by limits since replaced) is not
        let current = |r: &RouteInfo| r.generation == lim.generation;
        let mut own = given.filter(current);
        let found = match own {
            Some(_) => None,
            None => req.extensions().get::<RouteInfo>().filter(|r| current(r)),
        };
        let route = match found {
            Some(r) => r,
            None => &*own.get_or_insert_with(|| lim.classify_in(req)),
        };
        let usage = req.method() == Method::GET && lim.usage_path.as_deref() == Some(path);
        let fields = HeadFields::of(req.headers());
        let (who, stranger) = who(
            &limits,
            req.headers(),
            req.extensions(),
            peer,
            &fields,
            route,
            usage,
            || self.shared.clock.now(),
        );
        // consumer headers are believed from trusted proxies alone
        let strip = lim.consumer.is_some()
            && !peer_ip(req.extensions())
                .or(peer.map(Peer::ip))
                .is_some_and(|p| lim.trusted.contains(p));
        let (cost, units) = (route.cost, route.units);
        let reported = route.usage.clone();
        let refused = fields.check.refusal(req.headers(), &lim.key_source);
        let close = req.version() <= Version::HTTP_11
            && (fields.has_body() || refused.is_some_and(|r| r.breaks_framing()));
        let bytes = fields.body_len();
        let unknown_len = fields.transfer_encoding && fields.content_length.is_none();
        Prepared {
            refused,
            strip,
            bytes,
            unknown_len,
            limits,
            route: own,
            cost,
            units,
            reported,
            usage,
            who,
            stranger,
            close,
        }
    }

    /// See [`RateLimit::standing`](crate::RateLimit::standing).
    pub(crate) fn standing<B>(
        &self,
        req: &Request<B>,
        peer: Option<&Peer>,
        given: Option<RouteInfo>,
    ) -> Option<HeaderMap> {
        let p = self.prepare(req, peer, given);
        let who = p
            .who
            .as_ref()
            .filter(|w| w.publish && p.stranger.is_none() && !p.usage)?;
        let lim = &p.limits.inner;
        let compiled = &lim.plans[who.plan];
        let now = self.shared.clock.now();
        // at once: the memory store reads the key, a remote one answers
        // what it last heard of it (nothing for a key it has not)
        let d = self
            .shared
            .store
            .peek_local(&compiled.plan, who.key(lim), now)?;
        let mut h = HeaderMap::new();
        compiled
            .meta
            .write_fields(&compiled.plan, &d, &lim.dialects, true, &mut h);
        Some(h)
    }

    /// The standing of the configured key `key` under its plan, read
    /// without charging: the plan and what the store holds for the key
    /// now (each policy's whole units left and time to its full restore),
    /// as the store can tell it without I/O ([`Store::peek_local`]: a
    /// store outside the process answers what it last heard for the key).
    /// `None` for a key the configuration does not list, or one the store
    /// cannot tell at once. For showing a key's counters (a dashboard, a
    /// diagnostics page, a shed answer), not for deciding.
    pub fn peek_key(&self, key: &str) -> Option<(Plan, Decision)> {
        let limits = self.limits();
        let lim = &limits.inner;
        let entry = &lim.key_entries[*lim.keys.get(key)?];
        let plan = &lim.plans[entry.plan].plan;
        let now = self.shared.clock.now();
        let d = self.shared.store.peek_local(plan, &entry.stored, now)?;
        Some((plan.clone(), d))
    }

    /// The tracing span of one decision.
    fn span(&self, p: &Prepared) -> tracing::Span {
        match &p.who {
            Some(who) => {
                let name = &p.limits.inner.plans[who.plan].name;
                tracing::debug_span!("paceline.decide", plan = %name, key = %who.hash, cost = p.cost)
            }
            None => tracing::Span::none(),
        }
    }

    /// Decides at once when the store can answer without waiting (the
    /// memory store always; a remote one from its local cache, as for a
    /// key over its limit): no future and no allocation for it. Otherwise
    /// the question for [`decide_later`](Self::decide_later).
    pub(crate) fn decide_now(&self, p: &mut Prepared) -> Result<Verdict, Later> {
        let span = self.span(p);
        let _entered = span.enter();
        match self.stage(p) {
            Stage::Done(v) => Ok(v),
            Stage::Ask(ask) => {
                let store = &self.shared.store;
                let (plan, key) = (ask.plan(p), ask.key(p));
                let local = match ask.hold {
                    // held: the answer is a refusal whatever the store
                    // says; its fields come from what the store can tell
                    // at once (a remote store: its last answer for the
                    // key), so a key that keeps sending is no round trip
                    // per refusal
                    Some(_) => store.peek_local(plan, key, ask.now).map(Ok),
                    None => None,
                };
                match local.or_else(|| store.check_local(plan, key, ask.cost, ask.now)) {
                    Some(r) => Ok(self.conclude(p, ask, r)),
                    None => Err(Later(ask, span.clone())),
                }
            }
        }
    }

    /// Decides what [`decide_now`](Self::decide_now) could not, asking the
    /// store.
    pub(crate) async fn decide_later(&self, p: &mut Prepared, later: Later) -> Verdict {
        let Later(ask, span) = later;
        let r = self
            .shared
            .store
            .check_cost(ask.plan(p), ask.key(p), ask.cost, ask.now)
            .instrument(span.clone())
            .await;
        span.in_scope(|| self.conclude(p, ask, r))
    }

    /// Everything before the store: who, escalation holds, the cost.
    fn stage(&self, p: &Prepared) -> Stage {
        let lim = &p.limits.inner;
        if let Some(r) = p.refused {
            return Stage::Done(Verdict::Reject(r.answer(&lim.problem_base)));
        }
        let unauthorized = |s: Option<Stranger>| match s {
            Some(Stranger::Unavailable) => respond::keys_unavailable(&lim.problem_base),
            s => respond::unauthorized(
                &lim.problem_base,
                s.unwrap_or(Stranger::Missing),
                &lim.key_source,
            ),
        };
        if p.usage && (p.stranger.is_some() || !p.who.as_ref().is_some_and(|w| w.publish)) {
            // the usage of a key it does not have: say which is wrong
            return Stage::Done(Verdict::Respond(unauthorized(p.stranger)));
        }
        let Some(who) = &p.who else {
            return Stage::Done(match p.stranger {
                Some(_) => Verdict::Reject(unauthorized(p.stranger)),
                // an unlimited route
                None => Verdict::Pass,
            });
        };
        let sh = &*self.shared;
        let now = sh.clock.now();
        let ask = |cost: Cost, hold| {
            Stage::Ask(Ask {
                cost,
                now,
                hold,
                plan: who.plan,
            })
        };
        if p.usage {
            return ask(Cost::requests(0), None);
        }
        if p.unknown_len && lim.plans[who.plan].plan.counts_bytes() {
            return Stage::Done(Verdict::Reject(respond::length_required(&lim.problem_base)));
        }
        match sh.escalator.before(who.strikes(), now) {
            Some(hold) => {
                let compiled = &lim.plans[who.plan];
                let plan = &compiled.plan;
                if hold.fresh {
                    escalated(
                        &compiled.name,
                        &compiled.metric_keys,
                        who.hash,
                        hold.level,
                        hold.wait,
                    );
                }
                let policy = hold.policy.min(plan.policies().len() - 1);
                // read the standing for the headers, charge nothing
                ask(Cost::requests(0), Some(Held { policy, hold }))
            }
            None => ask(p.charge(), None),
        }
    }

    /// Everything after the store: escalation, metrics, logs, the answer.
    fn conclude(
        &self,
        p: &mut Prepared,
        ask: Ask,
        result: Result<Decision, StoreError>,
    ) -> Verdict {
        let lim = &p.limits.inner;
        let who = p.who.as_ref().expect("the store is asked only for someone");
        let compiled = &lim.plans[who.plan];
        let plan = &compiled.plan;
        let (plan_name, policy_names) = (&compiled.name, &compiled.policy_names);
        let mk = &compiled.metric_keys;
        let sh = &*self.shared;
        let now = ask.now;
        if p.usage {
            return match result {
                Ok(d) => {
                    Verdict::Respond(respond::usage(plan, &compiled.meta, &d, now, &lim.dialects))
                }
                Err(e) => {
                    telemetry::store_error(mk);
                    tracing::warn!(error = %e, "usage: store unavailable");
                    Verdict::Respond(respond::unavailable(&lim.problem_base))
                }
            };
        }
        // the hold that lengthened the wait, when one did
        let mut held: Option<Hold> = None;
        let result = result.map(|mut d| {
            match &ask.hold {
                Some(Held { policy, hold }) => {
                    // the policies' own wait: the store's at the last denial,
                    // or a quota that stands spent (until its reset)
                    let cost = p.charge();
                    let (mut real, mut binding) = (hold.real, *policy);
                    for (i, (q, s)) in plan.policies().iter().zip(&d.statuses).enumerate() {
                        let spent = s.remaining < cost.of(q);
                        if !q.is_shadow()
                            && q.kind() == PolicyKind::Quota
                            && spent
                            && s.reset_after > real
                        {
                            (real, binding) = (s.reset_after, i);
                        }
                    }
                    let wait = hold.wait.max(real);
                    if hold_binds(hold.wait, real) {
                        held = Some(wire_hold(hold.level));
                        binding = *policy;
                    }
                    mark_held(&mut d, binding, wait, held.is_some());
                    d.outcome = Outcome::Denied(Denial {
                        policy: binding,
                        kind: plan.policy(binding).kind(),
                        retry_after: wait,
                    });
                }
                None => {
                    if let Outcome::Denied(den) = &mut d.outcome {
                        let real = den.retry_after;
                        let (wait, fresh) =
                            sh.escalator
                                .denied(who.strikes(), now, real, den.policy, den.kind);
                        den.retry_after = wait;
                        if fresh {
                            escalated(plan_name, mk, who.hash, Level::Extended, wait);
                        }
                        if hold_binds(wait, real) {
                            held = Some(Hold::Extended);
                            let i = den.policy;
                            mark_held(&mut d, i, wait, true);
                        }
                    }
                }
            }
            d
        });
        // the same clock the decision read: a clock set back gives zero
        let elapsed = || sh.clock.now().saturating_sub(now).as_secs_f64();
        let d = match result {
            Ok(d) => d,
            Err(e) => {
                telemetry::store_error(mk);
                telemetry::decision(mk, None, OutcomeLabel::StoreError, elapsed());
                tracing::warn!(plan = %plan_name, error = %e, "rate-limit store failed");
                let closed = plan
                    .policies()
                    .iter()
                    .any(|q| !q.is_shadow() && q.fail_mode() == FailMode::Closed);
                return match closed {
                    true => Verdict::Reject(respond::unavailable(&lim.problem_base)),
                    false => Verdict::Pass,
                };
            }
        };
        if d.is_allowed() {
            // what a shadow policy alone would have refused
            for (i, s) in d.statuses.iter().enumerate() {
                if s.would_deny && plan.policy(i).is_shadow() {
                    telemetry::shadow(mk, i);
                }
            }
        }
        let label = outcome_label(&d);
        let deciding = d.rejecting_policy();
        telemetry::decision(mk, deciding, label, elapsed());
        let deciding = deciding.map(|i| &policy_names[i]);
        if d.is_allowed() {
            let warning = match who.publish {
                true => self.soft_limits(p, who, &d, now),
                false => None,
            };
            let release = plan.has_concurrency().then_some(p.cost);
            let cost = p.charge();
            // what was charged, should the answer never come
            let refund = (ask.hold.is_none() && ask.cost == cost).then_some((cost, now));
            let (plan, publish) = (who.plan, who.publish);
            let key = p.who.take().expect("asked for someone").key;
            return Verdict::Admit(Admitted {
                limits: p.limits.clone(),
                plan,
                decision: d,
                publish,
                warning,
                key,
                release,
                refund,
                reported: p.reported.clone(),
            });
        }
        // the fields are evaluated only when a subscriber listens
        tracing::info!(
            plan = %plan_name,
            policy = %deciding.map_or("", |s| s),
            key = %who.hash,
            outcome = label.as_str(),
            retry_after_s = paceline_wire::emit::retry_after_secs(&d),
            "request rejected"
        );
        let (meta, dialects, base) = (&compiled.meta, &lim.dialects, &lim.problem_base);
        Verdict::Reject(meta.held_rejection(plan, &d, dialects, who.publish, base, held))
    }

    /// The warning field for quotas past the soft limit; fires the hook the
    /// first time in each window.
    fn soft_limits(
        &self,
        p: &Prepared,
        who: &Who,
        d: &Decision,
        now: Nanos,
    ) -> Option<HeaderValue> {
        let compiled = &p.limits.inner.plans[who.plan];
        let plan = &compiled.plan;
        let sh = &*self.shared;
        let mut field = String::new();
        for (i, (pol, s)) in plan.policies().iter().zip(&d.statuses).enumerate() {
            let used = pol.quota().saturating_sub(s.remaining);
            if !sh.soft.past(pol.kind(), used, pol.quota()) {
                continue;
            }
            if !field.is_empty() {
                field.push_str(", ");
            }
            field.push_str(&format!("\"{}\";used={used};q={}", pol.name(), pol.quota()));
            let ends = now.saturating_add(s.reset_after);
            if sh.soft.first_in_window(who.hash, i, now, ends) {
                let plan_name = &compiled.name;
                telemetry::soft_limit(&compiled.metric_keys, i);
                tracing::info!(plan = %plan_name, policy = pol.name(), key = %who.hash, used, quota = pol.quota(), "soft limit crossed");
                if let Some(hook) = sh.hook.read().as_ref() {
                    (hook.0)(&SoftLimitEvent {
                        plan: plan.name().to_string(),
                        policy: pol.name().to_string(),
                        key_hash: who.hash,
                        used,
                        quota: pol.quota(),
                        window_ends: ends,
                    });
                }
            }
        }
        (!field.is_empty())
            .then(|| HeaderValue::try_from(field).ok())
            .flatten()
    }

    /// A guard that gives back an admitted request's concurrency units.
    pub(crate) fn release_guard(&self, a: &Admitted) -> Option<ReleaseGuard> {
        let cost = a.release?;
        let plan = a.limits.inner.plans[a.plan].plan.clone();
        let key = a.key.of(&a.limits.inner).to_string();
        let this = self.clone();
        Some(ReleaseGuard::new(async move {
            let sh = &*this.shared;
            if let Err(e) = sh.store.release(&plan, &key, cost, sh.clock.now()).await {
                tracing::warn!(error = %e, "releasing concurrency units failed");
            }
        }))
    }
}

impl<S: Store, C: Clock> RateLimiter<S, C> {
    /// Gives back an admitted request's charge, its upstream's answer
    /// having never come: always when it was shed; when it never reached
    /// the upstream, unless its plan charges upstream failures; when it
    /// reached it, only if its plan refunds those too. The fields of the
    /// answer then tell the budget as it stands after.
    pub(crate) async fn refund(&self, a: &mut Admitted, failed: crate::UpstreamFailed) {
        let Some((cost, charged)) = a.refund else {
            return;
        };
        let limits = a.limits.clone();
        let compiled = &limits.inner.plans[a.plan];
        let give = match failed {
            crate::UpstreamFailed::Shed => true,
            crate::UpstreamFailed::NeverSent => !compiled.charge_upstream_failures,
            crate::UpstreamFailed::AfterSending => {
                !compiled.charge_upstream_failures && compiled.refund_sent_failures
            }
        };
        if !give {
            return;
        }
        let sh = &*self.shared;
        let now = sh.clock.now();
        let key = a.key.of(&limits.inner);
        let given = sh.store.refund(&compiled.plan, key, cost, charged, now);
        if let Err(e) = given.await {
            tracing::warn!(error = %e, "giving back an upstream failure's charge failed");
            return;
        }
        telemetry::refunded(&compiled.name);
        // read without charging, for the answer's fields
        let standing = sh
            .store
            .check_cost(&compiled.plan, key, Cost::requests(0), now);
        if let Ok(d) = standing.await {
            a.decision = d;
        }
    }
}

impl<S: Store, C: Clock> RateLimiter<S, C> {
    /// Settles an admitted request's charge in its named unit from its
    /// answer's head, when its route names where the answer reports its
    /// use: at once when the head holds it (the fields of the answer then
    /// tell the budget after the settle), else the meter that settles when
    /// the body has told (its trailer, its JSON, its last event). Nothing
    /// for a request that was not charged (an escalation hold), or whose
    /// charge went back (an upstream failure).
    pub(crate) async fn settle_head(&self, a: &mut Admitted, head: &HeaderMap) -> Option<Meter> {
        let source = a.reported.take()?;
        let (charged, at) = a.refund?;
        let key = a.key.of(&a.limits.inner).to_string();
        let compiled = &a.limits.inner.plans[a.plan];
        let (plan, name) = (compiled.plan.clone(), compiled.name.clone());
        if let Some(used) = source.read_headers(head) {
            let sh = &*self.shared;
            self.settle_units(&plan, &name, &key, charged, at, used)
                .await;
            let standing = sh
                .store
                .check_cost(&plan, &key, Cost::requests(0), sh.clock.now());
            if let Ok(d) = standing.await {
                a.decision = d;
            }
            return None;
        }
        let this = self.clone();
        let settler: Settler = Box::new(move |used| {
            Box::pin(async move {
                this.settle_units(&plan, &name, &key, charged, at, used)
                    .await;
            })
        });
        Meter::new(source, head, settler)
    }

    /// Charges or gives back the difference between `charged` and the
    /// `used` units the answer reported.
    async fn settle_units(
        &self,
        plan: &paceline_core::Plan,
        name: &Arc<str>,
        key: &str,
        charged: Cost,
        at: Nanos,
        used: u64,
    ) {
        let sh = &*self.shared;
        let actual = charged.with_units(used);
        let now = sh.clock.now();
        match sh.store.settle(plan, key, charged, actual, at, now).await {
            Ok(()) => telemetry::settled(name, charged.units, used),
            Err(e) => tracing::warn!(error = %e, "settling a charge from the answer failed"),
        }
    }
}

impl Admitted {
    /// Whether the answer is to report the request's use (see
    /// [`RateLimiter::settle_head`]).
    pub(crate) fn reports_usage(&self) -> bool {
        self.reported.is_some()
    }

    /// Adds the rate-limit fields (and a soft-limit warning) to a response.
    pub(crate) fn decorate(&self, headers: &mut HeaderMap) {
        let lim = &self.limits.inner;
        let compiled = &lim.plans[self.plan];
        let (plan, meta) = (&compiled.plan, &compiled.meta);
        meta.write_fields(plan, &self.decision, &lim.dialects, self.publish, headers);
        if let Some(w) = &self.warning {
            headers.insert(WARNING_HEADER, w.clone());
        }
    }
}

fn escalated(plan: &Arc<str>, keys: &PlanKeys, key: KeyHash, level: Level, wait: Nanos) {
    telemetry::escalation(keys, level);
    tracing::warn!(plan = %plan, key = %key, level = level.as_str(), wait_s = wait.as_secs_ceil(), "key escalated: it keeps sending inside its Retry-After window");
}

fn outcome_label(d: &Decision) -> OutcomeLabel {
    match d.outcome {
        Outcome::Allowed => OutcomeLabel::Allowed,
        Outcome::Denied(den) if den.kind == PolicyKind::Quota => OutcomeLabel::QuotaExhausted,
        Outcome::Denied(_) => OutcomeLabel::RateLimited,
        Outcome::CostExceedsBurst { .. } => OutcomeLabel::CostExceedsBurst,
    }
}

/// The header fields the layer reads, found in one pass over the head
/// (cheaper than hashing each name when a request carries a few dozen).
struct HeadFields<'a> {
    /// The first `Authorization` value.
    authorization: Option<&'a HeaderValue>,
    transfer_encoding: bool,
    /// The first `Content-Length` value.
    content_length: Option<&'a HeaderValue>,
    /// What decides whether the head is refused.
    check: HeadCheck,
}

impl<'a> HeadFields<'a> {
    fn of(h: &'a HeaderMap) -> Self {
        let mut f = HeadFields {
            authorization: None,
            transfer_encoding: false,
            content_length: None,
            check: HeadCheck::default(),
        };
        for (name, value) in h {
            if name == AUTHORIZATION {
                f.check.authorization(value);
                f.authorization.get_or_insert(value);
            } else if name == TRANSFER_ENCODING {
                f.check.transfer_encoding(value);
                f.transfer_encoding = true;
            } else if name == CONTENT_LENGTH {
                f.check.content_length(value);
                f.content_length.get_or_insert(value);
            } else if name == HOST {
                f.check.host(value);
            }
        }
        f
    }

    /// The announced body length (`Content-Length`); 0 when absent or not
    /// a number. A streamed body of unknown length is charged nothing.
    fn body_len(&self) -> u64 {
        self.content_length
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Whether the request sends a body (which a rejection leaves unread).
    fn has_body(&self) -> bool {
        self.transfer_encoding
            || self
                .content_length
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.trim() != "0")
    }
}

/// Who a request is counted as, and why it has no known key when it has
/// none. No one (and no stranger) is a request of an unlimited route; no
/// one with a stranger is a request to refuse with 401 (503 for a key
/// whose lookup failed). `now` is read only to verify a token.
#[allow(clippy::too_many_arguments)]
fn who(
    limits: &Limits,
    headers: &HeaderMap,
    extensions: &http::Extensions,
    peer: Option<&Peer>,
    fields: &HeadFields<'_>,
    route: &RouteInfo,
    usage: bool,
    now: impl Fn() -> Nanos,
) -> (Option<Who>, Option<Stranger>) {
    let lim = &*limits.inner;
    // the usage endpoint reports on the key, whatever its route says
    if route.unlimited && !usage {
        return (None, None);
    }
    let socket_peer = || peer_ip(extensions).or(peer.map(Peer::ip));
    let ip = || client_ip(headers, socket_peer(), &lim.trusted);
    let anonymous = |plan: usize| match ip() {
        Some(ip) => Who::ip(ip, peer, plan, false, lim),
        None => Who::owned("ip:unknown".to_string(), plan, false, &lim.hasher),
    };
    if route.anonymous {
        // the build makes sure an anonymous route has a plan
        return (
            route.anonymous_plan.or(lim.anonymous_plan).map(anonymous),
            None,
        );
    }
    // a stranger gets its treatment: the anonymous plan, or a refusal
    let stranger = |s: Stranger| {
        let treatment = match s {
            Stranger::Missing => lim.missing_key,
            Stranger::Unknown => lim.unknown_key,
            // the service behind may read it as somebody's key; a token
            // that does not verify names no one; a key that could not be
            // looked up may be anyone's
            Stranger::Unreadable | Stranger::BadToken(_) | Stranger::Unavailable => {
                KeyTreatment::Reject
            }
        };
        let who = match treatment {
            KeyTreatment::Anonymous => lim.anonymous_plan.map(anonymous),
            _ => None,
        };
        (who, Some(s))
    };
    // the plan the identity itself names (a token's claim, the consumer
    // header): `Some(None)` when it names a plan the limits do not have
    let mut claimed: Option<Option<usize>> = None;
    let read = match &lim.key_source {
        KeySource::ApiKey => fields
            .authorization
            .map(|v| read_authorization(v, lim.basic_auth)),
        KeySource::ClientIp => {
            let Some(ip) = ip() else {
                return stranger(Stranger::Missing);
            };
            // a configured address first, then its network's bucket
            let exact = match peer.and_then(|p| p.key(ip, lim)) {
                Some(k) => k.exact,
                None => configured_ip(lim, ip),
            };
            if let Some(i) = exact {
                return (Some(Who::configured(lim, i)), None);
            }
            return match lim.default_plan {
                Some(plan) => (Some(Who::ip(ip, peer, plan, true, lim)), None),
                None => stranger(Stranger::Unknown),
            };
        }
        KeySource::Route => route.pattern.as_deref().map(|p| Credential::Key(p.into())),
        KeySource::Header(name) => headers.get(name).map(read_key_field),
        KeySource::ClientCert => extensions
            .get::<crate::identity::ClientCert>()
            .map(|c| Credential::Key((&*c.subject).into())),
        KeySource::Jwt => {
            let Some(j) = &lim.jwt else {
                return stranger(Stranger::Unknown);
            };
            match fields
                .authorization
                .map(|v| read_authorization(v, BasicAuth::Refuse))
            {
                Some(Credential::Key(token)) => match j.jwt.verify(&token, now().as_secs_floor()) {
                    Ok((key, plan)) => {
                        claimed = plan.map(|p| j.plans.plan(&p, &lim.plan_index));
                        Some(Credential::Key(key.into()))
                    }
                    Err(e) => return stranger(Stranger::BadToken(e)),
                },
                other => other,
            }
        }
        KeySource::ConsumerHeader => {
            let Some(c) = &lim.consumer else {
                return stranger(Stranger::Unknown);
            };
            // from anyone but a trusted proxy, the headers say nothing
            if !socket_peer().is_some_and(|p| lim.trusted.contains(p)) {
                return stranger(Stranger::Missing);
            }
            match one_field(headers, &c.headers.key) {
                Err(()) => Some(Credential::Unreadable),
                Ok(None) => None,
                Ok(Some(v)) => {
                    if let Some(name) = &c.headers.plan {
                        match one_field(headers, name).map(|v| v.map(read_key_field)) {
                            Ok(None) => {}
                            Ok(Some(Credential::Key(p))) => {
                                claimed = Some(c.plans.plan(&p, &lim.plan_index));
                            }
                            _ => return stranger(Stranger::Unreadable),
                        }
                    }
                    Some(read_key_field(v))
                }
            }
        }
    };
    let l = match read {
        None => return stranger(Stranger::Missing),
        Some(Credential::Unreadable) => return stranger(Stranger::Unreadable),
        Some(Credential::Key(l)) => l,
    };
    // a configured key was prepared at build time: no allocation, no hash
    if let Some(&i) = lim.keys.get(&*l) {
        return (Some(Who::configured(lim, i)), None);
    }
    let owned = |plan: usize| {
        let prefix = key_prefix(&lim.key_source);
        let mut k = String::with_capacity(prefix.len() + l.len());
        k.push_str(prefix);
        k.push_str(&l);
        (Some(Who::owned(k, plan, true, &lim.hasher)), None)
    };
    // a key configured hashed counts as the key itself (hashed only when
    // some are configured)
    if let Some(plan) = lim.hashed_plan(&l) {
        return owned(plan);
    }
    if let Some(Some(plan)) = claimed {
        return owned(plan);
    }
    // a lookup made before this layer (the gateway's Redis key map), for
    // the very key the request sends
    if matches!(lim.key_source, KeySource::ApiKey | KeySource::Header(_)) {
        if let Some(found) = extensions.get::<KeyLookup>().filter(|f| *f.key == *l) {
            match &found.found {
                LookedUp::Plan(name) => {
                    if let Some(&plan) = lim.plan_index.get(&**name) {
                        return owned(plan);
                    }
                }
                LookedUp::Unavailable => return stranger(Stranger::Unavailable),
                _ => {}
            }
        }
    }
    match lim.default_plan {
        Some(plan) => owned(plan),
        None => stranger(Stranger::Unknown),
    }
}

/// The one value of `name` in `headers`: `Err` when it is sent twice
/// (which of the two counts is not guessed).
fn one_field<'h>(
    headers: &'h HeaderMap,
    name: &http::header::HeaderName,
) -> Result<Option<&'h HeaderValue>, ()> {
    let mut values = headers.get_all(name).iter();
    match (values.next(), values.next()) {
        (None, _) => Ok(None),
        (Some(v), None) => Ok(Some(v)),
        (Some(_), Some(_)) => Err(()),
    }
}

/// `ip:` and the client's network as `Display` writes it: the address
/// itself where the prefix is the whole address (`ip:203.0.113.9`), else
/// the network and its length (`ip:2001:db8:1:2::/64`).
fn ip_key(ip: std::net::IpAddr, prefixes: &IpPrefixes) -> String {
    let (net, len) = prefixes.group(ip);
    let mut s = String::with_capacity(3 + 39 + 4);
    s.push_str("ip:");
    paceline_wire::ip::push_ip(&mut s, net);
    if let Some(len) = len {
        use std::fmt::Write;
        let _ = write!(s, "/{len}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::ip_key;
    use crate::IpPrefixes;
    use std::net::IpAddr;

    #[test]
    fn ip_keys_read_as_the_address_displays() {
        let whole = IpPrefixes { v4: 32, v6: 128 };
        for a in [
            "127.0.0.1",
            "0.0.0.0",
            "255.255.255.255",
            "10.20.3.40",
            "::1",
            "2001:db8::7",
        ] {
            let ip: IpAddr = a.parse().unwrap();
            assert_eq!(ip_key(ip, &whole), format!("ip:{ip}"));
        }
        let d = IpPrefixes::default();
        assert_eq!(ip_key("10.20.3.40".parse().unwrap(), &d), "ip:10.20.3.40");
        assert_eq!(
            ip_key("2001:db8:0:7:1::9".parse().unwrap(), &d),
            "ip:2001:db8:0:7::/64"
        );
    }

    #[test]
    fn a_connections_per_ip_key_is_made_once_and_only_for_its_peer() {
        use super::{Peer, RateLimiter, StoreKey};
        use crate::{KeySource, PeerAddr, TrustedProxies};
        use paceline_core::{ManualClock, MemoryStore, Plan, Policy};
        let limits = |trusted: &str| {
            let plan = Plan::new("ip", vec![Policy::token_bucket("b", 8, 2).unwrap()]).unwrap();
            crate::Limits::builder()
                .plan(plan.clone())
                .key_source(KeySource::ClientIp)
                .default_plan("ip")
                .key("10.0.0.9", "ip")
                .trusted_proxies(TrustedProxies::parse([trusted]).unwrap())
                .build()
                .unwrap()
        };
        let clock = ManualClock::at_unix_secs(1_790_000_000);
        let limiter = RateLimiter::new(limits("10.0.0.1"), MemoryStore::new(), clock);
        let key = |p: &super::Prepared| {
            let who = p.who.as_ref().unwrap();
            let shared = match &who.key {
                StoreKey::Shared(k) => Some(k.clone()),
                _ => None,
            };
            (who.key(&p.limits.inner).to_string(), who.hash, shared)
        };
        let get = || http::Request::get("/").body(()).unwrap();
        // an IPv4-mapped peer is its IPv4 address
        let peer = Peer::new("::ffff:203.0.113.7".parse().unwrap());
        let (k1, h1, s1) = key(&limiter.prepare(&get(), Some(&peer), None));
        let (k2, h2, s2) = key(&limiter.prepare(&get(), Some(&peer), None));
        assert_eq!(
            (k1.as_str(), h1),
            ("ip:203.0.113.7", limiter.limits().key_hasher().hash(&k1))
        );
        assert_eq!((k2, h2), (k1.clone(), h1));
        assert!(
            std::sync::Arc::ptr_eq(&s1.unwrap(), &s2.unwrap()),
            "made once"
        );
        // the same key as a request without the connection's peer gets
        let alone = http::Request::get("/")
            .extension(PeerAddr("203.0.113.7:9".parse().unwrap()))
            .body(())
            .unwrap();
        let (k, h, s) = key(&limiter.prepare(&alone, None, None));
        assert_eq!((k.as_str(), h, s.is_none()), ("ip:203.0.113.7", h1, true));
        // another client behind a trusted proxy: its own key
        let proxy = Peer::new("10.0.0.1".parse().unwrap());
        let fwd = http::Request::get("/")
            .header("x-forwarded-for", "198.51.100.4")
            .body(())
            .unwrap();
        let (k, _, s) = key(&limiter.prepare(&fwd, Some(&proxy), None));
        assert_eq!((k.as_str(), s.is_none()), ("ip:198.51.100.4", true));
        let (k, _, _) = key(&limiter.prepare(&get(), Some(&proxy), None));
        assert_eq!(k, "ip:10.0.0.1");
        // a configured address is its configured key
        let listed = Peer::new("10.0.0.9".parse().unwrap());
        let p = limiter.prepare(&get(), Some(&listed), None);
        assert!(matches!(
            p.who.as_ref().unwrap().key,
            StoreKey::Configured(_)
        ));
        // limits reloaded: their own key, the same text
        limiter.reload(limits("10.0.0.2"));
        let (k, h, s) = key(&limiter.prepare(&get(), Some(&peer), None));
        assert_eq!((k, h, s.is_none()), (k1, h1, true));
    }

    #[test]
    fn peek_key_reads_a_configured_key_without_charging() {
        use paceline_core::{ManualClock, MemoryStore, Nanos, Plan, Policy};
        let clock = ManualClock::at_unix_secs(1_790_000_000);
        let plan = Plan::new("race", vec![Policy::token_bucket("burst", 8, 2).unwrap()]).unwrap();
        let limits = crate::Limits::builder()
            .plan(plan)
            .key("sk_a", "race")
            .build()
            .unwrap();
        let limiter = super::RateLimiter::new(limits, MemoryStore::new(), clock.clone());
        let left = |l: &super::RateLimiter<MemoryStore, ManualClock>| {
            let (plan, d) = l.peek_key("sk_a").unwrap();
            assert_eq!(plan.name(), "race");
            (d.statuses[0].remaining, d.statuses[0].reset_after)
        };
        assert_eq!(left(&limiter), (8, Nanos::ZERO));
        assert_eq!(left(&limiter), (8, Nanos::ZERO), "a peek charges nothing");
        let req = http::Request::get("/")
            .header("authorization", "Bearer sk_a")
            .body(())
            .unwrap();
        for _ in 0..3 {
            let mut p = limiter.prepare(&req, None, None);
            assert!(limiter.decide_now(&mut p).is_ok());
        }
        assert_eq!(left(&limiter), (5, Nanos::from_millis(750)));
        assert!(limiter.peek_key("sk_unknown").is_none());
    }
}
