//! One module per subcommand; each has `Args` (clap) and `run`, which
//! returns the process exit code.

pub(crate) mod bulk;
pub(crate) mod check;
pub(crate) mod demo;
pub(crate) mod gateway;
pub(crate) mod inspect;
pub(crate) mod keys;
pub(crate) mod rls;
pub(crate) mod sim;
