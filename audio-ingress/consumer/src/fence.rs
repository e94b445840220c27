//! The fence of one leased partition: shared by the lease driver (which extends or
//! revokes it) and every handler task of the partition (which checks it before each
//! event it hands over). Every fence of a worker also depends on the worker's
//! [`Liveness`]: the proof, from its own heartbeats heard back, that the others still
//! take it for alive.
//!
//! Invariants:
//! - Once [`Fence::is_open`] returned false it never returns true again — a revoked
//!   fence stays revoked, and the validity only moves forward.
//! - A fence is open only while the worker's liveness is valid. The driver revokes
//!   every fence *before* it extends a liveness that had run out (see
//!   [`Liveness::renew`]), and [`Fence::is_open`] reads the liveness before the revoked
//!   flag, so a handler that sees the extended liveness also sees the revocation.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::time::Instant;

/// Microseconds from `base` to `t` (0 before it, saturating).
fn us_since(base: Instant, t: Instant) -> u64 {
    u64::try_from(t.saturating_duration_since(base).as_micros()).unwrap_or(u64::MAX)
}

/// A worker's liveness as its peers can judge it: valid until the send time of its
/// latest heartbeat heard back + the self-validity (the heartbeat timeout after which
/// peers take it for dead and take its partitions over).
///
/// A worker whose heartbeats stop coming back — it stalled, or lost its connection —
/// stops delivering before anyone can have taken its partitions; see the lease
/// planner's docs for why the peers' side of that holds.
///
/// Whoever finds it run out first — a handler checking its fence, or the driver —
/// latches that in `lapsed`, so the driver always learns of a lapse that closed a fence
/// (and drops the leases behind it) even if a heartbeat renewed the liveness meanwhile.
#[derive(Debug)]
pub(crate) struct Liveness {
    base: Instant,
    /// Valid until `base` + this many microseconds (0: never heard back yet).
    valid_until_us: AtomicU64,
    /// It ran out since the driver last dealt with a lapse.
    lapsed: AtomicBool,
}

impl Liveness {
    pub(crate) fn new(now: Instant) -> Self {
        Self {
            base: now,
            valid_until_us: AtomicU64::new(0),
            lapsed: AtomicBool::new(false),
        }
    }

    /// Whether the worker may deliver at `now` (latching a lapse when not).
    pub(crate) fn is_valid(&self, now: Instant) -> bool {
        let until = self.valid_until_us.load(Ordering::Acquire);
        if us_since(self.base, now) < until {
            return true;
        }
        if until > 0 {
            self.lapsed.store(true, Ordering::Release);
        }
        false
    }

    /// Whether it was valid once and ran out (by `now`, or as found by a handler since
    /// the last [`Self::clear_lapse`]), as opposed to never having been valid.
    pub(crate) fn has_lapsed(&self, now: Instant) -> bool {
        let until = self.valid_until_us.load(Ordering::Acquire);
        self.lapsed.load(Ordering::Acquire) || (until > 0 && us_since(self.base, now) >= until)
    }

    /// The driver dealt with a lapse (every fence revoked, every lease dropped).
    pub(crate) fn clear_lapse(&self) {
        self.lapsed.store(false, Ordering::Release);
    }

    /// A heartbeat came back: valid until `valid_until` (never moved backward). The
    /// caller revokes every fence first when [`Self::has_lapsed`]: a liveness that ran
    /// out must not be revived under fences that were open before.
    pub(crate) fn renew(&self, valid_until: Instant) {
        self.valid_until_us
            .fetch_max(us_since(self.base, valid_until), Ordering::AcqRel);
    }
}

#[cfg(test)]
impl Liveness {
    /// A liveness valid for a day (tests where the lease validity alone decides).
    pub(crate) fn for_a_day(now: Instant) -> Arc<Self> {
        let l = Arc::new(Self::new(now));
        l.renew(now + std::time::Duration::from_secs(86_400));
        l
    }
}

/// See the [module docs](self).
#[derive(Debug)]
pub(crate) struct Fence {
    base: Instant,
    /// Valid until `base` + this many microseconds.
    valid_until_us: AtomicU64,
    revoked: AtomicBool,
    liveness: Arc<Liveness>,
}

impl Fence {
    pub(crate) fn new(now: Instant, valid_until: Instant, liveness: Arc<Liveness>) -> Self {
        let fence = Self {
            base: now,
            valid_until_us: AtomicU64::new(0),
            revoked: AtomicBool::new(false),
            liveness,
        };
        fence.extend(valid_until);
        fence
    }

    /// Moves the validity forward to `valid_until` (never backward).
    pub(crate) fn extend(&self, valid_until: Instant) {
        self.valid_until_us
            .fetch_max(us_since(self.base, valid_until), Ordering::AcqRel);
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
        // The liveness first: see the module docs.
        let live = self.liveness.is_valid(now);
        if self.is_revoked() {
            return false;
        }
        if live && us_since(self.base, now) < self.valid_until_us.load(Ordering::Acquire) {
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

    fn live(now: Instant) -> Arc<Liveness> {
        Liveness::for_a_day(now)
    }

    #[tokio::test(start_paused = true)]
    async fn closes_at_its_validity_and_stays_closed() {
        let now = Instant::now();
        let fence = Fence::new(now, now + Duration::from_secs(9), live(now));
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
        let fence = Fence::new(now, now + Duration::from_secs(9), live(now));
        fence.revoke();
        assert!(!fence.is_open(now));
        assert!(fence.is_revoked());
    }

    #[tokio::test(start_paused = true)]
    async fn a_lapsed_liveness_closes_every_fence_for_good() {
        let now = Instant::now();
        let liveness = Arc::new(Liveness::new(now));
        let fence = Fence::new(now, now + Duration::from_secs(9), liveness.clone());
        assert!(
            !fence.is_open(now),
            "never heard back: nothing is delivered"
        );
        assert!(!liveness.has_lapsed(now));
        let fence = Fence::new(now, now + Duration::from_secs(9), liveness.clone());
        liveness.renew(now + Duration::from_millis(1_350));
        assert!(fence.is_open(now));
        tokio::time::advance(Duration::from_millis(1_350)).await;
        let later = Instant::now();
        assert!(liveness.has_lapsed(later));
        assert!(
            !fence.is_open(later),
            "a stalled worker stops at its liveness"
        );
        liveness.renew(later + Duration::from_millis(1_350));
        assert!(
            liveness.has_lapsed(later),
            "the lapse a handler found stays until the driver dealt with it"
        );
        liveness.clear_lapse();
        assert!(!liveness.has_lapsed(later));
        assert!(
            !fence.is_open(later),
            "a fence closed by the lapse stays closed when the liveness comes back"
        );
        let fresh = Fence::new(later, later + Duration::from_secs(9), liveness);
        assert!(fresh.is_open(later), "a lease acquired afterwards delivers");
    }
}
