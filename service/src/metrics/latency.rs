//! One latency primitive for both views of a duration: the JSON percentiles of
//! `/v1/stats` ([`Percentiles`]: count, p50, p95, p99, max, mean) and the Prometheus
//! histogram of `/metrics` ([`Series`]: the fixed `le` buckets dashboards and alert
//! rules use).
//!
//! A [`LatencyHistogram`] is a log-linear histogram of relaxed atomics over whole
//! microseconds, with three significant decimal digits: every value up to 1,000 µs has
//! its own bucket, and above that each decade `(10^k, 10^(k+1)]` is cut into 900 buckets
//! of width `10^(k-2)` (e.g. 20 ms falls in `(19.98, 20.00]` ms), up to one hour; longer
//! samples share one overflow bucket (reported as the largest sample seen). Recording is
//! lock-free and allocation-free: one atomic add for the bucket, one for the sum, one
//! `fetch_max` (fewer per batch, [`LatencyHistogram::record_us`]).
//!
//! Invariants a reader must not break:
//! - buckets are closed at the top, `(lower, upper]`, and a sample is rounded *up* to
//!   whole microseconds; so for any Prometheus bound that is a whole number of
//!   microseconds with at most three significant digits (every bound weir uses, checked
//!   by [`Series::is_exact`]), the sum of the buckets at or below it is exactly the count
//!   of samples `<= le`: rendering by summing gives what a fixed-bucket histogram gave;
//! - a percentile is the upper edge of the bucket holding the nearest-rank sample
//!   (clamped to the largest sample): never below the exact value and at most 1% (one
//!   bucket width) above it, and exact up to 1 ms;
//! - counts only grow; a read while samples are recorded may miss the samples in flight
//!   (the sum and the counts are separate atomics), a read of a quiet histogram is exact.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use weir_protocol::admin::Percentiles;

/// Values up to this many microseconds have a bucket of their own.
const EXACT_US: u64 = 1_000;
/// Buckets per decade above [`EXACT_US`] (three significant digits: 101..=1000).
const PER_DECADE: usize = 900;
/// The largest value with a bucket of its own precision: one hour.
pub const MAX_US: u64 = 3_600_000_000;
/// Index of the overflow bucket (samples above [`MAX_US`]).
const OVERFLOW: usize = in_range_index(MAX_US) + 1;
/// Number of buckets, the overflow one included (6,662: 53 KB of counters).
const N_BUCKETS: usize = OVERFLOW + 1;

/// The bucket of a value in microseconds (the overflow bucket above [`MAX_US`]).
const fn bucket_index(us: u64) -> usize {
    if us > MAX_US {
        OVERFLOW
    } else {
        in_range_index(us)
    }
}

/// The bucket of a value in microseconds, at most [`MAX_US`].
const fn in_range_index(us: u64) -> usize {
    if us <= EXACT_US {
        return us as usize;
    }
    // us in (10^k, 10^(k+1)] with k >= 3; the bucket width is 10^(k-2).
    let k = (us - 1).ilog10();
    let width = 10u64.pow(k - 2);
    let m = us.div_ceil(width); // 101..=1000
    EXACT_US as usize + 1 + (k as usize - 3) * PER_DECADE + (m as usize - 101)
}

/// The largest value (µs) of bucket `i` (`u64::MAX` for the overflow bucket).
const fn upper_edge(i: usize) -> u64 {
    if i <= EXACT_US as usize {
        return i as u64;
    }
    if i >= OVERFLOW {
        return u64::MAX;
    }
    let j = i - EXACT_US as usize - 1;
    let k = (j / PER_DECADE) as u32 + 3;
    let m = (j % PER_DECADE) as u64 + 101;
    m * 10u64.pow(k - 2)
}

/// A duration in whole microseconds, rounded up (so `<= le` is decided exactly for a
/// bound in whole microseconds).
fn micros_ceil(d: Duration) -> u64 {
    u64::try_from(d.as_nanos().div_ceil(1_000)).unwrap_or(u64::MAX)
}

/// How a [`LatencyHistogram`] appears in `/metrics`: name, one optional label, and the
/// `le` bounds in seconds (ascending).
#[derive(Debug, Clone, Copy)]
pub struct Series {
    /// The Prometheus name (`…_seconds`).
    pub name: &'static str,
    /// One `key="value"` label, e.g. `outcome="ok"`.
    pub label: Option<(&'static str, &'static str)>,
    /// Upper bounds in seconds, ascending.
    pub buckets: &'static [f64],
}

impl Series {
    /// True when every bound is an edge of the histogram's buckets (a whole number of
    /// microseconds with at most three significant digits, at most [`MAX_US`]): then the
    /// rendered `le` counts are exact. Each service checks its bounds in a unit test.
    pub fn is_exact(&self) -> bool {
        self.buckets.iter().all(|b| {
            let us = (b * 1e6).round();
            (us - b * 1e6).abs() < 1e-6
                && us >= 0.0
                && us <= MAX_US as f64
                && upper_edge(bucket_index(us as u64)) == us as u64
        })
    }

    /// Appends the HELP and TYPE lines of the family `name`.
    pub fn render_header(name: &str, help: &str, out: &mut String) {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} histogram");
    }
}

/// A log-linear histogram of durations (see the module docs): percentiles for JSON,
/// fixed buckets for Prometheus, from the same counts.
pub struct LatencyHistogram {
    /// One count per bucket ([`N_BUCKETS`]).
    counts: Box<[AtomicU64]>,
    /// Sum of the samples in nanoseconds (saturating at `u64::MAX`: 584 years).
    sum_ns: AtomicU64,
    /// Largest sample, microseconds (rounded up).
    max_us: AtomicU64,
}

impl std::fmt::Debug for LatencyHistogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LatencyHistogram")
            .field("count", &self.count())
            .field("max_us", &self.max_us.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self::new()
    }
}

impl LatencyHistogram {
    /// An empty histogram.
    pub fn new() -> Self {
        Self {
            counts: (0..N_BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            sum_ns: AtomicU64::new(0),
            max_us: AtomicU64::new(0),
        }
    }

    /// Records one duration.
    pub fn record(&self, d: Duration) {
        let us = micros_ceil(d);
        if let Some(c) = self.counts.get(bucket_index(us)) {
            c.fetch_add(1, Ordering::Relaxed);
        }
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
        self.max_us.fetch_max(us, Ordering::Relaxed);
    }

    /// Records a batch of durations given in whole microseconds: one atomic add per
    /// distinct bucket the batch touches, one for the sum and one `fetch_max`.
    pub fn record_us(&self, samples_us: &[u64]) {
        const CHUNK: usize = 64;
        let mut sum_ns = 0u64;
        let mut max = 0u64;
        for chunk in samples_us.chunks(CHUNK) {
            let mut idx = [0u16; CHUNK];
            for (slot, &us) in idx.iter_mut().zip(chunk) {
                // N_BUCKETS < u16::MAX, so the index fits.
                *slot = bucket_index(us) as u16;
                sum_ns = sum_ns.saturating_add(us.saturating_mul(1_000));
                max = max.max(us);
            }
            let idx = &mut idx[..chunk.len()];
            idx.sort_unstable();
            let mut run = 0u64;
            for (n, i) in idx.iter().enumerate() {
                run += 1;
                if idx.get(n + 1) != Some(i) {
                    if let Some(c) = self.counts.get(usize::from(*i)) {
                        c.fetch_add(run, Ordering::Relaxed);
                    }
                    run = 0;
                }
            }
        }
        if !samples_us.is_empty() {
            self.sum_ns.fetch_add(sum_ns, Ordering::Relaxed);
            self.max_us.fetch_max(max, Ordering::Relaxed);
        }
    }

    /// Samples recorded so far.
    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    /// The sum of the samples.
    pub fn sum(&self) -> Duration {
        Duration::from_nanos(self.sum_ns.load(Ordering::Relaxed))
    }

    /// The `/v1/stats` summary, in milliseconds (all zero when empty).
    pub fn percentiles(&self) -> Percentiles {
        Self::merged_percentiles(std::slice::from_ref(self))
    }

    /// The summary of several histograms taken as one (e.g. a latency kept per outcome
    /// for Prometheus and summarised over all outcomes for JSON).
    pub fn merged_percentiles(hists: &[LatencyHistogram]) -> Percentiles {
        let mut counts = vec![0u64; N_BUCKETS];
        let (mut sum_ns, mut max_us) = (0u64, 0u64);
        for h in hists {
            for (total, c) in counts.iter_mut().zip(h.counts.iter()) {
                *total += c.load(Ordering::Relaxed);
            }
            sum_ns = sum_ns.saturating_add(h.sum_ns.load(Ordering::Relaxed));
            max_us = max_us.max(h.max_us.load(Ordering::Relaxed));
        }
        let count: u64 = counts.iter().sum();
        if count == 0 {
            return Percentiles::default();
        }
        let ms = |us: u64| us as f64 / 1000.0;
        let at = |q: f64| -> f64 {
            // Nearest rank: the smallest value with at least q·count samples at or below.
            let rank = ((q * count as f64).ceil() as u64).clamp(1, count);
            let mut seen = 0u64;
            for (i, n) in counts.iter().enumerate() {
                seen += n;
                if seen >= rank {
                    return ms(upper_edge(i).min(max_us));
                }
            }
            ms(max_us)
        };
        Percentiles {
            count,
            p50: at(0.50),
            p95: at(0.95),
            p99: at(0.99),
            max: ms(max_us),
            mean: sum_ns as f64 / count as f64 / 1e6,
        }
    }

    /// Appends the `_bucket`, `_sum` and `_count` lines of `series` (no HELP/TYPE
    /// header): each `le` count is the sum of the buckets at or below the bound.
    pub fn render_samples(&self, series: &Series, out: &mut String) {
        let labels = |le: Option<&str>| -> String {
            let mut parts: Vec<String> = Vec::new();
            if let Some((k, v)) = series.label {
                parts.push(format!("{k}=\"{v}\""));
            }
            parts.extend(le.map(|le| format!("le=\"{le}\"")));
            if parts.is_empty() {
                String::new()
            } else {
                format!("{{{}}}", parts.join(","))
            }
        };
        let mut cumulative = 0u64;
        let mut next = 0usize;
        let bounds = series.buckets.iter().map(|b| (b.to_string(), Some(*b)));
        for (le, b) in bounds.chain([("+Inf".to_owned(), None)]) {
            // The buckets at or below the bound, in whole microseconds; a bound between
            // two edges counts the bucket that straddles it as above (only for bounds
            // `is_exact` refuses). `+Inf`: every bucket.
            let end = b.map_or(N_BUCKETS, |b| {
                let bound_us = (b * 1e6).round().clamp(0.0, MAX_US as f64) as u64;
                let i = bucket_index(bound_us);
                if upper_edge(i) > bound_us { i } else { i + 1 }
            });
            for c in self.counts.iter().take(end).skip(next) {
                cumulative += c.load(Ordering::Relaxed);
            }
            next = next.max(end);
            let _ = writeln!(
                out,
                "{}_bucket{} {cumulative}",
                series.name,
                labels(Some(&le))
            );
        }
        let sum = self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{}_sum{} {sum}", series.name, labels(None));
        let _ = writeln!(out, "{}_count{} {cumulative}", series.name, labels(None));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fixed-bucket histogram weir rendered before (the reference for "rendering is
    /// unchanged"): a sample lands in the first bucket whose bound it does not exceed.
    fn fixed_bucket_text(series: &Series, samples: &[Duration]) -> String {
        let mut counts = vec![0u64; series.buckets.len() + 1];
        let mut sum_ns = 0u64;
        for d in samples {
            let secs = d.as_secs_f64();
            let i = series
                .buckets
                .iter()
                .position(|b| secs <= *b)
                .unwrap_or(series.buckets.len());
            counts[i] += 1;
            sum_ns += d.as_nanos() as u64;
        }
        let label = |extra: Option<String>| -> String {
            let mut parts: Vec<String> = Vec::new();
            if let Some((k, v)) = series.label {
                parts.push(format!("{k}=\"{v}\""));
            }
            parts.extend(extra);
            if parts.is_empty() {
                String::new()
            } else {
                format!("{{{}}}", parts.join(","))
            }
        };
        let mut out = String::new();
        let mut cumulative = 0;
        for (i, c) in counts.iter().enumerate() {
            cumulative += c;
            let le = series
                .buckets
                .get(i)
                .map_or_else(|| "+Inf".to_owned(), |b| b.to_string());
            let _ = writeln!(
                out,
                "{}_bucket{} {cumulative}",
                series.name,
                label(Some(format!("le=\"{le}\"")))
            );
        }
        let _ = writeln!(
            out,
            "{}_sum{} {}",
            series.name,
            label(None),
            sum_ns as f64 / 1e9
        );
        let _ = writeln!(out, "{}_count{} {cumulative}", series.name, label(None));
        out
    }

    /// A deterministic spread of durations: every bound ±1 ns and ±1 µs, zero, the
    /// overflow, and pseudo-random values from 1 µs to 100 s on a log scale.
    fn samples_around(bounds: &[f64]) -> Vec<Duration> {
        let mut v = vec![Duration::ZERO, Duration::from_secs(7_200)];
        for b in bounds {
            let ns = (b * 1e9).round() as u64;
            for d in [ns - 1_000, ns - 1, ns, ns + 1, ns + 1_000] {
                v.push(Duration::from_nanos(d));
            }
        }
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..5_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let exp = (x % 8_000) as f64 / 1_000.0; // 10^0 .. 10^8 µs
            v.push(Duration::from_nanos(
                (10f64.powf(exp) * 1_000.0) as u64 + x % 1_000,
            ));
        }
        v
    }

    const INGRESS: &[f64] = &[0.001, 0.005, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0];
    const ADAPTER: &[f64] = &[
        0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    ];

    #[test]
    fn rendering_matches_the_fixed_bucket_histogram_for_the_buckets_in_use() {
        for (name, label, buckets) in [
            ("weir_ingress_queue_wait_seconds", None, INGRESS),
            (
                "weir_llm_inference_seconds",
                Some(("outcome", "ok")),
                ADAPTER,
            ),
        ] {
            let series = Series {
                name,
                label,
                buckets,
            };
            assert!(series.is_exact(), "{name}");
            let samples = samples_around(buckets);
            let h = LatencyHistogram::new();
            for d in &samples {
                h.record(*d);
            }
            let mut text = String::new();
            h.render_samples(&series, &mut text);
            assert_eq!(text, fixed_bucket_text(&series, &samples), "{name}");
        }
    }

    #[test]
    fn a_batch_lands_in_the_same_buckets_as_single_records() {
        let series = Series {
            name: "x_seconds",
            label: None,
            buckets: &[0.001, 0.02, 0.5],
        };
        let one = LatencyHistogram::new();
        let batch = LatencyHistogram::new();
        let mut us: Vec<u64> = vec![500, 1_000, 1_001, 20_000, 499_999, 2_000_000];
        us.extend((0..200).map(|i| 19_990 + i % 17));
        for u in &us {
            one.record(Duration::from_micros(*u));
        }
        batch.record_us(&us);
        let (mut a, mut b) = (String::new(), String::new());
        one.render_samples(&series, &mut a);
        batch.render_samples(&series, &mut b);
        assert_eq!(a, b);
        assert!(b.contains("x_seconds_bucket{le=\"0.001\"} 2"), "{b}");
        assert!(b.contains("x_seconds_bucket{le=\"+Inf\"} 206"), "{b}");
        assert_eq!(batch.count(), 206);
        assert_eq!(one.percentiles(), batch.percentiles());
    }

    #[test]
    fn bucket_edges_are_contiguous_and_three_digits_wide() {
        let mut prev = 0u64;
        for i in 1..OVERFLOW {
            let up = upper_edge(i);
            assert!(up > prev, "bucket {i}");
            assert_eq!(bucket_index(up), i, "upper edge of {i}");
            assert_eq!(bucket_index(prev + 1), i, "lower edge of {i}");
            // Width at most 1% of the lower edge above 1 ms, 1 µs below.
            assert!(
                up - prev == 1 || (up - prev) * 100 <= prev + 1,
                "bucket {i}"
            );
            prev = up;
        }
        assert_eq!(prev, MAX_US);
        assert_eq!(bucket_index(MAX_US + 1), OVERFLOW);
        assert_eq!(N_BUCKETS, 6_662);
    }

    /// Percentiles are within one bucket (≤ 1%) above the exact nearest-rank value.
    #[test]
    fn percentiles_are_within_a_bucket_of_the_exact_values() {
        let mut x = 12_345u64;
        let mut exact: Vec<u64> = Vec::new();
        let h = LatencyHistogram::new();
        for i in 0..20_000u64 {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            // Mostly 20 ms frames with jitter, some seconds-long outliers.
            let us = if i % 50 == 0 {
                1_000_000 + (x >> 33) % 9_000_000
            } else {
                18_000 + (x >> 33) % 4_000
            };
            exact.push(us);
            h.record(Duration::from_micros(us));
        }
        exact.sort_unstable();
        let p = h.percentiles();
        assert_eq!(p.count, 20_000);
        for (q, got) in [(0.5, p.p50), (0.95, p.p95), (0.99, p.p99)] {
            let rank = ((q * exact.len() as f64).ceil() as usize).max(1);
            let want = exact[rank - 1] as f64 / 1000.0;
            assert!(got >= want && got <= want * 1.01, "p{q}: {got} vs {want}");
        }
        let max = *exact.last().expect("samples") as f64 / 1000.0;
        assert_eq!(p.max, max);
        let mean = exact.iter().sum::<u64>() as f64 / exact.len() as f64 / 1000.0;
        assert!((p.mean - mean).abs() < 1e-9 * mean, "{} vs {mean}", p.mean);
    }

    #[test]
    fn small_values_are_exact_and_empty_is_zero() {
        let h = LatencyHistogram::new();
        assert_eq!(h.percentiles(), Percentiles::default());
        h.record_us(&[1_000, 2_000, 3_000, 4_000]);
        let p = h.percentiles();
        assert_eq!(
            (p.count, p.p50, p.p99, p.max, p.mean),
            (4, 2.0, 4.0, 4.0, 2.5)
        );
        // Sub-microsecond samples round up to 1 µs; beyond an hour reports the max.
        let h = LatencyHistogram::new();
        h.record(Duration::from_nanos(10));
        h.record(Duration::from_secs(7_200));
        let p = h.percentiles();
        assert_eq!((p.p50, p.max), (0.001, 7_200_000.0));
    }

    #[test]
    fn merged_percentiles_are_those_of_one_histogram_with_every_sample() {
        let (a, b, all) = (
            LatencyHistogram::new(),
            LatencyHistogram::new(),
            LatencyHistogram::new(),
        );
        for us in 1..=300u64 {
            let d = Duration::from_micros(us * 37);
            if us % 3 == 0 { &a } else { &b }.record(d);
            all.record(d);
        }
        assert_eq!(
            LatencyHistogram::merged_percentiles(&[a, b]),
            all.percentiles()
        );
    }

    #[test]
    fn a_bound_that_is_not_an_edge_is_reported() {
        let odd = Series {
            name: "x",
            label: None,
            buckets: &[0.0012345],
        };
        assert!(!odd.is_exact());
        assert!(
            Series {
                name: "x",
                label: None,
                buckets: &[0.0125, 3600.0]
            }
            .is_exact()
        );
    }
}
