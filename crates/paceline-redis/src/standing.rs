//! The last answer per key: what Redis last answered this instance for a
//! key, kept so that a peek ([`Store::peek_local`]) can tell a key's
//! standing without a round trip and without charging — the fields of an
//! answer that never asked Redis, such as a shed `503`.
//!
//! A peek answers the decision as it was, read as a cost-0 check would
//! be (admitted, nothing marked over), each reset time aged by the time
//! since; `None` for a key never answered, or whose answer has aged past
//! its longest reset (it says nothing of what other instances spent
//! since): the view never invents a count. Bounded, at a constant cost
//! per answer: each shard keeps two generations of at most half its share;
//! when the newer is full, the older (the answers least recently written)
//! is dropped whole and the newer takes its place.
//!
//! A request held by escalation takes its answer's fields from here too
//! (a key being held is one that keeps sending: asking Redis for each
//! would be a round trip per refusal). A refund or release drops the
//! key's answer, so a peek never shows a charge that was given back.
//!
//! [`Store::peek_local`]: paceline_core::Store::peek_local

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use parking_lot::Mutex;

use paceline_core::{Decision, Nanos, Outcome, Plan};

const SHARDS: usize = 16;

struct Seen {
    plan: Plan,
    at: Nanos,
    until: Nanos,
    decision: Decision,
}

type Key = (u128, u64);

/// The key hash is already a keyed hash: its halves folded (the low one,
/// which picks the shard, turned so that its shard bits land in the
/// middle) with the plan's identity are the table's hash, as they are.
#[derive(Default)]
struct Spread(u64);

impl Hasher for Spread {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u128(&mut self, n: u128) {
        self.0 ^= (n >> 64) as u64 ^ (n as u64).rotate_left(32);
    }
    fn write_u64(&mut self, n: u64) {
        self.0 ^= n.rotate_left(29);
    }
}

type Map = HashMap<Key, Seen, BuildHasherDefault<Spread>>;

/// One shard: (key hash, plan identity) → the last answer, in two
/// generations: every answer is written to `new`; `old` is only read (and
/// forgotten from).
#[derive(Default)]
struct Generations {
    new: Map,
    old: Map,
}

/// A shard's lock and tables on cache lines of their own: the threads of
/// one instance write different shards without passing lines between
/// their cores.
#[derive(Default)]
#[repr(align(128))]
struct Shard(Mutex<Generations>);

impl std::ops::Deref for Shard {
    type Target = Mutex<Generations>;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

/// The bounded view of last answers.
pub(crate) struct Standing {
    shards: Box<[Shard]>,
    /// The most answers one generation of a shard holds (0: off).
    per_generation: usize,
}

impl Standing {
    /// A view of at most `capacity` keys (0: off).
    pub(crate) fn new(capacity: usize) -> Standing {
        Standing {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
            // both generations of every shard within `capacity` (or one
            // answer each, for a capacity under 32)
            per_generation: match capacity {
                0 => 0,
                c => (c / (2 * SHARDS)).max(1),
            },
        }
    }

    fn shard(&self, hash: u128) -> &Shard {
        &self.shards[(hash as usize) % SHARDS]
    }

    /// Keeps `d`, Redis's answer at `now` for this plan and key.
    pub(crate) fn put(&self, plan: &Plan, hash: u128, now: Nanos, d: &Decision) {
        if self.per_generation == 0 {
            return;
        }
        let longest = d
            .statuses
            .iter()
            .map(|s| s.reset_after)
            .max()
            .unwrap_or(Nanos::ZERO)
            .max(Nanos::SECOND);
        let seen = Seen {
            plan: plan.clone(),
            at: now,
            until: now.saturating_add(longest),
            decision: d.clone(),
        };
        let k = (hash, plan.identity());
        let mut g = self.shard(hash).lock();
        let g = &mut *g;
        g.old.remove(&k);
        if g.new.len() >= self.per_generation && !g.new.contains_key(&k) {
            // the older generation gives way, whole
            let fresh = Map::with_capacity_and_hasher(self.per_generation, Default::default());
            g.old = std::mem::replace(&mut g.new, fresh);
        }
        g.new.insert(k, seen);
    }

    /// The last answer for this plan and key, read as a cost-0 check at
    /// `now`, if one is known and still holds.
    pub(crate) fn get(&self, plan: &Plan, hash: u128, now: Nanos) -> Option<Decision> {
        if self.per_generation == 0 {
            return None;
        }
        let k = (hash, plan.identity());
        let mut g = self.shard(hash).lock();
        let g = &mut *g;
        let m = match g.new.contains_key(&k) {
            true => &mut g.new,
            false => &mut g.old,
        };
        let e = m.get(&k)?;
        if now >= e.until || now < e.at {
            m.remove(&k);
            return None;
        }
        if e.plan != *plan {
            return None;
        }
        let gone = now.saturating_sub(e.at);
        let mut d = e.decision.clone();
        d.outcome = Outcome::Allowed;
        for s in &mut d.statuses {
            s.would_deny = false;
            s.reset_after = s.reset_after.saturating_sub(gone);
        }
        Some(d)
    }

    /// Drops the key's answer (a release or refund changed its standing).
    pub(crate) fn forget(&self, plan: &Plan, hash: u128) {
        if self.per_generation > 0 {
            let k = (hash, plan.identity());
            let mut g = self.shard(hash).lock();
            g.new.remove(&k);
            g.old.remove(&k);
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                let g = s.lock();
                g.new.len() + g.old.len()
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use paceline_core::{Denial, Policy, PolicyKind, PolicyStatus};

    fn answer(remaining: u64, reset_ms: u64, denied: bool) -> Decision {
        Decision {
            outcome: match denied {
                true => Outcome::Denied(Denial {
                    policy: 0,
                    kind: PolicyKind::Burst,
                    retry_after: Nanos::from_millis(reset_ms),
                }),
                false => Outcome::Allowed,
            },
            statuses: smallvec::smallvec![PolicyStatus {
                remaining,
                reset_after: Nanos::from_millis(reset_ms),
                would_deny: denied,
            }],
        }
    }

    fn plan() -> Plan {
        Plan::new("p", vec![Policy::token_bucket("b", 20, 2).unwrap()]).unwrap()
    }

    #[test]
    fn a_seen_key_reads_as_it_was_aged_and_an_unseen_one_is_none() {
        let v = Standing::new(100);
        let t = Nanos::from_secs(100);
        v.put(&plan(), 7, t, &answer(0, 5_000, true));
        let d = v
            .get(&plan(), 7, t.saturating_add(Nanos::from_secs(2)))
            .unwrap();
        assert!(d.is_allowed() && !d.statuses[0].would_deny, "{d:?}");
        assert_eq!(d.statuses[0].remaining, 0);
        assert_eq!(d.statuses[0].reset_after, Nanos::from_secs(3));
        assert!(v.get(&plan(), 8, t).is_none(), "never seen");
        let other = Plan::new("q", vec![Policy::token_bucket("b", 20, 2).unwrap()]).unwrap();
        assert!(v.get(&other, 7, t).is_none(), "another plan");
        // past its longest reset it says nothing
        assert!(v
            .get(&plan(), 7, t.saturating_add(Nanos::from_secs(5)))
            .is_none());
        // a later answer replaces the earlier one
        v.put(&plan(), 7, t, &answer(19, 100, false));
        v.put(&plan(), 7, t, &answer(18, 200, false));
        assert_eq!(v.get(&plan(), 7, t).unwrap().statuses[0].remaining, 18);
        // an answer with no reset still holds for a second
        v.put(&plan(), 9, t, &answer(20, 0, false));
        assert!(v
            .get(&plan(), 9, t.saturating_add(Nanos::from_millis(999)))
            .is_some());
    }

    #[test]
    fn a_forgotten_answer_is_gone() {
        let v = Standing::new(100);
        let t = Nanos::from_secs(100);
        v.put(&plan(), 7, t, &answer(3, 60_000, false));
        assert!(v.get(&plan(), 7, t).is_some());
        v.forget(&plan(), 7);
        assert!(v.get(&plan(), 7, t).is_none());
    }

    #[test]
    fn the_bound_holds_and_off_is_off() {
        let v = Standing::new(64);
        let t = Nanos::from_secs(100);
        for h in 0..10_000u128 {
            v.put(&plan(), h, t, &answer(1, 60_000, false));
            assert!(v.len() <= 64, "{}", v.len());
        }
        // the newest answers are kept, and one of the older generation is
        // still read (and can be forgotten)
        assert!(v.get(&plan(), 9_999, t).is_some());
        let in_old = (0..10_000u128)
            .rev()
            .find(|&h| {
                let g = v.shard(h).lock();
                g.old.contains_key(&(h, plan().identity()))
            })
            .expect("an older generation");
        assert!(v.get(&plan(), in_old, t).is_some());
        v.forget(&plan(), in_old);
        assert!(v.get(&plan(), in_old, t).is_none());
        // a key answered again moves to the newer generation, once
        v.put(&plan(), 9_999, t, &answer(0, 60_000, false));
        assert_eq!(v.get(&plan(), 9_999, t).unwrap().statuses[0].remaining, 0);
        let off = Standing::new(0);
        off.put(&plan(), 1, t, &answer(1, 1_000, false));
        assert!(off.get(&plan(), 1, t).is_none());
    }
}
