//! Escalation for keys that do not listen.
//!
//! Why: a client that ignores `Retry-After` and retries in a tight loop
//! turns its own traffic into rejections, and each still costs a check.
//! A request that arrives while its key is still inside the wait it was
//! given is a *strike*. From [`EscalationConfig::extend_after`] strikes on,
//! every denial's wait is multiplied by [`EscalationConfig::extend_factor`]
//! and enforced here, without asking the store; from
//! [`EscalationConfig::block_after`] strikes the key is blocked for
//! [`EscalationConfig::block_for_s`] seconds. A key that waits out its
//! window starts clean again. State is per key hash, bounded in size.
//!
//! A hold never hides the real wait: the store's own wait at the last
//! denial is kept, and a hold's wait is the longer of the two, so
//! `Retry-After` is never shorter than a policy's wait and never longer
//! than the hold plus it. A quota is not extended or blocked past its
//! reset: its wait already runs to the reset, and a client that retries
//! inside it is only held (without asking the store) until then.

use paceline_core::{Nanos, PolicyKind};
use serde::Deserialize;

use crate::config::{ConfigError, ConfigErrorKind};
use crate::identity::KeyHash;
use crate::state::{BoundedMap, Expiring};

/// Escalation settings.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EscalationConfig {
    /// Whether escalation is on.
    pub enabled: bool,
    /// Strikes (requests inside the key's own wait) before waits grow.
    pub extend_after: u32,
    /// How much longer an escalated wait is.
    pub extend_factor: u32,
    /// Strikes before the key is blocked.
    pub block_after: u32,
    /// How long a block lasts, in seconds.
    pub block_for_s: u64,
    /// The most keys tracked at once.
    pub max_keys: usize,
}

impl Default for EscalationConfig {
    fn default() -> Self {
        EscalationConfig {
            enabled: true,
            extend_after: 10,
            extend_factor: 4,
            block_after: 50,
            block_for_s: 300,
            max_keys: 100_000,
        }
    }
}

impl EscalationConfig {
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        let err = |f: &str, m: &str| {
            Err(ConfigError::new(
                ConfigErrorKind::OutOfRange,
                format!("escalation.{f}"),
                m,
            ))
        };
        if self.extend_after == 0 {
            return err("extend_after", "must be at least 1");
        }
        if self.extend_factor < 2 {
            return err("extend_factor", "must be at least 2");
        }
        if self.block_after <= self.extend_after {
            return err("block_after", "must be greater than extend_after");
        }
        if self.block_for_s == 0 {
            return err("block_for_s", "must be at least 1 second");
        }
        if self.max_keys == 0 {
            return err("max_keys", "must be at least 1");
        }
        Ok(())
    }
}

/// How far a key has been escalated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Level {
    /// Waits are longer than the limit alone would give.
    Extended,
    /// Every request is refused until the block ends.
    Blocked,
}

impl Level {
    /// The level's name in metrics and logs.
    pub fn as_str(&self) -> &'static str {
        match self {
            Level::Extended => "extended",
            Level::Blocked => "blocked",
        }
    }
}

/// A request refused by escalation alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Hold {
    /// Until the hold ends.
    pub(crate) wait: Nanos,
    /// Until the wait the store gave at the key's last denial ends (what
    /// the policies alone still impose).
    pub(crate) real: Nanos,
    pub(crate) policy: usize,
    pub(crate) level: Level,
    /// The key reached this level with this request.
    pub(crate) fresh: bool,
}

#[derive(Default)]
struct Entry {
    retry_at: u64,
    blocked_until: u64,
    /// When the store's own wait of the last denial ends.
    real_until: u64,
    strikes: u32,
    policy: usize,
    /// The last denial was by a quota: it is never held past its reset.
    quota: bool,
}

impl Expiring for Entry {
    fn expires(&self) -> u64 {
        self.retry_at.max(self.blocked_until)
    }
}

pub(crate) struct Escalator {
    config: EscalationConfig,
    map: BoundedMap<Entry>,
}

impl Escalator {
    pub(crate) fn new(config: EscalationConfig) -> Self {
        let map = BoundedMap::new(config.max_keys);
        Escalator { config, map }
    }

    /// Called before the store: refuses a blocked key, or an escalated key
    /// still inside its (longer) wait, and counts strikes.
    pub(crate) fn before(&self, key: KeyHash, now: Nanos) -> Option<Hold> {
        if !self.config.enabled {
            return None;
        }
        let now = now.as_u64();
        let c = &self.config;
        let hit = |e: &mut Entry| {
            let real = e.real_until.saturating_sub(now);
            if e.blocked_until > now {
                return Some(hold(e.blocked_until - now, real, e, Level::Blocked, false));
            }
            // a quota's reset ends its wait, whatever was announced
            if now >= e.retry_at || (e.quota && now >= e.real_until) {
                e.strikes = 0; // it waited: start clean
                return None;
            }
            e.strikes = e.strikes.saturating_add(1);
            // a quota's wait runs to its reset already: no block beyond it
            if e.strikes >= c.block_after && !e.quota {
                e.blocked_until = now.saturating_add(c.block_for_s.saturating_mul(1_000_000_000));
                // the strike window is what the block's answer announces
                e.retry_at = e.blocked_until.max(e.real_until);
                return Some(hold(e.blocked_until - now, real, e, Level::Blocked, true));
            }
            // a quota key is held to its reset, not to the rounded second
            let until = match e.quota {
                true => e.real_until,
                false => e.retry_at,
            };
            match e.strikes > c.extend_after {
                true => Some(hold(until - now, real, e, Level::Extended, false)),
                false => None,
            }
        };
        // a key never denied has no entry, and gets none here
        self.map.with_existing(key.0, hit).flatten()
    }

    /// Called on a denial from the store: returns the wait to announce
    /// (longer once the key is escalated, never for a quota, whose wait
    /// runs to its reset) and whether the key was just escalated.
    pub(crate) fn denied(
        &self,
        key: KeyHash,
        now: Nanos,
        wait: Nanos,
        policy: usize,
        kind: PolicyKind,
    ) -> (Nanos, bool) {
        if !self.config.enabled {
            return (wait, false);
        }
        let c = &self.config;
        let now_ns = now.as_u64();
        self.map
            .with(key.0, now_ns, |e| {
                let quota = kind == PolicyKind::Quota;
                let escalated = e.strikes >= c.extend_after && !quota;
                let real = wait;
                let wait = if escalated {
                    // whole announced seconds times the factor: 1 s becomes 4 s
                    let secs = wait.as_secs_ceil().max(1);
                    Nanos::from_secs(secs.saturating_mul(u64::from(c.extend_factor)))
                } else {
                    wait
                };
                // whole seconds, as announced: the strike window matches the header
                let announced = Nanos::from_secs(wait.as_secs_ceil().max(1));
                e.retry_at = e.retry_at.max(now_ns.saturating_add(announced.as_u64()));
                e.real_until = now_ns.saturating_add(real.as_u64());
                e.policy = policy;
                e.quota = quota;
                (wait, escalated && e.strikes == c.extend_after)
            })
            .unwrap_or((wait, false))
    }
}

fn hold(wait_ns: u64, real_ns: u64, e: &Entry, level: Level, fresh: bool) -> Hold {
    Hold {
        wait: Nanos::new(wait_ns),
        real: Nanos::new(real_ns),
        policy: e.policy,
        level,
        fresh,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> EscalationConfig {
        EscalationConfig {
            extend_after: 3,
            block_after: 6,
            block_for_s: 60,
            ..EscalationConfig::default()
        }
    }

    #[test]
    fn strikes_extend_then_block_then_forgive() {
        let e = Escalator::new(cfg());
        let k = KeyHash::of("k");
        let t0 = Nanos::from_secs(1000);
        assert_eq!(e.before(k, t0), None);
        let (w, fresh) = e.denied(k, t0, Nanos::from_millis(400), 0, PolicyKind::Burst);
        assert_eq!((w, fresh), (Nanos::from_millis(400), false));
        // three strikes inside the 1 s window, each denied by the store
        for i in 1..=3u64 {
            let t = t0.saturating_add(Nanos::from_millis(10 * i));
            assert_eq!(e.before(k, t), None);
            let (w, fresh) = e.denied(k, t, Nanos::from_millis(400), 0, PolicyKind::Burst);
            if i < 3 {
                assert_eq!(w, Nanos::from_millis(400));
            } else {
                assert_eq!(w, Nanos::from_secs(4));
                assert!(fresh);
            }
        }
        // now inside the extended window: held without the store
        let t = t0.saturating_add(Nanos::from_millis(100));
        let h = e.before(k, t).unwrap();
        assert_eq!(h.level, Level::Extended);
        // two more strikes: blocked
        assert_eq!(e.before(k, t).unwrap().level, Level::Extended);
        let b = e.before(k, t).unwrap();
        assert_eq!((b.level, b.fresh), (Level::Blocked, true));
        assert_eq!(b.wait, Nanos::from_secs(60));
        let later = t.saturating_add(Nanos::from_secs(30));
        assert_eq!(e.before(k, later).unwrap().wait, Nanos::from_secs(30));
        // after the block, a patient key is clean again
        let after = t.saturating_add(Nanos::from_secs(61));
        assert_eq!(e.before(k, after), None);
        assert_eq!(
            e.denied(k, after, Nanos::from_millis(400), 0, PolicyKind::Burst)
                .0,
            Nanos::from_millis(400)
        );
    }

    #[test]
    fn a_key_that_waits_is_never_escalated() {
        let e = Escalator::new(cfg());
        let k = KeyHash::of("patient");
        let mut t = Nanos::from_secs(1000);
        for _ in 0..100 {
            assert_eq!(e.before(k, t), None);
            let (w, fresh) = e.denied(k, t, Nanos::from_millis(500), 0, PolicyKind::Burst);
            assert_eq!(w, Nanos::from_millis(500));
            assert!(!fresh);
            t = t.saturating_add(Nanos::from_secs(1));
        }
    }

    #[test]
    fn a_quota_is_held_to_its_reset_and_no_further() {
        let e = Escalator::new(cfg());
        let k = KeyHash::of("spent");
        let t0 = Nanos::from_secs(1000);
        let reset = Nanos::from_secs(16_971);
        for i in 0..20u64 {
            let t = t0.saturating_add(Nanos::from_millis(10 * i));
            let left = reset.saturating_sub(Nanos::from_millis(10 * i));
            match e.before(k, t) {
                // held without the store: exactly until the reset
                Some(h) => {
                    assert_eq!(h.level, Level::Extended, "a quota key is never blocked");
                    assert!(h.wait.as_secs_ceil() <= reset.as_secs_ceil());
                    assert_eq!(h.real, left);
                }
                None => {
                    let (w, _) = e.denied(k, t, left, 1, PolicyKind::Quota);
                    assert_eq!(w, left, "a quota's wait is never extended");
                }
            }
        }
    }

    #[test]
    fn a_block_keeps_the_real_wait() {
        let e = Escalator::new(cfg());
        let k = KeyHash::of("k");
        let t0 = Nanos::from_secs(1000);
        // a burst denial with a long real wait (a slow bucket)
        let real = Nanos::from_secs(100);
        for i in 0..10u64 {
            let t = t0.saturating_add(Nanos::from_millis(i));
            if e.before(k, t).is_none() {
                e.denied(k, t, real, 0, PolicyKind::Burst);
            }
        }
        let h = e
            .before(k, t0.saturating_add(Nanos::from_millis(20)))
            .unwrap();
        assert_eq!(h.level, Level::Blocked);
        assert!(h.real > Nanos::from_secs(99), "{h:?}");
    }

    #[test]
    fn invalid_config_names_the_field() {
        let bad = EscalationConfig {
            block_after: 2,
            ..cfg()
        };
        assert_eq!(
            bad.validate().unwrap_err().field(),
            "escalation.block_after"
        );
    }
}
