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
#[derive(Clone, Debug)]
pub struct SlotWindow {
    width: u64,
    slots: Box<[Slot]>,
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

    /// Adds `da` and `db` at `now`.
    pub fn add(&mut self, now: Nanos, da: u64, db: u64) {
        let e = self.epoch(now);
        let n = self.slots.len();
        let s = &mut self.slots[(e % n as u64) as usize];
        if s.epoch != e {
            *s = Slot {
                epoch: e,
                a: 0,
                b: 0,
            };
        }
        s.a = s.a.saturating_add(da);
        s.b = s.b.saturating_add(db);
    }

    /// The sums of `a` and `b` over the window ending at `now`.
    pub fn totals(&self, now: Nanos) -> (u64, u64) {
        let e = self.epoch(now);
        let n = self.slots.len() as u64;
        let mut a = 0u64;
        let mut b = 0u64;
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

    #[test]
    fn a_reused_slot_forgets_its_old_count() {
        let mut w = SlotWindow::new(Nanos::from_secs(2), Nanos::SECOND);
        w.add(Nanos::from_secs(10), 3, 3);
        w.add(Nanos::from_secs(12), 1, 0);
        assert_eq!(w.totals(Nanos::from_secs(12)), (1, 0));
    }
}
