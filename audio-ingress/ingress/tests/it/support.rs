//! Helpers shared by the integration tests: the real `audio-ingress serve` binary with
//! the default configuration plus the overrides a test names, bounded plain-HTTP
//! requests, the process's RSS, the process-wide Prometheus recorder and the Python
//! scripts in `tests/python/`.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// Bound on any single await in these tests.
pub const STEP: Duration = Duration::from_secs(10);

/// A script in `tests/python/`.
/// Whether `event` is one of a resumable stream's lifecycle events (`opened`, `ack`),
/// which tests of other events skip.
pub fn is_lifecycle(event: &serde_json::Value) -> bool {
    matches!(event["type"].as_str(), Some("opened" | "ack"))
}

pub fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/python")
        .join(name)
}

/// The process-wide Prometheus recorder, installed on first use: every in-process
/// service of this test binary renders from it (a process holds one global recorder).
pub fn prometheus() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = weir_audio_ingress::metrics::prometheus_recorder();
            let handle = recorder.handle();
            metrics::set_global_recorder(recorder).expect("the only recorder of this process");
            handle
        })
        .clone()
}

/// The `audio-ingress` binary the tests start: this build's, or `WEIR_INGRESS_BIN`
/// (e.g. `target/release/audio-ingress`, to take a test's figures on a release build).
pub fn binary() -> PathBuf {
    std::env::var_os("WEIR_INGRESS_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_audio-ingress")))
}

/// A running `audio-ingress serve` (killed on drop).
pub struct Binary {
    /// The process.
    pub child: tokio::process::Child,
    /// WebSocket listener.
    pub ws: SocketAddr,
    /// Admin listener.
    pub admin: SocketAddr,
    _stdout: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
}

impl Binary {
    /// Starts the binary (default configuration, free ports, `nats_url`, then `sets`
    /// as `--set k=v`) and reads its ready line. Does not wait for NATS.
    pub async fn start(nats_url: &str, sets: &[(&str, &str)]) -> Self {
        Self::start_with(&[], &[], nats_url, sets).await
    }

    /// [`Self::start`] with extra `serve` arguments (e.g. `--config FILE`) and
    /// environment variables.
    pub async fn start_with(
        args: &[&str],
        envs: &[(&str, &str)],
        nats_url: &str,
        sets: &[(&str, &str)],
    ) -> Self {
        let mut cmd = tokio::process::Command::new(binary());
        cmd.arg("serve").args(args).envs(envs.iter().copied());
        // Listen, admin and NATS come after `args`: the last value of a flag wins.
        cmd.args([
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
            "--nats-url",
            nats_url,
        ]);
        for (k, v) in sets {
            cmd.arg("--set").arg(format!("{k}={v}"));
        }
        let mut child = cmd
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn audio-ingress");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let line = tokio::time::timeout(STEP, lines.next_line())
            .await
            .expect("ready line in time")
            .expect("read stdout")
            .expect("a ready line");
        let ready: Value = serde_json::from_str(&line).expect("ready line is JSON");
        let addr = |k: &str| -> SocketAddr {
            ready[k]
                .as_str()
                .and_then(|a| a.parse().ok())
                .unwrap_or_else(|| panic!("ready line lacks {k}: {line}"))
        };
        Self {
            ws: addr("ws"),
            admin: addr("admin"),
            child,
            _stdout: lines,
        }
    }

    /// Starts it and waits (bounded) until `/readyz` answers 200.
    pub async fn start_ready(nats_url: &str, sets: &[(&str, &str)]) -> Self {
        let b = Self::start(nats_url, sets).await;
        assert!(b.wait_ready(200).await, "/readyz never answered 200");
        b
    }

    /// Waits at most [`STEP`] for `/readyz` to answer `status`.
    pub async fn wait_ready(&self, status: u16) -> bool {
        let deadline = Instant::now() + STEP;
        while Instant::now() < deadline {
            if http_get(self.admin, "/readyz").await.0 == status {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }

    /// Resident set size of the process, in KiB (Linux `/proc`).
    pub fn rss_kib(&self) -> u64 {
        let pid = self.child.id().expect("running");
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .expect("VmRSS")
    }

    /// The value of a Prometheus sample line starting with `prefix` (0 when absent).
    pub async fn metric(&self, prefix: &str) -> f64 {
        let (_, body) = http_get(self.admin, "/metrics").await;
        body.lines()
            .filter(|l| l.starts_with(prefix))
            .filter_map(|l| l.rsplit(' ').next())
            .filter_map(|v| v.parse::<f64>().ok())
            .fold(0.0, |a, b| a + b)
    }
}

/// A bounded HTTP/1.1 GET: (status, body); (0, "") when it could not be done in 2 s.
pub async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    raw_request(
        addr,
        &format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"),
    )
    .await
}

/// Sends `request` as is and reads the response to the end: (status, body); (0, "")
/// when it could not be done in 2 s.
pub async fn raw_request(addr: SocketAddr, request: &str) -> (u16, String) {
    let attempt = async {
        let mut s = TcpStream::connect(addr).await.ok()?;
        s.write_all(request.as_bytes()).await.ok()?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.ok()?;
        let text = String::from_utf8_lossy(&buf).to_string();
        let status = text.split_whitespace().nth(1)?.parse().ok()?;
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        Some((status, body))
    };
    tokio::time::timeout(Duration::from_secs(2), attempt)
        .await
        .ok()
        .flatten()
        .unwrap_or((0, String::new()))
}

/// Raises this process's soft open-file limit to its hard limit (safe `setrlimit`).
pub fn raise_fd_limit() -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard).expect("setrlimit");
    }
    hard
}

/// The status, `Retry-After` and JSON body of a refused WebSocket upgrade (`what` names
/// the attempt in the panic when the upgrade was not refused over HTTP).
pub fn refusal<T>(
    what: &str,
    result: Result<T, tokio_tungstenite::tungstenite::Error>,
) -> (u16, Option<String>, Value) {
    match result {
        Ok(_) => panic!("{what}: upgrade accepted"),
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
            let retry = resp
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let body = resp
                .body()
                .as_ref()
                .and_then(|b| serde_json::from_slice(b).ok())
                .unwrap_or(Value::Null);
            (resp.status().as_u16(), retry, body)
        }
        Err(e) => panic!("{what}: {e}"),
    }
}

/// The service in process (the default configuration, free loopback ports, NATS at
/// `nats_url`, then `overrides` as `--set k=v`), rendering metrics to [`prometheus`];
/// returns once it is connected to NATS.
pub async fn start_in_process(
    nats_url: &str,
    overrides: &[(&str, &str)],
) -> weir_audio_ingress::service::RunningService<weir_audio_producer::jetstream::NatsSink> {
    use weir_audio_ingress::config::{Config, ConfigSources};
    use weir_audio_producer::publisher::Sink;
    let base = [
        ("nats.url", nats_url),
        ("listen", "127.0.0.1:0"),
        ("admin.listen", "127.0.0.1:0"),
    ];
    let config = Config::load(&ConfigSources {
        overrides: base
            .iter()
            .chain(overrides)
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        ..Default::default()
    })
    .expect("config");
    let svc = tokio::time::timeout(
        STEP,
        weir_audio_ingress::service::start(config, Some(prometheus())),
    )
    .await
    .expect("start in time")
    .expect("start");
    let ingress = svc.ingress().clone();
    let connected =
        weir_audio_producer::testing::wait_until(STEP, || ingress.sink().is_connected()).await;
    assert!(connected, "the service connected to NATS");
    svc
}

/// Runs `tests/python/capacity_client.py SCENARIO` (a `websockets` producer and a
/// nats-py worker) against the service at `ws` and NATS at `nats_url`, within
/// `timeout`; asserts it exited 0 and returns its last line's JSON.
pub async fn capacity_client(
    ws: SocketAddr,
    nats_url: &str,
    scenario: &str,
    timeout: Duration,
) -> Value {
    let out = tokio::time::timeout(
        timeout,
        tokio::process::Command::new(weir_audio_consumer::testing::python())
            .arg(script("capacity_client.py"))
            .args(["--ws", &format!("ws://{ws}")])
            .args(["--nats", nats_url, scenario])
            .output(),
    )
    .await
    .expect("python in time")
    .expect("python runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{scenario}: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.lines().last().expect("a line")).expect("JSON")
}
