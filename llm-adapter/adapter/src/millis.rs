//! Durations and wall-clock time as whole milliseconds, the unit of the headers, the
//! JSON documents and the configuration keys (`_ms`). Saturating: a duration beyond
//! `u64::MAX` ms is `u64::MAX`, a clock before 1970 is 0.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `d` in whole milliseconds (rounded down).
pub(crate) fn whole_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The wall clock now, in milliseconds since the Unix epoch.
pub(crate) fn unix_ms_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, whole_ms)
}
