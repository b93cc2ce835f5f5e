//! Time, injected.
//!
//! Every decision that depends on time reads it from a [`Clock`], so the same
//! limiter code runs against the wall clock in production and against a
//! [`ManualClock`] in tests and in the simulator, where virtual time moves
//! only when the test says so.
//!
//! ```
//! use paceline_core::{Clock, ManualClock, Nanos};
//!
//! let clock = ManualClock::new(Nanos::from_secs(100));
//! clock.advance(Nanos::from_millis(250));
//! assert_eq!(clock.now(), Nanos::from_millis(100_250));
//! ```

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Nanoseconds: an instant (counted from the UNIX epoch, UTC) or a duration.
///
/// Integer nanoseconds keep every algorithm exact and cheap; a `u64` covers
/// instants until the year 2554.
#[derive(Copy, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Nanos(u64);

impl Nanos {
    /// Zero: the epoch, or an empty duration.
    pub const ZERO: Nanos = Nanos(0);
    /// The largest representable value.
    pub const MAX: Nanos = Nanos(u64::MAX);
    /// One second.
    pub const SECOND: Nanos = Nanos(1_000_000_000);

    /// From raw nanoseconds.
    pub const fn new(nanos: u64) -> Self {
        Nanos(nanos)
    }
    /// From whole seconds (saturating).
    pub const fn from_secs(secs: u64) -> Self {
        Nanos(secs.saturating_mul(1_000_000_000))
    }
    /// From whole milliseconds (saturating).
    pub const fn from_millis(ms: u64) -> Self {
        Nanos(ms.saturating_mul(1_000_000))
    }
    /// From fractional seconds; negative or NaN gives zero, huge saturates.
    pub fn from_secs_f64(secs: f64) -> Self {
        if secs.is_nan() || secs <= 0.0 {
            return Nanos(0);
        }
        let n = secs * 1e9;
        if n >= u64::MAX as f64 {
            Nanos(u64::MAX)
        } else {
            Nanos(n as u64)
        }
    }
    /// The raw nanosecond count.
    pub const fn as_u64(self) -> u64 {
        self.0
    }
    /// Fractional seconds.
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / 1e9
    }
    /// Whole seconds, rounded down.
    pub const fn as_secs_floor(self) -> u64 {
        self.0 / 1_000_000_000
    }
    /// Whole seconds, rounded up (so a wait is never announced short).
    pub const fn as_secs_ceil(self) -> u64 {
        self.0.div_ceil(1_000_000_000)
    }
    /// `self + rhs`, saturating at [`Nanos::MAX`].
    pub const fn saturating_add(self, rhs: Nanos) -> Nanos {
        Nanos(self.0.saturating_add(rhs.0))
    }
    /// `self - rhs`, saturating at zero.
    pub const fn saturating_sub(self, rhs: Nanos) -> Nanos {
        Nanos(self.0.saturating_sub(rhs.0))
    }
    /// As a [`Duration`].
    pub const fn as_duration(self) -> Duration {
        Duration::from_nanos(self.0)
    }
    /// From a [`Duration`] (saturating).
    pub fn from_duration(d: Duration) -> Self {
        Nanos(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    }
    /// As a [`SystemTime`], reading `self` as an instant.
    pub fn as_system_time(self) -> SystemTime {
        UNIX_EPOCH + self.as_duration()
    }
    /// From a [`SystemTime`]; times before the epoch give zero.
    pub fn from_system_time(t: SystemTime) -> Self {
        t.duration_since(UNIX_EPOCH)
            .map(Nanos::from_duration)
            .unwrap_or(Nanos::ZERO)
    }
}

impl fmt::Debug for Nanos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.9}s", self.as_secs_f64())
    }
}

impl From<Duration> for Nanos {
    fn from(d: Duration) -> Self {
        Nanos::from_duration(d)
    }
}

impl From<Nanos> for Duration {
    fn from(n: Nanos) -> Self {
        n.as_duration()
    }
}

/// A source of the current time, as nanoseconds since the UNIX epoch (UTC).
///
/// Wall-clock time (not a monotonic instant) because calendar windows, such
/// as a daily quota resetting at 00:00 UTC, need to know the time of day.
pub trait Clock: Send + Sync + 'static {
    /// The current instant.
    fn now(&self) -> Nanos;
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now(&self) -> Nanos {
        (**self).now()
    }
}

impl<C: Clock + ?Sized> Clock for &'static C {
    fn now(&self) -> Nanos {
        (**self).now()
    }
}

/// The real clock: the wall time read once at construction, advanced by a
/// cheap monotonic counter (TSC where available), so reading it costs a few
/// nanoseconds and it never runs backwards when the system clock is stepped.
#[derive(Clone, Debug)]
pub struct SystemClock {
    anchor_wall: Nanos,
    anchor_raw: u64,
    mono: quanta::Clock,
}

impl SystemClock {
    /// Anchors a new clock at the current system time.
    pub fn new() -> Self {
        let mono = quanta::Clock::new();
        let anchor_raw = mono.raw();
        let anchor_wall = Nanos::from_system_time(SystemTime::now());
        SystemClock {
            anchor_wall,
            anchor_raw,
            mono,
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        SystemClock::new()
    }
}

impl Clock for SystemClock {
    #[inline]
    fn now(&self) -> Nanos {
        let raw = self.mono.raw();
        let elapsed = if raw > self.anchor_raw {
            self.mono.delta_as_nanos(self.anchor_raw, raw)
        } else {
            0
        };
        Nanos(self.anchor_wall.0.saturating_add(elapsed))
    }
}

/// A clock that moves only when told to. Clones share the same time.
#[derive(Clone, Debug, Default)]
pub struct ManualClock {
    now: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock standing at `start`.
    pub fn new(start: Nanos) -> Self {
        ManualClock {
            now: Arc::new(AtomicU64::new(start.as_u64())),
        }
    }
    /// A clock standing at the given UNIX second.
    pub fn at_unix_secs(secs: u64) -> Self {
        ManualClock::new(Nanos::from_secs(secs))
    }
    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Nanos) {
        self.now.fetch_add(by.as_u64(), Ordering::SeqCst);
    }
    /// Sets the clock to `to` (which may be earlier: clocks do jump).
    pub fn set(&self, to: Nanos) {
        self.now.store(to.as_u64(), Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    #[inline]
    fn now(&self) -> Nanos {
        Nanos(self.now.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding() {
        assert_eq!(Nanos::from_millis(190).as_secs_ceil(), 1);
        assert_eq!(Nanos::from_millis(1000).as_secs_ceil(), 1);
        assert_eq!(Nanos::from_millis(1001).as_secs_ceil(), 2);
        assert_eq!(Nanos::from_millis(1999).as_secs_floor(), 1);
        assert_eq!(Nanos::from_secs_f64(-3.0), Nanos::ZERO);
        assert_eq!(Nanos::from_secs_f64(f64::NAN), Nanos::ZERO);
        assert_eq!(Nanos::from_secs_f64(1e300), Nanos::MAX);
    }

    #[test]
    fn system_clock_is_near_wall_time_and_monotonic() {
        let c = SystemClock::new();
        let a = c.now();
        let b = c.now();
        assert!(b >= a);
        let wall = Nanos::from_system_time(SystemTime::now());
        let diff = wall.as_u64().abs_diff(a.as_u64());
        assert!(diff < 1_000_000_000, "drift {diff}ns");
    }
}
