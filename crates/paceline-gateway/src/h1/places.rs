//! Where a parsed head's fields sit in the bytes they were read from, so
//! that the map built from them shares those bytes instead of copying
//! each value: one pass over `httparse`'s fields, then the map once the
//! head is out of the read buffer.

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue};

use super::scan::Scan;

/// How many fields' places are kept on the stack (a hundred's would be
/// cleared for every head); more go in a vector.
pub(crate) const FEW: usize = 16;

/// Offsets of each field's name and value: start and end of both.
type Span = (u32, u32, u32, u32);

/// The places of a head's fields.
#[derive(Default)]
pub(crate) struct Places {
    few: [Span; FEW],
    many: Vec<Span>,
    count: usize,
}

impl Places {
    /// Records where each of `fields` (parsed out of `buf`) sits, and reads
    /// each into `scan` (filled in place: a `Places` is a few hundred bytes,
    /// not worth moving).
    pub(crate) fn record(
        &mut self,
        buf: &[u8],
        fields: &[httparse::Header<'_>],
        scan: &mut Scan,
    ) -> Result<(), &'static str> {
        let count = fields.len();
        self.count = count;
        if count > FEW {
            self.many.resize(count, (0, 0, 0, 0));
        }
        let base = buf.as_ptr() as usize;
        let spans = self.spans_mut();
        for (span, f) in spans.iter_mut().zip(fields) {
            let name = f.name.as_bytes();
            scan.field(name, f.value)?;
            let ns = (name.as_ptr() as usize - base) as u32;
            let vs = (f.value.as_ptr() as usize - base) as u32;
            *span = (ns, ns + name.len() as u32, vs, vs + f.value.len() as u32);
        }
        Ok(())
    }

    fn spans_mut(&mut self) -> &mut [Span] {
        match self.count <= FEW {
            true => &mut self.few[..self.count],
            false => &mut self.many[..],
        }
    }

    fn spans(&self) -> &[Span] {
        match self.count <= FEW {
            true => &self.few[..self.count],
            false => &self.many[..],
        }
    }

    /// The fields as a map whose values share `head` (the bytes the places
    /// were taken in, now out of the buffer), with room for `extra` more.
    /// With `one_length`, a `Content-Length` given again (with the same
    /// value: `Scan` refuses another) is kept once.
    pub(crate) fn map(
        &self,
        head: &Bytes,
        extra: usize,
        one_length: bool,
    ) -> Result<HeaderMap, &'static str> {
        let mut headers = super::stock::take(self.count + extra);
        for &(ns, ne, vs, ve) in self.spans() {
            let name = field_name(&head[ns as usize..ne as usize])?;
            if one_length && name == http::header::CONTENT_LENGTH && headers.contains_key(&name) {
                continue;
            }
            let value = HeaderValue::from_maybe_shared(head.slice(vs as usize..ve as usize))
                .map_err(|_| "bad field value")?;
            headers.append(name, value);
        }
        Ok(headers)
    }
}

/// `X-Forwarded-For`: a name of no standard, sent by every proxy in front.
static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
/// `X-Forwarded-Proto`.
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
/// `X-Forwarded-Host`.
static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
/// `X-Forwarded-Method`: what Caddy and Traefik describe a request with
/// when they ask the forward-auth check.
static X_FORWARDED_METHOD: HeaderName = HeaderName::from_static("x-forwarded-method");
/// `X-Forwarded-Uri`.
static X_FORWARDED_URI: HeaderName = HeaderName::from_static("x-forwarded-uri");
/// `X-Original-Method`: nginx's convention for the same.
static X_ORIGINAL_METHOD: HeaderName = HeaderName::from_static("x-original-method");
/// `X-Original-URI`.
static X_ORIGINAL_URI: HeaderName = HeaderName::from_static("x-original-uri");

/// A field's name: the ones most requests and answers carry, spelt as
/// most clients and servers spell them (all lowercase, or each word
/// capitalised), by a comparison of the bytes; any other through
/// `HeaderName::from_bytes`, which lowercases the name into a scratch
/// buffer and then looks it up among every standard name (about a
/// hundred instructions a field) and copies a name outside them. The
/// `X-Forwarded-` and `X-Original-` names are among those compared here:
/// a proxy in front sends some on every request, and the forward-auth
/// check's every call is made of them.
fn field_name(name: &[u8]) -> Result<HeaderName, &'static str> {
    use http::header as h;
    Ok(match name {
        b"host" | b"Host" => h::HOST,
        b"user-agent" | b"User-Agent" => h::USER_AGENT,
        b"accept" | b"Accept" => h::ACCEPT,
        b"accept-encoding" | b"Accept-Encoding" => h::ACCEPT_ENCODING,
        b"authorization" | b"Authorization" => h::AUTHORIZATION,
        b"content-type" | b"Content-Type" => h::CONTENT_TYPE,
        b"content-length" | b"Content-Length" => h::CONTENT_LENGTH,
        b"date" | b"Date" => h::DATE,
        b"server" | b"Server" => h::SERVER,
        b"cache-control" | b"Cache-Control" => h::CACHE_CONTROL,
        b"etag" | b"ETag" => h::ETAG,
        b"vary" | b"Vary" => h::VARY,
        b"connection" | b"Connection" => h::CONNECTION,
        b"transfer-encoding" | b"Transfer-Encoding" => h::TRANSFER_ENCODING,
        b"last-modified" | b"Last-Modified" => h::LAST_MODIFIED,
        b"location" | b"Location" => h::LOCATION,
        b"set-cookie" | b"Set-Cookie" => h::SET_COOKIE,
        b"content-encoding" | b"Content-Encoding" => h::CONTENT_ENCODING,
        b"x-forwarded-for" | b"X-Forwarded-For" => X_FORWARDED_FOR.clone(),
        b"x-forwarded-proto" | b"X-Forwarded-Proto" => X_FORWARDED_PROTO.clone(),
        b"x-forwarded-host" | b"X-Forwarded-Host" => X_FORWARDED_HOST.clone(),
        b"x-forwarded-method" | b"X-Forwarded-Method" => X_FORWARDED_METHOD.clone(),
        b"x-forwarded-uri" | b"X-Forwarded-Uri" => X_FORWARDED_URI.clone(),
        b"x-original-method" | b"X-Original-Method" => X_ORIGINAL_METHOD.clone(),
        b"x-original-uri" | b"X-Original-URI" | b"X-Original-Uri" => X_ORIGINAL_URI.clone(),
        _ => HeaderName::from_bytes(name).map_err(|_| "bad field name")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_field_names_are_the_parsed_ones() {
        for name in [
            "content-type",
            "Content-Type",
            "content-length",
            "Content-Length",
            "date",
            "Date",
            "server",
            "Server",
            "cache-control",
            "Cache-Control",
            "etag",
            "ETag",
            "vary",
            "Vary",
            "connection",
            "Connection",
            "transfer-encoding",
            "Transfer-Encoding",
            "last-modified",
            "Last-Modified",
            "location",
            "Location",
            "set-cookie",
            "Set-Cookie",
            "content-encoding",
            "Content-Encoding",
            "host",
            "Host",
            "user-agent",
            "User-Agent",
            "accept",
            "Accept",
            "accept-encoding",
            "Accept-Encoding",
            "authorization",
            "Authorization",
            "x-forwarded-for",
            "X-Forwarded-For",
            "x-forwarded-proto",
            "X-Forwarded-Proto",
            "x-forwarded-host",
            "X-Forwarded-Host",
            "x-forwarded-method",
            "X-Forwarded-Method",
            "x-forwarded-uri",
            "X-Forwarded-Uri",
            "x-original-method",
            "X-Original-Method",
            "x-original-uri",
            "X-Original-URI",
            "X-Original-Uri",
            // spelt otherwise, or not among them: parsed
            "CONTENT-TYPE",
            "x-request-id",
            "X-Request-Id",
            "dAte",
        ] {
            let parsed = HeaderName::from_bytes(name.as_bytes()).unwrap();
            assert_eq!(field_name(name.as_bytes()).unwrap(), parsed, "{name}");
        }
        for bad in ["", "a b", "x:y", "caf\u{e9}"] {
            assert!(field_name(bad.as_bytes()).is_err(), "{bad:?}");
        }
    }
}
