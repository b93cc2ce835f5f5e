//! A mirror of one server policy, kept by the client.
//!
//! Two models, chosen from what the server publishes and how it behaves:
//!
//! - **rate** (quota and a window under an hour known, and nothing says
//!   otherwise): a GCRA bucket of capacity `q` refilling `q` per `w`, the
//!   way the server's token bucket refills, so the client spends exactly at
//!   the published rate;
//! - **window** (a long quota, only remaining and reset known, or a short
//!   window the server runs as a fixed window): `r` units until the reset,
//!   then the whole quota again; when fewer than 10% of `q` are left the
//!   rest is spread evenly over the time to the reset instead of spent at
//!   once.
//!
//! Why the server's window kind matters: a counter that restores all of
//! `q` at once at the reset instant holds nothing between two resets, so a
//! bucket mirror that refills one unit every `w/q` spends units the server
//! does not have and draws a 429 each time. A policy is taken for a fixed
//! window as soon as an answer could not come from a bucket: `t` (whole
//! seconds to the full restore, rounded up) longer than a bucket missing
//! `q − r` units could need, `ceil((q − r) · w / q)` (a fixed window says
//! `t ≈ w` right after it opens), or shorter than a bucket holding less
//! than `r + 1` units must need (a window about to end with little left),
//! or `r` higher than the refill since an earlier answer allows (restored
//! at once). A window mirror keeps the
//! earliest reset instant its answers allow (every answer's `now + t` is an
//! upper bound on the same instant) and waits [`FIXED_MARGIN`] past it, for
//! clock and network jitter, before spending the next window.
//!
//! A server that publishes no `w` and its reset as an epoch second
//! (`X-RateLimit-Reset`) says when a window ends up to a second late. The
//! answer to the request that opened a window (it left `q − 1`) tells the
//! window's length in whole seconds, `floor(t + round trip)`; the mirror
//! then ends each window one such length after its first answer, and lets
//! the first request of the next window go alone, the others waiting for
//! its answer, so a window that is not a whole number of seconds costs one
//! 429 (after which only the server's reset counts), not a window's worth.
//!
//! How answers correct a rate mirror: every request remembers what the
//! mirror expected of it when it went out (its `Mark`). The server's `r`
//! agrees with that expectation when it is what the mirror predicted for
//! some moment between send and receipt, give or take the requests sent
//! after it (the server may have served them first); then the mirror,
//! which knows the refill phase better than a rounded-down `r` can tell,
//! stays as it is. Only when the server reports clearly less (another
//! client on the key, a restarted server) is the mirror moved, by whole
//! units, so the phase is kept. Two floors keep it safe: the server
//! charged the request no later than its answer came back, and a 429
//! means even that was too early.
//!
//! Answers without a mark (the first response of a scope, a usage seed)
//! only ever make the mirror more careful, except when no other request is
//! in flight and no answer to a later request came back first, when the
//! server's word is taken as it is.

use paceline_core::Nanos;

use crate::observe::PolicyObservation;

/// Windows at least this long are quotas (their 429 is not retried).
pub const QUOTA_WINDOW: Nanos = Nanos::from_secs(3_600);

/// How long past a window's reset instant a window mirror waits before it
/// spends the next window: room for the server's clock, the network and the
/// rounding of `t` to whole seconds on the server's side of the reset.
pub(crate) const FIXED_MARGIN: Nanos = Nanos::from_millis(50);

/// The share of `span` nanoseconds that `amount` of `left` units get,
/// when the last of a window are spread evenly to its reset.
fn spread(span: u64, amount: u64, left: u64) -> u64 {
    let share = u128::from(span) * u128::from(amount) / u128::from(left.max(1));
    share.min(u128::from(span)) as u64
}

#[derive(Clone, Debug)]
pub(crate) enum Model {
    Rate {
        emission: u64,
        span: u64,
        tat: u64,
        /// How far answers have moved `tat` since the model was made:
        /// a mark's expectation is its base plus this.
        shifted: u64,
    },
    Window {
        remaining: Option<u64>,
        reset_at: u64,
        next_at: u64,
        /// Counts the windows the mirror has rolled over to; a request
        /// remembers the one it went out in.
        epoch: u64,
        /// `reset_at` is the mirror's own guess for a window no answer has
        /// spoken of yet (replaced, not tightened, by the first answer).
        provisional: bool,
        /// Units spent since `remaining` was last taken from the server.
        spent: u64,
    },
}

impl Model {
    fn empty_window() -> Self {
        Model::Window {
            remaining: None,
            reset_at: 0,
            next_at: 0,
            epoch: 0,
            provisional: false,
            spent: 0,
        }
    }
}

/// The client's copy of one policy.
#[derive(Clone, Debug)]
pub(crate) struct Mirror {
    pub(crate) name: String,
    /// The unit the policy counts (`requests`, `tokens`, …).
    pub(crate) unit: String,
    /// Units charged to the mirror since it was made, and the charges
    /// (requests) they came in: an answer's mark tells how many units went
    /// out after its request.
    pub(crate) spent_total: u64,
    pub(crate) charges: u64,
    pub(crate) endpoint: Option<String>,
    pub(crate) quota: Option<u64>,
    pub(crate) window: Option<Nanos>,
    pub(crate) model: Model,
    /// Bumped whenever a new model is made, so marks taken under an older
    /// one are not read against it.
    generation: u32,
    /// The server runs this policy as a fixed window (seen in its answers).
    pub(crate) fixed: bool,
    /// The longest `t` seen: the window's length, as far as the answers
    /// tell, when the server does not publish `w`.
    longest_reset: u64,
    /// The latest answer taken as the server's word: when it came and
    /// what it said was left (to tell a restore at once from a refill).
    last_answer: Option<(u64, u64)>,
    /// The window's length in whole seconds, read off the answer to the
    /// request that opened a window, when the server publishes no `w`
    /// (its reset instant, in whole epoch seconds, can be up to a second
    /// late); dropped for good on the first 429.
    whole_window: Option<u64>,
    no_guess: bool,
    /// When a window whose reset instant was guessed rolled over: the
    /// first request of the new window goes alone, and the others wait
    /// for its answer (at most [`PROBE_HOLD`]), so a wrong guess costs one
    /// 429, not a window's worth.
    awaiting: Option<u64>,
}

/// How long the other requests wait for the first answer of a window
/// whose reset instant was guessed.
const PROBE_HOLD: u64 = 1_000_000_000;
/// How often they look again.
const PROBE_POLL: u64 = 5_000_000;

/// What a rate mirror expected of one request when it went out: its
/// theoretical arrival time after the charge, less the shifts made so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Mark {
    /// The mirror's generation (0: no expectation).
    generation: u32,
    base: u64,
    /// The units the request was charged.
    pub(crate) amount: u64,
    /// The amount was the scope's estimate, not stated by the request.
    pub(crate) estimated: bool,
    /// The mirror's `spent_total` right after this request's charge.
    after: u64,
}

/// How an answer relates to the request it answers and to the others.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Seen {
    /// When the answered request went out (`None`: not a request's answer,
    /// for example a usage seed).
    pub(crate) sent_at: Option<Nanos>,
    /// Requests sent after it and still in flight.
    pub(crate) later: u64,
    /// Requests sent after it, landed or not: the server may have served
    /// any of them first.
    pub(crate) sent_after: u64,
    /// Nothing else in flight and no answer to a later request came first.
    pub(crate) alone: bool,
    /// The server rejected it (429): it charged nothing.
    pub(crate) rejected: bool,
    /// Requests still in flight once it landed (sent before or after it):
    /// the server may not have served them yet.
    pub(crate) in_flight: u64,
}

impl Seen {
    /// Not an answer to a request of this client.
    pub(crate) fn unsent(alone: bool) -> Self {
        Seen {
            alone,
            ..Seen::default()
        }
    }
}

impl Mirror {
    pub(crate) fn new(p: &PolicyObservation, endpoint: Option<String>) -> Self {
        let mut m = Mirror {
            name: p.name.clone(),
            unit: p.unit_name().to_string(),
            spent_total: 0,
            charges: 0,
            endpoint,
            quota: None,
            window: None,
            model: Model::empty_window(),
            // never 0, which marks carry when they expect nothing
            generation: 1,
            fixed: false,
            longest_reset: 0,
            last_answer: None,
            whole_window: None,
            no_guess: false,
            awaiting: None,
        };
        m.shape(p);
        m
    }

    /// Whether the policy's window has reset by `now` (nothing spent is
    /// still counted against it).
    pub(crate) fn is_reset(&self, now: Nanos) -> bool {
        let now = now.as_u64();
        match self.model {
            Model::Rate { tat, .. } => tat <= now,
            Model::Window { reset_at, .. } => reset_at <= now,
        }
    }

    /// How the mirror models the server's window, for diagnostics:
    /// `bucket` (continuous refill), `fixed` (restored at once at the
    /// reset) or `window` (only remaining and reset known).
    pub(crate) fn kind(&self) -> &'static str {
        match self.model {
            Model::Rate { .. } => "bucket",
            Model::Window { .. } if self.fixed => "fixed",
            Model::Window { .. } => "window",
        }
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
            (Some(q), Some(w)) if q > 0 && w > Nanos::ZERO && w < QUOTA_WINDOW && !self.fixed => {
                Some((q, w))
            }
            _ => None,
        };
        match (rate, &self.model) {
            (Some((q, w)), Model::Rate { emission, .. }) if *emission == w.as_u64() / q => {}
            (Some((q, w)), _) => {
                self.generation = self.generation.wrapping_add(1).max(1);
                self.model = Model::Rate {
                    emission: (w.as_u64() / q).max(1),
                    span: w.as_u64(),
                    tat: 0,
                    shifted: 0,
                }
            }
            (None, Model::Window { .. }) => {}
            (None, Model::Rate { .. }) => {
                self.generation = self.generation.wrapping_add(1).max(1);
                self.model = Model::empty_window();
            }
        }
    }

    /// Whether an answer shows a window that restores all at once rather
    /// than a bucket that refills (see the module documentation).
    fn looks_fixed(&self, now: u64, p: &PolicyObservation, seen: &Seen) -> bool {
        let (Some(q), Some(w), Some(r)) = (p.quota.or(self.quota), self.window_of(p), p.remaining)
        else {
            return false;
        };
        if q == 0 || r >= q || w == 0 || seen.rejected {
            return false;
        }
        let w_ns = w.saturating_mul(1_000_000_000);
        if let Some(t) = p.reset_in {
            // a bucket missing q − r units is full again within
            // (q − r) · w / q, and the server rounds that up to seconds
            let bucket_t = ((q - r) as u128 * w_ns as u128).div_ceil(q as u128 * 1_000_000_000);
            let t_s = t.as_u64().div_ceil(1_000_000_000) as u128;
            if t_s > bucket_t {
                return true;
            }
            // and needs more than (q − r − 1) · w / q (it holds less than
            // r + 1 units): a window that ends sooner is not a bucket
            let least = ((q - r - 1) as u128 * w_ns as u128) / (q as u128 * 1_000_000_000);
            if t_s > 0 && t_s <= least {
                return true;
            }
        }
        // restored at once: the request went out after an earlier answer,
        // so the server served it later, and it found more units than a
        // refill since then (one unit per w/q, and one for rounding) gives
        if let (Some((at, prev)), Some(sent)) = (self.last_answer, seen.sent_at) {
            if sent.as_u64() >= at && now > at {
                let refill = ((now - at) as u128 * q as u128).div_ceil(w_ns as u128) as u64;
                return r > prev.saturating_add(refill).saturating_add(1);
            }
        }
        false
    }

    /// Reads the window's length off the answer to a request that opened
    /// a window (it left `q − 1`): its reset, `t` after the answer, came
    /// at most one second late (rounded up to an epoch second) and the
    /// window opened at most one round trip before the answer, so a
    /// window of whole seconds is `floor(t + round trip)`.
    fn guess_window(&mut self, now: u64, r: u64, p: &PolicyObservation, seen: &Seen) {
        if seen.rejected {
            // the guess may be what drew it: the server's word from now on
            self.no_guess = true;
            self.whole_window = None;
            self.awaiting = None;
            return;
        }
        if self.window.is_some() || self.no_guess || self.whole_window.is_some() {
            return;
        }
        let (Some(q), Some(t), Some(sent)) = (self.quota, p.reset_in, seen.sent_at) else {
            return;
        };
        if r.saturating_add(1) != q || sent.as_u64() > now {
            return;
        }
        let rtt = now - sent.as_u64();
        let secs = t.as_u64().saturating_add(rtt) / 1_000_000_000;
        if secs >= 1 {
            self.whole_window = Some(secs * 1_000_000_000);
        }
    }

    fn window_of(&self, p: &PolicyObservation) -> Option<u64> {
        p.window_s
            .or_else(|| self.window.map(|w| w.as_secs_floor()))
    }

    /// The earliest instant `amount` units may be spent; a bucket mirror
    /// in debt waits `margin` past its slot (see [`Config::pace_margin`]).
    ///
    /// [`Config::pace_margin`]: crate::Config::pace_margin
    pub(crate) fn earliest(&self, now: Nanos, margin: Nanos, amount: u64) -> Nanos {
        let now = now.as_u64();
        if let Some(at) = self.awaiting {
            if now < at.saturating_add(PROBE_HOLD) {
                return Nanos::new(now + PROBE_POLL);
            }
        }
        let at = match self.model {
            Model::Rate {
                emission,
                span,
                tat,
                ..
            } => match tat
                .saturating_add(amount.saturating_mul(emission))
                .saturating_sub(span)
            {
                // a unit is there: no margin for what needs no wait
                at if at <= now => at,
                at => at.saturating_add(margin.as_u64()),
            },
            Model::Window {
                remaining,
                reset_at,
                next_at,
                ..
            } => {
                let go = reset_at.saturating_add(FIXED_MARGIN.as_u64());
                if reset_at == 0 || now >= go || amount == 0 {
                    now
                } else if remaining.is_some_and(|r| r < amount) {
                    go
                } else if now >= reset_at {
                    now
                } else {
                    next_at
                }
            }
        };
        Nanos::new(at.max(now))
    }

    /// Spends `amount` units at `now` (`estimated`: the amount is the
    /// scope's estimate, not the request's word); returns what the mirror
    /// now expects of the request.
    pub(crate) fn spend(&mut self, now: Nanos, amount: u64, estimated: bool) -> Mark {
        let now = now.as_u64();
        self.spent_total = self.spent_total.saturating_add(amount);
        self.charges = self.charges.saturating_add(1);
        let after = self.spent_total;
        let quota = self.quota;
        let window = self.window.map(Nanos::as_u64);
        let generation = self.generation;
        match &mut self.model {
            Model::Rate {
                emission,
                tat,
                shifted,
                ..
            } => {
                *tat = (*tat)
                    .max(now)
                    .saturating_add(amount.saturating_mul(*emission));
                Mark {
                    generation,
                    base: tat.wrapping_sub(*shifted),
                    amount,
                    estimated,
                    after,
                }
            }
            Model::Window {
                remaining,
                reset_at,
                next_at,
                epoch,
                provisional,
                spent,
            } => {
                let rolled = *reset_at > 0 && now >= reset_at.saturating_add(FIXED_MARGIN.as_u64());
                if rolled && self.whole_window.is_some() {
                    self.awaiting = Some(now);
                }
                if rolled {
                    // a new window: the whole quota, until at most one
                    // window from now (the answers will say exactly when)
                    *epoch += 1;
                    *remaining = quota;
                    let span = window.or(self.whole_window).unwrap_or(self.longest_reset);
                    if span > 0 && quota.is_some() {
                        *reset_at = now.saturating_add(span);
                        *provisional = true;
                    } else {
                        *reset_at = 0;
                        *remaining = None;
                    }
                    *next_at = 0;
                    *spent = 0;
                }
                *spent = spent.saturating_add(amount);
                if let Some(r) = remaining {
                    *r = r.saturating_sub(amount);
                    if let Some(q) = quota {
                        if *r > 0 && r.saturating_mul(10) < q && *reset_at > now && amount > 0 {
                            *next_at = now + spread(*reset_at - now, amount, *r);
                        }
                    }
                }
                Mark {
                    generation,
                    base: *epoch,
                    amount,
                    estimated,
                    after,
                }
            }
        }
    }

    /// Folds what the server published into the mirror; `mark` is what
    /// the mirror expected of the answered request when it went out.
    ///
    /// Returns what the answered request was seen to spend, when its
    /// amount was an estimate and the answer tells (it came back alone,
    /// sent after the previous answer, so nothing else was charged in
    /// between).
    pub(crate) fn observe(
        &mut self,
        now: Nanos,
        p: &PolicyObservation,
        seen: &Seen,
        mark: Mark,
    ) -> Option<u64> {
        let now = now.as_u64();
        let seen = &self.in_units(seen, mark);
        if !self.fixed && self.looks_fixed(now, p, seen) {
            self.fixed = true;
        }
        self.shape(p);
        if let Some(t) = p.reset_in {
            self.longest_reset = self.longest_reset.max(t.as_u64());
        }
        let r = p.remaining?;
        let observed = self.observed_spend(now, r, seen, mark);
        if !seen.rejected {
            self.last_answer = Some((now, r));
        }
        self.guess_window(now, r, p, seen);
        let guess = self.whole_window;
        let quota = self.quota;
        let generation = self.generation;
        let per = self.per_request();
        match &mut self.model {
            Model::Rate {
                emission,
                span,
                tat,
                shifted,
            } => {
                let rate = Rate {
                    emission: *emission,
                    span: *span,
                    quota: quota.unwrap_or(1),
                };
                let valid = mark.generation != 0 && mark.generation == generation;
                let to = match seen.sent_at {
                    Some(sent) if valid => {
                        let expected = mark.base.wrapping_add(*shifted);
                        let at = rate.reconcile(expected, sent.as_u64(), now, r, seen, mark);
                        match at.checked_sub(expected) {
                            Some(later) => tat.saturating_add(later),
                            None => tat.saturating_sub(expected - at),
                        }
                    }
                    _ => rate.unmarked(*tat, now, r, seen),
                };
                // in-flight marks move with the mirror
                *shifted = shifted.wrapping_add(to.wrapping_sub(*tat));
                *tat = to;
            }
            Model::Window {
                remaining,
                reset_at,
                next_at,
                epoch,
                provisional,
                spent,
            } => {
                let marked =
                    mark.generation != 0 && mark.generation == generation && seen.sent_at.is_some();
                if marked && mark.base < *epoch {
                    // an answer about a window the mirror has left behind
                    return observed;
                }
                // the units the answered request itself was charged
                let this = if marked { mark.amount } else { 1 };
                if marked {
                    self.awaiting = None;
                }
                // the window opened before this answer came: it ends no
                // later than one window from now
                let bound = p
                    .reset_in
                    .map(|t| now.saturating_add(t.as_u64()))
                    .map(|b| guess.map_or(b, |w| b.min(now.saturating_add(w))));
                // the server restored more than this window can hold: it
                // is in a window the mirror has not seen open. Within one
                // window the server can hold more than the mirror only by
                // the other units the mirror spent since it last took the
                // server's count (answers overtake one another).
                let others = spent.saturating_sub(this);
                let restored =
                    marked && remaining.is_some_and(|local| r > local.saturating_add(others));
                // a window the server announces by its reset (fixed, or
                // only remaining and reset published) ends at one instant
                let one_instant = self.fixed || self.window.is_none();
                let tighten = one_instant
                    && marked
                    && !*provisional
                    && !seen.rejected
                    && !restored
                    && *reset_at > 0;
                match bound {
                    // every answer about the same window bounds its reset
                    // from above: keep the earliest
                    Some(b) if tighten => *reset_at = (*reset_at).min(b),
                    Some(b) => *reset_at = b,
                    None if *reset_at <= now => {
                        *reset_at = now.saturating_add(self.window.map(Nanos::as_u64).unwrap_or(0))
                    }
                    None => {}
                }
                *provisional = false;
                // what may still be charged after this answer's count: the
                // requests in flight, and those sent after it and answered
                let unserved = seen
                    .in_flight
                    .saturating_add(seen.sent_after.saturating_sub(seen.later));
                let r = if restored || (!marked && !seen.alone) {
                    r.saturating_sub(unserved)
                } else {
                    r.saturating_sub(seen.later)
                };
                // the server's count is taken as it is only when no other
                // unit was spent since the last one (nothing can have been
                // served after this request without the mirror knowing)
                let sole = seen.alone && *spent <= this;
                *remaining = Some(match *remaining {
                    Some(local) if !sole && !restored => local.min(r),
                    _ => {
                        *spent = 0;
                        r
                    }
                });
                if let (Some(q), Some(left)) = (quota, *remaining) {
                    if left > 0 && left.saturating_mul(10) < q && *reset_at > now {
                        let gap = spread(*reset_at - now, per, left + 1);
                        *next_at = (*next_at).max(now + gap);
                    }
                }
            }
        }
        observed
    }

    /// The average charge of one request, at least 1 (1 for a mirror of
    /// requests charged one each).
    fn per_request(&self) -> u64 {
        (self.spent_total / self.charges.max(1)).max(1)
    }

    /// An answer's relation to the other requests, counted in this
    /// mirror's units: the units charged after the answered request (its
    /// mark tells them exactly), the share of them still in flight, and
    /// the requests in flight at the average charge. A mirror of requests
    /// counts requests, as the answer does.
    fn in_units(&self, seen: &Seen, mark: Mark) -> Seen {
        if self.unit == crate::cost::REQUESTS {
            return *seen;
        }
        let per = self.per_request();
        let after = if mark.generation != 0 {
            self.spent_total.saturating_sub(mark.after)
        } else {
            seen.sent_after.saturating_mul(per)
        };
        let later = match seen.sent_after {
            0 => 0,
            n => (after as u128 * u128::from(seen.later.min(n)) / u128::from(n)) as u64,
        };
        Seen {
            sent_after: after,
            later,
            in_flight: seen.in_flight.saturating_mul(per),
            ..*seen
        }
    }

    /// What an answered request spent, read off the drop in the server's
    /// count since the previous answer, when its amount was only an
    /// estimate and nothing else can have been charged in between: it
    /// went out after that answer and came back alone, in the same window.
    fn observed_spend(&self, now: u64, r: u64, seen: &Seen, mark: Mark) -> Option<u64> {
        if !mark.estimated || mark.generation == 0 || !seen.alone || seen.rejected {
            return None;
        }
        let (at, prev) = self.last_answer?;
        if seen.sent_at?.as_u64() < at || now < at {
            return None;
        }
        let refill = match self.model {
            Model::Rate { emission, .. } => (now - at) / emission,
            Model::Window { reset_at, .. } if reset_at > now => 0,
            Model::Window { .. } => return None,
        };
        let spent = prev.saturating_add(refill).saturating_sub(r);
        Some(self.quota.map_or(spent, |q| spent.min(q)))
    }

    /// What is left, for diagnostics: whole units.
    pub(crate) fn available(&self, now: Nanos) -> Option<u64> {
        let now = now.as_u64();
        match self.model {
            Model::Rate {
                emission,
                span,
                tat,
                ..
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

/// A rate mirror's constants, for reading one answer.
#[derive(Clone, Copy, Debug)]
struct Rate {
    emission: u64,
    span: u64,
    quota: u64,
}

impl Rate {
    /// Whole units left at `at` if the theoretical arrival time is `tat`,
    /// the way the server's bucket counts them.
    fn remaining(&self, tat: u64, at: u64) -> u64 {
        self.span.saturating_sub(tat.saturating_sub(at)) / self.emission
    }

    /// The latest the server's theoretical arrival time can be, given that
    /// it had `r` whole units left at some moment no later than `now`.
    fn latest(&self, now: u64, r: u64) -> u64 {
        let debt = self.quota.saturating_sub(r.min(self.quota));
        now + debt.saturating_mul(self.emission).min(self.span)
    }

    /// The theoretical arrival time after a marked request, given that the
    /// mirror expected `expected`, the request went out at `sent` and the
    /// server answered `r` units left, received at `now`; `mark` says what
    /// the request was charged, and whether that was an estimate.
    fn reconcile(
        &self,
        expected: u64,
        sent: u64,
        now: u64,
        r: u64,
        seen: &Seen,
        mark: Mark,
    ) -> u64 {
        if seen.rejected {
            // the server held more than the mirror did, by at least the
            // unit it refused: assume its count was read at `now`
            return expected.max(self.latest(now, r));
        }
        // the fewest units the mirror can have expected at the server
        let least = self.remaining(expected, sent);
        let mut at = expected;
        if r.saturating_add(seen.sent_after) < least {
            // clearly fewer: whole units spent elsewhere, same phase
            let missing = least - seen.sent_after - r;
            at = at.saturating_add(missing.saturating_mul(self.emission));
        } else if mark.estimated {
            // an estimate too high: the server holds more than the mirror
            // can have at the answer even before any later request (and a
            // unit more, for rounding); give back the excess, never more
            // than the estimate itself
            let most = self.remaining(expected, now);
            if r > most.saturating_add(1) {
                let back = (r - most - 1).min(mark.amount);
                at = at.saturating_sub(back.saturating_mul(self.emission));
            }
        }
        // the server charged this request before its answer came back (an
        // estimated amount may have been nothing)
        let charged = if mark.estimated { 0 } else { mark.amount };
        at.max(now.saturating_add(charged.saturating_mul(self.emission)))
    }

    /// Where an answer without a mark (the mirror expected nothing of it)
    /// puts `tat`: at the latest state the server can be in when that is
    /// later, or back to it when nothing else is in flight and the server
    /// is a whole unit more generous.
    fn unmarked(&self, tat: u64, now: u64, r: u64, seen: &Seen) -> u64 {
        // `latest` is never earlier than the server's own state (`r` is
        // rounded down and was computed before now), so taking the later of
        // the two never lets the mirror run ahead of the server.
        let observed = self.latest(now, r.saturating_sub(seen.later));
        let local = tat.max(now);
        let behind = seen.alone && observed.saturating_add(self.emission) <= local;
        if observed > local || behind {
            observed
        } else {
            tat
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
            unit: String::new(),
        }
    }

    #[test]
    fn rate_mirror_spends_seven_then_one_per_quarter_second() {
        let t0 = Nanos::from_secs(1_000);
        let mut m = Mirror::new(&pol(8, 2, 7, 1), None);
        m.observe(t0, &pol(8, 2, 7, 1), &Seen::unsent(true), Mark::default());
        for _ in 0..7 {
            assert_eq!(m.earliest(t0, Nanos::ZERO, 1), t0);
            m.spend(t0, 1, false);
        }
        assert_eq!(
            m.earliest(t0, Nanos::ZERO, 1),
            t0.saturating_add(Nanos::from_millis(250))
        );
    }

    #[test]
    fn the_pace_margin_is_a_constant_lag_not_a_slower_rate() {
        let t0 = Nanos::from_secs(1_000);
        let margin = Nanos::from_millis(20);
        let ms = |n: u64| t0.saturating_add(Nanos::from_millis(n));
        let mut m = Mirror::new(&pol(8, 2, 8, 0), None);
        m.observe(t0, &pol(8, 2, 8, 0), &Seen::unsent(true), Mark::default());
        // what is in the bucket goes at once: no margin without a wait
        for _ in 0..8 {
            assert_eq!(m.earliest(t0, margin, 1), t0);
            m.spend(t0, 1, false);
        }
        // in debt, each request goes 20 ms after its slot; 40 slots on,
        // still 20 ms: nothing accumulates
        for k in 1..=40u64 {
            let at = m.earliest(ms(250 * (k - 1) + 20), margin, 1);
            assert_eq!(at, ms(250 * k + 20), "slot {k}");
            m.spend(at, 1, false);
        }
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
            unit: String::new(),
        };
        let mut m = Mirror::new(&p, None);
        m.observe(t0, &p, &Seen::unsent(true), Mark::default());
        assert!(m.is_quota());
        m.spend(t0, 1, false);
        // 49 left over 5,000 s: about one every 102 s
        let next = m.earliest(t0, Nanos::ZERO, 1).saturating_sub(t0);
        assert_eq!(next.as_secs_floor(), 102);
    }

    #[test]
    fn window_mirror_waits_for_the_reset_when_empty() {
        let t0 = Nanos::from_secs(1_000);
        let mut p = pol(10, 60, 0, 30);
        p.window_s = None;
        p.quota = None;
        let mut m = Mirror::new(&p, None);
        m.observe(t0, &p, &Seen::unsent(true), Mark::default());
        assert_eq!(
            m.earliest(t0, Nanos::ZERO, 1),
            t0.saturating_add(Nanos::from_secs(30))
                .saturating_add(FIXED_MARGIN)
        );
    }

    const MS: u64 = 1_000_000;

    /// The mark of a request charged one unit, stated.
    const ONE: Mark = Mark {
        generation: 1,
        base: 0,
        amount: 1,
        estimated: false,
        after: 0,
    };

    /// 8 per 2 s: one unit every 250 ms.
    fn race_rate() -> Rate {
        Rate {
            emission: 250 * MS,
            span: 2_000 * MS,
            quota: 8,
        }
    }

    fn sent(after: u64) -> Seen {
        Seen {
            sent_at: Some(Nanos::ZERO),
            sent_after: after,
            ..Seen::default()
        }
    }

    #[test]
    fn an_answer_the_mirror_expected_leaves_it_where_it_is() {
        let rate = race_rate();
        let t0 = 1_000_000 * MS;
        // in debt: the request went out at the earliest instant, the bucket
        // empty after it; the server saw it 10 ms later and said r=0
        let expected = t0 + rate.span;
        assert_eq!(
            rate.reconcile(expected, t0, t0 + 20 * MS, 0, &sent(0), ONE),
            expected
        );
        // a rounded-down r one below what the mirror expects at the send
        // instant is still consistent when a later request may have been
        // served first
        assert_eq!(
            rate.reconcile(expected - 250 * MS, t0, t0 + 20 * MS, 0, &sent(1), ONE),
            expected - 250 * MS
        );
    }

    #[test]
    fn units_spent_elsewhere_move_the_mirror_by_whole_units_in_phase() {
        let rate = race_rate();
        let t0 = 1_000_000 * MS;
        // the mirror expects 5 left (3 spent, 7 ms into a refill); the
        // server says 2: someone else spent 3
        let expected = t0 + 3 * 250 * MS + 7 * MS;
        assert_eq!(rate.remaining(expected, t0), 4);
        let at = rate.reconcile(expected, t0, t0 + 30 * MS, 1, &sent(0), ONE);
        assert_eq!(at - expected, 3 * 250 * MS);
        assert_eq!((at - t0) % (250 * MS), 7 * MS, "the refill phase is kept");
    }

    #[test]
    fn the_first_of_a_burst_moves_the_phase_to_its_answer() {
        let rate = race_rate();
        let t0 = 1_000_000 * MS;
        // a full bucket: the server started its refill when the request
        // arrived, somewhere before the answer came back 40 ms later
        let at = rate.reconcile(t0 + 250 * MS, t0, t0 + 40 * MS, 7, &sent(7), ONE);
        assert_eq!(at, t0 + 290 * MS);
    }

    #[test]
    fn a_429_puts_the_mirror_a_whole_window_past_the_answer() {
        let rate = race_rate();
        let t0 = 1_000_000 * MS;
        let seen = Seen {
            rejected: true,
            ..sent(0)
        };
        let at = rate.reconcile(t0 + rate.span, t0, t0 + 20 * MS, 0, &seen, ONE);
        assert_eq!(at, t0 + 20 * MS + rate.span);
    }

    #[test]
    fn marks_from_an_older_model_are_not_read() {
        let t0 = Nanos::from_secs(1_000);
        let mut m = Mirror::new(&pol(8, 2, 8, 0), None);
        m.observe(t0, &pol(8, 2, 8, 0), &Seen::unsent(true), Mark::default());
        let mark = m.spend(t0, 1, false);
        // the server changes its policy: a new model, the mark is stale
        m.observe(t0, &pol(10, 2, 10, 0), &Seen::unsent(true), Mark::default());
        let before = m.earliest(t0, Nanos::ZERO, 1);
        let seen = Seen {
            sent_at: Some(t0),
            ..Seen::default()
        };
        m.observe(t0, &pol(10, 2, 10, 0), &seen, mark);
        assert_eq!(m.earliest(t0, Nanos::ZERO, 1), before);
    }

    proptest::proptest! {
        /// Whatever the server answers, reading it never makes a rate
        /// mirror more generous than it expected, and never leaves it
        /// earlier than the answer's own charge.
        #[test]
        fn reconciling_only_tightens(q in 1u64..50, w in 1u64..10, debt in 0u64..50,
                                     rtt_ms in 0u64..500, r in 0u64..60, after in 0u64..10,
                                     rejected in proptest::bool::ANY) {
            let rate = Rate { emission: w * 1_000 * MS / q, span: w * 1_000 * MS, quota: q };
            let t0 = 1_000_000 * MS;
            let expected = t0 + debt.min(q) * rate.emission;
            let now = t0 + rtt_ms * MS;
            let seen = Seen { rejected, ..sent(after) };
            let at = rate.reconcile(expected, t0, now, r, &seen, ONE);
            proptest::prop_assert!(at >= expected);
            // charged no later than answered (a rejection charged nothing,
            // but leaves the mirror no earlier than the server's count)
            let floor = if rejected { rate.latest(now, r) } else { now + rate.emission };
            proptest::prop_assert!(at >= floor);
            // an answer that agrees with the expectation moves nothing
            // but the phase floor
            if !rejected && r + after >= rate.remaining(expected, t0) {
                proptest::prop_assert_eq!(at, expected.max(now + rate.emission));
            }
        }
    }
}
