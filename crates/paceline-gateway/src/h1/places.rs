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
    /// were taken in, now out of the buffer), with room for `extra` more;
    /// each name through `name`. With `one_length`, a `Content-Length`
    /// given again (with the same value: `Scan` refuses another) is kept
    /// once.
    pub(crate) fn map(
        &self,
        head: &Bytes,
        extra: usize,
        one_length: bool,
        name: impl Fn(&[u8]) -> Result<HeaderName, &'static str>,
    ) -> Result<HeaderMap, &'static str> {
        let mut headers = HeaderMap::with_capacity(self.count + extra);
        for &(ns, ne, vs, ve) in self.spans() {
            let name = name(&head[ns as usize..ne as usize])?;
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
