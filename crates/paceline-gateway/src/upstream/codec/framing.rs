//! The body framing state machine: how many bytes of a response body are
//! still to come (`Content-Length`), the chunked decoder with its size
//! lines, extensions and bounded trailers, or the end of the connection.
//! It takes body bytes out of a buffer and never reads a socket itself.

use bytes::{Buf, Bytes, BytesMut};

use crate::upstream::error::BodyError;

/// The longest chunk-size line (with extensions) accepted.
const MAX_CHUNK_LINE: usize = 4096;
/// The most trailer bytes skipped after the last chunk.
const MAX_TRAILERS: usize = 16 * 1024;

/// How a response body ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Framing {
    /// After this many more bytes.
    Length(u64),
    /// With the last chunk.
    Chunked(Chunk),
    /// When the upstream closes the connection.
    Close,
}

/// Where a chunked decoder is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Chunk {
    /// Expecting a chunk-size line.
    Size,
    /// Inside a chunk, with this many bytes left.
    Data(u64),
    /// Expecting the CRLF after a chunk's data.
    DataEnd,
    /// After the last chunk, skipping trailer fields (bytes skipped so far).
    Trailers(usize),
    /// Done.
    End,
}

/// What the decoder found in the buffer.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Body bytes.
    Data(Bytes),
    /// The buffer holds no complete next piece.
    NeedMore,
    /// The body is complete.
    End,
}

impl Framing {
    /// Takes the next piece of body out of `buf`.
    pub(crate) fn decode(&mut self, buf: &mut BytesMut) -> Result<Step, BodyError> {
        match self {
            Framing::Length(0) => Ok(Step::End),
            Framing::Length(left) => {
                if buf.is_empty() {
                    return Ok(Step::NeedMore);
                }
                let n = (*left).min(buf.len() as u64) as usize;
                *left -= n as u64;
                Ok(Step::Data(buf.split_to(n).freeze()))
            }
            Framing::Close => match buf.is_empty() {
                true => Ok(Step::NeedMore),
                false => Ok(Step::Data(buf.split().freeze())),
            },
            Framing::Chunked(state) => decode_chunked(state, buf),
        }
    }

    /// True once nothing more is to come.
    pub(crate) fn is_end(&self) -> bool {
        matches!(self, Framing::Length(0) | Framing::Chunked(Chunk::End))
    }
}

fn decode_chunked(state: &mut Chunk, buf: &mut BytesMut) -> Result<Step, BodyError> {
    loop {
        match state {
            Chunk::Size => {
                let Some(eol) = find_crlf(buf, MAX_CHUNK_LINE)? else {
                    return Ok(Step::NeedMore);
                };
                let line = &buf[..eol];
                let digits = line.iter().take_while(|c| c.is_ascii_hexdigit()).count();
                if digits == 0 || digits > 16 {
                    return Err(BodyError("bad chunk size"));
                }
                let rest = &line[digits..];
                let rest_ok = rest
                    .iter()
                    .position(|&c| c == b';')
                    .map_or(rest, |p| &rest[..p])
                    .iter()
                    .all(|&c| c == b' ' || c == b'\t');
                if !rest_ok {
                    return Err(BodyError("bad chunk size"));
                }
                let size = line[..digits].iter().fold(0u64, |n, &c| {
                    (n << 4) | u64::from((c as char).to_digit(16).unwrap_or(0))
                });
                buf.advance(eol + 2);
                *state = match size {
                    0 => Chunk::Trailers(0),
                    n => Chunk::Data(n),
                };
            }
            Chunk::Data(left) => {
                if buf.is_empty() {
                    return Ok(Step::NeedMore);
                }
                let n = (*left).min(buf.len() as u64) as usize;
                *left -= n as u64;
                if *left == 0 {
                    *state = Chunk::DataEnd;
                }
                return Ok(Step::Data(buf.split_to(n).freeze()));
            }
            Chunk::DataEnd => {
                if buf.len() < 2 {
                    return Ok(Step::NeedMore);
                }
                if &buf[..2] != b"\r\n" {
                    return Err(BodyError("chunk not followed by CRLF"));
                }
                buf.advance(2);
                *state = Chunk::Size;
            }
            Chunk::Trailers(seen) => {
                let room = MAX_TRAILERS.saturating_sub(*seen);
                let Some(eol) = find_crlf(buf, room)? else {
                    return Ok(Step::NeedMore);
                };
                buf.advance(eol + 2);
                match eol {
                    0 => *state = Chunk::End,
                    n => *seen += n + 2,
                }
            }
            Chunk::End => return Ok(Step::End),
        }
    }
}

/// The position of the first CRLF in `buf`, looked for within `limit`
/// bytes; a bare LF is an error.
fn find_crlf(buf: &[u8], limit: usize) -> Result<Option<usize>, BodyError> {
    match buf
        .iter()
        .take(limit.saturating_add(1))
        .position(|&c| c == b'\n')
    {
        Some(0) => Err(BodyError("bare LF")),
        Some(p) if buf[p - 1] == b'\r' => Ok(Some(p - 1)),
        Some(_) => Err(BodyError("bare LF")),
        None if buf.len() > limit => Err(BodyError("line too long")),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(framing: &mut Framing, wire: &[u8], step: usize) -> Result<Vec<u8>, BodyError> {
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        let mut fed = 0;
        loop {
            match framing.decode(&mut buf)? {
                Step::Data(b) => out.extend_from_slice(&b),
                Step::End => return Ok(out),
                Step::NeedMore if fed >= wire.len() => return Err(BodyError("short")),
                Step::NeedMore => {
                    let n = step.min(wire.len() - fed);
                    buf.extend_from_slice(&wire[fed..fed + n]);
                    fed += n;
                }
            }
        }
    }

    #[test]
    fn chunked_bodies_decode_whatever_the_read_sizes() {
        let wire = b"5;ext=1\r\nhello\r\n1\r\n \r\n6\r\nworld!\r\n0\r\nx-trailer: 1\r\n\r\n";
        for step in [1, 2, 3, 7, 64] {
            let mut f = Framing::Chunked(Chunk::Size);
            assert_eq!(
                decode_all(&mut f, wire, step).unwrap(),
                b"hello world!",
                "{step}"
            );
            assert!(f.is_end());
        }
    }

    #[test]
    fn broken_chunked_bodies_fail() {
        for wire in [
            &b"zz\r\nhello\r\n0\r\n\r\n"[..],
            b"5\r\nhelloX\r\n0\r\n\r\n",
            b"5\nhello\r\n0\r\n\r\n",
            b"11111111111111111\r\n",
            b"5 x\r\nhello\r\n0\r\n\r\n",
        ] {
            let mut f = Framing::Chunked(Chunk::Size);
            assert!(
                decode_all(&mut f, wire, 64).is_err(),
                "{:?}",
                String::from_utf8_lossy(wire)
            );
        }
        let long = vec![b'1'; MAX_CHUNK_LINE + 10];
        let mut f = Framing::Chunked(Chunk::Size);
        assert!(decode_all(&mut f, &long, 64).is_err());
        // trailers are bounded, however their lines fall on the limit
        for len in [
            MAX_TRAILERS - 3,
            MAX_TRAILERS - 2,
            MAX_TRAILERS - 1,
            MAX_TRAILERS,
        ] {
            let mut wire = b"0\r\n".to_vec();
            wire.extend(std::iter::repeat_n(b'x', len));
            wire.extend_from_slice(b"\r\nx-more: 1\r\n\r\n");
            let mut f = Framing::Chunked(Chunk::Size);
            assert!(decode_all(&mut f, &wire, 4096).is_err(), "{len}");
        }
    }

    #[test]
    fn length_bodies_stop_at_their_length() {
        let mut f = Framing::Length(5);
        let mut buf = BytesMut::from(&b"helloHTTP/1.1"[..]);
        assert_eq!(
            f.decode(&mut buf).unwrap(),
            Step::Data(Bytes::from_static(b"hello"))
        );
        assert_eq!(f.decode(&mut buf).unwrap(), Step::End);
        assert_eq!(&buf[..], b"HTTP/1.1", "the rest stays in the buffer");
    }
}
