//! The operations kit of `deploy/` against the code it deploys.
//!
//! - The Grafana dashboard and the Prometheus alert rules name only series
//!   a running gateway serves: a gateway with its counters in a Redis of
//!   its own is driven through admitted requests, 429s on a burst and on a
//!   quota, a shed 503, an intake refusal, a body deadline, upstream
//!   timeouts, reloads applied and refused, and Redis killed (degraded,
//!   fail-closed 503s) and started again; a second gateway serves TLS and
//!   is sent bytes that are not TLS. Every metric name in every panel's
//!   PromQL, every variable's query and every rule's expression must then
//!   be on `/metrics` (exactly: a summary's `_sum` and `_count`, never a
//!   `_bucket` the exporter does not write), with the labels the
//!   expression selects or groups by.
//! - The files are read the way their tools would, without the tools: the
//!   dashboard's JSON, the rules' YAML (alert, expr, for, severity,
//!   summary), the Dockerfile's instructions and stages, the systemd
//!   unit's directives, `deploy/gateway.toml` through `paceline gateway
//!   --check`. When `promtool` is installed, the dashboard's expressions
//!   go through its parser too (`deploy/check.sh` runs the tools on the
//!   rest: `systemd-analyze verify`, `promtool check rules` and `test
//!   rules`).
//!
//! Every wait is bounded; every process started here is killed when the
//! test ends.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use yaml_rust2::{Yaml, YamlLoader};

const WAIT: Duration = Duration::from_secs(20);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn deploy(rel: &str) -> PathBuf {
    repo().join("deploy").join(rel)
}

fn read(rel: &str) -> String {
    let p = deploy(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Labels Prometheus adds when it scrapes: never on `/metrics`.
const TARGET_LABELS: [&str; 2] = ["job", "instance"];

// ---------------------------------------------------------------------------
// PromQL, as far as these files need it: metric selectors and `by` lists
// ---------------------------------------------------------------------------

/// One `name{label op "value", ...}` in an expression.
#[derive(Debug, Clone)]
struct Selector {
    name: String,
    matchers: Vec<(String, String, String)>,
    at: usize,
}

/// One `agg by (labels) (expr)`: the labels, and where its expression is.
#[derive(Debug, Clone)]
struct Grouping {
    labels: Vec<String>,
    span: (usize, usize),
}

fn is_ident_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_' || c == b':'
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b':'
}

/// Reads a quoted string at `i`; returns its content and the index after it.
fn string_at(b: &[u8], i: usize) -> (String, usize) {
    let q = b[i];
    let mut j = i + 1;
    let mut out = Vec::new();
    while j < b.len() && b[j] != q {
        if b[j] == b'\\' && q != b'`' && j + 1 < b.len() {
            j += 1;
        }
        out.push(b[j]);
        j += 1;
    }
    assert!(
        j < b.len(),
        "an unterminated string in {:?}",
        String::from_utf8_lossy(b)
    );
    (String::from_utf8(out).expect("UTF-8"), j + 1)
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && b[i].is_ascii_whitespace() {
        i += 1;
    }
    i
}

fn ident_at(b: &[u8], mut i: usize) -> (String, usize) {
    let s = i;
    while i < b.len() && is_ident(b[i]) {
        i += 1;
    }
    (String::from_utf8(b[s..i].to_vec()).expect("ASCII"), i)
}

/// The index of the `)` closing the `(` at `i`.
fn closing(b: &[u8], i: usize) -> usize {
    let mut depth = 0;
    let mut j = i;
    while j < b.len() {
        match b[j] {
            b'"' | b'\'' | b'`' => {
                j = string_at(b, j).1;
                continue;
            }
            b'(' => depth += 1,
            b')' => {
                depth -= 1;
                if depth == 0 {
                    return j;
                }
            }
            _ => {}
        }
        j += 1;
    }
    panic!("unbalanced parentheses in {:?}", String::from_utf8_lossy(b));
}

/// The metric selectors (names starting `paceline_`) and `by` groupings of
/// one PromQL expression.
fn scan(expr: &str) -> (Vec<Selector>, Vec<Grouping>) {
    let b = expr.as_bytes();
    let (mut sels, mut groups) = (Vec::new(), Vec::new());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'"' || c == b'\'' || c == b'`' {
            i = string_at(b, i).1;
        } else if c.is_ascii_digit() || c == b'$' {
            // a number, a duration (5m) or a Grafana variable
            i += 1;
            while i < b.len() && (is_ident(b[i]) || b[i] == b'.') {
                i += 1;
            }
        } else if is_ident_start(c) {
            let (word, end) = ident_at(b, i);
            i = end;
            if word == "by" {
                let open = skip_ws(b, i);
                assert_eq!(b[open], b'(', "`by` without a label list in {expr}");
                let close = closing(b, open);
                let labels = expr[open + 1..close]
                    .split(',')
                    .map(|l| l.trim().to_string())
                    .filter(|l| !l.is_empty())
                    .collect();
                let start = skip_ws(b, close + 1);
                assert_eq!(b[start], b'(', "write `agg by (labels) (expr)` in {expr}");
                groups.push(Grouping {
                    labels,
                    span: (start, closing(b, start)),
                });
                i = close + 1;
            } else if word.starts_with("paceline_") {
                let at = i - word.len();
                let mut matchers = Vec::new();
                let mut j = skip_ws(b, i);
                if j < b.len() && b[j] == b'{' {
                    j += 1;
                    loop {
                        j = skip_ws(b, j);
                        if b[j] == b'}' {
                            j += 1;
                            break;
                        }
                        let (label, e) = ident_at(b, j);
                        j = skip_ws(b, e);
                        let op_len = if b[j..].starts_with(b"=~")
                            || b[j..].starts_with(b"!~")
                            || b[j..].starts_with(b"!=")
                        {
                            2
                        } else {
                            assert_eq!(b[j], b'=', "a matcher without an operator in {expr}");
                            1
                        };
                        let op = expr[j..j + op_len].to_string();
                        j = skip_ws(b, j + op_len);
                        let (value, e) = string_at(b, j);
                        matchers.push((label, op, value));
                        j = skip_ws(b, e);
                        if b[j] == b',' {
                            j += 1;
                        }
                    }
                    i = j;
                }
                sels.push(Selector {
                    name: word,
                    matchers,
                    at,
                });
            }
        } else {
            i += 1;
        }
    }
    (sels, groups)
}

#[test]
fn the_scanner_reads_selectors_and_groupings() {
    let (s, g) = scan(
        r#"sum by (plan, policy) (rate(paceline_decisions_total{job=~"$job", outcome=~"a|b"}[$__rate_interval])) / max(paceline_x_seconds_count) > 0.5"#,
    );
    assert_eq!(s.len(), 2, "{s:?}");
    assert_eq!(s[0].name, "paceline_decisions_total");
    assert_eq!(
        s[0].matchers,
        vec![
            ("job".into(), "=~".into(), "$job".into()),
            ("outcome".into(), "=~".into(), "a|b".into())
        ]
    );
    assert_eq!(s[1].name, "paceline_x_seconds_count");
    assert_eq!(g.len(), 1);
    assert_eq!(g[0].labels, vec!["plan", "policy"]);
    assert!(g[0].span.0 < s[0].at && s[0].at < g[0].span.1);
    assert!(s[1].at > g[0].span.1);
}

// ---------------------------------------------------------------------------
// The files
// ---------------------------------------------------------------------------

/// Every PromQL expression of the dashboard, with where it is.
fn dashboard_exprs(d: &Value) -> Vec<(String, String)> {
    fn panels(list: &Value, out: &mut Vec<(String, String)>) {
        for p in list.as_array().into_iter().flatten() {
            let title = p["title"].as_str().unwrap_or("?").to_string();
            for t in p["targets"].as_array().into_iter().flatten() {
                let expr = t["expr"]
                    .as_str()
                    .unwrap_or_else(|| panic!("panel {title:?}: a target without expr: {t}"));
                out.push((format!("panel {title:?}"), expr.to_string()));
            }
            panels(&p["panels"], out);
        }
    }
    let mut out = Vec::new();
    panels(&d["panels"], &mut out);
    for v in d["templating"]["list"].as_array().into_iter().flatten() {
        if v["type"] == "query" {
            let q = v["query"]["query"]
                .as_str()
                .or(v["query"].as_str())
                .expect("a query variable's query");
            out.push((
                format!("variable ${}", v["name"].as_str().unwrap()),
                q.into(),
            ));
        }
    }
    out
}

fn dashboard() -> Value {
    serde_json::from_str(&read("grafana/paceline-dashboard.json"))
        .expect("deploy/grafana/paceline-dashboard.json is JSON")
}

fn rules() -> Yaml {
    let docs = YamlLoader::load_from_str(&read("prometheus/paceline-alerts.yml"))
        .expect("deploy/prometheus/paceline-alerts.yml is YAML");
    assert_eq!(docs.len(), 1, "one YAML document");
    docs.into_iter().next().unwrap()
}

/// Every alert rule's name and expression.
fn rule_exprs(doc: &Yaml) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for g in doc["groups"].as_vec().expect("groups: a list") {
        for r in g["rules"].as_vec().expect("rules: a list") {
            let name = r["alert"].as_str().expect("alert: a name");
            out.push((
                format!("alert {name}"),
                r["expr"].as_str().expect("expr").to_string(),
            ));
        }
    }
    out
}

fn is_duration(s: &str) -> bool {
    let num = s.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let unit = &s[num.len()..];
    !num.is_empty()
        && num.bytes().all(|c| c.is_ascii_digit())
        && ["ms", "s", "m", "h", "d", "w", "y"].contains(&unit)
}

#[test]
fn the_dashboard_is_a_grafana_dashboard_on_a_chosen_prometheus() {
    let d = dashboard();
    assert!(
        d["title"].is_string() && d["uid"].is_string(),
        "title and uid"
    );
    assert!(d["schemaVersion"].as_u64().is_some_and(|v| v >= 36));
    let vars = d["templating"]["list"].as_array().expect("templating.list");
    let ds = vars
        .iter()
        .find(|v| v["type"] == "datasource")
        .expect("a data source variable");
    assert_eq!(ds["query"], "prometheus");
    let ds_ref = format!("${{{}}}", ds["name"].as_str().unwrap());
    let mut ids = BTreeSet::new();
    let mut titles = BTreeSet::new();
    let mut stack = vec![&d["panels"]];
    let mut count = 0;
    while let Some(list) = stack.pop() {
        for p in list.as_array().into_iter().flatten() {
            let title = p["title"].as_str().expect("every panel has a title");
            assert!(
                ids.insert(p["id"].as_u64().expect("an id")),
                "{title}: id reused"
            );
            for k in ["h", "w", "x", "y"] {
                assert!(p["gridPos"][k].is_u64(), "{title}: gridPos.{k}");
            }
            stack.push(&p["panels"]);
            if p["type"] == "row" {
                continue;
            }
            count += 1;
            assert!(titles.insert(title), "two panels titled {title:?}");
            assert!(
                p["description"].as_str().is_some_and(|s| !s.is_empty()),
                "{title}: a description says what the panel shows"
            );
            assert_eq!(p["datasource"]["uid"], ds_ref.as_str(), "{title}");
            let targets = p["targets"].as_array().expect("targets");
            assert!(!targets.is_empty(), "{title}: no queries");
            for t in targets {
                assert_eq!(t["datasource"]["uid"], ds_ref.as_str(), "{title}");
                assert!(t["refId"].is_string(), "{title}: refId");
            }
        }
    }
    assert!(count >= 20, "{count} panels");
    // the panels the issue asks for, by the series they read
    let exprs = dashboard_exprs(&d);
    let names: BTreeSet<String> = exprs
        .iter()
        .flat_map(|(_, e)| scan(e).0)
        .map(|s| s.name)
        .collect();
    for want in [
        "paceline_decisions_total",
        "paceline_decision_seconds",
        "paceline_gateway_upstream_seconds",
        "paceline_gateway_shed_total",
        "paceline_gateway_intake_refused_total",
        "paceline_gateway_request_body_deadlines_total",
        "paceline_gateway_tls_handshakes_total",
        "paceline_gateway_reloads_total",
        "paceline_redis_call_seconds_count",
        "paceline_redis_errors_total",
        "paceline_redis_degraded",
        "paceline_redis_degraded_seconds_sum",
    ] {
        assert!(names.contains(want), "no panel reads {want}");
    }
    // the exporter writes summaries: a _bucket would never match
    assert!(!names.iter().any(|n| n.ends_with("_bucket")), "{names:?}");
    promtool_parses(&exprs);
}

/// With promtool installed, every dashboard expression goes through
/// Prometheus's own parser (as a recording rule, Grafana's variables
/// given values).
fn promtool_parses(exprs: &[(String, String)]) {
    let ok = Command::new("promtool")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("promtool not installed: the dashboard's PromQL was only scanned");
        return;
    }
    let mut text = String::from("groups:\n  - name: dashboard\n    rules:\n");
    // a variable's label_values() is Grafana's, not PromQL
    let panels = exprs.iter().filter(|(w, _)| w.starts_with("panel "));
    for (i, (_, e)) in panels.enumerate() {
        let e = e
            .replace("$__rate_interval", "5m")
            .replace("$__interval", "1m")
            .replace("$__range", "3h");
        text.push_str(&format!(
            "      - record: paceline_dashboard:expr_{i}\n        expr: {}\n",
            serde_json::to_string(&e).unwrap()
        ));
    }
    let dir = TempDir::new("promtool");
    let file = dir.file("dashboard-rules.yml", &text);
    let out = Command::new("promtool")
        .args(["check", "rules"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "promtool refuses a dashboard expression:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn every_alert_rule_is_complete_and_documented() {
    let doc = rules();
    let readme = read("README.md");
    let groups = doc["groups"].as_vec().expect("groups: a list");
    let mut names = BTreeSet::new();
    for g in groups {
        assert!(g["name"].as_str().is_some(), "a group without a name");
        for r in g["rules"].as_vec().expect("rules: a list") {
            let name = r["alert"].as_str().unwrap_or_else(|| {
                panic!("a rule without alert (recording rules belong elsewhere): {r:?}")
            });
            assert!(names.insert(name.to_string()), "{name} twice");
            let expr = r["expr"].as_str().unwrap_or_else(|| panic!("{name}: expr"));
            assert!(!scan(expr).0.is_empty(), "{name}: reads no paceline series");
            let f = r["for"].as_str().unwrap_or_else(|| panic!("{name}: for"));
            assert!(is_duration(f), "{name}: for = {f:?}");
            let sev = r["labels"]["severity"]
                .as_str()
                .unwrap_or_else(|| panic!("{name}: labels.severity"));
            assert!(
                ["warning", "critical"].contains(&sev),
                "{name}: severity {sev}"
            );
            for a in ["summary", "description"] {
                assert!(
                    r["annotations"][a].as_str().is_some_and(|s| !s.is_empty()),
                    "{name}: annotations.{a}"
                );
            }
            assert!(
                readme.contains(name),
                "deploy/README.md does not explain {name}"
            );
        }
    }
    for want in [
        "PacelineRedisDegraded",
        "Paceline503sRising",
        "PacelineDecisionLatencyHigh",
        "PacelineDecisionLatencyHighRedis",
        "PacelineUpstreamErrors",
        "PacelineReloadRefused",
    ] {
        assert!(names.contains(want), "no alert {want}");
    }
}

/// The Dockerfile's instructions, continuation lines joined, comments and
/// parser directives dropped.
fn dockerfile() -> Vec<(String, String)> {
    let text = read("Dockerfile");
    let mut out = Vec::new();
    let mut cur = String::new();
    for line in text.lines() {
        let t = line.trim();
        if cur.is_empty() && (t.is_empty() || t.starts_with('#')) {
            continue;
        }
        if !cur.is_empty() && t.starts_with('#') {
            continue; // a comment inside a continued instruction
        }
        match t.strip_suffix('\\') {
            Some(head) => {
                cur.push_str(head);
                cur.push(' ');
            }
            None => {
                cur.push_str(t);
                let (ins, rest) = cur.split_once(char::is_whitespace).unwrap_or((&cur, ""));
                out.push((ins.to_ascii_uppercase(), rest.trim().to_string()));
                cur.clear();
            }
        }
    }
    assert!(
        cur.is_empty(),
        "the Dockerfile ends inside a continued line"
    );
    out
}

#[test]
fn the_dockerfile_builds_in_one_stage_and_runs_unprivileged_in_another() {
    const KNOWN: [&str; 18] = [
        "FROM",
        "RUN",
        "CMD",
        "LABEL",
        "EXPOSE",
        "ENV",
        "ADD",
        "COPY",
        "ENTRYPOINT",
        "VOLUME",
        "USER",
        "WORKDIR",
        "ARG",
        "ONBUILD",
        "STOPSIGNAL",
        "HEALTHCHECK",
        "SHELL",
        "MAINTAINER",
    ];
    let ins = dockerfile();
    for (i, rest) in &ins {
        assert!(
            KNOWN.contains(&i.as_str()),
            "unknown instruction {i} {rest}"
        );
        assert!(!rest.is_empty() || i == "CMD", "{i} with nothing after it");
        assert_ne!(i, "MAINTAINER", "deprecated: use LABEL");
        if i == "ADD" {
            assert!(!rest.contains("://"), "ADD of a URL: {rest}");
        }
    }
    // stages: (name, instructions)
    type Stage = (Option<String>, Vec<(String, String)>);
    let mut stages: Vec<Stage> = Vec::new();
    for (i, rest) in ins {
        if i == "FROM" {
            let words: Vec<&str> = rest.split_whitespace().collect();
            let name = match words.as_slice() {
                [_image] => None,
                [_image, as_, name] if as_.eq_ignore_ascii_case("as") => Some(name.to_string()),
                _ => panic!("FROM {rest}: expected IMAGE [AS NAME]"),
            };
            stages.push((name, Vec::new()));
        } else {
            match stages.last_mut() {
                Some(s) => s.1.push((i, rest)),
                None => assert_eq!(i, "ARG", "{i} before the first FROM"),
            }
        }
    }
    assert!(stages.len() >= 2, "multi-stage: {} stage(s)", stages.len());
    let builder = &stages[0];
    let builder_name = builder
        .0
        .as_deref()
        .expect("the build stage is named (AS builder)");
    let build = builder
        .1
        .iter()
        .find(|(i, r)| i == "RUN" && r.contains("cargo build"))
        .expect("the build stage runs cargo build");
    for flag in ["--release", "--locked", "-p paceline"] {
        assert!(
            build.1.contains(flag),
            "cargo build without {flag}: {}",
            build.1
        );
    }
    // what the build stage copies in from the context exists there
    for (i, r) in &builder.1 {
        if i == "COPY" && !r.starts_with("--from") {
            let words: Vec<&str> = r.split_whitespace().collect();
            for src in &words[..words.len() - 1] {
                assert!(
                    repo().join(src).exists(),
                    "COPY {src}: not in the repository"
                );
            }
        }
    }
    let last = &stages.last().unwrap().1;
    let text = |i: &str| -> Vec<&str> {
        last.iter()
            .filter(|(x, _)| x == i)
            .map(|(_, r)| r.as_str())
            .collect()
    };
    let user = *text("USER").last().expect("the final stage sets USER");
    let who = user.split(':').next().unwrap();
    assert!(
        who != "root" && who != "0",
        "the final stage runs as {user}"
    );
    assert!(
        text("COPY")
            .iter()
            .any(|r| r.starts_with(&format!("--from={builder_name} "))
                && r.trim_end().ends_with("/usr/local/bin/paceline")),
        "the binary is copied from {builder_name} to /usr/local/bin/paceline: {:?}",
        text("COPY")
    );
    assert!(
        text("COPY")
            .iter()
            .any(|r| r.ends_with("/etc/paceline/examples")),
        "the examples at /etc/paceline/examples"
    );
    for r in text("RUN") {
        assert!(
            !r.contains("cargo") && !r.contains("rustc"),
            "a compiler in the final stage: {r}"
        );
    }
    let exposed: Vec<&str> = text("EXPOSE")
        .iter()
        .flat_map(|r| r.split_whitespace())
        .collect();
    for port in ["8080", "9464"] {
        assert!(exposed.contains(&port), "EXPOSE {port}");
    }
    let json = |i: &str| -> Vec<String> {
        let r = *text(i).last().unwrap_or_else(|| panic!("no {i}"));
        serde_json::from_str(r).unwrap_or_else(|e| panic!("{i} in exec form (JSON): {r}: {e}"))
    };
    assert_eq!(json("ENTRYPOINT"), ["paceline"]);
    assert_eq!(
        json("CMD"),
        ["gateway", "--config", "/etc/paceline/gateway.toml"]
    );
}

/// The unit's directives: (section, key) → values, in order.
fn unit() -> BTreeMap<(String, String), Vec<String>> {
    let mut out: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    let mut section = String::new();
    for (n, line) in read("systemd/paceline-gateway.service").lines().enumerate() {
        let t = line.trim();
        if t.is_empty() || t.starts_with('#') || t.starts_with(';') {
            continue;
        }
        if let Some(s) = t.strip_prefix('[').and_then(|s| s.strip_suffix(']')) {
            section = s.to_string();
            continue;
        }
        assert!(
            !t.ends_with('\\'),
            "line {}: keep directives on one line",
            n + 1
        );
        let (k, v) = t
            .split_once('=')
            .unwrap_or_else(|| panic!("line {}: not KEY=VALUE: {t}", n + 1));
        assert!(!section.is_empty(), "line {}: outside any section", n + 1);
        out.entry((section.clone(), k.trim().to_string()))
            .or_default()
            .push(v.trim().to_string());
    }
    out
}

#[test]
fn the_unit_runs_the_gateway_sandboxed_and_reloads_on_sighup() {
    let u = unit();
    let sections: BTreeSet<&str> = u.keys().map(|(s, _)| s.as_str()).collect();
    assert_eq!(sections, BTreeSet::from(["Install", "Service", "Unit"]));
    let get = |k: &str| -> Vec<String> {
        u.get(&("Service".to_string(), k.to_string()))
            .cloned()
            .unwrap_or_else(|| panic!("[Service] {k}= is missing"))
    };
    let one = |k: &str| get(k).last().unwrap().clone();
    assert_eq!(one("Type"), "simple");
    assert_eq!(
        one("ExecStart"),
        "/usr/local/bin/paceline gateway --config /etc/paceline/gateway.toml"
    );
    assert!(
        get("ExecReload")
            .iter()
            .any(|r| r == "/bin/kill -HUP $MAINPID"),
        "ExecReload sends SIGHUP: {:?}",
        get("ExecReload")
    );
    for (k, v) in [
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("PrivateDevices", "yes"),
        ("ProtectKernelTunables", "yes"),
        ("ProtectKernelModules", "yes"),
        ("ProtectKernelLogs", "yes"),
        ("ProtectControlGroups", "yes"),
        ("RestrictAddressFamilies", "AF_INET AF_INET6 AF_UNIX"),
        ("RestrictNamespaces", "yes"),
        ("LockPersonality", "yes"),
        ("MemoryDenyWriteExecute", "yes"),
        ("CapabilityBoundingSet", ""),
        ("LimitNOFILE", "65536"),
        ("Restart", "on-failure"),
        ("DynamicUser", "yes"),
    ] {
        assert_eq!(one(k), v, "[Service] {k}");
    }
    assert_eq!(get("SystemCallFilter")[0], "@system-service");
    assert!(get("EnvironmentFile").iter().any(|f| f.starts_with('-')));
    assert_eq!(
        u[&("Install".to_string(), "WantedBy".to_string())],
        ["multi-user.target"]
    );
    // the command lines are ones the binary takes
    for line in get("ExecStartPre").iter().chain(&get("ExecReload")) {
        if let Some(args) = line.strip_prefix("/usr/local/bin/paceline ") {
            let args: Vec<&str> = args.split_whitespace().collect();
            assert_eq!(args, ["gateway", "--check", "/etc/paceline/gateway.toml"]);
        }
    }
}

#[test]
fn the_deployable_configuration_passes_the_check() {
    let out = Command::new(env!("CARGO_BIN_EXE_paceline"))
        .args(["gateway", "--check"])
        .arg(deploy("gateway.toml"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "paceline gateway --check deploy/gateway.toml:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

// ---------------------------------------------------------------------------
// The run
// ---------------------------------------------------------------------------

struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("pl-deploy-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    fn file(&self, name: &str, text: &str) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn lines(r: impl Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

fn wait_line(rx: &Receiver<String>, what: &str) -> String {
    let end = Instant::now() + WAIT;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) if l.contains(what) => return l,
            Ok(_) => continue,
            Err(e) => panic!("no line with {what:?}: {e}"),
        }
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A `redis-server` of this test's own, killed on drop.
struct Redis {
    port: u16,
    dir: TempDir,
    child: Option<Child>,
}

impl Redis {
    fn start() -> Redis {
        let ok = Command::new("redis-server")
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            ok,
            "redis-server is not installed: this test starts its own Redis. \
             Install the Debian package (apt-get install redis-server), or run \
             scripts/test.sh, which installs it"
        );
        let mut r = Redis {
            port: free_port(),
            dir: TempDir::new("redis"),
            child: None,
        };
        r.spawn();
        r
    }

    fn spawn(&mut self) {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir.0)
            .args(["--daemonize", "no", "--loglevel", "warning"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        self.child = Some(child);
        let end = Instant::now() + WAIT;
        while Instant::now() < end {
            if let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) {
                let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
                let mut buf = [0u8; 16];
                if s.write_all(b"PING\r\n").is_ok()
                    && s.read(&mut buf)
                        .is_ok_and(|n| buf[..n].starts_with(b"+PONG"))
                {
                    return;
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("redis-server on port {} did not answer", self.port);
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
    }
}

/// An upstream on loopback: `200 ok` (keep-alive), except `/hang` (never:
/// the connection closes after 4 s) and `/slow`, which says it arrived and
/// answers once released (or after 10 s).
struct Upstream {
    addr: SocketAddr,
    slow_arrived: Receiver<()>,
    release: std::sync::mpsc::Sender<()>,
}

/// What the upstream's connections share.
#[derive(Clone)]
struct Slow {
    arrived: std::sync::mpsc::Sender<()>,
    release: Arc<Mutex<Receiver<()>>>,
}

fn upstream() -> Upstream {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let (arrived, slow_arrived) = channel();
    let (release, released) = channel();
    let slow = Slow {
        arrived,
        release: Arc::new(Mutex::new(released)),
    };
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { continue };
            let slow = slow.clone();
            std::thread::spawn(move || serve_upstream(s, &slow));
        }
    });
    Upstream {
        addr,
        slow_arrived,
        release,
    }
}

fn serve_upstream(mut s: TcpStream, slow: &Slow) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            match s.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
        let path = head.split_whitespace().nth(1).unwrap_or("/").to_string();
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .map_or(0, |v| v.trim().parse().unwrap_or(0));
        while buf.len() < end + len {
            match s.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        buf.drain(..end + len);
        match path.as_str() {
            "/hang" => {
                std::thread::sleep(Duration::from_secs(4));
                return;
            }
            "/slow" => {
                let _ = slow.arrived.send(());
                let _ = slow
                    .release
                    .lock()
                    .unwrap()
                    .recv_timeout(Duration::from_secs(10));
            }
            _ => {}
        }
        if s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            .is_err()
        {
            return;
        }
    }
}

/// A `paceline gateway` process, killed on drop.
struct Gateway {
    child: Child,
    out: Receiver<String>,
    err: Receiver<String>,
    addr: SocketAddr,
    metrics: SocketAddr,
}

impl Gateway {
    fn start(config: &Path) -> Gateway {
        let mut child = Command::new(env!("CARGO_BIN_EXE_paceline"))
            .args(["gateway", "--config"])
            .arg(config)
            .env("PACELINE_KEY_HASH_SECRET", "one secret for the deploy test")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let out = lines(child.stdout.take().unwrap());
        let err = lines(child.stderr.take().unwrap());
        let addr_of = |line: &str, scheme: &str| -> SocketAddr {
            let w = line
                .split_whitespace()
                .find_map(|w| w.strip_prefix(scheme))
                .unwrap_or_else(|| panic!("no {scheme} address in {line:?}"));
            w.trim_end_matches("/metrics").parse().unwrap()
        };
        let metrics = addr_of(&wait_line(&out, "metrics on "), "http://");
        let listening = wait_line(&out, "listening on ");
        let scheme = if listening.contains("https://") {
            "https://"
        } else {
            "http://"
        };
        let addr = addr_of(&listening, scheme);
        Gateway {
            child,
            out,
            err,
            addr,
            metrics,
        }
    }

    fn hangup(&self) {
        let ok = Command::new("kill")
            .args(["-HUP", &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -HUP");
    }

    fn scrape(&self) -> String {
        let (status, body) = exchange(
            self.metrics,
            "GET /metrics HTTP/1.1\r\nhost: metrics\r\nconnection: close\r\n\r\n",
        );
        assert_eq!(status, 200, "GET /metrics: {body}");
        body
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends `raw` on a new connection and reads the answer to its end.
fn exchange(addr: SocketAddr, raw: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    s.write_all(raw.as_bytes()).unwrap();
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    status_of(&buf)
}

fn status_of(buf: &[u8]) -> (u16, String) {
    let text = String::from_utf8_lossy(buf).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {text:?}"));
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (status, body)
}

fn get(gw: &Gateway, path: &str, key: &str) -> u16 {
    exchange(
        gw.addr,
        &format!(
            "GET {path} HTTP/1.1\r\nhost: api\r\nauthorization: Bearer {key}\r\nconnection: close\r\n\r\n"
        ),
    )
    .0
}

/// A POST whose head announces 1000 body bytes and only 10 follow: it
/// waits in the intake, holding a receiving place, until answered.
fn unfinished_post(gw: &Gateway) -> TcpStream {
    let mut s = TcpStream::connect(gw.addr).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    s.write_all(
        b"POST /upload HTTP/1.1\r\nhost: api\r\nauthorization: Bearer sk_free\r\ncontent-length: 1000\r\n\r\n0123456789",
    )
    .unwrap();
    s
}

fn answer(mut s: TcpStream) -> u16 {
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    status_of(&buf).0
}

/// Repeats `step` until `done` holds of a scrape.
fn until(gw: &Gateway, what: &str, mut step: impl FnMut(), done: impl Fn(&Exposition) -> bool) {
    let end = Instant::now() + WAIT;
    loop {
        step();
        if done(&Exposition::parse(&gw.scrape())) {
            return;
        }
        assert!(Instant::now() < end, "waited in vain for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn redis_config(upstream: SocketAddr, redis_port: u16) -> String {
    format!(
        r#"[gateway]
listen = "127.0.0.1:0"
upstream = "http://{upstream}"
metrics_listen = "127.0.0.1:0"
store = "redis"
watch = false

[gateway.redis]
url = "redis://127.0.0.1:{redis_port}"
deadline_ms = 1000
connect_timeout_ms = 500
degraded_share = 0.5

[gateway.timeouts]
upstream_header_ms = 2000
request_body_ms = 1500

[gateway.limits]
max_receiving = 1

# SHEDDABLE work gets floor(2 * (1 - 2 * 0.2)) = 1 place
[gateway.shedding]
max_in_flight = 2

[escalation]
extend_after = 2
block_after = 4

# fail open: decided by the degraded limiter while Redis is away; a shadow
# policy that would refuse from the second request on
[plans.free]
refund_sent_failures = true
policies = [
  {{ name = "burst", algorithm = "token_bucket", q = 1000, w = 3600 }},
  {{ name = "preview", algorithm = "fixed_window", q = 1, w = 3600, shadow = true }},
]

# 429 rate_limited from the third request; retries inside the wait are
# strikes, and escalate
[plans.tiny]
policies = [{{ name = "burst", algorithm = "token_bucket", q = 2, w = 600, kind = "burst" }}]

# a soft limit at 4 of 5, then 429 quota_exhausted
[plans.quota]
policies = [{{ name = "hour", algorithm = "fixed_window", q = 5, w = 3600, kind = "quota" }}]

# fail closed: 503 while Redis is away
[plans.strict]
policies = [{{ name = "burst", algorithm = "token_bucket", q = 1000, w = 3600, fail = "closed" }}]

[keys]
sk_free = "free"
sk_tiny = "tiny"
sk_quota = "quota"
sk_strict = "strict"

[[routes]]
method = "GET"
path = "/slow"
criticality = "SHEDDABLE"
"#
    )
}

fn tls_config(upstream: SocketAddr) -> String {
    format!(
        r#"[gateway]
listen = "127.0.0.1:0"
upstream = "http://{upstream}"
metrics_listen = "127.0.0.1:0"
watch = false

[gateway.tls]
cert_file = "cert.pem"
key_file = "key.pem"

[plans.free]
policies = [{{ name = "burst", algorithm = "token_bucket", q = 10, w = 1 }}]

[keys]
sk_free = "free"
"#
    )
}

/// The series of one `/metrics` text: (name, labels, value).
struct Exposition {
    series: Vec<(String, BTreeMap<String, String>, f64)>,
}

impl Exposition {
    fn parse(text: &str) -> Exposition {
        let mut series = Vec::new();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let b = line.as_bytes();
            let (name, mut i) = ident_at(b, 0);
            assert!(!name.is_empty(), "not a sample line: {line:?}");
            let mut labels = BTreeMap::new();
            if b.get(i) == Some(&b'{') {
                i += 1;
                loop {
                    i = skip_ws(b, i);
                    if b[i] == b'}' {
                        break;
                    }
                    let (k, e) = ident_at(b, i);
                    assert_eq!(b[e], b'=', "{line:?}");
                    let (v, e) = string_at(b, e + 1);
                    labels.insert(k, v);
                    i = e;
                    if b[i] == b',' {
                        i += 1;
                    }
                }
            }
            let value = line[i..]
                .trim_start_matches('}')
                .split_whitespace()
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no value in {line:?}"));
            series.push((name, labels, value));
        }
        Exposition { series }
    }

    fn merge(mut self, other: Exposition) -> Exposition {
        self.series.extend(other.series);
        self
    }

    fn of<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a BTreeMap<String, String>> + 'a {
        self.series
            .iter()
            .filter(move |(n, _, _)| n == name)
            .map(|(_, l, _)| l)
    }

    /// The sum of the series of `name` whose labels include `labels`.
    fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.series
            .iter()
            .filter(|(n, l, _)| {
                n == name
                    && labels
                        .iter()
                        .all(|(k, v)| l.get(*k).is_some_and(|x| x == v))
            })
            .map(|(_, _, v)| v)
            .sum()
    }

    fn has(&self, name: &str) -> bool {
        self.of(name).next().is_some()
    }

    fn has_value(&self, name: &str, label: &str, value: &str) -> bool {
        self.of(name)
            .any(|l| l.get(label).is_some_and(|v| v == value))
    }

    /// What is wrong with `expr` against these series, one line each.
    fn faults(&self, source: &str, expr: &str) -> Vec<String> {
        let (sels, groups) = scan(expr);
        let mut out = Vec::new();
        for s in &sels {
            if !self.has(&s.name) {
                out.push(format!("{source}: {} is not on /metrics", s.name));
                continue;
            }
            for (label, op, value) in &s.matchers {
                if TARGET_LABELS.contains(&label.as_str()) {
                    continue;
                }
                if !self.of(&s.name).any(|l| l.contains_key(label)) {
                    out.push(format!("{source}: {} has no label {label}", s.name));
                    continue;
                }
                let seen = match op.as_str() {
                    "=" => self.has_value(&s.name, label, value),
                    "=~" if value
                        .bytes()
                        .all(|c| c.is_ascii_alphanumeric() || b"_.|".contains(&c)) =>
                    {
                        value.split('|').any(|v| self.has_value(&s.name, label, v))
                    }
                    _ => true,
                };
                if !seen {
                    out.push(format!(
                        "{source}: no {}{{{label}{op}{value:?}}} on /metrics",
                        s.name
                    ));
                }
            }
            for g in &groups {
                if !(g.span.0 < s.at && s.at < g.span.1) {
                    continue;
                }
                for label in &g.labels {
                    if !TARGET_LABELS.contains(&label.as_str())
                        && !self.of(&s.name).any(|l| l.contains_key(label))
                    {
                        out.push(format!(
                            "{source}: by ({label}) but {} has no {label}",
                            s.name
                        ));
                    }
                }
            }
        }
        out
    }
}

#[test]
fn every_series_of_the_dashboard_and_the_alerts_is_on_metrics_after_a_short_run() {
    // what each step started at: on a failure, or with --nocapture, the
    // time a loaded machine took
    let start = Instant::now();
    let step = |what: &str| eprintln!("{:>8.3} s  {what}", start.elapsed().as_secs_f64());
    let up = upstream();
    let mut redis = Redis::start();
    let dir = TempDir::new("run");
    let config = dir.file("gateway.toml", &redis_config(up.addr, redis.port));
    let gw = Gateway::start(&config);

    step("redis");
    // Redis answers (the first call loads the functions)
    until(
        &gw,
        "a decision from Redis",
        || assert_eq!(get(&gw, "/ok", "sk_free"), 200),
        |m| m.has("paceline_redis_call_seconds_count"),
    );
    step("admitted");
    // admitted, and refused by the shadow policy alone
    for _ in 0..5 {
        assert_eq!(get(&gw, "/ok", "sk_free"), 200);
    }
    step("429");
    // 429 on a burst, then strikes inside the wait: the deny cache answers,
    // escalation extends the wait
    let tiny: Vec<u16> = (0..8).map(|_| get(&gw, "/ok", "sk_tiny")).collect();
    assert_eq!(&tiny[..3], [200, 200, 429], "{tiny:?}");
    // a soft limit at 4 of 5, then 429 on the quota
    let quota: Vec<u16> = (0..7).map(|_| get(&gw, "/ok", "sk_quota")).collect();
    assert_eq!(quota[5], 429, "{quota:?}");
    step("shed");
    // a shed 503: a sheddable request held at the upstream takes the only
    // sheddable place
    let addr = gw.addr;
    let held = std::thread::spawn(move || {
        exchange(
            addr,
            "GET /slow HTTP/1.1\r\nhost: api\r\nauthorization: Bearer sk_free\r\nconnection: close\r\n\r\n",
        )
        .0
    });
    up.slow_arrived
        .recv_timeout(WAIT)
        .expect("the sheddable request reached the upstream");
    assert_eq!(get(&gw, "/slow", "sk_free"), 503);
    up.release.send(()).unwrap();
    assert_eq!(held.join().unwrap(), 200);
    step("upstream timeout");
    // the upstream never answers: 504 past upstream_header_ms, refunded
    assert_eq!(get(&gw, "/hang", "sk_free"), 504);
    step("intake");
    // a body still arriving holds the only receiving place (it has one once
    // the limiter has decided it): the next one is refused at the intake,
    // and the first is cut off at request_body_ms
    let decided = |m: &Exposition| m.sum("paceline_decisions_total", &[("plan", "free")]);
    let before = decided(&Exposition::parse(&gw.scrape()));
    let first = unfinished_post(&gw);
    until(
        &gw,
        "the first body's decision",
        || {},
        |m| decided(m) > before,
    );
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(answer(unfinished_post(&gw)), 503);
    assert_eq!(answer(first), 408);
    step("reload");
    // a reload applied
    gw.hangup();
    wait_line(&gw.out, "configuration reloaded");
    step("redis away");
    // Redis away: the fail-open plan is decided by the degraded limiter, the
    // fail-closed one answers 503
    redis.kill();
    until(
        &gw,
        "degraded decisions",
        || {
            assert_eq!(get(&gw, "/ok", "sk_free"), 200);
            assert_eq!(get(&gw, "/ok", "sk_strict"), 503);
        },
        |m| m.has("paceline_redis_degraded") && m.has("paceline_redis_degraded_decisions_total"),
    );
    step("redis back");
    // Redis back: the degraded period ends and is counted
    redis.spawn();
    until(
        &gw,
        "the end of the degraded period",
        || {
            let _ = get(&gw, "/ok", "sk_free");
        },
        |m| m.has("paceline_redis_degraded_seconds_count"),
    );
    step("reload refused");
    // a reload refused: the file is broken now
    std::fs::write(&config, "[gateway]\nlisten = 1\n").unwrap();
    gw.hangup();
    wait_line(&gw.err, "reload refused");
    let scraped = gw.scrape();

    step("tls");
    // TLS toward clients: bytes that are not TLS fail the handshake
    let certs = TempDir::new("tls");
    let made = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
        ])
        .args(["-nodes", "-days", "2", "-subj", "/CN=localhost"])
        .args(["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"])
        .arg("-keyout")
        .arg(certs.0.join("key.pem"))
        .arg("-out")
        .arg(certs.0.join("cert.pem"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    assert!(
        made.is_ok_and(|s| s.success()),
        "openssl could not make a certificate: install openssl (scripts/test.sh does)"
    );
    let tls = Gateway::start(&certs.file("gateway.toml", &tls_config(up.addr)));
    let mut s = TcpStream::connect(tls.addr).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nhost: api\r\n\r\n").unwrap();
    let mut sink = Vec::new();
    let _ = s.read_to_end(&mut sink);
    until(
        &tls,
        "a failed handshake",
        || {},
        |m| m.has("paceline_gateway_tls_handshakes_total"),
    );
    let served = Exposition::parse(&scraped).merge(Exposition::parse(&tls.scrape()));

    step("checks");
    // every expression against what was served
    let mut faults = Vec::new();
    let mut names = BTreeSet::new();
    let exprs: Vec<(String, String)> = dashboard_exprs(&dashboard())
        .into_iter()
        .map(|(w, e)| (format!("dashboard {w}"), e))
        .chain(rule_exprs(&rules()))
        .collect();
    for (source, expr) in &exprs {
        names.extend(scan(expr).0.into_iter().map(|s| s.name));
        faults.extend(served.faults(source, expr));
    }
    assert!(
        faults.is_empty(),
        "{} fault(s):\n  {}\nserved:\n{scraped}",
        faults.len(),
        faults.join("\n  ")
    );
    eprintln!(
        "{} expressions, {} metric names, all served: {}",
        exprs.len(),
        names.len(),
        names.into_iter().collect::<Vec<_>>().join(" ")
    );
}
