//! The binary refuses a misspelled `WEIR_INGRESS_*` variable before it binds or
//! connects anything: exit status 2 and the variable named on stderr.

use std::process::Command;

#[test]
fn a_misspelled_environment_variable_is_refused_by_serve() {
    let out = Command::new(env!("CARGO_BIN_EXE_audio-ingress"))
        .args(["serve", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
        .env("WEIR_INGRESS_MAX_BYTE", "32000")
        .env("WEIR_INGRESS_LOG_FORMAT", "text")
        .output()
        .expect("run audio-ingress");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("WEIR_INGRESS_MAX_BYTE"), "{stderr}");
    assert!(stderr.contains("did you mean `max_bytes`?"), "{stderr}");
    assert!(out.stdout.is_empty(), "no ready line");
}

#[test]
fn list_keys_prints_every_key_with_its_default() {
    let out = Command::new(env!("CARGO_BIN_EXE_audio-ingress"))
        .args(["serve", "--list-keys"])
        .output()
        .expect("run audio-ingress");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.lines().count(), 80, "{text}");
    let line = |key: &str| {
        text.lines()
            .find(|l| l.split_whitespace().next() == Some(key))
            .unwrap_or_default()
            .to_owned()
    };
    assert!(line("max_bytes").contains("default 16000"), "{text}");
    assert!(line("max_rate").contains("decimal  default 1.5"), "{text}");
    assert!(line("nats.token").contains("(unset)"), "{text}");
    assert!(line("capacity.mode").contains("default enforce"), "{text}");
}
