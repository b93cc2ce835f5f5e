//! Numbers, dates and durations as providers write them.
//!
//! The rule for a reset value (documented on [`parse_reset`]):
//!
//! 1. A duration with units (`6m0s`, `1s`, `20ms`, `1h2m3.5s`) is a delay.
//! 2. An RFC 3339 timestamp (`2024-05-01T12:00:00Z`, also without seconds)
//!    or an HTTP-date (any of the three forms) is an instant; the delay is
//!    that instant minus now (zero when it has passed).
//! 3. A plain number (integer or decimal) is an instant in epoch
//!    milliseconds when it is at least 10^12, an instant in epoch seconds
//!    when it is at least 10^9 (no window lasts 31 years), and otherwise a
//!    delay in seconds.
//!
//! Anything else (signs, exponents, text, more than 15 integer digits) is
//! rejected with a reason.

use paceline_core::Nanos;

/// The longest delay taken at face value: a bit over a year.
pub const MAX_DELAY_SECS: u64 = 400 * 86_400;

/// Epoch seconds at or above this are instants, not delays.
pub const EPOCH_SECS_FLOOR: f64 = 1e9;
/// Epoch values at or above this are milliseconds.
pub const EPOCH_MILLIS_FLOOR: f64 = 1e12;

/// A plain non-negative decimal: digits, at most one dot, no sign, no
/// exponent, at most 15 integer digits.
pub fn parse_decimal(s: &str) -> Result<f64, String> {
    let s = s.trim();
    if s.is_empty() {
        return Err("empty value".into());
    }
    let b = s.as_bytes();
    if b[0] == b'-' {
        return Err(format!("negative value {s:?}"));
    }
    if b[0].is_ascii_digit() && b.iter().any(|c| matches!(c, b'e' | b'E')) {
        return Err(format!("exponent notation {s:?} is not allowed"));
    }
    let mut dots = 0;
    let mut int_digits = 0;
    for (i, c) in b.iter().enumerate() {
        match c {
            b'0'..=b'9' => {
                if dots == 0 {
                    int_digits += 1;
                }
            }
            b'.' if dots == 0 && i > 0 && i + 1 < b.len() => dots += 1,
            _ => return Err(format!("not a number: {}", shorten(s))),
        }
    }
    if int_digits > 15 {
        return Err(format!("number {} has more than 15 digits", shorten(s)));
    }
    s.parse::<f64>()
        .map_err(|_| format!("not a number: {}", shorten(s)))
}

/// A count (limit, remaining, used): a plain non-negative integer, or a
/// decimal read rounded down (Reddit sends `598.0`).
pub fn parse_count(s: &str) -> Result<u64, String> {
    let s = s.trim();
    if !s.is_empty() && s.len() <= 15 && s.bytes().all(|c| c.is_ascii_digit()) {
        return s.parse().map_err(|_| format!("not a count: {s:?}"));
    }
    let v = parse_decimal(s)?;
    Ok(v.floor() as u64)
}

/// Cuts a long value for a diagnostic.
pub fn shorten(s: &str) -> String {
    if s.len() <= 40 {
        format!("{s:?}")
    } else {
        let mut end = 40;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        format!("{:?}… ({} bytes)", &s[..end], s.len())
    }
}

/// `Retry-After` as RFC 9110 defines it (delay-seconds or an HTTP-date in
/// any of its three forms), plus, leniently, a plain decimal number of
/// seconds. Returns the wait from `now`.
///
/// Negative numbers (a date in the past among them), exponents, text and
/// several different values in one field are errors. A valid delay is never
/// capped here, however long: a client decides what it will wait for.
pub fn parse_retry_after(value: &str, now: Nanos) -> Result<Nanos, String> {
    let v = value.trim();
    if v.is_empty() {
        return Err("empty Retry-After".into());
    }
    if v.len() > 256 {
        return Err(format!("value too long ({} bytes)", v.len()));
    }
    if let Some(t) = parse_http_date(v) {
        if t < now {
            return Err(format!("date {} is in the past", shorten(v)));
        }
        return Ok(t.saturating_sub(now));
    }
    if v.contains(',') {
        let mut first: Option<Nanos> = None;
        for part in v.split(',') {
            let d = parse_retry_delay(part)?;
            match first {
                None => first = Some(d),
                Some(f) if f == d => {}
                Some(_) => return Err(format!("conflicting values {}", shorten(v))),
            }
        }
        return first.ok_or_else(|| "empty Retry-After".into());
    }
    parse_retry_delay(v)
}

/// Delay-seconds of a `Retry-After`: any non-negative decimal, saturating;
/// whole seconds exactly (a float would blur a long delay).
fn parse_retry_delay(s: &str) -> Result<Nanos, String> {
    let x = parse_decimal(s)?;
    match s.trim().parse::<u64>() {
        Ok(secs) => Ok(Nanos::from_secs(secs)),
        Err(_) => Ok(Nanos::from_secs_f64(x)),
    }
}

/// A delay in seconds (integer or plain decimal), capped by plausibility.
pub fn parse_delay_secs(s: &str) -> Result<Nanos, String> {
    let x = parse_decimal(s)?;
    if x > MAX_DELAY_SECS as f64 {
        return Err(format!(
            "delay of {} s is implausibly long",
            shorten(s.trim())
        ));
    }
    Ok(Nanos::from_secs_f64(x))
}

/// A delay in milliseconds (vendor hints such as `retry-after-ms`).
pub fn parse_delay_millis(s: &str) -> Result<Nanos, String> {
    let x = parse_decimal(s)?;
    if x > MAX_DELAY_SECS as f64 * 1000.0 {
        return Err(format!(
            "delay of {} ms is implausibly long",
            shorten(s.trim())
        ));
    }
    Ok(Nanos::from_secs_f64(x / 1000.0))
}

/// How a reset value was written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResetForm {
    /// A delay (number of seconds or a duration string).
    Delay,
    /// Epoch seconds.
    EpochSecs,
    /// Epoch milliseconds.
    EpochMillis,
    /// An RFC 3339 or HTTP date.
    Date,
}

/// A reset value, as a delay from `now` (see the module docs for the rule).
pub fn parse_reset(s: &str, now: Nanos) -> Result<(Nanos, ResetForm), String> {
    let s = s.trim();
    if s.is_empty() {
        return Err("empty value".into());
    }
    if s.len() > 128 {
        return Err(format!("value too long ({} bytes)", s.len()));
    }
    let b = s.as_bytes();
    if b.len() <= 15 && b.iter().all(u8::is_ascii_digit) {
        let n: u64 = s
            .parse()
            .map_err(|_| format!("not a number: {}", shorten(s)))?;
        return Ok(number_reset(n as f64, now));
    }
    if b.iter().all(|c| c.is_ascii_digit() || *c == b'.') {
        let x = parse_decimal(s)?;
        return Ok(number_reset(x, now));
    }
    if let Some(d) = parse_go_duration(s) {
        return Ok((d, ResetForm::Delay));
    }
    if let Some(t) = parse_rfc3339(s)
        .or_else(|| parse_http_date(s))
        .or_else(|| parse_js_date(s))
    {
        return Ok((t.saturating_sub(now), ResetForm::Date));
    }
    // Give the number parser the chance to say why (sign, exponent…).
    parse_decimal(s).map(|x| number_reset(x, now))
}

fn number_reset(x: f64, now: Nanos) -> (Nanos, ResetForm) {
    if x >= EPOCH_MILLIS_FLOOR {
        let t = Nanos::from_secs_f64(x / 1000.0);
        (t.saturating_sub(now), ResetForm::EpochMillis)
    } else if x >= EPOCH_SECS_FLOOR {
        (
            Nanos::from_secs_f64(x).saturating_sub(now),
            ResetForm::EpochSecs,
        )
    } else {
        (Nanos::from_secs_f64(x), ResetForm::Delay)
    }
}

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

/// A Go-style duration: `6m0s`, `1s`, `20ms`, `1h2m3.5s`, `250us`, `59.6s`.
pub fn parse_go_duration(s: &str) -> Option<Nanos> {
    let b = s.as_bytes();
    if b.is_empty() || !b[0].is_ascii_digit() || !b[b.len() - 1].is_ascii_alphabetic() {
        return None;
    }
    let mut total: f64 = 0.0;
    let mut i = 0;
    while i < b.len() {
        let start = i;
        while i < b.len() && (b[i].is_ascii_digit() || b[i] == b'.') {
            i += 1;
        }
        if start == i {
            return None;
        }
        let num: f64 = s[start..i].parse().ok()?;
        let ustart = i;
        while i < b.len() && !(b[i].is_ascii_digit() || b[i] == b'.') {
            i += 1;
        }
        let scale = match &s[ustart..i] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" | "μs" => 1e-6,
            "ns" => 1e-9,
            _ => return None,
        };
        total += num * scale;
    }
    if !(total.is_finite()) || total > MAX_DELAY_SECS as f64 {
        return None;
    }
    Some(Nanos::from_secs_f64(total))
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

/// Formats an instant as RFC 3339 (UTC, whole seconds).
pub fn format_rfc3339(t: Nanos) -> String {
    let secs = t.as_secs_floor() as i64;
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

    const NOW: Nanos = Nanos::from_secs(1_700_000_000);

    #[test]
    fn retry_after_forms() {
        // RFC 9110 section 10.2.3's own examples.
        let date = parse_http_date("Fri, 31 Dec 1999 23:59:59 GMT").unwrap();
        assert_eq!(date, Nanos::from_secs(946_684_799));
        assert_eq!(parse_retry_after("120", NOW), Ok(Nanos::from_secs(120)));
        // RFC 9110 section 5.6.7: the three date forms name the same instant.
        let t = Nanos::from_secs(784_111_777);
        for s in [
            "Sun, 06 Nov 1994 08:49:37 GMT",
            "Sunday, 06-Nov-94 08:49:37 GMT",
            "Sun Nov  6 08:49:37 1994",
        ] {
            assert_eq!(parse_http_date(s), Some(t), "{s}");
            assert_eq!(
                parse_retry_after(s, t.saturating_sub(Nanos::from_secs(30))),
                Ok(Nanos::from_secs(30))
            );
        }
        assert_eq!(parse_retry_after("1.5", NOW), Ok(Nanos::from_millis(1500)));
        assert_eq!(parse_retry_after("5, 5", NOW), Ok(Nanos::from_secs(5)));
        for bad in [
            "-1",
            "1e30",
            "soon",
            "",
            "5, 7",
            "1.",
            ".5",
            "+3",
            "99999999999999999999",
            "0x10",
        ] {
            assert!(parse_retry_after(bad, NOW).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations_like_openai_writes_them() {
        assert_eq!(parse_go_duration("6m0s"), Some(Nanos::from_secs(360)));
        assert_eq!(parse_go_duration("1s"), Some(Nanos::SECOND));
        assert_eq!(parse_go_duration("20ms"), Some(Nanos::from_millis(20)));
        assert_eq!(
            parse_go_duration("1h2m3.5s"),
            Some(Nanos::from_millis(3_723_500))
        );
        assert_eq!(parse_go_duration("17.2s"), Some(Nanos::from_millis(17_200)));
        assert_eq!(parse_go_duration("5x"), None);
        assert_eq!(parse_go_duration("s"), None);
    }

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
    fn reset_rule() {
        let (d, f) = parse_reset("30", NOW).unwrap();
        assert_eq!((d, f), (Nanos::from_secs(30), ResetForm::Delay));
        let (d, f) = parse_reset("1700000060", NOW).unwrap();
        assert_eq!((d, f), (Nanos::from_secs(60), ResetForm::EpochSecs));
        let (d, f) = parse_reset("1700000060000", NOW).unwrap();
        assert_eq!((d, f), (Nanos::from_secs(60), ResetForm::EpochMillis));
        let (d, _) = parse_reset("1700000001.5", NOW).unwrap();
        assert_eq!(d, Nanos::from_millis(1500));
        let (d, f) = parse_reset("2023-11-14T22:14:20Z", NOW).unwrap();
        assert_eq!((d, f), (Nanos::from_secs(60), ResetForm::Date));
        assert_eq!(parse_reset("6m0s", NOW).unwrap().0, Nanos::from_secs(360));
        assert!(parse_reset("-5", NOW).is_err());
        assert!(parse_reset("1e30", NOW).is_err());
        assert!(parse_reset("tomorrow", NOW).is_err());
    }

    #[test]
    fn counts() {
        assert_eq!(parse_count("598.0"), Ok(598));
        assert_eq!(parse_count("12"), Ok(12));
        assert!(parse_count("-1").is_err());
        assert!(parse_count("1234567890123456").is_err());
    }
}
