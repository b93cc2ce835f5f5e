//! The Shiplane-style demo API with the gateway in front of it, started and
//! stopped as one: what `paceline demo` serves beside the race. With more
//! than one instance, a round-robin front listens where the gateway would.

use std::net::SocketAddr;

use crate::api::{self as demo, DemoOptions, DemoUpstream};
use crate::front::Front;
use crate::race::Deployment;
use anyhow::Context;
use paceline_gateway::{Gateway, GatewayHandle};

/// One running gateway.
struct Running {
    handle: GatewayHandle,
    served: tokio::task::JoinHandle<std::io::Result<()>>,
}

/// The demo API and the gateway(s) in front of it, all running.
pub struct DemoStack {
    gateway: SocketAddr,
    instances: Vec<Running>,
    front: Option<Front>,
    /// Kept alive while the stack runs.
    _api: DemoUpstream,
}

impl DemoStack {
    /// Starts the demo API on a free loopback port and the gateway (with
    /// `examples/shiplane.toml`) on `listen`.
    pub async fn start(listen: SocketAddr) -> anyhow::Result<DemoStack> {
        DemoStack::start_in(listen, &Deployment::default()).await
    }

    /// [`DemoStack::start`] with the gateways of `d`: with more than one,
    /// each on a free loopback port and a round-robin front on `listen`.
    pub async fn start_in(listen: SocketAddr, d: &Deployment) -> anyhow::Result<DemoStack> {
        d.check().map_err(anyhow::Error::msg)?;
        let api = demo::serve(([127, 0, 0, 1], 0).into(), DemoOptions::default())
            .await
            .context("starting the demo API")?;
        let secret = crate::race::run_secret();
        let mut instances = Vec::new();
        let mut urls = Vec::new();
        let each = match d.instances {
            1 => listen,
            _ => ([127, 0, 0, 1], 0).into(),
        };
        for n in 1..=d.instances {
            let config =
                demo::shiplane_config_in(each, api.addr(), d.redis_url.as_deref(), &secret)?;
            let gateway = Gateway::bind(config)
                .await
                .with_context(|| format!("starting gateway {n}"))?;
            urls.push(format!("http://{}", gateway.local_addr()));
            let handle = gateway.handle();
            let served = tokio::spawn(gateway.run(std::future::pending()));
            instances.push(Running { handle, served });
        }
        let (front, gateway) = match d.instances {
            1 => (None, urls[0].trim_start_matches("http://").parse()?),
            _ => {
                let front = Front::start(listen, urls).await?;
                let addr = front.addr();
                (Some(front), addr)
            }
        };
        Ok(DemoStack {
            gateway,
            instances,
            front,
            _api: api,
        })
    }

    /// The gateway's address, or the front's (what clients call).
    pub fn gateway(&self) -> SocketAddr {
        self.gateway
    }

    /// Stops the front and the gateways, letting requests in flight finish.
    pub async fn stop(self) -> anyhow::Result<()> {
        if let Some(front) = self.front {
            front.stop();
        }
        for i in self.instances {
            i.handle.shutdown();
            i.served.await.context("the gateway task failed")??;
        }
        Ok(())
    }
}
