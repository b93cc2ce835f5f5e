//! The transport-free client: before a request, go / wait / drop; after a
//! response, done / retry after / error.

use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::Method;
use paceline_core::{Clock, Nanos, SystemClock};
use parking_lot::{Mutex, RwLock};
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};

use crate::bucket::Seen;
use crate::budget::RetryBudget;
use crate::config::{ns, Config};
use crate::diag::{ScopeSnapshot, Snapshot};
use crate::error::ClientError;
use crate::event::{trace, Event, Hook, Mode};
use crate::jitter;
use crate::observe::{Observation, PolicyObservation, ResponseKind};
use crate::request::{Call, Flight, RequestInfo};
use crate::scope::{Hold, Marks, Scope};
use crate::throttle::AdaptiveThrottle;
use crate::window::SlotWindow;

/// What to do before sending an attempt.
///
/// Deliberately exhaustive, as [`After`] is: a transport that drives the
/// client must act on every answer, so a new one is a breaking change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Before {
    /// Send it now (the attempt is counted as in flight).
    Go,
    /// Ask again after this long.
    Wait(Nanos),
    /// Do not send it: the call ends with this error.
    Drop(ClientError),
}

/// What to do after an attempt's response (or network error).
///
/// Deliberately exhaustive, as [`Before`] is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum After {
    /// Hand the response to the application (whatever its status).
    Done,
    /// Wait this long, then call `before` again for the next attempt.
    RetryAfter(Nanos),
    /// The call ends with this error.
    Error(ClientError),
}

/// Builds a [`Client`].
pub struct ClientBuilder {
    clock: Option<Arc<dyn Clock>>,
    rng: Option<Box<dyn RngCore + Send>>,
    config: Config,
}

impl fmt::Debug for ClientBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientBuilder")
            .field("config", &self.config)
            .finish()
    }
}

impl ClientBuilder {
    /// Reads time from `clock` (the system clock by default).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }
    /// Seeds the random draws (jitter, drops, idempotency keys), for
    /// reproducible runs.
    pub fn seed(mut self, seed: u64) -> Self {
        self.rng = Some(Box::new(StdRng::seed_from_u64(seed)));
        self
    }
    /// Uses this random source.
    pub fn rng(mut self, rng: impl RngCore + Send + 'static) -> Self {
        self.rng = Some(Box::new(rng));
        self
    }
    /// Replaces the settings.
    pub fn config(mut self, config: Config) -> Self {
        self.config = config;
        self
    }
    /// Changes the adaptive throttle's K.
    pub fn throttle_k(mut self, k: f64) -> Self {
        self.config.throttle_k = k;
        self
    }
    /// Changes the ceiling above which waits are never slept.
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.config.max_wait = max_wait;
        self
    }
    /// The client.
    pub fn build(self) -> Client {
        let clock = self.clock.unwrap_or_else(|| Arc::new(SystemClock::new()));
        let rng = self.rng.unwrap_or_else(|| Box::new(StdRng::from_entropy()));
        let c = &self.config;
        let state = State {
            rng,
            budget: RetryBudget::new(ns(c.budget_window), c.budget_percent, c.budget_min_retries)
                .with_floor(c.budget_floor_per_s, c.budget_floor_burst),
            scopes: Scopes::default(),
            totals: Totals::default(),
            rates: SlotWindow::new(Nanos::from_secs(60), Nanos::SECOND),
        };
        Client {
            inner: Arc::new(Inner {
                clock,
                config: self.config,
                state: Mutex::new(state),
                hooks: RwLock::new(Vec::new()),
                hooked: AtomicBool::new(false),
                calls: AtomicU64::new(0),
                credential_keys: RandomState::new(),
            }),
        }
    }
}

/// Running totals since the client was built.
#[derive(Clone, Debug, Default)]
pub(crate) struct Totals {
    pub(crate) requests: u64,
    pub(crate) retries: u64,
    pub(crate) drops: u64,
    pub(crate) gave_up: u64,
    pub(crate) transport_errors: u64,
    pub(crate) by_status: BTreeMap<u16, u64>,
}

pub(crate) struct State {
    rng: Box<dyn RngCore + Send>,
    pub(crate) budget: RetryBudget,
    pub(crate) scopes: Scopes,
    pub(crate) totals: Totals,
    pub(crate) rates: SlotWindow,
}

struct Inner {
    clock: Arc<dyn Clock>,
    config: Config,
    state: Mutex<State>,
    hooks: RwLock<Vec<Hook>>,
    /// Whether any hook is subscribed (read without the lock).
    hooked: AtomicBool,
    calls: AtomicU64,
    /// Keys the hash that names a credential's scope (random per client).
    #[cfg_attr(not(any(feature = "reqwest", feature = "tower")), allow(dead_code))]
    credential_keys: RandomState,
}

/// The SDK's state machine. Cheap to clone; every clone shares the same
/// state, so all workers of a process pace as one client.
///
/// ```
/// use paceline_client::{After, Before, Client, Observation, RequestInfo};
/// use paceline_client::{ManualClock, Nanos};
///
/// let clock = ManualClock::new(Nanos::from_secs(1_000));
/// let client = Client::builder().clock(clock.clone()).seed(7).build();
/// let mut call = client.call(RequestInfo::get("http://api.test/v1/rates"));
/// assert_eq!(client.before(&mut call), Before::Go);
/// // the server answers: 7 of a burst of 8 per 2 s left
/// let ok = Observation::bare(200).with_policy("burst", 8, 2, 7, Nanos::from_secs(1));
/// assert_eq!(client.after(&mut call, &ok), After::Done);
/// ```
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl Default for Client {
    fn default() -> Self {
        Client::builder().build()
    }
}

impl Client {
    /// A builder with the default settings.
    pub fn builder() -> ClientBuilder {
        ClientBuilder {
            clock: None,
            rng: None,
            config: Config::default(),
        }
    }

    /// A client on the system clock with the default settings.
    pub fn new() -> Self {
        Client::default()
    }

    /// The settings.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The current time on the client's clock.
    pub fn now(&self) -> Nanos {
        self.inner.clock.now()
    }

    /// Calls `hook` for every event from now on.
    pub fn subscribe(&self, hook: impl Fn(&Event) + Send + Sync + 'static) {
        self.inner.hooks.write().push(Arc::new(hook));
        self.inner.hooked.store(true, Ordering::Release);
    }

    /// Whether anyone hears about waits: a hook, or a tracing subscriber
    /// that wants them. Waits are the common answer, so their events are
    /// only built when they have an audience.
    fn waits_heard(&self) -> bool {
        self.inner.hooked.load(Ordering::Acquire) || crate::event::waits_traced()
    }

    fn emit(&self, events: Vec<Event>) {
        if events.is_empty() {
            return;
        }
        let hooks = self.inner.hooks.read();
        for e in &events {
            trace(e);
            for h in hooks.iter() {
                h(e);
            }
        }
    }

    /// A new idempotency key (a UUID v4, from the client's seeded draws),
    /// for an application that keeps one logical request alive across
    /// calls (a job queued again) and sets it itself
    /// ([`RequestInfo::with_idempotency_key`], or the header through the
    /// adapters).
    pub fn idempotency_key(&self) -> String {
        let mut b = [0u8; 16];
        self.inner.state.lock().rng.fill_bytes(&mut b);
        uuid::Builder::from_random_bytes(b).into_uuid().to_string()
    }

    /// A name for a credential that does not reveal it: a hash keyed per
    /// client (clones share the key), as 16 hex digits.
    #[cfg(any(feature = "reqwest", feature = "tower"))]
    pub(crate) fn credential_tag(&self, credential: &[u8]) -> String {
        use std::hash::BuildHasher;
        format!("{:016x}", self.inner.credential_keys.hash_one(credential))
    }

    /// Starts a call: one application request across all its attempts. A
    /// POST or PATCH gets an `Idempotency-Key` (a UUID v4) unless it has
    /// one; every attempt of the call sends the same key.
    pub fn call(&self, info: RequestInfo) -> Call {
        self.inner.calls.fetch_add(1, Ordering::Relaxed);
        let key = match &info.idempotency_key {
            Some(k) => Some(k.clone()),
            None if self.inner.config.idempotency_keys
                && (info.method == Method::POST || info.method == Method::PATCH) =>
            {
                Some(self.idempotency_key())
            }
            None => None,
        };
        Call::new(info, key)
    }

    /// Asks whether the next attempt of `call` may go now.
    pub fn before(&self, call: &mut Call) -> Before {
        let now = self.now();
        let mut events = Vec::new();
        let heard = self.waits_heard();
        let b = self.before_at(call, now, heard, &mut events);
        self.emit(events);
        b
    }

    fn before_at(
        &self,
        call: &mut Call,
        now: Nanos,
        heard: bool,
        events: &mut Vec<Event>,
    ) -> Before {
        let cfg = &self.inner.config;
        if call.flight.is_some() {
            return Before::Go;
        }
        if call.not_before > now {
            let wait = call.not_before.saturating_sub(now);
            if heard {
                events.push(wait_event(&call.info.scope, wait, "retry"));
            }
            return Before::Wait(wait);
        }
        let mut guard = self.inner.state.lock();
        let st = &mut *guard;
        let scope = st.scopes.get_or_make(call, cfg);
        if let Some(t) = scope.too_costly(&call.info.path, &call.info.cost) {
            let error = ClientError::CostExceedsQuota {
                policy: t.policy,
                unit: t.unit,
                amount: t.amount,
                quota: t.quota,
            };
            return dropped(scope, &mut st.totals, events, error);
        }
        let (until, hold) =
            scope.earliest(now, &call.info.path, ns(cfg.pace_margin), &call.info.cost);
        if until > now {
            let wait = until.saturating_sub(now);
            if wait > ns(cfg.max_wait) {
                let error = match hold {
                    h @ Some(Hold::Mirror(_) | Hold::Endpoint(_))
                        if scope.held(h, &call.info.path).is_some_and(|m| m.is_quota()) =>
                    {
                        ClientError::QuotaExceeded {
                            policy: scope
                                .held(h, &call.info.path)
                                .map(|m| m.name.clone())
                                .unwrap_or_default(),
                            reset_at: until.as_system_time(),
                        }
                    }
                    h => ClientError::WaitTooLong {
                        until: until.as_system_time(),
                        policy: match h {
                            Some(Hold::Pause) => scope.pause_policy.clone(),
                            h => scope.held(h, &call.info.path).map(|m| m.name.clone()),
                        },
                    },
                };
                return dropped(scope, &mut st.totals, events, error);
            }
            let (wait, reason) = match hold {
                Some(Hold::Pause) if scope.pause_spread => {
                    let extra = jitter::uniform(jitter::jitter_span(scope.pause_len), &mut st.rng);
                    (wait.saturating_add(extra), "pause")
                }
                Some(Hold::Pause) => (wait, "pause"),
                _ => (wait, "pacing"),
            };
            if heard {
                events.push(wait_event(&scope.name, wait, reason));
            }
            return Before::Wait(wait);
        }
        let probing = now.saturating_sub(scope.probe_sent_at) < ns(cfg.probe_timeout);
        if scope.mode == Mode::Unseeded && !scope.in_flight.is_empty() && probing {
            if heard {
                events.push(wait_event(&scope.name, ns(cfg.probe_poll), "probe"));
            }
            return Before::Wait(ns(cfg.probe_poll));
        }
        if scope.throttle.should_drop(now, &mut st.rng) {
            let p = scope.throttle.probability(now);
            scope.throttle.record_drop(now);
            let error = ClientError::Throttled {
                probability_per_mille: (p * 1000.0).round() as u32,
            };
            return dropped(scope, &mut st.totals, events, error);
        }
        if scope.mode == Mode::Unseeded && scope.in_flight.is_empty() {
            scope.probe_sent_at = now;
        }
        let (seq, marks) = scope.spend(now, &call.info.path, &call.info.cost);
        let retry = call.attempts > 0;
        if retry {
            scope.retries += 1;
        } else {
            st.budget.record_request(now);
        }
        call.flight = Some(Flight {
            seq,
            mode: scope.mode,
            sent_at: now,
            marks,
        });
        call.attempts += 1;
        scope.last_attempt = Some((call.attempts, call.key.clone()));
        if heard {
            events.push(Event::Attempt {
                scope: scope.name.clone(),
                attempt: call.attempts,
                idempotency_key: call.key.clone(),
            });
        }
        st.totals.requests += 1;
        st.rates.add(now, 1, u64::from(retry));
        Before::Go
    }

    /// Reports the response to the attempt in flight and says what next.
    pub fn after(&self, call: &mut Call, obs: &Observation) -> After {
        let now = self.now();
        let mut events = Vec::new();
        let a = self.after_at(call, obs, now, &mut events);
        self.emit(events);
        a
    }

    /// Parses a response with `paceline-wire` and reports it, like
    /// [`Client::after`].
    pub fn after_response(
        &self,
        call: &mut Call,
        status: u16,
        headers: &http::HeaderMap,
        body: Option<&[u8]>,
    ) -> After {
        let obs = Observation::parse(status, headers, body, self.now());
        self.after(call, &obs)
    }

    /// Reports a network error (no response) for the attempt in flight.
    /// `transient` errors (connection reset or refused, timeout) may be
    /// retried when the call may be resent; others end the call.
    pub fn after_error(&self, call: &mut Call, transient: bool, message: &str) -> After {
        let now = self.now();
        let mut events = Vec::new();
        let a = self.after_error_at(call, transient, message, now, &mut events);
        self.emit(events);
        a
    }

    /// Forgets the attempt in flight without an answer (the request was
    /// cancelled). The call may start a new attempt with `before`.
    pub fn cancel(&self, call: &mut Call) {
        if let Some(f) = call.flight.take() {
            if let Some(scope) = self.inner.state.lock().scopes.get_mut(call) {
                scope.land(f.seq, f.sent_at);
            }
        }
    }

    /// Seeds a scope's mirrors before its first response, for example from
    /// the API's usage endpoint.
    pub fn seed_policies(&self, scope: &str, policies: &[PolicyObservation]) {
        let now = self.now();
        let cfg = &self.inner.config;
        let mut events = Vec::new();
        {
            let mut st = self.inner.state.lock();
            let s = st.scopes.named_or_make(scope, cfg);
            let seen = Seen::unsent(s.in_flight.is_empty());
            s.observe(now, "/", policies, &seen, &Marks::default());
            if policies
                .iter()
                .any(|p| p.is_mirrored() && p.remaining.is_some())
            {
                s.set_mode(Mode::Paced, ns(cfg.absent_gap), &mut events);
            }
        }
        self.emit(events);
    }

    /// Seeds a scope from a usage endpoint's body (see [`crate::usage`]);
    /// returns how many policies it read.
    pub fn seed_usage(&self, scope: &str, body: &[u8]) -> Result<usize, crate::usage::UsageError> {
        let policies = crate::usage::parse_usage(body, self.now())?;
        self.seed_policies(scope, &policies);
        Ok(policies.len())
    }

    fn after_at(
        &self,
        call: &mut Call,
        obs: &Observation,
        now: Nanos,
        events: &mut Vec<Event>,
    ) -> After {
        let cfg = &self.inner.config;
        let Some(flight) = call.flight.take() else {
            return After::Done;
        };
        call.last_status = Some(obs.status);
        let mut guard = self.inner.state.lock();
        let st = &mut *guard;
        *st.totals.by_status.entry(obs.status).or_insert(0) += 1;
        let Some(scope) = st.scopes.get_mut(call) else {
            return After::Done;
        };
        let mut seen = scope.land(flight.seq, flight.sent_at);
        seen.rejected = obs.status == 429;
        if obs.has_limits() {
            scope.headerless = 0;
            scope.observe(now, &call.info.path, &obs.policies, &seen, &flight.marks);
            scope.set_mode(Mode::Paced, ns(cfg.absent_gap), events);
        } else {
            scope.headerless += 1;
            if scope.mode == Mode::Unseeded || scope.headerless >= 5 {
                scope.set_mode(Mode::HeaderAbsent, ns(cfg.absent_gap), events);
            }
        }
        let rejected = matches!(obs.status, 429 | 503);
        scope.throttle.record_request(now);
        if !rejected {
            scope.throttle.record_accept(now);
        }
        if obs.status == 429 {
            scope.last_429 = Some((now, obs.headers.clone()));
            scope.last_429_attempt = Some((call.attempts, call.key.clone()));
        }
        // an explicit verdict (`x-should-retry`, `Stripe-Should-Retry`)
        // overrides the guess from the kind of answer
        let retryable = match obs.kind {
            ResponseKind::QuotaExhausted if obs.should_retry != Some(true) => {
                let policy = obs.limit.clone().unwrap_or_else(|| quota_name(scope));
                let reset_at = now.saturating_add(obs.retry_after.unwrap_or(Nanos::ZERO));
                mark_exhausted(scope, &policy, now, reset_at);
                let error = ClientError::QuotaExceeded {
                    policy,
                    reset_at: reset_at.as_system_time(),
                };
                st.totals.gave_up += 1;
                events.push(Event::Drop {
                    scope: scope.name.clone(),
                    error: error.clone(),
                });
                return After::Error(error);
            }
            ResponseKind::QuotaExhausted => true,
            ResponseKind::RateLimited | ResponseKind::Overloaded => obs.should_retry != Some(false),
            // the same key is still running: waiting can succeed, and the
            // retry is replayed, never run twice
            ResponseKind::InFlight => call.key.is_some() && obs.should_retry != Some(false),
            ResponseKind::Error => obs.should_retry == Some(true),
            _ => false,
        };
        // A wait the server gave is kept whole: the scope pauses for all of
        // it, and a wait past `max_wait` fails the call below, never shortened.
        let policy = binding_policy(obs);
        let policy = policy.as_deref();
        if !retryable {
            if !rejected {
                scope.success(now, cfg.restore_after, events);
            }
            return After::Done;
        }
        // the whole scope reacts, not only this call
        if obs.kind == ResponseKind::RateLimited {
            match scope.mode {
                Mode::HeaderAbsent => {
                    scope.absent_429(now, flight.seq, ns(cfg.absent_gap));
                    let wait = obs.retry_after.unwrap_or_else(|| {
                        cfg.absent_backoff
                            .nominal(call.attempts)
                            .min(ns(cfg.max_wait))
                    });
                    scope.pause(now, now.saturating_add(wait), false, policy);
                }
                _ => {
                    if flight.mode == Mode::Paced {
                        scope.obeyed_429(
                            now,
                            flight.seq,
                            cfg.escalate_after,
                            cfg.max_factor,
                            events,
                        );
                    }
                    if let Some(ra) = obs.retry_after {
                        scope.pause(now, now.saturating_add(ra), false, policy);
                    }
                }
            }
        } else if let Some(ra) = obs.retry_after {
            scope.pause(now, now.saturating_add(ra), true, policy);
        }
        let absent = scope.mode == Mode::HeaderAbsent;
        let scope_name = scope.name.clone();
        let max_attempts = if absent {
            cfg.absent_backoff.max_attempts
        } else {
            cfg.max_attempts
        };
        if let Some(ra) = obs.retry_after {
            if ra > ns(cfg.max_wait) {
                return self.fail(
                    st,
                    &scope_name,
                    ClientError::WaitTooLong {
                        until: now.saturating_add(ra).as_system_time(),
                        policy: policy.map(str::to_string),
                    },
                    events,
                );
            }
        }
        if call.attempts >= max_attempts {
            let e = ClientError::RetriesExhausted {
                attempts: call.attempts,
                status: Some(obs.status),
            };
            return self.fail(st, &scope_name, e, events);
        }
        let wait = match obs.retry_after {
            Some(ra) => jitter::retry_wait(Some(ra), call.attempts, &mut st.rng),
            None if absent => cfg.absent_backoff.wait(call.attempts, &mut st.rng),
            None => jitter::retry_wait(None, call.attempts, &mut st.rng),
        };
        self.retry(st, call, &scope_name, wait, Some(obs.status), now, events)
    }

    fn after_error_at(
        &self,
        call: &mut Call,
        transient: bool,
        message: &str,
        now: Nanos,
        events: &mut Vec<Event>,
    ) -> After {
        let cfg = &self.inner.config;
        let Some(flight) = call.flight.take() else {
            return After::Done;
        };
        let mut guard = self.inner.state.lock();
        let st = &mut *guard;
        st.totals.transport_errors += 1;
        let Some(scope) = st.scopes.get_mut(call) else {
            return After::Done;
        };
        scope.land(flight.seq, flight.sent_at);
        scope.throttle.record_request(now);
        let absent = scope.mode == Mode::HeaderAbsent;
        let name = scope.name.clone();
        let transport = ClientError::Transport {
            message: message.to_string(),
        };
        if !transient || !call.may_resend() {
            return self.fail(st, &name, transport, events);
        }
        let max_attempts = if absent {
            cfg.absent_backoff.max_attempts
        } else {
            cfg.max_attempts
        };
        if call.attempts >= max_attempts {
            let e = ClientError::RetriesExhausted {
                attempts: call.attempts,
                status: None,
            };
            return self.fail(st, &name, e, events);
        }
        let wait = if absent {
            cfg.absent_backoff.wait(call.attempts, &mut st.rng)
        } else {
            jitter::retry_wait(None, call.attempts, &mut st.rng)
        };
        self.retry(st, call, &name, wait, None, now, events)
    }

    #[allow(clippy::too_many_arguments)]
    fn retry(
        &self,
        st: &mut State,
        call: &mut Call,
        scope: &str,
        wait: Nanos,
        status: Option<u16>,
        now: Nanos,
        events: &mut Vec<Event>,
    ) -> After {
        if !st.budget.try_retry(now) {
            return self.fail(st, scope, ClientError::BudgetExhausted { status }, events);
        }
        st.totals.retries += 1;
        call.not_before = now.saturating_add(wait);
        events.push(Event::Retry {
            scope: scope.to_string(),
            attempt: call.attempts,
            idempotency_key: call.key.clone(),
            wait: wait.into(),
            status,
        });
        After::RetryAfter(wait)
    }

    fn fail(
        &self,
        st: &mut State,
        scope: &str,
        error: ClientError,
        events: &mut Vec<Event>,
    ) -> After {
        st.totals.gave_up += 1;
        events.push(Event::Drop {
            scope: scope.to_string(),
            error: error.clone(),
        });
        After::Error(error)
    }

    /// The pacing mode of `scope`, if the client has seen it.
    pub fn mode(&self, scope: &str) -> Option<Mode> {
        self.inner.state.lock().scopes.named(scope).map(|s| s.mode)
    }

    /// The retry budget as it stands.
    pub fn budget(&self) -> crate::budget::BudgetStats {
        let now = self.now();
        self.inner.state.lock().budget.stats(now)
    }

    /// A snapshot of everything the client knows and did.
    pub fn diagnostics(&self) -> Snapshot {
        let now = self.now();
        let st = self.inner.state.lock();
        let (req_min, retry_min) = st.rates.totals(now);
        let mut scopes: Vec<ScopeSnapshot> = st
            .scopes
            .all()
            .iter()
            .map(|s| ScopeSnapshot::of(s, now))
            .collect();
        scopes.sort_by(|a, b| a.scope.cmp(&b.scope));
        Snapshot {
            at_s: now.as_secs_f64(),
            calls: self.inner.calls.load(Ordering::Relaxed),
            requests: st.totals.requests,
            retries: st.totals.retries,
            local_drops: st.totals.drops,
            gave_up: st.totals.gave_up,
            transport_errors: st.totals.transport_errors,
            by_status: st.totals.by_status.clone(),
            request_rate_per_s: req_min as f64 / 60.0,
            retry_rate_per_s: retry_min as f64 / 60.0,
            budget: st.budget.stats(now),
            scopes,
        }
    }

    /// Draws a uniform number in `[0, 1)` from the client's random source
    /// (shared with jitter; for adapters and the simulator).
    pub fn random(&self) -> f64 {
        self.inner.state.lock().rng.gen()
    }
}

/// A call dropped before it was sent: counted in its scope and the
/// totals, told as an event, and answered.
fn dropped(
    scope: &mut Scope,
    totals: &mut Totals,
    events: &mut Vec<Event>,
    error: ClientError,
) -> Before {
    scope.drops += 1;
    totals.drops += 1;
    events.push(Event::Drop {
        scope: scope.name.clone(),
        error: error.clone(),
    });
    Before::Drop(error)
}

fn wait_event(scope: &str, wait: Nanos, reason: &'static str) -> Event {
    Event::Wait {
        scope: scope.to_string(),
        wait: wait.into(),
        reason,
    }
}

/// The policy a rejection names (the problem body's `limit`), else the
/// exhausted one that resets last.
fn binding_policy(obs: &Observation) -> Option<String> {
    obs.limit
        .clone()
        .or_else(|| {
            obs.policies
                .iter()
                .filter(|p| p.remaining == Some(0))
                .max_by_key(|p| p.reset_in)
                .map(|p| p.name.clone())
        })
        .filter(|n| !n.is_empty())
}

fn quota_name(scope: &Scope) -> String {
    scope
        .all_mirrors()
        .find(|m| m.is_quota())
        .map(|m| m.name.clone())
        .unwrap_or_else(|| "quota".to_string())
}

fn mark_exhausted(scope: &mut Scope, policy: &str, now: Nanos, reset_at: Nanos) {
    let p = PolicyObservation {
        name: policy.to_string(),
        quota: None,
        window_s: Some(86_400),
        remaining: Some(0),
        reset_in: Some(reset_at.saturating_sub(now)),
        counts_requests: true,
        per_endpoint: false,
        unit: String::new(),
    };
    let keep_window = scope
        .mirrors
        .iter()
        .find(|m| m.name == policy)
        .and_then(|m| m.window);
    let p = PolicyObservation {
        window_s: keep_window.map(|w| w.as_secs_floor()).or(p.window_s),
        ..p
    };
    scope.observe(
        now,
        "/",
        std::slice::from_ref(&p),
        &Seen::unsent(true),
        &Marks::default(),
    );
}

/// The scopes of a client: a name index over a list, so a call that
/// remembers where its scope is (its slot) finds it again without hashing,
/// and a lookup never copies the name.
#[derive(Debug, Default)]
pub(crate) struct Scopes {
    list: Vec<Scope>,
    index: HashMap<String, usize>,
}

impl Scopes {
    /// Every scope.
    pub(crate) fn all(&self) -> &[Scope] {
        &self.list
    }

    /// The scope called `name`, if any.
    pub(crate) fn named(&self, name: &str) -> Option<&Scope> {
        self.index.get(name).map(|&i| &self.list[i])
    }

    fn position(&self, call: &Call) -> Option<usize> {
        match call.slot {
            Some(i) if self.list.get(i).is_some_and(|s| s.name == call.info.scope) => Some(i),
            _ => self.index.get(call.info.scope.as_str()).copied(),
        }
    }

    /// The scope of `call`, if the client has seen it.
    pub(crate) fn get_mut(&mut self, call: &mut Call) -> Option<&mut Scope> {
        let i = self.position(call)?;
        call.slot = Some(i);
        Some(&mut self.list[i])
    }

    /// The scope of `call`, made on first sight.
    pub(crate) fn get_or_make(&mut self, call: &mut Call, cfg: &Config) -> &mut Scope {
        let i = match self.position(call) {
            Some(i) => i,
            None => self.make(&call.info.scope, cfg),
        };
        call.slot = Some(i);
        &mut self.list[i]
    }

    /// The scope called `name`, made on first sight.
    pub(crate) fn named_or_make(&mut self, name: &str, cfg: &Config) -> &mut Scope {
        let i = match self.index.get(name) {
            Some(&i) => i,
            None => self.make(name, cfg),
        };
        &mut self.list[i]
    }

    fn make(&mut self, name: &str, cfg: &Config) -> usize {
        let throttle = AdaptiveThrottle::new(ns(cfg.throttle_window), cfg.throttle_k)
            .with_min_requests(cfg.throttle_min_requests);
        self.list.push(Scope::new(name, throttle));
        self.index.insert(name.to_string(), self.list.len() - 1);
        self.list.len() - 1
    }
}
