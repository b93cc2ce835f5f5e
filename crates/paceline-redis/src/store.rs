//! [`RedisStore`]: the [`Store`] contract over Redis.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use paceline_core::{
    check_each, Algorithm, Cost, Decision, FailMode, GroupDecision, GroupItem, MemoryStore, Nanos,
    Plan, Policy, Store, StoreError,
};
use parking_lot::Mutex;
use smallvec::SmallVec;

use crate::batch::{self, Batcher, Counters, Req, Reqs, Settings};
use crate::cache::DenyCache;
use crate::config::{ClockSource, ConfigError, RedisStoreConfig};
use crate::degraded::Taken;
use crate::keys::KeyNamer;
use crate::link::Link;
use crate::script::{Op, PlanCache};
use crate::standing::Standing;
use paceline_core::lease::Answered;

/// The longest window of a token bucket or sliding window the store
/// takes: 30 days (its arithmetic stays exact below 2^53 nanoseconds).
/// Fixed and calendar windows may be as long as any policy.
pub const MAX_SLIDING_WINDOW_SECS: u64 = 30 * 86_400;
/// The largest concurrency cap the store takes (each lease is kept with
/// the instant it was taken, so one left behind can expire).
pub const MAX_CONCURRENCY_QUOTA: u64 = 65_536;
/// The largest quota of a sliding counter the store takes.
pub const MAX_COUNTER_QUOTA: u64 = (1 << 31) - 1;

/// What a store has done, for tests and diagnostics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RedisStats {
    /// Calls sent to Redis (one per batch).
    pub calls: u64,
    /// Of those, calls a deciding task sent itself: no call was in flight
    /// and nothing queued, so the decision did not wait for the batcher.
    pub direct: u64,
    /// Decisions carried by those calls.
    pub sent: u64,
    /// Calls that failed.
    pub errors: u64,
    /// Denials answered by the local cache, with no round trip.
    pub cache_hits: u64,
    /// Decisions made by the degraded local limiter.
    pub degraded: u64,
    /// Decisions of leased plans answered from a slice (or a remembered
    /// refusal), with no round trip.
    pub leased: u64,
    /// Calls that took a slice of a leased plan's budget.
    pub lease_calls: u64,
    /// Units of slices given back unused.
    pub lease_returned: u64,
}

/// A [`Store`] in Redis: all of a request's policies are checked and
/// charged in one atomic server-side step, so every instance on the same
/// Redis shares one count. Clones share everything.
///
/// See the crate documentation for an example.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    namer: KeyNamer,
    link: Arc<Link>,
    batcher: Batcher,
    plans: PlanCache,
    clock: ClockSource,
    cluster: bool,
    deadline: std::time::Duration,
    counters: Arc<Counters>,
    cache: DenyCache,
    cache_hits: AtomicU64,
    degraded: Option<Degraded>,
    standing: Standing,
    idempotency_deadline: std::time::Duration,
    leases: paceline_core::lease::Leases,
    /// Woken when a lease's answer lands (see `decide_leased`).
    landed: tokio::sync::Notify,
    /// Exact decisions answered without Redis for a while after it
    /// failed a call (see `decide`).
    breaker: Breaker,
}

/// After Redis fails a call, exact decisions are answered at once (the
/// degraded limiter, or each policy's fail mode) for one probe interval
/// instead of each waiting out the deadline; then one decision probes
/// Redis, and a success closes it. Read on tokio's clock, as the
/// deadline is.
struct Breaker {
    open: AtomicBool,
    /// Until when decisions skip Redis, and what it last failed with.
    until: parking_lot::Mutex<(Option<tokio::time::Instant>, String)>,
    interval: std::time::Duration,
}

impl Breaker {
    /// Whether to answer without Redis now (`false` for the one caller
    /// a period that probes it).
    fn skip(&self) -> Option<String> {
        if !self.open.load(Ordering::Relaxed) {
            return None;
        }
        let now = tokio::time::Instant::now();
        let mut g = self.until.lock();
        match g.0 {
            Some(until) if now < until => Some(g.1.clone()),
            _ => {
                g.0 = Some(now + self.interval);
                None
            }
        }
    }

    fn record(&self, failure: Option<&str>) {
        match failure {
            Some(m) => {
                let mut g = self.until.lock();
                g.0 = Some(tokio::time::Instant::now() + self.interval);
                m.clone_into(&mut g.1);
                self.open.store(true, Ordering::Relaxed);
            }
            None if self.open.load(Ordering::Relaxed) => {
                self.open.store(false, Ordering::Relaxed);
                self.until.lock().0 = None;
            }
            None => {}
        }
    }
}

struct Degraded {
    share: f64,
    store: MemoryStore,
    /// Scaled plans by identity, with the plan each was made from.
    plans: Mutex<HashMap<u64, (Plan, Plan)>>,
    decisions: AtomicU64,
    since: Mutex<Option<Instant>>,
    /// What it charged and leased, so that only that goes back to it.
    taken: Mutex<Taken>,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

/// Whether the store can hold `plan` exactly: token buckets and sliding
/// windows up to [`MAX_SLIDING_WINDOW_SECS`], sliding counters up to
/// [`MAX_COUNTER_QUOTA`], concurrency caps up to [`MAX_CONCURRENCY_QUOTA`];
/// everything else as the memory store does.
pub fn supports(plan: &Plan) -> Result<(), String> {
    for p in plan.policies() {
        supports_policy(p)?;
    }
    paceline_core::lease::leasable(plan)
}

fn supports_policy(p: &Policy) -> Result<(), String> {
    let sliding = matches!(
        p.algorithm(),
        Algorithm::TokenBucket | Algorithm::SlidingLog | Algorithm::SlidingCounter
    );
    let capacity_s = p
        .emission_interval()
        .as_u64()
        .saturating_mul(p.burst())
        .div_ceil(1_000_000_000);
    if sliding && p.window_s().max(capacity_s) > MAX_SLIDING_WINDOW_SECS {
        return Err(format!(
            "policy {:?}: a {} over Redis may span at most {MAX_SLIDING_WINDOW_SECS} s (30 days); use a fixed window for longer quotas",
            p.name(),
            p.algorithm().name()
        ));
    }
    if p.algorithm() == Algorithm::Concurrency && p.quota() > MAX_CONCURRENCY_QUOTA {
        return Err(format!(
            "policy {:?}: a concurrency cap over Redis holds at most {MAX_CONCURRENCY_QUOTA}",
            p.name()
        ));
    }
    if p.algorithm() == Algorithm::SlidingCounter && p.quota() > MAX_COUNTER_QUOTA {
        return Err(format!(
            "policy {:?}: a sliding_counter over Redis counts at most {MAX_COUNTER_QUOTA}",
            p.name()
        ));
    }
    Ok(())
}

fn setup(e: StoreError) -> ConfigError {
    ConfigError {
        field: "urls",
        message: e.to_string(),
    }
}

impl RedisStore {
    /// Connects (a single server lazily: one that is down at start is not
    /// an error) and starts the batcher. Call inside a Tokio runtime.
    pub async fn connect(config: RedisStoreConfig) -> Result<RedisStore, ConfigError> {
        config.validate()?;
        let link = Arc::new(Link::connect(&config).await.map_err(setup)?);
        // the library, before the first decision waits for it (bounded:
        // a server that does not answer soon is left to load on demand)
        let _ = tokio::time::timeout(config.connect_timeout * 2, link.preload()).await;
        let counters = Arc::new(Counters::default());
        let ms = |d: std::time::Duration| d.as_millis().min(u128::from(u64::MAX)) as u64;
        let settings = Settings {
            cluster: config.cluster,
            connections: config.connections,
            batch_max: config.batch_max,
            linger: config.batch_linger,
            max_in_flight: config.max_in_flight,
            deadline: config.deadline,
            ttl_slack_ms: ms(config.ttl_slack).max(1),
            lease_ttl_ms: ms(config.lease_ttl).max(1),
        };
        let batcher = batch::start(link.clone(), settings, config.queue, counters.clone());
        let degraded = config.degraded.map(|d| Degraded {
            share: d.share,
            store: MemoryStore::new(),
            plans: Mutex::new(HashMap::new()),
            decisions: AtomicU64::new(0),
            since: Mutex::new(None),
            taken: Mutex::new(Taken::default()),
        });
        Ok(RedisStore {
            inner: Arc::new(Inner {
                namer: KeyNamer::new(&config.key_secret, &config.prefix),
                link,
                batcher,
                plans: PlanCache::default(),
                clock: config.clock,
                cluster: config.cluster,
                deadline: config.deadline,
                counters,
                cache: DenyCache::new(config.deny_cache),
                cache_hits: AtomicU64::new(0),
                degraded,
                standing: Standing::new(config.standing_keys),
                idempotency_deadline: config.idempotency_deadline,
                leases: paceline_core::lease::Leases::new(Nanos::new(
                    config.slice.as_nanos().min(u128::from(u64::MAX)) as u64,
                )),
                landed: tokio::sync::Notify::new(),
                breaker: Breaker {
                    open: AtomicBool::new(false),
                    until: parking_lot::Mutex::new((None, String::new())),
                    interval: config.slice.max(std::time::Duration::from_millis(1)),
                },
            }),
        })
    }

    /// An idempotency store on this store's connections and key prefix,
    /// its entries named under `key_secret` (a secret of its own, not the
    /// limiter's rows' one), each step cut at the configured
    /// [`RedisStoreConfig::idempotency_deadline`].
    pub fn idempotency_store(&self, key_secret: &[u8]) -> crate::RedisIdempotencyStore {
        crate::idempotency::RedisIdempotencyStore::on_link(
            self.inner.link.clone(),
            key_secret,
            self.inner.namer.prefix(),
            self.inner.idempotency_deadline,
        )
    }

    /// What the store has done so far.
    pub fn stats(&self) -> RedisStats {
        let i = &self.inner;
        RedisStats {
            calls: i.counters.calls.load(Ordering::Relaxed),
            direct: i.counters.direct.load(Ordering::Relaxed),
            sent: i.counters.sent.load(Ordering::Relaxed),
            errors: i.counters.errors.load(Ordering::Relaxed),
            cache_hits: i.cache_hits.load(Ordering::Relaxed),
            degraded: i
                .degraded
                .as_ref()
                .map_or(0, |d| d.decisions.load(Ordering::Relaxed)),
            leased: i.leases.counters.local.load(Ordering::Relaxed),
            lease_calls: i.leases.counters.calls.load(Ordering::Relaxed),
            lease_returned: i.leases.counters.returned.load(Ordering::Relaxed),
        }
    }

    /// Whether Redis answers a `PING` within the store's deadline: the
    /// round trip, or why not. For readiness probes: it goes on the
    /// store's own connection, so it sees what the decisions see.
    pub async fn ping(&self) -> Result<std::time::Duration, StoreError> {
        let started = Instant::now();
        let deadline = self.inner.deadline;
        match tokio::time::timeout(deadline, self.inner.link.command(&redis::cmd("PING"))).await {
            Ok(Ok(_)) => Ok(started.elapsed()),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(StoreError::Unavailable(format!(
                "no answer to PING within {} ms",
                deadline.as_millis()
            ))),
        }
    }

    /// The deadline of one call to Redis.
    pub fn deadline(&self) -> std::time::Duration {
        self.inner.deadline
    }

    /// Whether the store has a degraded mode (a share of each quota decided
    /// locally while Redis is unreachable), and whether it is in it now.
    pub fn degraded_mode(&self) -> (bool, bool) {
        match &self.inner.degraded {
            None => (false, false),
            Some(d) => (true, d.since.lock().is_some()),
        }
    }

    /// `HGET key field`, within the store's deadline: the field's value,
    /// `None` when the hash or the field is not there. For a lookup made
    /// before a decision (the gateway's Redis key map), on the store's own
    /// connections.
    pub async fn hget(&self, key: &str, field: &str) -> Result<Option<String>, StoreError> {
        let mut cmd = redis::cmd("HGET");
        cmd.arg(key).arg(field);
        let deadline = self.inner.deadline;
        match tokio::time::timeout(deadline, self.inner.link.command(&cmd)).await {
            Ok(Ok(redis::Value::Nil)) => Ok(None),
            Ok(Ok(v)) => redis::from_redis_value::<String>(v)
                .map(Some)
                .map_err(|e| StoreError::Protocol(format!("HGET {key}: {e}"))),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(StoreError::Unavailable(format!(
                "no answer to HGET within {} ms",
                deadline.as_millis()
            ))),
        }
    }

    /// Sends one plain command to a server (tests and diagnostics), within
    /// the deadline.
    pub async fn command(&self, cmd: &redis::Cmd) -> Result<redis::Value, StoreError> {
        match tokio::time::timeout(self.inner.deadline * 20, self.inner.link.command(cmd)).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::Unavailable("no answer".into())),
        }
    }

    /// Sends one decision (through the batcher, or at once when no batch
    /// is gathering) and waits for its answer, at most the deadline.
    async fn submit(
        &self,
        plan: &Plan,
        hash: u128,
        op: Op,
        now: Nanos,
    ) -> Result<Option<Decision>, StoreError> {
        let i = &self.inner;
        let spec = i.plans.get(plan).spec.clone();
        self.send(plan, spec, hash, op, now).await
    }

    async fn send(
        &self,
        plan: &Plan,
        spec: Arc<str>,
        hash: u128,
        op: Op,
        now: Nanos,
    ) -> Result<Option<Decision>, StoreError> {
        let i = &self.inner;
        let (row, slot) = i.namer.row_of(plan, hash);
        let req = Req {
            row,
            // one server holds every slot: any decisions share a call
            slot: if i.cluster { slot } else { 0 },
            plan: plan.clone(),
            spec,
            op,
            now: (i.clock == ClockSource::Caller).then_some(now),
            joins: false,
        };
        i.batcher.submit(req).await
    }

    /// The group check (see [`Store::check_all`]): every item in one call,
    /// decided on the server as one step (`core.lua`'s groups), so a
    /// refused group charges nothing and no other caller ever sees its
    /// charges. A group whose item the deny cache holds is refused here,
    /// with no round trip: that item cannot fit before its retry time, so
    /// Redis would refuse the group too and charge nothing (the other
    /// items are then not asked: `None`). On a cluster, a group's rows
    /// must share a slot to be one call; a group across slots is decided
    /// item by item ([`check_each`]), its charges given back on a refusal.
    async fn decide_all(
        &self,
        items: &[GroupItem<'_>],
        now: Nanos,
    ) -> Result<GroupDecision, StoreError> {
        let i = &self.inner;
        if items.is_empty() {
            return Ok(GroupDecision {
                decisions: Vec::new(),
            });
        }
        let mut reqs: Reqs = Reqs::with_capacity(items.len());
        let mut hashes: SmallVec<[u128; 4]> = SmallVec::with_capacity(items.len());
        for (k, it) in items.iter().enumerate() {
            let info = i.plans.get(it.plan);
            if let Err(e) = &info.supported {
                return Err(StoreError::Protocol(e.clone()));
            }
            let hash = i.namer.hash(it.key);
            let (row, slot) = i.namer.row_of(it.plan, hash);
            hashes.push(hash);
            reqs.push(Req {
                row,
                slot: if i.cluster { slot } else { 0 },
                plan: it.plan.clone(),
                spec: info.spec.clone(),
                op: Op::Check {
                    requests: it.cost.requests,
                    bytes: crate::script::second(it.plan, it.cost),
                },
                now: (i.clock == ClockSource::Caller).then_some(now),
                joins: k > 0,
            });
        }
        if reqs.iter().any(|r| r.slot != reqs[0].slot) {
            return check_each(self, items, now).await;
        }
        if let Some(g) = self.refused_locally(items, &hashes, now) {
            return Ok(g);
        }
        // a row the group asks twice: its second answer saw the first's
        // charge, which a refusal takes back, so neither is kept
        let once: SmallVec<[bool; 4]> = reqs
            .iter()
            .map(|r| reqs.iter().filter(|o| o.row == r.row).count() == 1)
            .collect();
        let answers = match i.batcher.submit_all(reqs).await {
            Ok(a) => a,
            Err(e @ StoreError::Unavailable(_)) => {
                return self.degraded_all(items, now).ok_or(e);
            }
            Err(e) => return Err(e),
        };
        self.recovered();
        let mut decisions = Vec::with_capacity(items.len());
        for (k, a) in answers.into_iter().enumerate() {
            let Some(d) = a else {
                return Err(StoreError::Protocol("a check answered no decision".into()));
            };
            let (it, hash) = (&items[k], hashes[k]);
            if once[k] {
                let c = it.cost;
                i.cache.put(
                    it.plan,
                    hash,
                    c.requests,
                    crate::script::second(it.plan, c),
                    now,
                    &d,
                );
                i.standing.put(it.plan, hash, now, &d);
            }
            decisions.push(Some(d));
        }
        Ok(GroupDecision { decisions })
    }

    /// A group refused by an item the deny cache holds (for at least its
    /// cost): that item's cached denial, the others not asked.
    fn refused_locally(
        &self,
        items: &[GroupItem<'_>],
        hashes: &[u128],
        now: Nanos,
    ) -> Option<GroupDecision> {
        let (k, d) = items
            .iter()
            .zip(hashes)
            .enumerate()
            .find_map(|(k, (it, &h))| {
                let c = it.cost;
                if c.requests == 0 && c.bytes == 0 && c.units == 0 {
                    return None;
                }
                let d = self.cached(it.plan, h, c, now)?;
                (!d.is_allowed()).then_some((k, d))
            })?;
        let mut decisions = vec![None; items.len()];
        decisions[k] = Some(d);
        Some(GroupDecision { decisions })
    }

    /// The answer the local cache holds for this decision: a denial that
    /// stands until its retry time (only a plan Redis answered for can be
    /// there).
    fn cached(&self, plan: &Plan, hash: u128, cost: Cost, now: Nanos) -> Option<Decision> {
        let i = &self.inner;
        let d = i.cache.get(
            plan,
            hash,
            cost.requests,
            crate::script::second(plan, cost),
            now,
        )?;
        i.cache_hits.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("paceline_redis_deny_cache_hits_total").increment(1);
        Some(d)
    }

    async fn decide(
        &self,
        plan: &Plan,
        key: &str,
        cost: Cost,
        now: Nanos,
    ) -> Result<Decision, StoreError> {
        let i = &self.inner;
        // the spec and the support check, once per plan
        let info = i.plans.get(plan);
        if let Err(e) = &info.supported {
            return Err(StoreError::Protocol(e.clone()));
        }
        let hash = i.namer.hash(key);
        if let Some(max) = paceline_core::lease::max_slice(plan) {
            drop(info);
            return self.decide_leased(plan, key, hash, cost, max, now).await;
        }
        if let Some(d) = self.cached(plan, hash, cost, now) {
            return Ok(d);
        }
        let op = Op::Check {
            requests: cost.requests,
            bytes: crate::script::second(plan, cost),
        };
        let spec = info.spec.clone();
        drop(info);
        // Redis failed a call a moment ago: answer at once (the degraded
        // limiter, or the policies' fail mode) instead of making every
        // decision wait out the deadline; one decision a slice's time
        // probes it
        if let Some(why) = i.breaker.skip() {
            return match self.degraded(plan, key, cost, now) {
                Some(d) => Ok(d),
                None => Err(StoreError::Unavailable(format!(
                    "{why} (a moment ago; Redis is probed again shortly)"
                ))),
            };
        }
        let sent = self.send(plan, spec, hash, op, now).await;
        i.breaker.record(match &sent {
            Err(StoreError::Unavailable(m)) => Some(m),
            _ => None,
        });
        match sent {
            Ok(Some(d)) => {
                self.recovered();
                i.cache.put(
                    plan,
                    hash,
                    cost.requests,
                    crate::script::second(plan, cost),
                    now,
                    &d,
                );
                i.standing.put(plan, hash, now, &d);
                Ok(d)
            }
            Ok(None) => Err(StoreError::Protocol("a check answered no decision".into())),
            Err(e @ StoreError::Unavailable(_)) => match self.degraded(plan, key, cost, now) {
                Some(d) => Ok(d),
                None => Err(e),
            },
            Err(e) => Err(e),
        }
    }

    /// A decision of a leased plan (see `lease.rs`): from the key's slice
    /// when it can; else a slice taken from Redis (one round trip), of
    /// which the request takes its cost; a refused slice is remembered
    /// until its wait. Redis unreachable: the degraded limiter, as in
    /// exact mode.
    async fn decide_leased(
        &self,
        plan: &Plan,
        key: &str,
        hash: u128,
        cost: Cost,
        max: u64,
        now: Nanos,
    ) -> Result<Decision, StoreError> {
        use paceline_core::lease::Local;
        let i = &self.inner;
        let leases = &i.leases;
        self.give_back(leases.sweep(now), now);
        let c = cost.requests;
        // another decision's slice on its way: wait for it to land (once,
        // at most the deadline; armed before looking again, so a landing in
        // between is not missed) and look again, so the callers of a key
        // whose slice ran out do not each ask
        let mut looked = leases.local(plan, max, hash, c, now, true);
        if let Some(Local::Wait) = looked {
            let landed = i.landed.notified();
            tokio::pin!(landed);
            landed.as_mut().enable();
            looked = leases.local(plan, max, hash, c, now, true);
            if let Some(Local::Wait) = looked {
                let _ = tokio::time::timeout(i.deadline, landed).await;
                looked = leases.local(plan, max, hash, c, now, true);
            }
        }
        let (want, give) = match looked {
            Some(Local::Decided(d, ahead)) => {
                self.note_leased(ahead, plan, hash, now);
                return Ok(d);
            }
            Some(Local::Ask { want, give_back }) => (want, give_back),
            Some(Local::Wait) | None => (c.max(1), None),
        };
        let r = self
            .lease_call(plan, key, hash, cost, want, give, now)
            .await;
        // whatever came of it, the key's slice is no longer on its way
        leases.fetch_done(plan, hash);
        i.landed.notify_waiters();
        r
    }

    /// The round trip of [`decide_leased`](Self::decide_leased): gives
    /// back what a lapsed slice held, takes a slice of `want` units, and
    /// reads the answer into the key's slice.
    #[allow(clippy::too_many_arguments)]
    async fn lease_call(
        &self,
        plan: &Plan,
        key: &str,
        hash: u128,
        cost: Cost,
        want: u64,
        give: Option<(u64, Nanos)>,
        now: Nanos,
    ) -> Result<Decision, StoreError> {
        let i = &self.inner;
        let leases = &i.leases;
        let c = cost.requests;
        if let Some((n, at)) = give {
            self.give_back(Some(vec![(plan.clone(), hash, n, at)]), now);
        }
        if i.degraded.is_some() && leases.down(now) {
            // Redis failed a moment ago: no wait for it on every decision
            if let Some(d) = self.degraded(plan, key, cost, now) {
                return Ok(d);
            }
        }
        let taken = match c {
            // a read charges nothing and takes no slice
            0 => self.take(plan, hash, 0, now).await,
            _ => self.take(plan, hash, want, now).await,
        };
        let mut d = match taken {
            Ok(d) => d,
            Err(e @ StoreError::Unavailable(_)) => {
                leases.failed(now, true);
                return match self.degraded(plan, key, cost, now) {
                    Some(d) => Ok(d),
                    None => Err(e),
                };
            }
            Err(e) => return Err(e),
        };
        leases.failed(now, false);
        self.recovered();
        if c == 0 {
            return Ok(d);
        }
        // a slice that comes within a slice's time is waited for,
        // refusing meanwhile, so a key at its limit costs a round trip per
        // slice, not per refill
        let mut asked = want;
        let d = loop {
            i.standing.put(plan, hash, now, &d);
            match leases.answer(plan, hash, asked, c, now, d, asked == want) {
                Answered::Done(done) => break done,
                Answered::Retry(units) => {
                    asked = units;
                    d = self.take(plan, hash, units, now).await?;
                }
            }
        };
        if d.is_allowed() {
            metrics::histogram!("paceline_redis_lease_slice_units").record(asked as f64);
        }
        Ok(d)
    }

    /// Takes a slice of `units` of a leased plan's budget: a check of
    /// that cost, counted as a lease call (0 units: a read, not counted).
    async fn take(
        &self,
        plan: &Plan,
        hash: u128,
        units: u64,
        now: Nanos,
    ) -> Result<Decision, StoreError> {
        // a read of the standing (0 units) is no lease
        if units > 0 {
            let counters = &self.inner.leases.counters;
            counters.calls.fetch_add(1, Ordering::Relaxed);
            metrics::counter!("paceline_redis_lease_calls_total").increment(1);
        }
        let op = Op::Check {
            requests: units,
            bytes: 0,
        };
        match self.submit(plan, hash, op, now).await? {
            Some(d) => Ok(d),
            None => Err(StoreError::Protocol("a lease answered no decision".into())),
        }
    }

    /// A decision answered from a slice: counted, and the next slice
    /// taken ahead of need when the slice asked for it.
    fn note_leased(&self, ahead: Option<u64>, plan: &Plan, hash: u128, now: Nanos) {
        metrics::counter!("paceline_redis_lease_decisions_total").increment(1);
        let Some(want) = ahead else {
            return;
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            self.inner.leases.fetch_done(plan, hash);
            return;
        };
        let (this, plan) = (self.clone(), plan.clone());
        rt.spawn(async move {
            match this.take(&plan, hash, want, now).await {
                Ok(d) => {
                    this.inner.standing.put(&plan, hash, now, &d);
                    // refused: the slice held goes on, and none is asked
                    // for again before the wait
                    let leases = &this.inner.leases;
                    let _ = leases.answer(&plan, hash, want, 0, now, d, false);
                }
                Err(_) => this.inner.leases.fetch_done(&plan, hash),
            }
            this.inner.landed.notify_waiters();
        });
    }

    /// Gives back the units of slices whose time is up (each with the
    /// instant it was charged), off the deciding path.
    fn give_back(&self, swept: Option<Vec<(Plan, u128, u64, Nanos)>>, now: Nanos) {
        let Some(items) = swept else {
            return;
        };
        let held = self.inner.leases.counters.held.load(Ordering::Relaxed);
        metrics::gauge!("paceline_redis_lease_units_held").set(held as f64);
        if items.is_empty() {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let this = self.clone();
        rt.spawn(async move {
            for (plan, hash, units, at) in items {
                let op = Op::Refund {
                    requests: units,
                    bytes: 0,
                    age_ns: now.saturating_sub(at).as_u64(),
                };
                match this.submit(&plan, hash, op, now).await {
                    Ok(_) => {
                        this.inner.standing.forget(&plan, hash);
                        this.inner.leases.returned(units);
                        metrics::counter!("paceline_redis_lease_returned_units_total")
                            .increment(units);
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, units, "a slice's units were not given back")
                    }
                }
            }
        });
    }

    /// The degraded local decision, when configured and every policy that
    /// decides fails open (a fail-closed one must still answer 503).
    fn degraded(&self, plan: &Plan, key: &str, cost: Cost, now: Nanos) -> Option<Decision> {
        let dg = self.inner.degraded.as_ref()?;
        let scaled = Self::degraded_plan(dg, plan)?;
        Self::enter_degraded(dg, 1);
        let d = dg.store.check_sync(&scaled, key, cost, now).ok()?;
        if d.is_allowed() {
            self.took_degraded(dg, plan, &scaled, key, cost, now);
        }
        Some(d)
    }

    /// The degraded local decision of a group: all or nothing, as the
    /// memory store decides a group, when every item's plan may decide
    /// degraded.
    fn degraded_all(&self, items: &[GroupItem<'_>], now: Nanos) -> Option<GroupDecision> {
        let dg = self.inner.degraded.as_ref()?;
        let scaled = items
            .iter()
            .map(|it| Self::degraded_plan(dg, it.plan))
            .collect::<Option<Vec<Plan>>>()?;
        Self::enter_degraded(dg, items.len() as u64);
        let local: Vec<GroupItem<'_>> = items
            .iter()
            .zip(&scaled)
            .map(|(it, p)| GroupItem::new(p, it.key, it.cost))
            .collect();
        let g = dg.store.check_all_sync(&local, now).ok()?;
        if g.is_admitted() {
            for (it, p) in items.iter().zip(&scaled) {
                self.took_degraded(dg, it.plan, p, it.key, it.cost, now);
            }
        }
        Some(g)
    }

    /// The degraded limiter's plan for `plan`, unless a policy that
    /// decides fails closed (it must still answer 503).
    fn degraded_plan(dg: &Degraded, plan: &Plan) -> Option<Plan> {
        let closed = plan
            .policies()
            .iter()
            .any(|p| !p.is_shadow() && p.fail_mode() == FailMode::Closed);
        if closed {
            return None;
        }
        let scaled = {
            let mut plans = dg.plans.lock();
            match plans.get(&plan.identity()) {
                Some((orig, scaled)) if orig == plan => scaled.clone(),
                _ => {
                    let scaled = scale(plan, dg.share)?;
                    if plans.len() >= 1024 {
                        plans.clear();
                    }
                    plans.insert(plan.identity(), (plan.clone(), scaled.clone()));
                    scaled
                }
            }
        };
        Some(scaled)
    }

    /// Counts `decisions` made degraded, and says so on the first.
    fn enter_degraded(dg: &Degraded, decisions: u64) {
        {
            let mut since = dg.since.lock();
            if since.is_none() {
                *since = Some(Instant::now());
                metrics::gauge!("paceline_redis_degraded").set(1.0);
                tracing::warn!("Redis unreachable: deciding locally on a share of each quota");
            }
        }
        dg.decisions.fetch_add(decisions, Ordering::Relaxed);
        metrics::counter!("paceline_redis_degraded_decisions_total").increment(decisions);
    }

    /// Remembers what the degraded limiter charged (on `scaled`, the
    /// degraded plan of `plan`), so only that comes back to it.
    fn took_degraded(
        &self,
        dg: &Degraded,
        plan: &Plan,
        scaled: &Plan,
        key: &str,
        cost: Cost,
        now: Nanos,
    ) {
        if cost.requests == 0 && cost.bytes == 0 && cost.units == 0 {
            return;
        }
        let hash = self.inner.namer.hash(key);
        let mut taken = dg.taken.lock();
        taken.charged(plan.identity(), hash, now);
        if plan.has_concurrency()
            && cost.requests > 0
            && !taken.leased(plan.identity(), hash, cost.requests)
        {
            // no room to remember the lease: it is not taken
            drop(taken);
            dg.store.release_sync(scaled, key, cost.requests, now);
        }
    }

    /// The degraded limiter's plan for `plan` (made again if it was swept
    /// from the table: scaling is deterministic).
    fn scaled(dg: &Degraded, plan: &Plan) -> Option<Plan> {
        match dg.plans.lock().get(&plan.identity()) {
            Some((orig, scaled)) if orig == plan => Some(scaled.clone()),
            _ => scale(plan, dg.share),
        }
    }

    /// Redis answered: leave degraded mode if in it.
    fn recovered(&self) {
        if let Some(dg) = &self.inner.degraded {
            let mut since = dg.since.lock();
            if let Some(t) = since.take() {
                let secs = t.elapsed().as_secs_f64();
                metrics::gauge!("paceline_redis_degraded").set(0.0);
                // each period whole, to the nanosecond: its sum is the time
                // spent degraded, its count the periods
                metrics::histogram!("paceline_redis_degraded_seconds").record(secs);
                tracing::info!(seconds = secs, "Redis reachable again");
            }
        }
    }
}

/// `plan` with every quota scaled by `share` (at least 1).
fn scale(plan: &Plan, share: f64) -> Option<Plan> {
    let policies = plan
        .policies()
        .iter()
        .map(|p| {
            let q = ((p.quota() as f64 * share).floor() as u64).max(1);
            let s = Policy::new(p.name(), p.algorithm(), q, p.window_s()).ok()?;
            let s = s.with_unit(p.unit()).ok()?;
            let s = match p.has_own_burst() {
                true => s
                    .with_burst(((p.burst() as f64 * share).floor() as u64).max(1))
                    .ok()?,
                false => s,
            };
            Some(
                s.with_kind(p.kind())
                    .with_fail_mode(p.fail_mode())
                    .with_shadow(p.is_shadow()),
            )
        })
        .collect::<Option<Vec<_>>>()?;
    Plan::new(plan.name(), policies).ok()
}

impl Store for RedisStore {
    /// A denial (or a read) the local cache answers, with no round trip.
    fn check_local(
        &self,
        plan: &Plan,
        key: &str,
        cost: Cost,
        now: Nanos,
    ) -> Option<Result<Decision, StoreError>> {
        let hash = self.inner.namer.hash(key);
        if let Some(max) = paceline_core::lease::max_slice(plan) {
            let leases = &self.inner.leases;
            self.give_back(leases.sweep(now), now);
            return match leases.local(plan, max, hash, cost.requests, now, false) {
                Some(paceline_core::lease::Local::Decided(d, ahead)) => {
                    self.note_leased(ahead, plan, hash, now);
                    Some(Ok(d))
                }
                _ => None,
            };
        }
        self.cached(plan, hash, cost, now).map(Ok)
    }

    fn check(
        &self,
        plan: &Plan,
        key: &str,
        cost: u64,
        now: Nanos,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        self.decide(plan, key, Cost::requests(cost), now)
    }

    fn check_cost(
        &self,
        plan: &Plan,
        key: &str,
        cost: Cost,
        now: Nanos,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        self.decide(plan, key, cost, now)
    }

    /// Every item in one atomic call (see `RedisStore::decide_all`).
    fn check_all(
        &self,
        items: &[GroupItem<'_>],
        now: Nanos,
    ) -> impl Future<Output = Result<GroupDecision, StoreError>> + Send {
        self.decide_all(items, now)
    }

    /// What Redis last answered this instance for the key, aged to `now`
    /// (see `standing.rs`); `None` for a key it has not answered.
    fn peek_local(&self, plan: &Plan, key: &str, now: Nanos) -> Option<Decision> {
        let i = &self.inner;
        i.standing.get(plan, i.namer.hash(key), now)
    }

    async fn release(
        &self,
        plan: &Plan,
        key: &str,
        amount: u64,
        now: Nanos,
    ) -> Result<(), StoreError> {
        let hash = self.inner.namer.hash(key);
        self.inner.standing.forget(plan, hash);
        let mut amount = amount;
        if let Some(dg) = &self.inner.degraded {
            // the units the degraded limiter leased go back there, the
            // rest to Redis: neither side is given what it never lent
            let local = dg.taken.lock().released(plan.identity(), hash, amount);
            if local > 0 {
                if let Some(scaled) = Self::scaled(dg, plan) {
                    dg.store.release_sync(&scaled, key, local, now);
                }
                amount -= local;
            }
            if amount == 0 {
                return Ok(());
            }
        }
        let r = self.submit(plan, hash, Op::Release { amount }, now).await;
        r.map(|_| ())
    }

    async fn refund(
        &self,
        plan: &Plan,
        key: &str,
        cost: Cost,
        charged: Nanos,
        now: Nanos,
    ) -> Result<(), StoreError> {
        let hash = self.inner.namer.hash(key);
        // a read after the refund must see it
        self.inner.standing.forget(plan, hash);
        if let Some(dg) = &self.inner.degraded {
            // a charge the degraded limiter made goes back there, and
            // only there: Redis never took it
            if dg.taken.lock().refunded(plan.identity(), hash, charged) {
                if let Some(scaled) = Self::scaled(dg, plan) {
                    dg.store.refund_sync(&scaled, key, cost, charged, now);
                }
                return Ok(());
            }
        }
        // a leased plan's charge goes back to the slice it came from,
        // while that slice lives: no round trip
        if paceline_core::lease::max_slice(plan).is_some()
            && self.inner.leases.refund(plan, hash, cost.requests, now)
        {
            return Ok(());
        }
        let op = Op::Refund {
            requests: cost.requests,
            bytes: crate::script::second(plan, cost),
            age_ns: now.saturating_sub(charged).as_u64(),
        };
        let r = self.submit(plan, hash, op, now).await;
        r.map(|_| ())
    }

    /// One atomic call, on the server's clock when the store uses it (the
    /// check's age is sent, not its instant). A check the degraded limiter
    /// admitted is settled there, and only there.
    async fn settle(
        &self,
        plan: &Plan,
        key: &str,
        charged: Cost,
        actual: Cost,
        charged_at: Nanos,
        now: Nanos,
    ) -> Result<(), StoreError> {
        let hash = self.inner.namer.hash(key);
        // a read after the settle must see it
        self.inner.standing.forget(plan, hash);
        if let Some(dg) = &self.inner.degraded {
            if dg.taken.lock().refunded(plan.identity(), hash, charged_at) {
                if let Some(scaled) = Self::scaled(dg, plan) {
                    dg.store
                        .settle_sync(&scaled, key, charged, actual, charged_at, now)?;
                }
                return Ok(());
            }
        }
        if charged == actual {
            return Ok(());
        }
        let op = Op::Settle {
            requests: crate::script::delta(charged.requests, actual.requests),
            bytes: crate::script::delta(
                crate::script::second(plan, charged),
                crate::script::second(plan, actual),
            ),
            age_ns: now.saturating_sub(charged_at).as_u64(),
        };
        let r = self.submit(plan, hash, op, now).await;
        r.map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_sliding_windows_are_refused_by_name() {
        let ok = Plan::new(
            "p",
            vec![
                Policy::token_bucket("b", 20, 2).unwrap(),
                Policy::fixed_window("year", 1_000_000, 366 * 86_400).unwrap(),
            ],
        )
        .unwrap();
        supports(&ok).unwrap();
        let long = Plan::new(
            "p",
            vec![Policy::token_bucket("slow", 20, 31 * 86_400).unwrap()],
        )
        .unwrap();
        assert!(supports(&long).unwrap_err().contains("\"slow\""));
        let big = Plan::new(
            "p",
            vec![Policy::sliding_counter("c", 1 << 32, 60).unwrap()],
        )
        .unwrap();
        assert!(supports(&big).is_err());
    }

    #[test]
    fn scaled_plans_keep_everything_but_the_quota() {
        let plan = Plan::new(
            "p",
            vec![
                Policy::token_bucket("b", 20, 2).unwrap(),
                Policy::concurrency("c", 2)
                    .unwrap()
                    .with_fail_mode(FailMode::Open),
            ],
        )
        .unwrap();
        let s = scale(&plan, 1.0 / 3.0).unwrap();
        assert_eq!(s.policy(0).quota(), 6);
        assert_eq!(s.policy(1).quota(), 1);
        assert_eq!(s.layout_fingerprint(), plan.layout_fingerprint());
    }
}
