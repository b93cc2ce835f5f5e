//! What makes two requests "the same": the key's scope (caller, route,
//! key) as the store's entry key, and the request's fingerprint (method,
//! target, a digest of the body).
//!
//! The body is digested while it streams to the upstream
//! ([`DigestBody`]), so the first execution keeps its streaming and reads
//! the body once; past the configured size the body fails, and the layer
//! answers `413`. A retry's body is digested the same way before it is
//! compared ([`digest_body`]), and never sent anywhere.
//!
//! Hashes are SipHash-1-3 (128 bits) under fixed keys, so every process
//! sharing a store computes the same entry key for the same scope.

use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::Method;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use siphasher::sip128::{Hasher128, SipHasher13};

/// A boxed error, as request bodies fail.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

const K0: u64 = 0x6964_656d_706f_7465;
const K1: u64 = 0x6e63_792d_6b65_7921;

fn hasher() -> SipHasher13 {
    SipHasher13::new_with_keys(K0, K1)
}

/// Writes `s` with its length first, so that no two tuples of strings hash
/// the same by moving a boundary.
fn put(h: &mut SipHasher13, s: &[u8]) {
    use std::hash::Hasher;
    h.write_u64(s.len() as u64);
    h.write(s);
}

/// The hash of a scope (`caller` on `route`), to be finished with a key.
pub(crate) fn scope_hasher(caller: &str, route: &str) -> SipHasher13 {
    let mut h = hasher();
    put(&mut h, caller.as_bytes());
    put(&mut h, route.as_bytes());
    h
}

/// The entry a key is stored under: its caller, its route and the key
/// itself, hashed. Two callers with the same key string never meet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EntryKey(pub u128);

impl EntryKey {
    /// The entry of `key` sent by `caller` on `route`.
    pub fn of(caller: &str, route: &str, key: &str) -> EntryKey {
        EntryKey::finish(scope_hasher(caller, route), key)
    }

    /// The entry of `key` in the scope hashed so far.
    pub(crate) fn finish(mut h: SipHasher13, key: &str) -> EntryKey {
        put(&mut h, key.as_bytes());
        EntryKey(h.finish128().as_u128())
    }

    /// The entry key as 32 lowercase hex digits (for a store that keys by
    /// string, such as Redis).
    pub fn hex(&self) -> String {
        format!("{:032x}", self.0)
    }
}

/// A request's fingerprint: its head (method and target) and its body.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Fingerprint {
    /// The method and path (with the query).
    pub head: u64,
    /// The body's digest; `None` when the answer came before the body
    /// was read to its end (a service that ignores it), and a retry is
    /// matched by its head alone.
    pub body: Option<u128>,
}

/// The head half of a fingerprint: the method and the path with its query.
pub(crate) fn head_digest(method: &Method, path_and_query: &str) -> u64 {
    let mut h = hasher();
    put(&mut h, method.as_str().as_bytes());
    put(&mut h, path_and_query.as_bytes());
    h.finish128().h1
}

/// How a digested body ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BodyEnd {
    /// Read to its end: its digest.
    Complete(u128),
    /// Larger than allowed: failed at the bound.
    TooLarge,
    /// The body failed (the client went away, say).
    Failed,
}

/// The error a [`DigestBody`] fails with past its bound.
#[derive(Debug)]
pub struct BodyTooLarge {
    /// The bound in bytes.
    pub limit: u64,
}

impl std::fmt::Display for BodyTooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "request body larger than {} bytes", self.limit)
    }
}

impl std::error::Error for BodyTooLarge {}

/// The running digest of a body.
struct Digest {
    hasher: SipHasher13,
    read: u64,
    limit: u64,
    end: Arc<OnceLock<BodyEnd>>,
}

impl Digest {
    fn finish(&mut self) {
        let d = self.hasher.finish128().as_u128();
        let _ = self.end.set(BodyEnd::Complete(d));
    }
}

pin_project! {
    /// A request body on its way to the inner service: passed through as
    /// it is, or digested as it streams (with its size bounded), the
    /// digest written where the layer reads it when the answer comes.
    pub struct DigestBody<B> {
        #[pin]
        inner: B,
        digest: Option<Box<Digest>>,
    }
}

impl<B: std::fmt::Debug> std::fmt::Debug for DigestBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DigestBody")
            .field("inner", &self.inner)
            .field("digested", &self.digest.is_some())
            .finish()
    }
}

impl<B: Body> DigestBody<B> {
    /// `inner`, untouched.
    pub(crate) fn pass(inner: B) -> Self {
        DigestBody {
            inner,
            digest: None,
        }
    }

    /// `inner`, digested into `end` and failing past `limit` bytes.
    pub(crate) fn digested(inner: B, limit: u64, end: Arc<OnceLock<BodyEnd>>) -> Self {
        let mut digest = Box::new(Digest {
            hasher: hasher(),
            read: 0,
            limit,
            end,
        });
        // a body that is empty from the start is never polled
        if inner.is_end_stream() {
            digest.finish();
        }
        DigestBody {
            inner,
            digest: Some(digest),
        }
    }

    /// The body underneath.
    pub fn into_inner(self) -> B {
        self.inner
    }
}

impl<B> Body for DigestBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        let Some(d) = this.digest.as_deref_mut() else {
            return this.inner.poll_frame(cx).map_err(Into::into);
        };
        if d.end.get() == Some(&BodyEnd::TooLarge) {
            return Poll::Ready(Some(Err(Box::new(BodyTooLarge { limit: d.limit }))));
        }
        match this.inner.as_mut().poll_frame(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(None) => {
                d.finish();
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) => {
                let _ = d.end.set(BodyEnd::Failed);
                Poll::Ready(Some(Err(e.into())))
            }
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    d.read += data.len() as u64;
                    if d.read > d.limit {
                        let _ = d.end.set(BodyEnd::TooLarge);
                        return Poll::Ready(Some(Err(Box::new(BodyTooLarge { limit: d.limit }))));
                    }
                    std::hash::Hasher::write(&mut d.hasher, data);
                }
                // a reader that stops at `is_end_stream` never polls the
                // end: the digest is written with the last frame
                if this.inner.is_end_stream() {
                    d.finish();
                }
                Poll::Ready(Some(Ok(frame)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Reads a retry's body to its end, at most `limit` bytes, giving its
/// digest (`Err(BodyEnd::TooLarge)` past the bound, `Err(BodyEnd::Failed)`
/// if it fails).
pub(crate) async fn digest_body<B>(body: B, limit: u64) -> Result<u128, BodyEnd>
where
    B: Body<Data = Bytes>,
{
    let mut body = std::pin::pin!(body);
    let mut h = hasher();
    let mut read = 0u64;
    loop {
        if body.is_end_stream() {
            break;
        }
        match std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
            None => break,
            Some(Err(_)) => return Err(BodyEnd::Failed),
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    read += data.len() as u64;
                    if read > limit {
                        return Err(BodyEnd::TooLarge);
                    }
                    std::hash::Hasher::write(&mut h, data);
                }
            }
        }
    }
    Ok(h.finish128().as_u128())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Full};
    use std::collections::VecDeque;

    /// A body in the given chunks, with no length announced.
    struct Chunks(VecDeque<&'static str>);

    impl Body for Chunks {
        type Data = Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            Poll::Ready(
                self.0
                    .pop_front()
                    .map(|c| Ok(Frame::data(Bytes::from_static(c.as_bytes())))),
            )
        }
    }

    fn chunks(parts: &[&'static str]) -> Chunks {
        Chunks(parts.iter().copied().collect())
    }

    #[tokio::test]
    async fn the_digest_does_not_depend_on_how_the_body_is_cut() {
        let end = Arc::new(OnceLock::new());
        let b = DigestBody::digested(chunks(&["hello", " ", "world"]), 100, end.clone());
        let got = b.collect().await.unwrap().to_bytes();
        assert_eq!(got, "hello world");
        let whole = digest_body(Full::new(Bytes::from_static(b"hello world")), 100)
            .await
            .unwrap();
        assert_eq!(*end.get().unwrap(), BodyEnd::Complete(whole));
        let other = digest_body(chunks(&["hello worle"]), 100).await.unwrap();
        assert_ne!(whole, other);
    }

    #[tokio::test]
    async fn a_body_past_its_bound_fails_there() {
        let end = Arc::new(OnceLock::new());
        let b = DigestBody::digested(chunks(&["12345", "67890", "x"]), 10, end.clone());
        let err = b.collect().await.unwrap_err();
        assert!(err.is::<BodyTooLarge>());
        assert_eq!(*end.get().unwrap(), BodyEnd::TooLarge);
        assert_eq!(
            digest_body(chunks(&["12345", "67890", "x"]), 10).await,
            Err(BodyEnd::TooLarge)
        );
        // exactly at the bound passes
        assert!(digest_body(chunks(&["12345", "67890"]), 10).await.is_ok());
    }

    #[tokio::test]
    async fn an_empty_body_is_digested_without_being_polled() {
        let end = Arc::new(OnceLock::new());
        let _b = DigestBody::digested(Full::new(Bytes::new()), 10, end.clone());
        let empty = digest_body(Full::new(Bytes::new()), 10).await.unwrap();
        assert_eq!(*end.get().unwrap(), BodyEnd::Complete(empty));
    }

    #[test]
    fn scopes_do_not_meet() {
        let a = EntryKey::of("sk_a", "/v1/labels", "k1");
        assert_ne!(a, EntryKey::of("sk_b", "/v1/labels", "k1"));
        assert_ne!(a, EntryKey::of("sk_a", "/v1/other", "k1"));
        assert_ne!(a, EntryKey::of("sk_a", "/v1/labels", "k2"));
        // a moved boundary is another scope
        assert_ne!(EntryKey::of("ab", "c", "k"), EntryKey::of("a", "bc", "k"));
        assert_eq!(a, EntryKey::of("sk_a", "/v1/labels", "k1"));
        assert_eq!(a.hex().len(), 32);
    }
}
