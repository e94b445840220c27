//! The demultiplexer of one subscription: decodes each message, finds (or starts) its
//! stream, checks the sequence, queues the event for the stream's handler task, and
//! reaps streams that went silent.
//!
//! Invariants a reader must not break:
//! - One `Demux` owns the streams of its subscription: no other task touches its map,
//!   so per-stream order is the subscription's order.
//! - Tasks: exactly one handler task per live stream instance, spawned when the
//!   stream's first packet arrives; nothing is spawned per packet.
//! - At most `max_streams` live instances over the whole consumer: an instance holds a
//!   [`StreamSlot`] (shared by its entry and its handler task, released by `Drop` when
//!   both are gone). A new stream without a free slot is *refused*: no handler, no
//!   entry, counted by reason, a [`ConsumerEvent::StreamRefused`]. Its id is remembered
//!   (in a set bounded by `max_streams` too) so that its later packets are refused as
//!   well — counted as `frames_refused`, never half-delivered to a handler that starts
//!   mid-stream — until its `end` or the idle timeout. While they keep arriving, its
//!   refusal notice (`max_streams`) is handed to the announcer again at most once per
//!   announcement interval ([`refused`]): one clock comparison per packet, nothing more.
//! - Every packet ends up counted: accepted (frame / gap / end), refused, stale,
//!   undecodable or unroutable; every accepted frame is queued or dropped with a reason
//!   (see [`super::stats`]).
//! - A stream instance's handler gets exactly one `End`, always as its last event.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use tokio::task::JoinSet;
use tokio::time::Instant;
use weir_protocol::WireName;
use weir_protocol::audio::extension::Extensions;
use weir_protocol::audio::{Packet, PacketBody};
use weir_protocol::fnv1a_32;

use super::Shared;
use super::event::{
    ConsumerEvent, End, EndCause, Frame, GapCause, GapNotice, LocalOverload, LossDeclaration,
    RefuseReason, StreamEvent, StreamInfo,
};
use super::fence::Fence;
use super::handler::{HandlerFactory, StreamHandler};
use super::loss::{self, HoleClass, Segment};
use super::queue::{Push, ReceiverGuard, StreamQueue};
use super::slots::StreamSlot;
use super::stats::{StreamState, count_by};
use super::tracker::{Observation, SeqTracker, Seqs};
use crate::metrics as m;

mod accepted;
mod refused;
mod task;

use accepted::Accepted;
use refused::Refused;
use task::run_stream;

/// One live stream instance, as the demultiplexer sees it.
struct Entry {
    instance: u64,
    tracker: SeqTracker,
    queue: Arc<StreamQueue>,
    last_packet: Instant,
    /// Ended for the handler (overload under `close`); packets are still tracked and
    /// counted as dropped until the producer's end or the idle timeout.
    closed: bool,
    /// This instance's `max_streams` slot, shared with its handler task.
    _slot: Arc<StreamSlot>,
    /// Recent holes and declared possible-loss ranges (bounded).
    loss: loss::Memory,
    /// Consecutive stale frames not yet reported to the handler.
    stale_run: Option<StaleRun>,
}

/// A run of consecutive stale frames, reported as one [`GapCause::Stale`] notice.
#[derive(Debug, Clone, Copy)]
struct StaleRun {
    first_seq: u64,
    last_seq: u64,
    samples: u64,
    max_age_ms: u64,
}

/// Routes one subscription's messages to per-stream handler tasks.
pub(crate) struct Demux<F: HandlerFactory> {
    shared: Arc<Shared>,
    factory: Arc<F>,
    streams: HashMap<String, Entry>,
    refused: HashMap<String, Refused>,
    tasks: JoinSet<()>,
    /// Lease ownership: the partition's fence, checked by every handler task.
    fence: Option<Arc<Fence>>,
    /// Lease ownership: the partition was taken over from another worker, so a
    /// stream's seqs before its first packet here are declared as a handover gap.
    handover: bool,
}

impl<F: HandlerFactory> Demux<F> {
    /// A demultiplexer with no streams.
    pub(crate) fn new(shared: Arc<Shared>, factory: Arc<F>) -> Self {
        Self {
            shared,
            factory,
            streams: HashMap::new(),
            refused: HashMap::new(),
            tasks: JoinSet::new(),
            fence: None,
            handover: false,
        }
    }

    /// A demultiplexer for a leased partition: handlers stop at `fence`; `handover`
    /// when the partition had another owner before.
    pub(crate) fn leased(
        shared: Arc<Shared>,
        factory: Arc<F>,
        fence: Arc<Fence>,
        handover: bool,
    ) -> Self {
        Self {
            fence: Some(fence),
            handover,
            ..Self::new(shared, factory)
        }
    }

    /// Number of live stream instances.
    pub(crate) fn active(&self) -> usize {
        self.streams.len()
    }

    /// Handles one message. `lookup` reads a header by name.
    pub(crate) fn on_message<'h>(
        &mut self,
        subject: &str,
        payload: &Bytes,
        lookup: impl Fn(&str) -> Option<&'h str>,
        now: Instant,
    ) {
        self.shared.messages.fetch_add(1, Ordering::Relaxed);
        self.shared.instruments.messages.increment(1);
        let settings = &self.shared.settings;
        let Some((token, subject_partition)) = settings.subject.parse_subject(subject) else {
            self.shared.registry().base.unroutable_subjects += 1;
            metrics::counter!(m::CONSUMER_UNROUTABLE_TOTAL).increment(1);
            tracing::debug!(subject, "subject does not fit the template; dropped");
            return;
        };
        let hashed = fnv1a_32(token.as_bytes()) % settings.partitions.get();
        let partition = match subject_partition {
            Some(p) if p != hashed => {
                self.shared.registry().base.misrouted += 1;
                metrics::counter!(m::CONSUMER_MISROUTED_TOTAL).increment(1);
                // Per message of such a stream: once per 10 s.
                static MISROUTED: weir_service::ratelimit::LogLimit =
                    weir_service::ratelimit::LogLimit::new(std::time::Duration::from_secs(10));
                if let Some(suppressed) = MISROUTED.allow() {
                    tracing::warn!(
                        subject,
                        expected = hashed,
                        suppressed,
                        "stream arrived on another partition than its hash: partition count differs between producers/server mapping and consumer"
                    );
                }
                p
            }
            Some(p) => p,
            None => hashed,
        };
        let packet = match weir_protocol::audio::decode(payload, &self.shared.decode) {
            Ok(p) => p,
            Err(e) => {
                let kind = e.kind().as_str();
                let mut reg = self.shared.registry();
                count_by(&mut reg.base.decode_errors_by_kind, kind);
                if let Some(entry) = self.streams.get(token) {
                    reg.update(entry.instance, |s| s.counters.decode_errors += 1);
                }
                drop(reg);
                metrics::counter!(m::CONSUMER_DECODE_ERRORS_TOTAL, "kind" => kind).increment(1);
                tracing::debug!(subject, error = %e, "undecodable packet");
                return;
            }
        };
        let ext = Extensions::read(lookup);
        self.on_packet(token, partition, subject, packet, ext, now);
    }

    /// One decoded packet of stream `token`: finds (or starts) its instance, checks its
    /// seq, counts it, and queues what it carries for the handler.
    fn on_packet(
        &mut self,
        token: &str,
        partition: u32,
        subject: &str,
        packet: Packet,
        ext: Extensions,
        now: Instant,
    ) {
        let seqs = match &packet.body {
            PacketBody::Gap(g) => Seqs::Range {
                first: g.first_seq,
                last: g.last_seq,
            },
            _ => Seqs::Single(packet.seq),
        };
        if !self.streams.contains_key(token)
            && !self.start_instance(token, partition, subject, &packet, now)
        {
            return;
        }
        let Some(entry) = self.streams.get_mut(token) else {
            return;
        };
        let instance = entry.instance;
        let observation = entry.tracker.observe(seqs);
        entry.last_packet = now;
        let (lost, leading) = match observation {
            Observation::Stale => {
                self.shared
                    .registry()
                    .update(instance, |s| s.counters.stale_packets += 1);
                metrics::counter!(m::CONSUMER_STALE_PACKETS_TOTAL).increment(1);
                return;
            }
            Observation::Restart => {
                self.end_stream(token, EndCause::Restarted, now);
                let _ = self.shared.events.send(ConsumerEvent::StreamRestarted {
                    stream: token.to_owned(),
                });
                tracing::info!(stream = token, "stream restarted at seq 1 without end");
                // The packet starts the new instance.
                return self.on_packet(token, partition, subject, packet, ext, now);
            }
            Observation::Accept { lost, leading } => (lost, leading),
        };
        let accepted = Accepted::new(
            entry,
            &self.shared,
            &packet,
            &ext,
            lost,
            leading,
            self.handover,
        );
        self.count_accepted(&accepted, seqs, &packet, &ext);
        self.deliver(token, packet, ext, accepted, seqs, now);
    }

    /// The first packet of a stream this demux does not follow: refused (at its start,
    /// or for want of a slot), an orphan `end`, or a new instance. Returns whether the
    /// packet goes on to the new instance.
    fn start_instance(
        &mut self,
        token: &str,
        partition: u32,
        subject: &str,
        packet: &Packet,
        now: Instant,
    ) -> bool {
        if self.refused_again(token, packet, now) {
            return false;
        }
        if matches!(packet.body, PacketBody::End) {
            // An end for a stream this consumer is not following (joined after it,
            // or reaped it already): nothing to end. Counted, not an instance.
            self.shared.registry().base.orphan_ends += 1;
            metrics::counter!(m::CONSUMER_ORPHAN_ENDS_TOTAL).increment(1);
            return false;
        }
        let Some(slot) = self.shared.stream_slots.try_acquire() else {
            self.refuse(token, partition, packet, RefuseReason::MaxStreams, now);
            return false;
        };
        self.open(token, partition, subject, packet, slot, now);
        true
    }

    /// All of an accepted packet's stats, in one registry lock (the hot path takes no
    /// more).
    fn count_accepted(&self, a: &Accepted, seqs: Seqs, packet: &Packet, ext: &Extensions) {
        let mut reg = self.shared.registry();
        reg.update(a.instance, |s| {
            s.first_seq.get_or_insert(seqs.first());
            s.last_seq = a.last_seq;
            let c = &mut s.counters;
            // Seqs and declared samples come from the network: saturate, never panic.
            c.leading_missing = c.leading_missing.saturating_add(a.leading);
            if a.handover_gap {
                c.handover_frames = c.handover_frames.saturating_add(a.leading);
            }
            if a.lost {
                c.loss_events += 1;
            }
            for seg in &a.segments {
                match seg.class {
                    HoleClass::Lost => c.lost_frames = c.lost_frames.saturating_add(seg.frames()),
                    HoleClass::PossiblyLost => {
                        c.possibly_lost_frames = c.possibly_lost_frames.saturating_add(seg.frames())
                    }
                }
            }
            c.possible_loss_declarations += u64::from(a.declaration.is_some());
            c.holes_forgotten += a.forgotten.0;
            c.declarations_forgotten += a.forgotten.1;
            match &packet.body {
                PacketBody::Frame { .. } if a.stale_age_ms.is_some() => {
                    c.stale_frames += 1;
                    c.stale_samples += a.samples;
                }
                PacketBody::Frame { .. } => {
                    c.frames += 1;
                    c.samples += a.samples;
                }
                PacketBody::Gap(g) => {
                    c.declared_gaps += 1;
                    c.declared_gap_frames = c.declared_gap_frames.saturating_add(g.frames());
                    c.declared_gap_samples = c.declared_gap_samples.saturating_add(g.samples);
                }
                PacketBody::End => {
                    s.end_seen = true;
                    s.end_seq = Some(packet.seq);
                    s.end_reason = ext.end_reason.map(|r| r.as_str().to_owned());
                    s.producer_overload = ext.overload.clone();
                }
            }
        });
        if let Some(d) = &a.declaration
            && d.reclassified_frames > 0
        {
            reg.reclassify_lost(a.instance, d.reclassified_frames);
        }
        if a.overload_moved > 0 {
            reg.reclassify_lost(a.instance, a.overload_moved);
        }
    }

    /// Queues what an accepted (and counted) packet carries for the handler, in seq
    /// order: the handover gap, the declaration, the holes, then the packet itself.
    fn deliver(
        &mut self,
        token: &str,
        packet: Packet,
        ext: Extensions,
        a: Accepted,
        seqs: Seqs,
        now: Instant,
    ) {
        if a.handover_gap {
            let first = seqs.first();
            metrics::counter!(m::CONSUMER_HANDOVER_FRAMES_TOTAL).increment(a.leading);
            let notice = StreamEvent::Gap(GapNotice {
                first_seq: first.saturating_sub(a.leading),
                last_seq: first.saturating_sub(1),
                samples: None,
                cause: GapCause::Handover,
            });
            self.queue_event(token, notice, now);
        }
        if let Some(d) = a.declaration {
            self.on_declaration(token, d, now);
        }
        for seg in a.segments {
            self.on_hole(token, seg, now);
        }
        match packet.body {
            PacketBody::Frame { pcm } => {
                if let Some(age_ms) = a.stale_age_ms {
                    self.shared.instruments.stale.increment(1);
                    self.on_stale(token, packet.seq, a.samples, age_ms);
                    return;
                }
                self.shared.instruments.frames.increment(1);
                let frame = StreamEvent::Frame(Frame {
                    seq: packet.seq,
                    pcm,
                    samples: a.samples,
                    format: packet.format,
                    captured_at_ms: a.captured_at_ms,
                    received_at: now,
                });
                self.queue_event(token, frame, now);
            }
            PacketBody::Gap(g) => {
                metrics::counter!(m::CONSUMER_DECLARED_GAP_FRAMES_TOTAL).increment(g.frames());
                let notice = StreamEvent::Gap(GapNotice {
                    first_seq: g.first_seq,
                    last_seq: g.last_seq,
                    samples: Some(g.samples),
                    cause: GapCause::Declared(g.reason),
                });
                self.queue_event(token, notice, now);
            }
            PacketBody::End => {
                let cause = EndCause::Producer {
                    reason: ext.end_reason,
                    overload: ext.overload,
                };
                self.end_stream(token, cause, now);
            }
        }
    }

    /// Reports a producer's possible-loss declaration: metrics, a consumer event, and a
    /// [`StreamEvent::LossDeclared`] for the handler.
    fn on_declaration(&mut self, token: &str, d: LossDeclaration, now: Instant) {
        metrics::counter!(m::CONSUMER_POSSIBLE_LOSS_DECLARATIONS_TOTAL).increment(1);
        if d.reclassified_frames > 0 {
            metrics::counter!(m::CONSUMER_FRAMES_POSSIBLY_LOST_TOTAL)
                .increment(d.reclassified_frames);
        }
        tracing::info!(
            stream = token,
            first_seq = d.first_seq,
            last_seq = d.last_seq,
            frames = d.frames,
            reclassified = d.reclassified_frames,
            reason = d.reason.as_str(),
            "producer declared frames possibly lost"
        );
        let _ = self
            .shared
            .events
            .send(ConsumerEvent::PossibleLossDeclared {
                stream: token.to_owned(),
                declaration: d.clone(),
            });
        self.queue_event(token, StreamEvent::LossDeclared(d), now);
    }

    /// Reports one classified part of a hole: metrics, a consumer event, and a gap
    /// notice for the handler.
    fn on_hole(&mut self, token: &str, seg: Segment, now: Instant) {
        let (first_seq, last_seq) = (seg.first, seg.last);
        metrics::counter!(m::CONSUMER_FRAMES_LOST_TOTAL).increment(seg.frames());
        let cause = match seg.class {
            HoleClass::Lost => {
                let _ = self.shared.events.send(ConsumerEvent::FramesLost {
                    stream: token.to_owned(),
                    first_seq,
                    last_seq,
                });
                GapCause::Lost
            }
            HoleClass::PossiblyLost => {
                metrics::counter!(m::CONSUMER_FRAMES_POSSIBLY_LOST_TOTAL).increment(seg.frames());
                let _ = self.shared.events.send(ConsumerEvent::FramesPossiblyLost {
                    stream: token.to_owned(),
                    first_seq,
                    last_seq,
                });
                GapCause::PossiblyLost
            }
        };
        // Counted, metered and broadcast; a debug line only, so that heavy loss
        // (a slow consumer) does not also flood the logs.
        tracing::debug!(
            stream = token,
            first_seq,
            last_seq,
            ?cause,
            "sequence gap: frames missing"
        );
        let notice = StreamEvent::Gap(GapNotice {
            first_seq,
            last_seq,
            samples: None,
            cause,
        });
        self.queue_event(token, notice, now);
    }

    /// A stale frame: extends the stream's open stale run (consecutive by
    /// construction: any other event of the stream flushes the run first), or opens one.
    fn on_stale(&mut self, token: &str, seq: u64, samples: u64, age_ms: u64) {
        let Some(entry) = self.streams.get_mut(token) else {
            return;
        };
        let run = entry.stale_run.get_or_insert(StaleRun {
            first_seq: seq,
            last_seq: seq,
            samples: 0,
            max_age_ms: 0,
        });
        run.last_seq = seq;
        run.samples = run.samples.saturating_add(samples);
        run.max_age_ms = run.max_age_ms.max(age_ms);
    }

    /// Queues the open stale run of `token` (if any) as one [`GapCause::Stale`] notice.
    fn flush_stale(&mut self, token: &str, now: Instant) {
        let Some(run) = self.streams.get_mut(token).and_then(|e| e.stale_run.take()) else {
            return;
        };
        tracing::debug!(
            stream = token,
            first_seq = run.first_seq,
            last_seq = run.last_seq,
            max_age_ms = run.max_age_ms,
            "stale frames dropped before the handler"
        );
        let _ = self.shared.events.send(ConsumerEvent::FramesStale {
            stream: token.to_owned(),
            first_seq: run.first_seq,
            last_seq: run.last_seq,
            samples: run.samples,
            max_age_ms: run.max_age_ms,
        });
        let notice = StreamEvent::Gap(GapNotice {
            first_seq: run.first_seq,
            last_seq: run.last_seq,
            samples: Some(run.samples),
            cause: GapCause::Stale,
        });
        self.push_event(token, notice, now);
    }

    /// Starts a new instance for `token` and its handler task; `slot` is its
    /// `max_streams` slot.
    fn open(
        &mut self,
        token: &str,
        partition: u32,
        subject: &str,
        packet: &Packet,
        slot: StreamSlot,
        now: Instant,
    ) {
        let slot = Arc::new(slot);
        let queue = Arc::new(StreamQueue::new(self.shared.settings.limits));
        let instance =
            self.shared
                .registry()
                .open(token, partition, packet.session_id.clone(), queue.clone());
        let info = StreamInfo {
            stream: token.to_owned(),
            partition,
            instance,
            subject: subject.to_owned(),
            session_id: packet.session_id.clone(),
        };
        let handler = self
            .factory
            .open_with(&info, super::handler::StreamEnded(queue.clone()));
        // One span per stream instance: the handler's own log lines carry the ids.
        let span = tracing::info_span!("stream", stream = token, partition, instance);
        self.tasks.spawn(tracing::Instrument::instrument(
            run_stream(
                queue.clone(),
                handler,
                self.shared.clone(),
                instance,
                slot.clone(),
                self.fence.clone(),
            ),
            span,
        ));
        metrics::counter!(m::CONSUMER_STREAMS_STARTED_TOTAL).increment(1);
        self.shared.instruments.streams_active.increment(1.0);
        tracing::debug!(stream = token, partition, instance, "stream started");
        self.streams.insert(
            token.to_owned(),
            Entry {
                instance,
                tracker: SeqTracker::new(),
                queue,
                last_packet: now,
                closed: false,
                _slot: slot,
                loss: loss::Memory::default(),
                stale_run: None,
            },
        );
    }

    /// Queues a frame, gap notice or loss declaration for `token`'s handler, after the
    /// stream's open stale run (so the timeline stays in seq order).
    fn queue_event(&mut self, token: &str, event: StreamEvent, now: Instant) {
        self.flush_stale(token, now);
        self.push_event(token, event, now);
    }

    /// Queues one event for `token`'s handler and counts what the bound did.
    fn push_event(&mut self, token: &str, event: StreamEvent, now: Instant) {
        let Some(entry) = self.streams.get_mut(token) else {
            return;
        };
        let instance = entry.instance;
        let is_frame = matches!(event, StreamEvent::Frame(_));
        if entry.closed {
            if is_frame {
                self.count_dropped_closed(instance);
            }
            return;
        }
        match entry.queue.push(event, now) {
            Push::Queued {
                dropped_frames,
                overload,
            } => {
                if let Some(overload) = overload {
                    self.shared.registry().update(instance, |s| {
                        s.counters.frames_dropped_overload += dropped_frames;
                        s.counters.overloads += 1;
                    });
                    metrics::counter!(m::CONSUMER_FRAMES_DROPPED_TOTAL, "reason" => "overload")
                        .increment(dropped_frames);
                    metrics::counter!(m::CONSUMER_OVERLOADS_TOTAL).increment(1);
                    self.report_overload(token, overload, false);
                }
            }
            Push::Overloaded(overload) => {
                entry.closed = true;
                let last_seq = entry.tracker.last_seq();
                let closed = entry.queue.close(
                    End {
                        seq: None,
                        last_seq,
                        cause: EndCause::Overload(overload),
                    },
                    now,
                );
                self.shared.registry().update(instance, |s| {
                    s.counters.overloads += 1;
                    if closed {
                        s.state = StreamState::Closed;
                        s.ended_by = Some("overload".into());
                    }
                });
                metrics::counter!(m::CONSUMER_OVERLOADS_TOTAL).increment(1);
                self.report_overload(token, overload, true);
                if is_frame {
                    self.count_dropped_closed(instance);
                }
            }
            Push::Closed => {
                if is_frame {
                    self.count_dropped_closed(instance);
                }
            }
            Push::ReceiverGone => {
                if is_frame {
                    self.shared
                        .registry()
                        .update(instance, |s| s.counters.frames_dropped_handler_gone += 1);
                    metrics::counter!(m::CONSUMER_FRAMES_DROPPED_TOTAL, "reason" => "handler_gone")
                        .increment(1);
                }
            }
        }
    }

    fn count_dropped_closed(&self, instance: u64) {
        self.shared
            .registry()
            .update(instance, |s| s.counters.frames_dropped_closed += 1);
        metrics::counter!(m::CONSUMER_FRAMES_DROPPED_TOTAL, "reason" => "closed").increment(1);
    }

    fn report_overload(&self, token: &str, overload: LocalOverload, closed: bool) {
        // Per packet under the `gap` policy (every push over the bound drops and reports):
        // one line per interval for the whole consumer; the event below and the drop
        // counters carry every occurrence.
        static BEHIND: weir_service::ratelimit::LogLimit =
            weir_service::ratelimit::LogLimit::new(std::time::Duration::from_secs(5));
        if let Some(suppressed) = BEHIND.allow() {
            tracing::warn!(
                stream = token,
                bound = ?overload.bound,
                pending_bytes = overload.pending_bytes,
                oldest_age_ms = overload.oldest_age.as_millis() as u64,
                closed,
                suppressed,
                "stream handler behind its bound"
            );
        }
        let _ = self.shared.events.send(ConsumerEvent::StreamOverloaded {
            stream: token.to_owned(),
            overload,
            closed,
        });
    }

    /// Removes `token` and gives its handler the final `End` (unless the stream was
    /// already closed for it).
    fn end_stream(&mut self, token: &str, cause: EndCause, now: Instant) {
        // A stale run still open is the last thing before the end.
        self.flush_stale(token, now);
        let Some(entry) = self.streams.remove(token) else {
            return;
        };
        self.shared.instruments.streams_active.decrement(1.0);
        let name = cause.as_str();
        metrics::counter!(m::CONSUMER_STREAMS_ENDED_TOTAL, "cause" => name).increment(1);
        if entry.closed {
            return;
        }
        let producer = matches!(cause, EndCause::Producer { .. });
        let queued = entry.queue.close(
            End {
                seq: producer.then(|| entry.tracker.last_seq()).flatten(),
                last_seq: entry.tracker.last_seq(),
                cause,
            },
            now,
        );
        if queued {
            self.shared.registry().update(entry.instance, |s| {
                s.ended_by = Some(name.to_owned());
            });
        }
    }

    /// Reaps streams silent for at least the idle timeout, forgets refused streams as
    /// silent, and collects finished handler tasks. Returns how many streams were
    /// reaped.
    pub(crate) fn reap(&mut self, now: Instant) -> usize {
        while self.tasks.try_join_next().is_some() {}
        let idle = self.shared.settings.idle_timeout;
        self.refused.retain(|token, r| {
            let keep = now.saturating_duration_since(r.last_packet) < idle;
            if !keep {
                tracing::debug!(stream = token.as_str(), "refused stream silent: forgotten");
            }
            keep
        });
        let silent: Vec<(String, std::time::Duration)> = self
            .streams
            .iter()
            .filter_map(|(k, e)| {
                let quiet = now.saturating_duration_since(e.last_packet);
                (quiet >= idle).then(|| (k.clone(), quiet))
            })
            .collect();
        for (token, silent_for) in &silent {
            let Some(entry) = self.streams.get(token) else {
                continue;
            };
            let (instance, last_seq) = (entry.instance, entry.tracker.last_seq());
            let mut partition = 0;
            self.shared.registry().update(instance, |s| {
                s.reaped = true;
                partition = s.partition;
            });
            metrics::counter!(m::CONSUMER_STREAMS_REAPED_TOTAL).increment(1);
            let silent_ms = weir_service::config::whole_ms(*silent_for);
            tracing::warn!(
                stream = token.as_str(),
                last_seq,
                silent_ms,
                "stream reaped: no packet and no end for the idle timeout"
            );
            let _ = self.shared.events.send(ConsumerEvent::StreamReaped {
                stream: token.clone(),
                partition,
                last_seq,
                silent_ms,
            });
            self.end_stream(
                token,
                EndCause::Idle {
                    silent_for: *silent_for,
                },
                now,
            );
        }
        silent.len()
    }

    /// Ends every live stream with [`EndCause::Shutdown`] (or [`EndCause::Handover`]
    /// when the partition's fence is closed) and waits for their handler tasks until
    /// `deadline`; tasks still running then are aborted.
    pub(crate) async fn shutdown(mut self, deadline: Instant) {
        let now = Instant::now();
        let fenced = self.fence.as_ref().is_some_and(|f| !f.is_open(now));
        let tokens: Vec<String> = self.streams.keys().cloned().collect();
        for token in tokens {
            let cause = if fenced {
                EndCause::Handover
            } else {
                EndCause::Shutdown
            };
            self.end_stream(&token, cause, now);
        }
        let drained = tokio::time::timeout_at(deadline, async {
            while self.tasks.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                tasks = self.tasks.len(),
                "stream handlers did not finish within the grace period; aborting them"
            );
            self.tasks.shutdown().await;
        }
    }
}

#[cfg(test)]
mod tests;
