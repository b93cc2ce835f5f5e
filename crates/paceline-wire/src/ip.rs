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
            let (buf, len) = v4_text(v4);
            f(std::str::from_utf8(&buf[..len]).unwrap_or_default())
        }
        IpAddr::V6(v6) => f(&v6.to_string()),
    }
}

/// [`with_ip`] for a writer of bytes (a head being written): the same
/// text, not checked again as UTF-8.
///
/// ```
/// let mut head = b"x-forwarded-for: ".to_vec();
/// paceline_wire::ip::with_ip_bytes("10.0.0.7".parse().unwrap(), |b| head.extend_from_slice(b));
/// assert_eq!(head, b"x-forwarded-for: 10.0.0.7");
/// ```
pub fn with_ip_bytes<R>(ip: IpAddr, f: impl FnOnce(&[u8]) -> R) -> R {
    match ip {
        IpAddr::V4(v4) => {
            let (buf, len) = v4_text(v4);
            f(&buf[..len])
        }
        IpAddr::V6(v6) => f(v6.to_string().as_bytes()),
    }
}

/// An IPv4 address as `Display` writes it (at most 15 bytes), each octet's
/// digits copied from [`OCTETS`].
fn v4_text(v4: std::net::Ipv4Addr) -> ([u8; 16], usize) {
    let mut buf = [0u8; 16];
    let mut len = 0;
    for (i, octet) in v4.octets().into_iter().enumerate() {
        if i > 0 {
            buf[len] = b'.';
            len += 1;
        }
        let (digits, n) = OCTETS[usize::from(octet)];
        // three bytes written, `n` kept: a shorter octet's spare bytes
        // are overwritten by what follows (or lie past the end)
        buf[len..len + 3].copy_from_slice(&digits);
        len += n;
    }
    (buf, len)
}

/// Each octet's decimal digits (padded to three bytes) and how many there
/// are.
const OCTETS: [([u8; 3], usize); 256] = {
    let mut t = [([0u8; 3], 0usize); 256];
    let mut v = 0;
    while v < 256 {
        let (h, d, o) = ((v / 100) as u8, (v / 10 % 10) as u8, (v % 10) as u8);
        t[v] = match v {
            0..=9 => ([b'0' + o, 0, 0], 1),
            10..=99 => ([b'0' + d, b'0' + o, 0], 2),
            _ => ([b'0' + h, b'0' + d, b'0' + o], 3),
        };
        v += 1;
    }
    t
};

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
            with_ip_bytes(ip, |b| assert_eq!(b, ip.to_string().as_bytes()));
        }
    }
}
