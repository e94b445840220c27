//! The producer core's budget and policy ([`StreamConfig`], built with
//! [`StreamConfig::builder`]): what a producer using the library needs. `Default` is the
//! documented default and is valid.
//!
//! [`StreamConfigBuilder::build`] is the one validation of these values: a refusal is a
//! [`ConfigError`] naming the key and the allowed range, the range of [`KEYS`] where
//! the key has a numeric one (the `serve` binary's key table shows the same [`KEYS`]).

use std::num::{NonZeroU32, NonZeroUsize};
use std::time::Duration;

use weir_protocol::SubjectTemplate;
use weir_protocol::audio::packet::DEFAULT_MAX_PCM_BYTES;
use weir_protocol::partition::{DEFAULT_STREAM_TEMPLATE, MAX_PARTITIONS};

use weir_service::config::{ConfigError, ConfigErrorKind};

mod raw;

pub use raw::{KEYS, StreamKeys};

/// Default byte budget per stream: 0.5 s of 16 kHz s16le mono (25 frames of 20 ms).
pub const DEFAULT_MAX_BYTES: usize = 16_000;
/// Default age budget: the oldest pending frame may be at most this old.
pub const DEFAULT_MAX_AGE: Duration = Duration::from_millis(500);
/// Default time a full stream may wait for room before the `close` policy overloads it.
pub const DEFAULT_MAX_WAIT: Duration = Duration::from_millis(100);
/// Default bound on one NATS publish call.
pub const DEFAULT_PUBLISH_TIMEOUT: Duration = Duration::from_millis(100);
/// Default time a stream keeps trying to hand its `end` to NATS.
pub const DEFAULT_END_TIMEOUT: Duration = Duration::from_secs(10);
/// Default largest accepted frame: 100 ms of audio.
pub const DEFAULT_MAX_FRAME_BYTES: usize = 3_200;
/// Default shadow-mode safety factor (see [`StreamConfig::shadow`]).
pub const DEFAULT_SHADOW_CEILING_FACTOR: u32 = 8;
/// Largest byte budget accepted (64 MiB): anything above is a typo.
pub const MAX_MAX_BYTES: usize = 64 * 1024 * 1024;

/// What a stream does when its budget is exhausted (the type both queues share).
pub use weir_service::bounded::WhenFull as Policy;

/// How a frame counts as published.
#[derive(strum::IntoStaticStr, strum::Display, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Delivery {
    /// A frame is published once the server confirmed it (a marker round trip on the
    /// same connection); until then it counts against the stream's budget. The
    /// default: the bound holds up to the server. See [`crate::confirm`].
    #[default]
    Confirmed,
    /// A frame counts as published once handed to the NATS client (the budget ends
    /// at the client; a stall can hold seconds of audio in its buffers). For
    /// comparison.
    Unconfirmed,
    /// Lossless: frames go to a JetStream stream and count as published once stored
    /// (see [`crate::jetstream`]).
    #[serde(rename = "jetstream")]
    #[strum(serialize = "jetstream")]
    JetStream,
}

/// Default `confirm_window_ms`: the window holds this much of the admitted byte rate.
pub const DEFAULT_CONFIRM_WINDOW: Duration = Duration::from_millis(200);
/// Default `confirm_window_min_bytes`: one stream's default budget (25 frames). At low
/// stream counts the rate-based limit (200 ms of the admitted rate) is smaller than
/// that; the floor keeps a single stream unthrottled, and no larger: a larger floor
/// lets a producer that reconnects during a stall put more than one budget of stale
/// audio into the client across its stream instances.
pub const DEFAULT_CONFIRM_WINDOW_MIN_BYTES: u64 = 16_000;
/// Default `confirm_interval_ms`: markers are at least this far apart.
pub const DEFAULT_CONFIRM_INTERVAL: Duration = Duration::from_millis(5);
/// Default `jetstream_stream`.
pub const DEFAULT_JETSTREAM_STREAM: &str = "WEIR_AUDIO";
/// Default `jetstream_max_age_s`.
pub const DEFAULT_JETSTREAM_MAX_AGE: Duration = Duration::from_secs(3600);
/// Default `jetstream_duplicate_window_s`.
pub const DEFAULT_JETSTREAM_DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

/// The validated budget and policy of every stream. Cannot hold an invalid combination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamConfig {
    max_bytes: NonZeroUsize,
    max_age: Duration,
    max_wait: Duration,
    policy: Policy,
    shadow: bool,
    shadow_ceiling_factor: u32,
    extended_consumers: bool,
    publish_timeout: Duration,
    end_timeout: Duration,
    max_frame_bytes: NonZeroUsize,
    subject: SubjectTemplate,
    partitions: NonZeroU32,
    frame_headers: bool,
    delivery: Delivery,
    confirm_window: Duration,
    confirm_window_min_bytes: u64,
    confirm_interval: Duration,
    jetstream: JetStreamKeys,
    max_rate_permille: u32,
}

/// The `jetstream_*` keys (used with `delivery = "jetstream"`), as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JetStreamKeys {
    /// `jetstream_stream`.
    pub stream: String,
    /// `jetstream_max_age_s`.
    pub max_age: Duration,
    /// `jetstream_duplicate_window_s`.
    pub duplicate_window: Duration,
    /// `jetstream_replicas`.
    pub replicas: u64,
}

impl Default for StreamConfig {
    /// The documented defaults: the builder's, assembled without validation (they are
    /// valid: a unit test checks that the builder's defaults validate to this same
    /// value).
    fn default() -> Self {
        StreamConfigBuilder::default().assemble(SubjectTemplate::deployed(), NonZeroU32::MIN)
    }
}

/// Default `max_rate`, in thousandths: 1.5 × real time.
pub const DEFAULT_MAX_RATE_PERMILLE: u32 = 1500;
/// Largest `max_rate` accepted (1,000 × real time), in thousandths.
pub const MAX_MAX_RATE_PERMILLE: u32 = 1_000_000;

/// Getters of Copy fields: `name: T;` writes `pub fn name(&self) -> T` returning the
/// field.
macro_rules! getters {
    ($($(#[$doc:meta])* $name:ident: $ty:ty;)*) => {
        $(
            $(#[$doc])*
            pub fn $name(&self) -> $ty {
                self.$name
            }
        )*
    };
}

impl StreamConfig {
    /// A builder starting from the defaults.
    pub fn builder() -> StreamConfigBuilder {
        StreamConfigBuilder::default()
    }

    /// Byte budget per stream (queued + in flight), `max_bytes`.
    pub fn max_bytes(&self) -> usize {
        self.max_bytes.get()
    }
    /// Largest accepted frame, in bytes.
    pub fn max_frame_bytes(&self) -> usize {
        self.max_frame_bytes.get()
    }
    /// The frame subject template.
    pub fn subject(&self) -> &SubjectTemplate {
        &self.subject
    }

    getters! {
        /// Age budget of the oldest pending frame, `max_age_ms`.
        max_age: Duration;
        /// How long a full stream waits for room before overloading (`close`), `max_wait_ms`.
        max_wait: Duration;
        /// The full-queue policy.
        policy: Policy;
        /// Shadow mode: the budget is measured and `would_reject` counted, not enforced.
        /// A safety ceiling of `shadow_ceiling_factor` × the budget still applies the
        /// policy, so memory stays bounded even in shadow mode.
        shadow: bool;
        /// The shadow-mode safety factor.
        shadow_ceiling_factor: u32;
        /// Whether every consumer speaks the extended protocol (required for `gap`).
        extended_consumers: bool;
        /// Bound on one NATS publish call.
        publish_timeout: Duration;
        /// How long a stream keeps trying to hand its `end` to NATS.
        end_timeout: Duration;
        /// Partition count for a `{partition}` template.
        partitions: NonZeroU32;
        /// Whether frames also carry the weir headers (`Weir-Audio-Version`,
        /// `Weir-Captured-At-Ms`). Default `false`: the capture time travels in the packet
        /// meta (`captured_at_ms`) at no header cost — async-nats serialises a header map
        /// per message in its single connection task, which halves the publish rate. `end`
        /// and `gap` packets always carry headers.
        frame_headers: bool;
        /// How a frame counts as published (`delivery`).
        delivery: Delivery;
        /// The confirmation window's share of the admitted byte rate (`confirm_window_ms`).
        confirm_window: Duration;
        /// The confirmation window's smallest limit (`confirm_window_min_bytes`).
        confirm_window_min_bytes: u64;
        /// Minimum spacing of confirmation markers (`confirm_interval_ms`).
        confirm_interval: Duration;
        /// The rate bound in thousandths of real time (`max_rate` × 1000; 0 = no bound):
        /// a stream delivers at most this much audio per unit of time, sustained, with a
        /// burst of `max_bytes` + 2 s of audio (a producer catching up after a network
        /// stall). See [`crate::rate`].
        max_rate_permille: u32;
    }

    /// The multiple of the budget actually enforced: the shadow-ceiling factor in
    /// shadow mode, else 1.
    fn ceiling(&self) -> u32 {
        if self.shadow {
            self.shadow_ceiling_factor
        } else {
            1
        }
    }

    /// The rate bound applied: [`Self::max_rate_permille`], times the
    /// shadow-ceiling factor in shadow mode (0 = no bound).
    pub fn enforced_max_rate_permille(&self) -> u32 {
        self.max_rate_permille.saturating_mul(self.ceiling())
    }

    /// The JetStream stream for `delivery = "jetstream"`: it captures every subject of
    /// the subject template.
    pub fn jetstream(&self) -> crate::jetstream::JetStreamSettings {
        crate::jetstream::JetStreamSettings {
            stream: self.jetstream.stream.clone(),
            subjects: vec![self.subject.wildcard()],
            max_age: self.jetstream.max_age,
            duplicate_window: self.jetstream.duplicate_window,
            replicas: self.jetstream.replicas as usize,
        }
    }

    /// The byte bound actually enforced (the budget, or the shadow ceiling).
    pub fn enforced_max_bytes(&self) -> usize {
        self.max_bytes.get().saturating_mul(self.ceiling() as usize)
    }

    /// The age bound actually enforced (the budget, or the shadow ceiling).
    pub fn enforced_max_age(&self) -> Duration {
        self.max_age.saturating_mul(self.ceiling())
    }

    /// The wait bound actually enforced (the budget, or the shadow ceiling).
    pub fn enforced_max_wait(&self) -> Duration {
        self.max_wait.saturating_mul(self.ceiling())
    }
}

/// Builds a [`StreamConfig`]; [`build`](Self::build) validates every value.
///
/// The fields are the keys' values as configured, in the widths a configuration file
/// can hold (what a loader fills, and where `Default` shows the documented defaults);
/// the setters are the typed way to set them. Nothing is checked before
/// [`build`](Self::build).
#[derive(Debug, Clone)]
pub struct StreamConfigBuilder {
    /// `max_bytes`.
    pub max_bytes: u64,
    /// `max_age_ms`.
    pub max_age: Duration,
    /// `max_wait_ms`.
    pub max_wait: Duration,
    /// `policy`.
    pub policy: Policy,
    /// `shadow`.
    pub shadow: bool,
    /// `shadow_ceiling_factor`.
    pub shadow_ceiling_factor: u64,
    /// `extended_consumers`.
    pub extended_consumers: bool,
    /// `publish_timeout_ms`.
    pub publish_timeout: Duration,
    /// `end_timeout_ms`.
    pub end_timeout: Duration,
    /// `max_frame_bytes`.
    pub max_frame_bytes: u64,
    /// `subject`.
    pub subject: String,
    /// `partitions` (`None`: unset, 1 partition; required with `{partition}`).
    pub partitions: Option<u64>,
    /// `frame_headers`.
    pub frame_headers: bool,
    /// `delivery`.
    pub delivery: Delivery,
    /// `confirm_window_ms`.
    pub confirm_window: Duration,
    /// `confirm_window_min_bytes`.
    pub confirm_window_min_bytes: u64,
    /// `confirm_interval_ms`.
    pub confirm_interval: Duration,
    /// The `jetstream_*` keys.
    pub jetstream: JetStreamKeys,
    /// `max_rate` in thousandths of real time (0: no bound).
    pub max_rate_permille: u64,
}

impl Default for StreamConfigBuilder {
    fn default() -> Self {
        Self {
            max_bytes: DEFAULT_MAX_BYTES as u64,
            max_age: DEFAULT_MAX_AGE,
            max_wait: DEFAULT_MAX_WAIT,
            policy: Policy::Close,
            shadow: false,
            shadow_ceiling_factor: u64::from(DEFAULT_SHADOW_CEILING_FACTOR),
            extended_consumers: false,
            publish_timeout: DEFAULT_PUBLISH_TIMEOUT,
            end_timeout: DEFAULT_END_TIMEOUT,
            max_frame_bytes: DEFAULT_MAX_FRAME_BYTES as u64,
            subject: DEFAULT_STREAM_TEMPLATE.to_owned(),
            partitions: None,
            frame_headers: false,
            delivery: Delivery::Confirmed,
            confirm_window: DEFAULT_CONFIRM_WINDOW,
            confirm_window_min_bytes: DEFAULT_CONFIRM_WINDOW_MIN_BYTES,
            confirm_interval: DEFAULT_CONFIRM_INTERVAL,
            jetstream: JetStreamKeys {
                stream: DEFAULT_JETSTREAM_STREAM.to_owned(),
                max_age: DEFAULT_JETSTREAM_MAX_AGE,
                duplicate_window: DEFAULT_JETSTREAM_DUPLICATE_WINDOW,
                replicas: 1,
            },
            max_rate_permille: u64::from(DEFAULT_MAX_RATE_PERMILLE),
        }
    }
}

/// `d` of `key` within the range [`KEYS`] gives it, in milliseconds.
fn documented_ms(key: &str, d: Duration) -> Result<(), ConfigError> {
    let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    match ms {
        // A sub-millisecond duration is below any range that starts above 0.
        0 if !d.is_zero() => raw::range(key).check(key, 0).map(drop),
        ms => raw::range(key).check(key, ms).map(drop),
    }
}

/// `v` of `key` within the range [`KEYS`] gives it.
fn int_in(key: &str, v: u64) -> Result<u64, ConfigError> {
    raw::range(key).check(key, v)
}

fn nonzero(v: u64) -> NonZeroUsize {
    NonZeroUsize::new(usize::try_from(v).unwrap_or(usize::MAX)).unwrap_or(NonZeroUsize::MIN)
}

fn check_ms(key: &str, d: Duration, min_ms: u64, max_ms: u64) -> Result<(), ConfigError> {
    let ms = d.as_millis();
    if ms < u128::from(min_ms) || ms > u128::from(max_ms) || (min_ms > 0 && d.is_zero()) {
        return Err(ConfigError::out_of_range(
            key,
            format!("{ms} ms"),
            format!("{min_ms}..={max_ms} ms"),
        ));
    }
    Ok(())
}

/// Builder setters: `name(v: T) => field = expr;` writes `pub fn name(mut self, v: T)
/// -> Self` that stores `expr` (validated in [`StreamConfigBuilder::build`]).
macro_rules! setters {
    ($($(#[$doc:meta])* $name:ident($v:ident: $ty:ty) => $($field:ident).+ = $value:expr;)*) => {
        $(
            $(#[$doc])*
            pub fn $name(mut self, $v: $ty) -> Self {
                self.$($field).+ = $value;
                self
            }
        )*
    };
}

impl StreamConfigBuilder {
    setters! {
        /// `max_rate` in thousandths of real time (1,500 = 1.5×; 0 = no rate bound).
        max_rate_permille(v: u32) => max_rate_permille = u64::from(v);
        /// `max_bytes`: byte budget per stream.
        max_bytes(v: usize) => max_bytes = v as u64;
        /// `max_age_ms`: age budget of the oldest pending frame.
        max_age(v: Duration) => max_age = v;
        /// `max_wait_ms`: how long a full stream waits for room (`close`).
        max_wait(v: Duration) => max_wait = v;
        /// `policy`.
        policy(v: Policy) => policy = v;
        /// `shadow`.
        shadow(v: bool) => shadow = v;
        /// `shadow_ceiling_factor`.
        shadow_ceiling_factor(v: u32) => shadow_ceiling_factor = u64::from(v);
        /// `extended_consumers`.
        extended_consumers(v: bool) => extended_consumers = v;
        /// `publish_timeout_ms`.
        publish_timeout(v: Duration) => publish_timeout = v;
        /// `end_timeout_ms`.
        end_timeout(v: Duration) => end_timeout = v;
        /// `max_frame_bytes`.
        max_frame_bytes(v: usize) => max_frame_bytes = v as u64;
        /// `subject`: the frame subject template.
        subject(v: impl Into<String>) => subject = v.into();
        /// `partitions`: required when the subject has `{partition}`.
        partitions(v: u32) => partitions = Some(u64::from(v));
        /// `frame_headers`: see [`StreamConfig::frame_headers`].
        frame_headers(v: bool) => frame_headers = v;
        /// `delivery`: see [`StreamConfig::delivery`].
        delivery(v: Delivery) => delivery = v;
        /// `confirm_window_ms`.
        confirm_window(v: Duration) => confirm_window = v;
        /// `confirm_window_min_bytes`.
        confirm_window_min_bytes(v: u64) => confirm_window_min_bytes = v;
        /// `confirm_interval_ms`.
        confirm_interval(v: Duration) => confirm_interval = v;
        /// `jetstream_stream`.
        jetstream_stream(v: impl Into<String>) => jetstream.stream = v.into();
    }

    /// Validates every value; the error names the key and the allowed range.
    pub fn build(self) -> Result<StreamConfig, ConfigError> {
        let max_pcm = DEFAULT_MAX_PCM_BYTES as u64;
        if self.max_frame_bytes < 2 || self.max_frame_bytes > max_pcm {
            return Err(ConfigError::out_of_range(
                "max_frame_bytes",
                self.max_frame_bytes,
                format!("2..={max_pcm} (the packet limit)"),
            ));
        }
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
        documented_ms("max_age_ms", self.max_age)?;
        let max_age_ms = self.max_age.as_millis() as u64;
        check_ms("max_wait_ms", self.max_wait, 0, max_age_ms)?;
        check_ms("publish_timeout_ms", self.publish_timeout, 1, max_age_ms)?;
        documented_ms("end_timeout_ms", self.end_timeout)?;
        documented_ms("confirm_window_ms", self.confirm_window)?;
        // A marker per round: at most every max_age / 4, so a stall is seen well within
        // the age budget.
        check_ms(
            "confirm_interval_ms",
            self.confirm_interval,
            1,
            (max_age_ms / 4).max(1),
        )?;
        let js = &self.jetstream;
        if js.stream.is_empty()
            || js.stream.len() > 64
            || !js
                .stream
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            return Err(ConfigError::new(
                "jetstream_stream",
                ConfigErrorKind::Invalid,
                format!("{:?}: 1..=64 characters of A-Z a-z 0-9 _ -", js.stream),
            ));
        }
        check_ms("jetstream_max_age_s", js.max_age, 1_000, 604_800_000)?;
        check_ms(
            "jetstream_duplicate_window_s",
            js.duplicate_window,
            1_000,
            js.max_age.as_millis() as u64,
        )?;
        int_in("jetstream_replicas", js.replicas)?;
        let min_window = self.max_frame_bytes;
        if self.confirm_window_min_bytes < min_window
            || self.confirm_window_min_bytes > MAX_MAX_BYTES as u64
        {
            return Err(ConfigError::out_of_range(
                "confirm_window_min_bytes",
                self.confirm_window_min_bytes,
                format!("{min_window}..={MAX_MAX_BYTES} (at least max_frame_bytes)"),
            ));
        }
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
            (true, None) => {
                return Err(ConfigError::new(
                    "partitions",
                    ConfigErrorKind::Missing,
                    "required because subject contains {partition}",
                ));
            }
            (_, p) => p.unwrap_or(1),
        };
        if !(1..=u64::from(MAX_PARTITIONS)).contains(&partitions) {
            return Err(ConfigError::out_of_range(
                "partitions",
                partitions,
                format!("1..={MAX_PARTITIONS} (the consumer's bound too)"),
            ));
        }
        if self.max_rate_permille != 0
            && !(1000..=u64::from(MAX_MAX_RATE_PERMILLE)).contains(&self.max_rate_permille)
        {
            return Err(ConfigError::out_of_range(
                "max_rate",
                self.max_rate_permille as f64 / 1000.0,
                "0 (no bound) or 1.0..=1000",
            ));
        }
        let partitions = NonZeroU32::new(partitions as u32).unwrap_or(NonZeroU32::MIN);
        Ok(self.assemble(subject, partitions))
    }

    /// The [`StreamConfig`] of these values, with the parsed subject and partitions;
    /// [`Self::build`] validates them first.
    fn assemble(self, subject: SubjectTemplate, partitions: NonZeroU32) -> StreamConfig {
        StreamConfig {
            max_bytes: nonzero(self.max_bytes),
            max_age: self.max_age,
            max_wait: self.max_wait,
            policy: self.policy,
            shadow: self.shadow,
            shadow_ceiling_factor: self.shadow_ceiling_factor as u32,
            extended_consumers: self.extended_consumers,
            publish_timeout: self.publish_timeout,
            end_timeout: self.end_timeout,
            max_frame_bytes: nonzero(self.max_frame_bytes),
            subject,
            partitions,
            frame_headers: self.frame_headers,
            delivery: self.delivery,
            confirm_window: self.confirm_window,
            confirm_window_min_bytes: self.confirm_window_min_bytes,
            confirm_interval: self.confirm_interval,
            jetstream: self.jetstream,
            max_rate_permille: self.max_rate_permille as u32,
        }
    }
}
