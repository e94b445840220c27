//! The Python client (`weir.llm` of the installed `weir` package, nats-py) against the
//! real `llm-adapter` binary and a real nats-server: a streamed request that waits
//! (queued → started → chunks → end), refusals as `LlmError` (plain and envelope
//! bodies), `llm.status`, the unary call. The script asserts; this test checks its
//! summary again. Python: `weir_testkit::python::weir_python()` (the project's
//! environment, where `scripts/build-python-wheel` installed the package).

use crate::common;

use std::path::Path;
use std::process::Command;

use common::bin::{first_line, serve};

#[tokio::test]
async fn python_client_streams_queued_started_chunks_end_and_gets_refusals() {
    let server = weir_testkit::NatsServer::start().expect("nats-server");
    let dir = tempfile::tempdir().expect("dir");
    let cfg = dir.path().join("adapter.toml");
    std::fs::write(
        &cfg,
        "workers = 1\nqueue_capacity = 1\n[backend.sim]\nfirst_token_ms = 10\ntokens_per_second = 200\n",
    )
    .expect("config");
    let mut child = serve(server.url(), &["--config", cfg.to_str().expect("utf-8")]);
    let line = first_line(&mut child).await;
    assert!(line.contains("\"ready\""), "{line}");

    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let script = root.join("tests/py/client_check.py");
    let url = server.url().to_owned();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(weir_testkit::python::weir_python())
            .arg(&script)
            .args(["--nats", &url])
            .output()
    });
    // The bound includes building the wheel when it is not current (a no-op after
    // scripts/test built it).
    let out = tokio::time::timeout(std::time::Duration::from_secs(300), out)
        .await
        .expect("the script ends in time")
        .expect("join")
        .expect("run python");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "client_check.py failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(stdout.trim().lines().last().unwrap_or(""))
        .unwrap_or_else(|e| panic!("summary JSON ({e}): {stdout}"));
    eprintln!("python client: {v}");
    let events = v["b_events"].as_array().expect("events");
    assert_eq!(events.first().and_then(|e| e.as_str()), Some("Queued"));
    assert_eq!(events.get(1).and_then(|e| e.as_str()), Some("Started"));
    assert_eq!(events.last().and_then(|e| e.as_str()), Some("End"));
    let chunks = v["b_chunks"].as_u64().expect("chunks");
    assert!(chunks >= 1);
    assert_eq!(events.len() as u64, chunks + 3);
    assert_eq!(v["b_text_ok"], true);
    assert_eq!(v["status_waiting"], "queued");
    assert_eq!(v["status_position"], 1);
    assert_eq!(v["refusal_code"], "queue_full");
    assert_eq!(v["refusal_limit"], 1);
    assert_eq!(v["refusal_nats_code"], 503);
    assert_eq!(v["stream_refusal_code"], "queue_full");
    assert_eq!(v["envelope_ok"], false);
    assert_eq!(v["envelope_trace_id"], "tr-1");
    assert_eq!(v["status_after"], "done");
    assert_eq!(v["status_unknown"], "not_found");
    assert_eq!(v["unary_ok"], true);
}
