//! Capture times: monotonic instants mapped to Unix milliseconds.
//!
//! Invariant: a capture time is derived from an anchor at most
//! [`WallClock::REANCHOR`] old, so a wall-clock step shows within a second; reading
//! it costs no clock read per frame beyond the caller's `now`.

use std::time::Duration;

use tokio::time::Instant;
use weir_service::clock::unix_ms_now;

/// An anchor (instant, Unix ms) that monotonic instants are mapped from (see the module
/// docs).
#[derive(Debug)]
pub(crate) struct WallClock {
    at: Instant,
    unix_ms: u64,
}

impl WallClock {
    const REANCHOR: Duration = Duration::from_secs(1);

    pub(crate) fn new() -> Self {
        Self {
            at: Instant::now(),
            unix_ms: unix_ms_now(),
        }
    }

    /// Unix ms of `t` (an instant near `now`); re-anchors when the anchor is old.
    #[inline]
    pub(crate) fn unix_ms(&mut self, t: Instant, now: Instant) -> u64 {
        if now.saturating_duration_since(self.at) >= Self::REANCHOR {
            *self = Self::new();
        }
        if t >= self.at {
            self.unix_ms + t.duration_since(self.at).as_millis() as u64
        } else {
            self.unix_ms
                .saturating_sub(self.at.duration_since(t).as_millis() as u64)
        }
    }
}
