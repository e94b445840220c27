//! The demultiplexer of one subscription: decodes each message, finds (or starts) its
//! stream, checks the sequence, queues the event for the stream's handler task, and
//! reaps streams that went silent.
//!
//! Invariants a reader must not break:
//! - One `Demux` owns the streams of its subscription: no other task touches its map,
//!   so per-stream order is the subscription's order.
//! - Tasks: exactly one handler task per live stream instance, spawned when the
//!   stream's first packet arrives; nothing is spawned per packet.
//! - Every packet ends up counted: accepted (frame / gap / end), stale, undecodable or
//!   unroutable; every accepted frame is queued or dropped with a reason (see
//!   [`super::stats`]).
//! - A stream instance's handler gets exactly one `End`, always as its last event.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use tokio::task::JoinSet;
use tokio::time::Instant;
use weir_protocol::audio::extension::Extensions;
use weir_protocol::audio::{Packet, PacketBody};
use weir_protocol::fnv1a_32;

use super::Shared;
use super::event::{
    ConsumerEvent, End, EndCause, Frame, GapCause, GapNotice, LocalOverload, StreamEvent,
    StreamInfo,
};
use super::handler::{HandlerFactory, StreamHandler};
use super::queue::{Push, ReceiverGuard, StreamQueue};
use super::stats::{StreamState, StreamStats};
use super::tracker::{Observation, SeqTracker, Seqs};
use crate::metrics as m;

/// One live stream instance, as the demultiplexer sees it.
struct Entry {
    instance: u64,
    tracker: SeqTracker,
    queue: Arc<StreamQueue>,
    last_packet: Instant,
    /// Ended for the handler (overload under `close`); packets are still tracked and
    /// counted as dropped until the producer's end or the idle timeout.
    closed: bool,
}

/// Routes one subscription's messages to per-stream handler tasks.
pub(crate) struct Demux<F: HandlerFactory> {
    shared: Arc<Shared>,
    factory: Arc<F>,
    streams: HashMap<String, Entry>,
    tasks: JoinSet<()>,
}

impl<F: HandlerFactory> Demux<F> {
    /// A demultiplexer with no streams.
    pub(crate) fn new(shared: Arc<Shared>, factory: Arc<F>) -> Self {
        Self {
            shared,
            factory,
            streams: HashMap::new(),
            tasks: JoinSet::new(),
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
        self.shared.registry().message();
        metrics::counter!(m::CONSUMER_MESSAGES_TOTAL).increment(1);
        let settings = &self.shared.settings;
        let Some((token, subject_partition)) = settings.subject.parse_subject(subject) else {
            self.shared.registry().unroutable();
            metrics::counter!(m::CONSUMER_UNROUTABLE_TOTAL).increment(1);
            tracing::debug!(subject, "subject does not fit the template; dropped");
            return;
        };
        let hashed = fnv1a_32(token.as_bytes()) % settings.partitions.get();
        let partition = match subject_partition {
            Some(p) if p != hashed => {
                self.shared.registry().misrouted();
                metrics::counter!(m::CONSUMER_MISROUTED_TOTAL).increment(1);
                tracing::warn!(
                    subject,
                    expected = hashed,
                    "stream arrived on another partition than its hash: partition count differs between producers/server mapping and consumer"
                );
                p
            }
            Some(p) => p,
            None => hashed,
        };
        let packet = match weir_protocol::audio::decode(payload, &self.shared.decode) {
            Ok(p) => p,
            Err(e) => {
                let kind = e.kind().as_str();
                self.shared.registry().decode_error(kind);
                if let Some(entry) = self.streams.get(token) {
                    let instance = entry.instance;
                    self.shared
                        .registry()
                        .update(instance, |s| s.counters.decode_errors += 1);
                }
                metrics::counter!(m::CONSUMER_DECODE_ERRORS_TOTAL, "kind" => kind).increment(1);
                tracing::debug!(subject, error = %e, "undecodable packet");
                return;
            }
        };
        let ext = Extensions::read(lookup);
        self.on_packet(token, partition, subject, packet, ext, now);
    }

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
        if !self.streams.contains_key(token) {
            if matches!(packet.body, PacketBody::End) {
                // An end for a stream this consumer is not following (joined after it,
                // or reaped it already): nothing to end. Counted, not an instance.
                self.shared.registry().orphan_end();
                metrics::counter!(m::CONSUMER_ORPHAN_ENDS_TOTAL).increment(1);
                return;
            }
            self.open(token, partition, subject, &packet, now);
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
        let last_seq = entry.tracker.last_seq();
        self.shared.registry().update(instance, |s| {
            s.first_seq.get_or_insert(seqs_first(seqs));
            s.last_seq = last_seq;
            s.counters.leading_missing += leading;
        });
        if let Some(lost) = lost {
            let (first_seq, last_seq) = (*lost.start(), *lost.end());
            let frames = last_seq - first_seq + 1;
            self.shared.registry().update(instance, |s| {
                s.counters.lost_frames += frames;
                s.counters.loss_events += 1;
            });
            metrics::counter!(m::CONSUMER_FRAMES_LOST_TOTAL).increment(frames);
            let _ = self.shared.events.send(ConsumerEvent::FramesLost {
                stream: token.to_owned(),
                first_seq,
                last_seq,
            });
            tracing::warn!(stream = token, first_seq, last_seq, "sequence gap: frames lost");
            let notice = StreamEvent::Gap(GapNotice {
                first_seq,
                last_seq,
                samples: None,
                cause: GapCause::Lost,
            });
            self.queue_event(token, notice, now);
        }
        match packet.body {
            PacketBody::Frame { pcm } => {
                let samples = (pcm.len() / packet.format.bytes_per_sample().max(1)) as u64;
                self.shared.registry().update(instance, |s| {
                    s.counters.frames += 1;
                    s.counters.samples += samples;
                });
                metrics::counter!(m::CONSUMER_FRAMES_TOTAL).increment(1);
                let frame = StreamEvent::Frame(Frame {
                    seq: packet.seq,
                    pcm,
                    samples,
                    format: packet.format,
                    captured_at_ms: ext.captured_at_ms,
                    received_at: now,
                });
                self.queue_event(token, frame, now);
            }
            PacketBody::Gap(g) => {
                self.shared.registry().update(instance, |s| {
                    s.counters.declared_gaps += 1;
                    s.counters.declared_gap_frames += g.frames();
                    s.counters.declared_gap_samples += g.samples;
                });
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
                let reason = ext.end_reason;
                self.shared.registry().update(instance, |s| {
                    s.end_seen = true;
                    s.end_seq = Some(packet.seq);
                    s.end_reason = reason.map(|r| r.as_str().to_owned());
                    s.producer_overload = ext.overload.clone();
                });
                let cause = EndCause::Producer {
                    reason,
                    overload: ext.overload,
                };
                self.end_stream(token, cause, now);
            }
        }
    }

    /// Starts a new instance for `token` and its handler task.
    fn open(&mut self, token: &str, partition: u32, subject: &str, packet: &Packet, now: Instant) {
        let queue = Arc::new(StreamQueue::new(self.shared.settings.limits));
        let instance = self.shared.registry().open(
            token,
            partition,
            packet.session_id.clone(),
            queue.clone(),
        );
        let info = StreamInfo {
            stream: token.to_owned(),
            partition,
            instance,
            subject: subject.to_owned(),
            session_id: packet.session_id.clone(),
        };
        let handler = self.factory.open(&info);
        self.tasks.spawn(run_stream(
            queue.clone(),
            handler,
            self.shared.clone(),
            instance,
        ));
        metrics::counter!(m::CONSUMER_STREAMS_STARTED_TOTAL).increment(1);
        metrics::gauge!(m::CONSUMER_STREAMS_ACTIVE).increment(1.0);
        tracing::debug!(stream = token, partition, instance, "stream started");
        self.streams.insert(
            token.to_owned(),
            Entry {
                instance,
                tracker: SeqTracker::new(),
                queue,
                last_packet: now,
                closed: false,
            },
        );
    }

    /// Queues a frame or gap notice for `token`'s handler and counts what the bound did.
    fn queue_event(&mut self, token: &str, event: StreamEvent, now: Instant) {
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
        tracing::warn!(
            stream = token,
            bound = ?overload.bound,
            pending_bytes = overload.pending_bytes,
            oldest_age_ms = overload.oldest_age.as_millis() as u64,
            closed,
            "stream handler behind its bound"
        );
        let _ = self.shared.events.send(ConsumerEvent::StreamOverloaded {
            stream: token.to_owned(),
            overload,
            closed,
        });
    }

    /// Removes `token` and gives its handler the final `End` (unless the stream was
    /// already closed for it).
    fn end_stream(&mut self, token: &str, cause: EndCause, now: Instant) {
        let Some(entry) = self.streams.remove(token) else {
            return;
        };
        metrics::gauge!(m::CONSUMER_STREAMS_ACTIVE).decrement(1.0);
        let name = cause.as_str();
        metrics::counter!(m::CONSUMER_STREAMS_ENDED_TOTAL, "cause" => name).increment(1);
        if entry.closed {
            return;
        }
        let seq = match &cause {
            EndCause::Producer { .. } => entry.tracker.last_seq(),
            _ => None,
        };
        let queued = entry.queue.close(
            End {
                seq,
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

    /// Reaps streams silent for at least the idle timeout, and collects finished
    /// handler tasks. Returns how many streams were reaped.
    pub(crate) fn reap(&mut self, now: Instant) -> usize {
        while self.tasks.try_join_next().is_some() {}
        let idle = self.shared.settings.idle_timeout;
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
            let silent_ms = u64::try_from(silent_for.as_millis()).unwrap_or(u64::MAX);
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

    /// Ends every live stream with [`EndCause::Shutdown`] and waits for their handler
    /// tasks until `deadline`; tasks still running then are aborted.
    pub(crate) async fn shutdown(mut self, deadline: Instant) {
        let now = Instant::now();
        let tokens: Vec<String> = self.streams.keys().cloned().collect();
        for token in tokens {
            self.end_stream(&token, EndCause::Shutdown, now);
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

fn seqs_first(seqs: Seqs) -> u64 {
    match seqs {
        Seqs::Single(s) => s,
        Seqs::Range { first, .. } => first,
    }
}

/// One stream's handler task: pops events in order and awaits the handler on each.
async fn run_stream<H: StreamHandler>(
    queue: Arc<StreamQueue>,
    mut handler: H,
    shared: Arc<Shared>,
    instance: u64,
) {
    let on_gone_shared = shared.clone();
    // Runs when this task ends, also by panic or abort: the queue refuses further
    // events and whatever it still held is counted as dropped.
    let _guard = ReceiverGuard::new(&queue, move |discarded| {
        let mut reg = on_gone_shared.registry();
        if discarded > 0 {
            reg.update(instance, |s| {
                s.counters.frames_dropped_handler_gone += discarded as u64;
            });
            metrics::counter!(m::CONSUMER_FRAMES_DROPPED_TOTAL, "reason" => "handler_gone")
                .increment(discarded as u64);
        }
        reg.finish(instance);
    });
    while let Some(event) = queue.pop().await {
        let is_frame = matches!(event, StreamEvent::Frame(_));
        let is_end = matches!(event, StreamEvent::End(_));
        handler.on_event(event).await;
        if is_frame {
            shared
                .registry()
                .update(instance, |s: &mut StreamStats| s.counters.frames_delivered += 1);
            metrics::counter!(m::CONSUMER_FRAMES_DELIVERED_TOTAL).increment(1);
        }
        if is_end {
            break;
        }
    }
}
