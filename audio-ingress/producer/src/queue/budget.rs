//! What a frame costs and who holds it: the charge floor, the stream's [`Budget`] of
//! pending bytes and frames, the [`Reservation`] each admitted frame holds, and the
//! admitted frame itself ([`QueuedFrame`]).
//!
//! Invariants a change must not break:
//! - Only a [`Reservation`] changes a [`Budget`]: it adds its bytes when made and
//!   takes them off exactly once, when dropped (also for the aggregate counts).
//! - A frame is charged at least [`MIN_FRAME_CHARGE`] bytes, against the byte budget
//!   and the rate bound alike.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use tokio::time::Instant;
use weir_service::bounded::Charged;

use crate::stats::Global;

/// The least a frame is charged against `max_bytes` and the rate bound: 160 bytes, 5 ms
/// of 16 kHz audio. A frame costs memory beyond its PCM (its packet's meta, ~100 bytes,
/// and its queue slot) and a NATS message; without a floor a producer sending 2-byte
/// frames could make one stream hold 8,000 frames under a 16,000-byte budget, or send
/// 24,000 messages a second within the 1.5× rate. With it a stream holds at most
/// `max_bytes / 160` frames and sends at most `max_rate` × 200 frames a second,
/// whatever their size.
pub const MIN_FRAME_CHARGE: usize = 160;

/// Bytes a frame of `pcm_len` PCM bytes takes from the budget.
#[inline]
pub(crate) fn charge_of(pcm_len: usize) -> u64 {
    pcm_len.max(MIN_FRAME_CHARGE) as u64
}

/// Samples in `len` bytes of s16le mono.
#[inline]
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
    #[inline]
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
    #[inline]
    pub(super) fn new(budget: &Arc<Budget>, bytes: u64) -> Self {
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
    pub(super) fn absorb(&mut self, mut other: Reservation) {
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
    pub(super) _reservation: Reservation,
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
