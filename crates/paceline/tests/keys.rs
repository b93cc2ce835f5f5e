//! `paceline keys hash`: the hashed `keys` entry of a key (which a
//! configuration then admits as the key itself) and the hash its requests
//! carry in the logs, under the deployment's key-hash secret.

use std::io::Write;
use std::process::{Command, Stdio};

const SECRET: &str = "0123456789abcdef0123456789abcdef";

fn hash(args: &[&str], env_secret: Option<&str>, stdin: Option<&str>) -> (i32, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_paceline"));
    cmd.args(["keys", "hash"]).args(args);
    cmd.env_remove("PACELINE_KEY_HASH_SECRET");
    if let Some(s) = env_secret {
        cmd.env("PACELINE_KEY_HASH_SECRET", s);
    }
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The log hash the gateway would show for `key`, under `SECRET`.
fn expected_log_hash(key: &str) -> String {
    let hasher = paceline_server::KeyHasher::from_secret(SECRET.as_bytes(), "test").unwrap();
    hasher.hash(&format!("k:{key}")).to_string()
}

#[test]
fn the_entry_and_the_log_hash_of_a_key() {
    let (code, out, err) = hash(&["sk_live_1"], Some(SECRET), None);
    assert_eq!(code, 0, "{err}");
    // the entry alone on standard output, the log hash on standard error
    assert_eq!(
        out,
        format!("{}\n", paceline_server::hashed_key_entry("sk_live_1"))
    );
    let log = err.lines().next().unwrap();
    assert!(
        log.starts_with(&format!("log hash: {}", expected_log_hash("sk_live_1"))),
        "{log}"
    );
    assert!(log.contains("PACELINE_KEY_HASH_SECRET"), "{log}");
    // from standard input: the same
    let (_, from_stdin, _) = hash(&["-"], Some(SECRET), Some("sk_live_1\n"));
    assert_eq!(from_stdin, out);
    // without a secret the log hash cannot be told
    let (code, _, err) = hash(&["sk_live_1"], None, None);
    assert_eq!(code, 0);
    assert!(err.lines().next().unwrap().contains("unknown"), "{err}");
}

#[test]
fn with_a_config_the_log_hash_is_its_secrets_and_the_entry_admits_the_key() {
    let dir = std::env::temp_dir().join(format!("paceline-keys-hash-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("secret"), format!("{SECRET}\n")).unwrap();
    let (_, out, _) = hash(&["sk_from_file"], None, None);
    let entry = out.lines().next().unwrap().to_string();
    let config = format!(
        r#"[gateway]
listen = "127.0.0.1:0"
upstream = "http://127.0.0.1:9"
key_hash_secret_file = "secret"

[plans.free]
policies = [{{ name = "b", algorithm = "token_bucket", q = 5, w = 1 }}]

[keys]
"{entry}" = "free"
"#
    );
    let path = dir.join("g.toml");
    std::fs::write(&path, config).unwrap();
    let (code, out, err) = hash(
        &["sk_from_file", "--config", path.to_str().unwrap()],
        None,
        None,
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.lines().count(), 1, "{out}");
    let log = err.lines().next().unwrap();
    assert!(
        log.starts_with(&format!("log hash: {}", expected_log_hash("sk_from_file"))),
        "{log}"
    );
    assert!(log.contains("key_hash_secret_file"), "{log}");
    // the configuration with the entry puts the clear key on its plan
    let cfg = paceline_gateway::GatewayConfig::load(&path).unwrap();
    assert_eq!(
        cfg.limits.plan_for_key("sk_from_file").unwrap().name(),
        "free"
    );
    assert!(cfg.limits.plan_for_key("sk_other").is_none());
    assert_eq!(
        cfg.limits.log_hash("sk_from_file").to_string(),
        expected_log_hash("sk_from_file")
    );
    // a broken configuration is reported, exit 1
    std::fs::write(&path, "[gateway]\n").unwrap();
    let (code, _, err) = hash(&["k", "--config", path.to_str().unwrap()], None, None);
    assert_eq!(code, 1);
    assert!(err.contains("g.toml"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
