//! The prepared emitter against the plain one: the same fields, the same
//! problem body, whatever the memo of the last denial holds.

use super::*;
use crate::emit;
use crate::problem::PROBLEM_CONTENT_TYPE;
use http::header::CONTENT_TYPE;
use paceline_core::{MemoryStore, Policy, PolicyKind};
use proptest::prelude::*;
use sfv::{KeyRef, ListSerializer, StringRef};

/// `RateLimit` as `sfv` serializes it: the reference the crate's own
/// writer must equal.
fn sfv_ratelimit(plan: &Plan, d: &Decision) -> String {
    let key = |k| KeyRef::from_str(k).unwrap();
    let int = |n: u64| sfv::Integer::constant(n.min(999_999_999_999_999) as i64);
    let mut out = String::new();
    {
        let mut ser = ListSerializer::with_buffer(&mut out);
        for (p, s) in plan.policies().iter().zip(d.statuses.iter()) {
            let name = StringRef::from_str(p.name()).unwrap();
            ser.bare_item(name)
                .parameter(key("r"), int(s.remaining))
                .parameter(key("t"), int(s.reset_secs()));
        }
        let _ = ser.finish();
    }
    out
}

fn statuses(plan_len: usize, items: &[(u64, u64)]) -> Decision {
    let mut d = Decision {
        outcome: Outcome::Allowed,
        statuses: Default::default(),
    };
    for &(r, t) in &items[..plan_len] {
        d.statuses.push(PolicyStatus {
            remaining: r,
            reset_after: Nanos::new(t),
            would_deny: false,
        });
    }
    d
}

proptest! {
    #[test]
    fn ratelimit_writer_matches_sfv(
        items in prop::collection::vec((any::<u64>(), any::<u64>()), 1..5),
        long in any::<bool>(),
    ) {
        // long names overflow the stack buffer and take the slow path
        let stem = if long { "p".repeat(55) } else { "p".to_string() };
        let policies = (0..items.len())
            .map(|i| Policy::token_bucket(&format!("{stem}-{i}.x_y"), 10, 1).unwrap())
            .collect();
        let plan = Plan::new("p", policies).unwrap();
        let d = statuses(items.len(), &items);
        let meta = PreparedPlan::new(&plan, "x:", &Dialects::default());
        let reference = sfv_ratelimit(&plan, &d);
        prop_assert_eq!(&emit::ratelimit_field(&plan, &d), &reference);
        let theirs = HeaderValue::try_from(reference).unwrap();
        prop_assert_eq!(meta.ratelimit_value(&plan, &d), Some(theirs));
    }
}

#[test]
fn seconds_values_are_the_numbers() {
    for n in (0..10_050).chain([99_999, u64::MAX]) {
        assert_eq!(seconds_value(n), HeaderValue::from(n), "{n}");
    }
}

fn free_plan() -> Plan {
    Plan::new(
        "free",
        vec![
            Policy::token_bucket("burst", 20, 2).unwrap(),
            Policy::daily("daily", 5).unwrap(),
        ],
    )
    .unwrap()
}

#[test]
fn prepared_problem_matches_the_wire_problem() {
    let plan = free_plan();
    let meta = PreparedPlan::new(&plan, "https://errors.invalid/", &Dialects::default());
    let store = MemoryStore::new();
    let now = Nanos::from_secs(1_790_793_600);
    for _ in 0..5 {
        store.check_sync(&plan, "k", 1, now).unwrap();
    }
    for _ in 0..20 {
        let d = store.check_sync(&plan, "k", 1, now).unwrap();
        let den = d.denial().unwrap();
        let ours = meta.denial_body(&plan, &d, den, true, None);
        let theirs = Problem::from_decision(&plan, &d, "https://errors.invalid/")
            .unwrap()
            .to_json();
        let a: serde_json::Value = serde_json::from_slice(&ours).unwrap();
        let b: serde_json::Value = serde_json::from_str(&theirs).unwrap();
        assert_eq!(a, b);
        // a parser keeps the last of two equal members: count them
        let text = std::str::from_utf8(&ours).unwrap();
        for member in [
            "\"type\"",
            "\"limit\"",
            "\"violated-policies\"",
            "\"retry_after_s\"",
        ] {
            assert_eq!(text.matches(member).count(), 1, "{member} in {text}");
        }
        assert_eq!(a["retry_after_s"], 19_200);
    }
}

#[test]
fn a_denial_names_every_policy_it_broke_deciding_one_first() {
    let plan = free_plan();
    let meta = PreparedPlan::new(&plan, "https://errors.invalid/", &Dialects::default());
    let mut d = statuses(2, &[(0, 1), (0, 1)]);
    for s in &mut d.statuses {
        s.would_deny = true;
    }
    let den = Denial {
        policy: 1,
        kind: PolicyKind::Quota,
        retry_after: Nanos::from_secs(7),
    };
    d.outcome = Outcome::Denied(den);
    for publish in [true, false] {
        let body = meta.denial_body(&plan, &d, &den, publish, None);
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            v["violated-policies"],
            serde_json::json!(["daily", "burst"])
        );
        assert_eq!(v["retry_after_s"], 7);
        assert_eq!(v["limit"], "daily");
        assert_eq!(v["status"], 429);
        assert_eq!(v["detail"] == ANONYMOUS_DETAIL, !publish);
    }
    let r = meta.rejection(&plan, &d, &Dialects::default(), true, "x:");
    let h = r.headers();
    assert_eq!(r.status(), 429);
    assert_eq!(h["retry-after"], "7");
    assert_eq!(h["cache-control"], "no-store");
    assert_eq!(h["content-type"], PROBLEM_CONTENT_TYPE);
    assert_eq!(h["ratelimit"], r#""burst";r=0;t=1, "daily";r=0;t=1"#);
    assert_eq!(h["ratelimit-policy"], emit::policy_field(&plan).as_str());
    assert_eq!(h.len(), 5);
    let anon = meta.rejection(&plan, &d, &Dialects::default(), false, "x:");
    let names: Vec<_> = anon.headers().keys().map(|k| k.as_str()).collect();
    assert_eq!(names, ["content-type", "cache-control", "retry-after"]);
    // a hold names itself and its end, and is no other answer's memo
    for (hold, words) in [
        (Hold::Blocked, "blocked for 7 seconds"),
        (Hold::Extended, "extended to 7 seconds"),
    ] {
        for publish in [true, false] {
            let r = meta.held_rejection(&plan, &d, &Dialects::default(), publish, "x:", Some(hold));
            assert_eq!(r.headers()["retry-after"], "7");
            let v: serde_json::Value = serde_json::from_slice(r.body()).unwrap();
            let detail = v["detail"].as_str().unwrap();
            assert!(detail.contains(words), "{detail}");
            assert_eq!(detail.contains("daily"), publish, "{detail}");
            assert_eq!(
                (v["retry_after_s"].as_u64(), v["limit"].as_str()),
                (Some(7), Some("daily"))
            );
        }
    }
    let plain = meta.rejection(&plan, &d, &Dialects::default(), true, "x:");
    let v: serde_json::Value = serde_json::from_slice(plain.body()).unwrap();
    assert!(!v["detail"].as_str().unwrap().contains("blocked"));
}

#[test]
fn the_last_denial_memo_never_mixes_plans_identities_or_numbers() {
    let plan =
        |name: &str| Plan::new(name, vec![Policy::token_bucket("burst", 20, 2).unwrap()]).unwrap();
    let (free, pro) = (plan("free"), plan("pro"));
    let meta_free = PreparedPlan::new(&free, "x:", &Dialects::default());
    let meta_pro = PreparedPlan::new(&pro, "x:", &Dialects::default());
    let denied = |secs: u64| {
        let mut d = statuses(1, &[(0, secs * 1_000_000_000)]);
        d.statuses[0].would_deny = true;
        d.outcome = Outcome::Denied(Denial {
            policy: 0,
            kind: PolicyKind::Burst,
            retry_after: Nanos::from_secs(secs),
        });
        d
    };
    let answer = |plan: &Plan, meta: &PreparedPlan, d: &Decision, publish: bool| {
        let r = meta.rejection(plan, d, &Dialects::default(), publish, "x:");
        let v: serde_json::Value = serde_json::from_slice(r.body()).unwrap();
        let rl = r.headers().get("ratelimit").cloned();
        (
            v["detail"].as_str().unwrap().to_string(),
            rl,
            r.headers()["retry-after"].clone(),
        )
    };
    let (d1, d2) = (denied(1), denied(2));
    // three in a row: new inputs, seen once, kept; then the next case
    for round in 0..2 {
        for _ in 0..3 {
            let (detail, rl, ra) = answer(&free, &meta_free, &d1, true);
            assert!(detail.contains("free plan"), "{round}: {detail}");
            assert_eq!(rl.unwrap(), r#""burst";r=0;t=1"#);
            assert_eq!(ra, "1");
        }
        for _ in 0..3 {
            let (detail, _, _) = answer(&pro, &meta_pro, &d1, true);
            assert!(detail.contains("pro plan"), "{round}: {detail}");
        }
        for _ in 0..3 {
            let (detail, rl, _) = answer(&pro, &meta_pro, &d1, false);
            assert_eq!((detail.as_str(), rl), (ANONYMOUS_DETAIL, None));
        }
        for _ in 0..3 {
            let (_, rl, ra) = answer(&pro, &meta_pro, &d2, true);
            assert_eq!(rl.unwrap(), r#""burst";r=0;t=2"#);
            assert_eq!(ra, "2");
        }
    }
}

#[test]
fn the_memo_tells_apart_denials_whose_older_dialects_differ() {
    use paceline_core::Unit;
    // denied by a byte policy: the older dialects describe the request
    // policy with the fewest left, the one resetting last on a tie
    let plan = Plan::new(
        "p",
        vec![
            Policy::token_bucket("a", 10, 60).unwrap(),
            Policy::token_bucket("b", 20, 60).unwrap(),
            Policy::token_bucket("upload", 1_000, 60)
                .unwrap()
                .with_unit(Unit::ContentBytes)
                .unwrap(),
        ],
    )
    .unwrap();
    let denied = |ta: u64, tb: u64| {
        let mut d = statuses(3, &[(5, ta), (5, tb), (0, 30_000_000_000)]);
        d.statuses[2].would_deny = true;
        d.outcome = Outcome::Denied(Denial {
            policy: 2,
            kind: PolicyKind::Burst,
            retry_after: Nanos::from_secs(3),
        });
        d
    };
    // the same rounded numbers (t=2 for both), the order flipped
    let first = denied(1_200_000_000, 1_400_000_000);
    let second = denied(1_400_000_000, 1_200_000_000);
    let dialects = Dialects::all();
    let meta = PreparedPlan::new(&plan, "x:", &dialects);
    for d in [&first, &first, &first, &second, &second] {
        let ours = meta.rejection(&plan, d, &dialects, true, "x:");
        let mut theirs = HeaderMap::new();
        emit::write_headers(&plan, d, &dialects, &mut theirs);
        assert_eq!(
            ours.headers().get("x-ratelimit-limit"),
            theirs.get("x-ratelimit-limit")
        );
    }
}

#[test]
fn a_denial_carries_every_chosen_dialect_as_write_headers_writes_it() {
    let plan = free_plan();
    let store = MemoryStore::new();
    let now = Nanos::from_secs(1_790_793_600);
    let mut d = store.check_sync(&plan, "k", 1, now).unwrap();
    while d.is_allowed() {
        d = store.check_sync(&plan, "k", 1, now).unwrap();
    }
    for dialects in [Dialects::all(), Dialects::default()] {
        let meta = PreparedPlan::new(&plan, "x:", &dialects);
        // three times: the memo must give the same answer as a fresh one
        for _ in 0..3 {
            let ours = meta.rejection(&plan, &d, &dialects, true, "x:");
            let mut theirs = HeaderMap::new();
            theirs.insert(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_CONTENT_TYPE));
            emit::write_headers(&plan, &d, &dialects, &mut theirs);
            assert_eq!(ours.headers().len(), theirs.len());
            for (name, value) in &theirs {
                assert_eq!(ours.headers().get(name), Some(value), "{name}");
            }
        }
    }
}
