//! The identity sources beyond a list of keys, through the limit layer in
//! process on a manual clock: hashed keys admit exactly as their clear
//! form; consumer headers count only from a trusted proxy (and are removed
//! from anyone else's request); JWTs are verified by signature, algorithm,
//! key and times read from the limiter's clock, a bad one answered 401
//! with a problem body, a good one counted on its plan; a lookup made
//! before the layer (`KeyLookup`) is honoured for its own key alone.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body_util::{BodyExt, Full};
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use paceline_core::{ManualClock, MemoryStore, Nanos, Plan, Policy};
use paceline_server::{
    hashed_key_entry, ConsumerHeaders, Jwt, KeyLookup, KeySource, KeyTreatment, Limits,
    LimitsBuilder, LimitsConfig, LookedUp, PeerAddr, RateLimiter, Route, TrustedProxies,
};
use tower::{Layer, Service};

fn now_or_never<F: Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("in-memory decisions are ready at once"),
    }
}

/// 2033: far from the system's time, so a decision by the system's clock
/// would differ from one by the limiter's.
const T0: u64 = 2_000_000_000;

fn builder() -> LimitsBuilder {
    Limits::builder()
        .plan(Plan::new("free", vec![Policy::token_bucket("burst", 5, 5).unwrap()]).unwrap())
        .plan(Plan::new("gold", vec![Policy::token_bucket("burst", 50, 5).unwrap()]).unwrap())
        .plan(Plan::new("anon", vec![Policy::token_bucket("ip", 2, 60).unwrap()]).unwrap())
        .route(Route::new("GET", "/healthz").unwrap().unlimited())
}

#[derive(Debug)]
struct Got {
    status: u16,
    headers: HeaderMap,
    body: serde_json::Value,
    /// The head the inner service was handed, if the request went on.
    passed: Option<HeaderMap>,
}

impl Got {
    fn code(&self) -> &str {
        self.body["type"]
            .as_str()
            .unwrap_or("")
            .rsplit('/')
            .next()
            .unwrap()
    }
    fn field(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .map_or("", |v| v.to_str().unwrap_or(""))
    }
    fn detail(&self) -> &str {
        self.body["detail"].as_str().unwrap_or("")
    }
    fn is_problem(&self) -> bool {
        self.field("content-type") == "application/problem+json"
    }
}

/// A limiter on a manual clock in front of a service that records the
/// head it is handed.
struct Bench {
    limiter: RateLimiter<MemoryStore, ManualClock>,
    clock: ManualClock,
}

impl Bench {
    fn new(limits: Limits) -> Bench {
        let clock = ManualClock::at_unix_secs(T0);
        Bench {
            limiter: RateLimiter::new(limits, MemoryStore::new(), clock.clone()),
            clock,
        }
    }

    fn send(&self, req: Request<()>, peer: &str) -> Got {
        let seen: Arc<Mutex<Option<HeaderMap>>> = Arc::default();
        let record = seen.clone();
        let inner = tower::service_fn(move |r: Request<()>| {
            *record.lock().unwrap() = Some(r.headers().clone());
            async { Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"{}")))) }
        });
        let mut svc = self.limiter.layer().layer(inner);
        let mut req = req;
        let peer: SocketAddr = peer.parse().unwrap();
        req.extensions_mut().insert(PeerAddr(peer));
        let res = now_or_never(svc.call(req)).unwrap();
        let (parts, body) = res.into_parts();
        let bytes = now_or_never(body.collect()).unwrap().to_bytes();
        let passed = seen.lock().unwrap().take();
        Got {
            status: parts.status.as_u16(),
            headers: parts.headers,
            body: serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null),
            passed,
        }
    }

    fn bearer(&self, token: &str) -> Got {
        let req = Request::get("/v1/rates")
            .header("authorization", format!("Bearer {token}"))
            .body(())
            .unwrap();
        self.send(req, "198.51.100.7:4000")
    }
}

// ---------------------------------------------------------------------------
// Hashed keys
// ---------------------------------------------------------------------------

#[test]
fn a_hashed_key_admits_exactly_as_its_clear_form() {
    let clear = Bench::new(builder().key("sk_alice", "free").build().unwrap());
    let hashed = Bench::new(
        builder()
            .key(&hashed_key_entry("sk_alice"), "free")
            .build()
            .unwrap(),
    );
    // the same answers, fields and all, request after request: 5 admitted
    // then 429 on the same policy
    for i in 0..7 {
        let (a, b) = (clear.bearer("sk_alice"), hashed.bearer("sk_alice"));
        assert_eq!(a.status, b.status, "request {i}");
        assert_eq!(a.field("ratelimit"), b.field("ratelimit"), "request {i}");
        assert_eq!(a.field("ratelimit-policy"), b.field("ratelimit-policy"));
        assert_eq!(a.field("retry-after"), b.field("retry-after"));
        assert_eq!(a.status, if i < 5 { 200 } else { 429 }, "request {i}");
    }
    // another key, the hash itself, or its hex are not the key
    let entry = hashed_key_entry("sk_alice");
    for other in ["sk_bob", &entry, &entry["sha256:".len()..]] {
        let g = hashed.bearer(other);
        assert_eq!((g.status, g.code()), (401, "unknown_key"), "{other}");
    }
    // the same counters: a file switched from the clear key to its hash
    // keeps the key's standing across the reload
    let moving = Bench::new(builder().key("sk_alice", "free").build().unwrap());
    for _ in 0..3 {
        assert_eq!(moving.bearer("sk_alice").status, 200);
    }
    moving.limiter.reload(
        builder()
            .key(&hashed_key_entry("sk_alice"), "free")
            .build()
            .unwrap(),
    );
    let after = moving.bearer("sk_alice");
    assert_eq!(after.status, 200);
    assert!(after.field("ratelimit").contains("r=1"), "{after:?}");
    // and the log hash is the clear key's
    let a = builder().key("sk_alice", "free").build().unwrap();
    let b = builder().key(&entry, "free").build().unwrap();
    assert_eq!(a.log_hash("sk_alice"), b.log_hash("sk_alice"));
}

#[test]
fn a_hashed_entry_that_is_not_a_sha256_is_refused_at_its_field() {
    let text = r#"
[plans.free]
policies = [{ name = "b", algorithm = "token_bucket", q = 5, w = 1 }]
[keys]
"sha256:abc" = "free"
"#;
    let err = toml::from_str::<LimitsConfig>(text)
        .unwrap()
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "keys.sha256:abc");
    assert!(err.message().contains("64 hex digits"), "{err}");
    // either case of hex digits is one key
    let upper = hashed_key_entry("k")
        .to_ascii_uppercase()
        .replace("SHA256:", "sha256:");
    let l = builder().key(&upper, "free").build().unwrap();
    assert_eq!(Bench::new(l).bearer("k").status, 200);
}

// ---------------------------------------------------------------------------
// Consumer headers
// ---------------------------------------------------------------------------

fn consumer_limits() -> Limits {
    builder()
        .key_source(KeySource::ConsumerHeader)
        .trusted_proxies(TrustedProxies::parse(["10.0.0.0/8"]).unwrap())
        .consumer_headers(ConsumerHeaders::default())
        .anonymous_plan("anon")
        .missing_key(KeyTreatment::Anonymous)
        .build()
        .unwrap()
}

fn consumer_req(id: Option<&str>, plan: Option<&str>) -> Request<()> {
    let mut r = Request::get("/v1/rates");
    if let Some(id) = id {
        r = r.header("x-consumer-id", id);
    }
    if let Some(p) = plan {
        r = r.header("x-plan", p);
    }
    r.body(()).unwrap()
}

#[test]
fn a_consumer_header_counts_from_a_trusted_proxy_only() {
    let b = Bench::new(consumer_limits());
    // from the authentication layer (a trusted proxy): the consumer on
    // the plan it names, counters published, headers passed on
    let g = b.send(consumer_req(Some("acme"), Some("gold")), "10.1.2.3:5000");
    assert_eq!(g.status, 200);
    assert!(g.field("ratelimit-policy").contains("q=50"), "{g:?}");
    let passed = g.passed.unwrap();
    assert_eq!(passed["x-consumer-id"], "acme");
    assert_eq!(passed["x-plan"], "gold");
    // no plan header: the default plan, else (here) an unknown caller
    let g = b.send(consumer_req(Some("acme"), None), "10.1.2.3:5000");
    assert_eq!((g.status, g.code()), (401, "unknown_key"));
    // a plan the configuration does not have: an unknown caller
    let g = b.send(
        consumer_req(Some("acme"), Some("platinum")),
        "10.1.2.3:5000",
    );
    assert_eq!((g.status, g.code()), (401, "unknown_key"));

    // from anyone else the headers are ignored: a keyless caller (here
    // limited per address, anonymously), and they never reach the
    // service behind
    for _ in 0..2 {
        let g = b.send(consumer_req(Some("acme"), Some("gold")), "203.0.113.5:5000");
        assert_eq!(g.status, 200);
        assert!(
            g.field("ratelimit-policy").is_empty(),
            "anonymous: no fields"
        );
        let passed = g.passed.unwrap();
        assert!(!passed.contains_key("x-consumer-id"), "{passed:?}");
        assert!(!passed.contains_key("x-plan"), "{passed:?}");
    }
    // the anonymous plan's 2 a minute are spent: the forged consumer
    // did not buy its way to gold
    let g = b.send(consumer_req(Some("acme"), Some("gold")), "203.0.113.5:5000");
    assert_eq!(g.status, 429);
    // the trusted consumer's own budget is untouched by the forgeries
    let g = b.send(consumer_req(Some("acme"), Some("gold")), "10.1.2.3:5000");
    assert!(g.field("ratelimit").contains("r=48"), "{g:?}");
}

#[test]
fn a_consumer_header_sent_twice_is_refused() {
    let b = Bench::new(consumer_limits());
    let req = Request::get("/v1/rates")
        .header("x-consumer-id", "a")
        .header("x-consumer-id", "b")
        .body(())
        .unwrap();
    let g = b.send(req, "10.1.2.3:5000");
    assert_eq!(g.status, 401);
    assert!(g.passed.is_none());
}

#[test]
fn consumer_headers_need_trusted_proxies_and_name_their_fields() {
    let err = builder()
        .key_source(KeySource::ConsumerHeader)
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "trusted_proxies");
    let text = r#"
key = "consumer_header"
trusted_proxies = ["10.0.0.0/8"]
[plans.free]
policies = [{ name = "b", algorithm = "token_bucket", q = 5, w = 1 }]
[consumer_header]
key_header = "X-Caller"
plan_header = "X-Tier"
plans = { enterprise = "gold" }
"#;
    let err = toml::from_str::<LimitsConfig>(text)
        .unwrap()
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "consumer_header.plans.enterprise");
    let bad = text.replace("X-Caller", "X Caller");
    let err = toml::from_str::<LimitsConfig>(&bad)
        .unwrap()
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "consumer_header.key_header");
    let elsewhere = text.replace("key = \"consumer_header\"", "");
    let err = toml::from_str::<LimitsConfig>(&elsewhere)
        .unwrap()
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "consumer_header");
}

// ---------------------------------------------------------------------------
// JWTs
// ---------------------------------------------------------------------------

/// An ES256 key pair made here: its PKCS#8 and its public JWK.
fn es256(kid: &str) -> (Vec<u8>, serde_json::Value) {
    use base64::Engine;
    use ring::signature::{EcdsaKeyPair, KeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
    let pair =
        EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).unwrap();
    let point = pair.public_key().as_ref();
    let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
    let jwk = serde_json::json!({
        "kty": "EC", "crv": "P-256", "kid": kid, "use": "sig", "alg": "ES256",
        "x": b64(&point[1..33]), "y": b64(&point[33..65]),
    });
    (pkcs8.as_ref().to_vec(), jwk)
}

fn sign(pkcs8: &[u8], kid: &str, claims: &serde_json::Value) -> String {
    Jwt::install_provider();
    let mut h = Header::new(Algorithm::ES256);
    h.kid = Some(kid.to_string());
    encode(&h, claims, &EncodingKey::from_ec_der(pkcs8)).unwrap()
}

fn jwt_bench(jwks: &serde_json::Value) -> Bench {
    let jwt = Jwt::jwks(&jwks.to_string())
        .unwrap()
        .plan_claim("tier")
        .plan("pro", "gold")
        .plan("hobby", "free");
    Bench::new(
        builder()
            .key_source(KeySource::Jwt)
            .jwt(jwt)
            .key("svc-batch", "gold")
            .build()
            .unwrap(),
    )
}

#[test]
fn a_good_jwt_gets_its_plan_and_a_bad_one_401_with_a_problem_body() {
    let (key, jwk) = es256("k1");
    let (other, _) = es256("k1");
    let (unlisted, _) = es256("k9");
    let b = jwt_bench(&serde_json::json!({ "keys": [jwk] }));
    let claims = |sub: &str, tier: &str, exp: u64| serde_json::json!({"sub": sub, "tier": tier, "exp": exp, "iat": T0});

    // good: counted under its subject, on the plan its tier maps to
    let good = sign(&key, "k1", &claims("user-1", "pro", T0 + 300));
    let g = b.bearer(&good);
    assert_eq!(g.status, 200, "{g:?}");
    assert!(g.field("ratelimit-policy").contains("q=50"), "gold: {g:?}");
    assert!(g.field("ratelimit").contains("r=49"), "{g:?}");
    let hobby = b.bearer(&sign(&key, "k1", &claims("user-2", "hobby", T0 + 300)));
    assert!(hobby.field("ratelimit-policy").contains("q=5"), "{hobby:?}");
    // a subject listed under keys has the plan listed, whatever the token
    let listed = b.bearer(&sign(&key, "k1", &claims("svc-batch", "hobby", T0 + 300)));
    assert!(
        listed.field("ratelimit-policy").contains("q=50"),
        "{listed:?}"
    );
    // two tokens of one subject share one budget
    let again = b.bearer(&sign(&key, "k1", &claims("user-1", "pro", T0 + 600)));
    assert!(again.field("ratelimit").contains("r=48"), "{again:?}");

    let refused = |g: &Got, reason: &str| {
        assert_eq!(g.status, 401, "{g:?}");
        assert!(g.is_problem(), "{g:?}");
        assert_eq!(g.code(), "unknown_key", "{g:?}");
        assert!(g.detail().contains(reason), "{reason}: {g:?}");
        assert!(
            g.field("www-authenticate").contains("invalid_token"),
            "{g:?}"
        );
        assert!(g.passed.is_none());
    };
    // a bad signature: the same claims signed by another key under k1's name
    refused(
        &b.bearer(&sign(&other, "k1", &claims("user-1", "pro", T0 + 300))),
        "signature does not verify",
    );
    // a good token with its claims changed
    let mut parts: Vec<&str> = good.split('.').collect();
    use base64::Engine;
    let forged_claims = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(claims("admin", "pro", T0 + 300).to_string());
    parts[1] = &forged_claims;
    refused(&b.bearer(&parts.join(".")), "signature does not verify");
    // alg none, unsigned
    let b64 = |v: serde_json::Value| {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
    };
    let none = format!(
        "{}.{}.",
        b64(serde_json::json!({"alg": "none", "typ": "JWT"})),
        b64(claims("user-1", "pro", T0 + 300))
    );
    refused(&b.bearer(&none), "algorithm is not accepted");
    // expired by the limiter's clock (the system's, in 2026, would take it)
    refused(
        &b.bearer(&sign(&key, "k1", &claims("user-1", "pro", T0 - 60))),
        "expired",
    );
    // signed with a key the set does not hold
    refused(
        &b.bearer(&sign(&unlisted, "k9", &claims("user-1", "pro", T0 + 300))),
        "key not in the key set",
    );
    // not yet valid
    let mut early = claims("user-1", "pro", T0 + 300);
    early["nbf"] = (T0 + 120).into();
    refused(&b.bearer(&sign(&key, "k1", &early)), "not valid yet");
    // garbage
    refused(&b.bearer("not.a.jwt"), "not a JWT");

    // time is the limiter's: the good token expires when its clock passes
    // exp (and the 30 s leeway), not before
    b.clock.advance(Nanos::from_secs(300 + 29));
    assert_eq!(b.bearer(&good).status, 200);
    b.clock.advance(Nanos::from_secs(1));
    refused(&b.bearer(&good), "expired");

    // no token at all: a request without a key
    let none = b.send(
        Request::get("/v1/rates").body(()).unwrap(),
        "198.51.100.7:1",
    );
    assert_eq!((none.status, none.code()), (401, "unauthorized"));
    // unlimited routes stay unlimited, token or not
    let h = b.send(
        Request::get("/healthz")
            .header("authorization", "Bearer junk")
            .body(())
            .unwrap(),
        "198.51.100.7:1",
    );
    assert_eq!(h.status, 200);
}

#[test]
fn a_jwt_plan_claim_naming_no_plan_falls_to_the_default_plan() {
    let (key, jwk) = es256("k1");
    let jwt = Jwt::jwks(&serde_json::json!({ "keys": [jwk] }).to_string())
        .unwrap()
        .plan_claim("tier");
    let b = Bench::new(
        builder()
            .key_source(KeySource::Jwt)
            .jwt(jwt)
            .default_plan("free")
            .build()
            .unwrap(),
    );
    let t = |tier: &str| {
        sign(
            &key,
            "k1",
            &serde_json::json!({"sub": "u", "tier": tier, "exp": T0 + 60}),
        )
    };
    // the claim's value is the plan's name
    assert!(b
        .bearer(&t("gold"))
        .field("ratelimit-policy")
        .contains("q=50"));
    assert!(b
        .bearer(&t("platinum"))
        .field("ratelimit-policy")
        .contains("q=5"));
}

#[test]
fn the_jwt_table_is_checked_by_field() {
    let dir = std::env::temp_dir().join(format!("paceline-jwt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("short.secret"), "too short\n").unwrap();
    std::fs::write(
        dir.join("good.secret"),
        "0123456789abcdef0123456789abcdef\n",
    )
    .unwrap();
    std::fs::write(dir.join("jwks.json"), "{\"keys\": 3}").unwrap();
    let build = |jwt: &str| {
        let text = format!(
            "key = \"jwt\"\n[plans.free]\npolicies = [{{ name = \"b\", algorithm = \"token_bucket\", q = 5, w = 1 }}]\n[jwt]\n{jwt}\n"
        );
        toml::from_str::<LimitsConfig>(&text)
            .unwrap()
            .build_with_files(paceline_server::KeyHasher::random(), Some(&dir))
    };
    let field = |jwt: &str| build(jwt).unwrap_err().field().to_string();
    assert!(build("secret_file = \"good.secret\"").is_ok());
    assert_eq!(field("secret_file = \"short.secret\""), "jwt.secret_file");
    assert_eq!(field("secret_file = \"absent\""), "jwt.secret_file");
    assert_eq!(field("jwks_file = \"jwks.json\""), "jwt.jwks_file");
    assert_eq!(
        field("secret_file = \"good.secret\"\njwks_file = \"jwks.json\""),
        "jwt.jwks_file"
    );
    assert_eq!(field(""), "jwt");
    assert_eq!(
        field("secret_file = \"good.secret\"\nalgorithms = [\"RS256\"]"),
        "jwt.algorithms"
    );
    assert_eq!(
        field("secret_file = \"good.secret\"\nalgorithms = [\"none\"]"),
        "jwt.algorithms"
    );
    assert_eq!(
        field("secret_file = \"good.secret\"\nplan_claim = \"tier\"\nplans = { pro = \"gold\" }"),
        "jwt.plans.pro"
    );
    assert_eq!(
        field("secret_file = \"good.secret\"\nplans = { pro = \"free\" }"),
        "jwt.plans"
    );
    assert_eq!(
        field("secret_file = \"good.secret\"\nleeway_s = 86400"),
        "jwt.leeway_s"
    );
    // [jwt] without key = "jwt" is a mistake, not silence
    let text = "[plans.free]\npolicies = [{ name = \"b\", algorithm = \"token_bucket\", q = 5, w = 1 }]\n[jwt]\nsecret_file = \"good.secret\"\n";
    let err = toml::from_str::<LimitsConfig>(text)
        .unwrap()
        .build_with_files(paceline_server::KeyHasher::random(), Some(&dir))
        .unwrap_err();
    assert_eq!(err.field(), "jwt");
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------------------------
// A lookup made before the layer
// ---------------------------------------------------------------------------

#[test]
fn a_key_lookup_is_honoured_for_its_own_key_alone() {
    let b = Bench::new(builder().key("sk_file", "free").build().unwrap());
    let req = |key: &str, lookup: Option<KeyLookup>| {
        let mut r = Request::get("/v1/rates")
            .header("authorization", format!("Bearer {key}"))
            .body(())
            .unwrap();
        if let Some(l) = lookup {
            r.extensions_mut().insert(l);
        }
        r
    };
    let found = |key: &str, plan: &str| KeyLookup {
        key: Arc::from(key),
        found: LookedUp::Plan(Arc::from(plan)),
    };
    let peer = "198.51.100.7:4000";
    let g = b.send(req("sk_redis", Some(found("sk_redis", "gold"))), peer);
    assert_eq!(g.status, 200);
    assert!(g.field("ratelimit-policy").contains("q=50"));
    // a lookup for another key says nothing of this one
    let g = b.send(req("sk_other", Some(found("sk_redis", "gold"))), peer);
    assert_eq!((g.status, g.code()), (401, "unknown_key"));
    // a key the file lists keeps its plan
    let g = b.send(req("sk_file", Some(found("sk_file", "gold"))), peer);
    assert!(g.field("ratelimit-policy").contains("q=5"));
    // not found: unknown; a plan not defined: unknown
    let g = b.send(
        req(
            "sk_gone",
            Some(KeyLookup {
                key: Arc::from("sk_gone"),
                found: LookedUp::NotFound,
            }),
        ),
        peer,
    );
    assert_eq!((g.status, g.code()), (401, "unknown_key"));
    let g = b.send(req("sk_x", Some(found("sk_x", "platinum"))), peer);
    assert_eq!(g.status, 401);
    // the lookup could not be made: 503 with a problem body, Retry-After
    let g = b.send(
        req(
            "sk_x",
            Some(KeyLookup {
                key: Arc::from("sk_x"),
                found: LookedUp::Unavailable,
            }),
        ),
        peer,
    );
    assert_eq!(g.status, 503);
    assert!(g.is_problem());
    assert_eq!(g.field("retry-after"), "1");
    assert!(g.passed.is_none());
}
