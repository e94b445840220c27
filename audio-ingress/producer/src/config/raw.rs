//! [`StreamKeys`]: the producer core's keys as a loader reads them, before validation —
//! one field per key of [`KEYS`] (the `stream` section of the `serve` binary's key table,
//! in the order shown; a numeric [`Range`] there is also the one
//! [`StreamConfigBuilder::build`] checks), with the names, units and widths every
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

use weir_service::config::{ConfigError, Range};

use super::{Delivery, JetStreamKeys, Policy, StreamConfig, StreamConfigBuilder};

weir_service::config_section! {
    /// The producer core's keys as given (see the module docs).
    #[derive(Debug, PartialEq)]
    pub struct StreamKeys: flattened, KEYS = "";
    /// The keys of `b` (the builder's defaults: none is written here).
    fn from_builder(b: StreamConfigBuilder);
    {
        max_bytes: u64 = b.max_bytes, Range::text("2×`max_frame_bytes`..=67108864"),
            "PCM byte budget per stream (queued + in flight + unconfirmed); each frame is \
            charged at least 160 bytes (5 ms), so a stream holds at most `max_bytes` / 160 \
            frames";
        max_rate: f64 = b.max_rate_permille as f64 / 1000.0,
            Range::text("0 (no bound) or 1.0..=1000"),
            "rate bound in audio time: a stream delivers at most `max_rate` × real time \
            sustained, with a burst of `max_bytes` + 2 s of audio (catching up after a network \
            stall); beyond it the policy applies (close: overload, reason rate; gap: dropped \
            into a marker). Shadow mode enforces `shadow_ceiling_factor` × it";
        max_age_ms: u64 = ms(b.max_age), Range::ms(20, 60000),
            "age budget of the oldest pending frame";
        max_wait_ms: u64 = ms(b.max_wait), Range::text("0..=`max_age_ms`"),
            "`close`: how long a full stream may stay full before it overloads; what `push` \
            waits at most";
        policy: Policy = b.policy, Range::text("`close` or `gap`"),
            "what a stream does when its budget is exhausted";
        extended_consumers: bool = b.extended_consumers, Range::Any,
            "every consumer of the subject speaks the extended protocol; required by \
            `policy = \"gap\"`";
        shadow: bool = b.shadow, Range::Any,
            "measure the budget and count `would_reject`; enforce only the ceiling";
        shadow_ceiling_factor: u64 = b.shadow_ceiling_factor, Range::int(2, 64),
            "shadow mode: the policy still applies at this multiple of the budget";
        publish_timeout_ms: u64 = ms(b.publish_timeout), Range::text("1..=`max_age_ms`"),
            "bound on one NATS publish call";
        end_timeout_ms: u64 = ms(b.end_timeout), Range::ms(100, 300000),
            "how long a closing stream keeps trying to hand its `end` (and last gap marker) to \
            NATS";
        max_frame_bytes: u64 = b.max_frame_bytes, Range::text("even, 2..=32000"),
            "largest accepted frame (WebSocket binary message)";
        frame_headers: bool = b.frame_headers, Range::Any,
            "frames also carry the `Weir-Audio-Version` and `Weir-Captured-At-Ms` headers. The \
            capture time is always in the meta (`captured_at_ms`); headers halve throughput. \
            `end` and `gap` always carry headers";
        delivery: Delivery = b.delivery, Range::text("`confirmed`, `unconfirmed` or `jetstream`"),
            "`confirmed`: a frame is pending until the server confirms it (the budget holds up \
            to the server); `unconfirmed`: published once handed to the client (comparison \
            only); `jetstream`: lossless mode, frames stored in a JetStream stream (see \
            `jetstream_*`)";
        confirm_window_ms: u64 = ms(b.confirm_window), Range::ms(10, 10000),
            "unconfirmed bytes per connection are limited to this much of the admitted byte \
            rate";
        confirm_window_min_bytes: u64 = b.confirm_window_min_bytes,
            Range::text("`max_frame_bytes`..=67108864"),
            "the window's floor (one stream's budget)";
        confirm_interval_ms: u64 = ms(b.confirm_interval), Range::text("1..=`max_age_ms`/4"),
            "minimum spacing of confirmation markers (one in flight)";
        jetstream_stream: String = b.jetstream.stream, Range::text("1..=64 of `A-Za-z0-9_-`"),
            "`delivery = \"jetstream\"`: the stream (created if missing), capturing the subject \
            template";
        jetstream_max_age_s: u64 = b.jetstream.max_age.as_secs(), Range::secs(1, 604800),
            "how long the stream keeps audio";
        jetstream_duplicate_window_s: u64 = b.jetstream.duplicate_window.as_secs(),
            Range::text("1..=`jetstream_max_age_s`"),
            "`Nats-Msg-Id` deduplication window (retries within it are stored once)";
        jetstream_replicas: u64 = b.jetstream.replicas, Range::int(1, 5), "stream replicas";
        subject: String = b.subject,
            Range::text("template: `{stream}` once, `{partition}` at most once, no wildcards"),
            "frame subject";
        // 0: unset (1 partition; required with `{partition}`).
        partitions: u64 = b.partitions.unwrap_or(0),
            Range::text(
                "0 (unset: 1 partition) or 1..=4096 (the consumer core's bound: one subscription \
                per owned partition); required with `{partition}`",
            ),
            "N of `FNV-1a-32(stream id) mod N`";
    }
}

impl Default for StreamKeys {
    fn default() -> Self {
        Self::from_builder(StreamConfigBuilder::default())
    }
}

/// The range [`KEYS`] gives `key` ([`Range::Any`] for a key without one, which a range
/// check refuses).
pub(super) fn range(key: &str) -> Range {
    weir_service::config::keys::range_of(KEYS, key)
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
        let mut names: Vec<&str> = KEYS.iter().map(|k| k.name).collect();
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
