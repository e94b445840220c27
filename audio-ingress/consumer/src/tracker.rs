//! Per-stream sequence tracking: pure, synchronous, no clock.
//!
//! The deployed producer numbers its packets `1, 2, 3, ...`; the `end` takes the next
//! number, and a declared gap packet `{first_seq..=last_seq}` carries `seq = last_seq`
//! (see `docs/contracts.md`). Core NATS is at-most-once and, on one subscription fed by
//! one publisher connection, keeps order. So for one stream the tracker expects the seq
//! of each packet to be exactly one more than the last seq it accepted, and classifies
//! every packet as:
//!
//! - in order, possibly after a **loss**: the seqs between the expected one and this
//!   packet's first seq never arrived (NATS loss, or a packet that could not be decoded);
//! - **stale**: a seq at or below the last accepted one (duplicate or reordered) — it is
//!   refused so that the handler sees a strictly increasing timeline;
//! - a **restart**: seq 1 (or a gap starting at 1) after the stream had advanced — the
//!   producer started the stream again under the same id without an `end`.
//!
//! Invariants a reader must not break:
//! - The last accepted seq only grows while one stream instance lives; every seq up to
//!   it has been accepted, reported lost, reported declared-missing or reported
//!   leading-missing — exactly once each.
//! - The tracker never panics: arithmetic on seqs coming from the network saturates.

use std::ops::RangeInclusive;

/// What the tracker decided about one packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observation {
    /// Accept the packet. `lost` is the range of seqs that should have arrived before it
    /// and did not (undeclared loss); `leading` is how many seqs before the first packet
    /// of the stream were never seen (set only on the stream's first packet).
    Accept {
        /// Undeclared loss detected by this packet.
        lost: Option<RangeInclusive<u64>>,
        /// Seqs `1..first` never seen, on the first packet only.
        leading: u64,
    },
    /// The packet's seq was already passed: a duplicate or a reordered packet.
    Stale,
    /// The producer started over (seq 1 after the stream had advanced).
    Restart,
}

/// The kind of packet being tracked, reduced to what sequencing needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seqs {
    /// A frame or an end packet: occupies exactly its own seq.
    Single(u64),
    /// A declared gap: occupies `first..=last` (the packet's own seq is `last`).
    Range {
        /// First missing seq.
        first: u64,
        /// Last missing seq (the gap packet's seq).
        last: u64,
    },
}

impl Seqs {
    /// The first seq it occupies.
    pub(crate) fn first(self) -> u64 {
        match self {
            Self::Single(s) => s,
            Self::Range { first, .. } => first,
        }
    }

    fn last(self) -> u64 {
        match self {
            Self::Single(s) => s,
            Self::Range { last, .. } => last,
        }
    }
}

/// Sequence state of one stream instance.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SeqTracker {
    /// The last seq accepted; `None` before the first packet.
    last: Option<u64>,
}

impl SeqTracker {
    /// A tracker that has seen nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Classifies one packet and, when accepted, advances past it.
    ///
    /// A range whose `first > last` is treated as the single seq `last` (the decoder
    /// should refuse such gaps; the tracker stays total anyway).
    pub fn observe(&mut self, seqs: Seqs) -> Observation {
        let seqs = match seqs {
            Seqs::Range { first, last } if first > last => Seqs::Single(last),
            other => other,
        };
        let (first, last) = (seqs.first(), seqs.last());
        let Some(prev) = self.last else {
            self.last = Some(last);
            return Observation::Accept {
                lost: None,
                leading: first.saturating_sub(1),
            };
        };
        if first <= 1 && prev >= 2 {
            // Seq 1 again after the stream advanced past it: not the first frame
            // arriving late (core NATS keeps order) but a new instance of the stream.
            return Observation::Restart;
        }
        if last <= prev {
            return Observation::Stale;
        }
        self.last = Some(last);
        let expected = prev.saturating_add(1);
        // A gap that starts at or before `prev` overlaps what was already accepted;
        // only its new part advances the timeline, which `self.last = last` did.
        let lost = (first > expected).then(|| expected..=first - 1);
        Observation::Accept { lost, leading: 0 }
    }

    /// The last seq accepted, if any.
    pub fn last_seq(&self) -> Option<u64> {
        self.last
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accept(lost: Option<RangeInclusive<u64>>, leading: u64) -> Observation {
        Observation::Accept { lost, leading }
    }

    #[test]
    fn in_order_stream_has_no_loss() {
        let mut t = SeqTracker::new();
        for s in 1..=100 {
            assert_eq!(t.observe(Seqs::Single(s)), accept(None, 0));
        }
        assert_eq!(t.last_seq(), Some(100));
    }

    #[test]
    fn missing_seqs_are_reported_once() {
        let mut t = SeqTracker::new();
        assert_eq!(t.observe(Seqs::Single(1)), accept(None, 0));
        assert_eq!(t.observe(Seqs::Single(5)), accept(Some(2..=4), 0));
        assert_eq!(t.observe(Seqs::Single(6)), accept(None, 0));
        // The end after a loss of the last frames.
        assert_eq!(t.observe(Seqs::Single(9)), accept(Some(7..=8), 0));
    }

    #[test]
    fn late_join_counts_leading_not_lost() {
        let mut t = SeqTracker::new();
        assert_eq!(t.observe(Seqs::Single(40)), accept(None, 39));
        assert_eq!(t.observe(Seqs::Single(41)), accept(None, 0));
    }

    #[test]
    fn stale_and_duplicate_packets_are_refused() {
        let mut t = SeqTracker::new();
        t.observe(Seqs::Single(1));
        t.observe(Seqs::Single(2));
        t.observe(Seqs::Single(3));
        assert_eq!(t.observe(Seqs::Single(3)), Observation::Stale);
        assert_eq!(t.observe(Seqs::Single(2)), Observation::Stale);
        assert_eq!(t.observe(Seqs::Single(4)), accept(None, 0));
    }

    #[test]
    fn seq_one_after_progress_is_a_restart() {
        let mut t = SeqTracker::new();
        for s in 1..=10 {
            t.observe(Seqs::Single(s));
        }
        assert_eq!(t.observe(Seqs::Single(1)), Observation::Restart);
        // A duplicate of seq 1 right after seq 1 is just stale.
        let mut t = SeqTracker::new();
        t.observe(Seqs::Single(1));
        assert_eq!(t.observe(Seqs::Single(1)), Observation::Stale);
    }

    #[test]
    fn declared_gap_advances_without_loss() {
        let mut t = SeqTracker::new();
        t.observe(Seqs::Single(1));
        t.observe(Seqs::Single(2));
        assert_eq!(
            t.observe(Seqs::Range { first: 3, last: 7 }),
            accept(None, 0)
        );
        assert_eq!(t.observe(Seqs::Single(8)), accept(None, 0));
    }

    #[test]
    fn loss_before_a_declared_gap_is_separate() {
        let mut t = SeqTracker::new();
        t.observe(Seqs::Single(1));
        assert_eq!(
            t.observe(Seqs::Range { first: 5, last: 9 }),
            accept(Some(2..=4), 0)
        );
        assert_eq!(t.last_seq(), Some(9));
    }

    #[test]
    fn hostile_seqs_do_not_panic() {
        let mut t = SeqTracker::new();
        assert_eq!(
            t.observe(Seqs::Single(u64::MAX)),
            accept(None, u64::MAX - 1)
        );
        assert_eq!(t.observe(Seqs::Single(u64::MAX)), Observation::Stale);
        let mut t = SeqTracker::new();
        assert_eq!(t.observe(Seqs::Single(0)), accept(None, 0));
        assert_eq!(
            t.observe(Seqs::Range { first: 9, last: 3 }),
            accept(Some(1..=2), 0)
        );
    }
}
