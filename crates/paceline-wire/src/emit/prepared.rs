//! The prepared emitter: a plan's fields and its `429` made ready once, so
//! that answering a request only splices in its numbers.
//!
//! Why: a server publishes the rate-limit fields on every response and
//! refuses floods of requests with a `429`. What never changes for a plan
//! (the `RateLimit-Policy` value, each policy's `RateLimit` item up to its
//! numbers, the head of a `429`, the problem body around its numbers) is
//! written once in a [`PreparedPlan`]; a request then costs a copy of the
//! head, a stack buffer for `RateLimit` and one exact allocation for the
//! body. The `RateLimit` writer here is the crate's only one: the plain
//! [`ratelimit_field`](super::ratelimit_field) uses it too.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use http::{Response, StatusCode};
use paceline_core::{Decision, Denial, Nanos, Outcome, Plan, PolicyStatus};

use super::{dialects, policy_field, sf_clamp, write_denial_fields, Dialects};
use crate::problem::{self, Problem, ProblemKind, ANONYMOUS_DETAIL};

const RATELIMIT_POLICY: HeaderName = HeaderName::from_static(super::RATELIMIT_POLICY);
const RATELIMIT: HeaderName = HeaderName::from_static(super::RATELIMIT);

/// An escalation hold on a denial: the key kept sending inside its own
/// `Retry-After` window, so its wait is longer than its policies alone
/// would give. The answer's `detail` names the hold and when it ends (in
/// the seconds `Retry-After` gives).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Hold {
    /// The wait is extended beyond the policy's own.
    Extended,
    /// The key is blocked until the hold ends.
    Blocked,
}

impl Hold {
    fn index(self) -> usize {
        match self {
            Hold::Extended => 0,
            Hold::Blocked => 1,
        }
    }
}

/// What never changes for a plan, prepared once so that a response only
/// splices its numbers into ready parts: the `RateLimit-Policy` value, the
/// head of a 429 and, per policy, the problem body around its numbers.
///
/// Made with the plan, the problem base and the dialects the responses
/// use; every method takes that same plan (and dialects) again.
///
/// ```
/// use paceline_core::{ManualClock, Limiter, MemoryStore, Plan, Policy};
/// use paceline_wire::emit::{self, Dialects, PreparedPlan};
///
/// let plan = Plan::new("free", vec![Policy::token_bucket("burst", 1, 2).unwrap()]).unwrap();
/// let prepared = PreparedPlan::new(&plan, "https://e.x/errors/", &Dialects::default());
/// let limiter = Limiter::new(MemoryStore::new(), ManualClock::at_unix_secs(1_790_000_000));
/// let _ = limiter.check_sync(&plan, "key", 1).unwrap();
/// let d = limiter.check_sync(&plan, "key", 1).unwrap();
/// let r = prepared.rejection(&plan, &d, &Dialects::default(), true, "https://e.x/errors/");
/// assert_eq!(r.status(), 429);
/// assert_eq!(r.headers()["ratelimit"], emit::ratelimit_field(&plan, &d).as_str());
/// assert_eq!(r.headers()["retry-after"], "2");
/// ```
#[derive(Debug)]
pub struct PreparedPlan {
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
    /// Per [`Hold`], [published, anonymous]: the JSON up to the number of
    /// seconds in the hold's `detail`, and from after it up to the value
    /// of `retry_after_s`.
    held: [[(String, String); 2]; 2],
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
        problem::put_problem_fields(&mut fields);
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

impl PreparedPlan {
    /// Prepares `plan`'s parts: problem types under `problem_base`, the
    /// IETF fields in the head of a 429 when `dialects` has them.
    pub fn new(plan: &Plan, problem_base: &str, dialects: &Dialects) -> PreparedPlan {
        let policy_field = HeaderValue::try_from(policy_field(plan)).ok();
        let problems = (0..plan.policies().len())
            .map(|i| ProblemParts::new(plan, i, problem_base))
            .collect();
        let heads = [
            Head::new(policy_field.as_ref(), dialects.ietf),
            Head::new(None, false),
        ];
        let items = plan
            .policies()
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let mut item = Vec::new();
                item_head(&mut item, i, p.name());
                item.into()
            })
            .collect();
        static IDS: AtomicU64 = AtomicU64::new(0);
        PreparedPlan {
            id: IDS.fetch_add(1, Ordering::Relaxed),
            policy_field,
            items,
            problems,
            heads,
        }
    }

    /// Writes the rate-limit fields of `d` into `h`: every chosen dialect
    /// when the identity publishes counters (and on a denial `Retry-After`
    /// with `Cache-Control: no-store`), else only `Retry-After` on a
    /// denial.
    #[inline]
    pub fn write_fields(
        &self,
        plan: &Plan,
        d: &Decision,
        dialects: &Dialects,
        publish: bool,
        h: &mut HeaderMap,
    ) {
        if !publish {
            if let Some(s) = super::retry_after_secs(d) {
                h.insert(RETRY_AFTER, seconds_value(s));
            }
            return;
        }
        if dialects.ietf {
            if let Some(v) = &self.policy_field {
                h.insert(RATELIMIT_POLICY, v.clone());
            }
            if let Some(v) = self.ratelimit_value(plan, d) {
                h.insert(RATELIMIT, v);
            }
        }
        dialects::write_older(plan, d, dialects, h);
        write_denial_fields(d, h);
    }

    /// The response for a rejected decision (429 or 400): the prepared
    /// answer of a denial, else the problem of the decision with the
    /// rate-limit fields. An identity that does not publish its counters
    /// gets neither the IETF fields nor the numbers in the `detail`.
    #[inline]
    pub fn rejection(
        &self,
        plan: &Plan,
        d: &Decision,
        dialects: &Dialects,
        publish: bool,
        problem_base: &str,
    ) -> Response<Bytes> {
        self.held_rejection(plan, d, dialects, publish, problem_base, None)
    }

    /// The response for a rejected decision whose wait an escalation
    /// `hold` may have lengthened: with a hold, as
    /// [`rejection`](Self::rejection) but with a `detail` naming the hold
    /// and the seconds until it ends (the `Retry-After` of the answer,
    /// which is `d`'s wait); without one, exactly
    /// [`rejection`](Self::rejection). A decision that is not a denial is
    /// answered as its problem, hold or not.
    #[inline]
    pub fn held_rejection(
        &self,
        plan: &Plan,
        d: &Decision,
        dialects: &Dialects,
        publish: bool,
        problem_base: &str,
        hold: Option<Hold>,
    ) -> Response<Bytes> {
        if let Outcome::Denied(den) = &d.outcome {
            return self.denial_response(plan, d, den, dialects, publish, hold);
        }
        let mut p = Problem::from_decision(plan, d, problem_base).unwrap_or_else(|| {
            Problem::new(ProblemKind::RateLimited, problem_base, "Too many requests.")
        });
        if !publish {
            p.detail = ANONYMOUS_DETAIL.to_string();
        }
        let mut r = problem::answer(&p);
        self.write_fields(plan, d, dialects, publish, r.headers_mut());
        r
    }

    /// The IETF `RateLimit` field of `d`, from the prepared items and
    /// without a heap buffer (unless it is too long for the stack).
    #[inline]
    fn ratelimit_value(&self, plan: &Plan, d: &Decision) -> Option<HeaderValue> {
        let mut out = FieldBuf::new();
        let items = self.items.iter().zip(&d.statuses);
        match write_ratelimit(&mut out, items, |out, item| out.put(item)) {
            true => HeaderValue::from_bytes(out.as_bytes()).ok(),
            false => HeaderValue::try_from(ratelimit_string(plan, d)).ok(),
        }
    }

    /// The 429 of a denial: the header fields and body of the last denial
    /// on this thread when its inputs were the same, else made from the
    /// prepared head and body parts.
    fn denial_response(
        &self,
        plan: &Plan,
        d: &Decision,
        den: &Denial,
        dialects: &Dialects,
        publish: bool,
        hold: Option<Hold>,
    ) -> Response<Bytes> {
        let older = publish && (dialects.x_ratelimit || dialects.draft03);
        let inputs = Inputs {
            d,
            den,
            secs: den.retry_after_secs(),
            publish,
            hold,
            older,
            binding: older.then(|| super::binding_policy(plan, d)).flatten(),
        };
        // None: new inputs; Some(None): seen once; Some(Some(_)): kept
        // (a thread tearing down its locals just goes without the memo)
        let seen = LAST_DENIAL
            .try_with(|last| match &*last.borrow() {
                Some(l) if l.matches(self, &inputs) => Some(l.answer.clone()),
                _ => None,
            })
            .ok()
            .flatten();
        let (fields, body) = match seen {
            Some(Some(answer)) => answer,
            _ => {
                let answer = self.denial_answer(plan, &inputs, dialects);
                let _ = LAST_DENIAL.try_with(|last| match (seen, &mut *last.borrow_mut()) {
                    // the second time in a row: keep it for the next ones
                    (Some(None), Some(l)) => l.answer = Some(answer.clone()),
                    (_, last) => last
                        .get_or_insert_with(LastDenial::default)
                        .remember(self, &inputs),
                });
                answer
            }
        };
        let mut r = Response::new(body);
        *r.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        *r.headers_mut() = fields;
        r
    }

    /// A denial's header fields and body, from the prepared parts.
    fn denial_answer(&self, plan: &Plan, inputs: &Inputs<'_>, dialects: &Dialects) -> Answer {
        let (d, publish) = (inputs.d, inputs.publish);
        let head = &self.heads[usize::from(!publish)];
        let mut fields = head.fields.clone();
        let mut ratelimit = head.ratelimit.and_then(|_| self.ratelimit_value(plan, d));
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
            // the head has `Retry-After` and `Cache-Control` already
            dialects::write_older(plan, d, dialects, &mut fields);
        }
        (
            fields,
            self.denial_body(plan, d, inputs.den, publish, inputs.hold),
        )
    }

    /// The problem body of a denial: the prepared parts with the numbers
    /// and any further violated policies spliced in, in one exact
    /// allocation.
    fn denial_body(
        &self,
        plan: &Plan,
        d: &Decision,
        den: &Denial,
        publish: bool,
        hold: Option<Hold>,
    ) -> Bytes {
        let parts = &self.problems[den.policy];
        let mut secs = itoa::Buffer::new();
        let secs = secs.format(den.retry_after_secs());
        // a hold's detail carries the seconds too: its text before them
        let (head, open) = match hold {
            Some(h) => {
                let (pre, post) = &parts.held[h.index()][usize::from(!publish)];
                (Some(pre.as_str()), post.as_str())
            }
            None => (None, parts.open[usize::from(!publish)].as_str()),
        };
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
        let held = head.map_or(0, |h| h.len() + secs.len());
        let len = held + open.len() + secs.len() + parts.violated.len() + extra + 2;
        let mut body = Vec::with_capacity(len);
        if let Some(h) = head {
            body.extend_from_slice(h.as_bytes());
            body.extend_from_slice(secs.as_bytes());
        }
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
        let (policy, plan_name) = (plan.policy(i).name(), plan.name());
        let held = [Hold::Extended, Hold::Blocked].map(|h| {
            let ends = match h {
                Hold::Extended => "its wait is extended to",
                Hold::Blocked => "it is blocked for",
            };
            let published = format!(
                "This key kept sending inside its Retry-After window, so {ends} {HOLD_MARK} seconds: no request is served before then (policy \"{policy}\", {plan_name} plan)."
            );
            let anonymous = format!(
                "This client kept sending inside its Retry-After window, so {ends} {HOLD_MARK} seconds; retry later."
            );
            [published, anonymous].map(|detail| {
                let mut q = p.clone();
                q.detail = detail;
                let json = open_json(&q);
                match json.split_once(HOLD_MARK) {
                    Some((pre, post)) => (pre.to_string(), post.to_string()),
                    None => (String::new(), json),
                }
            })
        });
        p.detail = ANONYMOUS_DETAIL.to_string();
        // policy names are token-safe (core validates them): no escaping
        ProblemParts {
            open: [published, open_json(&p)],
            held,
            violated: format!(",\"violated-policies\":[\"{}\"", plan.policy(i).name()),
        }
    }
}

/// Where the seconds go in a hold's `detail`: text JSON writes as it is.
const HOLD_MARK: &str = "{seconds}";

/// The problem's JSON object without the members a denial splices in
/// (`violated-policies`, written after the number) and without its closing
/// brace, ready for `retry_after_s`.
fn open_json(p: &Problem) -> String {
    // the problem writes every member, the empty list too (compact, in
    // declaration order), and `retry_after_s` is `None` here
    let mut s = p.to_json().replace(",\"violated-policies\":[]", "");
    if s.ends_with('}') {
        s.pop();
    }
    s.push_str(",\"retry_after_s\":");
    s
}

/// Where the `RateLimit` writer puts its bytes.
trait Sink {
    /// Appends `s`; false when it does not fit.
    fn put(&mut self, s: &[u8]) -> bool;

    /// Appends `n` as a structured-field integer (clamped to 15 digits).
    #[inline]
    fn put_int(&mut self, n: u64) -> bool {
        self.put(itoa::Buffer::new().format(sf_clamp(n)).as_bytes())
    }
}

/// A short buffer on the stack for a header value.
struct FieldBuf {
    buf: [u8; 192],
    len: usize,
}

impl FieldBuf {
    #[inline]
    fn new() -> Self {
        FieldBuf {
            buf: [0; 192],
            len: 0,
        }
    }

    #[inline]
    fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl Sink for FieldBuf {
    #[inline]
    fn put(&mut self, s: &[u8]) -> bool {
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
}

impl Sink for Vec<u8> {
    #[inline]
    fn put(&mut self, s: &[u8]) -> bool {
        self.extend_from_slice(s);
        true
    }
}

/// A policy's `RateLimit` item up to the value of `r`: `"name";r=`, after
/// `, ` unless it is the first. Policy names are token-safe (core validates
/// them), so they need no escaping.
#[inline]
fn item_head<S: Sink>(out: &mut S, i: usize, name: &str) -> bool {
    (i == 0 || out.put(b", ")) && out.put(b"\"") && out.put(name.as_bytes()) && out.put(b"\";r=")
}

/// The `RateLimit` writer: per policy, its item's head (written by `head`)
/// then `r` and `t`. False when `out` ran out of room.
#[inline]
fn write_ratelimit<'a, S: Sink, I>(
    out: &mut S,
    items: impl Iterator<Item = (I, &'a PolicyStatus)>,
    mut head: impl FnMut(&mut S, I) -> bool,
) -> bool {
    let mut fits = true;
    for (item, s) in items {
        fits &= head(out, item) && out.put_int(s.remaining);
        fits &= out.put(b";t=") && out.put_int(s.reset_secs());
    }
    fits
}

/// The `RateLimit` field of `d` in a heap buffer.
pub(crate) fn ratelimit_string(plan: &Plan, d: &Decision) -> String {
    let mut out = Vec::with_capacity(24 * plan.policies().len());
    let items = plan.policies().iter().enumerate().zip(&d.statuses);
    write_ratelimit(&mut out, items, |out, (i, p)| item_head(out, i, p.name()));
    // every byte written is ASCII
    String::from_utf8(out).unwrap_or_default()
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

#[inline]
const fn digits(n: usize) -> usize {
    match n {
        0..=9 => 1,
        10..=99 => 2,
        100..=999 => 3,
        _ => 4,
    }
}

/// `n` as a header value (a `Retry-After` in seconds, say); without
/// allocating below 10,000.
#[inline]
pub fn seconds_value(n: u64) -> HeaderValue {
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

/// The last denial answered on this thread: its inputs and, once they
/// came twice in a row, the answer made from them. A client that keeps
/// sending inside its wait is refused with the same numbers again and again
/// (until the next second), so its finished head and body are copied
/// instead of written anew; traffic that never repeats only pays for the
/// comparison.
#[derive(Default)]
struct LastDenial {
    prepared: u64,
    publish: bool,
    hold: Option<Hold>,
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
    hold: Option<Hold>,
    /// The older dialects are written too.
    older: bool,
    binding: Option<usize>,
}

/// A denial's finished header fields and body.
type Answer = (HeaderMap, Bytes);

impl LastDenial {
    fn matches(&self, prepared: &PreparedPlan, i: &Inputs<'_>) -> bool {
        let (d, den) = (i.d, i.den);
        self.prepared == prepared.id
            && self.publish == i.publish
            && self.hold == i.hold
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

    fn remember(&mut self, prepared: &PreparedPlan, i: &Inputs<'_>) {
        let d = i.d;
        self.prepared = prepared.id;
        self.publish = i.publish;
        self.hold = i.hold;
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

#[cfg(test)]
mod tests;
