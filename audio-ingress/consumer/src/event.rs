//! What a stream handler receives, and what the consumer reports about itself.
//!
//! A handler sees one stream's timeline strictly in order: frames, gap notices that
//! stand for frames it will never get (with the cause), and exactly one [`End`] as the
//! last event. Every seq from the first packet seen to the end is either delivered as a
//! [`Frame`] or covered by a [`GapNotice`]; seqs before the first packet seen (a
//! consumer that joined late) are reported in the stats as `leading_missing`.
//! [`StreamEvent::LossDeclared`] is the one event outside the timeline: it covers no
//! seq, it re-labels seqs an earlier [`GapCause::Lost`] notice already covered.

use std::time::Duration;

use bytes::Bytes;
use serde::Serialize;
use tokio::time::Instant;
use weir_protocol::audio::extension::{EndReason, Overload, PossibleLossReason};
use weir_protocol::audio::{AudioFormat, GapReason};

/// Identity of one stream instance, given to the handler factory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StreamInfo {
    /// The stream id: the `{stream}` token of the subject.
    pub stream: String,
    /// Its partition (`FNV-1a-32(stream) mod N`, or the subject's partition token).
    pub partition: u32,
    /// Unique per stream instance within this consumer (a stream id that ends and
    /// starts again gets a new instance).
    pub instance: u64,
    /// The subject of the first packet.
    pub subject: String,
    /// `session_id` of the first packet, if it had one.
    pub session_id: Option<String>,
}

/// One event of a stream, delivered in order to its handler.
#[derive(Debug, Clone, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum StreamEvent {
    /// Audio.
    Frame(Frame),
    /// Frames that will not be delivered, and why.
    Gap(GapNotice),
    /// The last event of the stream instance.
    End(End),
    /// The producer declared seqs possibly lost (header `Weir-Possibly-Lost`). Not part
    /// of the timeline: the seqs it names were already covered by frames or gap
    /// notices; it says that `reclassified_frames` of them, announced earlier as
    /// [`GapCause::Lost`], are a *declared* possible loss. Holes found after it inside
    /// its range arrive directly as [`GapCause::PossiblyLost`].
    LossDeclared(LossDeclaration),
}

impl StreamEvent {
    /// Short name: `frame`, `gap`, `end` or `loss_declared`.
    pub fn kind(&self) -> &'static str {
        self.into()
    }
}

/// A producer's declaration of possibly lost frames, as the handler receives it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LossDeclaration {
    /// First seq of the declared range.
    pub first_seq: u64,
    /// Last seq of the declared range.
    pub last_seq: u64,
    /// Frames the producer says were unconfirmed in that range.
    pub frames: u64,
    /// The producer's cumulative count for the stream.
    pub total_frames: u64,
    /// Why.
    pub reason: PossibleLossReason,
    /// Frames of holes this consumer had already reported as [`GapCause::Lost`] that
    /// fall in the range and are now counted as `possibly_lost_frames`.
    pub reclassified_frames: u64,
}

/// One frame of audio.
#[derive(Debug, Clone)]
pub struct Frame {
    /// Sequence number.
    pub seq: u64,
    /// s16le PCM (zero-copy slice of the NATS message).
    pub pcm: Bytes,
    /// Samples per channel in `pcm`.
    pub samples: u64,
    /// Sample format (validated by the decoder: the deployed 16 kHz s16le mono).
    pub format: AudioFormat,
    /// Unix ms at which the ingress accepted the frame: the meta key `captured_at_ms`,
    /// else the older `Weir-Captured-At-Ms` header. `None` for packets from producers
    /// that send neither (the deployed Python ones).
    pub captured_at_ms: Option<u64>,
    /// When this consumer received the packet.
    pub received_at: Instant,
}

/// Frames `first_seq..=last_seq` will not be delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GapNotice {
    /// First missing seq.
    pub first_seq: u64,
    /// Last missing seq.
    pub last_seq: u64,
    /// Samples missing, when known (declared gaps, stale frames and local drops; not
    /// for NATS loss).
    pub samples: Option<u64>,
    /// Why.
    pub cause: GapCause,
}

impl GapNotice {
    /// Number of seqs covered.
    pub fn frames(&self) -> u64 {
        crate::loss::frames(self.first_seq, self.last_seq)
    }
}

/// Why frames are missing; its `&'static str` is the stable snake_case name (`lost`,
/// `declared`, `possibly_lost`, `stale`, `overload`, `handover`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, strum::IntoStaticStr)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum GapCause {
    /// Never arrived: a sequence jump not covered by a gap packet (core NATS loss, or a
    /// packet that could not be decoded).
    Lost,
    /// The producer declared them dropped with a `gap` packet.
    Declared(GapReason),
    /// Never arrived, and the producer declared them possibly lost (header
    /// `Weir-Possibly-Lost`: unconfirmed by the server when its connection dropped).
    /// A hole reported [`Self::Lost`] before the declaration arrived is re-labelled by
    /// a [`StreamEvent::LossDeclared`].
    PossiblyLost,
    /// They arrived, but older than `max_frame_age_ms` (capture time against this
    /// consumer's wall clock): dropped before the handler. Consecutive stale frames
    /// are one notice, delivered before the stream's next event (at the latest just
    /// before its `End`).
    Stale,
    /// This consumer dropped them because the handler was behind its bound (`gap`
    /// policy). May swallow lost or declared gaps that were queued among them; the
    /// stats still count those by their own cause.
    Overload,
    /// Lease ownership: this worker took the stream's partition over from another
    /// worker (failover or rebalancing) and the stream's first packet here is not
    /// seq 1: the seqs before it were handled by the previous owner or lost in the
    /// handover; this worker never saw them. Counted in `handover_frames` (a part of
    /// `leading_missing`).
    Handover,
}

/// The end of a stream instance: always the handler's last event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct End {
    /// The seq of the producer's `end` packet, if one arrived.
    pub seq: Option<u64>,
    /// The last seq of the timeline that was accepted (frame, gap or end).
    pub last_seq: Option<u64>,
    /// Why the stream ended.
    pub cause: EndCause,
}

/// Why a stream instance ended.
#[derive(Debug, Clone, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum EndCause {
    /// The producer sent `end`. `reason` and `overload` come from the
    /// `Weir-End-Reason` / `Weir-Overload` headers (absent from deployed producers).
    Producer {
        /// `Weir-End-Reason`, if present and known.
        reason: Option<EndReason>,
        /// `Weir-Overload`, if present and valid.
        overload: Option<Overload>,
    },
    /// Reaped: no packet for at least the idle timeout and no `end`.
    Idle {
        /// How long the stream had been silent when it was reaped.
        silent_for: Duration,
    },
    /// This consumer ended the stream because its handler stayed over the bound
    /// (`close` policy).
    Overload(LocalOverload),
    /// The producer started the stream over (seq 1 again) without an `end`; a new
    /// instance follows.
    Restarted,
    /// The consumer is shutting down.
    Shutdown,
    /// Lease ownership: this worker lost (or released) the stream's partition; the
    /// stream continues on the partition's new owner. Frames still queued here were
    /// dropped at the fence (`frames_dropped_fenced`).
    Handover,
}

impl EndCause {
    /// Stable snake_case name: `producer`, `idle`, `overload`, `restarted`, `shutdown`,
    /// `handover`.
    pub fn as_str(&self) -> &'static str {
        self.into()
    }
}

/// Which bound a stream's queue exceeded; its `&'static str` is `bytes` or `age`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, strum::IntoStaticStr)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum OverloadBound {
    /// `max_pending_bytes`.
    Bytes,
    /// `max_pending_age_ms`.
    Age,
}

/// A stream's handler fell behind its bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LocalOverload {
    /// The bound that tripped.
    pub bound: OverloadBound,
    /// Bytes pending when it tripped.
    pub pending_bytes: usize,
    /// Age of the oldest pending event when it tripped (milliseconds in JSON).
    #[serde(serialize_with = "duration_ms")]
    pub oldest_age: Duration,
}

fn duration_ms<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1000.0)
}

/// Why a new stream was refused (no handler was created for it).
#[derive(strum::IntoStaticStr, strum::Display, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RefuseReason {
    /// `max_streams` live stream instances already.
    MaxStreams,
}

/// Something the consumer reports about itself (see [`super::Consumer::events`]).
///
/// Delivered through a bounded broadcast channel: a receiver that lags loses events
/// (the stats snapshot stays authoritative).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum ConsumerEvent {
    /// A stream that never sent `end` was silent for the idle timeout and was reaped.
    StreamReaped {
        /// Stream id.
        stream: String,
        /// Its partition.
        partition: u32,
        /// Last seq accepted.
        last_seq: Option<u64>,
        /// Silence when reaped, in milliseconds.
        silent_ms: u64,
    },
    /// A stream's handler fell behind its bound.
    StreamOverloaded {
        /// Stream id.
        stream: String,
        /// The overload.
        overload: LocalOverload,
        /// Whether the stream was ended (`close`) or frames dropped (`gap`).
        closed: bool,
    },
    /// A sequence jump: frames that never arrived and that the producer had not
    /// declared possibly lost (so far).
    FramesLost {
        /// Stream id.
        stream: String,
        /// First missing seq.
        first_seq: u64,
        /// Last missing seq.
        last_seq: u64,
    },
    /// A sequence jump inside a range the producer had already declared possibly lost.
    FramesPossiblyLost {
        /// Stream id.
        stream: String,
        /// First missing seq.
        first_seq: u64,
        /// Last missing seq.
        last_seq: u64,
    },
    /// A packet carried `Weir-Possibly-Lost`.
    PossibleLossDeclared {
        /// Stream id.
        stream: String,
        /// The declaration, with what it re-labelled here.
        declaration: LossDeclaration,
    },
    /// A run of consecutive frames older than `max_frame_age_ms` was dropped before
    /// the handler.
    FramesStale {
        /// Stream id.
        stream: String,
        /// First stale seq.
        first_seq: u64,
        /// Last stale seq.
        last_seq: u64,
        /// Samples dropped.
        samples: u64,
        /// The largest age seen in the run, ms.
        max_age_ms: u64,
    },
    /// The producer started a stream over without `end`.
    StreamRestarted {
        /// Stream id.
        stream: String,
    },
    /// A new stream was refused: no handler was created, and its packets are refused
    /// (counted in `frames_refused`) until its `end` or the idle timeout, even if room
    /// appears meanwhile — a handler never starts in the middle of a refused stream.
    StreamRefused {
        /// Stream id.
        stream: String,
        /// Its partition.
        partition: u32,
        /// Why.
        reason: RefuseReason,
        /// Seq of the refused packet that first showed the stream.
        seq: u64,
    },
    /// The NATS client dropped messages of a subscription (its buffer of
    /// `subscription_capacity` messages was full).
    SlowConsumer {
        /// The subscription id reported by async-nats.
        sid: u64,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn end_cause_names_are_unchanged() {
        let overload = LocalOverload {
            bound: OverloadBound::Age,
            pending_bytes: 0,
            oldest_age: Duration::ZERO,
        };
        let causes = [
            EndCause::Producer {
                reason: None,
                overload: None,
            },
            EndCause::Idle {
                silent_for: Duration::ZERO,
            },
            EndCause::Overload(overload),
            EndCause::Restarted,
            EndCause::Shutdown,
            EndCause::Handover,
        ];
        let names: Vec<_> = causes.iter().map(EndCause::as_str).collect();
        let want = [
            "producer",
            "idle",
            "overload",
            "restarted",
            "shutdown",
            "handover",
        ];
        assert_eq!(names, want);
    }

    #[test]
    fn event_kinds_are_unchanged() {
        let frame = Frame {
            seq: 1,
            pcm: Bytes::new(),
            samples: 0,
            format: AudioFormat::DEPLOYED,
            captured_at_ms: None,
            received_at: Instant::now(),
        };
        let gap = GapNotice {
            first_seq: 2,
            last_seq: 2,
            samples: None,
            cause: GapCause::Lost,
        };
        let loss = LossDeclaration {
            first_seq: 2,
            last_seq: 2,
            frames: 1,
            total_frames: 1,
            reason: PossibleLossReason::Other,
            reclassified_frames: 0,
        };
        let end = End {
            seq: None,
            last_seq: Some(2),
            cause: EndCause::Shutdown,
        };
        let events = [
            StreamEvent::Frame(frame),
            StreamEvent::Gap(gap),
            StreamEvent::End(end),
            StreamEvent::LossDeclared(loss),
        ];
        let kinds: Vec<_> = events.iter().map(StreamEvent::kind).collect();
        assert_eq!(kinds, ["frame", "gap", "end", "loss_declared"]);
    }
}
