//! Feeds arbitrary text to `paceline rls`'s reader of envoyproxy/ratelimit's
//! YAML, the same path `paceline rls --check` takes. Nothing may panic; an
//! error names a line inside the text (or none) and renders; an accepted
//! file's rules can be matched with any descriptor.

#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use paceline_rls::RlsConfig;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // YAML breaks lines at LF, CRLF and a lone CR
    let lines = text.bytes().filter(|b| matches!(b, b'\n' | b'\r')).count() + 2;
    match RlsConfig::from_str(Path::new("fuzz.yaml"), text) {
        Err(e) => {
            assert!(e.line <= lines, "line {} of a text of {lines}: {e}", e.line);
            assert!(e.to_string().starts_with("fuzz.yaml"));
        }
        Ok(config) => {
            for d in config.domains() {
                // descriptors made of the text's own words
                let words: Vec<&str> = text.split_whitespace().take(8).collect();
                for w in &words {
                    let _ = d.find([(*w, *w)]);
                    let _ = d.find(words.iter().map(|x| (*x, *w)));
                }
            }
        }
    }
});
