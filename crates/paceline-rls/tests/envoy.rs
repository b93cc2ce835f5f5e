//! envoyproxy/ratelimit's documented configurations, driven through
//! Envoy's own generated gRPC client against the served service: each
//! answers what envoyproxy/ratelimit documents for it, plus the IETF
//! fields, `Retry-After` and the problem body; and the one deliberate
//! difference, a refused request charging nothing.

mod common;

use common::*;
use envoy_types::pb::google::protobuf::UInt64Value;
use paceline_core::Nanos;

const PER_IP: &str = "
domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 0
";

#[tokio::test]
async fn per_remote_address_counts_each_address_and_blocks_the_listed_one() {
    let (s, clock) = memory(PER_IP).await;
    let mut c = client(s.addr).await;
    let one = request("edge_proxy_per_ip", &[&[("remote_address", "50.0.0.1")]]);
    for i in 0..10u32 {
        let r = ask(&mut c, &one).await;
        assert_eq!(code(&r), Code::Ok, "request {i}");
        let st = &r.statuses[0];
        assert_eq!(st.limit_remaining, 9 - i);
        let lim = st.current_limit.as_ref().unwrap();
        assert_eq!((lim.requests_per_unit, lim.unit), (10, 1));
        assert_eq!(st.duration_until_reset.as_ref().unwrap().seconds, 1);
        assert_eq!(
            header(&r, "ratelimit-policy"),
            Some("\"remote_address\";q=10;w=1")
        );
        let rl = format!("\"remote_address\";r={};t=1", 9 - i);
        assert_eq!(header(&r, "ratelimit"), Some(rl.as_str()));
        assert_eq!(header(&r, "retry-after"), None);
        assert!(r.raw_body.is_empty());
    }
    let no = ask(&mut c, &one).await;
    assert_eq!(code(&no), Code::OverLimit);
    assert_eq!(status_code(&no, 0), Code::OverLimit);
    assert_eq!(no.statuses[0].limit_remaining, 0);
    assert_eq!(header(&no, "retry-after"), Some("1"));
    assert_eq!(header(&no, "ratelimit"), Some("\"remote_address\";r=0;t=1"));
    assert_eq!(
        header(&no, "content-type"),
        Some("application/problem+json")
    );
    let p = problem(&no);
    assert_eq!(p["limit"], "remote_address");
    assert_eq!(p["status"], 429);
    assert_eq!(p["retry_after_s"], 1);
    assert!(p["type"].as_str().unwrap().ends_with("rate_limited"), "{p}");

    // another address has its own count
    let other = request("edge_proxy_per_ip", &[&[("remote_address", "50.0.0.2")]]);
    assert_eq!(code(&ask(&mut c, &other).await), Code::Ok);
    // the listed address never passes
    let listed = request("edge_proxy_per_ip", &[&[("remote_address", "50.0.0.5")]]);
    let r = ask(&mut c, &listed).await;
    assert_eq!(code(&r), Code::OverLimit);
    assert_eq!(
        r.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        0
    );
    assert_eq!(header(&r, "retry-after"), Some("1"));
    assert_eq!(problem(&r)["limit"], "remote_address_50.0.0.5");

    // the next second: the first address again
    clock.advance(Nanos::SECOND);
    assert_eq!(code(&ask(&mut c, &one).await), Code::Ok);
}

const MESSAGING: &str = "
domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
";

#[tokio::test]
async fn nested_descriptors_limit_each_number_and_a_refusal_charges_nothing() {
    let (s, _clock) = memory(MESSAGING).await;
    let mut c = client(s.addr).await;
    let n = "2061111111";
    // the wide limit first: envoyproxy/ratelimit would charge it on every
    // refusal of the marketing one
    let both = request(
        "messaging",
        &[
            &[("to_number", n)],
            &[("message_type", "marketing"), ("to_number", n)],
        ],
    );
    for i in 0..5u32 {
        let r = ask(&mut c, &both).await;
        assert_eq!(code(&r), Code::Ok);
        assert_eq!(r.statuses[0].limit_remaining, 99 - i);
        assert_eq!(r.statuses[1].limit_remaining, 4 - i);
    }
    let r = ask(&mut c, &both).await;
    assert_eq!(code(&r), Code::OverLimit);
    assert_eq!(status_code(&r, 0), Code::Ok);
    assert_eq!(status_code(&r, 1), Code::OverLimit);
    // the wide limit as it stands: the refused request gave its hit back
    assert_eq!(r.statuses[0].limit_remaining, 95);
    // the day's reset: 17 h 20 min from 06:40 UTC
    assert_eq!(header(&r, "retry-after"), Some("62400"));
    assert_eq!(
        header(&r, "ratelimit-policy"),
        Some("\"to_number\";q=100;w=86400, \"message_type_marketing.to_number\";q=5;w=86400")
    );
    assert_eq!(
        header(&r, "ratelimit"),
        Some("\"to_number\";r=95;t=62400, \"message_type_marketing.to_number\";r=0;t=62400")
    );
    let p = problem(&r);
    assert_eq!(p["limit"], "message_type_marketing.to_number");
    assert!(
        p["type"].as_str().unwrap().ends_with("quota_exhausted"),
        "{p}"
    );
    // again and again: still nothing charged on the wide limit
    for _ in 0..3 {
        assert_eq!(code(&ask(&mut c, &both).await), Code::OverLimit);
    }
    let wide = request("messaging", &[&[("to_number", n)]]);
    let r = ask(&mut c, &wide).await;
    assert_eq!(code(&r), Code::Ok);
    assert_eq!(r.statuses[0].limit_remaining, 94);
    // another number has its own marketing limit
    let other = request(
        "messaging",
        &[&[("message_type", "marketing"), ("to_number", "2062222222")]],
    );
    assert_eq!(ask(&mut c, &other).await.statuses[0].limit_remaining, 4);
    // a descriptor deeper than the rules, or stopping above one, has no limit
    let deep = request("messaging", &[&[("to_number", n), ("x", "y")]]);
    let r = ask(&mut c, &deep).await;
    assert_eq!(code(&r), Code::Ok);
    assert!(r.statuses[0].current_limit.is_none());
    assert!(header(&r, "ratelimit").is_none());
}

const WILDCARD: &str = "
domain: example9
descriptors:
  - key: key1
    value: value*
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: path
    value: /api/*/action
    rate_limit:
      unit: minute
      requests_per_unit: 2
";

#[tokio::test]
async fn wildcard_values_count_each_value_apart() {
    let (s, _clock) = memory(WILDCARD).await;
    let mut c = client(s.addr).await;
    let v1 = request("example9", &[&[("key1", "value1")]]);
    for _ in 0..20 {
        assert_eq!(code(&ask(&mut c, &v1).await), Code::Ok);
    }
    let r = ask(&mut c, &v1).await;
    assert_eq!(code(&r), Code::OverLimit);
    assert_eq!(header(&r, "retry-after"), Some("60"));
    let v2 = request("example9", &[&[("key1", "valueXYZ")]]);
    assert_eq!(ask(&mut c, &v2).await.statuses[0].limit_remaining, 19);
    // no match: no limit
    let none = request("example9", &[&[("key1", "other")]]);
    assert!(ask(&mut c, &none).await.statuses[0].current_limit.is_none());
    let a = request("example9", &[&[("path", "/api/7/action")]]);
    assert_eq!(ask(&mut c, &a).await.statuses[0].limit_remaining, 1);
    let b = request("example9", &[&[("path", "/api/7/other")]]);
    assert!(ask(&mut c, &b).await.statuses[0].current_limit.is_none());
}

const INTERNAL: &str = "
domain: internal
descriptors:
  - key: ldap
    rate_limit:
      unlimited: true
  - key: azure
    rate_limit:
      unit: minute
      requests_per_unit: 100
";

#[tokio::test]
async fn unlimited_answers_ok_with_the_largest_remaining() {
    let (s, _clock) = memory(INTERNAL).await;
    let mut c = client(s.addr).await;
    let ldap = request("internal", &[&[("ldap", "x")]]);
    for _ in 0..50 {
        let r = ask(&mut c, &ldap).await;
        assert_eq!(code(&r), Code::Ok);
        assert_eq!(r.statuses[0].limit_remaining, u32::MAX);
        assert!(header(&r, "ratelimit").is_none());
    }
    let both = request("internal", &[&[("ldap", "x")], &[("azure", "y")]]);
    let r = ask(&mut c, &both).await;
    assert_eq!(r.statuses[0].limit_remaining, u32::MAX);
    assert_eq!(r.statuses[1].limit_remaining, 99);
    assert_eq!(header(&r, "ratelimit-policy"), Some("\"azure\";q=100;w=60"));
}

const REPLACES: &str = "
domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          name: specific_limit
          requests_per_unit: 5
          unit: second
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces:
            - name: specific_limit
          requests_per_unit: 10
          unit: second
";

#[tokio::test]
async fn replaces_drops_the_replaced_limit_and_leaves_it_untouched() {
    let (s, _clock) = memory(REPLACES).await;
    let mut c = client(s.addr).await;
    let both = request(
        "example7",
        &[
            &[("key_1", "value_1"), ("user", "bkthomps")],
            &[("key_2", "value_2"), ("user", "bkthomps")],
        ],
    );
    for _ in 0..10 {
        let r = ask(&mut c, &both).await;
        assert_eq!(code(&r), Code::Ok);
        assert!(r.statuses[0].current_limit.is_none(), "replaced");
    }
    let r = ask(&mut c, &both).await;
    assert_eq!(code(&r), Code::OverLimit);
    assert_eq!(status_code(&r, 1), Code::OverLimit);
    // the replaced limit was not charged by any of them
    let one = request("example7", &[&[("key_1", "value_1"), ("user", "bkthomps")]]);
    let r = ask(&mut c, &one).await;
    assert_eq!(code(&r), Code::Ok);
    assert_eq!(r.statuses[0].limit_remaining, 4);
    assert_eq!(
        r.statuses[0].current_limit.as_ref().unwrap().name,
        "specific_limit"
    );
    assert_eq!(
        header(&r, "ratelimit-policy"),
        Some("\"specific_limit\";q=5;w=1")
    );
}

const SHADOW: &str = "
domain: example6
descriptors:
  - key: service
    descriptors:
      - key: user
        value: user-a
        rate_limit:
          requests_per_unit: 10
          unit: second
        shadow_mode: true
      - key: user
        value: user-b
        rate_limit:
          requests_per_unit: 20
          unit: second
";

#[tokio::test]
async fn shadow_mode_never_refuses_but_counts() {
    let (s, _clock) = memory(SHADOW).await;
    let mut c = client(s.addr).await;
    let a = request(
        "example6",
        &[&[("service", "auth-service"), ("user", "user-a")]],
    );
    for i in 0..15 {
        let r = ask(&mut c, &a).await;
        assert_eq!(code(&r), Code::Ok, "request {i}");
        assert_eq!(status_code(&r, 0), Code::Ok);
        assert_eq!(header(&r, "retry-after"), None);
        if i >= 10 {
            assert_eq!(r.statuses[0].limit_remaining, 0);
        }
    }
    let b = request(
        "example6",
        &[&[("service", "auth-service"), ("user", "user-b")]],
    );
    for _ in 0..20 {
        assert_eq!(code(&ask(&mut c, &b).await), Code::Ok);
    }
    assert_eq!(code(&ask(&mut c, &b).await), Code::OverLimit);
}

#[tokio::test]
async fn hits_addend_charges_that_many_request_level_or_per_descriptor() {
    let (s, _clock) = memory(PER_IP).await;
    let mut c = client(s.addr).await;
    let mut r3 = request("edge_proxy_per_ip", &[&[("remote_address", "1.1.1.1")]]);
    r3.hits_addend = 3;
    assert_eq!(ask(&mut c, &r3).await.statuses[0].limit_remaining, 7);
    r3.descriptors[0].hits_addend = Some(UInt64Value { value: 5 });
    assert_eq!(ask(&mut c, &r3).await.statuses[0].limit_remaining, 2);
    let r = ask(&mut c, &r3).await;
    assert_eq!(code(&r), Code::OverLimit);
    assert_eq!(r.statuses[0].limit_remaining, 2);
}

#[tokio::test]
async fn unknown_domains_pass_and_empty_requests_are_refused() {
    let (s, _clock) = memory(PER_IP).await;
    let mut c = client(s.addr).await;
    let r = ask(&mut c, &request("nobody", &[&[("a", "b")]])).await;
    assert_eq!(code(&r), Code::Ok);
    let e = c
        .should_rate_limit(request("edge_proxy_per_ip", &[]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    let e = c
        .should_rate_limit(request("", &[&[("a", "b")]]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
}

#[tokio::test]
async fn paceline_algorithms_in_the_same_yaml() {
    let yaml = "
domain: api
descriptors:
  - key: api_key
    rate_limit:
      unit: second
      requests_per_unit: 10
      algorithm: token_bucket
      burst: 20
  - key: plan
    rate_limit:
      unit: day
      requests_per_unit: 3
      reset_at: \"06:00\"
";
    let (s, clock) = memory(yaml).await;
    let mut c = client(s.addr).await;
    let k = request("api", &[&[("api_key", "sk_1")]]);
    for _ in 0..20 {
        assert_eq!(code(&ask(&mut c, &k).await), Code::Ok);
    }
    let r = ask(&mut c, &k).await;
    assert_eq!(code(&r), Code::OverLimit);
    assert_eq!(header(&r, "ratelimit-policy"), Some("\"api_key\";q=20;w=2"));
    assert_eq!(header(&r, "retry-after"), Some("1"));
    clock.advance(Nanos::from_millis(100));
    assert_eq!(code(&ask(&mut c, &k).await), Code::Ok);
    // a day from 06:00 UTC: 40 min into it, 23 h 20 min to go
    let p = request("api", &[&[("plan", "free")]]);
    assert_eq!(
        header(&ask(&mut c, &p).await, "ratelimit"),
        Some("\"plan\";r=2;t=84000")
    );
}

#[test]
fn the_example_configuration_loads() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/rls-ratelimit.yaml");
    let c = paceline_rls::RlsConfig::load(&path).unwrap();
    let d = c.domain("edge").unwrap();
    assert_eq!(
        d.find([("remote_address", "1.2.3.4")])
            .unwrap()
            .rule
            .requests_per_unit,
        10
    );
    assert_eq!(d.find([("api_key", "sk_1")]).unwrap().rule.name, "burst");
}

#[tokio::test]
async fn twenty_descriptors_publish_a_plan_s_worth_and_always_the_refusing_rule() {
    let mut yaml = String::from("domain: many\ndescriptors:\n");
    for i in 0..20 {
        let rpu = if i == 19 { 1 } else { 100 };
        yaml.push_str(&format!(
            "  - key: k{i}\n    rate_limit: {{unit: minute, requests_per_unit: {rpu}}}\n"
        ));
    }
    let (s, _clock) = memory(&yaml).await;
    let mut c = client(s.addr).await;
    let keys: Vec<String> = (0..20).map(|i| format!("k{i}")).collect();
    let d: Vec<[(&str, &str); 1]> = keys.iter().map(|k| [(k.as_str(), "v")]).collect();
    let d: Vec<&[(&str, &str)]> = d.iter().map(|x| &x[..]).collect();
    let req = request("many", &d);
    assert_eq!(code(&ask(&mut c, &req).await), Code::Ok);
    let r = ask(&mut c, &req).await;
    assert_eq!(code(&r), Code::OverLimit);
    let policy = header(&r, "ratelimit-policy").unwrap();
    assert_eq!(policy.matches(";q=").count(), 16, "{policy}");
    assert!(policy.ends_with("\"k19\";q=1;w=60"), "{policy}");
    assert_eq!(problem(&r)["limit"], "k19");
    // nothing charged: the first rule stands at 99
    assert_eq!(r.statuses[0].limit_remaining, 99);
}

#[tokio::test]
async fn a_descriptor_s_own_limit_and_negative_hits() {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
    let (s, _clock) = memory(PER_IP).await;
    let mut c = client(s.addr).await;
    let mut req = request("edge_proxy_per_ip", &[&[("remote_address", "7.7.7.7")]]);
    // the override: 2 a minute in place of 10 a second
    req.descriptors[0].limit = Some(RateLimitOverride {
        requests_per_unit: 2,
        unit: 2,
    });
    for left in [1, 0] {
        assert_eq!(ask(&mut c, &req).await.statuses[0].limit_remaining, left);
    }
    let r = ask(&mut c, &req).await;
    assert_eq!(code(&r), Code::OverLimit);
    assert_eq!(header(&r, "retry-after"), Some("60"));
    assert_eq!(
        r.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        2
    );
    // two hits given back
    let mut back = req.clone();
    back.descriptors[0].is_negative_hits = true;
    back.descriptors[0].hits_addend = Some(UInt64Value { value: 2 });
    let r = ask(&mut c, &back).await;
    assert_eq!(code(&r), Code::Ok);
    assert_eq!(r.statuses[0].limit_remaining, 2);
    assert_eq!(code(&ask(&mut c, &req).await), Code::Ok);
    // the configured rule was never touched
    let plain = request("edge_proxy_per_ip", &[&[("remote_address", "7.7.7.7")]]);
    assert_eq!(ask(&mut c, &plain).await.statuses[0].limit_remaining, 9);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refused_request_s_charge_is_never_seen_by_another() {
    let yaml = "
domain: race
descriptors:
  - key: a
    rate_limit: {unit: day, requests_per_unit: 50}
  - key: b
    rate_limit: {unit: day, requests_per_unit: 1}
";
    let svc = paceline_rls::RlsService::new(
        config(yaml),
        paceline_core::MemoryStore::new(),
        paceline_core::ManualClock::at_unix_secs(START),
    );
    // b spent, a at 49 of 50: every (a, b) request is refused after a
    // was charged its last unit
    svc.decide(&request("race", &[&[("b", "x")]]))
        .await
        .unwrap();
    let mut fill = request("race", &[&[("a", "x")]]);
    fill.hits_addend = 49;
    svc.decide(&fill).await.unwrap();
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let svc = svc.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..400 {
                let r = svc
                    .decide(&request("race", &[&[("a", "x")], &[("b", "x")]]))
                    .await;
                assert_eq!(r.unwrap().overall_code, Code::OverLimit as i32);
            }
        }));
    }
    for _ in 0..3 {
        let svc = svc.clone();
        tasks.push(tokio::spawn(async move {
            // a read (no hit): a always has its one unit left
            let mut read = request("race", &[&[("a", "x")]]);
            read.descriptors[0].hits_addend = Some(UInt64Value { value: 0 });
            for _ in 0..400 {
                let r = svc.decide(&read).await.unwrap();
                assert_eq!(
                    r.statuses[0].limit_remaining, 1,
                    "a refused request's charge was seen"
                );
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}
