//! The per-stream queue: bounded by bytes **and** age, with an explicit policy when the
//! budget is exhausted. Pure and synchronous: every method takes `now`, nothing here
//! sleeps, spawns or touches NATS, so the logic is unit-tested with a paused clock.
//!
//! The queue holds, in sequence order: gap markers for frames already dropped, then
//! the admitted frames still to publish. The stream's publisher task takes items from
//! the front ([`FrameQueue::pop`]); the producer appends ([`FrameQueue::offer`]).
//!
//! Invariants a change must not break:
//! - Sequence numbers are assigned at admission: 1, 2, 3 ... with no holes; the `end`
//!   takes the next number. A refused frame gets no number.
//! - Every admitted frame holds a [`Reservation`] of its bytes until the server
//!   confirmed it, it was declared possibly lost, or it was dropped; the reservation is
//!   released exactly once, by `Drop`. Pending bytes of a stream (queued + the
//!   publisher's frame in flight + handed to NATS and unconfirmed) never exceed the
//!   enforced byte bound.
//! - Frames handed to NATS wait in `unconfirmed`, in seq order, until the confirmation
//!   window ([`crate::confirm`]) settles them: [`FrameQueue::confirm_through`] (the
//!   server has them: published) or [`FrameQueue::lose_through`] (the connection dropped
//!   first: possibly lost, declared on the stream's next packet and on its `end`).
//!   Their age counts: in `close`, an unconfirmed frame older than `max_age` overloads
//!   the stream just like a queued one.
//! - Every admitted frame is published, or dropped with a [`DropReason`] and — in the
//!   `gap` policy — covered by a gap marker, or — in `close` — counted in the overload
//!   report of the `end`. Nothing is lost silently.
//! - A frame older than the enforced `max_age` is never handed out as if nothing had
//!   happened: `gap` drops it into a marker, `close` overloads the stream.
//! - In `gap`, a frame that finds the budget held by unconfirmed frames (nothing queued
//!   left to evict) is admitted and dropped at once into a marker (reason
//!   `unconfirmed`): the timeline stays exact.
//! - In `close`, a stream that stays full for `max_wait` (no room appeared) overloads:
//!   the queue is emptied, and the next item is the `end` with the overload report.
//! - A frame over the rate bound ([`crate::rate`], `max_rate` × real time, burst =
//!   the budget + 2 s of audio to catch up after a network stall) is never admitted as if nothing had happened: `gap` drops it into a
//!   marker (reason `rate`), `close` overloads the stream (reason `rate`).
//! - Shadow mode measures the budget (counts `would_reject`) and enforces only the
//!   ceiling (`shadow_ceiling_factor` × the budget), so memory stays bounded.
//! - A queued frame is its encoded packet ([`FrameQueue::offer_with`] encodes it once
//!   it is admitted); the budget counts its PCM bytes. Frames the publisher took in a
//!   batch and could not hand over come back to the front ([`FrameQueue::requeue_front`]),
//!   or into the overload report if the stream overloaded meanwhile — never dropped
//!   unaccounted.
//!
//! The queued frames are stored in a [`BoundedQueue`] (`weir-service`, shared with the
//! consumer's stream queue): order, ages and eviction from the front. The byte bound is
//! the [`Budget`]'s, which also counts frames in flight and unconfirmed; the enforced
//! budget and its policy are one [`QueueLimits`] (shared with the consumer's queue).
//!
//! This file admits frames (offer, the rate and byte/age bounds, overload); `budget`
//! holds what a frame costs and the reservations, `clock` the capture times,
//! `handover` what was handed to NATS until the window settles it, and `drain` what
//! the publisher takes next and what happens when its publish fails.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::time::Instant;
use weir_protocol::audio::extension::{
    EndReason, Overload, OverloadReason, PossibleLoss, PossibleLossReason,
};
use weir_protocol::audio::{Gap, GapReason};
use weir_service::bounded::{BoundedQueue, QueueLimits, WhenFull};

use crate::config::StreamConfig;
use crate::confirm::WindowPermit;
use crate::error::FrameError;
use crate::rate::RateBucket;
use crate::stats::{Account, Counters, DropReason, Global, WaitBatch, WouldReject};

mod budget;
mod clock;
mod drain;
mod handover;

pub use budget::{Budget, MIN_FRAME_CHARGE, QueuedFrame, Reservation};
pub(crate) use budget::{charge_of, samples_of};
pub(crate) use clock::WallClock;
pub(crate) use handover::ControlCheck;
use handover::{Carried, ConfirmedRound, Unconfirmed};

/// What the publisher should do next.
#[derive(Debug)]
pub enum Next {
    /// Publish this gap marker (frames already dropped and counted).
    Gap(Gap),
    /// Publish this frame.
    Frame(QueuedFrame),
    /// Publish the `end` and stop.
    End(EndPacket),
    /// Nothing to do until the producer pushes or the stream is finished.
    Empty,
    /// The `end` was already handed out.
    Done,
}

/// The stream's last packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndPacket {
    /// Its sequence number (last admitted seq + 1).
    pub seq: u64,
    /// Why the stream ended.
    pub reason: EndReason,
    /// The overload report, for `close` overloads.
    pub overload: Option<Overload>,
}

/// Why a frame was not admitted (internal; the stream handle maps it to `PushError`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// `close`: full now; the stream overloads at `overload_at` if no room appears.
    Full {
        /// Bytes pending.
        pending_bytes: u64,
        /// Enforced byte bound.
        max_bytes: u64,
        /// When the stream overloads if it stays full.
        overload_at: Instant,
    },
    /// The stream overloaded.
    Overloaded(Overload),
    /// The stream is ending or ended for another reason.
    Closed(EndReason),
    /// Not a valid frame.
    Invalid(FrameError),
}

/// How an offer is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OfferMode {
    /// `try_push`: a full queue refuses the frame (counted).
    Try,
    /// `push`: a full queue is not a refusal yet; the caller waits for room until
    /// `overload_at` and offers again.
    Wait,
}

/// How a publish of the frame in flight failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The publish did not complete within `publish_timeout`.
    Timeout,
    /// The NATS client returned an error.
    Error,
    /// The frame outlived the age bound while waiting for room in the confirmation
    /// window (the server stopped confirming).
    Expired,
}

/// What happens to a frame whose publish failed.
#[derive(Debug)]
pub enum AfterFailure {
    /// Shadow mode: try again (counted as would-reject).
    Retry(QueuedFrame),
    /// The frame was dropped and accounted.
    Dropped,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    /// Admitting frames.
    Open,
    /// No more frames; publish what is queued, then `end`. Frames still queued at
    /// `deadline` are dropped (shutdown grace).
    Draining {
        reason: EndReason,
        deadline: Option<Instant>,
    },
    /// The queue was emptied; `end` is next.
    Ending {
        reason: EndReason,
        overload: Option<Overload>,
    },
    /// The `end` was handed to the publisher.
    Ended {
        reason: EndReason,
        overload: Option<Overload>,
    },
}

/// The state a stream reports in the admin views.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StreamState {
    /// Admitting frames.
    #[default]
    Open,
    /// Finishing: draining what is queued, then `end`.
    Draining,
    /// Overloaded or failed: `end` is next.
    Ending,
    /// The `end` was handed to the publisher (which may still be delivering it).
    Ended,
}

/// One stream's queue. See the module docs for the invariants.
#[derive(Debug)]
pub struct FrameQueue {
    /// The enforced budget (in shadow mode the ceiling) and the policy over it.
    limits: QueueLimits,
    shadow: bool,
    /// The nominal budget (what shadow mode measures).
    max_bytes: u64,
    max_age: Duration,
    enforced_max_wait: Duration,
    max_frame_bytes: usize,
    end_timeout: Duration,

    gaps: VecDeque<Gap>,
    items: BoundedQueue<QueuedFrame>,
    next_seq: u64,
    phase: Phase,
    full_since: Option<Instant>,
    refused_while_full: (u64, u64),
    inflight_since: Option<Instant>,
    control_deadline: Option<Instant>,
    unconfirmed: VecDeque<Unconfirmed>,
    /// Possible loss declared and not yet carried by a packet.
    declaration: Option<PossibleLoss>,
    /// The declaration last handed to the client on a packet, until a frame at or
    /// after its carrier is confirmed (see [`Self::take_declaration`]).
    carried: Option<Carried>,
    /// The last range declared (for the cumulative report on `end`).
    last_declared: Option<PossibleLoss>,
    possibly_lost_total: u64,
    /// The frames the stream's most recent confirmed round covered.
    last_confirmed: Option<ConfirmedRound>,
    /// The control packet (`end` or gap marker) handed to the client last, awaiting the
    /// window's verdict ([`Self::control_handed_over`]).
    control_check: ControlCheck,
    /// The last window batch this stream registered in (see [`Self::hand_over`]).
    registered_batch: Option<u64>,
    /// The publisher is parked with nothing in its hands (its last pop was `Empty`).
    publisher_idle: bool,
    /// Queue waits of frames the producer handed over itself (the direct path).
    direct_waits: WaitBatch,
    /// Capture times (Unix ms) of admitted frames.
    clock: WallClock,
    /// Where the encoder carves admitted frames' packets from (see
    /// `weir_protocol::audio::encode_packet_in`): one allocation per arena, not per
    /// frame. Empty until the first frame.
    arena: BytesMut,
    /// The rate bound in audio time ([`crate::rate`]); `None` when `max_rate = 0`.
    rate: Option<RateBucket>,
    /// PCM bytes of the last frame admitted (what a frame of the stream weighs, for a
    /// resume's declared loss); 0 before the first.
    last_pcm_len: usize,
    /// When the last frame was admitted (`None` before the first).
    last_admitted_at: Option<Instant>,
    /// The consumers take `gap` packets (`gap` policy, or `extended_consumers`).
    gap_packets: bool,

    budget: Arc<Budget>,
    counters: Arc<Counters>,
    global: Arc<Global>,
}

impl FrameQueue {
    /// An empty queue for a new stream.
    pub fn new(cfg: &StreamConfig, counters: Arc<Counters>, global: Arc<Global>) -> Self {
        Self {
            limits: QueueLimits {
                max_bytes: cfg.enforced_max_bytes(),
                max_age: cfg.enforced_max_age(),
                policy: cfg.policy(),
            },
            shadow: cfg.shadow(),
            max_bytes: cfg.max_bytes() as u64,
            max_age: cfg.max_age(),
            enforced_max_wait: cfg.enforced_max_wait(),
            max_frame_bytes: cfg.max_frame_bytes(),
            end_timeout: cfg.end_timeout(),
            gaps: VecDeque::new(),
            items: BoundedQueue::default(),
            next_seq: 1,
            phase: Phase::Open,
            full_since: None,
            refused_while_full: (0, 0),
            inflight_since: None,
            control_deadline: None,
            unconfirmed: VecDeque::new(),
            declaration: None,
            carried: None,
            last_declared: None,
            possibly_lost_total: 0,
            last_confirmed: None,
            control_check: ControlCheck::None,
            registered_batch: None,
            publisher_idle: false,
            direct_waits: WaitBatch::default(),
            clock: WallClock::new(),
            arena: BytesMut::new(),
            rate: RateBucket::new(
                cfg.enforced_max_rate_permille(),
                crate::rate::burst_samples(cfg.enforced_max_bytes() as u64),
            ),
            last_pcm_len: 0,
            last_admitted_at: None,
            gap_packets: cfg.policy() == WhenFull::Gap || cfg.extended_consumers(),
            budget: Arc::new(Budget::new(Arc::clone(&global))),
            counters,
            global,
        }
    }

    /// The enforced byte budget.
    fn enforced_max_bytes(&self) -> u64 {
        self.limits.max_bytes as u64
    }

    fn account(&self) -> Account<'_> {
        Account {
            stream: &self.counters,
            global: &self.global,
        }
    }

    /// The stream's pending budget (shared with reservations).
    pub fn budget(&self) -> &Arc<Budget> {
        &self.budget
    }

    /// Whether the queue holds no frame and no gap marker.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty() && self.gaps.is_empty()
    }

    /// The admin-view state.
    pub fn state(&self) -> StreamState {
        match self.phase {
            Phase::Open => StreamState::Open,
            Phase::Draining { .. } => StreamState::Draining,
            Phase::Ending { .. } => StreamState::Ending,
            Phase::Ended { .. } => StreamState::Ended,
        }
    }

    /// Why the stream ends, once it is no longer open.
    pub fn end_reason(&self) -> Option<EndReason> {
        match &self.phase {
            Phase::Open => None,
            Phase::Draining { reason, .. }
            | Phase::Ending { reason, .. }
            | Phase::Ended { reason, .. } => Some(*reason),
        }
    }

    /// The overload report, once the stream overloaded.
    pub fn overload(&self) -> Option<&Overload> {
        match &self.phase {
            Phase::Ending { overload, .. } | Phase::Ended { overload, .. } => overload.as_ref(),
            _ => None,
        }
    }

    /// When the oldest pending frame (unconfirmed, in flight or queued) was admitted.
    pub fn oldest_enqueued_at(&self) -> Option<Instant> {
        let front = self.items.front().map(|f| f.enqueued_at);
        [self.oldest_unconfirmed_at(), self.inflight_since, front]
            .into_iter()
            .flatten()
            .min()
    }

    /// When the oldest frame handed to NATS and not yet confirmed was admitted.
    pub fn oldest_unconfirmed_at(&self) -> Option<Instant> {
        self.unconfirmed.front().map(|u| u.enqueued_at)
    }

    /// Whether frames handed to NATS still await confirmation.
    pub fn has_unconfirmed(&self) -> bool {
        !self.unconfirmed.is_empty()
    }

    /// Until when `end` (and gap markers, once the stream is closing) may be retried.
    /// `None` while the stream is open.
    pub fn control_deadline(&self) -> Option<Instant> {
        self.control_deadline
    }

    /// The next sequence number (the `end` would take it now).
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Sequence number of the last frame admitted (0 before the first).
    pub fn last_seq(&self) -> u64 {
        self.next_seq - 1
    }

    /// Samples of the last frame admitted (0 before the first).
    pub fn last_frame_samples(&self) -> u64 {
        samples_of(self.last_pcm_len)
    }

    /// When the last frame was admitted (`None` before the first).
    pub fn last_admitted_at(&self) -> Option<Instant> {
        self.last_admitted_at
    }

    /// Whether the consumers take `gap` packets (`gap` policy or
    /// `extended_consumers`); otherwise losses are declared in a header.
    pub fn gap_packets(&self) -> bool {
        self.gap_packets
    }

    /// Declares `frames` frames (`samples` samples) that the stream never received —
    /// the loss of a resumed connection, or a source's (a carrier's missing chunks):
    /// they take the next seqs, counted as offered, admitted and dropped (`resume` /
    /// `source`), and are declared with that reason: a gap marker when the consumers
    /// take them (`gap` policy or `extended_consumers`; published after the frames
    /// queued before it), else a possible-loss declaration on the next packet.
    /// `Ok(None)` for 0 frames; refused unless the stream is open.
    pub fn skip(&mut self, frames: u64, samples: u64, cause: Lost) -> Result<Option<Gap>, Refusal> {
        if let Some(r) = self.closed_refusal() {
            return Err(r);
        }
        if frames == 0 {
            return Ok(None);
        }
        let first_seq = self.next_seq;
        self.next_seq += frames;
        let (gap_reason, loss_reason, drop_reason) = cause.reasons();
        let gap = Gap {
            first_seq,
            last_seq: self.next_seq - 1,
            samples,
            reason: gap_reason,
        };
        let acct = self.account();
        acct.offered_and_admitted(frames);
        acct.dropped(drop_reason, frames, samples);
        if self.gap_packets {
            self.gaps.push_back(gap);
        } else {
            self.declare(gap.first_seq, gap.last_seq, frames, loss_reason);
        }
        Ok(Some(gap))
    }

    fn check_frame(&self, len: usize) -> Result<(), FrameError> {
        if len == 0 {
            return Err(FrameError::Empty);
        }
        if !len.is_multiple_of(2) {
            return Err(FrameError::PartialSample { len });
        }
        if len > self.max_frame_bytes {
            return Err(FrameError::TooLarge {
                len,
                max: self.max_frame_bytes,
            });
        }
        Ok(())
    }

    fn closed_refusal(&self) -> Option<Refusal> {
        match &self.phase {
            Phase::Open => None,
            Phase::Ending {
                overload: Some(o), ..
            }
            | Phase::Ended {
                overload: Some(o), ..
            } => Some(Refusal::Overloaded(o.clone())),
            Phase::Draining { reason, .. }
            | Phase::Ending { reason, .. }
            | Phase::Ended { reason, .. } => Some(Refusal::Closed(*reason)),
        }
    }

    /// Offers a frame. `Ok(seq)` when admitted. See [`OfferMode`] for what a full
    /// `close` queue does. Every final outcome is counted (offered, admitted or
    /// refused with a reason); a `Wait`-mode `Full` is not final and counts nothing.
    pub fn offer(&mut self, pcm: &Bytes, now: Instant, mode: OfferMode) -> Result<u64, Refusal> {
        self.offer_with(pcm.len(), now, mode, |_, _, _| Some(pcm.clone()))
    }

    /// [`Self::offer`] for a frame of `pcm_len` PCM bytes whose packet `encode(arena,
    /// seq, captured_at_ms)` makes once it is admitted (never for a refused frame), from
    /// the queue's packet arena if it likes. `None` from the encoder refuses the frame
    /// as invalid.
    pub fn offer_with(
        &mut self,
        pcm_len: usize,
        now: Instant,
        mode: OfferMode,
        encode: impl FnOnce(&mut BytesMut, u64, u64) -> Option<Bytes>,
    ) -> Result<u64, Refusal> {
        let result = self.offer_inner(pcm_len, now, mode, encode);
        if result.is_ok() {
            self.last_pcm_len = pcm_len;
            self.last_admitted_at = Some(now);
        }
        let acct = self.account();
        match &result {
            Ok(_) => {
                acct.offered();
                acct.admitted();
            }
            Err(Refusal::Full { .. }) if mode == OfferMode::Wait => {}
            Err(r) => {
                acct.offered();
                let reason = match r {
                    Refusal::Full { .. } => DropReason::QueueFull,
                    Refusal::Invalid(_) => DropReason::Invalid,
                    Refusal::Overloaded(_) | Refusal::Closed(_) => DropReason::Closed,
                };
                acct.dropped(reason, 1, samples_of(pcm_len));
            }
        }
        result
    }

    fn offer_inner(
        &mut self,
        pcm_len: usize,
        now: Instant,
        mode: OfferMode,
        encode: impl FnOnce(&mut BytesMut, u64, u64) -> Option<Bytes>,
    ) -> Result<u64, Refusal> {
        let Some(seq) = self.admit(pcm_len, now, mode)? else {
            // Admitted straight into a gap marker (`gap`, budget held elsewhere).
            return Ok(self.next_seq - 1);
        };
        let captured_at_ms = self.clock.unix_ms(now, now);
        let Some(packet) = encode(&mut self.arena, seq, captured_at_ms) else {
            // Only a frame that is not whole samples fails to encode (checked above).
            self.next_seq -= 1;
            return Err(Refusal::Invalid(FrameError::PartialSample { len: pcm_len }));
        };
        let reservation = Reservation::new(&self.budget, charge_of(pcm_len));
        self.items.push_back(QueuedFrame {
            seq,
            pcm_len,
            packet,
            captured_at_ms,
            enqueued_at: now,
            _reservation: reservation,
        });
        Ok(seq)
    }

    /// The admission decision: `Some(seq)` = queue the frame under `seq`; `None` = the
    /// frame took the next seq and went straight into a gap marker.
    fn admit(
        &mut self,
        pcm_len: usize,
        now: Instant,
        mode: OfferMode,
    ) -> Result<Option<u64>, Refusal> {
        self.check_frame(pcm_len).map_err(Refusal::Invalid)?;
        if let Some(r) = self.closed_refusal() {
            return Err(r);
        }
        self.expire(now);
        if let Some(r) = self.closed_refusal() {
            return Err(r);
        }
        if let Some(rate) = &mut self.rate
            && !rate.has(samples_of(charge_of(pcm_len) as usize), now)
        {
            return self.over_rate(pcm_len, now);
        }
        let len = charge_of(pcm_len);
        let pending = self.budget.bytes();
        if self.shadow {
            let too_old = self
                .oldest_enqueued_at()
                .is_some_and(|t| now.saturating_duration_since(t) > self.max_age);
            if pending + len > self.max_bytes {
                self.account().would_reject(WouldReject::Bytes);
            } else if too_old {
                self.account().would_reject(WouldReject::Age);
            }
        }
        let max_bytes = self.enforced_max_bytes();
        if pending + len > max_bytes {
            match self.limits.policy {
                WhenFull::Gap => {
                    while let Some(f) = self
                        .items
                        .pop_front_if(|_| self.budget.bytes() + len > max_bytes)
                    {
                        self.drop_into_gap(f, DropReason::Evicted, GapReason::QueueFull);
                    }
                    if self.budget.bytes() + len > max_bytes {
                        // Nothing queued is left to evict: the budget is held by the
                        // frame in flight and frames the server has not confirmed. The
                        // new frame takes its seq and goes straight into a marker, so
                        // the timeline stays exact and the bound holds.
                        let seq = self.next_seq;
                        self.next_seq += 1;
                        self.drop_seq_into_gap(
                            seq,
                            samples_of(pcm_len),
                            DropReason::Unconfirmed,
                            GapReason::QueueFull,
                        );
                        self.take_rate(pcm_len);
                        return Ok(None);
                    }
                }
                WhenFull::Close => {
                    let since = *self.full_since.get_or_insert(now);
                    let overload_at = since + self.enforced_max_wait;
                    if now >= overload_at {
                        return Err(self.overload_by(OverloadReason::QueueFull, pcm_len, now));
                    }
                    if mode == OfferMode::Try {
                        self.refused_while_full.0 += 1;
                        self.refused_while_full.1 += samples_of(pcm_len);
                    }
                    return Err(Refusal::Full {
                        pending_bytes: pending,
                        max_bytes,
                        overload_at,
                    });
                }
            }
        }
        self.full_since = None;
        self.refused_while_full = (0, 0);
        self.take_rate(pcm_len);
        let seq = self.next_seq;
        self.next_seq += 1;
        Ok(Some(seq))
    }

    /// Lowers the stream's rate bound to `max_rate_permille` (a producer token's rate
    /// class, given by the front door that authenticated the producer); never raises it; ignored in shadow mode.
    pub fn limit_rate(&mut self, max_rate_permille: u32) {
        if self.shadow
            || self
                .rate
                .as_ref()
                .is_some_and(|r| r.permille() <= max_rate_permille)
        {
            return;
        }
        let burst = crate::rate::burst_samples(self.enforced_max_bytes());
        self.rate = RateBucket::new(max_rate_permille, burst);
    }

    /// Charges an admitted frame to the rate bound.
    fn take_rate(&mut self, pcm_len: usize) {
        if let Some(rate) = &mut self.rate {
            rate.take(samples_of(charge_of(pcm_len) as usize));
        }
    }

    /// A frame over the rate bound: `gap` gives it its seq and drops it into a marker
    /// (reason `rate`); `close` overloads the stream (reason `rate`), the frame
    /// counted in the report.
    fn over_rate(&mut self, pcm_len: usize, now: Instant) -> Result<Option<u64>, Refusal> {
        match self.limits.policy {
            WhenFull::Gap => {
                let seq = self.next_seq;
                self.next_seq += 1;
                let samples = samples_of(pcm_len);
                self.drop_seq_into_gap(seq, samples, DropReason::Rate, GapReason::Rate);
                Ok(None)
            }
            WhenFull::Close => Err(self.overload_by(OverloadReason::Rate, pcm_len, now)),
        }
    }

    /// `close`: the frame of `pcm_len` bytes overloads the stream for `reason`, counted
    /// in the report; the refusal it gets.
    fn overload_by(&mut self, reason: OverloadReason, pcm_len: usize, now: Instant) -> Refusal {
        self.refused_while_full.0 += 1;
        self.refused_while_full.1 += samples_of(pcm_len);
        self.trip_overload(reason, now);
        self.closed_refusal()
            .unwrap_or(Refusal::Closed(EndReason::Overload))
    }

    /// Appends a dropped frame to the gap markers (merging contiguous ranges) and
    /// accounts it. The frame's reservation is released here.
    fn drop_into_gap(&mut self, frame: QueuedFrame, drop: DropReason, gap: GapReason) {
        self.drop_seq_into_gap(frame.seq, frame.samples(), drop, gap);
    }

    /// The markers stay in seq order (a `resume` or `rate` marker may wait behind
    /// queued frames while older frames are evicted or expire into a marker of their
    /// own); contiguous drops share one marker ([`mergeable`]).
    fn drop_seq_into_gap(&mut self, seq: u64, samples: u64, drop: DropReason, gap: GapReason) {
        self.account().dropped(drop, 1, samples);
        let i = self.gaps.partition_point(|g| g.last_seq < seq);
        if let Some(g) = i.checked_sub(1).and_then(|p| self.gaps.get_mut(p))
            && g.last_seq + 1 == seq
            && mergeable(g.reason, gap)
        {
            g.last_seq = seq;
            g.samples += samples;
            return;
        }
        self.gaps.insert(
            i,
            Gap {
                first_seq: seq,
                last_seq: seq,
                samples,
                reason: gap,
            },
        );
    }

    /// Drops every queued frame for `reason`; returns (frames, samples).
    fn drop_all(&mut self, reason: DropReason) -> (u64, u64) {
        let frames = self.items.frames() as u64;
        let samples = self.items.drain_all().map(|f| f.samples()).sum();
        self.account().dropped(reason, frames, samples);
        (frames, samples)
    }

    fn set_control_deadline(&mut self, deadline: Instant) {
        self.control_deadline = Some(match self.control_deadline {
            Some(d) => d.min(deadline),
            None => deadline,
        });
    }

    /// `close` policy: the stream overloads. Queued frames are dropped (reason
    /// `overload`) and the next item is the `end` with the report.
    fn trip_overload(&mut self, reason: OverloadReason, now: Instant) {
        if !matches!(self.phase, Phase::Open | Phase::Draining { .. }) {
            return;
        }
        let pending_bytes = self.budget.bytes();
        let seqs = (
            self.items.iter().map(|f| f.seq).min(),
            self.items.iter().map(|f| f.seq).max(),
        );
        let (frames, samples) = self.drop_all(DropReason::Overload);
        let (rf, rs) = std::mem::take(&mut self.refused_while_full);
        self.global.overloaded(reason);
        self.phase = Phase::Ending {
            reason: EndReason::Overload,
            overload: Some(Overload {
                reason,
                dropped_frames: frames + rf,
                dropped_samples: samples + rs,
                pending_bytes,
                max_bytes: self.max_bytes,
                max_age_ms: self.max_age.as_millis() as u64,
                dropped_first_seq: seqs.0,
                dropped_last_seq: seqs.1,
            }),
        };
        self.set_control_deadline(now + self.end_timeout);
    }

    /// Applies the age bound to the front of the queue, and (`close`) to the oldest
    /// frame the server has not confirmed: audio that old is stale wherever it waits.
    fn expire(&mut self, now: Instant) {
        let max_age = self.limits.max_age;
        match self.limits.policy {
            WhenFull::Gap => {
                while let Some(f) = self.items.pop_expired(now, max_age) {
                    self.drop_into_gap(f, DropReason::MaxAge, GapReason::MaxAge);
                }
            }
            WhenFull::Close => {
                let stale = |age: Duration| self.limits.too_old(age);
                let unconfirmed = self
                    .oldest_unconfirmed_at()
                    .map(|t| now.saturating_duration_since(t));
                if unconfirmed.is_some_and(stale) || self.items.oldest_age(now).is_some_and(stale) {
                    self.trip_overload(OverloadReason::MaxAge, now);
                }
            }
        }
    }
}

/// Audio a stream never received, declared by its door ([`FrameQueue::skip`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lost {
    /// Offered by a producer whose connection dropped, declared when it resumed.
    Resume,
    /// Lost by the producer's source before the door: a telephony carrier's missing
    /// chunks, or chunks later than the reorder window.
    Source,
}

impl Lost {
    /// The gap marker's, the possible-loss declaration's and the drop counter's reasons.
    fn reasons(self) -> (GapReason, PossibleLossReason, DropReason) {
        match self {
            Self::Resume => (
                GapReason::Resume,
                PossibleLossReason::Resume,
                DropReason::Resume,
            ),
            Self::Source => (
                GapReason::Source,
                PossibleLossReason::Source,
                DropReason::Source,
            ),
        }
    }
}

/// Whether two contiguous markers may become one (carrying the first one's cause): a
/// marker of audio the ingress never received (`resume`, `source`) stays apart from
/// the drops of audio it had, and from the other kind.
pub(crate) fn mergeable(a: GapReason, b: GapReason) -> bool {
    let never_received = |r| matches!(r, GapReason::Resume | GapReason::Source);
    if never_received(a) || never_received(b) {
        return a == b;
    }
    true
}

#[cfg(test)]
mod tests;
