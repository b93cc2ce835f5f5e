//! `paceline rls`: Envoy's rate-limit service on envoyproxy/ratelimit's
//! YAML.
//!
//! `--config FILE_OR_DIR` serves (`--check` validates and exits: 0 when
//! the files load, 1 with a located error otherwise). Once listening, one
//! line on stdout says where; saving a file reloads it (read again every
//! `--reload-ms`), SIGTERM stops. `--redis-url` counts in Redis, shared by
//! every instance on it (they need the same `PACELINE_KEY_HASH_SECRET`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use paceline_core::{Clock, MemoryStore, Store, SystemClock};
use paceline_rls::{RlsService, Watcher};

/// Arguments of `paceline rls`.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// envoyproxy/ratelimit's YAML: one file (a domain) or a directory of
    /// `*.yaml`/`*.yml` files (a domain each).
    #[arg(long, value_name = "FILE_OR_DIR")]
    config: PathBuf,
    /// Where Envoy's gRPC calls come (HTTP/2 cleartext).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8081")]
    listen: SocketAddr,
    /// Serve Prometheus metrics on http://ADDR/metrics.
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<SocketAddr>,
    /// Count in this Redis, one count for every instance on it (needs
    /// PACELINE_KEY_HASH_SECRET, the same on each, at least 16 bytes).
    #[arg(long, value_name = "URL")]
    redis_url: Option<String>,
    /// How long a decision waits for Redis before the domain's fail_mode
    /// answers (the store's default, as the gateway's; Envoy's filter
    /// waits 20 ms by default).
    #[arg(long, value_name = "MS", default_value_t = 5)]
    redis_deadline_ms: u64,
    /// How often the configuration's files are read again for changes.
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    reload_ms: u64,
    /// Validate the configuration and exit.
    #[arg(long)]
    check: bool,
    /// Worker threads (default: the cores this process may run on).
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
}

/// Runs `paceline rls`.
pub(crate) fn run(args: Args) -> anyhow::Result<i32> {
    let (watcher, config) = match Watcher::start(&args.config) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("paceline rls: {e}");
            return Ok(1);
        }
    };
    if args.check {
        let n = config.domains().count();
        println!("{}: ok ({n} domains)", args.config.display());
        return Ok(0);
    }
    let threads = args
        .threads
        .or_else(|| std::thread::available_parallelism().ok().map(Into::into))
        .unwrap_or(1)
        .max(1);
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    rt.worker_threads(threads);
    let rt = rt.enable_all().build().context("starting the runtime")?;
    rt.block_on(async move {
        match &args.redis_url {
            None => {
                let svc = RlsService::new(config, MemoryStore::new(), SystemClock::new());
                serve(&args, watcher, svc).await
            }
            Some(url) => {
                let store = redis(url, args.redis_deadline_ms).await?;
                let svc = RlsService::new(config, store, SystemClock::new());
                serve(&args, watcher, svc).await
            }
        }
    })?;
    Ok(0)
}

async fn redis(url: &str, deadline_ms: u64) -> anyhow::Result<paceline_redis::RedisStore> {
    let env = paceline_gateway::KEY_HASH_SECRET_ENV;
    let secret = std::env::var(env).unwrap_or_default();
    anyhow::ensure!(
        secret.len() >= 16,
        "--redis-url names keys by their hash under a secret every instance shares: set {env} (at least 16 bytes)"
    );
    let config = paceline_redis::RedisStoreConfig {
        urls: vec![url.to_string()],
        key_secret: secret.into_bytes(),
        deadline: Duration::from_millis(deadline_ms),
        ..paceline_redis::RedisStoreConfig::default()
    };
    paceline_redis::RedisStore::connect(config)
        .await
        .map_err(|e| anyhow::anyhow!("--redis-url: {}: {}", e.field, e.message))
}

async fn serve<S: Store, C: Clock>(
    args: &Args,
    watcher: Watcher,
    svc: RlsService<S, C>,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("--listen {}", args.listen))?;
    if let Some(addr) = args.metrics_listen {
        let m = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("--metrics-listen {addr}"))?;
        println!(
            "paceline rls: metrics on http://{}/metrics",
            m.local_addr()?
        );
        tokio::spawn(paceline_gateway::serve_metrics(m));
    }
    let every = Duration::from_millis(args.reload_ms.max(10));
    tokio::spawn(watcher.run(svc.clone(), every));
    println!(
        "paceline rls: listening on {} (gRPC, {} domains, {} store)",
        listener.local_addr()?,
        svc.config().domains().count(),
        if args.redis_url.is_some() {
            "redis"
        } else {
            "memory"
        }
    );
    paceline_rls::serve(listener, svc, paceline_gateway::shutdown_signal()).await?;
    println!("paceline rls: stopped");
    Ok(())
}
