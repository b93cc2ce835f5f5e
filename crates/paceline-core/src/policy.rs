//! Policies: what is limited, by how much, and how it refills.
//!
//! A [`Policy`] is one named limit — a quota `q` over a window of `w`
//! seconds, counted in a [`Unit`] with an [`Algorithm`]. Policies are built
//! through constructors that validate them, so a policy that could never
//! work (a zero quota, a zero window, a rate above one unit per nanosecond)
//! cannot exist.
//!
//! ```
//! use paceline_core::{Policy, PolicyKind};
//!
//! let burst = Policy::token_bucket("burst", 20, 2).unwrap();
//! let daily = Policy::daily("daily", 10_000).unwrap();
//! assert_eq!(burst.kind(), PolicyKind::Burst);
//! assert_eq!(daily.kind(), PolicyKind::Quota);
//! ```

use std::fmt;
use std::sync::Arc;

use crate::clock::Nanos;
use crate::divide::Divisor;

/// Seconds in a day.
pub const DAY_SECS: u64 = 86_400;
/// Windows at least this long are quotas unless said otherwise.
pub const QUOTA_THRESHOLD_SECS: u64 = 3_600;
/// The longest window a policy may have: ten years (longer windows would
/// never reset in practice, and their arithmetic approaches `u64` limits).
pub const MAX_WINDOW_SECS: u64 = 10 * 366 * DAY_SECS;
/// The largest quota a sliding-window log keeps a timestamp for, per key.
pub const MAX_LOG_QUOTA: u64 = 4_096;

/// How a policy counts and refills.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Algorithm {
    /// Token bucket as GCRA: capacity `q`, continuous refill of `q` per `w`.
    TokenBucket,
    /// Windows of `w` seconds aligned to the epoch plus `offset_s`; the count
    /// resets at each window edge. With `w` = one day and an offset this is
    /// a calendar day resetting at a chosen time of day.
    FixedWindow {
        /// Where windows start, in seconds after the epoch-aligned edge.
        offset_s: u64,
    },
    /// Exact sliding window: one timestamp per unit admitted in the last `w`.
    SlidingLog,
    /// Approximate sliding window: the previous fixed window's count,
    /// weighted by how much of it still overlaps, plus the current count.
    SlidingCounter,
    /// At most `q` units in flight at once; a lease gives them back.
    Concurrency,
}

impl Algorithm {
    /// A short stable name, used in configuration and diagnostics.
    pub fn name(&self) -> &'static str {
        match self {
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::FixedWindow { .. } => "fixed_window",
            Algorithm::SlidingLog => "sliding_log",
            Algorithm::SlidingCounter => "sliding_counter",
            Algorithm::Concurrency => "concurrency",
        }
    }

    pub(crate) fn tag(&self) -> u64 {
        match self {
            Algorithm::TokenBucket => 1,
            Algorithm::FixedWindow { .. } => 2,
            Algorithm::SlidingLog => 3,
            Algorithm::SlidingCounter => 4,
            Algorithm::Concurrency => 5,
        }
    }
}

/// What a policy counts.
///
/// Three units the IETF draft names, and any other by name (`tokens`,
/// `credits`…): see [`Unit::named`].
///
/// ```
/// use paceline_core::Unit;
///
/// let tokens = Unit::named("tokens").unwrap();
/// assert_eq!(tokens.as_str(), "tokens");
/// assert_eq!(Unit::named("content-bytes").unwrap(), Unit::ContentBytes);
/// assert!(Unit::named("Tokens!").is_err());
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Unit {
    /// Requests (the default).
    #[default]
    Requests,
    /// Bytes of request content.
    ContentBytes,
    /// Requests in flight at the same time.
    ConcurrentRequests,
    /// Any other unit, by name (a request's cost in it is its
    /// [`Cost::requests`](crate::Cost::requests): the route's cost, or its
    /// estimate, counted in that unit).
    Named(UnitName),
}

impl Unit {
    /// The unit called `name`: one of the three above by their names, or
    /// a [`Unit::Named`]. A name is 1 to [`UnitName::MAX_LEN`] lowercase
    /// ASCII letters, digits, `-`, `_` or `.`, starting with a letter.
    pub fn named(name: &str) -> Result<Unit, PolicyError> {
        Ok(match name {
            "requests" => Unit::Requests,
            "content-bytes" => Unit::ContentBytes,
            "concurrent-requests" => Unit::ConcurrentRequests,
            _ => Unit::Named(UnitName::new(name)?),
        })
    }

    /// The unit's name, as the IETF draft's `qu` parameter publishes it.
    pub fn as_str(&self) -> &str {
        match self {
            Unit::Requests => "requests",
            Unit::ContentBytes => "content-bytes",
            Unit::ConcurrentRequests => "concurrent-requests",
            Unit::Named(n) => n.as_str(),
        }
    }
}

/// The name of a [`Unit::Named`], kept inline (a unit stays `Copy`).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct UnitName {
    len: u8,
    bytes: [u8; UnitName::MAX_LEN],
}

impl UnitName {
    /// The longest name a unit may have.
    pub const MAX_LEN: usize = 32;

    fn new(name: &str) -> Result<UnitName, PolicyError> {
        let b = name.as_bytes();
        let ok = !b.is_empty()
            && b.len() <= UnitName::MAX_LEN
            && b[0].is_ascii_lowercase()
            && b.iter().all(|&c| {
                c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'-' | b'_' | b'.')
            });
        if !ok {
            return Err(PolicyError::BadUnit(name.to_string()));
        }
        let mut bytes = [0; UnitName::MAX_LEN];
        bytes[..b.len()].copy_from_slice(b);
        Ok(UnitName {
            len: b.len() as u8,
            bytes,
        })
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        // only ASCII was ever stored
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or_default()
    }
}

impl fmt::Debug for UnitName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

/// Whether running out means "slow down" or "come back after the reset".
///
/// Deliberately exhaustive: the two answers to running out (wait, or wait
/// for the reset) are what a client is told apart by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PolicyKind {
    /// A short window: a denial clears within seconds (429 `rate_limited`).
    Burst,
    /// A long window: a denial lasts until the reset (429 `quota_exhausted`).
    Quota,
}

/// What a shared store failure means for this policy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FailMode {
    /// Admit when the store cannot be reached (availability first).
    #[default]
    Open,
    /// Deny when the store cannot be reached (protection first).
    Closed,
}

/// How instances that share a store count a policy.
///
/// A store inside one process ignores it: it is exact either way.
///
/// ```
/// use paceline_core::{Policy, Share};
///
/// let p = Policy::token_bucket("global", 2_000, 1).unwrap()
///     .with_share(Share::Leased { max_slice: 50 });
/// assert_eq!(p.share(), Share::Leased { max_slice: 50 });
/// assert_eq!(Policy::token_bucket("b", 1, 1).unwrap().share(), Share::Exact);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Share {
    /// Every decision is counted in the shared store: exact, one round
    /// trip for each decision the store's local caches cannot answer.
    #[default]
    Exact,
    /// Each instance takes slices of the key's budget from the shared
    /// store, at most `max_slice` units at a time, and decides from them
    /// locally: few round trips, and an overshoot bounded by the units
    /// the instances hold.
    Leased {
        /// The most units one slice holds.
        max_slice: u64,
    },
}

/// Why a policy could not be built.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PolicyError {
    /// The name is empty or not a token-safe string.
    BadName(String),
    /// `q` is zero.
    ZeroQuota,
    /// `w` is zero.
    ZeroWindow,
    /// More than one unit per nanosecond cannot be represented (or, for a
    /// fixed window, a quota of 2^40 or more).
    RateTooHigh,
    /// The window is longer than [`MAX_WINDOW_SECS`].
    WindowTooLong,
    /// A sliding-window log keeps one timestamp per unit; this `q` is too big.
    LogTooLarge(u64),
    /// The window offset must be shorter than the window.
    BadOffset,
    /// A concurrency cap must count concurrent requests, and only it may.
    UnitMismatch,
    /// A unit's name is empty, too long, or not lowercase letters, digits,
    /// `-`, `_` or `.` after a first letter.
    BadUnit(String),
    /// A burst is given to a policy other than a token bucket, is zero,
    /// or would take longer than [`MAX_WINDOW_SECS`] to refill.
    BadBurst(&'static str),
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PolicyError::BadName(n) => write!(
                f,
                "policy name {n:?} must be 1-64 characters of letters, digits, '_', '-' or '.'"
            ),
            PolicyError::ZeroQuota => f.write_str("quota q must be at least 1"),
            PolicyError::ZeroWindow => f.write_str("window w must be at least 1 second"),
            PolicyError::RateTooHigh => f.write_str(
                "q is too large: at most one unit per nanosecond, and below 2^40 for a fixed window",
            ),
            PolicyError::LogTooLarge(q) => write!(
                f,
                "a sliding_log keeps one timestamp per unit; q={q} exceeds {MAX_LOG_QUOTA}, use sliding_counter"
            ),
            PolicyError::BadOffset => f.write_str("window offset must be shorter than the window"),
            PolicyError::WindowTooLong => write!(
                f,
                "window w is longer than {MAX_WINDOW_SECS} seconds (ten years)"
            ),
            PolicyError::BadUnit(u) => write!(
                f,
                "unit {u:?} must be 1-{} characters: a lowercase letter, then lowercase letters, digits, '-', '_' or '.'",
                UnitName::MAX_LEN
            ),
            PolicyError::BadBurst(why) => write!(f, "burst: {why}"),
            PolicyError::UnitMismatch => f.write_str(
                "the concurrency algorithm goes with unit concurrent-requests, and only it",
            ),
        }
    }
}

impl std::error::Error for PolicyError {}

/// One named limit. Cheap to clone.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Policy {
    name: Arc<str>,
    algorithm: Algorithm,
    quota: u64,
    window_s: u64,
    unit: Unit,
    kind: PolicyKind,
    fail_mode: FailMode,
    shadow: bool,
    share: Share,
    /// The most units at once: a token bucket's capacity (the quota
    /// unless [`Policy::with_burst`] set it), the quota otherwise.
    burst: u64,
    // derived
    window_ns: u64,
    /// A token bucket's capacity in time: `burst` emission intervals (the
    /// window itself when the burst is the quota).
    capacity_ns: u64,
    emission_ns: u64,
    window_div: Divisor,
    emission_div: Divisor,
}

impl Policy {
    /// Builds a policy, checking that it can work.
    pub fn new(
        name: &str,
        algorithm: Algorithm,
        quota: u64,
        window_s: u64,
    ) -> Result<Policy, PolicyError> {
        validate_name(name)?;
        if quota == 0 {
            return Err(PolicyError::ZeroQuota);
        }
        if window_s == 0 {
            return Err(PolicyError::ZeroWindow);
        }
        if window_s > MAX_WINDOW_SECS {
            return Err(PolicyError::WindowTooLong);
        }
        let window_ns = window_s * 1_000_000_000;
        if quota > window_ns {
            return Err(PolicyError::RateTooHigh);
        }
        match algorithm {
            Algorithm::SlidingLog if quota > MAX_LOG_QUOTA => {
                return Err(PolicyError::LogTooLarge(quota))
            }
            Algorithm::FixedWindow { offset_s } if offset_s >= window_s => {
                return Err(PolicyError::BadOffset)
            }
            Algorithm::FixedWindow { .. } if quota > crate::algorithm::MAX_WINDOW_QUOTA => {
                return Err(PolicyError::RateTooHigh)
            }
            _ => {}
        }
        let unit = if algorithm == Algorithm::Concurrency {
            Unit::ConcurrentRequests
        } else {
            Unit::Requests
        };
        let kind = if window_s >= QUOTA_THRESHOLD_SECS && algorithm != Algorithm::Concurrency {
            PolicyKind::Quota
        } else {
            PolicyKind::Burst
        };
        Ok(Policy {
            name: Arc::from(name),
            algorithm,
            quota,
            window_s,
            unit,
            kind,
            fail_mode: FailMode::Open,
            shadow: false,
            share: Share::Exact,
            burst: quota,
            window_ns,
            capacity_ns: window_ns,
            emission_ns: window_ns / quota,
            window_div: Divisor::new(window_ns),
            // quota <= window_ns (checked above): the interval is at least 1
            emission_div: Divisor::new(window_ns / quota),
        })
    }

    /// A token bucket holding `q`, refilling `q` every `w` seconds.
    pub fn token_bucket(name: &str, q: u64, w: u64) -> Result<Policy, PolicyError> {
        Policy::new(name, Algorithm::TokenBucket, q, w)
    }

    /// A fixed window of `w` seconds aligned to the epoch.
    pub fn fixed_window(name: &str, q: u64, w: u64) -> Result<Policy, PolicyError> {
        Policy::new(name, Algorithm::FixedWindow { offset_s: 0 }, q, w)
    }

    /// `q` per calendar day, resetting at 00:00 UTC.
    pub fn daily(name: &str, q: u64) -> Result<Policy, PolicyError> {
        Policy::daily_at(name, q, 0)
    }

    /// `q` per day, resetting `reset_s` seconds after 00:00 UTC.
    pub fn daily_at(name: &str, q: u64, reset_s: u64) -> Result<Policy, PolicyError> {
        Policy::new(
            name,
            Algorithm::FixedWindow { offset_s: reset_s },
            q,
            DAY_SECS,
        )
    }

    /// An exact sliding window.
    pub fn sliding_log(name: &str, q: u64, w: u64) -> Result<Policy, PolicyError> {
        Policy::new(name, Algorithm::SlidingLog, q, w)
    }

    /// An approximate sliding window.
    pub fn sliding_counter(name: &str, q: u64, w: u64) -> Result<Policy, PolicyError> {
        Policy::new(name, Algorithm::SlidingCounter, q, w)
    }

    /// At most `q` requests in flight.
    pub fn concurrency(name: &str, q: u64) -> Result<Policy, PolicyError> {
        Policy::new(name, Algorithm::Concurrency, q, 1)
    }

    /// Counts in `unit` instead of requests.
    pub fn with_unit(mut self, unit: Unit) -> Result<Policy, PolicyError> {
        let conc = self.algorithm == Algorithm::Concurrency;
        if conc != (unit == Unit::ConcurrentRequests) {
            return Err(PolicyError::UnitMismatch);
        }
        self.unit = unit;
        Ok(self)
    }

    /// A token bucket that refills `q` every `w` seconds but holds at most
    /// `burst` units: "5,000 a second with bursts of 500" is
    /// `token_bucket(name, 5_000, 1)` with a burst of 500. The policy
    /// still publishes `q` and `w` (its rate); what is left (`r`) is
    /// never more than the burst, and a cost over it cannot be admitted.
    ///
    /// ```
    /// use paceline_core::{MemoryStore, Nanos, Plan, Policy};
    ///
    /// let p = Policy::token_bucket("rps", 5_000, 1).unwrap().with_burst(500).unwrap();
    /// assert_eq!((p.quota(), p.burst()), (5_000, 500));
    /// let plan = Plan::new("big", vec![p]).unwrap();
    /// let store = MemoryStore::new();
    /// let t = Nanos::from_secs(10);
    /// let admitted = (0..1_000)
    ///     .filter(|_| store.check_sync(&plan, "k", 1, t).unwrap().is_allowed())
    ///     .count();
    /// assert_eq!(admitted, 500);
    /// // a tenth of a second later, 500 more have refilled
    /// let t = t.saturating_add(Nanos::from_millis(100));
    /// let d = store.check_sync(&plan, "k", 0, t).unwrap();
    /// assert_eq!(d.statuses[0].remaining, 500);
    /// ```
    pub fn with_burst(mut self, burst: u64) -> Result<Policy, PolicyError> {
        if self.algorithm != Algorithm::TokenBucket {
            return Err(PolicyError::BadBurst("only a token bucket takes a burst"));
        }
        if burst == 0 {
            return Err(PolicyError::BadBurst("must be at least 1"));
        }
        let capacity = burst
            .checked_mul(self.emission_ns)
            .filter(|&c| c <= MAX_WINDOW_SECS * 1_000_000_000)
            .ok_or(PolicyError::BadBurst(
                "refilling it would take longer than ten years",
            ))?;
        self.burst = burst;
        self.capacity_ns = if burst == self.quota {
            self.window_ns
        } else {
            capacity
        };
        Ok(self)
    }

    /// Overrides the burst/quota classification.
    pub fn with_kind(mut self, kind: PolicyKind) -> Policy {
        self.kind = kind;
        self
    }

    /// Sets what a store failure means for this policy.
    pub fn with_fail_mode(mut self, fail_mode: FailMode) -> Policy {
        self.fail_mode = fail_mode;
        self
    }

    /// Shadow mode: decide, publish and count, but never deny.
    pub fn with_shadow(mut self, shadow: bool) -> Policy {
        self.shadow = shadow;
        self
    }

    /// Sets how instances sharing a store count the policy.
    pub fn with_share(mut self, share: Share) -> Policy {
        self.share = share;
        self
    }

    /// The policy's name, as published in headers.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The algorithm.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }
    /// The quota `q`.
    pub fn quota(&self) -> u64 {
        self.quota
    }
    /// The most units admitted at once: a token bucket's burst (the
    /// quota unless [`with_burst`](Self::with_burst) set another), the
    /// quota for every other algorithm. A cost above it can never be
    /// admitted.
    #[inline]
    pub fn burst(&self) -> u64 {
        self.burst
    }
    /// Whether a token bucket's burst differs from its quota.
    pub fn has_own_burst(&self) -> bool {
        self.burst != self.quota
    }
    /// The window `w` in seconds.
    pub fn window_s(&self) -> u64 {
        self.window_s
    }
    /// The window in nanoseconds.
    pub fn window(&self) -> Nanos {
        Nanos::new(self.window_ns)
    }
    /// The unit counted.
    pub fn unit(&self) -> Unit {
        self.unit
    }
    /// Burst or quota.
    pub fn kind(&self) -> PolicyKind {
        self.kind
    }
    /// What a store failure means.
    pub fn fail_mode(&self) -> FailMode {
        self.fail_mode
    }
    /// Whether the policy only observes.
    pub fn is_shadow(&self) -> bool {
        self.shadow
    }
    /// How instances sharing a store count it.
    pub fn share(&self) -> Share {
        self.share
    }
    /// The nanoseconds one unit takes to refill (token bucket).
    pub fn emission_interval(&self) -> Nanos {
        Nanos::new(self.emission_ns)
    }
    pub(crate) fn window_ns(&self) -> u64 {
        self.window_ns
    }
    /// A token bucket's capacity in nanoseconds (see `capacity_ns`).
    #[inline]
    pub(crate) fn capacity_ns(&self) -> u64 {
        self.capacity_ns
    }
    pub(crate) fn emission_ns(&self) -> u64 {
        self.emission_ns
    }
    /// `x / window_ns`, without a hardware division.
    #[inline]
    pub(crate) fn per_window(&self, x: u64) -> u64 {
        self.window_div.div(x)
    }
    /// `x / emission_ns`, without a hardware division.
    #[inline]
    pub(crate) fn per_emission(&self, x: u64) -> u64 {
        self.emission_div.div(x)
    }
    /// How many `u64` words of state one key needs for this policy.
    pub fn state_words(&self) -> usize {
        match self.algorithm {
            Algorithm::TokenBucket | Algorithm::Concurrency => 1,
            Algorithm::FixedWindow { .. } => 1,
            Algorithm::SlidingCounter => 3,
            Algorithm::SlidingLog => 1 + self.quota as usize,
        }
    }
}

fn validate_name(name: &str) -> Result<(), PolicyError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(PolicyError::BadName(name.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_policies_cannot_be_built() {
        assert_eq!(
            Policy::token_bucket("b", 0, 1).unwrap_err(),
            PolicyError::ZeroQuota
        );
        assert_eq!(
            Policy::token_bucket("b", 1, 0).unwrap_err(),
            PolicyError::ZeroWindow
        );
        assert!(matches!(
            Policy::token_bucket("", 1, 1).unwrap_err(),
            PolicyError::BadName(_)
        ));
        assert!(matches!(
            Policy::token_bucket("a\"b", 1, 1).unwrap_err(),
            PolicyError::BadName(_)
        ));
        assert_eq!(
            Policy::token_bucket("b", 2_000_000_000, 1).unwrap_err(),
            PolicyError::RateTooHigh
        );
        assert_eq!(
            Policy::sliding_log("l", 10_000, 1).unwrap_err(),
            PolicyError::LogTooLarge(10_000)
        );
        assert_eq!(
            Policy::daily_at("d", 1, DAY_SECS).unwrap_err(),
            PolicyError::BadOffset
        );
        assert_eq!(
            Policy::token_bucket("b", 1, 1)
                .unwrap()
                .with_unit(Unit::ConcurrentRequests)
                .unwrap_err(),
            PolicyError::UnitMismatch
        );
        assert_eq!(
            Policy::token_bucket("b", 1, u64::MAX).unwrap_err(),
            PolicyError::WindowTooLong
        );
        assert_eq!(
            Policy::fixed_window("f", 10, 18_446_744_073).unwrap_err(),
            PolicyError::WindowTooLong
        );
        assert!(Policy::fixed_window("f", 10, MAX_WINDOW_SECS).is_ok());
    }

    #[test]
    fn a_named_unit_is_kept_and_checked() {
        let p = Policy::token_bucket("tpm", 100_000, 60)
            .unwrap()
            .with_unit(Unit::named("tokens").unwrap())
            .unwrap();
        assert_eq!(p.unit().as_str(), "tokens");
        assert_eq!(p.unit(), Unit::named("tokens").unwrap());
        assert_ne!(p.unit(), Unit::named("credits").unwrap());
        assert_eq!(
            Unit::named("concurrent-requests").unwrap(),
            Unit::ConcurrentRequests
        );
        let long = "t".repeat(UnitName::MAX_LEN);
        assert_eq!(Unit::named(&long).unwrap().as_str(), long);
        for bad in [
            "",
            "Tokens",
            "1k",
            "to kens",
            "tök",
            "a\"b",
            &"t".repeat(33),
        ] {
            assert_eq!(
                Unit::named(bad).unwrap_err(),
                PolicyError::BadUnit(bad.to_string()),
                "{bad:?}"
            );
        }
        // a concurrency cap counts requests in flight, nothing else
        assert_eq!(
            Policy::concurrency("c", 2)
                .unwrap()
                .with_unit(Unit::named("tokens").unwrap())
                .unwrap_err(),
            PolicyError::UnitMismatch
        );
        // charged the route's cost
        assert_eq!(crate::Cost::requests(700).with_bytes(3).of(&p), 700);
    }

    #[test]
    fn kind_defaults_by_window() {
        assert_eq!(
            Policy::fixed_window("m", 5, 60).unwrap().kind(),
            PolicyKind::Burst
        );
        assert_eq!(
            Policy::fixed_window("h", 5, 3600).unwrap().kind(),
            PolicyKind::Quota
        );
        assert_eq!(
            Policy::concurrency("c", 5).unwrap().kind(),
            PolicyKind::Burst
        );
    }

    #[test]
    fn a_burst_is_a_token_buckets_alone_and_bounded() {
        let tb = Policy::token_bucket("b", 5_000, 1).unwrap();
        assert_eq!(tb.burst(), 5_000);
        assert!(!tb.has_own_burst());
        let small = tb.clone().with_burst(500).unwrap();
        assert_eq!(
            (small.quota(), small.window_s(), small.burst()),
            (5_000, 1, 500)
        );
        assert_eq!(small.capacity_ns(), 100_000_000);
        // a burst equal to q is the plain bucket, to the nanosecond
        assert_eq!(tb.clone().with_burst(5_000).unwrap(), tb);
        let large = Policy::token_bucket("b", 10, 1)
            .unwrap()
            .with_burst(100)
            .unwrap();
        assert_eq!(large.capacity_ns(), 10_000_000_000);
        for bad in [
            Policy::fixed_window("f", 5, 1).unwrap().with_burst(2),
            tb.clone().with_burst(0),
            Policy::token_bucket("b", 1, MAX_WINDOW_SECS)
                .unwrap()
                .with_burst(2),
        ] {
            assert!(matches!(bad, Err(PolicyError::BadBurst(_))), "{bad:?}");
        }
    }

    #[test]
    fn a_small_burst_admits_at_once_only_what_it_holds() {
        let p = Policy::token_bucket("b", 10, 1)
            .unwrap()
            .with_burst(3)
            .unwrap();
        let plan = crate::Plan::new("p", vec![p]).unwrap();
        let store = crate::MemoryStore::new();
        let t = Nanos::from_secs(5);
        let n = (0..10)
            .filter(|_| store.check_sync(&plan, "k", 1, t).unwrap().is_allowed())
            .count();
        assert_eq!(n, 3);
        // refills at 10 a second: one every 100 ms
        let d = store
            .check_sync(&plan, "k", 1, t.saturating_add(Nanos::from_millis(99)))
            .unwrap();
        assert!(!d.is_allowed());
        let d = store
            .check_sync(&plan, "k", 1, t.saturating_add(Nanos::from_millis(100)))
            .unwrap();
        assert!(d.is_allowed());
        // a cost above the burst can never be admitted
        let d = store.check_sync(&plan, "j", 4, t).unwrap();
        assert!(!d.is_allowed());
    }
}
