//! Sliding counts over whole time slots, in exact integers.
//!
//! The retry budget (one minute) and the adaptive throttle (two minutes)
//! both need "how many of X and Y in the last W". A ring of fixed slots
//! answers that with integer counts and no allocation; the window slides a
//! slot at a time, so "the last minute" means the current one-second slot
//! and the 59 before it.

use paceline_core::Nanos;

#[derive(Clone, Copy, Debug, Default)]
struct Slot {
    epoch: u64,
    a: u64,
    b: u64,
}

/// Two counters (`a`, `b`) summed over the last `slots` slots of `width`.
///
/// Running sums are kept as slots expire, so reading the totals in the
/// current slot costs nothing; a read in a later slot subtracts only the
/// slots that expired since.
#[derive(Clone, Debug)]
pub struct SlotWindow {
    width: u64,
    slots: Box<[Slot]>,
    head: u64,
    sum_a: u64,
    sum_b: u64,
}

impl SlotWindow {
    /// A window of `span`, cut into slots of `width` (both at least 1 ns;
    /// `span` is rounded up to whole slots).
    pub fn new(span: Nanos, width: Nanos) -> Self {
        let width = width.as_u64().max(1);
        let n = span.as_u64().div_ceil(width).max(1) as usize;
        SlotWindow {
            width,
            slots: vec![Slot::default(); n].into_boxed_slice(),
            head: 0,
            sum_a: 0,
            sum_b: 0,
        }
    }

    /// The window's span.
    pub fn span(&self) -> Nanos {
        Nanos::new(self.width.saturating_mul(self.slots.len() as u64))
    }

    fn epoch(&self, now: Nanos) -> u64 {
        // +1 so that epoch 0 always means "never written"
        now.as_u64() / self.width + 1
    }

    fn index(&self, epoch: u64) -> usize {
        (epoch % self.slots.len() as u64) as usize
    }

    /// The counts of the slots that leave the window when the head moves
    /// from `self.head` to `e`.
    fn expiring(&self, e: u64) -> (u64, u64) {
        let n = self.slots.len() as u64;
        let steps = e.saturating_sub(self.head).min(n);
        let (mut a, mut b) = (0u64, 0u64);
        for k in 1..=steps {
            let s = &self.slots[self.index(self.head + k)];
            if s.epoch != 0 && s.epoch + n > self.head && s.epoch <= self.head {
                a += s.a;
                b += s.b;
            }
        }
        (a, b)
    }

    fn advance(&mut self, e: u64) {
        if e <= self.head {
            return;
        }
        let (a, b) = self.expiring(e);
        self.sum_a -= a;
        self.sum_b -= b;
        let n = self.slots.len() as u64;
        for k in 1..=e.saturating_sub(self.head).min(n) {
            let i = self.index(self.head + k);
            self.slots[i] = Slot::default();
        }
        self.head = e;
    }

    /// Adds `da` and `db` at `now` (a time before the newest slot counts in
    /// that slot if it is still in the window, and is dropped otherwise).
    pub fn add(&mut self, now: Nanos, da: u64, db: u64) {
        let e = self.epoch(now);
        self.advance(e);
        let n = self.slots.len() as u64;
        if e + n <= self.head {
            return;
        }
        let i = self.index(e);
        let s = &mut self.slots[i];
        if s.epoch != e {
            self.sum_a -= s.a;
            self.sum_b -= s.b;
            *s = Slot {
                epoch: e,
                a: 0,
                b: 0,
            };
        }
        s.a = s.a.saturating_add(da);
        s.b = s.b.saturating_add(db);
        self.sum_a = self.sum_a.saturating_add(da);
        self.sum_b = self.sum_b.saturating_add(db);
    }

    /// The sums of `a` and `b` over the window ending at `now`.
    pub fn totals(&self, now: Nanos) -> (u64, u64) {
        let e = self.epoch(now);
        if e >= self.head {
            let (a, b) = self.expiring(e);
            return (self.sum_a - a, self.sum_b - b);
        }
        // a clock that stepped back: count what lies in the window
        let n = self.slots.len() as u64;
        let (mut a, mut b) = (0u64, 0u64);
        for s in self.slots.iter() {
            if s.epoch != 0 && s.epoch <= e && s.epoch + n > e {
                a = a.saturating_add(s.a);
                b = b.saturating_add(s.b);
            }
        }
        (a, b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_expire_after_the_span() {
        let mut w = SlotWindow::new(Nanos::from_secs(60), Nanos::SECOND);
        let t0 = Nanos::from_secs(1_000);
        w.add(t0, 5, 1);
        w.add(t0.saturating_add(Nanos::from_secs(30)), 2, 0);
        assert_eq!(w.totals(t0.saturating_add(Nanos::from_secs(59))), (7, 1));
        assert_eq!(w.totals(t0.saturating_add(Nanos::from_secs(60))), (2, 0));
        assert_eq!(w.totals(t0.saturating_add(Nanos::from_secs(90))), (0, 0));
    }

    proptest::proptest! {
        /// The running sums agree with counting every event in the window.
        #[test]
        fn sums_match_a_direct_count(ops in proptest::collection::vec((0u64..2_500, 0u64..5, 0u64..5), 1..300),
                                     probe in 0u64..5_000) {
            let mut w = SlotWindow::new(Nanos::from_secs(10), Nanos::SECOND);
            let mut t = 1_000_000u64;
            let mut log = Vec::new();
            for (dt_ms, a, b) in ops {
                t += dt_ms;
                w.add(Nanos::from_millis(t), a, b);
                log.push((t / 1_000, a, b));
                let now = t + probe;
                let e = now / 1_000;
                let want = log.iter().filter(|(s, _, _)| *s + 10 > e && *s <= e)
                    .fold((0, 0), |(x, y), (_, a, b)| (x + a, y + b));
                proptest::prop_assert_eq!(w.totals(Nanos::from_millis(now)), want);
            }
        }
    }

    #[test]
    fn a_reused_slot_forgets_its_old_count() {
        let mut w = SlotWindow::new(Nanos::from_secs(2), Nanos::SECOND);
        w.add(Nanos::from_secs(10), 3, 3);
        w.add(Nanos::from_secs(12), 1, 0);
        assert_eq!(w.totals(Nanos::from_secs(12)), (1, 0));
    }
}
