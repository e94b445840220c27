//! Declared metrics, registered at start.
//!
//! Each service lists its metrics once, as [`Declared`] entries beside their names (its
//! `metrics` module), and calls [`register`] after installing its recorder. Counters
//! start at 0, gauges at 0, histograms with no samples: every name is in the first
//! scrape. Labelled metrics are registered without labels; their labelled series
//! appear with the first event that carries the labels (`sum(rate(x[5m]))` then covers
//! both).
//!
//! Latency histograms are [`DurationHistogram`]s, not `metrics` facade histograms: the
//! Prometheus exporter stores every sample (and allocates as it goes), which costs more
//! per event than the work being measured on both services' hot paths. A
//! `DurationHistogram` is a few relaxed atomic adds per sample (fewer per batch),
//! rendered at scrape time and appended to the exporter's text.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// What a metric is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Monotonic count (`_total`).
    Counter,
    /// A value that goes up and down.
    Gauge,
    /// A distribution of samples.
    Histogram,
}

/// A metric a service declares: its name and kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Declared {
    /// The Prometheus name.
    pub name: &'static str,
    /// Counter, gauge or histogram.
    pub kind: Kind,
}

impl Declared {
    /// A counter.
    pub const fn counter(name: &'static str) -> Self {
        Self {
            name,
            kind: Kind::Counter,
        }
    }

    /// A gauge.
    pub const fn gauge(name: &'static str) -> Self {
        Self {
            name,
            kind: Kind::Gauge,
        }
    }

    /// A histogram.
    pub const fn histogram(name: &'static str) -> Self {
        Self {
            name,
            kind: Kind::Histogram,
        }
    }
}

/// Registers every metric of `declared` with the installed recorder (a no-op without
/// one). Registering does not change a value that already exists.
pub fn register(declared: &[Declared]) {
    for d in declared {
        match d.kind {
            Kind::Counter => metrics::counter!(d.name).increment(0),
            Kind::Gauge => metrics::gauge!(d.name).increment(0.0),
            Kind::Histogram => drop(metrics::histogram!(d.name)),
        }
    }
}

/// The names in the `pub const NAME: &str = "…";` items of a metrics module's source
/// (on one line or two) that start with one of `prefixes`: a service's unit test
/// compares them with its declared list, so a new metric cannot be left out of it.
pub fn names_in_source<'a>(source: &'a str, prefixes: &[&str]) -> Vec<&'a str> {
    source
        .split("pub const ")
        .skip(1)
        .filter_map(|item| {
            let (head, rest) = item.split_once('=')?;
            if !head.trim_end().ends_with(": &str") {
                return None;
            }
            let value = rest.trim_start().strip_prefix('"')?;
            value.split('"').next()
        })
        .filter(|n| prefixes.iter().any(|p| n.starts_with(p)))
        .collect()
}

/// A fixed-bucket Prometheus histogram of durations: lock-free, allocation-free
/// recording, rendered in the text exposition format at scrape time.
///
/// Invariant: `counts` has one slot per bound plus one for `+Inf`; a sample lands in
/// the first bucket whose bound it does not exceed, so the cumulative rendering is
/// exactly Prometheus's `le` semantics.
#[derive(Debug)]
pub struct DurationHistogram {
    name: &'static str,
    label: Option<(&'static str, &'static str)>,
    /// Upper bounds in seconds, ascending.
    buckets: &'static [f64],
    /// Per-bucket counts (cumulated when rendered), the last one for `+Inf`.
    counts: Vec<AtomicU64>,
    sum_ns: AtomicU64,
}

impl DurationHistogram {
    /// A histogram `name{label}` with `buckets` (upper bounds in seconds, ascending).
    pub fn new(
        name: &'static str,
        label: Option<(&'static str, &'static str)>,
        buckets: &'static [f64],
    ) -> Self {
        Self {
            name,
            label,
            buckets,
            counts: (0..=buckets.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_ns: AtomicU64::new(0),
        }
    }

    fn bucket_of(&self, secs: f64) -> usize {
        self.buckets
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(self.buckets.len())
    }

    /// Records one duration.
    pub fn record(&self, d: Duration) {
        if let Some(c) = self.counts.get(self.bucket_of(d.as_secs_f64())) {
            c.fetch_add(1, Ordering::Relaxed);
        }
        self.sum_ns.fetch_add(
            u64::try_from(d.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// Records a batch of durations given in microseconds: one atomic add per bucket
    /// the batch touches, plus one for the sum.
    pub fn record_us(&self, samples_us: &[u64]) {
        if samples_us.is_empty() {
            return;
        }
        let mut local = [0u64; 32];
        let mut sum_ns = 0u64;
        for &us in samples_us {
            let i = self.bucket_of(us as f64 / 1e6);
            match local.get_mut(i) {
                Some(n) => *n += 1,
                // More buckets than the local array: count straight into the shared one.
                None => {
                    if let Some(c) = self.counts.get(i) {
                        c.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            sum_ns = sum_ns.saturating_add(us.saturating_mul(1_000));
        }
        for (c, n) in self.counts.iter().zip(local) {
            if n > 0 {
                c.fetch_add(n, Ordering::Relaxed);
            }
        }
        self.sum_ns.fetch_add(sum_ns, Ordering::Relaxed);
    }

    /// Samples recorded so far.
    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    /// Appends the `_bucket`, `_sum` and `_count` lines (no HELP/TYPE header).
    pub fn render_samples(&self, out: &mut String) {
        let label = |extra: Option<String>| -> String {
            let mut parts: Vec<String> = Vec::new();
            if let Some((k, v)) = self.label {
                parts.push(format!("{k}=\"{v}\""));
            }
            parts.extend(extra);
            if parts.is_empty() {
                String::new()
            } else {
                format!("{{{}}}", parts.join(","))
            }
        };
        let mut cumulative = 0u64;
        for (i, c) in self.counts.iter().enumerate() {
            cumulative += c.load(Ordering::Relaxed);
            let le = self
                .buckets
                .get(i)
                .map_or_else(|| "+Inf".to_owned(), |b| b.to_string());
            let _ = writeln!(
                out,
                "{}_bucket{} {cumulative}",
                self.name,
                label(Some(format!("le=\"{le}\"")))
            );
        }
        let sum = self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{}_sum{} {sum}", self.name, label(None));
        let _ = writeln!(out, "{}_count{} {cumulative}", self.name, label(None));
    }

    /// Appends the HELP and TYPE lines for a histogram family.
    pub fn render_header(name: &str, help: &str, out: &mut String) {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} histogram");
    }
}

/// The `/v1/stats`-style summary (`weir_protocol::admin::Percentiles`, in ms) of an
/// hdrhistogram of microseconds: the one conversion every JSON snapshot uses.
pub fn percentiles_from_us(h: &hdrhistogram::Histogram<u64>) -> weir_protocol::admin::Percentiles {
    if h.is_empty() {
        return weir_protocol::admin::Percentiles::default();
    }
    let ms = |us: u64| us as f64 / 1000.0;
    weir_protocol::admin::Percentiles {
        count: h.len(),
        p50: ms(h.value_at_quantile(0.50)),
        p95: ms(h.value_at_quantile(0.95)),
        p99: ms(h.value_at_quantile(0.99)),
        max: ms(h.max()),
        mean: h.mean() / 1000.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_read_in_milliseconds() {
        let mut h = hdrhistogram::Histogram::<u64>::new(2).expect("histogram");
        for us in [1_000, 2_000, 3_000, 4_000] {
            h.record(us).expect("record");
        }
        let p = percentiles_from_us(&h);
        assert_eq!(p.count, 4);
        assert!(
            (p.max - 4.0).abs() < 0.05 && (p.mean - 2.5).abs() < 0.05,
            "{p:?}"
        );
        assert_eq!(
            percentiles_from_us(&hdrhistogram::Histogram::new(2).expect("h")),
            weir_protocol::admin::Percentiles::default()
        );
    }

    #[test]
    fn a_batch_lands_in_the_same_buckets_as_single_records() {
        const B: &[f64] = &[0.001, 0.02, 0.5];
        let one = DurationHistogram::new("x_seconds", None, B);
        let batch = DurationHistogram::new("x_seconds", None, B);
        let us = [500, 1_000, 1_001, 20_000, 499_999, 2_000_000];
        for u in us {
            one.record(Duration::from_micros(u));
        }
        batch.record_us(&us);
        let (mut a, mut b) = (String::new(), String::new());
        one.render_samples(&mut a);
        batch.render_samples(&mut b);
        assert_eq!(a, b);
        assert!(b.contains("x_seconds_bucket{le=\"0.001\"} 2"), "{b}");
        assert!(b.contains("x_seconds_bucket{le=\"0.02\"} 4"), "{b}");
        assert!(b.contains("x_seconds_bucket{le=\"+Inf\"} 6"), "{b}");
        assert_eq!(batch.count(), 6);
    }

    #[test]
    fn names_are_read_from_const_lines_with_a_known_prefix() {
        let src = r#"
/// Counter: a.
pub const A: &str = "weir_a_total";
pub const LABEL: &str = "reason";
pub const B: &str =
    "weir_b";
pub const BUCKETS: &[f64] = &[0.1];
"#;
        assert_eq!(
            names_in_source(src, &["weir_"]),
            vec!["weir_a_total", "weir_b"]
        );
    }
}
