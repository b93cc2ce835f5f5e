//! `paceline demo`: the Shiplane-style demo API behind the gateway, and the
//! two-fleet race over real HTTP with its live dashboard.
//!
//! By default it starts the demo API behind the gateway, starts the race's
//! dashboard, runs the race through a gateway of its own (the race's keys,
//! an edge capacity) with the real SDK, prints the result
//! table and keeps serving (the dashboard can run the race again) until
//! interrupted. `--json` prints the race's result as JSON and exits.
//! `--instances N` races through N gateway instances behind a round-robin
//! front, each counting alone (`--store memory`) or all in one Redis
//! (`--store redis`, at `--redis-url` or a `redis-server` the demo starts).
//! With `--no-race` it only serves: the gateway's URL and the demo keys go
//! to stdout, and it keeps serving until interrupted. With
//! `--upstream-only` it serves the demo API alone, without the gateway
//! (optionally slowed by `--delay-ms`), to put any other proxy in front.

use std::net::SocketAddr;

use anyhow::Context;

use paceline_demo::api::{self as demo, DemoOptions, DEMO_KEYS};
use paceline_demo::race;
use paceline_demo::stack::DemoStack;
use paceline_sim::scenario::race::{self as scenario, RaceParams};

/// Arguments of `paceline demo`.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// Only serve the demo API behind the gateway, until interrupted.
    #[arg(long)]
    no_race: bool,
    /// Serve only the demo API (no gateway), until interrupted.
    #[arg(long, conflicts_with = "no_race")]
    upstream_only: bool,
    /// With --upstream-only: delay every answer by this many milliseconds.
    #[arg(
        long,
        value_name = "MS",
        default_value_t = 0,
        requires = "upstream_only"
    )]
    delay_ms: u64,
    /// Where the gateway (or, with --upstream-only, the API) listens.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Where the race's dashboard listens.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8081")]
    race_listen: SocketAddr,
    /// Print the race's result as JSON and exit.
    #[arg(long, conflicts_with_all = ["no_race", "upstream_only"])]
    json: bool,
    /// The cooperative fleet's SDK pace margin, in milliseconds (to
    /// measure what it must be; the SDK's default otherwise).
    #[arg(long, value_name = "MS", hide = true, conflicts_with_all = ["no_race", "upstream_only"])]
    pace_margin_ms: Option<u64>,
    /// Exit after the race instead of serving on.
    #[arg(long, conflicts_with_all = ["no_race", "upstream_only"])]
    exit: bool,
    /// Race through this many gateway instances (1 to 16) behind a
    /// round-robin front.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(race::MAX_INSTANCES)),
          conflicts_with = "upstream_only")]
    instances: u32,
    /// Where the race's gateways count: each in its own memory, or in one
    /// shared Redis.
    #[arg(long, value_enum, default_value_t = StoreArg::Memory, conflicts_with = "upstream_only")]
    store: StoreArg,
    /// With --store redis: the Redis to count in (without it, the demo
    /// starts a redis-server of its own on a free loopback port).
    #[arg(long, value_name = "URL", conflicts_with = "upstream_only")]
    redis_url: Option<String>,
}

/// `--store`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum StoreArg {
    /// Each instance counts alone, in its own memory.
    Memory,
    /// Every instance counts in one Redis.
    Redis,
}

/// Runs `paceline demo`.
pub(crate) fn run(args: Args) -> anyhow::Result<i32> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    rt.block_on(async {
        let interrupted = paceline_gateway::shutdown_signal();
        if args.upstream_only {
            return upstream_only(args, interrupted).await;
        }
        // a redis-server of our own lives as long as the demo
        let (deployment, own_redis) = deployment(&args)?;
        // a busy default port should not stop the demo: fall back to any
        let stack = match DemoStack::start_in(args.listen, &deployment).await {
            Ok(stack) => stack,
            Err(e) if args.listen.port() != 0 && !args.no_race => {
                eprintln!("paceline demo: {e:#}; using a free port instead");
                DemoStack::start_in(SocketAddr::new(args.listen.ip(), 0), &deployment).await?
            }
            Err(e) => return Err(e),
        };
        if args.no_race {
            print_banner(&stack, &deployment);
            interrupted.await;
            stack.stop().await?;
            drop(own_redis);
            return Ok(0);
        }
        let code = race_demo(&args, &stack, deployment.clone(), interrupted).await?;
        stack.stop().await?;
        drop(own_redis);
        Ok(code)
    })
}

/// The gateways `args` ask for, and the `redis-server` started for them
/// (kept until the demo ends), if one was.
fn deployment(
    args: &Args,
) -> anyhow::Result<(
    race::Deployment,
    Option<paceline_demo::local_redis::LocalRedis>,
)> {
    anyhow::ensure!(
        args.redis_url.is_none() || args.store == StoreArg::Redis,
        "--redis-url is read only with --store redis"
    );
    let mut own_redis = None;
    let redis_url = match (args.store, &args.redis_url) {
        (StoreArg::Memory, _) => None,
        (StoreArg::Redis, Some(url)) => {
            paceline_demo::local_redis::reachable(url)?;
            Some(url.clone())
        }
        (StoreArg::Redis, None) => {
            let r = paceline_demo::local_redis::LocalRedis::start()?;
            let url = r.url();
            own_redis = Some(r);
            Some(url)
        }
    };
    let d = race::Deployment {
        instances: args.instances,
        redis_url,
    };
    d.check().map_err(anyhow::Error::msg)?;
    Ok((d, own_redis))
}

/// Runs the race through the real gateway (its own instance, with the
/// race's keys and an edge capacity), prints the result, and serves the
/// dashboard on.
async fn race_demo(
    args: &Args,
    stack: &DemoStack,
    deployment: race::Deployment,
    interrupted: impl std::future::Future<Output = ()>,
) -> anyhow::Result<i32> {
    let params = RaceParams::default();
    let floor_s = params.floor_s();
    let (workers, jobs) = (params.workers, params.jobs);
    let race = race::Race::new(params.clone());
    race.set_deployment(deployment.clone())
        .map_err(anyhow::Error::msg)?;
    if let Some(ms) = args.pace_margin_ms {
        race.set_pace_margin(std::time::Duration::from_millis(ms));
    }
    let (listener, url) = match race::bind(&args.race_listen.to_string()).await {
        Ok(bound) => bound,
        Err(_) => race::bind(&SocketAddr::new(args.race_listen.ip(), 0).to_string()).await?,
    };
    tokio::spawn(race::serve(listener, race.clone()));
    if !args.json {
        print_banner(stack, &deployment);
        println!("paceline demo: race dashboard on {url}/");
        let d = &deployment;
        if d.instances > 1 || d.redis_url.is_some() {
            println!(
                "paceline demo: the race goes through {} gateway instance(s), {}",
                d.instances,
                match &d.redis_url {
                    Some(url) => format!("counting in one Redis ({url})"),
                    None => "each counting alone in its own memory".to_string(),
                }
            );
        }
        println!(
            "paceline demo: racing two fleets of {workers} workers, {jobs} jobs each (floor {floor_s:.1} s)…"
        );
    }
    let report = race::run(race.clone()).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(0);
    }
    println!();
    print!("{}", scenario::table(&report.fleets));
    println!("floor for the jobs: {floor_s:.1} s");
    print!("{}", race::admitted_lines(&params, &report));
    if args.exit {
        return Ok(0);
    }
    println!();
    println!("paceline demo: still serving; open {url}/ to run the race again, Ctrl-C to stop");
    interrupted.await;
    Ok(0)
}

async fn upstream_only(
    args: Args,
    interrupted: impl std::future::Future<Output = ()>,
) -> anyhow::Result<i32> {
    let options = DemoOptions {
        delay: std::time::Duration::from_millis(args.delay_ms),
    };
    let api = demo::serve(args.listen, options)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    println!("paceline demo: demo API on http://{}", api.addr());
    interrupted.await;
    Ok(0)
}

fn print_banner(stack: &DemoStack, d: &race::Deployment) {
    let url = format!("http://{}", stack.gateway());
    println!("paceline demo: gateway on {url}");
    if d.instances > 1 {
        let how = match d.store() {
            race::Store::Redis => "counting as one in Redis",
            race::Store::Memory => "each counting alone",
        };
        println!(
            "paceline demo: (a round-robin front over {} gateway instances, {how})",
            d.instances
        );
    }
    println!("paceline demo: keys (Free plan: burst 20 per 2 s, 10,000 per UTC day):");
    for k in DEMO_KEYS {
        println!("  {k}");
    }
    println!(
        "paceline demo: try  curl -i -H 'authorization: Bearer {}' {url}/v1/rates",
        DEMO_KEYS[0]
    );
}
