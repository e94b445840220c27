//! The ingress under test, as a child process: spawn, ready line, `/v1/stats`, RSS, CPU.
//!
//! Both designs run as a separate process with the same interface (the contract in
//! `docs/contracts.md`): the bounded one is the `audio-ingress` binary, the naive one is
//! this binary's hidden `naive-ingress` subcommand. A separate process is what makes the
//! RSS figure the ingress's own.
//!
//! Invariants:
//! - the child is killed when its [`IngressProcess`] is dropped (`kill_on_drop`), on
//!   every exit path of the load test, including a panic or Ctrl-C;
//! - its stdin is a pipe that we never write to: the naive ingress exits when it reads
//!   EOF, so it also dies if the load test is killed with SIGKILL;
//! - its stdout and stderr are always drained (a full pipe would stall the child); the
//!   last lines of stderr are kept for error messages;
//! - every wait is bounded: the ready line within [`READY_TIMEOUT`], a stats poll within
//!   [`STATS_TIMEOUT`].

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::error::{Error, ErrorKind};

/// How long the child has to print its ready line.
pub const READY_TIMEOUT: Duration = Duration::from_secs(15);
/// How long one `/v1/stats` request may take.
pub const STATS_TIMEOUT: Duration = Duration::from_millis(800);
/// Environment variable naming the `audio-ingress` binary explicitly.
pub const INGRESS_BIN_ENV: &str = "WEIR_INGRESS_BIN";
/// Lines of child stderr kept for error messages.
const STDERR_TAIL: usize = 40;

/// Which ingress design runs.
#[derive(strum::IntoStaticStr, strum::Display, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Design {
    /// weir's `audio-ingress`: one queue and one publisher per stream, bounded by bytes
    /// and age, publishes with a timeout.
    #[default]
    Bounded,
    /// The deployed shape: a task per frame behind a per-stream semaphore of 3.
    Naive,
}

/// The `/v1/stats` snapshot and the ready line: the ingress's own types
/// (`weir_protocol::admin`), so the load test reads exactly what the service writes.
pub use weir_protocol::admin::{IngressStats, ReadyLine};

/// A stats (or other admin) poll that failed, of kind [`ErrorKind::Process`].
fn poll_failed(why: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Process, format!("GET /v1/stats failed: {why}"))
}

/// A running ingress child process.
#[derive(Debug)]
pub struct IngressProcess {
    child: Child,
    pid: u32,
    ws: SocketAddr,
    admin: SocketAddr,
    http: reqwest::Client,
    stderr_tail: Arc<Mutex<VecDeque<String>>>,
}

impl IngressProcess {
    /// Spawns `program` with `args` (including `serve` or `naive-ingress`), logging
    /// warnings and errors only, and waits (bounded) for its ready line.
    pub async fn spawn(program: &Path, args: &[String]) -> Result<Self, Error> {
        let bin = program.display().to_string();
        let mut cmd = Command::new(program);
        cmd.args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .env("RUST_LOG", "warn")
            .kill_on_drop(true);
        let mut child = cmd.spawn().map_err(|e| {
            Error::with_source(ErrorKind::Process, format!("cannot start {bin}"), e)
        })?;
        let pid = child.id().unwrap_or(0);
        let stderr_tail = Arc::new(Mutex::new(VecDeque::with_capacity(STDERR_TAIL)));
        if let Some(stderr) = child.stderr.take() {
            let tail = stderr_tail.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(stderr).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if let Ok(mut t) = tail.lock() {
                        if t.len() == STDERR_TAIL {
                            t.pop_front();
                        }
                        t.push_back(line);
                    }
                }
            });
        }
        let not_ready = |why: String, tail: &Mutex<VecDeque<String>>| {
            let stderr = joined(tail);
            let message =
                format!("{bin} did not become ready: {why}; its stderr ended with:\n{stderr}");
            Error::new(ErrorKind::Process, message)
        };
        let Some(stdout) = child.stdout.take() else {
            return Err(not_ready("no stdout pipe".into(), &stderr_tail));
        };
        let mut lines = BufReader::new(stdout).lines();
        let ready = tokio::time::timeout(READY_TIMEOUT, async {
            loop {
                match lines.next_line().await {
                    Ok(Some(line)) => {
                        if let Ok(r) = serde_json::from_str::<ReadyLine>(&line)
                            && r.event == "ready"
                        {
                            return Ok(r);
                        }
                    }
                    Ok(None) => return Err("exited before its ready line".to_string()),
                    Err(e) => return Err(format!("reading stdout: {e}")),
                }
            }
        })
        .await;
        let ready = match ready {
            Ok(Ok(r)) => r,
            Ok(Err(why)) => {
                // Give the stderr reader a moment to collect the reason.
                tokio::time::sleep(Duration::from_millis(100)).await;
                return Err(not_ready(why, &stderr_tail));
            }
            Err(_) => {
                return Err(not_ready(
                    format!("no ready line within {READY_TIMEOUT:?}"),
                    &stderr_tail,
                ));
            }
        };
        // Keep draining stdout so the child never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let parse = |what: &str, v: Option<String>| -> Result<SocketAddr, Error> {
            let v =
                v.ok_or_else(|| not_ready(format!("ready line lacks \"{what}\""), &stderr_tail))?;
            let addr: SocketAddr = v.parse().map_err(|e| {
                not_ready(format!("ready line \"{what}\": {v:?}: {e}"), &stderr_tail)
            })?;
            if !addr.ip().is_loopback() {
                return Err(not_ready(
                    format!("\"{what}\" is {addr}, not a loopback address"),
                    &stderr_tail,
                ));
            }
            Ok(addr)
        };
        let ws = parse("ws", ready.ws)?;
        let admin = parse("admin", ready.admin)?;
        let http = reqwest::Client::builder()
            .timeout(STATS_TIMEOUT)
            .no_proxy()
            .build()
            .map_err(poll_failed)?;
        Ok(Self {
            child,
            pid,
            ws,
            admin,
            http,
            stderr_tail,
        })
    }

    /// The WebSocket listen address.
    pub fn ws_addr(&self) -> SocketAddr {
        self.ws
    }

    /// One `/v1/stats` snapshot.
    pub async fn stats(&self) -> Result<IngressStats, Error> {
        let text = self.admin_text("/v1/stats").await?;
        serde_json::from_str(&text).map_err(poll_failed)
    }

    /// The admin port's `/metrics` (Prometheus text).
    pub async fn metrics(&self) -> Result<String, Error> {
        self.admin_text("/metrics").await
    }

    /// The admin port's `/v1/streams` (one object per stream the ingress holds).
    pub async fn streams(&self) -> Result<Vec<serde_json::Value>, Error> {
        let text = self.admin_text("/v1/streams").await?;
        serde_json::from_str(&text).map_err(poll_failed)
    }

    async fn admin_text(&self, path: &str) -> Result<String, Error> {
        let url = format!("http://{}{path}", self.admin);
        let resp = self.http.get(&url).send().await.map_err(poll_failed)?;
        if !resp.status().is_success() {
            return Err(poll_failed(format!("{path}: status {}", resp.status())));
        }
        resp.text().await.map_err(poll_failed)
    }

    /// Resident set size of the process, from `/proc/<pid>/status`.
    pub fn rss_bytes(&self) -> Option<u64> {
        rss_bytes(self.pid)
    }

    /// CPU time (user + system) the process has used so far.
    pub fn cpu_time(&self) -> Option<Duration> {
        cpu_time_of(Some(self.pid))
    }

    /// The last lines the process wrote to stderr.
    pub fn stderr_tail(&self) -> String {
        joined(&self.stderr_tail)
    }

    /// Kills the process and waits for it (bounded).
    pub async fn stop(mut self) {
        let _ = self.child.start_kill();
        let _ = tokio::time::timeout(Duration::from_secs(2), self.child.wait()).await;
    }
}

/// The samples of a Prometheus text (`/metrics`): (metric name, the series with its
/// labels, value); comments and unreadable lines are left out.
pub fn samples(text: &str) -> impl Iterator<Item = (&str, &str, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let value = value.trim().parse().ok()?;
            Some((series.split('{').next().unwrap_or(series), series, value))
        })
}

/// The value of label `name` in a series (`metric{name="value",...}`).
pub fn label<'a>(series: &'a str, name: &str) -> Option<&'a str> {
    series
        .split(&format!("{name}=\""))
        .nth(1)?
        .split('"')
        .next()
}

/// The kept stderr lines as one text.
fn joined(tail: &Mutex<VecDeque<String>>) -> String {
    tail.lock()
        .map(|t| t.iter().cloned().collect::<Vec<_>>().join("\n"))
        .unwrap_or_default()
}

pub use weir_testkit::process::rss_bytes;

/// CPU time process `pid` used since [`cpu_time_of`] read `start` (0 when unreadable).
pub fn cpu_since(pid: u32, start: Duration) -> Duration {
    cpu_time_of(Some(pid))
        .unwrap_or_default()
        .saturating_sub(start)
}

/// Busy CPU time of the machine since [`machine_busy`] read `start`.
pub fn machine_busy_since(start: Duration) -> Duration {
    machine_busy().unwrap_or_default().saturating_sub(start)
}

/// CPU time the whole machine spent busy (all cores: user, nice, system, irq,
/// softirq, steal).
pub use weir_service::process::{cpu_time_of, machine_busy};

/// Finds the `audio-ingress` binary: `WEIR_INGRESS_BIN`, else next to `exe` (the
/// running executable), else one directory up (when `exe` is a test in `deps/`).
pub fn find_ingress_bin(exe: Option<&Path>) -> Result<PathBuf, Error> {
    if let Some(explicit) = std::env::var_os(INGRESS_BIN_ENV).filter(|v| !v.is_empty()) {
        let p = PathBuf::from(explicit);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(Error::new(
                ErrorKind::Process,
                format!("{INGRESS_BIN_ENV}={} is not a file", p.display()),
            ))
        };
    }
    let mut tried = Vec::new();
    if let Some(dir) = exe.and_then(Path::parent) {
        for d in [Some(dir), dir.parent()].into_iter().flatten() {
            let p = d.join("audio-ingress");
            if p.is_file() {
                return Ok(p);
            }
            tried.push(p.display().to_string());
        }
    }
    Err(Error::new(
        ErrorKind::Process,
        format!(
            "audio-ingress binary not found (tried {}); build it with \
         `cargo build --release -p weir-audio-ingress` (scripts/demo does) or set {INGRESS_BIN_ENV}",
            tried.join(", ")
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_tolerate_missing_and_extra_fields() {
        let s: IngressStats = serde_json::from_str(
            r#"{"pending_bytes":5,"frames":{"offered":3,"dropped":{"queue_full":2}},"new":1}"#,
        )
        .unwrap();
        assert_eq!(s.pending_bytes, 5);
        assert_eq!(s.frames.offered, 3);
        assert_eq!(s.frames.dropped_total(), 2);
        assert_eq!(s.frames.handed_over, None, "absent before the window lands");
        assert_eq!(s.window, None);
    }

    #[test]
    fn stats_read_the_server_confirmed_window() {
        let s: IngressStats = serde_json::from_str(
            r#"{"pending_frames":7,"frames":{"offered":100,"handed_over":95,"published":90,
                "unconfirmed":3,"possibly_lost":2,"dropped":{"queue_full":5}},
                "window":{"mode":"confirmed","unconfirmed_bytes":1920,"unconfirmed_frames":3,"limit_bytes":64000,
                "rounds":42,"round_ms":{"count":42,"p50":0.4,"p95":1.0,"p99":2.0,"max":3.5},
                "oldest_unconfirmed_age_ms":1.5,"disconnects":1,"future":true}}"#,
        )
        .unwrap();
        assert_eq!(s.frames.handed_over, Some(95));
        assert_eq!((s.frames.unconfirmed, s.frames.possibly_lost), (3, 2));
        let w = s.window.unwrap();
        assert_eq!(
            (w.unconfirmed_bytes, w.limit_bytes, w.disconnects),
            (1920, 64_000, 1)
        );
        assert_eq!(w.round_ms.count, 42);
        assert_eq!(w.mode.as_deref(), Some("confirmed"));
        assert_eq!(w.round_ms.max, 3.5);
    }

    #[test]
    fn own_rss_is_readable() {
        assert!(rss_bytes(std::process::id()).unwrap_or(0) > 0);
    }
}
