//! Frame accounting: where every frame went, and what explains any difference.
//!
//! "Offered" is what the ingress read from the producers; "received" is every distinct
//! frame the fleet's consumers accepted in sequence order, *including* the ones their
//! staleness guard then dropped (counted, never hidden). Then, exactly:
//!
//! ```text
//! unaccounted = offered − received − dropped          (dropped: with a reason, by the ingress)
//!             = pending_at_end + lost_declared + lost_undetected + ingress_discrepancy
//! ```
//!
//! with `lost_declared + lost_undetected = lost_after_publish = published + possibly_lost
//! − received` and `ingress_discrepancy = offered − published − possibly_lost − dropped −
//! pending_at_end` (must be 0). `lost_declared` is the consumers' own count of holes
//! inside a declared range (the ingress's view when they do not report it), capped by
//! what the ingress's counters allow. Every term is defined on the fields below and in
//! docs/loadtest.md ("What every number means").

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::timeliness::TimelinessSummary;

/// Drop reasons under which an ingress may list frames that were unconfirmed when its
/// connection dropped. They are possibly lost, not surely dropped: the accounting moves
/// them out of `dropped` into `possibly_lost`.
pub const POSSIBLY_LOST_DROP_REASONS: &[&str] = &["unconfirmed_at_disconnect", "possibly_lost"];

/// The raw counts at the end of a run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FrameCounts {
    /// Frames the WebSocket producers wrote.
    pub sent_by_producers: u64,
    /// Frames the ingress read (its `frames.offered`).
    pub offered: u64,
    /// Frames the ingress handed to the NATS client (`None`: not reported, i.e. an
    /// ingress without the server-confirmed window).
    pub handed_over: Option<u64>,
    /// Frames the ingress reports published (confirmed by the server with the window;
    /// handed to NATS without it).
    pub published: u64,
    /// Frames unconfirmed when the connection dropped (the ingress's `possibly_lost`).
    pub possibly_lost: u64,
    /// Frames the ingress dropped, by reason.
    pub dropped: BTreeMap<String, u64>,
    /// Frames still held by the ingress at the end (queued or unconfirmed).
    pub pending_at_end: u64,
    /// Of those, handed over and not yet confirmed.
    pub unconfirmed_at_end: u64,
    /// Distinct frames the fleet received in order, stale ones included.
    pub received: u64,
    /// Of those, frames the consumers' staleness guard dropped before the recogniser.
    pub stale_at_consumer: u64,
    /// Frames handed to (and handled by) the recognisers.
    pub handed_to_handler: u64,
    /// Holes the fleet detected by sequence number that no declaration covers.
    pub consumer_detected_holes: u64,
    /// Packets the fleet refused because they arrived after a later seq.
    pub refused_out_of_order: u64,
    /// Frames declared missing by gap packets.
    pub declared_in_gaps: u64,
    /// Holes the consumers found inside a declared possibly-lost range (`None`: the
    /// consumer does not report it).
    pub consumer_possibly_lost: Option<u64>,
}

/// The `frames` object of the report.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct FrameAccounting {
    /// Frames the WebSocket producers wrote.
    pub sent_by_producers: u64,
    /// Frames the ingress read from the producers.
    pub offered: u64,
    /// Frames handed to the NATS client (`null` when the ingress does not report it).
    pub handed_over: Option<u64>,
    /// Frames published: confirmed by the server (handed to NATS on an ingress without
    /// the server-confirmed window).
    pub published: u64,
    /// Frames the ingress declared possibly lost (unconfirmed at a disconnect).
    pub possibly_lost: u64,
    /// Distinct frames the recognition fleet received in order, stale ones included.
    pub received: u64,
    /// Of those, frames the consumers' staleness guard (`max_frame_age_ms`) dropped
    /// before the recogniser: delivered too old, declared to the recogniser as `stale`
    /// gaps. Never timed in `delivered_late` / `e2e_latency_ms`.
    pub stale_dropped_by_consumer: u64,
    /// Frames handed to the recognisers (the population of `delivered_late` and
    /// `e2e_latency_ms`); `received − stale − dropped by the consumers' own bound`.
    pub handed_to_handler: u64,
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
    /// Timeliness of what the fleet got: `late_after_ms`, `delivered_late`,
    /// `delivered_untimed`, `e2e_latency_ms` (see [`crate::timeliness`]).
    #[serde(flatten)]
    pub timeliness: TimelinessSummary,
}

/// The terms that add up to `unaccounted`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Explanation {
    /// Still held by the ingress when measured (queued or unconfirmed).
    pub pending_at_end: u64,
    /// Of those, handed to the NATS client and not yet confirmed by the server.
    pub unconfirmed_at_end: u64,
    /// Left the ingress (published or possibly lost) but never received:
    /// `lost_declared + lost_undetected`.
    pub lost_after_publish: i64,
    /// Not received, and declared possibly lost to the consumers: the holes they found
    /// inside a `Weir-Possibly-Lost` range, at most `possibly_lost_not_received`.
    pub lost_declared: i64,
    /// Not received, and the consumers were told by nobody: silent loss (core NATS is
    /// at-most-once), or a declaration that never reached them.
    pub lost_undetected: i64,
    /// The ingress's side: of the frames it declared possibly lost, at most this many
    /// did not arrive (`clamp(lost_after_publish, 0, possibly_lost)`).
    pub possibly_lost_not_received: i64,
    /// Of `lost_undetected`, the consumers detected this many as sequence holes.
    pub consumer_detected_holes: u64,
    /// Of the holes, frames that did arrive but after a later frame of their stream
    /// and were refused (the stream's order was broken upstream).
    pub refused_out_of_order: u64,
    /// At least this many were not even detectable by sequence numbers (lost at a
    /// stream's tail): `max(0, lost_undetected − consumer_detected_holes)`. Holes can
    /// exceed the loss because they also cover frames the ingress dropped *with a
    /// reason* just before an overload `end` (accounted in `dropped`).
    pub lost_at_tail: i64,
    /// The consumers' raw count of holes inside declared ranges (`null` when the
    /// consumer does not report it); `lost_declared` is this, capped by
    /// `possibly_lost_not_received`.
    pub consumer_possibly_lost_frames: Option<u64>,
    /// `handed_over − published − possibly_lost − unconfirmed_at_end`, when the ingress
    /// reports `handed_over`; must be 0.
    pub window_discrepancy: Option<i64>,
    /// `offered − published − possibly_lost − dropped − pending_at_end`; must be 0.
    pub ingress_discrepancy: i64,
}

fn signed(a: u64, b: u64) -> i64 {
    (i128::from(a) - i128::from(b)).clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
}

fn as_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Splits the possibly-lost frames out of the ingress's drop reasons: (drops that are
/// surely drops, possibly lost). The two sources count the same frames, so the larger
/// one wins rather than their sum.
pub fn split_possibly_lost(
    dropped: &BTreeMap<String, u64>,
    possibly_lost: u64,
) -> (BTreeMap<String, u64>, u64) {
    let mut sure = BTreeMap::new();
    let mut listed = 0u64;
    for (reason, n) in dropped {
        if POSSIBLY_LOST_DROP_REASONS.contains(&reason.as_str()) {
            listed = listed.saturating_add(*n);
        } else {
            sure.insert(reason.clone(), *n);
        }
    }
    (sure, possibly_lost.max(listed))
}

impl FrameAccounting {
    /// Computes the accounting from the raw counts (pure).
    pub fn from_counts(c: &FrameCounts) -> Self {
        let (dropped_by_reason, possibly_lost) = split_possibly_lost(&c.dropped, c.possibly_lost);
        let dropped: u64 = dropped_by_reason.values().sum();
        let unaccounted = signed(c.offered, c.received) - as_i64(dropped);
        let lost_after_publish = signed(c.published.saturating_add(possibly_lost), c.received);
        let possibly_lost_not_received = lost_after_publish.clamp(0, as_i64(possibly_lost));
        // Declared = what the consumers were told, when they say; never more than the
        // ingress's counters allow.
        let lost_declared = c
            .consumer_possibly_lost
            .map_or(possibly_lost_not_received, |n| {
                as_i64(n).min(possibly_lost_not_received)
            });
        let lost_undetected = lost_after_publish - lost_declared;
        let ingress_discrepancy = signed(c.offered, c.published)
            - as_i64(possibly_lost)
            - as_i64(dropped)
            - as_i64(c.pending_at_end);
        let window_discrepancy = c
            .handed_over
            .map(|h| signed(h, c.published) - as_i64(possibly_lost) - as_i64(c.unconfirmed_at_end));
        Self {
            sent_by_producers: c.sent_by_producers,
            offered: c.offered,
            handed_over: c.handed_over,
            published: c.published,
            possibly_lost,
            received: c.received,
            stale_dropped_by_consumer: c.stale_at_consumer,
            handed_to_handler: c.handed_to_handler,
            dropped,
            dropped_by_reason,
            declared_in_gaps: c.declared_in_gaps,
            unaccounted,
            explained: Explanation {
                pending_at_end: c.pending_at_end,
                unconfirmed_at_end: c.unconfirmed_at_end,
                lost_after_publish,
                lost_declared,
                lost_undetected,
                possibly_lost_not_received,
                consumer_detected_holes: c.consumer_detected_holes,
                refused_out_of_order: c.refused_out_of_order,
                lost_at_tail: (lost_undetected - as_i64(c.consumer_detected_holes)).max(0),
                consumer_possibly_lost_frames: c.consumer_possibly_lost,
                window_discrepancy,
                ingress_discrepancy,
            },
            not_read_by_ingress: signed(c.sent_by_producers, c.offered),
            timeliness: TimelinessSummary::default(),
        }
    }

    /// The same, with the fleet's timeliness figures attached.
    pub fn with_timeliness(mut self, timeliness: TimelinessSummary) -> Self {
        self.timeliness = timeliness;
        self
    }

    /// Sentences that explain every non-zero term, for the report's notes.
    pub fn notes(&self) -> Vec<String> {
        let mut notes = Vec::new();
        let e = &self.explained;
        if self.unaccounted != 0 {
            notes.push(format!(
                "unaccounted {} = pending at end {} (unconfirmed {}) + lost declared {} + lost \
                 undetected {} + ingress discrepancy {}",
                self.unaccounted,
                e.pending_at_end,
                e.unconfirmed_at_end,
                e.lost_declared,
                e.lost_undetected,
                e.ingress_discrepancy
            ));
        }
        if e.lost_declared > 0 {
            notes.push(format!(
                "{} frames were unconfirmed when the ingress's NATS connection dropped and never \
                 arrived: the consumers were told they were possibly lost ({} declared by the \
                 ingress in all)",
                e.lost_declared, self.possibly_lost
            ));
        }
        if let Some(seen) = e.consumer_possibly_lost_frames
            && i128::from(seen) != i128::from(e.possibly_lost_not_received)
        {
            notes.push(format!(
                "the consumers found {seen} holes inside declared possibly-lost ranges, the \
                 ingress's counters allow {} declared frames not received: lost declared {}, \
                 the rest of the loss counts as undetected",
                e.possibly_lost_not_received, e.lost_declared
            ));
        }
        if self.stale_dropped_by_consumer > 0 {
            notes.push(format!(
                "{} frames reached the consumers older than their staleness guard \
                 (max_frame_age_ms) and were dropped before the recogniser, declared to it as \
                 stale gaps: received, not handed over, not timed",
                self.stale_dropped_by_consumer
            ));
        }
        if e.lost_undetected > 0 {
            let mut n = format!(
                "{} frames left the ingress and were not received, and nobody declared them: \
                 the consumers detected {} sequence holes",
                e.lost_undetected, e.consumer_detected_holes
            );
            if e.refused_out_of_order > 0 {
                let _ = write!(
                    n,
                    " ({} of those frames did arrive, after a later frame of their stream, and \
                     were refused to keep the stream in order)",
                    e.refused_out_of_order
                );
            }
            if e.lost_at_tail > 0 {
                let _ = write!(
                    n,
                    "; {} were not detectable by sequence (lost at a stream's tail)",
                    e.lost_at_tail
                );
            }
            notes.push(n);
        }
        if e.ingress_discrepancy != 0 {
            notes.push(format!(
                "the ingress's counters do not add up: offered − published − possibly lost − \
                 dropped − pending = {}",
                e.ingress_discrepancy
            ));
        }
        if let Some(d) = e.window_discrepancy
            && d != 0
        {
            notes.push(format!(
                "the ingress's window counters do not add up: handed over − published − \
                 possibly lost − unconfirmed = {d}"
            ));
        }
        if self.not_read_by_ingress > 0 {
            notes.push(format!(
                "{} frames written by producers were never read by the ingress (sent after the \
                 server ended the stream, or in flight when the socket closed)",
                self.not_read_by_ingress
            ));
        }
        let t = &self.timeliness;
        if t.delivered_late > 0 {
            notes.push(format!(
                "{} frames reached the fleet more than {:.0} ms (max_age + one confirmation \
                 round) after capture",
                t.delivered_late, t.late_after_ms
            ));
        }
        if t.delivered_untimed > 0 && t.e2e_latency_ms.count == 0 {
            notes.push(format!(
                "none of the {} frames the fleet handled carried a capture time the consumer \
                 core could read: lateness and e2e latency were not measured",
                t.delivered_untimed
            ));
        } else if t.delivered_untimed > 0 {
            notes.push(format!(
                "{} frames the fleet handled carried no capture time and were not timed",
                t.delivered_untimed
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
        assert_eq!(a.explained.lost_declared, 0);
        assert_eq!(a.explained.lost_undetected, 10);
        assert_eq!(a.explained.lost_at_tail, 2);
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

    /// The decomposition the report promises: every term adds up to `unaccounted`.
    fn assert_exact(a: &FrameAccounting) {
        let e = &a.explained;
        assert_eq!(
            e.pending_at_end as i64 + e.lost_declared + e.lost_undetected + e.ingress_discrepancy,
            a.unaccounted,
            "{a:?}"
        );
        assert_eq!(e.lost_declared + e.lost_undetected, e.lost_after_publish);
    }

    #[test]
    fn with_the_window_loss_splits_into_declared_and_undetected() {
        // 1000 offered: 20 dropped with a reason, 30 pending (10 of them unconfirmed),
        // 900 confirmed, 50 unconfirmed at a disconnect (possibly lost). The fleet got
        // 880 of the confirmed ones and 15 of the possibly-lost ones: 895. The
        // consumers found all 35 missing possibly-lost frames inside the declared
        // range; the 20 missing confirmed frames are undeclared holes.
        let c = FrameCounts {
            sent_by_producers: 1000,
            offered: 1000,
            handed_over: Some(960),
            published: 900,
            possibly_lost: 50,
            dropped: BTreeMap::from([("max_age".into(), 20)]),
            pending_at_end: 30,
            unconfirmed_at_end: 10,
            received: 895,
            consumer_detected_holes: 20,
            consumer_possibly_lost: Some(35),
            ..Default::default()
        };
        let a = FrameAccounting::from_counts(&c);
        assert_eq!(a.unaccounted, 1000 - 895 - 20);
        assert_eq!(a.explained.lost_after_publish, 950 - 895);
        assert_eq!(
            a.explained.possibly_lost_not_received, 50,
            "the ingress's counters allow up to 50"
        );
        assert_eq!(
            a.explained.lost_declared, 35,
            "what the consumers were told"
        );
        assert_eq!(a.explained.lost_undetected, 20);
        assert_eq!(a.explained.lost_at_tail, 0, "20 holes cover the 20");
        assert_eq!(a.explained.ingress_discrepancy, 0);
        assert_eq!(a.explained.window_discrepancy, Some(0));
        assert_exact(&a);
        // The consumers' count differs from the ingress's bound: said in a note.
        assert!(
            a.notes().iter().any(|n| n.contains("found 35 holes")),
            "{:?}",
            a.notes()
        );
        // A consumer that does not report the count: the ingress's view.
        let a = FrameAccounting::from_counts(&FrameCounts {
            consumer_possibly_lost: None,
            ..c.clone()
        });
        assert_eq!(a.explained.lost_declared, 50, "at most what was declared");
        assert_eq!(a.explained.lost_undetected, 5);
        assert_exact(&a);
        // The consumers can never count more declared loss than there is.
        let a = FrameAccounting::from_counts(&FrameCounts {
            consumer_possibly_lost: Some(80),
            ..c
        });
        assert_eq!(a.explained.lost_declared, 50);
        assert_eq!(a.explained.lost_undetected, 5);
        assert_exact(&a);
    }

    #[test]
    fn a_declaration_that_never_reached_the_consumers_is_undetected_loss() {
        // The ingress declared 40 frames possibly lost, none arrived, and the
        // declaration was lost too (the consumers counted 0 declared holes): the
        // consumers cannot tell these 40 from silent loss.
        let a = FrameAccounting::from_counts(&FrameCounts {
            offered: 140,
            handed_over: Some(140),
            published: 100,
            possibly_lost: 40,
            received: 100,
            consumer_detected_holes: 40,
            consumer_possibly_lost: Some(0),
            ..Default::default()
        });
        assert_eq!(a.explained.possibly_lost_not_received, 40);
        assert_eq!(a.explained.lost_declared, 0);
        assert_eq!(a.explained.lost_undetected, 40);
        assert_eq!(a.explained.lost_at_tail, 0);
        assert_exact(&a);
    }

    #[test]
    fn stale_frames_are_received_counted_and_never_unaccounted() {
        // 500 offered and confirmed, all received: 30 of them the staleness guard
        // dropped before the recogniser, 5 the consumers' own bound dropped.
        let a = FrameAccounting::from_counts(&FrameCounts {
            sent_by_producers: 500,
            offered: 500,
            handed_over: Some(500),
            published: 500,
            received: 500,
            stale_at_consumer: 30,
            handed_to_handler: 465,
            consumer_possibly_lost: Some(0),
            ..Default::default()
        });
        assert_eq!(
            a.unaccounted, 0,
            "stale frames were delivered: not unaccounted"
        );
        assert_eq!(a.explained.lost_undetected, 0);
        assert_eq!(a.stale_dropped_by_consumer, 30);
        assert_eq!(a.handed_to_handler, 465);
        assert_exact(&a);
        let v = serde_json::to_value(&a).unwrap();
        assert_eq!(v["stale_dropped_by_consumer"], 30);
        assert_eq!(v["handed_to_handler"], 465);
        assert!(
            a.notes()
                .iter()
                .any(|n| n.contains("30 frames reached the consumers older")),
            "{:?}",
            a.notes()
        );
    }

    #[test]
    fn possibly_lost_frames_that_arrived_are_not_loss() {
        // All 50 possibly-lost frames did arrive: nothing is lost.
        let a = FrameAccounting::from_counts(&FrameCounts {
            offered: 100,
            handed_over: Some(100),
            published: 50,
            possibly_lost: 50,
            received: 100,
            ..Default::default()
        });
        assert_eq!(a.unaccounted, 0);
        assert_eq!(a.explained.lost_declared, 0);
        assert_eq!(a.explained.lost_undetected, 0);
        assert_exact(&a);
        // Some arrived, fewer than declared went missing: declared covers them all.
        let a = FrameAccounting::from_counts(&FrameCounts {
            offered: 100,
            published: 50,
            possibly_lost: 50,
            received: 80,
            ..Default::default()
        });
        assert_eq!(a.explained.lost_declared, 20);
        assert_eq!(a.explained.lost_undetected, 0);
        assert_exact(&a);
    }

    #[test]
    fn possibly_lost_listed_as_a_drop_reason_is_counted_once_not_as_dropped() {
        let dropped = BTreeMap::from([
            ("queue_full".to_owned(), 5),
            ("unconfirmed_at_disconnect".to_owned(), 40),
        ]);
        let (sure, possibly) = split_possibly_lost(&dropped, 40);
        assert_eq!(sure, BTreeMap::from([("queue_full".to_owned(), 5)]));
        assert_eq!(possibly, 40, "the same frames, not 80");
        assert_eq!(split_possibly_lost(&dropped, 0).1, 40);
        let a = FrameAccounting::from_counts(&FrameCounts {
            offered: 145,
            published: 100,
            possibly_lost: 40,
            dropped,
            received: 110,
            ..Default::default()
        });
        assert_eq!(a.dropped, 5);
        assert_eq!(a.possibly_lost, 40);
        assert_eq!(a.unaccounted, 30);
        assert_eq!(a.explained.lost_declared, 30);
        assert_eq!(a.explained.ingress_discrepancy, 0);
        assert_exact(&a);
    }

    #[test]
    fn without_the_window_fields_everything_reads_as_before() {
        // Today's ingress: no handed_over, no possibly_lost; published = handed over.
        let a = FrameAccounting::from_counts(&FrameCounts {
            offered: 6000,
            published: 6000,
            received: 4448,
            consumer_detected_holes: 0,
            ..Default::default()
        });
        assert_eq!(a.handed_over, None);
        assert_eq!(a.explained.window_discrepancy, None);
        assert_eq!(a.explained.consumer_possibly_lost_frames, None);
        assert_eq!(a.explained.lost_declared, 0);
        assert_eq!(a.explained.lost_undetected, 1552);
        assert_eq!(a.explained.lost_at_tail, 1552);
        assert_exact(&a);
        let v = serde_json::to_value(&a).unwrap();
        assert!(v["handed_over"].is_null());
        assert!(v["explained"]["window_discrepancy"].is_null());
    }

    #[test]
    fn broken_window_counters_show_as_window_discrepancy() {
        let a = FrameAccounting::from_counts(&FrameCounts {
            offered: 100,
            handed_over: Some(100),
            published: 90,
            pending_at_end: 10,
            unconfirmed_at_end: 7,
            received: 90,
            ..Default::default()
        });
        assert_eq!(a.explained.window_discrepancy, Some(3));
        assert!(a.notes().iter().any(|n| n.contains("window counters")));
        assert_exact(&a);
    }

    #[test]
    fn timeliness_is_flattened_into_frames() {
        let t = TimelinessSummary {
            late_after_ms: 700.0,
            delivered_late: 12,
            delivered_untimed: 0,
            e2e_latency_ms: crate::stats::Percentiles {
                count: 10,
                p50: 20.0,
                p95: 30.0,
                p99: 40.0,
                max: 900.0,
                mean: 100.0,
            },
        };
        let a = FrameAccounting::default().with_timeliness(t);
        let v = serde_json::to_value(&a).unwrap();
        assert_eq!(v["delivered_late"], 12);
        assert_eq!(v["late_after_ms"], 700.0);
        assert_eq!(v["e2e_latency_ms"]["p99"], 40.0);
        assert!(a.notes().iter().any(|n| n.contains("12 frames reached")));
        let untimed = FrameAccounting::default().with_timeliness(TimelinessSummary {
            delivered_untimed: 5,
            ..Default::default()
        });
        assert!(
            untimed
                .notes()
                .iter()
                .any(|n| n.contains("were not measured"))
        );
    }
}
