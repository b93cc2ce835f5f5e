//! `paceline sim`.

/// Arguments of `paceline sim`.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {}

/// Runs `paceline sim`.
pub(crate) fn run(_args: Args) -> anyhow::Result<i32> {
    anyhow::bail!("`paceline sim` is not built yet")
}
