//! Costs in several units against a real limiter on virtual time: a
//! server that limits requests and tokens per minute, publishing both the
//! way OpenAI does (`x-ratelimit-{limit,remaining,reset}-{requests,tokens}`,
//! resets as `1s`-style durations), two policies in two units.

mod common;

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use common::{Driver, Resp, Run, T0};
use http::HeaderMap;
use paceline_client::{Before, Client, ClientError, Cost, Observation, RequestInfo};
use paceline_core::{Limiter, ManualClock, MemoryStore, Nanos, Plan, Policy, Unit};
use paceline_wire::emit;

const URL: &str = "http://llm.test/v1/chat/completions";

/// Requests a minute, and tokens a minute.
const RPM: u64 = 30;
const TPM: u64 = 20_000;
const JOBS: usize = 200;
const WORKERS: usize = 8;

/// An OpenAI-style API: a bucket of requests and a bucket of tokens, both
/// refilling over a minute. The limiter counts tokens in its second unit
/// (the one a request's content is charged in), so one check charges a
/// request 1 to the first policy and its tokens to the second, or nothing.
struct TokenServer {
    limiter: Limiter<MemoryStore, ManualClock>,
    plan: Plan,
}

impl TokenServer {
    fn new(clock: &ManualClock) -> Self {
        let tokens = Policy::token_bucket("tokens", TPM, 60)
            .unwrap()
            .with_unit(Unit::ContentBytes)
            .unwrap();
        let requests = Policy::token_bucket("requests", RPM, 60).unwrap();
        TokenServer {
            limiter: Limiter::new(MemoryStore::new(), clock.clone()),
            plan: Plan::new("llm", vec![requests, tokens]).unwrap(),
        }
    }

    fn respond(&self, tokens: u64) -> Resp {
        let cost = paceline_core::Cost::requests(1).with_bytes(tokens);
        let d = self.limiter.check_sync(&self.plan, "key", cost).unwrap();
        let mut h = HeaderMap::new();
        for (policy, st) in self.plan.policies().iter().zip(d.statuses.iter()) {
            let n = policy.name();
            let set = |h: &mut HeaderMap, field: &str, v: String| {
                h.insert(
                    http::HeaderName::try_from(format!("x-ratelimit-{field}-{n}")).unwrap(),
                    v.parse().unwrap(),
                );
            };
            set(&mut h, "limit", policy.quota().to_string());
            set(&mut h, "remaining", st.remaining.to_string());
            set(&mut h, "reset", go_duration(st.reset_after));
        }
        let status = if d.is_allowed() { 200 } else { 429 };
        if let Some(s) = emit::retry_after_secs(&d) {
            h.insert("retry-after", s.into());
        }
        (status, h, None)
    }
}

/// A duration as OpenAI writes it (Go's style, to the millisecond,
/// rounded up): `20ms`, `1s`, `1.5s`, `6m0s`.
fn go_duration(d: Nanos) -> String {
    let ms = d.as_u64().div_ceil(1_000_000);
    if ms < 1_000 {
        return format!("{ms}ms");
    }
    let (m, rest) = (ms / 60_000, ms % 60_000);
    let s = match rest % 1_000 {
        0 => format!("{}s", rest / 1_000),
        f => format!(
            "{}.{}s",
            rest / 1_000,
            format!("{f:03}").trim_end_matches('0')
        ),
    };
    if m > 0 {
        format!("{m}m{s}")
    } else {
        s
    }
}

/// 200 token counts from 100 to 1,900 (a fixed seed).
fn token_costs(seed: u64) -> Vec<u64> {
    let mut x = seed ^ 0x9e37_79b9_7f4a_7c15;
    (0..JOBS)
        .map(|_| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            100 + (x >> 33) % 1_801
        })
        .collect()
}

/// The time the two limits make necessary: for each unit, what the jobs
/// spend beyond the first full bucket, at the refill rate; the larger.
fn floor_s(tokens: &[u64]) -> f64 {
    let spent: u64 = tokens.iter().sum();
    let by_tokens = spent.saturating_sub(TPM) as f64 / (TPM as f64 / 60.0);
    let by_requests = (tokens.len() as u64).saturating_sub(RPM) as f64 / (RPM as f64 / 60.0);
    by_tokens.max(by_requests)
}

fn driver<'a>(c: &'a Client, clock: &'a ManualClock) -> Driver<'a> {
    Driver {
        client: c,
        clock,
        workers: WORKERS,
        jobs: JOBS as u64,
        latency: Nanos::from_millis(40),
        think: Nanos::ZERO,
        stop: Some(T0.saturating_add(Nanos::from_secs(7_200))),
        url: URL,
        jitter_think: false,
        spread: Nanos::from_millis(10),
        latency_seed: 3,
    }
}

/// The SDK, each job stating its tokens (`state_costs`) or not.
fn paced(seed: u64, state_costs: bool) -> (Run, Client) {
    let tokens = token_costs(seed);
    let clock = ManualClock::new(T0);
    let server = TokenServer::new(&clock);
    let c = common::client(&clock, seed);
    let costs: Vec<Cost> = tokens
        .iter()
        .map(|&n| match state_costs {
            true => Cost::new().with("tokens", n),
            false => Cost::new(),
        })
        .collect();
    let mut i = 0usize;
    let run = driver(&c, &clock).run_costed(&costs, &mut |_, cost| {
        // the server counts the tokens itself, stated or not: the job's
        // own count, in order of arrival when the client states none
        let n = cost.get("tokens").unwrap_or_else(|| {
            i += 1;
            tokens[(i - 1) % JOBS]
        });
        server.respond(n)
    });
    (run, c)
}

/// What a naive client does: every worker sends its next job at once and,
/// on a 429, sends it again 100 ms later, whatever the headers say.
fn naive(seed: u64) -> Run {
    let tokens = token_costs(seed);
    let clock = ManualClock::new(T0);
    let server = TokenServer::new(&clock);
    let half = Nanos::from_millis(20);
    let mut run = Run::default();
    let mut heap = BinaryHeap::new();
    let mut next_job = 0usize;
    // (arrival at the server, worker, job; usize::MAX: the next one)
    for w in 0..WORKERS {
        heap.push(Reverse((T0.saturating_add(half), w, usize::MAX)));
    }
    let mut last = T0;
    while let Some(Reverse((t, w, job))) = heap.pop() {
        let job = match job {
            usize::MAX if next_job < JOBS => {
                next_job += 1;
                next_job - 1
            }
            usize::MAX => continue,
            j => j,
        };
        clock.set(t);
        let (status, _, _) = server.respond(tokens[job]);
        run.requests += 1;
        *run.by_status.entry(status).or_insert(0) += 1;
        let back = t.saturating_add(half);
        if status == 429 {
            run.retries += 1;
            let again = back.saturating_add(Nanos::from_millis(100));
            heap.push(Reverse((again.saturating_add(half), w, job)));
        } else {
            run.done += 1;
            last = last.max(back);
            heap.push(Reverse((back.saturating_add(half), w, usize::MAX)));
        }
    }
    run.finished_s = last.saturating_sub(T0).as_secs_f64();
    run
}

/// The acceptance test of per-unit pacing: 200 jobs of varied token cost
/// finish with at most one 429, within 1.1 times the floor the tighter
/// limit sets; a naive client beside it draws many more 429s.
#[test]
fn two_units_at_the_floor_with_at_most_one_429() {
    for seed in [1, 2, 3] {
        let floor = floor_s(&token_costs(seed));
        let (run, c) = paced(seed, true);
        let naive = naive(seed);
        println!(
            "seed {seed}: floor {floor:.1} s; paced: {} done, {} × 429, {:.1} s ({:.3} × floor), \
             {} requests; naive: {} done, {} × 429, {:.1} s ({:.3} × floor), {} requests",
            run.done,
            run.status(429),
            run.finished_s,
            run.finished_s / floor,
            run.requests,
            naive.done,
            naive.status(429),
            naive.finished_s,
            naive.finished_s / floor,
            naive.requests,
        );
        assert_eq!(run.done, JOBS as u64, "{:?}", run.failed);
        assert!(run.status(429) <= 1, "{} × 429", run.status(429));
        assert!(
            run.finished_s <= floor * 1.1,
            "finished at {:.1} s, floor {floor:.1} s",
            run.finished_s
        );
        // nothing beats the floor
        assert!(run.finished_s >= floor * 0.99);
        assert_eq!(naive.done, JOBS as u64);
        assert!(
            naive.status(429) > 10 * run.status(429).max(1),
            "naive: {} × 429",
            naive.status(429)
        );
        // the diagnostics tell the token unit apart
        let d = c.diagnostics();
        let tokens = &d.scopes[0].units[0];
        assert_eq!(tokens.unit, "tokens");
        // every attempt but the first, which went before any answer
        // told of tokens
        assert_eq!(tokens.stated, run.requests - 1);
        assert!(d.scopes[0]
            .policies
            .iter()
            .any(|p| p.name == "tokens" && p.unit == "tokens" && p.window_s == Some(60)));
    }
}

/// Without stated costs, the client charges each request its running
/// estimate of the tokens one spends, learnt from the server's counts: a
/// request dearer than the estimate can still draw a 429 (and, rarely,
/// run out of attempts), but far fewer than the naive client draws.
#[test]
fn unstated_costs_are_estimated_from_the_counts() {
    let seed = 4;
    let floor = floor_s(&token_costs(seed));
    let (run, c) = paced(seed, false);
    let naive = naive(seed);
    let units = &c.diagnostics().scopes[0].units;
    let mean = token_costs(seed).iter().sum::<u64>() as f64 / JOBS as f64;
    println!(
        "estimated: {} done, {} × 429, {:.1} s ({:.3} × floor), estimate {:?} (mean cost {mean:.0}); \
         naive {} × 429",
        run.done,
        run.status(429),
        run.finished_s,
        run.finished_s / floor,
        units[0].estimate,
        naive.status(429)
    );
    assert!(run.done >= JOBS as u64 - 5, "{:?}", run.failed);
    assert_eq!(units[0].stated, 0);
    let estimate = units[0].estimate.expect("the answers showed the spend");
    assert!((estimate - mean).abs() < mean * 0.5, "estimate {estimate}");
    assert!(run.status(429) * 10 < naive.status(429));
    assert!(run.finished_s <= floor * 1.5);
}

#[test]
fn a_cost_no_window_can_hold_fails_before_it_is_sent() {
    let clock = ManualClock::new(T0);
    let server = TokenServer::new(&clock);
    let c = common::client(&clock, 1);
    let mut first = c.call(RequestInfo::get(URL));
    assert_eq!(c.before(&mut first), Before::Go);
    let (status, h, _) = server.respond(10);
    c.after_response(&mut first, status, &h, None);
    let huge = Cost::new().with("tokens", TPM + 1);
    let mut call = c.call(RequestInfo::get(URL).with_cost(huge));
    match c.before(&mut call) {
        Before::Drop(ClientError::CostExceedsQuota {
            policy,
            unit,
            amount,
            quota,
        }) => {
            assert_eq!((policy.as_str(), unit.as_str()), ("tokens", "tokens"));
            assert_eq!((amount, quota), (TPM + 1, TPM));
        }
        other => panic!("{other:?}"),
    }
    // a whole window's worth is fine, and zero tokens never wait on tokens
    let mut full = c.call(RequestInfo::get(URL).with_cost(Cost::new().with("tokens", 0)));
    assert_eq!(c.before(&mut full), Before::Go);
    assert_eq!(c.diagnostics().local_drops, 1);
}

/// Anthropic counts input and output tokens in windows of their own: a
/// cost names them by policy, and the unit's amount covers the rest.
#[test]
fn a_policy_name_in_the_cost_wins_over_its_unit() {
    let clock = ManualClock::new(T0);
    let c = common::client(&clock, 1);
    let mut first = c.call(RequestInfo::get(URL));
    assert_eq!(c.before(&mut first), Before::Go);
    let mut h = HeaderMap::new();
    for (k, v) in [
        ("anthropic-ratelimit-requests-limit", "50"),
        ("anthropic-ratelimit-requests-remaining", "49"),
        ("anthropic-ratelimit-input-tokens-limit", "10000"),
        ("anthropic-ratelimit-input-tokens-remaining", "1000"),
        ("anthropic-ratelimit-output-tokens-limit", "4000"),
        ("anthropic-ratelimit-output-tokens-remaining", "4000"),
    ] {
        h.insert(k, v.parse().unwrap());
    }
    c.after_response(&mut first, 200, &h, None);
    // 900 input tokens fit the 1,000 left; 900 tokens of each kind also do
    let cost = Cost::new().with("input-tokens", 900).with("tokens", 3_000);
    let mut a = c.call(RequestInfo::get(URL).with_cost(cost));
    assert_eq!(c.before(&mut a), Before::Go);
    // now 100 input tokens are left: 200 more must wait
    let mut b = c.call(RequestInfo::get(URL).with_cost(Cost::new().with("input-tokens", 200)));
    assert!(matches!(c.before(&mut b), Before::Wait(_)));
    let d = c.diagnostics();
    let tokens = &d.scopes[0].units[0];
    assert_eq!(tokens.policies.len(), 2);
    assert_eq!(tokens.available, Some(100));
}

/// GitHub's GraphQL resource counts points: a query's points are its
/// cost there, and a REST resource still counts requests.
#[test]
fn github_graphql_points_are_their_own_unit() {
    let now = Nanos::from_secs(1_700_000_000);
    let mut h = HeaderMap::new();
    for (k, v) in [
        ("x-ratelimit-limit", "5000"),
        ("x-ratelimit-remaining", "4990"),
        ("x-ratelimit-used", "10"),
        ("x-ratelimit-reset", "1700003000"),
        ("x-ratelimit-resource", "graphql"),
    ] {
        h.insert(k, v.parse().unwrap());
    }
    let obs = Observation::parse(200, &h, None, now);
    assert_eq!(obs.policies[0].unit_name(), "points");
    assert!(!obs.policies[0].counts_requests);
    assert!(obs.has_limits());
    h.insert("x-ratelimit-resource", "core".parse().unwrap());
    let obs = Observation::parse(200, &h, None, now);
    assert_eq!(obs.policies[0].unit_name(), "requests");
}

#[test]
fn openai_durations_are_written_as_openai_writes_them() {
    assert_eq!(go_duration(Nanos::from_millis(20)), "20ms");
    assert_eq!(go_duration(Nanos::from_secs(1)), "1s");
    assert_eq!(go_duration(Nanos::from_millis(1_500)), "1.5s");
    assert_eq!(go_duration(Nanos::from_secs(360)), "6m0s");
    assert_eq!(go_duration(Nanos::new(1)), "1ms");
}
