//! Configuration: raw values (TOML file, `WEIR_INGRESS_<KEY>` environment variables,
//! command-line overrides) validated once into typed values that cannot be invalid.
//!
//! - [`StreamConfig`] — the producer core's budget and policy (what a Rust producer
//!   using the library needs). Built with [`StreamConfig::builder`]; `Default` is the
//!   documented default and is valid.
//! - [`ServerConfig`] — the `serve` front door (listeners, stream cap, timeouts).
//! - [`NatsConfig`] — the NATS connection (URL, auth, TLS, client timeouts): the
//!   settings type every weir client shares, `weir_service::nats`; the `nats_*` keys
//!   fill it and `NatsInput::validate` checks it.
//! - [`Config`] — all three, loaded by [`Config::load`] from [`ConfigSources`].
//!
//! Keys are flat snake_case names, one field each of the private `RawConfig` (serde,
//! `deny_unknown_fields`), merged by `weir_service::config` with precedence, lowest
//! first: defaults, the file, the environment, `--set key=value` and the dedicated
//! flags. Each default is written once, in the typed defaults (`StreamConfigBuilder`,
//! `ServerConfig`, `NatsConfig::named`) that `RawConfig::default` reads; [`key_table`]
//! (`--list-keys`, and the tables of docs/audio-ingress.md, which a test keeps equal)
//! is generated from it and [`SECTIONS`] (range and meaning); a fixed integer range
//! there (`min..=max`) is also the one the validation checks, written nowhere else.
//! Every refusal is a [`ConfigError`] naming the key (a misspelled variable: the
//! variable), where the value came from and, for numbers, the allowed range. Durations
//! are configured in milliseconds (`*_ms`) or seconds (`*_s`) and carried as
//! [`Duration`] inside the code.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::num::{NonZeroU32, NonZeroUsize};
use std::path::{Path, PathBuf};
use std::time::Duration;

use weir_protocol::SubjectTemplate;
use weir_protocol::audio::packet::DEFAULT_MAX_PCM_BYTES;
use weir_protocol::partition::{DEFAULT_STREAM_TEMPLATE, MAX_PARTITIONS};

use weir_service::admin::RequestLimits;
use weir_service::config::keys::{self, KeyDoc, Section};
use weir_service::config::{Layers, LoadError, LoadErrorKind, Origin};
use weir_service::http::BodyLimits;
use weir_service::nats::{FieldErrorKind, NatsInput};
pub use weir_service::nats::{NatsAuth, NatsConfig, NatsTls};

use crate::error::{ConfigError, ConfigErrorKind};

/// Prefix of the environment variables: `WEIR_INGRESS_MAX_BYTES` sets `max_bytes`. A
/// variable under it that is not a key is refused (exit 2, naming it), except those in
/// [`ENV_NOT_KEYS`].
pub const ENV_PREFIX: &str = "WEIR_INGRESS_";

/// Variables under [`ENV_PREFIX`] that are not configuration keys: `WEIR_INGRESS_BIN`
/// (where the load test finds this binary; it is inherited by the ingress it starts)
/// and the variable of the `--log-format` flag (`WEIR_INGRESS_LOG_FORMAT`).
pub const ENV_NOT_KEYS: &[&str] = &["BIN", "LOG_FORMAT"];

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

/// The `jetstream_*` keys (used with `delivery = "jetstream"`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct JetStreamKeys {
    stream: String,
    max_age: Duration,
    duplicate_window: Duration,
    replicas: u64,
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
#[derive(Debug, Clone)]
pub struct StreamConfigBuilder {
    max_bytes: u64,
    max_age: Duration,
    max_wait: Duration,
    policy: Policy,
    shadow: bool,
    shadow_ceiling_factor: u64,
    extended_consumers: bool,
    publish_timeout: Duration,
    end_timeout: Duration,
    max_frame_bytes: u64,
    subject: String,
    partitions: Option<u64>,
    frame_headers: bool,
    delivery: Delivery,
    confirm_window: Duration,
    confirm_window_min_bytes: u64,
    confirm_interval: Duration,
    jetstream: JetStreamKeys,
    max_rate_permille: u64,
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

fn out_of_range(key: &str, shown: impl fmt::Display, range: impl fmt::Display) -> ConfigError {
    ConfigError::new(
        key,
        ConfigErrorKind::OutOfRange,
        format!("{shown} is out of range; allowed {range}"),
    )
}

/// `d` of `key` within the range [`SECTIONS`] gives it, in milliseconds.
fn documented_ms(key: &str, d: Duration) -> Result<(), ConfigError> {
    let (min_ms, max_ms) = documented_range(key)?;
    check_ms(key, d, min_ms, max_ms)
}

fn check_ms(key: &str, d: Duration, min_ms: u64, max_ms: u64) -> Result<(), ConfigError> {
    let ms = d.as_millis();
    if ms < u128::from(min_ms) || ms > u128::from(max_ms) || (min_ms > 0 && d.is_zero()) {
        return Err(out_of_range(
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
            return Err(out_of_range(
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
            return Err(out_of_range(
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
            return Err(out_of_range(
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
            return Err(out_of_range(
                "partitions",
                partitions,
                format!("1..={MAX_PARTITIONS} (the consumer's bound too)"),
            ));
        }
        if self.max_rate_permille != 0
            && !(1000..=u64::from(MAX_MAX_RATE_PERMILLE)).contains(&self.max_rate_permille)
        {
            return Err(out_of_range(
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

/// The validated settings of the `serve` front door.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// WebSocket listener (`listen`).
    pub listen: SocketAddr,
    /// Admin HTTP listener (`admin`).
    pub admin: SocketAddr,
    /// Concurrent stream cap (`max_streams`).
    pub max_streams: NonZeroUsize,
    /// `Retry-After` sent with a 503 (`retry_after_s`).
    pub retry_after: Duration,
    /// A WebSocket silent for this long is ended with reason `idle` (`idle_timeout_ms`).
    pub idle_timeout: Duration,
    /// Bound on one send to a WebSocket client (`ws_send_timeout_ms`): a client that
    /// stops reading is abandoned after it, its stream ended with `producer_gone`.
    pub ws_send_timeout: Duration,
    /// Time allowed to finish every stream on SIGTERM/SIGINT (`grace_period_ms`).
    pub grace_period: Duration,
    /// Open TCP connections on the WebSocket port, upgraded or not (`max_connections`).
    pub max_connections: NonZeroUsize,
    /// Open TCP connections on the WebSocket port from one client address, IPv4 or
    /// IPv6 /64 (`max_connections_per_ip`; unset: a quarter of `max_connections`); at
    /// most `max_connections`.
    pub max_connections_per_ip: NonZeroUsize,
    /// Open TCP connections on the admin port (`admin_max_connections`); a separate
    /// cap, so `/readyz` and `/metrics` answer while the WebSocket port is full.
    pub admin_max_connections: NonZeroUsize,
    /// Bound on receiving a request head on either port (`http_header_timeout_ms`).
    pub http_header_timeout: Duration,
    /// A connection that moves no byte for this long before an upgrade is closed
    /// (`http_idle_timeout_ms`).
    pub http_idle_timeout: Duration,
    /// Largest request head buffered (`http_max_header_bytes`).
    pub http_max_header_bytes: usize,
    /// Bounds on reading a request body, both ports (`http_body_timeout_ms`,
    /// `http_body_min_rate`).
    pub http_body: BodyLimits,
    /// Per-request bounds of the admin routes (`admin_request_timeout_ms`,
    /// `admin_max_concurrent_requests`).
    pub admin_request_limits: RequestLimits,
    /// Producer authentication (`auth_required` and its keys); `None`: off.
    pub auth: Option<crate::auth::AuthConfig>,
    /// WHIP ingest (`whip_udp_listen` and the `whip_*` keys); `None`: off.
    pub whip: Option<WhipConfig>,
}

/// The validated settings of WHIP ingest ([`crate::whip`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WhipConfig {
    /// The one UDP socket of every WHIP session (`whip_udp_listen`).
    pub udp_listen: SocketAddr,
    /// The addresses offered to publishers as ICE host candidates, with the UDP port
    /// (`whip_advertise_ips`; default the listen address).
    pub advertise: Vec<IpAddr>,
    /// A session that has not connected ICE and DTLS within this ends
    /// (`whip_connect_timeout_ms`).
    pub connect_timeout: Duration,
    /// ICE disconnected, or no datagram from the publisher, for this long ends the
    /// stream with `producer_gone` (`whip_disconnect_timeout_ms`).
    pub disconnect_timeout: Duration,
    /// Concurrent WHIP sessions (`whip_max_sessions`).
    pub max_sessions: NonZeroUsize,
    /// Concurrent WHIP sessions from one client address, IPv4 or IPv6 /64
    /// (`whip_max_sessions_per_ip`; unset: a quarter of `whip_max_sessions`).
    pub max_sessions_per_ip: NonZeroUsize,
    /// Whether the ICE agent may check candidates on addresses other than the HTTP
    /// client's (`whip_allow_foreign_candidates`).
    pub allow_foreign_candidates: bool,
}

/// Default `whip_connect_timeout_ms`.
pub const DEFAULT_WHIP_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default `whip_disconnect_timeout_ms`.
pub const DEFAULT_WHIP_DISCONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Default `whip_max_sessions`.
pub const DEFAULT_WHIP_MAX_SESSIONS: usize = 256;

/// Default `max_connections`.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// Default `max_connections_per_ip`: a quarter of the connection cap.
pub const DEFAULT_MAX_CONNECTIONS_PER_IP: usize = DEFAULT_MAX_CONNECTIONS / 4;

/// A quarter of `max`, at least 1: the default per-address share of a cap.
pub fn quarter_of(max: u64) -> u64 {
    (max / 4).max(1)
}
/// Default `admin_max_connections`.
pub const DEFAULT_ADMIN_MAX_CONNECTIONS: usize = 64;
/// Default `http_header_timeout_ms`.
pub const DEFAULT_HTTP_HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// Default `http_idle_timeout_ms`.
pub const DEFAULT_HTTP_IDLE_TIMEOUT: Duration = Duration::from_secs(10);
/// Default `http_max_header_bytes`.
pub const DEFAULT_HTTP_MAX_HEADER_BYTES: usize = 16 * 1024;

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            admin: SocketAddr::from(([127, 0, 0, 1], 9090)),
            max_streams: NonZeroUsize::MIN.saturating_add(999),
            retry_after: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(30),
            ws_send_timeout: Duration::from_secs(2),
            grace_period: Duration::from_secs(5),
            max_connections: NonZeroUsize::MIN.saturating_add(DEFAULT_MAX_CONNECTIONS - 1),
            max_connections_per_ip: NonZeroUsize::MIN
                .saturating_add(DEFAULT_MAX_CONNECTIONS_PER_IP - 1),
            admin_max_connections: NonZeroUsize::MIN
                .saturating_add(DEFAULT_ADMIN_MAX_CONNECTIONS - 1),
            http_header_timeout: DEFAULT_HTTP_HEADER_TIMEOUT,
            http_idle_timeout: DEFAULT_HTTP_IDLE_TIMEOUT,
            http_max_header_bytes: DEFAULT_HTTP_MAX_HEADER_BYTES,
            http_body: BodyLimits::default(),
            admin_request_limits: RequestLimits::default(),
            auth: None,
            whip: None,
        }
    }
}

/// The client name `serve` connects with (shown by the server).
pub const NATS_CLIENT_NAME: &str = "weir-audio-ingress";

/// The complete validated configuration of `audio-ingress serve`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Per-stream budget and policy.
    pub stream: StreamConfig,
    /// Front door.
    pub server: ServerConfig,
    /// NATS connection.
    pub nats: NatsConfig,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            stream: StreamConfig::default(),
            server: ServerConfig::default(),
            nats: NatsConfig::named(NATS_CLIENT_NAME),
        }
    }
}

const fn doc(name: &'static str, range: &'static str, help: &'static str) -> KeyDoc {
    KeyDoc { name, range, help }
}

/// Range and meaning of every key, in the order `--list-keys` and the docs show them
/// (name, type and default come from `RawConfig::default`; a unit test checks that
/// these cover exactly its fields).
pub const SECTIONS: &[Section] = &[
    Section {
        name: "stream",
        keys: &[
            doc(
                "max_bytes",
                "2×`max_frame_bytes`..=67108864",
                "PCM byte budget per stream (queued + in flight + unconfirmed); each frame is charged at least 160 bytes (5 ms), so a stream holds at most `max_bytes` / 160 frames",
            ),
            doc(
                "max_rate",
                "0 (no bound) or 1.0..=1000",
                "rate bound in audio time: a stream delivers at most `max_rate` × real time sustained, with a burst of `max_bytes` + 2 s of audio (catching up after a network stall); beyond it the policy applies (close: overload, reason rate; gap: dropped into a marker). Shadow mode enforces `shadow_ceiling_factor` × it",
            ),
            doc(
                "max_age_ms",
                "20..=60000",
                "age budget of the oldest pending frame",
            ),
            doc(
                "max_wait_ms",
                "0..=`max_age_ms`",
                "`close`: how long a full stream may stay full before it overloads; what `push` waits at most",
            ),
            doc(
                "policy",
                "`close` or `gap`",
                "what a stream does when its budget is exhausted",
            ),
            doc(
                "extended_consumers",
                "",
                "every consumer of the subject speaks the extended protocol; required by `policy = \"gap\"`",
            ),
            doc(
                "shadow",
                "",
                "measure the budget and count `would_reject`; enforce only the ceiling",
            ),
            doc(
                "shadow_ceiling_factor",
                "2..=64",
                "shadow mode: the policy still applies at this multiple of the budget",
            ),
            doc(
                "publish_timeout_ms",
                "1..=`max_age_ms`",
                "bound on one NATS publish call",
            ),
            doc(
                "end_timeout_ms",
                "100..=300000",
                "how long a closing stream keeps trying to hand its `end` (and last gap marker) to NATS",
            ),
            doc(
                "max_frame_bytes",
                "even, 2..=32000",
                "largest accepted frame (WebSocket binary message)",
            ),
            doc(
                "frame_headers",
                "",
                "frames also carry the `Weir-Audio-Version` and `Weir-Captured-At-Ms` headers. The capture time is always in the meta (`captured_at_ms`); headers halve throughput. `end` and `gap` always carry headers",
            ),
            doc(
                "delivery",
                "`confirmed`, `unconfirmed` or `jetstream`",
                "`confirmed`: a frame is pending until the server confirms it (the budget holds up to the server); `unconfirmed`: published once handed to the client (comparison only); `jetstream`: lossless mode, frames stored in a JetStream stream (see `jetstream_*`)",
            ),
            doc(
                "confirm_window_ms",
                "10..=10000",
                "unconfirmed bytes per connection are limited to this much of the admitted byte rate",
            ),
            doc(
                "confirm_window_min_bytes",
                "`max_frame_bytes`..=67108864",
                "the window's floor (one stream's budget)",
            ),
            doc(
                "confirm_interval_ms",
                "1..=`max_age_ms`/4",
                "minimum spacing of confirmation markers (one in flight)",
            ),
            doc(
                "jetstream_stream",
                "1..=64 of `A-Za-z0-9_-`",
                "`delivery = \"jetstream\"`: the stream (created if missing), capturing the subject template",
            ),
            doc(
                "jetstream_max_age_s",
                "1..=604800",
                "how long the stream keeps audio",
            ),
            doc(
                "jetstream_duplicate_window_s",
                "1..=`jetstream_max_age_s`",
                "`Nats-Msg-Id` deduplication window (retries within it are stored once)",
            ),
            doc("jetstream_replicas", "1..=5", "stream replicas"),
            doc(
                "subject",
                "template: `{stream}` once, `{partition}` at most once, no wildcards",
                "frame subject",
            ),
            doc(
                "partitions",
                "0 (unset: 1 partition) or 1..=4096 (the consumer core's bound: one subscription per owned partition); required with `{partition}`",
                "N of `FNV-1a-32(stream id) mod N`",
            ),
        ],
    },
    Section {
        name: "server",
        keys: &[
            doc(
                "listen",
                "socket address; port 0 = any free port",
                "WebSocket listener",
            ),
            doc(
                "admin",
                "socket address; port 0 = any free port",
                "admin HTTP listener",
            ),
            doc(
                "max_streams",
                "1..=1000000",
                "concurrent streams (including those still delivering their `end`); above: 503 + `Retry-After`",
            ),
            doc("retry_after_s", "1..=3600", "`Retry-After` of a 503"),
            doc(
                "idle_timeout_ms",
                "100..=86400000",
                "a WebSocket that sends no frame for this long is ended (reason `idle`, close 1001; pings do not count)",
            ),
            doc(
                "ws_send_timeout_ms",
                "10..=60000",
                "bound on each send to a WebSocket client (event or close frame); a client that stops reading is abandoned after it (stream ends `producer_gone`)",
            ),
            doc(
                "grace_period_ms",
                "0..=600000",
                "SIGTERM/SIGINT: time to finish every stream",
            ),
            doc(
                "whip_udp_listen",
                "UDP socket address; port 0 = any free port; empty = WHIP off",
                "WHIP ingest (`POST /v1/whip/{stream_id}` on the listen port): the one UDP socket of every session",
            ),
            doc(
                "whip_advertise_ips",
                "comma-separated IP addresses (at most 8); empty = the `whip_udp_listen` IP, which must then be specified",
                "ICE host candidates offered to WHIP publishers (public or NAT 1:1 addresses), on the `whip_udp_listen` port",
            ),
            doc(
                "whip_connect_timeout_ms",
                "1000..=120000",
                "a WHIP session that has not connected ICE and DTLS within this ends (`producer_gone`)",
            ),
            doc(
                "whip_disconnect_timeout_ms",
                "500..=120000",
                "ICE disconnected, or no datagram from the publisher, this long ends the stream (`producer_gone`)",
            ),
            doc(
                "whip_max_sessions",
                "1..=100000",
                "concurrent WHIP sessions (503 + `Retry-After` above it); WHIP streams also count in `max_streams`",
            ),
            doc(
                "whip_max_sessions_per_ip",
                "0..=100000; at most `whip_max_sessions`; 0 = a quarter of `whip_max_sessions`",
                "concurrent WHIP sessions from one IPv4 address or IPv6 /64 (503 `max_sessions_per_ip` + `Retry-After` above it)",
            ),
            doc(
                "whip_allow_foreign_candidates",
                "`true` or `false`",
                "`false`: the ICE agent checks only the offer's candidates on the HTTP client's own address (others are dropped from the offer, so no STUN goes to a third party); `true`: every candidate (a publisher behind an HTTP proxy or on another network path)",
            ),
            doc(
                "auth_required",
                "`true` needs exactly one key below",
                "producers must present a signed token (JWT) before the upgrade: 401 missing/invalid, 403 out of scope; on in production",
            ),
            doc(
                "auth_hs256_secret",
                "at least 32 bytes; or `auth_eddsa_public_key`",
                "HS256 shared secret of producer tokens; never logged (set it by `WEIR_INGRESS_AUTH_HS256_SECRET` rather than on the command line)",
            ),
            doc(
                "auth_eddsa_public_key",
                "32-byte Ed25519 public key, base64url (43 characters); or `auth_hs256_secret`",
                "EdDSA verification key of producer tokens (the signer keeps the private key)",
            ),
            doc(
                "auth_leeway_s",
                "0..=300",
                "clock skew allowed on a token's `exp` and `nbf`",
            ),
            doc(
                "max_connections",
                "1..=1000000; `max_connections` + `admin_max_connections` + 64 <= the hard `RLIMIT_NOFILE`",
                "open TCP connections on the WebSocket port, upgraded or not; above: refused at accept (503 JSON, closed)",
            ),
            doc(
                "max_connections_per_ip",
                "0..=1000000; at most `max_connections`; 0 = a quarter of `max_connections`",
                "open connections on the WebSocket port from one IPv4 address or IPv6 /64",
            ),
            doc(
                "admin_max_connections",
                "1..=10000",
                "open TCP connections on the admin port (a separate cap: `/readyz` and `/metrics` answer while the WebSocket port is full); when it is full, a new connection takes the slot of the one that has waited longest for a request head",
            ),
            doc(
                "admin_request_timeout_ms",
                "100..=600000",
                "an admin request (probes included) still running after this is answered `503` `timeout`",
            ),
            doc(
                "admin_max_concurrent_requests",
                "1..=1024",
                "admin requests to `/metrics` and `/v1/*` running at once; one more is answered `503` `overloaded` (`/healthz`, `/readyz` not counted)",
            ),
            doc(
                "http_header_timeout_ms",
                "100..=600000",
                "both ports: a connection must deliver a complete request head within this, counted from accept (and from the end of the previous response on a keep-alive connection); else it is closed",
            ),
            doc(
                "http_idle_timeout_ms",
                "100..=3600000",
                "both ports: a connection that moves no byte in either direction for this long before an upgrade is closed",
            ),
            doc(
                "http_body_timeout_ms",
                "100..=600000",
                "both ports: a request body must be complete within this of its head; else the request fails (WHIP: 408 `body_timeout`) and the connection is closed",
            ),
            doc(
                "http_body_min_rate",
                "0..=1073741824",
                "both ports: bytes/s a request body must average from 1 s after its head on (0 = no rate bound); slower: as `http_body_timeout_ms`",
            ),
            doc(
                "http_max_header_bytes",
                "8192..=1048576",
                "largest request head buffered per connection; a larger one is refused (431)",
            ),
        ],
    },
    Section {
        name: "nats",
        keys: &[
            doc("nats_url", "comma-separated NATS URLs", "servers"),
            doc("nats_name", "non-empty", "client name shown by the server"),
            doc(
                "nats_user",
                "with `nats_password`",
                "user/password authentication",
            ),
            doc(
                "nats_password",
                "with `nats_user`",
                "user/password authentication",
            ),
            doc("nats_token", "", "token authentication"),
            doc(
                "nats_nkey",
                "an NKey user seed (`SU...`)",
                "NKey authentication",
            ),
            doc(
                "nats_creds_file",
                "an existing file",
                "JWT credentials file",
            ),
            doc("nats_tls_required", "", "require TLS"),
            doc("nats_tls_ca_file", "an existing PEM file", "extra root CAs"),
            doc(
                "nats_tls_cert_file",
                "an existing PEM file, with `nats_tls_key_file`",
                "client certificate",
            ),
            doc(
                "nats_tls_key_file",
                "an existing PEM file, with `nats_tls_cert_file`",
                "client key",
            ),
            doc(
                "nats_inbox_prefix",
                "1..=8 tokens of `A-Z a-z 0-9 _ -`, dot-separated, ≤ 128 bytes",
                "prefix of the client's inboxes (the confirmation marker \
                 `<prefix>.<nuid>.weir-confirm`): the user's own, e.g. `_INBOX.ingress` \
                 (deploy/nats-server.conf)",
            ),
            doc(
                "nats_connection_timeout_ms",
                "100..=60000",
                "per-attempt connect timeout",
            ),
            doc(
                "nats_ping_interval_ms",
                "100..=600000",
                "PING interval: a silent server is declared dead after 2–3 of these",
            ),
            doc(
                "nats_client_capacity",
                "16..=1048576",
                "messages async-nats buffers (shared by all streams) before `publish` blocks",
            ),
        ],
    },
];

/// Every key with its type, default, range and meaning: aligned text for
/// `--list-keys`, or the Markdown tables of docs/audio-ingress.md (each between its
/// `<!-- keys:NAME -->` markers) for `--list-keys --markdown`.
pub fn key_table(markdown: bool) -> String {
    keys::table(&Layers::new(&RawConfig::default()), SECTIONS, markdown)
}

/// Default `auth_leeway_s`: clock skew allowed on a token's `exp` and `nbf`.
pub const DEFAULT_AUTH_LEEWAY_S: u64 = 5;

/// The keys as read from the layers, before validation: one field per key, flat
/// snake_case names. `Default` is the documented default of every key (written once:
/// it reads the typed defaults above), and the key table is generated from it.
/// Secret fields make a `Debug` impl unwise; there is none.
#[derive(Clone, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawConfig {
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
    listen: String,
    admin: String,
    max_streams: u64,
    retry_after_s: u64,
    idle_timeout_ms: u64,
    ws_send_timeout_ms: u64,
    max_connections: u64,
    max_connections_per_ip: u64,
    admin_max_connections: u64,
    http_header_timeout_ms: u64,
    http_idle_timeout_ms: u64,
    http_max_header_bytes: u64,
    http_body_timeout_ms: u64,
    http_body_min_rate: u64,
    admin_request_timeout_ms: u64,
    admin_max_concurrent_requests: u64,
    auth_required: bool,
    auth_hs256_secret: String,
    auth_eddsa_public_key: String,
    auth_leeway_s: u64,
    whip_udp_listen: String,
    whip_advertise_ips: String,
    whip_connect_timeout_ms: u64,
    whip_disconnect_timeout_ms: u64,
    whip_max_sessions: u64,
    /// 0: a quarter of `whip_max_sessions`.
    whip_max_sessions_per_ip: u64,
    whip_allow_foreign_candidates: bool,
    grace_period_ms: u64,
    nats_url: String,
    nats_name: String,
    nats_user: String,
    nats_password: String,
    nats_token: String,
    nats_nkey: String,
    nats_creds_file: String,
    nats_tls_required: bool,
    nats_tls_ca_file: String,
    nats_tls_cert_file: String,
    nats_tls_key_file: String,
    nats_inbox_prefix: String,
    nats_connection_timeout_ms: u64,
    nats_ping_interval_ms: u64,
    nats_client_capacity: u64,
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Default for RawConfig {
    fn default() -> Self {
        let b = StreamConfigBuilder::default();
        let s = ServerConfig::default();
        let n = NatsConfig::named(NATS_CLIENT_NAME);
        let count = |v: NonZeroUsize| v.get() as u64;
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
            listen: s.listen.to_string(),
            admin: s.admin.to_string(),
            max_streams: count(s.max_streams),
            retry_after_s: s.retry_after.as_secs(),
            idle_timeout_ms: ms(s.idle_timeout),
            ws_send_timeout_ms: ms(s.ws_send_timeout),
            max_connections: count(s.max_connections),
            // Unset: derived from `max_connections` as it is configured.
            max_connections_per_ip: 0,
            admin_max_connections: count(s.admin_max_connections),
            http_header_timeout_ms: ms(s.http_header_timeout),
            http_idle_timeout_ms: ms(s.http_idle_timeout),
            http_max_header_bytes: s.http_max_header_bytes as u64,
            http_body_timeout_ms: ms(s.http_body.timeout),
            http_body_min_rate: s.http_body.min_rate,
            admin_request_timeout_ms: ms(s.admin_request_limits.timeout),
            admin_max_concurrent_requests: count(s.admin_request_limits.max_concurrent),
            auth_required: false,
            auth_hs256_secret: String::new(),
            auth_eddsa_public_key: String::new(),
            auth_leeway_s: DEFAULT_AUTH_LEEWAY_S,
            whip_udp_listen: String::new(),
            whip_advertise_ips: String::new(),
            whip_connect_timeout_ms: ms(DEFAULT_WHIP_CONNECT_TIMEOUT),
            whip_disconnect_timeout_ms: ms(DEFAULT_WHIP_DISCONNECT_TIMEOUT),
            whip_max_sessions: DEFAULT_WHIP_MAX_SESSIONS as u64,
            whip_max_sessions_per_ip: 0,
            whip_allow_foreign_candidates: false,
            grace_period_ms: ms(s.grace_period),
            nats_url: n.url_list(),
            nats_name: n.name,
            nats_user: String::new(),
            nats_password: String::new(),
            nats_token: String::new(),
            nats_nkey: String::new(),
            nats_creds_file: String::new(),
            nats_tls_required: n.tls.required,
            nats_tls_ca_file: String::new(),
            nats_tls_cert_file: String::new(),
            nats_tls_key_file: String::new(),
            nats_inbox_prefix: n.inbox_prefix,
            nats_connection_timeout_ms: ms(n.connection_timeout),
            nats_ping_interval_ms: ms(n.ping_interval),
            nats_client_capacity: n.client_capacity as u64,
        }
    }
}

/// Where configuration comes from, lowest precedence first.
#[derive(Debug, Clone, Default)]
pub struct ConfigSources {
    /// A TOML file of `key = value` lines.
    pub file: Option<PathBuf>,
    /// Environment variables (pass `std::env::vars()`); only `WEIR_INGRESS_*` are read.
    pub env: Vec<(String, String)>,
    /// `key=value` overrides from the command line, applied last in order.
    pub overrides: Vec<(String, String)>,
}

/// A decimal value in thousandths (rounded); `None` for a negative, NaN or huge value.
fn permille(v: f64) -> Option<u64> {
    (v.is_finite() && (0.0..=1e12).contains(&v)).then(|| (v * 1000.0).round() as u64)
}

/// Idle RSS allowance in [`Config::memory_bound_bytes`] (measured idle: ~17 MiB).
const IDLE_ALLOWANCE_BYTES: u64 = 32 << 20;

impl Config {
    /// The most memory this configuration lets one `serve` replica hold: an idle
    /// allowance (32 MiB) plus the worst case of every buffer in docs/operations.md
    /// § Memory, computed from these settings (≈ 325 MiB at the defaults). Exported as
    /// `weir_ingress_memory_bound_bytes` for the "RSS near the bound" alert.
    pub fn memory_bound_bytes(&self) -> u64 {
        let s = &self.stream;
        let streams = self.server.max_streams.get() as u64;
        // The PCM budget (× the shadow ceiling in shadow mode), charged at least 160 B a
        // frame; each queued frame also costs ~200 B of meta and slot, and a stream
        // holds up to one packet arena (4 KiB) and its gap markers (40 B a frame).
        let budget = s.enforced_max_bytes() as u64;
        let frames = budget / crate::queue::MIN_FRAME_CHARGE as u64 + 1;
        let per_stream_queue = budget + frames * (200 + 40) + 4096;
        // WebSocket buffers: read up to the largest message, write up to 64 KiB.
        let per_stream_ws = s.max_frame_bytes() as u64 + (64 << 10) + (64 << 10);
        // The NATS client's command channel: every slot a largest packet (+ meta,
        // headers).
        let nats = self.nats.client_capacity as u64 * (s.max_frame_bytes() as u64 + 1024);
        // Request heads of open connections on both ports (+ ~12 KiB of state each).
        let heads = (self.server.max_connections.get() + self.server.admin_max_connections.get())
            as u64
            * (self.server.http_max_header_bytes as u64 + (12 << 10));
        // With WHIP on, every connection may be reading an offer (at most 64 KiB
        // buffered, for at most `http_body_timeout_ms`).
        let offers = if self.server.whip.is_some() {
            self.server.max_connections.get() as u64 * crate::whip::MAX_OFFER_BYTES as u64
        } else {
            0
        };
        // Metrics, per-address table, `/v1/streams`, confirmation markers.
        let misc = 5 << 20;
        IDLE_ALLOWANCE_BYTES
            + streams * (per_stream_queue + per_stream_ws)
            + nats
            + heads
            + offers
            + misc
    }

    /// Loads and validates the configuration from `sources`: every key is refused or
    /// accepted whichever layer set it, and a refusal names the key and, when the value
    /// was not a default, where it came from.
    pub fn load(sources: &ConfigSources) -> Result<Self, ConfigError> {
        let mut layers = Layers::new(&RawConfig::default());
        if let Some(path) = &sources.file {
            layers.file(path).map_err(from_load)?;
        }
        layers.env(ENV_PREFIX, sources.env.iter().cloned(), ENV_NOT_KEYS);
        for (key, value) in &sources.overrides {
            layers.set_text(key, value, Origin::CommandLine);
        }
        let raw: RawConfig = layers.build().map_err(from_load)?;
        raw.validate().map_err(|e| match layers.origin(e.key()) {
            Origin::Default => e,
            origin => ConfigError::new(
                e.key(),
                e.kind(),
                format!("{} (from {origin})", e.message()),
            ),
        })
    }
}

/// The loader's refusal in this crate's terms. A misspelled variable is named by the
/// variable (what the operator has to fix), every other refusal by the key.
fn from_load(e: LoadError) -> ConfigError {
    let kind = match e.kind() {
        LoadErrorKind::UnknownKey => ConfigErrorKind::UnknownKey,
        LoadErrorKind::WrongType => ConfigErrorKind::WrongType,
        LoadErrorKind::InvalidValue if e.message().contains("invalid value: integer") => {
            ConfigErrorKind::OutOfRange
        }
        LoadErrorKind::InvalidValue => ConfigErrorKind::Invalid,
        LoadErrorKind::File => ConfigErrorKind::File,
    };
    let hint = match kind {
        ConfigErrorKind::UnknownKey => " (see `audio-ingress serve --list-keys`)",
        _ => "",
    };
    let (key, message) = match (kind, e.origin()) {
        // The variable is what the operator has to fix.
        (ConfigErrorKind::UnknownKey, Origin::Env(var)) => {
            (var.clone(), format!("{}{hint}", e.message()))
        }
        (ConfigErrorKind::File, _) => (e.key().to_owned(), e.message().to_owned()),
        (_, origin) => (
            e.key().to_owned(),
            format!("{} (from {origin}){hint}", e.message()),
        ),
    };
    ConfigError::new(key, kind, message)
}

/// `v` of `key` within `min..=max`.
fn int_between(key: &str, v: u64, min: u64, max: u64) -> Result<u64, ConfigError> {
    if v < min || v > max {
        return Err(out_of_range(key, v, format!("{min}..={max}")));
    }
    Ok(v)
}

/// `v` of `key` within the range [`SECTIONS`] gives it: the key table and the
/// validation read the same `min..=max` (the range text up to a `;`).
fn int_in(key: &str, v: u64) -> Result<u64, ConfigError> {
    let (min, max) = documented_range(key)?;
    int_between(key, v, min, max)
}

/// The `min..=max` written for `key` in [`SECTIONS`]; a key without a numeric range
/// there is a bug, refused rather than left unchecked (every key that is checked this
/// way is read when the defaults load, which a unit test does).
fn documented_range(key: &str) -> Result<(u64, u64), ConfigError> {
    let range = SECTIONS.iter().flat_map(|s| s.keys).find(|d| d.name == key);
    range
        .and_then(|d| d.range.split(';').next()?.split_once("..="))
        .and_then(|(min, max)| Some((min.trim().parse().ok()?, max.trim().parse().ok()?)))
        .ok_or_else(|| ConfigError::new(key, ConfigErrorKind::Invalid, "no documented range"))
}

/// `int!(raw, key)`: [`int_in`] of the field `key`, named by the field;
/// `millis!(raw, key)`: the same as a [`Duration`] of milliseconds.
macro_rules! int {
    ($raw:ident, $key:ident) => {
        int_in(stringify!($key), $raw.$key)
    };
}
macro_rules! millis {
    ($raw:ident, $key:ident) => {
        int!($raw, $key).map(Duration::from_millis)
    };
}

/// The first of `keys` whose value differs between two [`RawConfig`]s, by name.
macro_rules! first_changed {
    ($a:ident, $b:ident, $($key:ident),+) => {
        [$((stringify!($key), $a.$key != $b.$key)),+]
            .into_iter()
            .find_map(|(key, changed)| changed.then_some(key))
    };
}

/// A socket address key; the refusal shows `example`.
fn addr(key: &str, text: &str, example: &str) -> Result<SocketAddr, ConfigError> {
    text.parse().map_err(|_| {
        ConfigError::new(
            key,
            ConfigErrorKind::Invalid,
            format!("{text:?} is not a socket address like {example}"),
        )
    })
}

/// `Some(text)` unless empty (an empty string is "unset" for the optional keys).
fn set(text: &str) -> Option<&str> {
    (!text.is_empty()).then_some(text)
}

/// A path key: `None` when empty.
fn path(text: &str) -> Option<&Path> {
    set(text).map(Path::new)
}

impl RawConfig {
    /// Validates every value into the typed settings.
    fn validate(self) -> Result<Config, ConfigError> {
        Ok(Config {
            stream: self.stream()?,
            server: self.server()?,
            nats: self.nats()?,
        })
    }

    fn stream(&self) -> Result<StreamConfig, ConfigError> {
        let max_rate_permille = permille(self.max_rate)
            .ok_or_else(|| out_of_range("max_rate", self.max_rate, "0 (no bound) or 1.0..=1000"))?;
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
                max_age: Duration::from_secs(self.jetstream_max_age_s.min(u64::MAX / 2_000)),
                duplicate_window: Duration::from_secs(
                    self.jetstream_duplicate_window_s.min(u64::MAX / 2_000),
                ),
                replicas: self.jetstream_replicas,
            },
            max_rate_permille,
        }
        .build()
    }

    fn server(&self) -> Result<ServerConfig, ConfigError> {
        let max_connections = int!(self, max_connections)?;
        // Unset (0), the per-address cap is a quarter of the configured global cap, so
        // one address never takes every slot by default; a value set above the global
        // cap is refused.
        let per_ip = match int!(self, max_connections_per_ip)? {
            0 => quarter_of(max_connections),
            n => n,
        };
        if per_ip > max_connections {
            return Err(ConfigError::new(
                "max_connections_per_ip",
                ConfigErrorKind::Conflict,
                format!("{per_ip} exceeds max_connections = {max_connections}"),
            ));
        }
        Ok(ServerConfig {
            listen: addr("listen", &self.listen, "127.0.0.1:8080")?,
            admin: addr("admin", &self.admin, "127.0.0.1:8080")?,
            max_streams: nonzero(int!(self, max_streams)?),
            retry_after: Duration::from_secs(int!(self, retry_after_s)?),
            idle_timeout: millis!(self, idle_timeout_ms)?,
            ws_send_timeout: millis!(self, ws_send_timeout_ms)?,
            grace_period: millis!(self, grace_period_ms)?,
            max_connections: nonzero(max_connections),
            max_connections_per_ip: nonzero(per_ip),
            admin_max_connections: nonzero(int!(self, admin_max_connections)?),
            http_header_timeout: millis!(self, http_header_timeout_ms)?,
            http_idle_timeout: millis!(self, http_idle_timeout_ms)?,
            // At least 8 KiB: hyper accepts no smaller head buffer.
            http_max_header_bytes: int!(self, http_max_header_bytes)? as usize,
            http_body: BodyLimits {
                timeout: millis!(self, http_body_timeout_ms)?,
                min_rate: int!(self, http_body_min_rate)?,
            },
            admin_request_limits: RequestLimits {
                timeout: millis!(self, admin_request_timeout_ms)?,
                max_concurrent: nonzero(int!(self, admin_max_concurrent_requests)?),
            },
            auth: self.auth()?,
            whip: self.whip()?,
        })
    }

    fn whip(&self) -> Result<Option<WhipConfig>, ConfigError> {
        let connect_timeout = millis!(self, whip_connect_timeout_ms)?;
        let disconnect_timeout = millis!(self, whip_disconnect_timeout_ms)?;
        let max_sessions_raw = int!(self, whip_max_sessions)?;
        let max_sessions = nonzero(max_sessions_raw);
        let per_ip = match int!(self, whip_max_sessions_per_ip)? {
            0 => quarter_of(max_sessions_raw),
            n if n > max_sessions_raw => {
                return Err(ConfigError::new(
                    "whip_max_sessions_per_ip",
                    ConfigErrorKind::Conflict,
                    format!("{n} exceeds whip_max_sessions = {max_sessions_raw}"),
                ));
            }
            n => n,
        };
        let Some(listen) = set(&self.whip_udp_listen) else {
            // A WHIP setting without the socket would be silently ignored.
            let d = Self::default();
            let changed = first_changed!(
                self,
                d,
                whip_advertise_ips,
                whip_connect_timeout_ms,
                whip_disconnect_timeout_ms,
                whip_max_sessions,
                whip_max_sessions_per_ip,
                whip_allow_foreign_candidates
            );
            return match changed {
                Some(k) => Err(ConfigError::new(
                    k,
                    ConfigErrorKind::Conflict,
                    "WHIP is off (whip_udp_listen is empty); set whip_udp_listen to use it",
                )),
                None => Ok(None),
            };
        };
        let udp_listen = addr("whip_udp_listen", listen, "127.0.0.1:8443")?;
        let refuse = |kind, message| ConfigError::new("whip_advertise_ips", kind, message);
        let mut advertise = Vec::new();
        for part in self
            .whip_advertise_ips
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
        {
            let ip: IpAddr = part.parse().map_err(|_| {
                refuse(
                    ConfigErrorKind::Invalid,
                    format!("{part:?} is not an IP address"),
                )
            })?;
            if ip.is_unspecified() || ip.is_multicast() {
                return Err(refuse(
                    ConfigErrorKind::Invalid,
                    format!("{ip} cannot be reached by a publisher (unspecified or multicast)"),
                ));
            }
            if !advertise.contains(&ip) {
                advertise.push(ip);
            }
        }
        if advertise.len() > MAX_WHIP_ADVERTISE_IPS {
            return Err(refuse(
                ConfigErrorKind::OutOfRange,
                format!(
                    "{} addresses; at most {MAX_WHIP_ADVERTISE_IPS}",
                    advertise.len()
                ),
            ));
        }
        if advertise.is_empty() {
            if udp_listen.ip().is_unspecified() {
                return Err(refuse(
                    ConfigErrorKind::Missing,
                    format!(
                        "whip_udp_listen = {udp_listen} listens on every address; name the ones \
                         publishers reach in whip_advertise_ips"
                    ),
                ));
            }
            advertise.push(udp_listen.ip());
        }
        Ok(Some(WhipConfig {
            udp_listen,
            advertise,
            connect_timeout,
            disconnect_timeout,
            max_sessions,
            max_sessions_per_ip: nonzero(per_ip),
            allow_foreign_candidates: self.whip_allow_foreign_candidates,
        }))
    }

    fn auth(&self) -> Result<Option<crate::auth::AuthConfig>, ConfigError> {
        use crate::auth::{AuthConfig, AuthKey, MIN_HS256_SECRET_BYTES, b64url_decode};
        let leeway_s = int!(self, auth_leeway_s)?;
        let key = match (
            set(&self.auth_hs256_secret),
            set(&self.auth_eddsa_public_key),
        ) {
            (Some(_), Some(_)) => {
                return Err(ConfigError::new(
                    "auth_eddsa_public_key",
                    ConfigErrorKind::Conflict,
                    "set either auth_hs256_secret or auth_eddsa_public_key, not both",
                ));
            }
            // The secret itself is never part of a message.
            (Some(s), None) if s.len() < MIN_HS256_SECRET_BYTES => {
                return Err(ConfigError::new(
                    "auth_hs256_secret",
                    ConfigErrorKind::Invalid,
                    format!(
                        "too short ({} bytes); at least {MIN_HS256_SECRET_BYTES} bytes",
                        s.len()
                    ),
                ));
            }
            (Some(s), None) => Some(AuthKey::Hs256(s.as_bytes().to_vec())),
            (None, Some(p)) => {
                let bytes: [u8; 32] = b64url_decode(p)
                    .and_then(|b| b.try_into().ok())
                    .ok_or_else(|| {
                        ConfigError::new(
                            "auth_eddsa_public_key",
                            ConfigErrorKind::Invalid,
                            "expected the 32-byte Ed25519 public key in base64url (43 characters)",
                        )
                    })?;
                Some(AuthKey::EdDsa(bytes))
            }
            (None, None) => None,
        };
        match (self.auth_required, key) {
            (true, Some(key)) => Ok(Some(AuthConfig { key, leeway_s })),
            (false, None) => Ok(None),
            (true, None) => Err(ConfigError::new(
                "auth_required",
                ConfigErrorKind::Missing,
                "needs auth_hs256_secret or auth_eddsa_public_key",
            )),
            (false, Some(_)) => Err(ConfigError::new(
                "auth_required",
                ConfigErrorKind::Conflict,
                "a token key is set but auth_required is false; set auth_required = true to check tokens",
            )),
        }
    }

    fn nats(&self) -> Result<NatsConfig, ConfigError> {
        let base = NatsConfig {
            name: set(&self.nats_name).unwrap_or(NATS_CLIENT_NAME).to_owned(),
            connection_timeout: millis!(self, nats_connection_timeout_ms)?,
            ping_interval: millis!(self, nats_ping_interval_ms)?,
            client_capacity: int!(self, nats_client_capacity)? as usize,
            ..NatsConfig::named(NATS_CLIENT_NAME)
        };
        NatsInput {
            url: set(&self.nats_url),
            user: set(&self.nats_user),
            password: set(&self.nats_password),
            token: set(&self.nats_token),
            nkey: set(&self.nats_nkey),
            creds_file: path(&self.nats_creds_file),
            tls_required: self.nats_tls_required,
            tls_ca_file: path(&self.nats_tls_ca_file),
            tls_cert_file: path(&self.nats_tls_cert_file),
            tls_key_file: path(&self.nats_tls_key_file),
            inbox_prefix: set(&self.nats_inbox_prefix),
        }
        .validate(base)
        .map_err(|e| {
            let kind = match e.kind {
                FieldErrorKind::Missing => ConfigErrorKind::Missing,
                FieldErrorKind::Invalid => ConfigErrorKind::Invalid,
                FieldErrorKind::Conflict => ConfigErrorKind::Conflict,
            };
            ConfigError::new(format!("nats_{}", e.field), kind, e.message)
        })
    }
}

/// Most addresses `whip_advertise_ips` takes.
const MAX_WHIP_ADVERTISE_IPS: usize = 8;

fn nonzero(v: u64) -> NonZeroUsize {
    NonZeroUsize::new(usize::try_from(v).unwrap_or(usize::MAX)).unwrap_or(NonZeroUsize::MIN)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/operations.md § Memory and the metric's docs quote this figure.
    #[test]
    fn the_memory_bound_at_the_defaults_is_the_documented_sum() {
        let mib = Config::default().memory_bound_bytes() as f64 / f64::from(1 << 20);
        println!("memory bound at the defaults: {mib:.1} MiB");
        assert!((323.0..328.0).contains(&mib), "{mib:.1} MiB");
        // WHIP on: every connection may buffer an offer (4,096 × 64 KiB).
        let mut whip = Config::default();
        whip.server.whip = load(&[], &[("whip_udp_listen", "127.0.0.1:0")])
            .expect("whip on")
            .server
            .whip;
        let with_offers = whip.memory_bound_bytes() as f64 / f64::from(1 << 20);
        assert!(
            (mib + 255.0..mib + 257.0).contains(&with_offers),
            "{with_offers:.1}"
        );
    }

    fn load(env: &[(&str, &str)], overrides: &[(&str, &str)]) -> Result<Config, ConfigError> {
        Config::load(&ConfigSources {
            file: None,
            env: env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            overrides: overrides
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        })
    }

    #[test]
    fn admin_request_limits_default_to_the_shared_ones_and_flow_from_the_keys() {
        let c = load(&[], &[]).expect("defaults");
        assert_eq!(c.server.admin_request_limits, RequestLimits::default());
        let c = load(
            &[("WEIR_INGRESS_ADMIN_REQUEST_TIMEOUT_MS", "2500")],
            &[("admin_max_concurrent_requests", "3")],
        )
        .expect("valid");
        assert_eq!(
            c.server.admin_request_limits,
            RequestLimits {
                timeout: Duration::from_millis(2500),
                max_concurrent: NonZeroUsize::new(3).expect("3 > 0"),
            }
        );
    }

    #[test]
    fn defaults_are_valid_and_documented() {
        let c = load(&[], &[]).expect("defaults");
        assert_eq!(c, Config::default());
        assert_eq!(c.stream.max_bytes(), 16_000);
        assert_eq!(c.stream.max_age(), Duration::from_millis(500));
        assert_eq!(c.stream.policy(), Policy::Close);
        assert_eq!(c.stream.subject().as_str(), DEFAULT_STREAM_TEMPLATE);
        assert_eq!(c.server.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(c.server.admin.to_string(), "127.0.0.1:9090");
        assert_eq!(
            StreamConfigBuilder::default().build().expect("valid"),
            StreamConfig::default()
        );
        // The raw defaults are the typed ones (each written once, in the typed
        // `Default`s): they validate to the same configuration.
        let raw = RawConfig::default().validate().expect("raw defaults");
        assert_eq!(raw, Config::default());
        assert_eq!(weir_protocol::audio::FRAME_BYTES, 640);
    }

    #[test]
    fn zero_and_absurd_budgets_are_refused_naming_the_key_and_range() {
        let cases = [
            ("max_bytes", "0"),
            ("max_bytes", "100000000000"),
            ("max_age_ms", "0"),
            ("max_age_ms", "3600000"),
            ("max_wait_ms", "501"),
            ("publish_timeout_ms", "0"),
            ("max_frame_bytes", "0"),
            ("max_frame_bytes", "641"),
            ("max_frame_bytes", "64000"),
            ("max_streams", "0"),
            ("ws_send_timeout_ms", "0"),
            ("ws_send_timeout_ms", "60001"),
            ("shadow_ceiling_factor", "1"),
            ("nats_client_capacity", "1"),
            ("grace_period_ms", "999999999"),
            ("max_connections", "0"),
            ("admin_max_connections", "0"),
            ("http_header_timeout_ms", "10"),
            ("http_idle_timeout_ms", "0"),
            ("http_max_header_bytes", "4096"),
            ("admin_request_timeout_ms", "99"),
            ("admin_max_concurrent_requests", "0"),
            ("admin_max_concurrent_requests", "1025"),
        ];
        for (k, v) in cases {
            let err = load(&[], &[(k, v)]).expect_err(k);
            assert_eq!(err.key(), k, "{err}");
            assert!(
                matches!(
                    err.kind(),
                    ConfigErrorKind::OutOfRange | ConfigErrorKind::Invalid
                ),
                "{err}"
            );
            assert!(err.to_string().contains(k), "{err}");
        }
        let err = load(&[], &[("max_bytes", "0")]).expect_err("zero");
        assert!(err.to_string().contains("6400..=67108864"), "{err}");
    }

    #[test]
    fn env_overrides_file_defaults_and_flags_override_env() {
        let c = load(
            &[
                ("WEIR_INGRESS_MAX_BYTES", "32000"),
                ("WEIR_INGRESS_POLICY", "gap"),
                ("WEIR_INGRESS_EXTENDED_CONSUMERS", "true"),
                ("WEIR_INGRESS_BIN", "/usr/bin/audio-ingress"),
                ("PATH", "/bin"),
            ],
            &[("max_bytes", "48000")],
        )
        .expect("valid");
        assert_eq!(c.stream.max_bytes(), 48_000);
        assert_eq!(c.stream.policy(), Policy::Gap);
        let err = load(&[("WEIR_INGRESS_MAX_BYTES", "lots")], &[]).expect_err("type");
        assert_eq!(err.kind(), ConfigErrorKind::WrongType);
        assert!(err.to_string().contains("WEIR_INGRESS_MAX_BYTES"), "{err}");
    }

    #[test]
    fn partitions_are_bounded_like_the_consumer() {
        let partitioned = ("subject", "audio.{partition}.{stream}");
        let ok = load(&[], &[partitioned, ("partitions", "4096")]).expect("4096");
        assert_eq!(ok.stream.partitions().get(), 4_096);
        // The producer used to accept up to 65,536: streams no consumer could own.
        let err = load(&[], &[partitioned, ("partitions", "4097")]).expect_err("over");
        assert_eq!(err.kind(), ConfigErrorKind::OutOfRange);
        assert!(err.to_string().contains("partitions"), "{err}");
        assert!(
            weir_audio_consumer::ConsumerConfig {
                partitions: 4_097,
                ..Default::default()
            }
            .validate()
            .is_err(),
            "the consumer refuses the same count"
        );
    }

    #[test]
    fn gap_requires_extended_consumers() {
        let err = load(&[], &[("policy", "gap")]).expect_err("gap");
        assert_eq!(
            (err.key(), err.kind()),
            ("policy", ConfigErrorKind::Conflict)
        );
        let err = load(&[], &[("policy", "drop")]).expect_err("bad");
        assert_eq!(err.key(), "policy");
    }

    #[test]
    fn unknown_keys_and_bad_files_are_refused() {
        let err = load(&[], &[("max_byte", "1")]).expect_err("typo");
        assert_eq!(err.kind(), ConfigErrorKind::UnknownKey);
        assert_eq!(err.key(), "max_byte");
        // A misspelled environment variable too (it used to be ignored silently).
        let err = load(&[("WEIR_INGRESS_MAX_BYTE", "32000")], &[]).expect_err("typo");
        assert_eq!(err.kind(), ConfigErrorKind::UnknownKey);
        assert_eq!(err.key(), "WEIR_INGRESS_MAX_BYTE");

        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "max_bytes = 32000\nlisten = \"127.0.0.1:0\"\n").expect("write");
        let c = Config::load(&ConfigSources {
            file: Some(path.clone()),
            ..Default::default()
        })
        .expect("file");
        assert_eq!(c.stream.max_bytes(), 32_000);
        assert_eq!(c.server.listen.port(), 0);

        // A decimal key takes a TOML float or integer.
        for (text, permille) in [("max_rate = 2.5\n", 2500), ("max_rate = 3\n", 3000)] {
            std::fs::write(&path, text).expect("write");
            let c = Config::load(&ConfigSources {
                file: Some(path.clone()),
                ..Default::default()
            })
            .expect("decimal");
            assert_eq!(c.stream.max_rate_permille(), permille);
        }
        std::fs::write(&path, "max_rate = \"fast\"\n").expect("write");
        let err = Config::load(&ConfigSources {
            file: Some(path.clone()),
            ..Default::default()
        })
        .expect_err("string for a decimal");
        assert_eq!(err.kind(), ConfigErrorKind::WrongType);

        std::fs::write(&path, "max_bytes = \"big\"\n").expect("write");
        let err = Config::load(&ConfigSources {
            file: Some(path.clone()),
            ..Default::default()
        })
        .expect_err("type");
        assert_eq!(
            (err.key(), err.kind()),
            ("max_bytes", ConfigErrorKind::WrongType)
        );

        std::fs::write(&path, "max_bytes = -5\n").expect("write");
        let err = Config::load(&ConfigSources {
            file: Some(path.clone()),
            ..Default::default()
        })
        .expect_err("negative");
        assert_eq!(
            (err.key(), err.kind()),
            ("max_bytes", ConfigErrorKind::OutOfRange)
        );

        std::fs::write(&path, "[section]\nx = 1\n").expect("write");
        let err = Config::load(&ConfigSources {
            file: Some(path),
            ..Default::default()
        })
        .expect_err("unknown");
        assert_eq!(err.key(), "section");
    }

    #[test]
    fn subject_and_partitions_are_validated() {
        let err = load(&[], &[("subject", "audio.*.{stream}")]).expect_err("wildcard");
        assert_eq!(err.key(), "subject");
        let err = load(&[], &[("subject", "audio.{partition}.{stream}")]).expect_err("p");
        assert_eq!(
            (err.key(), err.kind()),
            ("partitions", ConfigErrorKind::Missing)
        );
        let c = load(
            &[],
            &[
                ("subject", "audio.{partition}.{stream}"),
                ("partitions", "16"),
            ],
        )
        .expect("partitioned");
        assert_eq!(c.stream.partitions().get(), 16);
    }

    #[test]
    fn nats_auth_is_exclusive_and_secrets_are_redacted() {
        let err = load(&[], &[("nats_user", "u")]).expect_err("pw");
        assert_eq!(err.key(), "nats_password");
        let err = load(&[], &[("nats_token", "t"), ("nats_nkey", "SUABC")]).expect_err("two");
        assert_eq!(err.kind(), ConfigErrorKind::Conflict);
        let c = load(&[], &[("nats_user", "u"), ("nats_password", "hunter2")]).expect("ok");
        assert!(!format!("{:?}", c.nats).contains("hunter2"));
        let err = load(&[], &[("nats_creds_file", "/nonexistent/x.creds")]).expect_err("f");
        assert_eq!(err.key(), "nats_creds_file");
        let err = load(&[], &[("nats_url", "not a url at all")]).expect_err("url");
        assert_eq!(err.key(), "nats_url");
        let c = load(&[], &[("nats_url", "nats://a:4222, nats://b:4222")]).expect("urls");
        assert_eq!(c.nats.urls.len(), 2);
    }

    #[test]
    fn every_key_is_settable() {
        let c = load(&[("WEIR_INGRESS_FRAME_HEADERS", "true")], &[]).expect("valid");
        assert!(c.stream.frame_headers());
        assert!(!Config::default().stream.frame_headers());
        let c = load(
            &[("WEIR_INGRESS_DELIVERY", "unconfirmed")],
            &[("confirm_window_ms", "150"), ("confirm_interval_ms", "2")],
        )
        .expect("valid");
        assert_eq!(c.stream.delivery(), Delivery::Unconfirmed);
        assert_eq!(c.stream.confirm_window(), Duration::from_millis(150));
        assert_eq!(c.stream.confirm_interval(), Duration::from_millis(2));
        let err = load(&[], &[("delivery", "maybe")]).expect_err("bad delivery");
        assert_eq!(err.key(), "delivery");
        let err = load(&[], &[("confirm_interval_ms", "400")]).expect_err("too slow");
        assert_eq!(err.key(), "confirm_interval_ms");
        let err = load(&[], &[("confirm_window_min_bytes", "10")]).expect_err("too small");
        assert_eq!(err.key(), "confirm_window_min_bytes");
        let layers = Layers::new(&RawConfig::default());
        assert_eq!(
            keys::uncovered(&layers, SECTIONS),
            (Vec::new(), Vec::new()),
            "SECTIONS documents exactly the keys of RawConfig"
        );
        assert_eq!(SECTIONS.iter().map(|s| s.keys.len()).sum::<usize>(), 65);
        let err = load(&[], &[("jetstream_stream", "a.b")]).expect_err("dot");
        assert_eq!(err.key(), "jetstream_stream");
        let err = load(&[], &[("jetstream_duplicate_window_s", "7200")]).expect_err("window");
        assert_eq!(err.key(), "jetstream_duplicate_window_s");
        let c = load(&[], &[("delivery", "jetstream")]).expect("jetstream");
        assert_eq!(
            c.stream.jetstream().subjects,
            ["inference.whisper.stream.*"]
        );
    }

    #[test]
    fn whip_keys_validate_and_need_the_udp_socket() {
        assert_eq!(load(&[], &[]).expect("defaults").server.whip, None);
        let c = load(&[], &[("whip_udp_listen", "127.0.0.1:0")]).expect("on");
        let w = c.server.whip.expect("whip on");
        assert_eq!(w.advertise, vec![IpAddr::from([127, 0, 0, 1])]);
        assert_eq!(w.connect_timeout, DEFAULT_WHIP_CONNECT_TIMEOUT);
        assert_eq!(w.disconnect_timeout, DEFAULT_WHIP_DISCONNECT_TIMEOUT);
        assert_eq!(w.max_sessions.get(), DEFAULT_WHIP_MAX_SESSIONS);
        assert_eq!(w.max_sessions_per_ip.get(), DEFAULT_WHIP_MAX_SESSIONS / 4);
        assert!(!w.allow_foreign_candidates);
        let c = load(
            &[],
            &[
                ("whip_udp_listen", "127.0.0.1:0"),
                ("whip_max_sessions", "10"),
                ("whip_allow_foreign_candidates", "true"),
            ],
        )
        .expect("on");
        let w = c.server.whip.expect("whip on");
        assert_eq!(w.max_sessions_per_ip.get(), 2, "a quarter of 10");
        assert!(w.allow_foreign_candidates);
        let err = load(
            &[],
            &[
                ("whip_udp_listen", "127.0.0.1:0"),
                ("whip_max_sessions", "10"),
                ("whip_max_sessions_per_ip", "11"),
            ],
        )
        .expect_err("above the cap");
        assert_eq!(
            (err.key(), err.kind()),
            ("whip_max_sessions_per_ip", ConfigErrorKind::Conflict)
        );
        let c = load(
            &[(
                "WEIR_INGRESS_WHIP_ADVERTISE_IPS",
                "203.0.113.7, 2001:db8::1",
            )],
            &[
                ("whip_udp_listen", "0.0.0.0:8443"),
                ("whip_max_sessions", "3"),
            ],
        )
        .expect("public addresses");
        let w = c.server.whip.expect("whip on");
        assert_eq!(w.advertise.len(), 2);
        assert_eq!(w.max_sessions.get(), 3);
        for (k, v, key) in [
            ("whip_max_sessions", "4", "whip_max_sessions"),
            ("whip_advertise_ips", "1.2.3.4", "whip_advertise_ips"),
        ] {
            let err = load(&[], &[(k, v)]).expect_err("WHIP off");
            assert_eq!((err.key(), err.kind()), (key, ConfigErrorKind::Conflict));
        }
        for (sets, key) in [
            (vec![("whip_udp_listen", "localhost")], "whip_udp_listen"),
            (vec![("whip_udp_listen", "0.0.0.0:0")], "whip_advertise_ips"),
            (
                vec![
                    ("whip_udp_listen", "127.0.0.1:0"),
                    ("whip_advertise_ips", "0.0.0.0"),
                ],
                "whip_advertise_ips",
            ),
            (
                vec![
                    ("whip_udp_listen", "127.0.0.1:0"),
                    ("whip_advertise_ips", "x"),
                ],
                "whip_advertise_ips",
            ),
            (
                vec![
                    ("whip_udp_listen", "127.0.0.1:0"),
                    ("whip_max_sessions", "0"),
                ],
                "whip_max_sessions",
            ),
            (
                vec![
                    ("whip_udp_listen", "127.0.0.1:0"),
                    ("whip_connect_timeout_ms", "10"),
                ],
                "whip_connect_timeout_ms",
            ),
            (
                vec![
                    ("whip_udp_listen", "127.0.0.1:0"),
                    ("whip_disconnect_timeout_ms", "999999"),
                ],
                "whip_disconnect_timeout_ms",
            ),
        ] {
            let err = load(&[], &sets).expect_err("refused");
            assert_eq!(err.key(), key, "{sets:?}: {err}");
        }
    }

    #[test]
    fn max_rate_is_a_decimal_in_thousandths_with_zero_for_off() {
        let c = load(&[], &[]).expect("defaults");
        assert_eq!(c.stream.max_rate_permille(), 1500);
        let c = load(&[("WEIR_INGRESS_MAX_RATE", "2.25")], &[]).expect("env");
        assert_eq!(c.stream.max_rate_permille(), 2250);
        let c = load(&[], &[("max_rate", "0")]).expect("off");
        assert_eq!(c.stream.max_rate_permille(), 0);
        for bad in ["0.5", "1001", "-1", "fast", "NaN"] {
            let err = load(&[], &[("max_rate", bad)]).expect_err(bad);
            assert_eq!(err.key(), "max_rate", "{bad}: {err}");
        }
        let c = load(&[], &[("shadow", "true"), ("max_rate", "2")]).expect("shadow");
        assert_eq!(c.stream.enforced_max_rate_permille(), 16_000);
    }

    #[test]
    fn auth_keys_validate_and_never_echo_the_secret() {
        assert_eq!(load(&[], &[]).expect("defaults").server.auth, None);
        let secret = "s3cr3t-s3cr3t-s3cr3t-s3cr3t-s3cr3t";
        let c = load(
            &[("WEIR_INGRESS_AUTH_HS256_SECRET", secret)],
            &[("auth_required", "true")],
        )
        .expect("hs256");
        let auth = c.server.auth.clone().expect("on");
        assert_eq!(auth.leeway_s, 5);
        assert!(!format!("{c:?}").contains("s3cr3t"), "Debug redacts");
        let short = load(
            &[],
            &[
                ("auth_required", "true"),
                ("auth_hs256_secret", "tooshort-SECRET"),
            ],
        )
        .expect_err("short");
        assert_eq!(short.key(), "auth_hs256_secret");
        assert!(!short.to_string().contains("tooshort-SECRET"), "{short}");
        let err = load(&[], &[("auth_required", "true")]).expect_err("no key");
        assert_eq!(err.key(), "auth_required");
        let err = load(&[], &[("auth_hs256_secret", secret)]).expect_err("key without required");
        assert_eq!(err.key(), "auth_required");
        let pk = crate::auth::b64url(&[9u8; 32]);
        let c = load(
            &[],
            &[("auth_required", "true"), ("auth_eddsa_public_key", &pk)],
        )
        .expect("eddsa");
        assert!(matches!(
            c.server.auth.map(|a| a.key),
            Some(crate::auth::AuthKey::EdDsa(_))
        ));
        let err = load(
            &[],
            &[("auth_required", "true"), ("auth_eddsa_public_key", "abc")],
        )
        .expect_err("bad key");
        assert_eq!(err.key(), "auth_eddsa_public_key");
    }

    #[test]
    fn connection_hygiene_keys_default_and_validate() {
        let c = load(&[], &[]).expect("defaults");
        assert_eq!(c.server, ServerConfig::default());
        assert_eq!(c.server.max_connections.get(), 4096);
        assert_eq!(c.server.max_connections_per_ip.get(), 1024);
        assert_eq!(c.server.admin_max_connections.get(), 64);
        assert_eq!(c.server.http_header_timeout, Duration::from_secs(5));
        assert_eq!(c.server.http_body, BodyLimits::default());
        assert_eq!(c.server.http_body.timeout, Duration::from_secs(10));
        assert_eq!(c.server.http_body.min_rate, 1024);
        // Unset, the per-address cap is a quarter of the configured cap: one address
        // never takes every slot.
        for (max, per_ip) in [("100", 25), ("896", 224), ("3", 1), ("1", 1)] {
            let c = load(&[], &[("max_connections", max)]).expect("small cap");
            assert_eq!(c.server.max_connections_per_ip.get(), per_ip, "{max}");
        }
        let c = load(
            &[],
            &[
                ("max_connections", "100"),
                ("max_connections_per_ip", "100"),
            ],
        )
        .expect("set explicitly, up to the cap");
        assert_eq!(c.server.max_connections_per_ip.get(), 100);
        let c = load(
            &[],
            &[("http_body_timeout_ms", "500"), ("http_body_min_rate", "0")],
        )
        .expect("body bounds");
        assert_eq!(c.server.http_body.timeout, Duration::from_millis(500));
        assert_eq!(c.server.http_body.min_rate, 0);
        assert_eq!(
            load(&[], &[("http_body_timeout_ms", "10")])
                .expect_err("too short")
                .key(),
            "http_body_timeout_ms"
        );
        let err = load(
            &[],
            &[
                ("max_connections", "100"),
                ("max_connections_per_ip", "101"),
            ],
        )
        .expect_err("per-ip above the cap");
        assert_eq!(err.key(), "max_connections_per_ip");
        assert_eq!(err.kind(), ConfigErrorKind::Conflict);
    }

    #[test]
    fn the_docs_tables_are_the_generated_ones() {
        let doc = include_str!("../../../docs/audio-ingress.md");
        assert_eq!(
            keys::stale_docs_sections(doc, &key_table(true), SECTIONS),
            Vec::<&str>::new(),
            "docs/audio-ingress.md: these tables differ from the generated ones; paste the output \
             of `audio-ingress serve --list-keys --markdown`"
        );
    }

    #[test]
    fn precedence_is_file_then_environment_then_command_line() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("c.toml");
        std::fs::write(
            &path,
            "max_bytes = 20000\nmax_age_ms = 700\nmax_streams = 10\n",
        )
        .expect("write");
        let env = |k: &str, v: &str| (k.to_owned(), v.to_owned());
        let c = Config::load(&ConfigSources {
            file: Some(path),
            env: vec![
                env("WEIR_INGRESS_MAX_BYTES", "24000"),
                env("WEIR_INGRESS_MAX_AGE_MS", "800"),
            ],
            overrides: vec![("max_bytes".to_owned(), "28000".to_owned())],
        })
        .expect("valid");
        assert_eq!(c.stream.max_bytes(), 28_000, "the command line wins");
        assert_eq!(c.stream.max_age(), Duration::from_millis(800), "env > file");
        assert_eq!(c.server.max_streams.get(), 10, "file > default");
        assert_eq!(c.stream.max_wait(), DEFAULT_MAX_WAIT, "the default stays");
    }

    #[test]
    fn text_values_take_the_type_of_the_key() {
        // A secret of digits stays a string; a boolean takes yes/no; a duration in ms
        // takes TOML integer syntax.
        let digits = "12345678901234567890123456789012";
        let c = load(
            &[
                ("WEIR_INGRESS_AUTH_HS256_SECRET", digits),
                ("WEIR_INGRESS_AUTH_REQUIRED", "yes"),
                ("WEIR_INGRESS_NATS_TOKEN", "0042"),
                ("WEIR_INGRESS_IDLE_TIMEOUT_MS", "1_500"),
            ],
            &[("frame_headers", "1")],
        )
        .expect("valid");
        assert_eq!(
            c.server.auth.map(|a| a.key),
            Some(crate::auth::AuthKey::Hs256(digits.as_bytes().to_vec()))
        );
        assert_eq!(c.nats.auth, NatsAuth::Token("0042".to_owned()));
        assert_eq!(c.server.idle_timeout, Duration::from_millis(1_500));
        assert!(c.stream.frame_headers());
        for (var, text) in [
            ("WEIR_INGRESS_IDLE_TIMEOUT_MS", "1500ms"),
            ("WEIR_INGRESS_SHADOW", "on"),
            ("WEIR_INGRESS_MAX_RATE", "fast"),
        ] {
            let err = load(&[(var, text)], &[]).expect_err(text);
            assert_eq!(err.kind(), ConfigErrorKind::WrongType, "{err}");
            assert!(err.to_string().contains(var), "{err}");
        }
        let err = load(&[], &[("max_byts", "1")]).expect_err("typo");
        assert!(
            err.to_string().contains("did you mean `max_bytes`?"),
            "{err}"
        );
    }

    #[test]
    fn shadow_mode_enforces_a_ceiling() {
        let c = StreamConfig::builder().shadow(true).build().expect("valid");
        assert_eq!(c.enforced_max_bytes(), 8 * 16_000);
        assert_eq!(c.enforced_max_age(), Duration::from_secs(4));
        let c = StreamConfig::default();
        assert_eq!(c.enforced_max_bytes(), 16_000);
    }
}
