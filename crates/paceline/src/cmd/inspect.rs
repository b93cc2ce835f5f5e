//! `paceline inspect`: what a client concludes from one raw HTTP response.
//!
//! The response comes from a file or stdin as text (`curl -i` output, a
//! capture, or `curl -v` output); CRLF or LF line ends, HTTP/1.0, 1.1 or 2
//! status lines, folded header lines and a missing body are all accepted.
//! The verdict is the same one the client SDK reaches: the JSON object the
//! CLI contract describes, or with `--human` a table.

use std::io::Read;
use std::path::PathBuf;

use anyhow::{bail, Context};
use paceline_core::Nanos;
use paceline_wire::parse::{parse_response, secs_json, Ignored, ResponseView};
use paceline_wire::raw::parse_raw_response;
use paceline_wire::time;

/// The most input read (a response head with a modest body).
const MAX_INPUT: u64 = 16 * 1024 * 1024;

/// Arguments of `paceline inspect`.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// When the response was received, RFC 3339 (for example
    /// 2025-06-01T18:40:00Z); defaults to the current time.
    #[arg(long, value_name = "RFC3339")]
    now: Option<String>,
    /// Indent the JSON output.
    #[arg(long)]
    pretty: bool,
    /// Print a table for people instead of JSON.
    #[arg(long, conflicts_with = "pretty")]
    human: bool,
    /// The raw response; `-` or nothing reads standard input.
    #[arg(value_name = "FILE")]
    file: Option<PathBuf>,
}

/// Runs `paceline inspect`.
pub(crate) fn run(args: Args) -> anyhow::Result<i32> {
    let now = match &args.now {
        Some(s) => parse_now(s)?,
        None => Nanos::from_system_time(std::time::SystemTime::now()),
    };
    let input = read_input(args.file.as_ref())?;
    let raw = parse_raw_response(&input).map_err(|e| anyhow::anyhow!("{e}"))?;
    let body = (!raw.body.is_empty()).then_some(&raw.body[..]);
    let view = parse_response(raw.status, &raw.headers, body, now);
    let mut report = view.report();
    for line in &raw.skipped {
        report.ignored.push(Ignored {
            field: "(line)".to_string(),
            reason: line.clone(),
        });
    }
    if args.human {
        print!("{}", human(&view, &raw.skipped));
    } else if args.pretty {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("{}", serde_json::to_string(&report)?);
    }
    Ok(0)
}

fn parse_now(s: &str) -> anyhow::Result<Nanos> {
    match time::parse_rfc3339(s.trim()) {
        Some(t) => Ok(t),
        None => bail!("--now {s:?} is not an RFC 3339 time (for example 2025-06-01T18:40:00Z)"),
    }
}

fn read_input(file: Option<&PathBuf>) -> anyhow::Result<Vec<u8>> {
    let mut buf = Vec::new();
    match file {
        Some(p) if p.as_os_str() != "-" => {
            let f =
                std::fs::File::open(p).with_context(|| format!("cannot open {}", p.display()))?;
            f.take(MAX_INPUT)
                .read_to_end(&mut buf)
                .with_context(|| format!("cannot read {}", p.display()))?;
        }
        _ => {
            std::io::stdin()
                .take(MAX_INPUT)
                .read_to_end(&mut buf)
                .context("cannot read standard input")?;
        }
    }
    if buf.iter().all(u8::is_ascii_whitespace) {
        bail!("no response to inspect: the input is empty");
    }
    Ok(buf)
}

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "-".to_string(), |x| x.to_string())
}

fn secs(n: Option<Nanos>) -> String {
    n.map_or_else(|| "-".to_string(), |n| format!("{} s", secs_json(n)))
}

/// `19200 s (5h 20m)`: seconds, and for a minute or more a rounder reading.
fn wait(n: Nanos) -> String {
    let s = n.as_secs_ceil();
    let (d, h, m, sec) = (s / 86_400, s % 86_400 / 3_600, s % 3_600 / 60, s % 60);
    let parts: Vec<String> = [(d, "d"), (h, "h"), (m, "m"), (sec, "s")]
        .iter()
        .skip_while(|(v, _)| *v == 0)
        .take(2)
        .filter(|(v, _)| *v > 0)
        .map(|(v, u)| format!("{v}{u}"))
        .collect();
    if s < 60 {
        format!("{} s", secs_json(n))
    } else {
        format!("{} s ({})", secs_json(n), parts.join(" "))
    }
}

/// The table `--human` prints.
fn human(v: &ResponseView, skipped: &[String]) -> String {
    let mut s = String::new();
    let line = |s: &mut String, k: &str, val: String| s.push_str(&format!("{k:<13}{val}\n"));
    line(&mut s, "status", v.status.to_string());
    line(
        &mut s,
        "outcome",
        format!(
            "{} ({})",
            v.outcome.as_str(),
            if v.retry { "retry" } else { "do not retry" }
        ),
    );
    line(
        &mut s,
        "wait",
        match v.retry_after {
            Some(w) => format!("{} before the next request", wait(w)),
            None => "none: the next request may go now".to_string(),
        },
    );
    if let Some(p) = v.tightest_policy() {
        line(
            &mut s,
            "tightest",
            format!(
                "{}: {} of {} left, resets in {}",
                p.name,
                opt(p.remaining),
                opt(p.quota),
                p.reset_in.map_or_else(|| "-".to_string(), wait)
            ),
        );
    }
    let dialects = if v.dialects.is_empty() {
        "none recognised".to_string()
    } else {
        v.dialects.join(", ")
    };
    line(&mut s, "dialects", dialects);
    if let Some(p) = &v.problem {
        line(
            &mut s,
            "problem",
            format!("{} {}", opt(p.code.as_ref()), opt(p.title.as_ref())),
        );
    }
    if !v.policies.is_empty() {
        s.push_str(&format!(
            "\n{:<28} {:>12} {:>9} {:>12} {:>12}  {:<20} {}\n",
            "POLICY", "QUOTA", "WINDOW", "REMAINING", "RESET", "UNIT", "SCOPE"
        ));
        for (i, p) in v.policies.iter().enumerate() {
            let mark = if Some(i) == v.tightest { "*" } else { " " };
            s.push_str(&format!(
                "{mark}{:<27} {:>12} {:>9} {:>12} {:>12}  {:<20} {}\n",
                p.name,
                opt(p.quota),
                p.window_s
                    .map_or_else(|| "-".to_string(), |w| format!("{w} s")),
                opt(p.remaining),
                secs(p.reset_in),
                p.unit.as_str(),
                opt(p.scope.as_ref()),
            ));
        }
    }
    if !v.ignored.is_empty() || !skipped.is_empty() {
        s.push_str("\nignored\n");
        for i in &v.ignored {
            s.push_str(&format!("  {}: {}\n", i.field, i.reason));
        }
        for l in skipped {
            s.push_str(&format!("  (line): {l}\n"));
        }
    }
    s
}
