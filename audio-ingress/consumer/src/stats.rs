//! Per-stream and aggregate counters, readable as a snapshot while the consumer runs.
//!
//! Accounting identities (per stream, and so in the totals), which the tests check:
//! - timeline: for a stream whose producer `end` arrived with seq `E`,
//!   `E - 1 = leading_missing + frames + stale_frames + lost_frames +
//!   possibly_lost_frames + declared_gap_frames`
//!   (every seq before the end was received fresh, received too old for the
//!   staleness guard, lost in transit undeclared, lost and declared possibly lost by
//!   the producer, declared dropped by the producer in a gap packet, or sent before
//!   this consumer joined — exactly one of these);
//! - local fate: `frames = frames_delivered + frames_dropped_overload +
//!   frames_dropped_closed + frames_dropped_handler_gone + frames_dropped_fenced +
//!   pending_frames`
//!   (every frame received was handed to the handler, dropped here with a reason, or is
//!   still queued);
//! - refused streams (over `max_streams`) have no record: their frames are counted in
//!   [`Totals::frames_refused`], so over all streams the frames producers sent =
//!   `frames + stale_frames + lost_frames + possibly_lost_frames + declared_gap_frames
//!   + leading_missing + frames_refused`.
//!
//! `frames` counts only fresh frames (queued for the handler); a stale frame is
//! counted in `stale_frames` instead and is not part of the local-fate identity.
//! `lost_frames` and `possibly_lost_frames` partition the holes: a declaration that
//! arrives after a hole moves it from the first to the second, so `lost_frames` can
//! go *down* (the Prometheus counters cannot: there `frames_lost_total` counts every
//! hole at detection and `frames_possibly_lost_total` the declared part of them).
//!
//! Finished streams keep their own record until `retain_finished_streams` newer ones
//! finished; their counts stay in the totals after that.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;
use weir_protocol::audio::extension::Overload;

use super::queue::StreamQueue;

/// Additive counters of one stream (and, summed, of the consumer).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counters {
    /// Fresh frames received in order (accepted by the sequence check and not stale):
    /// the frames queued for the handler.
    pub frames: u64,
    /// Samples in those frames.
    pub samples: u64,
    /// Frames accepted by the sequence check but older than `max_frame_age_ms`:
    /// dropped before the handler, declared as [`GapCause::Stale`](super::GapCause::Stale).
    /// Not in `frames`.
    pub stale_frames: u64,
    /// Samples in those frames.
    pub stale_samples: u64,
    /// Frames whose handler call completed.
    pub frames_delivered: u64,
    /// Frames dropped here by the `gap` policy (covered by an overload notice).
    pub frames_dropped_overload: u64,
    /// Frames dropped here after the stream was closed (overload under `close`).
    pub frames_dropped_closed: u64,
    /// Frames dropped because the stream's handler task had ended (panicked).
    pub frames_dropped_handler_gone: u64,
    /// Frames dropped because the partition's lease was lost or released (the fence):
    /// never handed to the handler here.
    pub frames_dropped_fenced: u64,
    /// Seqs before the first packet this consumer saw (joined late).
    pub leading_missing: u64,
    /// The part of `leading_missing` declared to the handler as a
    /// [`GapCause::Handover`](super::GapCause::Handover) gap (the partition was taken
    /// over from another worker).
    pub handover_frames: u64,
    /// Seqs that never arrived and that no declaration covers: undetected loss in
    /// transit.
    pub lost_frames: u64,
    /// Seqs that never arrived, inside a range the producer declared possibly lost
    /// (`Weir-Possibly-Lost`): declared possible loss. Disjoint from `lost_frames`.
    pub possibly_lost_frames: u64,
    /// Sequence jumps (holes) detected, whether declared or not.
    pub loss_events: u64,
    /// Packets that carried a valid `Weir-Possibly-Lost` header.
    pub possible_loss_declarations: u64,
    /// Hole ranges that fell out of the per-stream memory (the last 16) before a
    /// declaration could cover them; they stay in `lost_frames`.
    pub holes_forgotten: u64,
    /// Declared ranges that fell out of the per-stream memory (the last 16); a hole
    /// found later inside one of them counts as `lost_frames`.
    pub declarations_forgotten: u64,
    /// Declared gap packets received.
    pub declared_gaps: u64,
    /// Frames those gap packets declared missing.
    pub declared_gap_frames: u64,
    /// Samples those gap packets declared missing.
    pub declared_gap_samples: u64,
    /// Packets refused as duplicate or out of order.
    pub stale_packets: u64,
    /// Packets for this stream that could not be decoded.
    pub decode_errors: u64,
    /// Times this stream's queue went over its bound.
    pub overloads: u64,
}

impl Counters {
    /// Adds `o` field by field. Saturating: some counts derive from sequence numbers
    /// and declared samples sent over the network (near `u64::MAX` from a hostile
    /// producer), and a sum must never panic. The list is exhaustive (a destructuring):
    /// a new counter that is not summed does not compile.
    fn add(&mut self, o: &Self) {
        macro_rules! add {
            ($($field:ident),* $(,)?) => {
                let Self { $($field),* } = *o;
                $(self.$field = self.$field.saturating_add($field);)*
            };
        }
        add! {
            frames, samples, stale_frames, stale_samples, frames_delivered,
            frames_dropped_overload, frames_dropped_closed, frames_dropped_handler_gone,
            frames_dropped_fenced, leading_missing, handover_frames, lost_frames,
            possibly_lost_frames, loss_events, possible_loss_declarations, holes_forgotten,
            declarations_forgotten, declared_gaps, declared_gap_frames, declared_gap_samples,
            stale_packets, decode_errors, overloads,
        }
    }
}

/// Where a stream instance is in its life.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StreamState {
    /// Receiving.
    #[default]
    Active,
    /// Ended for the handler (overload under `close`) but packets still arrive; they
    /// are counted as `frames_dropped_closed` until the producer's end or the idle
    /// timeout.
    Closed,
    /// The handler has seen its `End` (or its task ended).
    Finished,
}

/// Stats of one stream instance.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct StreamStats {
    /// Stream id.
    pub stream: String,
    /// Partition.
    pub partition: u32,
    /// Instance number (unique within the consumer).
    pub instance: u64,
    /// `session_id` of the first packet.
    pub session_id: Option<String>,
    /// Life-cycle state.
    pub state: StreamState,
    /// First seq seen.
    pub first_seq: Option<u64>,
    /// Last seq accepted (frame, gap or end).
    pub last_seq: Option<u64>,
    /// The counters.
    #[serde(flatten)]
    pub counters: Counters,
    /// Whether the producer's `end` arrived.
    pub end_seen: bool,
    /// Seq of the producer's `end`.
    pub end_seq: Option<u64>,
    /// `Weir-End-Reason` of the end, if any (`producer`, `overload`, ...).
    pub end_reason: Option<String>,
    /// `Weir-Overload` report on the end, if any.
    pub producer_overload: Option<Overload>,
    /// Why the handler's stream ended: `producer`, `idle`, `overload`, `restarted`,
    /// `shutdown` (`None` while active).
    pub ended_by: Option<String>,
    /// Whether the stream was reaped after the idle timeout (no `end`).
    pub reaped: bool,
    /// Bytes queued for the handler now.
    pub pending_bytes: usize,
    /// Frames queued for the handler now.
    pub pending_frames: usize,
    /// Age of the oldest queued event now, in ms.
    pub oldest_pending_ms: f64,
}

/// Aggregate stats of the consumer.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Totals {
    /// Sum of every stream's counters (finished ones included).
    #[serde(flatten)]
    pub counters: Counters,
    /// Stream instances started.
    pub streams_started: u64,
    /// Stream instances active (not finished).
    pub streams_active: u64,
    /// Streams whose producer `end` arrived.
    pub streams_end_seen: u64,
    /// Streams reaped after the idle timeout.
    pub streams_reaped: u64,
    /// Streams ended here because their handler fell behind (`close`).
    pub streams_overloaded: u64,
    /// Messages received from NATS.
    pub messages: u64,
    /// Undecodable packets, by [`DecodeErrorKind`](weir_protocol::audio::DecodeErrorKind) name.
    pub decode_errors_by_kind: BTreeMap<String, u64>,
    /// Messages whose subject does not fit the subject template (dropped).
    pub unroutable_subjects: u64,
    /// Messages whose stream hashes to another partition than the subject says (a
    /// partition count differing between producer/server mapping and consumer);
    /// still delivered.
    pub misrouted: u64,
    /// Slow-consumer events from the NATS client (messages dropped in the client).
    pub slow_consumer_events: u64,
    /// `end` packets for streams this consumer was not following (it joined after
    /// their last frame, or reaped them already).
    pub orphan_ends: u64,
    /// Streams refused (no handler created), by reason (`max_streams`).
    pub streams_refused: BTreeMap<String, u64>,
    /// Frames of refused streams: each refused frame packet, plus the frames a refused
    /// gap packet declares missing (so that the "sent" identity holds).
    pub frames_refused: u64,
    /// Bytes queued for handlers now.
    pub pending_bytes: usize,
    /// Frames queued for handlers now.
    pub pending_frames: usize,
}

impl Totals {
    /// Adds one stream's record (its counters and how it ended).
    fn add_stream(&mut self, s: &StreamStats) {
        self.counters.add(&s.counters);
        self.streams_end_seen += u64::from(s.end_seen);
        self.streams_reaped += u64::from(s.reaped);
        self.streams_overloaded += u64::from(s.ended_by.as_deref() == Some("overload"));
    }
}

/// A snapshot of the consumer's stats.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ConsumerStats {
    /// Aggregates.
    pub totals: Totals,
    /// Active streams and the most recently finished ones, sorted by stream id then
    /// instance.
    pub streams: Vec<StreamStats>,
}

impl ConsumerStats {
    /// The records of stream id `stream` (several if it restarted).
    pub fn stream(&self, stream: &str) -> impl Iterator<Item = &StreamStats> {
        self.streams.iter().filter(move |s| s.stream == stream)
    }
}

/// Counts one more under `key` in a by-reason map of [`Totals`].
pub(crate) fn count_by(map: &mut BTreeMap<String, u64>, key: &str) {
    *map.entry(key.to_owned()).or_default() += 1;
}

/// The live streams' load ([`Registry::loads`]).
#[derive(Debug, Default)]
pub(crate) struct Loads {
    /// Live stream instances.
    pub(crate) live: u64,
    /// The largest lag.
    pub(crate) max_lag: Duration,
    /// `(stream id, lag)`, the most lagging first, at most the limit asked for.
    pub(crate) listed: Vec<(String, Duration)>,
}

struct Record {
    stats: StreamStats,
    queue: Option<Arc<StreamQueue>>,
}

/// The shared, lock-protected state behind [`ConsumerStats`].
pub(crate) struct Registry {
    records: HashMap<u64, Record>,
    finished: VecDeque<u64>,
    retain: usize,
    next_instance: u64,
    /// Counted by the demux without taking this registry's lock ([`Self::message_counter`]).
    messages: Arc<AtomicU64>,
    /// The totals that no live record holds: the consumer-wide counts, and the
    /// counters of evicted records (and of updates that came after eviction). A
    /// snapshot adds the live records to it.
    pub(crate) base: Totals,
}

impl Registry {
    /// An empty registry that keeps `retain` finished records.
    pub(crate) fn new(retain: usize) -> Self {
        Self {
            records: HashMap::new(),
            finished: VecDeque::new(),
            retain,
            next_instance: 1,
            messages: Arc::new(AtomicU64::new(0)),
            base: Totals::default(),
        }
    }

    /// Registers a new stream instance and returns its number.
    pub(crate) fn open(
        &mut self,
        stream: &str,
        partition: u32,
        session_id: Option<String>,
        queue: Arc<StreamQueue>,
    ) -> u64 {
        let instance = self.next_instance;
        self.next_instance += 1;
        self.base.streams_started += 1;
        self.records.insert(
            instance,
            Record {
                stats: StreamStats {
                    stream: stream.to_owned(),
                    partition,
                    instance,
                    session_id,
                    ..StreamStats::default()
                },
                queue: Some(queue),
            },
        );
        instance
    }

    /// Updates one stream's stats. Updates to an evicted record go to the totals only.
    pub(crate) fn update(&mut self, instance: u64, f: impl FnOnce(&mut StreamStats)) {
        match self.records.get_mut(&instance) {
            Some(r) => f(&mut r.stats),
            None => {
                let mut scratch = StreamStats::default();
                f(&mut scratch);
                self.base.counters.add(&scratch.counters);
            }
        }
    }

    /// Moves `frames` of one stream's holes from `lost_frames` to
    /// `possibly_lost_frames` (a declaration arrived after them). Works on an evicted
    /// record too (the move is applied to the retired totals), so the identity holds.
    pub(crate) fn reclassify_lost(&mut self, instance: u64, frames: u64) {
        let c = match self.records.get_mut(&instance) {
            Some(r) => &mut r.stats.counters,
            None => &mut self.base.counters,
        };
        let frames = frames.min(c.lost_frames);
        c.lost_frames -= frames;
        c.possibly_lost_frames = c.possibly_lost_frames.saturating_add(frames);
    }

    /// Marks a stream finished (its handler saw `End` or its task ended).
    pub(crate) fn finish(&mut self, instance: u64) {
        let Some(r) = self.records.get_mut(&instance) else {
            return;
        };
        if r.stats.state == StreamState::Finished {
            return;
        }
        r.stats.state = StreamState::Finished;
        if let Some(q) = r.queue.take() {
            let c = &mut r.stats.counters;
            c.frames_delivered = c.frames_delivered.saturating_add(q.delivered());
        }
        self.finished.push_back(instance);
        while self.finished.len() > self.retain {
            let Some(old) = self.finished.pop_front() else {
                break;
            };
            if let Some(r) = self.records.remove(&old) {
                self.base.add_stream(&r.stats);
            }
        }
    }

    /// The NATS message counter: the demux counts every message on it, lock-free.
    pub(crate) fn message_counter(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.messages)
    }

    /// The live streams (whose handler task runs) and their lag: the count, the
    /// largest lag, and up to `max_listed` of them, the most lagging first.
    pub(crate) fn loads(&self, now: Instant, max_listed: usize) -> Loads {
        let mut all: Vec<(Duration, &str)> = self
            .records
            .values()
            .filter_map(|r| {
                Some((
                    r.queue.as_ref()?.fill(now).oldest_age,
                    r.stats.stream.as_str(),
                ))
            })
            .collect();
        let live = all.len() as u64;
        let max_lag = all.iter().map(|(lag, _)| *lag).max().unwrap_or_default();
        if all.len() > max_listed {
            all.select_nth_unstable_by(max_listed, |a, b| b.0.cmp(&a.0));
            all.truncate(max_listed);
        }
        all.sort_unstable_by_key(|(lag, _)| std::cmp::Reverse(*lag));
        Loads {
            live,
            max_lag,
            listed: all
                .into_iter()
                .map(|(lag, s)| (s.to_owned(), lag))
                .collect(),
        }
    }

    /// The snapshot.
    pub(crate) fn snapshot(&self, now: Instant) -> ConsumerStats {
        self.collect(now, true)
    }

    /// The totals only (no per-stream records copied or sorted).
    pub(crate) fn totals(&self, now: Instant) -> Totals {
        self.collect(now, false).totals
    }

    fn collect(&self, now: Instant, with_streams: bool) -> ConsumerStats {
        let mut totals = Totals {
            messages: self.messages.load(Ordering::Relaxed),
            ..self.base.clone()
        };
        let mut streams = Vec::with_capacity(if with_streams { self.records.len() } else { 0 });
        for r in self.records.values() {
            let fill = r.queue.as_ref().map(|q| q.fill(now)).unwrap_or_default();
            // An active stream's deliveries are still on its queue's counter.
            let mut s = std::borrow::Cow::Borrowed(&r.stats);
            if let Some(q) = &r.queue {
                let c = &mut s.to_mut().counters;
                c.frames_delivered = c.frames_delivered.saturating_add(q.delivered());
            }
            totals.add_stream(&s);
            totals.streams_active += u64::from(s.state != StreamState::Finished);
            totals.pending_bytes += fill.bytes;
            totals.pending_frames += fill.frames;
            if with_streams {
                let mut s = s.into_owned();
                s.pending_bytes = fill.bytes;
                s.pending_frames = fill.frames;
                s.oldest_pending_ms = fill.oldest_age.as_secs_f64() * 1000.0;
                streams.push(s);
            }
        }
        streams.sort_by(|a, b| (&a.stream, a.instance).cmp(&(&b.stream, b.instance)));
        ConsumerStats { totals, streams }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_protocol::WireName;

    use weir_testkit::names::assert_serde_names;

    #[test]
    fn wire_names_are_the_serde_names_or_unchanged() {
        assert_serde_names::<crate::RefuseReason>();
        let ops: Vec<_> = crate::ownership::OpKind::ALL
            .iter()
            .map(|k| k.to_string())
            .collect();
        assert_eq!(ops, ["claim", "takeover", "renew", "release", "confirm"]);
    }
    use crate::config::{ConsumerPolicy, QueueLimits};
    use std::time::Duration;

    fn queue() -> Arc<StreamQueue> {
        Arc::new(StreamQueue::new(QueueLimits {
            max_bytes: 16_000,
            max_age: Duration::from_millis(500),
            policy: ConsumerPolicy::Close,
        }))
    }

    #[tokio::test(start_paused = true)]
    async fn eviction_keeps_totals() {
        let mut reg = Registry::new(2);
        for i in 0..5 {
            let id = reg.open(&format!("s{i}"), 0, None, queue());
            reg.update(id, |s| {
                s.counters.frames += 10;
                s.end_seen = true;
            });
            reg.finish(id);
        }
        let snap = reg.snapshot(Instant::now());
        assert_eq!(snap.streams.len(), 2);
        assert_eq!(snap.totals.counters.frames, 50);
        assert_eq!(snap.totals.streams_end_seen, 5);
        assert_eq!(snap.totals.streams_started, 5);
        assert_eq!(snap.totals.streams_active, 0);
        // An update after eviction still reaches the totals.
        reg.update(1, |s| s.counters.frames_dropped_closed += 3);
        let snap = reg.snapshot(Instant::now());
        assert_eq!(snap.totals.counters.frames_dropped_closed, 3);
    }
}
