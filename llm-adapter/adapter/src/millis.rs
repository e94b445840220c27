//! Durations and wall-clock time as whole milliseconds, the unit of the headers, the
//! JSON documents and the configuration keys (`_ms`). Saturating: a duration beyond
//! `u64::MAX` ms is `u64::MAX`, a clock before 1970 is 0.

use std::time::{SystemTime, UNIX_EPOCH};

use weir_service::config::whole_ms;

/// The wall clock now, in milliseconds since the Unix epoch.
pub(crate) fn unix_ms_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, whole_ms)
}
