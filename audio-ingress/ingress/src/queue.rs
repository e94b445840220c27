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
//! the [`Budget`]'s, which also counts frames in flight and unconfirmed.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{Bytes, BytesMut};
use tokio::time::Instant;
use weir_protocol::audio::extension::{
    EndReason, Overload, OverloadReason, PossibleLoss, PossibleLossReason,
};
use weir_protocol::audio::{Gap, GapReason};
use weir_service::bounded::{BoundedQueue, Charged, QueueLimits, WhenFull};

use crate::config::StreamConfig;
use crate::confirm::WindowPermit;
use crate::error::FrameError;
use crate::rate::RateBucket;
use crate::stats::{Account, Counters, DropReason, Global, WaitBatch, WouldReject};

/// Maps monotonic instants to Unix milliseconds without two clock reads per frame: an
/// anchor (instant, Unix ms) taken at most [`WallClock::REANCHOR`] ago, so wall-clock
/// steps are followed within a second.
#[derive(Debug)]
pub(crate) struct WallClock {
    at: Instant,
    unix_ms: u64,
}

impl WallClock {
    const REANCHOR: Duration = Duration::from_secs(1);

    pub(crate) fn new() -> Self {
        Self {
            at: Instant::now(),
            unix_ms: unix_ms_now(),
        }
    }

    /// Unix ms of `t` (an instant near `now`); re-anchors when the anchor is old.
    pub(crate) fn unix_ms(&mut self, t: Instant, now: Instant) -> u64 {
        if now.saturating_duration_since(self.at) >= Self::REANCHOR {
            *self = Self::new();
        }
        if t >= self.at {
            self.unix_ms + t.duration_since(self.at).as_millis() as u64
        } else {
            self.unix_ms
                .saturating_sub(self.at.duration_since(t).as_millis() as u64)
        }
    }
}

/// Now, in Unix milliseconds.
pub(crate) fn unix_ms_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The least a frame is charged against `max_bytes` and the rate bound: 160 bytes, 5 ms
/// of 16 kHz audio. A frame costs memory beyond its PCM (its packet's meta, ~100 bytes,
/// and its queue slot) and a NATS message; without a floor a producer sending 2-byte
/// frames could make one stream hold 8,000 frames under a 16,000-byte budget, or send
/// 24,000 messages a second within the 1.5× rate. With it a stream holds at most
/// `max_bytes / 160` frames and sends at most `max_rate` × 200 frames a second,
/// whatever their size.
pub const MIN_FRAME_CHARGE: usize = 160;

/// Bytes a frame of `pcm_len` PCM bytes takes from the budget.
pub(crate) fn charge_of(pcm_len: usize) -> u64 {
    pcm_len.max(MIN_FRAME_CHARGE) as u64
}

/// Samples in `len` bytes of s16le mono.
pub(crate) fn samples_of(len: usize) -> u64 {
    (len / 2) as u64
}

/// Pending bytes and frames of one stream, shared by the queue, the publisher's frame
/// in flight and the admin views. Only [`Reservation`] changes it.
#[derive(Debug)]
pub struct Budget {
    bytes: AtomicU64,
    frames: AtomicU64,
    high_water: AtomicU64,
    global: Arc<Global>,
}

impl Budget {
    /// A zero budget that also reports into `global`.
    pub fn new(global: Arc<Global>) -> Self {
        Self {
            bytes: AtomicU64::new(0),
            frames: AtomicU64::new(0),
            high_water: AtomicU64::new(0),
            global,
        }
    }

    /// Bytes pending (queued + in flight).
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Frames pending (queued + in flight).
    pub fn frames(&self) -> u64 {
        self.frames.load(Ordering::Relaxed)
    }

    /// The highest [`Self::bytes`] ever reached.
    pub fn high_water(&self) -> u64 {
        self.high_water.load(Ordering::Relaxed)
    }
}

/// The bytes of admitted frames (one at admission; several once merged into an
/// unconfirmed run), held against their stream's [`Budget`] (and the aggregate
/// counts) until dropped. Released exactly once, by `Drop`; [`Self::absorb`] moves
/// another reservation's bytes into this one, so they are released with it.
#[derive(Debug)]
pub struct Reservation {
    budget: Arc<Budget>,
    bytes: u64,
    frames: u64,
}

impl Reservation {
    fn new(budget: &Arc<Budget>, bytes: u64) -> Self {
        let now = budget.bytes.fetch_add(bytes, Ordering::Relaxed) + bytes;
        budget.frames.fetch_add(1, Ordering::Relaxed);
        budget.high_water.fetch_max(now, Ordering::Relaxed);
        budget.global.reserve(bytes);
        Self {
            budget: Arc::clone(budget),
            bytes,
            frames: 1,
        }
    }

    /// Takes over `other`'s frames (of the same stream): released with this one.
    fn absorb(&mut self, mut other: Reservation) {
        debug_assert!(Arc::ptr_eq(&self.budget, &other.budget));
        self.bytes += std::mem::take(&mut other.bytes);
        self.frames += std::mem::take(&mut other.frames);
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.frames == 0 {
            return;
        }
        self.budget.bytes.fetch_sub(self.bytes, Ordering::Relaxed);
        self.budget.frames.fetch_sub(self.frames, Ordering::Relaxed);
        self.budget.global.release(self.bytes, self.frames);
    }
}

/// An admitted frame, already encoded as the packet that goes to NATS (encoded once,
/// at admission: the publisher and every retry hand over the same bytes).
#[derive(Debug)]
pub struct QueuedFrame {
    /// Its sequence number.
    pub seq: u64,
    /// Bytes of PCM it carries (what the budget counts).
    pub pcm_len: usize,
    /// The encoded packet (what [`FrameQueue::offer_with`]'s encoder made).
    pub packet: Bytes,
    /// Its capture time (admission), Unix ms, as written in the packet's meta.
    pub captured_at_ms: u64,
    /// When it was admitted.
    pub enqueued_at: Instant,
    _reservation: Reservation,
}

impl QueuedFrame {
    /// Samples in the frame.
    pub fn samples(&self) -> u64 {
        samples_of(self.pcm_len)
    }
}

impl Charged for QueuedFrame {
    fn charge(&self) -> usize {
        charge_of(self.pcm_len) as usize
    }

    fn enqueued_at(&self) -> Instant {
        self.enqueued_at
    }
}

/// The frames of this stream the last confirmed round covered (see
/// [`FrameQueue::lose_through`]).
#[derive(Debug, Clone, Copy)]
struct ConfirmedRound {
    at: Instant,
    first: u64,
    last: u64,
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
struct Carried {
    /// The seq of the packet that carries it.
    carrier_seq: u64,
    declaration: PossibleLoss,
}

/// A run of consecutive frames handed to the NATS client in one window batch, awaiting
/// the server's confirmation: settled together, so they are held together until then —
/// one reservation and one window permit per run instead of per frame (the budget's and
/// the window's shared counters move once per run).
#[derive(Debug)]
struct Unconfirmed {
    first_seq: u64,
    last_seq: u64,
    /// The window batch its frames were handed over in: settled with that batch (or a
    /// later one).
    batch: u64,
    /// When the run's first (oldest) frame was admitted.
    enqueued_at: Instant,
    reservation: Reservation,
    permit: Option<WindowPermit>,
}

impl Unconfirmed {
    fn frames(&self) -> u64 {
        self.last_seq - self.first_seq + 1
    }
}

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
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StreamState {
    /// Admitting frames.
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
        let register = self.registered_batch != Some(batch);
        self.registered_batch = Some(batch);
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
        let register = self.registered_batch != Some(batch);
        self.registered_batch = Some(batch);
        register
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
    fn settle_runs(&mut self, batch: u64) -> (u64, Option<(u64, u64)>) {
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
    /// when it settled less than `max_age` ago: "confirmed" means the server processed
    /// the publish and queued it for its subscribers, and a server that dies takes those
    /// queued deliveries with it (measured: a SIGKILLed server lost a confirmed frame for
    /// a subscriber in 2 of 20 runs). Those frames stay counted as published; the
    /// consumer counts a hole inside the range as possibly lost, not as an undetected
    /// loss.
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
    fn declare_possibly_lost(&mut self, first: u64, last: u64, n: u64) {
        self.account().possibly_lost(n);
        self.possibly_lost_total += n;
        let earlier = match (self.declaration.take(), self.carried.take()) {
            (Some(d), Some(c)) => Some(PossibleLoss {
                first_seq: d.first_seq.min(c.declaration.first_seq),
                last_seq: d.last_seq.max(c.declaration.last_seq),
                frames: d.frames + c.declaration.frames,
                ..d
            }),
            (d, c) => d.or(c.map(|c| c.declaration)),
        };
        let declared = match earlier {
            Some(d) => PossibleLoss {
                first_seq: d.first_seq.min(first),
                last_seq: d.last_seq.max(last),
                frames: d.frames + n,
                total_frames: self.possibly_lost_total,
                reason: PossibleLossReason::UnconfirmedAtDisconnect,
            },
            None => PossibleLoss {
                first_seq: first,
                last_seq: last,
                frames: n,
                total_frames: self.possibly_lost_total,
                reason: PossibleLossReason::UnconfirmedAtDisconnect,
            },
        };
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

    /// Until when `end` (and gap markers, once the stream is closing) may be retried.
    /// `None` while the stream is open.
    pub fn control_deadline(&self) -> Option<Instant> {
        self.control_deadline
    }

    /// The next sequence number (the `end` would take it now).
    pub fn next_seq(&self) -> u64 {
        self.next_seq
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
                        self.refused_while_full.0 += 1;
                        self.refused_while_full.1 += samples_of(pcm_len);
                        self.trip_overload(OverloadReason::QueueFull, now);
                        return Err(self
                            .closed_refusal()
                            .unwrap_or(Refusal::Closed(EndReason::Overload)));
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
    /// class, [`crate::auth`]); never raises it; ignored in shadow mode.
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
        let samples = samples_of(pcm_len);
        match self.limits.policy {
            WhenFull::Gap => {
                let seq = self.next_seq;
                self.next_seq += 1;
                self.drop_seq_into_gap(seq, samples, DropReason::Rate, GapReason::Rate);
                Ok(None)
            }
            WhenFull::Close => {
                self.refused_while_full.0 += 1;
                self.refused_while_full.1 += samples;
                self.trip_overload(OverloadReason::Rate, now);
                Err(self
                    .closed_refusal()
                    .unwrap_or(Refusal::Closed(EndReason::Overload)))
            }
        }
    }

    /// Appends a dropped frame to the gap markers (merging contiguous ranges) and
    /// accounts it. The frame's reservation is released here.
    fn drop_into_gap(&mut self, frame: QueuedFrame, drop: DropReason, gap: GapReason) {
        self.drop_seq_into_gap(frame.seq, frame.samples(), drop, gap);
    }

    fn drop_seq_into_gap(&mut self, seq: u64, samples: u64, drop: DropReason, gap: GapReason) {
        self.account().dropped(drop, 1, samples);
        match self.gaps.back_mut() {
            Some(g) if g.last_seq + 1 == seq => {
                g.last_seq = seq;
                g.samples += samples;
            }
            _ => self.gaps.push_back(Gap {
                first_seq: seq,
                last_seq: seq,
                samples,
                reason: gap,
            }),
        }
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

    /// Takes the next item for the publisher. Order: gap markers, frames, `end`.
    pub fn pop(&mut self, now: Instant) -> Next {
        let next = self.pop_inner(now);
        // Empty: the publisher parks until woken, with nothing of this stream in its
        // hands; until its next pop a producer may hand frames over directly.
        self.publisher_idle = matches!(next, Next::Empty);
        next
    }

    fn pop_inner(&mut self, now: Instant) -> Next {
        self.inflight_since = None;
        self.expire(now);
        if let Phase::Draining {
            deadline: Some(d), ..
        } = self.phase
            && now >= d
        {
            self.drop_all(DropReason::Shutdown);
        }
        if let Some(g) = self.gaps.pop_front() {
            return Next::Gap(g);
        }
        if let Some(f) = self.items.pop_front() {
            // Taking a frame frees no room (it stays reserved until handed over, and
            // with the window until confirmed): a full `close` stream's wait goes on
            // until a frame is admitted again.
            self.inflight_since = Some(f.enqueued_at);
            return Next::Frame(f);
        }
        let (reason, overload) = match &self.phase {
            Phase::Open => return Next::Empty,
            Phase::Ended { .. } => return Next::Done,
            Phase::Draining { reason, .. } => (*reason, None),
            Phase::Ending { reason, overload } => (*reason, overload.clone()),
        };
        if self.control_deadline.is_none() {
            self.set_control_deadline(now + self.end_timeout);
        }
        self.phase = Phase::Ended {
            reason,
            overload: overload.clone(),
        };
        Next::End(EndPacket {
            seq: self.next_seq,
            reason,
            overload,
        })
    }

    /// The publish of the frame in flight failed; applies the policy to it.
    pub fn inflight_failed(
        &mut self,
        frame: QueuedFrame,
        failure: Failure,
        now: Instant,
    ) -> AfterFailure {
        self.inflight_since = None;
        let age = now.saturating_duration_since(frame.enqueued_at);
        if let Phase::Ending { .. } | Phase::Ended { .. } = self.phase {
            self.drop_inflight_on_overload(frame);
            return AfterFailure::Dropped;
        }
        if self.shadow && failure != Failure::Error && !self.limits.too_old(age) {
            self.account().would_reject(WouldReject::PublishTimeout);
            self.inflight_since = Some(frame.enqueued_at);
            return AfterFailure::Retry(frame);
        }
        match (self.limits.policy, failure) {
            (WhenFull::Gap, f) => {
                let (drop, gap) = match f {
                    Failure::Timeout => (DropReason::PublishTimeout, GapReason::PublishFailed),
                    Failure::Error => (DropReason::PublishError, GapReason::PublishFailed),
                    Failure::Expired => (DropReason::MaxAge, GapReason::MaxAge),
                };
                self.prepend_gap(frame, drop, gap);
            }
            (WhenFull::Close, Failure::Expired) => {
                self.trip_overload(OverloadReason::MaxAge, now);
                self.drop_inflight_on_overload(frame);
            }
            (WhenFull::Close, Failure::Timeout) => {
                self.trip_overload(OverloadReason::PublishTimeout, now);
                self.drop_inflight_on_overload(frame);
            }
            (WhenFull::Close, Failure::Error) => {
                self.account()
                    .dropped(DropReason::PublishError, 1, frame.samples());
                drop(frame);
                self.drop_all(DropReason::PublishError);
                self.phase = Phase::Ending {
                    reason: EndReason::Error,
                    overload: None,
                };
                self.set_control_deadline(now + self.end_timeout);
            }
        }
        AfterFailure::Dropped
    }

    /// Accounts the frame in flight when the stream has already overloaded (or
    /// failed): dropped, and added to the overload report if there is one.
    fn drop_inflight_on_overload(&mut self, frame: QueuedFrame) {
        let samples = frame.samples();
        let seq = frame.seq;
        let reason = if self.overload().is_some() {
            DropReason::Overload
        } else {
            DropReason::PublishError
        };
        self.account().dropped(reason, 1, samples);
        if let Phase::Ending {
            overload: Some(o), ..
        } = &mut self.phase
        {
            o.dropped_frames += 1;
            o.dropped_samples += samples;
            o.dropped_first_seq = Some(o.dropped_first_seq.map_or(seq, |s| s.min(seq)));
            o.dropped_last_seq = Some(o.dropped_last_seq.map_or(seq, |s| s.max(seq)));
        }
    }

    /// `gap`: the frame in flight is dropped; it precedes everything queued, so its
    /// marker goes (or merges) at the front.
    fn prepend_gap(&mut self, frame: QueuedFrame, drop: DropReason, reason: GapReason) {
        let samples = frame.samples();
        self.account().dropped(drop, 1, samples);
        match self.gaps.front_mut() {
            Some(g) if g.first_seq == frame.seq + 1 => {
                // A merged marker carries the cause of its first frame.
                g.first_seq = frame.seq;
                g.samples += samples;
                g.reason = reason;
            }
            _ => self.gaps.push_front(Gap {
                first_seq: frame.seq,
                last_seq: frame.seq,
                samples,
                reason,
            }),
        }
    }

    /// A gap marker in flight could not be published yet: merges markers queued since
    /// (contiguous with it) into it, so one marker covers the whole range.
    /// Applies the age bound first, so frames that expired meanwhile are included.
    pub fn merge_into_gap(&mut self, gap: &mut Gap, now: Instant) {
        self.expire(now);
        while let Some(front) = self.gaps.front() {
            if front.first_seq != gap.last_seq + 1 {
                break;
            }
            gap.last_seq = front.last_seq;
            gap.samples += front.samples;
            self.gaps.pop_front();
        }
    }

    /// Stops admitting; what is queued is still published (until `drain_deadline`, if
    /// any), then `end` with `reason`. Idempotent; a later call can only tighten the
    /// deadlines (a shutdown during a producer's finish).
    pub fn finish(
        &mut self,
        reason: EndReason,
        now: Instant,
        drain_deadline: Option<Instant>,
        control_deadline: Option<Instant>,
    ) {
        match &mut self.phase {
            Phase::Open => {
                self.phase = Phase::Draining {
                    reason,
                    deadline: drain_deadline,
                };
                self.set_control_deadline(control_deadline.unwrap_or(now + self.end_timeout));
            }
            Phase::Draining { deadline, .. } => {
                if let Some(d) = drain_deadline {
                    *deadline = Some(deadline.map_or(d, |old| old.min(d)));
                }
                if let Some(d) = control_deadline {
                    self.set_control_deadline(d);
                }
            }
            Phase::Ending { .. } | Phase::Ended { .. } => {
                if let Some(d) = control_deadline {
                    self.set_control_deadline(d);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(
        f: impl FnOnce(crate::config::StreamConfigBuilder) -> crate::config::StreamConfigBuilder,
    ) -> StreamConfig {
        // No rate bound unless a test asks for one: these tests offer frames at one
        // instant, i.e. infinitely faster than real time.
        f(StreamConfig::builder().max_rate_permille(0))
            .build()
            .expect("valid config")
    }

    fn queue(c: &StreamConfig) -> (FrameQueue, Arc<Counters>, Arc<Global>) {
        let counters = Arc::new(Counters::default());
        let global = Arc::new(Global::new());
        (
            FrameQueue::new(c, Arc::clone(&counters), Arc::clone(&global)),
            counters,
            global,
        )
    }

    fn pcm() -> Bytes {
        Bytes::from(vec![0u8; 640])
    }

    const MS: Duration = Duration::from_millis(1);

    /// offered = admitted + rejected; admitted = published + dropped + pending.
    fn assert_accounted(q: &FrameQueue, c: &Counters, published: u64) {
        let s = c.snapshot();
        assert_eq!(s.offered, s.admitted + s.rejected_total(), "{s:?}");
        assert_eq!(
            s.admitted,
            published + s.dropped_admitted_total() + q.budget().frames(),
            "{s:?}"
        );
    }

    #[test]
    fn seq_starts_at_one_and_end_takes_the_next() {
        let c = cfg(|b| b);
        let (mut q, counters, g) = queue(&c);
        let t = Instant::now();
        assert_eq!(q.offer(&pcm(), t, OfferMode::Try), Ok(1));
        assert_eq!(q.offer(&pcm(), t, OfferMode::Try), Ok(2));
        assert_eq!(q.budget().bytes(), 1280);
        assert_eq!(g.pending_bytes(), 1280);
        q.finish(EndReason::Producer, t, None, None);
        assert!(matches!(
            q.offer(&pcm(), t, OfferMode::Try),
            Err(Refusal::Closed(EndReason::Producer))
        ));
        let Next::Frame(f1) = q.pop(t) else {
            panic!("frame")
        };
        assert_eq!(f1.seq, 1);
        drop(f1);
        assert_eq!(
            q.budget().bytes(),
            640,
            "published frame released its bytes"
        );
        let Next::Frame(f2) = q.pop(t) else {
            panic!("frame")
        };
        drop(f2);
        match q.pop(t) {
            Next::End(e) => assert_eq!(
                (e.seq, e.reason, e.overload),
                (3, EndReason::Producer, None)
            ),
            other => panic!("{other:?}"),
        }
        assert!(matches!(q.pop(t), Next::Done));
        assert_eq!(
            (q.budget().bytes(), g.pending_bytes(), g.pending_frames()),
            (0, 0, 0)
        );
        assert_accounted(&q, &counters, 2);
    }

    #[test]
    fn tiny_frames_are_charged_the_floor_so_the_frame_count_is_bounded() {
        // The byte budget alone (the rate bound's burst is larger: budget + catch-up).
        let c = StreamConfig::builder()
            .max_rate_permille(0)
            .build()
            .expect("cfg");
        let (mut q, _, _) = queue(&c);
        let t0 = Instant::now();
        let tiny = Bytes::from_static(&[0, 0]);
        let mut admitted = 0;
        while q.offer(&tiny, t0, OfferMode::Try).is_ok() {
            admitted += 1;
            assert!(admitted <= 1_000, "unbounded");
        }
        assert_eq!(admitted, 16_000 / MIN_FRAME_CHARGE);
        assert_eq!(q.budget().bytes(), 16_000);
        assert_eq!(q.budget().frames(), admitted as u64);
    }

    #[test]
    fn tiny_frames_are_charged_the_floor_by_the_rate_bound_too() {
        // A roomy budget so only the rate bound (1.5x, burst = the budget + 2 s of
        // catch-up) can refuse: frames are popped (released) as they come.
        let c = StreamConfig::builder()
            .max_bytes(1_600_000)
            .delivery(crate::config::Delivery::Unconfirmed)
            .build()
            .expect("cfg");
        let (mut q, counters, _) = queue(&c);
        let t0 = Instant::now();
        let tiny = Bytes::from_static(&[0, 0]);
        // Burst: 800,000 + 32,000 samples = 10,400 frames at the 80-sample floor.
        let mut admitted = 0u64;
        while q.offer(&tiny, t0, OfferMode::Try).is_ok() {
            admitted += 1;
            assert!(admitted <= 20_000, "the rate bound never refused");
            while let Next::Frame(f) = q.pop(t0) {
                drop(f);
            }
        }
        assert_eq!(
            admitted,
            crate::rate::burst_samples(1_600_000) / (MIN_FRAME_CHARGE as u64 / 2)
        );
        assert_eq!(q.state(), StreamState::Ending, "over rate: overloaded");
        assert_eq!(counters.snapshot().admitted, admitted);
    }

    #[test]
    fn invalid_frames_change_nothing() {
        let c = cfg(|b| b);
        let (mut q, counters, _) = queue(&c);
        let t = Instant::now();
        for bad in [
            Bytes::new(),
            Bytes::from_static(&[0; 3]),
            Bytes::from(vec![0; 3202]),
        ] {
            assert!(matches!(
                q.offer(&bad, t, OfferMode::Try),
                Err(Refusal::Invalid(_))
            ));
        }
        assert_eq!(q.offer(&pcm(), t, OfferMode::Try), Ok(1));
        assert_eq!(counters.snapshot().dropped(DropReason::Invalid), 3);
        assert_accounted(&q, &counters, 0);
    }

    #[test]
    fn close_refuses_when_full_then_overloads_after_max_wait() {
        let c = cfg(|b| b); // 16,000 bytes = 25 frames, max_wait 100 ms
        let (mut q, counters, g) = queue(&c);
        let t0 = Instant::now();
        for i in 0..25 {
            assert_eq!(q.offer(&pcm(), t0, OfferMode::Try), Ok(i + 1));
        }
        assert_eq!(q.budget().bytes(), 16_000);
        let t1 = t0 + 10 * MS;
        match q.offer(&pcm(), t1, OfferMode::Try) {
            Err(Refusal::Full {
                pending_bytes,
                max_bytes,
                overload_at,
            }) => {
                assert_eq!((pending_bytes, max_bytes), (16_000, 16_000));
                assert_eq!(overload_at, t1 + 100 * MS);
            }
            other => panic!("{other:?}"),
        }
        // A Wait-mode full is not a refusal.
        assert!(matches!(
            q.offer(&pcm(), t1 + 50 * MS, OfferMode::Wait),
            Err(Refusal::Full { .. })
        ));
        assert_eq!(counters.snapshot().dropped(DropReason::QueueFull), 1);
        // Still full at max_wait: overload.
        let r = q.offer(&pcm(), t1 + 100 * MS, OfferMode::Wait);
        let Err(Refusal::Overloaded(o)) = r else {
            panic!("{r:?}")
        };
        assert_eq!(o.reason, OverloadReason::QueueFull);
        assert_eq!(o.dropped_frames, 25 + 2, "25 queued + 2 refused");
        assert_eq!(
            (o.dropped_first_seq, o.dropped_last_seq),
            (Some(1), Some(25)),
            "the queued frames' seqs (refused ones have none)"
        );
        assert_eq!(o.dropped_samples, 27 * 320);
        assert_eq!(
            (o.pending_bytes, o.max_bytes, o.max_age_ms),
            (16_000, 16_000, 500)
        );
        assert_eq!(q.budget().bytes(), 0, "the queue was emptied");
        assert_eq!(g.overloads(), 1);
        // Later offers are refused with the same report; the next item is the end.
        assert!(matches!(
            q.offer(&pcm(), t1 + 200 * MS, OfferMode::Try),
            Err(Refusal::Overloaded(_))
        ));
        match q.pop(t1 + 200 * MS) {
            Next::End(e) => {
                assert_eq!(e.seq, 26);
                assert_eq!(e.reason, EndReason::Overload);
                assert_eq!(e.overload, Some(o));
            }
            other => panic!("{other:?}"),
        }
        assert!(q.control_deadline().is_some());
        assert_accounted(&q, &counters, 0);
    }

    #[test]
    fn close_wait_restarts_when_room_appears() {
        let c = cfg(|b| b);
        let (mut q, _, _) = queue(&c);
        let t0 = Instant::now();
        for _ in 0..25 {
            q.offer(&pcm(), t0, OfferMode::Try).expect("room");
        }
        assert!(matches!(
            q.offer(&pcm(), t0, OfferMode::Try),
            Err(Refusal::Full { .. })
        ));
        let Next::Frame(f) = q.pop(t0 + 90 * MS) else {
            panic!("frame")
        };
        drop(f);
        assert_eq!(q.offer(&pcm(), t0 + 95 * MS, OfferMode::Try), Ok(26));
        // Full again at 120 ms: a fresh wait, no overload at 150 ms.
        assert!(matches!(
            q.offer(&pcm(), t0 + 120 * MS, OfferMode::Try),
            Err(Refusal::Full { .. })
        ));
        assert!(matches!(
            q.offer(&pcm(), t0 + 150 * MS, OfferMode::Try),
            Err(Refusal::Full { .. })
        ));
        assert!(matches!(
            q.offer(&pcm(), t0 + 220 * MS, OfferMode::Try),
            Err(Refusal::Overloaded(_))
        ));
    }

    #[test]
    fn close_overloads_on_age_instead_of_publishing_late() {
        let c = cfg(|b| b);
        let (mut q, counters, _) = queue(&c);
        let t0 = Instant::now();
        q.offer(&pcm(), t0, OfferMode::Try).expect("room");
        q.offer(&pcm(), t0 + 400 * MS, OfferMode::Try)
            .expect("room");
        match q.pop(t0 + 501 * MS) {
            Next::End(e) => {
                let o = e.overload.expect("report");
                assert_eq!(o.reason, OverloadReason::MaxAge);
                assert_eq!(o.dropped_frames, 2);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(counters.snapshot().dropped(DropReason::Overload), 2);
        assert_accounted(&q, &counters, 0);
    }

    fn gap_cfg() -> StreamConfig {
        cfg(|b| b.policy(WhenFull::Gap).extended_consumers(true))
    }

    #[test]
    fn gap_evicts_oldest_and_marks_the_exact_range() {
        let c = gap_cfg();
        let (mut q, counters, _) = queue(&c);
        let t0 = Instant::now();
        for i in 1..=25 {
            assert_eq!(q.offer(&pcm(), t0, OfferMode::Try), Ok(i));
        }
        // Three more: evict 1, 2, 3.
        for i in 26..=28 {
            assert_eq!(q.offer(&pcm(), t0 + MS, OfferMode::Try), Ok(i));
        }
        assert!(q.budget().bytes() <= 16_000);
        assert_eq!(q.budget().high_water(), 16_000);
        match q.pop(t0 + 2 * MS) {
            Next::Gap(g) => assert_eq!(
                g,
                Gap {
                    first_seq: 1,
                    last_seq: 3,
                    samples: 960,
                    reason: GapReason::QueueFull
                }
            ),
            other => panic!("{other:?}"),
        }
        let Next::Frame(f) = q.pop(t0 + 2 * MS) else {
            panic!("frame")
        };
        assert_eq!(f.seq, 4);
        assert_eq!(counters.snapshot().dropped(DropReason::Evicted), 3);
        drop(f);
        assert_accounted(&q, &counters, 1);
    }

    #[test]
    fn gap_expires_old_frames_into_a_marker_and_merges_with_the_inflight_frame() {
        let c = gap_cfg();
        let (mut q, counters, _) = queue(&c);
        let t0 = Instant::now();
        for i in 0..5u32 {
            q.offer(&pcm(), t0 + i * 20 * MS, OfferMode::Try)
                .expect("room");
        }
        let Next::Frame(f1) = q.pop(t0 + 100 * MS) else {
            panic!("frame")
        };
        assert_eq!(f1.seq, 1);
        // Frames 2..=5 outlive max_age while frame 1 is in flight.
        assert_eq!(q.oldest_enqueued_at(), Some(t0));
        let now = t0 + 700 * MS;
        assert_eq!(q.offer(&pcm(), now, OfferMode::Try), Ok(6));
        // The publish of frame 1 times out: it joins the front marker.
        assert!(matches!(
            q.inflight_failed(f1, Failure::Timeout, now),
            AfterFailure::Dropped
        ));
        match q.pop(now) {
            Next::Gap(g) => {
                assert_eq!((g.first_seq, g.last_seq, g.samples), (1, 5, 1600));
                assert_eq!(g.reason, GapReason::PublishFailed);
            }
            other => panic!("{other:?}"),
        }
        let s = counters.snapshot();
        assert_eq!(s.dropped(DropReason::MaxAge), 4);
        assert_eq!(s.dropped(DropReason::PublishTimeout), 1);
        assert_accounted(&q, &counters, 0);
    }

    #[test]
    fn a_gap_in_flight_absorbs_later_drops() {
        let c = gap_cfg();
        let (mut q, _, _) = queue(&c);
        let t0 = Instant::now();
        for _ in 0..26 {
            q.offer(&pcm(), t0, OfferMode::Try).expect("room");
        }
        let Next::Gap(mut g) = q.pop(t0) else {
            panic!("gap")
        };
        assert_eq!((g.first_seq, g.last_seq), (1, 1));
        // While the marker is being retried, frames 2..=3 are evicted.
        q.offer(&pcm(), t0, OfferMode::Try).expect("room");
        q.offer(&pcm(), t0, OfferMode::Try).expect("room");
        q.merge_into_gap(&mut g, t0);
        assert_eq!((g.first_seq, g.last_seq, g.samples), (1, 3, 960));
        let Next::Frame(f) = q.pop(t0) else {
            panic!("frame")
        };
        assert_eq!(f.seq, 4);
    }

    #[test]
    fn close_publish_timeout_overloads_and_counts_the_inflight_frame() {
        let c = cfg(|b| b);
        let (mut q, counters, _) = queue(&c);
        let t0 = Instant::now();
        for _ in 0..3 {
            q.offer(&pcm(), t0, OfferMode::Try).expect("room");
        }
        let Next::Frame(f) = q.pop(t0) else {
            panic!("frame")
        };
        let _ = q.inflight_failed(f, Failure::Timeout, t0 + 100 * MS);
        match q.pop(t0 + 100 * MS) {
            Next::End(e) => {
                let o = e.overload.expect("report");
                assert_eq!(o.reason, OverloadReason::PublishTimeout);
                assert_eq!(o.dropped_frames, 3);
                assert_eq!(e.seq, 4);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(counters.snapshot().dropped(DropReason::Overload), 3);
        assert_accounted(&q, &counters, 0);
    }

    #[test]
    fn shadow_counts_would_reject_and_enforces_only_the_ceiling() {
        let c = cfg(|b| b.shadow(true));
        let (mut q, counters, _) = queue(&c);
        let t0 = Instant::now();
        for i in 1..=30 {
            assert_eq!(q.offer(&pcm(), t0, OfferMode::Try), Ok(i));
        }
        assert_eq!(
            counters.snapshot().would_reject,
            5,
            "frames 26..=30 over the budget"
        );
        // The ceiling (8 x 16,000) still applies.
        for _ in 30..200 {
            let _ = q.offer(&pcm(), t0, OfferMode::Try);
        }
        assert!(q.budget().bytes() <= 8 * 16_000);
        assert!(q.budget().high_water() <= 8 * 16_000);
        // A publish timeout is retried, not enforced.
        let Next::Frame(f) = q.pop(t0) else {
            panic!("frame")
        };
        assert!(matches!(
            q.inflight_failed(f, Failure::Timeout, t0 + 100 * MS),
            AfterFailure::Retry(_)
        ));
    }

    #[test]
    fn shutdown_drain_deadline_drops_what_is_left() {
        let c = cfg(|b| b);
        let (mut q, counters, _) = queue(&c);
        let t0 = Instant::now();
        for _ in 0..3 {
            q.offer(&pcm(), t0, OfferMode::Try).expect("room");
        }
        q.finish(
            EndReason::Shutdown,
            t0,
            Some(t0 + 50 * MS),
            Some(t0 + 100 * MS),
        );
        let Next::Frame(f) = q.pop(t0 + 10 * MS) else {
            panic!("frame")
        };
        drop(f);
        match q.pop(t0 + 60 * MS) {
            Next::End(e) => assert_eq!((e.seq, e.reason), (4, EndReason::Shutdown)),
            other => panic!("{other:?}"),
        }
        assert_eq!(counters.snapshot().dropped(DropReason::Shutdown), 2);
        assert_eq!(q.control_deadline(), Some(t0 + 100 * MS));
        assert_accounted(&q, &counters, 1);
    }

    #[test]
    fn reservations_are_released_exactly_once_on_every_path() {
        let c = gap_cfg();
        let (mut q, _, g) = queue(&c);
        let t0 = Instant::now();
        for _ in 0..40 {
            q.offer(&pcm(), t0, OfferMode::Try).expect("room");
        }
        let Next::Gap(_) = q.pop(t0) else {
            panic!("gap")
        };
        let Next::Frame(f) = q.pop(t0) else {
            panic!("frame")
        };
        let _ = q.inflight_failed(f, Failure::Error, t0);
        q.finish(EndReason::Shutdown, t0, Some(t0), None);
        while !matches!(q.pop(t0 + MS), Next::Done) {}
        assert_eq!((g.pending_bytes(), g.pending_frames()), (0, 0));
        drop(q);
        assert_eq!((g.pending_bytes(), g.pending_frames()), (0, 0));
    }
}
