//! Both binaries compose the one `[nats]` section: `--list-keys` of `llm-adapter` and of
//! `audio-ingress` print the same `nats.*` keys with the same types, ranges and
//! defaults (except the client name and the client's buffer, each binary's own), and
//! the same `[admin]` and `[log]` keys. The adapter adds keys of its own beside them.
//! Both binaries' `check-config` print a warning for a seeded bad timeout chain,
//! naming its keys, and none for the defaults.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

/// `audio-ingress` beside this crate's binary in the same target directory, built
/// first when it is not there yet (`WEIR_INGRESS_BIN` names another).
fn ingress_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("WEIR_INGRESS_BIN") {
        return bin.into();
    }
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_llm-adapter")).with_file_name("audio-ingress");
    if !bin.exists() {
        let status = Command::new(env!("CARGO"))
            .args([
                "build",
                "-p",
                "weir-audio-ingress",
                "--bin",
                "audio-ingress",
            ])
            .status()
            .expect("run cargo build");
        assert!(status.success(), "building audio-ingress failed");
    }
    bin
}

/// The `--list-keys` lines by key, for keys under `prefix`.
fn keys(bin: &PathBuf, prefix: &str) -> BTreeMap<String, String> {
    let out = Command::new(bin)
        .args(["serve", "--list-keys"])
        .output()
        .expect("run --list-keys");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with(prefix))
        .map(|l| {
            let name = l.split_whitespace().next().unwrap_or_default().to_owned();
            (name, l.to_owned())
        })
        .collect()
}

/// A line without its default (`default X` is the third column).
fn without_default(line: &str) -> String {
    let mut words: Vec<&str> = line.split_whitespace().collect();
    if let Some(i) = words.iter().position(|w| *w == "default") {
        words.drain(i..=i + 1);
    }
    words.join(" ")
}

#[test]
fn both_binaries_print_the_same_nats_admin_and_log_keys() {
    let llm = PathBuf::from(env!("CARGO_BIN_EXE_llm-adapter"));
    let ingress = ingress_bin();
    let (a, b) = (keys(&llm, "nats."), keys(&ingress, "nats."));
    let adapter_own = [
        "nats.expected_burst",
        "nats.publish_timeout_ms",
        "nats.subscription_capacity",
    ];
    let shared: Vec<&String> = a
        .keys()
        .filter(|k| !adapter_own.contains(&k.as_str()))
        .collect();
    assert_eq!(shared, b.keys().collect::<Vec<_>>(), "the same nats.* keys");
    assert!(b.len() >= 16, "{b:?}");
    for (key, line) in &b {
        let other = &a[key];
        if ["nats.name", "nats.client_capacity"].contains(&key.as_str()) {
            assert_eq!(without_default(line), without_default(other), "{key}");
        } else {
            assert_eq!(line, other, "{key}: type, default, range and meaning");
        }
    }
    // The drifting ranges resolved to one choice.
    assert!(
        b["nats.connection_timeout_ms"].contains("(100..=60000)"),
        "{b:?}"
    );
    assert!(
        b["nats.ping_interval_ms"].contains("(100..=600000)"),
        "{b:?}"
    );
    for prefix in ["admin.", "log."] {
        let (a, b) = (keys(&llm, prefix), keys(&ingress, prefix));
        for (key, line) in &b {
            // Each binary listens on its own admin port by default.
            if key == "admin.listen" {
                assert_eq!(without_default(line), without_default(&a[key]), "{key}");
            } else {
                assert_eq!(line, &a[key], "{key}");
            }
        }
        assert!(!b.is_empty());
    }
    assert!(keys(&ingress, "admin.")["admin.max_connections"].contains("(1..=10000)"));
}

/// `check-config` of `bin` with `args`: (exit status, stderr).
fn check(bin: &PathBuf, args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(bin)
        .arg("check-config")
        .args(args)
        .env_remove("WEIR_LLM_CONFIG")
        .output()
        .expect("run check-config");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn check_config_warns_on_a_bad_timeout_chain_and_not_on_the_defaults() {
    let llm = PathBuf::from(env!("CARGO_BIN_EXE_llm-adapter"));
    let ingress = ingress_bin();
    for bin in [&llm, &ingress] {
        let (code, stderr) = check(bin, &[]);
        assert_eq!(code, Some(0), "{stderr}");
        assert!(!stderr.contains("warning"), "{stderr}");
    }
    let (code, stderr) = check(&llm, &["--set", "backend.timeout_ms=200000"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains("warning: backend.timeout_ms = 200000")
            && stderr.contains("deadline.max_ms = 120000"),
        "{stderr}"
    );
    let (code, stderr) = check(
        &ingress,
        &["--set", "max_age_ms=100", "--set", "publish_timeout_ms=80"],
    );
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains("publish_timeout_ms = 80") && stderr.contains("max_age_ms = 100"),
        "{stderr}"
    );
    let (_, stderr) = check(&ingress, &["--consumer-idle-timeout-ms", "5000"]);
    assert!(
        stderr.contains("idle_timeout_ms = 5000") && stderr.contains("nats.ping_interval_ms"),
        "{stderr}"
    );
    // An old key name loads, with a warning that names the new one.
    let (code, stderr) = check(&ingress, &["--set", "nats_url=nats://127.0.0.1:4222"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains("`nats_url`") && stderr.contains("`nats.url`"),
        "{stderr}"
    );
    // A refusal stays an error.
    let (code, _) = check(&llm, &["--set", "nats.connection_timeout_ms=99"]);
    assert_eq!(code, Some(2));
}
