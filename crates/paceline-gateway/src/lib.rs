//! # paceline-gateway
//!
//! A rate-limiting reverse proxy: the server layers of `paceline-server`
//! in front of any HTTP API, configured by one TOML file.
//!
//! Why a gateway: not every API can take a tower layer. Put the gateway in
//! front and every response publishes its budget, 429s are answered from
//! the request head without touching the API, overload sheds the least
//! critical work first, and the configuration reloads without losing a
//! counter or a connection.
//!
//! The pieces:
//! - [`GatewayConfig`]: the file, with errors naming file, line and field.
//! - [`Gateway`]: binds, serves (HTTP/1.1 and h2c), reloads, shuts down
//!   gracefully; [`GatewayHandle`] controls it.
//! - [`shed`]: load shedding by criticality, as a tower layer.
//! - [`proxy`]: the forwarding service, with its own HTTP/1.1 client to
//!   the upstream (pooled keep-alive connections driven in the request's
//!   task).
//!
//! ```no_run
//! use paceline_gateway::{Gateway, GatewayConfig};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let config = GatewayConfig::load("examples/shiplane.toml".as_ref())?;
//! let gateway = Gateway::bind(config).await?;
//! println!("listening on http://{}", gateway.local_addr());
//! gateway.run(paceline_gateway::shutdown_signal()).await?;
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]

mod config;
mod edge;
mod idle;
mod locate;
pub mod metrics;
pub mod proxy;
mod server;
pub mod shed;
mod split;
mod upstream;
pub mod webhook;

pub use config::{
    ConfigFileError, GatewayConfig, Settings, SheddingSettings, StoreKind, Timeouts,
    DEFAULT_MAX_HEAD_BYTES, MAX_MAX_HEAD_BYTES, MIN_MAX_HEAD_BYTES,
};
pub use server::{
    shutdown_signal, Gateway, GatewayHandle, GatewayLimiter, ReloadCallback, ReloadEvent,
};
