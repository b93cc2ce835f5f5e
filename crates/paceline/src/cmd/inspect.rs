//! `paceline inspect`.

/// Arguments of `paceline inspect`.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {}

/// Runs `paceline inspect`.
pub(crate) fn run(_args: Args) -> anyhow::Result<i32> {
    anyhow::bail!("`paceline inspect` is not built yet")
}
