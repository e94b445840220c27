//! [`StreamKeys`]: the producer core's keys as a loader reads them, before validation —
//! one field per key of [`KEYS`](super::KEYS), with the names, units and widths every
//! front end shows (`max_age_ms` in milliseconds, `max_rate` as a decimal, `partitions`
//! 0 for unset). `audio-ingress serve` flattens it into its raw configuration and the
//! Python package's `Producer.connect(**keys)` reads it, so the two cannot drift.
//!
//! Invariants:
//! - `Default` reads [`StreamConfigBuilder::default`]: no default is written here.
//! - [`StreamKeys::build`] is the only conversion to [`StreamConfig`], and
//!   [`StreamConfigBuilder::build`] the only validation: a refusal names the key.
//! - Unknown keys are the loader's to refuse (the struct is flattened, so it cannot
//!   `deny_unknown_fields`).

use std::time::Duration;

use serde::{Deserialize, Serialize};
use weir_service::config::ConfigError;

use super::{Delivery, JetStreamKeys, Policy, StreamConfig, StreamConfigBuilder};

/// The producer core's keys as given (see the module docs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct StreamKeys {
    max_bytes: u64,
    max_rate: f64,
    max_age_ms: u64,
    max_wait_ms: u64,
    policy: Policy,
    extended_consumers: bool,
    shadow: bool,
    shadow_ceiling_factor: u64,
    publish_timeout_ms: u64,
    end_timeout_ms: u64,
    max_frame_bytes: u64,
    subject: String,
    frame_headers: bool,
    delivery: Delivery,
    jetstream_stream: String,
    jetstream_max_age_s: u64,
    jetstream_duplicate_window_s: u64,
    jetstream_replicas: u64,
    confirm_window_ms: u64,
    confirm_window_min_bytes: u64,
    confirm_interval_ms: u64,
    /// 0: unset (1 partition; required with `{partition}`).
    partitions: u64,
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Seconds as a [`Duration`], capped where a later conversion to milliseconds could
/// overflow (the builder refuses such a value by its range).
fn secs(s: u64) -> Duration {
    Duration::from_secs(s.min(u64::MAX / 2_000))
}

/// A decimal value in thousandths (rounded); `None` for a negative, NaN or huge value.
fn permille(v: f64) -> Option<u64> {
    (v.is_finite() && (0.0..=1e12).contains(&v)).then(|| (v * 1000.0).round() as u64)
}

impl Default for StreamKeys {
    fn default() -> Self {
        let b = StreamConfigBuilder::default();
        Self {
            max_bytes: b.max_bytes,
            max_rate: b.max_rate_permille as f64 / 1000.0,
            max_age_ms: ms(b.max_age),
            max_wait_ms: ms(b.max_wait),
            policy: b.policy,
            extended_consumers: b.extended_consumers,
            shadow: b.shadow,
            shadow_ceiling_factor: b.shadow_ceiling_factor,
            publish_timeout_ms: ms(b.publish_timeout),
            end_timeout_ms: ms(b.end_timeout),
            max_frame_bytes: b.max_frame_bytes,
            subject: b.subject,
            frame_headers: b.frame_headers,
            delivery: b.delivery,
            jetstream_stream: b.jetstream.stream,
            jetstream_max_age_s: b.jetstream.max_age.as_secs(),
            jetstream_duplicate_window_s: b.jetstream.duplicate_window.as_secs(),
            jetstream_replicas: b.jetstream.replicas,
            confirm_window_ms: ms(b.confirm_window),
            confirm_window_min_bytes: b.confirm_window_min_bytes,
            confirm_interval_ms: ms(b.confirm_interval),
            partitions: b.partitions.unwrap_or(0),
        }
    }
}

impl StreamKeys {
    /// Validates the keys into the typed settings (the builder's checks; `max_rate`'s
    /// decimal first).
    pub fn build(&self) -> Result<StreamConfig, ConfigError> {
        let max_rate_permille = permille(self.max_rate).ok_or_else(|| {
            ConfigError::out_of_range("max_rate", self.max_rate, "0 (no bound) or 1.0..=1000")
        })?;
        StreamConfigBuilder {
            max_bytes: self.max_bytes,
            max_age: Duration::from_millis(self.max_age_ms),
            max_wait: Duration::from_millis(self.max_wait_ms),
            policy: self.policy,
            shadow: self.shadow,
            shadow_ceiling_factor: self.shadow_ceiling_factor,
            extended_consumers: self.extended_consumers,
            publish_timeout: Duration::from_millis(self.publish_timeout_ms),
            end_timeout: Duration::from_millis(self.end_timeout_ms),
            max_frame_bytes: self.max_frame_bytes,
            subject: self.subject.clone(),
            partitions: (self.partitions != 0).then_some(self.partitions),
            frame_headers: self.frame_headers,
            delivery: self.delivery,
            confirm_window: Duration::from_millis(self.confirm_window_ms),
            confirm_window_min_bytes: self.confirm_window_min_bytes,
            confirm_interval: Duration::from_millis(self.confirm_interval_ms),
            jetstream: JetStreamKeys {
                stream: self.jetstream_stream.clone(),
                max_age: secs(self.jetstream_max_age_s),
                duplicate_window: secs(self.jetstream_duplicate_window_s),
                replicas: self.jetstream_replicas,
            },
            max_rate_permille,
        }
        .build()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_build_the_default_config() {
        assert_eq!(
            StreamKeys::default().build().ok(),
            Some(StreamConfig::default())
        );
    }

    #[test]
    fn every_key_of_the_table_is_a_field_and_no_other() {
        let value = serde_json::to_value(StreamKeys::default()).expect("serialize");
        let mut fields: Vec<&str> = value
            .as_object()
            .expect("object")
            .keys()
            .map(String::as_str)
            .collect();
        let mut names: Vec<&str> = super::super::KEYS.iter().map(|k| k.name).collect();
        fields.sort_unstable();
        names.sort_unstable();
        assert_eq!(fields, names);
    }

    #[test]
    fn a_bad_rate_is_refused_by_name() {
        let keys: StreamKeys = serde_json::from_str(r#"{"max_rate": -1.0}"#).expect("keys");
        assert_eq!(
            keys.build().map_err(|e| e.key().to_owned()),
            Err("max_rate".into())
        );
    }
}
