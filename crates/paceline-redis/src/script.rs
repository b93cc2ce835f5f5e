//! The server-side step: the Lua source (as a Redis 7 function library and
//! as a plain script for `EVALSHA`), what a batch sends, and how its reply
//! is read back into [`Decision`]s.
//!
//! The library is named by version (`paceline_v1`): a release that changes
//! the Lua loads a new name next to the old one, so instances of two
//! releases share one server while they roll. New operations (a refund,
//! say) are new op codes of the same `run` (see `core.lua`).

use std::fmt::Write as _;

use paceline_core::{Algorithm, Decision, Denial, Nanos, Outcome, Plan, PolicyStatus, Unit};
use smallvec::SmallVec;

use paceline_core::StoreError;

/// The shared Lua core (see the file for its arguments and reply).
const CORE: &str = include_str!("lua/core.lua");

/// The function library's name.
pub(crate) const LIBRARY: &str = "paceline_v1";
/// The function a batch calls.
pub(crate) const FUNCTION: &str = "paceline_v1_run";

/// The library source for `FUNCTION LOAD`.
pub(crate) fn library_source() -> String {
    format!(
        "#!lua name={LIBRARY}\n{CORE}\nredis.register_function('{FUNCTION}', function(keys, args) return run(keys, args) end)\n"
    )
}

/// The script source for `EVAL` / `EVALSHA`.
pub(crate) fn script_source() -> String {
    format!("{CORE}\nreturn run(KEYS, ARGV)\n")
}

/// The largest value a cost is sent as: every quota the store takes is
/// below it, so clamping keeps every comparison the same.
const MAX_SENT_COST: u64 = 1 << 53;

/// What one decision asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
}

/// A plan's spec string: `algo,q,window_s,offset_s,shadow,unit;…`.
pub(crate) fn plan_spec(plan: &Plan) -> String {
    let mut s = String::new();
    for (i, p) in plan.policies().iter().enumerate() {
        if i > 0 {
            s.push(';');
        }
        let (a, off) = match p.algorithm() {
            Algorithm::TokenBucket => ('t', 0),
            Algorithm::FixedWindow { offset_s } => ('f', offset_s),
            Algorithm::SlidingCounter => ('c', 0),
            Algorithm::SlidingLog => ('l', 0),
            _ => ('n', 0),
        };
        let unit = if p.unit() == Unit::ContentBytes {
            'b'
        } else {
            'r'
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

/// The arguments of one decision.
pub(crate) fn push_op(args: &mut Vec<String>, plan_index: usize, op: Op) {
    let (code, a, b) = match op {
        Op::Check { requests, bytes } => ("c".to_string(), requests, bytes),
        Op::Release { amount } => ("r".to_string(), amount, 0),
        // an age, not an instant: the server's clock need not be the caller's
        Op::Refund {
            requests,
            bytes,
            age_ns,
        } => (format!("f{}", age_ns.min(MAX_SENT_COST)), requests, bytes),
    };
    args.push(code);
    args.push(plan_index.to_string());
    args.push(a.min(MAX_SENT_COST).to_string());
    args.push(b.min(MAX_SENT_COST).to_string());
}

/// The clock argument: the server's `TIME`, or the caller's instant.
pub(crate) fn clock_arg(now: Option<Nanos>) -> String {
    match now {
        None => "T".to_string(),
        Some(n) => {
            let n = n.as_u64();
            format!("{} {}", n / 1_000_000_000, n % 1_000_000_000)
        }
    }
}

fn bad(line: &str) -> StoreError {
    StoreError::Protocol(format!("unreadable reply line {line:?}"))
}

/// Reads one reply line of a check into a decision for `plan`, whose
/// request cost was `cost` (the reply names the policy; the cost is ours).
pub(crate) fn parse_decision(
    line: &str,
    plan: &Plan,
    requests: u64,
    bytes: u64,
) -> Result<Decision, StoreError> {
    let mut it = line.split(' ');
    let code = it.next().ok_or_else(|| bad(line))?;
    let mut num = || -> Result<u64, StoreError> {
        it.next()
            .and_then(|s| s.parse::<u64>().ok())
            .ok_or_else(|| bad(line))
    };
    let policy = num()? as usize;
    let wait = num()?;
    let n = plan.policies().len();
    if policy >= n {
        return Err(bad(line));
    }
    let mut statuses: SmallVec<[PolicyStatus; 2]> = SmallVec::with_capacity(n);
    for _ in 0..n {
        let remaining = num()?;
        let reset = num()?;
        let deny = num()?;
        statuses.push(PolicyStatus {
            remaining,
            reset_after: Nanos::new(reset),
            would_deny: deny == 1,
        });
    }
    let outcome = match code {
        "A" => Outcome::Allowed,
        "D" => Outcome::Denied(Denial {
            policy,
            kind: plan.policy(policy).kind(),
            retry_after: Nanos::new(wait),
        }),
        "X" => {
            let p = plan.policy(policy);
            let cost = if p.unit() == Unit::ContentBytes {
                bytes
            } else {
                requests
            };
            Outcome::CostExceedsBurst { policy, cost }
        }
        _ => return Err(bad(line)),
    };
    Ok(Decision { outcome, statuses })
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
    }

    #[test]
    fn replies_parse_and_bad_ones_are_errors() {
        let plan = Plan::new("p", vec![Policy::token_bucket("b", 20, 2).unwrap()]).unwrap();
        let d = parse_decision("D 0 100 0 5 1", &plan, 1, 0).unwrap();
        assert_eq!(d.denial().unwrap().retry_after, Nanos::new(100));
        assert!(d.statuses[0].would_deny);
        for line in [
            "",
            "A",
            "A 0 0 1 2",
            "Q 0 0 1 2 0",
            "D 7 1 1 1 1",
            "A x 0 1 1 0",
        ] {
            assert!(parse_decision(line, &plan, 1, 0).is_err(), "{line:?}");
        }
    }
}
