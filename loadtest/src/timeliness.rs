//! Timeliness of delivered audio: how old each frame was when the recognition fleet got
//! it, measured against the capture time the ingress put on the frame.
//!
//! Two figures per run:
//! - `delivered_late`: frames delivered to a recognition handler that the consumer had
//!   *received* (NATS message in, before its own queue: `Frame::received_at`) more than
//!   [`late_after`] after capture, that is more than the ingress's `max_age` plus one
//!   confirmation round ([`CONFIRMATION_ROUND_BUDGET`]). With the bound holding end to
//!   end this is 0 for the bounded design at any size. Frames the consumer core drops
//!   itself (its own bound, declared to the handler as a gap) never reach a handler and
//!   are counted by the consumer core, not here;
//! - `e2e_latency_ms`: capture → handed to the recognition handler, p50/p95/p99/max, of
//!   every frame the handler got (frames the consumer dropped never reach it and are
//!   counted elsewhere).
//!
//! The capture time is the one the consumer core exposes (`Frame::captured_at_ms`: the
//! packet meta key `captured_at_ms`, falling back to the `Weir-Captured-At-Ms` header).
//! Frames without one (the naive design's, or a consumer core that does not read the
//! meta key yet) are counted as `delivered_untimed`, never guessed.
//!
//! Clocks: capture time is Unix milliseconds written by the ingress on the same machine;
//! the receive and hand-over times are Unix microseconds taken here. A capture time in
//! the future (clock step) counts as zero latency.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::stats::{LatencyHistogram, Percentiles};

/// One confirmation round's allowance on top of the ingress's `max_age`: a frame may
/// legitimately be that much older than `max_age` when it reaches a consumer (it can
/// wait `max_age` in the ingress, then one marker round trip to be confirmed).
pub const CONFIRMATION_ROUND_BUDGET: Duration = Duration::from_millis(200);

/// The ingress's default `max_age` (`max_age_ms` = 500): the budget used when the run
/// does not override it.
pub const DEFAULT_MAX_AGE: Duration = Duration::from_millis(500);

/// A frame received later than this after capture is late: `max_age` + one
/// confirmation round.
pub fn late_after(max_age: Duration) -> Duration {
    max_age + CONFIRMATION_ROUND_BUDGET
}

/// Milliseconds since the Unix epoch on this host (every process of a run shares the
/// clock: they all run on this machine), as the consumer core reads it.
pub use weir_service::clock::unix_ms_now as unix_ms;

/// Unix time in microseconds.
pub fn unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Age of a frame at `at_unix_us`, given its capture time in Unix ms (zero when the
/// capture time lies in the future).
pub fn age(captured_at_ms: u64, at_unix_us: u64) -> Duration {
    Duration::from_micros(at_unix_us.saturating_sub(captured_at_ms.saturating_mul(1000)))
}

/// Whether a frame captured at `captured_at_ms` and received at `received_unix_us` is
/// late against `late_after` (strictly more than it).
pub fn is_late(captured_at_ms: u64, received_unix_us: u64, late_after: Duration) -> bool {
    age(captured_at_ms, received_unix_us) > late_after
}

/// Accumulates the timeliness of the frames handed to recognition handlers.
#[derive(Debug, Default)]
pub struct Timeliness {
    late_after: Duration,
    delivered_late: u64,
    untimed: u64,
    e2e: LatencyHistogram,
}

impl Timeliness {
    /// Empty, with the lateness threshold `late_after`.
    pub fn new(late_after: Duration) -> Self {
        Self {
            late_after,
            ..Self::default()
        }
    }

    /// Records one frame: its capture time (if any), when the consumer received it and
    /// when it was handed to the handler (both Unix µs).
    pub fn record(
        &mut self,
        captured_at_ms: Option<u64>,
        received_unix_us: u64,
        handed_unix_us: u64,
    ) {
        let Some(at) = captured_at_ms else {
            self.untimed += 1;
            return;
        };
        if is_late(at, received_unix_us, self.late_after) {
            self.delivered_late += 1;
        }
        self.e2e.record(age(at, handed_unix_us));
    }

    /// The summary for the report.
    pub fn summary(&self) -> TimelinessSummary {
        TimelinessSummary {
            late_after_ms: self.late_after.as_secs_f64() * 1000.0,
            delivered_late: self.delivered_late,
            delivered_untimed: self.untimed,
            e2e_latency_ms: self.e2e.percentiles(),
        }
    }
}

/// What [`Timeliness`] measured.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct TimelinessSummary {
    /// The lateness threshold: `max_age` + [`CONFIRMATION_ROUND_BUDGET`], ms.
    pub late_after_ms: f64,
    /// Frames received more than `late_after_ms` after capture.
    pub delivered_late: u64,
    /// Frames handed to a handler without a capture time (not timed).
    pub delivered_untimed: u64,
    /// Capture → handed to the recognition handler, timed frames only.
    pub e2e_latency_ms: Percentiles,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_threshold_is_max_age_plus_one_round() {
        assert_eq!(late_after(DEFAULT_MAX_AGE), Duration::from_millis(700));
        assert_eq!(
            late_after(Duration::from_millis(100)),
            Duration::from_millis(300)
        );
    }

    #[test]
    fn late_is_strictly_over_the_threshold() {
        let t = Duration::from_millis(700);
        let cap = 1_700_000_000_000u64;
        assert!(!is_late(cap, cap * 1000 + 700_000, t));
        assert!(is_late(cap, cap * 1000 + 700_001, t));
        // A capture time in the future is age zero, not late, not a panic.
        assert!(!is_late(cap + 10, cap * 1000, t));
        assert_eq!(age(cap + 10, cap * 1000), Duration::ZERO);
        assert_eq!(age(u64::MAX, 0), Duration::ZERO);
    }

    #[test]
    fn late_counts_at_receipt_latency_at_hand_over() {
        let mut t = Timeliness::new(Duration::from_millis(700));
        let cap = 1_700_000_000_000u64;
        let base = cap * 1000;
        // 100 frames received 10..=1000 ms after capture, handed over 5 ms later.
        for i in 1..=100u64 {
            let rx = base + i * 10_000;
            t.record(Some(cap), rx, rx + 5_000);
        }
        t.record(None, base, base);
        t.record(None, base, base);
        let s = t.summary();
        assert_eq!(s.late_after_ms, 700.0);
        // Received at 710, 720, ..., 1000 ms: 30 frames.
        assert_eq!(s.delivered_late, 30);
        assert_eq!(s.delivered_untimed, 2);
        assert_eq!(s.e2e_latency_ms.count, 100);
        assert!((s.e2e_latency_ms.p50 - 505.0).abs() < 1.0, "{s:?}");
        assert!((s.e2e_latency_ms.p99 - 995.0).abs() < 1.0, "{s:?}");
        assert!((s.e2e_latency_ms.max - 1005.0).abs() < 1.0, "{s:?}");
    }

    #[test]
    fn a_frame_late_at_receipt_is_late_even_if_handled_fast() {
        // Lateness is a property of delivery, not of the handler: the threshold is
        // checked at receipt.
        let mut t = Timeliness::new(Duration::from_millis(700));
        let cap = 1_000u64;
        t.record(Some(cap), cap * 1000 + 800_000, cap * 1000 + 800_000);
        t.record(Some(cap), cap * 1000 + 100_000, cap * 1000 + 900_000);
        let s = t.summary();
        assert_eq!(s.delivered_late, 1);
        assert_eq!(s.e2e_latency_ms.count, 2);
    }

    #[test]
    fn empty_is_all_zero() {
        let s = Timeliness::new(Duration::from_millis(700)).summary();
        assert_eq!(s.delivered_late, 0);
        assert_eq!(s.delivered_untimed, 0);
        assert_eq!(s.e2e_latency_ms, Percentiles::default());
    }
}
