//! `paceline gateway`: the rate-limiting reverse proxy.
//!
//! `--config FILE` serves; `--check FILE` validates and exits (0 when the
//! file is good, 1 with a located error otherwise). Once listening, one
//! line on stdout says where; SIGHUP or saving the file reloads, SIGTERM
//! finishes the requests in flight and exits.

use std::path::PathBuf;

use anyhow::Context;
use paceline_gateway::{Gateway, GatewayConfig, ReloadEvent};

/// Arguments of `paceline gateway`.
#[derive(clap::Args, Debug)]
#[command(group(clap::ArgGroup::new("file").required(true).args(["config", "check"])))]
pub(crate) struct Args {
    /// Serve with this configuration file.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Validate this configuration file and exit.
    #[arg(long, value_name = "FILE")]
    check: Option<PathBuf>,
    /// Listen here instead of the file's `gateway.listen`.
    #[arg(long, value_name = "ADDR")]
    listen: Option<std::net::SocketAddr>,
    /// Worker threads (default: the cores this process may run on; with
    /// one, a single-threaded runtime).
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
}

/// Runs `paceline gateway`.
pub(crate) fn run(args: Args) -> anyhow::Result<i32> {
    if let Some(path) = &args.check {
        return Ok(check(path));
    }
    let path = args
        .config
        .as_deref()
        .context("--config FILE is required")?;
    let mut config = match GatewayConfig::load(path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("paceline gateway: {e}");
            return Ok(1);
        }
    };
    if let Some(addr) = args.listen {
        config.settings.listen = addr;
    }
    let threads = args
        .threads
        .or_else(|| std::thread::available_parallelism().ok().map(Into::into))
        .unwrap_or(1)
        .max(1);
    let mut rt = match threads {
        1 => tokio::runtime::Builder::new_current_thread(),
        n => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(n);
            b
        }
    };
    let rt = rt.enable_all().build().context("starting the runtime")?;
    rt.block_on(serve(config))?;
    Ok(0)
}

fn check(path: &std::path::Path) -> i32 {
    match GatewayConfig::load(path) {
        Ok(c) => {
            println!(
                "{}: ok ({} plans, {} routes, upstream {})",
                path.display(),
                c.limits.plans().len(),
                c.limits.routes().count(),
                c.settings.upstream
            );
            for w in &c.warnings {
                println!("warning: {w}");
            }
            0
        }
        Err(e) => {
            eprintln!("{e}");
            1
        }
    }
}

async fn serve(config: GatewayConfig) -> anyhow::Result<()> {
    let upstream = config.settings.upstream.clone();
    let scheme = match config.settings.tls {
        Some(_) => "https",
        None => "http",
    };
    let shutdown = paceline_gateway::shutdown_signal();
    // the error names the address that failed (there may be two)
    let gateway = Gateway::bind(config)
        .await
        .context("starting the gateway")?
        .on_reload(report_reload);
    if let Some(m) = gateway.metrics_addr() {
        println!("paceline gateway: metrics on http://{m}/metrics");
    }
    println!(
        "paceline gateway: listening on {scheme}://{} (upstream {upstream})",
        gateway.local_addr()
    );
    gateway.run(shutdown).await?;
    println!("paceline gateway: stopped");
    Ok(())
}

fn report_reload(event: &ReloadEvent) {
    match event {
        ReloadEvent::Applied { notes } => {
            println!("paceline gateway: configuration reloaded");
            for n in notes {
                eprintln!("paceline gateway: note: {n}");
            }
        }
        ReloadEvent::Refused(e) => {
            eprintln!(
                "paceline gateway: reload refused, the previous configuration keeps serving: {e}"
            );
        }
        other => eprintln!("paceline gateway: reload: {other:?}"),
    }
}
