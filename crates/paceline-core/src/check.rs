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
pub fn check_words(plan: &Plan, words: &mut [u64], now: Nanos, cost: u64) -> (Decision, Nanos) {
    let now_ns = now.as_u64();
    let policies = plan.policies();
    for (i, p) in policies.iter().enumerate() {
        if cost > p.quota() && !p.is_shadow() {
            let statuses = policies
                .iter()
                .enumerate()
                .map(|(j, q)| {
                    let off = plan.offset(j);
                    status(algorithm::peek(
                        q,
                        &words[off..off + q.state_words()],
                        now_ns,
                        0,
                    ))
                })
                .collect();
            let outcome = Outcome::CostExceedsBurst { policy: i, cost };
            return (Decision { outcome, statuses }, Nanos::MAX);
        }
    }
    let mut peeks: SmallVec<[Peek; 2]> = SmallVec::with_capacity(policies.len());
    let mut denial: Option<Denial> = None;
    for (i, p) in policies.iter().enumerate() {
        let off = plan.offset(i);
        let slice = &words[off..off + p.state_words()];
        let pk = if cost > p.quota() {
            // shadow policy that could never fit: report it, charge nothing
            Peek {
                admit: false,
                remaining: algorithm::peek(p, slice, now_ns, 0).remaining,
                reset_ns: 0,
                wait_ns: u64::MAX,
            }
        } else {
            algorithm::peek(p, slice, now_ns, cost)
        };
        if !pk.admit && !p.is_shadow() && denial.is_none_or(|d| pk.wait_ns > d.retry_after.as_u64())
        {
            denial = Some(Denial {
                policy: i,
                kind: p.kind(),
                retry_after: Nanos::new(pk.wait_ns),
            });
        }
        peeks.push(pk);
    }
    let mut rest_at = now_ns;
    if denial.is_some() {
        // nothing is charged: publish the policies that would have admitted
        // as they stand, not as they would after a charge that never happens
        for (i, p) in policies.iter().enumerate() {
            if peeks[i].admit {
                let off = plan.offset(i);
                let pk = algorithm::peek(p, &words[off..off + p.state_words()], now_ns, 0);
                peeks[i].remaining = pk.remaining;
                peeks[i].reset_ns = pk.reset_ns;
            }
        }
    } else {
        for (i, p) in policies.iter().enumerate() {
            if peeks[i].admit {
                let off = plan.offset(i);
                algorithm::commit(p, &mut words[off..off + p.state_words()], now_ns, cost);
            }
        }
    }
    for (i, p) in policies.iter().enumerate() {
        let off = plan.offset(i);
        let slice = &words[off..off + p.state_words()];
        rest_at = rest_at.max(rest_instant(p, slice, now_ns, &peeks[i]));
    }
    let statuses = peeks.iter().map(|&pk| status(pk)).collect();
    let outcome = match denial {
        Some(d) => Outcome::Denied(d),
        None => Outcome::Allowed,
    };
    (Decision { outcome, statuses }, Nanos::new(rest_at))
}

fn status(pk: Peek) -> PolicyStatus {
    PolicyStatus {
        remaining: pk.remaining,
        reset_after: Nanos::new(pk.reset_ns),
        would_deny: !pk.admit,
    }
}

fn rest_instant(p: &crate::Policy, words: &[u64], now: u64, pk: &Peek) -> u64 {
    use crate::Algorithm;
    match p.algorithm() {
        Algorithm::TokenBucket => words[0],
        Algorithm::Concurrency if words[0] > 0 => u64::MAX,
        Algorithm::Concurrency => now,
        // windows: the reported reset is when the state stops mattering
        // (sliding ones report the full drain)
        _ => now.saturating_add(pk.reset_ns.max(p.window_ns())),
    }
}
