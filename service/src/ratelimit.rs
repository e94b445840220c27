//! Rate-limited log sites: a warning in a loop that runs per packet or per retry says
//! so once per interval, with how many times it was suppressed in between.
//!
//! One [`LogLimit`] per call site, usually a `static`:
//!
//! ```
//! use std::time::Duration;
//! use weir_service::ratelimit::LogLimit;
//!
//! static PUBLISH_FAILED: LogLimit = LogLimit::new(Duration::from_secs(5));
//! if let Some(suppressed) = PUBLISH_FAILED.allow() {
//!     tracing::warn!(suppressed, "NATS publish failed");
//! }
//! ```
//!
//! Invariant: over any run of calls, `allow` returns `Some` at most once per interval
//! (the first call always), and the `Some` values plus the calls still suppressed add
//! up to the number of calls: nothing is counted twice or dropped.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A per-site log rate limit (see the module docs). Lock-free; `const`-constructible.
#[derive(Debug)]
pub struct LogLimit {
    interval_ns: u64,
    /// When the last allowed call happened, ns since [`epoch`] + 1 (0: never).
    last_ns: AtomicU64,
    suppressed: AtomicU64,
}

/// The process-wide origin of [`LogLimit`]'s clock.
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

impl LogLimit {
    /// At most one log line per `interval`.
    pub const fn new(interval: Duration) -> Self {
        Self {
            interval_ns: interval.as_nanos() as u64,
            last_ns: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// `Some(n)`: log now, `n` calls were suppressed since the last line. `None`: stay
    /// quiet (counted).
    pub fn allow(&self) -> Option<u64> {
        self.allow_at(epoch().elapsed())
    }

    fn allow_at(&self, now: Duration) -> Option<u64> {
        let now_ns = u64::try_from(now.as_nanos()).unwrap_or(u64::MAX - 1) + 1;
        let last = self.last_ns.load(Ordering::Relaxed);
        let due = last == 0 || now_ns.saturating_sub(last) >= self.interval_ns;
        if due
            && self
                .last_ns
                .compare_exchange(last, now_ns, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            return Some(self.suppressed.swap(0, Ordering::AcqRel));
        }
        self.suppressed.fetch_add(1, Ordering::Relaxed);
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_with_the_suppressed_count() {
        let l = LogLimit::new(Duration::from_secs(5));
        let at = |s: u64| l.allow_at(Duration::from_millis(s));
        assert_eq!(at(0), Some(0), "the first call logs");
        assert_eq!(at(1_000), None);
        assert_eq!(at(4_999), None);
        assert_eq!(at(5_000), Some(2), "two suppressed in between");
        assert_eq!(at(5_001), None);
        assert_eq!(at(20_000), Some(1));
        assert_eq!(at(20_000), None);
    }

    #[test]
    fn calls_are_counted_exactly_once_across_threads() {
        static L: LogLimit = LogLimit::new(Duration::from_secs(3600));
        // (lines logged, suppressed counts they reported). A call that lost the race to
        // the first line may be counted into that line's `Some(n)` (it incremented before
        // the winner's swap) or stay in `suppressed`: either way exactly once.
        let (logged, reported) = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| {
                        (0..1000)
                            .filter_map(|_| L.allow())
                            .fold((0u64, 0u64), |(n, r), got| (n + 1, r + got))
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().expect("thread"))
                .fold((0, 0), |(n, r), (dn, dr)| (n + dn, r + dr))
        });
        assert_eq!(logged, 1, "one line in the hour");
        assert_eq!(
            logged + reported + L.suppressed.load(Ordering::Relaxed),
            4000,
            "every call is the line, reported by it, or still suppressed"
        );
    }
}
