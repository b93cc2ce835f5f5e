//! Settling: an admission charged an estimate, the answer says what it
//! really cost. More is charged into debt (never refused), less is given
//! back (never more than was charged); a key in debt is refused until it
//! is paid off, and the wait it is told is exact.

use paceline_core::{check_words, settle_words, Cost, MemoryStore, Nanos, Outcome, Plan, Policy};
use proptest::prelude::*;

const S: u64 = 1_000_000_000;

fn kinds() -> Vec<Policy> {
    vec![
        Policy::token_bucket("tb", 10, 10).unwrap(),
        Policy::fixed_window("fw", 10, 60).unwrap(),
        Policy::daily("day", 10).unwrap(),
        Policy::sliding_counter("sc", 10, 60).unwrap(),
        Policy::sliding_log("sl", 10, 60).unwrap(),
    ]
}

/// A one-word plan and a plan of several words holding the same limit
/// (the second policy never binds), for both paths of the memory store.
fn plans(p: Policy) -> [Plan; 2] {
    let roomy = Policy::sliding_counter("roomy", 1 << 30, 60).unwrap();
    [
        Plan::new("one", vec![p.clone()]).unwrap(),
        Plan::new("two", vec![p, roomy]).unwrap(),
    ]
}

fn c(n: u64) -> Cost {
    Cost::requests(n)
}

/// Refused at `now`, and admitted exactly when its wait says, not a
/// nanosecond before (probed on copies of the store's decision, read
/// with cost-0 checks first so nothing is charged by the probes).
fn wait_is_exact(store: &MemoryStore, plan: &Plan, key: &str, now: Nanos, cost: u64) -> Nanos {
    let d = store.check_sync(plan, key, c(cost), now).unwrap();
    let wait = d.denial().expect("refused while in debt").retry_after;
    let before = Nanos::new(now.as_u64() + wait.as_u64() - 1);
    assert!(
        !store
            .check_sync(plan, key, c(cost), before)
            .unwrap()
            .is_allowed(),
        "admitted a nanosecond early"
    );
    let at = now.saturating_add(wait);
    assert!(store
        .check_sync(plan, key, c(cost), at)
        .unwrap()
        .is_allowed());
    wait
}

#[test]
fn a_bucket_in_debt_is_refused_until_paid_with_an_exact_wait() {
    let now = Nanos::new(1_790_000_000 * S);
    // 10 per 10 s: one token a second
    for plan in plans(Policy::token_bucket("tb", 10, 10).unwrap()) {
        let store = MemoryStore::new();
        assert!(store
            .check_sync(&plan, "k", c(4), now)
            .unwrap()
            .is_allowed());
        // the answer cost 16: 10 past the estimate, 6 past a full bucket
        store
            .settle_sync(&plan, "k", c(4), c(16), now, now)
            .unwrap();
        let d = store.check_sync(&plan, "k", c(0), now).unwrap();
        assert_eq!(d.statuses[0].remaining, 0);
        assert_eq!(d.statuses[0].reset_after, Nanos::from_secs(16));
        // the TAT is 16 s ahead, the burst 10 s: a cost of 2 waits 8 s
        assert_eq!(
            wait_is_exact(&store, &plan, "k", now, 2),
            Nanos::from_secs(8),
            "{}",
            plan.name()
        );
    }
}

#[test]
fn a_window_in_debt_is_refused_until_its_end() {
    // windows of 60 s aligned to the epoch; 25 s into one
    let now = Nanos::new(1_790_000_040 * S + 5 * S);
    let end = Nanos::new(1_790_000_100 * S);
    for plan in plans(Policy::fixed_window("fw", 10, 60).unwrap()) {
        let store = MemoryStore::new();
        assert!(store
            .check_sync(&plan, "k", c(5), now)
            .unwrap()
            .is_allowed());
        // 35 in a window of 10: the debt is forgiven at the edge, and not
        // carried into the next window
        store
            .settle_sync(&plan, "k", c(5), c(35), now, now)
            .unwrap();
        let wait = wait_is_exact(&store, &plan, "k", now, 1);
        assert_eq!(now.saturating_add(wait), end, "{}", plan.name());
        let d = store.check_sync(&plan, "k", c(0), end).unwrap();
        assert_eq!(d.statuses[0].remaining, 9, "{}", plan.name());
    }
}

#[test]
fn a_key_settled_after_coming_to_rest_still_owes_the_overrun() {
    let plan = Plan::new("p", vec![Policy::token_bucket("tb", 10, 10).unwrap()]).unwrap();
    let store = MemoryStore::new();
    let t0 = Nanos::new(1_790_000_000 * S);
    assert!(store.check_sync(&plan, "k", c(1), t0).unwrap().is_allowed());
    // a long answer: the estimate refilled and the key was swept
    let t1 = Nanos::new(t0.as_u64() + 3_600 * S);
    store.sweep(t1);
    assert!(store.is_empty());
    store.settle_sync(&plan, "k", c(1), c(15), t0, t1).unwrap();
    assert_eq!(
        wait_is_exact(&store, &plan, "k", t1, 1),
        Nanos::from_secs(5)
    );
}

#[test]
fn hostile_costs_give_a_bounded_debt_and_no_panic() {
    let now = Nanos::new(1_790_000_000 * S);
    for p in kinds() {
        let name = p.name().to_string();
        for plan in plans(p.clone()) {
            let store = MemoryStore::new();
            // nothing charged, nothing owed: no change, no entry
            store
                .settle_sync(&plan, "zero", c(0), c(0), now, now)
                .unwrap();
            assert!(store.is_empty());
            store
                .settle_sync(&plan, "k", c(0), c(u64::MAX), now, now)
                .unwrap();
            store
                .settle_sync(&plan, "k", c(u64::MAX), c(u64::MAX), now, now)
                .unwrap();
            let d = store.check_sync(&plan, "k", c(1), now).unwrap();
            let wait = d.denial().expect("in debt").retry_after;
            // the most any kind owes: two of its windows (a bucket: a full
            // burst of debt, then the wait for one unit)
            let longest = plan.policies().iter().map(Policy::window_s).max().unwrap();
            assert!(wait <= Nanos::from_secs(2 * longest), "{name}");
            // an estimate that can never fit is its own refusal
            let big = store.check_sync(&plan, "k", c(11), now).unwrap();
            assert_eq!(
                big.outcome,
                Outcome::CostExceedsBurst {
                    policy: 0,
                    cost: 11
                },
                "{name}"
            );
        }
    }
}

#[test]
fn a_debt_in_bytes_leaves_the_request_policies_alone() {
    let plan = Plan::new(
        "p",
        vec![
            Policy::token_bucket("rps", 10, 10).unwrap(),
            Policy::token_bucket("bytes", 1_000, 10)
                .unwrap()
                .with_unit(paceline_core::Unit::ContentBytes)
                .unwrap(),
        ],
    )
    .unwrap();
    let mut w = vec![0u64; plan.state_words()];
    let now = Nanos::new(1_790_000_000 * S);
    let est = Cost::requests(1).with_bytes(100);
    assert!(check_words(&plan, &mut w, now, est).0.is_allowed());
    settle_words(
        &plan,
        &mut w,
        est,
        Cost::requests(1).with_bytes(1_500),
        now,
        now,
    );
    let (d, _) = check_words(&plan, &mut w, now, Cost::requests(0));
    assert_eq!(d.statuses[0].remaining, 9);
    let (d, _) = check_words(&plan, &mut w, now, Cost::requests(1).with_bytes(1));
    assert_eq!(d.denial().unwrap().policy, 1);
    // 1,501 bytes past a full 1,000 at 10 ms each
    assert_eq!(d.denial().unwrap().retry_after, Nanos::from_millis(5_010));
}

fn remaining(plan: &Plan, w: &mut [u64], now: Nanos) -> u64 {
    check_words(plan, w, now, 0).0.statuses[0].remaining
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// A settle below the estimate leaves the key where a charge of the
    /// actual cost would have, and a settle later never leaves more room
    /// than if the request had never been made.
    #[test]
    fn settling_down_never_gives_more_than_was_charged(
        kind in 0usize..5,
        history in prop::collection::vec((0u64..3 * S, 1u64..5), 0..30),
        est in 1u64..=10,
        actual in 0u64..=10,
        delay in 0u64..120 * S,
    ) {
        let plan = Plan::new("p", vec![kinds().swap_remove(kind)]).unwrap();
        let mut w = vec![0u64; plan.state_words()];
        let mut now = 1_790_000_000 * S;
        for (gap, cost) in history {
            now += gap;
            check_words(&plan, &mut w, Nanos::new(now), cost);
        }
        let (now, later) = (Nanos::new(now), Nanos::new(now + delay));
        let actual = actual.min(est);
        let mut settled = w.clone();
        if check_words(&plan, &mut settled, now, est).0.is_allowed() {
            let mut late = settled.clone();
            let mut direct = w.clone();
            prop_assert!(check_words(&plan, &mut direct, now, actual).0.is_allowed());
            settle_words(&plan, &mut settled, c(est), c(actual), now, now);
            prop_assert_eq!(
                remaining(&plan, &mut settled, now),
                remaining(&plan, &mut direct, now)
            );
            settle_words(&plan, &mut late, c(est), c(actual), now, later);
            let mut untouched = w.clone();
            prop_assert!(remaining(&plan, &mut late, later) <= remaining(&plan, &mut untouched, later));
        }
    }
}

#[test]
fn concurrent_settles_are_exact() {
    // one quota no thread ever reaches: every charge and settle must land
    let q = 1_000_000;
    let policies = [
        Policy::fixed_window("fw", q, 3_600).unwrap(),
        Policy::token_bucket("tb", q, 3_600).unwrap(),
    ];
    let now = Nanos::new((1_789_999_200 + 60) * S);
    for p in policies {
        for plan in plans(p.clone()) {
            let store = MemoryStore::new();
            let threads: Vec<_> = (0..4u64)
                .map(|t| {
                    let (store, plan) = (store.clone(), plan.clone());
                    std::thread::spawn(move || {
                        let mut spent = 0;
                        for i in 0..500u64 {
                            let est = 1 + (i + t) % 7;
                            let actual = (i * 13 + t * 5) % 11;
                            let d = store.check_sync(&plan, "k", c(est), now).unwrap();
                            assert!(d.is_allowed());
                            store
                                .settle_sync(&plan, "k", c(est), c(actual), now, now)
                                .unwrap();
                            spent += actual;
                        }
                        spent
                    })
                })
                .collect();
            let spent: u64 = threads.into_iter().map(|h| h.join().unwrap()).sum();
            let d = store.check_sync(&plan, "k", c(0), now).unwrap();
            assert_eq!(d.statuses[0].remaining, q - spent, "{}", plan.name());
        }
    }
}
