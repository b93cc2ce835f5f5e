//! Who is who through the gateway: JWTs verified against a JWKS file
//! (keys made here; a bad signature, `alg: none`, an expired token and a
//! key not in the set each answered 401 with a problem body, a good token
//! counted on its plan), the JWKS read again when it changes; consumer
//! headers believed from a trusted proxy only, and removed before the
//! upstream when they come from anyone else; hashed keys from a keys file.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use base64::Engine;
use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use paceline_core::{Clock, ManualClock, Nanos};
use paceline_gateway::{Gateway, GatewayConfig, GatewayHandle, ReloadEvent};

/// 2033, on the gateway's manual clock: far from the system's time.
const T0: u64 = 2_000_000_000;

/// An upstream saying which consumer fields reached it.
async fn echo_upstream() -> SocketAddr {
    common::echo_upstream(&["x-consumer-id", "x-plan"]).await
}

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("paceline-id-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

const PLANS: &str = r#"
[plans.free]
policies = [{ name = "burst", algorithm = "token_bucket", q = 5, w = 5 }]

[plans.gold]
policies = [{ name = "burst", algorithm = "token_bucket", q = 50, w = 5 }]

[plans.anonymous]
policies = [{ name = "ip", algorithm = "token_bucket", q = 2, w = 60 }]

[escalation]
enabled = false
"#;

fn gateway_table(upstream: SocketAddr) -> String {
    format!(
        "[gateway]\nlisten = \"127.0.0.1:0\"\nupstream = \"http://{upstream}\"\nwatch = false\n\n[gateway.shedding]\nmax_in_flight = 0\n"
    )
}

struct Rig {
    addr: SocketAddr,
    handle: GatewayHandle,
    clock: ManualClock,
    client: Client<HttpConnector, Full<Bytes>>,
}

async fn start(path: &Path) -> Rig {
    let cfg = GatewayConfig::load(path).unwrap_or_else(|e| panic!("{e}"));
    let clock = ManualClock::at_unix_secs(T0);
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    let gw = Gateway::bind_with_clock(cfg, shared).await.unwrap();
    let addr = gw.local_addr();
    let handle = gw.handle();
    tokio::spawn(gw.run(std::future::pending()));
    Rig {
        addr,
        handle,
        clock,
        client: Client::builder(TokioExecutor::new()).build_http(),
    }
}

struct Got {
    status: u16,
    headers: http::HeaderMap,
    body: serde_json::Value,
}

impl Got {
    fn field(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .map_or("", |v| v.to_str().unwrap_or(""))
    }
    fn code(&self) -> &str {
        self.body["type"]
            .as_str()
            .unwrap_or("")
            .rsplit('/')
            .next()
            .unwrap()
    }
}

impl Rig {
    async fn send(&self, headers: &[(&str, &str)]) -> Got {
        let mut req = Request::get(format!("http://{}/v1/rates", self.addr));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let res = tokio::time::timeout(
            common::LIMIT,
            self.client.request(req.body(Full::default()).unwrap()),
        )
        .await
        .expect("in time")
        .expect("an answer");
        let (parts, body) = res.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        Got {
            status: parts.status.as_u16(),
            headers: parts.headers,
            body: serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null),
        }
    }
    async fn bearer(&self, token: &str) -> Got {
        self.send(&[("authorization", &format!("Bearer {token}"))])
            .await
    }
}

/// An ES256 key made here (rcgen, on ring): its PKCS#8 and its JWK.
fn es256(kid: &str) -> (Vec<u8>, serde_json::Value) {
    let pair = rcgen::KeyPair::generate().unwrap();
    let point = pair.public_key_raw();
    assert_eq!(point.len(), 65, "an uncompressed P-256 point");
    let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
    let jwk = serde_json::json!({
        "kty": "EC", "crv": "P-256", "kid": kid, "alg": "ES256", "use": "sig",
        "x": b64(&point[1..33]), "y": b64(&point[33..]),
    });
    (pair.serialize_der(), jwk)
}

fn sign(pkcs8: &[u8], kid: &str, claims: serde_json::Value) -> String {
    paceline_server::Jwt::install_provider();
    let mut h = Header::new(Algorithm::ES256);
    h.kid = Some(kid.to_string());
    encode(&h, &claims, &EncodingKey::from_ec_der(pkcs8)).unwrap()
}

fn claims(sub: &str, tier: &str, exp: u64) -> serde_json::Value {
    serde_json::json!({"sub": sub, "tier": tier, "exp": exp, "iss": "https://id.example"})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jwts_are_verified_against_the_jwks_and_count_on_their_plan() {
    let upstream = echo_upstream().await;
    let d = dir("jwt");
    let (k1, jwk1) = es256("k1");
    let (impostor, _) = es256("k1");
    let (k2, jwk2) = es256("k2");
    std::fs::write(
        d.join("jwks.json"),
        serde_json::json!({"keys": [jwk1]}).to_string(),
    )
    .unwrap();
    let text = format!(
        "key = \"jwt\"\n{}\n[jwt]\njwks_file = \"jwks.json\"\nissuer = \"https://id.example\"\nplan_claim = \"tier\"\nplans = {{ pro = \"gold\", hobby = \"free\" }}\n{PLANS}",
        gateway_table(upstream)
    );
    let path = d.join("gateway.toml");
    std::fs::write(&path, text).unwrap();
    let rig = start(&path).await;

    // a good token: its plan, counters under its subject
    let good = sign(&k1, "k1", claims("user-1", "pro", T0 + 600));
    let g = rig.bearer(&good).await;
    assert_eq!(g.status, 200, "{}", g.body);
    assert!(g.field("ratelimit-policy").contains("q=50"), "gold");
    assert!(g.field("ratelimit").contains("r=49"));
    let hobby = rig
        .bearer(&sign(&k1, "k1", claims("user-2", "hobby", T0 + 600)))
        .await;
    assert!(hobby.field("ratelimit-policy").contains("q=5;"), "free");

    let refused = |g: Got, reason: &str| {
        assert_eq!(g.status, 401, "{reason}: {}", g.body);
        assert_eq!(g.field("content-type"), "application/problem+json");
        assert_eq!(g.code(), "unknown_key");
        let detail = g.body["detail"].as_str().unwrap_or("");
        assert!(detail.contains(reason), "{reason}: {detail}");
        assert!(g.field("www-authenticate").contains("invalid_token"));
        assert_eq!(
            g.field("seen-x-consumer-id"),
            "",
            "never reached the upstream"
        );
    };
    // signed by another key under k1's name
    refused(
        rig.bearer(&sign(&impostor, "k1", claims("user-1", "pro", T0 + 600)))
            .await,
        "signature does not verify",
    );
    // alg none
    let b64 = |v: serde_json::Value| {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
    };
    let none = format!(
        "{}.{}.",
        b64(serde_json::json!({"alg": "none", "typ": "JWT", "kid": "k1"})),
        b64(claims("user-1", "pro", T0 + 600))
    );
    refused(rig.bearer(&none).await, "algorithm is not accepted");
    // expired on the gateway's clock
    refused(
        rig.bearer(&sign(&k1, "k1", claims("user-1", "pro", T0 - 120)))
            .await,
        "expired",
    );
    // a key the set does not hold (yet)
    let by_k2 = sign(&k2, "k2", claims("user-3", "pro", T0 + 600));
    refused(rig.bearer(&by_k2).await, "key not in the key set");
    // another issuer
    let mut foreign = claims("user-1", "pro", T0 + 600);
    foreign["iss"] = "https://evil.example".into();
    refused(rig.bearer(&sign(&k1, "k1", foreign)).await, "issuer");

    // the identity provider rotates: k2 published, the file reloaded
    std::fs::write(
        d.join("jwks.json"),
        serde_json::json!({"keys": [jwk1, jwk2]}).to_string(),
    )
    .unwrap();
    match rig.handle.reload() {
        ReloadEvent::Applied { .. } => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(rig.bearer(&by_k2).await.status, 200, "k2 is in the set now");
    // and a JWKS that breaks is refused, the set in force kept
    std::fs::write(d.join("jwks.json"), "{\"keys\": [").unwrap();
    match rig.handle.reload() {
        ReloadEvent::Refused(e) => assert_eq!(e.field(), "jwt.jwks_file", "{e}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(rig.bearer(&by_k2).await.status, 200);

    // the token expires by the gateway's clock (exp + 30 s of leeway)
    rig.clock.advance(Nanos::from_secs(600 + 30));
    refused(rig.bearer(&good).await, "expired");
    let _ = std::fs::remove_dir_all(&d);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_headers_count_from_a_trusted_proxy_and_are_stripped_from_others() {
    let upstream = echo_upstream().await;
    let d = dir("consumer");
    let make = |trusted: &str| {
        format!(
            "key = \"consumer_header\"\ntrusted_proxies = [\"{trusted}\"]\nanonymous_plan = \"anonymous\"\nmissing_key = \"anonymous\"\n{}\n[consumer_header]\nplans = {{ enterprise = \"gold\" }}\n{PLANS}",
            gateway_table(upstream)
        )
    };
    // the test client is the authentication layer, on 127.0.0.1
    let trusting = d.join("trusting.toml");
    std::fs::write(&trusting, make("127.0.0.1")).unwrap();
    let rig = start(&trusting).await;
    let g = rig
        .send(&[("x-consumer-id", "acme"), ("x-plan", "enterprise")])
        .await;
    assert_eq!(g.status, 200);
    assert!(g.field("ratelimit-policy").contains("q=50"), "gold");
    assert_eq!(
        g.field("seen-x-consumer-id"),
        "acme",
        "passed on from a trusted proxy"
    );
    assert_eq!(g.field("seen-x-plan"), "enterprise");

    // the same request from a peer that is not trusted
    let wary = d.join("wary.toml");
    std::fs::write(&wary, make("10.0.0.0/8")).unwrap();
    let rig = start(&wary).await;
    for _ in 0..2 {
        let g = rig
            .send(&[("x-consumer-id", "acme"), ("x-plan", "enterprise")])
            .await;
        assert_eq!(g.status, 200, "limited per address, as anonymous");
        assert_eq!(g.field("ratelimit-policy"), "", "no counters: anonymous");
        assert_eq!(
            g.field("seen-x-consumer-id"),
            "-",
            "stripped before the upstream"
        );
        assert_eq!(g.field("seen-x-plan"), "-");
    }
    let g = rig
        .send(&[("x-consumer-id", "acme"), ("x-plan", "enterprise")])
        .await;
    assert_eq!(g.status, 429, "the anonymous plan, not gold");
    let _ = std::fs::remove_dir_all(&d);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hashed_keys_in_a_keys_file_admit_as_their_clear_form() {
    let upstream = echo_upstream().await;
    let d = dir("hashed");
    std::fs::write(
        d.join("keys.toml"),
        format!(
            "\"{}\" = \"gold\"\n",
            paceline_server::hashed_key_entry("sk_live_secret")
        ),
    )
    .unwrap();
    let text = format!(
        "{}{PLANS}",
        gateway_table(upstream).replace(
            "watch = false\n",
            "watch = false\nkeys_file = \"keys.toml\"\n"
        )
    );
    let path = d.join("gateway.toml");
    std::fs::write(&path, &text).unwrap();
    let rig = start(&path).await;
    let g = rig.bearer("sk_live_secret").await;
    assert_eq!(g.status, 200, "{}", g.body);
    assert!(g.field("ratelimit-policy").contains("q=50"));
    assert_eq!(rig.bearer("sk_live_other").await.status, 401);
    let _ = std::fs::remove_dir_all(&d);
}
