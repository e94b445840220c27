//! Refused streams (see the [parent module](super)): refusing a new stream, and the
//! memory of a refused stream id, whose later packets are refused too, until its `end`
//! or the idle timeout. While they keep arriving its refusal is notified again at most
//! once per announcement interval — a notice lost on the way (a door reconnecting, a
//! slow consumer) must not leave its producer streaming into nothing for the rest of
//! the call.

use std::time::Duration;

use tokio::time::Instant;
use weir_protocol::WireName;
use weir_protocol::audio::{Packet, PacketBody};

use super::Demux;
use crate::event::{ConsumerEvent, RefuseReason};
use crate::handler::HandlerFactory;
use crate::metrics as m;
use crate::slots::StreamSlot;
use crate::stats::count_by;

/// A stream refused at its first packet.
pub(super) struct Refused {
    pub(super) reason: RefuseReason,
    pub(super) last_packet: Instant,
    /// When its refusal was last handed to the announcer.
    notified: Instant,
    /// A slot of the bounded set of remembered refused ids.
    _slot: StreamSlot,
}

impl Refused {
    /// Refused (and notified) at `now`.
    pub(super) fn new(reason: RefuseReason, now: Instant, slot: StreamSlot) -> Self {
        Self {
            reason,
            last_packet: now,
            notified: now,
            _slot: slot,
        }
    }

    /// A later packet arrived at `now`: whether its refusal is notified again (the
    /// last notice is at least `every` old). One clock comparison, no allocation.
    pub(super) fn packet(&mut self, now: Instant, every: Duration) -> bool {
        self.last_packet = now;
        let due = now.saturating_duration_since(self.notified) >= every;
        if due {
            self.notified = now;
        }
        due
    }
}

impl<F: HandlerFactory> Demux<F> {
    /// A packet of a stream refused at its start: it stays refused, even if a slot is
    /// free now, and is notified again at most once per announcement interval while it
    /// keeps sending. Returns whether `token` is such a stream.
    pub(super) fn refused_again(&mut self, token: &str, packet: &Packet, now: Instant) -> bool {
        let Some(refused) = self.refused.get_mut(token) else {
            return false;
        };
        let renotify = refused.packet(now, self.shared.settings.capacity.interval);
        let reason = refused.reason;
        if matches!(packet.body, PacketBody::End) {
            self.refused.remove(token);
        } else if renotify && reason == RefuseReason::MaxStreams {
            let live = self.shared.stream_slots.taken() as u64;
            self.shared.capacity.refused(token, live, true);
        }
        self.count_refused_frames(&packet.body, reason);
        true
    }

    /// Refuses the new stream `token`: no handler, no entry. Counted, reported, and
    /// remembered (while the bounded set has room) so that its later packets are
    /// refused too.
    pub(super) fn refuse(
        &mut self,
        token: &str,
        partition: u32,
        packet: &Packet,
        reason: RefuseReason,
        now: Instant,
    ) {
        let name = reason.as_str();
        let remembered = match self.shared.refused_slots.try_acquire() {
            Some(slot) => {
                self.refused
                    .insert(token.to_owned(), Refused::new(reason, now, slot));
                true
            }
            // More than `max_streams` refused ids at once: this one is not remembered,
            // so its next packet is refused (and counted) as a new stream again.
            None => false,
        };
        let live = self.shared.stream_slots.taken() as u64;
        if reason == RefuseReason::MaxStreams {
            self.shared.capacity.refused(token, live, remembered);
        }
        count_by(&mut self.shared.registry().base.streams_refused, name);
        metrics::counter!(m::CONSUMER_STREAMS_REFUSED_TOTAL, m::LABEL_REASON => name).increment(1);
        self.count_refused_frames(&packet.body, reason);
        tracing::warn!(
            stream = token,
            partition,
            seq = packet.seq,
            max_streams = self.shared.stream_slots.max(),
            remembered,
            "stream refused: max_streams live streams already"
        );
        let _ = self.shared.events.send(ConsumerEvent::StreamRefused {
            stream: token.to_owned(),
            partition,
            reason,
            seq: packet.seq,
        });
    }

    /// Counts the frames a packet of a refused stream carries (a gap packet: the frames
    /// it declares), so that the "sent" identity holds without a record for the stream.
    fn count_refused_frames(&self, body: &PacketBody, reason: RefuseReason) {
        let frames = match body {
            PacketBody::Frame { .. } => 1,
            PacketBody::Gap(g) => g.frames(),
            PacketBody::End => return,
        };
        let mut reg = self.shared.registry();
        reg.base.frames_refused = reg.base.frames_refused.saturating_add(frames);
        drop(reg);
        metrics::counter!(m::CONSUMER_FRAMES_REFUSED_TOTAL, m::LABEL_REASON => reason.as_str())
            .increment(frames);
    }
}
