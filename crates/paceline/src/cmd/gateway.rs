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
    /// With `--check`: the number of gateway instances sharing the store,
    /// for the overshoot bound printed for each leased policy.
    #[arg(long, value_name = "N", default_value_t = 1, requires = "check")]
    instances: u64,
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
        return Ok(check(path, args.instances.max(1)));
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
    runtime(args.threads)?.block_on(serve(config))?;
    Ok(0)
}

/// The runtime of a server: `threads` workers (default: the cores this
/// process may run on); with one, a single-threaded runtime, which a
/// server pinned to one core runs faster (no work stealing, no wake-ups
/// across threads).
pub(crate) fn runtime(threads: Option<usize>) -> anyhow::Result<tokio::runtime::Runtime> {
    let threads = threads
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
    rt.enable_all().build().context("starting the runtime")
}

fn check(path: &std::path::Path, instances: u64) -> i32 {
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
            for line in leased(&c, instances) {
                println!("{line}");
            }
            0
        }
        Err(e) => {
            eprintln!("{e}");
            1
        }
    }
}

/// One line per leased policy: its slices and the overshoot bound for
/// `instances` gateways on the shared store.
fn leased(c: &GatewayConfig, instances: u64) -> Vec<String> {
    let shared = c.settings.redis.is_some();
    let mut lines = Vec::new();
    for plan in c.limits.plans() {
        for p in plan.policies() {
            let paceline_core::Share::Leased { max_slice } = p.share() else {
                continue;
            };
            if !shared {
                lines.push(format!(
                    "warning: plan {:?} policy {:?} is leased, and this gateway counts in its own memory: exact, with nothing to lease from",
                    plan.name(),
                    p.name()
                ));
                continue;
            }
            let bound = instances.saturating_mul(2).saturating_mul(max_slice);
            lines.push(format!(
                "leased: plan {:?} policy {:?}: slices of at most {max_slice}; with {instances} instance{} at most {bound} admitted beyond exact counting over any window ({:.1}% of q = {})",
                plan.name(),
                p.name(),
                if instances == 1 { "" } else { "s" },
                100.0 * bound as f64 / p.quota() as f64,
                p.quota()
            ));
        }
    }
    if let Some(name) = &c.settings.global_plan {
        let exact = c.limits.plan(name).is_some_and(|p| {
            p.policies()
                .iter()
                .any(|q| !q.is_shadow() && q.share() == paceline_core::Share::Exact)
        });
        lines.push(match (shared, exact) {
            (true, true) => format!(
                "warning: global_plan {name:?} is counted exactly: every request passed on is a round trip to one Redis key, shared by every gateway; share = \"leased\" in its policies decides almost all of them locally"
            ),
            _ => format!("global: every request passed on is charged to plan {name:?}, once for all gateways on the store"),
        });
    }
    lines
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
