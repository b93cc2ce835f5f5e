//! `paceline demo`.

/// Arguments of `paceline demo`.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {}

/// Runs `paceline demo`.
pub(crate) fn run(_args: Args) -> anyhow::Result<i32> {
    anyhow::bail!("`paceline demo` is not built yet")
}
