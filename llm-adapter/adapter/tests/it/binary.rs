//! The `llm-adapter` binary: configuration from file + env + flags, the ready line,
//! the admin endpoints, graceful shutdown on SIGTERM, refusal of bad configuration.

use crate::common;
use crate::tls_openai;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::bin::{BIN, Child, first_line, serve};
use common::{STEP, connect};
use weir_llm_client::LlmClient;

async fn get(url: &str) -> (u16, String) {
    let r = tokio::time::timeout(STEP, reqwest::get(url))
        .await
        .expect("in time")
        .expect("http");
    let code = r.status().as_u16();
    (code, r.text().await.expect("body"))
}

#[tokio::test]
async fn serve_prints_ready_serves_admin_and_shuts_down_on_sigterm() {
    let server = weir_testkit::NatsServer::start().expect("nats-server");
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("llm-bin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let cfg = dir.join("adapter.toml");
    std::fs::write(
        &cfg,
        "workers = 2\nqueue_capacity = 16\n[backend.sim]\nlatency_ms = 5\n[service]\nsubject = \"bin.infer\"\ncancel_subject = \"bin.cancel\"\ncapabilities_subject = \"bin.caps\"\nlimits_subject = \"bin.limits\"\n",
    )
    .expect("write config");
    let mut child = Child(
        Command::new(BIN)
            .args(["serve", "--config"])
            .arg(&cfg)
            .args(["--admin", "127.0.0.1:0", "--nats-url", server.url()])
            .env("WEIR_LLM_SESSION__PENDING_CAP", "3")
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn"),
    );
    let line = first_line(&mut child).await;
    let ready: serde_json::Value = serde_json::from_str(&line).expect("ready line is JSON");
    assert_eq!(ready["event"], "ready");
    let admin = ready["admin"].as_str().expect("admin address").to_owned();
    assert_eq!(ready.as_object().map(|o| o.len()), Some(2), "{line}");

    // The binary re-executed itself with glibc's mmap threshold fixed (same pid).
    let environ = std::fs::read(format!("/proc/{}/environ", child.0.id())).expect("environ");
    assert!(
        environ
            .split(|b| *b == 0)
            .any(|kv| kv == b"MALLOC_MMAP_THRESHOLD_=131072"),
        "mmap threshold pinned"
    );
    assert_eq!(get(&format!("http://{admin}/healthz")).await.0, 200);
    assert_eq!(get(&format!("http://{admin}/readyz")).await.0, 200);
    let (code, caps) = get(&format!("http://{admin}/v1/capabilities")).await;
    assert_eq!(code, 200);
    let caps: serde_json::Value = serde_json::from_str(&caps).expect("json");
    assert_eq!(caps["session"]["pending_cap"], 3, "env override applied");
    assert_eq!(caps["workers"], 2, "file applied");
    assert_eq!(caps["service"]["subject"], "bin.infer");

    let caller = connect(server.url()).await;
    let llm = LlmClient::discover(caller, "bin.caps", STEP)
        .await
        .expect("discover");
    let r = llm
        .request("ping")
        .session("s")
        .timeout(Duration::from_secs(2))
        .send()
        .await;
    assert_eq!(&r.expect("reply").body[..], b"ping");

    let (_, metrics) = get(&format!("http://{admin}/metrics")).await;
    assert!(
        metrics.contains("weir_llm_requests_offered_total 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("weir_llm_inference_seconds_bucket"),
        "{metrics}"
    );
    let (_, limits) = get(&format!("http://{admin}/v1/limits?top=3")).await;
    let limits: serde_json::Value = serde_json::from_str(&limits).expect("json");
    assert_eq!(limits["queue"]["capacity"], 16);
    let (_, stats) = get(&format!("http://{admin}/v1/stats")).await;
    let stats: serde_json::Value = serde_json::from_str(&stats).expect("json");
    assert_eq!(stats["completed"], 1);

    // Every refusal of the admin listener is a JSON error body.
    let post = tokio::time::timeout(
        STEP,
        reqwest::Client::new()
            .post(format!("http://{admin}/v1/stats"))
            .send(),
    )
    .await
    .expect("in time")
    .expect("http");
    let post = (post.status().as_u16(), post.text().await.expect("body"));
    for ((code, body), want, what) in [
        (get(&format!("http://{admin}/nope")).await, 404, "not_found"),
        (post, 405, "method_not_allowed"),
        (
            get(&format!("http://{admin}/v1/limits?top=many")).await,
            400,
            "invalid_request",
        ),
    ] {
        assert_eq!(code, want, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).expect("JSON error body");
        assert_eq!(v["error"]["code"], what, "{body}");
        assert!(v["error"]["message"].is_string(), "{body}");
    }

    let pid = child.0.id().to_string();
    let killed = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    assert!(killed.success());
    let t0 = std::time::Instant::now();
    loop {
        if let Some(status) = child.0.try_wait().expect("wait") {
            assert!(status.success(), "exit status {status}");
            break;
        }
        assert!(t0.elapsed() < STEP, "did not exit after SIGTERM");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn invalid_configuration_is_refused_with_the_key_named() {
    for (var, value, key) in [
        ("WEIR_LLM_SESSION__PENDING_CAP", "-1", "session.pending_cap"),
        (
            "WEIR_LLM_SESSION__PENDING_CAP",
            "2.5",
            "session.pending_cap",
        ),
        ("WEIR_LLM_WORKERS", "many", "workers"),
        ("WEIR_LLM_QUEUE_CAPACTY", "5", "queue_capacty"),
    ] {
        let out = Command::new(BIN)
            .args(["check-config"])
            .env(var, value)
            .output()
            .expect("run");
        assert_eq!(out.status.code(), Some(2), "{var}={value}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(key), "{var}={value}: {err}");
    }
    // A numeric token is a string (the old loader typed it as an integer and refused it).
    let out = Command::new(BIN)
        .args(["check-config"])
        .env("WEIR_LLM_NATS__TOKEN", "123456")
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(BIN)
        .args(["check-config"])
        .env("WEIR_LLM_SESSION__PENDING_CAP", "0")
        .output()
        .expect("run");
    assert!(out.status.success());
    let caps: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(caps["session"]["pending_cap"], serde_json::Value::Null);
}

/// Threads of the tokio runtime's workers in process `pid` (Linux `/proc`).
fn runtime_workers(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("tasks")
        .filter_map(Result::ok)
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .is_ok_and(|c| c.starts_with("tokio-rt-worker"))
        })
        .count()
}

/// `--threads` sizes the runtime: 1 runs the
/// adapter on the current thread (no worker threads), 3 starts 3 workers; 0 is refused.
#[tokio::test]
async fn threads_flag_sizes_the_runtime() {
    let server = weir_testkit::NatsServer::start().expect("nats-server");
    for (threads, workers) in [("1", 0), ("3", 3)] {
        let mut child = serve(server.url(), &["--threads", threads]);
        let line = first_line(&mut child).await;
        assert!(line.contains("\"ready\""), "{line}");
        assert_eq!(
            runtime_workers(child.0.id()),
            workers,
            "--threads {threads}"
        );
    }
    let out = Command::new(BIN)
        .args(["serve", "--threads", "0"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--threads"));
}

/// `--nats-url` takes a comma-separated list, as the docs say: the adapter connects to
/// whichever server answers (not an "invalid port number" exit).
#[tokio::test]
async fn nats_url_list_connects_to_a_live_server() {
    let server = weir_testkit::NatsServer::start().expect("nats-server");
    let list = format!("nats://127.0.0.1:1,{}", server.url());
    let mut child = serve(&list, &[]);
    let line = first_line(&mut child).await;
    assert!(line.contains("\"ready\""), "not ready: {line:?}");
    let client = LlmClient::new(connect(server.url()).await, "llm.infer");
    let reply = client
        .request(r#"{"prompt":"hi"}"#)
        .timeout(STEP)
        .send()
        .await;
    assert!(reply.is_ok(), "{reply:?}");
}

/// `/readyz` answers 503 while NATS is gone and 200 again once it is back.
#[tokio::test]
async fn readyz_is_503_while_nats_is_gone() {
    let server = weir_testkit::NatsServer::start().expect("nats-server");
    let mut child = serve(server.url(), &[]);
    let line = first_line(&mut child).await;
    let ready: serde_json::Value = serde_json::from_str(&line).expect("ready line is JSON");
    let readyz = format!("http://{}/readyz", ready["admin"].as_str().expect("admin"));
    let wait_for = |want: u16| {
        let readyz = readyz.clone();
        async move {
            for _ in 0..200 {
                if get(&readyz).await.0 == want {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            false
        }
    };
    assert!(wait_for(200).await, "ready with NATS up");
    server.kill().expect("kill");
    assert!(wait_for(503).await, "/readyz 503 with NATS gone");
    server.restart().expect("restart");
    assert!(wait_for(200).await, "ready again after the restart");
}

/// NATS down at start: the adapter starts anyway, answers `/readyz`
/// 503, connects when the server appears, and serves.
#[tokio::test]
async fn starts_with_nats_down_and_serves_once_it_is_up() {
    let server = weir_testkit::NatsServer::start().expect("nats-server");
    server
        .kill()
        .expect("kill: the port is known, nothing listens");
    let mut child = serve(server.url(), &[]);
    let line = first_line(&mut child).await;
    let ready: serde_json::Value = serde_json::from_str(&line).expect("ready line is JSON");
    let readyz = format!("http://{}/readyz", ready["admin"].as_str().expect("admin"));
    assert_eq!(get(&readyz).await.0, 503, "not ready without NATS");
    // The gauge the not-ready alert reads says so too.
    let metrics_url = readyz.replace("/readyz", "/metrics");
    let connected = |text: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix("weir_llm_nats_connected "))
            .map(str::to_owned)
    };
    let (_, text) = get(&metrics_url).await;
    assert_eq!(
        connected(&text).as_deref(),
        Some("0"),
        "weir_llm_nats_connected"
    );
    server.restart().expect("start the server");
    let mut up = false;
    for _ in 0..200 {
        if get(&readyz).await.0 == 200 {
            up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(up, "ready once NATS is up");
    let (_, text) = get(&metrics_url).await;
    assert_eq!(
        connected(&text).as_deref(),
        Some("1"),
        "weir_llm_nats_connected"
    );
    let client = LlmClient::new(connect(server.url()).await, "llm.infer");
    let reply = client.request("hello").timeout(STEP).send().await;
    assert_eq!(&reply.expect("answered").body[..], b"hello");
}

/// A 10 MB reply from an HTTPS backend is refused (`backend_error` with the byte cap in
/// `limit`) and the binary's RSS does not keep it: measured on the real process, after
/// one small request has set up the pooled TLS connection. Prints the figures.
#[tokio::test]
async fn a_10_mb_backend_reply_is_refused_and_rss_grows_less_than_1_mb() {
    let server = weir_testkit::NatsServer::start().expect("nats-server");
    let backend = tls_openai::TlsOpenAi::start(false).await;
    let dir = tempfile::tempdir().expect("dir");
    let cfg = dir.path().join("adapter.toml");
    std::fs::write(
        &cfg,
        format!("workers = 1\n{}", backend.backend_toml(false)),
    )
    .expect("config");
    let mut child = serve(
        server.url(),
        &["--config", cfg.to_str().expect("utf-8 path")],
    );
    let line = first_line(&mut child).await;
    assert!(line.contains("\"ready\""), "{line}");
    let pid = child.0.id();
    let rss = || weir_testkit::process::rss_bytes(pid).expect("rss") as i64;
    let client = LlmClient::new(connect(server.url()).await, "llm.infer");
    for _ in 0..3 {
        client
            .request("{}")
            .timeout(STEP)
            .send()
            .await
            .expect("warm-up over https");
    }
    let before = rss();
    let mut peak = before;
    for _ in 0..10 {
        let call = client.request(r#"{"huge":1}"#).timeout(STEP).send();
        tokio::pin!(call);
        let e = loop {
            tokio::select! {
                r = &mut call => break r.expect_err("too large"),
                _ = tokio::time::sleep(Duration::from_millis(2)) => peak = peak.max(rss()),
            }
        };
        assert_eq!(
            e.kind(),
            weir_llm_client::ClientErrorKind::Server(weir_protocol::llm::ErrorCode::BackendError)
        );
        assert!(e.details().limit.is_some(), "{e}");
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let after = rss();
    eprintln!(
        "10 x 10 MB replies refused: RSS before {} KiB, peak {} KiB (+{} KiB), after {} KiB (+{} KiB)",
        before / 1024,
        peak / 1024,
        (peak - before) / 1024,
        after / 1024,
        (after - before) / 1024
    );
    assert!(
        after - before < 1024 * 1024,
        "RSS grew {} KiB",
        (after - before) / 1024
    );
}

/// `serve --list-keys` prints every key (the `[[limits]]` fields and every sim
/// distribution key included), with default and range, and exits 0 without connecting
/// anywhere.
#[test]
fn list_keys_prints_the_keys_with_defaults() {
    let out = Command::new(BIN)
        .args(["serve", "--list-keys"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    for key in [
        "workers ",
        "stream.window ",
        "stream.ack_timeout_ms ",
        "backend.openai.tls_ca_file ",
        "backend.openai.tls_cert_file ",
        "service.status_subject ",
        "backend.sim.tokens_per_second ",
        "backend.sim.p99_ms ",
        "backend.sim.min_ms ",
        "limits[].limit ",
        "limits[].max_wait_ms ",
        "admin.request_timeout_ms ",
    ] {
        assert!(
            text.lines().any(|l| l.starts_with(key)),
            "{key} missing:\n{text}"
        );
    }
    let window = text
        .lines()
        .find(|l| l.starts_with("stream.window "))
        .unwrap_or_default();
    assert!(
        window.contains("default 16") && window.contains("0..=100000"),
        "{window}"
    );
}

/// The deploy kit: `deploy/llm-adapter.toml` passes `check-config` and starts
/// `serve` (as the systemd unit runs them), and every `weir_llm_*`, `weir_build_info` and `process_*` metric
/// named by the alerting rules or the dashboard is in its first `/metrics` scrape.
#[tokio::test]
async fn deploy_kit_config_starts_and_rules_name_only_exported_metrics() {
    // As the systemd unit runs it: ExecStartPre (check-config), then ExecStart, with
    // the example configuration as shipped; only the addresses are made local.
    let unit = |directive| {
        weir_testkit::deploy::unit_exec_args("llm-adapter.service", directive).expect("unit")
    };
    let check = Command::new(BIN)
        .args(unit("ExecStartPre"))
        .output()
        .expect("run check-config");
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );

    let server = weir_testkit::NatsServer::start().expect("nats-server");
    let start = unit("ExecStart");
    assert_eq!(start.first().map(String::as_str), Some("serve"));
    let args: Vec<&str> = start[1..].iter().map(String::as_str).collect();
    let mut child = serve(server.url(), &args);
    let line = first_line(&mut child).await;
    let ready: serde_json::Value = serde_json::from_str(&line).expect("ready line is JSON");
    let admin = ready["admin"].as_str().expect("admin");
    let (status, text) = get(&format!("http://{admin}/metrics")).await;
    assert_eq!(status, 200);
    let scraped = weir_testkit::deploy::scraped(&text);
    let gone: Vec<String> = weir_testkit::deploy::referenced()
        .expect("deploy files")
        .into_iter()
        .filter(|(n, _)| {
            n.starts_with("weir_llm_") || n.starts_with("weir_build_") || n.starts_with("process_")
        })
        .filter(|(n, _)| !scraped.contains(n))
        .map(|(n, f)| format!("{n} (in deploy/{f})"))
        .collect();
    assert!(
        gone.is_empty(),
        "not exported by llm-adapter serve: {gone:?}"
    );
    let value = |name: &str| -> f64 {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    let (rss, bound) = (
        value("process_resident_memory_bytes"),
        value("weir_llm_memory_bound_bytes"),
    );
    assert!(rss > 1e6 && rss < bound, "rss {rss}, bound {bound}");
}
