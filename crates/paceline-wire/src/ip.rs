//! IP addresses as header text.
//!
//! Why here: a client address goes onto the wire in `X-Forwarded-For` and
//! into the limiter's per-IP keys, once or twice per request; one writer,
//! tested against `Display`, serves both.

use std::net::IpAddr;

/// Appends `ip` to `out` as `Display` writes it, without the formatting
/// machinery in the common IPv4 case (it runs once or twice per request).
///
/// ```
/// let mut s = String::from("for ");
/// paceline_wire::ip::push_ip(&mut s, "10.0.0.7".parse().unwrap());
/// assert_eq!(s, "for 10.0.0.7");
/// ```
pub fn push_ip(out: &mut String, ip: IpAddr) {
    match ip {
        IpAddr::V6(v6) => {
            use std::fmt::Write;
            let _ = write!(out, "{v6}");
        }
        v4 => with_ip(v4, |s| out.push_str(s)),
    }
}

/// Calls `f` with `ip` as `Display` writes it; an IPv4 address is written
/// on the stack, so a writer into any buffer allocates nothing for it.
///
/// ```
/// let n = paceline_wire::ip::with_ip("192.0.2.10".parse().unwrap(), |s| s.len());
/// assert_eq!(n, 10);
/// ```
pub fn with_ip<R>(ip: IpAddr, f: impl FnOnce(&str) -> R) -> R {
    match ip {
        IpAddr::V4(v4) => {
            // at most 15 bytes, written once
            let mut buf = [0u8; 15];
            let mut len = 0;
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    buf[len] = b'.';
                    len += 1;
                }
                if octet >= 100 {
                    buf[len] = b'0' + octet / 100;
                    len += 1;
                }
                if octet >= 10 {
                    buf[len] = b'0' + octet / 10 % 10;
                    len += 1;
                }
                buf[len] = b'0' + octet % 10;
                len += 1;
            }
            f(std::str::from_utf8(&buf[..len]).unwrap_or_default())
        }
        IpAddr::V6(v6) => f(&v6.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ip_writing_matches_display() {
        // every octet value in every position, then a spread of addresses
        let mut cases: Vec<IpAddr> = Vec::new();
        for pos in 0..4 {
            for v in 0..=255u8 {
                let mut o = [1u8, 22, 133, 4];
                o[pos] = v;
                cases.push(IpAddr::from(o));
            }
        }
        cases.extend(
            ["::1", "2001:db8::7", "::ffff:10.0.0.1"].map(|a| a.parse::<IpAddr>().unwrap()),
        );
        for ip in cases {
            let mut s = String::from(">");
            push_ip(&mut s, ip);
            assert_eq!(s, format!(">{ip}"));
        }
    }
}
