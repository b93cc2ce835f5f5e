//! The example limits file loads, and mistakes in a file name their field.

use paceline_core::PolicyKind;
use paceline_server::{Criticality, LimitsConfig};

const EXAMPLE: &str = include_str!("../examples/limits.toml");

#[test]
fn the_example_file_loads() {
    let cfg: LimitsConfig = toml::from_str(EXAMPLE).unwrap();
    let limits = cfg.build().unwrap();
    let free = limits.plan_for_key("sk_live_free").unwrap();
    assert_eq!(free.name(), "free");
    assert_eq!(free.policy(1).kind(), PolicyKind::Quota);
    let pro = limits.plan("pro").unwrap();
    assert!(pro.policy(2).is_shadow());
    let batch = limits
        .route(&http::Method::POST, "/v1/labels:batch")
        .unwrap();
    assert_eq!(
        (batch.cost(), batch.criticality()),
        (10, Criticality::CriticalPlus)
    );
    assert!(limits
        .route(&http::Method::POST, "/v1/login")
        .unwrap()
        .is_anonymous());
    assert_eq!(limits.soft_limit(), Some(0.8));
}

#[test]
fn a_bad_file_names_the_field() {
    let bad = EXAMPLE.replace("q = 20, w = 2", "q = 20, w = 0");
    let err = toml::from_str::<LimitsConfig>(&bad)
        .unwrap()
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "plans.free.policies[0].w");
    assert!(err.to_string().starts_with("plans.free.policies[0].w: "));

    let typo = EXAMPLE.replace("soft_limit = 0.8", "soft_limt = 0.8");
    let err = toml::from_str::<LimitsConfig>(&typo).unwrap_err();
    assert!(err.to_string().contains("soft_limt"), "{err}");
}

const KEYED: &str = r#"
[plans.free]
policies = [{ name = "burst", algorithm = "token_bucket", q = 20, w = 2 }]

[idempotency]
ttl_s = 3600
conflict_status = 422
in_flight = "wait"
max_wait_ms = 2000

[[routes]]
method = "POST"
path = "/v1/labels"
idempotency = "required"

[[routes]]
method = "PATCH"
path = "/v1/labels/{id}"
idempotency = "optional"
"#;

#[test]
fn routes_take_idempotency_keys_and_the_layer_its_settings() {
    use paceline_server::idempotency::{InFlight, DEFAULT_MAX_BODY_BYTES};
    use paceline_server::IdempotencyMode;
    let limits = toml::from_str::<LimitsConfig>(KEYED)
        .unwrap()
        .build()
        .unwrap();
    let r = |m: http::Method, p: &str| limits.route(&m, p).unwrap().idempotency();
    assert_eq!(
        r(http::Method::POST, "/v1/labels"),
        Some(IdempotencyMode::Required)
    );
    assert_eq!(
        r(http::Method::PATCH, "/v1/labels/lbl_1"),
        Some(IdempotencyMode::Optional)
    );
    let s = limits.idempotency();
    assert_eq!(s.ttl, std::time::Duration::from_secs(3600));
    assert_eq!(s.conflict_status, 422);
    assert_eq!(s.in_flight, InFlight::Wait);
    assert_eq!(s.max_body_bytes, DEFAULT_MAX_BODY_BYTES);
    assert_eq!(s.problem_base, limits.problem_base());
    assert!(limits.has_idempotent_routes());
}

#[test]
fn idempotency_mistakes_name_their_field() {
    let err = |from: &str, to: &str| {
        let text = KEYED.replacen(from, to, 1);
        let cfg = match toml::from_str::<LimitsConfig>(&text) {
            Ok(c) => c,
            Err(e) => return e.to_string(),
        };
        cfg.build().unwrap_err().to_string()
    };
    assert!(err("conflict_status = 422", "conflict_status = 500")
        .starts_with("idempotency.conflict_status: "));
    assert!(err("ttl_s = 3600", "ttl_s = 0").starts_with("idempotency.ttl_s: "));
    assert!(err("max_wait_ms = 2000", "max_wait_ms = 999999999")
        .starts_with("idempotency.max_wait_ms: "));
    assert!(err("ttl_s = 3600", "ttl_s = 3600\nmax_store_bytes = 10")
        .starts_with("idempotency.max_store_bytes: "));
    assert!(err("in_flight = \"wait\"", "in_flight = \"queue\"").contains("queue"));
    assert!(err("ttl_s = 3600", "ttl = 3600").contains("unknown field"));
    assert!(err("idempotency = \"required\"", "idempotency = \"always\"").contains("always"));
    // a GET never takes a key
    assert!(err("method = \"POST\"", "method = \"GET\"")
        .starts_with("routes[0].idempotency: only POST and PATCH"));
}

const TOKENS: &str = r#"
[plans.llm]
policies = [
  { name = "burst", algorithm = "token_bucket", q = 20, w = 2 },
  { name = "tpm", algorithm = "token_bucket", q = 100000, w = 60, unit = "tokens" },
]
"#;

#[test]
fn a_policy_counts_any_named_unit_and_publishes_it() {
    let limits = toml::from_str::<LimitsConfig>(TOKENS)
        .unwrap()
        .build()
        .unwrap();
    let plan = limits.plan("llm").unwrap();
    assert_eq!(plan.policy(1).unit().as_str(), "tokens");
    assert_eq!(
        paceline_wire::emit::policy_field(plan),
        r#""burst";q=20;w=2, "tpm";q=100000;w=60;qu="tokens""#
    );
    let bad = TOKENS.replace(r#"unit = "tokens""#, r#"unit = "Tokens!""#);
    let err = toml::from_str::<LimitsConfig>(&bad)
        .unwrap()
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "plans.llm.policies[1].unit");
    assert!(err.to_string().contains("\"Tokens!\""), "{err}");
    // a near miss of a unit the body is counted in is a mistake
    let typo = TOKENS.replace(r#"unit = "tokens""#, r#"unit = "bytes""#);
    let err = toml::from_str::<LimitsConfig>(&typo)
        .unwrap()
        .build()
        .unwrap_err();
    assert!(
        err.to_string().contains("did you mean content-bytes"),
        "{err}"
    );
}

#[test]
fn a_route_cost_settled_from_the_answer_reads_and_its_mistakes_name_their_field() {
    let ok = format!(
        "{TOKENS}\n[[routes]]\nmethod = \"POST\"\npath = \"/v1/chat\"\ncost = {{ estimate = 800, from_json = \"usage.total_tokens\" }}\n"
    );
    let limits = toml::from_str::<LimitsConfig>(&ok)
        .unwrap()
        .build()
        .unwrap();
    let route = limits.routes().next().unwrap();
    assert_eq!((route.cost(), route.units()), (1, 800));
    assert_eq!(
        route.usage().unwrap().to_string(),
        "json:usage.total_tokens"
    );
    let err = |from: &str, to: &str| {
        let text = ok.replace(from, to);
        match toml::from_str::<LimitsConfig>(&text) {
            Err(e) => e.to_string(),
            Ok(c) => c.build().unwrap_err().to_string(),
        }
    };
    assert!(err(
        "from_json = \"usage.total_tokens\"",
        "from_json = \"usage..x\""
    )
    .starts_with("routes[0].cost.from_json"));
    assert!(err(
        "from_json = \"usage.total_tokens\"",
        "from_header = \"bad name\""
    )
    .starts_with("routes[0].cost.from_header"));
    assert!(err(
        "from_json = \"usage.total_tokens\"",
        "from_json = \"a\", from_header = \"x-used\""
    )
    .contains("not both"));
    // an estimate no plan can hold, and a usage no plan counts
    assert!(err("estimate = 800", "estimate = 200000").contains("200000 is more than any plan"));
    let no_unit = ok.replace(", unit = \"tokens\"", "");
    let e = toml::from_str::<LimitsConfig>(&no_unit)
        .unwrap()
        .build()
        .unwrap_err()
        .to_string();
    assert!(e.contains("no plan this route meets counts one"), "{e}");
    // two units besides requests in one plan
    let mixed = ok.replace(
        "unit = \"tokens\" },",
        "unit = \"tokens\" },\n  { name = \"up\", algorithm = \"token_bucket\", q = 9, w = 60, unit = \"content-bytes\" },",
    );
    let e = toml::from_str::<LimitsConfig>(&mixed)
        .unwrap()
        .build()
        .unwrap_err()
        .to_string();
    assert!(e.contains("at most one other unit"), "{e}");
}

#[test]
fn leased_policies_read_and_their_mistakes_name_their_field() {
    let ok = r#"
[plans.global]
policies = [
  { name = "rps", algorithm = "token_bucket", q = 2000, w = 1, share = "leased" },
  { name = "day", algorithm = "daily", q = 1000000, share = "leased", max_slice = 500 },
]
"#;
    let limits = toml::from_str::<LimitsConfig>(ok).unwrap().build().unwrap();
    let plan = limits.plan("global").unwrap();
    use paceline_core::Share;
    assert_eq!(plan.policy(0).share(), Share::Leased { max_slice: 40 });
    assert_eq!(plan.policy(1).share(), Share::Leased { max_slice: 500 });
    let err = |from: &str, to: &str| {
        let text = ok.replace(from, to);
        toml::from_str::<LimitsConfig>(&text)
            .unwrap()
            .build()
            .unwrap_err()
            .to_string()
    };
    let e = err(
        r#""token_bucket", q = 2000, w = 1"#,
        r#""concurrency", q = 2000"#,
    );
    assert!(
        e.starts_with("plans.global.policies[0].share") && e.contains("concurrency"),
        "{e}"
    );
    let counter = ok.replace(
        r#""token_bucket", q = 2000"#,
        r#""sliding_counter", q = 2000"#,
    );
    let limits = toml::from_str::<LimitsConfig>(&counter)
        .unwrap()
        .build()
        .unwrap();
    let p = limits.plan("global").unwrap().policy(0).clone();
    assert_eq!(p.share(), Share::Leased { max_slice: 40 });
    let e = err(r#""token_bucket", q = 2000"#, r#""sliding_log", q = 2000"#);
    assert!(e.contains("a sliding log stamps each unit"), "{e}");
    let e = err("max_slice = 500", "max_slice = 2000000");
    assert!(e.starts_with("plans.global.policies[1].max_slice"), "{e}");
    let e = err(r#", share = "leased", max_slice"#, ", max_slice");
    assert!(e.contains("max_slice is for share"), "{e}");
    let e = err(r#"w = 1, share = "leased""#, "w = 1");
    assert!(
        e.starts_with("plans.global") && e.contains("every policy of the plan"),
        "{e}"
    );
    let e = err(r#"share = "leased" },"#, r#"share = "shared" },"#);
    assert!(e.contains("use exact or leased"), "{e}");
}

#[test]
fn a_bucket_with_a_burst_of_its_own_reads_and_bounds_its_slices() {
    let ok = r#"
[plans.big]
policies = [
  { name = "rps", algorithm = "token_bucket", q = 5000, w = 1, burst = 500, share = "leased" },
]
"#;
    let limits = toml::from_str::<LimitsConfig>(ok).unwrap().build().unwrap();
    let p = limits.plan("big").unwrap().policy(0).clone();
    assert_eq!((p.quota(), p.window_s(), p.burst()), (5000, 1, 500));
    // a tenth of the burst, not a fiftieth of q (100)
    assert_eq!(p.share(), paceline_core::Share::Leased { max_slice: 50 });
    let err = |from: &str, to: &str| {
        let text = ok.replace(from, to);
        toml::from_str::<LimitsConfig>(&text)
            .unwrap()
            .build()
            .unwrap_err()
            .to_string()
    };
    let e = err(
        r#"share = "leased""#,
        r#"share = "leased", max_slice = 501"#,
    );
    assert!(
        e.starts_with("plans.big.policies[0].max_slice") && e.contains("the burst (500)"),
        "{e}"
    );
    let e = err("burst = 500", "burst = 0");
    assert!(e.starts_with("plans.big.policies[0].burst"), "{e}");
    let e = err(r#""token_bucket""#, r#""fixed_window""#);
    assert!(
        e.starts_with("plans.big.policies[0].burst") && e.contains("only a token bucket"),
        "{e}"
    );
}
