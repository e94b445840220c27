//! `weir.Producer.connect(**config)`: the producer core's stream keys, with the names,
//! types and defaults of `audio-ingress serve` (its flat `stream` keys, e.g.
//! `max_bytes`, `max_age_ms`, `policy`, `confirm_window_ms`, `subject`, `partitions`,
//! plus its `max_streams`), validated once by the same builder
//! (`weir_audio_producer::config::StreamConfigBuilder::build`).
//!
//! Invariants:
//! - Every default comes from `StreamConfigBuilder::default()` (and the ingress's
//!   `max_streams` default); none is written here.
//! - An unknown key, a value of the wrong type or out of range is a `ConfigError`
//!   (code `invalid_config`) whose `details["key"]` names the key; nothing connects
//!   before the configuration is valid.
//! - [`KEY_NAMES`] is exactly the producer core's key table (`KEYS`) plus
//!   `max_streams` (a pytest compares them).

use std::num::NonZeroUsize;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Map, Value};
use weir_audio_producer::config::{
    Delivery, JetStreamKeys, KEYS, Policy, StreamConfig, StreamConfigBuilder,
};

use crate::errors::WeirErr;

/// Default `max_streams`: the ingress's (`audio-ingress serve`, key `max_streams`).
pub const DEFAULT_MAX_STREAMS: u64 = 1000;
/// Largest `max_streams` accepted (the ingress's range).
pub const MAX_MAX_STREAMS: u64 = 1_000_000;

/// The keys [`Keys`] accepts, in the producer core's table order, then `max_streams`.
pub fn key_names() -> Vec<&'static str> {
    KEYS.iter()
        .map(|k| k.name)
        .chain(std::iter::once("max_streams"))
        .collect()
}

/// The keys as given, before validation: one field per key, the ingress's names and
/// widths. `Default` reads the builder's documented defaults.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Keys {
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
    max_streams: u64,
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Default for Keys {
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
            max_streams: DEFAULT_MAX_STREAMS,
        }
    }
}

/// The validated producer settings.
#[derive(Debug, Clone)]
pub struct ProducerConfig {
    /// Every stream's budget and policy.
    pub stream: StreamConfig,
    /// Concurrent streams (including those still delivering their `end`).
    pub max_streams: usize,
    /// The keys as validated (defaults filled in), for `Producer.config`.
    pub keys: Value,
}

fn invalid(key: &str, message: impl std::fmt::Display) -> WeirErr {
    WeirErr::config("invalid_config", format!("config key `{key}`: {message}")).with("key", key)
}

/// A decimal value in thousandths (rounded); `None` for a negative, NaN or huge value.
fn permille(v: f64) -> Option<u64> {
    (v.is_finite() && (0.0..=1e12).contains(&v)).then(|| (v * 1000.0).round() as u64)
}

/// Validates the keys given as a JSON object (the Python layer serialises its keyword
/// arguments).
pub fn from_json(json: &str) -> Result<ProducerConfig, WeirErr> {
    let given: Map<String, Value> = serde_json::from_str(json)
        .map_err(|e| WeirErr::config("invalid_config", format!("producer options: {e}")))?;
    let known = key_names();
    // One key at a time first, so that a refusal names its key (serde's message for a
    // whole object does not).
    for (key, value) in &given {
        if !known.contains(&key.as_str()) {
            return Err(WeirErr::config(
                "invalid_config",
                format!(
                    "unknown config key `{key}` (the producer's keys: {})",
                    known.join(", ")
                ),
            )
            .with("key", key.as_str()));
        }
        let one = Value::Object(Map::from_iter([(key.clone(), value.clone())]));
        if let Err(e) = serde_json::from_value::<Keys>(one) {
            return Err(invalid(key, e));
        }
    }
    let keys: Keys = serde_json::from_value(Value::Object(given))
        .map_err(|e| WeirErr::config("invalid_config", format!("producer options: {e}")))?;
    validate(keys)
}

fn validate(k: Keys) -> Result<ProducerConfig, WeirErr> {
    let max_rate_permille = permille(k.max_rate)
        .ok_or_else(|| invalid("max_rate", "out of range: 0 (no bound) or 1.0..=1000"))?;
    if !(1..=MAX_MAX_STREAMS).contains(&k.max_streams) {
        return Err(invalid(
            "max_streams",
            format!("{} is out of range: 1..={MAX_MAX_STREAMS}", k.max_streams),
        ));
    }
    let stream = StreamConfigBuilder {
        max_bytes: k.max_bytes,
        max_age: Duration::from_millis(k.max_age_ms),
        max_wait: Duration::from_millis(k.max_wait_ms),
        policy: k.policy,
        shadow: k.shadow,
        shadow_ceiling_factor: k.shadow_ceiling_factor,
        extended_consumers: k.extended_consumers,
        publish_timeout: Duration::from_millis(k.publish_timeout_ms),
        end_timeout: Duration::from_millis(k.end_timeout_ms),
        max_frame_bytes: k.max_frame_bytes,
        subject: k.subject.clone(),
        partitions: (k.partitions != 0).then_some(k.partitions),
        frame_headers: k.frame_headers,
        delivery: k.delivery,
        confirm_window: Duration::from_millis(k.confirm_window_ms),
        confirm_window_min_bytes: k.confirm_window_min_bytes,
        confirm_interval: Duration::from_millis(k.confirm_interval_ms),
        jetstream: JetStreamKeys {
            stream: k.jetstream_stream.clone(),
            max_age: Duration::from_secs(k.jetstream_max_age_s.min(u64::MAX / 2_000)),
            duplicate_window: Duration::from_secs(
                k.jetstream_duplicate_window_s.min(u64::MAX / 2_000),
            ),
            replicas: k.jetstream_replicas,
        },
        max_rate_permille,
    }
    .build()
    .map_err(|e| WeirErr::config("invalid_config", e.to_string()).with("key", e.key()))?;
    let max_streams = NonZeroUsize::new(usize::try_from(k.max_streams).unwrap_or(usize::MAX))
        .map_or(1, NonZeroUsize::get);
    let keys = serde_json::to_value(&k).unwrap_or(Value::Null);
    Ok(ProducerConfig {
        stream,
        max_streams,
        keys,
    })
}

/// The defaults, as a JSON object (`weir.Producer.config_defaults()`).
pub fn defaults_json() -> String {
    serde_json::to_string(&Keys::default()).unwrap_or_else(|_| "{}".to_owned())
}
