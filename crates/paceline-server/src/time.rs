//! RFC 3339 timestamps for the usage endpoint, without a date library.

use paceline_core::Nanos;

/// Formats an instant as `2026-10-01T00:00:00Z`, rounding up to the second
/// (a reset announced early would invite a request that is still refused).
pub(crate) fn rfc3339(t: Nanos) -> String {
    let secs = t.as_secs_ceil();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's
/// algorithm, for non-negative days).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_instants() {
        assert_eq!(rfc3339(Nanos::ZERO), "1970-01-01T00:00:00Z");
        assert_eq!(
            rfc3339(Nanos::from_secs(1_790_812_800)),
            "2026-10-01T00:00:00Z"
        );
        assert_eq!(
            rfc3339(Nanos::from_secs(951_782_400)),
            "2000-02-29T00:00:00Z"
        );
        assert_eq!(rfc3339(Nanos::new(1_500_000_000)), "1970-01-01T00:00:02Z");
        assert_eq!(
            rfc3339(Nanos::from_secs(4_102_444_799)),
            "2099-12-31T23:59:59Z"
        );
    }
}
