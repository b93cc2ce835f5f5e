//! Feeds arbitrary bytes to every parser: as a raw HTTP response (status
//! line, headers, body) through `parse_response`, and as single values
//! through the Retry-After, reset and date parsers. Nothing may panic, and
//! the view's invariants must hold.

#![no_main]

use libfuzzer_sys::fuzz_target;
use paceline_core::Nanos;
use paceline_wire::parse::{self, time};
use paceline_wire::raw::parse_raw_response;

const NOW: Nanos = Nanos::from_secs(1_700_000_000);

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = std::str::from_utf8(data) {
        let _ = parse::parse_retry_after(s, NOW);
        let _ = time::parse_reset(s, NOW);
        let _ = time::parse_rfc3339(s);
        let _ = time::parse_go_duration(s);
    }
    // As a whole response, and as a header block after a fixed status line.
    let mut framed = b"HTTP/1.1 429 Too Many Requests\r\n".to_vec();
    framed.extend_from_slice(data);
    for input in [data, &framed[..]] {
        if let Ok(r) = parse_raw_response(input) {
            let body = (!r.body.is_empty()).then_some(&r.body[..]);
            let v = parse::parse_response(r.status, &r.headers, body, NOW);
            if let Some(i) = v.tightest {
                assert!(i < v.policies.len());
                assert_eq!(v.remaining, v.policies[i].remaining);
            }
            if v.retry {
                assert!(matches!(
                    v.outcome,
                    parse::OutcomeKind::RateLimited | parse::OutcomeKind::Overloaded
                ));
            }
            assert!(v.retry_after != Some(Nanos::ZERO));
            let _ = v.to_json().to_string();
        }
    }
});
