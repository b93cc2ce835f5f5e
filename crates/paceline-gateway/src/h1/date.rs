//! The `Date` field of the answers a connection writes, formatted once a
//! second.

use std::time::{SystemTime, UNIX_EPOCH};

/// The current second's `Date` value.
#[derive(Default)]
pub(crate) struct Date {
    second: u64,
    text: Vec<u8>,
}

impl Date {
    /// The value for now (RFC 9110 §5.6.7's IMF-fixdate).
    pub(crate) fn now(&mut self) -> &[u8] {
        let now = SystemTime::now();
        let s = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        if s != self.second || self.text.is_empty() {
            self.second = s;
            self.text = httpdate::fmt_http_date(now).into_bytes();
        }
        &self.text
    }
}
