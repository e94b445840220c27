//! The frames and control packets a stream handed to the NATS client, until the
//! confirmation window ([`crate::confirm`]) settles them; the producer's direct path;
//! the possible-loss declarations that ride on the next packet.
//!
//! Invariants a change must not break (with the parent module's):
//! - Frames handed over wait in `unconfirmed`, in seq order, holding their
//!   reservation and window permit, until [`FrameQueue::confirm_through`] (published)
//!   or [`FrameQueue::lose_through`] (possibly lost: counted and declared) settles
//!   them: every frame is settled exactly once.
//! - A declaration is carried by a packet and only forgotten once a frame at or after
//!   its carrier is confirmed; otherwise it is declared again (and on the `end`).

use super::*;

/// The frames of this stream the last confirmed round covered (see
/// [`FrameQueue::lose_through`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct ConfirmedRound {
    pub(super) at: Instant,
    pub(super) first: u64,
    pub(super) last: u64,
}

/// Where the stream's last control packet (`end` or gap marker) stands with the
/// confirmation window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ControlCheck {
    /// Not handed over (or no window).
    None,
    /// Handed over in this window batch; no verdict yet.
    Pending(u64),
    /// A marker published after it came back on the same connection.
    Confirmed,
    /// The connection was replaced before that: the client may have discarded it.
    Lost,
}

/// A declaration riding on a packet that the server has not confirmed yet.
#[derive(Debug, Clone)]
pub(super) struct Carried {
    /// The seq of the packet that carries it.
    pub(super) carrier_seq: u64,
    pub(super) declaration: PossibleLoss,
}

/// A run of consecutive frames handed to the NATS client in one window batch, awaiting
/// the server's confirmation: settled together, so they are held together until then —
/// one reservation and one window permit per run instead of per frame (the budget's and
/// the window's shared counters move once per run).
#[derive(Debug)]
pub(super) struct Unconfirmed {
    pub(super) first_seq: u64,
    pub(super) last_seq: u64,
    /// The window batch its frames were handed over in: settled with that batch (or a
    /// later one).
    pub(super) batch: u64,
    /// When the run's first (oldest) frame was admitted.
    pub(super) enqueued_at: Instant,
    pub(super) reservation: Reservation,
    pub(super) permit: Option<WindowPermit>,
}

impl Unconfirmed {
    fn frames(&self) -> u64 {
        self.last_seq - self.first_seq + 1
    }
}

impl FrameQueue {
    /// The frame was handed to the NATS client in window batch `tag`: it stays pending
    /// (bytes and age) until [`Self::confirm_through`] or [`Self::lose_through`]
    /// settles it. `tag = None` (the connection changed while it was handed over, see
    /// `Window::open_tag`): possibly lost at once, counted and declared. Returns whether
    /// the stream must register in that batch (once per batch, not per frame).
    pub(crate) fn hand_over(
        &mut self,
        frame: QueuedFrame,
        permit: Option<WindowPermit>,
        tag: Option<u64>,
    ) -> bool {
        let Some(batch) = tag else {
            self.declare_possibly_lost(frame.seq, frame.seq, 1);
            return false;
        };
        let QueuedFrame {
            seq,
            enqueued_at,
            _reservation: reservation,
            ..
        } = frame;
        let register = self.registered_batch.replace(batch) != Some(batch);
        if let Some(run) = self.unconfirmed.back_mut()
            && run.batch == batch
            && run.last_seq + 1 == seq
        {
            run.last_seq = seq;
            run.reservation.absorb(reservation);
            match (run.permit.as_mut(), permit) {
                (Some(held), Some(p)) => held.absorb(p),
                (None, Some(p)) => run.permit = Some(p),
                (_, None) => {}
            }
        } else {
            self.unconfirmed.push_back(Unconfirmed {
                first_seq: seq,
                last_seq: seq,
                batch,
                enqueued_at,
                reservation,
                permit,
            });
        }
        register
    }

    /// A control packet (`end` or gap marker) was handed to the client in window batch
    /// `tag` (`None`: the connection changed meanwhile, so it may be gone already): the
    /// window settles it like a frame ([`Self::control_check`]). Returns whether the
    /// stream must register in that batch.
    pub(crate) fn control_handed_over(&mut self, tag: Option<u64>) -> bool {
        let Some(batch) = tag else {
            self.control_check = ControlCheck::Lost;
            return false;
        };
        self.control_check = ControlCheck::Pending(batch);
        self.registered_batch.replace(batch) != Some(batch)
    }

    /// The window's verdict on the control packet handed over last.
    pub(crate) fn control_check(&self) -> ControlCheck {
        self.control_check
    }

    /// [`Self::hand_over`] for several frames handed over in order, under one lock,
    /// whose window room is held by one `permit` (it goes with the first frame).
    pub(crate) fn hand_over_all(
        &mut self,
        frames: impl Iterator<Item = QueuedFrame>,
        mut permit: Option<WindowPermit>,
        tag: Option<u64>,
    ) -> bool {
        let mut register = false;
        for frame in frames {
            register |= self.hand_over(frame, permit.take(), tag);
        }
        register
    }

    /// Moves up to `max` more frames from the front of the queue into `out`, right
    /// after [`Self::pop`] returned a frame (so they follow it in seq order). Takes
    /// nothing while gap markers wait: a marker goes out before the frames behind it.
    pub(crate) fn take_more(&mut self, out: &mut Vec<QueuedFrame>, max: usize) {
        if !self.gaps.is_empty() {
            return;
        }
        out.extend(self.items.drain_front(max));
    }

    /// Frames taken by [`Self::take_more`] that the publisher did not hand over (its
    /// fast path ended): back to the front of the queue, in order, where the age bound
    /// and the policy apply to them again. If the stream overloaded meanwhile, they
    /// are dropped into the overload report instead (never silently).
    pub(crate) fn requeue_front(&mut self, frames: impl DoubleEndedIterator<Item = QueuedFrame>) {
        if let Phase::Ending { .. } | Phase::Ended { .. } = self.phase {
            for f in frames {
                self.drop_inflight_on_overload(f);
            }
            return;
        }
        for f in frames.rev() {
            self.items.push_front(f);
        }
    }

    /// The direct path ([`crate::stream`]): right after admitting the frame `seq`,
    /// takes it back out of the queue for the producer to hand over itself, if that
    /// keeps the stream's order — the publisher is parked with nothing in its hands,
    /// nothing else is queued, no gap marker or declaration waits, and the stream is
    /// open. The producer either hands it over ([`Self::hand_over`]) or puts it back
    /// ([`Self::restore_direct`]), under the same lock.
    pub(crate) fn take_direct(&mut self, seq: u64) -> Option<QueuedFrame> {
        if !self.publisher_idle
            || self.items.len() != 1
            || !self.gaps.is_empty()
            || self.declaration.is_some()
            || self.phase != Phase::Open
            || self.items.back().is_none_or(|f| f.seq != seq)
        {
            return None;
        }
        self.items.pop_back()
    }

    /// The queue-wait batch of the direct path (merged into the aggregate when full,
    /// and by [`Self::flush_direct_waits`]).
    pub(crate) fn direct_waits(&mut self) -> &mut WaitBatch {
        &mut self.direct_waits
    }

    /// Merges the direct path's pending queue waits into the aggregate histogram.
    pub(crate) fn flush_direct_waits(&mut self) {
        self.global.record_waits(&mut self.direct_waits);
    }

    /// A frame from [`Self::take_direct`] that could not be handed over at once: back
    /// into the queue, for the publisher.
    pub(crate) fn restore_direct(&mut self, frame: QueuedFrame) {
        self.items.push_back(frame);
    }

    /// Whether a possible-loss declaration waits for the next packet.
    pub(crate) fn has_declaration(&self) -> bool {
        self.declaration.is_some()
    }

    /// Releases the unconfirmed runs of batches `<= batch`: how many frames, and the
    /// seq range they span.
    pub(super) fn settle_runs(&mut self, batch: u64) -> (u64, Option<(u64, u64)>) {
        let mut n = 0;
        let mut range: Option<(u64, u64)> = None;
        while self.unconfirmed.front().is_some_and(|u| u.batch <= batch) {
            if let Some(u) = self.unconfirmed.pop_front() {
                range = Some(range.map_or((u.first_seq, u.last_seq), |(a, _)| (a, u.last_seq)));
                n += u.frames();
            }
        }
        (n, range)
    }

    /// The server confirmed every frame handed over in batches up to `batch`: they are
    /// published, their bytes released. Returns how many.
    pub(crate) fn confirm_through(&mut self, batch: u64, now: Instant) -> u64 {
        if matches!(self.control_check, ControlCheck::Pending(b) if b <= batch) {
            self.control_check = ControlCheck::Confirmed;
        }
        let (n, range) = self.settle_runs(batch);
        if let Some((first, last)) = range {
            // The server received every publish made before a confirmed one on the
            // same connection: a carrier at or before `last` reached it.
            if self.carried.as_ref().is_some_and(|c| c.carrier_seq <= last) {
                self.carried = None;
            }
            self.last_confirmed = Some(ConfirmedRound {
                at: now,
                first,
                last,
            });
        }
        self.account().published(n);
        n
    }

    /// The connection dropped before the server confirmed the frames handed over in
    /// batches up to `batch`: they are possibly lost. Counted, released, and declared
    /// on the next packet. Returns how many.
    ///
    /// The declared range also covers the frames of this stream's last confirmed round
    /// when it settled less than `max_age` ago (a server that dies loses what it queued
    /// for its subscribers: docs/audio-ingress.md, "Possible loss is declared"); those
    /// frames stay counted as published.
    pub(crate) fn lose_through(&mut self, batch: u64) -> u64 {
        if matches!(self.control_check, ControlCheck::Pending(b) if b <= batch) {
            self.control_check = ControlCheck::Lost;
        }
        let (n, range) = self.settle_runs(batch);
        let Some((mut first, last)) = range else {
            return 0;
        };
        if let Some(c) = self.last_confirmed.take()
            && c.at.elapsed() <= self.max_age
            && c.last < first
        {
            first = c.first;
        }
        self.declare_possibly_lost(first, last, n);
        n
    }

    /// `n` frames in `first..=last` are possibly lost: counted, and declared on the
    /// next packet, merged (their hull) with a declaration not yet sent and with one
    /// whose carrier the server has not confirmed — that carrier may be among the
    /// packets lost with this connection, and a consumer that never saw it must still
    /// find the earlier range declared (seen in CI: frame 51 lost at a server kill was
    /// declared on packet 61 only, and the `end` named just the later range). A
    /// consumer that did see the carrier gets the range twice, which changes nothing:
    /// a declaration re-labels holes, it adds none.
    pub(super) fn declare_possibly_lost(&mut self, first: u64, last: u64, n: u64) {
        self.account().possibly_lost(n);
        self.declare(first, last, n, PossibleLossReason::UnconfirmedAtDisconnect);
    }

    /// Declares `n` frames in `first..=last` on the next packet for `reason` (see
    /// [`Self::declare_possibly_lost`] for the merging); counts nothing but the
    /// declared total.
    pub(super) fn declare(&mut self, first: u64, last: u64, n: u64, reason: PossibleLossReason) {
        self.possibly_lost_total += n;
        let mut declared = PossibleLoss {
            first_seq: first,
            last_seq: last,
            frames: n,
            total_frames: self.possibly_lost_total,
            reason,
        };
        let earlier = [
            self.declaration.take(),
            self.carried.take().map(|c| c.declaration),
        ];
        for d in earlier.into_iter().flatten() {
            declared.first_seq = declared.first_seq.min(d.first_seq);
            declared.last_seq = declared.last_seq.max(d.last_seq);
            declared.frames += d.frames;
        }
        self.last_declared = Some(declared.clone());
        self.declaration = Some(declared);
    }

    /// The declaration the packet `carrier_seq` must carry, if any. It stays
    /// *carried* until a frame at or after that packet is confirmed.
    pub(crate) fn take_declaration(&mut self, carrier_seq: u64) -> Option<PossibleLoss> {
        let d = self.declaration.take()?;
        self.carried = Some(Carried {
            carrier_seq,
            declaration: d.clone(),
        });
        Some(d)
    }

    /// A packet that was to carry `d` was not handed over: keep it for the next one.
    pub(crate) fn restore_declaration(&mut self, d: PossibleLoss) {
        if self.carried.as_ref().is_some_and(|c| c.declaration == d) {
            self.carried = None;
        }
        if self.declaration.is_none() {
            self.declaration = Some(d);
        }
    }

    /// What the `end` reports: the pending declaration, else the last one with the
    /// cumulative total, else nothing.
    pub(crate) fn end_declaration(&mut self) -> Option<PossibleLoss> {
        self.declaration.take().or_else(|| {
            self.last_declared.clone().map(|mut d| {
                d.total_frames = self.possibly_lost_total;
                d
            })
        })
    }
}
