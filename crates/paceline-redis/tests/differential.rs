//! The main correctness proof: the same random operations against the
//! memory store and the Redis store (on the caller's clock) give the same
//! decisions, for every policy kind, mixed in plans, with byte costs,
//! shadow policies, reads, concurrency releases, refunds and settles
//! (answers that cost more than their check charged, into debt, or less).

#[path = "../src/testing.rs"]
mod testing;

use std::time::Duration;

use paceline_core::{Cost, MemoryStore, Nanos, Plan, Policy, Store, Unit};
use paceline_redis::{ClockSource, RedisStore, RedisStoreConfig, Scripting};
use proptest::prelude::*;

fn policy(kind: u8, a: u64, b: u64, shadow: bool, i: usize) -> Policy {
    let name = format!("p{i}");
    let p = match kind % 9 {
        // half of them with a burst of their own, smaller or larger than q
        0 => Policy::token_bucket(&name, 1 + a % 30, 1 + b % 5).and_then(|p| match a >> 63 {
            1 => p.with_burst(1 + (a >> 8) % 60),
            _ => Ok(p),
        }),
        1 => Policy::fixed_window(&name, 1 + a % 10, 1 + b % 10),
        2 => Policy::daily_at(&name, 1 + a % 50, b % 86_400),
        3 => Policy::sliding_counter(&name, 1 + a % 20, 1 + b % 10),
        4 => Policy::sliding_log(&name, 1 + a % 10, 1 + b % 10),
        5 => Policy::concurrency(&name, 1 + a % 4),
        // a window longer than 104 days: durations past 2^53 ns
        6 => Policy::fixed_window(&name, 1 + a % 5, 200 * 86_400 + b % 1_000),
        7 => Policy::token_bucket(&name, 100 + a % 1_000, 1 + b % 5)
            .and_then(|p| p.with_unit(Unit::ContentBytes)),
        // big counts over long windows: products past 2^53
        _ => Policy::sliding_counter(&name, 1_000_000 + a % 2_000_000_000, 1 + b % (30 * 86_400))
            .and_then(|p| p.with_unit(Unit::ContentBytes)),
    }
    .unwrap();
    p.with_shadow(shadow && kind % 9 != 5)
}

#[derive(Clone, Debug)]
enum Step {
    Check {
        key: u8,
        requests: u64,
        bytes: u64,
    },
    Release {
        key: u8,
        amount: u64,
    },
    /// Gives back the `back`-th latest charge still unrefunded.
    Refund {
        back: usize,
    },
    /// Settles the `back`-th latest charge still open at what its answer
    /// cost.
    Settle {
        back: usize,
        requests: u64,
        bytes: u64,
    },
}

fn step() -> impl Strategy<Value = (u64, Step)> {
    let bytes = prop_oneof![3 => 0u64..400, 1 => 0u64..3_000_000_000];
    let check = (0u8..3, 0u64..4, bytes).prop_map(|(key, requests, bytes)| Step::Check {
        key,
        requests,
        bytes,
    });
    let release = (0u8..3, 1u64..3).prop_map(|(key, amount)| Step::Release { key, amount });
    let gap = prop_oneof![
        3 => 0u64..50_000_000,
        2 => 0u64..3_000_000_000,
        1 => Just(0u64),
        1 => 0u64..100_000_000_000,
    ];
    let refund = (0usize..4).prop_map(|back| Step::Refund { back });
    let actual = prop_oneof![3 => 0u64..8, 1 => 0u64..80, 1 => Just(u64::MAX)];
    let actual_bytes = prop_oneof![3 => 0u64..4_000, 1 => 0u64..6_000_000_000, 1 => Just(u64::MAX)];
    let settle =
        (0usize..4, actual, actual_bytes).prop_map(|(back, requests, bytes)| Step::Settle {
            back,
            requests,
            bytes,
        });
    (
        gap,
        prop_oneof![5 => check, 1 => release, 1 => refund, 2 => settle],
    )
}

fn plan_strategy() -> impl Strategy<Value = Plan> {
    prop::collection::vec(
        (
            0u8..9,
            any::<u64>(),
            any::<u64>(),
            prop::bool::weighted(0.2),
        ),
        1..4,
    )
    .prop_map(|ps| {
        let policies = ps
            .into_iter()
            .enumerate()
            .map(|(i, (k, a, b, s))| policy(k, a, b, s, i))
            .collect();
        Plan::new("diff", policies).unwrap()
    })
}

fn config(url: String, scripting: Scripting) -> RedisStoreConfig {
    RedisStoreConfig {
        urls: vec![url],
        clock: ClockSource::Caller,
        scripting,
        deadline: Duration::from_secs(2),
        deny_cache: 0,
        // rows are kept by the virtual timeline's rules, not wall time
        ttl_slack: Duration::from_secs(86_400),
        // no lease outlives its request here, as in memory
        lease_ttl: paceline_redis::MAX_LEASE_TTL,
        key_secret: b"test".to_vec(),
        ..RedisStoreConfig::default()
    }
}

fn run_differential(scripting: Scripting, cases: u32) {
    let server = testing::RedisServer::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let redis = rt
        .block_on(RedisStore::connect(config(server.url(), scripting)))
        .unwrap();
    let cfg = ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    proptest!(cfg, |(plan in plan_strategy(), start in 0u64..1_000_000_000, steps in prop::collection::vec(step(), 1..60))| {
        rt.block_on(async {
            redis.command(&redis::cmd("FLUSHALL")).await.unwrap();
        });
        let memory = MemoryStore::new();
        let mut now = 1_700_000_000u64 * 1_000_000_000 + start;
        let mut charges: Vec<(String, Cost, Nanos)> = Vec::new();
        for (i, (gap, s)) in steps.iter().enumerate() {
            now += gap;
            let t = Nanos::new(now);
            match s {
                Step::Check { key, requests, bytes } => {
                    let k = format!("k:{key}");
                    let cost = Cost::requests(*requests).with_bytes(*bytes);
                    let m = memory.check_sync(&plan, &k, cost, t).unwrap();
                    let r = rt.block_on(redis.check_cost(&plan, &k, cost, t)).unwrap();
                    prop_assert_eq!(&r, &m, "step {} of {:?} on {:?}", i, steps, plan);
                    if m.is_allowed() {
                        charges.push((k, cost, t));
                    }
                }
                Step::Refund { back } => {
                    if let Some(at) = charges.len().checked_sub(back + 1) {
                        let (k, cost, charged) = charges.remove(at);
                        memory.refund_sync(&plan, &k, cost, charged, t);
                        rt.block_on(redis.refund(&plan, &k, cost, charged, t)).unwrap();
                    }
                }
                Step::Settle { back, requests, bytes } => {
                    if let Some(at) = charges.len().checked_sub(back + 1) {
                        let (k, cost, charged) = charges.remove(at);
                        let actual = Cost::requests(*requests).with_bytes(*bytes);
                        memory.settle_sync(&plan, &k, cost, actual, charged, t).unwrap();
                        rt.block_on(redis.settle(&plan, &k, cost, actual, charged, t)).unwrap();
                        // the standing right after, debt and all
                        let m = memory.check_sync(&plan, &k, Cost::requests(0), t).unwrap();
                        let r = rt.block_on(redis.check_cost(&plan, &k, Cost::requests(0), t)).unwrap();
                        prop_assert_eq!(&r, &m, "after settle, step {} of {:?} on {:?}", i, steps, plan);
                    }
                }
                Step::Release { key, amount } => {
                    let k = format!("k:{key}");
                    memory.release_sync(&plan, &k, *amount, t);
                    rt.block_on(redis.release(&plan, &k, *amount, t)).unwrap();
                }
            }
        }
    });
}

#[test]
fn redis_decides_as_memory_does_with_functions() {
    run_differential(Scripting::Functions, 300);
}

#[test]
fn redis_decides_as_memory_does_with_scripts() {
    run_differential(Scripting::Eval, 60);
}

/// The flat path as interpreted where `loadstring` is missing: the same
/// decisions as the compiled one.
#[test]
fn redis_decides_as_memory_does_interpreted() {
    run_differential(Scripting::EvalInterpreted, 150);
}

/// Big counts over a long sliding window: the weighted estimate's product
/// passes 2^53 and takes the exact long-multiplication path.
#[test]
fn big_sliding_counts_are_exact() {
    let server = testing::RedisServer::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let redis = rt
        .block_on(RedisStore::connect(config(
            server.url(),
            Scripting::Functions,
        )))
        .unwrap();
    let memory = MemoryStore::new();
    let w = 30 * 86_400u64;
    let plan = Plan::new(
        "big",
        vec![Policy::sliding_counter("c", 2_000_000_000, w)
            .unwrap()
            .with_unit(Unit::ContentBytes)
            .unwrap()],
    )
    .unwrap();
    let base = 1_700_000_000u64 / w * w * 1_000_000_000;
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    for k in 0..200u64 {
        let key = format!("k:{k}");
        // fill the previous window, then ask at some point of the next one
        let t0 = Nanos::new(base + 1_000_000_007);
        let fill = Cost::requests(1).with_bytes(1_000_000_000 + k * 4_999_999);
        let m = memory.check_sync(&plan, &key, fill, t0).unwrap();
        let r = rt
            .block_on(redis.check_cost(&plan, &key, fill, t0))
            .unwrap();
        assert_eq!(r, m);
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let into = rng % (w * 1_000_000_000);
        let t1 = Nanos::new(base + w * 1_000_000_000 + into);
        for bytes in [1, 999_999_999, 1_500_000_000 - k * 1_000_003] {
            let c = Cost::requests(1).with_bytes(bytes);
            let m = memory.check_sync(&plan, &key, c, t1).unwrap();
            let r = rt.block_on(redis.check_cost(&plan, &key, c, t1)).unwrap();
            assert_eq!(r, m, "key {k}, {bytes} bytes at {into} ns into the window");
        }
    }
}

/// One item of a group: which plan, which key, its cost.
type Member = (usize, u8, u64, u64);

fn group_step() -> impl Strategy<Value = (u64, Vec<Member>)> {
    let bytes = prop_oneof![3 => 0u64..400, 1 => 0u64..3_000_000_000];
    let member = (0usize..2, 0u8..3, 0u64..4, bytes);
    let gap = prop_oneof![
        3 => 0u64..50_000_000,
        2 => 0u64..3_000_000_000,
        1 => Just(0u64),
    ];
    (gap, prop::collection::vec(member, 1..5))
}

/// Groups (all or nothing) against both stores: the same verdict, the
/// same refusing item, the same decision for every item the memory store
/// asked (it stops at the first refusal; Redis answers them all), and so
/// the same counts afterwards. Two plans, so a group's rows differ in
/// plan and key, and sometimes repeat.
fn run_group_differential(scripting: Scripting, cases: u32) {
    use paceline_core::GroupItem;
    let server = testing::RedisServer::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let redis = rt
        .block_on(RedisStore::connect(config(server.url(), scripting)))
        .unwrap();
    let cfg = ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    proptest!(cfg, |(a in plan_strategy(), b in plan_strategy(), start in 0u64..1_000_000_000, steps in prop::collection::vec(group_step(), 1..40))| {
        rt.block_on(async {
            redis.command(&redis::cmd("FLUSHALL")).await.unwrap();
        });
        // the same layout under two names: two rows per key
        let b = Plan::new("diff2", b.policies().to_vec()).unwrap();
        let plans = [&a, &b];
        let memory = MemoryStore::new();
        let mut now = 1_700_000_000u64 * 1_000_000_000 + start;
        for (i, (gap, members)) in steps.iter().enumerate() {
            now += gap;
            let t = Nanos::new(now);
            let keys: Vec<String> = members.iter().map(|m| format!("k:{}", m.1)).collect();
            let items: Vec<GroupItem<'_>> = members
                .iter()
                .zip(&keys)
                .map(|(m, k)| GroupItem::new(plans[m.0], k, Cost::requests(m.2).with_bytes(m.3)))
                .collect();
            let m = memory.check_all_sync(&items, t).unwrap();
            let r = rt.block_on(redis.check_all(&items, t)).unwrap();
            prop_assert_eq!(r.is_admitted(), m.is_admitted(), "step {}: {:?} {:?}", i, &r, &m);
            prop_assert_eq!(r.refused(), m.refused(), "step {}: {:?} {:?}", i, &r, &m);
            for (k, (rd, md)) in r.decisions.iter().zip(&m.decisions).enumerate() {
                if md.is_some() {
                    prop_assert_eq!(rd, md, "step {} item {} of {:?} on {:?} {:?}", i, k, steps, a, b);
                }
            }
        }
    });
}

#[test]
fn groups_decide_as_in_memory_with_functions() {
    run_group_differential(Scripting::Functions, 300);
}

#[test]
fn groups_decide_as_in_memory_with_scripts() {
    run_group_differential(Scripting::Eval, 60);
}

#[test]
fn groups_decide_as_in_memory_interpreted() {
    run_group_differential(Scripting::EvalInterpreted, 150);
}
