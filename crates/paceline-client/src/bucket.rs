//! A mirror of one server policy, kept by the client.
//!
//! Two models, chosen from what the server publishes:
//!
//! - **rate** (quota and a window under an hour known): a GCRA bucket of
//!   capacity `q` refilling `q` per `w`, the way the server's token bucket
//!   refills, so the client spends exactly at the published rate;
//! - **window** (a long quota, or only remaining and reset known): `r`
//!   units until the reset; when fewer than 10% of `q` are left the rest is
//!   spread evenly over the time to the reset instead of spent at once.
//!
//! Corrections from the server only ever make the mirror more careful,
//! except when no other request is in flight and no answer to a later
//! request came back first, when the server's word is taken as it is.

use paceline_core::Nanos;

use crate::observe::PolicyObservation;

/// Windows at least this long are quotas (their 429 is not retried).
pub const QUOTA_WINDOW: Nanos = Nanos::from_secs(3_600);

#[derive(Clone, Debug)]
pub(crate) enum Model {
    Rate {
        emission: u64,
        span: u64,
        tat: u64,
    },
    Window {
        remaining: Option<u64>,
        reset_at: u64,
        next_at: u64,
    },
}

/// The client's copy of one policy.
#[derive(Clone, Debug)]
pub(crate) struct Mirror {
    pub(crate) name: String,
    pub(crate) endpoint: Option<String>,
    pub(crate) quota: Option<u64>,
    pub(crate) window: Option<Nanos>,
    pub(crate) model: Model,
}

impl Mirror {
    pub(crate) fn new(p: &PolicyObservation, endpoint: Option<String>) -> Self {
        let mut m = Mirror {
            name: p.name.clone(),
            endpoint,
            quota: None,
            window: None,
            model: Model::Window {
                remaining: None,
                reset_at: 0,
                next_at: 0,
            },
        };
        m.shape(p);
        m
    }

    /// Whether this is a long-window quota.
    pub(crate) fn is_quota(&self) -> bool {
        self.window.is_some_and(|w| w >= QUOTA_WINDOW)
    }

    /// The time one unit takes to refill (rate model), if known.
    pub(crate) fn emission(&self) -> Option<Nanos> {
        match self.model {
            Model::Rate { emission, .. } => Some(Nanos::new(emission)),
            Model::Window { .. } => None,
        }
    }

    fn shape(&mut self, p: &PolicyObservation) {
        if p.quota.is_some() {
            self.quota = p.quota;
        }
        if let Some(w) = p.window_s {
            self.window = Some(Nanos::from_secs(w));
        }
        let rate = match (self.quota, self.window) {
            (Some(q), Some(w)) if q > 0 && w > Nanos::ZERO && w < QUOTA_WINDOW => Some((q, w)),
            _ => None,
        };
        match (rate, &self.model) {
            (Some((q, w)), Model::Rate { emission, .. }) if *emission == w.as_u64() / q => {}
            (Some((q, w)), _) => {
                self.model = Model::Rate {
                    emission: (w.as_u64() / q).max(1),
                    span: w.as_u64(),
                    tat: 0,
                }
            }
            (None, Model::Window { .. }) => {}
            (None, Model::Rate { .. }) => {
                self.model = Model::Window {
                    remaining: None,
                    reset_at: 0,
                    next_at: 0,
                }
            }
        }
    }

    /// The earliest instant one unit may be spent.
    pub(crate) fn earliest(&self, now: Nanos) -> Nanos {
        let now = now.as_u64();
        let at = match self.model {
            Model::Rate {
                emission,
                span,
                tat,
            } => (tat + emission).saturating_sub(span),
            Model::Window {
                remaining,
                reset_at,
                next_at,
            } => {
                if now >= reset_at {
                    now
                } else if remaining == Some(0) {
                    reset_at
                } else {
                    next_at
                }
            }
        };
        Nanos::new(at.max(now))
    }

    /// Spends one unit at `now`.
    pub(crate) fn spend(&mut self, now: Nanos) {
        let now = now.as_u64();
        let quota = self.quota;
        let window = self.window.map(Nanos::as_u64);
        match &mut self.model {
            Model::Rate { emission, tat, .. } => *tat = (*tat).max(now) + *emission,
            Model::Window {
                remaining,
                reset_at,
                next_at,
            } => {
                if now >= *reset_at {
                    match (quota, window) {
                        (Some(q), Some(w)) if *reset_at > 0 && w > 0 => {
                            let behind = (now - *reset_at) / w + 1;
                            *reset_at += behind * w;
                            *remaining = Some(q);
                        }
                        _ => *remaining = None,
                    }
                }
                if let Some(r) = remaining {
                    *r = r.saturating_sub(1);
                    if let Some(q) = quota {
                        if *r > 0 && r.saturating_mul(10) < q && *reset_at > now {
                            *next_at = now + (*reset_at - now) / *r;
                        }
                    }
                }
            }
        }
    }

    /// Folds what the server published into the mirror. `later` counts
    /// requests sent after the one this response answers and still in
    /// flight; `alone` says no other request is in flight and this is the
    /// answer to the latest request sent.
    pub(crate) fn observe(&mut self, now: Nanos, p: &PolicyObservation, later: u64, alone: bool) {
        self.shape(p);
        let now = now.as_u64();
        let Some(r) = p.remaining else { return };
        let r = r.saturating_sub(later);
        let quota = self.quota;
        match &mut self.model {
            Model::Rate {
                emission,
                span,
                tat,
            } => {
                let q = quota.unwrap_or(1);
                let debt = q.saturating_sub(r.min(q));
                let observed = now + debt.saturating_mul(*emission).min(*span);
                // `observed` is never earlier than the server's own state
                // (`r` is rounded down and was computed before now), so
                // taking the later of the two never lets the mirror run
                // ahead of the server, whatever the latency did. When no
                // other request is in flight the server's word is taken
                // even if it is a whole unit more generous.
                let local = (*tat).max(now);
                let behind = alone && observed.saturating_add(*emission) <= local;
                if observed > local || behind {
                    *tat = observed;
                }
            }
            Model::Window {
                remaining,
                reset_at,
                next_at,
            } => {
                if let Some(t) = p.reset_in {
                    *reset_at = now.saturating_add(t.as_u64());
                } else if *reset_at <= now {
                    *reset_at = now.saturating_add(self.window.map(Nanos::as_u64).unwrap_or(0));
                }
                *remaining = Some(match *remaining {
                    Some(local) if !alone => local.min(r),
                    _ => r,
                });
                if let (Some(q), Some(left)) = (quota, *remaining) {
                    if left > 0 && left.saturating_mul(10) < q && *reset_at > now {
                        *next_at = (*next_at).max(now + (*reset_at - now) / (left + 1));
                    }
                }
            }
        }
    }

    /// What is left, for diagnostics: whole units.
    pub(crate) fn available(&self, now: Nanos) -> Option<u64> {
        let now = now.as_u64();
        match self.model {
            Model::Rate {
                emission,
                span,
                tat,
            } => Some(span.saturating_sub(tat.saturating_sub(now)) / emission),
            Model::Window {
                remaining,
                reset_at,
                ..
            } => {
                if now >= reset_at {
                    self.quota
                } else {
                    remaining
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pol(q: u64, w: u64, r: u64, t: u64) -> PolicyObservation {
        PolicyObservation {
            name: "burst".into(),
            quota: Some(q),
            window_s: Some(w),
            remaining: Some(r),
            reset_in: Some(Nanos::from_secs(t)),
            counts_requests: true,
            per_endpoint: false,
        }
    }

    #[test]
    fn rate_mirror_spends_seven_then_one_per_quarter_second() {
        let t0 = Nanos::from_secs(1_000);
        let mut m = Mirror::new(&pol(8, 2, 7, 1), None);
        m.observe(t0, &pol(8, 2, 7, 1), 0, true);
        for _ in 0..7 {
            assert_eq!(m.earliest(t0), t0);
            m.spend(t0);
        }
        assert_eq!(m.earliest(t0), t0.saturating_add(Nanos::from_millis(250)));
    }

    #[test]
    fn window_mirror_spreads_the_last_tenth() {
        let t0 = Nanos::from_secs(1_000);
        let p = PolicyObservation {
            name: "daily".into(),
            quota: Some(1_000),
            window_s: Some(86_400),
            remaining: Some(50),
            reset_in: Some(Nanos::from_secs(5_000)),
            counts_requests: true,
            per_endpoint: false,
        };
        let mut m = Mirror::new(&p, None);
        m.observe(t0, &p, 0, true);
        assert!(m.is_quota());
        m.spend(t0);
        // 49 left over 5,000 s: about one every 102 s
        let next = m.earliest(t0).saturating_sub(t0);
        assert_eq!(next.as_secs_floor(), 102);
    }

    #[test]
    fn window_mirror_waits_for_the_reset_when_empty() {
        let t0 = Nanos::from_secs(1_000);
        let mut p = pol(10, 60, 0, 30);
        p.window_s = None;
        p.quota = None;
        let mut m = Mirror::new(&p, None);
        m.observe(t0, &p, 0, true);
        assert_eq!(m.earliest(t0), t0.saturating_add(Nanos::from_secs(30)));
    }
}
