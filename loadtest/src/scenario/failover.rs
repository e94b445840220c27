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
//!
//! [`run`] reads as these steps in order, each a function of its own; `workers` holds
//! the worker processes and their logs, `figures` turns what was measured into the
//! report.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;
use weir_protocol::WireName;
use weir_protocol::audio::Packet;
use weir_protocol::fnv1a_32;
use weir_testkit::NatsCluster;

mod figures;
mod workers;

use figures::{Measured, PhaseCpu, run_report};
use workers::{
    WorkerProc, drain_logs, instances, keep_logs, read, spawn_worker, summarise_stderr, tail,
};

use crate::counters::Count;
use crate::error::{Error, ErrorKind, nats, process, usage};
use crate::ingress::{cpu_time_of, machine_busy};
use crate::lease_audit::{self, FrameAudit, FrameAuditor, Instance};
use crate::lease_worker::connect_options;
use crate::scenario::Scenario;
use crate::scenario::run::{RunOutput, SUBJECT_TEMPLATE, TempDir, blocking};
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

/// The producers' streams: (id, subject).
fn streams_of(n: usize, partitions: u32) -> Vec<(String, String)> {
    (0..n)
        .map(|i| {
            let id = format!("s{i:05}");
            let p = fnv1a_32(id.as_bytes()) % partitions;
            let subject = SUBJECT_TEMPLATE
                .replace("{partition}", &p.to_string())
                .replace("{stream}", &id);
            (id, subject)
        })
        .collect()
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
    // 20 ms of 16 kHz PCM; its content does not matter to the audit.
    let pcm = Bytes::from(vec![0u8; 640]);
    // Bounded by `max`.
    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
        tick.tick().await;
        seq += 1;
        let Ok(payload) = Packet::frame(seq, pcm.clone()).encode() else {
            break;
        };
        publish_all(&client, &streams, &payload).await;
        sent.add(streams.len() as u64);
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

/// Runs one failover scenario with `streams` streams.
pub async fn run(
    env: &FailoverEnv,
    plan: &FailoverPlan,
    streams: usize,
) -> Result<RunOutput, Error> {
    let label = format!("{} {streams}", plan.scenario.as_str());
    check_workers(env, &label)?;
    let mut notes = Vec::new();
    // 1. The cluster.
    let cluster = start_cluster().await?;
    let urls = cluster.urls();
    let dir = TempDir::create("weir-failover")?;

    // 2. The workers, and the initial spread.
    let (mut workers, share) = start_workers(env, &dir.0, &urls, &label).await?;
    let planned_node = planned_node(plan, &cluster, &label).await?;
    let producer_client = connect_producers(&urls, planned_node, &label).await?;

    // 3. Producers, progress, CPU.
    let stream_list = streams_of(streams, env.partitions);
    let ids: Vec<String> = stream_list.iter().map(|(id, _)| id.clone()).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let machine0 = machine_busy().unwrap_or_default();
    let self0 = cpu_time_of(None).unwrap_or_default();
    let nats0: Vec<Duration> = (0..NODES)
        .map(|i| cpu_time_of(Some(cluster.node(i).pid())).unwrap_or_default())
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

    // 4.–5. The kill and the restart, with a progress line every second.
    let phase = Phase {
        env,
        plan,
        cluster: &cluster,
        dir: &dir.0,
        urls: &urls,
        planned_node,
        nats0: &nats0,
        start,
        label: &label,
        sent: &sent,
    };
    let fault = kill_and_restart(&phase, &mut workers, &mut notes).await?;
    stop.store(true, Ordering::Relaxed);
    let Ok(Ok(last_seq)) = tokio::time::timeout(Duration::from_secs(10), producer).await else {
        return Err(Error::new(
            ErrorKind::Run,
            format!("{label}: the producers did not stop within 10 s"),
        ));
    };
    let wall = start.elapsed();
    let end_ms = unix_ms();
    let cpu = PhaseCpu::measure(machine0, self0, &workers, &phase, &fault);
    crate::scenario::clear_progress(env.quiet);

    // 6. Drain, then the audit.
    let (inst, frames) = audit(
        &phase,
        &mut workers,
        ids,
        last_seq,
        start_ms,
        &fault,
        &mut notes,
    )
    .await;
    let _ = blocking(move || drop(cluster)).await;
    drop(dir);

    let measured = Measured {
        inst,
        fault,
        frames,
        cpu,
        wall_s: wall.as_secs_f64().max(0.001),
        start_ms,
        end_ms,
        share,
        sent: sent.load(Ordering::Relaxed),
    };
    Ok(RunOutput {
        report: run_report(env, plan, streams, measured, notes),
        samples: Vec::new(),
    })
}

/// Refuses worker counts the scenario cannot run: fewer than 2 (one is killed), or
/// more than the partitions.
fn check_workers(env: &FailoverEnv, label: &str) -> Result<(), Error> {
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
    Ok(())
}

/// Step 1: the cluster of [`NODES`] nats-servers.
async fn start_cluster() -> Result<Arc<NatsCluster>, Error> {
    Ok(Arc::new(
        blocking(|| NatsCluster::start(NODES)).await?.map_err(|e| {
            process(
                format!("cannot start a {NODES}-node nats-server cluster"),
                e,
            )
        })?,
    ))
}

/// Step 2: the workers, once they hold the initial spread (each within the returned
/// share bounds of the partitions) and their leases have settled.
async fn start_workers(
    env: &FailoverEnv,
    dir: &Path,
    urls: &[String],
    label: &str,
) -> Result<(Vec<WorkerProc>, (usize, usize)), Error> {
    let mut workers = Vec::new();
    for w in 0..env.workers as usize {
        workers.push(spawn_worker(env, dir, w, 0, urls)?);
    }
    let share = lease_audit::share_bounds(env.partitions, env.workers as usize);
    wait_for_spread(env, &workers, share, label).await?;
    // A lease delivers a settle time (250 ms, then the next planning tick) after it is
    // held (docs/scale-out.md): frames published before a partition's first owner
    // reads are lost without a gap (a late join, not a handover).
    tokio::time::sleep(Duration::from_secs(1)).await;
    Ok((workers, share))
}

/// The node to kill (node-failover) is the bucket's leader; the producers connect to
/// the other nodes, so that the run measures the leases, not a producer's reconnect
/// (the failover drill measures that). `None` when a worker is the victim.
async fn planned_node(
    plan: &FailoverPlan,
    cluster: &Arc<NatsCluster>,
    label: &str,
) -> Result<Option<usize>, Error> {
    Ok(match plan.victim {
        Victim::Node => Some(
            on_cluster(cluster, |c| {
                c.wait_stream_leader(KV_STREAM, Duration::from_secs(10))
            })
            .await?
            .map_err(|e| nats(label.to_owned(), e))?,
        ),
        Victim::Worker => None,
    })
}

/// Step 6: waits for the workers' logs to stop growing, kills the workers, then audits
/// every frame of `ids` up to `last_seq` and reads each worker's lease history; keeps
/// the logs when asked. What is unusual goes to `notes`.
async fn audit(
    p: &Phase<'_>,
    workers: &mut [WorkerProc],
    ids: Vec<String>,
    last_seq: u64,
    start_ms: u64,
    f: &FaultLog,
    notes: &mut Vec<String>,
) -> (Vec<Instance>, FrameAudit) {
    if !drain_logs(workers).await {
        notes.push(format!(
            "the workers' logs still grew {DRAIN_MAX:?} after the producers stopped"
        ));
    }
    for w in workers.iter_mut() {
        w.kill().await;
    }
    let inst = instances(workers);
    let mut auditor = FrameAuditor::default();
    for w in workers.iter() {
        auditor.add(&w.name, &read(&w.frames));
        let err = summarise_stderr(&read(&w.stderr));
        if !err.is_empty() {
            notes.push(format!("{} stderr: {err}", w.name));
        }
    }
    if let Some(keep) = &p.env.keep_logs {
        match keep_logs(workers, keep, p.label, start_ms, f.kill_ms, f.restart_ms) {
            Ok(to) => notes.push(format!("worker logs kept in {}", to.display())),
            Err(e) => notes.push(format!("cannot keep the worker logs: {e}")),
        }
    }
    let last_seqs: BTreeMap<String, u64> = ids.into_iter().map(|id| (id, last_seq)).collect();
    (inst, auditor.audit(&last_seqs))
}

/// Step 2: waits until the live workers hold every partition between `share.0` and
/// `share.1` each; refused (with the workers' stderr) after [`SPREAD_WAIT`].
async fn wait_for_spread(
    env: &FailoverEnv,
    workers: &[WorkerProc],
    (lo, hi): (usize, usize),
    label: &str,
) -> Result<(), Error> {
    let spread_deadline = Instant::now() + SPREAD_WAIT;
    loop {
        let now = unix_ms();
        let inst = instances(workers);
        if lease_audit::balanced_at(&inst, now, env.partitions, lo, hi)
            && inst.iter().all(|i| i.alive_at(now))
        {
            return Ok(());
        }
        if Instant::now() >= spread_deadline {
            let tails: Vec<String> = workers
                .iter()
                .map(|w| format!("{}: {}", w.name, tail(&read(&w.stderr), 400)))
                .collect();
            return Err(Error::new(
                ErrorKind::Run,
                format!(
                    "{label}: the workers did not share the {} partitions ({lo}..={hi} each) \
                     within {SPREAD_WAIT:?}: {:?}; stderr: {}",
                    env.partitions,
                    lease_audit::spread_at(&inst, now),
                    tails.join(" | ")
                ),
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The producers' connection, to every node but `skip` (the node to be killed).
async fn connect_producers(
    urls: &[String],
    skip: Option<usize>,
    label: &str,
) -> Result<async_nats::Client, Error> {
    let producer_urls: Vec<async_nats::ServerAddr> = (0..urls.len())
        .filter(|i| Some(*i) != skip)
        .filter_map(|i| urls[i].parse().ok())
        .collect();
    tokio::time::timeout(
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
    .map_err(|e| nats(format!("{label}: the producers cannot connect"), e))
}

/// What the kill-and-restart phase works on.
struct Phase<'a> {
    env: &'a FailoverEnv,
    plan: &'a FailoverPlan,
    cluster: &'a Arc<NatsCluster>,
    /// The workers' log directory.
    dir: &'a Path,
    urls: &'a [String],
    /// The node to kill (node-failover).
    planned_node: Option<usize>,
    /// Each node's CPU time at the start.
    nats0: &'a [Duration],
    start: Instant,
    /// The run's label, for messages.
    label: &'a str,
    /// Frames sent so far.
    sent: &'a AtomicU64,
}

impl Phase<'_> {
    /// The progress line: time, frames sent, partitions held per live worker, `phase`.
    fn progress(&self, workers: &[WorkerProc], phase: &str) {
        if self.env.quiet {
            return;
        }
        let spread = lease_audit::spread_at(&instances(workers), unix_ms());
        let line = format!(
            "[{}] {:>5.1}/{:.0} s  sent {}  held {:?}  {phase}",
            self.label,
            self.start.elapsed().as_secs_f64(),
            self.plan.duration.as_secs_f64(),
            self.sent.load(Ordering::Relaxed),
            spread
        );
        crate::scenario::progress(&line);
    }
}

/// What the kill and the restart did.
#[derive(Debug, Default)]
struct FaultLog {
    kill_ms: u64,
    restart_ms: u64,
    loadavg_at_kill: Option<f64>,
    /// Whether the killed node led the KV stream (node-failover).
    victim_led_kv: Option<bool>,
    victim_name: String,
    killed_node: Option<usize>,
    /// CPU the killed node used in its first life.
    nats_cpu_dead: Duration,
    /// Index in the workers of the restarted worker (worker-failover).
    restarted_idx: Option<usize>,
}

/// Steps 4–5: kills the victim at [`FAULT_AT`], restarts it after the plan's `down`,
/// and prints a progress line every second, until the plan's duration is over.
async fn kill_and_restart(
    p: &Phase<'_>,
    workers: &mut Vec<WorkerProc>,
    notes: &mut Vec<String>,
) -> Result<FaultLog, Error> {
    let kill_at = p.start + FAULT_AT;
    let restart_at = kill_at + p.plan.down;
    let stop_at = p.start + p.plan.duration;
    let mut f = FaultLog::default();
    let mut phase = "";
    let mut next_progress = p.start + Duration::from_secs(1);
    // Bounded: the loop ends at `stop_at`; each step is bounded.
    while Instant::now() < stop_at {
        let now = Instant::now();
        if f.kill_ms == 0 && now >= kill_at {
            f.loadavg_at_kill = weir_service::process::load_average_1m();
            match p.plan.victim {
                Victim::Worker => {
                    f.victim_name = "worker w0".into();
                    f.kill_ms = unix_ms();
                    workers[0].kill().await;
                }
                Victim::Node => kill_node(p, &mut f, notes).await?,
            }
            phase = "KILLED";
        }
        if f.kill_ms != 0 && f.restart_ms == 0 && now >= restart_at {
            f.restart_ms = unix_ms();
            match p.plan.victim {
                Victim::Worker => {
                    f.restarted_idx = Some(workers.len());
                    workers.push(spawn_worker(p.env, p.dir, 0, 1, p.urls)?);
                }
                Victim::Node => {
                    if let Some(node) = f.killed_node
                        && let Err(e) =
                            on_cluster(p.cluster, move |c| c.node(node).restart()).await?
                    {
                        notes.push(format!("node {node} did not restart: {e}"));
                    }
                }
            }
            phase = "restarted";
        }
        if now >= next_progress {
            p.progress(workers, phase);
            next_progress += Duration::from_secs(1);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(f)
}

/// Kills the planned node (the KV stream's leader when planned), noting if the leader
/// moved in between.
async fn kill_node(p: &Phase<'_>, f: &mut FaultLog, notes: &mut Vec<String>) -> Result<(), Error> {
    let label = p.label;
    let cluster = p.cluster;
    let leader = on_cluster(cluster, |c| c.stream_leader(KV_STREAM)).await?;
    let node = p.planned_node.unwrap_or(0);
    f.victim_led_kv = Some(leader == Some(node));
    if leader != Some(node) {
        notes.push(format!(
            "the KV stream's leader moved before the kill (now {:?}); node {} \
             was killed anyway",
            leader.map(|l| cluster.name(l).to_owned()),
            cluster.name(node)
        ));
    }
    f.victim_name = format!("node {}", cluster.name(node));
    f.nats_cpu_dead = cpu_time_of(Some(cluster.node(node).pid()))
        .unwrap_or_default()
        .saturating_sub(p.nats0[node]);
    f.kill_ms = unix_ms();
    on_cluster(cluster, move |c| c.node(node).kill())
        .await?
        .map_err(|e| process(format!("{label}: cannot kill node {node}"), e))?;
    f.killed_node = Some(node);
    Ok(())
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
