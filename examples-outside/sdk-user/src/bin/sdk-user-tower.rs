//! The tower adapter under a hyper client, on the versions `cargo add`
//! picks: 30 quotes with one demo key, paced, each answered 200.

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client as Hyper;
use hyper_util::rt::TokioExecutor;
use paceline_client::adapter::tower::PacelineLayer;
use paceline_client::{Attempt, Client};
use tower::{Layer, ServiceExt};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let base = std::env::var("PACELINE_URL").unwrap_or("http://127.0.0.1:8080".into());
    let hyper: Hyper<_, Full<Bytes>> = Hyper::builder(TokioExecutor::new()).build_http();
    let svc = PacelineLayer::new(Client::new()).layer(hyper);
    let mut ok = 0;
    for _ in 0..30 {
        let req = http::Request::get(format!("{base}/v1/rates"))
            .header("authorization", "Bearer sk_demo_carol")
            .body(Full::new(Bytes::new()))?;
        let resp = svc.clone().oneshot(req).await?;
        assert!(resp.extensions().get::<Attempt>().is_some());
        if resp.status() == 200 {
            ok += 1;
        }
    }
    println!("{ok} of 30 quotes through tower");
    Ok(())
}
