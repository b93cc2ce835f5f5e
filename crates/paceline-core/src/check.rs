//! The multi-policy check over one key's state words: admit only if every
//! policy admits, then charge every policy; a denial charges nothing.
//!
//! Stores call [`check_words`] under whatever exclusion they provide (a
//! shard lock in memory); the simulator calls it directly.

use smallvec::SmallVec;

use crate::algorithm::{self, Peek};
use crate::clock::Nanos;
use crate::decision::{Decision, Denial, Outcome, PolicyStatus};
use crate::plan::Plan;

/// Checks `cost` against every policy of `plan` at `now` and, if all
/// admit, charges them in `words` (a key's state, `plan.state_words()` long).
///
/// Returns the decision and the instant after which the state is at rest
/// (a fresh state would decide the same), for idle-key eviction.
///
/// ```
/// use paceline_core::{check_words, Plan, Policy, Nanos};
///
/// let plan = Plan::new("free", vec![
///     Policy::token_bucket("burst", 20, 2).unwrap(),
///     Policy::daily("daily", 10_000).unwrap(),
/// ]).unwrap();
/// let mut state = vec![0u64; plan.state_words()];
/// let now = Nanos::from_secs(1_700_000_000);
/// let (d, _) = check_words(&plan, &mut state, now, 1);
/// assert!(d.is_allowed());
/// assert_eq!(d.statuses[0].remaining, 19);
/// assert_eq!(d.statuses[1].remaining, 9_999);
/// ```
#[inline]
pub fn check_words(
    plan: &Plan,
    words: &mut [u64],
    now: Nanos,
    cost: impl Into<Cost>,
) -> (Decision, Nanos) {
    let now_ns = now.as_u64();
    let cost = cost.into();
    let policies = plan.policies();
    if let [p] = policies {
        return check_single(p, words, now_ns, cost.of(p), plan);
    }
    if let Some(i) = policies
        .iter()
        .position(|p| cost.of(p) > p.burst() && !p.is_shadow())
    {
        return cost_exceeds(plan, words, now_ns, i, cost.of(plan.policy(i)));
    }
    let spans = plan.spans();
    let mut statuses: SmallVec<[PolicyStatus; 2]> = SmallVec::new();
    let mut admitted: u32 = 0; // bit i: policy i admitted
    let mut denial: Option<Denial> = None;
    for (i, (p, &(a, b))) in policies.iter().zip(spans).enumerate() {
        let slice = &words[a..b];
        let cost = cost.of(p);
        let pk = if cost > p.burst() {
            // a shadow policy that could never fit: report it, charge nothing
            Peek {
                admit: false,
                remaining: algorithm::peek(p, slice, now_ns, 0).remaining,
                reset_ns: 0,
                wait_ns: u64::MAX,
            }
        } else {
            algorithm::peek(p, slice, now_ns, cost)
        };
        if pk.admit {
            admitted |= 1 << i;
        } else if !p.is_shadow() && denial.is_none_or(|d| pk.wait_ns > d.retry_after.as_u64()) {
            denial = Some(Denial {
                policy: i,
                kind: p.kind(),
                retry_after: Nanos::new(pk.wait_ns),
            });
        }
        statuses.push(status(pk));
    }
    let mut rest_at = now_ns;
    let outcome = match denial {
        Some(d) => {
            // nothing is charged: publish the policies that would have
            // admitted as they stand, not after a charge that never happens
            for (i, (p, &(a, b))) in policies.iter().zip(spans).enumerate() {
                let slice = &words[a..b];
                if admitted & (1 << i) != 0 {
                    let pk = algorithm::peek(p, slice, now_ns, 0);
                    statuses[i].remaining = pk.remaining;
                    statuses[i].reset_after = Nanos::new(pk.reset_ns);
                }
                rest_at = rest_at.max(rest_of(p, slice, now_ns, cost.of(p), &statuses[i]));
            }
            Outcome::Denied(d)
        }
        None => {
            for (i, ((p, &(a, b)), st)) in policies.iter().zip(spans).zip(&statuses).enumerate() {
                let slice = &mut words[a..b];
                if admitted & (1 << i) != 0 {
                    algorithm::commit(p, slice, now_ns, cost.of(p));
                }
                rest_at = rest_at.max(rest_of(p, slice, now_ns, cost.of(p), st));
            }
            Outcome::Allowed
        }
    };
    (Decision { outcome, statuses }, Nanos::new(rest_at))
}

/// What [`check_words`] with a cost of 0 answers for `words`, read
/// without charging or writing anything: a key's standing, for the fields
/// of an answer that charges nothing. A cost of 0 fits every policy whose
/// burst is above 0, so nothing would be charged and a denial would leave
/// the statuses as first peeked: one peek per policy is the whole answer.
pub(crate) fn peek_words(plan: &Plan, words: &[u64], now: Nanos) -> Decision {
    let policies = plan.policies();
    if policies.len() == 1 || policies.iter().any(|p| p.burst() == 0) {
        // the check itself, on a copy
        let mut copy: SmallVec<[u64; 8]> = SmallVec::from_slice(words);
        return check_words(plan, &mut copy, now, 0).0;
    }
    let now_ns = now.as_u64();
    let mut statuses: SmallVec<[PolicyStatus; 2]> = SmallVec::new();
    let mut denial: Option<Denial> = None;
    for (i, (p, &(a, b))) in policies.iter().zip(plan.spans()).enumerate() {
        let pk = algorithm::peek(p, &words[a..b], now_ns, 0);
        if !pk.admit && !p.is_shadow() && denial.is_none_or(|d| pk.wait_ns > d.retry_after.as_u64())
        {
            denial = Some(Denial {
                policy: i,
                kind: p.kind(),
                retry_after: Nanos::new(pk.wait_ns),
            });
        }
        statuses.push(status(pk));
    }
    let outcome = match denial {
        Some(d) => Outcome::Denied(d),
        None => Outcome::Allowed,
    };
    Decision { outcome, statuses }
}

/// Gives back `cost`, charged at `charged`, to every policy of `plan` in
/// `words` at `now` (see [`Store::refund`](crate::Store::refund) for what
/// each algorithm gives back). Shadow policies are left as they are: they
/// may not have been charged, and they never refuse anyone.
///
/// ```
/// use paceline_core::{check_words, refund_words, Cost, Plan, Policy, Nanos};
///
/// let plan = Plan::new("free", vec![Policy::daily("daily", 10).unwrap()]).unwrap();
/// let mut state = vec![0u64; plan.state_words()];
/// let now = Nanos::from_secs(1_700_000_000);
/// check_words(&plan, &mut state, now, 3);
/// refund_words(&plan, &mut state, Cost::requests(3), now, now);
/// let (d, _) = check_words(&plan, &mut state, now, 0);
/// assert_eq!(d.statuses[0].remaining, 10);
/// ```
pub fn refund_words(plan: &Plan, words: &mut [u64], cost: Cost, charged: Nanos, now: Nanos) {
    for (p, &(a, b)) in plan.policies().iter().zip(plan.spans()) {
        if !p.is_shadow() {
            algorithm::refund(
                p,
                &mut words[a..b],
                charged.as_u64(),
                now.as_u64(),
                cost.of(p),
            );
        }
    }
}

/// Settles, at `now`, a request admitted at `charged_at` with the cost
/// `charged` whose answer turned out to cost `actual`, in `words` (see
/// [`Store::settle`](crate::Store::settle)). Per policy, in the unit it
/// counts: more than charged is charged whatever the room (the work is
/// done; the key may go into debt), less than charged is given back as
/// [`refund_words`] gives back. Shadow policies and concurrency caps are
/// left as they are.
///
/// Returns the instant after which the state is at rest (at least `now`).
///
/// ```
/// use paceline_core::{check_words, settle_words, Cost, Plan, Policy, Nanos};
///
/// let plan = Plan::new("llm", vec![Policy::token_bucket("tokens", 100, 10).unwrap()]).unwrap();
/// let mut state = vec![0u64; plan.state_words()];
/// let now = Nanos::from_secs(1_700_000_000);
/// assert!(check_words(&plan, &mut state, now, 40).0.is_allowed());
/// // the answer used 130: 30 past the bucket, refused until paid off
/// settle_words(&plan, &mut state, Cost::requests(40), Cost::requests(130), now, now);
/// let (d, _) = check_words(&plan, &mut state, now, 1);
/// assert_eq!(d.denial().unwrap().retry_after, Nanos::from_millis(3_100));
/// ```
pub fn settle_words(
    plan: &Plan,
    words: &mut [u64],
    charged: Cost,
    actual: Cost,
    charged_at: Nanos,
    now: Nanos,
) -> Nanos {
    let now_ns = now.as_u64();
    let mut rest = now_ns;
    for (p, &(a, b)) in plan.policies().iter().zip(plan.spans()) {
        let w = &mut words[a..b];
        let (was, is) = (charged.of(p), actual.of(p));
        if !p.is_shadow() {
            if is > was {
                algorithm::overrun(p, w, now_ns, is - was);
            } else {
                algorithm::refund(p, w, charged_at.as_u64(), now_ns, was - is);
            }
        }
        rest = rest.max(match algorithm::at_rest(p, w, now_ns) {
            true => now_ns,
            false => rest_instant(p, w, now_ns, &status(algorithm::peek(p, w, now_ns, 0))),
        });
    }
    Nanos::new(rest)
}

/// What a request costs, per unit a policy may count in.
///
/// Policies counting requests and concurrency caps are charged
/// `requests` (the route's cost); policies counting content bytes are
/// charged `bytes`; policies counting a named unit (`tokens`, say) are
/// charged `units`. [`Cost::requests`] charges a named unit the same
/// number as requests (a cost fixed per route, in whatever unit a policy
/// counts) until [`Cost::with_units`] says otherwise. A plain number
/// converts to a cost of that many requests and no bytes.
///
/// ```
/// use paceline_core::{Cost, Policy, Unit};
///
/// let bytes = Policy::token_bucket("upload", 1_000_000, 60).unwrap()
///     .with_unit(Unit::ContentBytes).unwrap();
/// let tokens = Policy::token_bucket("tpm", 10_000, 60).unwrap()
///     .with_unit(Unit::named("tokens").unwrap()).unwrap();
/// let rpm = Policy::token_bucket("rpm", 60, 60).unwrap();
/// let cost = Cost::requests(1).with_bytes(4_096).with_units(750);
/// assert_eq!((cost.of(&rpm), cost.of(&bytes), cost.of(&tokens)), (1, 4_096, 750));
/// assert_eq!(Cost::from(10).requests, 10);
/// assert_eq!(Cost::requests(3).of(&tokens), 3);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cost {
    /// Units charged to request-counting policies (the route's cost).
    pub requests: u64,
    /// Units charged to content-bytes policies (the body's length).
    pub bytes: u64,
    /// Units charged to policies counting a named unit (the tokens an
    /// answer is expected to use, say).
    pub units: u64,
}

impl Cost {
    /// A cost of `n` requests and no bytes.
    pub const fn requests(n: u64) -> Cost {
        Cost {
            requests: n,
            bytes: 0,
            units: n,
        }
    }
    /// The same cost, with `bytes` of content.
    pub const fn with_bytes(self, bytes: u64) -> Cost {
        Cost { bytes, ..self }
    }
    /// The same cost, with `units` charged to named-unit policies.
    pub const fn with_units(self, units: u64) -> Cost {
        Cost { units, ..self }
    }
    /// Per unit, what `self` holds beyond `other` (zero where it holds
    /// less): the part of an answer's cost its estimate did not cover.
    pub const fn saturating_sub(self, other: Cost) -> Cost {
        Cost {
            requests: self.requests.saturating_sub(other.requests),
            bytes: self.bytes.saturating_sub(other.bytes),
            units: self.units.saturating_sub(other.units),
        }
    }
    /// What `policy` is charged.
    #[inline]
    pub fn of(&self, policy: &crate::Policy) -> u64 {
        match policy.unit() {
            crate::Unit::ContentBytes => self.bytes,
            crate::Unit::Named(_) => self.units,
            _ => self.requests,
        }
    }
}

impl From<u64> for Cost {
    fn from(n: u64) -> Cost {
        Cost::requests(n)
    }
}

/// The common case, a plan of one policy, without the bookkeeping of many.
#[inline]
fn check_single(
    p: &crate::Policy,
    words: &mut [u64],
    now_ns: u64,
    cost: u64,
    plan: &Plan,
) -> (Decision, Nanos) {
    if cost > p.burst() {
        if !p.is_shadow() {
            return cost_exceeds(plan, words, now_ns, 0, cost);
        }
        let mut st = status(algorithm::peek(p, words, now_ns, 0));
        st.would_deny = true;
        let rest = rest_instant(p, words, now_ns, &st).max(now_ns);
        let statuses = smallvec::smallvec![st];
        return (
            Decision {
                outcome: Outcome::Allowed,
                statuses,
            },
            Nanos::new(rest),
        );
    }
    let (pk, rest) = single_step(p, words, now_ns, cost);
    (single_decision(p, pk), Nanos::new(rest))
}

/// The step of a one-policy plan whose cost fits its quota: peeks,
/// charges `words` if admitted, and returns the peek and the instant the
/// state comes to rest. Nothing is built: a caller retrying a
/// compare-and-swap builds the decision once, from the winning peek.
#[inline(always)]
pub(crate) fn single_step(
    p: &crate::Policy,
    words: &mut [u64],
    now_ns: u64,
    cost: u64,
) -> (Peek, u64) {
    let pk = algorithm::peek(p, words, now_ns, cost);
    if pk.admit {
        algorithm::commit(p, words, now_ns, cost);
    }
    let rest = rest_instant(p, words, now_ns, &status(pk)).max(now_ns);
    (pk, rest)
}

/// The decision of a one-policy plan from its step's peek.
#[inline(always)]
pub(crate) fn single_decision(p: &crate::Policy, pk: Peek) -> Decision {
    let outcome = if pk.admit || p.is_shadow() {
        Outcome::Allowed
    } else {
        Outcome::Denied(Denial {
            policy: 0,
            kind: p.kind(),
            retry_after: Nanos::new(pk.wait_ns),
        })
    };
    Decision {
        outcome,
        statuses: smallvec::smallvec![status(pk)],
    }
}

#[inline]
fn policy_words<'a>(plan: &Plan, words: &'a [u64], i: usize) -> &'a [u64] {
    let (a, b) = plan.spans()[i];
    &words[a..b]
}

#[cold]
fn cost_exceeds(
    plan: &Plan,
    words: &[u64],
    now_ns: u64,
    policy: usize,
    cost: u64,
) -> (Decision, Nanos) {
    let statuses = (0..plan.policies().len())
        .map(|j| {
            status(algorithm::peek(
                plan.policy(j),
                policy_words(plan, words, j),
                now_ns,
                0,
            ))
        })
        .collect();
    let outcome = Outcome::CostExceedsBurst { policy, cost };
    // nothing was charged: the state rests when it would have anyway
    let rest = plan
        .policies()
        .iter()
        .zip(&statuses)
        .enumerate()
        .map(|(j, (p, st))| {
            let w = policy_words(plan, words, j);
            match algorithm::at_rest(p, w, now_ns) {
                true => now_ns,
                false => rest_instant(p, w, now_ns, st),
            }
        })
        .fold(now_ns, u64::max);
    (Decision { outcome, statuses }, Nanos::new(rest))
}

fn status(pk: Peek) -> PolicyStatus {
    PolicyStatus {
        remaining: pk.remaining,
        reset_after: Nanos::new(pk.reset_ns),
        would_deny: !pk.admit,
    }
}

/// When a policy of a plan of several stops mattering, after a check
/// that cost it `cost`. A shadow policy the cost can never fit reports a
/// reset of 0, not its state's: that state's own reset is taken then.
#[inline]
fn rest_of(p: &crate::Policy, words: &[u64], now: u64, cost: u64, st: &PolicyStatus) -> u64 {
    if cost > p.burst() {
        let own = status(algorithm::peek(p, words, now, 0));
        return rest_instant(p, words, now, &own);
    }
    rest_instant(p, words, now, st)
}

#[inline]
fn rest_instant(p: &crate::Policy, words: &[u64], now: u64, st: &PolicyStatus) -> u64 {
    use crate::Algorithm;
    match p.algorithm() {
        Algorithm::TokenBucket => words[0],
        Algorithm::Concurrency if words[0] > 0 => u64::MAX,
        Algorithm::Concurrency => now,
        // windows: the reported reset is when the state stops mattering
        // (sliding ones report the full drain)
        _ => now.saturating_add(st.reset_after.as_u64().max(p.window_ns())),
    }
}
