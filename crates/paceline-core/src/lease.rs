//! Leased budgets: an instance takes a slice of a key's budget from Redis
//! in one atomic step (a check charging the slice's units on the server)
//! and decides from it locally, with no round trip, until the slice runs
//! out or its time is up. Then it asks again: a hot key's next slice is
//! taken ahead of need, when half of the current one is left, so its
//! decisions do not wait.
//!
//! **Slice sizes** follow the instance's own recent rate on the key (an
//! exponentially decaying count with a one-second time constant): a slice
//! holds what the instance uses in one slice time (`slice_ms`), at least
//! the request's cost and at most the policy's `max_slice`. A key used
//! rarely gets slices of one request: each decision is one round trip, as
//! in exact mode. The instance with the larger share of a key's traffic
//! takes the larger slices.
//!
//! **The overshoot bound.** Every admitted request's units were charged
//! in Redis before it was admitted, when its slice was taken; Redis's own
//! count never exceeds the limit. What a slice adds is time: units
//! charged before a window began may be used inside it. An instance holds
//! at most two slices' units unused at once (the current one and the next,
//! taken ahead), so over any window the admitted count exceeds what exact
//! mode admits by at most `N × 2 × max_slice` for `N` instances. A slice
//! of a plan with fixed or daily windows lapses at the end of the window
//! it was charged in, so in every such window the admitted count stays
//! within the quota itself when the instances read one clock; a sliding
//! counter's slice lapses with the sub-window it was charged in. A slice
//! in use is renewed in the last quarter of its time, and what it holds
//! beyond two slices (refunds into it) is given back.
//!
//! **Unused units go back**: when a slice's time is up with units left,
//! they are given back (a refund of a charge made when the slice was
//! taken; a window's refund counts only within the window it was charged
//! in). A refused lease is remembered until its `Retry-After`: the
//! instance refuses locally until then (each refusal's fields aged), so a
//! key over its limit costs one round trip per wait, not one per request.
//!
//! **Faults.** With Redis unreachable an instance goes on deciding from
//! the slice it holds until the slice runs out or its time is up; then
//! the lease fails and the store's degraded limiter (a share of each
//! quota, decided locally) answers, as in exact mode. No slice is counted
//! twice: units are charged once, when the slice is taken, and given back
//! at most once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::{Algorithm, Decision, Denial, Nanos, Outcome, Plan, Share};

const SHARDS: usize = 16;
/// The most keys one shard keeps a slice for: past it, a new key's
/// decisions take no slice (each is a lease of its own cost, as exact
/// counting would be) until idle keys are forgotten.
const MAX_PER_SHARD: usize = 4_096;
/// How often slices whose time is up are looked for.
const SWEEP_EVERY: Nanos = Nanos::from_millis(250);
/// A key with no decision for this long is forgotten (its units given
/// back first).
const IDLE: Nanos = Nanos::from_secs(10);
/// The time constant of a key's rate (ns).
const RATE_TAU_NS: f64 = 1e9;

/// The most units one slice of `plan` may hold, when every policy that
/// decides is leased (`None`: the plan is counted exactly).
pub fn max_slice(plan: &Plan) -> Option<u64> {
    let mut max: Option<u64> = None;
    for p in plan.policies() {
        match p.share() {
            Share::Leased { max_slice } => {
                max = Some(max.map_or(max_slice, |m: u64| m.min(max_slice)));
            }
            _ if p.is_shadow() => {}
            _ => return None,
        }
    }
    max
}

/// Whether `plan` can be leased: token buckets, fixed or daily windows and
/// sliding counters, counted in requests.
pub fn leasable(plan: &Plan) -> Result<(), String> {
    for p in plan.policies() {
        if !matches!(p.share(), Share::Leased { .. }) {
            continue;
        }
        let ok = matches!(
            p.algorithm(),
            Algorithm::TokenBucket | Algorithm::FixedWindow { .. } | Algorithm::SlidingCounter
        ) && p.unit() == crate::Unit::Requests;
        if !ok {
            return Err(format!(
                "policy {:?}: only token buckets, fixed or daily windows and sliding counters counted in requests are leased",
                p.name()
            ));
        }
    }
    Ok(())
}

/// One key's slice on this instance.
struct Slice {
    plan: Plan,
    /// Units left to admit here.
    left: u64,
    /// When the oldest unused units were charged.
    taken_at: Nanos,
    /// When the units left lapse (given back, or lost with their window).
    expires: Nanos,
    /// The decision Redis gave at the last lease, and when.
    seen: Decision,
    seen_at: Nanos,
    /// Redis refused: refuse here until then.
    denied_until: Option<Nanos>,
    /// Leases refused in a row (other instances took the slices first).
    refusals: u32,
    /// Decisions here, an exponentially decaying count (1 s), and when it
    /// was last brought up to date.
    count: f64,
    last: Nanos,
    /// A lease is in flight for this key, since then.
    fetching: bool,
    fetch_since: Nanos,
    /// Units past what one instance may hold, to be given back.
    excess: u64,
}

/// What a local look at the slices concluded.
#[derive(Clone, Debug)]
pub enum Local {
    /// Decided from the slice (or its remembered refusal); `Some(want)`
    /// asks for the next slice to be taken ahead of need.
    Decided(Decision, Option<u64>),
    /// A slice for the key is on its way: wait for it to land (not long:
    /// see [`Leases::fetch_done`]), then look again; still waiting after
    /// that, ask for the request's own cost.
    Wait,
    /// The slice cannot decide: take a slice of `want` units; `give_back`
    /// holds units left from a slice whose time is up, and when they were
    /// charged.
    Ask {
        /// The units to take.
        want: u64,
        /// Units to give back to the shared count, and when they were
        /// charged there.
        give_back: Option<(u64, Nanos)>,
    },
}

/// What the shared count's answer to a lease means (see
/// [`Leases::answer`]).
#[derive(Clone, Debug)]
pub enum Answered {
    /// The request's decision.
    Done(Decision),
    /// A whole slice is not coming soon: take this many units instead
    /// (what is left, or the request's cost alone), and answer again.
    Retry(u64),
}

/// What the leases have done, for stats and metrics.
#[derive(Debug, Default)]
pub struct LeaseCounters {
    /// Decisions answered from a slice or a remembered refusal.
    pub local: AtomicU64,
    /// Leases asked of the shared count (counted by the caller).
    pub calls: AtomicU64,
    /// Units granted in slices.
    pub granted: AtomicU64,
    /// Units given back unused.
    pub returned: AtomicU64,
    /// Units held unused in live slices at the last sweep: this
    /// instance's part of the overshoot a window may see.
    pub held: AtomicU64,
}

/// Every key's slice on this instance: the local half of leased budgets,
/// whatever holds the shared count (the Redis store, the simulator's
/// shared state).
///
/// ```
/// use paceline_core::lease::{Answered, Leases, Local};
/// use paceline_core::{check_words, Nanos, Plan, Policy, Share};
///
/// let plan = Plan::new("g", vec![Policy::token_bucket("g", 100, 1).unwrap()
///     .with_share(Share::Leased { max_slice: 10 })]).unwrap();
/// let mut shared = vec![0u64; plan.state_words()]; // the shared count
/// let leases = Leases::new(Nanos::from_millis(100));
/// let now = Nanos::from_secs(1_000);
/// let Some(Local::Ask { want, .. }) = leases.local(&plan, 10, 1, 1, now, true) else { panic!() };
/// let (d, _) = check_words(&plan, &mut shared, now, want);
/// let Answered::Done(d) = leases.answer(&plan, 1, want, 1, now, d, true) else { panic!() };
/// assert!(d.is_allowed());
/// ```
pub struct Leases {
    shards: Vec<Mutex<HashMap<(u64, u128), Slice>>>,
    /// A slice's time (ns).
    interval: Nanos,
    next_sweep: AtomicU64,
    /// Redis failed a lease: until this instant (ns) the degraded limiter
    /// answers at once, and one lease a slice's time probes Redis.
    down_until: AtomicU64,
    /// What they have done.
    pub counters: LeaseCounters,
}

impl std::fmt::Debug for Leases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leases")
            .field("interval", &self.interval)
            .field("counters", &self.counters)
            .finish_non_exhaustive()
    }
}

impl Leases {
    /// Leases whose slices live `interval` (and hold what the instance
    /// uses of a key in that time, up to the policy's `max_slice`).
    pub fn new(interval: Nanos) -> Leases {
        Leases {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            interval: interval.max(Nanos::from_millis(1)),
            next_sweep: AtomicU64::new(0),
            down_until: AtomicU64::new(0),
            counters: LeaseCounters::default(),
        }
    }

    /// A slice's time.
    pub fn interval(&self) -> Nanos {
        self.interval
    }

    /// Whether Redis failed a lease within the last slice's time: the
    /// first caller after that time probes it (and is told `false`).
    pub fn down(&self, now: Nanos) -> bool {
        let until = self.down_until.load(Ordering::Relaxed);
        if now.as_u64() < until {
            return true;
        }
        // one prober a period: the others keep answering degraded
        until != 0
            && self
                .down_until
                .compare_exchange(
                    until,
                    now.saturating_add(self.interval).as_u64(),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_err()
    }

    /// Redis failed (`true`) or answered a lease.
    pub fn failed(&self, now: Nanos, failed: bool) {
        let v = match failed {
            true => now.saturating_add(self.interval).as_u64(),
            false => 0,
        };
        self.down_until.store(v, Ordering::Relaxed);
    }

    fn shard(&self, hash: u128) -> &Mutex<HashMap<(u64, u128), Slice>> {
        &self.shards[(hash as usize) % SHARDS]
    }

    /// Decides from the key's slice if it can; else what to ask Redis.
    pub fn local(
        &self,
        plan: &Plan,
        max: u64,
        hash: u128,
        cost: u64,
        now: Nanos,
        may_ask: bool,
    ) -> Option<Local> {
        let mut shard = self.shard(hash).lock();
        let Some(s) = shard.get_mut(&(plan.identity(), hash)) else {
            return may_ask.then_some(Local::Ask {
                want: want(0.0, self.interval, cost, max, plan),
                give_back: None,
            });
        };
        if s.plan != *plan {
            // a reloaded plan of the same layout: start again
            shard.remove(&(plan.identity(), hash));
            return may_ask.then_some(Local::Ask {
                want: cost.max(1),
                give_back: None,
            });
        }
        s.tick(now, cost);
        let want = want(s.count, self.interval, cost, max, plan);
        let refused = s.denied_until.is_some_and(|u| now < u);
        if now < s.expires && s.left >= cost {
            s.left -= cost;
            self.counters.local.fetch_add(1, Ordering::Relaxed);
            // the next slice ahead of need: when less than half of one is
            // left, or in the last quarter of the slice's time (a key in
            // use then never finds its slice lapsed, and its callers do not
            // all ask at once); none while Redis refuses them
            let ending = now
                >= s.expires
                    .saturating_sub(Nanos::new(self.interval.as_u64() / 4));
            let low = s.left < want.div_ceil(2) && want > cost;
            let ahead = (!s.fetching && !refused && (low || ending)).then(|| {
                s.fetching = true;
                s.fetch_since = now;
                want
            });
            return Some(Local::Decided(s.admitted(now), ahead));
        }
        if let Some(until) = s.denied_until {
            if now < until {
                self.counters.local.fetch_add(1, Ordering::Relaxed);
                return Some(Local::Decided(s.refusal(now, until), None));
            }
            s.denied_until = None;
        }
        if !may_ask {
            return None;
        }
        // a slice on its way (for at most a slice's time: a lease whose
        // caller gave up never answers): wait for it rather than each ask
        if s.fetching && now < s.fetch_since.saturating_add(self.interval) {
            return Some(Local::Wait);
        }
        let give_back = (s.left > 0 && now >= s.expires).then_some((s.left, s.taken_at));
        if give_back.is_some() || now >= s.expires {
            s.left = 0;
        }
        s.fetching = true;
        s.fetch_since = now;
        Some(Local::Ask { want, give_back })
    }

    /// Redis granted a slice of `units` (taken at `now`, its check's
    /// decision `d`), of which `used` went to the request that asked.
    fn granted(&self, plan: &Plan, hash: u128, units: u64, used: u64, now: Nanos, d: &Decision) {
        self.counters.granted.fetch_add(units, Ordering::Relaxed);
        let lapse = lapse(plan, d, now, self.interval);
        let mut shard = self.shard(hash).lock();
        // no room: the request had what it asked (a new key's slice is its
        // own cost)
        let Some(s) = slice_of(&mut shard, plan, hash, now, d) else {
            return;
        };
        s.refusals = 0;
        if used > 0 {
            s.tick(now, used);
        }
        if s.left == 0 || now >= s.expires {
            s.taken_at = now;
            s.left = 0;
        }
        // a slice renewed before its time is up holds at most two (what
        // the stated bound counts); the rest goes back at the next sweep
        s.hold(s.left + units - used);
        // units of the window just ended never reach the next one
        s.expires = lapse;
        s.seen = d.clone();
        s.seen_at = now;
        s.denied_until = None;
        s.fetching = false;
    }

    /// Redis refused a lease of `asked` units whose units come back after
    /// `wait`: refuse locally until then, and at least as long as a token
    /// bucket takes to refill the whole slice (a bucket a few units short
    /// of it answers a wait of a fraction of a millisecond), and longer
    /// after refusals in a row (up to a slice's time, and at most half the
    /// time a token bucket takes to fill from empty, lest the instances all
    /// wait while it overflows), so instances racing for a key at its limit
    /// do not each ask at every refill; what they leave accumulates for the
    /// next slice. Returns the instant refusals last until.
    fn refused(
        &self,
        plan: &Plan,
        hash: u128,
        asked: u64,
        now: Nanos,
        wait: Nanos,
        d: &Decision,
    ) -> Nanos {
        let refill = plan
            .policies()
            .iter()
            .filter(|p| !p.is_shadow() && p.algorithm() == Algorithm::TokenBucket)
            .map(|p| p.emission_interval().as_u64().saturating_mul(asked))
            .max()
            .unwrap_or(0);
        let wait = wait.max(Nanos::new(refill).min(self.interval));
        let fill = plan
            .policies()
            .iter()
            .filter(|p| !p.is_shadow() && p.algorithm() == Algorithm::TokenBucket)
            .map(|p| p.capacity_ns() / 2)
            .min()
            .unwrap_or(u64::MAX);
        let most = Nanos::new(self.interval.as_u64().min(fill)).max(wait);
        let mut shard = self.shard(hash).lock();
        let Some(s) = slice_of(&mut shard, plan, hash, now, d) else {
            return now.saturating_add(wait);
        };
        let factor = 1u64 << s.refusals.min(8);
        let longer = Nanos::new(wait.as_u64().saturating_mul(factor)).min(most);
        let until = now.saturating_add(longer);
        s.refusals = s.refusals.saturating_add(1);
        s.seen = d.clone();
        s.seen_at = now;
        s.denied_until = Some(until);
        s.fetching = false;
        until
    }

    /// Reads the shared count's answer `d` to a lease of `asked` units
    /// made for a request of `cost` at `now`: a grant becomes the
    /// key's slice (the request takes its cost of it), a refusal is
    /// remembered (its wait lengthened after refusals in a row, and
    /// written into the decision), and a refusal whose slice would not come
    /// within a slice's time asks, when `may_retry`, for what is left
    /// instead.
    #[allow(clippy::too_many_arguments)]
    pub fn answer(
        &self,
        plan: &Plan,
        hash: u128,
        asked: u64,
        cost: u64,
        now: Nanos,
        mut d: Decision,
        may_retry: bool,
    ) -> Answered {
        match &d.outcome {
            Outcome::Allowed => {
                self.granted(plan, hash, asked, cost.min(asked), now, &d);
                for s in &mut d.statuses {
                    s.remaining = s.remaining.saturating_add(asked - cost.min(asked));
                }
            }
            Outcome::Denied(den) => {
                if may_retry && asked > cost && den.retry_after > self.interval {
                    // a window near its end, a quota spent: what is left,
                    // or the request alone
                    let left = plan
                        .policies()
                        .iter()
                        .zip(&d.statuses)
                        .filter(|(p, _)| !p.is_shadow())
                        .map(|(_, s)| s.remaining)
                        .min()
                        .unwrap_or(0);
                    return Answered::Retry(left.clamp(cost, asked));
                }
                let until = self.refused(plan, hash, asked, now, den.retry_after, &d);
                if let Outcome::Denied(den) = &mut d.outcome {
                    den.retry_after = until.saturating_sub(now);
                }
            }
            Outcome::CostExceedsBurst { .. } => self.fetch_done(plan, hash),
        }
        Answered::Done(d)
    }

    /// Gives `units` of a charge back to the key's slice, while it lives
    /// (`false`: there is none to take them; they go back to Redis).
    pub fn refund(&self, plan: &Plan, hash: u128, units: u64, now: Nanos) -> bool {
        let mut shard = self.shard(hash).lock();
        match shard.get_mut(&(plan.identity(), hash)) {
            Some(s) if s.plan == *plan && now < s.expires => {
                s.hold(s.left.saturating_add(units));
                true
            }
            _ => false,
        }
    }

    /// A lease (taken ahead of need or not) failed, or came to nothing to
    /// keep: the key may be asked for again.
    pub fn fetch_done(&self, plan: &Plan, hash: u128) {
        if let Some(s) = self.shard(hash).lock().get_mut(&(plan.identity(), hash)) {
            s.fetching = false;
        }
    }

    /// Slices whose time is up with units left, taken out to be given
    /// back (with the instant they were charged), and keys idle for long
    /// forgotten: at most every [`SWEEP_EVERY`] (`None` between sweeps).
    /// A sweep also counts the units held ([`LeaseCounters::held`]).
    pub fn sweep(&self, now: Nanos) -> Option<Vec<(Plan, u128, u64, Nanos)>> {
        let due = self.next_sweep.load(Ordering::Relaxed);
        if now.as_u64() < due
            || self
                .next_sweep
                .compare_exchange(
                    due,
                    now.saturating_add(SWEEP_EVERY).as_u64(),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_err()
        {
            return None;
        }
        let mut back = Vec::new();
        let mut held = 0u64;
        for shard in &self.shards {
            let mut g = shard.lock();
            g.retain(|&(_, hash), s| {
                if s.excess > 0 {
                    back.push((s.plan.clone(), hash, s.excess, s.taken_at));
                    s.excess = 0;
                }
                if s.left > 0 && now >= s.expires {
                    back.push((s.plan.clone(), hash, s.left, s.taken_at));
                    s.left = 0;
                }
                held = held.saturating_add(s.left);
                s.fetching || now.saturating_sub(s.last) < IDLE
            });
        }
        self.counters.held.store(held, Ordering::Relaxed);
        Some(back)
    }

    /// Units given back.
    pub fn returned(&self, units: u64) {
        self.counters.returned.fetch_add(units, Ordering::Relaxed);
    }
}

/// The key's slice, empty when it had none; `None` when the shard has no
/// room for another key.
fn slice_of<'a>(
    shard: &'a mut HashMap<(u64, u128), Slice>,
    plan: &Plan,
    hash: u128,
    now: Nanos,
    d: &Decision,
) -> Option<&'a mut Slice> {
    let k = (plan.identity(), hash);
    if shard.len() >= MAX_PER_SHARD && !shard.contains_key(&k) {
        return None;
    }
    Some(shard.entry(k).or_insert_with(|| Slice {
        plan: plan.clone(),
        left: 0,
        taken_at: now,
        expires: now,
        seen: d.clone(),
        seen_at: now,
        denied_until: None,
        refusals: 0,
        count: 0.0,
        last: now,
        fetching: false,
        fetch_since: now,
        excess: 0,
    }))
}

impl Slice {
    /// Keeps `units` to admit here, at most two slices' worth; the rest
    /// is set aside to be given back.
    fn hold(&mut self, units: u64) {
        self.left = units.min(held_at_most(&self.plan));
        self.excess = self.excess.saturating_add(units - self.left);
    }

    /// Brings the rate up to `now` and counts `cost` more.
    fn tick(&mut self, now: Nanos, cost: u64) {
        let dt = now.saturating_sub(self.last).as_u64() as f64;
        self.count = self.count * (-dt / RATE_TAU_NS).exp() + cost as f64;
        self.last = self.last.max(now);
    }

    /// The last decision Redis gave, aged to `now`.
    fn aged(&self, now: Nanos) -> Decision {
        let gone = now.saturating_sub(self.seen_at);
        let mut d = self.seen.clone();
        for st in &mut d.statuses {
            st.reset_after = st.reset_after.saturating_sub(gone);
            st.would_deny = false;
        }
        d
    }

    /// An admission from the slice: what Redis said was left after the
    /// lease, and what this instance still holds of it.
    fn admitted(&self, now: Nanos) -> Decision {
        let mut d = self.aged(now);
        d.outcome = Outcome::Allowed;
        for st in &mut d.statuses {
            st.remaining = st.remaining.saturating_add(self.left);
        }
        d
    }

    /// A refusal remembered until `until`.
    fn refusal(&self, now: Nanos, until: Nanos) -> Decision {
        let mut d = self.aged(now);
        let wait = until.saturating_sub(now);
        match &mut d.outcome {
            Outcome::Denied(den) => den.retry_after = wait,
            o => {
                *o = Outcome::Denied(Denial {
                    policy: 0,
                    kind: self.plan.policy(0).kind(),
                    retry_after: wait,
                })
            }
        }
        if let Outcome::Denied(den) = &d.outcome {
            if let Some(st) = d.statuses.get_mut(den.policy) {
                st.would_deny = true;
            }
        }
        d
    }
}

/// A slice's size: what the instance uses of the key in one slice time,
/// at least `cost` (and 1), at most `max` (unless one request costs more)
/// and never more than a policy holds.
fn want(count: f64, interval: Nanos, cost: u64, max: u64, plan: &Plan) -> u64 {
    let rate = count / (RATE_TAU_NS / 1e9);
    let need = (rate * interval.as_secs_f64()).ceil();
    let need = if need.is_finite() && need > 0.0 {
        need as u64
    } else {
        0
    };
    let holds = plan
        .policies()
        .iter()
        .filter(|p| !p.is_shadow())
        .map(|p| p.burst())
        .min()
        .unwrap_or(u64::MAX);
    need.min(max).max(cost).max(1).min(holds.max(cost))
}

/// The most units one instance holds of a key: two slices (the one in
/// use and the next, taken ahead of need).
fn held_at_most(plan: &Plan) -> u64 {
    max_slice(plan).map_or(u64::MAX, |m| m.saturating_mul(2))
}

/// When a slice taken at `now` lapses: after one slice time, or at the
/// end of the shortest window it was charged in (a fixed window, or a
/// sliding counter's current sub-window: a unit charged in one and
/// spent in the next would weigh in the next only by the share of the
/// one it was charged in).
fn lapse(plan: &Plan, d: &Decision, now: Nanos, interval: Nanos) -> Nanos {
    let mut end = now.saturating_add(interval);
    for (p, st) in plan.policies().iter().zip(&d.statuses) {
        match p.algorithm() {
            Algorithm::FixedWindow { .. } => end = end.min(now.saturating_add(st.reset_after)),
            Algorithm::SlidingCounter => {
                let w = p.window().as_u64();
                let next = (now.as_u64() / w).saturating_add(1).saturating_mul(w);
                end = end.min(Nanos::new(next));
            }
            _ => {}
        }
    }
    end
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Policy, PolicyStatus};
    use smallvec::smallvec;

    fn plan(max_slice: u64) -> Plan {
        Plan::new(
            "g",
            vec![Policy::token_bucket("global", 2_000, 1)
                .unwrap()
                .with_share(Share::Leased { max_slice })],
        )
        .unwrap()
    }

    fn allowed(remaining: u64) -> Decision {
        Decision {
            outcome: Outcome::Allowed,
            statuses: smallvec![PolicyStatus {
                remaining,
                reset_after: Nanos::from_millis(500),
                would_deny: false,
            }],
        }
    }

    #[test]
    fn a_plan_is_leased_when_every_deciding_policy_is() {
        assert_eq!(max_slice(&plan(20)), Some(20));
        let mixed = Plan::new(
            "m",
            vec![
                Policy::token_bucket("a", 10, 1)
                    .unwrap()
                    .with_share(Share::Leased { max_slice: 2 }),
                Policy::token_bucket("b", 10, 1).unwrap(),
            ],
        )
        .unwrap();
        assert_eq!(max_slice(&mixed), None);
    }

    #[test]
    fn slices_grow_with_the_rate_up_to_the_bound() {
        let p = plan(50);
        let ms = Nanos::from_millis(100);
        assert_eq!(want(0.0, ms, 1, 50, &p), 1);
        assert_eq!(want(200.0, ms, 1, 50, &p), 20);
        assert_eq!(want(5_000.0, ms, 1, 50, &p), 50);
        // one request's cost beyond the bound is still one slice
        assert_eq!(want(0.0, ms, 70, 50, &p), 70);
    }

    #[test]
    fn decisions_come_from_the_slice_until_it_runs_out() {
        let p = plan(10);
        let l = Leases::new(Nanos::from_millis(100));
        let t = Nanos::from_secs(1_000);
        assert!(l.local(&p, 10, 7, 1, t, false).is_none());
        l.granted(&p, 7, 10, 1, t, &allowed(1_990));
        let mut local = 0;
        let mut ahead = 0;
        while let Some(Local::Decided(d, a)) = l.local(&p, 10, 7, 1, t, false) {
            assert!(d.is_allowed());
            local += 1;
            ahead += usize::from(a.is_some());
        }
        assert_eq!(local, 9, "the slice held 10, one went to the asker");
        assert!(ahead <= 1, "one lease ahead of need at a time");
        // its time up, what is left goes back
        l.granted(&p, 7, 5, 0, t, &allowed(1_980));
        let later = t.saturating_add(Nanos::from_millis(150));
        match l.local(&p, 10, 7, 1, later, true) {
            Some(Local::Ask { give_back, .. }) => assert_eq!(give_back, Some((5, t))),
            _ => panic!("an expired slice decides nothing"),
        }
    }

    #[test]
    fn a_refund_goes_back_to_a_live_slice() {
        let p = plan(10);
        let l = Leases::new(Nanos::from_millis(100));
        let t = Nanos::from_secs(1_000);
        assert!(!l.refund(&p, 9, 1, t), "no slice: back to Redis");
        l.granted(&p, 9, 10, 10, t, &allowed(1_990));
        assert!(l.local(&p, 10, 9, 1, t, false).is_none(), "all of it used");
        assert!(l.refund(&p, 9, 1, t));
        assert!(
            matches!(l.local(&p, 10, 9, 1, t, false), Some(Local::Decided(d, _)) if d.is_allowed())
        );
        let late = t.saturating_add(Nanos::from_millis(100));
        assert!(!l.refund(&p, 9, 1, late), "its time up: back to Redis");
    }

    #[test]
    fn a_slice_in_use_is_renewed_before_its_time_is_up_and_holds_at_most_two() {
        let p = plan(10);
        let l = Leases::new(Nanos::from_millis(100));
        let t = Nanos::from_secs(1_000);
        assert!(matches!(
            l.answer(&p, 5, 10, 1, t, allowed(100), true),
            Answered::Done(_)
        ));
        // plenty left, the slice young: nothing asked ahead
        match l.local(&p, 10, 5, 1, t.saturating_add(Nanos::from_millis(10)), true) {
            Some(Local::Decided(d, None)) => assert!(d.is_allowed()),
            other => panic!("{other:?}"),
        }
        // plenty left, the slice in its last quarter: the next one asked
        let late = t.saturating_add(Nanos::from_millis(80));
        let ahead = match l.local(&p, 10, 5, 1, late, true) {
            Some(Local::Decided(d, Some(want))) => {
                assert!(d.is_allowed());
                want
            }
            other => panic!("{other:?}"),
        };
        // it lands: 7 left + 10, within two slices (20)
        let _ = l.answer(&p, 5, ahead, 0, late, allowed(100), false);
        // refunds past two slices are set aside and go back at the sweep
        // (with the slice's own units, its time up by then)
        assert!(l.refund(&p, 5, 50, late));
        let back = l.sweep(late.saturating_add(SWEEP_EVERY)).unwrap();
        let given: Vec<u64> = back.iter().map(|(_, _, n, _)| *n).collect();
        assert_eq!(given, [7 + ahead + 50 - 20, 20]);
    }

    #[test]
    fn a_refusal_is_remembered_until_its_wait() {
        let p = plan(10);
        let l = Leases::new(Nanos::from_millis(100));
        let t = Nanos::from_secs(1_000);
        let mut d = allowed(0);
        d.outcome = Outcome::Denied(Denial {
            policy: 0,
            kind: p.policy(0).kind(),
            retry_after: Nanos::from_millis(40),
        });
        let until = l.refused(&p, 3, 10, t, Nanos::from_millis(40), &d);
        assert_eq!(until, t.saturating_add(Nanos::from_millis(40)));
        // a bucket a unit short answers a tiny wait: the refusal lasts at
        // least as long as the whole slice takes to refill (10 × 0.5 ms),
        // doubled for the second refusal in a row
        let short = l.refused(&p, 4, 10, t, Nanos::new(500_000), &d);
        assert_eq!(short, t.saturating_add(Nanos::from_millis(5)));
        let again = l.refused(&p, 4, 10, t, Nanos::new(500_000), &d);
        assert_eq!(again, t.saturating_add(Nanos::from_millis(10)));
        let mid = t.saturating_add(Nanos::from_millis(15));
        match l.local(&p, 10, 3, 1, mid, false) {
            Some(Local::Decided(d, None)) => {
                assert_eq!(d.denial().unwrap().retry_after, Nanos::from_millis(25));
            }
            _ => panic!("refused locally"),
        }
        let after = t.saturating_add(Nanos::from_millis(40));
        assert!(matches!(
            l.local(&p, 10, 3, 1, after, true),
            Some(Local::Ask { .. })
        ));
    }

    #[test]
    fn a_fixed_window_slice_lapses_with_its_window() {
        let p = Plan::new(
            "w",
            vec![Policy::fixed_window("w", 100, 1)
                .unwrap()
                .with_share(Share::Leased { max_slice: 10 })],
        )
        .unwrap();
        let t = Nanos::from_secs(1_000);
        let mut d = allowed(50);
        d.statuses[0].reset_after = Nanos::from_millis(30);
        assert_eq!(
            lapse(&p, &d, t, Nanos::from_millis(100)),
            t.saturating_add(Nanos::from_millis(30))
        );
    }
}
