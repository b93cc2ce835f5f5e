//! Who is asking: API keys, client addresses behind trusted proxies,
//! routes and arbitrary headers.
//!
//! A request without a known key is a stranger of one of two kinds: it
//! sends no key, or a key the configuration does not list. Each kind gets
//! its [`KeyTreatment`]: refused with 401 (the default, so an unknown
//! caller never passes by accident), or limited per client IP under the
//! anonymous plan. A listed key never depends on either.
//!
//! The client address comes from the socket. `X-Forwarded-For` and
//! `Forwarded` are believed only when the socket peer is a configured
//! trusted proxy; then the list is read from the right, skipping trusted
//! hops, and the first untrusted address is the client. A header sent by
//! anyone else changes nothing, so a client cannot pick its own bucket.
//!
//! One precedence: `X-Forwarded-For` first, `Forwarded` only when the
//! request carries no `X-Forwarded-For` at all. Why: the proxies people
//! put in front (load balancers, nginx, HAProxy, Envoy, this gateway)
//! append to `X-Forwarded-For` and pass a client's `Forwarded` through
//! untouched, so preferring `Forwarded` would let any client behind them
//! name its own address. A trusted proxy must therefore append to (or
//! replace) `X-Forwarded-For`; one that writes only `Forwarded` works when
//! it also removes any `X-Forwarded-For` a client sent.
//!
//! ```
//! use std::net::SocketAddr;
//! use paceline_server::{client_ip, TrustedProxies};
//!
//! let trusted = TrustedProxies::parse(["10.0.0.0/8"]).unwrap();
//! let mut req = http::Request::new(());
//! req.headers_mut().insert("x-forwarded-for", "203.0.113.9, 10.1.2.3".parse().unwrap());
//!
//! let via_proxy: SocketAddr = "10.0.0.7:5000".parse().unwrap();
//! assert_eq!(client_ip(req.headers(), Some(via_proxy.ip()), &trusted).unwrap().to_string(), "203.0.113.9");
//! let direct: SocketAddr = "198.51.100.4:5000".parse().unwrap();
//! assert_eq!(client_ip(req.headers(), Some(direct.ip()), &trusted).unwrap().to_string(), "198.51.100.4");
//! ```

use std::fmt;
use std::net::{IpAddr, SocketAddr};

use http::header::{HeaderName, HeaderValue, AUTHORIZATION};
use http::{Extensions, HeaderMap};

/// The socket peer of a request, for servers that are not axum: insert it
/// into the request's extensions (a plain `SocketAddr` extension works too).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerAddr(pub SocketAddr);

/// Where the limit key of a request comes from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeySource {
    /// The token of `Authorization: Bearer …` (the default).
    #[default]
    ApiKey,
    /// The client IP address.
    ClientIp,
    /// The matched route's pattern: one budget per route, shared by all.
    Route,
    /// The value of a request header.
    Header(HeaderName),
    /// The subject of the client's TLS certificate (mutual TLS), as the
    /// server terminating TLS puts it in the request's extensions
    /// ([`ClientCert`]). A request without one has no key.
    ClientCert,
    /// A claim (`sub` by default) of the JWT sent as `Authorization:
    /// Bearer <token>`, once its signature and times are verified
    /// ([`Jwt`](crate::Jwt)); the plan from another claim. A token that
    /// fails verification is refused with 401.
    Jwt,
    /// The caller (and its plan) as the authentication layer in front
    /// names them in request headers ([`ConsumerHeaders`]): believed only
    /// when the socket peer is a trusted proxy. From anyone else the
    /// headers are ignored (the request counts as sending no key) and
    /// removed before the service behind sees them.
    ConsumerHeader,
}

/// The headers an authentication layer in front of the limiter sets once
/// it has authenticated a caller, for [`KeySource::ConsumerHeader`] (the
/// `[consumer_header]` table of a configuration file). They are believed
/// only from a [trusted proxy](TrustedProxies): a request from any other
/// peer is read as sending no key, and the limit layer removes both
/// headers before its inner service sees the request, so no service
/// behind reads a forged one.
///
/// ```
/// use paceline_server::ConsumerHeaders;
/// let h = ConsumerHeaders::default();
/// assert_eq!(h.key, "x-consumer-id");
/// assert_eq!(h.plan.as_ref().map(|p| p.as_str()), Some("x-plan"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsumerHeaders {
    /// The header naming the caller (`X-Consumer-Id` by default): its
    /// value is the key, one visible-ASCII token.
    pub key: HeaderName,
    /// The header naming its plan (`X-Plan` by default); `None`: no plan
    /// is read, the key's plan is its entry under `keys`, else the default
    /// plan.
    pub plan: Option<HeaderName>,
    /// Plan header values to plan names; empty: the value is the plan's
    /// own name.
    pub plans: std::collections::BTreeMap<String, String>,
}

impl Default for ConsumerHeaders {
    fn default() -> Self {
        ConsumerHeaders {
            key: HeaderName::from_static("x-consumer-id"),
            plan: Some(HeaderName::from_static("x-plan")),
            plans: Default::default(),
        }
    }
}

/// What a lookup the limiter cannot make itself found for a request's key
/// (the gateway's Redis key map, `[gateway.keys_redis]`): made before the
/// limit layer and put into the request's extensions, the way a TLS
/// acceptor puts a [`ClientCert`]. The limiter honours it for a key
/// neither `keys` nor a hashed entry lists, and only when it names the
/// very key the request sends.
///
/// ```
/// use std::sync::Arc;
/// use paceline_server::{KeyLookup, LookedUp};
/// let mut req = http::Request::get("/").header("authorization", "Bearer sk_new").body(()).unwrap();
/// req.extensions_mut().insert(KeyLookup { key: Arc::from("sk_new"), found: LookedUp::Plan(Arc::from("free")) });
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyLookup {
    /// The key, as the request sends it.
    pub key: std::sync::Arc<str>,
    /// What the lookup found.
    pub found: LookedUp,
}

/// The outcome of a [`KeyLookup`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LookedUp {
    /// The key is on the plan so named (a name the limits do not define
    /// is read as an unknown key).
    Plan(std::sync::Arc<str>),
    /// The key is not known there: an unknown key (the default plan, or
    /// the `unknown_key` treatment).
    NotFound,
    /// The lookup could not be made and nothing cached tells: answered
    /// 503 with a problem body and `Retry-After`.
    Unavailable,
}

/// The `keys` entry of a key stored hashed: `sha256:` and the lowercase
/// hex of the SHA-256 of the key. A configuration listing it admits the
/// key exactly as the key itself (same plan, same counters) while the
/// file holds no secret.
///
/// ```
/// assert_eq!(
///     paceline_server::hashed_key_entry("abc"),
///     "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
/// );
/// ```
pub fn hashed_key_entry(key: &str) -> String {
    let digest = sha256(key.as_bytes());
    let mut s = String::with_capacity(HASHED_PREFIX.len() + 64);
    s.push_str(HASHED_PREFIX);
    for b in digest {
        use std::fmt::Write;
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// What a hashed `keys` entry starts with.
pub(crate) const HASHED_PREFIX: &str = "sha256:";

/// The SHA-256 of `bytes`.
pub(crate) fn sha256(bytes: &[u8]) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, bytes);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// Reads a hashed `keys` entry (`sha256:` and 64 hex digits, either case).
pub(crate) fn parse_hashed(entry: &str) -> Option<Result<[u8; 32], String>> {
    let hex = entry.strip_prefix(HASHED_PREFIX)?;
    let bad = || {
        format!("{entry:?}: a hashed key is sha256: and the 64 hex digits of its SHA-256 (paceline keys hash KEY prints it)")
    };
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Some(Err(bad()));
    }
    let mut out = [0u8; 32];
    for (o, pair) in out.iter_mut().zip(hex.as_bytes().chunks(2)) {
        let digit = |b: u8| (b as char).to_digit(16).unwrap_or(0) as u8;
        *o = digit(pair[0]) << 4 | digit(pair[1]);
    }
    Some(Ok(out))
}

/// The verified TLS client certificate of a request's connection, for
/// [`KeySource::ClientCert`]: the server that terminates TLS inserts it
/// into each request's extensions. Its subject is a distinguished name
/// as RFC 4514 writes it (`CN=billing,O=Example`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientCert {
    /// The certificate's subject.
    pub subject: std::sync::Arc<str>,
}

/// What a request without a known key gets: the configured answer for a
/// request that sends no key, and for one whose key is not configured.
///
/// Neither passes unlimited: with no setting both are refused with 401.
/// A route that needs no limit at all says so itself
/// ([`Route::unlimited`](crate::Route::unlimited)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum KeyTreatment {
    /// 401 with a problem body saying what is wrong (the default).
    #[default]
    Reject,
    /// Limited per client IP under the anonymous plan, publishing no
    /// counters.
    Anonymous,
}

/// Why a request has no known key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stranger {
    /// It sends no key.
    Missing,
    /// It sends a key the configuration does not know.
    Unknown,
    /// It sends a credential field the limiter cannot read as one key:
    /// refused whatever the treatments say.
    Unreadable,
    /// It sends a bearer token that does not verify: refused with 401
    /// whatever the treatments say.
    BadToken(crate::jwt::TokenError),
    /// Its key could not be looked up (the gateway's Redis key map did
    /// not answer, and nothing cached tells): 503.
    Unavailable,
}

/// One network: an address and a prefix length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpNet {
    addr: IpAddr,
    prefix: u8,
}

impl IpNet {
    /// Parses `10.0.0.0/8`, `::1/128` or a bare address.
    pub fn parse(s: &str) -> Result<IpNet, String> {
        let (a, p) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = a
            .trim()
            .parse()
            .map_err(|_| format!("{s:?} is not an IP address or CIDR network"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match p {
            None => max,
            Some(p) => p
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|&n| n <= max)
                .ok_or_else(|| format!("{s:?}: prefix length must be 0-{max}"))?,
        };
        Ok(IpNet { addr, prefix })
    }

    /// Whether `ip` lies in this network (IPv4-mapped IPv6 counts as IPv4).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        match (self.addr, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => prefix_eq(
                u128::from(n.to_bits()),
                u128::from(a.to_bits()),
                self.prefix,
                32,
            ),
            (IpAddr::V6(n), IpAddr::V6(a)) => prefix_eq(n.to_bits(), a.to_bits(), self.prefix, 128),
            _ => false,
        }
    }
}

fn prefix_eq(a: u128, b: u128, prefix: u8, bits: u8) -> bool {
    if prefix == 0 {
        return true;
    }
    let shift = u32::from(bits - prefix);
    (a >> shift) == (b >> shift)
}

/// An IPv4-mapped IPv6 address as the IPv4 one; any other as it is.
pub(crate) fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map(IpAddr::V4)
            .unwrap_or(IpAddr::V6(v6)),
        v4 => v4,
    }
}

/// The proxies whose forwarding headers are believed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TrustedProxies {
    nets: Vec<IpNet>,
}

impl TrustedProxies {
    /// No proxy is trusted: the socket address is always the client.
    pub fn none() -> Self {
        TrustedProxies::default()
    }
    /// Parses networks such as `10.0.0.0/8` or `127.0.0.1`.
    pub fn parse<I, T>(nets: I) -> Result<Self, String>
    where
        I: IntoIterator<Item = T>,
        T: AsRef<str>,
    {
        let nets = nets
            .into_iter()
            .map(|n| IpNet::parse(n.as_ref()))
            .collect::<Result<_, _>>()?;
        Ok(TrustedProxies { nets })
    }
    /// Whether `ip` is a trusted proxy.
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.nets.iter().any(|n| n.contains(ip))
    }
    /// Whether no proxy is trusted.
    pub fn is_empty(&self) -> bool {
        self.nets.is_empty()
    }
}

/// The socket peer recorded in the request's extensions: [`PeerAddr`], a
/// plain `SocketAddr`, or (with the `axum` feature) axum's `ConnectInfo`.
pub fn peer_ip(ext: &Extensions) -> Option<IpAddr> {
    if let Some(p) = ext.get::<PeerAddr>() {
        return Some(p.0.ip());
    }
    if let Some(a) = ext.get::<SocketAddr>() {
        return Some(a.ip());
    }
    #[cfg(feature = "axum")]
    if let Some(c) = ext.get::<axum::extract::ConnectInfo<SocketAddr>>() {
        return Some(c.0.ip());
    }
    None
}

/// The client address of a request whose socket peer is `peer`: the peer
/// itself unless it is a trusted proxy, in which case the right-most
/// untrusted hop of `X-Forwarded-For` (or, when the request carries no
/// `X-Forwarded-For`, of `Forwarded`).
pub fn client_ip(
    headers: &HeaderMap,
    peer: Option<IpAddr>,
    trusted: &TrustedProxies,
) -> Option<IpAddr> {
    let peer = canonical(peer?);
    if !trusted.contains(peer) {
        return Some(peer);
    }
    let hops = match headers.contains_key(X_FORWARDED_FOR) {
        true => xff_hops(headers),
        false => forwarded_hops(headers),
    };
    let Some(hops) = hops else {
        return Some(peer);
    };
    // Right to left: the nearest hops were added by our own proxies.
    for hop in hops.iter().rev() {
        match hop {
            Some(ip) if trusted.contains(*ip) => continue,
            Some(ip) => return Some(*ip),
            // An unparseable hop ends the trust chain where it stands.
            None => return Some(peer),
        }
    }
    hops.first().copied().flatten().or(Some(peer))
}

type Hops = Vec<Option<IpAddr>>;

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

fn xff_hops(headers: &HeaderMap) -> Option<Hops> {
    let mut hops = Vec::new();
    for v in headers.get_all(X_FORWARDED_FOR) {
        let s = v.to_str().ok()?;
        hops.extend(s.split(',').map(|h| parse_hop(h.trim())));
    }
    (!hops.is_empty()).then_some(hops)
}

fn forwarded_hops(headers: &HeaderMap) -> Option<Hops> {
    let mut hops = Vec::new();
    for v in headers.get_all(http::header::FORWARDED) {
        let s = v.to_str().ok()?;
        for element in s.split(',') {
            let for_value = element.split(';').find_map(|pair| {
                let (k, v) = pair.trim().split_once('=')?;
                k.trim().eq_ignore_ascii_case("for").then(|| v.trim())
            });
            hops.push(for_value.and_then(|v| parse_hop(v.trim_matches('"'))));
        }
    }
    (!hops.is_empty()).then_some(hops)
}

/// Parses `1.2.3.4`, `1.2.3.4:80`, `[::1]`, `[::1]:80` or `::1`.
fn parse_hop(s: &str) -> Option<IpAddr> {
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(canonical(ip));
    }
    if let Ok(sa) = s.parse::<SocketAddr>() {
        return Some(canonical(sa.ip()));
    }
    let inner = s.strip_prefix('[')?.split(']').next()?;
    inner.parse::<IpAddr>().ok().map(canonical)
}

/// The token of an `Authorization: Bearer` header, when the field is one
/// credential the limiter reads (see [`read_authorization`]).
pub fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    match read_authorization(headers.get(AUTHORIZATION)?, BasicAuth::Refuse) {
        Credential::Key(std::borrow::Cow::Borrowed(k)) => Some(k),
        _ => None,
    }
}

/// What the limiter makes of a present credential field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Credential<'a> {
    /// One key, read.
    Key(std::borrow::Cow<'a, str>),
    /// A field the limiter cannot read as exactly one key: refused with
    /// 401, never counted as a request without a key (the service behind
    /// may read it as somebody's key all the same).
    Unreadable,
}

/// How `Authorization: Basic` is read when the key is an API key.
///
/// Why it matters: a service that takes its key from Basic's user part
/// (Stripe's style) would serve a request the limiter counted as keyless.
/// Either the limiter reads the same part, or the field is refused.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum BasicAuth {
    /// `Basic` credentials are refused with 401 (the default).
    #[default]
    Refuse,
    /// The user part of `Basic base64(user:password)` is the key.
    User,
}

/// Reads one `Authorization` value the one way the limiter and any
/// service behind it agree on (RFC 9110 §11.4, RFC 6750 §2.1): the scheme
/// `Bearer` (any case), one or more spaces, then a token of `b64token`
/// characters (letters, digits, `-._~+/`, then any `=`), spaces after it
/// allowed; or, with [`BasicAuth::User`], `Basic` and the base64 of
/// `user:password`. Anything else is [`Credential::Unreadable`]: a tab or
/// non-ASCII byte where a space belongs, another scheme, a token with
/// other characters (a service splitting on whitespace would read a part
/// of it), an empty token.
///
/// ```
/// use paceline_server::{read_authorization, BasicAuth, Credential};
/// let read = |v: &'static str| {
///     match read_authorization(&http::HeaderValue::from_static(v), BasicAuth::Refuse) {
///         Credential::Key(k) => Some(k.into_owned()),
///         _ => None,
///     }
/// };
/// assert_eq!(read("Bearer  sk_alice ").as_deref(), Some("sk_alice"));
/// assert_eq!(read("Bearer\tsk_alice"), None);
/// assert_eq!(read("Token sk_alice"), None);
/// assert_eq!(read("Bearer sk_alice extra"), None);
/// ```
pub fn read_authorization(v: &HeaderValue, basic: BasicAuth) -> Credential<'_> {
    let b = v.as_bytes();
    let Some(sp) = b.iter().position(|&c| c == b' ') else {
        return Credential::Unreadable;
    };
    let (scheme, rest) = (&b[..sp], trim_spaces(&b[sp..]));
    if scheme.eq_ignore_ascii_case(b"bearer") {
        return match is_b64token(rest) {
            // b64token bytes are ASCII: this is the field's own text
            true => std::str::from_utf8(rest)
                .map_or(Credential::Unreadable, |t| Credential::Key(t.into())),
            false => Credential::Unreadable,
        };
    }
    if scheme.eq_ignore_ascii_case(b"basic") && basic == BasicAuth::User {
        return basic_user(rest).map_or(Credential::Unreadable, |u| Credential::Key(u.into()));
    }
    Credential::Unreadable
}

/// Reads a key from a configured header: visible ASCII with no space and
/// no comma (a list would be read one way here and another further on).
pub(crate) fn read_key_field(v: &HeaderValue) -> Credential<'_> {
    let b = trim_spaces(v.as_bytes());
    let ok = !b.is_empty() && b.iter().all(|&c| c.is_ascii_graphic() && c != b',');
    match ok.then(|| std::str::from_utf8(b).ok()).flatten() {
        Some(k) => Credential::Key(k.into()),
        None => Credential::Unreadable,
    }
}

fn trim_spaces(mut b: &[u8]) -> &[u8] {
    while let [b' ', rest @ ..] = b {
        b = rest;
    }
    while let [rest @ .., b' '] = b {
        b = rest;
    }
    b
}

/// RFC 6750's `b64token`: `1*( ALPHA / DIGIT / "-" / "." / "_" / "~" /
/// "+" / "/" ) *"="`.
fn is_b64token(b: &[u8]) -> bool {
    let body = b
        .iter()
        .position(|&c| !B64TOKEN[usize::from(c)])
        .unwrap_or(b.len());
    body > 0 && b[body..].iter().all(|&c| c == b'=')
}

/// The characters of a `b64token` before its `=` padding, by byte.
const B64TOKEN: [bool; 256] = {
    let mut t = [false; 256];
    let mut i = 0;
    while i < 256 {
        let c = i as u8;
        t[i] = c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~' | b'+' | b'/');
        i += 1;
    }
    t
};

/// The user part of a `Basic` credential: base64 of `user:password`, the
/// user non-empty visible ASCII.
fn basic_user(b: &[u8]) -> Option<String> {
    use base64::Engine;
    if !is_b64token(b) {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD.decode(b).ok()?;
    let colon = decoded.iter().position(|&c| c == b':')?;
    let user = &decoded[..colon];
    let ok = !user.is_empty() && user.iter().all(|&c| c.is_ascii_graphic());
    ok.then(|| String::from_utf8(user.to_vec()).ok()).flatten()
}

/// How many leading bits of a client address name one client for per-IP
/// keys: one IPv6 host usually holds a whole /64, so counting each of its
/// addresses apart would give it 2^64 budgets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpPrefixes {
    /// Bits of an IPv4 address (32 by default: each address alone).
    pub v4: u8,
    /// Bits of an IPv6 address (64 by default).
    pub v6: u8,
}

impl Default for IpPrefixes {
    fn default() -> Self {
        IpPrefixes { v4: 32, v6: 64 }
    }
}

impl IpPrefixes {
    /// Checks the lengths (IPv4 1-32, IPv6 1-128): the setting at fault
    /// (`ipv4_prefix` or `ipv6_prefix`) and why.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if !(1..=32).contains(&self.v4) {
            return Err(("ipv4_prefix", format!("{} must be 1-32", self.v4)));
        }
        if !(1..=128).contains(&self.v6) {
            return Err(("ipv6_prefix", format!("{} must be 1-128", self.v6)));
        }
        Ok(())
    }

    /// The network `ip` is counted under: the address with the bits past
    /// the prefix cleared (IPv4-mapped IPv6 counts as IPv4), and the
    /// prefix length when it is shorter than the address.
    pub fn group(&self, ip: IpAddr) -> (IpAddr, Option<u8>) {
        match canonical(ip) {
            IpAddr::V4(a) if self.v4 < 32 => {
                let mask = u32::MAX << (32 - u32::from(self.v4));
                (IpAddr::V4((a.to_bits() & mask).into()), Some(self.v4))
            }
            IpAddr::V6(a) if self.v6 < 128 => {
                let mask = u128::MAX << (128 - u32::from(self.v6));
                (IpAddr::V6((a.to_bits() & mask).into()), Some(self.v6))
            }
            a => (a, None),
        }
    }
}

/// A stable, non-reversible fingerprint of a key for logs and hooks: the
/// key itself is never logged. Made by a [`KeyHasher`], under a secret.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyHash(pub u64);

impl KeyHash {
    /// Hashes `key` under this process's random secret
    /// ([`KeyHasher::per_process`]); limits built with a configured secret
    /// hash with theirs ([`crate::Limits::key_hasher`]).
    pub fn of(key: &str) -> KeyHash {
        KeyHasher::per_process().hash(key)
    }
}

/// The fewest bytes a key-hash secret may have.
pub const MIN_KEY_HASH_SECRET_BYTES: usize = 16;

/// Where a [`KeyHasher`]'s secret came from.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SecretOrigin {
    /// Made at random when the process started: hashes match within this
    /// process only, not across restarts or instances.
    Random,
    /// Given by the deployment (a file or the environment), named here.
    Configured(String),
}

/// The keyed hash (SipHash-1-3) that turns keys into [`KeyHash`]es for
/// logs, soft-limit events and the names a shared store gives keys: with
/// a secret per deployment, someone holding the logs can neither confirm
/// a guessed key nor recover a client address from its hash. Its `Debug`
/// never shows the secret.
#[derive(Clone)]
pub struct KeyHasher {
    keys: (u64, u64),
    origin: SecretOrigin,
}

/// A key-hash secret too short to keep hashes unguessable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShortSecret {
    /// How many bytes it had.
    pub len: usize,
}

impl fmt::Display for ShortSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the key-hash secret has {} bytes; it needs at least {MIN_KEY_HASH_SECRET_BYTES} (say, 32 random bytes as hex)",
            self.len
        )
    }
}

impl std::error::Error for ShortSecret {}

impl KeyHasher {
    /// A hasher under `secret` (at least [`MIN_KEY_HASH_SECRET_BYTES`]),
    /// its origin named by `origin` (a file name, an environment
    /// variable; never the secret).
    pub fn from_secret(secret: &[u8], origin: &str) -> Result<KeyHasher, ShortSecret> {
        if secret.len() < MIN_KEY_HASH_SECRET_BYTES {
            return Err(ShortSecret { len: secret.len() });
        }
        // the secret, of any length, stretched into SipHash's 128-bit key
        let derive = |tweak: u8| {
            use std::hash::Hasher;
            let mut h = siphasher::sip::SipHasher13::new_with_keys(
                0x7061_6365_6c69_6e65,
                0x6b64_6572_6976_6521,
            );
            h.write(secret);
            h.write_u8(tweak);
            h.finish()
        };
        Ok(KeyHasher {
            keys: (derive(0), derive(1)),
            origin: SecretOrigin::Configured(origin.to_string()),
        })
    }

    /// A hasher under a fresh random secret.
    pub fn random() -> KeyHasher {
        use std::hash::{BuildHasher, Hasher};
        // the standard library's per-process random keys, drawn twice
        let draw = |n: u64| {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u64(n);
            h.finish()
        };
        KeyHasher {
            keys: (draw(0), draw(1)),
            origin: SecretOrigin::Random,
        }
    }

    /// The hasher of this process when no secret is given: random, made
    /// once, the same for every configuration the process loads.
    pub fn per_process() -> &'static KeyHasher {
        static ONE: std::sync::OnceLock<KeyHasher> = std::sync::OnceLock::new();
        ONE.get_or_init(KeyHasher::random)
    }

    /// The hash of `key`.
    pub fn hash(&self, key: &str) -> KeyHash {
        use std::hash::Hasher;
        let mut h = siphasher::sip::SipHasher13::new_with_keys(self.keys.0, self.keys.1);
        h.write(key.as_bytes());
        KeyHash(h.finish())
    }

    /// 16 bytes derived from the secret for one `purpose` (say, naming
    /// keys in a shared store): as stable and as secret as the secret
    /// itself, and telling nothing of it or of the hashes in logs.
    pub fn derive(&self, purpose: &str) -> [u8; 16] {
        use siphasher::sip128::Hasher128;
        use std::hash::Hasher;
        let mut h = siphasher::sip128::SipHasher13::new_with_keys(self.keys.0, self.keys.1);
        h.write(b"paceline derive\0");
        h.write(purpose.as_bytes());
        h.finish128().as_bytes()
    }

    /// Where its secret came from.
    pub fn origin(&self) -> &SecretOrigin {
        &self.origin
    }

    /// What to say about the secret when a server starts (never the
    /// secret itself).
    pub fn statement(&self) -> String {
        match &self.origin {
            SecretOrigin::Random => "key hashes in logs and events use a random per-process secret: they will not match across restarts or instances (set a key-hash secret to keep them stable)".to_string(),
            SecretOrigin::Configured(from) => format!("key hashes in logs and events use the secret from {from}"),
        }
    }
}

impl PartialEq for KeyHasher {
    fn eq(&self, other: &Self) -> bool {
        self.keys == other.keys
    }
}

impl fmt::Debug for KeyHasher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyHasher")
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

impl fmt::Display for KeyHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl fmt::Debug for KeyHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyHash({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn two_secrets_give_two_hashes_and_one_the_same() {
        let a = KeyHasher::from_secret(b"0123456789abcdef-one", "a").unwrap();
        let a2 = KeyHasher::from_secret(b"0123456789abcdef-one", "again").unwrap();
        let b = KeyHasher::from_secret(b"0123456789abcdef-two", "b").unwrap();
        assert_eq!(a.hash("sk_demo_alice"), a2.hash("sk_demo_alice"));
        assert_ne!(a.hash("sk_demo_alice"), b.hash("sk_demo_alice"));
        assert_ne!(a.hash("sk_demo_alice"), a.hash("sk_demo_bob"));
        // two random secrets differ; the process's own stays one
        assert_ne!(KeyHasher::random(), KeyHasher::random());
        assert_eq!(KeyHasher::per_process(), KeyHasher::per_process());
        assert_eq!(KeyHash::of("k"), KeyHasher::per_process().hash("k"));
    }

    #[test]
    fn a_short_secret_is_refused_and_none_is_shown() {
        let e = KeyHasher::from_secret(b"short", "f").unwrap_err();
        assert_eq!(e.len, 5);
        assert!(e.to_string().contains("16"), "{e}");
        let secret = "a-secret-nobody-may-read";
        let h = KeyHasher::from_secret(secret.as_bytes(), "the file s.txt").unwrap();
        for shown in [format!("{h:?}"), h.statement()] {
            assert!(!shown.contains(secret), "{shown}");
        }
        assert!(h.statement().contains("s.txt"));
        assert!(KeyHasher::random()
            .statement()
            .contains("random per-process"));
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn cidr() {
        let n = IpNet::parse("10.0.0.0/8").unwrap();
        assert!(n.contains(ip("10.255.0.1")));
        assert!(!n.contains(ip("11.0.0.1")));
        assert!(n.contains(ip("::ffff:10.0.0.1")));
        assert!(IpNet::parse("0.0.0.0/0").unwrap().contains(ip("8.8.8.8")));
        assert!(IpNet::parse("fd00::/8").unwrap().contains(ip("fd12::1")));
        assert!(IpNet::parse("10.0.0.0/33").is_err());
        assert!(IpNet::parse("ten").is_err());
    }

    #[test]
    fn forwarded_header_from_trusted_proxy() {
        let t = TrustedProxies::parse(["127.0.0.1", "10.0.0.0/8"]).unwrap();
        let h = headers(&[(
            "forwarded",
            "for=\"[2001:db8::7]:4711\";proto=https, for=10.0.0.3",
        )]);
        assert_eq!(
            client_ip(&h, Some(ip("127.0.0.1")), &t),
            Some(ip("2001:db8::7"))
        );
        // X-Forwarded-For wins over Forwarded: a proxy that appends to the
        // first passes a client's second through untouched
        let h2 = headers(&[
            ("forwarded", "for=198.51.100.1"),
            ("x-forwarded-for", "192.0.2.1"),
        ]);
        assert_eq!(
            client_ip(&h2, Some(ip("127.0.0.1")), &t),
            Some(ip("192.0.2.1"))
        );
        // garbage hop: stop at the proxy
        let h3 = headers(&[("x-forwarded-for", "192.0.2.1, unknown")]);
        assert_eq!(
            client_ip(&h3, Some(ip("127.0.0.1")), &t),
            Some(ip("127.0.0.1"))
        );
        // a client that prepends a fake address cannot choose it
        let h4 = headers(&[("x-forwarded-for", "1.1.1.1, 192.0.2.1")]);
        assert_eq!(
            client_ip(&h4, Some(ip("10.0.0.1")), &t),
            Some(ip("192.0.2.1"))
        );
        // every hop trusted: the left-most
        let h5 = headers(&[("x-forwarded-for", "10.0.0.9, 10.0.0.8")]);
        assert_eq!(
            client_ip(&h5, Some(ip("10.0.0.1")), &t),
            Some(ip("10.0.0.9"))
        );
    }

    #[test]
    fn bearer() {
        let h = headers(&[("authorization", "bearer  sk_1 ")]);
        assert_eq!(bearer_token(&h), Some("sk_1"));
        assert_eq!(
            bearer_token(&headers(&[("authorization", "Bearer a.b-c_d~e+f/g==")])),
            Some("a.b-c_d~e+f/g==")
        );
        for bad in [
            "Bearer\tsk_1",
            "Bearer sk_1\t",
            "Bearer sk 1",
            "Bearer sk_1=x",
            "Bearer =",
            "Bearer",
            "Bearer,sk_1",
            "Token sk_1",
            "",
        ] {
            let v = HeaderValue::from_str(bad).unwrap();
            assert_eq!(
                read_authorization(&v, BasicAuth::Refuse),
                Credential::Unreadable,
                "{bad:?}"
            );
        }
        let nbsp = HeaderValue::from_bytes(b"Bearer\xc2\xa0sk_1").unwrap();
        assert_eq!(
            read_authorization(&nbsp, BasicAuth::User),
            Credential::Unreadable
        );
        let trailing = HeaderValue::from_bytes(b"Bearer sk_1\xc2\xa0").unwrap();
        assert_eq!(
            read_authorization(&trailing, BasicAuth::User),
            Credential::Unreadable
        );
        assert_eq!(
            bearer_token(&headers(&[("authorization", "Basic abc")])),
            None
        );
        assert_eq!(
            bearer_token(&headers(&[("authorization", "Bearer ")])),
            None
        );
    }

    #[test]
    fn basic_is_read_only_when_asked() {
        // base64("sk_alice:") and base64("sk_alice:secret")
        for v in ["Basic c2tfYWxpY2U6", "basic  c2tfYWxpY2U6c2VjcmV0"] {
            let v = HeaderValue::from_static(v);
            assert_eq!(
                read_authorization(&v, BasicAuth::Refuse),
                Credential::Unreadable
            );
            assert_eq!(
                read_authorization(&v, BasicAuth::User),
                Credential::Key("sk_alice".into())
            );
        }
        // no colon, an empty user, not base64
        for bad in ["Basic c2tfYWxpY2U=", "Basic OnNlY3JldA==", "Basic !!!"] {
            let v = HeaderValue::from_static(bad);
            assert_eq!(
                read_authorization(&v, BasicAuth::User),
                Credential::Unreadable,
                "{bad}"
            );
        }
    }

    #[test]
    fn key_fields_are_one_visible_token() {
        assert_eq!(
            read_key_field(&HeaderValue::from_static("k_1")),
            Credential::Key("k_1".into())
        );
        for bad in ["", "k 1", "k,1", "k\t1"] {
            assert_eq!(
                read_key_field(&HeaderValue::from_str(bad).unwrap()),
                Credential::Unreadable,
                "{bad:?}"
            );
        }
        assert_eq!(
            read_key_field(&HeaderValue::from_bytes(b"k\xc2\xa0").unwrap()),
            Credential::Unreadable
        );
    }

    #[test]
    fn addresses_group_by_prefix() {
        let p = IpPrefixes::default();
        assert_eq!(
            p.group(ip("2001:db8:1:2:aaaa::1")),
            (ip("2001:db8:1:2::"), Some(64))
        );
        assert_eq!(p.group(ip("2001:db8:1:2:ffff::9")).0, ip("2001:db8:1:2::"));
        assert_ne!(p.group(ip("2001:db8:1:3::1")).0, ip("2001:db8:1:2::"));
        assert_eq!(p.group(ip("203.0.113.9")), (ip("203.0.113.9"), None));
        assert_eq!(p.group(ip("::ffff:203.0.113.9")), (ip("203.0.113.9"), None));
        let wide = IpPrefixes { v4: 24, v6: 48 };
        assert_eq!(wide.group(ip("203.0.113.9")), (ip("203.0.113.0"), Some(24)));
        assert_eq!(
            wide.group(ip("2001:db8:1:2::1")),
            (ip("2001:db8:1::"), Some(48))
        );
        let field = |p: IpPrefixes| p.validate().unwrap_err().0;
        assert_eq!(field(IpPrefixes { v4: 0, v6: 64 }), "ipv4_prefix");
        assert_eq!(field(IpPrefixes { v4: 32, v6: 129 }), "ipv6_prefix");
        assert_eq!(field(IpPrefixes { v4: 33, v6: 0 }), "ipv4_prefix");
    }

    #[test]
    fn the_b64token_table_holds_its_characters() {
        for c in 0..=255u8 {
            let class = c.is_ascii_alphanumeric() || b"-._~+/".contains(&c);
            assert_eq!(B64TOKEN[usize::from(c)], class, "{c:#04x}");
        }
        assert!(is_b64token(b"a.b-c_d~e+f/g=="));
        for bad in [&b""[..], b"=", b"a=b", b"a b", b"a,b", b"\xc2\xa0"] {
            assert!(!is_b64token(bad), "{bad:?}");
        }
    }

    proptest! {
        #[test]
        fn a_read_key_is_what_a_whitespace_splitting_service_reads(
            v in "(Bearer|bEARER|Basic|Token|)[ \t\u{a0}\u{3000}]{0,3}[a-z_=.~ \t,\u{a0}]{0,12}[ \t\u{a0}]{0,2}"
        ) {
            // a service that splits the field on any whitespace and takes
            // the second word (Flask's `auth.split()`, Node's
            // `/^Bearer\s+(\S+)/`) reads exactly the limiter's key, or
            // the limiter refuses the field
            let Ok(hv) = HeaderValue::from_bytes(v.as_bytes()) else { return Ok(()) };
            if let Credential::Key(k) = read_authorization(&hv, BasicAuth::Refuse) {
                let text = &v;
                let words: Vec<&str> = text.split(char::is_whitespace).filter(|w| !w.is_empty()).collect();
                prop_assert_eq!(words.len(), 2);
                prop_assert!(words[0].eq_ignore_ascii_case("bearer"));
                prop_assert_eq!(words[1], &*k);
            }
        }

        #[test]
        fn any_forwarding_header_from_a_proxy_gives_a_listed_address(
            fwd in "[ -~]{0,60}",
            xff in "[ -~]{0,60}",
        ) {
            let trusted = TrustedProxies::parse(["127.0.0.1"]).unwrap();
            let peer = ip("127.0.0.1");
            let mut h = HeaderMap::new();
            if let Ok(v) = fwd.parse() { h.insert("forwarded", v); }
            if let Ok(v) = xff.parse() { h.insert("x-forwarded-for", v); }
            let got = client_ip(&h, Some(peer), &trusted).unwrap();
            // the peer itself, or an address that appears in a header
            let text = format!("{fwd} {xff}").to_ascii_lowercase();
            let shown = got.to_string();
            prop_assert!(got == peer || text.contains(&shown) || shown.contains(':'), "{shown} from {text}");
        }

        #[test]
        fn a_hashed_entry_reads_back_as_the_sha256_of_its_key(key in "\\PC{0,40}") {
            let entry = hashed_key_entry(&key);
            prop_assert_eq!(parse_hashed(&entry), Some(Ok(sha256(key.as_bytes()))));
            prop_assert_eq!(parse_hashed(&entry.to_ascii_uppercase().replacen("SHA256:", "sha256:", 1)), Some(Ok(sha256(key.as_bytes()))));
            // a key that is not an entry is not read as one
            prop_assert_eq!(parse_hashed(&key).is_some(), key.starts_with(HASHED_PREFIX));
        }

        #[test]
        fn any_sha256_entry_is_read_or_refused_never_misread(hex in "[0-9a-fA-Fg ]{0,70}") {
            let entry = format!("{HASHED_PREFIX}{hex}");
            let good = hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit());
            match parse_hashed(&entry) {
                Some(Ok(d)) => {
                    prop_assert!(good);
                    let back: String = d.iter().map(|b| format!("{b:02x}")).collect();
                    prop_assert_eq!(back, hex.to_ascii_lowercase());
                }
                Some(Err(_)) => prop_assert!(!good),
                None => prop_assert!(false, "a sha256: entry is always read"),
            }
        }

        #[test]
        fn untrusted_peer_is_always_the_client(a in any::<u32>(), b in any::<u32>(), spoof in "[0-9., a-f:]{0,40}") {
            let trusted = TrustedProxies::parse(["10.0.0.0/8"]).unwrap();
            let peer = IpAddr::V4(std::net::Ipv4Addr::from_bits(a));
            prop_assume!(!trusted.contains(peer));
            let mut h = HeaderMap::new();
            if let Ok(v) = spoof.parse() { h.insert("x-forwarded-for", v); }
            if let Ok(v) = format!("for={}", std::net::Ipv4Addr::from_bits(b)).parse() { h.insert("forwarded", v); }
            prop_assert_eq!(client_ip(&h, Some(peer), &trusted), Some(peer));
        }
    }
}
