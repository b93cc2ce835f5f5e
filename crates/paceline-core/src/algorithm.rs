//! The algorithms, as pure functions over a key's state words and integer
//! time. Nothing here locks, allocates or reads a clock; a store runs
//! [`peek`] for every policy of a plan, and [`commit`] for all of them only
//! if every peek admitted.
//!
//! State layout per algorithm (all `u64`, all zero for a key never seen):
//!
//! | algorithm | words |
//! |---|---|
//! | token bucket | `[tat]`: the theoretical arrival time (GCRA) |
//! | fixed window | `[window_index mod 2^24 << 40 \| count]` (one word) |
//! | sliding counter | `[window_index, current, previous]` |
//! | sliding log | `[next_slot, t_0 + 1, …, t_(q-1) + 1]` (0 = empty slot) |
//! | concurrency | `[in_flight]` |

use crate::policy::{Algorithm, Policy};

/// One policy's answer to "would `cost` fit now?".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Peek {
    /// Whether the cost fits.
    pub(crate) admit: bool,
    /// Whole units left: after the charge when admitted, now when not.
    pub(crate) remaining: u64,
    /// Nanoseconds until the policy is fully restored (after the charge
    /// when admitted).
    pub(crate) reset_ns: u64,
    /// When denied: nanoseconds until the cost would fit. Zero if admitted.
    pub(crate) wait_ns: u64,
}

/// Would `cost` units fit under `policy` at `now`, given the key's `words`?
///
/// `cost` must not exceed the policy's quota (the caller checks that first:
/// such a request can never fit and needs no wait).
#[inline]
pub(crate) fn peek(policy: &Policy, words: &[u64], now: u64, cost: u64) -> Peek {
    match policy.algorithm() {
        Algorithm::TokenBucket => gcra_peek(policy, words[0], now, cost),
        Algorithm::FixedWindow { offset_s } => {
            window_peek(policy, words, now, cost, offset_s * 1_000_000_000)
        }
        Algorithm::SlidingCounter => counter_peek(policy, words, now, cost),
        Algorithm::SlidingLog => log_peek(policy, words, now, cost),
        Algorithm::Concurrency => concurrency_peek(policy, words[0], cost),
    }
}

/// Charges `cost` units at `now`. Call only after [`peek`] admitted.
#[inline]
pub(crate) fn commit(policy: &Policy, words: &mut [u64], now: u64, cost: u64) {
    match policy.algorithm() {
        Algorithm::TokenBucket => {
            let t = policy.emission_ns();
            words[0] = words[0].max(now).saturating_add(cost.saturating_mul(t));
        }
        Algorithm::FixedWindow { offset_s } => {
            let idx = window_index(policy, now, offset_s * 1_000_000_000);
            let count = window_count(words[0], idx);
            words[0] = pack_window(idx, count.saturating_add(cost));
        }
        Algorithm::SlidingCounter => {
            roll_counter(policy, words, now);
            words[1] = words[1].saturating_add(cost);
        }
        Algorithm::SlidingLog => {
            let q = policy.quota() as usize;
            let mut slot = words[0] as usize % q;
            for _ in 0..cost {
                words[1 + slot] = now + 1;
                slot = (slot + 1) % q;
            }
            words[0] = slot as u64;
        }
        Algorithm::Concurrency => words[0] = words[0].saturating_add(cost),
    }
}

/// Gives back `amount` units of a concurrency cap (a finished request).
/// Other algorithms ignore it: time refills them.
pub(crate) fn release(policy: &Policy, words: &mut [u64], amount: u64) {
    if policy.algorithm() == Algorithm::Concurrency {
        words[0] = words[0].saturating_sub(amount);
    }
}

/// Gives back `cost` units charged at `charged`, at `now` (a request whose
/// answer never came): a token bucket is credited, never past full; a
/// fixed window only while it is still the window of the charge; a
/// sliding counter in the sub-window the charge went to (the current or
/// the previous one); a sliding log loses up to `cost` entries stamped
/// with the charge's instant. A concurrency cap is untouched: its lease
/// gives its units back.
pub(crate) fn refund(policy: &Policy, words: &mut [u64], charged: u64, now: u64, cost: u64) {
    if cost == 0 {
        return;
    }
    match policy.algorithm() {
        Algorithm::TokenBucket => {
            if words[0] > now {
                let t = policy.emission_ns();
                words[0] = words[0].saturating_sub(cost.saturating_mul(t)).max(now);
            }
        }
        Algorithm::FixedWindow { offset_s } => {
            let offset = offset_s * 1_000_000_000;
            let idx = window_index(policy, charged, offset);
            if idx != window_index(policy, now, offset) {
                return;
            }
            let count = window_count(words[0], idx);
            if count > 0 {
                words[0] = pack_window(idx, count.saturating_sub(cost));
            }
        }
        Algorithm::SlidingCounter => {
            let idx = policy.per_window(charged);
            if words[0] == idx {
                words[1] = words[1].saturating_sub(cost);
            } else if words[0] == idx + 1 {
                words[2] = words[2].saturating_sub(cost);
            }
        }
        Algorithm::SlidingLog => {
            let stamp = charged + 1;
            let mut left = cost;
            for w in words[1..].iter_mut() {
                if left == 0 {
                    break;
                }
                if *w == stamp {
                    *w = 0;
                    left -= 1;
                }
            }
            if left == cost {
                return;
            }
            // packed again oldest first, so the next charge takes an empty
            // slot before overwriting the oldest entry
            let mut live: smallvec::SmallVec<[u64; 64]> =
                words[1..].iter().copied().filter(|&t| t != 0).collect();
            live.sort_unstable();
            let q = words.len() - 1;
            for (i, w) in words[1..].iter_mut().enumerate() {
                *w = live.get(i).copied().unwrap_or(0);
            }
            words[0] = (live.len() % q) as u64;
        }
        Algorithm::Concurrency => {}
    }
}

/// Charges `cost` units at `now` whatever the policy's room: the part of
/// an answer that cost more than its admission charged, for work already
/// done, so it is never refused. The key may go into debt, and is refused
/// until the debt is paid off; how far depends on the algorithm:
///
/// - token bucket: the TAT moves on by `cost` emission intervals, at most
///   to `now + 2w` (a debt of at most one full burst);
/// - fixed window: the current window's count grows (up to the 40 bits it
///   is kept in); the debt ends with the window;
/// - sliding counter: the current sub-window's count grows to at most `q`;
/// - sliding log: at most `q` entries are stamped `now`, the oldest
///   overwritten first (the log holds no more than `q`);
/// - concurrency: nothing (a request holds its lease's units whatever it
///   costs).
pub(crate) fn overrun(policy: &Policy, words: &mut [u64], now: u64, cost: u64) {
    if cost == 0 {
        return;
    }
    match policy.algorithm() {
        Algorithm::TokenBucket => {
            let t = policy.emission_ns();
            let cap = now.saturating_add(policy.capacity_ns().saturating_mul(2));
            let tat = words[0].max(now).saturating_add(cost.saturating_mul(t));
            words[0] = tat.min(cap).max(words[0]);
        }
        Algorithm::FixedWindow { .. } => commit(policy, words, now, cost),
        Algorithm::SlidingCounter => {
            roll_counter(policy, words, now);
            words[1] = words[1]
                .saturating_add(cost)
                .min(policy.quota())
                .max(words[1]);
        }
        Algorithm::SlidingLog => commit(policy, words, now, cost.min(policy.quota())),
        Algorithm::Concurrency => {}
    }
}

/// True when the state says nothing a fresh (all-zero) state would not:
/// the key can be forgotten without changing any future decision.
pub(crate) fn at_rest(policy: &Policy, words: &[u64], now: u64) -> bool {
    match policy.algorithm() {
        Algorithm::TokenBucket => words[0] <= now,
        Algorithm::FixedWindow { offset_s } => {
            let idx = window_index(policy, now, offset_s * 1_000_000_000);
            window_count(words[0], idx) == 0
        }
        Algorithm::SlidingCounter => {
            let idx = policy.per_window(now);
            (words[1] == 0 && words[2] == 0) || words[0] + 1 < idx
        }
        Algorithm::SlidingLog => {
            let floor = now.saturating_sub(policy.window_ns());
            words[1..].iter().all(|&t| t == 0 || t - 1 <= floor)
        }
        Algorithm::Concurrency => words[0] == 0,
    }
}

#[inline]
fn gcra_peek(policy: &Policy, tat: u64, now: u64, cost: u64) -> Peek {
    let t = policy.emission_ns();
    let w = policy.capacity_ns();
    let base = tat.max(now);
    let new_tat = base.saturating_add(cost.saturating_mul(t));
    let used_after = new_tat - now;
    if used_after <= w {
        Peek {
            admit: true,
            remaining: policy.per_emission(w - used_after),
            reset_ns: used_after,
            wait_ns: 0,
        }
    } else {
        let used = base - now;
        Peek {
            admit: false,
            remaining: policy.per_emission(w.saturating_sub(used)),
            reset_ns: used,
            wait_ns: used_after - w,
        }
    }
}

const COUNT_BITS: u32 = 40;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;
const INDEX_MASK: u64 = (1 << (64 - COUNT_BITS)) - 1;

/// The count a packed fixed-window word holds for window `idx` (zero when
/// the word belongs to another window). Stores reset a key's state when it
/// comes to rest, so a stale index can never alias a window 2^24 later.
#[inline]
fn window_count(word: u64, idx: u64) -> u64 {
    if word >> COUNT_BITS == idx & INDEX_MASK {
        word & COUNT_MASK
    } else {
        0
    }
}

#[inline]
fn pack_window(idx: u64, count: u64) -> u64 {
    ((idx & INDEX_MASK) << COUNT_BITS) | count.min(COUNT_MASK)
}

/// The largest quota a fixed window can count (40 bits).
pub(crate) const MAX_WINDOW_QUOTA: u64 = COUNT_MASK;

#[inline]
fn window_index(policy: &Policy, now: u64, offset: u64) -> u64 {
    // Windows are [offset + k*w, offset + (k+1)*w); shift so index 0 is the
    // window holding the epoch. `+ w` keeps it unsigned before the offset.
    policy.per_window(now + policy.window_ns() - offset)
}

fn window_peek(policy: &Policy, words: &[u64], now: u64, cost: u64, offset: u64) -> Peek {
    let w = policy.window_ns();
    let q = policy.quota();
    let idx = window_index(policy, now, offset);
    let count = window_count(words[0], idx);
    let end = idx.saturating_mul(w).saturating_add(offset);
    let until_end = end.saturating_sub(now).max(1);
    if count.saturating_add(cost) <= q {
        let after = count + cost;
        Peek {
            admit: true,
            remaining: q - after,
            reset_ns: if after == 0 { 0 } else { until_end },
            wait_ns: 0,
        }
    } else {
        Peek {
            admit: false,
            remaining: q.saturating_sub(count),
            reset_ns: until_end,
            wait_ns: until_end,
        }
    }
}

fn roll_counter(policy: &Policy, words: &mut [u64], now: u64) {
    let idx = policy.per_window(now);
    if words[0] == idx {
        return;
    }
    words[2] = if words[0] + 1 == idx { words[1] } else { 0 };
    words[1] = 0;
    words[0] = idx;
}

fn counter_peek(policy: &Policy, words: &[u64], now: u64, cost: u64) -> Peek {
    let w = policy.window_ns();
    let q = policy.quota();
    let mut s = [words[0], words[1], words[2]];
    roll_counter(policy, &mut s, now);
    let (cur, prev) = (s[1], s[2]);
    let into = now - s[0] * w;
    let left = w - into; // > 0
                         // estimate = prev * left / w + cur, in units (u128 keeps it exact)
    let prev_part = (prev as u128 * left as u128).div_ceil(w as u128) as u64;
    let estimate = prev_part.saturating_add(cur);
    let reset_after = |cur_after: u64| -> u64 {
        if cur_after > 0 {
            left + w
        } else if prev > 0 {
            left
        } else {
            0
        }
    };
    if estimate.saturating_add(cost) <= q {
        Peek {
            admit: true,
            remaining: q - estimate - cost,
            reset_ns: reset_after(cur + cost),
            wait_ns: 0,
        }
    } else {
        let wait = counter_wait(prev, cur, q, cost, w, left);
        Peek {
            admit: false,
            remaining: q.saturating_sub(estimate),
            reset_ns: reset_after(cur),
            wait_ns: wait.max(1),
        }
    }
}

/// Time until `prev·(left−d)/w + cur + cost ≤ q`, or in the next window
/// `cur·(w−d′)/w + cost ≤ q`.
fn counter_wait(prev: u64, cur: u64, q: u64, cost: u64, w: u64, left: u64) -> u64 {
    if cur + cost <= q && prev > 0 {
        // need prev*(left-d)/w <= q - cur - cost
        let room = (q - cur - cost) as u128;
        let max_left = room * w as u128 / prev as u128; // floor keeps it safe
        return left - (max_left as u64).min(left);
    }
    // next window: prev becomes cur
    let room = q.saturating_sub(cost) as u128;
    let max_left = (room * w as u128 / cur.max(1) as u128) as u64;
    left + (w - max_left.min(w))
}

fn log_peek(policy: &Policy, words: &[u64], now: u64, cost: u64) -> Peek {
    let w = policy.window_ns();
    let q = policy.quota();
    let floor = now.saturating_sub(w);
    let mut live: smallvec::SmallVec<[u64; 64]> = words[1..]
        .iter()
        .filter(|&&t| t != 0 && t - 1 > floor)
        .map(|&t| t - 1)
        .collect();
    live.sort_unstable();
    let count = live.len() as u64;
    let newest = live.last().copied();
    if count + cost <= q {
        Peek {
            admit: true,
            remaining: q - count - cost,
            reset_ns: w,
            wait_ns: 0,
        }
    } else {
        // the (count + cost - q)-th oldest live entry must expire
        let k = (count + cost - q) as usize;
        let expires = live[k - 1] + w;
        Peek {
            admit: false,
            remaining: q - count,
            reset_ns: newest.map_or(0, |n| n + w - now),
            wait_ns: (expires - now).max(1),
        }
    }
}

fn concurrency_peek(policy: &Policy, in_flight: u64, cost: u64) -> Peek {
    let q = policy.quota();
    if in_flight.saturating_add(cost) <= q {
        Peek {
            admit: true,
            remaining: q - in_flight - cost,
            reset_ns: 0,
            wait_ns: 0,
        }
    } else {
        Peek {
            admit: false,
            remaining: q.saturating_sub(in_flight),
            reset_ns: 0,
            // nobody knows when a request in flight ends; one second is the
            // smallest wait the wire can express
            wait_ns: 1_000_000_000,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{check_words, Nanos, Plan};
    use proptest::prelude::*;

    const S: u64 = 1_000_000_000;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// Waiting exactly the announced wait always lets the request
        /// through (when nothing else arrives), and a nanosecond less never
        /// does for a token bucket.
        #[test]
        fn announced_wait_is_exact(
            q in 1u64..30,
            w in 1u64..5,
            seq in prop::collection::vec((0u64..400_000_000, 1u64..4), 1..400),
            cost in 1u64..4,
        ) {
            let cost = cost.min(q);
            let p = Policy::token_bucket("b", q, w).unwrap();
            let plan = Plan::new("p", vec![p.clone()]).unwrap();
            let mut words = vec![0u64; 1];
            let mut now = 1_000 * S;
            for (gap, c) in seq {
                now += gap;
                check_words(&plan, &mut words, Nanos::new(now), c);
            }
            let pk = peek(&p, &words, now, cost);
            if !pk.admit {
                prop_assert!(!peek(&p, &words, now + pk.wait_ns - 1, cost).admit);
                prop_assert!(peek(&p, &words, now + pk.wait_ns, cost).admit);
            }
        }
    }

    fn run(p: &Policy, words: &mut [u64], now: u64, cost: u64) -> Peek {
        let r = peek(p, words, now, cost);
        if r.admit {
            commit(p, words, now, cost);
        }
        r
    }

    #[test]
    fn fixed_window_counts_and_resets_at_edge() {
        let p = Policy::fixed_window("m", 3, 10).unwrap();
        let mut w = vec![0; 2];
        let t0 = 1_000 * S + 4 * S; // 6 s before the edge at 1010
        for i in 0..3 {
            let r = run(&p, &mut w, t0, 1);
            assert!(r.admit);
            assert_eq!(r.remaining, 2 - i);
            assert_eq!(r.reset_ns, 6 * S);
        }
        let r = run(&p, &mut w, t0, 1);
        assert!(!r.admit);
        assert_eq!(r.wait_ns, 6 * S);
        assert!(run(&p, &mut w, 1_010 * S, 1).admit);
    }

    #[test]
    fn daily_window_offset() {
        // resets at 06:00 UTC
        let p = Policy::daily_at("d", 1, 6 * 3600).unwrap();
        let mut w = vec![0; 2];
        let day = 20_000 * 86_400 * S;
        assert!(run(&p, &mut w, day + 5 * 3600 * S, 1).admit);
        let r = run(&p, &mut w, day + 5 * 3600 * S + 1, 1);
        assert!(!r.admit);
        assert_eq!(r.wait_ns, 3600 * S - 1);
        assert!(run(&p, &mut w, day + 6 * 3600 * S, 1).admit);
    }

    #[test]
    fn sliding_log_is_exact() {
        let p = Policy::sliding_log("l", 2, 10).unwrap();
        let mut w = vec![0; 3];
        assert!(run(&p, &mut w, 100 * S, 1).admit);
        assert!(run(&p, &mut w, 105 * S, 1).admit);
        let r = run(&p, &mut w, 109 * S, 1);
        assert!(!r.admit);
        assert_eq!(r.wait_ns, S); // the 100 s entry leaves at 110 s
        assert!(run(&p, &mut w, 110 * S + 1, 1).admit);
    }

    #[test]
    fn sliding_counter_weights_previous_window() {
        let p = Policy::sliding_counter("c", 10, 10).unwrap();
        let mut w = vec![0; 3];
        for _ in 0..10 {
            assert!(run(&p, &mut w, 105 * S, 1).admit);
        }
        // at 115 s half of the previous window overlaps: estimate 5
        let r = peek(&p, &w, 115 * S, 1);
        assert!(r.admit);
        assert_eq!(r.remaining, 4);
        let r = peek(&p, &w, 115 * S, 6);
        assert!(!r.admit);
        assert_eq!(r.wait_ns, S); // at 116 s estimate is 4, 4 + 6 = 10
    }

    #[test]
    fn concurrency_cap_releases() {
        let p = Policy::concurrency("c", 2).unwrap();
        let mut w = vec![0; 1];
        assert!(run(&p, &mut w, 0, 1).admit);
        assert!(run(&p, &mut w, 0, 1).admit);
        assert!(!run(&p, &mut w, 0, 1).admit);
        release(&p, &mut w, 1);
        assert!(run(&p, &mut w, 0, 1).admit);
    }
}
