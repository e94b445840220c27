//! The service-time estimator of the backend: a decaying quantile (p90 by default) of
//! the most recent inference times, seeded from config before any call has finished.
//!
//! The estimate is the weighted `quantile` of the last `window` samples, the newest
//! weighing 1 and each older one `2^(-1/half_life)` times the next newer one (`half_life`
//! counted in samples). With the defaults (64 samples, half-life 16, p90):
//! - a latency *increase* shows after about 3 slow calls in a row (their weight passes
//!   10 % of the total): the estimate errs towards refusing early, the cheap mistake;
//! - a *decrease* shows after about 50 fast calls: the estimate comes down slowly, so
//!   one fast burst does not make the adapter promise what it cannot keep.
//!
//! Invariants:
//! - no sample and no seed → no estimate (`None`): nothing is refused on a prediction
//!   until the backend has been measured once (cold start admits; the checks at the
//!   start of inference and during it remain the guarantee);
//! - the estimate is recomputed when a sample is added (O(window log window) under the
//!   admission lock, 64 samples by default), and read in O(1).

use std::collections::VecDeque;
use std::time::Duration;

/// Settings of the estimator (`[estimator]`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EstimatorConfig {
    /// Estimate before the first sample; `None` = none (no predictive refusal yet).
    pub initial: Option<Duration>,
    /// Samples kept.
    pub window: usize,
    /// Age (in samples) at which a sample weighs half as much as the newest.
    pub half_life: f64,
    /// The quantile taken, in (0, 1).
    pub quantile: f64,
}

impl Default for EstimatorConfig {
    fn default() -> Self {
        Self {
            initial: None,
            window: 64,
            half_life: 16.0,
            quantile: 0.9,
        }
    }
}

/// The estimator's state, as shown in `/v1/stats` and the capabilities document (the
/// shared admin types).
pub use weir_protocol::admin::{EstimateSource, ServiceEstimate as EstimateView};

/// A decaying quantile of recent service times.
#[derive(Debug, Clone)]
pub struct Estimator {
    cfg: EstimatorConfig,
    /// Newest at the back.
    samples: VecDeque<Duration>,
    total: u64,
    current: Option<Duration>,
    /// Reused for sorting (no allocation per sample once warm).
    scratch: Vec<(Duration, f64)>,
}

impl Estimator {
    /// An estimator with no sample.
    pub fn new(cfg: EstimatorConfig) -> Self {
        let window = cfg.window.max(1);
        Self {
            cfg: EstimatorConfig { window, ..cfg },
            samples: VecDeque::with_capacity(window),
            total: 0,
            current: cfg.initial,
            scratch: Vec::with_capacity(window),
        }
    }

    /// The current estimate of one inference.
    pub fn estimate(&self) -> Option<Duration> {
        self.current
    }

    /// Adds one observed inference time.
    pub fn observe(&mut self, took: Duration) {
        if self.samples.len() == self.cfg.window {
            self.samples.pop_front();
        }
        self.samples.push_back(took);
        self.total += 1;
        self.current = Some(self.recompute());
    }

    fn recompute(&mut self) -> Duration {
        let decay = 0.5f64.powf(1.0 / self.cfg.half_life.max(f64::MIN_POSITIVE));
        self.scratch.clear();
        let mut w = 1.0;
        let mut total = 0.0;
        for s in self.samples.iter().rev() {
            self.scratch.push((*s, w));
            total += w;
            w *= decay;
        }
        self.scratch.sort_unstable_by_key(|(d, _)| *d);
        // A relative tolerance so that rounding never skips the exact quantile.
        let target = total * self.cfg.quantile.clamp(0.0, 1.0) * (1.0 - 1e-9);
        let mut acc = 0.0;
        for (d, w) in &self.scratch {
            acc += w;
            if acc >= target {
                return *d;
            }
        }
        self.scratch.last().map_or(Duration::ZERO, |(d, _)| *d)
    }

    /// The state for stats and capabilities.
    pub fn view(&self) -> EstimateView {
        EstimateView {
            service_time_ms: self.current.map(|d| d.as_secs_f64() * 1000.0),
            source: if !self.samples.is_empty() {
                EstimateSource::Observed
            } else if self.current.is_some() {
                EstimateSource::Seed
            } else {
                EstimateSource::None
            },
            samples: self.samples.len(),
            samples_total: self.total,
            quantile: self.cfg.quantile,
            window: self.cfg.window,
            half_life: self.cfg.half_life,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn cold_start_is_the_seed_or_nothing() {
        let e = Estimator::new(EstimatorConfig::default());
        assert_eq!(e.estimate(), None);
        assert_eq!(e.view().source, EstimateSource::None);
        let mut e = Estimator::new(EstimatorConfig {
            initial: Some(ms(200)),
            ..Default::default()
        });
        assert_eq!(e.estimate(), Some(ms(200)));
        assert_eq!(e.view().source, EstimateSource::Seed);
        e.observe(ms(50));
        assert_eq!(
            e.estimate(),
            Some(ms(50)),
            "the first sample replaces the seed"
        );
        assert_eq!(e.view().source, EstimateSource::Observed);
    }

    #[test]
    fn rises_fast_and_falls_slowly() {
        let mut e = Estimator::new(EstimatorConfig::default());
        for _ in 0..64 {
            e.observe(ms(50));
        }
        assert_eq!(e.estimate(), Some(ms(50)));
        let mut up = 0;
        while e.estimate() != Some(ms(100)) {
            e.observe(ms(100));
            up += 1;
            assert!(up < 64);
        }
        assert!(up <= 3, "an increase shows after {up} samples");
        for _ in 0..64 {
            e.observe(ms(100));
        }
        let mut down = 0;
        while e.estimate() != Some(ms(50)) {
            e.observe(ms(50));
            down += 1;
            assert!(down <= 64);
        }
        assert!(
            (30..=60).contains(&down),
            "a decrease shows after {down} samples"
        );
    }

    #[test]
    fn p90_of_a_spread() {
        let mut e = Estimator::new(EstimatorConfig {
            half_life: f64::INFINITY, // no decay: a plain p90
            window: 100,
            ..Default::default()
        });
        for i in 1..=100 {
            e.observe(ms(i));
        }
        assert_eq!(e.estimate(), Some(ms(90)));
    }
}
