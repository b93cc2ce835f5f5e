//! envoyproxy/ratelimit's YAML, read into rules over paceline's policies.
//!
//! A file is one domain: `domain`, then `descriptors`, each a `key`, an
//! optional `value` (exact, or with `*` matching any run of characters),
//! an optional `rate_limit` (`unit`, `requests_per_unit`, `unlimited`,
//! `name`, `replaces`), `shadow_mode`, `detailed_metric`,
//! `value_to_metric`, `share_threshold` and nested `descriptors`. A
//! directory is every `*.yaml`/`*.yml` file in it, one domain each.
//!
//! paceline's extensions, in the same file (envoyproxy/ratelimit refuses
//! them, so a file that uses them is paceline's):
//!
//! - in `rate_limit`: `algorithm` — `fixed_window` (the default, and
//!   envoyproxy/ratelimit's: windows of one `unit` aligned to the epoch),
//!   `token_bucket` (continuous refill of `requests_per_unit` per `unit`,
//!   holding `burst`, by default `requests_per_unit`), `sliding_window`
//!   (an approximate sliding window) or `sliding_log` (an exact one);
//!   `reset_at: "HH:MM"` moves a `day` window's edge from 00:00 UTC;
//! - at the top: `fail_mode: open | closed` — what a request of this
//!   domain gets when the store does not answer in time (`open`, the
//!   default: `OK`; `closed`: `OVER_LIMIT`).
//!
//! Every mistake is an error naming the file, the line and the fix: a key
//! nobody reads, a key twice at one level, a unit that does not exist, a
//! number out of range, a descriptor twice in one list.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use paceline_core::{Algorithm, FailMode, Plan, Policy};

use crate::yaml::{self, Kind, Node};

/// A configuration file that could not be used, located.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// The file at fault.
    pub file: PathBuf,
    /// Its 1-based line (0 when the error concerns the whole file).
    pub line: usize,
    /// What is wrong, and how to fix it.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            0 => write!(f, "{}: {}", self.file.display(), self.message),
            l => write!(f, "{}:{l}: {}", self.file.display(), self.message),
        }
    }
}

impl std::error::Error for ConfigError {}

/// The unit of a rule, as envoyproxy/ratelimit names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Unit {
    /// 1 s.
    Second,
    /// 60 s.
    Minute,
    /// 3,600 s.
    Hour,
    /// 86,400 s (a UTC day).
    Day,
    /// 7 days, aligned to the epoch (as envoyproxy/ratelimit's).
    Week,
    /// 30 days, aligned to the epoch (as envoyproxy/ratelimit's).
    Month,
    /// 365 days, aligned to the epoch (as envoyproxy/ratelimit's).
    Year,
}

impl Unit {
    const ALL: [(&'static str, Unit); 7] = [
        ("second", Unit::Second),
        ("minute", Unit::Minute),
        ("hour", Unit::Hour),
        ("day", Unit::Day),
        ("week", Unit::Week),
        ("month", Unit::Month),
        ("year", Unit::Year),
    ];

    /// The unit's length in seconds.
    pub fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Month => 30 * 86_400,
            Unit::Year => 365 * 86_400,
        }
    }

    /// The unit of `rls.proto`'s `RateLimit.Unit` number (none for
    /// `UNKNOWN` or a number it does not define).
    pub fn from_proto(n: i32) -> Option<Unit> {
        Unit::ALL.iter().map(|(_, u)| *u).find(|u| u.proto() == n)
    }

    /// The unit's number in `rls.proto`'s `RateLimit.Unit`.
    pub fn proto(self) -> i32 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 2,
            Unit::Hour => 3,
            Unit::Day => 4,
            Unit::Month => 5,
            Unit::Year => 6,
            Unit::Week => 7,
        }
    }
}

/// What a matched rule does.
#[derive(Clone, Debug)]
pub enum Limit {
    /// `unlimited: true`: always `OK`, nothing counted.
    Unlimited,
    /// `requests_per_unit: 0`: always `OVER_LIMIT`, nothing counted.
    Blocked,
    /// A limit over paceline's policies (a plan of one policy).
    Plan(Plan),
}

/// One `rate_limit` block, ready to decide.
#[derive(Debug)]
pub struct Rule {
    /// The name published in the IETF fields and the problem's `limit`:
    /// the block's `name`, else the descriptor path (`key_value.key`),
    /// made a valid policy name.
    pub name: String,
    /// The block's own `name`, for `replaces` and `current_limit`.
    pub given_name: Option<String>,
    /// The names this rule replaces when both apply.
    pub replaces: Vec<String>,
    /// The limit.
    pub limit: Limit,
    /// The unit.
    pub unit: Option<Unit>,
    /// `requests_per_unit`.
    pub requests_per_unit: u32,
    /// `shadow_mode: true`: decided and counted, never `OVER_LIMIT`.
    pub shadow: bool,
    /// The line of the `rate_limit` block.
    pub line: usize,
}

/// A rule a descriptor matched, with the key it counts under.
#[derive(Clone, Debug)]
pub struct Match {
    /// The rule.
    pub rule: Arc<Rule>,
    /// The key the store counts under: the domain and each entry's key
    /// and value (a shared wildcard's pattern instead of the value).
    pub store_key: String,
    /// The metric key (`key_value.key`), as envoyproxy/ratelimit's.
    pub metric_key: String,
}

#[derive(Debug, Default)]
struct Level {
    exact: HashMap<(String, String), usize>,
    nodes: Vec<DescNode>,
}

#[derive(Debug)]
struct DescNode {
    key: String,
    value: Option<String>,
    wildcard: bool,
    rule: Option<Arc<Rule>>,
    children: Level,
    detailed_metric: bool,
    value_to_metric: bool,
    share_threshold: bool,
}

/// One domain's rules.
#[derive(Debug)]
pub struct Domain {
    name: String,
    fail_mode: FailMode,
    root: Level,
    file: PathBuf,
}

impl Domain {
    /// The domain's name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// What a request gets when the store does not answer.
    pub fn fail_mode(&self) -> FailMode {
        self.fail_mode
    }
    /// The file it came from.
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// The rule a descriptor's entries match, as envoyproxy/ratelimit
    /// matches: level by level, an exact `value` first, then a wildcard,
    /// then a descriptor without a value; the rule is the one of the node
    /// the last entry reaches (none when the entries end above a rule, or
    /// go deeper than the configuration).
    pub fn find<'a, I>(&self, entries: I) -> Option<Match>
    where
        I: IntoIterator<Item = (&'a str, &'a str)>,
    {
        let mut level = &self.root;
        let mut node: Option<&DescNode> = None;
        let mut store_key = self.name.clone();
        let mut parts: Vec<(&DescNode, &str)> = Vec::new();
        for (k, v) in entries {
            let n = level.find(k, v)?;
            store_key.push('\u{1f}');
            store_key.push_str(k);
            store_key.push('=');
            match (&n.value, n.share_threshold) {
                (Some(p), true) => store_key.push_str(p),
                _ => store_key.push_str(v),
            }
            parts.push((n, v));
            level = &n.children;
            node = Some(n);
        }
        let rule = node?.rule.clone()?;
        let detailed = node.is_some_and(|n| n.detailed_metric);
        let metric_key = parts
            .iter()
            .map(|(n, v)| n.metric_part(v, detailed))
            .collect::<Vec<_>>()
            .join(".");
        Some(Match {
            rule,
            store_key,
            metric_key,
        })
    }
}

impl Domain {
    /// The rule a descriptor's own `limit` override makes (as
    /// envoyproxy/ratelimit: a fixed window of `requests_per_unit` per
    /// `unit`, in place of any configured rule), counted under the
    /// descriptor's entries; none for an unknown unit.
    pub fn override_rule<'a, I>(
        &self,
        entries: I,
        requests_per_unit: u32,
        unit: i32,
    ) -> Option<Match>
    where
        I: IntoIterator<Item = (&'a str, &'a str)>,
    {
        let unit = Unit::from_proto(unit)?;
        let mut store_key = format!("{}\u{1f}override", self.name);
        let mut path = Vec::new();
        for (k, v) in entries {
            store_key.push('\u{1f}');
            store_key.push_str(k);
            store_key.push('=');
            store_key.push_str(v);
            path.push(format!("{k}_{v}"));
        }
        let metric_key = path.join(".");
        let name = policy_name(&metric_key);
        let limit = match requests_per_unit {
            0 => Limit::Blocked,
            q => {
                let p = Policy::fixed_window(&name, u64::from(q), unit.seconds()).ok()?;
                Limit::Plan(Plan::new(&name, vec![p]).ok()?)
            }
        };
        let rule = Rule {
            name,
            given_name: None,
            replaces: Vec::new(),
            limit,
            unit: Some(unit),
            requests_per_unit,
            shadow: false,
            line: 0,
        };
        Some(Match {
            rule: Arc::new(rule),
            store_key,
            metric_key,
        })
    }
}

impl Level {
    fn find(&self, k: &str, v: &str) -> Option<&DescNode> {
        if let Some(&i) = self.exact.get(&(k.to_string(), v.to_string())) {
            return Some(&self.nodes[i]);
        }
        let wild = self
            .nodes
            .iter()
            .find(|n| n.key == k && n.wildcard && n.value.as_deref().is_some_and(|p| glob(p, v)));
        wild.or_else(|| self.nodes.iter().find(|n| n.key == k && n.value.is_none()))
    }
}

impl DescNode {
    fn metric_part(&self, runtime: &str, detailed: bool) -> String {
        let shared_prefix = || {
            let p = self.value.as_deref().unwrap_or("");
            p.split('*').next().unwrap_or("").to_string()
        };
        let value = if detailed || self.value_to_metric {
            match self.share_threshold {
                true => Some(shared_prefix()),
                false => Some(runtime.to_string()),
            }
        } else {
            self.value.clone()
        };
        match value {
            Some(v) => format!("{}_{v}", self.key),
            None => self.key.clone(),
        }
    }
}

/// `*` matches any run of characters (none included), each in order.
pub(crate) fn glob(pattern: &str, value: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = value.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty();
    };
    for m in middle {
        match rest.find(m) {
            Some(i) => rest = &rest[i + m.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// Every domain the service knows.
#[derive(Debug, Default)]
pub struct RlsConfig {
    domains: HashMap<String, Arc<Domain>>,
}

impl RlsConfig {
    /// Reads a file (one domain) or a directory (every `*.yaml`/`*.yml`
    /// file in it, one domain each).
    pub fn load(path: &Path) -> Result<RlsConfig, ConfigError> {
        let mut config = RlsConfig::default();
        for (file, text) in read_sources(path)? {
            config.add(&file, &text)?;
        }
        Ok(config)
    }

    /// Reads one domain from `text` (named `file` in errors).
    pub fn from_str(file: &Path, text: &str) -> Result<RlsConfig, ConfigError> {
        let mut config = RlsConfig::default();
        config.add(file, text)?;
        Ok(config)
    }

    /// Adds one file's domain; a domain already known is an error.
    pub fn add(&mut self, file: &Path, text: &str) -> Result<(), ConfigError> {
        let domain = parse_domain(file, text)?;
        if let Some(other) = self.domains.get(&domain.name) {
            return Err(ConfigError {
                file: file.to_path_buf(),
                line: 0,
                message: format!(
                    "domain {:?} is already defined in {}; a domain lives in one file",
                    domain.name,
                    other.file.display()
                ),
            });
        }
        self.domains.insert(domain.name.clone(), Arc::new(domain));
        Ok(())
    }

    /// The domain named `name`.
    pub fn domain(&self, name: &str) -> Option<&Arc<Domain>> {
        self.domains.get(name)
    }

    /// The domains, in no particular order.
    pub fn domains(&self) -> impl Iterator<Item = &Arc<Domain>> {
        self.domains.values()
    }
}

/// The files a path names, with their text: the file itself, or a
/// directory's `*.yaml`/`*.yml` files in name order.
pub fn read_sources(path: &Path) -> Result<Vec<(PathBuf, String)>, ConfigError> {
    let io = |file: &Path, e: std::io::Error| ConfigError {
        file: file.to_path_buf(),
        line: 0,
        message: format!("cannot read: {e}"),
    };
    let meta = std::fs::metadata(path).map_err(|e| io(path, e))?;
    let mut files = Vec::new();
    if meta.is_dir() {
        for entry in std::fs::read_dir(path).map_err(|e| io(path, e))? {
            let p = entry.map_err(|e| io(path, e))?.path();
            let yaml = p.extension().is_some_and(|e| e == "yaml" || e == "yml");
            if yaml && p.is_file() {
                files.push(p);
            }
        }
        files.sort();
    } else {
        files.push(path.to_path_buf());
    }
    files
        .into_iter()
        .map(|f| {
            let text = std::fs::read_to_string(&f).map_err(|e| io(&f, e))?;
            Ok((f, text))
        })
        .collect()
}

/// Reads what a file says into a domain.
struct Reader<'a> {
    file: &'a Path,
}

type Res<T> = Result<T, ConfigError>;

fn parse_domain(file: &Path, text: &str) -> Res<Domain> {
    let err = |line: usize, message: String| ConfigError {
        file: file.to_path_buf(),
        line,
        message,
    };
    let root = yaml::parse(text)
        .map_err(|e| err(e.line, format!("not valid YAML: {}", e.message)))?
        .ok_or_else(|| err(0, "the file is empty; it needs a `domain`".into()))?;
    let r = Reader { file };
    let entries = r.map(&root, "the file")?;
    r.known(
        entries,
        &["domain", "descriptors", "fail_mode"],
        "at the top",
    )?;
    let d = get(entries, "domain").ok_or_else(|| {
        err(
            root.line,
            "`domain` is missing: name the domain this file limits".into(),
        )
    })?;
    let name = r.string(d, "domain")?;
    if name.is_empty() {
        return Err(err(d.line, "`domain` must not be empty".into()));
    }
    let fail_mode = match get(entries, "fail_mode") {
        None => FailMode::Open,
        Some(n) => match r.string(n, "fail_mode")?.as_str() {
            "open" => FailMode::Open,
            "closed" => FailMode::Closed,
            other => {
                return Err(err(
                    n.line,
                    format!("fail_mode {other:?}: use \"open\" (answer OK) or \"closed\" (answer OVER_LIMIT) when the store does not answer"),
                ))
            }
        },
    };
    let root_level = match get(entries, "descriptors") {
        Some(n) => r.level(n, "")?,
        None => Level::default(),
    };
    Ok(Domain {
        name,
        fail_mode,
        root: root_level,
        file: file.to_path_buf(),
    })
}

fn get<'n>(entries: &'n [(String, usize, Node)], key: &str) -> Option<&'n Node> {
    entries.iter().find(|(k, _, _)| k == key).map(|(_, _, n)| n)
}

const DESCRIPTOR_KEYS: &[&str] = &[
    "key",
    "value",
    "rate_limit",
    "descriptors",
    "shadow_mode",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
];

const RATE_LIMIT_KEYS: &[&str] = &[
    "unit",
    "requests_per_unit",
    "unlimited",
    "name",
    "replaces",
    "algorithm",
    "burst",
    "reset_at",
];

impl Reader<'_> {
    fn err<T>(&self, line: usize, message: impl Into<String>) -> Res<T> {
        Err(ConfigError {
            file: self.file.to_path_buf(),
            line,
            message: message.into(),
        })
    }

    fn map<'n>(&self, n: &'n Node, what: &str) -> Res<&'n [(String, usize, Node)]> {
        match &n.kind {
            Kind::Map(e) => Ok(e),
            _ => self.err(
                n.line,
                format!("{what} must be a mapping (`key: value` lines)"),
            ),
        }
    }

    fn known(&self, entries: &[(String, usize, Node)], keys: &[&str], at: &str) -> Res<()> {
        for (k, line, _) in entries {
            if !keys.contains(&k.as_str()) {
                return self.err(
                    *line,
                    format!(
                        "unknown key {k:?} {at}; the keys here are: {}",
                        keys.join(", ")
                    ),
                );
            }
        }
        Ok(())
    }

    fn string(&self, n: &Node, field: &str) -> Res<String> {
        match &n.kind {
            Kind::Scalar { text, plain } => {
                if *plain && matches!(text.as_str(), "~" | "null" | "Null" | "NULL" | "") {
                    return self.err(n.line, format!("`{field}` is empty"));
                }
                Ok(text.clone())
            }
            _ => self.err(n.line, format!("`{field}` must be a string")),
        }
    }

    fn boolean(&self, n: &Node, field: &str) -> Res<bool> {
        match &n.kind {
            Kind::Scalar { text, plain: true } => match text.as_str() {
                "true" | "True" | "TRUE" => Ok(true),
                "false" | "False" | "FALSE" => Ok(false),
                _ => self.err(
                    n.line,
                    format!("`{field}` must be true or false, not {text:?}"),
                ),
            },
            _ => self.err(
                n.line,
                format!("`{field}` must be true or false (unquoted)"),
            ),
        }
    }

    fn number(&self, n: &Node, field: &str, max: u64) -> Res<u64> {
        let Kind::Scalar { text, .. } = &n.kind else {
            return self.err(n.line, format!("`{field}` must be a whole number"));
        };
        let t = text.trim();
        if t.starts_with('-') {
            return self.err(
                n.line,
                format!("`{field}` must not be negative (it is {t})"),
            );
        }
        if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
            return self.err(
                n.line,
                format!("`{field}` must be a whole number, not {t:?}"),
            );
        }
        match t.parse::<u64>() {
            Ok(v) if v <= max => Ok(v),
            _ => self.err(n.line, format!("`{field}` is {t}; at most {max}")),
        }
    }

    /// A list of descriptors; `path` is the metric path above it.
    fn level(&self, n: &Node, path: &str) -> Res<Level> {
        let Kind::Seq(items) = &n.kind else {
            return self.err(n.line, "`descriptors` must be a list (`- key: …` items)");
        };
        let mut level = Level::default();
        for item in items {
            let node = self.descriptor(item, path)?;
            let dup = level
                .nodes
                .iter()
                .any(|o| o.key == node.key && o.value == node.value);
            if dup {
                let v = node.value.as_deref().unwrap_or("(any value)");
                return self.err(
                    item.line,
                    format!("descriptor {}={v} appears twice in this list", node.key),
                );
            }
            if let (Some(v), false) = (&node.value, node.wildcard) {
                level
                    .exact
                    .insert((node.key.clone(), v.clone()), level.nodes.len());
            }
            level.nodes.push(node);
        }
        Ok(level)
    }

    fn descriptor(&self, n: &Node, path: &str) -> Res<DescNode> {
        let entries = self.map(n, "a descriptor")?;
        self.known(entries, DESCRIPTOR_KEYS, "in a descriptor")?;
        let key = match get(entries, "key") {
            Some(k) => self.string(k, "key")?,
            None => return self.err(n.line, "a descriptor needs a `key`"),
        };
        let value = get(entries, "value")
            .map(|v| self.string(v, "value"))
            .transpose()?;
        let flag = |name: &str| {
            get(entries, name)
                .map(|v| self.boolean(v, name))
                .transpose()
                .map(|b| b.unwrap_or(false))
        };
        let shadow = flag("shadow_mode")?;
        let share_threshold = flag("share_threshold")?;
        let wildcard = value.as_deref().is_some_and(|v| v.contains('*'));
        if share_threshold && !wildcard {
            let line = entries
                .iter()
                .find(|e| e.0 == "share_threshold")
                .map_or(n.line, |e| e.1);
            return self.err(
                line,
                "share_threshold goes with a wildcard value (one with `*`)",
            );
        }
        let part = match &value {
            Some(v) => format!("{key}_{v}"),
            None => key.clone(),
        };
        let path = match path {
            "" => part,
            p => format!("{p}.{part}"),
        };
        let rule = get(entries, "rate_limit")
            .map(|r| self.rule(r, &path, shadow))
            .transpose()?
            .map(Arc::new);
        if shadow && rule.is_none() {
            let line = entries
                .iter()
                .find(|e| e.0 == "shadow_mode")
                .map_or(n.line, |e| e.1);
            return self.err(
                line,
                "shadow_mode goes with a `rate_limit` on the same descriptor",
            );
        }
        let children = match get(entries, "descriptors") {
            Some(d) => self.level(d, &path)?,
            None => Level::default(),
        };
        Ok(DescNode {
            key,
            value,
            wildcard,
            rule,
            children,
            detailed_metric: flag("detailed_metric")?,
            value_to_metric: flag("value_to_metric")?,
            share_threshold,
        })
    }

    fn rule(&self, n: &Node, path: &str, shadow: bool) -> Res<Rule> {
        let entries = self.map(n, "`rate_limit`")?;
        self.known(entries, RATE_LIMIT_KEYS, "in `rate_limit`")?;
        let line_of = |k: &str| entries.iter().find(|e| e.0 == k).map_or(n.line, |e| e.1);
        let given_name = get(entries, "name")
            .map(|v| self.string(v, "name"))
            .transpose()?;
        let replaces = match get(entries, "replaces") {
            None => Vec::new(),
            Some(r) => self.replaces(r)?,
        };
        let unlimited = get(entries, "unlimited")
            .map(|v| self.boolean(v, "unlimited"))
            .transpose()?
            .unwrap_or(false);
        let name = policy_name(given_name.as_deref().unwrap_or(path));
        if unlimited {
            for k in [
                "unit",
                "requests_per_unit",
                "algorithm",
                "burst",
                "reset_at",
            ] {
                if get(entries, k).is_some() {
                    return self.err(
                        line_of(k),
                        format!("an unlimited rate_limit takes no `{k}`"),
                    );
                }
            }
            return Ok(Rule {
                name,
                given_name,
                replaces,
                limit: Limit::Unlimited,
                unit: None,
                requests_per_unit: 0,
                shadow,
                line: n.line,
            });
        }
        let unit = match get(entries, "unit") {
            None => return self.err(n.line, "`rate_limit` needs a `unit` (second, minute, hour, day, week, month or year) or `unlimited: true`"),
            Some(u) => {
                let text = self.string(u, "unit")?;
                let lower = text.to_ascii_lowercase();
                match Unit::ALL.iter().find(|(s, _)| *s == lower) {
                    Some((_, u)) => *u,
                    None => {
                        return self.err(
                            u.line,
                            format!("unknown unit {text:?}: use second, minute, hour, day, week, month or year"),
                        )
                    }
                }
            }
        };
        let rpu = match get(entries, "requests_per_unit") {
            None => {
                return self.err(
                    n.line,
                    "`rate_limit` needs `requests_per_unit` (0 blocks every request)",
                )
            }
            Some(v) => self.number(v, "requests_per_unit", u64::from(u32::MAX))?,
        };
        let limit = match rpu {
            0 => {
                for k in ["algorithm", "burst", "reset_at"] {
                    if get(entries, k).is_some() {
                        return self.err(line_of(k), format!("requests_per_unit 0 blocks every request; `{k}` has nothing to shape"));
                    }
                }
                Limit::Blocked
            }
            q => Limit::Plan(self.plan(entries, n, &name, unit, q, shadow)?),
        };
        Ok(Rule {
            name,
            given_name,
            replaces,
            limit,
            unit: Some(unit),
            requests_per_unit: rpu as u32,
            shadow,
            line: n.line,
        })
    }

    fn replaces(&self, r: &Node) -> Res<Vec<String>> {
        let Kind::Seq(items) = &r.kind else {
            return self.err(r.line, "`replaces` must be a list of `- name: …` items");
        };
        items
            .iter()
            .map(|i| {
                let e = self.map(i, "an item of `replaces`")?;
                self.known(e, &["name"], "in `replaces`")?;
                match get(e, "name") {
                    Some(v) => self.string(v, "name"),
                    None => self.err(i.line, "an item of `replaces` needs a `name`"),
                }
            })
            .collect()
    }

    fn plan(
        &self,
        entries: &[(String, usize, Node)],
        n: &Node,
        name: &str,
        unit: Unit,
        q: u64,
        shadow: bool,
    ) -> Res<Plan> {
        let line_of = |k: &str| entries.iter().find(|e| e.0 == k).map_or(n.line, |e| e.1);
        let algorithm = get(entries, "algorithm")
            .map(|v| self.string(v, "algorithm"))
            .transpose()?
            .unwrap_or_else(|| "fixed_window".into());
        let w = unit.seconds();
        if get(entries, "burst").is_some() && algorithm != "token_bucket" {
            return self.err(
                line_of("burst"),
                "`burst` goes with `algorithm: token_bucket`",
            );
        }
        if get(entries, "reset_at").is_some() && (algorithm != "fixed_window" || unit != Unit::Day)
        {
            return self.err(
                line_of("reset_at"),
                "`reset_at` goes with `unit: day` on a fixed window",
            );
        }
        let built = match algorithm.as_str() {
            "fixed_window" => {
                let offset_s = match get(entries, "reset_at") {
                    Some(v) => self.time_of_day(v)?,
                    None => 0,
                };
                Policy::new(name, Algorithm::FixedWindow { offset_s }, q, w)
            }
            "token_bucket" => {
                let burst = match get(entries, "burst") {
                    Some(v) => self.number(v, "burst", u64::from(u32::MAX))?,
                    None => q,
                };
                if burst == 0 {
                    return self.err(line_of("burst"), "`burst` must be at least 1");
                }
                // capacity `burst`, refilled at q per w: burst per burst·w/q
                let span = u128::from(burst) * u128::from(w);
                if span % u128::from(q) != 0 {
                    return self.err(
                        line_of("burst"),
                        format!("a token bucket refills `burst` in whole seconds: burst × {w} s must be a multiple of requests_per_unit ({burst} × {w} / {q} is not whole)"),
                    );
                }
                let bw = u64::try_from(span / u128::from(q)).unwrap_or(u64::MAX);
                Policy::token_bucket(name, burst, bw)
            }
            "sliding_window" => Policy::sliding_counter(name, q, w),
            "sliding_log" => Policy::sliding_log(name, q, w),
            other => {
                return self.err(
                    line_of("algorithm"),
                    format!("unknown algorithm {other:?}: use fixed_window, token_bucket, sliding_window or sliding_log"),
                )
            }
        };
        let policy = built.map_err(|e| ConfigError {
            file: self.file.to_path_buf(),
            line: n.line,
            message: format!("this rate_limit cannot be built: {e}"),
        })?;
        let plan = Plan::new(name, vec![policy.with_shadow(shadow)]).map_err(|e| ConfigError {
            file: self.file.to_path_buf(),
            line: n.line,
            message: e.to_string(),
        })?;
        #[cfg(feature = "redis")]
        if let Err(e) = paceline_redis::supports(&plan) {
            return self.err(n.line, e);
        }
        Ok(plan)
    }

    fn time_of_day(&self, v: &Node) -> Res<u64> {
        let text = self.string(v, "reset_at")?;
        let parsed = text.split_once(':').and_then(|(h, m)| {
            let (h, m) = (h.parse::<u64>().ok()?, m.parse::<u64>().ok()?);
            (h < 24 && m < 60 && !text.starts_with('-')).then_some(h * 3_600 + m * 60)
        });
        match parsed {
            Some(s) => Ok(s),
            None => self.err(
                v.line,
                format!("reset_at {text:?}: write a UTC time of day as \"HH:MM\""),
            ),
        }
    }
}

/// A policy name from any text: letters, digits, `_`, `-` and `.`, at
/// most 64 characters (others become `_`).
pub(crate) fn policy_name(text: &str) -> String {
    let mut s: String = text
        .chars()
        .map(
            |c| match c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.') {
                true => c,
                false => '_',
            },
        )
        .take(64)
        .collect();
    if s.is_empty() {
        s.push('_');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Result<RlsConfig, ConfigError> {
        RlsConfig::from_str(Path::new("t.yaml"), text)
    }

    #[test]
    fn globs() {
        assert!(glob("value*", "value1"));
        assert!(glob("value*", "value"));
        assert!(!glob("value*", "valu"));
        assert!(glob("/api/*/action", "/api/1/action"));
        assert!(!glob("/api/*/action", "/api/1/other"));
        assert!(glob("/a/*/r/*/x", "/a/v1/r/2/x"));
        assert!(!glob("a*a", "a"));
    }

    #[test]
    fn errors_name_the_line() {
        let e = load("domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n").unwrap_err();
        assert_eq!(e.line, 5);
        assert!(e.message.contains("unknown unit"), "{e}");
        let e = load("domain: d\ndescriptors:\n  - key: a\n    rate_limt: {}\n").unwrap_err();
        assert_eq!(e.line, 4);
        assert!(e.message.contains("unknown key \"rate_limt\""), "{e}");
        let e = load("domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: -1\n").unwrap_err();
        assert!(e.message.contains("negative"), "{e}");
        let e = load("domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 99999999999\n").unwrap_err();
        assert!(e.message.contains("at most"), "{e}");
        let e = load("domain: d\ndescriptors:\n  - key: a\n  - key: a\n").unwrap_err();
        assert_eq!(e.line, 4);
        let e = load("domain: d\ndomain: e\n").unwrap_err();
        assert!(e.message.contains("twice"), "{e}");
        assert!(e.to_string().starts_with("t.yaml:2: "), "{e}");
        let e = load("domain: [\n").unwrap_err();
        assert!(e.message.contains("not valid YAML"), "{e}");
        let e = load("descriptors: []\n").unwrap_err();
        assert!(e.message.contains("domain"), "{e}");
    }

    #[test]
    fn token_bucket_needs_whole_seconds() {
        let ok = load("domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 10\n      algorithm: token_bucket\n      burst: 20\n").unwrap();
        let m = ok.domain("d").unwrap().find([("a", "x")]).unwrap();
        let Limit::Plan(p) = &m.rule.limit else {
            panic!()
        };
        assert_eq!((p.policy(0).quota(), p.policy(0).window_s()), (20, 2));
        let e = load("domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 3\n      algorithm: token_bucket\n      burst: 1\n").unwrap_err();
        assert!(e.message.contains("whole"), "{e}");
    }

    #[test]
    fn matching_order() {
        let c = load("domain: d\ndescriptors:\n  - key: ip\n    rate_limit: {unit: second, requests_per_unit: 10}\n  - key: ip\n    value: 50.0.0.5\n    rate_limit: {unit: second, requests_per_unit: 0}\n  - key: ip\n    value: 10.*\n    rate_limit: {unit: second, requests_per_unit: 5}\n").unwrap();
        let d = c.domain("d").unwrap();
        let rpu = |v: &str| d.find([("ip", v)]).unwrap().rule.requests_per_unit;
        assert_eq!(rpu("1.2.3.4"), 10);
        assert_eq!(rpu("50.0.0.5"), 0);
        assert_eq!(rpu("10.1.1.1"), 5);
        assert!(d.find([("ip", "1"), ("x", "y")]).is_none());
        assert_eq!(d.find([("ip", "1.2.3.4")]).unwrap().metric_key, "ip");
    }
}

#[cfg(test)]
mod cut {
    use super::*;

    /// Every prefix of a full file, and every file with one byte
    /// replaced: an error with a line inside the text, never a panic.
    #[test]
    fn damaged_files_are_errors_not_panics() {
        let full = "domain: d\nfail_mode: closed\ndescriptors:\n  - key: a\n    value: x*y\n    share_threshold: true\n    descriptors:\n      - key: b\n        rate_limit:\n          name: n\n          replaces: [{name: m}]\n          unit: day\n          requests_per_unit: 7\n          reset_at: \"01:30\"\n  - key: c\n    shadow_mode: true\n    rate_limit: {unit: second, requests_per_unit: 4, algorithm: token_bucket, burst: 8}\n";
        let lines = full.lines().count() + 1;
        for cut in 0..full.len() {
            if let Err(e) = RlsConfig::from_str(Path::new("t"), &full[..cut]) {
                assert!(e.line <= lines, "{e}");
            }
        }
        for i in 0..full.len() {
            for b in [b'-', b':', b'*', b'[', b'\'', b'9', b' ', b'\n'] {
                let mut v = full.as_bytes().to_vec();
                v[i] = b;
                let Ok(t) = String::from_utf8(v) else {
                    continue;
                };
                if let Ok(c) = RlsConfig::from_str(Path::new("t"), &t) {
                    for d in c.domains() {
                        let _ = d.find([("a", "xzy"), ("b", "1")]);
                    }
                }
            }
        }
    }
}
