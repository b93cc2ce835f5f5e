//! Routes: which requests cost how much, and how much they matter.
//!
//! A [`Route`] matches a method and a path pattern. Patterns are split on
//! `/`: a literal segment matches itself, `{name}` matches any one segment,
//! and a last segment `{*name}` (or `*`) matches the rest of the path.
//! The first route that matches wins.
//!
//! Literal segments match in any ASCII case, and a path matches with or
//! without one trailing `/`. Why: many services route so (Express and
//! ASP.NET ignore case and a trailing slash by default; Rails ignores the
//! slash), so `/V1/Login/` may reach the login handler; a route matched
//! more narrowly than the service matches would let such a spelling pass
//! as some other, cheaper route. Matching more widely costs nothing: a
//! service that routes strictly answers those spellings 404. (Paths are
//! expected in normal form, as the gateway makes them: see
//! [`crate::path`].)
//!
//! ```
//! use paceline_server::{Criticality, Route};
//!
//! let batch = Route::new("POST", "/v1/labels:batch").unwrap().with_cost(10);
//! assert!(batch.matches(&http::Method::POST, "/v1/labels:batch"));
//! let one = Route::new("GET", "/v1/labels/{id}").unwrap();
//! assert!(one.matches(&http::Method::GET, "/v1/labels/lbl_1"));
//! assert!(!one.matches(&http::Method::GET, "/v1/labels/lbl_1/pdf"));
//! assert_eq!(one.criticality(), Criticality::Critical);
//! ```

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use http::Method;
use serde::Deserialize;

/// How much a request matters when the server must drop some (the levels
/// of Google's SRE book, most important first). A load shedder drops the
/// least critical first.
///
/// Deliberately exhaustive: the four levels are the whole ordering a
/// shedder and its reserve are defined over.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Criticality {
    /// Never shed while anything else can be.
    CriticalPlus,
    /// Paid or user-facing work (the default).
    #[default]
    Critical,
    /// Can be shed, but before plain sheddable work only under pressure.
    SheddablePlus,
    /// Shed first (rate quotes, prefetches, batch jobs).
    Sheddable,
}

impl Criticality {
    /// The level's name as written in configuration.
    pub fn as_str(&self) -> &'static str {
        match self {
            Criticality::CriticalPlus => "CRITICAL_PLUS",
            Criticality::Critical => "CRITICAL",
            Criticality::SheddablePlus => "SHEDDABLE_PLUS",
            Criticality::Sheddable => "SHEDDABLE",
        }
    }
}

impl FromStr for Criticality {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "CRITICAL_PLUS" => Ok(Criticality::CriticalPlus),
            "CRITICAL" => Ok(Criticality::Critical),
            "SHEDDABLE_PLUS" => Ok(Criticality::SheddablePlus),
            "SHEDDABLE" => Ok(Criticality::Sheddable),
            other => Err(format!(
                "unknown criticality {other:?}; use CRITICAL_PLUS, CRITICAL, SHEDDABLE_PLUS or SHEDDABLE"
            )),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Segment {
    Literal(String),
    One,
    Rest,
}

/// A method and path pattern with the cost and criticality of requests
/// that match it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    method: Option<Method>,
    pattern: Arc<str>,
    segments: Vec<Segment>,
    /// Every segment is a literal: the route matches its pattern's exact
    /// text, so one comparison of the path decides.
    literal: bool,
    cost: u64,
    /// Charged to named-unit policies at admission (`None`: the cost).
    units: Option<u64>,
    /// Where the answer reports the request's real use of the named unit.
    usage: Option<Arc<crate::usage::UsageSource>>,
    criticality: Criticality,
    anonymous: bool,
    /// No limit applies (see [`Route::unlimited`]).
    unlimited: bool,
    plan: Option<String>,
    idempotency: Option<crate::idempotency::IdempotencyMode>,
}

/// The methods a route may name: those of RFC 9110 and `PATCH`. Any other
/// name is a typo no request would ever match on purpose.
const METHODS: [&str; 9] = [
    "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH",
];

/// Why a route could not be built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteError {
    message: String,
    /// The method is at fault (else the path pattern).
    method: bool,
}

impl RouteError {
    fn method(message: String) -> Self {
        RouteError {
            message,
            method: true,
        }
    }
    fn path(message: String) -> Self {
        RouteError {
            message,
            method: false,
        }
    }
    /// Whether the method is at fault (else the path pattern).
    pub fn is_method(&self) -> bool {
        self.method
    }
}

impl fmt::Display for RouteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for RouteError {}

impl Route {
    /// A route for `method` (`*` for any) and `pattern` (starting with `/`),
    /// costing 1, [`Criticality::Critical`].
    pub fn new(method: &str, pattern: &str) -> Result<Route, RouteError> {
        let method = match method {
            "*" | "" => None,
            m => {
                let upper = m.to_ascii_uppercase();
                if !METHODS.contains(&upper.as_str()) {
                    return Err(RouteError::method(format!(
                        "{m:?} is not an HTTP method; use one of {}, or * for any",
                        METHODS.join(", ")
                    )));
                }
                Some(
                    Method::from_bytes(upper.as_bytes())
                        .map_err(|_| RouteError::method(format!("{m:?} is not an HTTP method")))?,
                )
            }
        };
        let segments = parse_pattern(pattern)?;
        let literal = segments.iter().all(|s| matches!(s, Segment::Literal(_)));
        Ok(Route {
            method,
            pattern: Arc::from(pattern),
            segments,
            literal,
            cost: 1,
            units: None,
            usage: None,
            criticality: Criticality::Critical,
            anonymous: false,
            unlimited: false,
            plan: None,
            idempotency: None,
        })
    }

    /// Sets the cost (units charged to every policy counting requests).
    /// A cost of 0 makes the route free: checked, published, never charged.
    pub fn with_cost(mut self, cost: u64) -> Route {
        self.cost = cost;
        self
    }

    /// Sets what a request is charged at admission by policies counting
    /// a named unit (`tokens`, say): the estimate of its use, settled from
    /// the answer when the route has a [`usage`](Route::with_usage) source.
    /// Without it, those policies are charged the route's cost.
    ///
    /// ```
    /// use paceline_server::{usage::UsageSource, Route};
    ///
    /// let chat = Route::new("POST", "/v1/chat")
    ///     .unwrap()
    ///     .with_units(500)
    ///     .with_usage("json:usage.total_tokens".parse::<UsageSource>().unwrap());
    /// assert_eq!((chat.cost(), chat.units()), (1, 500));
    /// assert!(chat.usage().is_some());
    /// ```
    pub fn with_units(mut self, estimate: u64) -> Route {
        self.units = Some(estimate);
        self
    }

    /// Sets where the answer reports what the request really used of the
    /// named unit: when it does, the difference from what admission
    /// charged is charged or given back (see [`crate::usage`]).
    pub fn with_usage(mut self, source: crate::usage::UsageSource) -> Route {
        self.usage = Some(Arc::new(source));
        self
    }

    /// Sets the criticality.
    pub fn with_criticality(mut self, criticality: Criticality) -> Route {
        self.criticality = criticality;
        self
    }

    /// Makes the route anonymous: limited per client IP under `plan` (or the
    /// configured anonymous plan when `None`), publishing no counters. For
    /// login and sign-up pages, where counters would help an attacker pace.
    pub fn anonymous(mut self, plan: Option<&str>) -> Route {
        self.anonymous = true;
        self.plan = plan.map(str::to_string);
        self
    }

    /// Makes the route unlimited: no limit applies to it, for any caller,
    /// and no rate-limit fields are published (health checks, status
    /// pages). The only way a request passes without a limit.
    pub fn unlimited(mut self) -> Route {
        self.unlimited = true;
        self.anonymous = false;
        self.plan = None;
        self
    }

    /// Makes the route take idempotency keys: required (a POST or PATCH
    /// without one is refused) or optional (honoured when sent). The
    /// idempotency layer ([`crate::idempotency::LimiterScope`]) reads it.
    pub fn with_idempotency(mut self, mode: crate::idempotency::IdempotencyMode) -> Route {
        self.idempotency = Some(mode);
        self
    }

    /// Whether the route takes idempotency keys, and how.
    pub fn idempotency(&self) -> Option<crate::idempotency::IdempotencyMode> {
        self.idempotency
    }

    /// Whether the route matches (in any ASCII case, with or without a
    /// trailing `/`: see the module documentation).
    pub fn matches(&self, method: &Method, path: &str) -> bool {
        if self.method.as_ref().is_some_and(|m| m != method) {
            return false;
        }
        let path = trim_slash(path);
        if self.literal {
            // splitting two equal texts on '/' gives equal segments, and
            // only equal texts split into equal segments; the path as the
            // pattern spells it (the common case) is one comparison
            let pattern = trim_slash(&self.pattern);
            return pattern.len() == path.len()
                && (pattern == path || pattern.eq_ignore_ascii_case(path));
        }
        let mut parts = path.split('/');
        for seg in &self.segments {
            match (seg, parts.next()) {
                (Segment::Rest, _) => return true,
                (Segment::One, Some(p)) if !p.is_empty() => {}
                (Segment::Literal(l), Some(p)) if l.eq_ignore_ascii_case(p) => {}
                _ => return false,
            }
        }
        parts.next().is_none()
    }

    /// The pattern as written.
    pub fn pattern(&self) -> &str {
        &self.pattern
    }
    /// The method, or `None` for any.
    pub fn method(&self) -> Option<&Method> {
        self.method.as_ref()
    }
    /// The cost.
    pub fn cost(&self) -> u64 {
        self.cost
    }
    /// What named-unit policies are charged at admission.
    pub fn units(&self) -> u64 {
        self.units.unwrap_or(self.cost)
    }
    /// Where the answer reports the request's use, if it does.
    pub fn usage(&self) -> Option<&crate::usage::UsageSource> {
        self.usage.as_deref()
    }
    /// The criticality.
    pub fn criticality(&self) -> Criticality {
        self.criticality
    }
    /// Whether requests are limited per IP, anonymously.
    pub fn is_anonymous(&self) -> bool {
        self.anonymous
    }
    /// Whether no limit applies to the route.
    pub fn is_unlimited(&self) -> bool {
        self.unlimited
    }
    /// The per-IP plan of an anonymous route, if it names one.
    pub fn plan(&self) -> Option<&str> {
        self.plan.as_deref()
    }
}

/// `path` without one trailing `/` (the root path stays `/`).
fn trim_slash(path: &str) -> &str {
    match path.len() > 1 {
        true => path.strip_suffix('/').unwrap_or(path),
        false => path,
    }
}

fn parse_pattern(pattern: &str) -> Result<Vec<Segment>, RouteError> {
    if !pattern.starts_with('/') {
        return Err(RouteError::path(format!(
            "path {pattern:?} must start with '/'"
        )));
    }
    let parts: Vec<&str> = trim_slash(pattern).split('/').collect();
    let last = parts.len() - 1;
    parts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let rest = *p == "*" || (p.starts_with("{*") && p.ends_with('}'));
            if rest && i != last {
                Err(RouteError::path(format!(
                    "path {pattern:?}: a wildcard may only be the last segment"
                )))
            } else if rest {
                Ok(Segment::Rest)
            } else if p.starts_with('{') && p.ends_with('}') && p.len() > 2 {
                Ok(Segment::One)
            } else if p.contains(['{', '}']) {
                Err(RouteError::path(format!(
                    "path {pattern:?}: a parameter must fill its whole segment, as {{id}}"
                )))
            } else {
                Ok(Segment::Literal(p.to_string()))
            }
        })
        .collect()
}

/// How a request is classified by the first route it matches: its cost
/// and criticality (and, privately, the plan of an anonymous route), made
/// once per request by [`Limits::classify`](crate::Limits::classify).
///
/// It travels with the request: the first layer that needs it (a load
/// shedder before the limit layer) classifies, and inserts it into the
/// request's extensions or hands it over with
/// [`RateLimit::call_classified`](crate::RateLimit::call_classified); the
/// limit layer uses it instead of matching the routes again, as long as it
/// was made by the limits in force (it remembers which). Without one, the
/// limit layer classifies by itself. Either way a request the limit layer
/// lets through carries the classification its decision was made with in
/// its extensions, for the layers and handlers after it.
///
/// Two classifications are equal when their public fields are.
#[derive(Clone, Debug)]
pub struct RouteInfo {
    /// The matched pattern, or `None` when no route matched.
    pub pattern: Option<Arc<str>>,
    /// The request's cost.
    pub cost: u64,
    /// The request's criticality.
    pub criticality: Criticality,
    /// Charged to named-unit policies at admission.
    pub(crate) units: u64,
    /// Where the answer reports the request's real use.
    pub(crate) usage: Option<Arc<crate::usage::UsageSource>>,
    /// The matched route is anonymous: limited per client IP.
    pub(crate) anonymous: bool,
    /// The matched route is unlimited: no limit applies.
    pub(crate) unlimited: bool,
    /// Whether the matched route takes idempotency keys
    /// ([`crate::idempotency`]), and how.
    pub idempotency: Option<crate::idempotency::IdempotencyMode>,
    /// The per-IP plan of an anonymous route (else the anonymous plan).
    pub(crate) anonymous_plan: Option<usize>,
    /// The generation of the limits that made it.
    pub(crate) generation: u64,
}

impl PartialEq for RouteInfo {
    fn eq(&self, other: &Self) -> bool {
        self.pattern == other.pattern
            && self.cost == other.cost
            && self.criticality == other.criticality
    }
}

impl Eq for RouteInfo {}

impl RouteInfo {
    /// The classification by `route` (with its anonymous plan), or the
    /// one of a request no route matched, made by the limits of
    /// `generation`.
    pub(crate) fn of(route: Option<&(Route, Option<usize>)>, generation: u64) -> RouteInfo {
        match route {
            Some((r, plan)) => RouteInfo {
                pattern: Some(r.pattern.clone()),
                cost: r.cost,
                criticality: r.criticality,
                units: r.units(),
                usage: r.usage.clone(),
                anonymous: r.anonymous,
                unlimited: r.unlimited,
                idempotency: r.idempotency,
                anonymous_plan: *plan,
                generation,
            },
            None => RouteInfo {
                pattern: None,
                cost: 1,
                criticality: Criticality::default(),
                units: 1,
                usage: None,
                anonymous: false,
                unlimited: false,
                idempotency: None,
                anonymous_plan: None,
                generation,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns() {
        let r = Route::new("*", "/v1/{*rest}").unwrap();
        assert!(r.matches(&Method::DELETE, "/v1/a/b/c"));
        assert!(r.matches(&Method::GET, "/v1/"));
        assert!(!r.matches(&Method::GET, "/v2/a"));
        let exact = Route::new("post", "/v1/login").unwrap();
        assert!(exact.matches(&Method::POST, "/v1/login"));
        assert!(!exact.matches(&Method::GET, "/v1/login"));
        assert!(!exact.matches(&Method::POST, "/v1/login/x"));
        assert!(!exact.matches(&Method::POST, "/v1"));
        let p = Route::new("GET", "/v1/labels/{id}").unwrap();
        assert!(!p.matches(&Method::GET, "/v1/labels/"));
    }

    #[test]
    fn any_case_and_a_trailing_slash_match_as_services_route() {
        let exact = Route::new("POST", "/v1/login").unwrap();
        for p in ["/v1/login/", "/V1/Login", "/v1/LOGIN/"] {
            assert!(exact.matches(&Method::POST, p), "{p}");
        }
        assert!(!exact.matches(&Method::POST, "/v1/login//"));
        let slash = Route::new("GET", "/v1/items/").unwrap();
        assert!(slash.matches(&Method::GET, "/v1/items"));
        assert!(slash.matches(&Method::GET, "/v1/items/"));
        let p = Route::new("GET", "/v1/labels/{id}").unwrap();
        assert!(p.matches(&Method::GET, "/V1/LABELS/lbl_1/"));
        let root = Route::new("GET", "/").unwrap();
        assert!(root.matches(&Method::GET, "/"));
        assert!(!root.matches(&Method::GET, "/x"));
    }

    /// The walk over segments, as every pattern is matched without the
    /// literal shortcut.
    fn walk(r: &Route, method: &Method, path: &str) -> bool {
        let slow = Route {
            literal: false,
            ..r.clone()
        };
        slow.matches(method, path)
    }

    proptest::proptest! {
        #[test]
        fn literal_patterns_match_as_the_segment_walk_does(
            pattern in "(/[a-z:.]{0,3}){1,4}",
            path in "(/[a-zA-Z:.]{0,3}){0,5}/?",
        ) {
            let r = Route::new("GET", &pattern).unwrap();
            proptest::prop_assert!(r.literal);
            for p in [path.as_str(), pattern.as_str()] {
                proptest::prop_assert_eq!(r.matches(&Method::GET, p), walk(&r, &Method::GET, p), "{}", p);
            }
        }
    }

    #[test]
    fn bad_patterns_are_refused() {
        assert!(Route::new("GET", "v1").is_err());
        assert!(Route::new("GET", "/v1/*/x").is_err());
        assert!(Route::new("GET", "/v1/a{id}").is_err());
        assert!(Route::new("G ET", "/v1").is_err());
        let fetch = Route::new("FETCH", "/v1").unwrap_err();
        assert!(
            fetch.is_method() && fetch.to_string().contains("FETCH"),
            "{fetch}"
        );
        assert!(Route::new("patch", "/v1").is_ok());
    }

    #[test]
    fn criticality_orders_most_important_first() {
        assert!(Criticality::CriticalPlus < Criticality::Sheddable);
        assert_eq!(
            "SHEDDABLE_PLUS".parse::<Criticality>(),
            Ok(Criticality::SheddablePlus)
        );
        assert!("LOW".parse::<Criticality>().is_err());
    }
}
