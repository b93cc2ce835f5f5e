//! `paceline`: both halves of the HTTP rate-limit contract, from the shell.

#![forbid(unsafe_code)]

use clap::{Parser, Subcommand};

mod cmd;

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
    /// Run a deterministic scenario on virtual time.
    Sim(cmd::sim::Args),
    /// Read one raw HTTP response and print what a client concludes.
    Inspect(cmd::inspect::Args),
    /// Run a list of requests through the SDK with N workers.
    Bulk(cmd::bulk::Args),
}

fn main() {
    quiet_broken_pipe();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo(a) => cmd::demo::run(a),
        Command::Gateway(a) => cmd::gateway::run(a),
        Command::Sim(a) => cmd::sim::run(a),
        Command::Inspect(a) => cmd::inspect::run(a),
        Command::Bulk(a) => cmd::bulk::run(a),
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("paceline: {e:#}");
            std::process::exit(2);
        }
    }
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
