//! `paceline`: both halves of the HTTP rate-limit contract, from the shell.
//!
//! The binary is arguments to calls: each command in `cmd/` parses and
//! validates its arguments with clap, calls the crates, and prints.
//!
//! ```text
//!  cmd/gateway.rs ─► paceline-gateway       cmd/inspect.rs ─► paceline-wire (raw, parse)
//!  cmd/demo.rs    ─► paceline-demo          cmd/bulk.rs    ─► paceline-client (reqwest)
//!  cmd/sim.rs     ─► paceline-sim           cmd/keys.rs    ─► paceline-server (hashed entries,
//!                                                             log hashes)
//! ```
//!
//! A 429 the gateway sends never crosses this crate: `cmd/gateway.rs`
//! loads the file, binds and runs, and the gateway's own doc follows the
//! request from there.

#![forbid(unsafe_code)]

use clap::{Parser, Subcommand};

mod cmd;

#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Both halves of the HTTP rate-limit contract.
#[derive(Parser, Debug)]
#[command(name = "paceline", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the demo: a Shiplane-style API behind the gateway, and the race.
    Demo(cmd::demo::Args),
    /// Run the reverse-proxy gateway.
    Gateway(cmd::gateway::Args),
    /// Answer a proxy's forward-auth calls as the gateway would decide.
    Check(cmd::check::Args),
    /// Run a deterministic scenario on virtual time.
    Sim(cmd::sim::Args),
    /// Read one raw HTTP response and print what a client concludes.
    Inspect(cmd::inspect::Args),
    /// Run a list of requests through the SDK with N workers.
    Bulk(cmd::bulk::Args),
    /// Serve Envoy's rate-limit service on envoyproxy/ratelimit's YAML.
    Rls(cmd::rls::Args),
    /// Tools for the keys a configuration lists (`keys hash KEY`).
    Keys(cmd::keys::Args),
}

fn main() {
    quiet_broken_pipe();
    let cli = Cli::parse();
    if matches!(
        cli.command,
        Command::Demo(_) | Command::Gateway(_) | Command::Check(_) | Command::Rls(_)
    ) {
        logs();
    }
    let result = match cli.command {
        Command::Demo(a) => cmd::demo::run(a),
        Command::Gateway(a) => cmd::gateway::run(a),
        Command::Check(a) => cmd::check::run(a),
        Command::Sim(a) => cmd::sim::run(a),
        Command::Inspect(a) => cmd::inspect::run(a),
        Command::Bulk(a) => cmd::bulk::run(a),
        Command::Rls(a) => cmd::rls::run(a),
        Command::Keys(a) => cmd::keys::run(a),
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("paceline: {e:#}");
            std::process::exit(2);
        }
    }
}

/// Log lines of the servers on stderr, filtered by `PACELINE_LOG` (the
/// `tracing` filter syntax, e.g. `info` or `paceline_server=debug`).
/// Warnings and errors by default; `info` adds one line per rejection
/// (policy, outcome, a hash of the key), reloads and shutdowns. With
/// `PACELINE_LOG_FORMAT=json`, each line is one JSON object (`timestamp`,
/// `level`, `target`, `fields` with the message and every field), for
/// log collectors; `text` (the default) is for people.
fn logs() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("PACELINE_LOG").unwrap_or_else(|_| EnvFilter::new("warn"));
    let format = std::env::var("PACELINE_LOG_FORMAT").unwrap_or_default();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false);
    let _ = match format.trim() {
        "json" => builder.json().try_init(),
        "" | "text" => builder.try_init(),
        other => {
            let r = builder.try_init();
            eprintln!("paceline: PACELINE_LOG_FORMAT={other:?} is not json or text; logging text");
            r
        }
    };
}

/// `paceline sim herd --json | head` closes our stdout early: end quietly
/// with the conventional status instead of a panic message.
fn quiet_broken_pipe() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if msg.contains("failed printing to stdout") && msg.contains("Broken pipe") {
            std::process::exit(141);
        }
        default(info);
    }));
}
