//! The fence of one leased partition: shared by the lease driver (which extends or
//! revokes it) and every handler task of the partition (which checks it before each
//! event it hands over).
//!
//! Invariant: once [`Fence::is_open`] returned false it never returns true again — a
//! revoked fence stays revoked, and the validity only moves forward.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::time::Instant;

/// See the [module docs](self).
#[derive(Debug)]
pub(crate) struct Fence {
    base: Instant,
    /// Valid until `base` + this many microseconds.
    valid_until_us: AtomicU64,
    revoked: AtomicBool,
}

impl Fence {
    pub(crate) fn new(now: Instant, valid_until: Instant) -> Self {
        let fence = Self {
            base: now,
            valid_until_us: AtomicU64::new(0),
            revoked: AtomicBool::new(false),
        };
        fence.extend(valid_until);
        fence
    }

    /// Moves the validity forward to `valid_until` (never backward).
    pub(crate) fn extend(&self, valid_until: Instant) {
        let us = u64::try_from(valid_until.saturating_duration_since(self.base).as_micros())
            .unwrap_or(u64::MAX);
        self.valid_until_us.fetch_max(us, Ordering::AcqRel);
    }

    /// Closes the fence for good.
    pub(crate) fn revoke(&self) {
        self.revoked.store(true, Ordering::Release);
    }

    /// Whether the fence was revoked (as opposed to having run out).
    pub(crate) fn is_revoked(&self) -> bool {
        self.revoked.load(Ordering::Acquire)
    }

    /// Whether events may still be handed to handlers at `now`.
    pub(crate) fn is_open(&self, now: Instant) -> bool {
        if self.is_revoked() {
            return false;
        }
        let now_us =
            u64::try_from(now.saturating_duration_since(self.base).as_micros()).unwrap_or(u64::MAX);
        if now_us < self.valid_until_us.load(Ordering::Acquire) {
            true
        } else {
            // Ran out: stays closed even if a late renewal extends it.
            self.revoke();
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn closes_at_its_validity_and_stays_closed() {
        let now = Instant::now();
        let fence = Fence::new(now, now + Duration::from_secs(9));
        assert!(fence.is_open(now));
        fence.extend(now + Duration::from_secs(5)); // never backward
        tokio::time::advance(Duration::from_secs(8)).await;
        assert!(fence.is_open(Instant::now()));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(!fence.is_open(Instant::now()));
        fence.extend(Instant::now() + Duration::from_secs(9));
        assert!(
            !fence.is_open(Instant::now()),
            "a late renewal reopens nothing"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn revoke_closes_at_once() {
        let now = Instant::now();
        let fence = Fence::new(now, now + Duration::from_secs(9));
        fence.revoke();
        assert!(!fence.is_open(now));
        assert!(fence.is_revoked());
    }
}
