//! Timing invariants that must hold for any arrival sequence.

use paceline_core::{check_words, Nanos, Plan, Policy};
use proptest::prelude::*;

const S: u64 = 1_000_000_000;

/// Arrival gaps (ns) and costs; time only moves forward.
fn arrivals() -> impl Strategy<Value = Vec<(u64, u64)>> {
    prop::collection::vec((0u64..400_000_000, 1u64..4), 1..400)
}

fn run(plan: &Plan, start: u64, seq: &[(u64, u64)]) -> Vec<(u64, u64, bool)> {
    let mut words = vec![0u64; plan.state_words()];
    let mut now = start;
    seq.iter()
        .map(|&(gap, cost)| {
            now += gap;
            let (d, _) = check_words(plan, &mut words, Nanos::new(now), cost);
            (now, cost, d.is_allowed())
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// A token bucket of capacity C refilling r/s admits at most
    /// C + r·(b − a) units in any interval [a, b].
    #[test]
    fn token_bucket_never_exceeds_capacity_plus_refill(
        q in 1u64..30, w in 1u64..5, seq in arrivals()
    ) {
        let plan = Plan::new("p", vec![Policy::token_bucket("b", q, w).unwrap()]).unwrap();
        let out = run(&plan, 1_000 * S, &seq);
        let admitted: Vec<(u64, u64)> = out.iter().filter(|x| x.2).map(|x| (x.0, x.1)).collect();
        for i in 0..admitted.len() {
            let mut total = 0u64;
            for &(t, c) in &admitted[i..] {
                total += c;
                let span = (t - admitted[i].0) as u128;
                // C + r*(b-a), r = q/w per second; integer-exact bound
                let bound = q as u128 * (w as u128 * S as u128) + q as u128 * span;
                prop_assert!(total as u128 * (w as u128 * S as u128) <= bound,
                    "{} units in {} ns (q={}, w={})", total, span, q, w);
            }
        }
    }

    /// A fixed window never admits more than q in one window.
    #[test]
    fn fixed_window_never_exceeds_q(q in 1u64..30, w in 1u64..5, seq in arrivals()) {
        let plan = Plan::new("p", vec![Policy::fixed_window("f", q, w).unwrap()]).unwrap();
        let out = run(&plan, 1_000 * S, &seq);
        let mut per_window = std::collections::HashMap::new();
        for (t, c, ok) in out {
            if ok {
                *per_window.entry(t / (w * S)).or_insert(0u64) += c;
            }
        }
        prop_assert!(per_window.values().all(|&n| n <= q));
    }

    /// The sliding log admits at most q in any window of w.
    #[test]
    fn sliding_log_never_exceeds_q_in_any_window(q in 1u64..20, w in 1u64..3, seq in arrivals()) {
        let plan = Plan::new("p", vec![Policy::sliding_log("l", q, w).unwrap()]).unwrap();
        let out = run(&plan, 1_000 * S, &seq);
        let admitted: Vec<(u64, u64)> = out.iter().filter(|x| x.2).map(|x| (x.0, x.1)).collect();
        for i in 0..admitted.len() {
            let total: u64 = admitted[i..].iter()
                .take_while(|(t, _)| *t < admitted[i].0 + w * S)
                .map(|x| x.1).sum();
            prop_assert!(total <= q);
        }
    }

    /// The sliding counter's estimate never lets more than 2q through in any
    /// window (its documented approximation bound) and q in an aligned one.
    #[test]
    fn sliding_counter_bounded(q in 1u64..20, w in 1u64..3, seq in arrivals()) {
        let plan = Plan::new("p", vec![Policy::sliding_counter("c", q, w).unwrap()]).unwrap();
        let out = run(&plan, 1_000 * S, &seq);
        let mut per_window = std::collections::HashMap::new();
        for (t, c, ok) in out {
            if ok {
                *per_window.entry(t / (w * S)).or_insert(0u64) += c;
            }
        }
        prop_assert!(per_window.values().all(|&n| n <= q));
    }

    /// A denied request changes no state, for every algorithm in a plan.
    #[test]
    fn denial_changes_nothing(seq in arrivals(), q in 1u64..10) {
        let plan = Plan::new("p", vec![
            Policy::token_bucket("b", q, 1).unwrap(),
            Policy::fixed_window("f", q + 3, 2).unwrap(),
            Policy::sliding_log("l", q + 1, 1).unwrap(),
            Policy::sliding_counter("c", q + 2, 1).unwrap(),
            Policy::concurrency("n", 1_000).unwrap(),
        ]).unwrap();
        let mut words = vec![0u64; plan.state_words()];
        let mut now = 1_000 * S;
        for (gap, cost) in seq {
            now += gap;
            let before = words.clone();
            let (d, _) = check_words(&plan, &mut words, Nanos::new(now), cost);
            if !d.is_allowed() {
                prop_assert_eq!(&before, &words);
            }
        }
    }

    /// Remaining is what can actually be spent right now.
    #[test]
    fn remaining_is_spendable(q in 1u64..30, w in 1u64..5, seq in arrivals()) {
        let p = Policy::token_bucket("b", q, w).unwrap();
        let plan = Plan::new("p", vec![p.clone()]).unwrap();
        let mut words = vec![0u64; 1];
        let mut now = 1_000 * S;
        for (gap, c) in seq {
            now += gap;
            check_words(&plan, &mut words, Nanos::new(now), c);
        }
        let (d, _) = check_words(&plan, &mut words, Nanos::new(now), 0);
        let r = d.statuses[0].remaining;
        for _ in 0..r {
            prop_assert!(check_words(&plan, &mut words, Nanos::new(now), 1).0.is_allowed());
        }
        prop_assert!(!check_words(&plan, &mut words, Nanos::new(now), 1).0.is_allowed());
    }
}

/// The store's bound on live keys, under any mix of plans, keys and
/// pauses: it never holds more than `max_keys`, it refuses a new key only
/// when it really holds that many (its count never drifts from what its
/// tables hold), and everything at rest is swept.
mod store_bound {
    use paceline_core::{MemoryStore, MemoryStoreConfig, Nanos, Plan, Policy, StoreError};
    use proptest::prelude::*;

    const MAX: usize = 12;

    fn plans() -> [Plan; 2] {
        [
            Plan::new("one", vec![Policy::token_bucket("b", 3, 1).unwrap()]).unwrap(),
            Plan::new(
                "two",
                vec![
                    Policy::token_bucket("b", 3, 1).unwrap(),
                    Policy::fixed_window("w", 10, 2).unwrap(),
                ],
            )
            .unwrap(),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        #[test]
        fn live_keys_stay_bounded_and_counted(
            ops in prop::collection::vec((0usize..2, 0u32..40, 0u64..1_500, 0u64..5), 1..300)
        ) {
            let plans = plans();
            let store = MemoryStore::with_config(MemoryStoreConfig { shards: 1, max_keys: MAX });
            let mut now = 1_800_000_000 * 1_000_000_000u64;
            for (kind, key, pause_ms, cost) in ops {
                now += pause_ms * 1_000_000;
                let held = store.len();
                let r = store.check_sync(&plans[kind], &format!("k{key}"), cost, Nanos::new(now));
                match r {
                    Ok(_) => {}
                    // refused only when it really holds `max_keys` entries
                    // (idle ones are swept at most once a second)
                    Err(StoreError::Full) => prop_assert_eq!(held, MAX),
                    Err(e) => prop_assert!(false, "{e}"),
                }
                prop_assert!(store.len() <= MAX, "{} > {MAX}", store.len());
            }
            now += 3_600 * 1_000_000_000;
            prop_assert_eq!(store.sweep(Nanos::new(now)), 0);
        }
    }
}

/// The memory store forgets a key once its state is at rest. Forgetting
/// may never change a decision: every answer equals the one a state kept
/// for ever gives, for every policy kind, shadow ones and costs past a
/// quota included.
mod forgetting {
    use paceline_core::{check_words, Cost, MemoryStore, Nanos, Plan, Policy, Unit};
    use proptest::prelude::*;

    fn policy(kind: u8, q: u64, w: u64, shadow: bool, i: usize) -> Policy {
        let name = format!("p{i}");
        let p = match kind % 6 {
            0 => Policy::token_bucket(&name, q, w),
            1 => Policy::fixed_window(&name, q, w),
            2 => Policy::sliding_counter(&name, q, w),
            3 => Policy::sliding_log(&name, q, w),
            4 => Policy::daily_at(&name, q, w * 3_600),
            _ => Policy::token_bucket(&name, q * 100, w)
                .and_then(|p| p.with_unit(Unit::ContentBytes)),
        }
        .unwrap();
        p.with_shadow(shadow)
    }

    fn plan() -> impl Strategy<Value = Plan> {
        prop::collection::vec((0u8..6, 1u64..6, 1u64..5, prop::bool::weighted(0.5)), 1..4).prop_map(
            |ps| {
                let policies = ps
                    .into_iter()
                    .enumerate()
                    .map(|(i, (k, q, w, s))| policy(k, q, w, s, i))
                    .collect();
                Plan::new("forget", policies).unwrap()
            },
        )
    }

    fn gap() -> impl Strategy<Value = u64> {
        prop_oneof![
            3 => 0u64..2_000_000_000,
            2 => (0u64..6).prop_map(|s| s * 1_000_000_000),
            1 => Just(0u64),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        #[test]
        fn a_forgotten_key_decides_as_a_remembered_one(
            plan in plan(),
            start in 0u64..4,
            ops in prop::collection::vec((gap(), 0u64..8, 0u64..800), 1..60),
        ) {
            let store = MemoryStore::new();
            let mut kept = vec![0u64; plan.state_words()];
            let mut now = 1_700_000_000 * 1_000_000_000 + start * 1_000_000_000;
            for (i, &(gap, requests, bytes)) in ops.iter().enumerate() {
                now += gap;
                let t = Nanos::new(now);
                let cost = Cost::requests(requests).with_bytes(bytes);
                let (want, _) = check_words(&plan, &mut kept, t, cost);
                let got = store.check_sync(&plan, "k", cost, t).unwrap();
                prop_assert_eq!(&got, &want, "step {} of {:?}", i, ops);
            }
        }

        /// A peek answers what a check of cost 0 answers, and leaves the
        /// key deciding as if it had been that check.
        #[test]
        fn a_peek_answers_as_a_check_of_cost_zero(
            plan in plan(),
            start in 0u64..4,
            ops in prop::collection::vec((gap(), 0u64..8, 0u64..800, any::<bool>()), 1..60),
        ) {
            let (peeked, checked) = (MemoryStore::new(), MemoryStore::new());
            let mut now = 1_700_000_000 * 1_000_000_000 + start * 1_000_000_000;
            for (i, &(gap, requests, bytes, peek)) in ops.iter().enumerate() {
                now += gap;
                let t = Nanos::new(now);
                if peek {
                    let want = checked.check_sync(&plan, "k", 0, t).unwrap();
                    prop_assert_eq!(&peeked.peek_sync(&plan, "k", t), &want, "step {} of {:?}", i, ops);
                    continue;
                }
                let cost = Cost::requests(requests).with_bytes(bytes);
                let want = checked.check_sync(&plan, "k", cost, t).unwrap();
                let got = peeked.check_sync(&plan, "k", cost, t).unwrap();
                prop_assert_eq!(&got, &want, "step {} of {:?}", i, ops);
            }
            // a key never charged is peeked without an entry
            peeked.peek_sync(&plan, "never", Nanos::new(now));
            prop_assert!(peeked.len() <= 1);
        }
    }
}
