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
