//! Frame accounting: where every frame went, and what explains any difference.
//!
//! "Producer side" is the ingress, the NATS producer: `offered` is what it read from
//! the WebSocket producers. Then
//!
//! ```text
//! unaccounted = offered − received − dropped          (dropped: with a reason, by the ingress)
//! ```
//!
//! and any non-zero value is decomposed, exactly, into
//!
//! ```text
//! unaccounted = pending_at_end                       still held by the ingress when measured
//!             + lost_after_publish                   published − received: NATS is at-most-once
//!             + ingress_discrepancy                  offered − published − dropped − pending_at_end
//! ```
//!
//! `lost_after_publish` is confirmed (or not) by `consumer_detected_holes`: seqs below
//! the highest one a consumer saw that did not arrive in order and no gap declared.
//! Some of those may have arrived *late*, after a later frame of their stream, and
//! been refused to keep the stream's order (`refused_out_of_order`): the naive design
//! does that, since three publishes of one stream race each other. A loss at the
//! very tail of a stream (after the last frame the consumer saw, and the `end` lost too)
//! cannot be detected by sequence numbers; the difference is reported as
//! `lost_undetected`. `ingress_discrepancy` must be 0 — anything else means the
//! ingress's own counters do not add up.
//!
//! One hop earlier, `sent_by_producers − offered` = `not_read_by_ingress`: frames the
//! WebSocket producers wrote that the ingress never read — written after the server
//! had ended the stream (the producer was told: `overload`/close) or in flight when the
//! socket died.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

/// The raw counts at the end of a run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FrameCounts {
    /// Frames the WebSocket producers wrote.
    pub sent_by_producers: u64,
    /// Frames the ingress read (its `frames.offered`).
    pub offered: u64,
    /// Frames the ingress handed to NATS.
    pub published: u64,
    /// Frames the ingress dropped, by reason.
    pub dropped: BTreeMap<String, u64>,
    /// Frames still held by the ingress at the end.
    pub pending_at_end: u64,
    /// Distinct frames the fleet received.
    pub received: u64,
    /// Holes the fleet detected by sequence number.
    pub consumer_detected_holes: u64,
    /// Packets the fleet refused because they arrived after a later seq.
    pub refused_out_of_order: u64,
    /// Frames declared missing by gap packets.
    pub declared_in_gaps: u64,
}

/// The `frames` object of the report.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct FrameAccounting {
    /// Frames the WebSocket producers wrote.
    pub sent_by_producers: u64,
    /// Frames the ingress read from the producers.
    pub offered: u64,
    /// Frames handed to NATS.
    pub published: u64,
    /// Distinct frames the recognition fleet received.
    pub received: u64,
    /// Frames dropped by the ingress with a reason (total).
    pub dropped: u64,
    /// Dropped frames by reason.
    pub dropped_by_reason: BTreeMap<String, u64>,
    /// Frames declared missing in gap packets the fleet received.
    pub declared_in_gaps: u64,
    /// `offered − received − dropped` (may be negative only if counters are broken).
    pub unaccounted: i64,
    /// Exact decomposition of `unaccounted`.
    pub explained: Explanation,
    /// `sent_by_producers − offered`: written by producers, never read by the ingress.
    pub not_read_by_ingress: i64,
}

/// The terms that add up to `unaccounted`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Explanation {
    /// Still held by the ingress when measured.
    pub pending_at_end: u64,
    /// Published but never received (core NATS is at-most-once).
    pub lost_after_publish: i64,
    /// Of those, detected by the consumer as sequence holes.
    pub consumer_detected_holes: u64,
    /// Of the holes, frames that did arrive but after a later frame of their stream
    /// and were refused (the stream's order was broken upstream).
    pub refused_out_of_order: u64,
    /// At least this many were not detectable by sequence numbers (lost at a stream's
    /// tail): `max(0, lost_after_publish − consumer_detected_holes)`. Holes can exceed
    /// the loss because they also cover frames the ingress dropped *with a reason* just
    /// before an overload `end` (accounted in `dropped`).
    pub lost_undetected: i64,
    /// `offered − published − dropped − pending_at_end`; must be 0.
    pub ingress_discrepancy: i64,
}

fn signed(a: u64, b: u64) -> i64 {
    (i128::from(a) - i128::from(b)).clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
}

impl FrameAccounting {
    /// Computes the accounting from the raw counts (pure).
    pub fn from_counts(c: &FrameCounts) -> Self {
        let dropped: u64 = c.dropped.values().sum();
        let unaccounted = signed(c.offered, c.received) - dropped as i64;
        let lost_after_publish = signed(c.published, c.received);
        let ingress_discrepancy =
            signed(c.offered, c.published) - dropped as i64 - c.pending_at_end as i64;
        Self {
            sent_by_producers: c.sent_by_producers,
            offered: c.offered,
            published: c.published,
            received: c.received,
            dropped,
            dropped_by_reason: c.dropped.clone(),
            declared_in_gaps: c.declared_in_gaps,
            unaccounted,
            explained: Explanation {
                pending_at_end: c.pending_at_end,
                lost_after_publish,
                consumer_detected_holes: c.consumer_detected_holes,
                refused_out_of_order: c.refused_out_of_order,
                lost_undetected: (lost_after_publish - c.consumer_detected_holes as i64).max(0),
                ingress_discrepancy,
            },
            not_read_by_ingress: signed(c.sent_by_producers, c.offered),
        }
    }

    /// Sentences that explain every non-zero term, for the report's notes.
    pub fn notes(&self) -> Vec<String> {
        let mut notes = Vec::new();
        let e = &self.explained;
        if self.unaccounted != 0 {
            notes.push(format!(
                "unaccounted {} = pending at end {} + lost after publish {} + ingress discrepancy {}",
                self.unaccounted, e.pending_at_end, e.lost_after_publish, e.ingress_discrepancy
            ));
        }
        if e.lost_after_publish > 0 {
            let mut n = format!(
                "{} frames were handed to NATS and not received in order: the consumers detected \
                 {} sequence holes",
                e.lost_after_publish, e.consumer_detected_holes
            );
            if e.refused_out_of_order > 0 {
                let _ = write!(
                    n,
                    " ({} of those frames did arrive, after a later frame of their stream, and \
                     were refused to keep the stream in order)",
                    e.refused_out_of_order
                );
            }
            if e.lost_undetected > 0 {
                let _ = write!(
                    n,
                    "; {} were not detectable by sequence (lost at a stream's tail)",
                    e.lost_undetected
                );
            }
            notes.push(n);
        }
        if e.ingress_discrepancy != 0 {
            notes.push(format!(
                "the ingress's counters do not add up: offered − published − dropped − pending = {}",
                e.ingress_discrepancy
            ));
        }
        if self.not_read_by_ingress > 0 {
            notes.push(format!(
                "{} frames written by producers were never read by the ingress (sent after the \
                 server ended the stream, or in flight when the socket closed)",
                self.not_read_by_ingress
            ));
        }
        notes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_delivered_is_zero() {
        let a = FrameAccounting::from_counts(&FrameCounts {
            sent_by_producers: 100,
            offered: 100,
            published: 100,
            received: 100,
            ..Default::default()
        });
        assert_eq!(a.unaccounted, 0);
        assert_eq!(a.explained, Explanation::default());
        assert!(a.notes().is_empty());
    }

    #[test]
    fn drops_with_a_reason_are_accounted() {
        let a = FrameAccounting::from_counts(&FrameCounts {
            sent_by_producers: 105,
            offered: 100,
            published: 70,
            received: 70,
            dropped: BTreeMap::from([("queue_full".into(), 25), ("overload".into(), 5)]),
            declared_in_gaps: 25,
            ..Default::default()
        });
        assert_eq!(a.dropped, 30);
        assert_eq!(a.unaccounted, 0);
        assert_eq!(a.explained.ingress_discrepancy, 0);
        assert_eq!(a.not_read_by_ingress, 5);
    }

    #[test]
    fn nats_loss_is_decomposed_and_detected() {
        let a = FrameAccounting::from_counts(&FrameCounts {
            offered: 100,
            published: 100,
            received: 90,
            consumer_detected_holes: 8,
            ..Default::default()
        });
        assert_eq!(a.unaccounted, 10);
        assert_eq!(a.explained.lost_after_publish, 10);
        assert_eq!(a.explained.lost_undetected, 2);
        let sum = a.explained.pending_at_end as i64
            + a.explained.lost_after_publish
            + a.explained.ingress_discrepancy;
        assert_eq!(sum, a.unaccounted, "the decomposition is exact");
        assert!(!a.notes().is_empty());
    }

    #[test]
    fn broken_ingress_counters_show_as_discrepancy() {
        let a = FrameAccounting::from_counts(&FrameCounts {
            offered: 100,
            published: 90,
            received: 90,
            pending_at_end: 4,
            ..Default::default()
        });
        assert_eq!(a.unaccounted, 10);
        assert_eq!(a.explained.ingress_discrepancy, 6);
        assert_eq!(
            a.explained.pending_at_end as i64
                + a.explained.lost_after_publish
                + a.explained.ingress_discrepancy,
            a.unaccounted
        );
    }
}
