//! Refunds: a charge given back leaves every later decision as if it had
//! never been made, and a refund never makes room a key never had; for
//! every algorithm, through the words and through the memory store (both
//! its one-word and its multi-word paths).

use paceline_core::{check_words, refund_words, Cost, MemoryStore, Nanos, Plan, Policy, Store};
use proptest::prelude::*;

const S: u64 = 1_000_000_000;

fn kinds() -> Vec<Policy> {
    vec![
        Policy::token_bucket("tb", 10, 10).unwrap(),
        Policy::fixed_window("fw", 10, 60).unwrap(),
        Policy::daily("day", 10).unwrap(),
        Policy::sliding_counter("sc", 10, 60).unwrap(),
        Policy::sliding_log("sl", 10, 60).unwrap(),
        Policy::concurrency("cc", 10).unwrap(),
    ]
}

fn remaining(plan: &Plan, words: &mut [u64], now: Nanos) -> Vec<u64> {
    let (d, _) = check_words(plan, words, now, 0);
    d.statuses.iter().map(|s| s.remaining).collect()
}

#[test]
fn a_refund_gives_the_charge_back_for_every_time_based_kind() {
    let now = Nanos::new(1_790_000_000 * S + 7 * S);
    for p in kinds() {
        let name = p.name().to_string();
        let concurrency = p.algorithm() == paceline_core::Algorithm::Concurrency;
        let plan = Plan::new("p", vec![p]).unwrap();
        let mut w = vec![0u64; plan.state_words()];
        check_words(&plan, &mut w, now, 2);
        let before = remaining(&plan, &mut w, now);
        check_words(&plan, &mut w, now, 3);
        refund_words(&plan, &mut w, Cost::requests(3), now, now);
        let after = remaining(&plan, &mut w, now);
        match concurrency {
            // the lease gives concurrency units back, not a refund
            true => assert_eq!(after[0], before[0] - 3, "{name}"),
            false => assert_eq!(after, before, "{name}"),
        }
    }
}

#[test]
fn a_window_refunds_only_while_it_is_the_window_of_the_charge() {
    let plan = Plan::new("p", vec![Policy::fixed_window("m", 10, 60).unwrap()]).unwrap();
    let charged = Nanos::new(1_790_000_000 * S / (60 * S) * (60 * S) + 59 * S);
    let mut w = vec![0u64; plan.state_words()];
    check_words(&plan, &mut w, charged, 4);
    // the next window has started: its count is not touched
    let later = charged.saturating_add(Nanos::new(2 * S));
    check_words(&plan, &mut w, later, 1);
    refund_words(&plan, &mut w, Cost::requests(4), charged, later);
    assert_eq!(remaining(&plan, &mut w, later), vec![9]);
}

#[test]
fn a_bucket_is_never_credited_past_full() {
    let plan = Plan::new("p", vec![Policy::token_bucket("b", 5, 5).unwrap()]).unwrap();
    let now = Nanos::new(1_000 * S);
    let mut w = vec![0u64; plan.state_words()];
    check_words(&plan, &mut w, now, 1);
    // a refund of more than was charged, or twice
    refund_words(&plan, &mut w, Cost::requests(4), now, now);
    refund_words(&plan, &mut w, Cost::requests(4), now, now);
    assert_eq!(remaining(&plan, &mut w, now), vec![5]);
}

#[test]
fn a_sliding_counter_refunds_the_sub_window_of_the_charge() {
    let plan = Plan::new("p", vec![Policy::sliding_counter("c", 10, 10).unwrap()]).unwrap();
    let t0 = Nanos::new(105 * S);
    let mut w = vec![0u64; plan.state_words()];
    check_words(&plan, &mut w, t0, 6);
    // a charge in the next sub-window moves the first into "previous"
    let t1 = Nanos::new(111 * S);
    check_words(&plan, &mut w, t1, 1);
    let with = remaining(&plan, &mut w, t1);
    refund_words(&plan, &mut w, Cost::requests(6), t0, t1);
    let without = remaining(&plan, &mut w, t1);
    assert!(without[0] > with[0], "{with:?} {without:?}");
    assert_eq!(without, vec![9]);
}

#[test]
fn bytes_policies_get_their_bytes_back() {
    let bytes = Policy::daily("bytes", 1000)
        .unwrap()
        .with_unit(paceline_core::Unit::ContentBytes)
        .unwrap();
    let plan = Plan::new("p", vec![Policy::daily("req", 10).unwrap(), bytes]).unwrap();
    let now = Nanos::new(1_790_000_000 * S);
    let mut w = vec![0u64; plan.state_words()];
    let cost = Cost::requests(1).with_bytes(300);
    check_words(&plan, &mut w, now, cost);
    refund_words(&plan, &mut w, cost, now, now);
    assert_eq!(remaining(&plan, &mut w, now), vec![10, 1000]);
}

/// Runs a store future that is ready at once (the memory store's are).
fn now_ready<T>(f: impl std::future::Future<Output = T>) -> T {
    let mut f = std::pin::pin!(f);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match f.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(v) => v,
        std::task::Poll::Pending => panic!("the memory store never waits"),
    }
}

#[test]
fn the_memory_store_refunds_one_word_and_multi_word_plans() {
    let store = MemoryStore::new();
    let now = Nanos::new(1_790_000_000 * S);
    for plan in [
        Plan::new("one", vec![Policy::token_bucket("b", 10, 10).unwrap()]).unwrap(),
        Plan::new("two", vec![Policy::sliding_log("l", 10, 60).unwrap()]).unwrap(),
        Plan::new(
            "many",
            vec![
                Policy::token_bucket("b", 10, 10).unwrap(),
                Policy::daily("d", 100).unwrap(),
                Policy::sliding_counter("c", 50, 60).unwrap(),
            ],
        )
        .unwrap(),
    ] {
        let d = now_ready(store.check(&plan, "k", 4, now)).unwrap();
        assert!(d.is_allowed());
        now_ready(store.refund(&plan, "k", Cost::requests(4), now, now)).unwrap();
        let d = now_ready(store.check(&plan, "k", 0, now)).unwrap();
        let left: Vec<u64> = d.statuses.iter().map(|s| s.remaining).collect();
        let full: Vec<u64> = plan.policies().iter().map(|p| p.quota()).collect();
        assert_eq!(left, full, "{}", plan.name());
        // a key never seen: nothing happens
        now_ready(store.refund(&plan, "stranger", Cost::requests(4), now, now)).unwrap();
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Charging and at once refunding one request, anywhere in any
    /// sequence, leaves every later decision as it would have been.
    #[test]
    fn a_refunded_charge_changes_no_later_decision(
        kind in 0usize..5,
        seq in prop::collection::vec((0u64..3 * S, 1u64..4), 1..120),
        at in 0usize..120,
        extra in 1u64..4,
    ) {
        let plan = Plan::new("p", vec![kinds()[kind].clone()]).unwrap();
        let mut a = vec![0u64; plan.state_words()];
        let mut b = vec![0u64; plan.state_words()];
        let mut now = 1_790_000_000 * S;
        for (i, &(gap, cost)) in seq.iter().enumerate() {
            now += gap;
            let t = Nanos::new(now);
            if i == at.min(seq.len() - 1) {
                let (d, _) = check_words(&plan, &mut b, t, extra);
                if d.is_allowed() {
                    refund_words(&plan, &mut b, Cost::requests(extra), t, t);
                }
            }
            let (da, _) = check_words(&plan, &mut a, t, cost);
            let (db, _) = check_words(&plan, &mut b, t, cost);
            prop_assert_eq!(da.is_allowed(), db.is_allowed(), "step {}", i);
            prop_assert_eq!(da.statuses[0].remaining, db.statuses[0].remaining, "step {}", i);
        }
    }

    /// However refunds are given (late, twice, more than was charged), a
    /// key never has more room than its quota.
    #[test]
    fn a_refund_never_makes_room_past_the_quota(
        kind in 0usize..5,
        ops in prop::collection::vec((0u64..3 * S, 1u64..6, any::<bool>()), 1..150),
    ) {
        let plan = Plan::new("p", vec![kinds()[kind].clone()]).unwrap();
        let q = plan.policy(0).quota();
        let mut w = vec![0u64; plan.state_words()];
        let mut now = 1_790_000_000 * S;
        let mut last = now;
        for (gap, cost, refund) in ops {
            now += gap;
            let t = Nanos::new(now);
            match refund {
                true => refund_words(&plan, &mut w, Cost::requests(cost), Nanos::new(last), t),
                false => {
                    check_words(&plan, &mut w, t, cost.min(q));
                    last = now;
                }
            }
            let (d, _) = check_words(&plan, &mut w, t, 0);
            prop_assert!(d.statuses[0].remaining <= q);
        }
    }
}
