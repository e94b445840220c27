//! Latency histograms and percentile summaries.
//!
//! Every latency in the load test is recorded in microseconds in an hdrhistogram with
//! 3 significant digits and reported in milliseconds. Values above the histogram's range
//! (one hour) are clamped, never refused, so a stuck frame still shows up as the maximum.
//! An empty histogram summarises to all zeros with `count == 0`: a reader must check the
//! count before reading a zero p99 as "fast".

use std::time::Duration;

use hdrhistogram::Histogram;

/// Highest trackable value, in microseconds (one hour).
const MAX_MICROS: u64 = 3_600_000_000;

/// A latency histogram in microseconds.
#[derive(Debug, Clone)]
pub struct LatencyHistogram {
    inner: Histogram<u64>,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self::new()
    }
}

impl LatencyHistogram {
    /// An empty histogram (1 µs .. 1 h, 3 significant digits).
    pub fn new() -> Self {
        // The bounds are constants that hdrhistogram accepts; fall back to an
        // auto-resizing histogram should a future version disagree.
        let inner = Histogram::new_with_bounds(1, MAX_MICROS, 3)
            .or_else(|_| Histogram::new(3))
            .unwrap_or_else(|_| unreachable_histogram());
        Self { inner }
    }

    /// Records one duration (clamped to the range).
    pub fn record(&mut self, d: Duration) {
        let micros = u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1);
        self.inner.saturating_record(micros);
    }

    /// Records a value already in milliseconds (negative values count as zero).
    pub fn record_ms(&mut self, ms: f64) {
        let micros = if ms.is_finite() && ms > 0.0 {
            (ms * 1000.0) as u64
        } else {
            1
        };
        self.inner.saturating_record(micros.max(1));
    }

    /// Adds every value of `other`.
    pub fn merge(&mut self, other: &LatencyHistogram) {
        // Same bounds on both sides, so `add` cannot fail; clamp defensively otherwise.
        if self.inner.add(&other.inner).is_err() {
            for v in other.inner.iter_recorded() {
                self.inner
                    .saturating_record(v.value_iterated_to().min(MAX_MICROS));
            }
        }
    }

    /// Forgets everything recorded.
    pub fn reset(&mut self) {
        self.inner.reset();
    }

    /// Number of values recorded.
    pub fn count(&self) -> u64 {
        self.inner.len()
    }

    /// p50/p95/p99/max in milliseconds.
    pub fn summary(&self) -> Percentiles {
        let h = &self.inner;
        if h.is_empty() {
            return Percentiles::default();
        }
        let ms = |us: u64| us as f64 / 1000.0;
        Percentiles {
            count: h.len(),
            p50: ms(h.value_at_quantile(0.50)),
            p95: ms(h.value_at_quantile(0.95)),
            p99: ms(h.value_at_quantile(0.99)),
            max: ms(h.max()),
            mean: h.mean() / 1000.0,
        }
    }
}

/// Records `d` in a shared histogram (nothing if its lock was poisoned).
pub fn record(h: &std::sync::Mutex<LatencyHistogram>, d: Duration) {
    if let Ok(mut h) = h.lock() {
        h.record(d);
    }
}

/// The summary of a shared histogram (empty if its lock was poisoned).
pub fn summary(h: &std::sync::Mutex<LatencyHistogram>) -> Percentiles {
    h.lock().map(|h| h.summary()).unwrap_or_default()
}

/// Never reached: `Histogram::new(3)` only fails for sigfig > 5.
fn unreachable_histogram() -> Histogram<u64> {
    Histogram::new_with_max(MAX_MICROS, 2).unwrap_or_else(|_| {
        // The crate documents this cannot fail for sigfig 2 and a max ≥ 2.
        Histogram::new(2).unwrap_or_else(|e| panic!("hdrhistogram refuses sigfig 2: {e}"))
    })
}

/// A latency summary in milliseconds: the services' own type (`weir_protocol::admin`).
pub use weir_protocol::admin::Percentiles;

/// The value at quantile `q` (0..=1) of `sorted` (ascending), nearest-rank; `None` when
/// empty. Used for summaries of sampled series (e.g. RSS over a run).
pub fn quantile_sorted(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let q = q.clamp(0.0, 1.0);
    let rank = (q * sorted.len() as f64).ceil() as usize;
    let idx = rank.saturating_sub(1).min(sorted.len() - 1);
    Some(sorted[idx])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_histogram_is_all_zero() {
        let h = LatencyHistogram::new();
        assert_eq!(h.summary(), Percentiles::default());
    }

    #[test]
    fn percentiles_of_a_uniform_run() {
        let mut h = LatencyHistogram::new();
        for ms in 1..=100u64 {
            h.record(Duration::from_millis(ms));
        }
        let s = h.summary();
        assert_eq!(s.count, 100);
        assert!((s.p50 - 50.0).abs() < 0.1, "{s:?}");
        assert!((s.p95 - 95.0).abs() < 0.1, "{s:?}");
        assert!((s.p99 - 99.0).abs() < 0.1, "{s:?}");
        assert!((s.max - 100.0).abs() < 0.1, "{s:?}");
    }

    #[test]
    fn huge_values_are_clamped_not_lost() {
        let mut h = LatencyHistogram::new();
        h.record(Duration::from_secs(10 * 3600));
        h.record_ms(-5.0);
        h.record_ms(f64::NAN);
        assert_eq!(h.count(), 3);
        assert!(h.summary().max >= 3_599_000.0);
    }

    #[test]
    fn merge_adds_counts() {
        let mut a = LatencyHistogram::new();
        let mut b = LatencyHistogram::new();
        a.record(Duration::from_millis(1));
        b.record(Duration::from_millis(30));
        a.merge(&b);
        assert_eq!(a.count(), 2);
        assert!((a.summary().max - 30.0).abs() < 0.1);
    }

    #[test]
    fn nearest_rank_quantiles() {
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(quantile_sorted(&v, 0.5), Some(2.0));
        assert_eq!(quantile_sorted(&v, 1.0), Some(4.0));
        assert_eq!(quantile_sorted(&v, 0.0), Some(1.0));
        assert_eq!(quantile_sorted(&[], 0.5), None);
    }
}
