//! Validation: a [`LimitsBuilder`] checks a configuration and compiles it
//! into the [`Limits`] the layer reads on every request.
//!
//! Compiling does once what would otherwise be done per request: each plan
//! becomes a [`CompiledPlan`] holding, beside the plan, the names its
//! metrics are labelled with, the parts of its responses that never change
//! and its metric keys; each configured key is resolved to its plan and
//! hashed.

use std::collections::HashMap;
use std::sync::Arc;

use paceline_core::Plan;
use paceline_wire::emit::Dialects;

use super::error::{ConfigError, ConfigErrorKind as Kind};
use super::{
    key_prefix, ClaimedPlans, Consumer, KeyEntry, Limits, LimitsInner, VerifiedJwt,
    DEFAULT_PROBLEM_BASE, DEFAULT_SOFT_LIMIT, DEFAULT_USAGE_PATH,
};
use crate::escalation::EscalationConfig;
use crate::identity::{
    parse_hashed, BasicAuth, ConsumerHeaders, IpPrefixes, KeySource, KeyTreatment, TrustedProxies,
};
use crate::route::Route;

/// A plan with everything the responses and the telemetry need of it,
/// prepared when the configuration is built.
#[derive(Debug)]
pub(crate) struct CompiledPlan {
    pub(crate) plan: Plan,
    /// The plan's name, shared with metric labels.
    pub(crate) name: Arc<str>,
    /// Its policies' names, in order, shared with metric labels.
    pub(crate) policy_names: Vec<Arc<str>>,
    /// The parts of its responses that never change.
    pub(crate) meta: paceline_wire::emit::PreparedPlan,
    /// Its metric keys.
    pub(crate) metric_keys: crate::telemetry::PlanKeys,
    /// Whether a request whose upstream answer never came (see
    /// [`UpstreamFailed`](crate::UpstreamFailed)) stays charged.
    pub(crate) charge_upstream_failures: bool,
    /// Whether a request whose head reached the upstream before its answer
    /// failed is given its charge back too (by default it is not: the
    /// upstream may have done the work).
    pub(crate) refund_sent_failures: bool,
}

impl CompiledPlan {
    fn new(plan: Plan, problem_base: &str, dialects: &Dialects) -> CompiledPlan {
        let name: Arc<str> = Arc::from(plan.name());
        let policy_names: Vec<Arc<str>> = plan
            .policies()
            .iter()
            .map(|q| Arc::from(q.name()))
            .collect();
        let meta = paceline_wire::emit::PreparedPlan::new(&plan, problem_base, dialects);
        let metric_keys = crate::telemetry::PlanKeys::new(&name, &policy_names);
        CompiledPlan {
            plan,
            name,
            policy_names,
            meta,
            metric_keys,
            charge_upstream_failures: false,
            refund_sent_failures: false,
        }
    }
}

/// Builds [`Limits`] step by step; [`LimitsBuilder::build`] validates.
#[derive(Debug)]
pub struct LimitsBuilder {
    plans: Vec<Plan>,
    keys: Vec<(String, String)>,
    routes: Vec<Route>,
    key_source: KeySource,
    default_plan: Option<String>,
    anonymous_plan: Option<String>,
    missing_key: Option<KeyTreatment>,
    unknown_key: Option<KeyTreatment>,
    trusted: TrustedProxies,
    basic_auth: BasicAuth,
    ip_prefixes: IpPrefixes,
    dialects: Dialects,
    soft_limit: Option<f64>,
    usage_path: Option<String>,
    problem_base: String,
    escalation: EscalationConfig,
    /// Plans whose upstream failures stay charged.
    charged_failures: Vec<String>,
    /// Plans whose failures after the head went upstream are refunded.
    refunded_sent: Vec<String>,
    hasher: crate::KeyHasher,
    idempotency: crate::IdempotencySettings,
    jwt: Option<crate::Jwt>,
    consumer: Option<ConsumerHeaders>,
}

impl Default for LimitsBuilder {
    fn default() -> Self {
        LimitsBuilder {
            plans: Vec::new(),
            keys: Vec::new(),
            routes: Vec::new(),
            key_source: KeySource::ApiKey,
            default_plan: None,
            anonymous_plan: None,
            missing_key: None,
            unknown_key: None,
            trusted: TrustedProxies::none(),
            basic_auth: BasicAuth::default(),
            ip_prefixes: IpPrefixes::default(),
            dialects: Dialects::default(),
            soft_limit: Some(DEFAULT_SOFT_LIMIT),
            usage_path: Some(DEFAULT_USAGE_PATH.to_string()),
            problem_base: DEFAULT_PROBLEM_BASE.to_string(),
            escalation: EscalationConfig::default(),
            charged_failures: Vec::new(),
            refunded_sent: Vec::new(),
            hasher: crate::KeyHasher::per_process().clone(),
            idempotency: crate::IdempotencySettings::default(),
            jwt: None,
            consumer: None,
        }
    }
}

impl LimitsBuilder {
    /// The hash keys get in logs, soft-limit events and the names a shared
    /// store gives them (default: [`KeyHasher::per_process`](crate::KeyHasher::per_process)).
    pub fn key_hasher(mut self, hasher: crate::KeyHasher) -> Self {
        self.hasher = hasher;
        self
    }

    /// Whether requests of the plan named `plan` whose upstream answer
    /// never came (the gateway answered `502`/`504` itself: refused,
    /// malformed, timed out) stay charged. By default they are not: the
    /// charge is given back ([`paceline_core::Store::refund`]), so a client
    /// retrying through an outage does not spend its quota on it.
    pub fn charge_upstream_failures(mut self, plan: &str, charge: bool) -> Self {
        self.charged_failures.retain(|p| p != plan);
        if charge {
            self.charged_failures.push(plan.to_string());
        }
        self
    }
    /// Whether requests of the plan named `plan` whose upstream failed
    /// after their head was sent to it (a `504` for an answer that came
    /// too late, a `502` for one too large or malformed) are given their
    /// charge back as well. By default they are not: the upstream may
    /// have done the work, and a client that can make it slow or its
    /// answer large would otherwise get that work for nothing. Only
    /// failures before the head left (connection refused, no connection
    /// to be had) are refunded. Has no effect on a plan that
    /// [charges every upstream failure](Self::charge_upstream_failures).
    pub fn refund_sent_failures(mut self, plan: &str, refund: bool) -> Self {
        self.refunded_sent.retain(|p| p != plan);
        if refund {
            self.refunded_sent.push(plan.to_string());
        }
        self
    }
    /// How `Authorization: Basic` is read when the key is an API key
    /// (default [`BasicAuth::Refuse`]: 401).
    pub fn basic_auth(mut self, basic: BasicAuth) -> Self {
        self.basic_auth = basic;
        self
    }
    /// How client addresses are grouped for per-IP keys (default: IPv4
    /// addresses alone, IPv6 by /64).
    pub fn ip_prefixes(mut self, prefixes: IpPrefixes) -> Self {
        self.ip_prefixes = prefixes;
        self
    }
    /// Adds a plan.
    pub fn plan(mut self, plan: Plan) -> Self {
        self.plans.push(plan);
        self
    }
    /// Puts `key` (an API key, or a header value or IP address with other
    /// key sources) on the plan named `plan`. A key given as
    /// `sha256:<hex>` ([`hashed_key_entry`](crate::hashed_key_entry)) is
    /// the key whose SHA-256 that is: admitted exactly as the key itself
    /// (same plan, same counters), with no secret in the configuration.
    pub fn key(mut self, key: &str, plan: &str) -> Self {
        self.keys.push((key.to_string(), plan.to_string()));
        self
    }
    /// Adds a route (first match wins).
    pub fn route(mut self, route: Route) -> Self {
        self.routes.push(route);
        self
    }
    /// Where the key comes from (default: the bearer token).
    pub fn key_source(mut self, source: KeySource) -> Self {
        self.key_source = source;
        self
    }
    /// How JWTs are verified and read, for [`KeySource::Jwt`] (required
    /// with it, refused without it).
    pub fn jwt(mut self, jwt: crate::Jwt) -> Self {
        self.jwt = Some(jwt);
        self
    }
    /// The headers an authentication layer in front sets, for
    /// [`KeySource::ConsumerHeader`] (which uses
    /// [`ConsumerHeaders::default`] without it). Believed only from
    /// [trusted proxies](Self::trusted_proxies), of which there must be
    /// one at least.
    pub fn consumer_headers(mut self, headers: ConsumerHeaders) -> Self {
        self.consumer = Some(headers);
        self
    }
    /// The plan for keys not listed, counted per key with their counters
    /// published. Without one, an unlisted key gets
    /// [`unknown_key`](Self::unknown_key).
    pub fn default_plan(mut self, plan: &str) -> Self {
        self.default_plan = Some(plan.to_string());
        self
    }
    /// The per-IP plan of anonymous routes and of requests treated as
    /// [`KeyTreatment::Anonymous`] (no counters are published for it).
    pub fn anonymous_plan(mut self, plan: &str) -> Self {
        self.anonymous_plan = Some(plan.to_string());
        self
    }
    /// What a request that sends no key gets (default
    /// [`KeyTreatment::Reject`]: 401).
    pub fn missing_key(mut self, treatment: KeyTreatment) -> Self {
        self.missing_key = Some(treatment);
        self
    }
    /// What a key not listed gets when there is no default plan (default
    /// [`KeyTreatment::Reject`]: 401).
    pub fn unknown_key(mut self, treatment: KeyTreatment) -> Self {
        self.unknown_key = Some(treatment);
        self
    }
    /// The proxies whose forwarding headers are believed.
    pub fn trusted_proxies(mut self, trusted: TrustedProxies) -> Self {
        self.trusted = trusted;
        self
    }
    /// The header dialects to publish.
    pub fn dialects(mut self, dialects: Dialects) -> Self {
        self.dialects = dialects;
        self
    }
    /// The soft-limit threshold (share of a quota, in (0, 1]); `None` turns
    /// soft limits off.
    pub fn soft_limit(mut self, threshold: Option<f64>) -> Self {
        self.soft_limit = threshold;
        self
    }
    /// The usage endpoint's path; `None` turns it off.
    pub fn usage_path(mut self, path: Option<&str>) -> Self {
        self.usage_path = path.map(str::to_string);
        self
    }
    /// The prefix of problem `type` URIs.
    pub fn problem_base(mut self, base: &str) -> Self {
        self.problem_base = base.to_string();
        self
    }
    /// Escalation settings.
    pub fn escalation(mut self, escalation: EscalationConfig) -> Self {
        self.escalation = escalation;
        self
    }

    /// The idempotency layer's settings (its problem base becomes the
    /// limits' own when built).
    pub fn idempotency(mut self, settings: crate::IdempotencySettings) -> Self {
        self.idempotency = settings;
        self
    }

    /// Validates and builds.
    pub fn build(mut self) -> Result<Limits, ConfigError> {
        let index = plan_index(&self.plans)?;
        let find = |field: &str, name: &str| {
            index.get(name).copied().ok_or_else(|| {
                ConfigError::new(
                    Kind::UnknownPlan,
                    field,
                    format!("no plan named {name:?}; plans are {:?}", names(&self.plans)),
                )
            })
        };
        let mut keys = HashMap::with_capacity_and_hasher(self.keys.len(), Default::default());
        let mut key_entries = Vec::with_capacity(self.keys.len());
        let mut hashed = HashMap::default();
        let prefix = key_prefix(&self.key_source);
        for (k, p) in &self.keys {
            if k.is_empty() {
                return Err(ConfigError::new(
                    Kind::InvalidValue,
                    "keys",
                    "a key may not be empty",
                ));
            }
            let field = format!("keys.{k}");
            if let Some(digest) = parse_hashed(k) {
                let digest = digest.map_err(|m| ConfigError::new(Kind::InvalidValue, &field, m))?;
                // a key given twice: the later plan wins
                hashed.insert(digest, find(&field, p)?);
                continue;
            }
            let entry = KeyEntry::new(prefix, k, find(&field, p)?, &self.hasher);
            match keys.get(k.as_str()) {
                // a key given twice: the later plan wins
                Some(&i) => key_entries[i] = entry,
                None => {
                    keys.insert(k.clone(), key_entries.len());
                    key_entries.push(entry);
                }
            }
        }
        let default_plan = self
            .default_plan
            .as_deref()
            .map(|p| find("default_plan", p))
            .transpose()?;
        let anonymous_plan = self
            .anonymous_plan
            .as_deref()
            .map(|p| find("anonymous_plan", p))
            .transpose()?;
        if self.default_plan.is_some() && self.unknown_key.is_some() {
            return Err(ConfigError::new(
                Kind::InvalidValue,
                "unknown_key",
                "default_plan already gives unknown keys a plan: set one of the two",
            ));
        }
        for (field, t) in [
            ("missing_key", self.missing_key),
            ("unknown_key", self.unknown_key),
        ] {
            if t == Some(KeyTreatment::Anonymous) && anonymous_plan.is_none() {
                return Err(ConfigError::new(
                    Kind::Missing,
                    field,
                    "\"anonymous\" limits per client IP under anonymous_plan: set anonymous_plan",
                ));
            }
        }
        let claimed = |field: &str, plans: &std::collections::BTreeMap<String, String>| {
            let mut mapped = HashMap::new();
            for (value, plan) in plans {
                mapped.insert(value.clone(), find(&format!("{field}.{value}"), plan)?);
            }
            Ok::<_, ConfigError>(ClaimedPlans {
                mapped: (!plans.is_empty()).then_some(mapped),
            })
        };
        let jwt = match (&self.key_source, self.jwt.take()) {
            (KeySource::Jwt, Some(j)) => {
                let plans = claimed("jwt.plans", j.plan_map())?;
                Some(Box::new(VerifiedJwt { jwt: j, plans }))
            }
            (KeySource::Jwt, None) => {
                return Err(ConfigError::new(
                    Kind::Missing,
                    "jwt",
                    "key = \"jwt\" needs a [jwt] table: secret_file or jwks_file, the keys tokens are signed with",
                ))
            }
            (_, Some(_)) => {
                return Err(ConfigError::new(
                    Kind::InvalidValue,
                    "jwt",
                    "[jwt] is read only with key = \"jwt\"",
                ))
            }
            (_, None) => None,
        };
        let consumer = match (&self.key_source, self.consumer.take()) {
            (KeySource::ConsumerHeader, c) => {
                let c = c.unwrap_or_default();
                if self.trusted.is_empty() {
                    return Err(ConfigError::new(
                        Kind::Missing,
                        "trusted_proxies",
                        "key = \"consumer_header\" believes the headers only from trusted proxies: list the authentication layer's addresses under trusted_proxies",
                    ));
                }
                if c.plan.as_ref() == Some(&c.key) {
                    return Err(ConfigError::new(
                        Kind::InvalidValue,
                        "consumer_header.plan_header",
                        "the plan header must not be the key header",
                    ));
                }
                let plans = claimed("consumer_header.plans", &c.plans)?;
                Some(Box::new(Consumer { headers: c, plans }))
            }
            (_, Some(_)) => {
                return Err(ConfigError::new(
                    Kind::InvalidValue,
                    "consumer_header",
                    "[consumer_header] is read only with key = \"consumer_header\"",
                ))
            }
            (_, None) => None,
        };
        let mut routes = Vec::with_capacity(self.routes.len());
        for (i, r) in self.routes.into_iter().enumerate() {
            let anon = match (r.is_anonymous(), r.plan()) {
                (true, Some(p)) => Some(find(&format!("routes[{i}].plan"), p)?),
                (true, None) if anonymous_plan.is_none() => {
                    return Err(ConfigError::new(
                        Kind::Missing,
                        format!("routes[{i}].plan"),
                        "an anonymous route needs a plan, or set anonymous_plan",
                    ))
                }
                _ => None,
            };
            check_cost(i, &r, anon, &self.plans)?;
            routes.push((r, anon));
        }
        validate_soft(self.soft_limit)?;
        if let Some(p) = &self.usage_path {
            if !p.starts_with('/') {
                return Err(ConfigError::new(
                    Kind::InvalidValue,
                    "usage_path",
                    format!("{p:?} must start with '/'"),
                ));
            }
        }
        if self.problem_base.is_empty() {
            return Err(ConfigError::new(
                Kind::InvalidValue,
                "problem_base",
                "must not be empty",
            ));
        }
        self.escalation.validate()?;
        let failure_settings = [
            (&self.charged_failures, "charge upstream failures to"),
            (&self.refunded_sent, "refund failures to"),
        ];
        for (plans, what) in failure_settings {
            if let Some(p) = plans.iter().find(|p| !index.contains_key(p.as_str())) {
                return Err(ConfigError::new(
                    Kind::UnknownPlan,
                    "plans",
                    format!(
                        "no plan named {p:?} to {what}; plans are {:?}",
                        names(&self.plans)
                    ),
                ));
            }
        }
        self.ip_prefixes
            .validate()
            .map_err(|(field, m)| ConfigError::new(Kind::OutOfRange, field, m))?;
        let charged = std::mem::take(&mut self.charged_failures);
        let refunded = std::mem::take(&mut self.refunded_sent);
        self.idempotency.problem_base = self.problem_base.clone();
        let plans = self
            .plans
            .into_iter()
            .map(|p| {
                let charge = charged.iter().any(|c| c == p.name());
                let refund = refunded.iter().any(|r| r == p.name());
                let mut c = CompiledPlan::new(p, &self.problem_base, &self.dialects);
                c.charge_upstream_failures = charge;
                c.refund_sent_failures = refund;
                c
            })
            .collect();
        Ok(Limits {
            inner: Arc::new(LimitsInner {
                plans,
                keys,
                key_entries,
                hashed,
                jwt,
                consumer,
                plan_index: index,
                routes,
                key_source: self.key_source,
                default_plan,
                anonymous_plan,
                missing_key: self.missing_key.unwrap_or_default(),
                unknown_key: self.unknown_key.unwrap_or_default(),
                trusted: self.trusted,
                basic_auth: self.basic_auth,
                ip_prefixes: self.ip_prefixes,
                dialects: self.dialects,
                soft_limit: self.soft_limit,
                usage_path: self.usage_path,
                problem_base: self.problem_base,
                escalation: self.escalation,
                hasher: self.hasher,
                idempotency: self.idempotency,
                generation: super::next_generation(),
            }),
        })
    }
}

/// Refuses a route whose cost no plan it can meet could ever hold: every
/// request to it would be answered 400 `cost_exceeds_burst`. An anonymous
/// route meets its own plan, any other route every plan.
fn check_cost(i: usize, r: &Route, anon: Option<usize>, plans: &[Plan]) -> Result<(), ConfigError> {
    if r.is_unlimited() {
        return Ok(());
    }
    let cost = paceline_core::Cost::requests(r.cost()).with_units(r.units());
    let candidates: Vec<&Plan> = match anon {
        Some(a) => vec![&plans[a]],
        None => plans.iter().collect(),
    };
    if r.usage().is_some() && !candidates.iter().any(|p| p.counts_units()) {
        return Err(ConfigError::new(
            Kind::InvalidValue,
            format!("routes[{i}].cost"),
            "the answer's use is read for a named unit, and no plan this route meets counts one: give a policy a unit such as unit = \"tokens\"",
        ));
    }
    let holds = |p: &Plan| {
        p.policies()
            .iter()
            .all(|q| q.is_shadow() || cost.of(q) <= q.burst())
    };
    if candidates.is_empty() || candidates.iter().any(|p| holds(p)) {
        return Ok(());
    }
    let smallest = candidates
        .iter()
        .flat_map(|p| p.policies().iter().map(move |q| (p, q)))
        .filter(|(_, q)| !q.is_shadow() && cost.of(q) > q.burst())
        .min_by_key(|(_, q)| q.burst());
    let amount = smallest.map_or(r.cost(), |(_, q)| cost.of(q));
    let what = smallest.map_or(String::new(), |(p, q)| {
        format!(
            " (policy {:?} of plan {:?} holds {})",
            q.name(),
            p.name(),
            q.burst()
        )
    });
    Err(ConfigError::new(
        Kind::OutOfRange,
        format!("routes[{i}].cost"),
        format!(
            "{amount} is more than any plan can hold{what}: every request would be refused; lower the cost or raise the policy"
        ),
    ))
}

fn names(plans: &[Plan]) -> Vec<&str> {
    plans.iter().map(|p| p.name()).collect()
}

fn plan_index(plans: &[Plan]) -> Result<HashMap<String, usize>, ConfigError> {
    let mut index = HashMap::new();
    for (i, p) in plans.iter().enumerate() {
        if index.insert(p.name().to_string(), i).is_some() {
            return Err(ConfigError::new(
                Kind::Duplicate,
                format!("plans.{}", p.name()),
                "defined twice",
            ));
        }
    }
    Ok(index)
}

fn validate_soft(t: Option<f64>) -> Result<(), ConfigError> {
    match t {
        Some(t) if !(t > 0.0 && t <= 1.0) => Err(ConfigError::new(
            Kind::OutOfRange,
            "soft_limit",
            format!("{t} is not a share in (0, 1]; use 0.8 for 80%, or 0 to turn soft limits off"),
        )),
        _ => Ok(()),
    }
}
