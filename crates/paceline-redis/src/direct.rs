//! A connection the calling task reads and writes itself, for a call that
//! finds it free (a lone caller, above all).
//!
//! Why: the client library's multiplexed connection does its I/O in a
//! task of its own, so every call is two hand-offs between tasks (the
//! request to that task, the reply back), each a wake-up of another
//! thread. With many callers that is shared by a batch; a lone caller
//! pays it on every decision, and its CPU per decision was several times
//! the round trip's. Here the caller writes the command and reads the
//! reply on its own task: one wake-up, by the socket.
//!
//! What it speaks: RESP2, the replies the Lua step and the server give
//! (integers, bulk and simple strings, arrays, errors, nulls). A plain
//! `redis://` server only (no TLS, no cluster); it logs in and selects
//! the database as the URL says. It is an optimisation, never the only
//! way: whatever it cannot do (busy, not connected, an error that needs
//! the library loaded) falls back to the multiplexed connection.
//!
//! It rests (every call goes the usual way) from the start and after any
//! failure, a call cut off by its deadline included, until a call the
//! usual way succeeds: so the multiplexed connection has found a server
//! that came back (and made its own connection anew) before this one is
//! made again, and a server that hangs is not sent a new connection's
//! command at every call (each would run when it wakes, late).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::{Buf, BytesMut};
use redis::{Cmd, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Mutex;

/// The largest reply read (a batch's reply is a few KiB): past it the
/// connection is dropped.
const MAX_REPLY: usize = 16 << 20;

/// What a direct call came to.
pub(crate) enum Direct {
    /// The reply.
    Value(Value),
    /// The server answered an error (its text).
    Error(String),
    /// Not sent: go the usual way.
    Skip,
    /// Sent, and the connection failed before the whole reply came: the
    /// command may have run, so it must not be sent again.
    Failed,
}

struct Conn {
    stream: TcpStream,
    buf: BytesMut,
}

/// One direct connection, made on first use and again after a failure.
pub(crate) struct DirectLink {
    addr: String,
    login: Vec<Cmd>,
    connect_timeout: Duration,
    conn: Mutex<Option<Conn>>,
    /// Calls go the usual way (see the module's notes).
    resting: AtomicBool,
    /// A connection that could not be made (refused, timed out, its
    /// login refused) is not tried again before then: the usual way
    /// serves meanwhile, without a connection attempt on every call.
    connect_after: parking_lot::Mutex<Option<tokio::time::Instant>>,
}

/// How long a direct connection that could not be made is not tried.
const CONNECT_PAUSE: Duration = Duration::from_secs(5);

/// Sets the link resting when dropped, unless disarmed: a call dropped
/// half way (its deadline) rests it as a failure does.
struct RestOnDrop<'a>(Option<&'a AtomicBool>);

impl Drop for RestOnDrop<'_> {
    fn drop(&mut self) {
        if let Some(r) = self.0 {
            r.store(true, Ordering::Relaxed);
        }
    }
}

impl DirectLink {
    /// For a plain `redis://` URL; `None` for anything else.
    pub(crate) fn new(url: &str, connect_timeout: Duration) -> Option<DirectLink> {
        let info = redis::IntoConnectionInfo::into_connection_info(url).ok()?;
        let redis::ConnectionAddr::Tcp(host, port) = info.addr() else {
            return None;
        };
        let r = info.redis_settings();
        let mut login = Vec::new();
        if let Some(pw) = r.password() {
            let mut auth = redis::cmd("AUTH");
            if let Some(user) = r.username() {
                auth.arg(user);
            }
            auth.arg(pw);
            login.push(auth);
        }
        if r.db() != 0 {
            let mut select = redis::cmd("SELECT");
            select.arg(r.db());
            login.push(select);
        }
        Some(DirectLink {
            addr: format!("{host}:{port}"),
            login,
            connect_timeout,
            conn: Mutex::new(None),
            resting: AtomicBool::new(true),
            connect_after: parking_lot::Mutex::new(None),
        })
    }

    /// A call the usual way succeeded: the next call may go directly.
    pub(crate) fn wake(&self) {
        if self.resting.load(Ordering::Relaxed) {
            self.resting.store(false, Ordering::Relaxed);
        }
    }

    /// Sends `cmd` and reads its reply, if the connection is free (else
    /// [`Direct::Skip`] at once). A call dropped half way (its deadline)
    /// leaves the connection to be made again.
    pub(crate) async fn query(&self, cmd: &Cmd) -> Direct {
        if self.resting.load(Ordering::Relaxed) {
            return Direct::Skip;
        }
        let Ok(mut slot) = self.conn.try_lock() else {
            return Direct::Skip;
        };
        // resting if this call fails or is dropped half way
        let mut guard = RestOnDrop(Some(&self.resting));
        let mut conn = match slot.take() {
            Some(c) => c,
            None => {
                let now = tokio::time::Instant::now();
                if self.connect_after.lock().is_some_and(|t| now < t) {
                    guard.0 = None;
                    return Direct::Skip;
                }
                match self.connect().await {
                    Some(c) => c,
                    None => {
                        *self.connect_after.lock() = Some(now + CONNECT_PAUSE);
                        return Direct::Skip;
                    }
                }
            }
        };
        // taken out while in use: a call cut short leaves `None`
        match exchange(&mut conn, &cmd.get_packed_command()).await {
            Some(r) => {
                *slot = Some(conn);
                guard.0 = None;
                r
            }
            None => Direct::Failed,
        }
    }

    async fn connect(&self) -> Option<Conn> {
        let stream = tokio::time::timeout(self.connect_timeout, TcpStream::connect(&self.addr))
            .await
            .ok()?
            .ok()?;
        stream.set_nodelay(true).ok()?;
        let mut conn = Conn {
            stream,
            buf: BytesMut::with_capacity(4096),
        };
        for cmd in &self.login {
            match exchange(&mut conn, &cmd.get_packed_command()).await? {
                Direct::Value(_) => {}
                _ => return None,
            }
        }
        Some(conn)
    }
}

/// Writes `packed` and reads one reply; `None` when the connection failed.
async fn exchange(conn: &mut Conn, packed: &[u8]) -> Option<Direct> {
    conn.stream.write_all(packed).await.ok()?;
    loop {
        match parse(&conn.buf) {
            Ok(Some((v, used))) => {
                conn.buf.advance(used);
                return Some(v);
            }
            Ok(None) if conn.buf.len() < MAX_REPLY => {}
            _ => return None,
        }
        conn.buf.reserve(4096);
        if conn.stream.read_buf(&mut conn.buf).await.ok()? == 0 {
            return None;
        }
    }
}

/// One RESP2 reply from the front of `b`, and the bytes it took; `None`
/// when more must be read.
fn parse(b: &[u8]) -> Result<Option<(Direct, usize)>, ()> {
    let mut at = 0;
    match value(b, &mut at, 0)? {
        Some(Ok(v)) => Ok(Some((Direct::Value(v), at))),
        Some(Err(e)) => Ok(Some((Direct::Error(e), at))),
        None => Ok(None),
    }
}

/// A line from `at` (without its CRLF), `at` moved past it.
fn line<'a>(b: &'a [u8], at: &mut usize) -> Option<&'a [u8]> {
    let rest = &b[*at..];
    let end = rest.windows(2).position(|w| w == b"\r\n")?;
    *at += end + 2;
    Some(&rest[..end])
}

fn number(s: &[u8]) -> Result<i64, ()> {
    std::str::from_utf8(s)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or(())
}

type Parsed = Option<Result<Value, String>>;

fn value(b: &[u8], at: &mut usize, depth: usize) -> Result<Parsed, ()> {
    if depth > 8 {
        return Err(());
    }
    let Some(&kind) = b.get(*at) else {
        return Ok(None);
    };
    *at += 1;
    let Some(l) = line(b, at) else {
        return Ok(None);
    };
    Ok(Some(Ok(match kind {
        b'+' => Value::SimpleString(String::from_utf8_lossy(l).into_owned()),
        b'-' => return Ok(Some(Err(String::from_utf8_lossy(l).into_owned()))),
        b':' => Value::Int(number(l)?),
        b'$' => {
            let n = number(l)?;
            if n < 0 {
                Value::Nil
            } else {
                let n = n as usize;
                if b.len() < *at + n + 2 {
                    return Ok(None);
                }
                let v = b[*at..*at + n].to_vec();
                *at += n + 2;
                Value::BulkString(v)
            }
        }
        b'*' => {
            let n = number(l)?;
            if n < 0 {
                Value::Nil
            } else {
                let mut items = Vec::with_capacity((n as usize).min(4096));
                for _ in 0..n {
                    match value(b, at, depth + 1)? {
                        Some(Ok(v)) => items.push(v),
                        // an error inside an array: the whole reply is one
                        Some(Err(e)) => return Ok(Some(Err(e))),
                        None => return Ok(None),
                    }
                }
                Value::Array(items)
            }
        }
        _ => return Err(()),
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn whole(b: &[u8]) -> Direct {
        let (d, used) = parse(b).unwrap().unwrap();
        assert_eq!(used, b.len());
        d
    }

    #[test]
    fn replies_are_read_whole_or_not_at_all() {
        let reply = b"*4\r\n:1\r\n$3\r\nabc\r\n*-1\r\n+OK\r\n";
        match whole(reply) {
            Direct::Value(Value::Array(v)) => assert_eq!(
                v,
                [
                    Value::Int(1),
                    Value::BulkString(b"abc".to_vec()),
                    Value::Nil,
                    Value::SimpleString("OK".into())
                ]
            ),
            _ => panic!("an array"),
        }
        // every cut short asks for more
        for n in 0..reply.len() {
            assert!(parse(&reply[..n]).unwrap().is_none(), "{n}");
        }
        match whole(b"-ERR Function not found\r\n") {
            Direct::Error(e) => assert_eq!(e, "ERR Function not found"),
            _ => panic!("an error"),
        }
        assert!(parse(b"?what\r\n").is_err());
        assert!(parse(b":12x\r\n").is_err());
    }
}
