//! The budget of one per-stream queue and what happens over it: one declaration for
//! both per-stream queues, the producer's (`weir-audio-producer`'s `FrameQueue`) and
//! the consumer's (`weir-audio-consumer`'s `StreamQueue`).
//!
//! Invariants a change must not break:
//! - [`WhenFull`]'s wire names (serde and [`strum`]) are `close` and `gap`, the values
//!   of both binaries' `policy` key; `close` is the default, safe for every consumer.
//! - [`QueueLimits`] is plain data: it decides nothing by itself. Each queue applies it
//!   at admission with the items [`BoundedQueue`](super::BoundedQueue) hands back, so
//!   every frame over the budget is either refused (`close`) or dropped into a gap
//!   with its exact range (`gap`), and counted: never lost silently.

use std::time::Duration;

/// What a per-stream queue does when an item would break its [`QueueLimits`].
#[derive(strum::IntoStaticStr, strum::Display, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum WhenFull {
    /// End the stream with an overload `end`; the frames already queued are still
    /// delivered. The producer first waits up to `max_wait` for room (frames too old
    /// are an overload too); the consumer never waits — one subscription carries many
    /// streams, and waiting for one slow handler would stall them all — it ends the
    /// stream for that handler and counts the rest of the stream as dropped. The
    /// default; safe for every consumer.
    #[default]
    Close,
    /// Drop the oldest frames to stay within the budget and put one gap with the exact
    /// missing range in their place, so the timeline stays exact. On the producer, only
    /// for consumers that speak the extended protocol.
    Gap,
}

/// The budget of one per-stream queue: bytes and age of what it holds, and the policy
/// over them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueLimits {
    /// Bytes the queue may hold (PCM bytes, plus what each queue charges per item).
    pub max_bytes: usize,
    /// Age the oldest queued frame may reach.
    pub max_age: Duration,
    /// What happens over the budget.
    pub policy: WhenFull,
}

impl QueueLimits {
    /// Whether `bytes` (what would be held) break the byte budget.
    #[inline]
    pub fn over_bytes(&self, bytes: usize) -> bool {
        bytes > self.max_bytes
    }

    /// Whether an item of `age` breaks the age budget.
    #[inline]
    pub fn too_old(&self, age: Duration) -> bool {
        age > self.max_age
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_names_are_snake_case_and_close_is_the_default() {
        assert_eq!(WhenFull::default(), WhenFull::Close);
        for (p, name) in [(WhenFull::Close, "close"), (WhenFull::Gap, "gap")] {
            let s: &'static str = p.into();
            assert_eq!(s, name);
            assert_eq!(p.to_string(), name);
        }
    }

    #[test]
    fn bounds_are_inclusive() {
        let l = QueueLimits {
            max_bytes: 100,
            max_age: Duration::from_millis(500),
            policy: WhenFull::Gap,
        };
        assert!(!l.over_bytes(100));
        assert!(l.over_bytes(101));
        assert!(!l.too_old(Duration::from_millis(500)));
        assert!(l.too_old(Duration::from_millis(501)));
    }
}
