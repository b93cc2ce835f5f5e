//! The SDK in the loop: the gateway's answer goes through the real header
//! emitter and the real parser, and the real client decides.
//!
//! Nothing here decides anything itself. [`response`] asks
//! `paceline-wire` to write the response head and problem body a real
//! gateway sends, [`observe`] has the client parse it
//! ([`Observation::parse`]), and [`Cooperative`] hands every worker's
//! request to a shared [`Client`].

use http::header::HeaderMap;
use paceline_client::{
    After as SdkAfter, Before as SdkBefore, Call, Client, ClientError, Observation, RequestInfo,
};
use paceline_core::{ManualClock, Nanos};
use paceline_wire::problem::{self, Problem, ProblemKind};

use crate::fleet::{After, Before, FleetClient};
use crate::gateway::{Answer, Gateway, Verdict};

/// Where the simulated API's problem types live.
pub(crate) const PROBLEM_BASE: &str = "https://api.sim.example/errors/";
/// The scope (authority) every simulated client talks to.
pub(crate) const URL: &str = "http://api.sim.example/v1/jobs";

/// The status, headers and body a real gateway sends for `answer`
/// (`None` when the edge dropped it: there is no response).
pub fn response(gateway: &Gateway, answer: &Answer) -> Option<(u16, HeaderMap, Option<String>)> {
    let mut headers = HeaderMap::new();
    let (status, body) = response_into(gateway, answer, &mut headers)?;
    Some((status, headers, body))
}

/// Like [`response`], writing the headers into `headers`.
pub fn response_into(
    gateway: &Gateway,
    answer: &Answer,
    headers: &mut HeaderMap,
) -> Option<(u16, Option<String>)> {
    let status = gateway.write_head(answer, headers)?;
    let found = match (&answer.verdict, &answer.decision) {
        (Verdict::Served, _) => None,
        (_, Some(d)) => Problem::from_decision(gateway.plan(), d, PROBLEM_BASE),
        (Verdict::Fault { status: 503, .. }, None) => Some(Problem::new(
            ProblemKind::Overloaded,
            PROBLEM_BASE,
            "the service is shedding load",
        )),
        (Verdict::Fault { .. }, None) => Some(Problem::new(
            ProblemKind::RateLimited,
            PROBLEM_BASE,
            "too many requests",
        )),
        _ => None,
    };
    let body = found.map(|p| {
        problem::write_fields(&p, headers);
        p.to_json()
    });
    Some((status.as_u16(), body))
}

/// The gateway's answer as the client sees it, parsed by the client's own
/// reader (`paceline-wire` underneath); `None`: dropped at the edge.
pub fn observe(gateway: &Gateway, answer: &Answer, now: Nanos) -> Option<Observation> {
    SCRATCH.with(|cell| {
        let mut headers = cell.borrow_mut();
        let (status, body) = response_into(gateway, answer, &mut headers)?;
        Some(Observation::parse(
            status,
            &headers,
            body.as_deref().map(str::as_bytes),
            now,
        ))
    })
}

thread_local! {
    // one header map reused for every simulated response
    static SCRATCH: std::cell::RefCell<HeaderMap> = std::cell::RefCell::new(HeaderMap::new());
}

/// A new SDK client on the simulation's clock.
pub fn client(clock: &ManualClock, seed: u64) -> Client {
    Client::builder().clock(clock.clone()).seed(seed).build()
}

/// Seeds `client`'s pacing the way the SDK does at start-up: from the
/// key's `GET /v1/usage` (which charges nothing).
pub fn seed_from_usage(client: &Client, gateway: &Gateway, key: usize, now: Nanos) {
    let usage = Answer {
        verdict: Verdict::Served,
        decision: Some(gateway.usage(key, now)),
    };
    if let Some(obs) = observe(gateway, &usage, now) {
        let scope = RequestInfo::get(URL).scope;
        client.seed_policies(&scope, &obs.policies);
    }
}

/// A fleet's shared SDK client: one [`Call`] per worker's job.
pub struct Cooperative {
    client: Client,
    calls: Vec<Option<Call>>,
    request: RequestInfo,
}

impl Cooperative {
    /// A client for `key` on `clock`, seeded from the key's usage at `now`.
    pub fn new(clock: ManualClock, seed: u64, gateway: &Gateway, key: usize, now: Nanos) -> Self {
        let client = client(&clock, seed);
        seed_from_usage(&client, gateway, key, now);
        Cooperative {
            client,
            calls: Vec::new(),
            request: RequestInfo::get(URL),
        }
    }

    /// The SDK client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    fn call(&mut self, worker: usize) -> &mut Call {
        if self.calls.len() <= worker {
            self.calls.resize_with(worker + 1, || None);
        }
        let (client, request) = (&self.client, &self.request);
        self.calls[worker].get_or_insert_with(|| client.call(request.clone()))
    }
}

fn after_error(e: &ClientError, now: Nanos) -> After {
    if e.is_quota_exceeded() {
        return After::Abandon;
    }
    let wait = e
        .retry_at()
        .map(|t| Nanos::from_system_time(t).saturating_sub(now))
        .unwrap_or(Nanos::SECOND);
    After::Requeue(wait.max(Nanos::from_millis(1)))
}

impl FleetClient for Cooperative {
    type Ticket = ();

    fn before(&mut self, worker: usize, _attempt: u32, _now: Nanos) -> Before<()> {
        let client = self.client.clone();
        let call = self.call(worker);
        match client.before(call) {
            SdkBefore::Go => Before::Send(()),
            SdkBefore::Wait(d) => Before::Wait(d),
            SdkBefore::Drop(_) => {
                self.calls[worker] = None;
                Before::Drop
            }
        }
    }

    fn after(
        &mut self,
        worker: usize,
        _: (),
        answer: &Answer,
        gateway: &Gateway,
        now: Nanos,
    ) -> After {
        let client = self.client.clone();
        let obs = observe(gateway, answer, now);
        let call = self.call(worker);
        let next = match &obs {
            Some(o) => client.after(call, o),
            None => client.after_error(call, true, "connection reset at the edge"),
        };
        let served = matches!(answer.verdict, Verdict::Served);
        let out = match next {
            SdkAfter::Done if served => After::Done,
            SdkAfter::Done => After::Requeue(Nanos::SECOND),
            SdkAfter::RetryAfter(d) => return After::Retry(d),
            SdkAfter::Error(e) => after_error(&e, now),
        };
        self.calls[worker] = None;
        out
    }
}
