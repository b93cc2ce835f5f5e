//! Header routing and the providers' dialects.
//!
//! Headers are read in one pass over the map's names. A name is routed by
//! its prefix to a family (`x-ratelimit-`, `x-rate-limit-`, `ratelimit-`,
//! `anthropic-ratelimit-`, …); the rest of the name is split into a field
//! word (`limit`, `max`, `remaining`, `used`, `reset`, `reset-after`,
//! `interval-ms`, …) and a qualifier (`requests`, `tokens`, `api-token`,
//! `24hour`, …), whichever side the field word is on. That covers, among
//! others, GitHub (`x-ratelimit-used`, `x-ratelimit-resource`), Discord
//! (`x-ratelimit-reset-after`, `-bucket`, `-global`, `-scope`), OpenAI and
//! Azure OpenAI (`x-ratelimit-remaining-tokens`), Linear
//! (`x-ratelimit-requests-remaining`), Anthropic
//! (`anthropic-ratelimit-input-tokens-reset`), Twitter/X (`x-rate-limit-*`,
//! `x-app-limit-24hour-*`), Okta, Trello (`x-rate-limit-api-token-max`),
//! Sentry (`x-sentry-rate-limit-concurrentremaining`), HubSpot
//! (`x-hubspot-ratelimit-secondly-remaining`), Fastly, GitLab
//! (`ratelimit-observed`, `ratelimit-resettime`), Heroku and Docker Hub
//! (`ratelimit-remaining: 76;w=21600`). A few providers get their own
//! reader: Shopify's `32/40`, Salesforce's `Sforce-Limit-Info`, Zendesk's
//! per-endpoint fields, Sentry's `X-Sentry-Rate-Limits` and Azure's
//! `x-ms-ratelimit-remaining-*`.

use std::borrow::Cow;

use http::HeaderMap;
use paceline_core::Nanos;

use super::ietf::{self, LimitField, LimitItem, PolicyField, PolicyItem};
use super::time::{self, parse_count, parse_delay_millis, parse_delay_secs, parse_reset, shorten};
use super::{Ignored, OutcomeKind, PolicyView, ProblemView, ResponseView, Unit};

/// Longest header value read; longer ones are ignored.
pub(crate) const MAX_VALUE_LEN: usize = 4096;

/// Longest value of the IETF structured fields (`RateLimit`,
/// `RateLimit-Policy`), all lines joined: room for RFC 9651's minimums (a
/// List of 1,024 members, 256 parameters on a member, 1,024-character
/// strings), and a bound on what one response can make the parser do.
pub(crate) const MAX_STRUCTURED_LEN: usize = 128 * 1024;

/// GitHub's documented floor for a secondary rate limit without headers.
pub(crate) const GITHUB_SECONDARY_FLOOR: Nanos = Nanos::from_secs(60);

/// Shopify's REST bucket drains its whole size in this many seconds (40
/// leaking 2/s, 400 leaking 20/s).
const SHOPIFY_DRAIN_WINDOW_S: u64 = 20;

/// Index in [`FAMS`] of Etsy's names, which share no prefix.
const ETSY: usize = 9;

/// A family of headers sharing a prefix.
struct Fam {
    prefix: &'static str,
    dialect: &'static str,
    default_name: &'static str,
    /// Policy names are `default_name-qualifier` (so `app-24hour`).
    prefix_names: bool,
    /// A bare qualifier with no field word is the limit (HubSpot's `-daily`).
    bare_is_limit: bool,
}

const FAMS: &[Fam] = &[
    Fam {
        prefix: "x-ratelimit-",
        dialect: "x-ratelimit",
        default_name: "x-ratelimit",
        prefix_names: false,
        bare_is_limit: false,
    },
    Fam {
        prefix: "x-rate-limit-",
        dialect: "x-rate-limit",
        default_name: "x-rate-limit",
        prefix_names: false,
        bare_is_limit: false,
    },
    Fam {
        prefix: "ratelimit-",
        dialect: "ietf-draft03",
        default_name: "ratelimit",
        prefix_names: false,
        bare_is_limit: false,
    },
    Fam {
        prefix: "anthropic-ratelimit-",
        dialect: "anthropic",
        default_name: "anthropic",
        prefix_names: false,
        bare_is_limit: false,
    },
    Fam {
        prefix: "x-sentry-rate-limit-",
        dialect: "sentry",
        default_name: "sentry",
        prefix_names: false,
        bare_is_limit: false,
    },
    Fam {
        prefix: "fastly-ratelimit-",
        dialect: "fastly",
        default_name: "fastly",
        prefix_names: false,
        bare_is_limit: false,
    },
    Fam {
        prefix: "x-hubspot-ratelimit-",
        dialect: "hubspot",
        default_name: "interval",
        prefix_names: false,
        bare_is_limit: true,
    },
    Fam {
        prefix: "x-app-limit-",
        dialect: "twitter",
        default_name: "app",
        prefix_names: true,
        bare_is_limit: false,
    },
    Fam {
        prefix: "x-user-limit-",
        dialect: "twitter",
        default_name: "user",
        prefix_names: true,
        bare_is_limit: false,
    },
    Fam {
        prefix: "\0etsy",
        dialect: "etsy",
        default_name: "etsy",
        prefix_names: false,
        bare_is_limit: false,
    },
    Fam {
        prefix: "x-quota-",
        dialect: "x-quota",
        default_name: "quota",
        prefix_names: false,
        bare_is_limit: false,
    },
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Field {
    Limit,
    Remaining,
    Used,
    Reset,
    ResetAfter,
    ResetTime,
    WindowMs,
    Resource,
    Bucket,
    Scope,
    Name,
    Kind,
    Global,
}

enum Route<'a> {
    IetfPolicy,
    IetfLimit,
    RetryAfter,
    MsHint,
    SecsHint,
    ShouldRetry,
    Fam(usize, Field, &'a str),
    Azure(&'a str),
    Shopify,
    Salesforce,
    Zendesk(&'a str),
    SentryLimits,
    AwsErrorType,
    Marker(&'static str),
}

impl Route<'_> {
    /// Counters that a cached response makes stale.
    fn is_counter(&self) -> bool {
        !matches!(
            self,
            Route::RetryAfter
                | Route::MsHint
                | Route::SecsHint
                | Route::ShouldRetry
                | Route::AwsErrorType
                | Route::Marker(_)
        )
    }
    fn is_list(&self) -> bool {
        matches!(
            self,
            Route::IetfPolicy | Route::IetfLimit | Route::SentryLimits
        ) || matches!(self, Route::Azure("resource"))
    }
}

/// Whether a header name can matter at all, decided from its first bytes
/// so that the common headers (`content-type`, `date`, `x-request-id`…) cost
/// next to nothing.
fn may_matter(name: &[u8]) -> bool {
    match name {
        [b'r', b'a' | b'e', ..] | [b'a', b'n', ..] | [b's', b't' | b'f', ..] => true,
        [b'f', b'a', ..] | [b'z', b'e', ..] => true,
        [b'x', b'-', rest @ ..] => matches!(
            rest,
            [b'r', b'a', ..]
                | [b's', b'h' | b'e', ..]
                | [b'm', b's', ..]
                | [b'g', b'i', ..]
                | [b'e', b'n', ..]
                | [b'a', b'm' | b'p', ..]
                | [b'h', b'u', ..]
                | [b'u', b's', ..]
                | [b'q', b'u', ..]
                | [b'l', b'i', ..]
                | [b'r', b'e', ..]
        ),
        _ => false,
    }
}

fn classify(name: &str) -> Option<Route<'_>> {
    if !may_matter(name.as_bytes()) {
        return None;
    }
    Some(match name {
        "ratelimit-policy" => Route::IetfPolicy,
        "ratelimit" => Route::IetfLimit,
        "retry-after" => Route::RetryAfter,
        "retry-after-ms" | "x-ms-retry-after-ms" | "x-amz-retry-after" => Route::MsHint,
        "x-ratelimit-retry-after"
        | "x-rate-limit-retry-after"
        | "x-rate-limit-retry-after-seconds" => Route::SecsHint,
        // Etsy: per-second and per-day allowances.
        "x-limit-per-second" => Route::Fam(ETSY, Field::Limit, "second"),
        "x-remaining-this-second" => Route::Fam(ETSY, Field::Remaining, "second"),
        "x-limit-per-day" => Route::Fam(ETSY, Field::Limit, "day"),
        "x-remaining-today" => Route::Fam(ETSY, Field::Remaining, "day"),
        "stripe-should-retry" | "x-should-retry" => Route::ShouldRetry,
        "x-rate-limit" => Route::Fam(1, Field::Limit, ""),
        "x-shopify-shop-api-call-limit" => Route::Shopify,
        "sforce-limit-info" => Route::Salesforce,
        "x-sentry-rate-limits" => Route::SentryLimits,
        "x-amzn-errortype" => Route::AwsErrorType,
        "x-github-request-id" => Route::Marker("github"),
        "x-envoy-ratelimited" => Route::Marker("envoy"),
        "stripe-rate-limited-reason" => Route::Marker("stripe"),
        _ => return classify_prefixed(name),
    })
}

fn classify_prefixed(name: &str) -> Option<Route<'_>> {
    if let Some(rest) = name.strip_prefix("x-ms-ratelimit-remaining-") {
        return Some(Route::Azure(rest));
    }
    if let Some(rest) = name.strip_prefix("zendesk-ratelimit-") {
        return Some(Route::Zendesk(rest));
    }
    let (i, fam) = FAMS
        .iter()
        .enumerate()
        .find(|(_, f)| name.starts_with(f.prefix))?;
    let rest = &name[fam.prefix.len()..];
    let bare = (fam.bare_is_limit && !rest.is_empty()).then_some((Field::Limit, rest));
    let (field, qual) = split_field(rest).or(bare)?;
    Some(Route::Fam(i, field, qual))
}

const WHOLE: &[(&str, Field)] = &[
    ("limit", Field::Limit),
    ("max", Field::Limit),
    ("remaining", Field::Remaining),
    ("used", Field::Used),
    ("observed", Field::Used),
    ("reset", Field::Reset),
    ("reset-after", Field::ResetAfter),
    ("resettime", Field::ResetTime),
    ("interval-ms", Field::WindowMs),
    ("interval-milliseconds", Field::WindowMs),
    ("resource", Field::Resource),
    ("bucket", Field::Bucket),
    ("scope", Field::Scope),
    ("name", Field::Name),
    ("type", Field::Kind),
    ("total", Field::Limit),
    ("burst-capacity", Field::Limit),
    ("global", Field::Global),
];

/// `limit` → (Limit, ""), `limit-requests` and `requests-limit` →
/// (Limit, "requests"), `concurrentlimit` → (Limit, "concurrent").
fn split_field(rest: &str) -> Option<(Field, &str)> {
    if let Some((_, f)) = WHOLE.iter().find(|(w, _)| *w == rest) {
        return Some((*f, ""));
    }
    for (w, f) in WHOLE.iter().take(10) {
        if let Some(q) = rest.strip_suffix(w).and_then(|q| q.strip_suffix('-')) {
            if !q.is_empty() {
                return Some((*f, q));
            }
        }
    }
    for (w, f) in WHOLE.iter().take(6) {
        if let Some(q) = rest.strip_prefix(w).and_then(|q| q.strip_prefix('-')) {
            if !q.is_empty() && !q.contains("after") {
                return Some((*f, q));
            }
        }
    }
    // Sentry's `concurrentlimit` / `concurrentremaining`.
    match rest {
        "concurrentlimit" => Some((Field::Limit, "concurrent")),
        "concurrentremaining" => Some((Field::Remaining, "concurrent")),
        _ => None,
    }
}

/// One provider limit being assembled from several headers.
#[derive(Default)]
struct Group {
    fam: usize,
    qual: String,
    limit: Option<u64>,
    remaining: Option<u64>,
    used: Option<u64>,
    reset: Option<Nanos>,
    reset_after: Option<Nanos>,
    reset_time: Option<Nanos>,
    window_s: Option<u64>,
    resource: Option<String>,
    name: Option<String>,
    bucket: Option<String>,
    scope: Option<String>,
}

/// The accumulator one parse fills.
pub(crate) struct Acc {
    pub(crate) now: Nanos,
    age: u64,
    groups: Vec<Group>,
    extra: Vec<PolicyView>,
    ietf_policies: Option<Vec<PolicyItem>>,
    ietf_limits: Option<Vec<LimitItem>>,
    numbered: Option<Vec<(u64, Option<u64>)>>,
    pub(crate) dialects: Vec<String>,
    pub(crate) ignored: Vec<Ignored>,
    retry_after_header: Option<Nanos>,
    /// The longest millisecond hint (`retry-after-ms`, `x-ms-retry-after-ms`,
    /// `x-amz-retry-after`): finer than `Retry-After`, so it wins.
    ms_hint: Option<Nanos>,
    /// The longest seconds hint (`x-ratelimit-retry-after`): used only
    /// without `Retry-After`.
    secs_hint: Option<Nanos>,
    should_retry: Option<bool>,
    global: bool,
    pub(crate) github: bool,
    /// A retry hint found in the body (Discord's `retry_after`).
    pub(crate) body_retry: Option<Nanos>,
    /// The body says a quota is used up (OpenAI's `insufficient_quota`).
    pub(crate) body_quota: bool,
    /// The body says the request was rate limited.
    pub(crate) body_rate_limited: bool,
    /// The body says the request was throttled, whatever the status
    /// (Shopify GraphQL's `THROTTLED` inside a 200).
    pub(crate) body_throttled: bool,
    /// The answer itself says a rate limit refused the request, whatever
    /// its status: GitHub GraphQL's `RATE_LIMITED` error inside a 200, an
    /// AWS throttling error code inside a 400.
    pub(crate) rejected_by_limit: bool,
    /// The wait the throttled body implies (the points the query needs,
    /// at the restore rate): exact, so it comes before the exhausted
    /// windows' resets.
    pub(crate) throttle_wait: Option<Nanos>,
}

impl Acc {
    pub(crate) fn new(now: Nanos) -> Acc {
        Acc {
            now,
            age: 0,
            groups: Vec::new(),
            extra: Vec::new(),
            ietf_policies: None,
            ietf_limits: None,
            numbered: None,
            dialects: Vec::new(),
            ignored: Vec::new(),
            retry_after_header: None,
            ms_hint: None,
            secs_hint: None,
            should_retry: None,
            global: false,
            github: false,
            body_retry: None,
            body_quota: false,
            body_rate_limited: false,
            body_throttled: false,
            rejected_by_limit: false,
            throttle_wait: None,
        }
    }

    pub(crate) fn push_policy(&mut self, p: PolicyView) {
        self.extra.push(p);
    }

    pub(crate) fn set_global(&mut self) {
        self.global = true;
    }

    pub(crate) fn ignore(&mut self, field: &str, reason: impl Into<String>) {
        self.ignored.push(Ignored {
            field: field.to_string(),
            reason: reason.into(),
        });
    }

    pub(crate) fn dialect(&mut self, d: &str) {
        if !self.dialects.iter().any(|x| same_str(x, d)) {
            self.dialects.push(d.to_string());
        }
    }

    pub(crate) fn read_headers(&mut self, headers: &HeaderMap) {
        if let Some(age) = headers.get(http::header::AGE) {
            match age
                .to_str()
                .ok()
                .map(str::trim)
                .and_then(|s| s.parse::<u64>().ok())
            {
                Some(a) => self.age = a,
                None => self.ignore("age", "not a non-negative integer"),
            }
        }
        let mut it = headers.iter().peekable();
        while let Some((name, first)) = it.next() {
            // All values of one name come together, under the same key.
            let mut more: Vec<&http::HeaderValue> = Vec::new();
            while let Some((n, v)) = it.peek() {
                if !std::ptr::eq(*n, name) {
                    break;
                }
                more.push(v);
                it.next();
            }
            let n = name.as_str();
            let Some(route) = classify(n) else { continue };
            if route.is_counter() && self.age > 0 {
                let reason = format!(
                    "cached response (Age: {}): its rate-limit fields are stale",
                    self.age
                );
                self.ignore(n, reason);
                continue;
            }
            let cap = match route {
                Route::IetfPolicy | Route::IetfLimit => MAX_STRUCTURED_LEN,
                _ => MAX_VALUE_LEN,
            };
            let Some(value) = self.value(n, first, &more, route.is_list(), cap) else {
                continue;
            };
            self.apply(route, n, &value);
        }
    }

    /// The field's value; several lines are joined for list fields and must
    /// agree for the others.
    fn value<'h>(
        &mut self,
        name: &str,
        first: &'h http::HeaderValue,
        more: &[&'h http::HeaderValue],
        list: bool,
        cap: usize,
    ) -> Option<Cow<'h, str>> {
        let mut out: Option<Cow<'h, str>> = None;
        for v in std::iter::once(first).chain(more.iter().copied()) {
            let Ok(s) = v.to_str() else {
                self.ignore(name, "value is not visible ASCII");
                return None;
            };
            let len = out.as_ref().map_or(0, |o| o.len()) + s.len();
            if len > cap {
                self.ignore(name, format!("value too long ({len} bytes)"));
                return None;
            }
            out = Some(match out {
                None => Cow::Borrowed(s),
                Some(prev) if list => Cow::Owned(format!("{prev}, {s}")),
                Some(prev) if prev.trim() == s.trim() => prev,
                Some(prev) => {
                    let reason =
                        format!("conflicting values {} and {}", shorten(&prev), shorten(s));
                    self.ignore(name, reason);
                    return None;
                }
            });
        }
        out
    }

    fn apply(&mut self, route: Route<'_>, name: &str, v: &str) {
        match route {
            Route::IetfPolicy => match ietf::parse_policy_field(v) {
                Ok(PolicyField::Named(p)) => {
                    self.dialect("ietf");
                    self.ietf_policies = Some(p);
                }
                Ok(PolicyField::Numbered(p)) => {
                    self.dialect("ietf-draft03");
                    self.numbered = Some(p);
                }
                Err(e) => self.ignore(name, e),
            },
            Route::IetfLimit => match ietf::parse_limit_field(v) {
                Ok(LimitField::Named(l)) => {
                    self.dialect("ietf");
                    self.ietf_limits = Some(l);
                }
                Ok(LimitField::Draft07 {
                    limit,
                    remaining,
                    reset,
                }) => {
                    self.dialect("ietf-draft07");
                    let mut p = PolicyView::named("ratelimit", Unit::Requests);
                    p.quota = limit;
                    p.remaining = remaining;
                    p.reset_in = reset.map(Nanos::from_secs);
                    self.extra.push(p);
                }
                Err(e) => self.ignore(name, e),
            },
            Route::RetryAfter => match time::parse_retry_after(v, self.now) {
                Ok(d) => self.retry_after_header = Some(d),
                Err(e) => self.ignore(name, e),
            },
            Route::MsHint => match parse_delay_millis(v) {
                Ok(d) => {
                    // Several hints: keep the longest.
                    self.ms_hint = Some(self.ms_hint.map_or(d, |x| x.max(d)));
                }
                Err(e) => self.ignore(name, e),
            },
            Route::SecsHint => match parse_delay_secs(v) {
                Ok(d) => self.secs_hint = Some(self.secs_hint.map_or(d, |x| x.max(d))),
                Err(e) => self.ignore(name, e),
            },
            Route::ShouldRetry => match v.trim().to_ascii_lowercase().as_str() {
                "true" => self.should_retry = Some(true),
                "false" => self.should_retry = Some(false),
                _ => self.ignore(name, format!("not true or false: {}", shorten(v))),
            },
            Route::Marker(d) => {
                if d == "github" {
                    self.github = true;
                }
                self.dialect(d);
            }
            Route::Fam(i, field, qual) => self.apply_fam(i, field, qual, name, v),
            Route::Azure(rest) => self.apply_azure(rest, name, v),
            Route::Shopify => self.apply_shopify(name, v),
            Route::Salesforce => self.apply_salesforce(name, v),
            Route::Zendesk(rest) => self.apply_zendesk(rest, name, v),
            Route::SentryLimits => self.apply_sentry_limits(name, v),
            Route::AwsErrorType => {
                // `ThrottlingException:http://internal.amazon.com/coral/…`
                let code = v.split(':').next().unwrap_or("").trim();
                if is_aws_throttling_code(code) {
                    self.dialect("aws");
                    self.body_rate_limited = true;
                    self.rejected_by_limit = true;
                }
            }
        }
    }

    fn group(&mut self, fam: usize, qual: &str) -> &mut Group {
        let pos = self
            .groups
            .iter()
            .position(|g| g.fam == fam && same_str(&g.qual, qual));
        let i = match pos {
            Some(i) => i,
            None => {
                self.groups.push(Group {
                    fam,
                    qual: qual.to_string(),
                    ..Group::default()
                });
                self.groups.len() - 1
            }
        };
        &mut self.groups[i]
    }

    fn apply_fam(&mut self, fam: usize, field: Field, qual: &str, name: &str, v: &str) {
        self.dialect(FAMS[fam].dialect);
        self.tag_vendor(fam, field, qual);
        let now = self.now;
        let result: Result<(), String> = (|| {
            match field {
                Field::Limit => {
                    let (n, w) = count_with_window(v)?;
                    let g = self.group(fam, qual);
                    g.limit = Some(n);
                    if w.is_some() {
                        g.window_s = w;
                    }
                }
                Field::Remaining => {
                    let (n, w) = count_with_window(v)?;
                    let g = self.group(fam, qual);
                    g.remaining = Some(n);
                    if g.window_s.is_none() {
                        g.window_s = w;
                    }
                }
                Field::Used => self.group(fam, qual).used = Some(parse_count(v)?),
                Field::Reset => {
                    let (d, _) = parse_reset(strip_params(v), now)?;
                    self.group(fam, qual).reset = Some(d);
                }
                Field::ResetAfter => self.group(fam, qual).reset_after = Some(parse_delay_secs(v)?),
                Field::ResetTime => {
                    let (d, _) = parse_reset(v, now)?;
                    self.group(fam, qual).reset_time = Some(d);
                }
                Field::WindowMs => {
                    let ms = parse_count(v)?;
                    self.group(fam, qual).window_s = Some(ms.div_ceil(1000).max(1));
                }
                Field::Resource => self.group(fam, qual).resource = Some(short_token(v)?),
                Field::Bucket => self.group(fam, qual).bucket = Some(short_token(v)?),
                Field::Scope => self.group(fam, qual).scope = Some(short_token(v)?),
                Field::Name => self.group(fam, qual).name = Some(short_token(v)?),
                // Zoom's `X-RateLimit-Type: QPS | Daily-limit`.
                Field::Kind => {
                    let k = v.trim().to_ascii_lowercase();
                    let w = if k.contains("day") || k.contains("daily") {
                        Some(86_400)
                    } else if k == "qps" {
                        Some(1)
                    } else {
                        None
                    };
                    let g = self.group(fam, qual);
                    g.window_s = g.window_s.or(w);
                }
                Field::Global => self.global = v.trim().eq_ignore_ascii_case("true"),
            }
            Ok(())
        })();
        if let Err(e) = result {
            self.ignore(name, e);
        }
    }

    fn tag_vendor(&mut self, fam: usize, field: Field, qual: &str) {
        match (FAMS[fam].prefix, field) {
            ("x-ratelimit-", Field::Resource) => {
                self.github = true;
                self.dialect("github");
            }
            ("x-ratelimit-", Field::ResetAfter | Field::Bucket | Field::Global | Field::Scope) => {
                self.dialect("discord")
            }
            ("x-ratelimit-", _) if qual == "requests" || qual == "tokens" => self.dialect("openai"),
            ("ratelimit-", Field::ResetTime | Field::Used) => self.dialect("gitlab"),
            ("x-rate-limit-", Field::WindowMs) => self.dialect("trello"),
            _ => {}
        }
    }

    fn apply_azure(&mut self, rest: &str, name: &str, v: &str) {
        self.dialect("azure");
        if rest == "resource" {
            // `Microsoft.Compute/HighCostGet3Min;107,Microsoft.Compute/HighCostGet30Min;587`
            for part in v.split(',') {
                let Some((pname, n)) = part.trim().rsplit_once(';') else {
                    self.ignore(
                        name,
                        format!("expected name;remaining, got {}", shorten(part)),
                    );
                    continue;
                };
                match parse_count(n) {
                    Ok(n) => {
                        let mut p = PolicyView::named(pname.trim(), Unit::Requests);
                        p.remaining = Some(n);
                        p.window_s = azure_window(pname);
                        p.scope = Some("resource".to_string());
                        self.extra.push(p);
                    }
                    Err(e) => self.ignore(name, e),
                }
            }
            return;
        }
        match parse_count(v) {
            Ok(n) => {
                let mut p = PolicyView::named(rest, Unit::Requests);
                p.remaining = Some(n);
                self.extra.push(p);
            }
            Err(e) => self.ignore(name, e),
        }
    }

    fn apply_shopify(&mut self, name: &str, v: &str) {
        self.dialect("shopify");
        // `32/40`: used/limit of a leaky bucket that, as documented, drains
        // limit/20 per second (2/s for 40, 20/s for 400). The header states
        // no reset; the documented drain is published as the window it
        // implies (the limit per 20 s), never as a reset.
        let parsed = v
            .split_once('/')
            .ok_or_else(|| format!("expected used/limit, got {}", shorten(v)))
            .and_then(|(u, l)| Ok((parse_count(u)?, parse_count(l)?)));
        match parsed {
            Ok((used, limit)) if limit > 0 => {
                let mut p = PolicyView::named("shopify", Unit::Requests);
                p.quota = Some(limit);
                p.remaining = Some(limit.saturating_sub(used));
                p.window_s = Some(SHOPIFY_DRAIN_WINDOW_S);
                self.extra.push(p);
            }
            Ok(_) => self.ignore(name, "limit is zero"),
            Err(e) => self.ignore(name, e),
        }
    }

    fn apply_salesforce(&mut self, name: &str, v: &str) {
        self.dialect("salesforce");
        // `api-usage=25/5000` (a rolling 24 hours), maybe with
        // `; per-app-api-usage=17/250(appName=x)`.
        for part in v.split([';', ',']) {
            let Some((k, rest)) = part.trim().split_once('=') else {
                continue;
            };
            let rest = rest.split('(').next().unwrap_or("");
            let Some((u, l)) = rest.split_once('/') else {
                self.ignore(name, format!("expected used/limit in {}", shorten(part)));
                continue;
            };
            match (parse_count(u), parse_count(l)) {
                (Ok(u), Ok(l)) => {
                    let mut p = PolicyView::named(k.trim(), Unit::Requests);
                    p.quota = Some(l);
                    p.remaining = Some(l.saturating_sub(u));
                    p.window_s = Some(86_400);
                    self.extra.push(p);
                }
                _ => self.ignore(name, format!("bad used/limit in {}", shorten(part))),
            }
        }
    }

    fn apply_zendesk(&mut self, rest: &str, name: &str, v: &str) {
        self.dialect("zendesk");
        // `total=100; remaining=99; resets=58`
        let mut p = PolicyView::named(rest, Unit::Requests);
        for kv in v.split([';', ',']) {
            let Some((k, val)) = kv.trim().split_once('=') else {
                continue;
            };
            let r = match k.trim() {
                "total" => parse_count(val).map(|n| p.quota = Some(n)),
                "remaining" => parse_count(val).map(|n| p.remaining = Some(n)),
                "resets" => parse_delay_secs(val).map(|d| p.reset_in = Some(d)),
                _ => Ok(()),
            };
            if let Err(e) = r {
                self.ignore(name, e);
                return;
            }
        }
        if p.quota.is_some() || p.remaining.is_some() {
            self.extra.push(p);
        }
    }

    fn apply_sentry_limits(&mut self, name: &str, v: &str) {
        self.dialect("sentry");
        // `60:transaction:key, 2700:default;error;security:organization`
        for entry in v.split(',') {
            let mut it = entry.trim().split(':');
            let secs = it.next().unwrap_or("");
            let cats = it.next().unwrap_or("");
            let scope = it.next().unwrap_or("");
            match parse_delay_secs(secs) {
                Ok(d) => {
                    let n = if cats.is_empty() { "all" } else { cats };
                    let mut p = PolicyView::named(n, Unit::Other("events".into()));
                    p.remaining = Some(0);
                    p.reset_in = Some(d);
                    p.scope = (!scope.is_empty()).then(|| scope.to_string());
                    self.extra.push(p);
                }
                Err(e) => self.ignore(name, e),
            }
        }
    }

    /// Builds every policy, the merged view and the verdict.
    pub(crate) fn finish(mut self, status: u16, problem: Option<ProblemView>) -> ResponseView {
        let mut policies = self.ietf_views();
        if let Some(numbered) = self.numbered.take() {
            apply_numbered(&mut self.groups, &numbered);
            apply_numbered_draft07(&mut self.extra, &numbered);
        }
        let groups = std::mem::take(&mut self.groups);
        for g in groups {
            if let Some(p) = group_view(g, self.github) {
                push_dedup(&mut policies, p);
            }
        }
        for p in std::mem::take(&mut self.extra) {
            push_dedup(&mut policies, p);
        }
        let tightest = tightest(&policies);
        let header_wait = self.ms_hint.or(self.retry_after_header).or(self.secs_hint);
        // A rejection's bare reset (no count beside it, as Atlassian sends
        // on a 429) is the reset of the window that refused it.
        let rejected = matches!(status, 429 | 420);
        let exhausted = policies
            .iter()
            .filter(|p| p.is_exhausted() || (rejected && p.is_bare_reset()))
            .filter_map(|p| p.reset_in)
            .max();
        // A 403 is a rate limit only with evidence: a body that says so, a
        // request window used up, or a Retry-After (GitHub's secondary limit).
        let rate_evidence = self.body_rate_limited
            || header_wait.is_some()
            || policies
                .iter()
                .any(|p| p.unit.is_requests() && p.is_exhausted());
        let floor = (self.github && (status == 429 || (status == 403 && self.body_rate_limited)))
            .then_some(GITHUB_SECONDARY_FLOOR);
        let wait = header_wait
            .or(self.throttle_wait)
            .or(exhausted)
            .or(self.body_retry)
            .or(floor)
            .filter(|w| *w > Nanos::ZERO);
        let outcome = outcome(
            status,
            rate_evidence,
            self.body_throttled,
            self.rejected_by_limit,
            &policies,
            problem.as_ref(),
            self.body_quota,
        );
        // An explicit verdict (`x-should-retry`, `Stripe-Should-Retry`)
        // overrides the guess from the outcome, for any answer but a success.
        let retry = match self.should_retry {
            Some(v) if outcome != OutcomeKind::Success => v,
            _ => matches!(outcome, OutcomeKind::RateLimited | OutcomeKind::Overloaded),
        };
        let t = tightest.map(|i| &policies[i]);
        ResponseView {
            status,
            outcome,
            retry,
            retry_after: wait,
            retry_after_header: header_wait,
            should_retry: self.should_retry,
            limit: t.and_then(|p| p.quota),
            remaining: t.and_then(|p| p.remaining),
            reset_in: t.and_then(|p| p.reset_in),
            tightest,
            policies,
            dialects: self.dialects,
            ignored: self.ignored,
            problem,
        }
    }

    fn ietf_views(&mut self) -> Vec<PolicyView> {
        let pols = self.ietf_policies.take().unwrap_or_default();
        let mut lims = self.ietf_limits.take().unwrap_or_default();
        let mut out = Vec::with_capacity(pols.len().max(lims.len()));
        for p in pols {
            let mut v = PolicyView::named(
                p.name,
                p.qu.as_deref().map_or(Unit::Requests, Unit::from_name),
            );
            v.quota = Some(p.q);
            v.window_s = p.w;
            if v.unit == Unit::ConcurrentRequests {
                v.window_s = None;
            }
            if let Some(i) = lims.iter().position(|l| l.name == v.name) {
                let l = lims.swap_remove(i);
                v.remaining = Some(l.r);
                v.reset_in = l.t.map(Nanos::from_secs);
            }
            out.push(v);
        }
        for l in lims {
            let mut v = PolicyView::named(l.name, Unit::Requests);
            v.remaining = Some(l.r);
            v.reset_in = l.t.map(Nanos::from_secs);
            out.push(v);
        }
        out
    }
}

/// String equality that settles the common cases (different lengths, both
/// empty) without calling `memcmp`.
fn same_str(a: &str, b: &str) -> bool {
    a.len() == b.len() && (a.is_empty() || a.as_bytes() == b.as_bytes())
}

/// Draft-05/06 `RateLimit-Policy: 10;w=1, 50;w=60` gives the window of the
/// `RateLimit-Limit` with the same quota.
fn apply_numbered(groups: &mut [Group], numbered: &[(u64, Option<u64>)]) {
    let draft = FAMS.iter().position(|f| f.prefix == "ratelimit-");
    for g in groups
        .iter_mut()
        .filter(|g| Some(g.fam) == draft && g.qual.is_empty())
    {
        if g.window_s.is_some() {
            continue;
        }
        let hit = match g.limit {
            Some(l) => numbered.iter().find(|(q, _)| *q == l),
            None if numbered.len() == 1 => numbered.first(),
            None => None,
        };
        if let Some((q, w)) = hit {
            g.limit.get_or_insert(*q);
            g.window_s = *w;
        }
    }
}

/// Draft-07 pairs the same numbered `RateLimit-Policy: 8;w=2` with its
/// `RateLimit: limit=8, remaining=7, reset=2` dictionary: the window of the
/// policy with the same quota (or of the only one) is the dictionary's.
fn apply_numbered_draft07(extra: &mut [PolicyView], numbered: &[(u64, Option<u64>)]) {
    for p in extra
        .iter_mut()
        .filter(|p| p.name == "ratelimit" && p.window_s.is_none())
    {
        let hit = match p.quota {
            Some(l) => numbered.iter().find(|(q, _)| *q == l),
            None if numbered.len() == 1 => numbered.first(),
            None => None,
        };
        if let Some((q, w)) = hit {
            p.quota.get_or_insert(*q);
            p.window_s = *w;
        }
    }
}

/// One provider limit as a policy. `used` fills in whichever of limit and
/// remaining is missing (Reddit sends used and remaining only); on GitHub a
/// limit without a resource is the hourly `core` one.
fn group_view(g: Group, github: bool) -> Option<PolicyView> {
    let remaining = g
        .remaining
        .or_else(|| Some(g.limit?.saturating_sub(g.used?)));
    let limit = g.limit.or_else(|| g.remaining?.checked_add(g.used?));
    let reset_in = g.reset_after.or(g.reset).or(g.reset_time);
    // A reset alone (Atlassian's `X-RateLimit-Reset` on a 429) still says
    // when the window resets.
    if limit.is_none() && remaining.is_none() && reset_in.is_none() {
        return None;
    }
    let github_core = github && g.fam == 0 && g.qual.is_empty() && g.resource.is_none();
    let fam = &FAMS[g.fam];
    let name = match (g.resource.as_ref().or(g.name.as_ref()), g.qual.is_empty()) {
        (Some(r), _) => r.clone(),
        (None, true) => fam.default_name.to_string(),
        (None, false) if fam.prefix_names => format!("{}-{}", fam.default_name, g.qual),
        (None, false) => g.qual.clone(),
    };
    let window_s = g
        .window_s
        .or_else(|| window_from_words(&g.qual))
        .or_else(|| g.resource.as_deref().and_then(github_window))
        .or(github_core.then_some(3_600))
        .or(documented_window(fam.prefix));
    Some(PolicyView {
        unit: unit_from_words(&g.qual),
        name,
        quota: limit,
        window_s,
        remaining,
        reset_in,
        scope: g.bucket.or(g.resource).or(g.scope),
    })
}

/// Adds `p` unless an earlier policy already describes the same counter
/// (same unit and remaining, and the same quota when the newcomer states one), in
/// which case the earlier one only gains what it lacked.
fn push_dedup(policies: &mut Vec<PolicyView>, p: PolicyView) {
    let same = policies.iter_mut().find(|o| {
        o.unit == p.unit
            && o.remaining.is_some()
            && o.remaining == p.remaining
            && (p.quota.is_none() || o.quota == p.quota)
            && (p.scope.is_none() || o.scope.is_none() || o.scope == p.scope)
    });
    match same {
        Some(o) => {
            o.window_s = o.window_s.or(p.window_s);
            o.reset_in = o.reset_in.or(p.reset_in);
            o.scope = o.scope.take().or(p.scope);
        }
        None => policies.push(p),
    }
}

/// The tightest window counted in requests: the fewest remaining; on a tie
/// the one that resets last.
pub(crate) fn tightest(policies: &[PolicyView]) -> Option<usize> {
    policies
        .iter()
        .enumerate()
        .filter(|(_, p)| p.unit.is_requests() && p.remaining.is_some())
        .min_by(|(_, a), (_, b)| {
            a.remaining
                .cmp(&b.remaining)
                .then(b.reset_in.cmp(&a.reset_in))
        })
        .map(|(i, _)| i)
}

fn outcome(
    status: u16,
    rate_evidence: bool,
    throttled: bool,
    rejected: bool,
    policies: &[PolicyView],
    problem: Option<&ProblemView>,
    body_quota: bool,
) -> OutcomeKind {
    let code = problem.and_then(|p| p.code.as_deref());
    // 420 is Twitter's old "Enhance Your Calm".
    let limited = status == 429
        || status == 420
        || throttled
        || rejected
        || (status == 403 && rate_evidence)
        || (status >= 400 && matches!(code, Some("rate_limited" | "quota_exhausted")));
    if limited {
        let kind = classify_limit(policies, problem, code, body_quota);
        // a throttled body is a leaky bucket running dry, never a quota
        // (unless the body itself says quota)
        if throttled && kind == OutcomeKind::QuotaExhausted && !body_quota && code.is_none() {
            return OutcomeKind::RateLimited;
        }
        return kind;
    }
    match status {
        0..=399 => OutcomeKind::Success,
        // 529 is Anthropic's "overloaded"
        503 | 529 => OutcomeKind::Overloaded,
        _ => OutcomeKind::Error,
    }
}

fn classify_limit(
    policies: &[PolicyView],
    problem: Option<&ProblemView>,
    code: Option<&str>,
    body_quota: bool,
) -> OutcomeKind {
    if code == Some("quota_exhausted") || body_quota {
        return OutcomeKind::QuotaExhausted;
    }
    if code == Some("rate_limited") {
        return OutcomeKind::RateLimited;
    }
    let named = problem
        .and_then(|p| p.limit.as_deref())
        .and_then(|n| policies.iter().find(|p| p.name == n));
    let binding = named.or_else(|| {
        policies
            .iter()
            .filter(|p| p.is_exhausted())
            .max_by_key(|p| p.reset_in)
    });
    match binding {
        Some(p) if p.unit == Unit::ConcurrentRequests => OutcomeKind::RateLimited,
        Some(p) => {
            let long = match p.window_s {
                Some(w) => w >= 3_600,
                None => p.reset_in.is_some_and(|r| r >= Nanos::from_secs(3_600)),
            };
            if long {
                OutcomeKind::QuotaExhausted
            } else {
                OutcomeKind::RateLimited
            }
        }
        None => OutcomeKind::RateLimited,
    }
}

/// `100`, `100;w=21600` (Docker Hub, draft-03), `10, 10;w=1, 50;w=60`
/// (draft-03 with quota policies): the count and, when stated, its window.
fn count_with_window(v: &str) -> Result<(u64, Option<u64>), String> {
    let t = v.trim();
    if !t.is_empty() && t.len() <= 15 && t.bytes().all(|c| c.is_ascii_digit()) {
        return Ok((t.parse().map_err(|_| format!("not a count: {t:?}"))?, None));
    }
    let mut first: Option<(u64, Option<u64>)> = None;
    let mut windows: Vec<(u64, u64)> = Vec::new();
    // `150/15m`: a count per window.
    if let Some((n, w)) = v.split_once('/') {
        let w = time::parse_go_duration(w.trim())
            .ok_or_else(|| format!("bad window in {}", shorten(v)))?;
        return Ok((parse_count(n)?, Some(w.as_secs_ceil().max(1))));
    }
    for part in v.split(',') {
        let mut it = part.split(';');
        let n = parse_count(it.next().unwrap_or(""))?;
        let mut w = None;
        for param in it {
            // `window=` is the parameter's name in the drafts before `w=`.
            let param = param.trim();
            if let Some(x) = param
                .strip_prefix("w=")
                .or_else(|| param.strip_prefix("window="))
            {
                w = Some(parse_count(x)?);
            }
        }
        match (first, w) {
            (None, _) => first = Some((n, w)),
            (Some(_), Some(w)) => windows.push((n, w)),
            (Some((f, _)), None) if f == n => {}
            (Some(_), None) => return Err(format!("conflicting values in {}", shorten(v))),
        }
    }
    let (n, w) = first.ok_or("empty value")?;
    let w = w.or_else(|| windows.iter().find(|(q, _)| *q == n).map(|(_, w)| *w));
    Ok((n, w))
}

fn strip_params(v: &str) -> &str {
    v.split(';').next().unwrap_or(v)
}

fn short_token(v: &str) -> Result<String, String> {
    let v = v.trim();
    if v.is_empty() || v.len() > 128 {
        return Err(format!("not a usable name: {}", shorten(v)));
    }
    Ok(v.to_string())
}

fn unit_from_words(q: &str) -> Unit {
    if q.is_empty() {
        Unit::Requests
    } else if q.contains("token") && !q.contains("api-token") {
        Unit::Tokens
    } else if q.contains("concurrent") {
        Unit::ConcurrentRequests
    } else if q.contains("byte") {
        Unit::ContentBytes
    } else if ["complexity", "cost", "point", "credit", "spend"]
        .iter()
        .any(|w| q.contains(w))
    {
        Unit::Other(q.to_string())
    } else {
        Unit::Requests
    }
}

fn window_from_words(q: &str) -> Option<u64> {
    if q.is_empty() {
        return None;
    }
    q.split('-').find_map(|w| match w {
        "second" | "secondly" | "sec" | "1s" => Some(1),
        "minute" | "minutely" | "min" | "1m" | "rpm" | "tpm" => Some(60),
        "hour" | "hourly" | "1h" => Some(3_600),
        "day" | "daily" | "24hour" | "24h" | "rpd" | "tpd" => Some(86_400),
        "month" | "monthly" => Some(30 * 86_400),
        "year" | "yearly" => Some(365 * 86_400),
        _ => None,
    })
}

/// A family's documented window when its headers state none: Fastly's API
/// counts modifying requests per hour.
fn documented_window(prefix: &str) -> Option<u64> {
    (prefix == "fastly-ratelimit-").then_some(3_600)
}

/// AWS error codes that mean the request was throttled (the codes the AWS
/// SDKs retry as throttling). `LimitExceededException` is left out: many
/// services use it for a cap on how many resources exist, which no wait
/// lifts.
pub(crate) fn is_aws_throttling_code(code: &str) -> bool {
    matches!(
        code,
        "Throttling"
            | "ThrottlingException"
            | "ThrottledException"
            | "RequestThrottledException"
            | "TooManyRequestsException"
            | "ProvisionedThroughputExceededException"
            | "RequestLimitExceeded"
            | "BandwidthLimitExceeded"
            | "RequestThrottled"
            | "SlowDown"
            | "PriorRequestNotComplete"
            | "EC2ThrottledException"
    )
}

/// GitHub's documented windows per resource.
fn github_window(resource: &str) -> Option<u64> {
    match resource {
        "core" | "graphql" | "integration_manifest" => Some(3_600),
        "search" | "code_search" | "source_import" => Some(60),
        _ => None,
    }
}

/// `HighCostGet3Min` → 180 s.
fn azure_window(name: &str) -> Option<u64> {
    let lower = name.to_ascii_lowercase();
    let (stem, mult) = if let Some(s) = lower.strip_suffix("min") {
        (s, 60)
    } else if let Some(s) = lower.strip_suffix("sec") {
        (s, 1)
    } else if let Some(s) = lower.strip_suffix("hour") {
        (s, 3_600)
    } else {
        return None;
    };
    let digits = stem.len() - stem.bytes().rev().take_while(u8::is_ascii_digit).count();
    stem[digits..]
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefilter_keeps_every_routed_name() {
        for n in [
            "ratelimit",
            "ratelimit-policy",
            "retry-after",
            "retry-after-ms",
            "x-ms-retry-after-ms",
            "x-amz-retry-after",
            "x-ratelimit-retry-after",
            "x-rate-limit-retry-after",
            "stripe-should-retry",
            "x-should-retry",
            "x-rate-limit",
            "x-shopify-shop-api-call-limit",
            "sforce-limit-info",
            "x-sentry-rate-limits",
            "x-github-request-id",
            "x-envoy-ratelimited",
            "stripe-rate-limited-reason",
            "x-ms-ratelimit-remaining-resource",
            "zendesk-ratelimit-a",
            "x-ratelimit-limit",
            "x-rate-limit-limit",
            "ratelimit-limit",
            "anthropic-ratelimit-x-limit",
            "x-sentry-rate-limit-limit",
            "fastly-ratelimit-remaining",
            "x-hubspot-ratelimit-max",
            "x-app-limit-24hour-limit",
            "x-user-limit-24hour-limit",
            "x-quota-limit",
            "x-limit-per-second",
            "x-remaining-today",
            "x-rate-limit-retry-after-seconds",
            "x-amzn-errortype",
        ] {
            assert!(classify(n).is_some(), "{n}");
        }
        for n in [
            "content-type",
            "date",
            "x-request-id",
            "x-frame-options",
            "server",
            "age",
        ] {
            assert!(classify(n).is_none(), "{n}");
        }
    }

    #[test]
    fn etsy_index_is_right() {
        assert_eq!(FAMS[ETSY].dialect, "etsy");
    }

    #[test]
    fn field_words() {
        assert!(matches!(split_field("limit"), Some((Field::Limit, ""))));
        assert!(matches!(
            split_field("limit-requests"),
            Some((Field::Limit, "requests"))
        ));
        assert!(matches!(
            split_field("requests-limit"),
            Some((Field::Limit, "requests"))
        ));
        assert!(matches!(
            split_field("reset-after"),
            Some((Field::ResetAfter, ""))
        ));
        assert!(matches!(
            split_field("input-tokens-reset"),
            Some((Field::Reset, "input-tokens"))
        ));
        assert!(matches!(
            split_field("api-token-interval-ms"),
            Some((Field::WindowMs, "api-token"))
        ));
        assert!(matches!(
            split_field("concurrentremaining"),
            Some((Field::Remaining, "concurrent"))
        ));
        assert!(matches!(
            split_field("24hour-limit"),
            Some((Field::Limit, "24hour"))
        ));
        assert!(split_field("nearlimit-x").is_none());
    }

    #[test]
    fn count_forms() {
        assert_eq!(count_with_window("100"), Ok((100, None)));
        assert_eq!(count_with_window("100;w=21600"), Ok((100, Some(21_600))));
        assert_eq!(count_with_window("10, 10;w=1, 50;w=60"), Ok((10, Some(1))));
        assert_eq!(count_with_window("5, 5"), Ok((5, None)));
        assert_eq!(count_with_window("150/15m"), Ok((150, Some(900))));
        assert_eq!(
            count_with_window("100, 100;window=60, 10000;window=86400"),
            Ok((100, Some(60)))
        );
        assert!(count_with_window("5, 6").is_err());
    }

    #[test]
    fn azure_windows() {
        assert_eq!(azure_window("Microsoft.Compute/HighCostGet3Min"), Some(180));
        assert_eq!(
            azure_window("Microsoft.Compute/HighCostGet30Min"),
            Some(1_800)
        );
        assert_eq!(azure_window("reads"), None);
    }
}
