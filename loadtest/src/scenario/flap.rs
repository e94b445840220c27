//! `producer-flap`: every producer's TCP connection is cut at socket level every
//! `--flap-every` and the producer reconnects at once — resumable streams
//! beside what a reconnect does without them.
//!
//! `--streams` calls (default [`DEFAULT_STREAMS`]) send speech-like PCM at the real
//! 20 ms cadence for `--duration` ([`DEFAULT_DURATION`]); each call's connection is cut
//! (SO_LINGER 0 and drop: a TCP RST, no close) every `--flap-every`
//! ([`DEFAULT_FLAP_EVERY`]), the calls' cuts spread evenly over one period
//! ([`producer`]). Three designs ([`FlapDesign`]; docs/loadtest.md, "Producers that
//! flap") run one after the other, each on a fresh nats-server and ingress, with the
//! same calls.
//!
//! The consumer is the wire audit ([`audit`]): every packet on `weir.audio.>`, per
//! call, held against what its producer offered — published + declared lost =
//! offered, no duplicate, nothing out of order, one stream instance and one `end`.
//! Resume latency is measured on both sides: the producers' cut → `resumed` event
//! and the door's `weir_ingress_resume_seconds` histogram (upgrade received → first
//! frame admitted), read from its `/metrics` at the end.
//!
//! Order of events, each step bounded in time: nats-server, the audit's subscription
//! (confirmed), the ingress (ready line), the calls (progress line once a second),
//! the drain (until the wire is quiet and every call's `end` is in, at most
//! [`DRAIN_MAX`]), `/metrics`, then everything stopped (also on drop).

pub mod audit;
pub mod producer;
mod table;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;
use weir_audio_ingress::metrics::{
    RESUME_PARKED_ENDED_TOTAL, RESUME_PARKED_TOTAL, RESUME_SECONDS, RESUMES_TOTAL,
};

use crate::error::Error;
use crate::ingress::{Design, label, samples};
use crate::report::{CpuReport, RunReport};
use crate::scenario::run::{CpuStart, Env, RunNats, RunOutput, ScenarioIngress, spawn_ingress};
use audit::{AuditTotals, WireAudit};
use producer::{FlapConfig, FlapCounters, FlapSnapshot};

pub use table::{rows as table_rows, summary_line};

/// Default calls.
pub const DEFAULT_STREAMS: usize = 1_000;
/// Default seconds of audio per call: three cuts per call at the default period.
pub const DEFAULT_DURATION: Duration = Duration::from_secs(30);
/// Default period of the cuts.
pub const DEFAULT_FLAP_EVERY: Duration = Duration::from_secs(10);
/// Longest drain after the calls ended.
pub const DRAIN_MAX: Duration = Duration::from_secs(10);
/// The target: resume p99 at most this, ms.
pub const RESUME_TARGET_MS: f64 = 250.0;
/// What the audit subscribes to.
pub const AUDIT_SUBJECT: &str = "weir.audio.>";

/// A design of `producer-flap`.
#[derive(strum::IntoStaticStr, strum::Display, strum::VariantArray)]
#[strum(serialize_all = "kebab-case")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FlapDesign {
    /// The naive ingress; a reconnect is a fresh open.
    #[default]
    Naive,
    /// audio-ingress with `resume_window_ms = 0`; a reconnect is a fresh open.
    WeirNoResume,
    /// audio-ingress with resume on; a reconnect resumes.
    WeirResume,
}

impl FlapDesign {
    /// The designs `--design` selects: `naive`, `bounded` (both weir designs) or both.
    pub fn selected(design: Option<crate::cli::DesignArg>) -> Vec<Self> {
        use crate::cli::DesignArg;
        match design {
            Some(DesignArg::Naive) => vec![Self::Naive],
            Some(DesignArg::Bounded) => vec![Self::WeirNoResume, Self::WeirResume],
            Some(DesignArg::Both) | None => vec![Self::Naive, Self::WeirNoResume, Self::WeirResume],
        }
    }
}

/// The scenario's settings.
#[derive(Debug, Clone, Copy)]
pub struct FlapSettings {
    /// Seconds of audio per call.
    pub duration: Duration,
    /// Every connection is cut this often.
    pub flap_every: Duration,
    /// Partitions of the audio subject.
    pub partitions: u32,
}

/// The door's resume histogram, read from `/metrics` (Prometheus buckets: the
/// percentiles are the bucket bounds they fall in, "at most").
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ServerResume {
    /// Resumes timed.
    pub count: u64,
    /// The bucket bound (ms) at or below which half of them were.
    pub p50_le_ms: Option<f64>,
    /// The bucket bound (ms) at or below which 99 % of them were.
    pub p99_le_ms: Option<f64>,
    /// Mean, ms (`_sum / _count`).
    pub mean_ms: Option<f64>,
    /// Share at or below [`RESUME_TARGET_MS`], percent (`null` without that bucket).
    pub within_target_pct: Option<f64>,
    /// The cumulative buckets: (bound ms, count).
    pub buckets: Vec<(f64, u64)>,
}

/// Reads histogram `name` from Prometheus text, summed over its series (pure).
pub fn histogram(text: &str, name: &str) -> Option<ServerResume> {
    let bucket = format!("{name}_bucket");
    let mut buckets: BTreeMap<u64, (f64, u64)> = BTreeMap::new();
    let (mut sum, mut count) = (None::<f64>, None::<u64>);
    for (metric, series, value) in samples(text) {
        if metric == bucket {
            let bound = match label(series, "le") {
                Some("+Inf") => f64::INFINITY,
                le => match le.map(str::parse::<f64>) {
                    Some(Ok(b)) => b,
                    _ => continue,
                },
            };
            // Keyed by the bound's bits: the bounds are finite or +Inf, never NaN.
            let e = buckets.entry(bound.to_bits()).or_insert((bound, 0));
            e.1 += value as u64;
        } else if metric == format!("{name}_sum") {
            *sum.get_or_insert(0.0) += value;
        } else if metric == format!("{name}_count") {
            *count.get_or_insert(0) += value as u64;
        }
    }
    let count = count?;
    // Bounds in ms, ascending (+Inf last).
    let mut sorted: Vec<(f64, u64)> = buckets.into_values().map(|(b, c)| (b * 1e3, c)).collect();
    sorted.sort_by(|a, b| a.0.total_cmp(&b.0));
    let share = |n: f64| (count > 0).then(|| n / count as f64);
    let quantile = |q: f64| {
        let rank = ((q * count as f64).ceil() as u64).max(1);
        let bound = sorted.iter().find(|(_, c)| *c >= rank).map(|(b, _)| *b);
        bound.filter(|_| count > 0)
    };
    let target = sorted
        .iter()
        .find(|(b, _)| (b - RESUME_TARGET_MS).abs() < 1e-6);
    Some(ServerResume {
        count,
        p50_le_ms: quantile(0.5),
        p99_le_ms: quantile(0.99),
        mean_ms: sum.and_then(|s| share(s * 1e3)),
        within_target_pct: target.and_then(|(_, c)| share(100.0 * *c as f64)),
        buckets: sorted.into_iter().filter(|(b, _)| b.is_finite()).collect(),
    })
}

/// Counter `name` from Prometheus text by the value of `label` (pure).
pub fn counter_by_label(text: &str, name: &str, by: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for (_, series, value) in samples(text).filter(|(metric, ..)| *metric == name) {
        // A series without the label (declared, never incremented) is left out.
        if let Some(v) = label(series, by) {
            *out.entry(v.to_owned()).or_default() += value as u64;
        }
    }
    out
}

/// One design's figures (the report's `flap` object).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct FlapReport {
    /// The design.
    pub design: FlapDesign,
    /// Period of the cuts, seconds.
    pub flap_every_s: f64,
    /// Nominal frames: calls × 50 × seconds.
    pub nominal_frames: u64,
    /// The producers' side.
    pub producers: FlapSnapshot,
    /// The wire audit.
    pub audit: AuditTotals,
    /// The door's resume histogram (`null` for the naive ingress, or when absent).
    pub server_resume: Option<ServerResume>,
    /// The door's `weir_ingress_resumes_total` by `outcome` (`resumed`, or a
    /// refusal's code).
    pub server_resumes_by_outcome: BTreeMap<String, u64>,
    /// The door's `weir_ingress_resume_parked_total`: streams it parked because their
    /// connection dropped (`null` when absent): the cuts it noticed before the resume
    /// arrived (a resume that finds the old connection still attached takes it over
    /// instead).
    pub server_parked: Option<u64>,
    /// The door's `weir_ingress_resume_parked_ended_total` by `reason` (parked streams
    /// that ended without a resume).
    pub server_parked_ended: BTreeMap<String, u64>,
    /// The target, ms.
    pub resume_target_ms: f64,
    /// Whether the client-side resume p99 met the target (`null` without resumes).
    pub resume_p99_within_target: Option<bool>,
    /// CPU while the calls ran.
    pub cpu: CpuReport,
}

/// The ingress of `design` for this run. Capacity admission off: no recognition fleet
/// announces slots here (the audit is a plain subscriber); the stream cap never limits
/// the run.
fn ingress_of(design: FlapDesign, streams: usize) -> ScenarioIngress {
    let weir = |sets| ScenarioIngress::Weir {
        max_streams: (streams * 2).max(1000) + 100,
        config: String::new(),
        sets,
    };
    match design {
        FlapDesign::Naive => ScenarioIngress::Naive { floor: None },
        FlapDesign::WeirResume => weir(&["capacity.mode=off"]),
        FlapDesign::WeirNoResume => weir(&["capacity.mode=off", "resume_window_ms=0"]),
    }
}

/// One design.
pub async fn run_design(
    env: &Env,
    settings: &FlapSettings,
    streams: usize,
    design: FlapDesign,
) -> Result<RunOutput, Error> {
    let label = format!("producer-flap {streams} {design}");
    crate::scenario::run::settle(env, &label).await;
    let nats = RunNats::start(env).await?;
    let audit = WireAudit::start(&nats.url, AUDIT_SUBJECT).await?;
    let ingress = ingress_of(design, streams);
    let (ingress, dir) = spawn_ingress(env, ingress, &nats.url, settings.partitions).await?;

    let counters = Arc::new(FlapCounters::default());
    let spread = Duration::from_millis((streams as u64).clamp(20, 1000));
    let cpu0 = CpuStart::take(&ingress, &nats);
    let start = Instant::now();
    let calls = producer::start(
        FlapConfig {
            ws_addr: ingress.ws_addr(),
            ids: Arc::new((0..streams).map(|i| format!("call{i}")).collect()),
            duration: settings.duration,
            flap_every: settings.flap_every,
            resume: design == FlapDesign::WeirResume,
            start_spread: spread,
        },
        streams as u64,
        counters.clone(),
    );
    // The calls, bounded: their duration, the spread, one last attempt and the end's
    // grace, and 5 s of slack.
    let deadline = start
        + settings.duration
        + spread
        + producer::CONNECT_TIMEOUT
        + producer::END_GRACE
        + Duration::from_secs(5);
    let mut tick = crate::scenario::ticker(Duration::from_secs(1));
    let (ended, late) = crate::scenario::join_ticking(calls, deadline, &mut tick, || {
        if !env.quiet {
            let line = progress(&label, start, settings.duration, &counters, &audit);
            crate::scenario::progress(&line);
        }
    })
    .await;
    let (mut offered, mut notes) = (Vec::with_capacity(ended.len()), Vec::new());
    for call in ended {
        match call {
            Ok(call) => offered.push(call),
            Err(e) => notes.push(format!("a call's task failed: {e}")),
        }
    }
    if late {
        notes.push("some calls had not finished in time and were aborted".into());
    }
    let cpu = cpu0.used(&ingress, &nats, start.elapsed());
    crate::scenario::clear_progress(env.quiet);

    if !drain(&audit, offered.len() as u64).await {
        notes.push(format!(
            "the drain did not settle within {} s (the wire still moved, or some calls had \
             no end); figures are as of its end",
            DRAIN_MAX.as_secs()
        ));
    }
    // The door's `/metrics` (none for the naive ingress; when unreadable, a note).
    let metrics = match design {
        FlapDesign::Naive => None,
        _ => (ingress.metrics().await)
            .map_err(|e| notes.push(format!("cannot read the ingress's /metrics: {e}")))
            .ok(),
    };
    let wall = start.elapsed();
    ingress.stop().await;
    offered.sort();
    let totals = audit.totals(&offered);
    drop(audit);
    nats.stop().await;
    drop(dir);

    let flap = figures(
        design,
        settings,
        streams,
        counters.snapshot(),
        totals,
        metrics.as_deref(),
        cpu,
    );
    notes.extend(flap_notes(&flap));
    Ok(output(design, settings, streams, wall, flap, notes))
}

/// The run's report: the design's `flap` figures and `notes`, no samples.
fn output(
    design: FlapDesign,
    settings: &FlapSettings,
    streams: usize,
    wall: Duration,
    flap: FlapReport,
    notes: Vec<String>,
) -> RunOutput {
    let report = RunReport {
        scenario: "producer-flap".into(),
        streams,
        design: match design {
            FlapDesign::Naive => Design::Naive,
            _ => Design::Bounded,
        },
        duration_s: settings.duration.as_secs_f64(),
        wall_s: wall.as_secs_f64(),
        llm: crate::llm::not_run(),
        flap: Some(flap),
        notes,
        ..RunReport::default()
    };
    RunOutput {
        report,
        samples: Vec::new(),
    }
}

/// Drains: waits until the wire has been quiet for 1 s and `calls` ends are in, at
/// most [`DRAIN_MAX`]. Returns whether it settled.
async fn drain(audit: &WireAudit, calls: u64) -> bool {
    let deadline = Instant::now() + DRAIN_MAX;
    crate::scenario::until_stable(deadline, Duration::from_millis(100), 10, async || {
        (audit.packets(), audit.ends() >= calls)
    })
    .await
}

/// The design's figures (pure).
pub fn figures(
    design: FlapDesign,
    settings: &FlapSettings,
    streams: usize,
    producers: FlapSnapshot,
    audit: AuditTotals,
    metrics: Option<&str>,
    cpu: CpuReport,
) -> FlapReport {
    let server_resume = metrics.and_then(|m| histogram(m, RESUME_SECONDS));
    let server_resumes_by_outcome = metrics
        .map(|m| counter_by_label(m, RESUMES_TOTAL, "outcome"))
        .unwrap_or_default();
    let server_parked =
        metrics.and_then(|m| crate::scenario::asr::churn::gauge(m, RESUME_PARKED_TOTAL));
    let server_parked_ended = metrics
        .map(|m| counter_by_label(m, RESUME_PARKED_ENDED_TOTAL, "reason"))
        .unwrap_or_default();
    let resume_p99_within_target =
        (producers.resume_ms.count > 0).then_some(producers.resume_ms.p99 <= RESUME_TARGET_MS);
    FlapReport {
        design,
        flap_every_s: settings.flap_every.as_secs_f64(),
        nominal_frames: crate::producers::nominal_frames(streams, settings.duration),
        producers,
        audit,
        server_resume,
        server_resumes_by_outcome,
        server_parked: server_parked.map(|v| v as u64),
        server_parked_ended,
        resume_target_ms: RESUME_TARGET_MS,
        resume_p99_within_target,
        cpu,
    }
}

/// Sentences for what is not obviously fine (pure).
pub fn flap_notes(f: &FlapReport) -> Vec<String> {
    let mut notes = Vec::new();
    let a = &f.audit;
    if a.audit_slow_consumer_events > 0 {
        notes.push(format!(
            "the audit's own subscription fell behind ({} slow-consumer events): it lost \
             messages, so its losses are upper bounds and its other counts lower bounds",
            a.audit_slow_consumer_events
        ));
    }
    let p = &f.producers;
    if f.nominal_frames > 0 && p.ticks_missed * 100 > f.nominal_frames {
        notes.push(format!(
            "the load generator missed {} of {} ticks (over 1 %): it, not the ingress, was \
             short of CPU",
            p.ticks_missed, f.nominal_frames
        ));
    }
    if p.end_failed > 0 {
        notes.push(format!(
            "{} calls could not send their end (no connection at the stop time)",
            p.end_failed
        ));
    }
    if f.design == FlapDesign::WeirResume && f.server_resume.is_none() {
        notes.push(format!(
            "the ingress's /metrics has no {RESUME_SECONDS} histogram"
        ));
    }
    if f.cpu.wall_s > 0.0 && f.cpu.other_s / f.cpu.wall_s > 0.25 {
        notes.push(format!(
            "other processes used {:.2} cores while the calls ran: the machine was shared",
            f.cpu.other_s / f.cpu.wall_s
        ));
    }
    notes
}

fn progress(
    label: &str,
    start: Instant,
    total: Duration,
    counters: &FlapCounters,
    audit: &WireAudit,
) -> String {
    let p = counters.snapshot();
    format!(
        "[{label}] {:>5.1}/{:.0} s  up {}  cuts {}  resumed {}  reopened {}  refused {}  \
         offered {}  on NATS {}  resume p99 {} ms",
        start.elapsed().as_secs_f64(),
        total.as_secs_f64(),
        counters.up.load(std::sync::atomic::Ordering::Relaxed),
        p.cuts,
        p.resumes,
        p.fresh_reopens,
        p.refused,
        p.frames_offered,
        audit.packets(),
        if p.resume_ms.count == 0 {
            "-".to_owned()
        } else {
            format!("{:.0}", p.resume_ms.p99)
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    use weir_testkit::names::assert_serde_names;

    #[test]
    fn design_names_are_the_serde_names() {
        assert_serde_names::<FlapDesign>();
    }

    const METRICS: &str = "# TYPE weir_ingress_resume_seconds histogram\n\
        weir_ingress_resume_seconds_bucket{le=\"0.001\"} 0\n\
        weir_ingress_resume_seconds_bucket{le=\"0.005\"} 40\n\
        weir_ingress_resume_seconds_bucket{le=\"0.02\"} 90\n\
        weir_ingress_resume_seconds_bucket{le=\"0.05\"} 99\n\
        weir_ingress_resume_seconds_bucket{le=\"0.1\"} 100\n\
        weir_ingress_resume_seconds_bucket{le=\"0.25\"} 100\n\
        weir_ingress_resume_seconds_bucket{le=\"+Inf\"} 100\n\
        weir_ingress_resume_seconds_sum 0.8\n\
        weir_ingress_resume_seconds_count 100\n\
        weir_ingress_resumes_total{outcome=\"resumed\"} 100\n\
        weir_ingress_resumes_total{outcome=\"expired\"} 2\n\
        weir_ingress_resumes_total 0\n";

    #[test]
    fn the_doors_histogram_reads_as_bucket_bounds() {
        let h = histogram(METRICS, RESUME_SECONDS).unwrap();
        assert_eq!(h.count, 100);
        assert_eq!(h.p50_le_ms, Some(20.0), "the 50th is in (5, 20] ms");
        assert_eq!(h.p99_le_ms, Some(50.0));
        assert!((h.mean_ms.unwrap() - 8.0).abs() < 1e-9);
        assert_eq!(h.within_target_pct, Some(100.0));
        assert_eq!(h.buckets.len(), 6, "+Inf left out");
        assert!(histogram(METRICS, "absent").is_none());
        let by = counter_by_label(METRICS, RESUMES_TOTAL, "outcome");
        assert_eq!(by.get("resumed"), Some(&100));
        assert_eq!(by.get("expired"), Some(&2));
        assert_eq!(by.len(), 2, "the unlabelled series is left out: {by:?}");
    }

    #[test]
    fn an_empty_histogram_has_no_percentiles() {
        let h = histogram(
            "weir_ingress_resume_seconds_bucket{le=\"+Inf\"} 0\nweir_ingress_resume_seconds_count 0\n",
            RESUME_SECONDS,
        )
        .unwrap();
        assert_eq!((h.count, h.p99_le_ms, h.mean_ms), (0, None, None));
    }

    #[test]
    fn design_selection_follows_the_design_flag() {
        use crate::cli::DesignArg;
        assert_eq!(FlapDesign::selected(None).len(), 3);
        assert_eq!(
            FlapDesign::selected(Some(DesignArg::Bounded)),
            vec![FlapDesign::WeirNoResume, FlapDesign::WeirResume]
        );
        assert_eq!(
            FlapDesign::selected(Some(DesignArg::Naive)),
            vec![FlapDesign::Naive]
        );
    }
}
