//! The Shiplane-style demo API with the gateway in front of it, started and
//! stopped as one: what `paceline demo` serves beside the race.

use std::net::SocketAddr;

use crate::api::{self as demo, DemoOptions, DemoUpstream};
use anyhow::Context;
use paceline_gateway::{Gateway, GatewayHandle};

/// The demo API and the gateway in front of it, both running.
pub struct DemoStack {
    gateway: SocketAddr,
    handle: GatewayHandle,
    served: tokio::task::JoinHandle<std::io::Result<()>>,
    /// Kept alive while the stack runs.
    _api: DemoUpstream,
}

impl DemoStack {
    /// Starts the demo API on a free loopback port and the gateway (with
    /// `examples/shiplane.toml`) on `listen`.
    pub async fn start(listen: SocketAddr) -> anyhow::Result<DemoStack> {
        let api = demo::serve(([127, 0, 0, 1], 0).into(), DemoOptions::default())
            .await
            .context("starting the demo API")?;
        let config = demo::shiplane_config(listen, api.addr())?;
        let gateway = Gateway::bind(config)
            .await
            .context("starting the gateway")?;
        let addr = gateway.local_addr();
        let handle = gateway.handle();
        let served = tokio::spawn(gateway.run(std::future::pending()));
        Ok(DemoStack {
            gateway: addr,
            handle,
            served,
            _api: api,
        })
    }

    /// The gateway's address (what clients call).
    pub fn gateway(&self) -> SocketAddr {
        self.gateway
    }

    /// Stops the gateway, letting requests in flight finish.
    pub async fn stop(self) -> anyhow::Result<()> {
        self.handle.shutdown();
        self.served.await.context("the gateway task failed")??;
        Ok(())
    }
}
