//! `worker-failover` and `node-failover`: recognition workers with lease ownership on
//! a 3-node NATS cluster, one worker process or one NATS node SIGKILLed mid-run and
//! restarted later.
//!
//! Order of events, each step bounded in time:
//! 1. a 3-node cluster on free loopback ports (`weir_testkit::NatsCluster`, JetStream
//!    on every node; the lease bucket has 3 replicas);
//! 2. `--workers` processes of this executable's hidden `lease-worker` subcommand,
//!    worker `i` connected to node `i mod 3` first; wait (at most
//!    [`SPREAD_WAIT`]) until they hold every partition once, ⌈P/N⌉ ± 1 each;
//! 3. producers (in this process) publish `--streams` streams straight to NATS,
//!    `weir.audio.{partition}.{stream}`, `--fps` frames per second each, seq from 1 —
//!    no ingress: the scenarios measure ownership, not admission;
//! 4. at [`FAULT_AT`]: `worker-failover` SIGKILLs worker `w0` (the process, not a
//!    simulation); `node-failover` SIGKILLs the node that leads the bucket's stream
//!    `KV_weir_leases` (the producers are connected to another node);
//! 5. `--pause` later the victim is started again (the worker with the same id, in a
//!    new process; the node on its ports with its store);
//! 6. at `--duration` the producers stop and send an `end` per stream; the drain waits until the workers' logs stop
//!    growing (at most [`DRAIN_MAX`]); then every process is killed (also on drop, e.g.
//!    on Ctrl-C).
//!
//! Everything reported is read from the workers' own logs afterwards
//! ([`crate::lease_audit`]): frames handed per worker instance, gap notices, and the
//! leases each instance held (polled every 50 ms — the resolution of every ownership
//! time). Double deliveries are counted from the frames' (stream, seq), never inferred
//! from ownership, and are reported whatever their number.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use tokio::process::{Child, Command};
use tokio::time::Instant;
use weir_protocol::WireName;
use weir_protocol::audio::Packet;
use weir_protocol::fnv1a_32;
use weir_testkit::NatsCluster;

use crate::error::{Error, ErrorKind, io, usage};
use crate::ingress::{cpu_since, cpu_time, machine_busy, machine_busy_since};
use crate::lease_audit::{self, FrameAuditor, Instance};
use crate::lease_worker::connect_options;
use crate::report::{
    CpuReport, FailoverCpu, FailoverReport, FaultReport, ProducerReport, RunReport,
};
use crate::scenario::Scenario;
use crate::scenario::run::{RunOutput, TempDir, blocking};
use crate::timeliness::unix_ms;

/// When the victim is killed, after the producers started.
pub const FAULT_AT: Duration = Duration::from_secs(3);
/// Default time the victim stays down (`--pause`).
pub const DEFAULT_DOWN: Duration = Duration::from_secs(6);
/// Default sending time after the restart: the restarted worker takes its share back
/// gradually (one release per balancing tick on each other worker).
pub const AFTER_RESTART: Duration = Duration::from_secs(12);
/// The shortest sending time allowed after the restart.
pub const MIN_AFTER_RESTART: Duration = Duration::from_secs(3);
/// NATS nodes.
pub const NODES: usize = 3;
/// The lease bucket (its stream is `KV_<bucket>`).
pub const BUCKET: &str = "weir_leases";
/// The bucket's stream, `KV_<bucket>`.
const KV_STREAM: &str = "KV_weir_leases";
/// Longest wait for the initial spread.
pub const SPREAD_WAIT: Duration = Duration::from_secs(30);
/// Longest drain after the producers stopped.
pub const DRAIN_MAX: Duration = Duration::from_secs(5);
/// Audio subject template (the other scenarios' one).
pub const SUBJECT: &str = crate::scenario::run::SUBJECT_TEMPLATE;
/// A worker process ends by itself after this long (if the load test died).
const WORKER_LIFETIME: Duration = Duration::from_secs(1800);

/// What is killed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Victim {
    /// Worker `w0`'s process.
    Worker,
    /// The NATS node leading the lease bucket's stream.
    Node,
}

/// A failover run's plan.
#[derive(Debug, Clone, PartialEq)]
pub struct FailoverPlan {
    /// `worker-failover` or `node-failover`.
    pub scenario: Scenario,
    /// What is killed.
    pub victim: Victim,
    /// How long the producers send.
    pub duration: Duration,
    /// How long the victim stays down.
    pub down: Duration,
}

/// Resolves the plan from `--duration` and `--pause` (pure).
pub fn plan(
    scenario: Scenario,
    duration: Option<Duration>,
    pause: Option<Duration>,
) -> Result<FailoverPlan, Error> {
    let victim = match scenario {
        Scenario::WorkerFailover => Victim::Worker,
        Scenario::NodeFailover => Victim::Node,
        s => return Err(usage(format!("{} is not a failover scenario", s.as_str()))),
    };
    let down = pause.unwrap_or(DEFAULT_DOWN);
    let needed = FAULT_AT + down + MIN_AFTER_RESTART;
    let duration = duration.unwrap_or(FAULT_AT + down + AFTER_RESTART);
    if duration < needed {
        return Err(usage(format!(
            "--duration {:.1} s is too short for {}: the kill is at {} s, the victim stays \
             down --pause {:.1} s, and at least {} s follow the restart; use --duration {:.0} \
             or more",
            duration.as_secs_f64(),
            scenario.as_str(),
            FAULT_AT.as_secs(),
            down.as_secs_f64(),
            MIN_AFTER_RESTART.as_secs(),
            needed.as_secs_f64().ceil()
        )));
    }
    Ok(FailoverPlan {
        scenario,
        victim,
        duration,
        down,
    })
}

/// What a failover run needs besides its plan.
#[derive(Debug, Clone)]
pub struct FailoverEnv {
    /// This executable (the workers are its hidden `lease-worker` subcommand).
    pub self_exe: PathBuf,
    /// Worker processes (at least 2).
    pub workers: u32,
    /// Partitions.
    pub partitions: u32,
    /// The workers' lease length.
    pub lease_ttl: Duration,
    /// Frames per second per stream.
    pub fps: u32,
    /// No progress line.
    pub quiet: bool,
    /// Copy the workers' logs (frames, leases, stderr) into this directory at the end
    /// (`--keep-logs`): the raw evidence behind the audit.
    pub keep_logs: Option<PathBuf>,
}

/// One worker process life.
struct WorkerProc {
    name: String,
    frames: PathBuf,
    leases: PathBuf,
    stderr: PathBuf,
    child: Option<Child>,
    pid: Option<u32>,
    /// CPU it used, sampled before it was killed.
    cpu: Option<Duration>,
    ended_ms: Option<u64>,
}

impl WorkerProc {
    fn cpu_now(&self) -> Option<Duration> {
        self.pid.and_then(cpu_time).or(self.cpu)
    }

    /// SIGKILL and reap (bounded).
    async fn kill(&mut self) {
        self.cpu = self.cpu_now();
        if let Some(mut c) = self.child.take() {
            let _ = c.start_kill();
            self.ended_ms = Some(unix_ms());
            let _ = tokio::time::timeout(Duration::from_secs(5), c.wait()).await;
        }
        self.pid = None;
    }
}

fn spawn_worker(
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
        .args(["--subject", SUBJECT])
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
        .map_err(|e| {
            Error::with_source(
                ErrorKind::Process,
                format!("cannot start {}", env.self_exe.display()),
                e,
            )
        })?;
    let pid = child.id();
    Ok(WorkerProc {
        name,
        frames,
        leases,
        stderr: stderr_path,
        child: Some(child),
        pid,
        cpu: None,
        ended_ms: None,
    })
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// The instances' ownership timelines as logged so far.
fn instances(workers: &[WorkerProc]) -> Vec<Instance> {
    workers
        .iter()
        .map(|w| {
            let mut i = lease_audit::parse_leases(&w.name, &read(&w.leases));
            i.ended_ms = w.ended_ms;
            i
        })
        .collect()
}

fn frames_bytes(workers: &[WorkerProc]) -> u64 {
    workers
        .iter()
        .filter_map(|w| std::fs::metadata(&w.frames).ok())
        .map(|m| m.len())
        .sum()
}

/// The producers' streams: (id, subject).
fn streams_of(n: usize, partitions: u32) -> Vec<(String, String)> {
    (0..n)
        .map(|i| {
            let id = format!("s{i:05}");
            let p = fnv1a_32(id.as_bytes()) % partitions;
            let subject = SUBJECT
                .replace("{partition}", &p.to_string())
                .replace("{stream}", &id);
            (id, subject)
        })
        .collect()
}

/// 20 ms of 16 kHz PCM; its content does not matter to the audit.
fn pcm() -> Bytes {
    Bytes::from(vec![0u8; 640])
}

/// Publishes one frame per stream per tick until `stop`, then an `end` per stream
/// (so that a frame missing at the tail of a stream is declared too: the worker that
/// receives the `end` reports the hole before it); returns the last frame seq
/// published (the same for every stream).
async fn produce(
    client: async_nats::Client,
    streams: Vec<(String, String)>,
    fps: u32,
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    max: Duration,
) -> u64 {
    let mut tick = tokio::time::interval(Duration::from_secs(1) / fps.max(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let deadline = Instant::now() + max;
    let mut seq = 0u64;
    let pcm = pcm();
    // Bounded by `max`.
    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
        tick.tick().await;
        seq += 1;
        let Ok(payload) = Packet::frame(seq, pcm.clone()).encode() else {
            break;
        };
        publish_all(&client, &streams, &payload).await;
        sent.fetch_add(streams.len() as u64, Ordering::Relaxed);
    }
    if let Ok(end) = Packet::end(seq + 1).encode() {
        publish_all(&client, &streams, &end).await;
    }
    let _ = tokio::time::timeout(Duration::from_secs(2), client.flush()).await;
    seq
}

/// Runs `f` on the cluster off the runtime's worker threads (its calls block).
async fn on_cluster<T: Send + 'static>(
    cluster: &Arc<NatsCluster>,
    f: impl FnOnce(&NatsCluster) -> T + Send + 'static,
) -> Result<T, Error> {
    let cluster = cluster.clone();
    blocking(move || f(&cluster)).await
}

/// Publishes `payload` to every stream, each publish bounded by 1 s.
async fn publish_all(client: &async_nats::Client, streams: &[(String, String)], payload: &Bytes) {
    for (_, subject) in streams {
        let publish = client.publish(subject.clone(), payload.clone());
        let _ = tokio::time::timeout(Duration::from_secs(1), publish).await;
    }
}

fn loadavg_1m() -> Option<f64> {
    weir_service::process::load_average_1m()
}

/// Runs one failover scenario with `streams` streams.
pub async fn run(
    env: &FailoverEnv,
    plan: &FailoverPlan,
    streams: usize,
) -> Result<RunOutput, Error> {
    let label = format!("{} {streams}", plan.scenario.as_str());
    if env.workers < 2 {
        return Err(usage(format!(
            "{label}: --workers must be at least 2 (one is killed)"
        )));
    }
    if env.workers > env.partitions {
        return Err(usage(format!(
            "{label}: --workers must not exceed --partitions"
        )));
    }
    let mut notes = Vec::new();
    // 1. The cluster.
    let cluster = Arc::new(blocking(|| NatsCluster::start(NODES)).await?.map_err(|e| {
        Error::with_source(
            ErrorKind::Process,
            format!("cannot start a {NODES}-node nats-server cluster"),
            e,
        )
    })?);
    let urls = cluster.urls();
    let dir = TempDir::create("weir-failover")?;

    // 2. The workers, and the initial spread.
    let mut workers = Vec::new();
    for w in 0..env.workers as usize {
        workers.push(spawn_worker(env, &dir.0, w, 0, &urls)?);
    }
    let (lo, hi) = lease_audit::share_bounds(env.partitions, env.workers as usize);
    let spread_deadline = Instant::now() + SPREAD_WAIT;
    loop {
        let now = unix_ms();
        let inst = instances(&workers);
        if lease_audit::balanced_at(&inst, now, env.partitions, lo, hi)
            && inst.iter().all(|i| i.alive_at(now))
        {
            break;
        }
        if Instant::now() >= spread_deadline {
            let tails: Vec<String> = workers
                .iter()
                .map(|w| format!("{}: {}", w.name, tail(&read(&w.stderr), 400)))
                .collect();
            return Err(Error::new(
                ErrorKind::Run,
                format!(
                    "{label}: the workers did not share the {} partitions ({lo}..={hi} each) within \
                 {SPREAD_WAIT:?}: {:?}; stderr: {}",
                    env.partitions,
                    lease_audit::spread_at(&inst, now),
                    tails.join(" | ")
                ),
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A lease delivers a settle time (250 ms, then the next planning tick) after it is
    // held (docs/scale-out.md): frames published before a partition's first owner
    // reads are lost without a gap (a late join, not a handover).
    tokio::time::sleep(Duration::from_secs(1)).await;

    // The node to kill (node-failover) is the bucket's leader; the producers connect
    // to the other nodes, so that the run measures the leases, not a producer's
    // reconnect (the failover drill measures that).
    let planned_node = match plan.victim {
        Victim::Node => Some(
            on_cluster(&cluster, |c| {
                c.wait_stream_leader(KV_STREAM, Duration::from_secs(10))
            })
            .await?
            .map_err(|e| Error::with_source(ErrorKind::Nats, label.clone(), e))?,
        ),
        Victim::Worker => None,
    };
    let producer_urls: Vec<async_nats::ServerAddr> = (0..urls.len())
        .filter(|i| Some(*i) != planned_node)
        .filter_map(|i| urls[i].parse().ok())
        .collect();
    let producer_client = tokio::time::timeout(
        Duration::from_secs(5),
        connect_options().connect(producer_urls),
    )
    .await
    .map_err(|_| {
        Error::new(
            ErrorKind::Nats,
            format!("{label}: the producers cannot connect within 5 s"),
        )
    })?
    .map_err(|e| {
        Error::with_source(
            ErrorKind::Nats,
            format!("{label}: the producers cannot connect"),
            e,
        )
    })?;

    // 3. Producers, progress, CPU.
    let stream_list = streams_of(streams, env.partitions);
    let ids: Vec<String> = stream_list.iter().map(|(id, _)| id.clone()).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let machine0 = machine_busy().unwrap_or_default();
    let self0 = cpu_time(std::process::id()).unwrap_or_default();
    let nats0: Vec<Duration> = (0..NODES)
        .map(|i| cpu_time(cluster.node(i).pid()).unwrap_or_default())
        .collect();
    let start = Instant::now();
    let start_ms = unix_ms();
    let producer = tokio::spawn(produce(
        producer_client,
        stream_list,
        env.fps,
        stop.clone(),
        sent.clone(),
        plan.duration + Duration::from_secs(5),
    ));
    let tty = std::io::stderr().is_terminal();
    let progress = |workers: &[WorkerProc], phase: &str| {
        if env.quiet {
            return;
        }
        let spread = lease_audit::spread_at(&instances(workers), unix_ms());
        let line = format!(
            "[{label}] {:>5.1}/{:.0} s  sent {}  held {:?}  {phase}",
            start.elapsed().as_secs_f64(),
            plan.duration.as_secs_f64(),
            sent.load(Ordering::Relaxed),
            spread
        );
        if tty {
            eprint!("\r{line:<110}");
        } else {
            eprintln!("{line}");
        }
    };

    // 4.–5. The kill and the restart, with a progress line every second.
    let kill_at = start + FAULT_AT;
    let restart_at = kill_at + plan.down;
    let stop_at = start + plan.duration;
    let mut kill_ms = 0;
    let mut restart_ms = 0;
    let mut loadavg_at_kill = None;
    let mut victim_led_kv = None;
    let mut victim_name = String::new();
    let mut killed_node = None;
    let mut nats_cpu_dead = Duration::ZERO;
    let mut restarted_idx = None;
    let mut phase = "";
    let mut next_progress = start + Duration::from_secs(1);
    // Bounded: the loop ends at `stop_at`; each step is bounded.
    while Instant::now() < stop_at {
        let now = Instant::now();
        if kill_ms == 0 && now >= kill_at {
            loadavg_at_kill = loadavg_1m();
            match plan.victim {
                Victim::Worker => {
                    victim_name = "worker w0".into();
                    kill_ms = unix_ms();
                    workers[0].kill().await;
                }
                Victim::Node => {
                    let leader = on_cluster(&cluster, |c| c.stream_leader(KV_STREAM)).await?;
                    let node = planned_node.unwrap_or(0);
                    victim_led_kv = Some(leader == Some(node));
                    if leader != Some(node) {
                        notes.push(format!(
                            "the KV stream's leader moved before the kill (now {:?}); node {} \
                             was killed anyway",
                            leader.map(|l| cluster.name(l).to_owned()),
                            cluster.name(node)
                        ));
                    }
                    victim_name = format!("node {}", cluster.name(node));
                    nats_cpu_dead = cpu_time(cluster.node(node).pid())
                        .unwrap_or_default()
                        .saturating_sub(nats0[node]);
                    kill_ms = unix_ms();
                    on_cluster(&cluster, move |c| c.kill(node))
                        .await?
                        .map_err(|e| {
                            Error::with_source(
                                ErrorKind::Process,
                                format!("{label}: cannot kill node {node}"),
                                e,
                            )
                        })?;
                    killed_node = Some(node);
                }
            }
            phase = "KILLED";
        }
        if kill_ms != 0 && restart_ms == 0 && now >= restart_at {
            restart_ms = unix_ms();
            match plan.victim {
                Victim::Worker => {
                    restarted_idx = Some(workers.len());
                    workers.push(spawn_worker(env, &dir.0, 0, 1, &urls)?);
                }
                Victim::Node => {
                    if let Some(node) = killed_node
                        && let Err(e) = on_cluster(&cluster, move |c| c.restart(node)).await?
                    {
                        notes.push(format!("node {node} did not restart: {e}"));
                    }
                }
            }
            phase = "restarted";
        }
        if now >= next_progress {
            progress(&workers, phase);
            next_progress += Duration::from_secs(1);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let last_seq = match tokio::time::timeout(Duration::from_secs(10), producer).await {
        Ok(Ok(seq)) => seq,
        _ => {
            return Err(Error::new(
                ErrorKind::Run,
                format!("{label}: the producers did not stop within 10 s"),
            ));
        }
    };
    let wall = start.elapsed();
    let end_ms = unix_ms();
    let machine = machine_busy_since(machine0).as_secs_f64();
    let own = cpu_since(std::process::id(), self0).as_secs_f64();
    let workers_cpu: f64 = workers
        .iter()
        .filter_map(WorkerProc::cpu_now)
        .map(|d| d.as_secs_f64())
        .sum();
    let nats_cpu: f64 = (0..NODES)
        .map(|i| {
            if Some(i) == killed_node {
                // Its first life until the kill, plus its restarted process.
                nats_cpu_dead + cpu_time(cluster.node(i).pid()).unwrap_or_default()
            } else {
                cpu_since(cluster.node(i).pid(), nats0[i])
            }
        })
        .map(|d| d.as_secs_f64())
        .sum();
    if !env.quiet && tty {
        eprint!("\r{:<110}\r", "");
    }

    // 6. Drain: the logs stop growing.
    let drain_deadline = Instant::now() + DRAIN_MAX;
    let mut last = u64::MAX;
    let mut stable = 0;
    while Instant::now() < drain_deadline && stable < 3 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let b = frames_bytes(&workers);
        stable = if b == last { stable + 1 } else { 0 };
        last = b;
    }
    if stable < 3 {
        notes.push(format!(
            "the workers' logs still grew {DRAIN_MAX:?} after the producers stopped"
        ));
    }
    for w in &mut workers {
        w.kill().await;
    }
    let inst = instances(&workers);
    let mut auditor = FrameAuditor::default();
    for w in &workers {
        auditor.add(&w.name, &read(&w.frames));
        let err = summarise_stderr(&read(&w.stderr));
        if !err.is_empty() {
            notes.push(format!("{} stderr: {err}", w.name));
        }
    }
    if let Some(keep) = &env.keep_logs {
        match keep_logs(&workers, keep, &label, start_ms, kill_ms, restart_ms) {
            Ok(to) => notes.push(format!("worker logs kept in {}", to.display())),
            Err(e) => notes.push(format!("cannot keep the worker logs: {e}")),
        }
    }
    let last_seqs: BTreeMap<String, u64> = ids.into_iter().map(|id| (id, last_seq)).collect();
    let frames = auditor.audit(&last_seqs);
    let _ = blocking(move || drop(cluster)).await;
    drop(dir);

    let wall_s = wall.as_secs_f64().max(0.001);
    let mut report = FailoverReport {
        victim: victim_name,
        victim_led_kv,
        nodes: NODES,
        workers: env.workers,
        partitions: env.partitions,
        fps: env.fps,
        lease_ttl_ms: env.lease_ttl.as_millis() as u64,
        killed_at_s: kill_ms.saturating_sub(start_ms) as f64 / 1000.0,
        restarted_at_s: restart_ms.saturating_sub(start_ms) as f64 / 1000.0,
        spread_before: lease_audit::spread_at(&inst, kill_ms.saturating_sub(1)),
        spread_before_restart: lease_audit::spread_at(&inst, restart_ms.saturating_sub(1)),
        spread_end: lease_audit::spread_at(&inst, end_ms),
        frames,
        cpu: FailoverCpu {
            machine_cores: machine / wall_s,
            loadtest_cores: own / wall_s,
            workers_cores: workers_cpu / wall_s,
            nats_cores: nats_cpu / wall_s,
            other_cores: ((machine - own - workers_cpu - nats_cpu) / wall_s).max(0.0),
            loadavg_1m_at_kill: loadavg_at_kill,
        },
        ..FailoverReport::default()
    };
    match plan.victim {
        Victim::Worker => {
            report.takeover = Some(lease_audit::takeover(&inst, 0, restarted_idx, kill_ms));
            if let Some(r) = restarted_idx {
                let started = inst[r].started_ms.unwrap_or(restart_ms);
                let share_lo = lo;
                report.rejoin_share_ms = inst[r]
                    .events
                    .iter()
                    .map(|e| e.at_ms)
                    .find(|&t| inst[r].held_at(t).len() >= share_lo)
                    .map(|t| t.saturating_sub(restart_ms) as f64);
                report.rejoin_balanced_ms =
                    lease_audit::first_balanced(&inst, started, end_ms, env.partitions, lo, hi)
                        .map(|t| t.saturating_sub(restart_ms) as f64);
            }
        }
        Victim::Node => {
            report.renewals = Some(lease_audit::renewals(&inst, kill_ms, end_ms));
        }
    }
    if report.cpu.other_cores > 0.25 {
        notes.push(format!(
            "other processes used {:.2} cores on average during this run: the machine was not quiet",
            report.cpu.other_cores
        ));
    }
    if report.frames.double_deliveries > 0 {
        notes.push(format!(
            "{} frames were handed to two workers ({:?}; e.g. {:?}) — machine {:.2} cores busy, \
             load average {:?} at the kill",
            report.frames.double_deliveries,
            report.frames.double_by_instances,
            report.frames.double_examples,
            report.cpu.machine_cores,
            report.cpu.loadavg_1m_at_kill
        ));
    }
    notes.push(
        "no ingress in this scenario: producers publish straight to NATS; the ingress, \
         frames and llm sections are empty, the figures are under failover"
            .into(),
    );
    let run = RunReport {
        scenario: plan.scenario.as_str().to_owned(),
        streams,
        duration_s: plan.duration.as_secs_f64(),
        wall_s,
        fault: Some(FaultReport {
            kind: match plan.victim {
                Victim::Worker => "worker_kill".into(),
                Victim::Node => "node_kill".into(),
            },
            at_s: report.killed_at_s,
            duration_s: plan.down.as_secs_f64(),
        }),
        producers: ProducerReport {
            nominal_frames: streams as u64 * u64::from(env.fps) * plan.duration.as_secs(),
            frames_sent: sent.load(Ordering::Relaxed),
            ..ProducerReport::default()
        },
        llm: crate::llm::not_run(),
        cpu: CpuReport {
            loadtest_s: own,
            nats_server_s: Some(nats_cpu),
            other_s: (machine - own - workers_cpu - nats_cpu).max(0.0),
            wall_s,
            ..CpuReport::default()
        },
        failover: Some(report),
        notes,
        ..RunReport::default()
    };
    Ok(RunOutput {
        report: run,
        samples: Vec::new(),
    })
}

/// Copies every worker log into `<keep>/<scenario>-<streams>-<start_ms>/`, with a
/// `times` file (start, kill, restart in Unix ms).
fn keep_logs(
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
fn summarise_stderr(text: &str) -> String {
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
fn tail(s: &str, n: usize) -> String {
    let mut start = s.len().saturating_sub(n);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    s[start..].trim().replace('\n', " / ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kv_stream_is_the_buckets() {
        assert_eq!(KV_STREAM, format!("KV_{BUCKET}"));
    }

    #[test]
    fn plans_leave_room_for_the_restart() {
        let p = plan(Scenario::WorkerFailover, None, None).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(p.duration, FAULT_AT + DEFAULT_DOWN + AFTER_RESTART);
        assert_eq!(p.victim, Victim::Worker);
        let e = plan(
            Scenario::NodeFailover,
            Some(Duration::from_secs(5)),
            Some(Duration::from_secs(4)),
        )
        .unwrap_err();
        assert_eq!(e.kind(), crate::error::ErrorKind::Usage);
        let e = e.to_string();
        assert!(e.contains("--duration") && e.contains("10"), "{e}");
        assert!(plan(Scenario::Steady, None, None).is_err());
    }

    #[test]
    fn stderr_is_summarised_by_message() {
        let text = "2026-12-02T03:11:00.632700Z  WARN weir_audio_consumer::ownership: lease renewal unknown; retrying partition=37 outcome=\"error\"\n\
                    2026-12-02T03:11:00.632800Z  WARN weir_audio_consumer::ownership: lease renewal unknown; retrying partition=38 outcome=\"error\"\n\
                    2026-12-02T03:11:01.0Z  WARN weir_audio_consumer::demux: aborting them tasks=3\n";
        assert_eq!(
            summarise_stderr(text),
            "2 × WARN weir_audio_consumer::ownership: lease renewal unknown; retrying; \
             1 × WARN weir_audio_consumer::demux: aborting them"
        );
    }

    #[test]
    fn streams_land_on_their_hash_partition() {
        let s = streams_of(3, 64);
        assert_eq!(s.len(), 3);
        let p = fnv1a_32(b"s00001") % 64;
        assert_eq!(s[1].1, format!("weir.audio.{p}.s00001"));
    }
}
