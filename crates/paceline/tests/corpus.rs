//! `paceline inspect` over a corpus of providers' answers, each checked
//! against the values its documentation implies (see `corpus/README.md`).
//!
//! Every case is two files in `tests/corpus/`: `NAME.http`, the raw
//! response, and `NAME.json`, the instant to read it at (`now`), where the
//! answer is documented (`source`) and the expected fields (`expect`). The
//! test runs the built binary on each, prints one line per field that
//! disagrees and the agreement, overall and per field, and fails unless
//! every case agrees.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The fields a case may state, in the order they are reported.
const FIELDS: &[&str] = &[
    "status",
    "outcome",
    "retry",
    "retry_after_s",
    "limit",
    "remaining",
    "reset_in_s",
];

/// Seconds fields may differ by this much (rounding of instants).
const SECONDS_TOLERANCE: f64 = 0.5;

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus")
}

/// Every case, by name, sorted.
fn cases() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(corpus_dir())
        .expect("tests/corpus exists")
        .filter_map(|e| {
            let p = e.ok()?.path();
            (p.extension()? == "http").then(|| p.file_stem()?.to_str().map(str::to_string))?
        })
        .collect();
    names.sort();
    names
}

fn inspect(http: &Path, now: &str) -> Result<Value, String> {
    let out = Command::new(env!("CARGO_BIN_EXE_paceline"))
        .args(["inspect", "--now", now])
        .arg(http)
        .output()
        .map_err(|e| format!("cannot run paceline: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "paceline inspect exited with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("output is not JSON: {e}"))
}

/// Whether `got` is what the case expects: numbers of seconds within the
/// tolerance, everything else exactly.
fn agrees(field: &str, want: &Value, got: &Value) -> bool {
    if field.ends_with("_s") {
        if let (Some(w), Some(g)) = (want.as_f64(), got.as_f64()) {
            return (w - g).abs() <= SECONDS_TOLERANCE;
        }
    }
    if let (Some(w), Some(g)) = (want.as_f64(), got.as_f64()) {
        return w == g;
    }
    want == got
}

#[derive(Default)]
struct Tally {
    checked: usize,
    agreed: usize,
}

fn percent(n: usize, d: usize) -> f64 {
    if d == 0 {
        100.0
    } else {
        100.0 * n as f64 / d as f64
    }
}

#[test]
fn corpus_agrees_with_the_documented_readings() {
    let names = cases();
    assert!(!names.is_empty(), "the corpus has no cases");
    let mut mismatches: Vec<String> = Vec::new();
    let mut fields: BTreeMap<usize, Tally> = BTreeMap::new();
    let mut whole = 0;
    let mut providers: Vec<String> = Vec::new();
    for name in &names {
        let meta_path = corpus_dir().join(format!("{name}.json"));
        let meta: Value = match std::fs::read_to_string(&meta_path)
            .map_err(|e| e.to_string())
            .and_then(|s| serde_json::from_str(&s).map_err(|e| e.to_string()))
        {
            Ok(v) => v,
            Err(e) => {
                mismatches.push(format!("{name}: unreadable {name}.json: {e}"));
                continue;
            }
        };
        let now = meta["now"].as_str().unwrap_or_default();
        assert!(
            meta["source"].as_str().is_some_and(|s| !s.is_empty()),
            "{name}: every case names its source"
        );
        let provider = name.split('-').next().unwrap_or(name).to_string();
        if !providers.contains(&provider) {
            providers.push(provider);
        }
        let expect = meta["expect"].as_object().cloned().unwrap_or_default();
        assert!(
            ["status", "outcome", "retry", "retry_after_s"]
                .iter()
                .all(|f| expect.contains_key(*f)),
            "{name}: every case states status, outcome, retry and retry_after_s"
        );
        for key in expect.keys() {
            assert!(
                FIELDS.contains(&key.as_str()),
                "{name}: unknown field {key}"
            );
        }
        let got = match inspect(&corpus_dir().join(format!("{name}.http")), now) {
            Ok(v) => v,
            Err(e) => {
                mismatches.push(format!("{name}: {e}"));
                for (i, f) in FIELDS.iter().enumerate() {
                    if expect.contains_key(*f) {
                        fields.entry(i).or_default().checked += 1;
                    }
                }
                continue;
            }
        };
        let mut all = true;
        for (i, f) in FIELDS.iter().enumerate() {
            let Some(want) = expect.get(*f) else { continue };
            let t = fields.entry(i).or_default();
            t.checked += 1;
            let have = got.get(*f).unwrap_or(&Value::Null);
            if agrees(f, want, have) {
                t.agreed += 1;
            } else {
                all = false;
                mismatches.push(format!("{name}: {f} expected {want}, got {have}"));
            }
        }
        if all {
            whole += 1;
        }
    }
    for m in &mismatches {
        println!("MISMATCH {m}");
    }
    println!(
        "corpus: {whole}/{} cases agree ({:.1}%), {} providers",
        names.len(),
        percent(whole, names.len()),
        providers.len()
    );
    for (i, t) in &fields {
        println!(
            "  {:<14} {}/{} ({:.1}%)",
            FIELDS[*i],
            t.agreed,
            t.checked,
            percent(t.agreed, t.checked)
        );
    }
    assert!(
        mismatches.is_empty(),
        "{} mismatches over {} cases (run with --nocapture to see them)",
        mismatches.len(),
        names.len()
    );
}
