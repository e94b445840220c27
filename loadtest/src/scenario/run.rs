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
//!    fleet shut down, the nats-server killed (all also on drop, e.g. on Ctrl-C).

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::accounting::{FrameAccounting, FrameCounts};
use crate::error::{Error, ErrorKind, io, usage};
use crate::fleet::{DEFAULT_MAX_FRAME_AGE, Fleet, FleetConfig};
use crate::ingress::{
    Design, IngressProcess, Launch, cpu_since, cpu_time, machine_busy, machine_busy_since,
};
use crate::llm::{LlmRun, LlmSettings};
use crate::producers::{self, ProducerConfig, ProducerCounters, Transport};
use crate::report::{
    ConsumerReport, CpuReport, FaultReport, IngressReport, ProducerReport, RunReport,
};
use crate::sample::{self, IngressSample, Sample};
use crate::scenario::{FaultKind, Plan};
use crate::timeliness::{DEFAULT_MAX_AGE, late_after};
use weir_protocol::WireName;

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

/// The NATS server of a run.
enum Nats {
    Embedded(Arc<weir_testkit::NatsServer>),
    External(String),
}

impl Nats {
    fn url(&self) -> String {
        match self {
            Self::Embedded(s) => s.url().to_owned(),
            Self::External(u) => u.clone(),
        }
    }

    fn pid(&self) -> Option<u32> {
        match self {
            Self::Embedded(s) => Some(s.pid()),
            Self::External(_) => None,
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

/// Writes the bounded ingress's config file for this run.
fn bounded_config(env: &Env, streams: usize) -> String {
    let (policy, shadow) = match env.policy {
        PolicyArg::Close => ("close", false),
        PolicyArg::Gap => ("gap", false),
        PolicyArg::Shadow => ("close", true),
    };
    let max_streams = (streams * 2).max(1000) + 100;
    let whip = match env.transport {
        Transport::Ws => String::new(),
        // Loopback only, a free port; the session cap never limits the run.
        Transport::Whip => format!(
            "whip_udp_listen = \"127.0.0.1:0\"\nwhip_max_sessions = {}\n",
            max_streams.min(100_000)
        ),
    };
    format!(
        "# written by weir-loadtest for one run\n\
         subject = \"{SUBJECT_TEMPLATE}\"\n\
         partitions = {}\n\
         policy = \"{policy}\"\n\
         shadow = {shadow}\n\
         extended_consumers = true\n\
         max_streams = {max_streams}\n{whip}",
        env.partitions
    )
}

fn launch(
    env: &Env,
    design: Design,
    nats_url: &str,
    streams: usize,
    config_dir: &std::path::Path,
) -> Result<Launch, Error> {
    let (program, mut args) = match design {
        Design::Bounded => {
            let program = env
                .ingress_bin
                .as_ref()
                .map_err(|e| Error::new(e.kind(), e.to_string()))?
                .clone();
            let path = config_dir.join("audio-ingress.toml");
            std::fs::write(&path, bounded_config(env, streams)).map_err(|e| {
                Error::with_source(ErrorKind::Io, format!("cannot write {}", path.display()), e)
            })?;
            let config = path.display().to_string();
            let mut args: Vec<String> = ["serve", "--config", &config].map(String::from).to_vec();
            for kv in &env.ingress_set {
                args.extend(["--set".to_owned(), kv.clone()]);
            }
            (program, args)
        }
        Design::Naive => {
            let partitions = env.partitions.to_string();
            let mut args = [
                "naive-ingress",
                "--subject",
                SUBJECT_TEMPLATE,
                "--partitions",
                &partitions,
            ]
            .map(String::from)
            .to_vec();
            if let Some(floor) = env.naive_floor {
                let value = clap::ValueEnum::to_possible_value(&floor)
                    .map(|v| v.get_name().to_owned())
                    .unwrap_or_default();
                args.extend(["--floor".to_owned(), value]);
            }
            (env.self_exe.clone(), args)
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
    Ok(Launch {
        program,
        args,
        env: vec![("RUST_LOG".to_owned(), "warn".to_owned())],
    })
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
        Transport::Whip => format!("{} {} {} whip", plan.scenario.as_str(), streams, design),
    };
    if !env.wait_quiet.is_zero() {
        let busy = wait_quiet(env.wait_quiet).await;
        if busy >= 0.3 && !env.quiet {
            eprintln!("[{label}] the machine is still busy ({busy:.2} cores): running anyway");
        }
    }
    // 1. NATS.
    let nats = match &env.nats_url {
        Some(url) => {
            if let Some(f) = plan.fault
                && f.kind.needs_embedded_server()
            {
                return Err(usage(format!(
                    "{} needs to stop and restart nats-server, which is only possible with the \
                     server the load test starts itself: drop --nats-url",
                    plan.scenario.as_str()
                )));
            }
            Nats::External(url.clone())
        }
        None => Nats::Embedded(Arc::new(
            blocking(weir_testkit::NatsServer::start)
                .await?
                .map_err(|e| {
                    Error::with_source(ErrorKind::Process, "cannot start nats-server", e)
                })?,
        )),
    };
    let nats_url = nats.url();

    // 2. Fleet.
    let fleet_idle = FLEET_IDLE_TIMEOUT + plan.fault.map_or(Duration::ZERO, |f| f.length);
    let max_age = ingress_max_age(&env.ingress_set);
    let fleet = Arc::new(
        Fleet::start(
            &nats_url,
            &FleetConfig {
                template: SUBJECT_TEMPLATE.to_owned(),
                partitions: env.partitions,
                workers: env.fleet_workers,
                cost_per_frame: env.frame_cost,
                idle_timeout: fleet_idle,
                subscription_capacity: 65_536,
                max_pending_bytes: 16_000,
                max_pending_age: Duration::from_millis(500),
                late_after: late_after(max_age),
                // The consumer core's staleness guard at the product default (1 s).
                max_frame_age: Some(DEFAULT_MAX_FRAME_AGE),
            },
        )
        .await
        .map_err(|e| {
            Error::with_source(ErrorKind::Nats, "cannot start the recognition fleet", e)
        })?,
    );

    // 3. Ingress.
    let config_dir = TempDir::create("weir-loadtest")?;
    let ingress = Arc::new(
        IngressProcess::spawn(&launch(env, design, &nats_url, streams, &config_dir.0)?)
            .await
            .map_err(Error::from)?,
    );
    let cpu_start = ingress.cpu_time().unwrap_or_default();
    let self_cpu_start = cpu_time(std::process::id()).unwrap_or_default();
    let machine_start = machine_busy().unwrap_or_default();
    let nats_cpu_start = nats.pid().and_then(cpu_time);

    // 4. LLM side.
    let mut llm_unavailable = None;
    let llm = match plan.llm {
        Some(load) => {
            match LlmRun::start(&nats_url, design, streams, load.factor, &env.llm).await {
                Ok(l) => Some(Arc::new(l)),
                Err(e) => {
                    llm_unavailable = Some(format!("LLM side not run: {e}"));
                    None
                }
            }
        }
        None => None,
    };

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
    let mut producer_set = producers::start(
        ProducerConfig {
            ws_addr: ingress.ws_addr(),
            streams,
            id_prefix: "s".into(),
            duration: plan.duration,
            vanish_share: plan.vanish_share,
            reconnect: env.reconnect,
            reconnect_delay: Duration::from_millis(500),
            start_spread: spread,
            transport: env.transport,
        },
        streams as u64,
        counters.clone(),
    );
    let fault_task = plan.fault.map(|f| {
        let fleet = fleet.clone();
        let llm = llm.clone();
        let server = match &nats {
            Nats::Embedded(s) => Some(s.clone()),
            Nats::External(_) => None,
        };
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
    });

    // 6. Wait for the producers (bounded), then drain.
    let producers_deadline =
        start + plan.duration + spread + producers::END_GRACE + Duration::from_secs(5);
    while let Ok(Some(_)) =
        tokio::time::timeout_at(producers_deadline, producer_set.join_next()).await
    {}
    let producers_late = !producer_set.is_empty();
    producer_set.abort_all();
    let mut notes = Vec::new();
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
    if let Some(llm) = &llm {
        llm.stop_offering();
    }
    let producers_done = Instant::now();
    // CPU is measured over the sending phase (set-up and drain excluded).
    let cpu_end = ingress.cpu_time().unwrap_or_default();
    let machine = machine_busy_since(machine_start);
    let self_cpu = cpu_since(std::process::id(), self_cpu_start);
    // After a restart the server is a new process: its CPU is counted from its start.
    let nats_cpu = nats
        .pid()
        .and_then(cpu_time)
        .map(|end| match nats_cpu_start {
            Some(s) if end >= s => end - s,
            _ => end,
        });
    let cpu_wall = producers_done - start;
    // Streams whose `end` never arrives are reaped `fleet_idle` after their last packet,
    // which is at the latest when the producers stopped or the fault ended.
    let fault_end = plan.fault.map_or(start, |f| start + f.at + f.length);
    let reap_wait = producers_done.max(fault_end) + fleet_idle + REAP_MARGIN;
    let drain_deadline = producers_done + DRAIN_MAX + (reap_wait - producers_done);
    let mut last_received = u64::MAX;
    let mut stable = 0;
    let mut drained = false;
    while Instant::now() < drain_deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let pending = ingress
            .stats()
            .await
            .map(|s| s.pending_frames)
            .unwrap_or(u64::MAX);
        let received = fleet.frames_received();
        stable = if received == last_received {
            stable + 1
        } else {
            0
        };
        last_received = received;
        let llm_idle = llm.as_ref().is_none_or(|l| l.idle());
        // Every stream ended or reaped, or the reaper had its chance.
        let streams_settled = fleet.streams_active() == 0 || Instant::now() >= reap_wait;
        if pending == 0 && stable >= 3 && llm_idle && streams_settled {
            drained = true;
            break;
        }
    }
    if !drained {
        notes.push(format!(
            "the drain did not settle within {:.0} s; figures are as of its end",
            (drain_deadline - producers_done).as_secs_f64()
        ));
    }

    // 7. Final snapshots.
    let _ = stop_sampler.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(3), sampler).await;
    let mut final_stats = None;
    for _ in 0..3 {
        match ingress.stats().await {
            Ok(s) => {
                final_stats = Some(s);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    let final_stats = final_stats.ok_or_else(|| {
        Error::new(
            ErrorKind::Process,
            format!(
                "[{label}] the ingress did not answer /v1/stats at the end; its stderr:\n{}",
                ingress.stderr_tail()
            ),
        )
    })?;
    let wall = start.elapsed();
    let llm_report = match (&llm, &llm_unavailable) {
        (Some(l), _) => l.report(wall),
        (None, Some(why)) => crate::llm::not_run_because(why),
        (None, None) => crate::llm::not_run(),
    };
    if let Some(why) = llm_unavailable {
        notes.push(why);
    }
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
    if let Nats::Embedded(s) = nats {
        let _ = blocking(move || drop(s)).await;
    }
    drop(config_dir);

    let samples = samples.lock().map(|s| s.clone()).unwrap_or_default();
    let series = sample::summarise(&samples);
    let producer_snapshot = counters.snapshot();
    let frames = FrameAccounting::from_counts(&FrameCounts {
        sent_by_producers: producer_snapshot.frames_sent,
        offered: final_stats.frames.offered,
        handed_over: final_stats.frames.handed_over,
        published: final_stats.frames.published,
        possibly_lost: final_stats.frames.possibly_lost,
        unconfirmed_at_end: final_stats.frames.unconfirmed,
        consumer_possibly_lost: Some(fleet_snapshot.possibly_lost_frames),
        dropped: final_stats
            .frames
            .dropped
            .clone()
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .collect(),
        pending_at_end: final_stats.pending_frames,
        // Fresh and stale: the staleness guard's frames were delivered, then dropped.
        received: fleet_snapshot.frames_received,
        stale_at_consumer: fleet_snapshot.stale_frames,
        handed_to_handler: fleet_snapshot.frames_handled,
        // Everything the consumers saw missing, counted and not declared, including the
        // frames of streams refused over their cap.
        consumer_detected_holes: fleet_snapshot.lost_frames
            + fleet_snapshot.leading_missing
            + fleet_snapshot.frames_refused,
        refused_out_of_order: fleet_snapshot.stale_packets,
        declared_in_gaps: fleet_snapshot.gap_frames,
    })
    .with_timeliness(fleet_snapshot.timeliness);
    notes.extend(frames.notes());
    let limit_per_stream = final_stats
        .pending_bytes_limit_per_stream
        .filter(|l| *l > 0 && design == Design::Bounded);
    let pending_bytes_max = series.pending_bytes_max.max(final_stats.pending_bytes);
    let window_limit_max = series
        .window_limit_bytes_max
        .or(final_stats.window.as_ref().map(|w| w.limit_bytes));
    if let Some(note) = pending_over_limit_note(
        pending_bytes_max,
        limit_per_stream.map(|l| l * streams as u64),
        window_limit_max,
        env.reconnect,
    ) {
        notes.push(note);
    }
    if design == Design::Bounded && env.policy == PolicyArg::Shadow {
        notes.push(
            "shadow mode: the budget is measured, not enforced (only its safety ceiling is)".into(),
        );
    }
    if series.failed_polls > 0 {
        notes.push(format!(
            "{} of {} stats polls failed or timed out (the ingress did not answer within {:?})",
            series.failed_polls,
            series.samples,
            crate::ingress::STATS_TIMEOUT
        ));
    }
    let nominal = producers::nominal_frames(streams, plan.duration);
    let other_cores = cpu_other_cores(
        machine,
        cpu_end.saturating_sub(cpu_start),
        self_cpu,
        nats_cpu,
        cpu_wall,
    );
    if other_cores > 0.25 {
        notes.push(format!(
            "other processes used {other_cores:.2} cores on average during this run: the machine was not quiet"
        ));
    }
    if producer_snapshot.ticks_missed > nominal / 50 {
        notes.push(format!(
            "the load generator missed {} of {} frame ticks (it shares the CPU with everything else)",
            producer_snapshot.ticks_missed, nominal
        ));
    }
    let mut consumer = ConsumerReport::from(&fleet_snapshot);
    consumer.latency_window_p99_max_ms = series.latency_window_p99_max_ms;
    let report = RunReport {
        scenario: plan.scenario.as_str().to_owned(),
        streams,
        design,
        transport: env.transport,
        duration_s: plan.duration.as_secs_f64(),
        wall_s: wall.as_secs_f64(),
        fault: plan.fault.map(|f| FaultReport {
            kind: f.kind.as_str().to_owned(),
            at_s: f.at.as_secs_f64(),
            duration_s: f.length.as_secs_f64(),
        }),
        ingress: IngressReport {
            rss_peak_bytes: series.rss_peak_bytes,
            rss_start_bytes: series.rss_start_bytes,
            rss_end_bytes: series.rss_end_bytes,
            rss_before_fault_bytes: plan.fault.map(|_| series.rss_before_fault_bytes),
            pending_bytes_max,
            pending_bytes_limit: limit_per_stream.map(|l| l * streams as u64),
            pending_bytes_limit_per_stream: limit_per_stream,
            pending_frames_max: series.pending_frames_max,
            queue_wait_ms: final_stats.queue_wait_ms,
            oldest_frame_age_ms_max: series.oldest_frame_age_ms_max,
            admission_rejects: final_stats.admission_rejects,
            overloads: final_stats.overloads,
            gaps: final_stats.gaps,
            would_reject: final_stats.frames.would_reject,
            tasks_max: series.tasks_max.max(final_stats.tasks_alive),
            cpu_seconds: cpu_end.saturating_sub(cpu_start).as_secs_f64(),
            samples: series.samples,
            failed_polls: series.failed_polls,
            nats_disconnected_samples: series.nats_disconnected_samples,
            unconfirmed_bytes_max: series.unconfirmed_bytes_max,
            window_limit_bytes: final_stats.window.as_ref().map(|w| w.limit_bytes),
            window_limit_bytes_max: series.window_limit_bytes_max,
            window_mode: final_stats.window.as_ref().and_then(|w| w.mode.clone()),
            confirm_round_ms: final_stats.window.as_ref().map(|w| w.round_ms),
            window_disconnects: final_stats.window.as_ref().map(|w| w.disconnects),
        },
        frames,
        consumer,
        producers: ProducerReport::new(&producer_snapshot, nominal),
        llm: llm_report,
        cpu: CpuReport {
            ingress_s: cpu_end.saturating_sub(cpu_start).as_secs_f64(),
            loadtest_s: self_cpu.as_secs_f64(),
            nats_server_s: nats_cpu.map(|d| d.as_secs_f64()),
            other_s: (machine.as_secs_f64()
                - cpu_end.saturating_sub(cpu_start).as_secs_f64()
                - self_cpu.as_secs_f64()
                - nats_cpu.map_or(0.0, |d| d.as_secs_f64()))
            .max(0.0),
            wall_s: cpu_wall.as_secs_f64(),
        },
        notes,
        ..RunReport::default()
    };
    Ok(RunOutput { report, samples })
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

/// Explains a `pending_bytes_max` above `streams × per-stream limit`. Pending bytes
/// include frames handed to NATS and not yet confirmed. A stream instance that ended
/// (overloaded) keeps its unconfirmed frames' bytes until the server confirms them, and
/// a reconnecting producer opens a new instance with a budget of its own: while the
/// server is stalled the aggregate can then exceed `streams × limit`, by at most the
/// window's bound (all unconfirmed bytes of the connection). Beyond that, the bound did
/// not hold.
fn pending_over_limit_note(
    pending_max: u64,
    limit: Option<u64>,
    window_limit: Option<u64>,
    reconnect: bool,
) -> Option<String> {
    let limit = limit?;
    let over = pending_max.checked_sub(limit).filter(|o| *o > 0)?;
    Some(match window_limit {
        Some(w) if over <= w && reconnect => format!(
            "pending bytes (queued + unconfirmed) peaked {over} B above streams × per-stream \
             limit ({limit} B), within the confirmation window's bound ({w} B): stream \
             instances that had ended (overloaded) still held their unconfirmed frames while \
             their producers reconnected as new instances"
        ),
        _ => format!(
            "pending bytes peaked {over} B above streams × per-stream limit ({limit} B){}: \
             the bound did not hold",
            window_limit.map_or_else(String::new, |w| format!(", beyond the window's {w} B"))
        ),
    })
}

/// Average cores used by everything but the ingress, the load test and nats-server.
fn cpu_other_cores(
    machine: Duration,
    ingress: Duration,
    loadtest: Duration,
    nats: Option<Duration>,
    wall: Duration,
) -> f64 {
    let mine = ingress + loadtest + nats.unwrap_or_default();
    machine.saturating_sub(mine).as_secs_f64() / wall.as_secs_f64().max(0.001)
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

struct SamplerInputs {
    ingress: Arc<IngressProcess>,
    fleet: Arc<Fleet>,
    counters: Arc<ProducerCounters>,
    llm: Option<Arc<LlmRun>>,
    fault_active: Arc<AtomicBool>,
    samples: Arc<Mutex<Vec<Sample>>>,
    start: Instant,
    label: String,
    total: Duration,
    quiet: bool,
}

/// Captures a sample every 100 ms until told to stop (or a hard cap of samples), and
/// prints a progress line on stderr once per second.
async fn sampler(s: SamplerInputs, mut stop: tokio::sync::watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(sample::PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    // Hard cap: the run's duration plus 2 minutes of drain and grace.
    let cap =
        ((s.total + Duration::from_secs(120)).as_millis() / sample::PERIOD.as_millis()) as usize;
    let tty = std::io::stderr().is_terminal();
    let cpu0 = s.ingress.cpu_time().unwrap_or_default();
    for n in 0..cap {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => break,
        }
        let stats = s.ingress.stats().await.ok();
        let fault = s.fault_active.load(Ordering::Relaxed);
        let x = Sample {
            t_s: s.start.elapsed().as_secs_f64(),
            ingress: stats.as_ref().map(IngressSample::from),
            rss_bytes: s.ingress.rss_bytes(),
            ingress_cpu_s: s
                .ingress
                .cpu_time()
                .map(|c| c.saturating_sub(cpu0).as_secs_f64()),
            frames_sent: s.counters.frames_sent.load(Ordering::Relaxed),
            frames_received: s.fleet.frames_received(),
            latency_window_ms: s.fleet.take_window_latency(),
            llm_in_flight: s.llm.as_ref().map(|l| l.in_flight()),
            fault_active: fault,
        };
        if !s.quiet && n % 10 == 9 {
            let line = progress_line(&s.label, s.total, &x);
            if tty {
                eprint!("\r{line:<120}");
            } else {
                eprintln!("{line}");
            }
        }
        if let Ok(mut v) = s.samples.lock() {
            v.push(x);
        }
    }
    if !s.quiet && tty {
        eprint!("\r{:<120}\r", "");
    }
}

fn progress_line(label: &str, total: Duration, x: &Sample) -> String {
    let (pending, tasks, oldest) = x
        .ingress
        .as_ref()
        .map(|i| {
            (
                format!("{:.0} KiB", i.pending_bytes as f64 / 1024.0),
                i.tasks_alive.to_string(),
                format!("{:.0} ms", i.oldest_frame_age_ms),
            )
        })
        .unwrap_or_else(|| ("?".into(), "?".into(), "?".into()));
    format!(
        "[{label}] {:>5.1}/{:.0} s  sent {}  received {}  pending {pending}  oldest {oldest}  tasks {tasks}  rss {:.1} MiB{}",
        x.t_s,
        total.as_secs_f64(),
        x.frames_sent,
        x.frames_received,
        x.rss_bytes.unwrap_or(0) as f64 / (1024.0 * 1024.0),
        if x.fault_active { "  FAULT" } else { "" }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_over_the_limit_is_explained_or_flagged() {
        assert_eq!(
            pending_over_limit_note(160_000, Some(160_000), Some(65_536), true),
            None
        );
        assert_eq!(pending_over_limit_note(9, None, None, true), None);
        let n =
            pending_over_limit_note(215_680, Some(160_000), Some(65_536), true).unwrap_or_default();
        assert!(
            n.contains("55680 B above") && n.contains("reconnected"),
            "{n}"
        );
        let n =
            pending_over_limit_note(300_000, Some(160_000), Some(65_536), true).unwrap_or_default();
        assert!(n.contains("did not hold"), "{n}");
        let n = pending_over_limit_note(200_000, Some(160_000), Some(65_536), false)
            .unwrap_or_default();
        assert!(n.contains("did not hold"), "{n}");
    }

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
