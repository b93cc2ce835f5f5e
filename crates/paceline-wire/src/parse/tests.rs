//! Unit tests of the parse rules.

use super::*;
use http::{HeaderMap, HeaderName, HeaderValue};

pub(super) const NOW: Nanos = Nanos::from_secs(1_700_000_000);

pub(super) fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(
            HeaderName::from_bytes(k.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        );
    }
    h
}

#[test]
fn ietf_tightest_and_borrowed_quota() {
    let h = headers(&[
        (
            "RateLimit-Policy",
            r#""burst";q=20;w=2, "daily";q=10000;w=86400"#,
        ),
        (
            "RateLimit",
            r#""burst";r=7;t=1, "daily";r=2310;t=21600, "extra";r=3;t=5"#,
        ),
    ]);
    let v = parse_response(200, &h, None, NOW);
    assert_eq!(v.outcome, OutcomeKind::Success);
    assert_eq!(v.policies.len(), 3);
    // "extra" has no policy of its name: it has no quota.
    let t = v.tightest_policy().unwrap();
    assert_eq!(t.name, "extra");
    assert_eq!((v.limit, v.remaining), (None, Some(3)));
    assert_eq!(v.retry_after, None);
    assert_eq!(v.dialects, vec!["ietf".to_string()]);
}
