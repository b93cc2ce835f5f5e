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
}

impl Via<'_> {
    /// No known peer: nothing a client sent is passed on.
    #[cfg(test)]
    pub(crate) const UNKNOWN: Via<'static> = Via {
        peer: None,
        trusted: &|_| false,
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
        let mut xff = self.xff.unwrap_or_default();
        if let Some(ip) = via.peer {
            paceline_wire::ip::push_ip(&mut xff, ip);
        }
        put_list(out, b"x-forwarded-for: ", &xff);
        if self.saw_forwarded {
            let mut fwd = self.forwarded.unwrap_or_default();
            if let Some(ip) = via.peer {
                push_node(&mut fwd, ip);
            }
            put_list(out, b"forwarded: ", &fwd);
        }
    }
}

/// Writes `name` and `list` (a trailing separator dropped) as one field;
/// nothing when the list is empty.
fn put_list(out: &mut BytesMut, name: &[u8], list: &str) {
    let list = list.trim_end_matches(", ");
    if list.is_empty() {
        return;
    }
    out.put_slice(name);
    out.put_slice(list.as_bytes());
    out.put_slice(b"\r\n");
}

/// `for=` and the address as RFC 7239 §6 writes a node: an IPv6 address
/// in brackets, quoted.
fn push_node(out: &mut String, ip: IpAddr) {
    out.push_str("for=");
    match ip {
        IpAddr::V4(_) => paceline_wire::ip::push_ip(out, ip),
        IpAddr::V6(_) => {
            out.push_str("\"[");
            paceline_wire::ip::push_ip(out, ip);
            out.push_str("]\"");
        }
    }
}
