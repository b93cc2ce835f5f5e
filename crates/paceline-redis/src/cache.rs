//! The local deny cache: a key already over its limit is answered here,
//! with no round trip, until its retry time (and so is a read of its
//! standing, cost 0, which a held request's headers need).
//!
//! Only denials that only time can lift are kept (a concurrency cap can
//! free up whenever a request ends). A later request of the same plan and
//! key costing at least as much cannot fit before that time either: every
//! time-based algorithm only refills with time, and every other instance
//! can only spend more. Bounded: when full, expired entries are swept; if
//! none has expired, the new denial is simply not kept.

use std::collections::HashMap;

use parking_lot::Mutex;

use paceline_core::{Algorithm, Decision, Nanos, Outcome, Plan};

const SHARDS: usize = 16;

struct Entry {
    plan: Plan,
    until: Nanos,
    at: Nanos,
    requests: u64,
    bytes: u64,
    decision: Decision,
}

pub(crate) struct DenyCache {
    shards: Box<[Mutex<Shard>]>,
    per_shard: usize,
}

#[derive(Default)]
struct Shard {
    map: HashMap<(u128, u64), Entry>,
    /// No sweep before this instant (a sweep that freed nothing).
    next_sweep: Nanos,
}

impl DenyCache {
    /// A cache of at most `capacity` keys (0: off).
    pub(crate) fn new(capacity: usize) -> DenyCache {
        DenyCache {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            per_shard: capacity.div_ceil(SHARDS),
        }
    }

    pub(crate) fn enabled(&self) -> bool {
        self.per_shard > 0
    }

    fn shard(&self, hash: u128) -> &Mutex<Shard> {
        &self.shards[(hash as usize) % SHARDS]
    }

    /// The cached denial of this key, adjusted to `now`, if it still holds
    /// for a request of this cost.
    pub(crate) fn get(
        &self,
        plan: &Plan,
        hash: u128,
        requests: u64,
        bytes: u64,
        now: Nanos,
    ) -> Option<Decision> {
        if !self.enabled() {
            return None;
        }
        let mut g = self.shard(hash).lock();
        let k = (hash, plan.identity());
        let e = g.map.get(&k)?;
        if now >= e.until || now < e.at {
            g.map.remove(&k);
            return None;
        }
        let read = requests == 0 && bytes == 0;
        if e.plan != *plan || (!read && (requests < e.requests || bytes < e.bytes)) {
            return None;
        }
        let gone = now.saturating_sub(e.at);
        let mut d = e.decision.clone();
        if read {
            // a read (the standing for a held request's headers, or the
            // usage endpoint) as the denial left it: nothing was charged
            // since on this key, by this instance
            d.outcome = Outcome::Allowed;
            d.statuses.iter_mut().for_each(|s| s.would_deny = false);
        } else if let Outcome::Denied(den) = &mut d.outcome {
            den.retry_after = e.until.saturating_sub(now);
        }
        for s in &mut d.statuses {
            s.reset_after = s.reset_after.saturating_sub(gone);
        }
        Some(d)
    }

    /// Keeps a denial until its retry time.
    pub(crate) fn put(
        &self,
        plan: &Plan,
        hash: u128,
        requests: u64,
        bytes: u64,
        now: Nanos,
        d: &Decision,
    ) {
        if !self.enabled() {
            return;
        }
        let Outcome::Denied(den) = d.outcome else {
            return;
        };
        if plan.policy(den.policy).algorithm() == Algorithm::Concurrency
            || den.retry_after.as_u64() == 0
        {
            return;
        }
        let mut g = self.shard(hash).lock();
        let g = &mut *g;
        if g.map.len() >= self.per_shard {
            if now < g.next_sweep {
                return;
            }
            g.map.retain(|_, e| e.until > now);
            if g.map.len() >= self.per_shard {
                g.next_sweep = now.saturating_add(Nanos::SECOND);
                return;
            }
        }
        g.map.insert(
            (hash, plan.identity()),
            Entry {
                plan: plan.clone(),
                until: now.saturating_add(den.retry_after),
                at: now,
                requests,
                bytes,
                decision: d.clone(),
            },
        );
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().map.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use paceline_core::{Denial, Policy, PolicyKind, PolicyStatus};

    fn denied(wait: u64) -> Decision {
        Decision {
            outcome: Outcome::Denied(Denial {
                policy: 0,
                kind: PolicyKind::Burst,
                retry_after: Nanos::new(wait),
            }),
            statuses: smallvec::smallvec![PolicyStatus {
                remaining: 0,
                reset_after: Nanos::new(wait * 2),
                would_deny: true,
            }],
        }
    }

    #[test]
    fn holds_until_the_retry_time_and_only_for_as_much() {
        let plan = Plan::new("p", vec![Policy::token_bucket("b", 2, 1).unwrap()]).unwrap();
        let c = DenyCache::new(100);
        let t = Nanos::from_secs(100);
        c.put(&plan, 7, 2, 0, t, &denied(1_000));
        let d = c
            .get(&plan, 7, 2, 0, t.saturating_add(Nanos::new(400)))
            .unwrap();
        assert_eq!(d.denial().unwrap().retry_after, Nanos::new(600));
        assert_eq!(d.statuses[0].reset_after, Nanos::new(1_600));
        assert!(
            c.get(&plan, 7, 1, 0, t).is_none(),
            "a cheaper request may fit"
        );
        let read = c.get(&plan, 7, 0, 0, t).unwrap();
        assert!(
            read.is_allowed() && !read.statuses[0].would_deny,
            "{read:?}"
        );
        assert!(c.get(&plan, 8, 2, 0, t).is_none());
        assert!(c
            .get(&plan, 7, 2, 0, t.saturating_add(Nanos::new(1_000)))
            .is_none());
    }

    #[test]
    fn concurrency_denials_are_not_kept_and_the_bound_holds() {
        let conc = Plan::new("c", vec![Policy::concurrency("n", 1).unwrap()]).unwrap();
        let c = DenyCache::new(32);
        let t = Nanos::from_secs(100);
        c.put(&conc, 1, 1, 0, t, &denied(1_000_000_000));
        assert!(c.get(&conc, 1, 1, 0, t).is_none());
        let plan = Plan::new("p", vec![Policy::token_bucket("b", 2, 1).unwrap()]).unwrap();
        for h in 0..10_000u128 {
            c.put(&plan, h, 1, 0, t, &denied(1_000));
        }
        assert!(c.len() <= 32, "{}", c.len());
        // once they expire, new ones are kept again
        c.put(
            &plan,
            20_000,
            1,
            0,
            t.saturating_add(Nanos::from_secs(2)),
            &denied(1_000),
        );
        assert!(c
            .get(&plan, 20_000, 1, 0, t.saturating_add(Nanos::from_secs(2)))
            .is_some());
    }

    #[test]
    fn off_when_empty() {
        let plan = Plan::new("p", vec![Policy::token_bucket("b", 2, 1).unwrap()]).unwrap();
        let c = DenyCache::new(0);
        c.put(&plan, 1, 1, 0, Nanos::new(1), &denied(100));
        assert!(c.get(&plan, 1, 1, 0, Nanos::new(2)).is_none());
    }
}
