//! `paceline check`: the forward-auth endpoint for nginx `auth_request`,
//! Caddy `forward_auth` and Traefik `ForwardAuth`.
//!
//! `--config FILE` is the gateway's file (the same plans, keys, routes and
//! store); `--listen ADDR` where to answer (default 127.0.0.1:8081). Once
//! listening, one line on stdout says where; SIGHUP or saving the file
//! reloads, SIGTERM finishes the calls in flight and exits.

use std::path::PathBuf;

use anyhow::Context;
use paceline_gateway::check::{Check, DEFAULT_LISTEN};
use paceline_gateway::GatewayConfig;

/// Arguments of `paceline check`.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// The gateway's configuration file.
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
    /// Where to answer the proxy's calls.
    #[arg(long, value_name = "ADDR", default_value = DEFAULT_LISTEN)]
    listen: std::net::SocketAddr,
    /// Worker threads (default: the cores this process may run on; with
    /// one, a single-threaded runtime).
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
}

/// Runs `paceline check`.
pub(crate) fn run(args: Args) -> anyhow::Result<i32> {
    let config = match GatewayConfig::load(&args.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("paceline check: {e}");
            return Ok(1);
        }
    };
    let rt = super::gateway::runtime(args.threads)?;
    rt.block_on(serve(config, args.listen))?;
    Ok(0)
}

async fn serve(config: GatewayConfig, listen: std::net::SocketAddr) -> anyhow::Result<()> {
    let shutdown = paceline_gateway::shutdown_signal();
    let check = Check::bind(config, listen)
        .await
        .with_context(|| format!("starting the check on --listen {listen}"))?;
    println!("paceline check: listening on http://{}", check.local_addr());
    check.run(shutdown).await?;
    println!("paceline check: stopped");
    Ok(())
}
