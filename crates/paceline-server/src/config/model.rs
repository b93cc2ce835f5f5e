//! The serde model of the limits: what a file holds, with every default.
//!
//! A file (TOML, JSON, any serde format) is read into [`LimitsConfig`]; the
//! defaults of a field left out are applied here and nowhere else, and
//! [`LimitsConfig::build`] turns the strings of the file (algorithm names,
//! units, key sources) into the values [`LimitsBuilder`](super::LimitsBuilder) validates. A
//! program embedding the limits in a larger file (the gateway) hands the
//! rest of its file to this model unchanged.

use std::collections::BTreeMap;

use http::header::HeaderName;
use paceline_core::{Algorithm, FailMode, Plan, PlanError, Policy, PolicyError, PolicyKind, Unit};
use paceline_wire::emit::Dialects;
use serde::Deserialize;

use super::error::{ConfigError, ConfigErrorKind as Kind};
use super::{Limits, DEFAULT_PROBLEM_BASE, DEFAULT_SOFT_LIMIT, DEFAULT_USAGE_PATH};
use crate::escalation::EscalationConfig;
use crate::identity::{KeySource, KeyTreatment, TrustedProxies};
use crate::route::{Criticality, Route};

/// The configuration as a file holds it (TOML, JSON, YAML: any serde
/// format). [`LimitsConfig::build`] validates it into [`Limits`].
///
/// Every field may be left out; [`LimitsConfig::default`] holds what a
/// field left out means.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Plans by name.
    pub plans: BTreeMap<String, PlanConfig>,
    /// Keys to plan names.
    pub keys: BTreeMap<String, String>,
    /// Routes, first match wins.
    pub routes: Vec<RouteConfig>,
    /// Where the key comes from: `api_key` (default), `ip`, `route`,
    /// `client_cert` (the subject of a verified TLS client certificate)
    /// or `header:<name>`.
    pub key: String,
    /// The plan for keys not listed under `keys`, counted per key with
    /// their counters published. Without it, an unknown key gets
    /// `unknown_key`.
    pub default_plan: Option<String>,
    /// The per-IP plan of anonymous routes and of requests whose treatment
    /// is `anonymous`; no counters are published for it.
    pub anonymous_plan: Option<String>,
    /// What a request that sends no key gets: `reject` (401, the default)
    /// or `anonymous` (per client IP under `anonymous_plan`).
    pub missing_key: Option<KeyTreatment>,
    /// What a key not listed under `keys` gets when there is no
    /// `default_plan`: `reject` (401, the default) or `anonymous`.
    pub unknown_key: Option<KeyTreatment>,
    /// Networks whose `X-Forwarded-For`/`Forwarded` are believed.
    pub trusted_proxies: Vec<String>,
    /// How `Authorization: Basic` is read with `key = "api_key"`:
    /// `refuse` (401, the default) or `user` (its user part is the key).
    pub basic_auth: crate::identity::BasicAuth,
    /// How many leading bits of an IPv4 client address make one per-IP
    /// key (32, the default: each address alone).
    pub ipv4_prefix: u8,
    /// How many leading bits of an IPv6 client address make one per-IP
    /// key (64, the default: one host's usual share).
    pub ipv6_prefix: u8,
    /// Which header dialects to publish (`ietf`, `x_ratelimit`, `draft03`;
    /// by default the IETF fields alone).
    #[serde(with = "DialectsModel")]
    pub dialects: Dialects,
    /// Soft-limit threshold as a share of a quota; 0 turns it off.
    pub soft_limit: f64,
    /// The usage endpoint's path; empty turns it off.
    pub usage_path: String,
    /// The prefix of problem `type` URIs.
    pub problem_base: String,
    /// Escalation settings.
    pub escalation: EscalationConfig,
    /// The idempotency layer's settings, for the routes that take keys
    /// (`idempotency = "required"` or `"optional"`).
    pub idempotency: IdempotencyConfig,
}

/// The `[idempotency]` table: the idempotency layer's bounds and
/// answers. Every field has a default; see
/// [`IdempotencySettings`](crate::IdempotencySettings).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IdempotencyConfig {
    /// How long a final answer is kept, in seconds (24 h).
    pub ttl_s: u64,
    /// How long a first execution holds its key, in seconds (300).
    pub lease_s: u64,
    /// The largest request body of a request with a key (1 MiB).
    pub max_body_bytes: u64,
    /// The largest answer body kept for replay (256 KiB).
    pub max_answer_bytes: usize,
    /// The longest key (255).
    pub max_key_len: usize,
    /// 409 (the default) or 422 (the IETF draft's) for a key reused with
    /// another request.
    pub conflict_status: u16,
    /// `"reject"` (409 with Retry-After) or `"wait"` (replay the first
    /// answer once it comes) for a duplicate of a request still running.
    pub in_flight: crate::idempotency::InFlight,
    /// The Retry-After of an in-flight answer, in seconds (1).
    pub retry_after_s: u64,
    /// The longest wait in `"wait"` mode, in milliseconds (10 000).
    pub max_wait_ms: u64,
    /// Whether an upstream 5xx is a final answer, stored (false).
    pub store_5xx: bool,
    /// The in-memory store's cap in bytes (64 MiB).
    pub max_store_bytes: usize,
}

impl Default for IdempotencyConfig {
    fn default() -> Self {
        let d = crate::IdempotencySettings::default();
        IdempotencyConfig {
            ttl_s: d.ttl.as_secs(),
            lease_s: d.lease.as_secs(),
            max_body_bytes: d.max_body_bytes,
            max_answer_bytes: d.max_answer_bytes,
            max_key_len: d.max_key_len,
            conflict_status: d.conflict_status,
            in_flight: d.in_flight,
            retry_after_s: d.in_flight_retry_after.as_secs(),
            max_wait_ms: d.max_wait.as_millis() as u64,
            store_5xx: d.store_5xx,
            max_store_bytes: d.max_store_bytes,
        }
    }
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            plans: BTreeMap::new(),
            keys: BTreeMap::new(),
            routes: Vec::new(),
            key: "api_key".into(),
            default_plan: None,
            anonymous_plan: None,
            missing_key: None,
            unknown_key: None,
            trusted_proxies: Vec::new(),
            basic_auth: crate::identity::BasicAuth::default(),
            ipv4_prefix: crate::identity::IpPrefixes::default().v4,
            ipv6_prefix: crate::identity::IpPrefixes::default().v6,
            dialects: Dialects::default(),
            soft_limit: DEFAULT_SOFT_LIMIT,
            usage_path: DEFAULT_USAGE_PATH.into(),
            problem_base: DEFAULT_PROBLEM_BASE.into(),
            escalation: EscalationConfig::default(),
            idempotency: IdempotencyConfig::default(),
        }
    }
}

/// A plan as a file holds it.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanConfig {
    /// The plan's policies, in the order the headers list them.
    pub policies: Vec<PolicyConfig>,
    /// Whether a request whose upstream answer never came (a `502` or
    /// `504` the gateway wrote itself) stays charged; by default (`false`)
    /// its cost is given back.
    #[serde(default)]
    pub charge_upstream_failures: bool,
    /// Whether a request whose upstream failed after its head was sent
    /// (a `504`, or a `502` for a malformed or oversized answer) is given
    /// its charge back too; by default (`false`) only failures before the
    /// head left are refunded, since the upstream may have done the work.
    #[serde(default)]
    pub refund_sent_failures: bool,
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
    /// No limit at all on this route, for anyone, and no fields published
    /// (health checks). Nothing else passes unlimited.
    #[serde(default)]
    pub unlimited: bool,
    /// `"required"` or `"optional"`: the route takes idempotency keys.
    #[serde(default)]
    pub idempotency: Option<crate::idempotency::IdempotencyMode>,
}

fn any_method() -> String {
    "*".into()
}
fn one() -> u64 {
    1
}

/// How a file spells [`Dialects`]: its own fields, each optional (a field
/// left out keeps the value of `Dialects::default`). The derive checks
/// these fields against the wire type, so the two cannot drift apart.
#[derive(Deserialize)]
#[serde(remote = "Dialects", deny_unknown_fields, default)]
struct DialectsModel {
    ietf: bool,
    x_ratelimit: bool,
    draft03: bool,
}

impl Default for DialectsModel {
    fn default() -> Self {
        let Dialects {
            ietf,
            x_ratelimit,
            draft03,
        } = Dialects::default();
        DialectsModel {
            ietf,
            x_ratelimit,
            draft03,
        }
    }
}

impl LimitsConfig {
    /// Validates into [`Limits`], keys hashed under this process's random
    /// secret.
    pub fn build(self) -> Result<Limits, ConfigError> {
        self.build_with_hasher(crate::KeyHasher::per_process().clone())
    }

    /// Validates into [`Limits`] whose keys are hashed by `hasher` (a
    /// deployment's secret).
    pub fn build_with_hasher(self, hasher: crate::KeyHasher) -> Result<Limits, ConfigError> {
        let mut b = Limits::builder().key_hasher(hasher);
        for (name, plan) in &self.plans {
            b = b
                .plan(build_plan(name, plan)?)
                .charge_upstream_failures(name, plan.charge_upstream_failures)
                .refund_sent_failures(name, plan.refund_sent_failures);
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
        if let Some(t) = self.missing_key {
            b = b.missing_key(t);
        }
        if let Some(t) = self.unknown_key {
            b = b.unknown_key(t);
        }
        if self.plans.is_empty() {
            return Err(ConfigError::new(
                Kind::Missing,
                "plans",
                "no plan is defined: give at least one, as [plans.free] with its policies",
            ));
        }
        let trusted = TrustedProxies::parse(&self.trusted_proxies)
            .map_err(|m| ConfigError::new(Kind::InvalidValue, "trusted_proxies", m))?;
        let prefixes = crate::identity::IpPrefixes {
            v4: self.ipv4_prefix,
            v6: self.ipv6_prefix,
        };
        b.trusted_proxies(trusted)
            .basic_auth(self.basic_auth)
            .ip_prefixes(prefixes)
            .dialects(self.dialects)
            .soft_limit((self.soft_limit != 0.0).then_some(self.soft_limit))
            .usage_path((!self.usage_path.is_empty()).then_some(self.usage_path.as_str()))
            .problem_base(&self.problem_base)
            .escalation(self.escalation)
            .idempotency(self.idempotency.settings()?)
            .build()
    }
}

impl IdempotencyConfig {
    /// The layer's settings, every bound checked (the problem base is the
    /// limits' own, set when they are built).
    pub fn settings(&self) -> Result<crate::IdempotencySettings, ConfigError> {
        let range = |f: &str, m: String| {
            Err(ConfigError::new(
                Kind::OutOfRange,
                format!("idempotency.{f}"),
                m,
            ))
        };
        if self.ttl_s == 0 {
            return range("ttl_s", "must be at least 1 second".into());
        }
        if self.lease_s == 0 {
            return range("lease_s", "must be at least 1 second".into());
        }
        if self.max_body_bytes == 0 {
            return range("max_body_bytes", "must be at least 1".into());
        }
        if self.max_key_len == 0 || self.max_key_len > 8192 {
            return range("max_key_len", "must be 1-8192".into());
        }
        if !matches!(self.conflict_status, 409 | 422) {
            return Err(ConfigError::new(
                Kind::InvalidValue,
                "idempotency.conflict_status",
                format!("{}: use 409 or 422", self.conflict_status),
            ));
        }
        if self.retry_after_s == 0 {
            return range("retry_after_s", "must be at least 1 second".into());
        }
        if self.max_wait_ms == 0 || self.max_wait_ms > self.lease_s.saturating_mul(1000) {
            return range(
                "max_wait_ms",
                format!("must be 1 to the lease ({} s)", self.lease_s),
            );
        }
        let floor = self.max_answer_bytes.saturating_add(64 * 1024);
        if self.max_answer_bytes == 0 {
            return range("max_answer_bytes", "must be at least 1".into());
        }
        if self.max_store_bytes < floor {
            return range(
                "max_store_bytes",
                format!(
                    "must hold at least one answer of max_answer_bytes and 64 KiB more ({floor})"
                ),
            );
        }
        Ok(crate::IdempotencySettings {
            ttl: std::time::Duration::from_secs(self.ttl_s),
            lease: std::time::Duration::from_secs(self.lease_s),
            max_body_bytes: self.max_body_bytes,
            max_answer_bytes: self.max_answer_bytes,
            max_key_len: self.max_key_len,
            conflict_status: self.conflict_status,
            in_flight: self.in_flight,
            in_flight_retry_after: std::time::Duration::from_secs(self.retry_after_s),
            max_wait: std::time::Duration::from_millis(self.max_wait_ms),
            store_5xx: self.store_5xx,
            max_store_bytes: self.max_store_bytes,
            ..Default::default()
        })
    }
}

fn parse_key_source(s: &str) -> Result<KeySource, ConfigError> {
    match s {
        "api_key" => Ok(KeySource::ApiKey),
        "ip" => Ok(KeySource::ClientIp),
        "route" => Ok(KeySource::Route),
        "client_cert" => Ok(KeySource::ClientCert),
        other => {
            let name = other.strip_prefix("header:").ok_or_else(|| {
                ConfigError::new(
                    Kind::InvalidValue,
                    "key",
                    format!("{other:?}: use api_key, ip, route, client_cert or header:<name>"),
                )
            })?;
            HeaderName::from_bytes(name.trim().as_bytes())
                .map(KeySource::Header)
                .map_err(|_| {
                    ConfigError::new(
                        Kind::InvalidValue,
                        "key",
                        format!("{name:?} is not a header name"),
                    )
                })
        }
    }
}

fn build_route(i: usize, r: &RouteConfig) -> Result<Route, ConfigError> {
    let field = |f: &str| format!("routes[{i}].{f}");
    let route = Route::new(&r.method, &r.path).map_err(|e| {
        let f = if e.is_method() { "method" } else { "path" };
        ConfigError::new(Kind::InvalidValue, field(f), e.to_string())
    })?;
    let mut route = route.with_cost(r.cost).with_criticality(r.criticality);
    if let Some(mode) = r.idempotency {
        let takes_keys = route
            .method()
            .is_none_or(|m| *m == http::Method::POST || *m == http::Method::PATCH);
        if !takes_keys {
            return Err(ConfigError::new(
                Kind::InvalidValue,
                field("idempotency"),
                format!(
                    "only POST and PATCH requests take idempotency keys; this route is {}",
                    r.method
                ),
            ));
        }
        route = route.with_idempotency(mode);
    }
    if r.unlimited && (r.anonymous || r.plan.is_some()) {
        return Err(ConfigError::new(
            Kind::InvalidValue,
            field("unlimited"),
            "an unlimited route is neither anonymous nor on a plan",
        ));
    }
    if r.unlimited {
        Ok(route.unlimited())
    } else if r.anonymous {
        Ok(route.anonymous(r.plan.as_deref()))
    } else if r.plan.is_some() {
        Err(ConfigError::new(
            Kind::InvalidValue,
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
    Plan::new(name, policies).map_err(|e| {
        let kind = match e {
            PlanError::DuplicatePolicy(_) => Kind::Duplicate,
            PlanError::Empty => Kind::Missing,
            PlanError::TooMany(_) => Kind::OutOfRange,
            _ => Kind::InvalidPolicy,
        };
        ConfigError::new(kind, format!("plans.{name}"), e.to_string())
    })
}

fn build_policy(field: &str, p: &PolicyConfig) -> Result<Policy, ConfigError> {
    let err = |f: &str, m: String| ConfigError::new(Kind::InvalidPolicy, format!("{field}.{f}"), m);
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
            PolicyError::ZeroQuota | PolicyError::LogTooLarge(_) | PolicyError::RateTooHigh => "q",
            PolicyError::ZeroWindow | PolicyError::WindowTooLong => "w",
            PolicyError::BadOffset => "reset_at",
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
