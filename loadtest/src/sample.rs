//! Time series captured every 100 ms during a run, and their summary.
//!
//! One [`Sample`] per tick: what the ingress reported on `/v1/stats`, its RSS from
//! `/proc`, what the producers and the fleet counted, and whether a fault was active. A poll that failed or timed out leaves the ingress fields `None` — it is
//! never replaced by zeros, so a stuck ingress shows up as a hole in the series, not as
//! "nothing pending".

use serde::Serialize;

use crate::ingress::IngressStats;
use crate::stats::Percentiles;

/// Sampling period.
pub const PERIOD: std::time::Duration = std::time::Duration::from_millis(100);
/// `/v1/streams` (every stream of the ingress) is read once per this many samples
/// (1 s): rendering it at every sample cost the ingress ~0.3–0.45 µs per frame at 1,000
/// streams (`steady --design bounded`), which the run's CPU-per-frame figure counts.
pub const STREAMS_EVERY: usize = 10;

/// The ingress part of a sample.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct IngressSample {
    /// PCM bytes held, not yet handed to NATS.
    pub pending_bytes: u64,
    /// Frames held.
    pub pending_frames: u64,
    /// Age of the oldest frame held, ms.
    pub oldest_frame_age_ms: f64,
    /// Tokio tasks alive.
    pub tasks_alive: u64,
    /// NATS connection up.
    pub nats_connected: bool,
    /// Bytes handed to the NATS client and not yet confirmed by the server (`None` on an
    /// ingress without the server-confirmed window).
    pub unconfirmed_bytes: Option<u64>,
    /// The window's current bound, bytes (`None` without the window).
    pub window_limit_bytes: Option<u64>,
    /// Age of the oldest frame weir still holds for *live* stream instances (open or
    /// draining: queued, or handed to NATS and not yet confirmed), ms, from
    /// `/v1/streams` (`None`: not polled, e.g. the naive ingress).
    pub oldest_live_ms: Option<f64>,
    /// Age of the oldest frame of *ended* instances (overloaded or failed, their `end`
    /// next) that still sits unconfirmed in the NATS client, ms (`None`: not polled).
    pub oldest_ended_ms: Option<f64>,
}

/// The oldest pending frame of live and of ended stream instances, ms, from the
/// ingress's `/v1/streams` (`state` and `oldest_frame_age_ms` of each): live = `open`
/// or `draining`, ended = `ending` or `ended`. 0 when none holds a frame.
pub fn oldest_by_liveness(streams: &[serde_json::Value]) -> (f64, f64) {
    let (mut live, mut ended) = (0.0f64, 0.0f64);
    for s in streams {
        let age = s["oldest_frame_age_ms"].as_f64().unwrap_or(0.0);
        match s["state"].as_str() {
            Some("open" | "draining") => live = live.max(age),
            Some(_) => ended = ended.max(age),
            None => {}
        }
    }
    (live, ended)
}

impl From<&IngressStats> for IngressSample {
    fn from(s: &IngressStats) -> Self {
        Self {
            pending_bytes: s.pending_bytes,
            pending_frames: s.pending_frames,
            oldest_frame_age_ms: s.oldest_frame_age_ms,
            tasks_alive: s.tasks_alive,
            nats_connected: s.nats_connected,
            unconfirmed_bytes: s.window.as_ref().map(|w| w.unconfirmed_bytes),
            window_limit_bytes: s.window.as_ref().map(|w| w.limit_bytes),
            oldest_live_ms: None,
            oldest_ended_ms: None,
        }
    }
}

/// One capture.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Sample {
    /// Seconds since the producers started.
    pub t_s: f64,
    /// The ingress's own view (`None` when the poll failed).
    pub ingress: Option<IngressSample>,
    /// Ingress RSS in bytes.
    pub rss_bytes: Option<u64>,
    /// Frames written by producers so far.
    pub frames_sent: u64,
    /// Frames received by the fleet so far.
    pub frames_received: u64,
    /// End-to-end latency of the frames received in this window.
    pub latency_window_ms: Percentiles,
    /// LLM requests in flight in the front (queued + running), when the LLM side runs.
    pub llm_in_flight: Option<u64>,
    /// Whether the scenario's fault was active.
    pub fault_active: bool,
}

/// Maxima and end values over a series.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SeriesSummary {
    /// Samples taken.
    pub samples: usize,
    /// Samples whose stats poll failed.
    pub failed_polls: usize,
    /// Largest pending bytes.
    pub pending_bytes_max: u64,
    /// Largest pending frames.
    pub pending_frames_max: u64,
    /// Largest oldest-frame age, ms.
    pub oldest_frame_age_ms_max: f64,
    /// Largest task count.
    pub tasks_max: u64,
    /// Largest RSS.
    pub rss_peak_bytes: u64,
    /// First RSS seen.
    pub rss_start_bytes: u64,
    /// Last RSS seen.
    pub rss_end_bytes: u64,
    /// RSS just before the fault started (0 when no fault).
    pub rss_before_fault_bytes: u64,
    /// Largest end-to-end latency p99 of any window, ms.
    pub latency_window_p99_max_ms: f64,
    /// Samples during which NATS was reported disconnected.
    pub nats_disconnected_samples: usize,
    /// Largest unconfirmed window, bytes (`None` when no sample reported a window).
    pub unconfirmed_bytes_max: Option<u64>,
    /// Largest bound of the window seen, bytes (`None` when no sample reported a window).
    pub window_limit_bytes_max: Option<u64>,
}

/// Summarises a series (pure).
pub fn summarise(samples: &[Sample]) -> SeriesSummary {
    let mut s = SeriesSummary {
        samples: samples.len(),
        ..Default::default()
    };
    let mut fault_seen = false;
    for x in samples {
        match &x.ingress {
            Some(i) => {
                s.pending_bytes_max = s.pending_bytes_max.max(i.pending_bytes);
                s.pending_frames_max = s.pending_frames_max.max(i.pending_frames);
                s.oldest_frame_age_ms_max = s.oldest_frame_age_ms_max.max(i.oldest_frame_age_ms);
                s.tasks_max = s.tasks_max.max(i.tasks_alive);
                // `None` < `Some`: the maxima stay `None` only when no sample had a window.
                s.unconfirmed_bytes_max = s.unconfirmed_bytes_max.max(i.unconfirmed_bytes);
                s.window_limit_bytes_max = s.window_limit_bytes_max.max(i.window_limit_bytes);
                if !i.nats_connected {
                    s.nats_disconnected_samples += 1;
                }
            }
            None => s.failed_polls += 1,
        }
        if let Some(rss) = x.rss_bytes {
            if s.rss_start_bytes == 0 {
                s.rss_start_bytes = rss;
            }
            s.rss_end_bytes = rss;
            s.rss_peak_bytes = s.rss_peak_bytes.max(rss);
            fault_seen |= x.fault_active;
            if !fault_seen {
                s.rss_before_fault_bytes = rss;
            }
        }
        s.latency_window_p99_max_ms = s.latency_window_p99_max_ms.max(x.latency_window_ms.p99);
    }
    if !fault_seen {
        s.rss_before_fault_bytes = 0;
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(t: f64, pending: u64, rss: u64, fault: bool) -> Sample {
        Sample {
            t_s: t,
            ingress: Some(IngressSample {
                pending_bytes: pending,
                tasks_alive: pending / 640,
                nats_connected: true,
                ..Default::default()
            }),
            rss_bytes: Some(rss),
            fault_active: fault,
            ..Default::default()
        }
    }

    #[test]
    fn maxima_and_fault_split() {
        let series = vec![
            sample(0.1, 0, 10, false),
            sample(0.2, 640, 12, false),
            sample(0.3, 6400, 30, true),
            sample(0.4, 0, 20, false),
            Sample::default(),
        ];
        let s = summarise(&series);
        assert_eq!(s.samples, 5);
        assert_eq!(s.failed_polls, 1);
        assert_eq!(s.pending_bytes_max, 6400);
        assert_eq!(s.tasks_max, 10);
        assert_eq!(s.rss_start_bytes, 10);
        assert_eq!(s.rss_end_bytes, 20);
        assert_eq!(s.rss_peak_bytes, 30);
        assert_eq!(s.rss_before_fault_bytes, 12);
        assert_eq!(s.unconfirmed_bytes_max, None, "no window reported");
    }

    #[test]
    fn unconfirmed_window_maximum() {
        let mut a = sample(0.1, 0, 10, false);
        let mut b = sample(0.2, 0, 10, false);
        if let (Some(x), Some(y)) = (a.ingress.as_mut(), b.ingress.as_mut()) {
            x.unconfirmed_bytes = Some(6400);
            y.unconfirmed_bytes = Some(1280);
            x.window_limit_bytes = Some(16_000);
            y.window_limit_bytes = Some(32_000);
        }
        let s = summarise(&[a, b, sample(0.3, 0, 10, false)]);
        assert_eq!(s.unconfirmed_bytes_max, Some(6400));
        assert_eq!(s.window_limit_bytes_max, Some(32_000));
    }

    #[test]
    fn no_fault_means_no_before_figure() {
        let s = summarise(&[sample(0.1, 0, 10, false)]);
        assert_eq!(s.rss_before_fault_bytes, 0);
    }
}
