//! Per-scope state: the mirrored policies, the pause a throttle imposes on
//! every request of the scope, the header-absent spacing and escalation.

use std::collections::{BTreeSet, HashMap};

use paceline_core::Nanos;
use smallvec::SmallVec;

use crate::bucket::{Mark, Mirror, Seen};
use crate::cost::{Cost, Estimate, REQUESTS};
use crate::event::{Event, Mode};
use crate::observe::PolicyObservation;
use crate::throttle::AdaptiveThrottle;

/// At most this many endpoints keep mirrors of per-endpoint policies in
/// one scope; past it, endpoints whose windows have reset go first, then
/// the least recently used.
pub(crate) const MAX_ENDPOINTS: usize = 1_024;

/// What the mirrors of a scope expected of one request: the account-wide
/// ones in mirror order, and those of the request's endpoint (tagged with
/// the endpoint entry they belong to, which may be evicted meanwhile).
#[derive(Clone, Debug, Default)]
pub(crate) struct Marks {
    account: SmallVec<[Mark; 2]>,
    endpoint: Option<(u64, SmallVec<[Mark; 2]>)>,
}

/// The mirrors of the per-endpoint policies of one endpoint.
#[derive(Debug)]
pub(crate) struct Endpoint {
    /// Unique within the scope, so marks never outlive their entry.
    id: u64,
    /// The scope's use counter when the endpoint was last used.
    used: u64,
    pub(crate) mirrors: Vec<Mirror>,
}

impl Endpoint {
    /// Whether every window of the endpoint has reset: forgetting it loses
    /// nothing the next answer would not tell again.
    fn is_reset(&self, now: Nanos) -> bool {
        self.mirrors.iter().all(|m| m.is_reset(now))
    }
}

/// Why a request has to wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Hold {
    Pause,
    /// An account-wide mirror (index into `Scope::mirrors`).
    Mirror(usize),
    /// A mirror of the request's endpoint (index into its mirrors).
    Endpoint(usize),
    Gap,
}

#[derive(Debug)]
pub(crate) struct Scope {
    pub(crate) name: String,
    pub(crate) mode: Mode,
    /// Mirrors of the account-wide policies (never per endpoint).
    pub(crate) mirrors: Vec<Mirror>,
    /// Mirrors of per-endpoint policies, by path, at most `max_endpoints`.
    pub(crate) endpoints: HashMap<String, Endpoint>,
    pub(crate) max_endpoints: usize,
    endpoint_ids: u64,
    uses: u64,
    pub(crate) throttle: AdaptiveThrottle,
    pub(crate) in_flight: BTreeSet<u64>,
    /// The latest request (by sequence) whose answer came back.
    pub(crate) landed: Option<u64>,
    /// When the request that probes an unseeded scope went out.
    pub(crate) probe_sent_at: Nanos,
    pub(crate) next_seq: u64,
    pub(crate) pause_until: Nanos,
    pub(crate) pause_len: Nanos,
    pub(crate) pause_spread: bool,
    /// The policy the server named for the pause, when it did.
    pub(crate) pause_policy: Option<String>,
    /// Header-absent spacing between requests (zero: unpaced).
    pub(crate) gap: Nanos,
    pub(crate) gap_next: Nanos,
    pub(crate) gap_successes: u32,
    /// The spacing at which the last 429 came, and when: the spacing does
    /// not shrink back below 5/4 of it for a minute.
    pub(crate) gap_floor: Nanos,
    pub(crate) gap_floor_at: Nanos,
    pub(crate) last_gap_429: Nanos,
    /// Requests sent before this sequence number went out under an older,
    /// looser spacing: their 429s do not tighten it again.
    pub(crate) regime_seq: u64,
    pub(crate) factor: u32,
    pub(crate) obeyed_429s: u32,
    pub(crate) restore_run: u32,
    pub(crate) escalated_at: Nanos,
    pub(crate) reset_window: Nanos,
    pub(crate) headerless: u32,
    pub(crate) last_429: Option<(Nanos, Vec<(String, String)>)>,
    /// The number and idempotency key of the last attempt sent, and of the
    /// one that drew the last 429.
    pub(crate) last_attempt: Option<(u32, Option<String>)>,
    pub(crate) last_429_attempt: Option<(u32, Option<String>)>,
    pub(crate) drops: u64,
    pub(crate) requests: u64,
    pub(crate) retries: u64,
    /// What requests spend in each unit other than requests, by unit name.
    pub(crate) units: HashMap<String, UnitStat>,
}

/// What the requests of a scope spent in one unit.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct UnitStat {
    /// What a request without a stated amount is charged.
    pub(crate) estimate: Estimate,
    /// Units charged, stated and estimated (retries included).
    pub(crate) charged: u64,
    /// Attempts whose amount was stated.
    pub(crate) stated: u64,
    /// Attempts charged the estimate.
    pub(crate) estimated: u64,
}

/// A request's amount for one mirror: what its cost states (by the
/// policy's name, then its unit), else 1 request, else the unit's
/// estimate (never more than the policy's quota).
fn amount_for(units: &HashMap<String, UnitStat>, m: &Mirror, cost: &Cost) -> (u64, bool) {
    if let Some(n) = cost.for_policy(&m.name, &m.unit) {
        return (n, false);
    }
    if m.unit == REQUESTS {
        return (1, false);
    }
    let e = units.get(&m.unit).map_or(1, |u| u.estimate.charge());
    (e.min(m.quota.unwrap_or(u64::MAX)), true)
}

/// A cost more than a policy can ever hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TooCostly {
    pub(crate) policy: String,
    pub(crate) unit: String,
    pub(crate) amount: u64,
    pub(crate) quota: u64,
}

impl Scope {
    pub(crate) fn new(name: &str, throttle: AdaptiveThrottle) -> Self {
        Scope {
            name: name.to_string(),
            mode: Mode::Unseeded,
            mirrors: Vec::new(),
            endpoints: HashMap::new(),
            max_endpoints: MAX_ENDPOINTS,
            endpoint_ids: 0,
            uses: 0,
            throttle,
            in_flight: BTreeSet::new(),
            landed: None,
            probe_sent_at: Nanos::ZERO,
            next_seq: 0,
            pause_until: Nanos::ZERO,
            pause_len: Nanos::ZERO,
            pause_spread: false,
            pause_policy: None,
            gap: Nanos::ZERO,
            gap_next: Nanos::ZERO,
            gap_successes: 0,
            gap_floor: Nanos::ZERO,
            gap_floor_at: Nanos::ZERO,
            last_gap_429: Nanos::ZERO,
            regime_seq: 0,
            factor: 1,
            obeyed_429s: 0,
            restore_run: 0,
            escalated_at: Nanos::ZERO,
            reset_window: Nanos::SECOND,
            headerless: 0,
            last_429: None,
            last_attempt: None,
            last_429_attempt: None,
            drops: 0,
            requests: 0,
            retries: 0,
            units: HashMap::new(),
        }
    }

    /// The first mirror a request to `path` costing `cost` can never fit
    /// (its stated amount is above the published quota), if any.
    pub(crate) fn too_costly(&self, path: &str, cost: &Cost) -> Option<TooCostly> {
        if cost.is_empty() {
            return None;
        }
        let endpoint = self
            .endpoints
            .get(path)
            .into_iter()
            .flat_map(|e| &e.mirrors);
        self.mirrors.iter().chain(endpoint).find_map(|m| {
            let (amount, estimated) = amount_for(&self.units, m, cost);
            let quota = m.quota.filter(|q| *q > 0)?;
            (!estimated && amount > quota).then(|| TooCostly {
                policy: m.name.clone(),
                unit: m.unit.clone(),
                amount,
                quota,
            })
        })
    }

    /// The mirror a hold names, for a request to `path`.
    pub(crate) fn held(&self, hold: Option<Hold>, path: &str) -> Option<&Mirror> {
        match hold? {
            Hold::Mirror(i) => self.mirrors.get(i),
            Hold::Endpoint(i) => self.endpoints.get(path)?.mirrors.get(i),
            Hold::Pause | Hold::Gap => None,
        }
    }

    /// Every mirror: the account-wide ones, then those of each endpoint.
    pub(crate) fn all_mirrors(&self) -> impl Iterator<Item = &Mirror> {
        self.mirrors
            .iter()
            .chain(self.endpoints.values().flat_map(|e| e.mirrors.iter()))
    }

    /// The earliest instant a request to `path` costing `cost` may go:
    /// when every mirror of every unit has room for its amount; and what
    /// holds it.
    pub(crate) fn earliest(
        &self,
        now: Nanos,
        path: &str,
        margin: Nanos,
        cost: &Cost,
    ) -> (Nanos, Option<Hold>) {
        let mut until = now;
        let mut hold = None;
        if self.pause_until > until {
            until = self.pause_until;
            hold = Some(Hold::Pause);
        }
        for (i, m) in self.mirrors.iter().enumerate() {
            let e = m.earliest(now, margin, amount_for(&self.units, m, cost).0);
            if e > until {
                until = e;
                hold = Some(Hold::Mirror(i));
            }
        }
        if let Some(ep) = self.endpoints.get(path) {
            for (i, m) in ep.mirrors.iter().enumerate() {
                let e = m.earliest(now, margin, amount_for(&self.units, m, cost).0);
                if e > until {
                    until = e;
                    hold = Some(Hold::Endpoint(i));
                }
            }
        }
        if self.gap_next > until {
            until = self.gap_next;
            hold = Some(Hold::Gap);
        }
        (until, hold)
    }

    /// The spacing between requests now in force (escalation included).
    pub(crate) fn effective_gap(&self) -> Nanos {
        let base = match self.mode {
            Mode::HeaderAbsent => self.gap,
            _ if self.factor > 1 => self
                .all_mirrors()
                .filter_map(Mirror::emission)
                .max()
                .unwrap_or(Nanos::from_millis(100)),
            _ => Nanos::ZERO,
        };
        Nanos::new(base.as_u64().saturating_mul(u64::from(self.factor)))
    }

    /// Charges one request sent at `now` to `path`, costing `cost`;
    /// returns its sequence and what each mirror expects of it.
    pub(crate) fn spend(&mut self, now: Nanos, path: &str, cost: &Cost) -> (u64, Marks) {
        let mut marks = Marks::default();
        let units = &self.units;
        for m in self.mirrors.iter_mut() {
            let (n, est) = amount_for(units, m, cost);
            marks.account.push(m.spend(now, n, est));
        }
        if !self.endpoints.is_empty() {
            self.uses += 1;
            if let Some(ep) = self.endpoints.get_mut(path) {
                ep.used = self.uses;
                let spent = ep
                    .mirrors
                    .iter_mut()
                    .map(|m| {
                        let (n, est) = amount_for(units, m, cost);
                        m.spend(now, n, est)
                    })
                    .collect();
                marks.endpoint = Some((ep.id, spent));
            }
        }
        self.count_units(cost);
        let gap = self.effective_gap();
        if gap > Nanos::ZERO {
            self.gap_next = now.saturating_add(gap);
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.in_flight.insert(seq);
        self.requests += 1;
        (seq, marks)
    }

    /// Counts what one attempt costing `cost` spends in each unit the
    /// scope mirrors (other than requests); a stated amount is also a
    /// sample of what requests spend.
    fn count_units(&mut self, cost: &Cost) {
        let mut seen: SmallVec<[&str; 4]> = SmallVec::new();
        let endpoint_mirrors = self.endpoints.values().flat_map(|e| &e.mirrors);
        for m in self.mirrors.iter().chain(endpoint_mirrors) {
            if m.unit == REQUESTS || seen.contains(&m.unit.as_str()) {
                continue;
            }
            seen.push(&m.unit);
            let stated = cost.get(&m.unit);
            let (n, _) = amount_for(&self.units, m, cost);
            let u = self.units.entry(m.unit.clone()).or_default();
            u.charged = u.charged.saturating_add(n);
            match stated {
                Some(n) => {
                    u.stated += 1;
                    u.estimate.add(n);
                }
                None => u.estimated += 1,
            }
        }
    }

    /// Removes an attempt sent at `sent_at` from the in-flight set; says
    /// how its answer relates to the other requests: how many were sent
    /// after it (still in flight, and in all), and whether it may be
    /// trusted as the latest word (nothing else in flight, and no answer
    /// to a later request already in).
    pub(crate) fn land(&mut self, seq: u64, sent_at: Nanos) -> Seen {
        self.in_flight.remove(&seq);
        let later = self.in_flight.range(seq + 1..).count() as u64;
        let newest = self.landed.is_none_or(|l| seq > l);
        if newest {
            self.landed = Some(seq);
        }
        Seen {
            sent_at: Some(sent_at),
            later,
            sent_after: self.next_seq.saturating_sub(seq + 1),
            alone: newest && self.in_flight.is_empty(),
            rejected: false,
            in_flight: self.in_flight.len() as u64,
        }
    }

    pub(crate) fn set_mode(&mut self, to: Mode, min_gap: Nanos, events: &mut Vec<Event>) {
        if self.mode != to {
            if to == Mode::HeaderAbsent {
                // nothing published: start conservative, speed up on success
                self.gap = self.gap.max(min_gap);
                self.regime_seq = self.next_seq;
            }
            events.push(Event::ModeChange {
                scope: self.name.clone(),
                from: self.mode,
                to,
            });
            self.mode = to;
        }
    }

    /// Folds the published policies into the mirrors; `marks` are what
    /// the mirrors expected of the answered request (empty: nothing).
    pub(crate) fn observe(
        &mut self,
        now: Nanos,
        path: &str,
        policies: &[PolicyObservation],
        seen: &Seen,
        marks: &Marks,
    ) {
        let mut sampled: SmallVec<[&str; 4]> = SmallVec::new();
        for p in policies.iter().filter(|p| p.is_mirrored()) {
            let same = |m: &Mirror| m.name == p.name && m.unit == p.unit_name();
            let (window, quota, observed) = if p.per_endpoint {
                let ep = self.endpoint_mut(now, path);
                let i = match ep.mirrors.iter().position(same) {
                    Some(i) => i,
                    None => {
                        ep.mirrors.push(Mirror::new(p, Some(path.to_string())));
                        ep.mirrors.len() - 1
                    }
                };
                let mark = match &marks.endpoint {
                    Some((id, m)) if *id == ep.id => m.get(i).copied().unwrap_or_default(),
                    _ => Mark::default(),
                };
                let m = &mut ep.mirrors[i];
                let observed = m.observe(now, p, seen, mark);
                (m.window, m.is_quota(), observed)
            } else {
                let i = match self.mirrors.iter().position(same) {
                    Some(i) => i,
                    None => {
                        self.mirrors.push(Mirror::new(p, None));
                        self.mirrors.len() - 1
                    }
                };
                let mark = marks.account.get(i).copied().unwrap_or_default();
                let m = &mut self.mirrors[i];
                let observed = m.observe(now, p, seen, mark);
                (m.window, m.is_quota(), observed)
            };
            if let (Some(w), false) = (window, quota) {
                self.reset_window = self.reset_window.max(w);
            }
            // one sample a unit an answer (several policies may count it)
            let unit = p.unit_name();
            if let (Some(spent), false) = (observed, sampled.contains(&unit)) {
                sampled.push(unit);
                self.units
                    .entry(unit.to_string())
                    .or_default()
                    .estimate
                    .add(spent);
            }
        }
    }

    /// The entry of `path`, made (and room made for it) if need be.
    fn endpoint_mut(&mut self, now: Nanos, path: &str) -> &mut Endpoint {
        self.uses += 1;
        let uses = self.uses;
        if !self.endpoints.contains_key(path) {
            self.make_room(now);
            self.endpoint_ids += 1;
            self.endpoints.insert(
                path.to_string(),
                Endpoint {
                    id: self.endpoint_ids,
                    used: uses,
                    mirrors: Vec::new(),
                },
            );
        }
        let ep = self
            .endpoints
            .get_mut(path)
            .expect("the entry was just made");
        ep.used = uses;
        ep
    }

    /// Makes room for one more endpoint: when full, forgets every endpoint
    /// whose windows have all reset, or else the least recently used one.
    fn make_room(&mut self, now: Nanos) {
        let cap = self.max_endpoints.max(1);
        if self.endpoints.len() < cap {
            return;
        }
        self.endpoints.retain(|_, e| !e.is_reset(now));
        if self.endpoints.len() < cap {
            return;
        }
        let oldest = self
            .endpoints
            .iter()
            .min_by_key(|(_, e)| e.used)
            .map(|(k, _)| k.clone());
        if let Some(k) = oldest {
            self.endpoints.remove(&k);
        }
    }

    /// Extends the pause of the whole scope to `until`, for `policy` when
    /// the server named the one that ran out.
    pub(crate) fn pause(&mut self, now: Nanos, until: Nanos, spread: bool, policy: Option<&str>) {
        if until > self.pause_until {
            self.pause_until = until;
            self.pause_len = until.saturating_sub(now);
            self.pause_spread = spread;
            self.pause_policy = policy.map(str::to_string);
        }
    }

    /// A 429 although the request was sent on the mirror's word.
    pub(crate) fn obeyed_429(
        &mut self,
        now: Nanos,
        seq: u64,
        escalate_after: u32,
        max_factor: u32,
        events: &mut Vec<Event>,
    ) {
        self.restore_run = 0;
        if seq < self.regime_seq {
            return;
        }
        self.obeyed_429s += 1;
        if self.obeyed_429s >= escalate_after && self.factor < max_factor {
            self.factor = (self.factor * 2).min(max_factor);
            self.obeyed_429s = 0;
            self.escalated_at = now;
            self.regime_seq = self.next_seq;
            events.push(Event::Escalated {
                scope: self.name.clone(),
                factor: self.factor,
            });
        }
    }

    /// A 429 in header-absent mode: remember the spacing that was too
    /// tight, and double it.
    pub(crate) fn absent_429(&mut self, now: Nanos, seq: u64, min_gap: Nanos) {
        self.gap_successes = 0;
        self.last_gap_429 = now;
        if seq < self.regime_seq {
            return;
        }
        self.regime_seq = self.next_seq;
        self.gap_floor = self.gap_floor.max(self.gap);
        self.gap_floor_at = now;
        let doubled = Nanos::new(self.gap.as_u64().saturating_mul(2));
        self.gap = doubled.max(min_gap).min(Nanos::from_secs(60));
    }

    /// After ten successes spanning at least two seconds since the last
    /// 429, shrink the header-absent spacing by an eighth (a quarter while
    /// the scope has never drawn a 429), not below 5/4 of
    /// the spacing that last drew a 429 (that floor halves after a quiet
    /// minute, so a provider that raised its limit is found again).
    fn absent_restore(&mut self, now: Nanos) {
        self.gap_successes += 1;
        if self.gap_successes < 10 || now.saturating_sub(self.last_gap_429) < Nanos::from_secs(2) {
            return;
        }
        self.gap_successes = 0;
        if now.saturating_sub(self.gap_floor_at) >= Nanos::from_secs(60) {
            self.gap_floor = Nanos::new(self.gap_floor.as_u64() / 2);
            self.gap_floor_at = now;
        }
        let floor = Nanos::new(self.gap_floor.as_u64() / 4 * 5);
        // never rejected yet: speed up faster (by a quarter)
        let keep = if self.gap_floor == Nanos::ZERO { 6 } else { 7 };
        let shrunk = Nanos::new(self.gap.as_u64() / 8 * keep).max(floor);
        self.gap = if shrunk < Nanos::from_millis(10) {
            Nanos::ZERO
        } else {
            shrunk
        };
    }

    /// An accepted response.
    pub(crate) fn success(&mut self, now: Nanos, restore_after: u32, events: &mut Vec<Event>) {
        self.obeyed_429s = 0;
        if self.factor > 1 {
            self.restore_run += 1;
            let spans = now.saturating_sub(self.escalated_at)
                >= Nanos::new(self.reset_window.as_u64().saturating_mul(2));
            if self.restore_run >= restore_after && spans {
                self.factor /= 2;
                self.restore_run = 0;
                self.escalated_at = now;
                events.push(Event::Restored {
                    scope: self.name.clone(),
                    factor: self.factor,
                });
            }
        }
        if self.mode == Mode::HeaderAbsent && self.gap > Nanos::ZERO {
            self.absent_restore(now);
        }
    }
}
