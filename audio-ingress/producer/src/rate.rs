//! The per-stream rate bound in audio time: a token bucket counted in samples. It
//! refills at `max_rate` × real time (16,000 samples per second × `max_rate`, default
//! 1.5) and holds [`burst_samples`]: the byte budget in samples plus [`CATCH_UP`] of
//! audio, so a real-time producer that stalled may flush its backlog at once. A frame
//! the bucket has no tokens for is *over rate*, and the queue ([`crate::queue`])
//! applies its policy (`close`: overload, reason `rate`; `gap`: a marker, reason
//! `rate`). Why these numbers: docs/audio-ingress.md, "Rate in audio time".
//!
//! Pure and synchronous: every call takes `now`, nothing sleeps; unit-tested with a
//! paused clock. Integer arithmetic in milli-samples, so no rounding drifts with time.
//!
//! Invariants: tokens never exceed the burst; a frame either takes all its samples or
//! nothing (a frame refused for another reason, e.g. a full queue that `push` retries,
//! costs no tokens: the queue checks with [`RateBucket::has`] and takes on admission);
//! the bucket starts full at the first frame; a real-time producer (which drains 1×
//! while the bucket refills at `max_rate` ≥ 1×) finds it full again whenever it stalls,
//! so a stall of up to [`CATCH_UP`] followed by its backlog is never over rate, while
//! a producer sustained above `max_rate` is, once the burst is spent.

use std::time::Duration;

use tokio::time::Instant;

use weir_protocol::audio::SAMPLE_RATE;

/// The network stall a producer may catch up from at once: the burst holds this much
/// audio on top of the byte budget.
pub const CATCH_UP: Duration = Duration::from_secs(2);

/// The bucket's burst for a stream whose (enforced) byte budget is `max_bytes`: the
/// budget in samples plus [`CATCH_UP`] of audio (40,000 samples, 2.5 s, by default).
pub fn burst_samples(max_bytes: u64) -> u64 {
    max_bytes / 2 + u64::from(SAMPLE_RATE) * CATCH_UP.as_secs()
}

/// Milli-samples per sample (the bucket's unit).
const MILLI: u128 = 1000;

/// A token bucket in samples (milli-samples inside).
#[derive(Debug, Clone)]
pub struct RateBucket {
    /// Refill, milli-samples per second: `SAMPLE_RATE × max_rate_permille`.
    refill_per_s: u128,
    /// Capacity, milli-samples.
    burst: u128,
    /// Tokens now, milli-samples.
    tokens: u128,
    /// The rate, thousandths of real time.
    permille: u32,
    /// When `tokens` was last brought up to date; `None` before the first frame.
    last: Option<Instant>,
}

impl RateBucket {
    /// A bucket for `max_rate_permille` / 1000 × real time (1,500 = 1.5×) with a burst
    /// of `burst_samples`; `None` when the rate is 0 (no bound).
    pub fn new(max_rate_permille: u32, burst_samples: u64) -> Option<Self> {
        if max_rate_permille == 0 {
            return None;
        }
        let burst = u128::from(burst_samples.max(1)) * MILLI;
        Some(Self {
            refill_per_s: u128::from(SAMPLE_RATE) * u128::from(max_rate_permille),
            burst,
            tokens: burst,
            permille: max_rate_permille,
            last: None,
        })
    }

    /// Takes `samples` if the bucket holds them (then `true`); otherwise takes nothing
    /// and returns `false`.
    pub fn try_take(&mut self, samples: u64, now: Instant) -> bool {
        if !self.has(samples, now) {
            return false;
        }
        self.take(samples);
        true
    }

    /// Whether the bucket holds `samples` now (takes nothing).
    pub fn has(&mut self, samples: u64, now: Instant) -> bool {
        self.refill(now);
        u128::from(samples) * MILLI <= self.tokens
    }

    /// Takes `samples` (after [`Self::has`] said yes; saturates at 0 otherwise).
    pub fn take(&mut self, samples: u64) {
        self.tokens = self.tokens.saturating_sub(u128::from(samples) * MILLI);
    }

    /// The rate, in thousandths of real time.
    pub fn permille(&self) -> u32 {
        self.permille
    }

    /// Samples available now.
    pub fn available(&mut self, now: Instant) -> u64 {
        self.refill(now);
        u64::try_from(self.tokens / MILLI).unwrap_or(u64::MAX)
    }

    fn refill(&mut self, now: Instant) {
        let Some(last) = self.last else {
            self.last = Some(now);
            return;
        };
        let elapsed_ns = now.saturating_duration_since(last).as_nanos();
        if elapsed_ns == 0 {
            return;
        }
        let add = elapsed_ns.saturating_mul(self.refill_per_s) / 1_000_000_000;
        if add == 0 {
            // Less than one milli-sample: keep `last` so that the time is not lost.
            return;
        }
        self.tokens = self.tokens.saturating_add(add).min(self.burst);
        self.last = Some(now);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const FRAME: u64 = 320; // 20 ms

    #[test]
    fn zero_means_no_bound() {
        assert!(RateBucket::new(0, 8000).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn real_time_never_runs_dry_and_the_burst_is_the_budget() {
        let mut b = RateBucket::new(1500, 8000).expect("bucket");
        // 60 s of real-time audio, one 20 ms frame every 20 ms: always admitted.
        for _ in 0..3000 {
            assert!(b.try_take(FRAME, Instant::now()));
            tokio::time::advance(Duration::from_millis(20)).await;
        }
        // Full again (refills 1.5x, consumed 1x): the burst is exactly 8,000 samples.
        assert_eq!(b.available(Instant::now()), 8000);
        let now = Instant::now();
        for _ in 0..25 {
            assert!(b.try_take(FRAME, now), "25 frames = one budget at once");
        }
        assert!(!b.try_take(FRAME, now), "the 26th has no tokens");
        assert_eq!(b.available(now), 0, "a refused frame takes nothing");
    }

    #[tokio::test(start_paused = true)]
    async fn sustained_rate_is_max_rate_times_real_time() {
        let mut b = RateBucket::new(1500, 8000).expect("bucket");
        let start = Instant::now();
        // Offer as fast as possible (a frame every 1 ms) for 10 s; count admitted.
        let mut admitted = 0u64;
        while start.elapsed() < Duration::from_secs(10) {
            if b.try_take(FRAME, Instant::now()) {
                admitted += FRAME;
            }
            tokio::time::advance(Duration::from_millis(1)).await;
        }
        // 10 s × 16,000 × 1.5 + the initial burst, within one frame.
        let expected = 10 * 16_000 * 3 / 2 + 8000;
        assert!(
            admitted.abs_diff(expected) <= FRAME,
            "{admitted} vs {expected}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_hundred_times_real_time_runs_dry_within_a_few_ms() {
        let mut b = RateBucket::new(1500, 8000).expect("bucket");
        let start = Instant::now();
        // 100x: a 20 ms frame every 0.2 ms.
        let mut refused_at = None;
        for _ in 0..5000 {
            if !b.try_take(FRAME, Instant::now()) {
                refused_at = Some(start.elapsed());
                break;
            }
            tokio::time::advance(Duration::from_micros(200)).await;
        }
        let at = refused_at.expect("refused");
        assert!(at < Duration::from_millis(10), "{at:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn sub_milli_sample_steps_are_not_lost() {
        // 1.0x: 16 milli-samples per microsecond... step by 1 ns at a time would add
        // nothing per call, yet the time must count.
        let mut b = RateBucket::new(1000, 1).expect("bucket");
        assert!(b.try_take(1, Instant::now()));
        assert!(!b.try_take(1, Instant::now()));
        for _ in 0..100 {
            tokio::time::advance(Duration::from_nanos(1)).await;
            let _ = b.available(Instant::now());
        }
        tokio::time::advance(Duration::from_micros(63)).await;
        assert!(
            b.try_take(1, Instant::now()),
            "62.6 us of 16 kHz is one sample"
        );
    }
}
