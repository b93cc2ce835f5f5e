//! The responses the layer writes itself: rejections and the usage document.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use http::header::{
    HeaderName, HeaderValue, CACHE_CONTROL, CONNECTION, CONTENT_TYPE, RETRY_AFTER, WWW_AUTHENTICATE,
};
use http::{HeaderMap, Response, StatusCode};
use paceline_core::{Decision, Denial, Nanos, Outcome, Plan, PolicyKind, PolicyStatus};
use paceline_wire::emit::{self, Dialects};
use paceline_wire::problem::{Problem, ProblemKind, PROBLEM_CONTENT_TYPE};
use serde::Serialize;

use crate::time::rfc3339;

const NO_STORE: HeaderValue = HeaderValue::from_static("no-store");

const RATELIMIT_POLICY: HeaderName = HeaderName::from_static(emit::RATELIMIT_POLICY);
const RATELIMIT: HeaderName = HeaderName::from_static(emit::RATELIMIT);
const ANONYMOUS_DETAIL: &str = "Too many requests from this client; retry later.";

/// What never changes for a plan, prepared once so that a rejection only
/// splices its numbers into ready parts: the `RateLimit-Policy` value, the
/// head of a 429 and, per policy, the problem body around its numbers.
#[derive(Debug)]
pub(crate) struct PlanMeta {
    /// Tells this plan's prepared parts apart from any other's, for the
    /// per-thread memo of the last denial.
    id: u64,
    policy_field: Option<HeaderValue>,
    /// Per policy: its `RateLimit` item up to `r`'s value (`, "name";r=`).
    items: Vec<Box<[u8]>>,
    /// Per policy: the fixed parts of its problem body.
    problems: Vec<ProblemParts>,
    /// The head of a 429: [published, anonymous].
    heads: [Head; 2],
}

/// A policy's problem body without its per-request members.
#[derive(Debug)]
struct ProblemParts {
    /// [published, anonymous]: the JSON up to the value of `retry_after_s`.
    open: [String; 2],
    /// `,"violated-policies":["<policy>"`: the deciding policy first.
    violated: String,
}

/// The header fields of a 429 in a fixed order, with placeholders where the
/// per-request values go: cloning it and overwriting two values is cheaper
/// than hashing every name into a new map.
#[derive(Debug)]
struct Head {
    fields: HeaderMap,
    /// The position of `RateLimit`, when counters are published.
    ratelimit: Option<usize>,
    /// The position of `Retry-After`.
    retry_after: usize,
}

impl Head {
    fn new(policy_field: Option<&HeaderValue>, ietf: bool) -> Head {
        let mut fields = HeaderMap::with_capacity(6);
        fields.append(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_CONTENT_TYPE));
        fields.append(CACHE_CONTROL, NO_STORE);
        let mut ratelimit = None;
        if ietf {
            if let Some(v) = policy_field {
                fields.append(RATELIMIT_POLICY, v.clone());
            }
            ratelimit = Some(fields.len());
            fields.append(RATELIMIT, HeaderValue::from_static(""));
        }
        let retry_after = fields.len();
        fields.append(RETRY_AFTER, HeaderValue::from_static("1"));
        Head {
            fields,
            ratelimit,
            retry_after,
        }
    }
}

impl PlanMeta {
    pub(crate) fn new(plan: &Plan, base: &str, dialects: &Dialects) -> PlanMeta {
        let policy_field = HeaderValue::try_from(emit::policy_field(plan)).ok();
        let problems = (0..plan.policies().len())
            .map(|i| ProblemParts::new(plan, i, base))
            .collect();
        let heads = [
            Head::new(policy_field.as_ref(), dialects.ietf),
            Head::new(None, false),
        ];
        // policy names are token-safe (core validates them): no escaping
        let items = plan
            .policies()
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let sep = if i > 0 { ", " } else { "" };
                format!("{sep}\"{}\";r=", p.name()).into_bytes().into()
            })
            .collect();
        static IDS: AtomicU64 = AtomicU64::new(0);
        PlanMeta {
            id: IDS.fetch_add(1, Ordering::Relaxed),
            policy_field,
            items,
            problems,
            heads,
        }
    }
}

impl ProblemParts {
    fn new(plan: &Plan, i: usize, base: &str) -> ProblemParts {
        let mut d = Decision {
            outcome: Outcome::Denied(Denial {
                policy: i,
                kind: plan.policy(i).kind(),
                retry_after: Nanos::SECOND,
            }),
            statuses: Default::default(),
        };
        for j in 0..plan.policies().len() {
            d.statuses.push(PolicyStatus {
                remaining: 0,
                reset_after: Nanos::ZERO,
                would_deny: i == j,
            });
        }
        let mut p = Problem::from_decision(plan, &d, base)
            .unwrap_or_else(|| Problem::new(ProblemKind::RateLimited, base, ""));
        p.retry_after_s = None;
        p.violated_policies.clear();
        let published = open_json(&p);
        p.detail = ANONYMOUS_DETAIL.to_string();
        // policy names are token-safe (core validates them): no escaping
        ProblemParts {
            open: [published, open_json(&p)],
            violated: format!(",\"violated-policies\":[\"{}\"", plan.policy(i).name()),
        }
    }
}

/// The problem's JSON object without the members a denial splices in
/// (`violated-policies`, written after the number) and without its closing
/// brace, ready for `retry_after_s`.
fn open_json(p: &Problem) -> String {
    // the wire crate writes every member, the empty list too (compact, in
    // declaration order), and `retry_after_s` is `None` here
    let mut s = p.to_json().replace(",\"violated-policies\":[]", "");
    if s.ends_with('}') {
        s.pop();
    }
    s.push_str(",\"retry_after_s\":");
    s
}

/// Writes the rate-limit fields of `d`: every chosen dialect when the
/// identity publishes counters, else only `Retry-After` on a denial.
pub(crate) fn write_fields(
    plan: &Plan,
    meta: &PlanMeta,
    d: &Decision,
    dialects: &Dialects,
    publish: bool,
    h: &mut HeaderMap,
) {
    if !publish {
        if let Some(s) = emit::retry_after_secs(d) {
            h.insert(RETRY_AFTER, seconds_value(s));
        }
        return;
    }
    if dialects.ietf {
        if let Some(v) = &meta.policy_field {
            h.insert(RATELIMIT_POLICY, v.clone());
        }
        if let Some(v) = ratelimit_value(plan, meta, d) {
            h.insert(RATELIMIT, v);
        }
    }
    older_dialects(plan, d, dialects, h);
}

/// The older dialects (and, on a denial, `Retry-After` with no-store),
/// when the deployment asks for them.
fn older_dialects(plan: &Plan, d: &Decision, dialects: &Dialects, h: &mut HeaderMap) {
    let rest = Dialects {
        ietf: false,
        ..*dialects
    };
    if rest.x_ratelimit || rest.draft03 || d.denial().is_some() {
        emit::write_headers(plan, d, &rest, h);
    }
}

/// A short buffer on the stack for a header value.
struct FieldBuf {
    buf: [u8; 192],
    len: usize,
}

impl FieldBuf {
    fn new() -> Self {
        FieldBuf {
            buf: [0; 192],
            len: 0,
        }
    }
    /// Appends `s`; false when it does not fit.
    fn push(&mut self, s: &[u8]) -> bool {
        let end = self.len + s.len();
        match self.buf.get_mut(self.len..end) {
            Some(dst) => {
                dst.copy_from_slice(s);
                self.len = end;
                true
            }
            None => false,
        }
    }
    fn push_int(&mut self, n: u64) -> bool {
        self.push(itoa::Buffer::new().format(sf_int(n)).as_bytes())
    }
    fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

/// A structured-field integer: at most 15 digits, so larger values clamp.
fn sf_int(n: u64) -> u64 {
    n.min(999_999_999_999_999)
}

/// The IETF `RateLimit` field as `paceline_wire::emit::ratelimit_field`
/// writes it, from the plan's prepared items and without a heap buffer.
fn ratelimit_value(plan: &Plan, meta: &PlanMeta, d: &Decision) -> Option<HeaderValue> {
    let mut out = FieldBuf::new();
    let mut fits = true;
    for (item, s) in meta.items.iter().zip(&d.statuses) {
        fits &= out.push(item) && out.push_int(s.remaining);
        fits &= out.push(b";t=") && out.push_int(s.reset_secs());
    }
    match fits {
        true => HeaderValue::from_bytes(out.as_bytes()).ok(),
        false => HeaderValue::try_from(emit::ratelimit_field(plan, d)).ok(),
    }
}

/// Every number below 10,000 written out one after another
/// (`0123456789101112…9999`), so that most `Retry-After` values are a
/// static slice instead of an allocation.
static NUMBERS: [u8; NUMBERS_LEN] = numbers();
const NUMBERS_LEN: usize = 10 + 90 * 2 + 900 * 3 + 9_000 * 4;

const fn numbers() -> [u8; NUMBERS_LEN] {
    let mut out = [0u8; NUMBERS_LEN];
    let (mut n, mut at) = (0usize, 0usize);
    while n < 10_000 {
        let width = digits(n);
        let mut rest = n;
        let mut k = width;
        while k > 0 {
            k -= 1;
            out[at + k] = b'0' + (rest % 10) as u8;
            rest /= 10;
        }
        at += width;
        n += 1;
    }
    out
}

const fn digits(n: usize) -> usize {
    match n {
        0..=9 => 1,
        10..=99 => 2,
        100..=999 => 3,
        _ => 4,
    }
}

/// `n` as a header value; without allocating below 10,000.
fn seconds_value(n: u64) -> HeaderValue {
    let small = usize::try_from(n).ok().filter(|&n| n < 10_000);
    let Some(n) = small else {
        return HeaderValue::from(n);
    };
    let start = match digits(n) {
        1 => n,
        2 => 10 + 2 * (n - 10),
        3 => 190 + 3 * (n - 100),
        _ => 2_890 + 4 * (n - 1_000),
    };
    let digits = Bytes::from_static(&NUMBERS[start..start + digits(n)]);
    HeaderValue::from_maybe_shared(digits).unwrap_or_else(|_| HeaderValue::from(n as u64))
}

fn problem_response(json: String, status: u16) -> Response<Bytes> {
    let mut r = Response::new(Bytes::from(json));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::TOO_MANY_REQUESTS);
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_CONTENT_TYPE));
    h.insert(CACHE_CONTROL, NO_STORE);
    r
}

/// Marks a response that answers a request whose body was never read: the
/// connection is not reused.
pub(crate) fn close_connection<B>(r: &mut Response<B>) {
    r.headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
}

/// The problem body of a denial: the prepared parts with the numbers and
/// any further violated policies spliced in, in one exact allocation.
fn denial_body(plan: &Plan, meta: &PlanMeta, d: &Decision, den: &Denial, publish: bool) -> Bytes {
    let parts = &meta.problems[den.policy];
    let open = &parts.open[usize::from(!publish)];
    let mut secs = itoa::Buffer::new();
    let secs = secs.format(den.retry_after_secs());
    let also = |(i, s): (usize, &PolicyStatus)| {
        let p = plan.policy(i);
        (i != den.policy && s.would_deny && !p.is_shadow()).then(|| p.name())
    };
    let extra: usize = d
        .statuses
        .iter()
        .enumerate()
        .filter_map(also)
        .map(|n| n.len() + 3)
        .sum();
    let len = open.len() + secs.len() + parts.violated.len() + extra + 2;
    let mut body = Vec::with_capacity(len);
    body.extend_from_slice(open.as_bytes());
    body.extend_from_slice(secs.as_bytes());
    body.extend_from_slice(parts.violated.as_bytes());
    for name in d.statuses.iter().enumerate().filter_map(also) {
        body.extend_from_slice(b",\"");
        body.extend_from_slice(name.as_bytes());
        body.push(b'"');
    }
    body.extend_from_slice(b"]}");
    // capacity equal to length: the bytes are handed over without a copy
    Bytes::from(body)
}

/// The last denial answered on this thread: its inputs and, once they
/// came twice in a row, the answer made from them. A client that keeps
/// sending inside its wait is refused with the same numbers again and again
/// (until the next second), so its finished head and body are copied
/// instead of written anew; traffic that never repeats only pays for the
/// comparison.
#[derive(Default)]
struct LastDenial {
    meta: u64,
    publish: bool,
    policy: usize,
    retry_after_s: u64,
    /// Per policy: remaining, seconds to reset, would deny.
    statuses: Vec<(u64, u64, bool)>,
    /// The policy the older dialects describe, when they are written (it
    /// can turn on a nanosecond the rounded numbers do not show).
    binding: Option<usize>,
    answer: Option<Answer>,
}

/// What a denial's answer is made from, besides the plan's prepared parts.
struct Inputs<'a> {
    d: &'a Decision,
    den: &'a Denial,
    secs: u64,
    publish: bool,
    /// The older dialects are written too.
    older: bool,
    binding: Option<usize>,
}

/// A denial's finished header fields and body.
type Answer = (HeaderMap, Bytes);

impl LastDenial {
    fn matches(&self, meta: &PlanMeta, i: &Inputs<'_>) -> bool {
        let (d, den) = (i.d, i.den);
        self.meta == meta.id
            && self.publish == i.publish
            && self.policy == den.policy
            && self.retry_after_s == i.secs
            && self.binding == i.binding
            && self.statuses.len() == d.statuses.len()
            && self
                .statuses
                .iter()
                .zip(&d.statuses)
                .all(|(&a, s)| a == (s.remaining, s.reset_secs(), s.would_deny))
    }

    fn remember(&mut self, meta: &PlanMeta, i: &Inputs<'_>) {
        let d = i.d;
        self.meta = meta.id;
        self.publish = i.publish;
        self.policy = i.den.policy;
        self.retry_after_s = i.secs;
        self.binding = i.binding;
        self.statuses.clear();
        let numbers = d.statuses.iter();
        let numbers = numbers.map(|s| (s.remaining, s.reset_secs(), s.would_deny));
        self.statuses.extend(numbers);
        self.answer = None;
    }
}

thread_local! {
    static LAST_DENIAL: RefCell<Option<LastDenial>> = const { RefCell::new(None) };
}

/// The 429 of a denial: the header fields and body of the last denial on
/// this thread when its inputs were the same, else made from the plan's
/// prepared head and body parts.
fn denial_response(
    plan: &Plan,
    meta: &PlanMeta,
    d: &Decision,
    den: &Denial,
    dialects: &Dialects,
    publish: bool,
) -> Response<Bytes> {
    let older = publish && (dialects.x_ratelimit || dialects.draft03);
    let inputs = Inputs {
        d,
        den,
        secs: den.retry_after_secs(),
        publish,
        older,
        binding: older.then(|| emit::binding_policy(plan, d)).flatten(),
    };
    // None: new inputs; Some(None): seen once; Some(Some(_)): kept
    // (a thread tearing down its locals just goes without the memo)
    let seen = LAST_DENIAL
        .try_with(|last| match &*last.borrow() {
            Some(l) if l.matches(meta, &inputs) => Some(l.answer.clone()),
            _ => None,
        })
        .ok()
        .flatten();
    let (fields, body) = match seen {
        Some(Some(answer)) => answer,
        _ => {
            let answer = denial_answer(plan, meta, &inputs, dialects);
            let _ = LAST_DENIAL.try_with(|last| match (seen, &mut *last.borrow_mut()) {
                // the second time in a row: keep it for the next ones
                (Some(None), Some(l)) => l.answer = Some(answer.clone()),
                (_, last) => last
                    .get_or_insert_with(LastDenial::default)
                    .remember(meta, &inputs),
            });
            answer
        }
    };
    let mut r = Response::new(body);
    *r.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    *r.headers_mut() = fields;
    r
}

/// A denial's header fields and body, from the plan's prepared parts.
fn denial_answer(plan: &Plan, meta: &PlanMeta, inputs: &Inputs<'_>, dialects: &Dialects) -> Answer {
    let (d, publish) = (inputs.d, inputs.publish);
    let head = &meta.heads[usize::from(!publish)];
    let mut fields = head.fields.clone();
    let mut ratelimit = head.ratelimit.and_then(|_| ratelimit_value(plan, meta, d));
    let missing = head.ratelimit.is_some() && ratelimit.is_none();
    for (i, v) in fields.values_mut().enumerate() {
        if i == head.retry_after {
            *v = seconds_value(inputs.secs);
        } else if Some(i) == head.ratelimit {
            if let Some(r) = ratelimit.take() {
                *v = r;
            }
        }
    }
    if missing {
        fields.remove(RATELIMIT);
    }
    if inputs.older {
        older_dialects(plan, d, dialects, &mut fields);
    }
    (fields, denial_body(plan, meta, d, inputs.den, publish))
}

/// The response for a rejected decision (429 or 400). A rejection never
/// reads the request body: the layer closes the connection when one was
/// sent.
pub(crate) fn rejection(
    plan: &Plan,
    meta: &PlanMeta,
    d: &Decision,
    dialects: &Dialects,
    publish: bool,
    base: &str,
) -> Response<Bytes> {
    if let Outcome::Denied(den) = &d.outcome {
        return denial_response(plan, meta, d, den, dialects, publish);
    }
    let mut p = Problem::from_decision(plan, d, base)
        .unwrap_or_else(|| Problem::new(ProblemKind::RateLimited, base, "Too many requests."));
    if !publish {
        p.detail = ANONYMOUS_DETAIL.to_string();
    }
    let mut r = problem_response(p.to_json(), p.status);
    write_fields(plan, meta, d, dialects, publish, r.headers_mut());
    r
}

/// 503 when the store is down and a policy fails closed.
pub(crate) fn unavailable(base: &str) -> Response<Bytes> {
    let mut p = Problem::new(
        ProblemKind::Overloaded,
        base,
        "The rate limiter cannot reach its store; retry shortly.",
    );
    p.retry_after_s = Some(1);
    let mut r = problem_response(p.to_json(), p.status);
    r.headers_mut().insert(RETRY_AFTER, HeaderValue::from(1u64));
    r
}

/// A problem that names no policy: `type`, `title`, `status`, `detail`.
fn plain_problem(
    base: &str,
    code: &str,
    title: &str,
    status: u16,
    detail: &str,
) -> Response<Bytes> {
    #[derive(Serialize)]
    struct Body<'a> {
        #[serde(rename = "type")]
        type_uri: String,
        title: &'a str,
        status: u16,
        detail: &'a str,
    }
    let body = Body {
        type_uri: format!("{base}{code}"),
        title,
        status,
        detail,
    };
    problem_response(serde_json::to_string(&body).unwrap_or_default(), status)
}

/// 401 from the usage endpoint for a request without a known key.
pub(crate) fn unauthorized(base: &str) -> Response<Bytes> {
    let mut r = plain_problem(
        base,
        "unauthorized",
        "API key required",
        401,
        "Send your API key as Authorization: Bearer <key> to read its usage.",
    );
    r.headers_mut()
        .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    r
}

/// 411: the plan counts content bytes, and this body's length is unknown
/// until it has been read (a chunked upload); decided from the head, so it
/// is refused rather than let through uncounted.
pub(crate) fn length_required(base: &str) -> Response<Bytes> {
    plain_problem(
        base,
        "length_required",
        "Content-Length required",
        411,
        "This plan counts request bytes: send the body with a Content-Length.",
    )
}

#[derive(Serialize)]
struct Usage<'a> {
    plan: &'a str,
    limits: Vec<UsageLimit<'a>>,
}

#[derive(Serialize)]
struct UsageLimit<'a> {
    name: &'a str,
    q: u64,
    w: u64,
    r: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    reset_at: Option<String>,
}

/// The usage document: plan, limits, what is left and, for quotas, when
/// they reset.
pub(crate) fn usage(
    plan: &Plan,
    meta: &PlanMeta,
    d: &Decision,
    now: Nanos,
    dialects: &Dialects,
) -> Response<Bytes> {
    let limits = plan
        .policies()
        .iter()
        .zip(&d.statuses)
        .map(|(p, s)| UsageLimit {
            name: p.name(),
            q: p.quota(),
            w: p.window_s(),
            r: s.remaining,
            reset_at: (p.kind() == PolicyKind::Quota)
                .then(|| rfc3339(now.saturating_add(s.reset_after))),
        })
        .collect();
    let doc = Usage {
        plan: plan.name(),
        limits,
    };
    let mut r = Response::new(Bytes::from(serde_json::to_vec(&doc).unwrap_or_default()));
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    h.insert(CACHE_CONTROL, NO_STORE);
    write_fields(plan, meta, d, dialects, true, h);
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use paceline_core::{MemoryStore, Policy};
    use proptest::prelude::*;

    fn statuses(plan_len: usize, items: &[(u64, u64)]) -> Decision {
        let mut d = Decision {
            outcome: Outcome::Allowed,
            statuses: Default::default(),
        };
        for &(r, t) in &items[..plan_len] {
            d.statuses.push(PolicyStatus {
                remaining: r,
                reset_after: Nanos::new(t),
                would_deny: false,
            });
        }
        d
    }

    proptest! {
        #[test]
        fn ratelimit_value_matches_the_wire_crate(
            items in prop::collection::vec((any::<u64>(), any::<u64>()), 1..5),
            long in any::<bool>(),
        ) {
            // long names overflow the stack buffer and take the slow path
            let stem = if long { "p".repeat(55) } else { "p".to_string() };
            let policies = (0..items.len())
                .map(|i| Policy::token_bucket(&format!("{stem}-{i}.x_y"), 10, 1).unwrap())
                .collect();
            let plan = Plan::new("p", policies).unwrap();
            let d = statuses(items.len(), &items);
            let meta = PlanMeta::new(&plan, "x:", &Dialects::default());
            let theirs = HeaderValue::try_from(emit::ratelimit_field(&plan, &d)).unwrap();
            prop_assert_eq!(ratelimit_value(&plan, &meta, &d), Some(theirs));
        }
    }

    #[test]
    fn seconds_values_are_the_numbers() {
        for n in (0..10_050).chain([99_999, u64::MAX]) {
            assert_eq!(seconds_value(n), HeaderValue::from(n), "{n}");
        }
    }

    fn free_plan() -> Plan {
        Plan::new(
            "free",
            vec![
                Policy::token_bucket("burst", 20, 2).unwrap(),
                Policy::daily("daily", 5).unwrap(),
            ],
        )
        .unwrap()
    }

    #[test]
    fn prepared_problem_matches_the_wire_problem() {
        let plan = free_plan();
        let meta = PlanMeta::new(&plan, "https://errors.invalid/", &Dialects::default());
        let store = MemoryStore::new();
        let now = Nanos::from_secs(1_790_793_600);
        for _ in 0..5 {
            store.check_sync(&plan, "k", 1, now).unwrap();
        }
        for _ in 0..20 {
            let d = store.check_sync(&plan, "k", 1, now).unwrap();
            let den = d.denial().unwrap();
            let ours = denial_body(&plan, &meta, &d, den, true);
            let theirs = Problem::from_decision(&plan, &d, "https://errors.invalid/")
                .unwrap()
                .to_json();
            let a: serde_json::Value = serde_json::from_slice(&ours).unwrap();
            let b: serde_json::Value = serde_json::from_str(&theirs).unwrap();
            assert_eq!(a, b);
            // a parser keeps the last of two equal members: count them
            let text = std::str::from_utf8(&ours).unwrap();
            for member in [
                "\"type\"",
                "\"limit\"",
                "\"violated-policies\"",
                "\"retry_after_s\"",
            ] {
                assert_eq!(text.matches(member).count(), 1, "{member} in {text}");
            }
            assert_eq!(a["retry_after_s"], 19_200);
        }
    }

    #[test]
    fn a_denial_names_every_policy_it_broke_deciding_one_first() {
        let plan = free_plan();
        let meta = PlanMeta::new(&plan, "https://errors.invalid/", &Dialects::default());
        let mut d = statuses(2, &[(0, 1), (0, 1)]);
        for s in &mut d.statuses {
            s.would_deny = true;
        }
        let den = Denial {
            policy: 1,
            kind: PolicyKind::Quota,
            retry_after: Nanos::from_secs(7),
        };
        d.outcome = Outcome::Denied(den);
        for publish in [true, false] {
            let body = denial_body(&plan, &meta, &d, &den, publish);
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(
                v["violated-policies"],
                serde_json::json!(["daily", "burst"])
            );
            assert_eq!(v["retry_after_s"], 7);
            assert_eq!(v["limit"], "daily");
            assert_eq!(v["status"], 429);
            assert_eq!(v["detail"] == ANONYMOUS_DETAIL, !publish);
        }
        let r = rejection(&plan, &meta, &d, &Dialects::default(), true, "x:");
        let h = r.headers();
        assert_eq!(r.status(), 429);
        assert_eq!(h["retry-after"], "7");
        assert_eq!(h["cache-control"], "no-store");
        assert_eq!(h["content-type"], PROBLEM_CONTENT_TYPE);
        assert_eq!(h["ratelimit"], r#""burst";r=0;t=1, "daily";r=0;t=1"#);
        assert_eq!(h["ratelimit-policy"], emit::policy_field(&plan).as_str());
        assert_eq!(h.len(), 5);
        let anon = rejection(&plan, &meta, &d, &Dialects::default(), false, "x:");
        let names: Vec<_> = anon.headers().keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["content-type", "cache-control", "retry-after"]);
    }

    #[test]
    fn the_last_denial_memo_never_mixes_plans_identities_or_numbers() {
        let plan = |name: &str| {
            Plan::new(name, vec![Policy::token_bucket("burst", 20, 2).unwrap()]).unwrap()
        };
        let (free, pro) = (plan("free"), plan("pro"));
        let meta_free = PlanMeta::new(&free, "x:", &Dialects::default());
        let meta_pro = PlanMeta::new(&pro, "x:", &Dialects::default());
        let denied = |secs: u64| {
            let mut d = statuses(1, &[(0, secs * 1_000_000_000)]);
            d.statuses[0].would_deny = true;
            d.outcome = Outcome::Denied(Denial {
                policy: 0,
                kind: PolicyKind::Burst,
                retry_after: Nanos::from_secs(secs),
            });
            d
        };
        let answer = |plan: &Plan, meta: &PlanMeta, d: &Decision, publish: bool| {
            let r = rejection(plan, meta, d, &Dialects::default(), publish, "x:");
            let v: serde_json::Value = serde_json::from_slice(r.body()).unwrap();
            let rl = r.headers().get("ratelimit").cloned();
            (
                v["detail"].as_str().unwrap().to_string(),
                rl,
                r.headers()["retry-after"].clone(),
            )
        };
        let (d1, d2) = (denied(1), denied(2));
        // three in a row: new inputs, seen once, kept; then the next case
        for round in 0..2 {
            for _ in 0..3 {
                let (detail, rl, ra) = answer(&free, &meta_free, &d1, true);
                assert!(detail.contains("free plan"), "{round}: {detail}");
                assert_eq!(rl.unwrap(), r#""burst";r=0;t=1"#);
                assert_eq!(ra, "1");
            }
            for _ in 0..3 {
                let (detail, _, _) = answer(&pro, &meta_pro, &d1, true);
                assert!(detail.contains("pro plan"), "{round}: {detail}");
            }
            for _ in 0..3 {
                let (detail, rl, _) = answer(&pro, &meta_pro, &d1, false);
                assert_eq!((detail.as_str(), rl), (ANONYMOUS_DETAIL, None));
            }
            for _ in 0..3 {
                let (_, rl, ra) = answer(&pro, &meta_pro, &d2, true);
                assert_eq!(rl.unwrap(), r#""burst";r=0;t=2"#);
                assert_eq!(ra, "2");
            }
        }
    }

    #[test]
    fn the_memo_tells_apart_denials_whose_older_dialects_differ() {
        use paceline_core::Unit;
        // denied by a byte policy: the older dialects describe the request
        // policy with the fewest left, the one resetting last on a tie
        let plan = Plan::new(
            "p",
            vec![
                Policy::token_bucket("a", 10, 60).unwrap(),
                Policy::token_bucket("b", 20, 60).unwrap(),
                Policy::token_bucket("upload", 1_000, 60)
                    .unwrap()
                    .with_unit(Unit::ContentBytes)
                    .unwrap(),
            ],
        )
        .unwrap();
        let denied = |ta: u64, tb: u64| {
            let mut d = statuses(3, &[(5, ta), (5, tb), (0, 30_000_000_000)]);
            d.statuses[2].would_deny = true;
            d.outcome = Outcome::Denied(Denial {
                policy: 2,
                kind: PolicyKind::Burst,
                retry_after: Nanos::from_secs(3),
            });
            d
        };
        // the same rounded numbers (t=2 for both), the order flipped
        let first = denied(1_200_000_000, 1_400_000_000);
        let second = denied(1_400_000_000, 1_200_000_000);
        let dialects = Dialects::all();
        let meta = PlanMeta::new(&plan, "x:", &dialects);
        for d in [&first, &first, &first, &second, &second] {
            let ours = rejection(&plan, &meta, d, &dialects, true, "x:");
            let mut theirs = HeaderMap::new();
            emit::write_headers(&plan, d, &dialects, &mut theirs);
            assert_eq!(
                ours.headers().get("x-ratelimit-limit"),
                theirs.get("x-ratelimit-limit")
            );
        }
    }

    #[test]
    fn a_denial_carries_every_chosen_dialect_as_the_wire_crate_writes_it() {
        let plan = free_plan();
        let store = MemoryStore::new();
        let now = Nanos::from_secs(1_790_793_600);
        let mut d = store.check_sync(&plan, "k", 1, now).unwrap();
        while d.is_allowed() {
            d = store.check_sync(&plan, "k", 1, now).unwrap();
        }
        for dialects in [Dialects::all(), Dialects::default()] {
            let meta = PlanMeta::new(&plan, "x:", &dialects);
            // three times: the memo must give the same answer as a fresh one
            for _ in 0..3 {
                let ours = rejection(&plan, &meta, &d, &dialects, true, "x:");
                let mut theirs = HeaderMap::new();
                theirs.insert(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_CONTENT_TYPE));
                emit::write_headers(&plan, &d, &dialects, &mut theirs);
                assert_eq!(ours.headers().len(), theirs.len());
                for (name, value) in &theirs {
                    assert_eq!(ours.headers().get(name), Some(value), "{name}");
                }
            }
        }
    }
}
