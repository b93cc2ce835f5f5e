//! What the degraded local limiter took, so that a refund or a release
//! goes back to the side that charged: a charge made in Redis is given
//! back in Redis, one the degraded limiter made is given back there (and
//! only there), never both — a degraded bucket that was never charged is
//! not credited, nor is a Redis row.
//!
//! Charges are known by plan, key and the instant of the charge (the one
//! a refund names); leases by plan and key, as a count of units. Both are
//! bounded: past [`MAX_CHARGES`] the oldest charge is forgotten (its
//! refund, if it ever comes, goes to Redis, which never took it — and
//! which gives back nothing where nothing is charged, or credits one
//! request at most); past [`MAX_LEASE_KEYS`] a new key's degraded lease
//! is not taken at all (see the store's `degraded`).

use std::collections::{HashMap, VecDeque};

use paceline_core::Nanos;

/// The most degraded charges remembered for their refunds.
pub(crate) const MAX_CHARGES: usize = 100_000;
/// The most keys with degraded leases out remembered for their releases.
pub(crate) const MAX_LEASE_KEYS: usize = 100_000;

type Charge = (u64, u128, u64);

/// The degraded limiter's outstanding charges and leases.
pub(crate) struct Taken {
    charges: HashMap<Charge, u32>,
    order: VecDeque<Charge>,
    leases: HashMap<(u64, u128), u64>,
    max_charges: usize,
    max_lease_keys: usize,
}

impl Default for Taken {
    fn default() -> Self {
        Taken::with_bounds(MAX_CHARGES, MAX_LEASE_KEYS)
    }
}

impl Taken {
    pub(crate) fn with_bounds(max_charges: usize, max_lease_keys: usize) -> Taken {
        Taken {
            charges: HashMap::new(),
            order: VecDeque::new(),
            leases: HashMap::new(),
            max_charges: max_charges.max(1),
            max_lease_keys: max_lease_keys.max(1),
        }
    }

    /// The degraded limiter charged plan `plan`'s key `hash` at `at`.
    pub(crate) fn charged(&mut self, plan: u64, hash: u128, at: Nanos) {
        let c = (plan, hash, at.as_u64());
        while self.order.len() >= self.max_charges {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            self.forget(old);
        }
        self.order.push_back(c);
        *self.charges.entry(c).or_insert(0) += 1;
    }

    fn forget(&mut self, c: Charge) -> bool {
        match self.charges.get_mut(&c) {
            Some(n) if *n > 1 => {
                *n -= 1;
                true
            }
            Some(_) => {
                self.charges.remove(&c);
                true
            }
            None => false,
        }
    }

    /// Whether the charge of `hash` at `at` was the degraded limiter's;
    /// if so it is no longer outstanding.
    pub(crate) fn refunded(&mut self, plan: u64, hash: u128, at: Nanos) -> bool {
        let c = (plan, hash, at.as_u64());
        let took = self.forget(c);
        if took {
            // its place in the order goes too, when it is the newest (the
            // common case: refunds come soon); else it ages out harmlessly
            if let Some(i) = self.order.iter().rposition(|o| *o == c) {
                if i + 64 >= self.order.len() {
                    self.order.remove(i);
                }
            }
        }
        if self.charges.is_empty() {
            self.order.clear();
        }
        took
    }

    /// Records `units` leased by the degraded limiter; `false` when the
    /// bound leaves no room for a new key (the lease must then be given
    /// back at once).
    pub(crate) fn leased(&mut self, plan: u64, hash: u128, units: u64) -> bool {
        let k = (plan, hash);
        if !self.leases.contains_key(&k) && self.leases.len() >= self.max_lease_keys {
            return false;
        }
        *self.leases.entry(k).or_insert(0) += units;
        true
    }

    /// Of `amount` units released, how many the degraded limiter holds
    /// (now given back); the rest were Redis's.
    pub(crate) fn released(&mut self, plan: u64, hash: u128, amount: u64) -> u64 {
        let k = (plan, hash);
        let Some(held) = self.leases.get_mut(&k) else {
            return 0;
        };
        let local = amount.min(*held);
        *held -= local;
        if *held == 0 {
            self.leases.remove(&k);
        }
        local
    }

    #[cfg(test)]
    fn sizes(&self) -> (usize, usize, usize) {
        (self.charges.len(), self.order.len(), self.leases.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refund_is_the_degraded_limiters_only_for_its_own_charges() {
        let mut t = Taken::default();
        let at = Nanos::from_secs(5);
        t.charged(1, 7, at);
        t.charged(1, 7, at);
        assert!(!t.refunded(1, 7, Nanos::from_secs(4)), "another instant");
        assert!(!t.refunded(2, 7, at), "another plan");
        assert!(!t.refunded(1, 8, at), "another key");
        assert!(t.refunded(1, 7, at));
        assert!(t.refunded(1, 7, at));
        assert!(!t.refunded(1, 7, at), "both given back already");
        assert_eq!(t.sizes(), (0, 0, 0));
    }

    #[test]
    fn releases_split_between_the_sides() {
        let mut t = Taken::default();
        assert_eq!(t.released(1, 7, 1), 0, "nothing held locally");
        assert!(t.leased(1, 7, 2));
        assert_eq!(t.released(1, 7, 3), 2, "two local, one Redis's");
        assert_eq!(t.released(1, 7, 1), 0);
        assert_eq!(t.sizes(), (0, 0, 0));
    }

    #[test]
    fn both_records_are_bounded() {
        let mut t = Taken::with_bounds(100, 10);
        for i in 0..10_000u64 {
            t.charged(1, u128::from(i), Nanos::new(i));
        }
        let (charges, order, _) = t.sizes();
        assert!(charges <= 100 && order <= 100, "{charges} {order}");
        // the newest are remembered, the oldest forgotten
        assert!(t.refunded(1, 9_999, Nanos::new(9_999)));
        assert!(!t.refunded(1, 0, Nanos::ZERO));
        for k in 0..10u128 {
            assert!(t.leased(1, k, 1));
        }
        assert!(!t.leased(1, 10, 1), "no room for a new key");
        assert!(t.leased(1, 3, 1), "a known key still counts");
        assert_eq!(t.released(1, 3, 5), 2);
    }
}
