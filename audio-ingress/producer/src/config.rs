//! The producer core's budget and policy ([`StreamConfig`], built with
//! [`StreamConfig::builder`]): what a producer using the library needs. `Default` is the
//! documented default and is valid.
//!
//! [`StreamConfigBuilder::build`] is the one validation of these values: a refusal is a
//! `ConfigError` naming the key and the allowed range, the range of [`KEYS`] where the
//! key has a numeric one (the `serve` binary's key table shows the same [`KEYS`]).

use std::num::{NonZeroU32, NonZeroUsize};
use std::time::Duration;

use weir_protocol::SubjectTemplate;

mod builder;

pub use builder::{KEYS, StreamConfigBuilder};

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
    jetstream: crate::jetstream::JetStreamSettings,
    max_rate_permille: u32,
}

impl Default for StreamConfig {
    /// The documented defaults: the builder's, validated.
    fn default() -> Self {
        StreamConfigBuilder::default()
            .build()
            .expect("the default keys are valid")
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
        self.jetstream.clone()
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
