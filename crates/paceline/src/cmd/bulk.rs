//! `paceline bulk`.

/// Arguments of `paceline bulk`.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {}

/// Runs `paceline bulk`.
pub(crate) fn run(_args: Args) -> anyhow::Result<i32> {
    anyhow::bail!("`paceline bulk` is not built yet")
}
