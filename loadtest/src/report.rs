//! The report of a run: the JSON object (one per scenario × streams × design) and the
//! terminal table that puts the designs side by side.
//!
//! The JSON keys below are a contract with the README and
//! `docs/loadtest.md`; [`REQUIRED_KEYS`] lists them and a test checks that a report
//! carries every one. Figures are never invented: a value the run could not measure is
//! `null` (e.g. `pending_bytes_limit` for the naive design, which has none) and the
//! `notes` say why.

mod failover;
mod table;

pub use failover::failover_line;
use std::collections::BTreeMap;
pub(crate) use table::{Row, ms, opt_ms, or_dash, p50_p99};
pub use table::{markdown, table};

use serde::Serialize;

use crate::accounting::FrameAccounting;
use crate::fleet::FleetSnapshot;
use crate::ingress::Design;
use crate::producers::ProducerSnapshot;
use crate::stats::Percentiles;

/// Dotted paths every report object must contain (docs/loadtest.md, "What every number means").
pub const REQUIRED_KEYS: &[&str] = &[
    "scenario",
    "streams",
    "design",
    "duration_s",
    "ingress.rss_peak_bytes",
    "ingress.pending_bytes_max",
    "ingress.pending_bytes_limit",
    "ingress.queue_wait_ms.p50",
    "ingress.queue_wait_ms.p95",
    "ingress.queue_wait_ms.p99",
    "ingress.queue_wait_ms.max",
    "ingress.oldest_frame_age_ms_max",
    "ingress.admission_rejects",
    "ingress.overloads",
    "ingress.gaps",
    "ingress.tasks_max",
    "frames.offered",
    "frames.published",
    "frames.received",
    "frames.stale_dropped_by_consumer",
    "frames.handed_to_handler",
    "frames.dropped",
    "frames.unaccounted",
    "frames.delivered_late",
    "frames.late_after_ms",
    "frames.e2e_latency_ms.p50",
    "frames.e2e_latency_ms.p99",
    "frames.e2e_latency_ms.max",
    "frames.explained.pending_at_end",
    "frames.explained.lost_declared",
    "frames.explained.lost_undetected",
    "consumer.streams_reaped_without_end",
    "llm.offered",
    "llm.completed",
    "llm.refused",
    "llm.started_after_deadline",
    "llm.queue_wait_ms.p95",
    "llm.inference_ms.p95",
];

/// The fault a scenario injected.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FaultReport {
    /// What was done (`nats_pause`, `nats_restart`, `backend_pause`).
    pub kind: String,
    /// When it started, seconds after the producers started.
    pub at_s: f64,
    /// How long it lasted.
    pub duration_s: f64,
}

/// The ingress part of a report.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct IngressReport {
    /// Largest RSS of the ingress process.
    pub rss_peak_bytes: u64,
    /// RSS at the first sample.
    pub rss_start_bytes: u64,
    /// RSS at the last sample.
    pub rss_end_bytes: u64,
    /// RSS just before the fault started (`null` without a fault).
    pub rss_before_fault_bytes: Option<u64>,
    /// Largest pending bytes (all streams) seen in any sample.
    pub pending_bytes_max: u64,
    /// The configured bound on pending bytes for this run: per-stream limit × streams
    /// (`null` when the design has no bound).
    pub pending_bytes_limit: Option<u64>,
    /// The per-stream limit (`null` when none).
    pub pending_bytes_limit_per_stream: Option<u64>,
    /// Largest pending frame count.
    pub pending_frames_max: u64,
    /// Queue wait (enqueue → handed to NATS) over the whole run, from the ingress's
    /// histogram.
    pub queue_wait_ms: Percentiles,
    /// Largest age of the oldest pending frame seen in any sample.
    pub oldest_frame_age_ms_max: f64,
    /// Connections refused before upgrade.
    pub admission_rejects: u64,
    /// Overload signals.
    pub overloads: u64,
    /// Gap markers.
    pub gaps: u64,
    /// Frames shadow mode would have refused.
    pub would_reject: u64,
    /// Largest number of tokio tasks alive in the ingress.
    pub tasks_max: u64,
    /// CPU seconds the ingress used while the producers were sending.
    pub cpu_seconds: f64,
    /// Samples taken / of which the stats poll failed.
    pub samples: usize,
    /// Stats polls that failed.
    pub failed_polls: usize,
    /// Samples in which the ingress reported NATS disconnected.
    pub nats_disconnected_samples: usize,
    /// Largest unconfirmed window (handed to NATS, not yet confirmed by the server) seen
    /// in any sample, bytes; `null` for an ingress without the server-confirmed window.
    pub unconfirmed_bytes_max: Option<u64>,
    /// The window's bound at the end of the run, bytes (`null` without the window).
    pub window_limit_bytes: Option<u64>,
    /// The window's largest bound seen in any sample, bytes (it follows the aggregate
    /// rate; `null` without the window).
    pub window_limit_bytes_max: Option<u64>,
    /// The window's mode (`confirmed`, `unconfirmed`, `jetstream`; `null` when not
    /// reported).
    pub window_mode: Option<String>,
    /// Confirmation round time (marker out → back) over the run (`null` without the
    /// window).
    pub confirm_round_ms: Option<Percentiles>,
    /// NATS disconnects the window went through (`null` without the window).
    pub window_disconnects: Option<u64>,
}

/// The consumer (recognition fleet) part of a report: the fleet's snapshot and the
/// worst 100 ms window of its latency.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ConsumerReport {
    /// The fleet's own figures.
    #[serde(flatten)]
    pub fleet: FleetSnapshot,
    /// Largest p99 of end-to-end latency over any 100 ms window.
    pub latency_window_p99_max_ms: f64,
}

/// The LLM part of a report.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LlmReport {
    /// Whether the LLM side ran in this scenario.
    pub enabled: bool,
    /// Which front ran (`weir-llm-adapter`, `naive`, or why none).
    pub front: String,
    /// Requests sent.
    pub offered: u64,
    /// Requests the generator did not send because
    /// [`MAX_OUTSTANDING`](crate::llm::generator::MAX_OUTSTANDING) were waiting already.
    pub skipped: u64,
    /// Requests answered with a result.
    pub completed: u64,
    /// Requests refused, total.
    pub refused: u64,
    /// Refusals by error code.
    pub refused_by_code: BTreeMap<String, u64>,
    /// Requests whose caller gave up (no answer within deadline + margin).
    pub caller_timeouts: u64,
    /// Replies (ok or refusal) that arrived after the deadline: timeouts for a caller
    /// whose own timeout is the deadline.
    pub answered_after_deadline: u64,
    /// Refusals that came 100 ms or more after the request was sent: admitted, then
    /// answered without a result.
    pub refused_after_waiting: u64,
    /// Caller-side latency of refusals (send → reply).
    pub refusal_ms: Percentiles,
    /// Requests whose inference started after their deadline (must be 0 when bounded).
    pub started_after_deadline: u64,
    /// Completed within their deadline.
    pub completed_in_deadline: u64,
    /// Backend calls started (simulated backend's own count): calls beyond
    /// `completed_in_deadline` were work whose answer came too late or never went out.
    pub backend_calls: u64,
    /// Simulated backends (`--llm-backends`).
    pub backends: usize,
    /// `backend-stall`: the stalled backend's ejection and the goodput after it.
    pub stall: Option<crate::llm::pool::StallReport>,
    /// How each session's replies spread over the backends (`Weir-Backend`), when the
    /// replies name theirs.
    pub affinity: Option<crate::llm::generator::Affinity>,
    /// Completed within deadline per second of run.
    pub goodput_per_s: f64,
    /// Queue wait before inference, as the front measured it.
    pub queue_wait_ms: Percentiles,
    /// Inference time, as the front measured it.
    pub inference_ms: Percentiles,
    /// Largest number of requests held by the front (queued + running).
    pub in_flight_max: u64,
    /// Offered load as a multiple of the backend's capacity.
    pub load_factor: f64,
    /// Callers asked for streamed replies (`--stream`, weir's adapter).
    pub streamed: bool,
    /// Caller-side time to the first token: send → first `chunk` when streamed, send →
    /// the whole reply otherwise (completed requests).
    pub ttft_ms: Percentiles,
}

/// Producer-side counters in a report.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ProducerReport {
    /// Nominal frames: streams × 50 × seconds.
    pub nominal_frames: u64,
    /// The producers' counters.
    #[serde(flatten)]
    pub counters: ProducerSnapshot,
}

/// One step of the ceiling ramp.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CeilingStep {
    /// Streams in this step.
    pub streams: usize,
    /// Whether the step met every criterion.
    pub sustainable: bool,
    /// Why not (empty when sustainable).
    pub limited_by: Vec<String>,
}

impl CeilingStep {
    /// The step at `streams`, sustainable when nothing limited it.
    pub fn new(streams: usize, limited_by: Vec<String>) -> Self {
        Self {
            streams,
            sustainable: limited_by.is_empty(),
            limited_by,
        }
    }
}

/// The ceiling verdict, attached to every ceiling report object.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CeilingReport {
    /// Every step, in order.
    pub steps: Vec<CeilingStep>,
    /// What stopped the ramp.
    pub limited_by: Vec<String>,
}

/// CPU time used while the producers were sending (set-up and drain excluded), by
/// process (seconds; the machine has 2 cores, so `wall_s × 2` is the most available).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CpuReport {
    /// The ingress process.
    pub ingress_s: f64,
    /// The load test itself (producers, fleet, sampler, LLM side).
    pub loadtest_s: f64,
    /// nats-server (`null` with `--nats-url`).
    pub nats_server_s: Option<f64>,
    /// Everything else on the machine (other processes, the kernel): busy CPU time of
    /// all cores minus the three above. Non-negligible values mean the figures were
    /// measured on a busy machine.
    pub other_s: f64,
    /// Wall-clock seconds of the sending phase.
    pub wall_s: f64,
}

impl CpuReport {
    /// Average cores other processes used.
    pub fn other_cores(&self) -> f64 {
        self.other_s / self.wall_s.max(0.001)
    }
}

/// CPU use during a failover run's sending phase, in cores (CPU seconds / wall
/// seconds; this machine has 2): the conditions a double delivery or a slow takeover
/// was measured under.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct FailoverCpu {
    /// The whole machine.
    pub machine_cores: f64,
    /// The load test itself (producers, observer).
    pub loadtest_cores: f64,
    /// The worker processes (the victim until its death).
    pub workers_cores: f64,
    /// The nats-server nodes (the victim node until its death).
    pub nats_cores: f64,
    /// Everything else (other builds and tests on the machine).
    pub other_cores: f64,
    /// `/proc/loadavg`'s 1-minute figure at the kill.
    pub loadavg_1m_at_kill: Option<f64>,
}

/// The `worker-failover` / `node-failover` part of a report (absent for the other
/// scenarios).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct FailoverReport {
    /// What was SIGKILLed (`worker w0`, `node n1`).
    pub victim: String,
    /// For node-failover: whether the killed node led the KV stream at the kill.
    pub victim_led_kv: Option<bool>,
    /// NATS nodes in the cluster.
    pub nodes: usize,
    /// Worker processes.
    pub workers: u32,
    /// Partitions.
    pub partitions: u32,
    /// Frames per second per stream.
    pub fps: u32,
    /// The workers' lease length, ms.
    pub lease_ttl_ms: u64,
    /// Seconds after the producers started: the kill, the restart.
    pub killed_at_s: f64,
    /// See `killed_at_s`.
    pub restarted_at_s: f64,
    /// Held partitions per live worker just before the kill.
    pub spread_before: Vec<usize>,
    /// Held partitions per live worker just before the restart.
    pub spread_before_restart: Vec<usize>,
    /// Held partitions per live worker at the end.
    pub spread_end: Vec<usize>,
    /// worker-failover: the victim's partitions and their new owners.
    pub takeover: Option<crate::lease_audit::Takeover>,
    /// worker-failover: restart → the restarted worker holds ⌈P/N⌉ − 1 partitions, ms.
    pub rejoin_share_ms: Option<f64>,
    /// worker-failover: restart → every partition held once, all within ⌈P/N⌉ ± 1, ms.
    pub rejoin_balanced_ms: Option<f64>,
    /// node-failover: owner changes and renewals across the node's death.
    pub renewals: Option<crate::lease_audit::Renewals>,
    /// The frames audit: double deliveries, declared and undeclared losses.
    pub frames: crate::lease_audit::FrameAudit,
    /// CPU use while the producers sent.
    pub cpu: FailoverCpu,
}

/// One (scenario, streams, design) run.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RunReport {
    /// Scenario name.
    pub scenario: String,
    /// Streams.
    pub streams: usize,
    /// Design.
    pub design: Design,
    /// How the producers reached the ingress (`ws`, `whip`, `twilio`).
    pub transport: crate::producers::Transport,
    /// Seconds the producers sent.
    pub duration_s: f64,
    /// Seconds from start to the final measurement (sending + drain).
    pub wall_s: f64,
    /// The injected fault.
    pub fault: Option<FaultReport>,
    /// The ingress's figures.
    pub ingress: IngressReport,
    /// Frame accounting.
    pub frames: FrameAccounting,
    /// The recognition fleet's figures.
    pub consumer: ConsumerReport,
    /// Producers.
    pub producers: ProducerReport,
    /// The LLM side.
    pub llm: LlmReport,
    /// CPU used by each process.
    pub cpu: CpuReport,
    /// For `ceiling`: the largest sustainable stream count.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_streams: Option<usize>,
    /// For `ceiling`: the ramp.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ceiling: Option<CeilingReport>,
    /// For `worker-failover` and `node-failover`: ownership and the frames audit
    /// (those runs have no ingress: `ingress`, `frames`, `llm` stay empty).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failover: Option<FailoverReport>,
    /// For `asr-shortfall`: admissions, refusals and timeliness of the design.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub asr: Option<crate::scenario::asr::AsrReport>,
    /// For `asr-churn`: the door's fleet view across a worker's death and addition.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub churn: Option<crate::scenario::asr::ChurnReport>,
    /// For `producer-flap`: cuts, resumes and the wire audit of the design.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flap: Option<crate::scenario::flap::FlapReport>,
    /// Explanations of anything unusual.
    pub notes: Vec<String>,
}

/// Whether `value` has every dotted path in `keys`; returns the missing ones.
pub fn missing_keys(value: &serde_json::Value, keys: &[&str]) -> Vec<String> {
    keys.iter()
        .filter(|k| {
            value
                .pointer(&format!("/{}", k.replace('.', "/")))
                .is_none()
        })
        .map(|k| (*k).to_owned())
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn example() -> RunReport {
        RunReport {
            scenario: "steady".into(),
            streams: 10,
            design: Design::Bounded,
            transport: crate::producers::Transport::Ws,
            duration_s: 5.0,
            wall_s: 6.0,
            fault: None,
            ingress: IngressReport {
                pending_bytes_limit: Some(160_000),
                ..Default::default()
            },
            frames: FrameAccounting::default(),
            consumer: ConsumerReport::default(),
            producers: ProducerReport::default(),
            llm: LlmReport::default(),
            cpu: CpuReport::default(),
            max_streams: None,
            ceiling: None,
            failover: None,
            asr: None,
            churn: None,
            flap: None,
            notes: vec![],
        }
    }

    #[test]
    fn report_json_has_every_required_key() {
        let v = serde_json::to_value(example()).unwrap_or_default();
        assert_eq!(missing_keys(&v, REQUIRED_KEYS), Vec::<String>::new());
        assert_eq!(v["design"], "bounded");
        assert!(v.get("max_streams").is_none(), "only for ceiling");
        let mut c = example();
        c.max_streams = Some(1000);
        let v = serde_json::to_value(c).unwrap_or_default();
        assert_eq!(v["max_streams"], 1000);
    }

    #[test]
    fn missing_keys_are_reported() {
        let v = serde_json::json!({"a": {"b": 1}});
        assert_eq!(missing_keys(&v, &["a.b", "a.c", "d"]), vec!["a.c", "d"]);
    }

    #[test]
    fn table_puts_designs_side_by_side() {
        let mut naive = example();
        naive.design = Design::Naive;
        naive.ingress.pending_bytes_limit = None;
        let t = table(&[naive, example()]);
        let header = t
            .lines()
            .find(|l| l.contains("10 bounded"))
            .unwrap_or_default();
        assert!(header.find("10 bounded") < header.find("10 naive"), "{t}");
        assert!(t.contains("none"));
        let md = markdown(&[example()]);
        assert!(md.contains("| | 10 bounded |"), "{md}");
        assert!(md.contains("|---|---:|"), "{md}");
        assert!(t.contains("160000"));
        assert!(t.contains("delivered late"), "{t}");
    }

    #[test]
    fn table_shows_timeliness_and_dashes_when_untimed() {
        let mut timed_run = example();
        timed_run.frames.timeliness.delivered_late = 2290;
        timed_run.frames.timeliness.e2e_latency_ms = Percentiles {
            count: 6000,
            p50: 12.5,
            p95: 3000.0,
            p99: 5900.0,
            max: 6012.0,
            mean: 1000.0,
        };
        let mut untimed = example();
        untimed.streams = 50;
        let t = table(&[timed_run, untimed]);
        let row = |label: &str| {
            t.lines()
                .find(|l| l.starts_with(label))
                .unwrap_or_default()
                .to_owned()
        };
        assert!(row("delivered late").contains("2290"), "{t}");
        let p99 = row("e2e to handler p99 ms");
        assert!(p99.contains("5900") && p99.trim_end().ends_with('-'), "{t}");
        assert!(row("e2e to handler max ms").contains("6012"), "{t}");
    }
}
