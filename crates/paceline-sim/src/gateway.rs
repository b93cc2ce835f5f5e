//! The simulated gateway: an edge with finite capacity, injected faults,
//! and the real limiter behind them.
//!
//! Each request passes three stages, in the order a real deployment has
//! them: the [`Edge`] (capacity, shed per key), then any active [`Fault`]
//! (a blip of 429s or 503s that charges nothing), then the plan checked by
//! [`paceline_core::check_words`] on the key's own state words. Keys are
//! small integers, so state lives in one flat vector and a check costs no
//! hashing.
//!
//! ```
//! use paceline_core::{Nanos, Plan, Policy};
//! use paceline_sim::gateway::{Gateway, Verdict};
//!
//! let plan = Plan::new("race", vec![Policy::token_bucket("burst", 8, 2).unwrap()]).unwrap();
//! let mut gw = Gateway::new(plan, 1);
//! let t = Nanos::from_secs(1);
//! let served = (0..10).filter(|_| gw.handle(0, 1, t).verdict == Verdict::Served).count();
//! assert_eq!(served, 8);
//! assert_eq!(gw.handle(0, 1, t).status(), Some(429));
//! ```

use http::{HeaderMap, HeaderValue, StatusCode};
use paceline_core::{check_words, Decision, Nanos, Outcome, Plan, PolicyKind};
use paceline_wire::emit::{self, Dialects};

use crate::edge::Edge;

/// A stretch of time during which every request gets the same failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    /// When the blip starts (inclusive).
    pub from: Nanos,
    /// When it ends (exclusive).
    pub until: Nanos,
    /// The status answered: 429 or 503.
    pub status: u16,
    /// The `Retry-After` sent with it, in seconds (0 sends none).
    pub retry_after_s: u64,
}

impl Fault {
    /// Whether the fault applies at `now`.
    pub fn covers(&self, now: Nanos) -> bool {
        self.from <= now && now < self.until
    }
}

/// What the gateway did with one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verdict {
    /// Admitted and charged: 200.
    Served,
    /// The limiter said no: 429 (burst or quota, per the denial).
    Limited {
        /// Burst or quota.
        kind: PolicyKind,
        /// The `Retry-After` the response carries, whole seconds.
        retry_after_s: u64,
    },
    /// The request can never fit: 400.
    TooBig,
    /// An injected failure answered it.
    Fault {
        /// 429 or 503.
        status: u16,
        /// `Retry-After` seconds (0: none).
        retry_after_s: u64,
    },
    /// Shed at the edge: no response at all (a reset connection).
    Dropped,
}

/// One request's fate, with the limiter's decision when it ran.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Answer {
    /// What happened.
    pub verdict: Verdict,
    /// The limiter's decision (absent when the edge or a fault answered).
    pub decision: Option<Decision>,
}

impl Answer {
    /// The HTTP status, or `None` for a request dropped at the edge.
    pub fn status(&self) -> Option<u16> {
        match self.verdict {
            Verdict::Served => Some(200),
            Verdict::Limited { .. } => Some(429),
            Verdict::TooBig => Some(400),
            Verdict::Fault { status, .. } => Some(status),
            Verdict::Dropped => None,
        }
    }
}

/// Counters of what the gateway answered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct GatewayStats {
    /// Requests that reached the gateway.
    pub received: u64,
    /// 200s.
    pub served: u64,
    /// 429s from the limiter.
    pub limited: u64,
    /// Answers from injected faults.
    pub faulted: u64,
    /// Shed at the edge.
    pub dropped: u64,
    /// Calls to the shared count: one a decision when the instances
    /// share one count exactly, the leases (taken, ahead of need too, and
    /// given back) when they lease ([`Counting::Leased`]); none for a
    /// count per instance.
    pub round_trips: u64,
}

/// How the instances of a gateway with several count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Counting {
    /// Each instance keeps its own counters (the in-memory store of every
    /// process): a key's budget is granted once per instance.
    PerInstance,
    /// The instances share one count (a shared store such as Redis).
    Shared,
    /// The instances share one count and lease slices of it (the plan's
    /// policies with `Share::Leased`), deciding from them locally, each
    /// slice living `slice` ([`paceline_core::lease`]).
    Leased {
        /// A slice's time.
        slice: Nanos,
    },
}

/// Each instance's slices (a clone starts with none: its units stay
/// charged in the shared count, as an instance that restarts leaves them).
struct InstanceLeases(Vec<paceline_core::lease::Leases>);

impl InstanceLeases {
    fn new(instances: usize, slice: Nanos) -> Self {
        InstanceLeases(
            (0..instances)
                .map(|_| paceline_core::lease::Leases::new(slice))
                .collect(),
        )
    }
}

impl Clone for InstanceLeases {
    fn clone(&self) -> Self {
        let slice = self
            .0
            .first()
            .map_or(Nanos::from_millis(100), |l| l.interval());
        InstanceLeases::new(self.0.len(), slice)
    }
}

impl std::fmt::Debug for InstanceLeases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(&self.0).finish()
    }
}

/// The simulated gateway for keys `0..keys`, all on one plan.
#[derive(Clone, Debug)]
pub struct Gateway {
    plan: Plan,
    stride: usize,
    keys: usize,
    words: Vec<u64>,
    instances: usize,
    counting: Counting,
    next: usize,
    /// The balancer's order of instances, repeated (none: round robin).
    route: Vec<usize>,
    leases: Option<InstanceLeases>,
    edge: Option<Edge>,
    faults: Vec<Fault>,
    silent: bool,
    stats: GatewayStats,
}

impl Gateway {
    /// A gateway checking `keys` keys against `plan`, with unlimited
    /// capacity and no faults.
    pub fn new(plan: Plan, keys: usize) -> Self {
        let stride = plan.state_words();
        Gateway {
            plan,
            stride,
            keys,
            words: vec![0; stride * keys],
            instances: 1,
            counting: Counting::Shared,
            next: 0,
            route: Vec::new(),
            leases: None,
            edge: None,
            faults: Vec::new(),
            silent: false,
            stats: GatewayStats::default(),
        }
    }

    /// Limits the edge to `per_s` requests per second, shed per key.
    pub fn with_capacity(mut self, per_s: u64) -> Self {
        self.edge = Some(Edge::new(per_s, self.keys));
        self
    }

    /// Runs `instances` gateway instances behind a round-robin balancer
    /// (each request goes to the next instance), counting as `counting`
    /// says. With [`Counting::PerInstance`] every instance holds its own
    /// state for every key, as processes with in-memory stores do.
    ///
    /// ```
    /// use paceline_core::{Nanos, Plan, Policy};
    /// use paceline_sim::gateway::{Counting, Gateway, Verdict};
    ///
    /// let plan = Plan::new("p", vec![Policy::token_bucket("burst", 8, 2).unwrap()]).unwrap();
    /// let t = Nanos::from_secs(1);
    /// let mut alone = Gateway::new(plan.clone(), 1).with_instances(3, Counting::PerInstance);
    /// let mut shared = Gateway::new(plan, 1).with_instances(3, Counting::Shared);
    /// let served = |gw: &mut Gateway| (0..100).filter(|_| gw.handle(0, 1, t).verdict == Verdict::Served).count();
    /// assert_eq!(served(&mut alone), 24);
    /// assert_eq!(served(&mut shared), 8);
    /// ```
    pub fn with_instances(mut self, instances: usize, counting: Counting) -> Self {
        self.instances = instances.max(1);
        self.counting = counting;
        let copies = match counting {
            Counting::PerInstance => self.instances,
            _ => 1,
        };
        self.words = vec![0; self.stride * self.keys * copies];
        self.leases = match counting {
            Counting::Leased { slice } => Some(InstanceLeases::new(self.instances, slice)),
            _ => None,
        };
        self
    }

    /// Sends the instances unequal shares of the requests: instance `i`
    /// takes `weights[i]` of every `sum(weights)` (in turn, the same
    /// order every cycle).
    pub fn with_weights(mut self, weights: &[u32]) -> Self {
        self.route = weights
            .iter()
            .enumerate()
            .take(self.instances)
            .flat_map(|(i, &w)| std::iter::repeat_n(i, w as usize))
            .collect();
        self
    }

    /// The instance that takes the next request.
    fn instance(&self) -> usize {
        match self.route.is_empty() {
            true => self.next % self.instances,
            false => self.route[self.next % self.route.len()],
        }
    }

    /// The number of instances behind the balancer.
    pub fn instances(&self) -> usize {
        self.instances
    }

    /// Where `key`'s state sits in the instance that takes the next
    /// request.
    fn state_range(&self, key: usize) -> std::ops::Range<usize> {
        let copy = match self.counting {
            Counting::PerInstance => self.instance(),
            _ => 0,
        };
        let at = (copy * self.keys + key) * self.stride;
        at..at + self.stride
    }

    /// Adds an injected fault.
    pub fn with_fault(mut self, fault: Fault) -> Self {
        self.faults.push(fault);
        self
    }

    /// A backend that publishes nothing: no rate-limit headers, and a
    /// request over the plan is shed with a bare 503 (no `Retry-After`), the
    /// way an overloaded service without a limiter answers.
    pub fn silent(mut self) -> Self {
        self.silent = true;
        self
    }

    /// The plan every key is checked against.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// What the gateway has answered so far.
    pub fn stats(&self) -> GatewayStats {
        self.stats
    }

    /// Handles a request of `cost` from `key` arriving at `now`.
    pub fn handle(&mut self, key: usize, cost: u64, now: Nanos) -> Answer {
        self.stats.received += 1;
        if let Some(edge) = &mut self.edge {
            if !edge.admit(key, now) {
                self.stats.dropped += 1;
                return Answer {
                    verdict: Verdict::Dropped,
                    decision: None,
                };
            }
        }
        if let Some(f) = self.faults.iter().find(|f| f.covers(now)) {
            self.stats.faulted += 1;
            return Answer {
                verdict: Verdict::Fault {
                    status: f.status,
                    retry_after_s: f.retry_after_s,
                },
                decision: None,
            };
        }
        let range = self.state_range(key);
        let instance = self.instance();
        self.next = self.next.wrapping_add(1);
        let d = match self.counting {
            Counting::Leased { .. } => self.leased(instance, key, cost, now),
            Counting::Shared => {
                self.stats.round_trips += 1;
                check_words(&self.plan, &mut self.words[range], now, cost).0
            }
            _ => check_words(&self.plan, &mut self.words[range], now, cost).0,
        };
        if self.silent && !d.is_allowed() {
            self.stats.faulted += 1;
            return Answer {
                verdict: Verdict::Fault {
                    status: 503,
                    retry_after_s: 0,
                },
                decision: None,
            };
        }
        let verdict = match d.outcome {
            Outcome::Allowed => Verdict::Served,
            Outcome::Denied(den) => Verdict::Limited {
                kind: den.kind,
                retry_after_s: den.retry_after_secs(),
            },
            Outcome::CostExceedsBurst { .. } => Verdict::TooBig,
        };
        match verdict {
            Verdict::Served => self.stats.served += 1,
            Verdict::Limited { .. } => self.stats.limited += 1,
            _ => {}
        }
        Answer {
            verdict,
            decision: Some(d),
        }
    }

    /// A decision of `instance` from its slices of `key`, taking a slice
    /// from the shared count when they cannot answer (the same steps as
    /// the Redis store's, on the simulator's shared state).
    fn leased(&mut self, instance: usize, key: usize, cost: u64, now: Nanos) -> Decision {
        use paceline_core::lease::{max_slice, Answered, Local};
        let range = self.state_range(key);
        let leases = &self.leases.as_ref().expect("leased counting has leases").0[instance];
        let plan = &self.plan;
        // slices whose time is up give back what they did not use
        for (_, h, units, at) in leases.sweep(now).unwrap_or_default() {
            self.stats.round_trips += 1;
            let back = paceline_core::Cost::requests(units);
            let r = self.stride * h as usize;
            paceline_core::refund_words(plan, &mut self.words[r..r + self.stride], back, at, now);
            leases.returned(units);
        }
        let words = &mut self.words[range];
        let hash = key as u128;
        let max = max_slice(plan).unwrap_or(cost.max(1));
        let (want, give_back) = match leases.local(plan, max, hash, cost, now, true) {
            Some(Local::Decided(d, ahead)) => {
                if let Some(want) = ahead {
                    // taken ahead of need: in the simulator, at once
                    self.stats.round_trips += 1;
                    let (taken, _) = check_words(plan, words, now, want);
                    let _ = leases.answer(plan, hash, want, 0, now, taken, false);
                }
                return d;
            }
            Some(Local::Ask { want, give_back }) => (want, give_back),
            // (a slice is answered at once here: never on its way)
            Some(Local::Wait) | None => (cost.max(1), None),
        };
        if let Some((units, at)) = give_back {
            self.stats.round_trips += 1;
            let back = paceline_core::Cost::requests(units);
            paceline_core::refund_words(plan, words, back, at, now);
            leases.returned(units);
        }
        let mut asked = want;
        loop {
            self.stats.round_trips += 1;
            let (d, _) = check_words(plan, words, now, asked);
            match leases.answer(plan, hash, asked, cost, now, d, asked == want) {
                Answered::Done(d) => return d,
                Answered::Retry(units) => asked = units,
            }
        }
    }

    /// The key's standing without charging anything (what `GET /v1/usage`
    /// reports; with several instances, as the instance next in line
    /// counts it).
    pub fn usage(&self, key: usize, now: Nanos) -> Decision {
        let mut state = self.words[self.state_range(key)].to_vec();
        check_words(&self.plan, &mut state, now, 0).0
    }

    /// The HTTP status and headers a real gateway would send for `answer`
    /// (`None` for a request dropped at the edge).
    pub fn response_head(&self, answer: &Answer) -> Option<(StatusCode, HeaderMap)> {
        let mut headers = HeaderMap::new();
        let status = self.write_head(answer, &mut headers)?;
        Some((status, headers))
    }

    /// Like [`Gateway::response_head`], writing into `headers` (cleared
    /// first, its allocation kept).
    pub fn write_head(&self, answer: &Answer, headers: &mut HeaderMap) -> Option<StatusCode> {
        headers.clear();
        let status = StatusCode::from_u16(answer.status()?).ok()?;
        if let Some(d) = answer.decision.as_ref().filter(|_| !self.silent) {
            emit::write_headers(&self.plan, d, &Dialects::default(), headers);
        }
        if let Verdict::Fault { retry_after_s, .. } = answer.verdict {
            if retry_after_s > 0 {
                headers.insert(http::header::RETRY_AFTER, HeaderValue::from(retry_after_s));
            }
        }
        Some(status)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use paceline_core::Policy;

    fn plan() -> Plan {
        Plan::new("t", vec![Policy::token_bucket("burst", 8, 2).unwrap()]).unwrap()
    }

    #[test]
    fn keys_have_separate_buckets() {
        let mut gw = Gateway::new(plan(), 2);
        let t = Nanos::from_secs(3);
        for _ in 0..8 {
            assert_eq!(gw.handle(0, 1, t).verdict, Verdict::Served);
        }
        assert_eq!(gw.handle(0, 1, t).status(), Some(429));
        assert_eq!(gw.handle(1, 1, t).verdict, Verdict::Served);
        assert_eq!(gw.usage(0, t).statuses[0].remaining, 0);
        assert_eq!(gw.usage(1, t).statuses[0].remaining, 7);
        // refills at 4/s
        let later = t.saturating_add(Nanos::from_millis(250));
        assert_eq!(gw.handle(0, 1, later).verdict, Verdict::Served);
    }

    #[test]
    fn faults_answer_without_charging() {
        let fault = Fault {
            from: Nanos::ZERO,
            until: Nanos::from_secs(5),
            status: 503,
            retry_after_s: 5,
        };
        let mut gw = Gateway::new(plan(), 1).with_fault(fault);
        let a = gw.handle(0, 1, Nanos::from_secs(1));
        assert_eq!(a.status(), Some(503));
        let (status, headers) = gw.response_head(&a).unwrap();
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(headers[http::header::RETRY_AFTER], "5");
        assert_eq!(gw.usage(0, Nanos::from_secs(5)).statuses[0].remaining, 8);
        assert_eq!(gw.stats().faulted, 1);
    }

    #[test]
    fn the_edge_drops_before_the_limiter() {
        let mut gw = Gateway::new(plan(), 1).with_capacity(2);
        let t = Nanos::from_secs(1);
        assert_eq!(gw.handle(0, 1, t).verdict, Verdict::Served);
        assert_eq!(gw.handle(0, 1, t).verdict, Verdict::Served);
        let a = gw.handle(0, 1, t);
        assert_eq!(a.verdict, Verdict::Dropped);
        assert!(gw.response_head(&a).is_none());
        assert_eq!(gw.usage(0, t).statuses[0].remaining, 6);
    }
}
