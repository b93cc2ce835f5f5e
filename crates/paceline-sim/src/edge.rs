//! The edge: a gateway's raw capacity, shared fairly between keys.
//!
//! A gateway can only take so many requests per second. When callers ask
//! for more, something is dropped before the limiter even runs; the
//! question is whose. Dropping at random makes a polite caller pay for a
//! noisy one, so the edge here sheds the heaviest: within each one-second
//! window a key may pass at most its fair share, the capacity divided by the
//! keys active in this window or the one before.
//!
//! ```
//! use paceline_core::Nanos;
//! use paceline_sim::edge::Edge;
//!
//! let mut edge = Edge::new(4, 2);
//! let t = Nanos::from_secs(1);
//! // key 0 alone may take the whole capacity
//! assert!((0..4).all(|_| edge.admit(0, t)));
//! assert!(!edge.admit(0, t));
//! // key 1 arrives: the window's capacity is spent
//! assert!(!edge.admit(1, t));
//! ```

use paceline_core::Nanos;

const WINDOW_NS: u64 = 1_000_000_000;

/// Per-second capacity with a fair share per key.
#[derive(Clone, Debug)]
pub struct Edge {
    capacity: u64,
    window: u64,
    total: u64,
    // per key: window index + 1 it last passed in (0 = never), count in it
    last: Vec<u64>,
    count: Vec<u64>,
    active_cur: u64,
    active_union: u64,
}

impl Edge {
    /// An edge passing `capacity` requests per second, for `keys` keys
    /// (numbered `0..keys`).
    pub fn new(capacity: u64, keys: usize) -> Self {
        Edge {
            capacity,
            window: 0,
            total: 0,
            last: vec![0; keys],
            count: vec![0; keys],
            active_cur: 0,
            active_union: 0,
        }
    }

    /// The capacity in requests per second.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Whether a request from `key` at `now` passes the edge (and counts it).
    pub fn admit(&mut self, key: usize, now: Nanos) -> bool {
        let idx = now.as_u64() / WINDOW_NS + 1;
        self.roll(idx);
        let last = self.last[key];
        if last != idx {
            self.active_cur += 1;
            if last == 0 || last + 1 != idx {
                self.active_union += 1;
            }
            self.last[key] = idx;
            self.count[key] = 0;
        }
        let share = (self.capacity / self.active_union.max(1)).max(1);
        if self.total >= self.capacity || self.count[key] >= share {
            return false;
        }
        self.total += 1;
        self.count[key] += 1;
        true
    }

    fn roll(&mut self, idx: u64) {
        if idx == self.window {
            return;
        }
        self.active_union = if idx == self.window + 1 {
            self.active_cur
        } else {
            0
        };
        self.active_cur = 0;
        self.total = 0;
        self.window = idx;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_light_key_passes_while_a_heavy_one_is_shed() {
        let mut edge = Edge::new(40, 2);
        let mut light = 0;
        let mut heavy = 0;
        for ms in (0..10_000).step_by(10) {
            let now = Nanos::from_millis(ms);
            if edge.admit(1, now) {
                heavy += 1;
            }
            if ms % 250 == 0 && edge.admit(0, now) {
                light += 1;
            }
        }
        assert_eq!(light, 40, "every polite request passes");
        assert_eq!(heavy, 200, "the heavy key is held to its fair share");
    }

    proptest! {
        #[test]
        fn never_more_than_capacity_per_window(
            cap in 1u64..50,
            reqs in proptest::collection::vec((0usize..5, 0u64..3_000), 0..400),
        ) {
            let mut reqs = reqs;
            reqs.sort_by_key(|r| r.1);
            let mut edge = Edge::new(cap, 5);
            let mut per_window = std::collections::BTreeMap::new();
            for (k, ms) in reqs {
                if edge.admit(k, Nanos::from_millis(ms)) {
                    *per_window.entry(ms / 1000).or_insert(0u64) += 1;
                }
            }
            for (_, n) in per_window {
                prop_assert!(n <= cap);
            }
        }
    }
}
