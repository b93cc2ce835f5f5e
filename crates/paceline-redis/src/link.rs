//! The connections to Redis and the one call a batch makes: `FCALL` of the
//! function library (loaded on demand, reloaded when a restarted server
//! lacks it), or `EVALSHA` with an `EVAL` on `NOSCRIPT`.
//!
//! Connections are multiplexed and reconnect by themselves (the client
//! library's connection manager; the cluster client follows `MOVED` and
//! `ASK`). A call never waits longer than the caller's deadline: the
//! batcher wraps it in a timeout.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, RedisError, Value};

use paceline_core::StoreError;

use crate::config::{redact, RedisStoreConfig, Scripting};
use crate::direct::{Direct, DirectLink};
use crate::script;

#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Conn {
    async fn query(&mut self, cmd: &Cmd) -> Result<Value, RedisError> {
        let v = match self {
            Conn::Single(c) => c.req_packed_command(cmd).await,
            Conn::Cluster(c) => c.req_packed_command(cmd).await,
        }?;
        // an error the server answered comes back as a value
        v.extract_error()
    }
}

pub(crate) struct Link {
    conns: Vec<Conn>,
    /// A connection the caller drives itself, when it is free (a plain
    /// single server only; see `direct.rs`).
    direct: Option<DirectLink>,
    next: AtomicUsize,
    scripting: Scripting,
    /// Functions turned out to be missing on this server: use scripts.
    use_eval: AtomicBool,
    library: String,
    script: String,
    sha: String,
}

fn unavailable(e: &RedisError) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

impl Link {
    pub(crate) async fn connect(config: &RedisStoreConfig) -> Result<Link, StoreError> {
        let mut conns = Vec::with_capacity(config.connections);
        if config.cluster {
            let client = config
                .cluster_builder()
                .connection_timeout(config.connect_timeout)
                .response_timeout(Duration::from_secs(1))
                .retries(2)
                .min_retry_wait(10)
                .max_retry_wait(200)
                .build()
                .map_err(|e| StoreError::Unavailable(e.to_string()))?;
            for _ in 0..config.connections {
                let c =
                    tokio::time::timeout(config.connect_timeout * 4, client.get_async_connection())
                        .await
                        .map_err(|_| StoreError::Unavailable("cluster connect timed out".into()))?
                        .map_err(|e| unavailable(&e))?;
                conns.push(Conn::Cluster(c));
            }
        } else {
            let url = &config.urls[0];
            let client = config
                .client(url)
                .map_err(|e| StoreError::Unavailable(format!("{}: {e}", redact(url))))?;
            let cm = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(config.connect_timeout))
                .set_response_timeout(Some(Duration::from_secs(1)))
                .set_number_of_retries(2)
                .set_min_delay(Duration::from_millis(10))
                .set_max_delay(Duration::from_millis(200));
            for _ in 0..config.connections {
                // lazy: a server that is down at start is not an error; the
                // first calls fail (and each policy's fail mode applies)
                // until it answers
                let c = ConnectionManager::new_lazy_with_config(client.clone(), cm.clone())
                    .map_err(|e| unavailable(&e))?;
                conns.push(Conn::Single(c));
            }
        }
        let direct = match config.cluster {
            true => None,
            false => DirectLink::new(&config.urls[0], config.connect_timeout),
        };
        let script_src = script::script_source(config.scripting == Scripting::EvalInterpreted);
        let sha = redis::Script::new(&script_src).get_hash().to_string();
        Ok(Link {
            conns,
            direct,
            next: AtomicUsize::new(0),
            scripting: config.scripting,
            use_eval: AtomicBool::new(matches!(
                config.scripting,
                Scripting::Eval | Scripting::EvalInterpreted
            )),
            library: script::library_source(),
            script: script_src,
            sha,
        })
    }

    fn conn(&self) -> Conn {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.conns.len();
        self.conns[i].clone()
    }

    /// Runs one batch of `nkeys` keys, whose keys and arguments `fill`
    /// writes (again, if the call has to be sent once more); the reply is
    /// the script's flat array. A lone check may come in the library's
    /// shorter form too (`lone`), taken where functions are used.
    pub(crate) async fn run(
        &self,
        nkeys: usize,
        fill: &(dyn Fn(&mut Cmd) + Sync),
        lone: Option<Lone<'_>>,
    ) -> Result<Vec<Value>, StoreError> {
        if let (Some(lone), false) = (lone, self.use_eval.load(Ordering::Relaxed)) {
            let mut cmd = redis::cmd("FCALL");
            cmd.arg(script::FUNCTION_ONE).arg(1);
            (lone.fill)(&mut cmd);
            if let (Some(d), true) = (&self.direct, lone.direct) {
                match d.query(&cmd).await {
                    Direct::Value(v) => return array(v),
                    // the library to load, or no functions at all: the
                    // usual way knows what to do
                    Direct::Error(e)
                        if e.contains("Function not found") || e.contains("unknown command") => {}
                    Direct::Error(e) => return Err(classify_code(e.split(' ').next(), &e)),
                    Direct::Failed => {
                        return Err(StoreError::Unavailable(
                            "the connection to Redis failed during a call".into(),
                        ))
                    }
                    Direct::Skip => {}
                }
            }
            let mut conn = self.conn();
            match self.run_function(&mut conn, &cmd).await {
                Ok(v) => {
                    if let Some(d) = &self.direct {
                        d.wake();
                    }
                    return array(v);
                }
                // no functions: the script, in the batch's form, below
                Err(e) if self.scripting == Scripting::Auto && no_functions(&e) => {}
                Err(e) => return Err(classify(&e)),
            }
        }
        let mut conn = self.conn();
        let value = if self.use_eval.load(Ordering::Relaxed) {
            self.run_eval(&mut conn, nkeys, fill).await?
        } else {
            let mut cmd = redis::cmd("FCALL");
            cmd.arg(script::FUNCTION).arg(nkeys);
            fill(&mut cmd);
            match self.run_function(&mut conn, &cmd).await {
                Ok(v) => v,
                Err(e) if self.scripting == Scripting::Auto && no_functions(&e) => {
                    tracing::info!("the Redis server has no functions: using scripts");
                    self.use_eval.store(true, Ordering::Relaxed);
                    self.run_eval(&mut conn, nkeys, fill).await?
                }
                Err(e) => return Err(classify(&e)),
            }
        };
        array(value)
    }

    /// Sends a call of the function library (`FCALL`), loading the
    /// library first when the server lacks it.
    async fn run_function(&self, conn: &mut Conn, cmd: &Cmd) -> Result<Value, RedisError> {
        match conn.query(cmd).await {
            Err(e) if function_missing(&e) => {
                // a new or restarted server: load the library, once more
                tracing::info!("loading the paceline function library");
                metrics::counter!("paceline_redis_library_loads_total").increment(1);
                let mut load = redis::cmd("FUNCTION");
                load.arg("LOAD").arg("REPLACE").arg(&self.library);
                conn.query(&load).await?;
                conn.query(cmd).await
            }
            other => other,
        }
    }

    async fn run_eval(
        &self,
        conn: &mut Conn,
        nkeys: usize,
        fill: &(dyn Fn(&mut Cmd) + Sync),
    ) -> Result<Value, StoreError> {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&self.sha).arg(nkeys);
        fill(&mut cmd);
        match conn.query(&cmd).await {
            Err(e) if e.code() == Some("NOSCRIPT") => {
                metrics::counter!("paceline_redis_library_loads_total").increment(1);
                let mut eval = redis::cmd("EVAL");
                eval.arg(&self.script).arg(nkeys);
                fill(&mut eval);
                conn.query(&eval).await.map_err(|e| classify(&e))
            }
            other => other.map_err(|e| classify(&e)),
        }
    }

    /// Runs a small script on one key by its digest, sending its source
    /// once more on `NOSCRIPT` (a new or restarted server).
    pub(crate) async fn script(
        &self,
        sha: &str,
        source: &str,
        key: &str,
        args: &[&[u8]],
    ) -> Result<Value, StoreError> {
        let mut conn = self.conn();
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(sha).arg(1).arg(key);
        for a in args {
            cmd.arg(*a);
        }
        match conn.query(&cmd).await {
            Err(e) if e.code() == Some("NOSCRIPT") => {
                let mut eval = redis::cmd("EVAL");
                eval.arg(source).arg(1).arg(key);
                for a in args {
                    eval.arg(*a);
                }
                conn.query(&eval).await.map_err(|e| classify(&e))
            }
            other => other.map_err(|e| classify(&e)),
        }
    }

    /// Loads the library (or, without functions, the script) before the
    /// first decision needs it, so the first requests after a start do
    /// not each wait for the load. Best effort: a server that is down, or
    /// one that refuses, leaves it to be loaded on demand, as after a
    /// restart. Single servers only (a cluster's nodes load on demand).
    pub(crate) async fn preload(&self) {
        let mut conn = self.conn();
        if matches!(conn, Conn::Cluster(_)) {
            return;
        }
        if !self.use_eval.load(Ordering::Relaxed) {
            let mut load = redis::cmd("FUNCTION");
            load.arg("LOAD").arg("REPLACE").arg(&self.library);
            match conn.query(&load).await {
                Ok(_) => return,
                Err(e) if self.scripting == Scripting::Auto && no_functions(&e) => {
                    tracing::info!("the Redis server has no functions: using scripts");
                    self.use_eval.store(true, Ordering::Relaxed);
                }
                Err(e) => {
                    tracing::debug!(error = %e, "the function library is loaded on demand");
                    return;
                }
            }
        }
        let mut load = redis::cmd("SCRIPT");
        load.arg("LOAD").arg(&self.script);
        if let Err(e) = conn.query(&load).await {
            tracing::debug!(error = %e, "the script is loaded on demand");
        }
    }

    /// Sends one plain command (tests and diagnostics).
    pub(crate) async fn command(&self, cmd: &Cmd) -> Result<Value, StoreError> {
        self.conn().query(cmd).await.map_err(|e| classify(&e))
    }
}

/// A lone check in the library's shorter form (see [`Link::run`]).
#[derive(Clone, Copy)]
pub(crate) struct Lone<'a> {
    /// Writes the call's keys and arguments after `FCALL <one> 1`.
    pub(crate) fill: &'a (dyn Fn(&mut Cmd) + Sync),
    /// Whether the call may go on the caller's own connection (see
    /// `direct.rs`): a call that needs no answer to stay counted right if
    /// it runs late, after its caller gave up on it.
    pub(crate) direct: bool,
}

/// The script's reply, an array.
fn array(v: Value) -> Result<Vec<Value>, StoreError> {
    match v {
        Value::Array(v) => Ok(v),
        other => Err(StoreError::Protocol(format!("unexpected reply {other:?}"))),
    }
}

fn function_missing(e: &RedisError) -> bool {
    e.to_string().contains("Function not found")
}

fn no_functions(e: &RedisError) -> bool {
    let s = e.to_string().to_ascii_lowercase();
    s.contains("unknown command") && (s.contains("fcall") || s.contains("function"))
}

/// Connection trouble is "unavailable"; an error the script or server
/// answered is a protocol error (retrying elsewhere will not help).
fn classify(e: &RedisError) -> StoreError {
    if e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_unrecoverable_error()
    {
        return unavailable(e);
    }
    classify_code(e.code(), &e.to_string())
}

/// An error the server answered, by its code: a server not ready (or not
/// the right one) is "unavailable", anything else a protocol error.
fn classify_code(code: Option<&str>, text: &str) -> StoreError {
    match code {
        Some("LOADING") | Some("TRYAGAIN") | Some("CLUSTERDOWN") | Some("MASTERDOWN")
        | Some("BUSY") | Some("MOVED") | Some("ASK") | Some("READONLY") => {
            StoreError::Unavailable(text.to_string())
        }
        _ => StoreError::Protocol(text.to_string()),
    }
}
