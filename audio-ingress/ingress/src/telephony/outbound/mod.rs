//! A call's bot audio, between NATS and the carrier: the state both tasks share
//! ([`Shared`]), the call's socket writer — the only task that sends to the carrier
//! ([`writer`]) — and the task that moves the bot's audio and `clear` commands from
//! NATS into the call's bounded queue ([`intake`]).
//!
//! - **Writer.** Sends the door's own messages ([`Cmd`]) and, once the call started,
//!   the queued bot audio when it is due (`weir_audio_telephony::outbound::OutQueue`:
//!   real time, `telephony.out_lead_ms` ahead), encoded to the call's return format,
//!   and its marks. Every send is bounded by `ws_send_timeout_ms`; the first that
//!   fails or times out abandons the socket and tells the reader ([`Shared::gone`]).
//! - **Intake.** Reads `<prefix>.ctl.<stream>` (first) and `<prefix>.out.<stream>` all
//!   the time, whatever the socket does, so the NATS client never buffers a call's
//!   audio: it goes into the queue or is refused there (the call's bytes bound, or
//!   every call's: the new audio is refused, what is queued keeps playing) and told
//!   (`overload` event, `source: "bot_audio"`).
//! - **Clear.** Under the queue's lock: the queue is emptied, the clear *epoch* moves
//!   on and the marks sent but not echoed are taken from the ledger. The writer pops a
//!   frame only under that lock and only while its epoch is current, so after a
//!   `clear` it sends the carrier's `clear` before any later audio: at most the one
//!   frame already in its socket send goes out after the door cleared.
//!
//! Invariants: the queue's bytes are the call's only bot-audio memory; they are counted
//! in `weir_ingress_telephony_out_queue_bytes` and in the door's all-calls total under
//! the queue's lock, and given back when the call's state is dropped; what is left when
//! the call ends is counted as dropped (`ended`). Lock order: queue, then marks.

pub mod intake;
pub mod writer;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::json;
use tokio::sync::Notify;
use weir_audio_telephony::outbound::{Dropped, Marks, OutQueue, OutboundConfig};
use weir_service::sync::locked;

use crate::metrics as m;
use crate::telephony::voice::Events;

pub use writer::{Cmd, Started, Writer};

/// The queue and what must change with it, under one lock.
pub(super) struct Outbox {
    pub(super) queue: OutQueue,
    /// Moves on at every `clear`.
    pub(super) epoch: u64,
    /// The queue's bytes as counted in the gauge and the door's total.
    counted: usize,
}

/// The call's bot-audio state, shared by the writer and the intake.
pub struct Shared {
    outbox: Mutex<Outbox>,
    marks: Mutex<Marks>,
    /// New audio, or a clear.
    pub(super) wake: Notify,
    /// Set (and the reader woken) when the socket is abandoned (a send failed or
    /// timed out). A flag and a `Notify`, not a token: the reader's wait for it is
    /// polled at every carrier message, and a token's poll takes its lock.
    gone: AtomicBool,
    gone_wake: Notify,
    /// Bytes queued by every call of the door, and their bound.
    total: Arc<AtomicUsize>,
    total_max: usize,
}

impl Shared {
    /// The state of a call with these bounds; `total` counts every call's queued
    /// bytes against `total_max`.
    pub fn new(config: OutboundConfig, total: Arc<AtomicUsize>, total_max: usize) -> Arc<Self> {
        Arc::new(Self {
            outbox: Mutex::new(Outbox {
                queue: OutQueue::new(config),
                epoch: 0,
                counted: 0,
            }),
            marks: Mutex::new(Marks::default()),
            wake: Notify::new(),
            gone: AtomicBool::new(false),
            gone_wake: Notify::new(),
            total,
            total_max,
        })
    }

    /// The writer gave up on the socket: the reader stops.
    pub(super) fn abandon(&self) {
        self.gone.store(true, Ordering::Release);
        self.gone_wake.notify_waiters();
    }

    /// Whether the socket was abandoned.
    pub fn is_gone(&self) -> bool {
        self.gone.load(Ordering::Acquire)
    }

    /// Waits until the socket is abandoned (at once if it already is).
    pub async fn gone(&self) {
        let notified = self.gone_wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if self.gone.load(Ordering::Acquire) {
            return;
        }
        notified.await;
    }

    /// Whether `len` more bytes would take every call's bot audio over its bound (a
    /// check, not a reservation: calls pushing at the same instant may pass it together,
    /// by at most one message each).
    pub(super) fn over_total(&self, len: usize) -> bool {
        self.total.load(Ordering::Relaxed).saturating_add(len) > self.total_max
    }

    pub(super) fn marks(&self) -> MutexGuard<'_, Marks> {
        locked(&self.marks)
    }

    /// Runs `f` on the outbox (and, through the second argument, the marks: lock
    /// order queue then marks), then counts the change in the queue's bytes, all
    /// under the queue's lock.
    pub(super) fn with_outbox<R>(&self, f: impl FnOnce(&mut Outbox, &Self) -> R) -> R {
        let mut o = locked(&self.outbox);
        let r = f(&mut o, self);
        let now = o.queue.queued_bytes();
        self.recount(&mut o.counted, now);
        r
    }

    /// Moves the gauge and the door's total from `*counted` to `now`.
    fn recount(&self, counted: &mut usize, now: usize) {
        if now == *counted {
            return;
        }
        if now > *counted {
            self.total.fetch_add(now - *counted, Ordering::Relaxed);
        } else {
            self.total.fetch_sub(*counted - now, Ordering::Relaxed);
        }
        metrics::gauge!(m::TELEPHONY_OUT_QUEUE_BYTES).increment(now as f64 - *counted as f64);
        *counted = now;
    }

    /// Empties the queue at once (a `clear`, or the end of the call): what it held,
    /// and the marks never played — sent and not echoed (older), then still queued.
    pub(super) fn clear(&self) -> (u64, u64, Vec<String>) {
        self.with_outbox(|o, s| {
            let cleared = o.queue.clear();
            o.epoch += 1;
            let mut unplayed = s.marks().cleared();
            unplayed.extend(cleared.queued_marks);
            (cleared.frames, cleared.ms, unplayed)
        })
    }

    /// Drops what is left at the end of the call (counted `ended`); the marks never
    /// played.
    pub fn end(&self) -> (u64, Vec<String>) {
        let (frames, ms, unplayed) = self.clear();
        count_dropped("ended", frames);
        self.wake.notify_one();
        (ms, unplayed)
    }

    /// A mark the carrier echoed back: `true` when it was one of this call's (played),
    /// else counted as unknown (e.g. the echo of a mark a `clear` already reported).
    pub fn played(&self, name: &str) -> bool {
        let known = self.marks().played(name).is_ok();
        let outcome = if known { "played" } else { "unknown" };
        metrics::counter!(m::TELEPHONY_MARKS_TOTAL, m::LABEL_OUTCOME => outcome).increment(1);
        known
    }
}

impl Drop for Shared {
    /// Gives the door's total and the gauge back whatever the call's tasks did last.
    fn drop(&mut self) {
        let mut counted = match self.outbox.get_mut() {
            Ok(o) => o.counted,
            Err(poisoned) => poisoned.into_inner().counted,
        };
        self.recount(&mut counted, 0);
    }
}

pub(super) fn count_dropped(reason: &'static str, frames: u64) {
    if frames > 0 {
        metrics::counter!(m::TELEPHONY_OUT_DROPPED_FRAMES_TOTAL, m::LABEL_REASON => reason)
            .increment(frames);
    }
}

/// Bot audio dropped by a bound (`reason`), counted and told: the `overload` event
/// (`mark`: the mark that went with the refused audio).
pub(super) fn tell_dropped(events: &Events, reason: &'static str, d: &Dropped, mark: Option<&str>) {
    count_dropped(reason, d.frames);
    let mut ev = json!({"type": "overload", "source": "bot_audio", "reason": reason,
        "frames": d.frames, "ms": d.ms});
    if let Some(name) = mark {
        ev["mark"] = name.into();
    }
    events.emit(ev);
}
