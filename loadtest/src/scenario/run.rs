//! One run: (scenario plan, stream count, design) → a report and its time series.
//!
//! Order of events, each step bounded in time:
//! 1. a fresh nats-server on a free loopback port (unless `--nats-url`);
//! 2. the recognition fleet subscribes (confirmed by the server);
//! 3. the ingress process starts and prints its ready line;
//! 4. the LLM side starts when the scenario drives it;
//! 5. the sampler captures every 100 ms; the producers start; the fault (if any) is
//!    injected at its time and reverted after its length;
//! 6. the producers stop at the run's duration (`end`, or vanish), then a drain phase
//!    waits until the ingress holds nothing, the fleet's count is stable and every
//!    stream the fleet followed has ended or been reaped. A stream whose `end` never
//!    arrives (the producer vanished, or the `end` was lost with a NATS fault) is reaped
//!    by the fleet after its idle timeout, so the drain may wait that long plus
//!    [`REAP_MARGIN`] (at most [`DRAIN_MAX`] plus that wait): such streams are reported
//!    as reaped, not missing;
//! 7. final snapshots, then everything is stopped: the ingress child is killed, the
//!    fleet shut down, the nats-server killed (all also on drop, e.g. on Ctrl-C);
//!    `figures` turns what was measured into the report.
//!
//! [`run_one`] reads as these steps in order; each step is a function of its own.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{Error, ErrorKind, io, nats, process, usage};
use crate::fleet::{Fleet, FleetConfig, FleetSnapshot};
use crate::ingress::{
    Design, IngressProcess, IngressStats, cpu_since, cpu_time_of, machine_busy, machine_busy_since,
};
use crate::llm::{LlmRun, LlmSettings};
use crate::producers::{self, ProducerConfig, ProducerCounters, Transport};
use crate::report::{CpuReport, RunReport};
use crate::sample::{self, Sample};
use crate::scenario::figures::{self, Measured};
use crate::scenario::{FaultKind, Plan};
use crate::timeliness::{DEFAULT_MAX_AGE, late_after};
use weir_protocol::WireName;

mod sampler;
use sampler::{SamplerInputs, sampler};

/// Longest drain after the producers stopped, beyond the wait for the fleet to reap
/// streams that never sent `end` (its idle timeout + [`REAP_MARGIN`]).
pub const DRAIN_MAX: Duration = Duration::from_secs(6);
/// The fleet reaps a stream silent this long without `end` (plus the fault's length
/// in fault scenarios, so that a pause is not mistaken for a vanished producer).
pub const FLEET_IDLE_TIMEOUT: Duration = Duration::from_secs(2);
/// Slack after the fleet's idle timeout before streams that never sent `end` are
/// counted: the consumers' reaper runs periodically, not at the exact deadline.
pub const REAP_MARGIN: Duration = Duration::from_secs(1);
/// Audio subject template used by both designs.
pub const SUBJECT_TEMPLATE: &str = "weir.audio.{partition}.{stream}";

/// The ingress's full-queue policy for the bounded design (`--policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PolicyArg {
    /// End the stream with an overload signal (the default).
    Close,
    /// Drop the oldest frames and send a gap marker.
    Gap,
    /// Measure and count "would reject", enforce only the safety ceiling.
    Shadow,
}

/// Everything a run needs besides its plan.
#[derive(Debug)]
pub struct Env {
    /// An external NATS server (`--nats-url`); `None` starts one per run.
    pub nats_url: Option<String>,
    /// This executable (the naive ingress is its hidden subcommand).
    pub self_exe: PathBuf,
    /// The `audio-ingress` binary, or why it was not found (reported by a bounded run).
    pub ingress_bin: Result<PathBuf, Error>,
    /// Bounded design's policy.
    pub policy: PolicyArg,
    /// Simulated recognition cost per frame.
    pub frame_cost: Duration,
    /// Recognition workers.
    pub fleet_workers: u32,
    /// Partitions of the audio subject.
    pub partitions: u32,
    /// Producers reconnect after the server ended their stream.
    pub reconnect: bool,
    /// No progress line.
    pub quiet: bool,
    /// LLM side settings.
    pub llm: LlmSettings,
    /// Extra `key=value` settings for the bounded ingress (`--ingress-set`).
    pub ingress_set: Vec<String>,
    /// `--naive-floor`: the naive ingress in floor mode (measurement only).
    pub naive_floor: Option<crate::naive::audio::Floor>,
    /// Before each run, wait up to this long for the machine to be quiet (`--wait-quiet`).
    pub wait_quiet: Duration,
    /// How the producers reach the ingress (`--transport`).
    pub transport: Transport,
}

/// Waits (at most `max`) until the whole machine uses less than 0.3 cores, measured
/// over 1 s windows from `/proc/stat`. Returns the last busy figure, in cores.
pub async fn wait_quiet(max: Duration) -> f64 {
    let deadline = Instant::now() + max;
    let mut busy = f64::MAX;
    // Bounded: one iteration per second until the deadline.
    while Instant::now() < deadline {
        let a = machine_busy().unwrap_or_default();
        tokio::time::sleep(Duration::from_secs(1)).await;
        busy = machine_busy_since(a).as_secs_f64();
        if busy < 0.3 {
            break;
        }
    }
    busy
}

/// Before run `label`: waits for a quiet machine when `--wait-quiet` asks for it, and
/// says so (unless quiet) when the machine stayed busy.
pub(crate) async fn settle(env: &Env, label: &str) {
    if !env.wait_quiet.is_zero() {
        let busy = wait_quiet(env.wait_quiet).await;
        if busy >= 0.3 && !env.quiet {
            eprintln!("[{label}] the machine is still busy ({busy:.2} cores): running anyway");
        }
    }
}

/// A report and its series.
#[derive(Debug, Clone)]
pub struct RunOutput {
    /// The report.
    pub report: RunReport,
    /// The 100 ms samples.
    pub samples: Vec<Sample>,
}

/// A run's scratch directory (its config file, a failover run's worker logs), removed
/// on drop (also when the run is interrupted).
pub(crate) struct TempDir(pub(crate) PathBuf);

impl TempDir {
    /// A new directory `<tmp>/<prefix>-<pid>-<n>`.
    pub(crate) fn create(prefix: &str) -> Result<Self, Error> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("{prefix}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| io(&dir, e))?;
        Ok(Self(dir))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The run's NATS server: an embedded one, or `--nats-url`.
pub(crate) struct RunNats {
    pub(crate) url: String,
    pub(crate) server: Option<Arc<weir_testkit::NatsServer>>,
}

impl RunNats {
    pub(crate) async fn start(env: &Env) -> Result<Self, Error> {
        if let Some(url) = &env.nats_url {
            return Ok(Self {
                url: url.clone(),
                server: None,
            });
        }
        let server = blocking(weir_testkit::NatsServer::start)
            .await?
            .map_err(|e| process("cannot start nats-server", e))?;
        Ok(Self {
            url: server.url().to_owned(),
            server: Some(Arc::new(server)),
        })
    }

    fn pid(&self) -> Option<u32> {
        self.server.as_ref().map(|s| s.pid())
    }

    pub(crate) async fn stop(self) {
        if let Some(s) = self.server {
            let _ = blocking(move || drop(s)).await;
        }
    }
}

/// Runs blocking `f` (the testkit's servers) off the runtime's worker threads.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Error> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::with_source(ErrorKind::Run, "blocking task failed", e))
}

/// The ingress of `design` for a run of `streams` streams.
fn ingress_of(env: &Env, design: Design, streams: usize) -> ScenarioIngress {
    let (policy, shadow) = match env.policy {
        PolicyArg::Close => ("close", false),
        PolicyArg::Gap => ("gap", false),
        PolicyArg::Shadow => ("close", true),
    };
    let max_streams = (streams * 2).max(1000) + 100;
    let mut config = format!("policy = \"{policy}\"\nshadow = {shadow}\n");
    if env.transport == Transport::Whip {
        // Loopback only, a free port; the session cap never limits the run.
        config += &format!(
            "whip_udp_listen = \"127.0.0.1:0\"\nwhip_max_sessions = {}\n",
            max_streams.min(100_000)
        );
    }
    match design {
        Design::Bounded => ScenarioIngress::Weir {
            max_streams,
            config,
            sets: &[],
        },
        Design::Naive => ScenarioIngress::Naive {
            floor: env.naive_floor,
        },
    }
}

/// Runs one (plan, streams, design).
pub async fn run_one(
    env: &Env,
    plan: &Plan,
    streams: usize,
    design: Design,
) -> Result<RunOutput, Error> {
    let label = match env.transport {
        Transport::Ws => format!("{} {} {}", plan.scenario.as_str(), streams, design),
        t => format!("{} {} {} {t}", plan.scenario.as_str(), streams, design),
    };
    settle(env, &label).await;
    // 1. NATS.
    let nats = start_nats(env, plan).await?;
    let nats_url = nats.url.clone();

    // 2. Fleet.
    let fleet_idle = FLEET_IDLE_TIMEOUT + plan.fault.map_or(Duration::ZERO, |f| f.length);
    let fleet = Arc::new(start_fleet(env, &nats_url, fleet_idle).await?);

    // 3. Ingress.
    let ingress = ingress_of(env, design, streams);
    let (ingress, config_dir) = spawn_ingress(env, ingress, &nats_url, env.partitions).await?;
    let ingress = Arc::new(ingress);
    let cpu_start = CpuStart::take(&ingress, &nats);

    // 4. LLM side.
    let (llm, llm_unavailable) = start_llm(env, plan, &nats_url, design, streams).await;

    // 5. Sampler, producers, fault.
    let start = Instant::now();
    let counters = Arc::new(ProducerCounters::default());
    let fault_active = Arc::new(AtomicBool::new(false));
    let samples = Arc::new(Mutex::new(Vec::new()));
    let (stop_sampler, stop_rx) = tokio::sync::watch::channel(false);
    let sampler = tokio::spawn(sampler(
        SamplerInputs {
            ingress: ingress.clone(),
            fleet: fleet.clone(),
            counters: counters.clone(),
            llm: llm.clone(),
            fault_active: fault_active.clone(),
            samples: samples.clone(),
            start,
            label: label.clone(),
            total: plan.duration,
            quiet: env.quiet,
        },
        stop_rx,
    ));
    // Connections are spread over up to 1 s so that N streams do not all connect (and
    // tick) in the same millisecond.
    let spread = Duration::from_millis((streams as u64).clamp(20, 1000));
    let producer_set = producers::start(
        producer_config(env, plan, streams, ingress.ws_addr(), spread),
        streams as u64,
        counters.clone(),
    );
    let fault_task = spawn_fault(plan, start, &nats, &fleet, &llm, &fault_active);

    // 6. Wait for the producers (bounded), then drain.
    let producers_deadline =
        start + plan.duration + spread + producers::END_GRACE + Duration::from_secs(5);
    let mut notes = Vec::new();
    await_producers(producer_set, producers_deadline, fault_task, &mut notes).await;
    if let Some(llm) = &llm {
        llm.stop_offering();
    }
    let producers_done = Instant::now();
    // CPU is measured over the sending phase (set-up and drain excluded).
    let cpu = cpu_start.used(&ingress, &nats, producers_done - start);
    // Streams whose `end` never arrives are reaped `fleet_idle` after their last packet,
    // which is at the latest when the producers stopped or the fault ended.
    let fault_end = plan.fault.map_or(start, |f| start + f.at + f.length);
    let reap_wait = producers_done.max(fault_end) + fleet_idle + REAP_MARGIN;
    let drain_deadline = producers_done + DRAIN_MAX + (reap_wait - producers_done);
    if !drain(&ingress, &fleet, llm.as_deref(), drain_deadline, reap_wait).await {
        notes.push(format!(
            "the drain did not settle within {:.0} s; figures are as of its end",
            (drain_deadline - producers_done).as_secs_f64()
        ));
    }

    // 7. Final snapshots.
    let _ = stop_sampler.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(3), sampler).await;
    let final_stats = final_stats(&ingress, &label).await?;
    let wall = start.elapsed();
    let llm_report = llm_report(llm.as_deref(), llm_unavailable, wall, &mut notes);
    let fleet_snapshot = stop_all(llm, fleet, ingress, nats).await;
    drop(config_dir);

    let samples = samples.lock().map(|s| s.clone()).unwrap_or_default();
    let report = figures::report(
        Measured {
            env,
            plan,
            streams,
            design,
            wall,
            series: sample::summarise(&samples),
            final_stats,
            fleet: fleet_snapshot,
            producers: counters.snapshot(),
            llm: llm_report,
            cpu,
        },
        notes,
    );
    Ok(RunOutput { report, samples })
}

/// Step 4: the LLM side, when the scenario drives it; otherwise, or when it cannot
/// start, `None` and (in the second case) why.
async fn start_llm(
    env: &Env,
    plan: &Plan,
    nats_url: &str,
    design: Design,
    streams: usize,
) -> (Option<Arc<LlmRun>>, Option<String>) {
    match plan.llm_factor {
        Some(factor) => match LlmRun::start(nats_url, design, streams, factor, &env.llm).await {
            Ok(l) => (Some(Arc::new(l)), None),
            Err(e) => (None, Some(format!("LLM side not run: {e}"))),
        },
        None => (None, None),
    }
}

/// Step 5: the producers of the plan, `streams` of them on `ws_addr`, their starts
/// spread over `spread`.
fn producer_config(
    env: &Env,
    plan: &Plan,
    streams: usize,
    ws_addr: std::net::SocketAddr,
    spread: Duration,
) -> ProducerConfig {
    ProducerConfig {
        ws_addr,
        duration: plan.duration,
        vanish_share: plan.vanish_share,
        reconnect: env.reconnect,
        reconnect_delay: Duration::from_millis(500),
        start_spread: spread,
        transport: env.transport,
        ids: Arc::new((0..streams).map(|i| format!("s{i}")).collect()),
    }
}

/// Step 7: the LLM side's report over `wall` (a "not run" one without it); why it
/// could not start, if so, goes to `notes`.
fn llm_report(
    llm: Option<&LlmRun>,
    unavailable: Option<String>,
    wall: Duration,
    notes: &mut Vec<String>,
) -> crate::report::LlmReport {
    let report = match (llm, &unavailable) {
        (Some(l), _) => l.report(wall),
        (None, Some(why)) => crate::llm::not_run_because(why),
        (None, None) => crate::llm::not_run(),
    };
    if let Some(why) = unavailable {
        notes.push(why);
    }
    report
}

/// Step 1: the run's NATS server, embedded unless `--nats-url` names one.
async fn start_nats(env: &Env, plan: &Plan) -> Result<RunNats, Error> {
    if env.nats_url.is_some()
        && let Some(f) = plan.fault
        && f.kind.needs_embedded_server()
    {
        return Err(usage(format!(
            "{} needs to stop and restart nats-server, which is only possible with the \
             server the load test starts itself: drop --nats-url",
            plan.scenario.as_str()
        )));
    }
    RunNats::start(env).await
}

/// Step 2: the recognition fleet, subscribed; `idle` is its stream idle timeout.
async fn start_fleet(env: &Env, nats_url: &str, idle: Duration) -> Result<Fleet, Error> {
    let max_age = ingress_max_age(&env.ingress_set);
    Fleet::start(
        nats_url,
        &FleetConfig {
            partitions: env.partitions,
            workers: env.fleet_workers,
            cost_per_frame: env.frame_cost,
            idle_timeout: idle,
            max_pending_bytes: 16_000,
            max_pending_age: Duration::from_millis(500),
            late_after: late_after(max_age),
            asr: None,
        },
    )
    .await
    .map_err(|e| nats("cannot start the recognition fleet", e))
}

/// The fault task of step 5: injects the plan's fault at its time and reverts it after
/// its length, flagging `fault_active` in between.
fn spawn_fault(
    plan: &Plan,
    start: Instant,
    nats: &RunNats,
    fleet: &Arc<Fleet>,
    llm: &Option<Arc<LlmRun>>,
    fault_active: &Arc<AtomicBool>,
) -> Option<tokio::task::JoinHandle<Result<(), Error>>> {
    plan.fault.map(|f| {
        let fleet = fleet.clone();
        let llm = llm.clone();
        let server = nats.server.clone();
        let fault_active = fault_active.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(start + f.at).await;
            fault_active.store(true, Ordering::Relaxed);
            let r = apply_fault(f.kind, true, server.clone(), &fleet, llm.as_deref()).await;
            tokio::time::sleep_until(start + f.at + f.length).await;
            let r2 = apply_fault(f.kind, false, server, &fleet, llm.as_deref()).await;
            fault_active.store(false, Ordering::Relaxed);
            r.and(r2)
        })
    })
}

/// Step 6, first half: waits for the producers until `deadline` (aborting the late
/// ones), then for the fault task (15 s); what went wrong goes to `notes`.
async fn await_producers(
    mut producer_set: tokio::task::JoinSet<()>,
    deadline: Instant,
    fault_task: Option<tokio::task::JoinHandle<Result<(), Error>>>,
    notes: &mut Vec<String>,
) {
    while let Ok(Some(_)) = tokio::time::timeout_at(deadline, producer_set.join_next()).await {}
    let producers_late = !producer_set.is_empty();
    producer_set.abort_all();
    if producers_late {
        notes.push(
            "some producers had not finished 5 s after their grace period and were aborted".into(),
        );
    }
    if let Some(t) = fault_task {
        match tokio::time::timeout(Duration::from_secs(15), t).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => notes.push(format!("fault injection failed: {e}")),
            Ok(Err(e)) => notes.push(format!("fault task failed: {e}")),
            Err(_) => notes.push("fault task did not finish in 15 s".into()),
        }
    }
}

/// Step 6, second half: polls until the ingress holds nothing, the fleet's count is
/// stable, the LLM side is idle and every stream ended or was reaped (or `reap_wait`
/// passed); gives up at `deadline`. Returns whether it settled.
async fn drain(
    ingress: &IngressProcess,
    fleet: &Fleet,
    llm: Option<&LlmRun>,
    deadline: Instant,
    reap_wait: Instant,
) -> bool {
    super::until_stable(deadline, Duration::from_millis(100), 3, async || {
        let pending = ingress.stats().await.map_or(u64::MAX, |s| s.pending_frames);
        // Every stream ended or reaped, or the reaper had its chance.
        let streams_settled = fleet.streams_active() == 0 || Instant::now() >= reap_wait;
        let idle = pending == 0 && llm.is_none_or(|l| l.idle()) && streams_settled;
        (fleet.frames_received(), idle)
    })
    .await
}

/// Step 7, the end: stops the LLM side, the fleet, the ingress and the embedded
/// nats-server; returns the fleet's final snapshot.
async fn stop_all(
    llm: Option<Arc<LlmRun>>,
    fleet: Arc<Fleet>,
    ingress: Arc<IngressProcess>,
    nats: RunNats,
) -> FleetSnapshot {
    if let Some(Ok(l)) = llm.map(Arc::try_unwrap) {
        l.stop().await;
    }
    let fleet_snapshot = match Arc::try_unwrap(fleet) {
        Ok(f) => f.stop().await,
        Err(f) => f.snapshot(),
    };
    if let Ok(p) = Arc::try_unwrap(ingress) {
        p.stop().await;
    }
    nats.stop().await;
    fleet_snapshot
}

/// Step 7: the ingress's last `/v1/stats` (3 tries, 200 ms apart).
async fn final_stats(ingress: &IngressProcess, label: &str) -> Result<IngressStats, Error> {
    for _ in 0..3 {
        match ingress.stats().await {
            Ok(s) => return Ok(s),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    Err(Error::new(
        ErrorKind::Process,
        format!(
            "[{label}] the ingress did not answer /v1/stats at the end; its stderr:\n{}",
            ingress.stderr_tail()
        ),
    ))
}

/// CPU counters at the start of the sending phase.
pub(crate) struct CpuStart {
    ingress: Duration,
    loadtest: Duration,
    machine: Duration,
    nats: Option<Duration>,
}

impl CpuStart {
    pub(crate) fn take(ingress: &IngressProcess, nats: &RunNats) -> Self {
        Self {
            ingress: ingress.cpu_time().unwrap_or_default(),
            loadtest: cpu_time_of(None).unwrap_or_default(),
            machine: machine_busy().unwrap_or_default(),
            nats: nats.pid().and_then(|p| cpu_time_of(Some(p))),
        }
    }

    /// The CPU each process used since `self`, over `wall`; the rest of the machine's
    /// busy time is `other_s`.
    pub(crate) fn used(
        &self,
        ingress: &IngressProcess,
        nats: &RunNats,
        wall: Duration,
    ) -> CpuReport {
        let ingress_s = (ingress.cpu_time().unwrap_or_default())
            .saturating_sub(self.ingress)
            .as_secs_f64();
        let loadtest_s = cpu_since(std::process::id(), self.loadtest).as_secs_f64();
        // After a restart the server is a new process: its CPU is counted from its start.
        let nats_end = nats.pid().and_then(|p| cpu_time_of(Some(p)));
        let nats_server_s = nats_end.map(|end| match self.nats {
            Some(s) if end >= s => (end - s).as_secs_f64(),
            _ => end.as_secs_f64(),
        });
        let machine = machine_busy_since(self.machine).as_secs_f64();
        CpuReport {
            ingress_s,
            loadtest_s,
            nats_server_s,
            other_s: (machine - ingress_s - loadtest_s - nats_server_s.unwrap_or(0.0)).max(0.0),
            wall_s: wall.as_secs_f64(),
        }
    }
}

/// The bounded ingress's `max_age` for this run: the last `max_age_ms=N` of
/// `--ingress-set`, else the ingress's default. The naive design has no budget; its
/// frames are measured against the same one, for comparison.
fn ingress_max_age(ingress_set: &[String]) -> Duration {
    ingress_set
        .iter()
        .rev()
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| k.trim() == "max_age_ms")
        .and_then(|(_, v)| v.trim().parse::<u64>().ok())
        .map_or(DEFAULT_MAX_AGE, Duration::from_millis)
}

async fn apply_fault(
    kind: FaultKind,
    start: bool,
    server: Option<Arc<weir_testkit::NatsServer>>,
    fleet: &Fleet,
    llm: Option<&LlmRun>,
) -> Result<(), Error> {
    match kind {
        FaultKind::NatsPause | FaultKind::NatsRestart => {
            let server = server.ok_or_else(|| {
                Error::new(ErrorKind::Process, "no embedded nats-server to act on")
            })?;
            blocking(move || match (kind, start) {
                (FaultKind::NatsPause, true) => server.pause(),
                (FaultKind::NatsPause, false) => server.resume(),
                (_, true) => server.kill(),
                (_, false) => server.restart(),
            })
            .await?
            .map_err(|e| e.map_kind(ErrorKind::Process))
        }
        FaultKind::BackendStall => {
            if let Some(llm) = llm {
                llm.stall_backend(0, start);
            }
            Ok(())
        }
        FaultKind::BackendPause => {
            if start {
                fleet.pause();
            } else {
                fleet.resume();
            }
            if let Some(llm) = llm {
                llm.pause_backend(start);
            }
            Ok(())
        }
    }
}

/// The ingress of a scenario that runs designs side by side: the naive design
/// (`loadtest naive-ingress`), or weir's `audio-ingress serve` with a config file written
/// for the run.
pub(crate) enum ScenarioIngress {
    /// The naive design (`floor`: `--naive-floor`).
    Naive {
        floor: Option<crate::naive::audio::Floor>,
    },
    /// weir: `config` adds lines to the config file; `sets` come before the user's
    /// `--ingress-set`s.
    Weir {
        max_streams: usize,
        config: String,
        sets: &'static [&'static str],
    },
}

/// Starts `ingress` on `nats_url` with free loopback ports: the subject template and
/// `partitions` of the scenarios, extended consumers. Its config file lives in the
/// returned directory.
pub(crate) async fn spawn_ingress(
    env: &Env,
    ingress: ScenarioIngress,
    nats_url: &str,
    partitions: u32,
) -> Result<(IngressProcess, TempDir), Error> {
    let dir = TempDir::create("weir-loadtest")?;
    let (program, mut args) = match ingress {
        ScenarioIngress::Naive { floor } => {
            let partitions = partitions.to_string();
            let floor = floor.and_then(|f| clap::ValueEnum::to_possible_value(&f));
            let mut args = vec!["naive-ingress", "--subject", SUBJECT_TEMPLATE];
            args.extend(["--partitions", &partitions]);
            if let Some(v) = &floor {
                args.extend(["--floor", v.get_name()]);
            }
            (
                env.self_exe.clone(),
                args.into_iter().map(String::from).collect(),
            )
        }
        ScenarioIngress::Weir {
            max_streams,
            config,
            sets,
        } => {
            let program = env
                .ingress_bin
                .as_ref()
                .map_err(|e| Error::new(e.kind(), e.to_string()))?
                .clone();
            let path = dir.0.join("audio-ingress.toml");
            let config = format!(
                "# written by weir-loadtest for one run\n\
                 subject = \"{SUBJECT_TEMPLATE}\"\n\
                 partitions = {partitions}\n\
                 extended_consumers = true\n\
                 max_streams = {max_streams}\n{config}"
            );
            std::fs::write(&path, config).map_err(|e| io(&path, e))?;
            let mut args = vec![
                "serve".into(),
                "--config".into(),
                path.display().to_string(),
            ];
            for kv in sets
                .iter()
                .copied()
                .chain(env.ingress_set.iter().map(String::as_str))
            {
                args.extend(["--set".to_owned(), kv.to_owned()]);
            }
            (program, args)
        }
    };
    let common = [
        "--nats-url",
        nats_url,
        "--listen",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
    ];
    args.extend(common.map(String::from));
    let ingress = IngressProcess::spawn(&program, &args).await?;
    Ok((ingress, dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_age_comes_from_ingress_set_or_the_default() {
        assert_eq!(ingress_max_age(&[]), DEFAULT_MAX_AGE);
        let set = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            ingress_max_age(&set(&["max_bytes=8000", "max_age_ms=300"])),
            Duration::from_millis(300)
        );
        assert_eq!(
            ingress_max_age(&set(&["max_age_ms=300", "max_age_ms = 250"])),
            Duration::from_millis(250),
            "the last one wins, as on the command line"
        );
        assert_eq!(ingress_max_age(&set(&["max_age_ms=soon"])), DEFAULT_MAX_AGE);
    }
}
