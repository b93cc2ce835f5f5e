//! What an answer reports it cost: the usage read from a response header
//! or trailer, or from a JSON answer (the last event of a streamed one),
//! for a route whose cost in a named unit (tokens, say) is known only once
//! the answer exists.
//!
//! At admission the route's estimate is charged; when the answer reports
//! its usage, the difference is charged or given back
//! ([`Store::settle`](paceline_core::Store::settle)). An answer that
//! reports nothing readable (no such field, a value that is not a whole
//! number, a body past [`MAX_USAGE_BYTES`], a compressed body, a stream
//! cut short) leaves the estimate charged.
//!
//! ```
//! use paceline_server::usage::UsageSource;
//!
//! let s: UsageSource = "json:usage.total_tokens".parse().unwrap();
//! assert_eq!(s.read_json(br#"{"usage": {"total_tokens": 1234}}"#), Some(1234));
//! let h: UsageSource = "header:x-usage-tokens".parse().unwrap();
//! assert_eq!(h.to_string(), "header:x-usage-tokens");
//! ```

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::Arc;
use std::task::{Context, Waker};

use http::header::{CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderMap, HeaderName, HeaderValue};
use serde_json::Value;

/// The most bytes of an answer read for its usage: a JSON answer longer
/// than this, or an event of a stream longer than this, reports nothing.
pub const MAX_USAGE_BYTES: usize = 1 << 20;

/// The largest usage read (fifteen digits): a larger value is ignored, as a
/// hostile or broken one.
pub const MAX_USAGE: u64 = 999_999_999_999_999;

/// Where an answer reports what its request cost.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum UsageSource {
    /// A response header holding a whole number (or, when the head has
    /// none, a trailer of the same name).
    Header(HeaderName),
    /// A path into a JSON answer (`usage.total_tokens`; a number as a
    /// segment indexes an array). A `text/event-stream` answer is read
    /// event by event, and the last event holding the path wins.
    Json(JsonPath),
}

/// A dotted path into a JSON document.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JsonPath {
    segments: Vec<String>,
}

/// Why a usage source could not be built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsageSourceError(String);

impl fmt::Display for UsageSourceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageSourceError {}

impl JsonPath {
    /// A path such as `usage.total_tokens`: one or more non-empty
    /// segments separated by dots.
    pub fn new(path: &str) -> Result<JsonPath, UsageSourceError> {
        let segments: Vec<String> = path.split('.').map(str::to_string).collect();
        if path.len() > 256 || segments.len() > 16 || segments.iter().any(|s| s.is_empty()) {
            return Err(UsageSourceError(format!(
                "{path:?} is not a JSON path: give dotted names, such as usage.total_tokens (at most 16 segments)"
            )));
        }
        Ok(JsonPath { segments })
    }

    /// The number at this path of `doc`, if it is a whole number from 0
    /// to [`MAX_USAGE`].
    pub fn find(&self, doc: &Value) -> Option<u64> {
        let mut v = doc;
        for s in &self.segments {
            v = match v {
                Value::Object(m) => m.get(s)?,
                Value::Array(a) => a.get(s.parse::<usize>().ok()?)?,
                _ => return None,
            };
        }
        let n = match v {
            Value::Number(n) => n.as_u64().or_else(|| {
                let f = n.as_f64()?;
                (f >= 0.0 && f.fract() == 0.0 && f <= MAX_USAGE as f64).then_some(f as u64)
            })?,
            _ => return None,
        };
        (n <= MAX_USAGE).then_some(n)
    }
}

impl fmt::Display for JsonPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.segments.join("."))
    }
}

impl UsageSource {
    /// A header (or trailer) named `name`.
    pub fn header(name: &str) -> Result<UsageSource, UsageSourceError> {
        HeaderName::from_bytes(name.as_bytes())
            .map(UsageSource::Header)
            .map_err(|_| UsageSourceError(format!("{name:?} is not a header name")))
    }

    /// A path into a JSON answer.
    pub fn json(path: &str) -> Result<UsageSource, UsageSourceError> {
        JsonPath::new(path).map(UsageSource::Json)
    }

    /// The usage a header value states: a whole number from 0 to
    /// [`MAX_USAGE`], optionally surrounded by spaces; anything else is
    /// none.
    pub fn read_value(v: &HeaderValue) -> Option<u64> {
        let s = v.to_str().ok()?.trim();
        if s.is_empty() || s.len() > 15 || !s.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        s.parse().ok()
    }

    /// The usage `headers` state for a header source: the one value of its
    /// field (several values, or one unreadable, state none).
    pub fn read_headers(&self, headers: &HeaderMap) -> Option<u64> {
        let UsageSource::Header(name) = self else {
            return None;
        };
        let mut all = headers.get_all(name).iter();
        let one = all.next()?;
        match all.next() {
            Some(_) => None,
            None => Self::read_value(one),
        }
    }

    /// The usage a whole JSON answer states, for a JSON source.
    pub fn read_json(&self, body: &[u8]) -> Option<u64> {
        let UsageSource::Json(path) = self else {
            return None;
        };
        let doc: Value = serde_json::from_slice(body).ok()?;
        path.find(&doc)
    }
}

impl FromStr for UsageSource {
    type Err = UsageSourceError;
    /// `header:NAME` or `json:PATH`.
    fn from_str(s: &str) -> Result<UsageSource, UsageSourceError> {
        match s.split_once(':') {
            Some(("header", name)) => UsageSource::header(name),
            Some(("json", path)) => UsageSource::json(path),
            _ => Err(UsageSourceError(format!(
                "{s:?}: give header:NAME or json:PATH"
            ))),
        }
    }
}

impl fmt::Display for UsageSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UsageSource::Header(h) => write!(f, "header:{h}"),
            UsageSource::Json(p) => write!(f, "json:{p}"),
        }
    }
}

/// A future run to its end without anyone waiting for it.
pub(crate) type Detached = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// Runs `fut`: at once when it is ready at its first poll (an in-process
/// store), else on the runtime. `what` names it in the warning logged when
/// there is no runtime to run it on.
pub(crate) fn run_detached(mut fut: Detached, what: &'static str) {
    let mut cx = Context::from_waker(Waker::noop());
    if fut.as_mut().poll(&mut cx).is_pending() {
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(fut);
            }
            Err(_) => tracing::warn!("{what}: no runtime"),
        }
    }
}

/// What settles a request once its usage is known.
pub(crate) type Settler = Box<dyn FnOnce(u64) -> Detached + Send + 'static>;

/// Watches an admitted answer's body for the usage it reports, and settles
/// the request's charge when the body ends (or is dropped: a JSON answer
/// that parsed whole, or the events that came, still count). Made by the
/// limit layer for a route with a usage source; it travels in the
/// answer's [`RateLimitBody`](crate::RateLimitBody).
pub struct Meter {
    source: Arc<UsageSource>,
    read: Read,
    settle: Option<Settler>,
}

enum Read {
    /// A header source whose field was not in the head: its trailer.
    Trailer(Option<u64>),
    /// A JSON answer, whole, unless it outgrew the bound.
    Json { buf: Vec<u8>, over: bool },
    /// An event stream.
    Events(EventScan),
}

impl fmt::Debug for Meter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Meter")
            .field("source", &self.source)
            .field("pending", &self.settle.is_some())
            .finish()
    }
}

impl Meter {
    /// A meter for an answer with `head`, or none when its body cannot
    /// tell (a compressed body is not read).
    pub(crate) fn new(
        source: Arc<UsageSource>,
        head: &HeaderMap,
        settle: Settler,
    ) -> Option<Meter> {
        if let Some(enc) = head.get(CONTENT_ENCODING) {
            if !enc.as_bytes().eq_ignore_ascii_case(b"identity") {
                tracing::debug!(source = %source, "a compressed answer: its usage is not read");
                return None;
            }
        }
        let read = match &*source {
            UsageSource::Header(_) => Read::Trailer(None),
            UsageSource::Json(_) => {
                let events = head.get(CONTENT_TYPE).is_some_and(|t| {
                    t.as_bytes()
                        .get(..17)
                        .is_some_and(|p| p.eq_ignore_ascii_case(b"text/event-stream"))
                });
                if events {
                    Read::Events(EventScan::default())
                } else {
                    let len = head
                        .get(CONTENT_LENGTH)
                        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
                    let over = len.is_some_and(|n| n > MAX_USAGE_BYTES as u64);
                    let cap = len.map_or(0, |n| n.min(MAX_USAGE_BYTES as u64) as usize);
                    Read::Json {
                        buf: Vec::with_capacity(if over { 0 } else { cap }),
                        over,
                    }
                }
            }
        };
        Some(Meter {
            source,
            read,
            settle: Some(settle),
        })
    }

    /// A frame of data.
    pub(crate) fn data(&mut self, d: &[u8]) {
        match (&mut self.read, &*self.source) {
            (Read::Json { buf, over }, _) => {
                if *over || buf.len() + d.len() > MAX_USAGE_BYTES {
                    *over = true;
                    *buf = Vec::new();
                } else {
                    buf.extend_from_slice(d);
                }
            }
            (Read::Events(scan), UsageSource::Json(path)) => scan.feed(path, d),
            _ => {}
        }
    }

    /// The trailers.
    pub(crate) fn trailers(&mut self, t: &HeaderMap) {
        if let Read::Trailer(found) = &mut self.read {
            *found = self.source.read_headers(t);
        }
    }

    /// The body ended (or was dropped): settles with the usage it told,
    /// if it told one.
    pub(crate) fn finish(&mut self) {
        let Some(settle) = self.settle.take() else {
            return;
        };
        let read = std::mem::replace(&mut self.read, Read::Trailer(None));
        let used = match (read, &*self.source) {
            (Read::Trailer(found), _) => found,
            (Read::Json { buf, over: false }, s) => s.read_json(&buf),
            (Read::Json { over: true, .. }, _) => None,
            (Read::Events(scan), UsageSource::Json(path)) => scan.finish(path),
            (Read::Events(_), _) => None,
        };
        match used {
            Some(n) => run_detached(settle(n), "a settle was not made"),
            None => {
                tracing::debug!(source = %self.source, "the answer told no usage; the estimate stands")
            }
        }
    }
}

impl Drop for Meter {
    fn drop(&mut self) {
        self.finish();
    }
}

/// Reads a `text/event-stream` answer event by event, keeping only the
/// unfinished event, and remembers the last usage an event's data stated.
#[derive(Debug, Default)]
pub(crate) struct EventScan {
    tail: Vec<u8>,
    /// The last bytes fed (at most three) since the last event ended: a
    /// blank line may be split across frames.
    prev: Vec<u8>,
    /// The unfinished event outgrew [`MAX_USAGE_BYTES`]: skip to its end.
    skipping: bool,
    found: Option<u64>,
}

impl EventScan {
    pub(crate) fn feed(&mut self, path: &JsonPath, mut chunk: &[u8]) {
        loop {
            // an event ends at a blank line (LF LF, or CR LF CR LF)
            match find_blank(&self.prev, chunk) {
                Some(n) => {
                    let (now, rest) = chunk.split_at(n);
                    if !self.skipping && self.tail.len() + now.len() <= MAX_USAGE_BYTES {
                        self.tail.extend_from_slice(now);
                        if let Some(u) = event_usage(path, &self.tail) {
                            self.found = Some(u);
                        }
                    }
                    self.tail.clear();
                    self.prev.clear();
                    self.skipping = false;
                    chunk = rest;
                }
                None => {
                    if !self.skipping {
                        if self.tail.len() + chunk.len() > MAX_USAGE_BYTES {
                            self.tail.clear();
                            self.skipping = true;
                        } else {
                            self.tail.extend_from_slice(chunk);
                        }
                    }
                    self.prev
                        .extend_from_slice(&chunk[chunk.len().saturating_sub(3)..]);
                    let n = self.prev.len();
                    self.prev.drain(..n.saturating_sub(3));
                    return;
                }
            }
        }
    }

    /// The last usage stated, counting an event the stream ended without
    /// a blank line after.
    pub(crate) fn finish(mut self, path: &JsonPath) -> Option<u64> {
        if !self.skipping {
            if let Some(u) = event_usage(path, &self.tail) {
                self.found = Some(u);
            }
        }
        self.found
    }
}

/// Where in `chunk` the current event ends (the index just past its blank
/// line), if it ends there; `prev` holds the bytes just before the chunk.
fn find_blank(prev: &[u8], chunk: &[u8]) -> Option<usize> {
    let mut seen: Vec<u8> = prev.to_vec();
    for (i, &b) in chunk.iter().enumerate() {
        seen.push(b);
        let n = seen.len();
        if b == b'\n' && n >= 2 {
            if seen[n - 2] == b'\n' {
                return Some(i + 1);
            }
            if n >= 3 && seen[n - 2] == b'\r' && seen[n - 3] == b'\n' {
                return Some(i + 1);
            }
        }
        if n > 8 {
            seen.drain(..n - 3);
        }
    }
    None
}

/// The usage one event's `data` lines state.
fn event_usage(path: &JsonPath, event: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(event).ok()?;
    let mut data = String::new();
    for line in text.lines() {
        let Some(v) = line.strip_prefix("data:") else {
            continue;
        };
        if !data.is_empty() {
            data.push('\n');
        }
        data.push_str(v.strip_prefix(' ').unwrap_or(v));
    }
    let doc: Value = serde_json::from_str(&data).ok()?;
    path.find(&doc)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(p: &str) -> JsonPath {
        JsonPath::new(p).unwrap()
    }

    #[test]
    fn paths_walk_objects_and_arrays_and_take_whole_numbers_only() {
        let doc: Value = serde_json::from_str(
            r#"{"usage": {"total_tokens": 42, "f": 7.0, "half": 2.5, "neg": -1,
                "s": "12", "big": 1000000000000000}, "items": [{"n": 3}]}"#,
        )
        .unwrap();
        assert_eq!(json("usage.total_tokens").find(&doc), Some(42));
        assert_eq!(json("usage.f").find(&doc), Some(7));
        assert_eq!(json("items.0.n").find(&doc), Some(3));
        for bad in [
            "usage.half",
            "usage.neg",
            "usage.s",
            "usage.big",
            "usage",
            "items.1.n",
            "x",
        ] {
            assert_eq!(json(bad).find(&doc), None, "{bad}");
        }
        for bad in ["", "a..b", ".a", "a."] {
            assert!(JsonPath::new(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn header_values_are_whole_numbers_and_duplicates_state_nothing() {
        let s = UsageSource::header("x-usage-tokens").unwrap();
        let mut h = HeaderMap::new();
        assert_eq!(s.read_headers(&h), None);
        h.insert("x-usage-tokens", HeaderValue::from_static(" 1200 "));
        assert_eq!(s.read_headers(&h), Some(1200));
        for bad in ["-1", "1.5", "1e3", "", "12 13", "9999999999999999"] {
            h.insert("x-usage-tokens", HeaderValue::from_str(bad).unwrap());
            assert_eq!(s.read_headers(&h), None, "{bad:?}");
        }
        h.insert("x-usage-tokens", HeaderValue::from_static("5"));
        h.append("x-usage-tokens", HeaderValue::from_static("6"));
        assert_eq!(s.read_headers(&h), None);
    }

    #[test]
    fn sources_parse_and_print() {
        for s in ["header:x-usage", "json:usage.total_tokens"] {
            assert_eq!(s.parse::<UsageSource>().unwrap().to_string(), s);
        }
        assert!("body:x".parse::<UsageSource>().is_err());
        assert!("header:bad name".parse::<UsageSource>().is_err());
    }

    #[test]
    fn a_stream_gives_its_last_usage_whatever_the_frames() {
        let p = json("usage.total_tokens");
        let stream = "data: {\"choices\":[]}\n\n\
                      data: {\"usage\":{\"total_tokens\":10}}\r\n\r\n\
                      event: x\ndata: {\"usage\":\ndata: {\"total_tokens\":37}}\n\n\
                      data: [DONE]\n\n";
        let bytes = stream.as_bytes();
        for size in [1, 2, 3, 5, 7, 64, bytes.len()] {
            let mut scan = EventScan::default();
            for c in bytes.chunks(size) {
                scan.feed(&p, c);
            }
            assert_eq!(scan.finish(&p), Some(37), "frames of {size}");
        }
        // the last event without its blank line still counts
        let mut scan = EventScan::default();
        scan.feed(&p, b"data: {\"usage\":{\"total_tokens\":5}}");
        assert_eq!(scan.finish(&p), Some(5));
    }

    #[test]
    fn a_meter_settles_once_with_what_the_body_told() {
        use std::sync::Mutex;
        let got = Arc::new(Mutex::new(Vec::new()));
        let settler = |got: &Arc<Mutex<Vec<u64>>>| -> Settler {
            let got = got.clone();
            Box::new(move |n| {
                Box::pin(async move {
                    got.lock().unwrap().push(n);
                })
            })
        };
        let none = HeaderMap::new();
        // a trailer of the header's name, once, whatever follows
        let header = Arc::new(UsageSource::header("x-used").unwrap());
        let mut m = Meter::new(header, &none, settler(&got)).unwrap();
        m.data(b"hello");
        let mut t = HeaderMap::new();
        t.insert("x-used", HeaderValue::from_static("42"));
        m.trailers(&t);
        m.finish();
        drop(m);
        // a JSON answer in two frames, its meter dropped once it is whole
        let json = Arc::new(UsageSource::json("usage.total_tokens").unwrap());
        let mut m = Meter::new(json.clone(), &none, settler(&got)).unwrap();
        m.data(b"{\"usage\":{\"total");
        m.data(b"_tokens\":7}}");
        drop(m);
        // a body cut short, or longer than the bound, tells nothing
        let mut m = Meter::new(json.clone(), &none, settler(&got)).unwrap();
        m.data(b"{\"usage\":{\"total_tokens\":9");
        drop(m);
        let mut long = HeaderMap::new();
        long.insert(
            CONTENT_LENGTH,
            HeaderValue::from(MAX_USAGE_BYTES as u64 + 1),
        );
        let mut m = Meter::new(json.clone(), &long, settler(&got)).unwrap();
        m.data(b"{\"usage\":{\"total_tokens\":11}}");
        drop(m);
        // a compressed answer is not read at all
        let mut gz = HeaderMap::new();
        gz.insert(CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        assert!(Meter::new(json, &gz, settler(&got)).is_none());
        assert_eq!(*got.lock().unwrap(), vec![42, 7]);
    }

    #[test]
    fn an_event_past_the_bound_is_skipped_and_the_next_read() {
        let p = json("usage.total_tokens");
        let mut scan = EventScan::default();
        scan.feed(&p, b"data: ");
        let big = vec![b'x'; MAX_USAGE_BYTES];
        scan.feed(&p, &big);
        scan.feed(&p, b"\n\ndata: {\"usage\":{\"total_tokens\":9}}\n\n");
        assert_eq!(scan.finish(&p), Some(9));
        assert!(scan_len_bounded());
    }

    fn scan_len_bounded() -> bool {
        let p = json("a");
        let mut scan = EventScan::default();
        for _ in 0..4 {
            scan.feed(&p, &vec![b'y'; MAX_USAGE_BYTES / 2]);
        }
        scan.tail.len() <= MAX_USAGE_BYTES
    }
}
