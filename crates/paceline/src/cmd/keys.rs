//! `paceline keys`: tools for the keys a configuration lists.
//!
//! `paceline keys hash KEY` prints the `keys` entry that admits KEY
//! without the file holding it (`sha256:` and the hex of its SHA-256),
//! alone on standard output (so `$(paceline keys hash -)` is the entry),
//! and on standard error the hash logs and soft-limit events show for
//! KEY, to find its requests in the logs. That hash is keyed by the deployment's key-hash
//! secret: the one of `--config FILE` (its `gateway.key_hash_secret_file`,
//! else `PACELINE_KEY_HASH_SECRET`), or without a file the environment
//! variable alone; with neither, the log hash cannot be told. KEY `-`
//! reads the key from the first line of standard input, so it stays out
//! of the shell's history and the process list.

use std::io::BufRead;
use std::path::PathBuf;

use anyhow::Context;
use paceline_gateway::{GatewayConfig, KEY_HASH_SECRET_ENV};

/// Arguments of `paceline keys`.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    #[command(subcommand)]
    command: KeysCommand,
}

#[derive(clap::Subcommand, Debug)]
enum KeysCommand {
    /// Print the hashed `keys` entry of KEY and its hash in the logs.
    Hash {
        /// The key (`-`: read it from standard input).
        key: String,
        /// The gateway configuration whose key-hash secret and key source
        /// the log hash is made with.
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
    },
}

/// Runs `paceline keys`.
pub(crate) fn run(args: Args) -> anyhow::Result<i32> {
    match args.command {
        KeysCommand::Hash { key, config } => hash(&key, config.as_deref()),
    }
}

fn hash(key: &str, config: Option<&std::path::Path>) -> anyhow::Result<i32> {
    let key = match key {
        "-" => {
            let mut line = String::new();
            std::io::stdin()
                .lock()
                .read_line(&mut line)
                .context("reading the key from standard input")?;
            line.trim_end_matches(['\n', '\r']).to_string()
        }
        k => k.to_string(),
    };
    if key.is_empty() {
        eprintln!("paceline keys hash: the key is empty");
        return Ok(2);
    }
    println!("{}", paceline_server::hashed_key_entry(&key));
    let limits = match config {
        Some(path) => match GatewayConfig::load(path) {
            Ok(c) => Some(c.limits),
            Err(e) => {
                eprintln!("paceline keys hash: {e}");
                return Ok(1);
            }
        },
        None => match std::env::var(KEY_HASH_SECRET_ENV) {
            Ok(secret) => {
                let origin = format!("the environment ({KEY_HASH_SECRET_ENV})");
                let hasher =
                    match paceline_server::KeyHasher::from_secret(secret.as_bytes(), &origin) {
                        Ok(h) => h,
                        Err(e) => {
                            eprintln!("paceline keys hash: {KEY_HASH_SECRET_ENV}: {e}");
                            return Ok(1);
                        }
                    };
                // a plan is all limits need to be built
                let plan = paceline_core::Plan::new(
                    "any",
                    vec![paceline_core::Policy::token_bucket("any", 1, 1).expect("a valid policy")],
                )
                .expect("a valid plan");
                Some(
                    paceline_server::Limits::builder()
                        .plan(plan)
                        .key_hasher(hasher)
                        .build()
                        .context("building limits for the hash")?,
                )
            }
            Err(_) => None,
        },
    };
    match limits {
        Some(l) => match l.key_hasher().origin() {
            paceline_server::SecretOrigin::Configured(from) => eprintln!(
                "log hash: {} (key-hash secret from {from})",
                l.log_hash(&key)
            ),
            _ => eprintln!(
                "log hash: unknown: the configuration gives no key-hash secret (gateway.key_hash_secret_file or {KEY_HASH_SECRET_ENV}), so logs hash under a random one per process"
            ),
        },
        None => eprintln!(
            "log hash: unknown without the deployment's key-hash secret: give --config FILE or set {KEY_HASH_SECRET_ENV}"
        ),
    }
    Ok(0)
}
