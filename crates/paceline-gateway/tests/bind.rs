//! A listener that cannot be bound is named by its setting and address:
//! the gateway binds two (requests and metrics).

use paceline_gateway::{Gateway, GatewayConfig};

const CONFIG: &str = r#"[gateway]
listen = "127.0.0.1:0"
upstream = "http://127.0.0.1:9"
metrics_listen = "METRICS"

[plans.free]
policies = [{ name = "burst", algorithm = "token_bucket", q = 20, w = 2 }]

[keys]
sk_1 = "free"
"#;

#[tokio::test]
async fn a_busy_metrics_port_is_named_as_the_metrics_address() {
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap();
    let text = CONFIG.replace("METRICS", &addr.to_string());
    let config = GatewayConfig::parse(&text, "t.toml", None).unwrap();
    let Err(e) = Gateway::bind(config).await else {
        panic!("the port is taken");
    };
    let shown = e.to_string();
    assert!(shown.contains("gateway.metrics_listen"), "{shown}");
    assert!(shown.contains(&addr.to_string()), "{shown}");
    assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse);
    drop(busy);
}
