//! The configuration model: plans, keys, routes, proxies, dialects.
//!
//! Two doors lead to the same validated [`Limits`]: the [`LimitsBuilder`]
//! for code, and [`LimitsConfig`], a serde model a gateway reads from a
//! file. Either way a configuration that cannot work (a key on a plan that
//! does not exist, a policy with a zero window, a threshold above 100%)
//! is refused with a [`ConfigError`] naming the field and telling its
//! [kind](ConfigErrorKind).
//!
//! The parts: `model`, the serde model [`LimitsConfig`] with the defaults
//! of every field; `compile`, the [`LimitsBuilder`] that validates and
//! turns each plan into one compiled value; `error`, the typed
//! [`ConfigError`].
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
//! assert_eq!(err.kind(), paceline_server::ConfigErrorKind::UnknownPlan);
//! ```

mod compile;
mod error;
mod model;

use std::collections::HashMap;
use std::sync::Arc;

use paceline_core::Plan;
use paceline_wire::emit::Dialects;

use crate::escalation::EscalationConfig;
use crate::identity::{KeyHash, KeyHasher, KeySource, KeyTreatment, TrustedProxies};
use crate::route::{Route, RouteInfo};

pub(crate) use compile::CompiledPlan;
pub use compile::LimitsBuilder;
pub use error::{ConfigError, ConfigErrorKind};
pub use model::{
    ConsumerHeaderConfig, IdempotencyConfig, JwtConfig, LimitsConfig, PlanConfig, PolicyConfig,
    RouteConfig,
};

/// The default path of the usage endpoint.
pub const DEFAULT_USAGE_PATH: &str = "/v1/usage";
/// The default prefix of problem `type` URIs (the code is appended).
pub const DEFAULT_PROBLEM_BASE: &str = "https://paceline.invalid/problems/";
/// The default soft-limit threshold, as a share of a quota.
pub const DEFAULT_SOFT_LIMIT: f64 = 0.8;

/// A validated configuration, ready for the layer. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Limits {
    pub(crate) inner: Arc<LimitsInner>,
}

#[derive(Debug)]
pub(crate) struct LimitsInner {
    /// The plans, each with what its responses and metrics need.
    pub(crate) plans: Vec<CompiledPlan>,
    /// Configured keys, each to its entry in `key_entries`.
    pub(crate) keys: HashMap<String, usize, ahash::RandomState>,
    /// Per configured key: its plan, and the key as the store sees it.
    pub(crate) key_entries: Vec<KeyEntry>,
    /// Keys configured hashed (`sha256:<hex>`): their SHA-256 to their
    /// plan. Empty unless some are: no key is hashed per request then.
    pub(crate) hashed: HashMap<[u8; 32], usize>,
    /// With `key = "jwt"`: how tokens are verified.
    pub(crate) jwt: Option<Box<VerifiedJwt>>,
    /// With `key = "consumer_header"`: the headers believed.
    pub(crate) consumer: Option<Box<Consumer>>,
    /// The plans by name.
    pub(crate) plan_index: HashMap<String, usize>,
    pub(crate) routes: Vec<(Route, Option<usize>)>,
    pub(crate) key_source: KeySource,
    pub(crate) default_plan: Option<usize>,
    pub(crate) anonymous_plan: Option<usize>,
    /// What a request without a key gets.
    pub(crate) missing_key: KeyTreatment,
    /// What an unlisted key gets when there is no default plan.
    pub(crate) unknown_key: KeyTreatment,
    pub(crate) trusted: TrustedProxies,
    /// How `Authorization: Basic` is read.
    pub(crate) basic_auth: crate::identity::BasicAuth,
    /// How client addresses group into per-IP keys.
    pub(crate) ip_prefixes: crate::identity::IpPrefixes,
    pub(crate) dialects: Dialects,
    pub(crate) soft_limit: Option<f64>,
    pub(crate) usage_path: Option<String>,
    pub(crate) problem_base: String,
    pub(crate) escalation: EscalationConfig,
    /// The hash of keys in logs and events.
    pub(crate) hasher: KeyHasher,
    pub(crate) idempotency: crate::IdempotencySettings,
    /// Unique to this build of the limits: a [`RouteInfo`] made from them
    /// carries it, so a layer can tell whether a classification it finds
    /// was made by the limits it decides with.
    pub(crate) generation: u64,
}

impl LimitsInner {
    /// See [`Limits::classify`].
    pub(crate) fn classify_in<B>(&self, req: &http::Request<B>) -> RouteInfo {
        let (method, path) = (req.method(), req.uri().path());
        let matched = self.routes.iter().find(|(r, _)| r.matches(method, path));
        RouteInfo::of(matched, self.generation)
    }
}

/// The next [`LimitsInner::generation`].
pub(crate) fn next_generation() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
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
    fn new(prefix: &str, key: &str, plan: usize, hasher: &KeyHasher) -> KeyEntry {
        let stored: Box<str> = format!("{prefix}{key}").into();
        KeyEntry {
            plan,
            hash: hasher.hash(&stored),
            stored,
        }
    }
}

/// The plans the values of a claim or header name: through the configured
/// mapping, or (with none) by the plans' own names.
#[derive(Debug)]
pub(crate) struct ClaimedPlans {
    pub(crate) mapped: Option<HashMap<String, usize>>,
}

impl ClaimedPlans {
    /// The plan `value` names, if any.
    pub(crate) fn plan(&self, value: &str, by_name: &HashMap<String, usize>) -> Option<usize> {
        match &self.mapped {
            Some(m) => m.get(value).copied(),
            None => by_name.get(value).copied(),
        }
    }
}

/// `key = "jwt"`: the verification and the plans its claim names.
#[derive(Debug)]
pub(crate) struct VerifiedJwt {
    pub(crate) jwt: crate::Jwt,
    pub(crate) plans: ClaimedPlans,
}

/// `key = "consumer_header"`: the headers and the plans they name.
#[derive(Debug)]
pub(crate) struct Consumer {
    pub(crate) headers: crate::ConsumerHeaders,
    pub(crate) plans: ClaimedPlans,
}

/// What the store key of a request starts with, by where the key came from.
pub(crate) fn key_prefix(source: &KeySource) -> &'static str {
    match source {
        KeySource::ApiKey => "k:",
        KeySource::ClientIp => "ip:",
        KeySource::Route => "r:",
        KeySource::Header(_) => "h:",
        KeySource::ClientCert => "c:",
        KeySource::Jwt => "j:",
        KeySource::ConsumerHeader => "u:",
    }
}

impl Limits {
    /// Starts a builder.
    pub fn builder() -> LimitsBuilder {
        LimitsBuilder::default()
    }
    /// The plans.
    pub fn plans(&self) -> impl ExactSizeIterator<Item = &Plan> {
        self.inner.plans.iter().map(|p| &p.plan)
    }
    /// The plan named `name`.
    pub fn plan(&self, name: &str) -> Option<&Plan> {
        self.plans().find(|p| p.name() == name)
    }
    /// The plan a key is on (its own, listed clear or hashed, or the
    /// default plan).
    pub fn plan_for_key(&self, key: &str) -> Option<&Plan> {
        let i = self
            .inner
            .keys
            .get(key)
            .map(|&i| self.inner.key_entries[i].plan)
            .or_else(|| self.inner.hashed_plan(key))
            .or(self.inner.default_plan)?;
        Some(&self.inner.plans[i].plan)
    }
    /// The routes, in matching order.
    pub fn routes(&self) -> impl Iterator<Item = &Route> {
        self.inner.routes.iter().map(|(r, _)| r)
    }
    /// The first route matching a request.
    pub fn route(&self, method: &http::Method, path: &str) -> Option<&Route> {
        self.routes().find(|r| r.matches(method, path))
    }
    /// Classifies a request by the first route it matches: its cost,
    /// criticality and (for an anonymous route) plan, made once. A layer
    /// that inserts the result into the request's extensions spares the
    /// limit layer after it matching the routes again; the limit layer
    /// uses it only while these limits are in force (after a reload it
    /// classifies again, so one decision never mixes two configurations).
    ///
    /// ```
    /// use paceline_core::{Plan, Policy};
    /// use paceline_server::{Criticality, Limits, Route};
    ///
    /// let plan = Plan::new("free", vec![Policy::token_bucket("burst", 20, 2).unwrap()]).unwrap();
    /// let quote = Route::new("GET", "/v1/rates").unwrap().with_criticality(Criticality::Sheddable);
    /// let limits = Limits::builder().plan(plan).key("sk_1", "free").route(quote).build().unwrap();
    /// let req = http::Request::get("/v1/rates").body(()).unwrap();
    /// let info = limits.classify(&req);
    /// assert_eq!(info.criticality, Criticality::Sheddable);
    /// assert_eq!(info.pattern.as_deref(), Some("/v1/rates"));
    /// ```
    pub fn classify<B>(&self, req: &http::Request<B>) -> RouteInfo {
        self.inner.classify_in(req)
    }
    /// [`Limits::classify`] by method and path alone.
    pub(crate) fn classify_parts(&self, method: &http::Method, path: &str) -> RouteInfo {
        let matched = self
            .inner
            .routes
            .iter()
            .find(|(r, _)| r.matches(method, path));
        RouteInfo::of(matched, self.inner.generation)
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
    /// The prefix of problem `type` URIs.
    pub fn problem_base(&self) -> &str {
        &self.inner.problem_base
    }
    /// The hash keys get in logs, soft-limit events and the names a
    /// shared store gives them: one secret for all of them.
    pub fn key_hasher(&self) -> &KeyHasher {
        &self.inner.hasher
    }
    /// The escalation settings.
    pub fn escalation(&self) -> &EscalationConfig {
        &self.inner.escalation
    }
    /// The idempotency layer's settings.
    pub fn idempotency(&self) -> &crate::IdempotencySettings {
        &self.inner.idempotency
    }
    /// Whether any route takes idempotency keys.
    pub fn has_idempotent_routes(&self) -> bool {
        self.inner
            .routes
            .iter()
            .any(|(r, _)| r.idempotency().is_some())
    }
    /// The proxies whose forwarding fields are believed.
    pub fn trusted_proxies(&self) -> &TrustedProxies {
        &self.inner.trusted
    }
    /// Where keys come from.
    pub fn key_source(&self) -> &KeySource {
        &self.inner.key_source
    }
    /// The hash logs, soft-limit events and the store show for `key` (as
    /// the request sends it, under these limits' key source and key-hash
    /// secret): what to search the logs for to find a key's requests.
    ///
    /// ```
    /// use paceline_server::{KeyHasher, Limits};
    /// let hasher = KeyHasher::from_secret(b"a deployment's own secret", "test").unwrap();
    /// let plan = paceline_core::Plan::new("free", vec![paceline_core::Policy::token_bucket("b", 5, 1).unwrap()]).unwrap();
    /// let limits = Limits::builder().plan(plan).key_hasher(hasher.clone()).build().unwrap();
    /// assert_eq!(limits.log_hash("sk_1"), hasher.hash("k:sk_1"));
    /// ```
    pub fn log_hash(&self, key: &str) -> KeyHash {
        let prefix = key_prefix(&self.inner.key_source);
        let mut stored = String::with_capacity(prefix.len() + key.len());
        stored.push_str(prefix);
        stored.push_str(key);
        self.inner.hasher.hash(&stored)
    }
    /// The key a request sends when these limits do not list it (neither
    /// under `keys` nor hashed there): the key to look up elsewhere (the
    /// gateway's Redis key map) before the limit layer, and hand over as
    /// a [`KeyLookup`](crate::KeyLookup). `None` when the key source is
    /// not an API key or a key header, when the request sends no key or
    /// one that cannot be read, and when the key is listed.
    pub fn unlisted_key(&self, headers: &http::HeaderMap) -> Option<String> {
        let lim = &*self.inner;
        let read = match &lim.key_source {
            KeySource::ApiKey => headers
                .get(http::header::AUTHORIZATION)
                .map(|v| crate::identity::read_authorization(v, lim.basic_auth))?,
            KeySource::Header(name) => crate::identity::read_key_field(headers.get(name)?),
            _ => return None,
        };
        let crate::Credential::Key(k) = read else {
            return None;
        };
        if lim.keys.contains_key(&*k) || lim.hashed_plan(&k).is_some() {
            return None;
        }
        Some(k.into_owned())
    }
}

impl LimitsInner {
    /// The plan of a key configured hashed, if `key` is one (no hash is
    /// made when none is configured).
    #[inline]
    pub(crate) fn hashed_plan(&self, key: &str) -> Option<usize> {
        if self.hashed.is_empty() {
            return None;
        }
        self.hashed
            .get(&crate::identity::sha256(key.as_bytes()))
            .copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use paceline_core::Algorithm;

    use crate::route::Criticality;

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

    fn kind_of(patch: impl FnOnce(&mut serde_json::Value)) -> ConfigErrorKind {
        let mut v = base();
        patch(&mut v);
        build(v).unwrap_err().kind()
    }

    #[test]
    fn every_mistake_has_its_kind() {
        use ConfigErrorKind as K;
        fn policy(v: &mut serde_json::Value) -> &mut serde_json::Value {
            &mut v["plans"]["free"]["policies"][0]
        }
        assert_eq!(
            kind_of(|v| v["keys"]["sk_2"] = "gold".into()),
            K::UnknownPlan
        );
        assert_eq!(
            kind_of(|v| v["default_plan"] = "gold".into()),
            K::UnknownPlan
        );
        assert_eq!(
            kind_of(|v| v["routes"][0]["plan"] = "nope".into()),
            K::UnknownPlan
        );
        assert_eq!(kind_of(|v| policy(v)["w"] = 0.into()), K::InvalidPolicy);
        assert_eq!(
            kind_of(|v| policy(v)["algorithm"] = "leaky".into()),
            K::InvalidPolicy
        );
        assert_eq!(
            kind_of(|v| policy(v)["unit"] = "bytes".into()),
            K::InvalidPolicy
        );
        assert_eq!(
            kind_of(|v| v["plans"]["free"]["policies"][1]["name"] = "burst".into()),
            K::Duplicate
        );
        assert_eq!(
            kind_of(|v| v["plans"]["free"]["policies"] = serde_json::json!([])),
            K::Missing
        );
        assert_eq!(
            kind_of(|v| v["routes"][0]["plan"] = serde_json::Value::Null),
            K::Missing
        );
        assert_eq!(
            kind_of(|v| v["routes"][1]["path"] = "v1".into()),
            K::InvalidValue
        );
        assert_eq!(
            kind_of(|v| v["routes"][1]["plan"] = "login".into()),
            K::InvalidValue
        );
        assert_eq!(
            kind_of(|v| v["trusted_proxies"][0] = "ten".into()),
            K::InvalidValue
        );
        assert_eq!(kind_of(|v| v["key"] = "cookie".into()), K::InvalidValue);
        assert_eq!(
            kind_of(|v| v["usage_path"] = "usage".into()),
            K::InvalidValue
        );
        assert_eq!(kind_of(|v| v["problem_base"] = "".into()), K::InvalidValue);
        assert_eq!(kind_of(|v| v["soft_limit"] = 1.5.into()), K::OutOfRange);
        assert_eq!(
            kind_of(|v| v["escalation"] = serde_json::json!({"extend_after": 0})),
            K::OutOfRange
        );
        let mut v = base();
        v["routes"][1]["method"] = "B AD".into();
        assert_eq!(build(v).unwrap_err().field(), "routes[1].method");
    }

    #[test]
    fn a_file_leaving_everything_out_means_the_builders_defaults() {
        // a plan is the one thing a file must give
        let one = r#"{"plans": {"p": {"policies": [{"name": "b", "algorithm": "token_bucket", "q": 1, "w": 1}]}}}"#;
        let file = serde_json::from_str::<LimitsConfig>(one)
            .unwrap()
            .build()
            .unwrap();
        let code = Limits::builder().build().unwrap();
        assert_eq!(file.usage_path(), code.usage_path());
        assert_eq!(file.soft_limit(), code.soft_limit());
        assert_eq!(file.problem_base(), code.problem_base());
        assert_eq!(file.dialects(), code.dialects());
        assert_eq!(file.escalation(), code.escalation());
        let d = serde_json::from_str::<LimitsConfig>(r#"{"dialects": {"draft03": true}}"#)
            .unwrap()
            .dialects;
        assert_eq!((d.ietf, d.x_ratelimit, d.draft03), (true, false, true));
    }

    #[test]
    fn unknown_fields_are_refused() {
        let mut v = base();
        v["plans"]["free"]["policies"][0]["qq"] = 1.into();
        assert!(serde_json::from_value::<LimitsConfig>(v).is_err());
        let mut v = base();
        v["dialects"] = serde_json::json!({"ietf": true, "x-ratelimit": true});
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
