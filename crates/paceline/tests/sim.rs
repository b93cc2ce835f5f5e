//! `paceline sim`: tables by default, the contract's JSON with `--json`,
//! a plot with `--svg`, the same output for the same seed.

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

fn paceline(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_paceline"))
        .args(args)
        .output()
        .expect("run paceline")
}

fn json(args: &[&str]) -> Value {
    let out = paceline(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON on stdout")
}

fn temp_svg(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("paceline-sim-{}-{name}.svg", std::process::id()))
}

#[test]
fn race_json_is_the_contract() {
    let v = json(&["sim", "race", "--json", "--seed", "1"]);
    let coop = &v["fleets"][0];
    assert_eq!(coop["name"], "cooperative");
    assert_eq!(coop["jobs"], 50);
    assert_eq!(coop["jobs_done"], 50);
    assert_eq!(coop["requests"], 50);
    assert_eq!(coop["rejected_429"], 0);
    assert_eq!(coop["dropped"], 0);
    let at = coop["finished_at_s"].as_f64().expect("a number");
    assert!((at - 10.5).abs() <= 0.25, "{at}");
    let naive = &v["fleets"][1];
    assert_eq!(naive["name"], "naive");
    assert!(naive["requests"].as_u64().unwrap() > 500);
}

#[test]
fn race_table_by_default() {
    let out = paceline(&["sim", "race"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("measure"), "{text}");
    assert!(text.contains("cooperative") && text.contains("naive"));
    assert!(text.contains("50/50"));
}

#[test]
fn herd_json_counts_retries_per_second() {
    let v = json(&["sim", "herd", "--json", "--clients", "2000"]);
    assert_eq!(v["series"][0]["name"], "no_jitter");
    assert_eq!(v["series"][0]["per_second"][0]["t_s"], 5);
    assert_eq!(v["series"][0]["per_second"][0]["requests"], 2000);
    assert_eq!(v["series"][1]["name"], "jitter");
    let jitter = v["series"][1]["per_second"].as_array().unwrap();
    assert_eq!(jitter.len(), 5);
    for p in jitter {
        let n = p["requests"].as_u64().unwrap();
        assert!((300..=500).contains(&n), "{p}");
    }
}

#[test]
fn export_json_has_the_floor() {
    let v = json(&["sim", "export", "--json", "--records", "650"]);
    assert_eq!(v["floor_s"], 60.0);
    assert_eq!(v["fleets"][0]["name"], "cooperative");
    assert_eq!(v["fleets"][0]["jobs_done"], 650);
    assert_eq!(v["fleets"][1]["jobs_done"], 650);
}

#[test]
fn servers_json_shows_the_limit_multiplied_by_per_instance_counting() {
    let v = json(&[
        "sim",
        "servers",
        "--json",
        "--instances",
        "4",
        "--seconds",
        "30",
    ]);
    assert_eq!(v["instances"], 4);
    assert_eq!(v["limit"], 320);
    let runs = v["runs"].as_array().expect("runs");
    assert_eq!(runs[0]["store"], "per_instance");
    assert_eq!(runs[1]["store"], "shared");
    let alone = runs[0]["admitted"].as_u64().unwrap();
    let shared = runs[1]["admitted"].as_u64().unwrap();
    assert!((1_276..=1_280).contains(&alone), "{alone}");
    assert!((319..=320).contains(&shared), "{shared}");
}

#[test]
fn throttle_json_has_two_curves() {
    let v = json(&["sim", "throttle", "--json", "--measure-s", "60"]);
    let curves = v["curves"].as_array().unwrap();
    assert_eq!(curves.len(), 2);
    assert_eq!(curves[0]["k"], 2.0);
    assert_eq!(curves[1]["k"], 1.1);
    let p = &curves[0]["points"][3];
    assert_eq!(
        p["accept_ratio"].as_f64().map(|x| (x * 10.0).round()),
        Some(3.0)
    );
    assert!((p["drop_probability"].as_f64().unwrap() - 0.4).abs() < 0.03);
}

#[test]
fn same_seed_same_output_and_svg_written() {
    let svg = temp_svg("race");
    let path = svg.to_str().unwrap();
    let a = paceline(&["sim", "race", "--json", "--seed", "4", "--svg", path]);
    let b = paceline(&["sim", "race", "--json", "--seed", "4"]);
    assert!(a.status.success() && b.status.success());
    assert_eq!(a.stdout, b.stdout);
    let text = std::fs::read_to_string(&svg).expect("svg written");
    let _ = std::fs::remove_file(&svg);
    assert!(text.starts_with("<svg") && text.trim_end().ends_with("</svg>"));
    assert!(text.contains("seconds from the start"));
    assert!(text.contains("cooperative: sent"));
}

#[test]
fn every_scenario_draws_a_plot() {
    for (name, extra) in [
        ("herd", vec!["--clients", "500"]),
        ("export", vec!["--records", "300"]),
        ("throttle", vec!["--k", "2", "--measure-s", "10"]),
        ("incident", vec!["--incident-s", "60"]),
        ("servers", vec!["--seconds", "10"]),
    ] {
        let svg = temp_svg(name);
        let mut args = vec!["sim", name, "--svg", svg.to_str().unwrap()];
        args.extend(extra);
        let out = paceline(&args);
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = std::fs::read_to_string(&svg).expect("svg written");
        let _ = std::fs::remove_file(&svg);
        assert!(text.contains("</svg>"), "{name}");
    }
}

#[test]
fn bad_numbers_are_refused_with_the_flag_named() {
    let out = paceline(&["sim", "race", "--quota", "0"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--quota"));
    let out = paceline(&["sim", "herd", "--status", "500"]);
    assert!(!out.status.success());
    let out = paceline(&["sim", "throttle", "--k", "0.5"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--k"));
}

#[test]
fn nonsense_numbers_are_refused_naming_the_flag() {
    for (args, flag) in [
        (
            &["sim", "herd", "--retry-after-s", "0"][..],
            "--retry-after-s",
        ),
        (&["sim", "race", "--workers", "0"][..], "--workers"),
        (
            &["sim", "race", "--latency-ms", "100000"][..],
            "--latency-ms",
        ),
        (
            &["sim", "export", "--records", "1", "--workers", "0"][..],
            "--workers",
        ),
        (&["sim", "servers", "--instances", "0"][..], "--instances"),
        (&["sim", "servers", "--burst", "0"][..], "--burst"),
    ] {
        let out = paceline(args);
        assert!(!out.status.success(), "{args:?} ran");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(flag), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?} printed a result");
    }
}
