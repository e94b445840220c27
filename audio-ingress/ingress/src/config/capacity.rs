//! The `[capacity]` section: admission by recognition capacity ([`crate::capacity`]).
//!
//! Invariants: `capacity.prefix` is a usable subject prefix (no wildcard, no empty
//! token), `capacity.max_lag_ms` is inside the range of [`CAPACITY_KEYS`]; the
//! defaults validate.

use std::time::Duration;

use weir_protocol::capacity::DEFAULT_PREFIX;
use weir_service::config::Range;

use super::{ConfigError, int_in, subject_prefix};

/// What the door does with the recognition workers' announcements (`capacity.mode`).
#[derive(strum::IntoStaticStr, strum::Display)]
#[strum(serialize_all = "snake_case")]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum CapacityMode {
    /// No check at admission: streams are admitted as if no worker announced. The
    /// door still listens, so a worker's refusal and lag reach the producer.
    Off,
    /// The check runs; a stream it would refuse is counted
    /// (`weir_ingress_capacity_shadow_would_reject_total`) and admitted.
    Shadow,
    /// The check refuses (`503 no_capacity`). With no announcement heard it never
    /// refuses, so recognisers that announce nothing are unaffected.
    #[default]
    Enforce,
}

/// Default `capacity.max_lag_ms`: a worker whose oldest waiting frame is older than
/// this is lagging (half the consumer core's default `max_frame_age_ms`, 1 s, so the
/// door stops adding streams before the worker starts dropping stale frames).
pub const DEFAULT_MAX_LAG_MS: u64 = 500;

/// The validated `[capacity]` settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapacityConfig {
    /// `capacity.mode`.
    pub mode: CapacityMode,
    /// `capacity.prefix`: announcements on `<prefix>.announce.*`, refusals on
    /// `<prefix>.refused.*`.
    pub prefix: String,
    /// `capacity.max_lag_ms`: above it a worker is lagging (new streams refused,
    /// `degraded` sent to its producers).
    pub max_lag: Duration,
}

impl Default for CapacityConfig {
    /// The documented defaults: the keys' defaults, validated.
    fn default() -> Self {
        super::valid_default(CapacitySection::default().validate())
    }
}

weir_service::config_section! {
    /// The `[capacity]` keys as read from the layers.
    #[derive(Debug)]
    pub(super) struct CapacitySection, CAPACITY_KEYS = "capacity.";
    {
        mode: CapacityMode = CapacityMode::default(),
            Range::text("`off`, `shadow` or `enforce`"),
            "admission by recognition capacity: `enforce` refuses a stream whose partition's \
            announcing worker is gone, full or lagging (`503 no_capacity` + `Retry-After`); \
            `shadow` counts those and admits; `off` decides nothing (a worker's refusal and \
            lag still reach the producer in every mode). With no announcement heard \
            nothing is refused, so recognisers that announce nothing are unaffected";
        prefix: String = DEFAULT_PREFIX.to_owned(), Range::text("a subject prefix without wildcards"),
            "subject prefix of the workers' announcements (`<prefix>.announce.<worker>`) and \
            refusals (`<prefix>.refused.<stream>`)";
        max_lag_ms: u64 = DEFAULT_MAX_LAG_MS, Range::ms(10, 3600000),
            "a worker whose announced lag is above this is lagging: new streams on its \
            partitions are refused and its live streams' producers get `degraded`";
    }
}

impl CapacitySection {
    /// The typed settings, or the refusal naming the key.
    pub(super) fn validate(&self) -> Result<CapacityConfig, ConfigError> {
        subject_prefix("capacity.prefix", &self.prefix)?;
        Ok(CapacityConfig {
            mode: self.mode,
            prefix: self.prefix.clone(),
            max_lag: Duration::from_millis(int_in("capacity.max_lag_ms", self.max_lag_ms)?),
        })
    }
}
