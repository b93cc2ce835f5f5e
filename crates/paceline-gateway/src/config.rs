//! The gateway's configuration file.
//!
//! Why one file with precise errors: a gateway is configured by people who
//! did not write it, often under pressure. Every mistake, from a TOML
//! syntax error to a key on a plan that does not exist, is reported as
//! `file:line:column: field: what is wrong and what is expected`, and
//! `paceline gateway --check FILE` reports it without serving.
//!
//! The file has a `[gateway]` table (listen address, upstream, store,
//! timeouts, shedding, webhook, metrics) and, at the top level, the limits
//! model of `paceline-server` (`plans`, `keys`, `routes`, `trusted_proxies`,
//! `dialects`, ...): this module reads the `[gateway]` table and hands the
//! rest of the file to [`LimitsConfig`] as it is, so the limits' fields and
//! defaults are defined there alone. Keys may also come from a separate
//! file (`gateway.keys_file`, a TOML table of `key = "plan"`).
//!
//! Every error carries a [`ConfigErrorKind`], so a caller can tell a
//! missing plan from a malformed file without reading the message.
//!
//! ```
//! use paceline_gateway::GatewayConfig;
//!
//! let text = r#"
//! [gateway]
//! listen = "127.0.0.1:8080"
//! upstream = "http://127.0.0.1:9000"
//!
//! [plans.free]
//! policies = [{ name = "burst", algorithm = "token_bucket", q = 20, w = 2 }]
//!
//! [keys]
//! sk_1 = "free"
//! sk_2 = "gold"
//! "#;
//! let err = GatewayConfig::parse(text, "gw.toml", None).unwrap_err();
//! assert_eq!(err.to_string(), r#"gw.toml:11:1: keys.sk_2: no plan named "gold"; plans are ["free"]"#);
//! assert_eq!(err.kind(), paceline_server::ConfigErrorKind::UnknownPlan);
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use http::uri::{Authority, Scheme};
use http::Uri;
use paceline_server::{ConfigErrorKind as Kind, Limits, LimitsConfig};
use serde::{Deserialize, Deserializer};

use crate::locate::Doc;
use crate::split::{split, Expected};

/// A configuration mistake, located in its file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigFileError {
    kind: Kind,
    file: String,
    line: usize,
    column: usize,
    field: String,
    message: String,
}

impl ConfigFileError {
    /// What kind of mistake it is.
    pub fn kind(&self) -> Kind {
        self.kind
    }
    /// The file at fault (as given).
    pub fn file(&self) -> &str {
        &self.file
    }
    /// The 1-based line (0 when the file could not be read).
    pub fn line(&self) -> usize {
        self.line
    }
    /// The 1-based column (0 when unknown).
    pub fn column(&self) -> usize {
        self.column
    }
    /// The field at fault, as a path (`plans.free.policies[1].w`); empty for
    /// a syntax error outside any value.
    pub fn field(&self) -> &str {
        &self.field
    }
    /// What is wrong and what is expected.
    pub fn message(&self) -> &str {
        &self.message
    }

    fn unreadable(file: &str, e: &std::io::Error) -> Self {
        ConfigFileError {
            kind: Kind::Unreadable,
            file: file.to_string(),
            line: 0,
            column: 0,
            field: String::new(),
            message: format!("cannot read the file: {e}"),
        }
    }
}

impl fmt::Display for ConfigFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if self.line > 0 {
            write!(f, ":{}:{}", self.line, self.column)?;
        }
        if !self.field.is_empty() {
            write!(f, ": {}", self.field)?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for ConfigFileError {}

/// The store holding the counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreKind {
    /// In this process (counters survive reloads, not restarts).
    Memory,
}

/// Timeouts for every phase of a proxied exchange.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// Reading a request head from a client: a client connection with no
    /// request in flight for this long (one that never finishes its head,
    /// or an idle keep-alive) is closed.
    pub client_header: Duration,
    /// Connecting to the upstream.
    pub connect: Duration,
    /// Waiting for the upstream's response head once the request is sent.
    pub upstream_header: Duration,
    /// The longest pause inside a streamed body, either way.
    pub body_idle: Duration,
    /// Keeping an idle pooled upstream connection open.
    pub pool_idle: Duration,
    /// Waiting for in-flight requests on shutdown.
    pub shutdown: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            client_header: Duration::from_secs(10),
            connect: Duration::from_secs(2),
            upstream_header: Duration::from_secs(30),
            body_idle: Duration::from_secs(30),
            pool_idle: Duration::from_secs(60),
            shutdown: Duration::from_secs(30),
        }
    }
}

/// When to shed load, and what to keep for critical work.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SheddingSettings {
    /// The most requests in flight to the upstream; 0 turns shedding off.
    pub max_in_flight: u32,
    /// The smoothed upstream latency above which everything below
    /// `CRITICAL` is shed; `None` ignores latency.
    pub max_latency: Option<Duration>,
    /// The share of `max_in_flight` kept for critical routes (0.2 = 20%).
    pub reserve: f64,
    /// `Retry-After` on a shed request, in seconds (at least 1).
    pub retry_after_s: u64,
}

impl Default for SheddingSettings {
    fn default() -> Self {
        SheddingSettings {
            max_in_flight: 0,
            max_latency: None,
            reserve: 0.2,
            retry_after_s: 1,
        }
    }
}

/// The default bound on a client's request head, in bytes: the bound the
/// gateway keeps on its upstream's answer heads.
pub const DEFAULT_MAX_HEAD_BYTES: usize = 64 * 1024;

/// The smallest request-head bound `gateway.max_head_bytes` takes (the
/// HTTP/1 server reads in buffers of this size).
pub const MIN_MAX_HEAD_BYTES: usize = 8 * 1024;

/// The largest request-head bound `gateway.max_head_bytes` takes.
pub const MAX_MAX_HEAD_BYTES: usize = 1024 * 1024;

/// The gateway's own settings (the `[gateway]` table).
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// Where to listen.
    pub listen: SocketAddr,
    /// The upstream base URI (`http://host:port`).
    pub upstream: Uri,
    /// Where the counters live.
    pub store: StoreKind,
    /// Where to serve Prometheus metrics (`GET /metrics`), if anywhere.
    pub metrics_listen: Option<SocketAddr>,
    /// Where to POST soft-limit events, if anywhere.
    pub soft_limit_webhook: Option<Uri>,
    /// Timeouts.
    pub timeouts: Timeouts,
    /// Load shedding.
    pub shedding: SheddingSettings,
    /// Whether to watch the file and reload when it changes.
    pub watch: bool,
    /// The largest request head a client may send, in bytes (request line
    /// and fields; for HTTP/2, the field list): a longer one is answered
    /// `431` and the connection closed. `gateway.max_head_bytes`, by
    /// default [`DEFAULT_MAX_HEAD_BYTES`].
    pub max_head_bytes: usize,
}

/// A loaded, validated configuration.
#[derive(Clone, Debug)]
pub struct GatewayConfig {
    /// The gateway's own settings.
    pub settings: Settings,
    /// The validated limits.
    pub limits: Limits,
    /// The files it came from (the config, then the keys file if any).
    pub sources: Vec<PathBuf>,
}

// ---------------------------------------------------------------------------
// The file model
// ---------------------------------------------------------------------------

/// The whole file: the `[gateway]` table, and the limits at the top level.
struct FileModel {
    gateway: GatewayModel,
    limits: LimitsConfig,
}

/// The top-level fields, `gateway` first (see [`split`]).
static TOP_FIELDS: Expected = Expected::new();

impl<'de> Deserialize<'de> for FileModel {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let (gateway, limits) = split(d, "gateway", &TOP_FIELDS)?;
        Ok(FileModel { gateway, limits })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GatewayModel {
    listen: String,
    upstream: String,
    #[serde(default)]
    store: Option<String>,
    #[serde(default)]
    metrics_listen: Option<String>,
    #[serde(default)]
    soft_limit_webhook: Option<String>,
    #[serde(default)]
    keys_file: Option<String>,
    #[serde(default = "yes")]
    watch: bool,
    #[serde(default)]
    max_head_bytes: Option<u64>,
    #[serde(default)]
    timeouts: TimeoutsModel,
    #[serde(default)]
    shedding: SheddingModel,
}

fn yes() -> bool {
    true
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct TimeoutsModel {
    client_header_ms: Option<u64>,
    connect_ms: Option<u64>,
    upstream_header_ms: Option<u64>,
    body_idle_ms: Option<u64>,
    pool_idle_ms: Option<u64>,
    shutdown_ms: Option<u64>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct SheddingModel {
    max_in_flight: Option<u32>,
    max_latency_ms: Option<u64>,
    reserve: Option<f64>,
    retry_after_s: Option<u64>,
}

/// One file's text and name, for locating errors.
struct Source<'a> {
    name: &'a str,
    text: &'a str,
    doc: Doc<'a>,
}

impl<'a> Source<'a> {
    fn new(name: &'a str, text: &'a str) -> Self {
        Source {
            name,
            text,
            doc: Doc::parse(text),
        }
    }

    fn at_offset(
        &self,
        kind: Kind,
        offset: usize,
        field: Option<String>,
        msg: String,
    ) -> ConfigFileError {
        let (line, column) = self.doc.line_col(offset);
        ConfigFileError {
            kind,
            file: self.name.to_string(),
            line,
            column,
            field: field.unwrap_or_else(|| self.doc.path_at(offset)),
            message: msg,
        }
    }

    fn at_field(&self, kind: Kind, field: &str, msg: impl Into<String>) -> ConfigFileError {
        let (line, column) = self
            .doc
            .span_of(field)
            .map_or((1, 1), |s| self.doc.line_col(s.start));
        ConfigFileError {
            kind,
            file: self.name.to_string(),
            line,
            column,
            field: field.to_string(),
            message: msg.into(),
        }
    }

    fn toml_error(&self, e: &toml::de::Error) -> ConfigFileError {
        let mut msg = e.message().trim().to_string();
        if let (true, Some(span)) = (msg.is_empty(), e.span()) {
            msg = crate::locate::unexpected_at(self.text, span.start);
        }
        match e.span() {
            // a syntax error (the text did not parse) has no field
            Some(span) if !self.doc.is_parsed() => {
                let field = self.field_of_unreadable_value(&span);
                self.at_offset(Kind::Syntax, span.start, Some(field), msg)
            }
            // the deserializer fails on a key only when the field is unknown
            Some(span) if self.doc.is_key(&span) => {
                self.at_offset(Kind::UnknownField, span.start, None, msg)
            }
            Some(span) => self.at_offset(Kind::Mismatch, span.start, None, msg),
            None => ConfigFileError {
                kind: match self.doc.is_parsed() {
                    true => Kind::Mismatch,
                    false => Kind::Syntax,
                },
                file: self.name.to_string(),
                line: 1,
                column: 1,
                field: String::new(),
                message: msg,
            },
        }
    }

    /// The field whose value at `span` does not parse (a number too large
    /// for any field, say): the text with a 0 in place of the value's
    /// token locates it, when that parses; empty when it does not (a
    /// broken table header).
    fn field_of_unreadable_value(&self, span: &std::ops::Range<usize>) -> String {
        let start = span.start;
        // the parser points at the value's first character: take its token
        let token = self.text.get(start..).map_or(0, |rest| {
            rest.find(|c: char| !(c.is_ascii_alphanumeric() || "_+-.:".contains(c)))
                .unwrap_or(rest.len())
        });
        let end = span.end.max(start + token).min(self.text.len());
        let (Some(before), Some(after)) = (self.text.get(..start), self.text.get(end..)) else {
            return String::new();
        };
        if start >= end {
            return String::new();
        }
        let patched = format!("{before}0{after}");
        let doc = Doc::parse(&patched);
        match doc.is_parsed() {
            true => doc.path_at(start),
            false => String::new(),
        }
    }

    fn parse<T: for<'de> Deserialize<'de>>(&self) -> Result<T, ConfigFileError> {
        toml::from_str(self.text).map_err(|e| self.toml_error(&e))
    }
}

impl GatewayConfig {
    /// Reads and validates the file at `path` (and its keys file, relative
    /// to the config's directory).
    pub fn load(path: &Path) -> Result<GatewayConfig, ConfigFileError> {
        let name = path.display().to_string();
        let text =
            std::fs::read_to_string(path).map_err(|e| ConfigFileError::unreadable(&name, &e))?;
        let mut cfg = GatewayConfig::parse(&text, &name, path.parent())?;
        cfg.sources.insert(0, path.to_path_buf());
        Ok(cfg)
    }

    /// Validates a configuration text named `name`; a keys file is looked
    /// up relative to `dir` (or the working directory).
    pub fn parse(
        text: &str,
        name: &str,
        dir: Option<&Path>,
    ) -> Result<GatewayConfig, ConfigFileError> {
        let src = Source::new(name, text);
        let FileModel {
            gateway,
            limits: mut model,
        } = src.parse()?;
        let settings = settings(&src, &gateway)?;
        let mut sources = Vec::new();
        let keys_text;
        let keys_name;
        let mut keys_src = None;
        if let Some(file) = &gateway.keys_file {
            let path = dir.unwrap_or(Path::new("")).join(file);
            keys_name = path.display().to_string();
            keys_text = std::fs::read_to_string(&path).map_err(|e| {
                src.at_field(
                    Kind::Unreadable,
                    "gateway.keys_file",
                    format!("cannot read {keys_name}: {e}; expected a TOML file of key = \"plan\" lines"),
                )
            })?;
            let ks = Source::new(&keys_name, &keys_text);
            let extra: BTreeMap<String, String> = ks.parse()?;
            for (k, p) in extra {
                if model.keys.contains_key(&k) {
                    return Err(ks.at_field(
                        Kind::Duplicate,
                        &k,
                        "this key is also listed under [keys]",
                    ));
                }
                model.keys.insert(k, p);
            }
            sources.push(path);
            keys_src = Some(ks);
        }
        let limits = model.build().map_err(|e| {
            let field = e.field();
            // a key that came from the keys file is reported there
            if let (Some(ks), Some(k)) = (&keys_src, field.strip_prefix("keys.")) {
                if !src.doc.has(field) && ks.doc.has(k) {
                    let mut err = ks.at_field(e.kind(), k, e.message());
                    err.field = field.to_string();
                    return err;
                }
            }
            src.at_field(e.kind(), field, e.message())
        })?;
        Ok(GatewayConfig {
            settings,
            limits,
            sources,
        })
    }
}

fn settings(src: &Source<'_>, g: &GatewayModel) -> Result<Settings, ConfigFileError> {
    let addr = |field: &str, s: &str| {
        s.parse::<SocketAddr>().map_err(|_| {
            src.at_field(
                Kind::InvalidValue,
                field,
                format!(
                    "{s:?} is not a socket address; expected IP:PORT such as \"127.0.0.1:8080\""
                ),
            )
        })
    };
    let listen = addr("gateway.listen", &g.listen)?;
    let upstream = http_uri(&g.upstream).map_err(|m| {
        src.at_field(
            Kind::InvalidValue,
            "gateway.upstream",
            format!("{:?}: {m}", g.upstream),
        )
    })?;
    let store = match g.store.as_deref() {
        None | Some("memory") => StoreKind::Memory,
        Some(other) => {
            return Err(src.at_field(
                Kind::InvalidValue,
                "gateway.store",
                format!("{other:?}: the gateway supports store = \"memory\""),
            ))
        }
    };
    let metrics_listen = g
        .metrics_listen
        .as_deref()
        .map(|s| addr("gateway.metrics_listen", s))
        .transpose()?;
    let soft_limit_webhook = g
        .soft_limit_webhook
        .as_deref()
        .map(|s| {
            http_uri(s).map_err(|m| {
                src.at_field(
                    Kind::InvalidValue,
                    "gateway.soft_limit_webhook",
                    format!("{s:?}: {m}"),
                )
            })
        })
        .transpose()?;
    Ok(Settings {
        listen,
        upstream,
        store,
        metrics_listen,
        soft_limit_webhook,
        timeouts: timeouts(src, &g.timeouts)?,
        shedding: shedding(src, &g.shedding)?,
        watch: g.watch,
        max_head_bytes: max_head_bytes(src, g.max_head_bytes)?,
    })
}

fn max_head_bytes(src: &Source<'_>, v: Option<u64>) -> Result<usize, ConfigFileError> {
    let Some(n) = v else {
        return Ok(DEFAULT_MAX_HEAD_BYTES);
    };
    let range = MIN_MAX_HEAD_BYTES as u64..=MAX_MAX_HEAD_BYTES as u64;
    match range.contains(&n) {
        true => Ok(n as usize),
        false => Err(src.at_field(
            Kind::OutOfRange,
            "gateway.max_head_bytes",
            format!(
                "{n} bytes is outside {MIN_MAX_HEAD_BYTES}..={MAX_MAX_HEAD_BYTES}; the default is {DEFAULT_MAX_HEAD_BYTES} (64 KiB)"
            ),
        )),
    }
}

fn timeouts(src: &Source<'_>, t: &TimeoutsModel) -> Result<Timeouts, ConfigFileError> {
    let d = Timeouts::default();
    let ms = |field: &str, v: Option<u64>, default: Duration| match v {
        None => Ok(default),
        Some(0) => Err(src.at_field(
            Kind::OutOfRange,
            &format!("gateway.timeouts.{field}"),
            "a timeout of 0 ms would fail every request; expected a number of milliseconds above 0",
        )),
        Some(ms) => Ok(Duration::from_millis(ms)),
    };
    Ok(Timeouts {
        client_header: ms("client_header_ms", t.client_header_ms, d.client_header)?,
        connect: ms("connect_ms", t.connect_ms, d.connect)?,
        upstream_header: ms(
            "upstream_header_ms",
            t.upstream_header_ms,
            d.upstream_header,
        )?,
        body_idle: ms("body_idle_ms", t.body_idle_ms, d.body_idle)?,
        pool_idle: ms("pool_idle_ms", t.pool_idle_ms, d.pool_idle)?,
        shutdown: ms("shutdown_ms", t.shutdown_ms, d.shutdown)?,
    })
}

fn shedding(src: &Source<'_>, s: &SheddingModel) -> Result<SheddingSettings, ConfigFileError> {
    let d = SheddingSettings::default();
    let reserve = s.reserve.unwrap_or(d.reserve);
    if !(0.0..=0.9).contains(&reserve) {
        return Err(src.at_field(
            Kind::OutOfRange,
            "gateway.shedding.reserve",
            format!("{reserve} is not a share between 0 and 0.9; use 0.2 to keep 20% for critical routes"),
        ));
    }
    let retry_after_s = s.retry_after_s.unwrap_or(d.retry_after_s);
    if retry_after_s == 0 {
        return Err(src.at_field(
            Kind::OutOfRange,
            "gateway.shedding.retry_after_s",
            "Retry-After must be at least 1 second",
        ));
    }
    Ok(SheddingSettings {
        max_in_flight: s.max_in_flight.unwrap_or(d.max_in_flight),
        max_latency: s
            .max_latency_ms
            .filter(|&ms| ms > 0)
            .map(Duration::from_millis),
        reserve,
        retry_after_s,
    })
}

/// Parses an `http://host:port[/base]` URI.
fn http_uri(s: &str) -> Result<Uri, String> {
    let uri: Uri = s
        .parse()
        .map_err(|_| "not a URI; expected http://HOST:PORT".to_string())?;
    match uri.scheme() {
        Some(sc) if *sc == Scheme::HTTP => {}
        Some(sc) if *sc == Scheme::HTTPS => {
            return Err("https is not supported here; expected http://HOST:PORT".into())
        }
        _ => return Err("expected http://HOST:PORT".into()),
    }
    let host_ok = uri
        .authority()
        .map(Authority::host)
        .is_some_and(|h| !h.is_empty());
    if !host_ok {
        return Err("no host; expected http://HOST:PORT".into());
    }
    Ok(uri)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"[gateway]
listen = "127.0.0.1:0"
upstream = "http://127.0.0.1:9"

[gateway.shedding]
max_in_flight = 64

[plans.free]
policies = [
  { name = "burst", algorithm = "token_bucket", q = 20, w = 2 },
  { name = "daily", algorithm = "daily", q = 10000 },
]

[plans.login]
policies = [{ name = "login", algorithm = "fixed_window", q = 5, w = 60 }]

[keys]
sk_1 = "free"

[[routes]]
method = "POST"
path = "/v1/login"
anonymous = true
plan = "login"

[[routes]]
method = "GET"
path = "/v1/rates"
criticality = "SHEDDABLE"
"#;

    fn err(text: &str) -> ConfigFileError {
        GatewayConfig::parse(text, "t.toml", None).unwrap_err()
    }

    fn patched(from: &str, to: &str) -> ConfigFileError {
        assert!(GOOD.contains(from), "{from}");
        err(&GOOD.replacen(from, to, 1))
    }

    #[test]
    fn the_good_config_loads() {
        let c = GatewayConfig::parse(GOOD, "t.toml", None).unwrap();
        assert_eq!(c.settings.max_head_bytes, 64 * 1024);
        assert_eq!(c.settings.shedding.max_in_flight, 64);
        assert_eq!(c.settings.shedding.reserve, 0.2);
        assert_eq!(c.limits.plans().len(), 2);
        assert_eq!(c.settings.upstream.port_u16(), Some(9));
    }

    #[test]
    fn a_zero_window_names_line_and_field() {
        let e = patched("q = 20, w = 2", "q = 20, w = 0");
        assert_eq!((e.line(), e.field()), (10, "plans.free.policies[0].w"));
        assert!(e.to_string().starts_with("t.toml:10:"), "{e}");
    }

    #[test]
    fn an_unknown_field_is_located() {
        let e = patched("max_in_flight = 64", "max_inflight = 64");
        assert_eq!(e.line(), 6);
        assert!(e.message().contains("unknown field `max_inflight`"), "{e}");
        assert!(e.message().contains("max_in_flight"), "{e}");
        assert_eq!(e.field(), "gateway.shedding.max_inflight");
    }

    #[test]
    fn a_wrong_type_is_located() {
        let e = patched("q = 10000", "q = \"lots\"");
        assert_eq!(e.line(), 11);
        assert_eq!(e.field(), "plans.free.policies[1].q");
    }

    #[test]
    fn a_bad_criticality_is_located() {
        let e = patched("\"SHEDDABLE\"", "\"LOW\"");
        assert_eq!((e.line(), e.field()), (29, "routes[1].criticality"));
        assert!(e.message().contains("SHEDDABLE_PLUS"), "{e}");
    }

    #[test]
    fn a_syntax_error_is_located() {
        let e = patched("[keys]", "[keys");
        assert_eq!(e.line(), 17);
    }

    #[test]
    fn gateway_settings_are_checked() {
        let e = patched("127.0.0.1:0", "localhost");
        assert_eq!((e.line(), e.field()), (2, "gateway.listen"));
        assert!(e.message().contains("IP:PORT"));
        let e = patched("http://127.0.0.1:9", "https://x");
        assert_eq!(e.field(), "gateway.upstream");
        let e = patched("max_in_flight = 64", "max_in_flight = 64\nreserve = 2.0");
        assert_eq!((e.line(), e.field()), (7, "gateway.shedding.reserve"));
        let e = patched("[gateway]\n", "[gateway]\nstore = \"redis\"\n");
        assert_eq!((e.line(), e.field()), (2, "gateway.store"));
    }

    #[test]
    fn the_head_bound_is_checked() {
        for bad in ["0", "8191", "1048577"] {
            let e = patched(
                "[gateway]\n",
                &format!("[gateway]\nmax_head_bytes = {bad}\n"),
            );
            assert_eq!((e.line(), e.field()), (2, "gateway.max_head_bytes"), "{e}");
            assert_eq!(e.kind(), Kind::OutOfRange);
            assert!(e.message().contains("65536"), "{e}");
        }
        let text = GOOD.replacen("[gateway]\n", "[gateway]\nmax_head_bytes = 16384\n", 1);
        let c = GatewayConfig::parse(&text, "t.toml", None).unwrap();
        assert_eq!(c.settings.max_head_bytes, 16384);
    }

    #[test]
    fn a_missing_table_is_named() {
        let e = err("[plans]\n");
        assert!(e.message().contains("gateway"), "{e}");
    }

    #[test]
    fn semantic_errors_from_the_limits_model_are_located() {
        let e = patched("sk_1 = \"free\"", "sk_1 = \"gold\"");
        assert_eq!((e.line(), e.field()), (18, "keys.sk_1"));
        let e = patched("plan = \"login\"", "plan = \"nope\"");
        assert_eq!((e.line(), e.field()), (24, "routes[0].plan"));
    }

    #[test]
    fn every_error_has_its_kind() {
        let cases = [
            ("[keys]", "[keys", Kind::Syntax),
            (
                "max_in_flight = 64",
                "max_inflight = 64",
                Kind::UnknownField,
            ),
            ("[keys]", "[kesy]", Kind::UnknownField),
            (
                "[plans.login]",
                "[plans.free.x]\n[plans.login]",
                Kind::UnknownField,
            ),
            ("q = 10000", "q = \"lots\"", Kind::Mismatch),
            ("path = \"/v1/rates\"", "", Kind::Mismatch),
            ("sk_1 = \"free\"", "sk_1 = \"gold\"", Kind::UnknownPlan),
            ("q = 20, w = 2", "q = 20, w = 0", Kind::InvalidPolicy),
            ("anonymous = true\n", "", Kind::InvalidValue),
            ("plan = \"login\"", "", Kind::Missing),
            ("127.0.0.1:0", "localhost", Kind::InvalidValue),
            (
                "max_in_flight = 64",
                "max_in_flight = 64\nreserve = 2.0",
                Kind::OutOfRange,
            ),
            (
                "[gateway]\n",
                "soft_limit = 2.0\n[gateway]\n",
                Kind::OutOfRange,
            ),
        ];
        for (from, to, kind) in cases {
            assert_eq!(patched(from, to).kind(), kind, "{from:?} to {to:?}");
        }
        assert_eq!(err("[plans]\n").kind(), Kind::Mismatch);
        let missing = GatewayConfig::load(Path::new("/nonexistent/paceline/gw.toml"));
        assert_eq!(missing.unwrap_err().kind(), Kind::Unreadable);
    }

    #[test]
    fn an_unknown_top_level_field_names_the_gateway_table_too() {
        let e = patched("[gateway]\n", "plan = 1\n[gateway]\n");
        assert_eq!((e.line(), e.column(), e.field()), (1, 1, "plan"));
        assert!(
            e.message()
                .starts_with("unknown field `plan`, expected one of `gateway`, `plans`, `keys`"),
            "{e}"
        );
    }

    #[test]
    fn a_number_too_large_names_its_field() {
        let e = patched("q = 20, w = 2", "q = 99999999999999999999, w = 2");
        assert_eq!(e.field(), "plans.free.policies[0].q", "{e}");
        assert_eq!(e.line(), 10, "{e}");
        let e = patched("max_in_flight = 64", "max_in_flight = 99999999999999999999");
        assert_eq!(e.field(), "gateway.shedding.max_in_flight", "{e}");
    }

    #[test]
    fn what_cannot_work_is_refused_with_its_field() {
        // a route cost no plan can hold
        let e = patched(
            "path = \"/v1/rates\"\n",
            "path = \"/v1/rates\"\ncost = 25\n",
        );
        assert_eq!(
            (e.kind(), e.field()),
            (Kind::OutOfRange, "routes[1].cost"),
            "{e}"
        );
        // an unknown method
        let e = patched("method = \"GET\"", "method = \"FETCH\"");
        assert_eq!(
            (e.kind(), e.field()),
            (Kind::InvalidValue, "routes[1].method"),
            "{e}"
        );
        // no plan at all
        let start = GOOD.find("[plans.free]").unwrap();
        let end = GOOD.find("[keys]").unwrap();
        let none = format!("{}{}", &GOOD[..start], &GOOD[end..]).replace("sk_1 = \"free\"\n", "");
        let none = none.replace("anonymous = true\nplan = \"login\"\n", "");
        let e = err(&none);
        assert_eq!((e.kind(), e.field()), (Kind::Missing, "plans"), "{e}");
    }

    #[test]
    fn the_limits_defaults_are_the_server_models() {
        let c = GatewayConfig::parse(GOOD, "t.toml", None).unwrap();
        // the model's defaults, with the one plan a configuration must give
        let mut m = LimitsConfig::default();
        let plan = r#"policies = [{ name = "b", algorithm = "token_bucket", q = 1, w = 1 }]"#;
        m.plans.insert("p".into(), toml::from_str(plan).unwrap());
        let d = m.build().unwrap();
        assert_eq!(c.limits.problem_base(), d.problem_base());
        assert_eq!(c.limits.soft_limit(), d.soft_limit());
        assert_eq!(c.limits.usage_path(), d.usage_path());
        assert_eq!(c.limits.dialects(), d.dialects());
        assert_eq!(c.limits.escalation(), d.escalation());
    }

    #[test]
    fn keys_can_come_from_a_file() {
        let dir = std::env::temp_dir().join(format!("pl-gw-keys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("keys.toml"), "sk_2 = \"free\"\nsk_3 = \"gold\"\n").unwrap();
        let text = GOOD.replacen("[gateway]\n", "[gateway]\nkeys_file = \"keys.toml\"\n", 1);
        let e = GatewayConfig::parse(&text, "t.toml", Some(&dir)).unwrap_err();
        assert!(e.file().ends_with("keys.toml"), "{e}");
        assert_eq!((e.line(), e.field()), (2, "keys.sk_3"));
        assert_eq!(e.kind(), Kind::UnknownPlan);
        std::fs::write(dir.join("keys.toml"), "sk_1 = \"free\"\n").unwrap();
        let e = GatewayConfig::parse(&text, "t.toml", Some(&dir)).unwrap_err();
        assert_eq!((e.kind(), e.line()), (Kind::Duplicate, 1));
        std::fs::remove_file(dir.join("keys.toml")).unwrap();
        let e = GatewayConfig::parse(&text, "t.toml", Some(&dir)).unwrap_err();
        assert_eq!(
            (e.kind(), e.field()),
            (Kind::Unreadable, "gateway.keys_file")
        );
        std::fs::write(dir.join("keys.toml"), "sk_2 = \"free\"\n").unwrap();
        let c = GatewayConfig::parse(&text, "t.toml", Some(&dir)).unwrap();
        assert_eq!(c.limits.plan_for_key("sk_2").unwrap().name(), "free");
        assert_eq!(c.sources.len(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
