//! What one request spends, in every unit a server may count.
//!
//! Why a cost per unit: a language-model API limits tokens per minute as
//! well as requests per minute, a GraphQL API limits query cost points,
//! an upload API bytes. A request that spends 1,200 tokens must wait until
//! every token window has room for 1,200, not for one. So a request
//! carries a [`Cost`]: an amount per unit name, beside the one request it
//! always is.
//!
//! How a mirrored policy is charged, for one request:
//!
//! 1. the amount the cost names for the policy's own name (`input-tokens`
//!    for Anthropic's input-token window), else
//! 2. the amount it names for the policy's unit (`tokens`, `points`,
//!    `content-bytes`, `requests`), else
//! 3. for a request-counting policy, 1; for any other unit, the scope's
//!    estimate: the running average of what requests were seen to spend in
//!    that unit (stated costs, and the drop in the server's remaining count
//!    across an answer that came back alone), rounded up, 1 until anything
//!    was seen.
//!
//! Unit names are compared without regard to case and surrounding blanks.
//! The units the client names (see the diagnostics): `requests`, `tokens`
//! (OpenAI's and Anthropic's token windows), `content-bytes`, `points`
//! (Shopify GraphQL's cost points, GitHub's GraphQL points), or whatever a
//! server publishes as the IETF draft's `qu`.
//!
//! Hostile values: amounts are whole units (`u64`), so a negative or
//! fractional cost cannot be built in Rust; [`Cost::parse_amount`] reads
//! one from text (a CLI column) and says why it refuses. An empty unit
//! name is ignored. A cost larger than a policy can ever hold fails the
//! call before it is sent ([`ClientError::CostExceedsQuota`]), never waits
//! forever.
//!
//! ```
//! use paceline_client::{Before, Client, Cost, Observation, RequestInfo};
//! use paceline_client::{ManualClock, Nanos};
//!
//! let clock = ManualClock::new(Nanos::from_secs(1_000));
//! let client = Client::builder().clock(clock.clone()).seed(1).build();
//! // the server publishes 60 requests and 10,000 tokens a minute
//! let mut first = client.call(RequestInfo::get("http://llm.test/v1/chat"));
//! assert_eq!(client.before(&mut first), Before::Go);
//! let ok = Observation::bare(200)
//!     .with_policy("requests", 60, 60, 59, Nanos::from_secs(1))
//!     .with_unit_policy("tokens", "tokens", 10_000, 60, 2_000, Nanos::from_secs(48));
//! client.after(&mut first, &ok);
//!
//! // 1,500 tokens fit in the 2,000 left; 2,500 more do not, yet
//! let small = Cost::new().with("tokens", 1_500);
//! let mut a = client.call(RequestInfo::get("http://llm.test/v1/chat").with_cost(small));
//! assert_eq!(client.before(&mut a), Before::Go);
//! let big = Cost::new().with("tokens", 2_500);
//! let mut b = client.call(RequestInfo::get("http://llm.test/v1/chat").with_cost(big));
//! assert!(matches!(client.before(&mut b), Before::Wait(_)));
//! ```
//!
//! [`ClientError::CostExceedsQuota`]: crate::ClientError::CostExceedsQuota

use std::fmt;

use paceline_wire::parse::Unit;
use smallvec::SmallVec;

/// The unit every request spends one of unless its cost says otherwise.
pub const REQUESTS: &str = "requests";

/// What one request spends, by unit (or policy) name. Empty by default:
/// one request, and the estimate of every other unit.
///
/// Put it on a [`RequestInfo`](crate::RequestInfo) with
/// [`with_cost`](crate::RequestInfo::with_cost), or, through the adapters
/// (features `reqwest` and `tower`), in the request's extensions.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Cost {
    /// (normalised name, amount), at most one entry a name.
    amounts: SmallVec<[(String, u64); 2]>,
}

impl Cost {
    /// No stated amount: one request, and each other unit's estimate.
    pub fn new() -> Self {
        Cost::default()
    }

    /// The same cost, spending `amount` of `unit` (a unit name such as
    /// `tokens`, or a policy name such as `input-tokens`); a second amount
    /// for the same name replaces the first. An empty name is ignored.
    pub fn with(mut self, unit: &str, amount: u64) -> Self {
        self.set(unit, amount);
        self
    }

    /// Sets the amount of `unit` (see [`Cost::with`]).
    pub fn set(&mut self, unit: &str, amount: u64) {
        let name = normalise(unit);
        if name.is_empty() {
            return;
        }
        match self.amounts.iter_mut().find(|(n, _)| *n == name) {
            Some(slot) => slot.1 = amount,
            None => self.amounts.push((name, amount)),
        }
    }

    /// The amount stated for `unit` (or policy name), if any.
    pub fn get(&self, unit: &str) -> Option<u64> {
        let name = normalise(unit);
        self.amounts.iter().find(|(n, _)| *n == name).map(|x| x.1)
    }

    /// Whether no amount is stated.
    pub fn is_empty(&self) -> bool {
        self.amounts.is_empty()
    }

    /// Every stated amount, by normalised name, in the order first set.
    pub fn iter(&self) -> impl Iterator<Item = (&str, u64)> {
        self.amounts.iter().map(|(n, a)| (n.as_str(), *a))
    }

    /// The amount a policy called `policy`, counting `unit`, is charged,
    /// if the cost states one: by the policy's name first, then its unit.
    pub(crate) fn for_policy(&self, policy: &str, unit: &str) -> Option<u64> {
        let by = |name: &str| {
            self.amounts
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|x| x.1)
        };
        (!policy.is_empty() && policy != unit)
            .then(|| by(policy))
            .flatten()
            .or_else(|| by(unit))
    }

    /// Reads an amount from text (a CSV cell, a JSON number written out):
    /// a whole number of units, or a decimal that is rounded up to the
    /// next whole unit (`0.5` tokens spend 1). Refuses, saying why, what
    /// is empty, negative, not a finite number, or 2^53 units or more (no
    /// server publishes limits anywhere near that).
    pub fn parse_amount(text: &str) -> Result<u64, CostError> {
        let t = text.trim();
        let bad = |why: &'static str| CostError {
            value: shorten(t),
            why,
        };
        if t.is_empty() {
            return Err(bad("empty"));
        }
        if t.starts_with('-') {
            return Err(bad("negative"));
        }
        if let Ok(n) = t.parse::<u64>() {
            return match n < MAX_AMOUNT {
                true => Ok(n),
                false => Err(bad("too large (at most 2^53 - 1 units)")),
            };
        }
        let x: f64 = t.parse().map_err(|_| bad("not a number"))?;
        if !x.is_finite() {
            return Err(bad("not a finite number"));
        }
        if x < 0.0 {
            return Err(bad("negative"));
        }
        let up = x.ceil();
        if up >= MAX_AMOUNT as f64 {
            return Err(bad("too large (at most 2^53 - 1 units)"));
        }
        Ok(up as u64)
    }
}

/// The largest amount [`Cost::parse_amount`] reads, exclusive: 2^53,
/// where a decimal stops being exact.
const MAX_AMOUNT: u64 = 1 << 53;

/// Why an amount was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CostError {
    /// The text refused (shortened).
    pub value: String,
    /// Why.
    pub why: &'static str,
}

impl fmt::Display for CostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cost {:?}: {} (expected a whole number of units, 0 or more)",
            self.value, self.why
        )
    }
}

impl std::error::Error for CostError {}

fn normalise(unit: &str) -> String {
    unit.trim().to_ascii_lowercase()
}

fn shorten(s: &str) -> String {
    match s.char_indices().nth(40) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

/// The client's name for a parsed unit: the IETF `qu` names, with
/// Shopify GraphQL's `cost-points` called `points`.
pub(crate) fn unit_name(unit: &Unit) -> String {
    match unit {
        Unit::Other(s) if s.eq_ignore_ascii_case("cost-points") => "points".to_string(),
        Unit::Other(s) => normalise(s),
        u => u.as_str().to_string(),
    }
}

/// A running average of what requests spend in one unit: the plain mean
/// of the first samples, then an average that keeps adapting (each new
/// sample weighs 1/32).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Estimate {
    mean: f64,
    samples: u64,
}

/// Past this many samples each new one weighs `1 / WEIGHT`.
const WEIGHT: u64 = 32;

impl Estimate {
    /// Folds in one request's spend.
    pub(crate) fn add(&mut self, spent: u64) {
        self.samples = self.samples.saturating_add(1);
        let n = self.samples.min(WEIGHT) as f64;
        self.mean += (spent as f64 - self.mean) / n;
    }

    /// What a request without a stated amount is charged: the average
    /// rounded up, 1 before any sample.
    pub(crate) fn charge(&self) -> u64 {
        if self.samples == 0 {
            return 1;
        }
        // the mean of u64 samples is finite and non-negative; within a
        // thousandth of a whole number it is that number (an average that
        // settles on 10 from above is 10, not 11)
        let near = self.mean.round();
        let up = if (self.mean - near).abs() < 1e-3 {
            near
        } else {
            self.mean.ceil()
        };
        up.min(MAX_AMOUNT as f64) as u64
    }

    /// The average, if anything was seen.
    pub(crate) fn mean(&self) -> Option<f64> {
        (self.samples > 0).then_some(self.mean)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_normalised_and_policy_names_win_over_units() {
        let c = Cost::new()
            .with(" Tokens ", 1_200)
            .with("input-tokens", 1_000)
            .with("", 7);
        assert_eq!(c.get("tokens"), Some(1_200));
        assert_eq!(c.iter().count(), 2, "the empty name is ignored");
        assert_eq!(c.for_policy("input-tokens", "tokens"), Some(1_000));
        assert_eq!(c.for_policy("output-tokens", "tokens"), Some(1_200));
        assert_eq!(c.for_policy("requests", "requests"), None);
        let c = c.with("tokens", 5);
        assert_eq!(
            c.get("TOKENS"),
            Some(5),
            "a second amount replaces the first"
        );
    }

    #[test]
    fn amounts_from_text_are_whole_units_or_a_clear_error() {
        assert_eq!(Cost::parse_amount("1200"), Ok(1_200));
        assert_eq!(Cost::parse_amount(" 0 "), Ok(0));
        assert_eq!(Cost::parse_amount("0.2"), Ok(1));
        assert_eq!(Cost::parse_amount("1e3"), Ok(1_000));
        for bad in [
            "",
            "-1",
            "-0.5",
            "NaN",
            "inf",
            "abc",
            "1e300",
            "18446744073709551616",
        ] {
            let e = Cost::parse_amount(bad).unwrap_err();
            assert!(!e.to_string().is_empty(), "{bad}");
        }
        assert_eq!(Cost::parse_amount("-3").unwrap_err().why, "negative");
    }

    #[test]
    fn the_estimate_averages_then_adapts() {
        let mut e = Estimate::default();
        assert_eq!(e.charge(), 1);
        e.add(100);
        e.add(301);
        assert_eq!(e.charge(), 201);
        for _ in 0..600 {
            e.add(10);
        }
        assert_eq!(e.charge(), 10);
        assert_eq!(e.samples, 602);
    }

    proptest::proptest! {
        /// Whatever the text, reading an amount never panics, and what it
        /// accepts is below the cap and no less than the number written.
        #[test]
        fn parsing_any_text_is_total(s in "\\PC{0,24}") {
            if let Ok(n) = Cost::parse_amount(&s) {
                proptest::prop_assert!(n < MAX_AMOUNT);
                let x: f64 = s.trim().parse().unwrap();
                proptest::prop_assert!(n as f64 >= x);
            }
        }

        #[test]
        fn numbers_round_up_to_whole_units(x in 0.0f64..1e12) {
            let n = Cost::parse_amount(&x.to_string()).unwrap();
            proptest::prop_assert!(n as f64 >= x && (n as f64) < x + 1.0);
        }
    }
}
