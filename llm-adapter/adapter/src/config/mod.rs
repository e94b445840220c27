//! Configuration: defaults < a TOML file < `WEIR_LLM_*` environment variables <
//! command-line flags, merged by the loader every weir service shares
//! (`weir_service::config`) into the private `RawConfig` (serde,
//! `deny_unknown_fields`), then validated once into a [`Config`].
//!
//! Each key's default, range and meaning are written once, in its section's declaration
//! (`raw.rs`); `validate` checks each number against its typed `Range` in [`SECTIONS`],
//! and [`key_table`] (`--list-keys`, the tables of docs/llm-adapter.md, which a test
//! keeps equal) is generated from them. A key whose default follows another
//! (`stream.ack_timeout_ms`, ...) is an `Option` unset by default and resolved in
//! `validate`.
//!
//! Invariants:
//! - every error names the full key (`session.pending_cap`, `limits[1].max_wait_ms`),
//!   where a value not a default came from, and the allowed range; unknown keys are
//!   errors whichever layer set them, never ignored (a typo must not silently leave a
//!   limit disabled);
//! - numbers are whole, non-negative and inside their range: `-1`, `2.5`, `"five"` and
//!   `true` are refused for an integer key; a text value (environment, `--set`) takes
//!   the type of the key (`WEIR_LLM_NATS__TOKEN=123456` is a string);
//! - a [`Config`] built by [`Config::load`] / [`Config::from_toml_str`] satisfies every
//!   range. Its fields are public for reading and for programmatic tweaks in tests; the
//!   numeric types (`NonZeroUsize`, `Duration`, enums) keep such tweaks valid.
//!
//! `0` means "unlimited"/"disabled" only where the reference says so
//! (`session.pending_cap`, `deadline.default_ms`, `idempotency.window_ms`).
//!
//! Refusals are the one [`ConfigError`] of every weir component; [`Config::warnings`]
//! is the tier beside them (`check-config`).

mod capabilities;
mod check;
mod pool;
mod raw;
mod types;
mod validate;

use std::num::NonZeroUsize;
use std::time::Duration;

use weir_service::config::keys;
use weir_service::config::whole_ms as ms;
use weir_service::config::{Layers, Origin, Range, set};

pub use crate::admission::{AdmissionConfig, EstimatorConfig, HealthConfig, PoolSlots};
pub use pool::{MAX_BACKENDS, PoolMember};
use raw::{
    RawBackend, RawConfig, RawDeadline, RawJetStream, RawLimit, RawNats, RawPoolBackend, RawSim,
    RawStream,
};
pub use raw::{SECTIONS, ServiceConfig};
pub use types::*;
pub use weir_service::config::{ConfigError, ConfigErrorKind, ConfigSources, ConfigWarning};

/// Prefix of environment overrides: `WEIR_LLM_QUEUE_CAPACITY=64`,
/// `WEIR_LLM_SESSION__PENDING_CAP=5` (`__` separates sections). A variable under it
/// that is not a key is refused, except those in [`ENV_NOT_KEYS`].
pub const ENV_PREFIX: &str = "WEIR_LLM_";

/// Variables under [`ENV_PREFIX`] that are not configuration keys: those of the
/// command-line flags (`WEIR_LLM_CONFIG`, `WEIR_LLM_NATS_URL`, ...).
pub const ENV_NOT_KEYS: &[&str] = &["CONFIG", "NATS_URL", "ADMIN", "THREADS", "LOG_FORMAT"];

/// Longest accepted limit name, subject or service name.
const MAX_NAME_LEN: usize = 128;

/// Most `[[limits]]` entries.
const MAX_LIMITS: usize = 16;

impl Default for Config {
    /// The documented defaults (an empty file).
    fn default() -> Self {
        types::valid_default(RawConfig::default().validate())
    }
}

impl Config {
    /// Loads and validates the configuration from `sources`. A refusal names the key,
    /// where its value came from and the allowed values.
    pub fn load(sources: &ConfigSources) -> Result<Self, ConfigError> {
        Self::load_checked(sources).map(|(config, _)| config)
    }

    /// [`Config::load`], with the warnings of the load: each renamed key set under its
    /// old name (none today; the timeout chains are [`Config::warnings`]).
    pub fn load_checked(
        sources: &ConfigSources,
    ) -> Result<(Self, Vec<ConfigWarning>), ConfigError> {
        let mut layers = layers();
        layers
            .load(sources, ENV_PREFIX, ENV_NOT_KEYS)
            .map_err(from_load)?;
        let config = Self::build(&layers)?;
        Ok((config, layers.warnings().to_vec()))
    }

    /// Parses and validates TOML text (every key optional).
    pub fn from_toml_str(text: &str) -> Result<Self, ConfigError> {
        let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
            ConfigError::new("<toml>", ConfigErrorKind::File, e.to_string())
        })?;
        let mut layers = layers();
        layers.table(&table, &Origin::File("<toml>".into()));
        Self::build(&layers)
    }

    fn build(layers: &Layers) -> Result<Self, ConfigError> {
        let raw: RawConfig = layers.build().map_err(from_load)?;
        pool::exclusive(layers, &raw.backends)
            .and_then(|()| raw.validate())
            .map_err(|e| {
                let origin = layers.origin(e.key()).clone();
                e.with_origin(&origin)
            })
    }
}

/// The loader over `RawConfig`: its defaults, and a schema with every optional key and
/// one `[[limits]]` element (for the key table, typing, unknown keys and "did you
/// mean").
fn layers() -> Layers {
    let backend = RawBackend {
        sim: RawSim {
            min_ms: Some(0),
            max_ms: Some(0),
            p99_ms: Some(0),
            ..RawSim::default()
        },
        ..RawBackend::default()
    };
    let schema = RawConfig {
        limits: vec![RawLimit::default()],
        backends: vec![RawPoolBackend {
            backend: backend.clone(),
            ..RawPoolBackend::default()
        }],
        backend,
        deadline: RawDeadline {
            min_start_budget_ms: Some(0),
            ..RawDeadline::default()
        },
        nats: RawNats {
            subscription_capacity: Some(0),
            ..RawNats::default()
        },
        stream: RawStream {
            ack_timeout_ms: Some(0),
            ..RawStream::default()
        },
        jetstream: RawJetStream {
            progress_interval_ms: Some(0),
            max_ack_pending: Some(0),
            ..RawJetStream::default()
        },
        ..RawConfig::default()
    };
    Layers::new(&RawConfig::default()).with_schema(&schema)
}

/// The loader's refusal as the operator has to fix it (`keys::refusal`).
fn from_load(e: ConfigError) -> ConfigError {
    keys::refusal(e, SECTIONS, "llm-adapter serve --list-keys")
}

/// The range [`SECTIONS`] documents for `key` (`limits[2].limit` is `limits[].limit`).
fn range(key: &str) -> Range {
    keys::range(SECTIONS, key)
}

/// `v` of the integer key `key` inside its documented range.
fn int(key: &str, v: u64) -> Result<u64, ConfigError> {
    range(key).check(key, v)
}

/// [`int`] as a `u32` (the ranges keep it inside).
fn int32(key: &str, v: u64) -> Result<u32, ConfigError> {
    int(key, v).map(|v| u32::try_from(v).unwrap_or(u32::MAX))
}

/// [`int`] as a count that is not zero.
fn count(key: &str, v: u64) -> Result<NonZeroUsize, ConfigError> {
    range(key).count(key, v)
}

/// [`int`] as milliseconds.
fn millis(key: &str, v: u64) -> Result<Duration, ConfigError> {
    range(key).millis(key, v)
}

/// [`int`] as a `usize`.
fn size(key: &str, v: u64) -> Result<usize, ConfigError> {
    range(key).size(key, v)
}

/// `v` of the decimal key `key` inside its documented range.
fn decimal(key: &str, v: f64) -> Result<f64, ConfigError> {
    range(key).check_decimal(key, v)
}

/// A value refused for a reason other than its range.
fn invalid(key: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError::new(key, ConfigErrorKind::Invalid, message)
}

/// Every key with its type, default, range and meaning: aligned text for
/// `--list-keys`, or the Markdown tables of docs/llm-adapter.md (each between its
/// `<!-- keys:NAME -->` markers) for `--list-keys --markdown`.
pub fn key_table(markdown: bool) -> String {
    keys::table(&layers(), SECTIONS, markdown)
}

#[cfg(test)]
mod tests;
