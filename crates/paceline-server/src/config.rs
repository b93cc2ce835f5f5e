//! The configuration model: plans, keys, routes, proxies, dialects.
//!
//! Two doors lead to the same validated [`Limits`]: the [`LimitsBuilder`]
//! for code, and [`LimitsConfig`], a serde model a gateway reads from a
//! file. Either way a configuration that cannot work (a key on a plan that
//! does not exist, a policy with a zero window, a threshold above 100%)
//! is refused with a [`ConfigError`] naming the field.
//!
//! ```
//! use paceline_server::{Limits, LimitsConfig, Route};
//! use paceline_core::{Plan, Policy};
//!
//! // in code
//! let free = Plan::new("free", vec![
//!     Policy::token_bucket("burst", 20, 2).unwrap(),
//!     Policy::daily("daily", 10_000).unwrap(),
//! ]).unwrap();
//! let limits = Limits::builder()
//!     .plan(free)
//!     .key("sk_live_1", "free")
//!     .route(Route::new("POST", "/v1/labels:batch").unwrap().with_cost(10))
//!     .build()
//!     .unwrap();
//! assert_eq!(limits.plan_for_key("sk_live_1").unwrap().name(), "free");
//!
//! // from a file (any serde format; JSON here)
//! let cfg: LimitsConfig = serde_json::from_str(r#"{
//!     "plans": {"free": {"policies": [
//!         {"name": "burst", "algorithm": "token_bucket", "q": 20, "w": 2},
//!         {"name": "daily", "algorithm": "daily", "q": 10000}
//!     ]}},
//!     "keys": {"sk_live_1": "free", "sk_live_2": "gold"}
//! }"#).unwrap();
//! let err = cfg.build().unwrap_err();
//! assert_eq!(err.field(), "keys.sk_live_2");
//! ```

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;

use http::header::HeaderName;
use paceline_core::{Algorithm, FailMode, Plan, Policy, PolicyKind, Unit};
use paceline_wire::emit::Dialects;
use serde::Deserialize;

use crate::escalation::EscalationConfig;
use crate::identity::{KeyHash, KeySource, TrustedProxies};
use crate::route::{Criticality, Route};

/// The default path of the usage endpoint.
pub const DEFAULT_USAGE_PATH: &str = "/v1/usage";
/// The default prefix of problem `type` URIs (the code is appended).
pub const DEFAULT_PROBLEM_BASE: &str = "https://paceline.invalid/problems/";
/// The default soft-limit threshold, as a share of a quota.
pub const DEFAULT_SOFT_LIMIT: f64 = 0.8;

/// A configuration mistake, naming the field and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    field: String,
    message: String,
}

impl ConfigError {
    pub(crate) fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError {
            field: field.into(),
            message: message.into(),
        }
    }
    /// The field at fault, as a path (`plans.free.policies[1].w`).
    pub fn field(&self) -> &str {
        &self.field
    }
    /// What is wrong and how to fix it.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

impl std::error::Error for ConfigError {}

/// A validated configuration, ready for the layer. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Limits {
    pub(crate) inner: Arc<LimitsInner>,
}

#[derive(Debug)]
pub(crate) struct LimitsInner {
    pub(crate) plans: Vec<Plan>,
    /// Per plan: its name and its policies' names, shared with metric labels.
    pub(crate) names: Vec<(Arc<str>, Vec<Arc<str>>)>,
    /// Per plan: the parts of its responses that never change.
    pub(crate) meta: Vec<paceline_wire::emit::PreparedPlan>,
    /// Per plan: its metric keys.
    pub(crate) metric_keys: Vec<crate::telemetry::PlanKeys>,
    /// Configured keys, each to its entry in `key_entries`.
    pub(crate) keys: HashMap<String, usize, ahash::RandomState>,
    /// Per configured key: its plan, and the key as the store sees it.
    pub(crate) key_entries: Vec<KeyEntry>,
    pub(crate) routes: Vec<(Route, Option<usize>)>,
    pub(crate) key_source: KeySource,
    pub(crate) default_plan: Option<usize>,
    pub(crate) anonymous_plan: Option<usize>,
    pub(crate) trusted: TrustedProxies,
    pub(crate) dialects: Dialects,
    pub(crate) soft_limit: Option<f64>,
    pub(crate) usage_path: Option<String>,
    pub(crate) problem_base: String,
    pub(crate) escalation: EscalationConfig,
}

/// A configured key, prepared so that a request carrying it needs neither
/// an allocation nor a hash to be told apart.
#[derive(Debug)]
pub(crate) struct KeyEntry {
    pub(crate) plan: usize,
    /// The key with its source's prefix, as the store sees it.
    pub(crate) stored: Box<str>,
    pub(crate) hash: KeyHash,
}

impl KeyEntry {
    fn new(prefix: &str, key: &str, plan: usize) -> KeyEntry {
        let stored: Box<str> = format!("{prefix}{key}").into();
        KeyEntry {
            plan,
            hash: KeyHash::of(&stored),
            stored,
        }
    }
}

/// What the store key of a request starts with, by where the key came from.
pub(crate) fn key_prefix(source: &KeySource) -> &'static str {
    match source {
        KeySource::ApiKey => "k:",
        KeySource::ClientIp => "ip:",
        KeySource::Route => "r:",
        KeySource::Header(_) => "h:",
    }
}

impl Limits {
    /// Starts a builder.
    pub fn builder() -> LimitsBuilder {
        LimitsBuilder::default()
    }
    /// The plans.
    pub fn plans(&self) -> &[Plan] {
        &self.inner.plans
    }
    /// The plan named `name`.
    pub fn plan(&self, name: &str) -> Option<&Plan> {
        self.inner.plans.iter().find(|p| p.name() == name)
    }
    /// The plan a key is on (its own, or the default plan).
    pub fn plan_for_key(&self, key: &str) -> Option<&Plan> {
        let i = self
            .inner
            .keys
            .get(key)
            .map(|&i| self.inner.key_entries[i].plan)
            .or(self.inner.default_plan)?;
        Some(&self.inner.plans[i])
    }
    /// The routes, in matching order.
    pub fn routes(&self) -> impl Iterator<Item = &Route> {
        self.inner.routes.iter().map(|(r, _)| r)
    }
    /// The first route matching a request.
    pub fn route(&self, method: &http::Method, path: &str) -> Option<&Route> {
        self.routes().find(|r| r.matches(method, path))
    }
    /// The usage endpoint's path, if it is on.
    pub fn usage_path(&self) -> Option<&str> {
        self.inner.usage_path.as_deref()
    }
    /// The header dialects published.
    pub fn dialects(&self) -> &Dialects {
        &self.inner.dialects
    }
    /// The soft-limit threshold, if soft limits are on.
    pub fn soft_limit(&self) -> Option<f64> {
        self.inner.soft_limit
    }
    /// The escalation settings.
    pub fn escalation(&self) -> &EscalationConfig {
        &self.inner.escalation
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
    trusted: TrustedProxies,
    dialects: Dialects,
    soft_limit: Option<f64>,
    usage_path: Option<String>,
    problem_base: String,
    escalation: EscalationConfig,
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
            trusted: TrustedProxies::none(),
            dialects: Dialects::default(),
            soft_limit: Some(DEFAULT_SOFT_LIMIT),
            usage_path: Some(DEFAULT_USAGE_PATH.to_string()),
            problem_base: DEFAULT_PROBLEM_BASE.to_string(),
            escalation: EscalationConfig::default(),
        }
    }
}

impl LimitsBuilder {
    /// Adds a plan.
    pub fn plan(mut self, plan: Plan) -> Self {
        self.plans.push(plan);
        self
    }
    /// Puts `key` (an API key, or a header value or IP address with other
    /// key sources) on the plan named `plan`.
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
    /// The plan for keys not listed.
    pub fn default_plan(mut self, plan: &str) -> Self {
        self.default_plan = Some(plan.to_string());
        self
    }
    /// The per-IP plan for requests without a known key (no counters are
    /// published for it). Without one, such requests pass unlimited.
    pub fn anonymous_plan(mut self, plan: &str) -> Self {
        self.anonymous_plan = Some(plan.to_string());
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

    /// Validates and builds.
    pub fn build(self) -> Result<Limits, ConfigError> {
        let index = plan_index(&self.plans)?;
        let find = |field: &str, name: &str| {
            index.get(name).copied().ok_or_else(|| {
                ConfigError::new(
                    field,
                    format!("no plan named {name:?}; plans are {:?}", names(&self.plans)),
                )
            })
        };
        let mut keys = HashMap::with_capacity_and_hasher(self.keys.len(), Default::default());
        let mut key_entries = Vec::with_capacity(self.keys.len());
        let prefix = key_prefix(&self.key_source);
        for (k, p) in &self.keys {
            if k.is_empty() {
                return Err(ConfigError::new("keys", "a key may not be empty"));
            }
            let entry = KeyEntry::new(prefix, k, find(&format!("keys.{k}"), p)?);
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
        let mut routes = Vec::with_capacity(self.routes.len());
        for (i, r) in self.routes.into_iter().enumerate() {
            let anon = match (r.is_anonymous(), r.plan()) {
                (true, Some(p)) => Some(find(&format!("routes[{i}].plan"), p)?),
                (true, None) if anonymous_plan.is_none() => {
                    return Err(ConfigError::new(
                        format!("routes[{i}].plan"),
                        "an anonymous route needs a plan, or set anonymous_plan",
                    ))
                }
                _ => None,
            };
            routes.push((r, anon));
        }
        validate_soft(self.soft_limit)?;
        if let Some(p) = &self.usage_path {
            if !p.starts_with('/') {
                return Err(ConfigError::new(
                    "usage_path",
                    format!("{p:?} must start with '/'"),
                ));
            }
        }
        if self.problem_base.is_empty() {
            return Err(ConfigError::new("problem_base", "must not be empty"));
        }
        self.escalation
            .validate()
            .map_err(|(f, m)| ConfigError::new(f, m))?;
        let names: Vec<(Arc<str>, Vec<Arc<str>>)> = self
            .plans
            .iter()
            .map(|p| {
                (
                    Arc::from(p.name()),
                    p.policies().iter().map(|q| Arc::from(q.name())).collect(),
                )
            })
            .collect();
        let meta = self
            .plans
            .iter()
            .map(|p| paceline_wire::emit::PreparedPlan::new(p, &self.problem_base, &self.dialects))
            .collect();
        let metric_keys = names
            .iter()
            .map(|(plan, policies)| crate::telemetry::PlanKeys::new(plan, policies))
            .collect();
        Ok(Limits {
            inner: Arc::new(LimitsInner {
                plans: self.plans,
                names,
                meta,
                metric_keys,
                keys,
                key_entries,
                routes,
                key_source: self.key_source,
                default_plan,
                anonymous_plan,
                trusted: self.trusted,
                dialects: self.dialects,
                soft_limit: self.soft_limit,
                usage_path: self.usage_path,
                problem_base: self.problem_base,
                escalation: self.escalation,
            }),
        })
    }
}

fn names(plans: &[Plan]) -> Vec<&str> {
    plans.iter().map(|p| p.name()).collect()
}

fn plan_index(plans: &[Plan]) -> Result<HashMap<String, usize>, ConfigError> {
    let mut index = HashMap::new();
    for (i, p) in plans.iter().enumerate() {
        if index.insert(p.name().to_string(), i).is_some() {
            return Err(ConfigError::new(
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
            "soft_limit",
            format!("{t} is not a share in (0, 1]; use 0.8 for 80%, or 0 to turn soft limits off"),
        )),
        _ => Ok(()),
    }
}

// ---------------------------------------------------------------------------
// The serde model
// ---------------------------------------------------------------------------

/// The configuration as a file holds it (TOML, JSON, YAML: any serde
/// format). [`LimitsConfig::build`] validates it into [`Limits`].
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// Plans by name.
    #[serde(default)]
    pub plans: BTreeMap<String, PlanConfig>,
    /// Keys to plan names.
    #[serde(default)]
    pub keys: BTreeMap<String, String>,
    /// Routes, first match wins.
    #[serde(default)]
    pub routes: Vec<RouteConfig>,
    /// Where the key comes from: `api_key` (default), `ip`, `route`, or
    /// `header:<name>`.
    #[serde(default = "default_key")]
    pub key: String,
    /// The plan for keys not listed under `keys`.
    #[serde(default)]
    pub default_plan: Option<String>,
    /// The per-IP plan for requests without a known key.
    #[serde(default)]
    pub anonymous_plan: Option<String>,
    /// Networks whose `X-Forwarded-For`/`Forwarded` are believed.
    #[serde(default)]
    pub trusted_proxies: Vec<String>,
    /// Which header dialects to publish.
    #[serde(default)]
    pub dialects: DialectsConfig,
    /// Soft-limit threshold as a share of a quota; 0 turns it off.
    #[serde(default = "default_soft")]
    pub soft_limit: f64,
    /// The usage endpoint's path; empty turns it off.
    #[serde(default = "default_usage")]
    pub usage_path: String,
    /// The prefix of problem `type` URIs.
    #[serde(default = "default_base")]
    pub problem_base: String,
    /// Escalation settings.
    #[serde(default)]
    pub escalation: EscalationConfig,
}

fn default_key() -> String {
    "api_key".into()
}
fn default_soft() -> f64 {
    DEFAULT_SOFT_LIMIT
}
fn default_usage() -> String {
    DEFAULT_USAGE_PATH.into()
}
fn default_base() -> String {
    DEFAULT_PROBLEM_BASE.into()
}

/// A plan as a file holds it.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanConfig {
    /// The plan's policies, in the order the headers list them.
    pub policies: Vec<PolicyConfig>,
}

/// A policy as a file holds it.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyConfig {
    /// The name published in headers (`burst`, `daily`).
    pub name: String,
    /// `token_bucket`, `fixed_window`, `daily`, `sliding_log`,
    /// `sliding_counter` or `concurrency`.
    pub algorithm: String,
    /// The quota.
    pub q: u64,
    /// The window in seconds (not for `daily` or `concurrency`).
    #[serde(default)]
    pub w: Option<u64>,
    /// For `daily`: the time of day (UTC, `HH:MM`) the quota resets.
    #[serde(default)]
    pub reset_at: Option<String>,
    /// `requests` (default) or `content-bytes`.
    #[serde(default)]
    pub unit: Option<String>,
    /// `burst` or `quota`, overriding the classification by window length.
    #[serde(default)]
    pub kind: Option<String>,
    /// Shadow mode: decide, publish and count, never reject.
    #[serde(default)]
    pub shadow: bool,
    /// `open` (default) or `closed`: what a store outage means.
    #[serde(default)]
    pub fail: Option<String>,
}

/// A route as a file holds it.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// The method, or `*` (default) for any.
    #[serde(default = "any_method")]
    pub method: String,
    /// The path pattern (`/v1/labels/{id}`, `/v1/{*rest}`).
    pub path: String,
    /// The cost (default 1).
    #[serde(default = "one")]
    pub cost: u64,
    /// `CRITICAL_PLUS`, `CRITICAL` (default), `SHEDDABLE_PLUS`, `SHEDDABLE`.
    #[serde(default)]
    pub criticality: Criticality,
    /// Limit per client IP and publish no counters (login pages).
    #[serde(default)]
    pub anonymous: bool,
    /// The per-IP plan of an anonymous route.
    #[serde(default)]
    pub plan: Option<String>,
}

fn any_method() -> String {
    "*".into()
}
fn one() -> u64 {
    1
}

/// Which header dialects to publish.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DialectsConfig {
    /// IETF draft `RateLimit` / `RateLimit-Policy` (default on).
    pub ietf: bool,
    /// `X-RateLimit-Limit/-Remaining/-Reset`.
    pub x_ratelimit: bool,
    /// draft-03 `RateLimit-Limit/-Remaining/-Reset`.
    pub draft03: bool,
}

impl Default for DialectsConfig {
    fn default() -> Self {
        DialectsConfig {
            ietf: true,
            x_ratelimit: false,
            draft03: false,
        }
    }
}

impl LimitsConfig {
    /// Validates into [`Limits`].
    pub fn build(self) -> Result<Limits, ConfigError> {
        let mut b = Limits::builder();
        for (name, plan) in &self.plans {
            b = b.plan(build_plan(name, plan)?);
        }
        for (k, p) in &self.keys {
            b = b.key(k, p);
        }
        for (i, r) in self.routes.iter().enumerate() {
            b = b.route(build_route(i, r)?);
        }
        b = b.key_source(parse_key_source(&self.key)?);
        if let Some(p) = &self.default_plan {
            b = b.default_plan(p);
        }
        if let Some(p) = &self.anonymous_plan {
            b = b.anonymous_plan(p);
        }
        let trusted = TrustedProxies::parse(&self.trusted_proxies)
            .map_err(|m| ConfigError::new("trusted_proxies", m))?;
        let d = &self.dialects;
        b.trusted_proxies(trusted)
            .dialects(Dialects {
                ietf: d.ietf,
                x_ratelimit: d.x_ratelimit,
                draft03: d.draft03,
            })
            .soft_limit((self.soft_limit != 0.0).then_some(self.soft_limit))
            .usage_path((!self.usage_path.is_empty()).then_some(self.usage_path.as_str()))
            .problem_base(&self.problem_base)
            .escalation(self.escalation)
            .build()
    }
}

fn parse_key_source(s: &str) -> Result<KeySource, ConfigError> {
    match s {
        "api_key" => Ok(KeySource::ApiKey),
        "ip" => Ok(KeySource::ClientIp),
        "route" => Ok(KeySource::Route),
        other => {
            let name = other.strip_prefix("header:").ok_or_else(|| {
                ConfigError::new(
                    "key",
                    format!("{other:?}: use api_key, ip, route or header:<name>"),
                )
            })?;
            HeaderName::from_bytes(name.trim().as_bytes())
                .map(KeySource::Header)
                .map_err(|_| ConfigError::new("key", format!("{name:?} is not a header name")))
        }
    }
}

fn build_route(i: usize, r: &RouteConfig) -> Result<Route, ConfigError> {
    let field = |f: &str| format!("routes[{i}].{f}");
    let route = Route::new(&r.method, &r.path).map_err(|e| {
        let f = if e.to_string().contains("method") {
            "method"
        } else {
            "path"
        };
        ConfigError::new(field(f), e.to_string())
    })?;
    let route = route.with_cost(r.cost).with_criticality(r.criticality);
    if r.anonymous {
        Ok(route.anonymous(r.plan.as_deref()))
    } else if r.plan.is_some() {
        Err(ConfigError::new(
            field("plan"),
            "only anonymous routes name a plan",
        ))
    } else {
        Ok(route)
    }
}

fn build_plan(name: &str, plan: &PlanConfig) -> Result<Plan, ConfigError> {
    let policies = plan
        .policies
        .iter()
        .enumerate()
        .map(|(i, p)| build_policy(&format!("plans.{name}.policies[{i}]"), p))
        .collect::<Result<Vec<_>, _>>()?;
    Plan::new(name, policies).map_err(|e| ConfigError::new(format!("plans.{name}"), e.to_string()))
}

fn build_policy(field: &str, p: &PolicyConfig) -> Result<Policy, ConfigError> {
    let err = |f: &str, m: String| ConfigError::new(format!("{field}.{f}"), m);
    let need_w = || {
        p.w.ok_or_else(|| err("w", format!("{} needs a window w in seconds", p.algorithm)))
    };
    let algorithm = match p.algorithm.as_str() {
        "token_bucket" => Algorithm::TokenBucket,
        "fixed_window" => Algorithm::FixedWindow { offset_s: 0 },
        "daily" => Algorithm::FixedWindow {
            offset_s: p.reset_at.as_deref().map(parse_hhmm).transpose().map_err(|m| err("reset_at", m))?.unwrap_or(0),
        },
        "sliding_log" => Algorithm::SlidingLog,
        "sliding_counter" => Algorithm::SlidingCounter,
        "concurrency" => Algorithm::Concurrency,
        other => {
            return Err(err(
                "algorithm",
                format!("{other:?}: use token_bucket, fixed_window, daily, sliding_log, sliding_counter or concurrency"),
            ))
        }
    };
    if p.reset_at.is_some() && p.algorithm != "daily" {
        return Err(err(
            "reset_at",
            "only a daily policy has a reset time".into(),
        ));
    }
    let w = match p.algorithm.as_str() {
        "daily" | "concurrency" if p.w.is_some() => {
            return Err(err(
                "w",
                format!("a {} policy has a fixed window; remove w", p.algorithm),
            ))
        }
        "daily" => paceline_core::policy::DAY_SECS,
        "concurrency" => 1,
        _ => need_w()?,
    };
    let mut policy = Policy::new(&p.name, algorithm, p.q, w).map_err(|e| {
        let f = match e {
            paceline_core::PolicyError::ZeroQuota
            | paceline_core::PolicyError::LogTooLarge(_)
            | paceline_core::PolicyError::RateTooHigh => "q",
            paceline_core::PolicyError::ZeroWindow | paceline_core::PolicyError::WindowTooLong => {
                "w"
            }
            paceline_core::PolicyError::BadOffset => "reset_at",
            _ => "name",
        };
        err(f, e.to_string())
    })?;
    if let Some(u) = &p.unit {
        let unit = match u.as_str() {
            "requests" => Unit::Requests,
            "content-bytes" => Unit::ContentBytes,
            "concurrent-requests" => Unit::ConcurrentRequests,
            other => {
                return Err(err(
                    "unit",
                    format!("{other:?}: use requests, content-bytes or concurrent-requests"),
                ))
            }
        };
        policy = policy
            .with_unit(unit)
            .map_err(|e| err("unit", e.to_string()))?;
    }
    if let Some(k) = &p.kind {
        policy = policy.with_kind(match k.as_str() {
            "burst" => PolicyKind::Burst,
            "quota" => PolicyKind::Quota,
            other => return Err(err("kind", format!("{other:?}: use burst or quota"))),
        });
    }
    if let Some(f) = &p.fail {
        policy = policy.with_fail_mode(match f.as_str() {
            "open" => FailMode::Open,
            "closed" => FailMode::Closed,
            other => return Err(err("fail", format!("{other:?}: use open or closed"))),
        });
    }
    Ok(policy.with_shadow(p.shadow))
}

fn parse_hhmm(s: &str) -> Result<u64, String> {
    let bad = || format!("{s:?}: write the UTC time of day as HH:MM");
    let (h, m) = s.split_once(':').ok_or_else(bad)?;
    let h: u64 = h.parse().map_err(|_| bad())?;
    let m: u64 = m.parse().map_err(|_| bad())?;
    if h > 23 || m > 59 {
        return Err(bad());
    }
    Ok(h * 3600 + m * 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> serde_json::Value {
        serde_json::json!({
            "plans": {
                "free": {"policies": [
                    {"name": "burst", "algorithm": "token_bucket", "q": 20, "w": 2},
                    {"name": "daily", "algorithm": "daily", "q": 10000}
                ]},
                "login": {"policies": [{"name": "login", "algorithm": "fixed_window", "q": 5, "w": 60}]}
            },
            "keys": {"sk_1": "free"},
            "routes": [
                {"method": "POST", "path": "/v1/login", "anonymous": true, "plan": "login"},
                {"method": "POST", "path": "/v1/labels:batch", "cost": 10, "criticality": "CRITICAL_PLUS"}
            ],
            "trusted_proxies": ["10.0.0.0/8"]
        })
    }

    fn build(v: serde_json::Value) -> Result<Limits, ConfigError> {
        serde_json::from_value::<LimitsConfig>(v).unwrap().build()
    }

    fn field_of(patch: impl FnOnce(&mut serde_json::Value)) -> String {
        let mut v = base();
        patch(&mut v);
        build(v).unwrap_err().field().to_string()
    }

    #[test]
    fn a_good_config_builds() {
        let l = build(base()).unwrap();
        assert_eq!(l.plans().len(), 2);
        let r = l.route(&http::Method::POST, "/v1/labels:batch").unwrap();
        assert_eq!((r.cost(), r.criticality()), (10, Criticality::CriticalPlus));
        assert!(l
            .route(&http::Method::POST, "/v1/login")
            .unwrap()
            .is_anonymous());
        assert_eq!(l.usage_path(), Some("/v1/usage"));
        assert_eq!(l.soft_limit(), Some(0.8));
    }

    #[test]
    fn every_mistake_names_its_field() {
        assert_eq!(field_of(|v| v["keys"]["sk_2"] = "gold".into()), "keys.sk_2");
        assert_eq!(
            field_of(|v| v["plans"]["free"]["policies"][0]["w"] = 0.into()),
            "plans.free.policies[0].w"
        );
        assert_eq!(
            field_of(|v| v["plans"]["free"]["policies"][1]["w"] = 5.into()),
            "plans.free.policies[1].w"
        );
        assert_eq!(
            field_of(|v| v["plans"]["free"]["policies"][0]["algorithm"] = "leaky".into()),
            "plans.free.policies[0].algorithm"
        );
        assert_eq!(
            field_of(|v| v["plans"]["free"]["policies"][1]["reset_at"] = "25:00".into()),
            "plans.free.policies[1].reset_at"
        );
        assert_eq!(
            field_of(|v| v["plans"]["free"]["policies"][1]["name"] = "burst".into()),
            "plans.free"
        );
        assert_eq!(
            field_of(|v| v["routes"][0]["plan"] = "nope".into()),
            "routes[0].plan"
        );
        assert_eq!(
            field_of(|v| v["routes"][1]["path"] = "v1".into()),
            "routes[1].path"
        );
        assert_eq!(
            field_of(|v| v["trusted_proxies"][0] = "ten".into()),
            "trusted_proxies"
        );
        assert_eq!(field_of(|v| v["soft_limit"] = 1.5.into()), "soft_limit");
        assert_eq!(field_of(|v| v["key"] = "cookie".into()), "key");
        assert_eq!(
            field_of(|v| v["default_plan"] = "gold".into()),
            "default_plan"
        );
        assert_eq!(field_of(|v| v["usage_path"] = "usage".into()), "usage_path");
    }

    #[test]
    fn unknown_fields_are_refused() {
        let mut v = base();
        v["plans"]["free"]["policies"][0]["qq"] = 1.into();
        assert!(serde_json::from_value::<LimitsConfig>(v).is_err());
    }

    #[test]
    fn daily_reset_time() {
        let mut v = base();
        v["plans"]["free"]["policies"][1]["reset_at"] = "06:30".into();
        let l = build(v).unwrap();
        let daily = l.plan("free").unwrap().policy(1);
        assert_eq!(
            daily.algorithm(),
            Algorithm::FixedWindow {
                offset_s: 6 * 3600 + 1800
            }
        );
    }
}
