//! Reload on change: the configuration's files are read again every
//! interval; when any changed (or one came or went), the rules are swapped
//! in whole, or, when the new files do not load, the rules in force stay
//! and the error is logged. Counters live in the store, not in the rules,
//! so a reload loses none: a rule that keeps its name and algorithm keeps
//! its counts, even with a new `requests_per_unit`.
//!
//! Why polling: one read of a few small files a second costs nothing,
//! works the same on every platform and in every container, and sees a
//! file replaced by a rename (as editors and Kubernetes config maps do).

use std::path::{Path, PathBuf};
use std::time::Duration;

use paceline_core::{Clock, Store};

use crate::config::{read_sources, ConfigError, RlsConfig};
use crate::service::RlsService;

/// The files behind a configuration, as last loaded.
#[derive(Debug)]
pub struct Watcher {
    path: PathBuf,
    last: Vec<(PathBuf, String)>,
}

/// What a poll found.
#[derive(Debug)]
pub enum Reload {
    /// Nothing changed.
    Unchanged,
    /// New rules are in force (this many domains).
    Applied(usize),
    /// The files changed but do not load; the rules in force stay.
    Refused(ConfigError),
}

impl Watcher {
    /// Loads `path` (a file or a directory) and remembers what it read.
    pub fn start(path: &Path) -> Result<(Watcher, RlsConfig), ConfigError> {
        let sources = read_sources(path)?;
        let config = from_sources(&sources)?;
        let w = Watcher {
            path: path.to_path_buf(),
            last: sources,
        };
        Ok((w, config))
    }

    /// Reads the files again and, when they changed, reloads `service`.
    pub fn poll<S: Store, C: Clock>(&mut self, service: &RlsService<S, C>) -> Reload {
        let sources = match read_sources(&self.path) {
            Ok(s) => s,
            Err(e) => return Reload::Refused(e),
        };
        if sources == self.last {
            return Reload::Unchanged;
        }
        let loaded = from_sources(&sources);
        self.last = sources;
        match loaded {
            Ok(c) => {
                let n = c.domains().count();
                service.reload(c);
                Reload::Applied(n)
            }
            Err(e) => Reload::Refused(e),
        }
    }

    /// Polls every `every`, logging what each reload did; never returns.
    pub async fn run<S: Store, C: Clock>(mut self, service: RlsService<S, C>, every: Duration) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut refused: Option<ConfigError> = None;
        loop {
            tick.tick().await;
            match self.poll(&service) {
                Reload::Unchanged => {}
                Reload::Applied(n) => {
                    refused = None;
                    tracing::info!(domains = n, "configuration reloaded");
                }
                // said once per distinct error, not every interval
                Reload::Refused(e) if refused.as_ref() != Some(&e) => {
                    tracing::error!(error = %e, "configuration not reloaded; the rules in force stay");
                    refused = Some(e);
                }
                Reload::Refused(_) => {}
            }
        }
    }
}

fn from_sources(sources: &[(PathBuf, String)]) -> Result<RlsConfig, ConfigError> {
    let mut config = RlsConfig::default();
    for (file, text) in sources {
        config.add(file, text)?;
    }
    Ok(config)
}
