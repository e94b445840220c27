//! Declared metrics, registered at start.
//!
//! Each service lists its metrics once, as [`Declared`] entries beside their names (its
//! `metrics` module), and calls [`register`] after installing its recorder. Counters
//! start at 0, gauges at 0, histograms with no samples: every name is in the first
//! scrape. Labelled metrics are registered without labels; their labelled series
//! appear with the first event that carries the labels (`sum(rate(x[5m]))` then covers
//! both).
//!
//! Latencies are [`LatencyHistogram`]s ([`latency`]), not `metrics` facade histograms:
//! the Prometheus exporter stores every sample (and allocates as it goes), which costs
//! more per event than the work being measured on both services' hot paths. A
//! `LatencyHistogram` is a few relaxed atomic adds per sample (fewer per batch); the
//! same counts give the `/v1/stats` percentiles and, rendered at scrape time and
//! appended to the exporter's text, the Prometheus buckets.

pub mod latency;

pub use latency::{LatencyHistogram, Series};

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

/// Declares a crate's metrics once: each `kind pub const NAME: &str = "…";` (with its
/// doc comment) becomes the name's constant and a [`Declared`] entry of the list named
/// first, which the crate hands to [`register`] at start. `kind` is
/// `counter`, `gauge` or `histogram`.
///
/// ```
/// weir_service::declare_metrics! {
///     /// Every metric of this example.
///     pub const DECLARED;
///     /// Counter: things done.
///     counter pub const DONE_TOTAL: &str = "weir_example_done_total";
/// }
/// assert_eq!(DECLARED[0].name, DONE_TOTAL);
/// ```
#[macro_export]
macro_rules! declare_metrics {
    (
        $(#[$list_doc:meta])* pub const $list:ident;
        $($(#[$doc:meta])* $kind:ident pub const $name:ident: &str = $value:literal;)*
    ) => {
        $($(#[$doc])* pub const $name: &str = $value;)*

        $(#[$list_doc])*
        pub const $list: &[$crate::metrics::Declared] = &[$($crate::metrics::Declared {
            name: $name,
            kind: $crate::declare_metrics!(@kind $kind),
        }),*];
    };
    (@kind counter) => { $crate::metrics::Kind::Counter };
    (@kind gauge) => { $crate::metrics::Kind::Gauge };
    (@kind histogram) => { $crate::metrics::Kind::Histogram };
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

#[cfg(test)]
mod tests {
    use super::*;

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
