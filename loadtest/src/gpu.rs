//! A recogniser modelled as GPU wall time, not host CPU: the `asr-shortfall` scenario's
//! recognition workers.
//!
//! A worker has `slots` S (streams it batches at once) and a real-time factor r (GPU
//! time per second of audio for one slot's worth of work). One 20 ms frame costs
//! `r × 20 ms / S` of GPU time on the worker's **serial timeline**: the frame starts at
//! `max(now, gpu_free_at)`, the timeline moves to `start + cost`, and the handler
//! sleeps until then. A worker therefore keeps up with `S / r` streams at real time
//! and falls behind beyond, the way a batching GPU does, without burning a cycle of
//! the host's CPU (which the load generator shares).
//!
//! Invariants: the timeline is only ever moved forward, under one lock, so the
//! throughput is exact whatever the timer's resolution (a sleep that wakes late does
//! not stretch the frames behind it: their start was reserved on the timeline, not on
//! the wall clock); the lag of a frame is its age when the GPU *starts* it (capture →
//! start), measured against the same `max_frame_age` the consumers use.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;
use weir_protocol::audio::FRAME_DURATION;

use crate::counters::Count;
use crate::stats::{LatencyHistogram, Percentiles};
use crate::timeliness::{age, unix_us};

/// Default slots per worker (`--asr-slots`).
pub const DEFAULT_SLOTS: u32 = 6;
/// Default real-time factor (`--asr-rtf`).
pub const DEFAULT_RTF: f64 = 0.8;
/// Allowed real-time factors.
pub const RTF_RANGE: std::ops::RangeInclusive<f64> = 0.01..=10.0;

/// The GPU model of one worker: slots and real-time factor.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct GpuModel {
    /// Streams the worker batches at once (what it announces as `max_streams`).
    pub slots: u32,
    /// GPU time per audio time, for one slot.
    pub rtf: f64,
}

impl GpuModel {
    /// GPU time one 20 ms frame costs on the worker's serial timeline.
    pub fn frame_cost(&self) -> Duration {
        FRAME_DURATION.mul_f64(self.rtf / f64::from(self.slots.max(1)))
    }

    /// Streams one worker keeps up with at real time (`slots / rtf`).
    pub fn streams_at_real_time(&self) -> f64 {
        f64::from(self.slots) / self.rtf
    }
}

/// One worker's serial GPU timeline.
#[derive(Debug)]
pub struct GpuTimeline {
    cost: Duration,
    free_at: Mutex<Option<Instant>>,
}

impl GpuTimeline {
    /// An idle timeline for `model`.
    pub fn new(model: GpuModel) -> Self {
        Self {
            cost: model.frame_cost(),
            free_at: Mutex::new(None),
        }
    }

    /// Reserves the next frame at `now`: returns its start, `max(now, free_at)`, and
    /// moves the timeline to `start + cost` (pure bookkeeping, no waiting).
    pub fn reserve(&self, now: Instant) -> Instant {
        let mut free_at = self.free_at.lock().unwrap_or_else(|e| e.into_inner());
        let start = free_at.map_or(now, |f| f.max(now));
        *free_at = Some(start + self.cost);
        start
    }

    /// Runs one frame: reserves it and sleeps until the GPU is done with it. Returns
    /// how long it waited for the GPU before its start.
    pub async fn run_frame(&self) -> Duration {
        let now = Instant::now();
        let start = self.reserve(now);
        tokio::time::sleep_until(start + self.cost).await;
        start - now
    }
}

/// What the recognisers of one design measured (shared by its workers' handlers).
#[derive(Debug, Default)]
pub struct AsrMeter {
    max_frame_age: Duration,
    lag: LatencyHistogram,
    lag_window: Mutex<LatencyHistogram>,
    handed: AtomicU64,
    within: AtomicU64,
    untimed: AtomicU64,
}

/// A copy of an [`AsrMeter`].
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct AsrCounts {
    /// Frames the GPU model started.
    pub handed: u64,
    /// Of those, frames started within `max_frame_age` of their capture.
    pub within_max_age: u64,
    /// Frames without a capture time (not judged).
    pub untimed: u64,
    /// Age of a frame when the GPU started it (capture → start).
    pub lag_ms: Percentiles,
}

impl AsrMeter {
    /// An empty meter judging frames against `max_frame_age`.
    pub fn new(max_frame_age: Duration) -> Self {
        Self {
            max_frame_age,
            ..Self::default()
        }
    }

    /// Runs one frame captured at `captured_at_ms` (Unix ms) on `gpu` and records its
    /// lag: its age now plus its wait for the GPU.
    pub async fn run_frame(&self, gpu: &GpuTimeline, captured_at_ms: Option<u64>) {
        let age_now = captured_at_ms.map(|c| age(c, unix_us()));
        let wait = gpu.run_frame().await;
        self.record(age_now.map(|a| a + wait));
    }

    /// Records one frame started by the GPU with this lag (`None`: untimed).
    pub fn record(&self, lag: Option<Duration>) {
        self.handed.inc();
        match lag {
            Some(lag) => {
                if lag <= self.max_frame_age {
                    self.within.inc();
                }
                self.lag.record(lag);
                if let Ok(w) = self.lag_window.lock() {
                    w.record(lag);
                }
            }
            None => {
                self.untimed.inc();
            }
        }
    }

    /// Frames started so far (cheap, for progress lines and drains).
    pub fn handed(&self) -> u64 {
        self.handed.load(Ordering::Relaxed)
    }

    /// The lag of the frames started since the previous call.
    pub fn take_window(&self) -> Percentiles {
        self.lag_window
            .lock()
            .map(|mut h| std::mem::take(&mut *h).percentiles())
            .unwrap_or_default()
    }

    /// A copy of the counts.
    pub fn counts(&self) -> AsrCounts {
        AsrCounts {
            handed: self.handed(),
            within_max_age: self.within.load(Ordering::Relaxed),
            untimed: self.untimed.load(Ordering::Relaxed),
            lag_ms: self.lag.percentiles(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MODEL: GpuModel = GpuModel { slots: 6, rtf: 0.8 };

    #[test]
    fn a_frame_costs_rtf_times_its_audio_over_the_slots() {
        let cost = MODEL.frame_cost().as_secs_f64() * 1e6;
        assert!(
            (cost - 20_000.0 * 0.8 / 6.0).abs() < 1.0,
            "0.8 × 20 ms / 6: {cost}"
        );
        assert!((MODEL.streams_at_real_time() - 7.5).abs() < 1e-9);
    }

    #[tokio::test(start_paused = true)]
    async fn the_timeline_is_serial_and_never_moves_back() {
        let gpu = GpuTimeline::new(MODEL);
        let t0 = Instant::now();
        let cost = MODEL.frame_cost();
        assert_eq!(gpu.reserve(t0), t0);
        assert_eq!(gpu.reserve(t0), t0 + cost, "the second waits for the first");
        // Idle later: starts at once.
        let later = t0 + Duration::from_secs(1);
        assert_eq!(gpu.reserve(later), later);
        // A reservation "in the past" still queues behind the timeline.
        assert_eq!(gpu.reserve(t0), later + cost);
    }

    /// `n` streams at 50 frames/s for `secs` on one worker: the lag of the last frame.
    async fn last_wait(n: u32, secs: u64) -> Duration {
        let gpu = std::sync::Arc::new(GpuTimeline::new(MODEL));
        let mut tasks = Vec::new();
        for s in 0..n {
            let gpu = gpu.clone();
            tasks.push(tokio::spawn(async move {
                let start = Instant::now() + Duration::from_micros(u64::from(s) * 997);
                let mut tick = tokio::time::interval_at(start, FRAME_DURATION);
                let mut lag = Duration::ZERO;
                for _ in 0..secs * 50 {
                    let due = tick.tick().await;
                    gpu.run_frame().await;
                    lag = (Instant::now() - due).saturating_sub(MODEL.frame_cost());
                }
                lag
            }));
        }
        let mut worst = Duration::ZERO;
        for t in tasks {
            worst = worst.max(t.await.unwrap_or_default());
        }
        worst
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_keeps_up_with_slots_over_rtf_streams_and_falls_behind_beyond() {
        // 6 streams (80 % busy): every frame done well within a frame of its tick.
        let under = last_wait(6, 10).await;
        assert!(under < Duration::from_millis(40), "{under:?}");
        // 10 streams (133 % of what it keeps up with): 10 s of their audio take
        // 10 × 50 × 10 × 2.67 ms = 13.3 s of GPU time, so the last frame starts about
        // 3.3 s after its capture.
        let over = last_wait(10, 10).await;
        assert!(
            over > Duration::from_millis(3_000) && over < Duration::from_millis(3_700),
            "{over:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_meter_judges_lag_against_max_frame_age() {
        let m = AsrMeter::new(Duration::from_secs(1));
        m.record(Some(Duration::from_millis(10)));
        m.record(Some(Duration::from_millis(1_500)));
        m.record(None);
        let c = m.counts();
        assert_eq!((c.handed, c.within_max_age, c.untimed), (3, 1, 1));
        assert_eq!(c.lag_ms.count, 2);
        assert!(c.lag_ms.max >= 1_499.0, "{:?}", c.lag_ms);
        assert_eq!(m.take_window().count, 2);
        assert_eq!(m.take_window().count, 0, "the window restarts");
    }
}
