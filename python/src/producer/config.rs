//! `weir.Producer.connect(**config)`: the producer core's stream keys, with the names,
//! types and defaults of `audio-ingress serve` (its flat `stream` keys, e.g.
//! `max_bytes`, `max_age_ms`, `policy`, `confirm_window_ms`, `subject`, `partitions`,
//! plus its `max_streams`): the producer core's `StreamConfigBuilder`, the same type the
//! ingress reads, validated once by its `build`.
//!
//! Invariants:
//! - Every default comes from `StreamConfigBuilder::default()` and the ingress's
//!   `max_streams` default; none is written here.
//! - An unknown key, a value of the wrong type or out of range is a `ConfigError`
//!   (code `invalid_config`) whose `details["key"]` names the key; nothing connects
//!   before the configuration is valid.
//! - [`KEY_NAMES`] is exactly the producer core's key table (`KEYS`) plus
//!   `max_streams` (a pytest compares them).

use serde::Deserialize;
use serde_json::{Map, Value};
use weir_audio_producer::config::{KEYS, StreamConfig, StreamConfigBuilder};

use crate::errors::{WeirErr, keys_from_json};

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

/// The keys as given, before validation: the producer core's [`StreamConfigBuilder`] (the
/// ingress's names, widths and defaults) and the ingress's `max_streams`.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(default)]
pub struct Keys {
    #[serde(flatten)]
    stream: StreamConfigBuilder,
    max_streams: u64,
}

impl Default for Keys {
    fn default() -> Self {
        Self {
            stream: StreamConfigBuilder::default(),
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

/// Validates the keys given as a JSON object (the Python layer serialises its keyword
/// arguments).
pub fn from_json(json: &str) -> Result<ProducerConfig, WeirErr> {
    let given: Map<String, Value> = serde_json::from_str(json).unwrap_or_default();
    let known = key_names();
    if let Some(key) = given.keys().find(|k| !known.contains(&k.as_str())) {
        return Err(WeirErr::config(
            "invalid_config",
            format!(
                "unknown config key `{key}` (the producer's keys: {})",
                known.join(", ")
            ),
        )
        .with("key", key.as_str()));
    }
    validate(keys_from_json(json, "producer options")?)
}

fn validate(k: Keys) -> Result<ProducerConfig, WeirErr> {
    if !(1..=MAX_MAX_STREAMS).contains(&k.max_streams) {
        return Err(invalid(
            "max_streams",
            format!("{} is out of range: 1..={MAX_MAX_STREAMS}", k.max_streams),
        ));
    }
    let stream = k
        .stream
        .build()
        .map_err(|e| WeirErr::config("invalid_config", e.to_string()).with("key", e.key()))?;
    let max_streams = usize::try_from(k.max_streams).unwrap_or(usize::MAX);
    let keys = serde_json::to_value(&k).unwrap_or(Value::Null);
    Ok(ProducerConfig {
        stream,
        max_streams,
        keys,
    })
}
