//! `paceline gateway`.

/// Arguments of `paceline gateway`.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {}

/// Runs `paceline gateway`.
pub(crate) fn run(_args: Args) -> anyhow::Result<i32> {
    anyhow::bail!("`paceline gateway` is not built yet")
}
