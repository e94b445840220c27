//! One accepted packet's facts: its samples, capture time and staleness, the
//! producer's declarations on it, and its hole classified against the remembered
//! declarations.
//!
//! Invariant: working an [`Accepted`] out changes only the entry's loss memory (the
//! declarations and holes it remembers); it counts and queues nothing — the caller
//! counts it in one registry lock, then queues what it carries.

use weir_protocol::audio::extension::Extensions;
use weir_protocol::audio::{Packet, PacketBody};

use super::Entry;
use crate::Shared;
use crate::event::LossDeclaration;
use crate::loss::Segment;

/// What one accepted packet brings, worked out (and its holes classified) before
/// anything is counted or queued.
pub(super) struct Accepted {
    pub(super) instance: u64,
    pub(super) last_seq: Option<u64>,
    /// Seqs `1..first` never seen (first packet only).
    pub(super) leading: u64,
    /// The leading seqs are a handover gap (this demux took the partition over).
    pub(super) handover_gap: bool,
    /// Whether the packet revealed an undeclared hole.
    pub(super) lost: bool,
    /// That hole, classified against the declarations remembered.
    pub(super) segments: Vec<Segment>,
    /// Holes and declarations the bounded memory forgot meanwhile.
    pub(super) forgotten: (u64, u64),
    /// The producer's possible-loss declaration on this packet.
    pub(super) declaration: Option<LossDeclaration>,
    /// Frames the `end`'s overload report moved from lost to declared.
    pub(super) overload_moved: u64,
    pub(super) samples: u64,
    pub(super) captured_at_ms: Option<u64>,
    /// Age of a frame over the staleness guard (`None`: not stale, or not judged).
    pub(super) stale_age_ms: Option<u64>,
}

impl Accepted {
    pub(super) fn new(
        entry: &mut Entry,
        shared: &Shared,
        packet: &Packet,
        ext: &Extensions,
        lost: Option<std::ops::RangeInclusive<u64>>,
        leading: u64,
        handover: bool,
    ) -> Self {
        let samples = match &packet.body {
            PacketBody::Frame { pcm } => {
                (pcm.len() / packet.format.bytes_per_sample().max(1)) as u64
            }
            _ => 0,
        };
        // The capture time: the meta key first, the older header as fallback.
        let captured_at_ms = packet.captured_at_ms.or(ext.captured_at_ms);
        // Staleness guard: only frames with a capture time are judged (the wall clock
        // is read only then). A capture time in the future (clock skew) is age 0.
        let stale_age_ms = match (&packet.body, shared.settings.max_frame_age, captured_at_ms) {
            (PacketBody::Frame { .. }, Some(max), Some(at)) => {
                let age = (shared.wall_clock)().saturating_sub(at);
                (u128::from(age) > max.as_millis()).then_some(age)
            }
            _ => None,
        };
        // Declared possible loss: re-label remembered holes, then classify this
        // packet's own hole (a declaration on the packet that reveals its hole covers it).
        let declaration = ext.possibly_lost.as_ref().map(|p| {
            let reclassified = entry.loss.declare(p.first_seq, p.last_seq);
            LossDeclaration {
                first_seq: p.first_seq,
                last_seq: p.last_seq,
                frames: p.frames,
                total_frames: p.total_frames,
                reason: p.reason,
                reclassified_frames: reclassified,
            }
        });
        // A `close` overload's report (on the `end`) names the seqs of the admitted
        // frames it dropped: their hole is declared, like a possible loss, not undetected.
        let overload_moved = match (&packet.body, ext.overload.as_ref()) {
            (PacketBody::End, Some(o)) => match (o.dropped_first_seq, o.dropped_last_seq) {
                (Some(a), Some(b)) if a >= 1 && a <= b => entry.loss.declare(a, b),
                _ => 0,
            },
            _ => 0,
        };
        let segments = lost
            .as_ref()
            .map(|l| entry.loss.hole(*l.start(), *l.end()))
            .unwrap_or_default();
        let forgotten = (
            std::mem::take(&mut entry.loss.holes_forgotten),
            std::mem::take(&mut entry.loss.declarations_forgotten),
        );
        Self {
            instance: entry.instance,
            last_seq: entry.tracker.last_seq(),
            leading,
            handover_gap: handover && leading > 0,
            lost: lost.is_some(),
            segments,
            forgotten,
            declaration,
            overload_moved,
            samples,
            captured_at_ms,
            stale_age_ms,
        }
    }
}
