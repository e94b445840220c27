//! Latency histograms and percentile summaries.
//!
//! Every latency in the load test is recorded in the services' own histogram
//! ([`weir_service::metrics::LatencyHistogram`]: whole microseconds, three significant
//! digits) and reported in milliseconds. Values above its range (one hour) share its
//! overflow bucket, never refused, so a stuck frame still shows up as the maximum.
//! An empty histogram summarises to all zeros with `count == 0`: a reader must check the
//! count before reading a zero p99 as "fast".

/// A latency histogram: the services' own (atomic, shared by reference).
pub use weir_service::metrics::LatencyHistogram;

/// A latency summary in milliseconds: the services' own type (`weir_protocol::admin`).
pub use weir_protocol::admin::Percentiles;

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn empty_histogram_is_all_zero() {
        let h = LatencyHistogram::new();
        assert_eq!(h.percentiles(), Percentiles::default());
    }

    #[test]
    fn percentiles_of_a_uniform_run() {
        let h = LatencyHistogram::new();
        for ms in 1..=100u64 {
            h.record(Duration::from_millis(ms));
        }
        let s = h.percentiles();
        assert_eq!(s.count, 100);
        assert!((s.p50 - 50.0).abs() < 0.1, "{s:?}");
        assert!((s.p95 - 95.0).abs() < 0.1, "{s:?}");
        assert!((s.p99 - 99.0).abs() < 0.1, "{s:?}");
        assert!((s.max - 100.0).abs() < 0.1, "{s:?}");
    }

    #[test]
    fn huge_values_are_clamped_not_lost() {
        let h = LatencyHistogram::new();
        h.record(Duration::from_secs(10 * 3600));
        assert_eq!(h.count(), 1);
        assert!(h.percentiles().max >= 3_599_000.0);
    }
}
