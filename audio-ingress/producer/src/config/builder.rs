//! [`StreamConfigBuilder`]: the producer core's keys as given, before validation — one
//! field per key of [`KEYS`] (the `stream` section of the `serve` binary's key table, in
//! the order shown; a numeric [`Range`] there is also the one [`StreamConfigBuilder::build`]
//! checks), with the names, units and widths every front end shows (`max_age_ms` in
//! milliseconds, `max_rate` as a decimal, `partitions` 0 for unset). `audio-ingress serve`
//! flattens it into its raw configuration, the Python package's
//! `Producer.connect(**keys)` reads it, and a library user sets it with the setters, so
//! none can drift.
//!
//! Invariants:
//! - each default is written once, here, from the `DEFAULT_*` constants;
//! - [`StreamConfigBuilder::build`] is the one validation, and the only conversion to
//!   [`StreamConfig`]: a refusal names the key and the allowed range;
//! - unknown keys are the loader's to refuse (the struct is flattened, so it cannot
//!   `deny_unknown_fields`).

use std::num::{NonZeroU32, NonZeroUsize};
use std::time::Duration;

use async_nats::jetstream::stream::{DiscardPolicy, StorageType};
use weir_protocol::SubjectTemplate;
use weir_protocol::audio::packet::DEFAULT_MAX_PCM_BYTES;
use weir_protocol::partition::{DEFAULT_STREAM_TEMPLATE, MAX_PARTITIONS};
use weir_service::config::{ConfigError, ConfigErrorKind, Range, whole_ms as ms};

use super::*;
use crate::jetstream::JetStreamSettings;

weir_service::config_section! {
    /// Builds a [`StreamConfig`] (see the module docs); nothing is checked before
    /// [`build`](Self::build).
    #[derive(Debug, PartialEq)]
    pub struct StreamConfigBuilder: flattened, KEYS = "";
    {
        max_bytes: u64 = DEFAULT_MAX_BYTES as u64, Range::text("2×`max_frame_bytes`..=67108864"),
            "PCM byte budget per stream (queued + in flight + unconfirmed); each frame is \
            charged at least 160 bytes (5 ms), so a stream holds at most `max_bytes` / 160 \
            frames";
        max_rate: f64 = f64::from(DEFAULT_MAX_RATE_PERMILLE) / 1000.0,
            Range::text("0 (no bound) or 1.0..=1000"),
            "rate bound in audio time: a stream delivers at most `max_rate` × real time \
            sustained, with a burst of `max_bytes` + 2 s of audio (catching up after a network \
            stall); beyond it the policy applies (close: overload, reason rate; gap: dropped \
            into a marker). Shadow mode enforces `shadow_ceiling_factor` × it";
        max_age_ms: u64 = ms(DEFAULT_MAX_AGE), Range::ms(20, 60000),
            "age budget of the oldest pending frame";
        max_wait_ms: u64 = ms(DEFAULT_MAX_WAIT), Range::text("0..=`max_age_ms`"),
            "`close`: how long a full stream may stay full before it overloads; what `push` \
            waits at most";
        policy: Policy = Policy::Close, Range::text("`close` or `gap`"),
            "what a stream does when its budget is exhausted";
        extended_consumers: bool = false, Range::Any,
            "every consumer of the subject speaks the extended protocol; required by \
            `policy = \"gap\"`";
        shadow: bool = false, Range::Any,
            "measure the budget and count `would_reject`; enforce only the ceiling";
        shadow_ceiling_factor: u64 = u64::from(DEFAULT_SHADOW_CEILING_FACTOR), Range::int(2, 64),
            "shadow mode: the policy still applies at this multiple of the budget";
        publish_timeout_ms: u64 = ms(DEFAULT_PUBLISH_TIMEOUT), Range::text("1..=`max_age_ms`"),
            "bound on one NATS publish call";
        end_timeout_ms: u64 = ms(DEFAULT_END_TIMEOUT), Range::ms(100, 300000),
            "how long a closing stream keeps trying to hand its `end` (and last gap marker) to \
            NATS";
        max_frame_bytes: u64 = DEFAULT_MAX_FRAME_BYTES as u64, Range::text("even, 2..=32000"),
            "largest accepted frame (WebSocket binary message)";
        frame_headers: bool = false, Range::Any,
            "frames also carry the `Weir-Audio-Version` and `Weir-Captured-At-Ms` headers. The \
            capture time is always in the meta (`captured_at_ms`); headers halve throughput. \
            `end` and `gap` always carry headers";
        delivery: Delivery = Delivery::Confirmed, Range::text("`confirmed`, `unconfirmed` or `jetstream`"),
            "`confirmed`: a frame is pending until the server confirms it (the budget holds up \
            to the server); `unconfirmed`: published once handed to the client (comparison \
            only); `jetstream`: lossless mode, frames stored in a JetStream stream (see \
            `jetstream_*`)";
        confirm_window_ms: u64 = ms(DEFAULT_CONFIRM_WINDOW), Range::ms(10, 10000),
            "unconfirmed bytes per connection are limited to this much of the admitted byte \
            rate";
        confirm_window_min_bytes: u64 = DEFAULT_CONFIRM_WINDOW_MIN_BYTES,
            Range::text("`max_frame_bytes`..=67108864"),
            "the window's floor (one stream's budget)";
        confirm_interval_ms: u64 = ms(DEFAULT_CONFIRM_INTERVAL), Range::text("1..=`max_age_ms`/4"),
            "minimum spacing of confirmation markers (one in flight)";
        jetstream_stream: String = DEFAULT_JETSTREAM_STREAM.to_owned(), Range::text("1..=64 of `A-Za-z0-9_-`"),
            "`delivery = \"jetstream\"`: the stream (created if missing), capturing the subject \
            template";
        jetstream_max_age_s: u64 = DEFAULT_JETSTREAM_MAX_AGE.as_secs(), Range::secs(1, 604800),
            "how long the stream keeps audio";
        jetstream_duplicate_window_s: u64 = DEFAULT_JETSTREAM_DUPLICATE_WINDOW.as_secs(),
            Range::text("1..=`jetstream_max_age_s`"),
            "`Nats-Msg-Id` deduplication window (retries within it are stored once)";
        jetstream_replicas: u64 = 1, Range::int(1, 5), "stream replicas";
        subject: String = DEFAULT_STREAM_TEMPLATE.to_owned(),
            Range::text("template: `{stream}` once, `{partition}` at most once, no wildcards"),
            "frame subject";
        // 0: unset (1 partition; required with `{partition}`).
        partitions: u64 = 0,
            Range::text(
                "0 (unset: 1 partition) or 1..=4096 (the consumer core's bound: one subscription \
                per owned partition); required with `{partition}`",
            ),
            "N of `FNV-1a-32(stream id) mod N`";
    }
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

/// `v` of `key` within the range [`KEYS`] gives it.
fn int_in(key: &str, v: u64) -> Result<u64, ConfigError> {
    weir_service::config::keys::range_of(KEYS, key).check(key, v)
}

/// `v` ms of `key` within `min..=max` ms.
fn within(key: &str, v: u64, min: u64, max: u64) -> Result<u64, ConfigError> {
    Range::ms(min, max).check(key, v)
}

fn nonzero(v: u64) -> NonZeroUsize {
    NonZeroUsize::new(usize::try_from(v).unwrap_or(usize::MAX)).unwrap_or(NonZeroUsize::MIN)
}

/// Builder setters: `name(v: T) => field = expr;` writes `pub fn name(mut self, v: T)
/// -> Self` that stores `expr` (validated in [`StreamConfigBuilder::build`]).
macro_rules! setters {
    ($($(#[$doc:meta])* $name:ident($v:ident: $ty:ty) => $field:ident = $value:expr;)*) => {
        $(
            $(#[$doc])*
            pub fn $name(mut self, $v: $ty) -> Self {
                self.$field = $value;
                self
            }
        )*
    };
}

impl StreamConfigBuilder {
    setters! {
        /// `max_rate` in thousandths of real time (1,500 = 1.5×; 0 = no rate bound).
        max_rate_permille(v: u32) => max_rate = f64::from(v) / 1000.0;
        /// `max_bytes`: byte budget per stream.
        max_bytes(v: usize) => max_bytes = v as u64;
        /// `max_age_ms`: age budget of the oldest pending frame.
        max_age(v: Duration) => max_age_ms = ms(v);
        /// `max_wait_ms`: how long a full stream waits for room (`close`).
        max_wait(v: Duration) => max_wait_ms = ms(v);
        /// `policy`.
        policy(v: Policy) => policy = v;
        /// `shadow`.
        shadow(v: bool) => shadow = v;
        /// `extended_consumers`.
        extended_consumers(v: bool) => extended_consumers = v;
        /// `publish_timeout_ms`.
        publish_timeout(v: Duration) => publish_timeout_ms = ms(v);
        /// `end_timeout_ms`.
        end_timeout(v: Duration) => end_timeout_ms = ms(v);
        /// `max_frame_bytes`.
        max_frame_bytes(v: usize) => max_frame_bytes = v as u64;
        /// `subject`: the frame subject template.
        subject(v: impl Into<String>) => subject = v.into();
        /// `partitions`: required when the subject has `{partition}`.
        partitions(v: u32) => partitions = u64::from(v);
        /// `frame_headers`: see [`StreamConfig::frame_headers`].
        frame_headers(v: bool) => frame_headers = v;
        /// `delivery`: see [`StreamConfig::delivery`].
        delivery(v: Delivery) => delivery = v;
        /// `confirm_window_ms`.
        confirm_window(v: Duration) => confirm_window_ms = ms(v);
        /// `confirm_window_min_bytes`.
        confirm_window_min_bytes(v: u64) => confirm_window_min_bytes = v;
        /// `confirm_interval_ms`.
        confirm_interval(v: Duration) => confirm_interval_ms = ms(v);
        /// `jetstream_stream`.
        jetstream_stream(v: impl Into<String>) => jetstream_stream = v.into();
    }

    /// Validates every value; the error names the key and the allowed range
    /// (`max_rate` first).
    pub fn build(&self) -> Result<StreamConfig, ConfigError> {
        let max_rate_permille = permille(self.max_rate)
            .filter(|&p| p == 0 || (1000..=u64::from(MAX_MAX_RATE_PERMILLE)).contains(&p))
            .ok_or_else(|| {
                ConfigError::out_of_range("max_rate", self.max_rate, "0 (no bound) or 1.0..=1000")
            })?;
        let max_pcm = DEFAULT_MAX_PCM_BYTES as u64;
        Range::int(2, max_pcm)
            .note(" (the packet limit)")
            .check("max_frame_bytes", self.max_frame_bytes)?;
        if !self.max_frame_bytes.is_multiple_of(2) {
            return Err(ConfigError::new(
                "max_frame_bytes",
                ConfigErrorKind::Invalid,
                format!(
                    "{} is odd; a frame is a whole number of 16-bit samples",
                    self.max_frame_bytes
                ),
            ));
        }
        let min_bytes = 2 * self.max_frame_bytes;
        if self.max_bytes < min_bytes || self.max_bytes > MAX_MAX_BYTES as u64 {
            return Err(ConfigError::out_of_range(
                "max_bytes",
                self.max_bytes,
                format!(
                    "{min_bytes}..={MAX_MAX_BYTES} (at least twice max_frame_bytes = {})",
                    self.max_frame_bytes
                ),
            ));
        }
        let max_age_ms = int_in("max_age_ms", self.max_age_ms)?;
        within("max_wait_ms", self.max_wait_ms, 0, max_age_ms)?;
        within("publish_timeout_ms", self.publish_timeout_ms, 1, max_age_ms)?;
        int_in("end_timeout_ms", self.end_timeout_ms)?;
        int_in("confirm_window_ms", self.confirm_window_ms)?;
        // A marker per round: at most every max_age / 4, so a stall is seen well within
        // the age budget.
        let max_interval = (max_age_ms / 4).max(1);
        within(
            "confirm_interval_ms",
            self.confirm_interval_ms,
            1,
            max_interval,
        )?;
        let jetstream = self.jetstream()?;
        Range::int(self.max_frame_bytes, MAX_MAX_BYTES as u64)
            .note(" (at least max_frame_bytes)")
            .check("confirm_window_min_bytes", self.confirm_window_min_bytes)?;
        int_in("shadow_ceiling_factor", self.shadow_ceiling_factor)?;
        if self.policy == Policy::Gap && !self.extended_consumers {
            return Err(ConfigError::new(
                "policy",
                ConfigErrorKind::Conflict,
                "\"gap\" publishes `gap` packets, which deployed consumers refuse; set \
                 extended_consumers = true once every consumer of the subject speaks the \
                 extended protocol",
            ));
        }
        let subject = SubjectTemplate::parse(&self.subject)
            .map_err(|e| ConfigError::new("subject", ConfigErrorKind::Invalid, e.to_string()))?;
        let partitions = match (subject.is_partitioned(), self.partitions) {
            (true, 0) => {
                return Err(ConfigError::new(
                    "partitions",
                    ConfigErrorKind::Missing,
                    "required because subject contains {partition}",
                ));
            }
            (_, p) => p.max(1),
        };
        Range::int(1, MAX_PARTITIONS.into())
            .note(" (the consumer's bound too)")
            .check("partitions", partitions)?;
        let partitions = NonZeroU32::new(partitions as u32).unwrap_or(NonZeroU32::MIN);
        Ok(StreamConfig {
            max_bytes: nonzero(self.max_bytes),
            max_age: Duration::from_millis(self.max_age_ms),
            max_wait: Duration::from_millis(self.max_wait_ms),
            policy: self.policy,
            shadow: self.shadow,
            shadow_ceiling_factor: self.shadow_ceiling_factor as u32,
            extended_consumers: self.extended_consumers,
            publish_timeout: Duration::from_millis(self.publish_timeout_ms),
            end_timeout: Duration::from_millis(self.end_timeout_ms),
            max_frame_bytes: nonzero(self.max_frame_bytes),
            partitions,
            frame_headers: self.frame_headers,
            delivery: self.delivery,
            confirm_window: Duration::from_millis(self.confirm_window_ms),
            confirm_window_min_bytes: self.confirm_window_min_bytes,
            confirm_interval: Duration::from_millis(self.confirm_interval_ms),
            jetstream: JetStreamSettings {
                subjects: vec![subject.wildcard()],
                ..jetstream
            },
            subject,
            max_rate_permille: max_rate_permille as u32,
        })
    }

    /// The `jetstream_*` keys, validated (the subjects are the template's, set by
    /// [`Self::build`]).
    fn jetstream(&self) -> Result<JetStreamSettings, ConfigError> {
        let stream = &self.jetstream_stream;
        if stream.is_empty()
            || stream.len() > 64
            || !stream
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            return Err(ConfigError::new(
                "jetstream_stream",
                ConfigErrorKind::Invalid,
                format!("{stream:?}: 1..=64 characters of A-Z a-z 0-9 _ -"),
            ));
        }
        // Shown in milliseconds, as the durations are checked.
        let js_max_age = ms(secs(self.jetstream_max_age_s));
        within("jetstream_max_age_s", js_max_age, 1_000, 604_800_000)?;
        let js_window = ms(secs(self.jetstream_duplicate_window_s));
        within("jetstream_duplicate_window_s", js_window, 1_000, js_max_age)?;
        int_in("jetstream_replicas", self.jetstream_replicas)?;
        Ok(JetStreamSettings {
            name: stream.clone(),
            storage: StorageType::File,
            max_age: secs(self.jetstream_max_age_s),
            duplicate_window: secs(self.jetstream_duplicate_window_s),
            num_replicas: self.jetstream_replicas as usize,
            discard: DiscardPolicy::Old,
            ..Default::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_build_the_default_config() {
        assert_eq!(
            StreamConfigBuilder::default().build().ok(),
            Some(StreamConfig::default())
        );
    }

    #[test]
    fn every_key_of_the_table_is_a_field_and_no_other() {
        let value = serde_json::to_value(StreamConfigBuilder::default()).expect("serialize");
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
        let keys: StreamConfigBuilder =
            serde_json::from_str(r#"{"max_rate": -1.0}"#).expect("keys");
        assert_eq!(
            keys.build().map_err(|e| e.key().to_owned()),
            Err("max_rate".into())
        );
    }
}
