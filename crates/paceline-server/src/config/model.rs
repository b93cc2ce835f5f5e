//! The serde model of the limits: what a file holds, with every default.
//!
//! A file (TOML, JSON, any serde format) is read into [`LimitsConfig`]; the
//! defaults of a field left out are applied here and nowhere else, and
//! [`LimitsConfig::build`] turns the strings of the file (algorithm names,
//! units, key sources) into the values [`LimitsBuilder`](super::LimitsBuilder) validates. A
//! program embedding the limits in a larger file (the gateway) hands the
//! rest of its file to this model unchanged.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use http::header::HeaderName;
use paceline_core::{
    Algorithm, FailMode, Plan, PlanError, Policy, PolicyError, PolicyKind, Share, Unit,
};
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
    /// Keys to plan names. A key may be given hashed, as `sha256:` and the
    /// 64 hex digits of its SHA-256 (`paceline keys hash KEY` prints the
    /// entry): it is admitted exactly as the key itself, and the file
    /// holds no secret.
    pub keys: BTreeMap<String, String>,
    /// Routes, first match wins.
    pub routes: Vec<RouteConfig>,
    /// Where the key comes from: `api_key` (default), `ip`, `route`,
    /// `client_cert` (the subject of a verified TLS client certificate),
    /// `header:<name>`, `jwt` (a claim of a verified bearer JWT, with the
    /// `[jwt]` table) or `consumer_header` (the headers an authentication
    /// layer in front sets, believed from `trusted_proxies` only; the
    /// `[consumer_header]` table).
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
    /// With `key = "jwt"`: how bearer tokens are verified and read.
    pub jwt: Option<JwtConfig>,
    /// With `key = "consumer_header"`: the headers believed.
    pub consumer_header: Option<ConsumerHeaderConfig>,
}

/// The `[jwt]` table, for `key = "jwt"`: requests send `Authorization:
/// Bearer <JWT>`; the signature is verified, `exp` and `nbf` checked on
/// the limiter's clock, and one claim is the caller's key, another its
/// plan. A token that fails is refused with 401 and a problem body.
///
/// ```toml
/// key = "jwt"
/// [jwt]
/// jwks_file = "jwks.json"          # or secret_file = "jwt.secret" (HS256)
/// algorithms = ["RS256", "ES256"]  # the default with jwks_file
/// issuer = "https://id.example"    # optional: iss must be this
/// audience = "shiplane-api"        # optional: aud must name this
/// key_claim = "sub"                # the default
/// plan_claim = "tier"              # optional: the claim naming the plan
/// plans = { pro = "gold", hobby = "free" }  # optional: its values to plans
/// leeway_s = 30                    # clock skew allowed on exp and nbf
/// require_exp = true               # a token without exp is refused
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JwtConfig {
    /// A file holding the HMAC secret tokens are signed with (at least
    /// 32 bytes; a final line ending is not part of it), relative to the
    /// configuration's directory. `HS256` is accepted by default.
    pub secret_file: Option<String>,
    /// A JSON Web Key Set file (`{"keys": [...]}`, as an identity
    /// provider publishes it), relative to the configuration's directory,
    /// read again at every reload. `RS256` and `ES256` are accepted by
    /// default; a token names its key by `kid` (it may name none when the
    /// set holds one key).
    pub jwks_file: Option<String>,
    /// The algorithms accepted (`HS256`, `HS384`, `HS512`, `RS256`,
    /// `RS384`, `RS512`, `PS256`, `PS384`, `PS512`, `ES256`, `ES384`,
    /// `EdDSA`), each of a kind of key the file holds. `none` never is.
    pub algorithms: Option<Vec<String>>,
    /// When given, a token's `iss` must be this.
    pub issuer: Option<String>,
    /// When given, a token's `aud` must be (or list) this.
    pub audience: Option<String>,
    /// The claim whose value is the caller's key (`sub` by default): a
    /// string of 1 to 256 bytes.
    pub key_claim: Option<String>,
    /// The claim whose value names the caller's plan. Without it (or in a
    /// token without the claim), the plan is the key's under `keys`, else
    /// `default_plan`, else `unknown_key`'s treatment.
    pub plan_claim: Option<String>,
    /// The plan claim's values to plan names; empty: the value is the
    /// plan's own name. A value that names no plan counts as an unknown
    /// key.
    #[serde(default)]
    pub plans: BTreeMap<String, String>,
    /// Seconds of clock skew allowed on `exp` and `nbf` (30).
    pub leeway_s: Option<u64>,
    /// Whether a token without `exp` is refused (true).
    pub require_exp: Option<bool>,
}

/// The `[consumer_header]` table, for `key = "consumer_header"`: the
/// authentication layer in front (an API gateway, an auth proxy) names
/// the caller it authenticated in one header and its plan in another.
/// Believed only when the socket peer is listed under `trusted_proxies`;
/// from anyone else both headers are ignored (the request counts as
/// sending no key: `missing_key`'s treatment) and removed before the
/// service behind sees them.
///
/// ```toml
/// key = "consumer_header"
/// trusted_proxies = ["10.0.0.0/8"]
/// [consumer_header]
/// key_header = "X-Consumer-Id"   # the default
/// plan_header = "X-Plan"         # the default; "" reads no plan
/// plans = { enterprise = "gold" } # optional: its values to plans
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsumerHeaderConfig {
    /// The header naming the caller (`X-Consumer-Id`).
    pub key_header: Option<String>,
    /// The header naming its plan (`X-Plan`); empty: none is read, and the
    /// plan is the key's under `keys`, else `default_plan`.
    pub plan_header: Option<String>,
    /// The plan header's values to plan names; empty: the value is the
    /// plan's own name. A value that names no plan counts as an unknown
    /// key.
    #[serde(default)]
    pub plans: BTreeMap<String, String>,
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
            jwt: None,
            consumer_header: None,
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
    /// For `token_bucket`: the most units it holds, when not `q`. A
    /// bucket of `q = 5000, w = 1, burst = 500` admits 5,000 a second
    /// and at most 500 at once (see [`Policy::with_burst`]).
    #[serde(default)]
    pub burst: Option<u64>,
    /// For `daily`: the time of day (UTC, `HH:MM`) the quota resets.
    #[serde(default)]
    pub reset_at: Option<String>,
    /// `requests` (default), `content-bytes`, `concurrent-requests` (with
    /// `concurrency`), or any other unit by name (`tokens`, say), charged
    /// a route's `cost.estimate` (or its cost) and published as `qu`.
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
    /// `exact` (default) or `leased`: how instances sharing a store count
    /// it (see [`Share`]).
    #[serde(default)]
    pub share: Option<String>,
    /// With `share = "leased"`: the most units one slice holds (default
    /// a fiftieth of the quota and at most a tenth of the burst, at least
    /// 1). With `N` instances the
    /// admitted count over any window exceeds exact mode's by at most
    /// `N × 2 × max_slice`.
    #[serde(default)]
    pub max_slice: Option<u64>,
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
    /// The cost: a number of requests (default 1), or a table giving the
    /// estimate in the plan's named unit and where the answer reports
    /// the real use (see [`RouteCostConfig`]).
    #[serde(default)]
    pub cost: RouteCostConfig,
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

/// A route's cost as a file holds it: `cost = 10`, or
/// `cost = { estimate = 500, from_header = "x-usage-tokens" }`.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum RouteCostConfig {
    /// Every policy is charged this many (requests, or the named unit).
    Fixed(u64),
    /// Requests and a named unit apart, the latter settled from the answer.
    Settled(SettledCostConfig),
}

impl Default for RouteCostConfig {
    fn default() -> Self {
        RouteCostConfig::Fixed(1)
    }
}

/// A cost in a named unit known once the answer exists.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SettledCostConfig {
    /// Charged to request-counting policies (default 1).
    #[serde(default = "one")]
    pub requests: u64,
    /// Charged to named-unit policies at admission.
    pub estimate: u64,
    /// A response header (or trailer) holding the real use.
    #[serde(default)]
    pub from_header: Option<String>,
    /// A dotted path into a JSON answer (or the last event of a stream)
    /// holding the real use: `usage.total_tokens`.
    #[serde(default)]
    pub from_json: Option<String>,
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
    /// deployment's secret); files it names are read relative to the
    /// working directory.
    pub fn build_with_hasher(self, hasher: crate::KeyHasher) -> Result<Limits, ConfigError> {
        self.build_with_files(hasher, None)
    }

    /// The files the configuration names (the `[jwt]` key files), relative
    /// to `dir` (the configuration's directory; the working directory
    /// without one): a program that watches its configuration watches
    /// these too, since they are read again at every build.
    pub fn files(&self, dir: Option<&Path>) -> Vec<PathBuf> {
        let Some(j) = &self.jwt else {
            return Vec::new();
        };
        [&j.secret_file, &j.jwks_file]
            .into_iter()
            .flatten()
            .map(|f| dir.unwrap_or(Path::new("")).join(f))
            .collect()
    }

    /// [`build_with_hasher`](Self::build_with_hasher), reading the files
    /// it names ([`files`](Self::files)) relative to `dir`.
    pub fn build_with_files(
        self,
        hasher: crate::KeyHasher,
        dir: Option<&Path>,
    ) -> Result<Limits, ConfigError> {
        let mut b = Limits::builder().key_hasher(hasher);
        if let Some(j) = &self.jwt {
            b = b.jwt(j.build(dir)?);
        }
        if let Some(c) = &self.consumer_header {
            b = b.consumer_headers(c.build()?);
        }
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

impl JwtConfig {
    /// The verification it describes, its files read relative to `dir`;
    /// each error names its field (`jwt.jwks_file`, `jwt.algorithms`, ...).
    pub fn build(&self, dir: Option<&Path>) -> Result<crate::Jwt, ConfigError> {
        let err = |f: &str, kind: Kind, m: String| ConfigError::new(kind, format!("jwt.{f}"), m);
        let read = |f: &str, name: &str| {
            let path = dir.unwrap_or(Path::new("")).join(name);
            std::fs::read(&path).map_err(|e| {
                err(
                    f,
                    Kind::Unreadable,
                    format!("cannot read {}: {e}", path.display()),
                )
            })
        };
        let mut jwt = match (&self.secret_file, &self.jwks_file) {
            (Some(_), Some(_)) => {
                return Err(err(
                    "jwks_file",
                    Kind::InvalidValue,
                    "give secret_file or jwks_file, not both".into(),
                ))
            }
            (None, None) => {
                return Err(ConfigError::new(
                    Kind::Missing,
                    "jwt",
                    "needs the keys tokens are signed with: secret_file (an HMAC secret) or jwks_file (a JSON Web Key Set)",
                ))
            }
            (Some(f), None) => {
                let bytes = read("secret_file", f)?;
                // a line ending is not part of the secret
                let end = bytes
                    .iter()
                    .rposition(|b| !matches!(b, b'\n' | b'\r'))
                    .map_or(0, |i| i + 1);
                crate::Jwt::hmac(&bytes[..end])
                    .map_err(|m| err("secret_file", Kind::OutOfRange, format!("{f}: {m}")))?
            }
            (None, Some(f)) => {
                let bytes = read("jwks_file", f)?;
                let text = String::from_utf8_lossy(&bytes);
                crate::Jwt::jwks(&text)
                    .map_err(|m| err("jwks_file", Kind::InvalidValue, format!("{f}: {m}")))?
            }
        };
        if let Some(algs) = &self.algorithms {
            jwt = jwt
                .algorithms(algs)
                .map_err(|m| err("algorithms", Kind::InvalidValue, m))?;
        }
        if let Some(i) = &self.issuer {
            jwt = jwt.issuer(i);
        }
        if let Some(a) = &self.audience {
            jwt = jwt.audience(a);
        }
        if let Some(c) = &self.key_claim {
            if c.is_empty() {
                return Err(err(
                    "key_claim",
                    Kind::InvalidValue,
                    "must not be empty".into(),
                ));
            }
            jwt = jwt.key_claim(c);
        }
        if let Some(c) = &self.plan_claim {
            if c.is_empty() {
                return Err(err(
                    "plan_claim",
                    Kind::InvalidValue,
                    "must not be empty".into(),
                ));
            }
            jwt = jwt.plan_claim(c);
        }
        if !self.plans.is_empty() && self.plan_claim.is_none() {
            return Err(err(
                "plans",
                Kind::Missing,
                "maps the values of plan_claim: set plan_claim too".into(),
            ));
        }
        for (value, plan) in &self.plans {
            jwt = jwt.plan(value, plan);
        }
        if let Some(s) = self.leeway_s {
            if s > 3600 {
                return Err(err(
                    "leeway_s",
                    Kind::OutOfRange,
                    format!(
                        "{s} s of clock skew is over an hour; a few seconds to a minute is usual"
                    ),
                ));
            }
            jwt = jwt.leeway_s(s);
        }
        if let Some(r) = self.require_exp {
            jwt = jwt.require_exp(r);
        }
        Ok(jwt)
    }
}

impl ConsumerHeaderConfig {
    /// The headers it describes; each error names its field.
    pub fn build(&self) -> Result<crate::ConsumerHeaders, ConfigError> {
        let d = crate::ConsumerHeaders::default();
        let header = |f: &str, v: &str| {
            HeaderName::from_bytes(v.trim().as_bytes()).map_err(|_| {
                ConfigError::new(
                    Kind::InvalidValue,
                    format!("consumer_header.{f}"),
                    format!("{v:?} is not a header name"),
                )
            })
        };
        let key = match &self.key_header {
            Some(k) => header("key_header", k)?,
            None => d.key,
        };
        let plan = match self.plan_header.as_deref() {
            None => d.plan,
            Some("") => None,
            Some(p) => Some(header("plan_header", p)?),
        };
        if !self.plans.is_empty() && plan.is_none() {
            return Err(ConfigError::new(
                Kind::Missing,
                "consumer_header.plans",
                "maps the values of plan_header, which is empty",
            ));
        }
        Ok(crate::ConsumerHeaders {
            key,
            plan,
            plans: self.plans.clone(),
        })
    }
}

fn parse_key_source(s: &str) -> Result<KeySource, ConfigError> {
    match s {
        "api_key" => Ok(KeySource::ApiKey),
        "ip" => Ok(KeySource::ClientIp),
        "route" => Ok(KeySource::Route),
        "client_cert" => Ok(KeySource::ClientCert),
        "jwt" => Ok(KeySource::Jwt),
        "consumer_header" => Ok(KeySource::ConsumerHeader),
        other => {
            let name = other.strip_prefix("header:").ok_or_else(|| {
                ConfigError::new(
                    Kind::InvalidValue,
                    "key",
                    format!("{other:?}: use api_key, ip, route, client_cert, jwt, consumer_header or header:<name>"),
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
    let mut route = route.with_criticality(r.criticality);
    match &r.cost {
        RouteCostConfig::Fixed(n) => route = route.with_cost(*n),
        RouteCostConfig::Settled(c) => {
            route = route.with_cost(c.requests).with_units(c.estimate);
            let bad = |f: &str, m: String| ConfigError::new(Kind::InvalidValue, field(f), m);
            let source = match (&c.from_header, &c.from_json) {
                (Some(_), Some(_)) => {
                    return Err(bad(
                        "cost",
                        "give from_header or from_json, not both".into(),
                    ))
                }
                (Some(h), None) => Some(
                    crate::usage::UsageSource::header(h)
                        .map_err(|e| bad("cost.from_header", e.to_string()))?,
                ),
                (None, Some(p)) => Some(
                    crate::usage::UsageSource::json(p)
                        .map_err(|e| bad("cost.from_json", e.to_string()))?,
                ),
                (None, None) => None,
            };
            if let Some(s) = source {
                route = route.with_usage(s);
            }
        }
    }
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
    // a decision with one exact policy makes its round trip anyway
    let leased = |q: &Policy| matches!(q.share(), Share::Leased { .. });
    if policies.iter().any(leased) && !policies.iter().all(|q| q.is_shadow() || leased(q)) {
        return Err(ConfigError::new(
            Kind::InvalidPolicy,
            format!("plans.{name}"),
            "share = \"leased\" must be given to every policy of the plan (or none): a decision with one exact policy makes its round trip anyway",
        ));
    }
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
    if let Some(b) = p.burst {
        policy = policy
            .with_burst(b)
            .map_err(|e| err("burst", e.to_string()))?;
    }
    if let Some(u) = &p.unit {
        // requests, content-bytes, concurrent-requests, or any other
        // unit by name (published as `qu`); the near misses of the first
        // two are mistakes, not units of their own
        let near = match u.as_str() {
            "bytes" | "content-byte" => Some("content-bytes"),
            "request" => Some("requests"),
            _ => None,
        };
        if let Some(meant) = near {
            return Err(err("unit", format!("{u:?}: did you mean {meant}?")));
        }
        let unit = Unit::named(u).map_err(|e| err("unit", e.to_string()))?;
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
    let share = match (p.share.as_deref(), p.max_slice) {
        (None | Some("exact"), None) => Share::Exact,
        (None | Some("exact"), Some(_)) => {
            return Err(err(
                "max_slice",
                "max_slice is for share = \"leased\"".into(),
            ))
        }
        (Some("leased"), max) => {
            let why = match algorithm {
                Algorithm::Concurrency => Some(
                    "a concurrency cap cannot be leased: its units come back one by one as requests end, so a slice of them means nothing",
                ),
                Algorithm::SlidingLog => Some(
                    "a sliding log stamps each unit with its instant, and a slice's units would all carry the instant it was taken: use a sliding_counter, or count this one exactly",
                ),
                _ => None,
            };
            if let Some(why) = why {
                return Err(err("share", format!("{}: {why}", p.algorithm)));
            }
            if policy.unit() != Unit::Requests {
                return Err(err(
                    "share",
                    "a leased policy counts requests: a slice is a number of requests".into(),
                ));
            }
            // a fiftieth of the quota, and at most a tenth of a burst of
            // its own (the bound, N × 2 slices, stays a fraction of it)
            let holds = policy.burst();
            let max_slice = max.unwrap_or((p.q / 50).min(holds / 10).max(1));
            if max_slice == 0 || max_slice > holds {
                let what = match policy.has_own_burst() {
                    true => "the burst",
                    false => "q",
                };
                return Err(err(
                    "max_slice",
                    format!("{max_slice}: a slice holds 1 to {what} ({holds}) units"),
                ));
            }
            Share::Leased { max_slice }
        }
        (Some(other), _) => return Err(err("share", format!("{other:?}: use exact or leased"))),
    };
    Ok(policy.with_shadow(p.shadow).with_share(share))
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
