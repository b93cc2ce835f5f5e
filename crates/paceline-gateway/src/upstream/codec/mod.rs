//! HTTP/1.1 for the upstream client without I/O: what to write (the
//! request head and the framing of its body) and what was read (the answer
//! head and the body's framing), on byte buffers only. The connection
//! reads and writes; this says what the bytes mean, so it can be tested
//! on any split of them.

mod fields;
mod forwarded;
mod framing;
mod head;
mod hop;
mod request;

pub(crate) use fields::{hyper_head, Version};
pub(crate) use forwarded::Via;
pub(crate) use framing::{Chunk, Framing, Step};
pub(crate) use head::{parse_head, Head, MAX_HEAD};
pub(crate) use hop::strip_hop_by_hop;
pub(crate) use request::{put_data, write_head, BodyFraming, Target};

#[cfg(test)]
mod tests {
    mod props {
        use super::super::*;
        use crate::upstream::error::BodyError;
        use bytes::BytesMut;
        use http::Method;
        use proptest::prelude::*;

        /// Feeds `wire` to `framing` in pieces of the given sizes.
        fn decode_in(
            framing: &mut Framing,
            wire: &[u8],
            sizes: &[usize],
        ) -> Result<(Vec<u8>, Vec<u8>), BodyError> {
            let mut buf = BytesMut::new();
            let mut out = Vec::new();
            let mut fed = 0;
            let mut next = sizes.iter().cycle();
            loop {
                match framing.decode(&mut buf)? {
                    Step::Data(b) => out.extend_from_slice(&b),
                    Step::End => return Ok((out, buf.to_vec())),
                    Step::NeedMore if fed >= wire.len() => return Err(BodyError("short")),
                    Step::NeedMore => {
                        let n = (*next.next().unwrap()).clamp(1, wire.len() - fed);
                        buf.extend_from_slice(&wire[fed..fed + n]);
                        fed += n;
                    }
                }
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            /// Whatever an upstream sends, parsing and decoding answer
            /// without panicking.
            #[test]
            fn hostile_bytes_never_panic(wire in prop::collection::vec(any::<u8>(), 0..600), sizes in prop::collection::vec(1usize..64, 1..8)) {
                for method in [Method::GET, Method::HEAD] {
                    let mut b = BytesMut::from(&wire[..]);
                    let _ = parse_head(&mut b, &method);
                }
                let mut chunked = Framing::Chunked(Chunk::Size);
                let _ = decode_in(&mut chunked, &wire, &sizes);
                // the same bytes after a plausible head
                let mut head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
                head.extend_from_slice(&wire);
                let mut b = BytesMut::from(&head[..]);
                let _ = parse_head(&mut b, &Method::GET);
            }

            /// A chunked body decodes to what was encoded, however it is
            /// split into chunks and reads, and bytes after it stay put.
            #[test]
            fn chunked_bodies_round_trip(
                body in prop::collection::vec(any::<u8>(), 0..2000),
                cuts in prop::collection::vec(1usize..300, 1..10),
                sizes in prop::collection::vec(1usize..100, 1..10),
                ext in any::<bool>(),
            ) {
                let mut wire = Vec::new();
                let mut rest = &body[..];
                let mut cut = cuts.iter().cycle();
                while !rest.is_empty() {
                    let n = (*cut.next().unwrap()).min(rest.len());
                    let ext = if ext { ";name=\"v\"" } else { "" };
                    wire.extend_from_slice(format!("{n:X}{ext}\r\n").as_bytes());
                    wire.extend_from_slice(&rest[..n]);
                    wire.extend_from_slice(b"\r\n");
                    rest = &rest[n..];
                }
                wire.extend_from_slice(b"0\r\nx-sum: 1\r\n\r\nHTTP/1.1 next");
                let mut f = Framing::Chunked(Chunk::Size);
                let (out, left) = decode_in(&mut f, &wire, &sizes).unwrap();
                prop_assert_eq!(out, body);
                prop_assert!(f.is_end());
                prop_assert!(b"HTTP/1.1 next".starts_with(&left), "{:?}", left);
            }

            /// A head is not taken until it is complete, and then it is
            /// the same head wherever the bytes were cut.
            #[test]
            fn heads_wait_for_their_end(cut in 0usize..80) {
                let text: &[u8] = b"HTTP/1.1 201 Created\r\ncontent-length: 4\r\nx-a: b\r\n\r\nbody";
                let cut = cut.min(text.len());
                let mut b = BytesMut::from(&text[..cut]);
                let first = parse_head(&mut b, &Method::POST).unwrap();
                let head_len = text.len() - 4;
                prop_assert_eq!(first.is_some(), cut >= head_len);
                b.extend_from_slice(&text[cut..]);
                let h = match first {
                    Some(h) => h,
                    None => parse_head(&mut b, &Method::POST).unwrap().unwrap(),
                };
                prop_assert_eq!(h.status, 201);
                prop_assert_eq!(h.framing, Framing::Length(4));
                prop_assert_eq!(&h.headers["x-a"], "b");
                prop_assert_eq!(&b[..], b"body");
            }
        }
    }
}
