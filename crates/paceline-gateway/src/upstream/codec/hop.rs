//! The fields that describe one connection, not the message (RFC 9110
//! §7.6.1): they stay behind both ways, the request's on the way up and
//! the answer's on the way back, with any field `Connection` names.

use http::header::{self, HeaderMap, HeaderName};

const HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// True for a field that is hop-by-hop whatever `Connection` says.
pub(crate) fn is_hop_by_hop(name: &HeaderName) -> bool {
    // the names of `HOP_BY_HOP` as text: a match on a name's text is a
    // few comparisons, where the array (a const) would be made and
    // dropped at every call, once per field of every head
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
    )
}

/// The fields named in `Connection`.
pub(crate) fn connection_named(headers: &HeaderMap) -> Vec<HeaderName> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .filter_map(|t| HeaderName::from_bytes(t.trim_ascii()).ok())
        .collect()
}

/// Removes the fields that describe one connection, not the message
/// (RFC 9110 §7.6.1), including any named in `Connection`.
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // most messages carry none: one pass over the names instead of a
    // lookup per field
    if !headers.keys().any(is_hop_by_hop) {
        return;
    }
    let named = connection_named(headers);
    for h in named.iter().chain(HOP_BY_HOP.iter()) {
        headers.remove(h);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn the_hop_by_hop_names_are_the_matched_ones() {
        for name in &HOP_BY_HOP {
            assert!(is_hop_by_hop(name), "{name}");
        }
        for name in [
            "host",
            "content-length",
            "x-forwarded-for",
            "tea",
            "upgrades",
        ] {
            assert!(!is_hop_by_hop(&HeaderName::from_static(name)), "{name}");
        }
    }

    #[test]
    fn hop_by_hop_fields_go() {
        let mut h = HeaderMap::new();
        h.insert(
            "connection",
            HeaderValue::from_static("keep-alive, x-secret"),
        );
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert("te", HeaderValue::from_static("trailers"));
        h.insert("transfer-encoding", HeaderValue::from_static("chunked"));
        h.insert("upgrade", HeaderValue::from_static("websocket"));
        h.insert("authorization", HeaderValue::from_static("Bearer k"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1, "{h:?}");
        assert!(h.contains_key("authorization"));
    }
}
