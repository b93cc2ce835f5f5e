//! The event engine: a queue of timed events on integer virtual time.
//!
//! Why a queue and not threads: a simulation is only useful as evidence if
//! it gives the same answer every time. Events fire in time order; two
//! events at the same instant fire in the order they were scheduled, so a
//! run depends on nothing but its inputs and its seed. Popping an event
//! moves a shared [`ManualClock`] to the event's instant, so every piece of
//! real code that reads a [`Clock`](paceline_core::Clock) sees virtual time.
//!
//! ```
//! use paceline_core::{Clock, Nanos};
//! use paceline_sim::engine::EventQueue;
//!
//! let mut q = EventQueue::new(Nanos::ZERO);
//! q.schedule_at(Nanos::from_millis(20), "late");
//! q.schedule_at(Nanos::from_millis(10), "first");
//! q.schedule_at(Nanos::from_millis(10), "second");
//! let order: Vec<_> = std::iter::from_fn(|| q.pop()).map(|(_, e)| e).collect();
//! assert_eq!(order, ["first", "second", "late"]);
//! assert_eq!(q.clock().now(), Nanos::from_millis(20));
//! ```

use std::cmp::Ordering;
use std::collections::{BinaryHeap, VecDeque};

use paceline_core::{ManualClock, Nanos};

/// A heap entry: small, so sifting moves 24 bytes whatever the event's
/// size; the event itself waits in a slab slot.
#[derive(PartialEq, Eq)]
struct Entry {
    at: Nanos,
    seq: u64,
    slot: u32,
}

impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Entry {
    // BinaryHeap is a max-heap: the earliest (then first scheduled) is "largest".
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .at
            .cmp(&self.at)
            .then_with(|| other.seq.cmp(&self.seq))
    }
}

/// Timed events in virtual time, popped earliest first, ties first-in
/// first-out.
pub struct EventQueue<E> {
    heap: BinaryHeap<Entry>,
    // events scheduled in time order (the common case: a fixed latency
    // after now) skip the heap and wait here, already sorted
    run: VecDeque<Entry>,
    slab: Vec<Option<E>>,
    free: Vec<u32>,
    seq: u64,
    clock: ManualClock,
    popped: u64,
}

impl<E> EventQueue<E> {
    /// An empty queue whose clock stands at `start`.
    pub fn new(start: Nanos) -> Self {
        EventQueue::with_clock(ManualClock::new(start))
    }

    /// An empty queue driving `clock` (which it sets as events fire).
    pub fn with_clock(clock: ManualClock) -> Self {
        EventQueue {
            heap: BinaryHeap::new(),
            run: VecDeque::new(),
            slab: Vec::new(),
            free: Vec::new(),
            seq: 0,
            clock,
            popped: 0,
        }
    }

    /// The virtual clock; clones of it share the queue's time.
    pub fn clock(&self) -> &ManualClock {
        &self.clock
    }

    /// The current virtual instant.
    pub fn now(&self) -> Nanos {
        paceline_core::Clock::now(&self.clock)
    }

    /// Schedules `event` at `at`; an instant in the past means "now".
    pub fn schedule_at(&mut self, at: Nanos, event: E) {
        let at = at.max(self.now());
        let slot = match self.free.pop() {
            Some(i) => {
                self.slab[i as usize] = Some(event);
                i
            }
            None => {
                self.slab.push(Some(event));
                u32::try_from(self.slab.len() - 1).expect("fewer than 2^32 pending events")
            }
        };
        let entry = Entry {
            at,
            seq: self.seq,
            slot,
        };
        self.seq += 1;
        match self.run.back() {
            Some(last) if last.at > at => self.heap.push(entry),
            _ => self.run.push_back(entry),
        }
    }

    /// Schedules `event` `delay` after now.
    pub fn schedule_in(&mut self, delay: Nanos, event: E) {
        let at = self.now().saturating_add(delay);
        self.schedule_at(at, event);
    }

    /// Takes the next event and moves the clock to its instant.
    pub fn pop(&mut self) -> Option<(Nanos, E)> {
        let from_run = match (self.run.front(), self.heap.peek()) {
            (Some(r), Some(h)) => (r.at, r.seq) < (h.at, h.seq),
            (Some(_), None) => true,
            (None, _) => false,
        };
        let e = if from_run {
            self.run.pop_front()?
        } else {
            self.heap.pop()?
        };
        let event = self.slab[e.slot as usize].take()?;
        self.free.push(e.slot);
        self.clock.set(e.at);
        self.popped += 1;
        Some((e.at, event))
    }

    /// The instant of the next event, if any.
    pub fn peek_time(&self) -> Option<Nanos> {
        let r = self.run.front().map(|e| e.at);
        let h = self.heap.peek().map(|e| e.at);
        match (r, h) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Events waiting.
    pub fn len(&self) -> usize {
        self.heap.len() + self.run.len()
    }

    /// Whether no event is waiting.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty() && self.run.is_empty()
    }

    /// Events popped so far.
    pub fn popped(&self) -> u64 {
        self.popped
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn pops_in_time_then_insertion_order(times in proptest::collection::vec(0u64..50, 0..200)) {
            let mut q = EventQueue::new(Nanos::ZERO);
            for (i, &t) in times.iter().enumerate() {
                q.schedule_at(Nanos::new(t), i);
            }
            let mut last: Option<(Nanos, usize)> = None;
            let mut n = 0;
            while let Some((at, i)) = q.pop() {
                prop_assert_eq!(at, Nanos::new(times[i]));
                prop_assert_eq!(q.now(), at);
                if let Some((lt, li)) = last {
                    prop_assert!(lt < at || (lt == at && li < i));
                }
                last = Some((at, i));
                n += 1;
            }
            prop_assert_eq!(n, times.len());
        }

        #[test]
        fn interleaved_pushes_and_pops_match_a_sorted_model(
            ops in proptest::collection::vec((any::<bool>(), 0u64..20), 0..300),
        ) {
            let mut q = EventQueue::new(Nanos::ZERO);
            let mut model: Vec<(u64, u64)> = Vec::new(); // (at, id = seq)
            let mut id = 0u64;
            for (pop, delay) in ops {
                if pop {
                    let want = model
                        .iter()
                        .enumerate()
                        .min_by_key(|(_, e)| **e)
                        .map(|(i, _)| i)
                        .map(|i| model.remove(i));
                    let got = q.pop().map(|(at, e)| (at.as_u64(), e));
                    prop_assert_eq!(got, want);
                } else {
                    let at = q.now().as_u64() + delay;
                    q.schedule_in(Nanos::new(delay), id);
                    model.push((at, id));
                    id += 1;
                }
                prop_assert_eq!(q.len(), model.len());
            }
        }
    }

    #[test]
    fn past_instants_fire_now() {
        let mut q = EventQueue::new(Nanos::from_secs(5));
        q.schedule_at(Nanos::from_secs(1), ());
        assert_eq!(q.pop().map(|(t, _)| t), Some(Nanos::from_secs(5)));
        q.schedule_in(Nanos::from_millis(5), ());
        assert_eq!(q.peek_time(), Some(Nanos::from_millis(5_005)));
        assert_eq!(q.popped(), 1);
    }
}
