//! [`RedisIdempotencyStore`]: the idempotency layer's store in Redis, so a
//! retry that lands on another instance finds the first answer.
//!
//! One Redis key per entry, `<prefix>:idem:{<keyed hash>}`: the hash (under
//! a secret of its own) covers the entry key, which is itself the caller,
//! the route and the `Idempotency-Key`, so none of them appears in Redis;
//! the braces make it the key's hash tag (Cluster: one slot per entry).
//!
//! The value is a lease (`L`, a random token and the head's digest) or an
//! answer (`D`, the fingerprint and the stored answer, encoded below).
//! Every step is one round trip: `begin`, `complete` and `release` are
//! one small script each step (the same script, by its digest), `fetch`
//! is a `GET`, and `expire` sends nothing: leases and answers carry
//! their time as `PX`, so Redis drops them itself, on its own clock
//! (instances with skewed clocks agree). Each call is cut at a deadline
//! and fails as unavailable, which the layer answers with 503.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use redis::Value;

use paceline_core::{Nanos, StoreError};
use paceline_server::idempotency::{
    Begin, Completed, Entry, EntryKey, Fingerprint, IdempotencySettings, IdempotencyStore,
    StoredAnswer, DEFAULT_MAX_ANSWER_BYTES,
};

use crate::config::RedisStoreConfig;
use crate::keys::KeyNamer;
use crate::link::Link;
use crate::ConfigError;

/// The default deadline of one idempotency step: 250 ms (longer than a
/// limiter decision's: an answer to store may be a few hundred KiB).
pub const DEFAULT_IDEMPOTENCY_DEADLINE: Duration = Duration::from_millis(250);

/// What an encoded answer may take besides its body: its status, its
/// fingerprint and its header fields.
pub const ANSWER_HEAD_ROOM: usize = 64 * 1024;

/// The script of `begin`, `complete` and `release`.
///
/// `KEYS[1]` the entry; `ARGV[1]` the step: `B` (ARGV 2: the lease value,
/// 3: its ms) answers what the key holds, or takes it and answers nil;
/// `C` (2: the lease's prefix, 3: the answer, 4: its ms) and `R` (2: the
/// lease's prefix) answer 1 when the lease was still held, else 0.
const SCRIPT: &str = r"
local v = redis.call('GET', KEYS[1])
local step = ARGV[1]
if step == 'B' then
  if v then return v end
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return false
end
if not v or string.sub(v, 1, string.len(ARGV[2])) ~= ARGV[2] then return 0 end
if step == 'C' then
  redis.call('SET', KEYS[1], ARGV[3], 'PX', ARGV[4])
  return 1
end
if step == 'R' then
  redis.call('DEL', KEYS[1])
  return 1
end
return redis.error_reply('paceline idempotency: unknown step')
";

/// The idempotency layer's [`IdempotencyStore`] in Redis; clones share
/// the connections.
#[derive(Clone)]
pub struct RedisIdempotencyStore {
    inner: Arc<Inner>,
}

struct Inner {
    link: Arc<Link>,
    namer: KeyNamer,
    sha: String,
    deadline: Duration,
    max_value_bytes: usize,
}

impl std::fmt::Debug for RedisIdempotencyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisIdempotencyStore")
            .field("deadline", &self.inner.deadline)
            .field("max_value_bytes", &self.inner.max_value_bytes)
            .finish_non_exhaustive()
    }
}

impl RedisIdempotencyStore {
    /// Connects with `config` (its URLs, cluster mode, connections,
    /// prefix, idempotency deadline; its `key_secret` names the entries).
    /// Single servers are connected lazily. Call inside a Tokio runtime.
    pub async fn connect(config: RedisStoreConfig) -> Result<RedisIdempotencyStore, ConfigError> {
        config.validate()?;
        let link = Link::connect(&config).await.map_err(|e| ConfigError {
            field: "urls",
            message: e.to_string(),
        })?;
        Ok(RedisIdempotencyStore::on_link(
            Arc::new(link),
            &config.key_secret,
            &config.prefix,
            config.idempotency_deadline,
        ))
    }

    pub(crate) fn on_link(
        link: Arc<Link>,
        secret: &[u8],
        prefix: &str,
        deadline: Duration,
    ) -> RedisIdempotencyStore {
        RedisIdempotencyStore {
            inner: Arc::new(Inner {
                link,
                namer: KeyNamer::new(secret, prefix),
                sha: redis::Script::new(SCRIPT).get_hash().to_string(),
                deadline: deadline.max(Duration::from_millis(1)),
                max_value_bytes: DEFAULT_MAX_ANSWER_BYTES + ANSWER_HEAD_ROOM,
            }),
        }
    }

    fn with(self, f: impl FnOnce(&mut Inner)) -> RedisIdempotencyStore {
        let mut inner = Arc::try_unwrap(self.inner).unwrap_or_else(|a| Inner {
            link: a.link.clone(),
            namer: a.namer.clone(),
            sha: a.sha.clone(),
            deadline: a.deadline,
            max_value_bytes: a.max_value_bytes,
        });
        f(&mut inner);
        RedisIdempotencyStore {
            inner: Arc::new(inner),
        }
    }

    /// The longest one step waits for Redis (at least 1 ms); past it the
    /// step fails as unavailable.
    pub fn with_deadline(self, deadline: Duration) -> RedisIdempotencyStore {
        self.with(|i| i.deadline = deadline.max(Duration::from_millis(1)))
    }

    /// The largest value stored for an answer, in bytes (at least 1 KiB):
    /// an answer larger than it is kept without its body (the request ran
    /// once; a retry is told it cannot be replayed), and without its
    /// header fields if those alone pass it.
    pub fn with_max_value_bytes(self, max: usize) -> RedisIdempotencyStore {
        self.with(|i| i.max_value_bytes = max.max(1024))
    }

    /// Bounded for the layer's `settings`: answers up to their
    /// `max_answer_bytes`, plus [`ANSWER_HEAD_ROOM`] for the rest.
    pub fn for_settings(self, settings: &IdempotencySettings) -> RedisIdempotencyStore {
        let max = settings.max_answer_bytes.saturating_add(ANSWER_HEAD_ROOM);
        self.with_max_value_bytes(max)
    }

    /// The deadline of one step.
    pub fn deadline(&self) -> Duration {
        self.inner.deadline
    }

    /// The largest value stored for an answer.
    pub fn max_value_bytes(&self) -> usize {
        self.inner.max_value_bytes
    }

    /// The Redis key an entry lives under.
    pub fn key_name(&self, key: EntryKey) -> String {
        self.inner.namer.idempotency_name(&key.hex())
    }

    async fn within<T>(
        &self,
        step: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.inner.deadline, step).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::Unavailable(
                "Redis did not answer the idempotency step within the deadline".into(),
            )),
        }
    }

    async fn script(&self, key: EntryKey, args: &[&[u8]]) -> Result<Value, StoreError> {
        let name = self.key_name(key);
        let i = &self.inner;
        self.within(i.link.script(&i.sha, SCRIPT, &name, args))
            .await
    }
}

/// A duration as whole milliseconds, rounded up, at least 1 (`PX 0` is an
/// error).
fn millis(n: Nanos) -> Vec<u8> {
    let ms = n.as_u64().div_ceil(1_000_000).max(1);
    ms.to_string().into_bytes()
}

fn lease_prefix(token: u64) -> [u8; 9] {
    let mut p = [0u8; 9];
    p[0] = b'L';
    p[1..].copy_from_slice(&token.to_be_bytes());
    p
}

fn protocol(what: &str) -> StoreError {
    StoreError::Protocol(format!("idempotency entry: {what}"))
}

/// Encodes an answer: `D`, head (8), body digest (flag, 16), status (2),
/// field count (4), each field (name length 4, name, value length 4,
/// value), body (flag, length 4, bytes). Big-endian throughout.
pub(crate) fn encode(fp: &Fingerprint, answer: &StoredAnswer, keep: Keep) -> Vec<u8> {
    let mut v = Vec::with_capacity(64 + answer.body.as_ref().map_or(0, Bytes::len));
    v.push(b'D');
    v.extend_from_slice(&fp.head.to_be_bytes());
    match fp.body {
        Some(d) => {
            v.push(1);
            v.extend_from_slice(&d.to_be_bytes());
        }
        None => v.push(0),
    }
    v.extend_from_slice(&answer.status.as_u16().to_be_bytes());
    let fields: Vec<_> = match keep {
        Keep::Headers | Keep::All => answer.headers.iter().collect(),
        Keep::Head => Vec::new(),
    };
    v.extend_from_slice(&(fields.len() as u32).to_be_bytes());
    for (k, val) in fields {
        v.extend_from_slice(&(k.as_str().len() as u32).to_be_bytes());
        v.extend_from_slice(k.as_str().as_bytes());
        v.extend_from_slice(&(val.len() as u32).to_be_bytes());
        v.extend_from_slice(val.as_bytes());
    }
    match (&answer.body, keep) {
        (Some(b), Keep::All) => {
            v.push(1);
            v.extend_from_slice(&(b.len() as u32).to_be_bytes());
            v.extend_from_slice(b);
        }
        _ => v.push(0),
    }
    v
}

/// What of an answer is encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Keep {
    /// Everything.
    All,
    /// The status and the fields, not the body.
    Headers,
    /// The status alone.
    Head,
}

/// The value for `done`, within `max` bytes if it can be (the body, then
/// the fields, left out until it fits).
fn encode_bounded(done: &Completed, max: usize) -> Vec<u8> {
    for keep in [Keep::All, Keep::Headers] {
        let v = encode(&done.fingerprint, &done.answer, keep);
        if v.len() <= max {
            return v;
        }
    }
    encode(&done.fingerprint, &done.answer, Keep::Head)
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], StoreError> {
        if self.0.len() < n {
            return Err(protocol("truncated"));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, StoreError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, StoreError> {
        Ok(u16::from_be_bytes(self.take(2)?.try_into().expect("2")))
    }
    fn u32(&mut self) -> Result<u32, StoreError> {
        Ok(u32::from_be_bytes(self.take(4)?.try_into().expect("4")))
    }
    fn u64(&mut self) -> Result<u64, StoreError> {
        Ok(u64::from_be_bytes(self.take(8)?.try_into().expect("8")))
    }
    fn u128(&mut self) -> Result<u128, StoreError> {
        Ok(u128::from_be_bytes(self.take(16)?.try_into().expect("16")))
    }
    fn bytes(&mut self) -> Result<&'a [u8], StoreError> {
        let n = self.u32()? as usize;
        self.take(n)
    }
}

/// Reads a value back into an entry.
pub(crate) fn decode(v: &[u8]) -> Result<Entry, StoreError> {
    let mut r = Reader(v);
    match r.u8()? {
        b'L' => {
            let _token = r.u64()?;
            let head = r.u64()?;
            Ok(Entry::InFlight { head })
        }
        b'D' => {
            let head = r.u64()?;
            let body = match r.u8()? {
                0 => None,
                _ => Some(r.u128()?),
            };
            let status =
                StatusCode::from_u16(r.u16()?).map_err(|_| protocol("status out of range"))?;
            let n = r.u32()? as usize;
            // each field takes at least 8 bytes: a count past that is bad
            if n > r.0.len() / 8 {
                return Err(protocol("field count"));
            }
            let mut headers = HeaderMap::with_capacity(n);
            for _ in 0..n {
                let name =
                    HeaderName::from_bytes(r.bytes()?).map_err(|_| protocol("field name"))?;
                let value =
                    HeaderValue::from_bytes(r.bytes()?).map_err(|_| protocol("field value"))?;
                headers.append(name, value);
            }
            let answer_body = match r.u8()? {
                0 => None,
                _ => Some(Bytes::copy_from_slice(r.bytes()?)),
            };
            if !r.0.is_empty() {
                return Err(protocol("trailing bytes"));
            }
            Ok(Entry::Done(Arc::new(Completed {
                fingerprint: Fingerprint { head, body },
                answer: StoredAnswer {
                    status,
                    headers,
                    body: answer_body,
                },
            })))
        }
        _ => Err(protocol("unknown kind")),
    }
}

fn entry_of(v: Value) -> Result<Option<Entry>, StoreError> {
    match v {
        Value::Nil => Ok(None),
        Value::BulkString(b) => decode(&b).map(Some),
        other => Err(StoreError::Protocol(format!("unexpected reply {other:?}"))),
    }
}

fn held(v: Value) -> Result<bool, StoreError> {
    match v {
        Value::Int(1) => Ok(true),
        Value::Int(0) => Ok(false),
        other => Err(StoreError::Protocol(format!("unexpected reply {other:?}"))),
    }
}

impl IdempotencyStore for RedisIdempotencyStore {
    async fn begin(
        &self,
        key: EntryKey,
        head: u64,
        lease: Nanos,
        _now: Nanos,
    ) -> Result<Begin, StoreError> {
        // random: tokens of every instance meet in one Redis
        let token: u64 = rand::random();
        let mut value = lease_prefix(token).to_vec();
        value.extend_from_slice(&head.to_be_bytes());
        let ms = millis(lease);
        let reply = self.script(key, &[b"B", &value, &ms]).await?;
        match entry_of(reply)? {
            None => Ok(Begin::Acquired(token)),
            Some(e) => Ok(Begin::Existing(e)),
        }
    }

    async fn complete(
        &self,
        key: EntryKey,
        token: u64,
        done: Completed,
        ttl: Nanos,
        _now: Nanos,
    ) -> Result<bool, StoreError> {
        let value = encode_bounded(&done, self.inner.max_value_bytes);
        let ms = millis(ttl);
        let reply = self
            .script(key, &[b"C", &lease_prefix(token), &value, &ms])
            .await?;
        held(reply)
    }

    async fn fetch(&self, key: EntryKey, _now: Nanos) -> Result<Option<Entry>, StoreError> {
        let mut get = redis::cmd("GET");
        get.arg(self.key_name(key));
        let reply = self.within(self.inner.link.command(&get)).await?;
        entry_of(reply)
    }

    async fn release(&self, key: EntryKey, token: u64) -> Result<(), StoreError> {
        let reply = self.script(key, &[b"R", &lease_prefix(token)]).await?;
        held(reply).map(|_| ())
    }

    async fn expire(&self, _now: Nanos) -> Result<u64, StoreError> {
        // Redis expires every entry by its PX
        Ok(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(body: Option<&'static [u8]>) -> Completed {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        headers.append("x-a", HeaderValue::from_static("1"));
        headers.append("x-a", HeaderValue::from_static("2"));
        Completed {
            fingerprint: Fingerprint {
                head: 7,
                body: Some(u128::MAX - 3),
            },
            answer: StoredAnswer {
                status: StatusCode::CREATED,
                headers,
                body: body.map(Bytes::from_static),
            },
        }
    }

    #[test]
    fn answers_round_trip() {
        for d in [done(Some(b"{\"label_id\":\"lbl_1\"}")), done(None)] {
            let v = encode(&d.fingerprint, &d.answer, Keep::All);
            assert_eq!(decode(&v).unwrap(), Entry::Done(Arc::new(d)));
        }
        let mut lease = lease_prefix(9).to_vec();
        lease.extend_from_slice(&42u64.to_be_bytes());
        assert_eq!(decode(&lease).unwrap(), Entry::InFlight { head: 42 });
    }

    #[test]
    fn bad_values_are_protocol_errors_not_panics() {
        let v = encode(
            &done(Some(b"x")).fingerprint,
            &done(Some(b"x")).answer,
            Keep::All,
        );
        for cut in 0..v.len() {
            assert!(matches!(decode(&v[..cut]), Err(StoreError::Protocol(_))));
        }
        let mut extra = v.clone();
        extra.push(0);
        assert!(decode(&extra).is_err());
        assert!(decode(b"Zwhatever").is_err());
        let mut huge = v[..28].to_vec();
        huge.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(decode(&huge).is_err());
    }

    #[test]
    fn large_answers_lose_their_body_then_their_fields() {
        let body: &'static [u8] = Box::leak(vec![b'x'; 4000].into_boxed_slice());
        let d = done(Some(body));
        let all = encode_bounded(&d, 10_000);
        assert!(all.len() > 4000);
        let Entry::Done(c) = decode(&encode_bounded(&d, 1024)).unwrap() else {
            panic!("an answer")
        };
        assert_eq!(c.answer.body, None);
        assert_eq!(c.answer.headers.len(), 3);
        assert_eq!(c.answer.status, StatusCode::CREATED);
        let Entry::Done(c) = decode(&encode_bounded(&d, 10)).unwrap() else {
            panic!("an answer")
        };
        assert!(c.answer.headers.is_empty());
        assert_eq!(c.fingerprint, d.fingerprint);
    }

    #[test]
    fn durations_round_up_to_a_millisecond() {
        assert_eq!(millis(Nanos::new(1)), b"1");
        assert_eq!(millis(Nanos::ZERO), b"1");
        assert_eq!(millis(Nanos::from_millis(1500)), b"1500");
        assert_eq!(millis(Nanos::new(1_000_001)), b"2");
    }
}
