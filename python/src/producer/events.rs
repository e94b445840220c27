//! A stream's events for Python, derived from the core's `StreamStatus` watch (as the
//! ingress's WebSocket door derives its `overload`, `gap` and `closed` events):
//!
//! - `gap_sent`: the stream published a gap marker (`gap` policy). Several markers
//!   published between two reads are reported as one event naming the last marker;
//!   `gaps_total` counts them all.
//! - `overloaded`: the stream overloaded (`close` policy; the report of its `end`).
//!   At most once, before `closed`.
//! - `closed`: the publisher exited (the `end` was handed to NATS, or given up on):
//!   the final counts. The last event; after it, [`EventCursor::next`] returns `None`.
//!
//! Invariant (cancel safety): [`EventCursor::next`] awaits only `watch::changed`,
//! which is cancel-safe; deriving an event from the status and taking it out of the
//! cursor happen with no await in between. A cancelled wait therefore loses no event:
//! the next call derives it from the status, which the watch still holds. The cursor
//! sits behind an async mutex (one reader at a time), locked by each call.

use std::collections::VecDeque;

use serde_json::{Value, json};
use weir_audio_producer::stream::{StreamStatus, StreamView};
use weir_protocol::WireName;

/// What one stream's reader has seen so far.
pub struct EventCursor {
    view: StreamView,
    rx: tokio::sync::watch::Receiver<StreamStatus>,
    gaps_seen: u64,
    overload_sent: bool,
    closed_sent: bool,
    /// Derived, not yet returned.
    pending: VecDeque<Value>,
}

impl EventCursor {
    /// A cursor from the stream's current status on (nothing seen yet).
    pub fn new(view: StreamView) -> Self {
        let rx = view.status();
        Self {
            view,
            rx,
            gaps_seen: 0,
            overload_sent: false,
            closed_sent: false,
            pending: VecDeque::new(),
        }
    }

    /// The next event as JSON; `None` once `closed` was returned.
    pub async fn next(&mut self) -> Option<String> {
        loop {
            if let Some(ev) = self.pending.pop_front() {
                return Some(ev.to_string());
            }
            if self.closed_sent {
                return None;
            }
            let status = self.rx.borrow_and_update().clone();
            self.derive(&status);
            if self.pending.is_empty() && self.rx.changed().await.is_err() {
                // The stream's state is gone (cannot happen while the view holds it):
                // report it closed rather than wait forever.
                let mut last = self.rx.borrow().clone();
                last.finished = true;
                self.derive(&last);
            }
        }
    }

    /// Appends the events `status` shows that were not derived yet, in order.
    fn derive(&mut self, status: &StreamStatus) {
        if status.gaps > self.gaps_seen {
            self.gaps_seen = status.gaps;
            if let Some(g) = &status.last_gap {
                self.pending.push_back(json!({
                    "type": "gap_sent",
                    "first_seq": g.first_seq,
                    "last_seq": g.last_seq,
                    "frames": g.frames(),
                    "samples": g.samples,
                    "reason": g.reason,
                    "gaps_total": status.gaps,
                }));
            }
        }
        if !self.overload_sent
            && let Some(o) = &status.overload
        {
            self.overload_sent = true;
            let snapshot = self.view.snapshot();
            self.pending.push_back(json!({
                "type": "overloaded",
                "reason": o.reason,
                "pending_bytes": o.pending_bytes,
                "max_bytes": o.max_bytes,
                "max_age_ms": o.max_age_ms,
                "dropped_frames": o.dropped_frames,
                "dropped_samples": o.dropped_samples,
                "dropped_first_seq": o.dropped_first_seq,
                "dropped_last_seq": o.dropped_last_seq,
                "oldest_age_ms": snapshot.oldest_frame_age_ms,
                "frames_published": snapshot.frames.published,
            }));
        }
        if !self.closed_sent && status.finished {
            self.closed_sent = true;
            let snapshot = self.view.snapshot();
            let f = &snapshot.frames;
            self.pending.push_back(json!({
                "type": "closed",
                "reason": status.end_reason.map(|r| r.as_str()),
                "end_delivered": status.end_delivered,
                "frames_published": f.published,
                "frames_dropped": f.dropped_total(),
                "frames_possibly_lost": f.possibly_lost,
                "gaps": status.gaps,
                "overload": status.overload,
            }));
        }
    }
}
