//! The design documents' worked examples, as tests.

use paceline_core::{Limiter, ManualClock, MemoryStore, Nanos, Outcome, Plan, Policy, PolicyKind};

fn limiter_at(secs: u64) -> (Limiter<MemoryStore, ManualClock>, ManualClock) {
    let clock = ManualClock::at_unix_secs(secs);
    (Limiter::new(MemoryStore::new(), clock.clone()), clock)
}

fn plan(policies: Vec<Policy>) -> Plan {
    Plan::new("t", policies).unwrap()
}

/// Depth 8, refill 4/s: 8 at once, then 4/s; at most C + r*10 = 48 in 10 s.
#[test]
fn depth_8_refill_4_per_second() {
    let (lim, clock) = limiter_at(1_800_000_000);
    let p = plan(vec![Policy::token_bucket("burst", 8, 2).unwrap()]);
    let burst = (0..20)
        .filter(|_| lim.check_sync(&p, "k", 1).unwrap().is_allowed())
        .count();
    assert_eq!(burst, 8);
    // then exactly one every 250 ms
    let mut admitted = burst;
    let step = Nanos::from_millis(10);
    for _ in 0..1000 {
        clock.advance(step);
        while lim.check_sync(&p, "k", 1).unwrap().is_allowed() {
            admitted += 1;
        }
    }
    // 10 s elapsed: 8 + 40 refills
    assert_eq!(admitted, 48);
}

/// Empty bucket holding 0.25 tokens: the wait is 0.1875 s, announced as 1 s.
#[test]
fn quarter_token_waits_one_second() {
    let (lim, clock) = limiter_at(1_800_000_000);
    let p = plan(vec![Policy::token_bucket("burst", 8, 2).unwrap()]);
    for _ in 0..8 {
        assert!(lim.check_sync(&p, "k", 1).unwrap().is_allowed());
    }
    // a quarter of a token refills in 62.5 ms
    clock.advance(Nanos::new(62_500_000));
    let d = lim.check_sync(&p, "k", 1).unwrap();
    let denial = d.denial().expect("denied");
    assert_eq!(denial.retry_after, Nanos::new(187_500_000));
    assert_eq!(denial.retry_after_secs(), 1);
    assert_eq!(denial.kind, PolicyKind::Burst);
    clock.advance(denial.retry_after);
    assert!(lim.check_sync(&p, "k", 1).unwrap().is_allowed());
}

/// Depth 20, refill 5/s, idle a minute, 30 at once: 20 in, 10 out, RA 1.
#[test]
fn idle_minute_then_thirty() {
    let (lim, clock) = limiter_at(1_800_000_000);
    let p = plan(vec![Policy::token_bucket("burst", 20, 4).unwrap()]);
    assert!(lim.check_sync(&p, "k", 1).unwrap().is_allowed());
    clock.advance(Nanos::from_secs(60));
    let results: Vec<_> = (0..30)
        .map(|_| lim.check_sync(&p, "k", 1).unwrap())
        .collect();
    assert_eq!(results.iter().filter(|d| d.is_allowed()).count(), 20);
    for d in &results[20..] {
        assert_eq!(d.denial().unwrap().retry_after_secs(), 1);
        assert_eq!(d.statuses[0].remaining, 0);
    }
}

/// The Free plan's counters as the design document shows them.
#[test]
fn free_plan_counts_down_and_daily_resets_at_midnight() {
    // 2026-10-01T18:40:00Z
    let t = 1_790_812_800 + 18 * 3600 + 40 * 60;
    let (lim, clock) = limiter_at(t);
    let free = plan(vec![
        Policy::token_bucket("burst", 20, 2).unwrap(),
        Policy::daily("daily", 10_000).unwrap(),
    ]);
    let d = lim.check_sync(&free, "sk", 1).unwrap();
    assert_eq!(d.statuses[0].remaining, 19);
    assert_eq!(d.statuses[1].remaining, 9_999);
    assert_eq!(d.statuses[1].reset_secs(), 19_200);
    // spend the rest of the day's quota, pacing under the burst
    for _ in 0..9_999 {
        clock.advance(Nanos::from_millis(100));
        assert!(lim.check_sync(&free, "sk", 1).unwrap().is_allowed());
    }
    clock.set(Nanos::from_secs(t));
    let d = lim.check_sync(&free, "sk", 1).unwrap();
    let denial = d.denial().unwrap();
    assert_eq!(free.policy(denial.policy).name(), "daily");
    assert_eq!(denial.kind, PolicyKind::Quota);
    assert_eq!(denial.retry_after_secs(), 19_200);
    clock.set(Nanos::from_secs(t + 19_200));
    assert!(lim.check_sync(&free, "sk", 1).unwrap().is_allowed());
}

/// A cost no policy could ever hold is its own outcome, not a wait.
#[test]
fn cost_exceeding_burst() {
    let (lim, _) = limiter_at(1_800_000_000);
    let free = plan(vec![
        Policy::token_bucket("burst", 20, 2).unwrap(),
        Policy::daily("daily", 10_000).unwrap(),
    ]);
    let d = lim.check_sync(&free, "k", 50).unwrap();
    assert_eq!(
        d.outcome,
        Outcome::CostExceedsBurst {
            policy: 0,
            cost: 50
        }
    );
    // a flat cost of 10 fits twice
    assert!(lim.check_sync(&free, "k", 10).unwrap().is_allowed());
    assert!(lim.check_sync(&free, "k", 10).unwrap().is_allowed());
    assert!(!lim.check_sync(&free, "k", 10).unwrap().is_allowed());
}

/// When several policies deny, the longest wait wins and names its policy.
#[test]
fn longest_wait_names_the_policy() {
    let (lim, _) = limiter_at(1_800_000_000);
    let p = plan(vec![
        Policy::token_bucket("burst", 2, 1).unwrap(),
        Policy::fixed_window("minute", 2, 60).unwrap(),
    ]);
    assert!(lim.check_sync(&p, "k", 1).unwrap().is_allowed());
    assert!(lim.check_sync(&p, "k", 1).unwrap().is_allowed());
    let d = lim.check_sync(&p, "k", 1).unwrap();
    let denial = d.denial().unwrap();
    assert_eq!(denial.policy, 1);
    assert!(d.statuses[0].would_deny && d.statuses[1].would_deny);
}

/// Shadow policies publish and count but never deny.
#[test]
fn shadow_policy_never_denies() {
    let (lim, _) = limiter_at(1_800_000_000);
    let p = plan(vec![
        Policy::token_bucket("burst", 100, 1).unwrap(),
        Policy::token_bucket("new", 2, 1).unwrap().with_shadow(true),
    ]);
    let ds: Vec<_> = (0..5)
        .map(|_| lim.check_sync(&p, "k", 1).unwrap())
        .collect();
    assert!(ds.iter().all(|d| d.is_allowed()));
    assert!(ds[4].statuses[1].would_deny);
    assert_eq!(ds[4].statuses[0].remaining, 95);
}

/// Concurrency leases give their units back when dropped.
#[test]
fn concurrency_lease_released_on_drop() {
    let (lim, _) = limiter_at(1_800_000_000);
    let p = plan(vec![Policy::concurrency("inflight", 2).unwrap()]);
    let (_, a) = lim.acquire_sync(&p, "k", 1).unwrap();
    let (_, b) = lim.acquire_sync(&p, "k", 1).unwrap();
    assert!(a.is_some() && b.is_some());
    let (d, c) = lim.acquire_sync(&p, "k", 1).unwrap();
    assert!(!d.is_allowed() && c.is_none());
    drop(a);
    let (d, _c) = lim.acquire_sync(&p, "k", 1).unwrap();
    assert!(d.is_allowed());
}

/// Idle keys are forgotten; the store's memory stays bounded.
#[test]
fn idle_keys_are_swept_and_capacity_is_bounded() {
    // one-word plans (the lock-free table) and multi-word ones
    swept_and_bounded(plan(vec![Policy::token_bucket("burst", 10, 1).unwrap()]));
    swept_and_bounded(plan(vec![
        Policy::token_bucket("burst", 10, 1).unwrap(),
        Policy::fixed_window("second", 100, 1).unwrap(),
    ]));
}

/// A store of one shard holding at most `max_keys`, on a manual clock.
fn one_shard(max_keys: usize) -> (MemoryStore, ManualClock, Limiter<MemoryStore, ManualClock>) {
    let store = MemoryStore::with_config(paceline_core::MemoryStoreConfig {
        shards: 1,
        max_keys,
    });
    let clock = ManualClock::at_unix_secs(1_800_000_000);
    let lim = Limiter::new(store.clone(), clock.clone());
    (store, clock, lim)
}

/// A one-word plan (a burst of 10 per `w` seconds) and a multi-word one
/// (the same burst and `second`).
fn both_kinds(w: u64, second: Policy) -> [Plan; 2] {
    let burst = Policy::token_bucket("burst", 10, w).unwrap();
    [
        plan(vec![burst.clone()]),
        Plan::new("two", vec![burst, second]).unwrap(),
    ]
}

fn swept_and_bounded(p: Plan) {
    let (store, clock, lim) = one_shard(2_000);
    for i in 0..2_000 {
        assert!(lim
            .check_sync(&p, &format!("k{i}"), 1)
            .unwrap()
            .is_allowed());
    }
    // full of live keys: a new one is refused, old ones still work
    assert_eq!(store.len(), 2_000);
    assert!(lim.check_sync(&p, "new", 1).is_err());
    assert!(lim.check_sync(&p, "k1", 1).unwrap().is_allowed());
    clock.advance(Nanos::from_secs(2));
    // all at rest now: the next new key triggers a sweep and fits
    assert!(lim.check_sync(&p, "new", 1).unwrap().is_allowed());
    assert!(store.len() < 10);
}

/// One-word and multi-word plans live in separate tables of a shard, but
/// share its bound on live keys.
#[test]
fn the_key_bound_covers_both_kinds_of_plan() {
    let [one, two] = both_kinds(60, Policy::daily("daily", 1_000).unwrap());
    let (store, _clock, lim) = one_shard(1_000);
    for i in 0..500 {
        assert!(lim.check_sync(&one, &format!("a{i}"), 1).is_ok());
        assert!(lim.check_sync(&two, &format!("b{i}"), 1).is_ok());
    }
    assert_eq!(store.len(), 1_000);
    assert!(lim.check_sync(&one, "new", 1).is_err());
    assert!(lim.check_sync(&two, "new", 1).is_err());
    // keys already in keep working in both tables
    assert!(lim.check_sync(&one, "a7", 1).unwrap().is_allowed());
    assert!(lim.check_sync(&two, "b7", 1).unwrap().is_allowed());
    assert_eq!(store.len(), 1_000);
}

/// Generations of keys that come and go never wear the bound down: the
/// count of live keys stays exact through sweeps of either kind.
#[test]
fn keys_that_come_and_go_keep_the_bound_exact() {
    let [one, two] = both_kinds(1, Policy::fixed_window("second", 100, 1).unwrap());
    let (store, clock, lim) = one_shard(2_000);
    for generation in 0..12 {
        // 1,500 new keys, of one kind or the other: the last generation's
        // are all at rest, so every one of these must find room
        let p = if generation % 3 == 2 { &one } else { &two };
        for i in 0..1_500 {
            let key = format!("g{generation}-{i}");
            assert!(
                lim.check_sync(p, &key, 1).unwrap().is_allowed(),
                "generation {generation}, key {i}"
            );
        }
        assert!(store.len() <= 2_000, "{}", store.len());
        clock.advance(Nanos::from_secs(5));
    }
    // everything is at rest: a sweep leaves nothing, and says so
    use paceline_core::Clock;
    assert_eq!(store.sweep(clock.now()), 0);
    assert_eq!(store.len(), 0);
}

/// A shard full of idle keys of one kind makes room for keys of the other.
#[test]
fn a_full_shard_sweeps_both_kinds_of_plan() {
    let [one, two] = both_kinds(1, Policy::daily("daily", 1_000).unwrap());
    for (first, then) in [(&one, &two), (&two, &one)] {
        let (store, clock, lim) = one_shard(1_000);
        for i in 0..1_000 {
            assert!(lim.check_sync(first, &format!("a{i}"), 1).is_ok());
        }
        assert!(lim.check_sync(then, "new", 1).is_err());
        // a day and a bit later every key of the first kind is at rest
        clock.advance(Nanos::from_secs(90_000));
        assert!(lim.check_sync(then, "new", 1).unwrap().is_allowed());
        assert_eq!(store.len(), 1);
    }
}

/// A request that can never fit charges nothing and keeps no state.
#[test]
fn a_cost_beyond_the_burst_keeps_no_state() {
    let store = MemoryStore::new();
    let lim = Limiter::new(store.clone(), ManualClock::at_unix_secs(1_800_000_000));
    for p in [
        plan(vec![Policy::token_bucket("burst", 10, 1).unwrap()]),
        plan(vec![
            Policy::token_bucket("burst", 10, 1).unwrap(),
            Policy::fixed_window("minute", 100, 60).unwrap(),
        ]),
    ] {
        for i in 0..100 {
            let d = lim.check_sync(&p, &format!("k{i}"), 11).unwrap();
            assert!(matches!(
                d.outcome,
                paceline_core::Outcome::CostExceedsBurst { .. }
            ));
        }
    }
    assert_eq!(store.len(), 0);
}

/// A reload that changes only quotas keeps the counters.
#[test]
fn quota_change_keeps_counters() {
    let (lim, _) = limiter_at(1_800_000_000);
    let old = Plan::new("free", vec![Policy::daily("daily", 100).unwrap()]).unwrap();
    for _ in 0..50 {
        assert!(lim.check_sync(&old, "k", 1).unwrap().is_allowed());
    }
    let new = Plan::new("free", vec![Policy::daily("daily", 60).unwrap()]).unwrap();
    let d = lim.check_sync(&new, "k", 1).unwrap();
    assert_eq!(d.statuses[0].remaining, 9);
}

/// Content-bytes policies are charged the body's length, the others the
/// request cost.
#[test]
fn bytes_and_requests_are_charged_separately() {
    use paceline_core::{Cost, Unit};
    let (lim, _) = limiter_at(1_800_000_000);
    let p = plan(vec![
        Policy::token_bucket("burst", 10, 1).unwrap(),
        Policy::fixed_window("upload", 10_000, 60)
            .unwrap()
            .with_unit(Unit::ContentBytes)
            .unwrap(),
    ]);
    let d = lim
        .check_sync(&p, "k", Cost::requests(1).with_bytes(6_000))
        .unwrap();
    assert!(d.is_allowed());
    assert_eq!(d.statuses[0].remaining, 9);
    assert_eq!(d.statuses[1].remaining, 4_000);
    // the next upload does not fit the byte window: denied by "upload"
    let d = lim
        .check_sync(&p, "k", Cost::requests(1).with_bytes(6_000))
        .unwrap();
    assert_eq!(p.policy(d.denial().unwrap().policy).name(), "upload");
    // a body larger than the byte quota can never fit
    let d = lim
        .check_sync(&p, "k", Cost::requests(1).with_bytes(20_000))
        .unwrap();
    assert_eq!(
        d.outcome,
        Outcome::CostExceedsBurst {
            policy: 1,
            cost: 20_000
        }
    );
}
