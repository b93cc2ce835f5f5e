//! Dates on the wire: RFC 3339 timestamps and HTTP-dates, written and read.
//!
//! Why one module: the server writes the usage document's `reset_at`, the
//! client and `paceline inspect` read it back, and the parsers read the
//! dates providers put in `Retry-After` and reset fields; all of them use
//! these functions, with no date library.

use paceline_core::Nanos;

/// An HTTP-date (IMF-fixdate, RFC 850 or asctime form).
pub fn parse_http_date(s: &str) -> Option<Nanos> {
    let b = s.as_bytes();
    // Cheap guard: every form starts with a day name.
    if b.len() < 24 || !b[0].is_ascii_alphabetic() {
        return None;
    }
    httpdate::parse_http_date(s)
        .ok()
        .map(Nanos::from_system_time)
}

/// An RFC 3339 / ISO 8601 timestamp: `YYYY-MM-DDTHH:MM[:SS[.frac]]` with
/// `Z` or a numeric offset (a missing offset is read as UTC).
pub fn parse_rfc3339(s: &str) -> Option<Nanos> {
    let b = s.as_bytes();
    if b.len() < 16 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let p = b.get(r)?;
        if !p.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(p).ok()?.parse().ok()
    };
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    if b[13] != b':' {
        return None;
    }
    let (h, mi) = (num(11..13)?, num(14..16)?);
    let mut i = 16;
    let mut sec = 0i64;
    let mut frac = 0f64;
    if b.get(i) == Some(&b':') {
        sec = num(17..19)?;
        i = 19;
        if b.get(i) == Some(&b'.') {
            let start = i;
            i += 1;
            while i < b.len() && b[i].is_ascii_digit() {
                i += 1;
            }
            frac = s.get(start..i)?.parse().ok()?;
        }
    }
    let offset = match b.get(i) {
        None => 0,
        Some(b'Z') | Some(b'z') if i + 1 == b.len() => 0,
        Some(&c @ (b'+' | b'-')) => {
            let rest = s.get(i + 1..)?;
            if !rest.is_ascii() {
                return None;
            }
            let (oh, om) = match rest.len() {
                5 if rest.as_bytes()[2] == b':' => (
                    rest.get(..2)?.parse::<i64>().ok()?,
                    rest.get(3..)?.parse::<i64>().ok()?,
                ),
                4 => (
                    rest.get(..2)?.parse::<i64>().ok()?,
                    rest.get(2..)?.parse::<i64>().ok()?,
                ),
                2 => (rest.parse::<i64>().ok()?, 0),
                _ => return None,
            };
            let o = oh * 3600 + om * 60;
            if c == b'+' {
                o
            } else {
                -o
            }
        }
        _ => return None,
    };
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    let days = days_from_civil(y, mo, d);
    let secs = days * 86_400 + h * 3600 + mi * 60 + sec - offset;
    if secs < 0 {
        return Some(Nanos::ZERO);
    }
    Some(Nanos::from_secs(secs as u64).saturating_add(Nanos::from_secs_f64(frac)))
}

/// JavaScript's `Date.prototype.toString()` form, which some APIs send:
/// `Tue Feb 16 2021 09:02:42 GMT+0100 (Central European Standard Time)`.
pub fn parse_js_date(s: &str) -> Option<Nanos> {
    let mut it = s.split_ascii_whitespace();
    let _weekday = it.next()?;
    let month = it.next()?;
    let day: i64 = it.next()?.parse().ok()?;
    let year: i64 = it.next()?.parse().ok()?;
    let hms = it.next()?;
    let zone = it.next()?.strip_prefix("GMT")?;
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let m = MONTHS.iter().position(|x| *x == month)? as i64 + 1;
    let mut t = hms.split(':').map(|x| x.parse::<i64>().ok());
    let (h, mi, sec) = (t.next()??, t.next()??, t.next()??);
    let offset = match zone.as_bytes() {
        [] => 0,
        [sign @ (b'+' | b'-'), rest @ ..]
            if rest.len() == 4 && rest.iter().all(u8::is_ascii_digit) =>
        {
            let v: i64 = zone[1..].parse().ok()?;
            let o = v / 100 * 3600 + v % 100 * 60;
            if *sign == b'+' {
                o
            } else {
                -o
            }
        }
        _ => return None,
    };
    if !(1..=31).contains(&day)
        || !(0..=23).contains(&h)
        || !(0..=59).contains(&mi)
        || !(0..=60).contains(&sec)
    {
        return None;
    }
    let secs = days_from_civil(year, m, day) * 86_400 + h * 3600 + mi * 60 + sec - offset;
    u64::try_from(secs).ok().map(Nanos::from_secs)
}

/// Days since 1970-01-01 for a proleptic Gregorian date.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Formats an instant as RFC 3339 (UTC, whole seconds, rounded down):
/// `2023-11-14T22:13:20Z`.
pub fn format_rfc3339(t: Nanos) -> String {
    format_secs(t.as_secs_floor())
}

/// Formats an instant as RFC 3339 (UTC), rounding up to the second: a
/// reset announced early would invite a request that is still refused.
pub fn format_rfc3339_ceil(t: Nanos) -> String {
    format_secs(t.as_secs_ceil())
}

fn format_secs(secs: u64) -> String {
    let secs = i64::try_from(secs).unwrap_or(i64::MAX);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's
/// algorithm).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_forms() {
        let t = Nanos::from_secs(1_700_000_000); // 2023-11-14T22:13:20Z
        assert_eq!(format_rfc3339(t), "2023-11-14T22:13:20Z");
        assert_eq!(parse_rfc3339("2023-11-14T22:13:20Z"), Some(t));
        assert_eq!(parse_rfc3339("2023-11-14T23:13:20+01:00"), Some(t));
        assert_eq!(
            parse_rfc3339("2023-11-14T22:13Z"),
            Some(t.saturating_sub(Nanos::from_secs(20)))
        );
        assert_eq!(
            parse_rfc3339("2023-11-14T22:13:20.250Z"),
            Some(t.saturating_add(Nanos::from_millis(250)))
        );
        assert_eq!(parse_rfc3339("2023-13-14T22:13:20Z"), None);
        assert_eq!(parse_rfc3339("2023-11-14T22:13:20Zjunk"), None);
        // lemlist's documented X-RateLimit-Reset (a JavaScript Date string).
        assert_eq!(
            parse_js_date("Tue Feb 16 2021 09:02:42 GMT+0100 (Central European Standard Time)"),
            parse_rfc3339("2021-02-16T08:02:42Z")
        );
    }

    #[test]
    fn known_instants_round_up() {
        let ceil = format_rfc3339_ceil;
        assert_eq!(ceil(Nanos::ZERO), "1970-01-01T00:00:00Z");
        assert_eq!(
            ceil(Nanos::from_secs(1_790_812_800)),
            "2026-10-01T00:00:00Z"
        );
        assert_eq!(ceil(Nanos::from_secs(951_782_400)), "2000-02-29T00:00:00Z");
        assert_eq!(ceil(Nanos::new(1_500_000_000)), "1970-01-01T00:00:02Z");
        assert_eq!(
            ceil(Nanos::from_secs(4_102_444_799)),
            "2099-12-31T23:59:59Z"
        );
        assert_eq!(
            format_rfc3339(Nanos::new(1_500_000_000)),
            "1970-01-01T00:00:01Z"
        );
    }
}
