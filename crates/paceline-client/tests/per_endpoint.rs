//! Which published limits the SDK keeps per endpoint, and how many
//! endpoints it remembers: GitHub's resources are account-wide, Discord's
//! buckets are per route, and per-route state stays bounded.

use std::collections::BTreeMap;

use http::HeaderMap;
use paceline_client::{After, Before, Client, Observation, RequestInfo};
use paceline_core::{Clock, ManualClock, Nanos};

const T0: Nanos = Nanos::from_secs(1_790_000_000);
const LATENCY: Nanos = Nanos::from_millis(40);

fn headers(pairs: &[(&str, String)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.insert(
            http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
    }
    h
}

/// A GitHub-style server: the `core` resource, one counter for the whole
/// account whatever the path, `limit` per window, reset at an epoch second.
struct GitHub {
    limit: u64,
    remaining: u64,
    reset_at: Nanos,
    window: Nanos,
}

impl GitHub {
    fn respond(&mut self, now: Nanos) -> (u16, HeaderMap) {
        if now >= self.reset_at {
            self.remaining = self.limit;
            self.reset_at = self.reset_at.saturating_add(self.window);
        }
        let status = if self.remaining == 0 {
            403
        } else {
            self.remaining -= 1;
            200
        };
        let h = headers(&[
            ("x-ratelimit-limit", self.limit.to_string()),
            ("x-ratelimit-remaining", self.remaining.to_string()),
            (
                "x-ratelimit-used",
                (self.limit - self.remaining).to_string(),
            ),
            (
                "x-ratelimit-reset",
                self.reset_at.as_secs_floor().to_string(),
            ),
            ("x-ratelimit-resource", "core".to_string()),
        ]);
        (status, h)
    }
}

struct Sent {
    /// (virtual seconds since T0, status) of every attempt.
    at: Vec<(f64, u16)>,
}

impl Sent {
    fn before(&self, secs: f64) -> usize {
        self.at.iter().filter(|(t, _)| *t < secs).count()
    }
    fn statuses(&self) -> BTreeMap<u16, usize> {
        let mut m = BTreeMap::new();
        for (_, s) in &self.at {
            *m.entry(*s).or_insert(0) += 1;
        }
        m
    }
}

/// One worker sends a request to each URL in turn, waiting as the SDK says.
fn one_worker(c: &Client, clock: &ManualClock, server: &mut GitHub, urls: &[String]) -> Sent {
    let mut sent = Sent { at: Vec::new() };
    for url in urls {
        let mut call = c.call(RequestInfo::get(url));
        loop {
            match c.before(&mut call) {
                Before::Go => {}
                Before::Wait(d) => {
                    clock.advance(d);
                    continue;
                }
                Before::Drop(e) => panic!("dropped {url}: {e:?}"),
            }
            let (status, h) = server.respond(clock.now());
            sent.at
                .push((clock.now().saturating_sub(T0).as_secs_f64(), status));
            clock.advance(LATENCY);
            match c.after_response(&mut call, status, &h, None) {
                After::Done | After::Error(_) => break,
                After::RetryAfter(d) => clock.advance(d),
            }
        }
    }
    sent
}

fn github_run(urls: &[String]) -> Sent {
    let clock = ManualClock::new(T0);
    let c = Client::builder().clock(clock.clone()).seed(7).build();
    let mut server = GitHub {
        limit: 100,
        remaining: 9,
        reset_at: T0.saturating_add(Nanos::from_secs(60)),
        window: Nanos::from_secs(3_600),
    };
    one_worker(&c, &clock, &mut server, urls)
}

fn check_spread(name: &str, sent: &Sent) {
    println!(
        "{name}: {} in the first 5 s, {} before the reset, statuses {:?}",
        sent.before(5.0),
        sent.before(60.0),
        sent.statuses()
    );
    assert_eq!(sent.statuses().get(&403), None, "{name}: {:?}", sent.at);
    assert_eq!(sent.at.len(), 20, "{name}: every request sent once");
    // 9 left for 60 s: spread, never more than what is left
    assert!(sent.before(60.0) <= 9, "{name}: {:?}", sent.at);
    assert!(sent.before(5.0) <= 2, "{name}: {:?}", sent.at);
    assert!(sent.before(60.0) >= 5, "{name}: {:?}", sent.at);
}

#[test]
fn github_core_is_paced_for_the_account_on_one_path() {
    let urls: Vec<String> = (0..20)
        .map(|_| "http://api.github.test/repos/o/r/issues/1".to_string())
        .collect();
    check_spread("one path", &github_run(&urls));
}

#[test]
fn github_core_is_paced_for_the_account_across_distinct_paths() {
    let urls: Vec<String> = (1..=20)
        .map(|i| format!("http://api.github.test/repos/o/r/issues/{i}"))
        .collect();
    check_spread("distinct paths", &github_run(&urls));
}

#[test]
fn github_search_and_azure_resources_are_account_wide() {
    let now = T0;
    let gh = headers(&[
        ("x-ratelimit-limit", "30".into()),
        ("x-ratelimit-remaining", "29".into()),
        ("x-ratelimit-reset", (T0.as_secs_floor() + 60).to_string()),
        ("x-ratelimit-resource", "search".into()),
    ]);
    let o = Observation::parse(200, &gh, None, now);
    assert!(!o.policies.is_empty());
    assert!(o.policies.iter().all(|p| !p.per_endpoint), "{o:?}");
    let az = headers(&[(
        "x-ms-ratelimit-remaining-resource",
        "Microsoft.Compute/HighCostGet3Min;107,Microsoft.Compute/HighCostGet30Min;587".into(),
    )]);
    let o = Observation::parse(200, &az, None, now);
    assert_eq!(o.policies.len(), 2, "{o:?}");
    assert!(o.policies.iter().all(|p| !p.per_endpoint), "{o:?}");
}

#[test]
fn discord_buckets_and_zendesk_endpoint_limits_are_per_endpoint() {
    let discord = headers(&[
        ("x-ratelimit-limit", "5".into()),
        ("x-ratelimit-remaining", "4".into()),
        ("x-ratelimit-reset-after", "1.5".into()),
        ("x-ratelimit-bucket", "abcd1234".into()),
    ]);
    let o = Observation::parse(200, &discord, None, T0);
    assert_eq!(o.policies.len(), 1, "{o:?}");
    assert!(o.policies[0].per_endpoint, "{o:?}");
    let zendesk = headers(&[
        ("x-rate-limit", "700".into()),
        ("x-rate-limit-remaining", "699".into()),
        (
            "zendesk-ratelimit-tickets-index",
            "total=100; remaining=99; resets=41".into(),
        ),
    ]);
    let o = Observation::parse(200, &zendesk, None, T0);
    let by_name: BTreeMap<_, _> = o
        .policies
        .iter()
        .map(|p| (p.name.as_str(), p.per_endpoint))
        .collect();
    assert_eq!(by_name.get("tickets-index"), Some(&true), "{o:?}");
    assert!(
        o.policies
            .iter()
            .any(|p| p.quota == Some(700) && !p.per_endpoint),
        "{o:?}"
    );
}

/// A Discord-style answer for one route: its own bucket.
fn discord(remaining: u64, reset_after_s: u64) -> HeaderMap {
    headers(&[
        ("x-ratelimit-limit", "5".into()),
        ("x-ratelimit-remaining", remaining.to_string()),
        ("x-ratelimit-reset-after", reset_after_s.to_string()),
        ("x-ratelimit-bucket", "b0".into()),
    ])
}

fn endpoints(c: &Client) -> usize {
    c.diagnostics()
        .scopes
        .iter()
        .flat_map(|s| s.policies.iter())
        .filter(|p| p.endpoint.is_some())
        .count()
}

fn answer(c: &Client, clock: &ManualClock, url: &str, h: &HeaderMap) {
    let mut call = c.call(RequestInfo::get(url));
    assert_eq!(c.before(&mut call), Before::Go, "{url}");
    clock.advance(Nanos::from_millis(1));
    assert_eq!(c.after_response(&mut call, 200, h, None), After::Done);
}

fn held(c: &Client, url: &str) -> bool {
    let mut call = c.call(RequestInfo::get(url));
    matches!(c.before(&mut call), Before::Wait(_))
}

#[test]
fn endpoints_whose_windows_reset_are_forgotten_first() {
    let clock = ManualClock::new(T0);
    let c = Client::builder().clock(clock.clone()).seed(3).build();
    let hot = "http://discord.test/api/channels/hot/messages";
    answer(&c, &clock, hot, &discord(0, 200));
    assert!(held(&c, hot));
    for i in 0..3_000 {
        let url = format!("http://discord.test/api/channels/{i}/messages");
        answer(&c, &clock, &url, &discord(4, 1));
        assert!(endpoints(&c) <= 1_024, "after {i}: {}", endpoints(&c));
    }
    println!("{} endpoints kept", endpoints(&c));
    // the exhausted route outlived thousands of routes whose windows reset
    assert!(held(&c, hot));
}

#[test]
fn past_the_cap_the_least_recently_used_endpoint_goes() {
    let clock = ManualClock::new(T0);
    let c = Client::builder().clock(clock.clone()).seed(3).build();
    let url = |i: usize| format!("http://discord.test/api/channels/{i}/messages");
    for i in 0..1_100 {
        answer(&c, &clock, &url(i), &discord(0, 200));
    }
    assert_eq!(endpoints(&c), 1_024);
    // the first routes were evicted (nothing holds them now), the latest kept
    assert!(!held(&c, &url(0)));
    assert!(held(&c, &url(1_099)));
    assert!(held(&c, &url(500)));
}
