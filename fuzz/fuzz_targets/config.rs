//! Feeds arbitrary text to the gateway's configuration parser, the same
//! path `paceline gateway --check` takes: the `[gateway]` table, the split
//! of the rest to `paceline-server`'s limits model, its compilation, and
//! the location of every error. Nothing may panic; an error names a line
//! inside the text (or none) and renders; an accepted file keeps its
//! documented bounds.
//!
//! A `keys_file` is read only when it names `keys.toml` in a scratch
//! directory holding a small keys file: the fuzzer never reads other files.

#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use paceline_gateway::{GatewayConfig, MAX_MAX_HEAD_BYTES, MIN_MAX_HEAD_BYTES};

const KEYS: &str = "sk_file_1 = \"free\"\nsk_file_2 = \"gold\"\n";

fn scratch() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("paceline-fuzz-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch directory");
        std::fs::write(dir.join("keys.toml"), KEYS).expect("keys file");
        dir
    })
}

/// Whether the text names a keys file other than the scratch one (then it
/// is not parsed: the parser would read whatever it names).
fn names_another_file(text: &str) -> bool {
    let Ok(table) = text.parse::<toml::Table>() else {
        // the parser refuses it before it reads any keys file
        return false;
    };
    match table.get("gateway").and_then(|g| g.get("keys_file")) {
        None => false,
        Some(v) => v.as_str() != Some("keys.toml"),
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if names_another_file(text) {
        return;
    }
    match GatewayConfig::parse(text, "fuzz.toml", Some(scratch())) {
        Ok(cfg) => {
            let s = &cfg.settings;
            assert!((MIN_MAX_HEAD_BYTES..=MAX_MAX_HEAD_BYTES).contains(&s.max_head_bytes));
            assert!(s.upstream.scheme_str() == Some("http"), "{}", s.upstream);
            assert!(s.upstream.host().is_some_and(|h| !h.is_empty()));
            // the same text gives the same settings (nothing depends on
            // state left by an earlier parse)
            let again = GatewayConfig::parse(text, "fuzz.toml", Some(scratch()));
            assert_eq!(again.map(|c| c.settings).as_ref(), Ok(s));
        }
        Err(e) => {
            let shown = e.to_string();
            assert!(
                shown.starts_with("fuzz.toml") || shown.contains("keys.toml"),
                "{shown}"
            );
            assert!(!e.message().is_empty(), "{shown}");
            if e.file() == "fuzz.toml" {
                // a line of the text, or one past its end (an error at EOF)
                let lines = text.split('\n').count();
                assert!(e.line() <= lines + 1, "{shown}: line past {lines}");
            }
        }
    }
});
