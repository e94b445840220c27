//! The lease-worker processes of a failover run: one per life (a restarted worker is a
//! new life with its own logs), spawned as this binary's hidden `lease-worker`
//! subcommand, and their logs.
//!
//! Invariants: a worker is killed on drop (`kill_on_drop`) and killed before its logs are
//! audited; every wait is bounded (a kill waits at most 5 s, the drain [`DRAIN_MAX`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::time::Instant;

use super::{BUCKET, DRAIN_MAX, FailoverEnv, NODES, WORKER_LIFETIME};
use crate::error::{Error, io, process};
use crate::ingress::cpu_time_of;
use crate::lease_audit::{self, Instance};
use crate::scenario::run::SUBJECT_TEMPLATE;
use crate::timeliness::unix_ms;

/// One worker process life.
pub(super) struct WorkerProc {
    pub(super) name: String,
    pub(super) frames: PathBuf,
    pub(super) leases: PathBuf,
    pub(super) stderr: PathBuf,
    pub(super) child: Option<Child>,
    /// CPU it used, sampled before it was killed.
    pub(super) cpu: Option<Duration>,
    pub(super) ended_ms: Option<u64>,
}

impl WorkerProc {
    pub(super) fn cpu_now(&self) -> Option<Duration> {
        (self.child.as_ref().and_then(Child::id))
            .and_then(|p| cpu_time_of(Some(p)))
            .or(self.cpu)
    }

    /// SIGKILL and reap (bounded).
    pub(super) async fn kill(&mut self) {
        self.cpu = self.cpu_now();
        if let Some(mut c) = self.child.take() {
            let _ = c.start_kill();
            self.ended_ms = Some(unix_ms());
            let _ = tokio::time::timeout(Duration::from_secs(5), c.wait()).await;
        }
    }
}

pub(super) fn spawn_worker(
    env: &FailoverEnv,
    dir: &Path,
    worker: usize,
    life: usize,
    urls: &[String],
) -> Result<WorkerProc, Error> {
    let name = format!("w{worker}#{life}");
    let base = dir.join(format!("w{worker}-{life}"));
    let frames = base.with_extension("frames");
    let leases = base.with_extension("leases");
    let stderr_path = base.with_extension("stderr");
    let stderr = std::fs::File::create(&stderr_path).map_err(|e| io(&stderr_path, e))?;
    // Worker i connects to node i mod 3 first, then the others.
    let list: Vec<String> = (0..urls.len())
        .map(|k| urls[(worker + k) % urls.len()].clone())
        .collect();
    let child = Command::new(&env.self_exe)
        .arg("lease-worker")
        .args(["--id", &format!("w{worker}")])
        .args(["--nats-urls", &list.join(",")])
        .arg("--frames-log")
        .arg(&frames)
        .arg("--leases-log")
        .arg(&leases)
        .args(["--subject", SUBJECT_TEMPLATE])
        .args(["--partitions", &env.partitions.to_string()])
        .args(["--bucket", BUCKET])
        .args(["--replicas", &NODES.to_string()])
        .args(["--ttl-ms", &env.lease_ttl.as_millis().to_string()])
        .args(["--max-lifetime-s", &WORKER_LIFETIME.as_secs().to_string()])
        // WEIR_FAILOVER_LOG=weir_audio_consumer=info logs every lease decision of the workers.
        .env(
            "RUST_LOG",
            std::env::var("WEIR_FAILOVER_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| process(format!("cannot start {}", env.self_exe.display()), e))?;
    Ok(WorkerProc {
        name,
        frames,
        leases,
        stderr: stderr_path,
        child: Some(child),
        cpu: None,
        ended_ms: None,
    })
}

pub(super) fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// The instances' ownership timelines as logged so far.
pub(super) fn instances(workers: &[WorkerProc]) -> Vec<Instance> {
    workers
        .iter()
        .map(|w| {
            let mut i = lease_audit::parse_leases(&w.name, &read(&w.leases));
            i.ended_ms = w.ended_ms;
            i
        })
        .collect()
}

/// Step 6: waits (at most [`DRAIN_MAX`]) until the workers' frame logs stop growing;
/// returns whether they did.
pub(super) async fn drain_logs(workers: &[WorkerProc]) -> bool {
    let deadline = Instant::now() + DRAIN_MAX;
    crate::scenario::until_stable(deadline, Duration::from_millis(200), 3, async || {
        let logs = workers
            .iter()
            .filter_map(|w| std::fs::metadata(&w.frames).ok());
        (logs.map(|m| m.len()).sum(), true)
    })
    .await
}

/// Copies every worker log into `<keep>/<scenario>-<streams>-<start_ms>/`, with a
/// `times` file (start, kill, restart in Unix ms).
pub(super) fn keep_logs(
    workers: &[WorkerProc],
    keep: &Path,
    label: &str,
    start_ms: u64,
    kill_ms: u64,
    restart_ms: u64,
) -> Result<PathBuf, Error> {
    let to = keep.join(format!("{}-{start_ms}", label.replace(' ', "-")));
    std::fs::create_dir_all(&to).map_err(|e| io(&to, e))?;
    for w in workers {
        for from in [&w.frames, &w.leases, &w.stderr] {
            if let Some(name) = from.file_name() {
                std::fs::copy(from, to.join(name)).map_err(|e| io(from, e))?;
            }
        }
    }
    std::fs::write(
        to.join("times"),
        format!("start {start_ms}\nkill {kill_ms}\nrestart {restart_ms}\n"),
    )
    .map_err(|e| io(&to, e))?;
    Ok(to)
}

/// A worker's stderr in one line: each distinct message (timestamp and `key=value`
/// fields left out) with how often it appeared, most frequent first, at most 6.
pub(super) fn summarise_stderr(text: &str) -> String {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let key = line
            .split_whitespace()
            .skip(1)
            .filter(|t| !t.contains('='))
            .collect::<Vec<_>>()
            .join(" ");
        *counts.entry(key).or_insert(0) += 1;
    }
    let mut v: Vec<(String, usize)> = counts.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    v.iter()
        .take(6)
        .map(|(k, n)| format!("{n} × {k}"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The last `n` bytes of `s` (on a char boundary), on one line.
pub(super) fn tail(s: &str, n: usize) -> String {
    let mut start = s.len().saturating_sub(n);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    s[start..].trim().replace('\n', " / ")
}
