//! Wall-clock time as Unix milliseconds, the unit of every timestamp on the wire
//! (capture times, deadlines, capacity announcements). Saturating: a clock before 1970
//! is 0, one beyond `u64::MAX` ms is `u64::MAX`.

use std::time::{SystemTime, UNIX_EPOCH};

/// The wall clock now, in milliseconds since the Unix epoch.
pub fn unix_ms_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, crate::config::whole_ms)
}
