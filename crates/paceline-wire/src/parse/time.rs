//! Numbers, dates and durations as providers write them (the date
//! parsers are [`crate::time`]'s, re-exported here).
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

pub use crate::time::{format_rfc3339, parse_http_date, parse_js_date, parse_rfc3339};

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
/// A date that has already passed is a wait of zero: the server's answer
/// is "now", as with `Retry-After: 0`, not a missing field. Negative
/// numbers, exponents, text and several different values in one field are
/// errors. A valid delay is never capped here, however long: a client
/// decides what it will wait for.
pub fn parse_retry_after(value: &str, now: Nanos) -> Result<Nanos, String> {
    let v = value.trim();
    if v.is_empty() {
        return Err("empty Retry-After".into());
    }
    if v.len() > 256 {
        return Err(format!("value too long ({} bytes)", v.len()));
    }
    if let Some(t) = parse_http_date(v) {
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
#[non_exhaustive]
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
