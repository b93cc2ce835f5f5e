//! What the upstream is told of the client: `X-Forwarded-For` and
//! `Forwarded` as the gateway saw them.
//!
//! Why its own rules: the upstream, like the limiter, believes these
//! fields. A client that talks to the gateway directly could otherwise
//! hand the upstream any address it likes. So the fields a client sent
//! go on only when its socket peer is a configured trusted proxy (then
//! the peer is appended to them); from anyone else they are replaced by
//! the peer alone. `X-Forwarded-For` is always written (the peer,
//! appended); `Forwarded` only when the request carried one, so the
//! common request pays nothing for it.

use std::net::IpAddr;

use bytes::{BufMut, BytesMut};

/// The client connection a request came on, as the upstream head needs it.
#[derive(Clone, Copy)]
pub(crate) struct Via<'a> {
    /// The socket peer, if known.
    pub(crate) peer: Option<IpAddr>,
    /// Whether an address is a trusted proxy (asked at most once, and only
    /// when the request carries a forwarding field).
    pub(crate) trusted: &'a (dyn Fn(IpAddr) -> bool + Sync),
    /// Whether the client connection is TLS: `X-Forwarded-Proto: https`.
    pub(crate) tls: bool,
}

impl Via<'_> {
    /// No known peer: nothing a client sent is passed on.
    #[cfg(test)]
    pub(crate) const UNKNOWN: Via<'static> = Via {
        peer: None,
        trusted: &|_| false,
        tls: false,
    };

    /// Whether the peer is a trusted proxy, whose forwarding fields go on.
    pub(crate) fn peer_trusted(&self) -> bool {
        self.peer.is_some_and(|ip| (self.trusted)(ip))
    }
}

/// The forwarding fields of one request, gathered while its fields are
/// written: the chains passed on (from a trusted peer only), and whether a
/// `Forwarded` field came at all.
#[derive(Default)]
pub(crate) struct Chains {
    /// Asked of [`Via::peer_trusted`] at the first forwarding field.
    trusted: Option<bool>,
    xff: Option<String>,
    forwarded: Option<String>,
    saw_forwarded: bool,
}

impl Chains {
    /// One `X-Forwarded-For` (`forwarded` false) or `Forwarded` field.
    pub(crate) fn field(&mut self, via: &Via<'_>, forwarded: bool, value: &http::HeaderValue) {
        self.saw_forwarded |= forwarded;
        let trusted = *self.trusted.get_or_insert_with(|| via.peer_trusted());
        if !trusted {
            return;
        }
        let chain = match forwarded {
            true => self.forwarded.get_or_insert_with(String::new),
            false => self.xff.get_or_insert_with(String::new),
        };
        // a value that is not visible text cannot be a list of addresses
        if let Ok(v) = value.to_str() {
            chain.push_str(v);
            chain.push_str(", ");
        }
    }

    /// Writes `X-Forwarded-For` (the trusted chain, then the peer) and, if
    /// the client sent one, `Forwarded` (the same, as `for=` elements).
    pub(crate) fn write(self, via: &Via<'_>, out: &mut BytesMut) {
        let xff = self.xff.as_deref().unwrap_or_default();
        put_chain(out, b"x-forwarded-for: ", xff, via.peer, false);
        if self.saw_forwarded {
            let fwd = self.forwarded.as_deref().unwrap_or_default();
            put_chain(out, b"forwarded: ", fwd, via.peer, true);
        }
    }
}

/// Writes the field `name`: `chain` (each hop followed by `, `), then the
/// peer, as a node (`for=`) when `node`; nothing when both are empty.
fn put_chain(out: &mut BytesMut, name: &[u8], chain: &str, peer: Option<IpAddr>, node: bool) {
    let chain = match peer {
        Some(_) => chain,
        None => chain.strip_suffix(", ").unwrap_or(chain),
    };
    if chain.is_empty() && peer.is_none() {
        return;
    }
    out.put_slice(name);
    out.put_slice(chain.as_bytes());
    if let Some(ip) = peer {
        // RFC 7239 §6: an IPv6 node in brackets, quoted
        let v6 = node && ip.is_ipv6();
        out.put_slice(match (node, v6) {
            (false, _) => b"",
            (true, false) => b"for=",
            (true, true) => b"for=\"[",
        });
        paceline_wire::ip::with_ip_bytes(ip, |b| out.put_slice(b));
        if v6 {
            out.put_slice(b"]\"");
        }
    }
    out.put_slice(b"\r\n");
}
