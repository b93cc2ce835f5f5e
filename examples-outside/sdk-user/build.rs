//! Copies the first Rust example of paceline-client's README into
//! `OUT_DIR/readme.rs`, so this crate compiles and runs what the README
//! shows, as it shows it.

use std::path::Path;

fn main() {
    let readme =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../crates/paceline-client/README.md");
    println!("cargo:rerun-if-changed={}", readme.display());
    let text = std::fs::read_to_string(&readme).expect("the README");
    let mut lines = text.lines().skip_while(|l| !l.starts_with("```rust"));
    lines.next().expect("the README has a Rust example");
    let code: Vec<&str> = lines.take_while(|l| !l.starts_with("```")).collect();
    assert!(
        code.iter()
            .all(|l| !l.trim_start().starts_with("# ") && l.trim() != "#"),
        "the README's example must show every line (no hidden `#` lines)"
    );
    let out = Path::new(&std::env::var("OUT_DIR").unwrap()).join("readme.rs");
    std::fs::write(out, code.join("\n") + "\n").expect("writing the example");
}
