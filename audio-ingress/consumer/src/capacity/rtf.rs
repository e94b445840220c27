//! The worker's real-time factor (handler busy time over audio time) as a decaying
//! p95.
//!
//! Invariants: [`RtfHistogram::record`] takes no lock and allocates nothing (one
//! logarithm and one atomic add); counts halve every [`HALF_LIFE`] (applied lazily by
//! the reader, [`RtfHistogram::decay_to`]), so the p95 follows the last ~10–30 s; the
//! p95 is the upper bound of its bucket (buckets are 2^¼ ≈ 19 % wide), never above
//! [`MAX_RTF`](weir_protocol::capacity::MAX_RTF), and 0 before any sample.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use weir_protocol::capacity::MAX_RTF;

/// Audio a stream hands its handler before one ratio is recorded: long enough that a
/// handler working in batches (nothing for 9 frames, all of it on the 10th) is
/// measured by its average, short enough to follow a change within seconds.
pub(crate) const WINDOW: Duration = Duration::from_secs(1);
/// Counts halve every this long.
pub(crate) const HALF_LIFE: Duration = Duration::from_secs(10);

/// Buckets per doubling.
const PER_OCTAVE: f64 = 4.0;
/// log2 of the lower edge of bucket 1 (2^-10 ≈ 0.001); bucket 0 holds everything below.
const LOW_LOG2: f64 = -10.0;
/// Bucket count: bucket 0 (below 2^-10), 80 buckets up to 2^10, one above.
const BUCKETS: usize = 82;
/// The weight of one sample (fixed point, so that halving keeps a fraction of it).
const ONE: u64 = 1 << 10;

/// Per-stream accumulation in the handler task (plain fields, no sharing).
#[derive(Debug, Default)]
pub(crate) struct StreamMeter {
    busy: Duration,
    audio: Duration,
}

impl StreamMeter {
    /// The handler took `busy` for a frame of `samples` at `sample_rate`; returns the
    /// ratio to record once [`WINDOW`] of audio is complete.
    pub(crate) fn frame(&mut self, busy: Duration, samples: u64, sample_rate: u32) -> Option<f64> {
        if sample_rate == 0 {
            return None;
        }
        self.busy += busy;
        self.audio +=
            Duration::from_micros(samples.saturating_mul(1_000_000) / u64::from(sample_rate));
        (self.audio >= WINDOW).then(|| self.take())
    }

    /// The ratio of what is accumulated, if at least a tenth of [`WINDOW`] (a stream's
    /// last partial window), and starts over.
    pub(crate) fn flush(&mut self) -> Option<f64> {
        (self.audio >= WINDOW / 10).then(|| self.take())
    }

    fn take(&mut self) -> f64 {
        let ratio = self.busy.as_secs_f64() / self.audio.as_secs_f64();
        *self = Self::default();
        ratio
    }
}

/// A decaying histogram of real-time factors, log-spaced.
#[derive(Debug)]
pub(crate) struct RtfHistogram {
    counts: [AtomicU64; BUCKETS],
    last_decay: Mutex<Instant>,
}

fn bucket(rtf: f64) -> usize {
    if rtf.is_nan() || rtf <= 0.0 {
        return 0;
    }
    let k = ((rtf.log2() - LOW_LOG2) * PER_OCTAVE).floor() + 1.0;
    // A float → integer cast saturates (+∞ too); the clamp keeps it in the array.
    (k.max(0.0) as usize).min(BUCKETS - 1)
}

/// The upper edge of bucket `k`.
fn upper(k: usize) -> f64 {
    2f64.powf(LOW_LOG2 + k as f64 / PER_OCTAVE)
}

impl RtfHistogram {
    /// Empty; decay counted from `now`.
    pub(crate) fn new(now: Instant) -> Self {
        Self {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            last_decay: Mutex::new(now),
        }
    }

    /// One ratio. Lock-free.
    pub(crate) fn record(&self, rtf: f64) {
        self.counts[bucket(rtf)].fetch_add(ONE, Ordering::Relaxed);
    }

    /// Halves every count once per whole [`HALF_LIFE`] since the last decay.
    pub(crate) fn decay_to(&self, now: Instant) {
        let mut last = weir_service::sync::locked(&self.last_decay);
        let elapsed = now.saturating_duration_since(*last);
        let halvings = (elapsed.as_nanos() / HALF_LIFE.as_nanos()).min(63) as u32;
        if halvings == 0 {
            return;
        }
        *last += HALF_LIFE * halvings;
        for c in &self.counts {
            // A record racing with this halving is kept whole or halved: both fine.
            let _ = c.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n >> halvings)
            });
        }
    }

    /// The 95th percentile (the upper edge of its bucket), 0 with no sample.
    pub(crate) fn p95(&self) -> f64 {
        let counts: Vec<u64> = self
            .counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return 0.0;
        }
        // The smallest bucket with at least 95 % of the weight at or below it.
        let target = total - total / 20;
        let mut seen = 0;
        for (k, n) in counts.iter().enumerate() {
            seen += n;
            if seen >= target {
                return match k {
                    0 => 0.0,
                    k => upper(k).min(MAX_RTF),
                };
            }
        }
        MAX_RTF
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_log_spaced_and_clamped() {
        assert_eq!(bucket(0.0), 0);
        assert_eq!(bucket(-1.0), 0);
        assert_eq!(bucket(f64::NAN), 0);
        assert_eq!(bucket(f64::INFINITY), BUCKETS - 1);
        assert_eq!(bucket(1e9), BUCKETS - 1);
        for rtf in [0.002, 0.05, 0.5, 0.99, 1.0, 1.5, 7.0, 900.0] {
            let k = bucket(rtf);
            assert!(upper(k - 1) <= rtf && rtf < upper(k), "{rtf} in bucket {k}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn p95_is_the_upper_edge_of_the_95th_percentile_bucket() {
        let h = RtfHistogram::new(Instant::now());
        assert_eq!(h.p95(), 0.0, "no sample");
        for _ in 0..94 {
            h.record(0.3);
        }
        for _ in 0..6 {
            h.record(1.2);
        }
        let p = h.p95();
        assert!((1.2..1.2 * 1.19 + 1e-9).contains(&p), "{p}");
        let h = RtfHistogram::new(Instant::now());
        for _ in 0..100 {
            h.record(0.3);
        }
        let p = h.p95();
        assert!((0.3..0.36).contains(&p), "{p}");
        h.record(1e6);
        assert!(h.p95() <= MAX_RTF);
    }

    #[tokio::test(start_paused = true)]
    async fn counts_halve_every_half_life_so_a_recovery_shows() {
        let h = RtfHistogram::new(Instant::now());
        for _ in 0..100 {
            h.record(2.0); // behind real time
        }
        assert!(h.p95() >= 2.0);
        tokio::time::advance(HALF_LIFE - Duration::from_millis(1)).await;
        h.decay_to(Instant::now());
        assert_eq!(
            h.counts[bucket(2.0)].load(Ordering::Relaxed),
            100 * ONE,
            "not yet"
        );
        tokio::time::advance(Duration::from_millis(1)).await;
        h.decay_to(Instant::now());
        assert_eq!(h.counts[bucket(2.0)].load(Ordering::Relaxed), 50 * ONE);
        // Recovered: after 30 s (three more halvings) the old samples weigh 6.25
        // against 150 new fast ones, under 5 %: the p95 is fast again.
        tokio::time::advance(HALF_LIFE * 3).await;
        h.decay_to(Instant::now());
        for _ in 0..150 {
            h.record(0.2);
        }
        assert!(h.p95() < 0.25, "{}", h.p95());
        // A long silence empties it.
        tokio::time::advance(HALF_LIFE * 64).await;
        h.decay_to(Instant::now());
        assert_eq!(h.p95(), 0.0);
    }

    #[test]
    fn a_stream_meter_records_once_per_window_of_audio() {
        let mut m = StreamMeter::default();
        // 20 ms frames at 16 kHz, 10 ms of work each: rtf 0.5.
        for i in 1..=50 {
            let r = m.frame(Duration::from_millis(10), 320, 16_000);
            assert_eq!(r.is_some(), i == 50, "frame {i}");
            if let Some(r) = r {
                assert!((r - 0.5).abs() < 1e-9, "{r}");
            }
        }
        assert_eq!(m.flush(), None, "nothing left");
        for _ in 0..5 {
            m.frame(Duration::from_millis(40), 320, 16_000);
        }
        let r = m.flush().expect("100 ms: a partial window is recorded");
        assert!((r - 2.0).abs() < 1e-9, "{r}");
        assert_eq!(m.frame(Duration::from_millis(1), 320, 0), None, "no rate");
    }
}
