//! From what a run measured to its report: frame accounting, the ingress figures, CPU
//! shares and the notes that explain anything unusual.
//!
//! Pure: everything here works on figures already measured by [`super::run`]; nothing
//! is re-measured and nothing is invented (a figure that was not measured stays `None`).

use std::time::Duration;

use super::Plan;
use super::run::{Env, PolicyArg};
use crate::accounting::{FrameAccounting, FrameCounts};
use crate::fleet::FleetSnapshot;
use crate::ingress::{Design, IngressStats};
use crate::producers::{self, ProducerSnapshot};
use crate::report::{
    ConsumerReport, CpuReport, FaultReport, IngressReport, LlmReport, ProducerReport, RunReport,
};
use crate::sample::SeriesSummary;
use weir_protocol::WireName;

/// Everything one run measured, at its end.
pub(super) struct Measured<'a> {
    pub env: &'a Env,
    pub plan: &'a Plan,
    pub streams: usize,
    pub design: Design,
    /// From the producers' start to the final snapshots.
    pub wall: Duration,
    pub series: SeriesSummary,
    /// The ingress's last `/v1/stats`.
    pub final_stats: IngressStats,
    pub fleet: FleetSnapshot,
    pub producers: ProducerSnapshot,
    pub llm: LlmReport,
    /// CPU used during the sending phase (set-up and drain excluded).
    pub cpu: CpuReport,
}

/// The run's report; `notes` are what the run itself noted, in order, before the notes
/// on the figures.
pub(super) fn report(m: Measured<'_>, mut notes: Vec<String>) -> RunReport {
    let frames = frame_accounting(&m);
    notes.extend(frames.notes());
    let limit_per_stream = m
        .final_stats
        .pending_bytes_limit_per_stream
        .filter(|l| *l > 0 && m.design == Design::Bounded);
    let pending_bytes_max = m.series.pending_bytes_max.max(m.final_stats.pending_bytes);
    let window_limit_max =
        m.series
            .window_limit_bytes_max
            .or(m.final_stats.window.as_ref().map(|w| w.limit_bytes));
    if let Some(note) = pending_over_limit_note(
        pending_bytes_max,
        limit_per_stream.map(|l| l * m.streams as u64),
        window_limit_max,
        m.env.reconnect,
    ) {
        notes.push(note);
    }
    if m.design == Design::Bounded && m.env.policy == PolicyArg::Shadow {
        notes.push(
            "shadow mode: the budget is measured, not enforced (only its safety ceiling is)".into(),
        );
    }
    if m.series.failed_polls > 0 {
        notes.push(format!(
            "{} of {} stats polls failed or timed out (the ingress did not answer within {:?})",
            m.series.failed_polls,
            m.series.samples,
            crate::ingress::STATS_TIMEOUT
        ));
    }
    let nominal = producers::nominal_frames(m.streams, m.plan.duration);
    let other_cores = m.cpu.other_cores();
    if other_cores > 0.25 {
        notes.push(format!(
            "other processes used {other_cores:.2} cores on average during this run: the machine was not quiet"
        ));
    }
    if m.producers.ticks_missed > nominal / 50 {
        notes.push(format!(
            "the load generator missed {} of {} frame ticks (it shares the CPU with everything else)",
            m.producers.ticks_missed, nominal
        ));
    }
    RunReport {
        scenario: m.plan.scenario.as_str().to_owned(),
        streams: m.streams,
        design: m.design,
        transport: m.env.transport,
        duration_s: m.plan.duration.as_secs_f64(),
        wall_s: m.wall.as_secs_f64(),
        fault: m.plan.fault.map(|f| FaultReport {
            kind: f.kind.as_str().to_owned(),
            at_s: f.at.as_secs_f64(),
            duration_s: f.length.as_secs_f64(),
        }),
        ingress: ingress_report(&m, limit_per_stream, pending_bytes_max),
        frames,
        consumer: ConsumerReport {
            fleet: m.fleet,
            latency_window_p99_max_ms: m.series.latency_window_p99_max_ms,
        },
        producers: ProducerReport {
            nominal_frames: nominal,
            counters: m.producers,
        },
        llm: m.llm,
        cpu: m.cpu,
        notes,
        ..RunReport::default()
    }
}

/// Every frame's fate, from the producers' count through the ingress to the fleet.
fn frame_accounting(m: &Measured<'_>) -> FrameAccounting {
    FrameAccounting::from_counts(&FrameCounts {
        sent_by_producers: m.producers.frames_sent,
        offered: m.final_stats.frames.offered,
        handed_over: m.final_stats.frames.handed_over,
        published: m.final_stats.frames.published,
        possibly_lost: m.final_stats.frames.possibly_lost,
        unconfirmed_at_end: m.final_stats.frames.unconfirmed,
        consumer_possibly_lost: Some(m.fleet.possibly_lost_frames),
        dropped: m
            .final_stats
            .frames
            .dropped
            .clone()
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .collect(),
        pending_at_end: m.final_stats.pending_frames,
        // Fresh and stale: the staleness guard's frames were delivered, then dropped.
        received: m.fleet.frames_received,
        stale_at_consumer: m.fleet.stale_frames,
        handed_to_handler: m.fleet.frames_handled,
        // Everything the consumers saw missing, counted and not declared, including the
        // frames of streams refused over their cap.
        consumer_detected_holes: m.fleet.lost_frames + m.fleet.frames_refused,
        refused_out_of_order: m.fleet.out_of_order_refused,
        declared_in_gaps: m.fleet.gap_frames,
    })
    .with_timeliness(m.fleet.timeliness)
}

/// The ingress section: series maxima and the final snapshot.
fn ingress_report(
    m: &Measured<'_>,
    limit_per_stream: Option<u64>,
    pending_bytes_max: u64,
) -> IngressReport {
    IngressReport {
        rss_peak_bytes: m.series.rss_peak_bytes,
        rss_start_bytes: m.series.rss_start_bytes,
        rss_end_bytes: m.series.rss_end_bytes,
        rss_before_fault_bytes: m.plan.fault.map(|_| m.series.rss_before_fault_bytes),
        pending_bytes_max,
        pending_bytes_limit: limit_per_stream.map(|l| l * m.streams as u64),
        pending_bytes_limit_per_stream: limit_per_stream,
        pending_frames_max: m.series.pending_frames_max,
        queue_wait_ms: m.final_stats.queue_wait_ms,
        oldest_frame_age_ms_max: m.series.oldest_frame_age_ms_max,
        admission_rejects: m.final_stats.admission_rejects,
        overloads: m.final_stats.overloads,
        gaps: m.final_stats.gaps,
        would_reject: m.final_stats.frames.would_reject,
        tasks_max: m.series.tasks_max.max(m.final_stats.tasks_alive),
        cpu_seconds: m.cpu.ingress_s,
        samples: m.series.samples,
        failed_polls: m.series.failed_polls,
        nats_disconnected_samples: m.series.nats_disconnected_samples,
        unconfirmed_bytes_max: m.series.unconfirmed_bytes_max,
        window_limit_bytes: m.final_stats.window.as_ref().map(|w| w.limit_bytes),
        window_limit_bytes_max: m.series.window_limit_bytes_max,
        window_mode: m.final_stats.window.as_ref().and_then(|w| w.mode.clone()),
        confirm_round_ms: m.final_stats.window.as_ref().map(|w| w.round_ms),
        window_disconnects: m.final_stats.window.as_ref().map(|w| w.disconnects),
    }
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
}
