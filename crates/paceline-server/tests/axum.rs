//! The layer in an axum app, served over loopback: the peer address comes
//! from axum's `ConnectInfo`, and the usage endpoint answers through the
//! router's fallback.

use std::net::SocketAddr;

use axum::routing::{get, post};
use axum::Router;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use paceline_core::{ManualClock, MemoryStore, Plan, Policy};
use paceline_server::{Limits, RateLimiter, Route, TrustedProxies};
use tokio::net::{TcpListener, TcpStream};

async fn app() -> SocketAddr {
    let free = Plan::new("free", vec![Policy::token_bucket("burst", 20, 2).unwrap()]).unwrap();
    let login = Plan::new("login", vec![Policy::fixed_window("login", 5, 60).unwrap()]).unwrap();
    let limits = Limits::builder()
        .plan(free)
        .plan(login)
        .key("sk", "free")
        .route(
            Route::new("POST", "/v1/login")
                .unwrap()
                .anonymous(Some("login")),
        )
        .trusted_proxies(TrustedProxies::parse(["127.0.0.0/8"]).unwrap())
        .build()
        .unwrap();
    let limiter = RateLimiter::new(
        limits,
        MemoryStore::new(),
        ManualClock::at_unix_secs(1_790_769_600),
    );
    let router = Router::new()
        .route("/v1/rates", get(|| async { "rates" }))
        .route("/v1/login", post(|| async { "welcome" }))
        .fallback(|| async { (http::StatusCode::NOT_FOUND, "not found") })
        .layer(limiter.layer());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            router.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    addr
}

async fn send(addr: SocketAddr, req: http::request::Builder) -> (u16, http::HeaderMap, String) {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let res = tx
        .send_request(
            req.header("host", "localhost")
                .body(Empty::<bytes::Bytes>::new())
                .unwrap(),
        )
        .await
        .unwrap();
    let (parts, body) = res.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    (
        parts.status.as_u16(),
        parts.headers,
        String::from_utf8_lossy(&body).into(),
    )
}

#[tokio::test]
async fn axum_app_with_connect_info() {
    let addr = app().await;
    let (status, headers, body) = send(
        addr,
        http::Request::get("/v1/rates").header("authorization", "Bearer sk"),
    )
    .await;
    assert_eq!((status, body.as_str()), (200, "rates"));
    assert_eq!(headers["ratelimit"], "\"burst\";r=19;t=1");

    let (status, _, body) = send(
        addr,
        http::Request::get("/v1/usage").header("authorization", "Bearer sk"),
    )
    .await;
    assert_eq!(status, 200);
    assert!(body.starts_with("{\"plan\":\"free\""), "{body}");

    // the peer (127.0.0.1, trusted) is known: each forwarded client counts alone
    let login =
        |ip: &str| http::Request::post("/v1/login").header("x-forwarded-for", ip.to_string());
    for _ in 0..5 {
        assert_eq!(send(addr, login("198.51.100.1")).await.0, 200);
    }
    assert_eq!(send(addr, login("198.51.100.1")).await.0, 429);
    assert_eq!(send(addr, login("198.51.100.2")).await.0, 200);
}
