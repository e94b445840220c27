//! Telling a *declared possible loss* from an *undetected hole*: pure, synchronous, no
//! clock, one per stream instance.
//!
//! When the producer's NATS connection drops while frames were handed to its client but
//! not yet confirmed by the server, the producer declares their seqs on a later packet
//! (header `Weir-Possibly-Lost`, see `weir_protocol::audio::extension::PossibleLoss`).
//! Core NATS keeps order, so the consumer has usually seen the hole *before* the
//! declaration arrives: the packets after the hole come first. So this memory keeps
//!
//! - the last [`MEMORY`] **holes** (seq ranges the tracker reported lost and that no
//!   declaration has covered yet): a later declaration moves the part of a hole inside
//!   its `first_seq..=last_seq` from "lost" to "possibly lost";
//! - the last [`MEMORY`] **declared ranges**: a hole detected later inside one of them is
//!   "possibly lost" at once.
//!
//! Invariants a reader must not break:
//! - Every seq of a hole is classified exactly once at detection (lost or possibly
//!   lost) and moves at most once afterwards (lost → possibly lost): a repeated or
//!   cumulative declaration (the producer repeats it on `end`) finds nothing left to
//!   move.
//! - Both memories are bounded by [`MEMORY`] ranges; what falls off is counted
//!   ([`Memory::holes_forgotten`], [`Memory::declarations_forgotten`]) and a forgotten
//!   hole simply stays "lost".
//! - Arithmetic on seqs from the network saturates; nothing here panics.

use std::collections::VecDeque;

/// Ranges remembered per stream, for holes and for declared ranges each. 16 covers a
/// reconnect storm of 16 separate drops in the time a declaration takes to arrive
/// (normally one packet after the reconnect); a stream has at most a handful.
pub(crate) const MEMORY: usize = 16;

/// How a part of a hole is classified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HoleClass {
    /// Not (yet) declared by the producer: undetected loss in transit.
    Lost,
    /// Inside a range the producer declared possibly lost.
    PossiblyLost,
}

/// One classified part of a hole, `first..=last`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Segment {
    pub(crate) first: u64,
    pub(crate) last: u64,
    pub(crate) class: HoleClass,
}

impl Segment {
    fn new(first: u64, last: u64, class: HoleClass) -> Self {
        Self { first, last, class }
    }

    pub(crate) fn frames(&self) -> u64 {
        frames(self.first, self.last)
    }
}

/// Number of seqs in `first..=last`.
pub(crate) fn frames(first: u64, last: u64) -> u64 {
    last.saturating_sub(first).saturating_add(1)
}

/// The per-stream memory of holes and declared ranges.
#[derive(Debug, Default)]
pub(crate) struct Memory {
    /// Undeclared holes, oldest first (in seq order: holes are found in seq order).
    holes: VecDeque<(u64, u64)>,
    /// Declared ranges, oldest first.
    declared: VecDeque<(u64, u64)>,
    /// Hole ranges evicted from memory before a declaration covered them.
    pub(crate) holes_forgotten: u64,
    /// Declared ranges evicted from memory.
    pub(crate) declarations_forgotten: u64,
}

impl Memory {
    /// Records the declaration `first..=last` and returns how many frames of
    /// remembered holes it moves from lost to possibly lost. `first > last` declares
    /// nothing.
    pub(crate) fn declare(&mut self, first: u64, last: u64) -> u64 {
        if first > last {
            return 0;
        }
        let mut moved = 0u64;
        let mut kept = VecDeque::with_capacity(self.holes.len() + 1);
        for (a, b) in self.holes.drain(..) {
            if b < first || a > last {
                kept.push_back((a, b));
                continue;
            }
            let (lo, hi) = (a.max(first), b.min(last));
            moved = moved.saturating_add(frames(lo, hi));
            if a < lo {
                kept.push_back((a, lo - 1));
            }
            if hi < b {
                kept.push_back((hi + 1, b));
            }
        }
        self.holes = kept;
        self.holes_forgotten += evict(&mut self.holes) as u64;
        if !self.declared.iter().any(|&(a, b)| a <= first && last <= b) {
            self.declared.push_back((first, last));
            self.declarations_forgotten += evict(&mut self.declared) as u64;
        }
        moved
    }

    /// Classifies a hole the tracker just found, `first..=last`, in seq order: the
    /// parts inside a remembered declared range are possibly lost, the rest lost (and
    /// remembered for a declaration that may follow).
    pub(crate) fn hole(&mut self, first: u64, last: u64) -> Vec<Segment> {
        let mut out = Vec::with_capacity(1);
        if first > last {
            return out;
        }
        let mut covering: Vec<(u64, u64)> = self
            .declared
            .iter()
            .filter(|&&(a, b)| b >= first && a <= last)
            .map(|&(a, b)| (a.max(first), b.min(last)))
            .collect();
        covering.sort_unstable();
        let mut next = first;
        let mut done = false;
        for (a, b) in covering {
            if done || b < next {
                continue;
            }
            let a = a.max(next);
            if a > next {
                out.push(Segment::new(next, a - 1, HoleClass::Lost));
            }
            out.push(Segment::new(a, b, HoleClass::PossiblyLost));
            match b.checked_add(1) {
                Some(n) if n <= last => next = n,
                _ => done = true,
            }
        }
        if !done && next <= last {
            out.push(Segment::new(next, last, HoleClass::Lost));
        }
        // Merge adjacent possibly-lost parts from overlapping declarations.
        out.dedup_by(|b, a| {
            if a.class == b.class && a.last.checked_add(1) == Some(b.first) {
                a.last = b.last;
                true
            } else {
                false
            }
        });
        for s in &out {
            if s.class == HoleClass::Lost {
                self.holes.push_back((s.first, s.last));
            }
        }
        self.holes_forgotten += evict(&mut self.holes) as u64;
        out
    }
}

/// Drops the oldest ranges beyond [`MEMORY`]; returns how many.
fn evict(q: &mut VecDeque<(u64, u64)>) -> usize {
    let over = q.len().saturating_sub(MEMORY);
    q.drain(..over);
    over
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(first: u64, last: u64, class: HoleClass) -> Segment {
        Segment { first, last, class }
    }
    use HoleClass::{Lost, PossiblyLost};

    #[test]
    fn declaration_after_the_hole_moves_it() {
        let mut m = Memory::default();
        assert_eq!(m.hole(101, 125), vec![seg(101, 125, Lost)]);
        assert_eq!(m.declare(101, 125), 25);
        // Repeated (the cumulative declaration on `end`): nothing left to move.
        assert_eq!(m.declare(101, 125), 0);
        assert_eq!(m.declare(90, 130), 0);
    }

    #[test]
    fn declaration_moves_only_the_covered_part() {
        let mut m = Memory::default();
        m.hole(10, 19);
        m.hole(30, 30);
        // Covers 15..=19 of the first hole and nothing of the second.
        assert_eq!(m.declare(15, 25), 5);
        // The rest of the first hole is still remembered.
        assert_eq!(m.declare(1, 14), 5);
        assert_eq!(m.declare(30, 30), 1);
        assert_eq!(m.declare(1, 100), 0);
    }

    #[test]
    fn declaration_inside_a_hole_splits_it() {
        let mut m = Memory::default();
        m.hole(1, 100);
        assert_eq!(m.declare(40, 59), 20);
        assert_eq!(m.declare(1, 39), 39);
        assert_eq!(m.declare(60, 100), 41);
    }

    #[test]
    fn hole_after_the_declaration_is_classified_at_once() {
        let mut m = Memory::default();
        assert_eq!(m.declare(50, 60), 0);
        assert_eq!(m.hole(52, 55), vec![seg(52, 55, PossiblyLost)]);
        assert_eq!(
            m.hole(58, 70),
            vec![seg(58, 60, PossiblyLost), seg(61, 70, Lost)]
        );
        assert_eq!(
            m.hole(40, 50),
            vec![seg(40, 49, Lost), seg(50, 50, PossiblyLost)]
        );
        // Only the lost parts are remembered for a later declaration.
        assert_eq!(m.declare(1, 100), 10 + 10);
    }

    #[test]
    fn overlapping_declarations_classify_each_seq_once() {
        let mut m = Memory::default();
        m.declare(10, 20);
        m.declare(15, 30);
        m.declare(40, 45);
        assert_eq!(
            m.hole(5, 50),
            vec![
                seg(5, 9, Lost),
                seg(10, 30, PossiblyLost),
                seg(31, 39, Lost),
                seg(40, 45, PossiblyLost),
                seg(46, 50, Lost)
            ]
        );
        let total: u64 = m.hole(60, 60).iter().map(Segment::frames).sum();
        assert_eq!(total, 1);
    }

    #[test]
    fn memory_is_bounded_and_counts_what_falls_off() {
        let mut m = Memory::default();
        for i in 0..20u64 {
            m.hole(i * 10, i * 10 + 1);
        }
        assert_eq!(m.holes.len(), MEMORY);
        assert_eq!(m.holes_forgotten, 4);
        // The four oldest holes are forgotten: they stay lost.
        assert_eq!(m.declare(0, 39), 0);
        assert_eq!(m.declare(40, 49), 2);
        for i in 0..20u64 {
            m.declare(1_000 + i * 10, 1_000 + i * 10);
        }
        assert_eq!(m.declared.len(), MEMORY);
        // (0..=39) and (40..=49), then 20 more: 22 ranges, 16 kept.
        assert_eq!(m.declarations_forgotten, 6);
    }

    #[test]
    fn hostile_ranges_do_not_panic() {
        let mut m = Memory::default();
        assert_eq!(m.declare(9, 3), 0);
        assert!(m.hole(9, 3).is_empty());
        assert_eq!(m.declare(u64::MAX - 1, u64::MAX), 0);
        assert_eq!(
            m.hole(u64::MAX - 5, u64::MAX),
            vec![
                seg(u64::MAX - 5, u64::MAX - 2, Lost),
                seg(u64::MAX - 1, u64::MAX, PossiblyLost)
            ]
        );
        let all = m
            .hole(0, u64::MAX)
            .iter()
            .fold(0u64, |n, s| n.saturating_add(s.frames()));
        assert_eq!(all, u64::MAX);
        assert_eq!(m.declare(0, u64::MAX), u64::MAX);
    }
}
