//! The server-side step: the Lua source (as a Redis 7 function library and
//! as a plain script for `EVALSHA`), what a batch sends, and how its reply
//! is read back into [`Decision`]s.
//!
//! The library is named by version (`paceline_v8`): a release that changes
//! the Lua or what it is sent and answers loads a new name next to the old
//! one, so instances of two releases share one server while they roll. New
//! operations (a refund, say) are new op codes of the same `run` (see
//! `core.lua`). Version 2 answers a flat array of integers where version
//! 1 answered lines of text. Version 3 answers 2 + 2 values per policy
//! of a check (a head holding the outcome, policy and flags) where 2
//! answered 3 + 3, and keeps a plan of token buckets and fixed windows as
//! a row of doubles (`struct`) instead of msgpack: it
//! reads the rows version 2 wrote, so counts carry over an upgrade, but
//! while both run a version 2 instance reads a row version 3 wrote as
//! fresh (finish a rolling upgrade quickly). Version 4 sends a batch's
//! distinct operations once and an index per decision, compiles each
//! plan of token buckets and fixed windows into Lua of its own, and keeps
//! in such a row the instant its key expires, so that a write the expiry
//! already covers keeps it (`KEEPTTL`); it reads the rows of versions 2
//! and 3, and the same caveat holds for a version 3 instance reading a
//! row of version 4. Version 5 takes groups (decisions admitted together
//! or not at all, see `core.lua`) and keeps the rows of version 4 as they
//! are: a group sent to a version 4 library would be decided decision by
//! decision, hence the new name. Version 6 settles (a check's cost made
//! good from its answer, see `core.lua`: op `s`), an operation version 5
//! does not know; its rows are version 5's. Version 7 reads a token
//! bucket's own burst (see [`plan_spec`]), which version 6 would take for
//! a bucket as large as its quota; its rows are version 6's. Version 8
//! adds `one`, a lone check in fewer arguments and fewer steps of the
//! server (see `core.lua`); `run` and the rows are version 7's.
//!
//! What a plan needs on the client (its spec string, whether the store can
//! hold it) is worked out once per plan and kept ([`PlanCache`]).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;

use paceline_core::{Algorithm, Decision, Denial, Nanos, Outcome, Plan, PolicyStatus, Unit};
use parking_lot::Mutex;
use redis::{Cmd, Value};
use smallvec::SmallVec;

use paceline_core::StoreError;

/// The shared Lua core (see the file for its arguments and reply).
const CORE: &str = include_str!("lua/core.lua");

/// The function library's name.
pub(crate) const LIBRARY: &str = "paceline_v8";
/// The function a batch calls.
pub(crate) const FUNCTION: &str = "paceline_v8_run";
/// The function a lone check calls.
pub(crate) const FUNCTION_ONE: &str = "paceline_v8_one";

/// The library source for `FUNCTION LOAD`.
pub(crate) fn library_source() -> String {
    format!(
        "#!lua name={LIBRARY}\n{CORE}\nredis.register_function('{FUNCTION}', function(keys, args) return run(keys, args) end)\nredis.register_function('{FUNCTION_ONE}', function(keys, args) return one(keys, args) end)\n"
    )
}

/// The script source for `EVAL` / `EVALSHA`; `interpreted` hides
/// `loadstring` from the core, so no plan's flat path is compiled.
pub(crate) fn script_source(interpreted: bool) -> String {
    let hide = if interpreted {
        "local loadstring = nil\n"
    } else {
        ""
    };
    format!("{hide}{CORE}\nreturn run(KEYS, ARGV)\n")
}

/// The largest value a cost is sent as: every quota the store takes is
/// below it, so clamping keeps every comparison the same.
const MAX_SENT_COST: u64 = 1 << 53;

/// What one decision asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Op {
    /// Check and charge.
    Check { requests: u64, bytes: u64 },
    /// Give back concurrency units.
    Release { amount: u64 },
    /// Give back a charge made `age_ns` ago whose answer never came.
    Refund {
        requests: u64,
        bytes: u64,
        age_ns: u64,
    },
    /// Settle a check made `age_ns` ago whose answer cost `requests` and
    /// `bytes` more (or, negative, less) than it charged.
    Settle {
        requests: i64,
        bytes: i64,
        age_ns: u64,
    },
}

/// A settle's difference in one unit, `actual - charged`, clamped to
/// [`MAX_SENT_COST`] either way (every quota the store takes is below it,
/// and so is every debt it keeps).
pub(crate) fn delta(charged: u64, actual: u64) -> i64 {
    let m = MAX_SENT_COST as i64;
    if actual >= charged {
        (actual - charged).min(MAX_SENT_COST) as i64
    } else {
        -((charged - actual).min(m as u64) as i64)
    }
}

/// A cost's second amount, the one sent in the bytes slot: a plan counts
/// requests and at most one other unit (see
/// [`PlanError::MixedUnits`](paceline_core::PlanError::MixedUnits)), so
/// that slot carries the named unit's amount when the plan counts one, and
/// the content bytes otherwise.
pub(crate) fn second(plan: &Plan, cost: paceline_core::Cost) -> u64 {
    match plan.counts_units() {
        true => cost.units,
        false => cost.bytes,
    }
}

/// A plan's spec string: `algo,q,window_s,offset_s,shadow,unit;…`, unit
/// `b` for the plan's one unit besides requests (content bytes or a named
/// unit: see [`second`]), `r` otherwise. A token bucket has no offset:
/// that field carries its burst when it has one of its own (0 when its
/// burst is its quota).
pub(crate) fn plan_spec(plan: &Plan) -> String {
    let mut s = String::new();
    for (i, p) in plan.policies().iter().enumerate() {
        if i > 0 {
            s.push(';');
        }
        let (a, off) = match p.algorithm() {
            Algorithm::TokenBucket if p.has_own_burst() => ('t', p.burst()),
            Algorithm::TokenBucket => ('t', 0),
            Algorithm::FixedWindow { offset_s } => ('f', offset_s),
            Algorithm::SlidingCounter => ('c', 0),
            Algorithm::SlidingLog => ('l', 0),
            _ => ('n', 0),
        };
        let unit = match p.unit() {
            Unit::ContentBytes | Unit::Named(_) => 'b',
            _ => 'r',
        };
        let _ = write!(
            s,
            "{a},{},{},{off},{},{unit}",
            p.quota(),
            p.window_s(),
            u8::from(p.is_shadow())
        );
    }
    s
}

/// A decision's operation as sent: a check's cost in a unit none of its
/// plan's policies counts is sent as 0, so that checks which differ only
/// there are one operation of the call.
pub(crate) fn sent_op(op: Op, plan: &Plan) -> Op {
    match op {
        Op::Check { requests, bytes } => {
            let (mut r, mut b) = (false, false);
            for p in plan.policies() {
                match p.unit() {
                    Unit::ContentBytes | Unit::Named(_) => b = true,
                    _ => r = true,
                }
            }
            Op::Check {
                requests: if r { requests } else { 0 },
                bytes: if b { bytes } else { 0 },
            }
        }
        other => other,
    }
}

/// The arguments of a lone check for `one` (see `core.lua`): its row, the
/// clock, the head (ttl slack, lease ttl, the plan's spec) and its two
/// costs (as [`sent_op`] gives them).
#[allow(clippy::too_many_arguments)]
pub(crate) fn push_one(
    cmd: &mut Cmd,
    row: &str,
    now: Option<Nanos>,
    ttl_slack_ms: u64,
    lease_ttl_ms: u64,
    spec: &str,
    requests: u64,
    bytes: u64,
) {
    let clamp = |n: u64| n.min(MAX_SENT_COST);
    cmd.arg(row.as_bytes());
    push_clock(cmd, now);
    cmd.arg(format!("{ttl_slack_ms} {lease_ttl_ms} {spec}"))
        .arg(clamp(requests))
        .arg(clamp(bytes));
}

/// The string of a call's operation indices (1-based), one a decision: a
/// byte each, or two (little end first) when there are more than 255
/// operations.
pub(crate) fn op_index(which: &[usize], ops: usize) -> Vec<u8> {
    if ops > 255 {
        which
            .iter()
            .flat_map(|&i| (i as u16).to_le_bytes())
            .collect()
    } else {
        which.iter().map(|&i| i as u8).collect()
    }
}

/// The arguments of one operation: its op, plan index and two costs (a
/// settle's costs are signed differences).
pub(crate) fn push_op(cmd: &mut Cmd, plan_index: usize, op: Op) {
    let clamp = |n: u64| n.min(MAX_SENT_COST);
    match op {
        Op::Check { requests, bytes } => {
            cmd.arg(b"c")
                .arg(plan_index)
                .arg(clamp(requests))
                .arg(clamp(bytes));
        }
        Op::Release { amount } => {
            cmd.arg(b"r").arg(plan_index).arg(clamp(amount)).arg(0);
        }
        // an age, not an instant: the server's clock need not be the caller's
        Op::Refund {
            requests,
            bytes,
            age_ns,
        } => {
            cmd.arg(format!("f{}", clamp(age_ns)))
                .arg(plan_index)
                .arg(clamp(requests))
                .arg(clamp(bytes));
        }
        Op::Settle {
            requests,
            bytes,
            age_ns,
        } => {
            cmd.arg(format!("s{}", clamp(age_ns)))
                .arg(plan_index)
                .arg(requests)
                .arg(bytes);
        }
    }
}

/// The clock argument: the server's `TIME`, or the caller's instant.
pub(crate) fn push_clock(cmd: &mut Cmd, now: Option<Nanos>) {
    match now {
        None => cmd.arg(b"T"),
        Some(n) => {
            let n = n.as_u64();
            cmd.arg(format!("{} {}", n / 1_000_000_000, n % 1_000_000_000))
        }
    };
}

/// How many values of the reply one decision takes: a check 2, and 2 per
/// policy of its plan; a release, a refund or a settle 1.
pub(crate) fn reply_len(op: Op, plan: &Plan) -> usize {
    match op {
        Op::Check { .. } => 2 + 2 * plan.policies().len(),
        _ => 1,
    }
}

/// The most policies one reply is read for without a heap allocation.
type Statuses = SmallVec<[PolicyStatus; 2]>;

fn bad(what: &str, values: &[Value]) -> StoreError {
    StoreError::Protocol(format!("unreadable reply ({what}): {values:?}"))
}

/// An integer of the reply (a count, an index, a flag).
fn int(v: &Value) -> Option<u64> {
    match v {
        Value::Int(n) => u64::try_from(*n).ok(),
        _ => None,
    }
}

/// A duration of the reply: an integer, or (2^53 ns and more) a string of
/// digits.
fn duration(v: &Value) -> Option<u64> {
    match v {
        Value::Int(n) => u64::try_from(*n).ok(),
        Value::BulkString(b) if !b.is_empty() && b.iter().all(u8::is_ascii_digit) => {
            std::str::from_utf8(b).ok()?.parse().ok()
        }
        _ => None,
    }
}

/// Reads the reply values of one check (exactly [`reply_len`] of them)
/// into a decision for `plan`, whose cost was `requests` and `bytes` (the
/// reply names the policy; the cost is ours). The values: a head (the
/// outcome, plus 4 × the deciding policy's index, plus 64 × a bit per
/// policy that would deny), the wait, then each policy's remaining and
/// reset.
pub(crate) fn parse_decision(
    values: &[Value],
    plan: &Plan,
    requests: u64,
    bytes: u64,
) -> Result<Decision, StoreError> {
    let n = plan.policies().len();
    if values.len() != 2 + 2 * n {
        return Err(bad("length", values));
    }
    let head = int(&values[0]).ok_or_else(|| bad("outcome", values))?;
    let code = head % 4;
    let policy = ((head / 4) % 16) as usize;
    let flags = head / 64;
    if policy >= n || flags >> n != 0 {
        return Err(bad("policy", values));
    }
    let wait = duration(&values[1]).ok_or_else(|| bad("wait", values))?;
    let mut statuses: Statuses = SmallVec::with_capacity(n);
    for (k, s) in values[2..].chunks_exact(2).enumerate() {
        let remaining = int(&s[0]).ok_or_else(|| bad("remaining", values))?;
        let reset = duration(&s[1]).ok_or_else(|| bad("reset", values))?;
        statuses.push(PolicyStatus {
            remaining,
            reset_after: Nanos::new(reset),
            would_deny: flags >> k & 1 == 1,
        });
    }
    let outcome = match code {
        0 => Outcome::Allowed,
        1 => Outcome::Denied(Denial {
            policy,
            kind: plan.policy(policy).kind(),
            retry_after: Nanos::new(wait),
        }),
        2 => {
            let p = plan.policy(policy);
            // a named unit travels in the bytes slot (see `second`)
            let cost = match p.unit() {
                Unit::ContentBytes | Unit::Named(_) => bytes,
                _ => requests,
            };
            Outcome::CostExceedsBurst { policy, cost }
        }
        _ => return Err(bad("outcome", values)),
    };
    Ok(Decision { outcome, statuses })
}

/// Reads the one value of a release's, refund's or settle's reply.
pub(crate) fn parse_done(values: &[Value]) -> Result<(), StoreError> {
    match values {
        [Value::Int(0)] => Ok(()),
        _ => Err(bad("release or refund", values)),
    }
}

/// What the client needs of one plan, worked out once.
pub(crate) struct PlanInfo {
    plan: Plan,
    /// The plan's spec string, shared by every decision on it.
    pub(crate) spec: Arc<str>,
    /// Whether the store can hold the plan (see [`crate::supports`]).
    pub(crate) supported: Result<(), String>,
}

/// The most plans a [`PlanCache`] keeps; past it, it starts over.
pub(crate) const PLAN_CACHE_MAX: usize = 1024;

/// Plans' [`PlanInfo`] by identity (and checked for equality: a reloaded
/// plan of the same name and layout but other quotas gets its own).
#[derive(Default)]
pub(crate) struct PlanCache {
    map: Mutex<HashMap<u64, Arc<PlanInfo>>>,
}

impl PlanCache {
    /// The information of `plan`, worked out on its first use.
    pub(crate) fn get(&self, plan: &Plan) -> Arc<PlanInfo> {
        let mut map = self.map.lock();
        if let Some(info) = map.get(&plan.identity()) {
            // a clone of the same plan compares by pointer first
            if info.plan == *plan {
                return info.clone();
            }
        }
        let info = Arc::new(PlanInfo {
            plan: plan.clone(),
            spec: plan_spec(plan).into(),
            supported: crate::store::supports(plan),
        });
        if map.len() >= PLAN_CACHE_MAX {
            map.clear();
        }
        map.insert(plan.identity(), info.clone());
        info
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use paceline_core::Policy;

    #[test]
    fn specs_name_every_policy() {
        let plan = Plan::new(
            "p",
            vec![
                Policy::token_bucket("b", 20, 2).unwrap(),
                Policy::daily_at("d", 10, 3600).unwrap().with_shadow(true),
            ],
        )
        .unwrap();
        assert_eq!(plan_spec(&plan), "t,20,2,0,0,r;f,10,86400,3600,1,r");
        // a named unit travels in the second slot, beside requests
        let tokens = Plan::new(
            "t",
            vec![
                Policy::token_bucket("rpm", 60, 60).unwrap(),
                Policy::token_bucket("tpm", 1000, 60)
                    .unwrap()
                    .with_unit(Unit::named("tokens").unwrap())
                    .unwrap(),
            ],
        )
        .unwrap();
        assert_eq!(plan_spec(&tokens), "t,60,60,0,0,r;t,1000,60,0,0,b");
        let cost = paceline_core::Cost::requests(1).with_units(700);
        assert_eq!(second(&tokens, cost), 700);
        assert_eq!(second(&plan, cost.with_bytes(9)), 9);
    }

    #[test]
    fn a_settle_sends_signed_differences_within_bounds() {
        assert_eq!(delta(4, 16), 12);
        assert_eq!(delta(16, 4), -12);
        assert_eq!(delta(0, u64::MAX), MAX_SENT_COST as i64);
        assert_eq!(delta(u64::MAX, 0), -(MAX_SENT_COST as i64));
        assert_eq!(delta(7, 7), 0);
    }

    fn ints(v: &[i64]) -> Vec<Value> {
        v.iter().map(|&n| Value::Int(n)).collect()
    }

    #[test]
    fn replies_parse_and_bad_ones_are_errors() {
        let plan = Plan::new("p", vec![Policy::token_bucket("b", 20, 2).unwrap()]).unwrap();
        // denied by policy 0, which would deny: 1 + 4 * 0 + 64 * 0b1
        let d = parse_decision(&ints(&[65, 100, 0, 5]), &plan, 1, 0).unwrap();
        assert_eq!(d.denial().unwrap().retry_after, Nanos::new(100));
        assert!(d.statuses[0].would_deny);
        assert_eq!(d.statuses[0].reset_after, Nanos::new(5));
        let x = parse_decision(&ints(&[2, 0, 3, 5]), &plan, 30, 0).unwrap();
        assert_eq!(
            x.outcome,
            Outcome::CostExceedsBurst {
                policy: 0,
                cost: 30
            }
        );
        assert!(!x.statuses[0].would_deny);
        // the second policy named and flagged, the first not
        let two = Plan::new(
            "q",
            vec![
                Policy::token_bucket("b", 20, 2).unwrap(),
                Policy::daily("d", 10).unwrap(),
            ],
        )
        .unwrap();
        let d = parse_decision(&ints(&[1 + 4 + 128, 9, 3, 1, 0, 9]), &two, 1, 0).unwrap();
        assert_eq!(d.denial().unwrap().policy, 1);
        let flags: Vec<bool> = d.statuses.iter().map(|s| s.would_deny).collect();
        assert_eq!(flags, [false, true]);
        // a duration past 2^53 comes as digits
        let long = vec![
            Value::Int(65),
            Value::BulkString(b"20000000000000000".to_vec()),
            Value::Int(0),
            Value::BulkString(b"20000000000000001".to_vec()),
        ];
        let d = parse_decision(&long, &plan, 1, 0).unwrap();
        assert_eq!(
            d.denial().unwrap().retry_after,
            Nanos::new(20_000_000_000_000_000)
        );
        assert_eq!(
            d.statuses[0].reset_after,
            Nanos::new(20_000_000_000_000_001)
        );
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let mut bad_ones = vec![
            vec![],
            ints(&[0]),
            ints(&[0, 0, 1]),
            ints(&[0, 0, 1, 2, 0]),
            // outcome 3, a policy past the plan's, a flag past its policies
            ints(&[3, 0, 1, 2]),
            ints(&[1 + 4 * 7, 1, 1, 1]),
            ints(&[128, 0, 1, 1]),
            ints(&[-1, 0, 1, 1]),
            ints(&[0, -5, 1, 1]),
            ints(&[0, 0, -1, 1]),
        ];
        // only durations may be strings, and only of digits
        bad_ones.push(vec![bulk("0"), Value::Int(0), Value::Int(1), Value::Int(1)]);
        bad_ones.push(vec![Value::Int(0), Value::Int(0), bulk("1"), Value::Int(1)]);
        bad_ones.push(vec![
            Value::Int(0),
            bulk("1x"),
            Value::Int(1),
            Value::Int(1),
        ]);
        bad_ones.push(vec![Value::Int(0), bulk(""), Value::Int(1), Value::Int(1)]);
        bad_ones.push(vec![
            Value::Int(0),
            Value::Nil,
            Value::Int(1),
            Value::Int(1),
        ]);
        for v in bad_ones {
            assert!(parse_decision(&v, &plan, 1, 0).is_err(), "{v:?}");
        }
        assert!(parse_done(&ints(&[0])).is_ok());
        assert!(parse_done(&ints(&[1])).is_err());
        assert!(parse_done(&ints(&[0, 0])).is_err());
    }

    #[test]
    fn plan_information_is_kept_per_plan_and_bounded() {
        let cache = PlanCache::default();
        let a = Plan::new("p", vec![Policy::token_bucket("b", 20, 2).unwrap()]).unwrap();
        // the same name and layout, another quota: the same identity
        let b = Plan::new("p", vec![Policy::token_bucket("b", 30, 2).unwrap()]).unwrap();
        assert_eq!(a.identity(), b.identity());
        let ia = cache.get(&a);
        assert!(Arc::ptr_eq(&ia, &cache.get(&a.clone())));
        assert_eq!(&*ia.spec, "t,20,2,0,0,r");
        assert_eq!(&*cache.get(&b).spec, "t,30,2,0,0,r");
        assert_eq!(&*cache.get(&a).spec, "t,20,2,0,0,r");
        let long = Plan::new(
            "long",
            vec![Policy::token_bucket("slow", 20, 31 * 86_400).unwrap()],
        )
        .unwrap();
        assert!(cache.get(&long).supported.is_err());
        for i in 0..3 * PLAN_CACHE_MAX {
            let p = Plan::new(
                &format!("p{i}"),
                vec![Policy::token_bucket("b", 2, 1).unwrap()],
            )
            .unwrap();
            assert_eq!(&*cache.get(&p).spec, "t,2,1,0,0,r");
            assert!(cache.len() <= PLAN_CACHE_MAX);
        }
    }
}
