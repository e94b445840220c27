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
//! Invariant (cancel safety): an event leaves the cursor only when the reader
//! acknowledges it. Each event gets an index (1, 2, ...); [`EventCursor::next`]`(after)`
//! drops the events up to `after` (the index of the last event the Python reader
//! received) and returns the first one left, *keeping* it. A Python `await` cancelled
//! at any point — before the Rust future completed, or after it completed but before
//! the result reached the coroutine (the bridge cannot take a completed result back)
//! — therefore loses nothing: the reader did not move `after`, so the next call
//! returns the same event. Waiting is `watch::changed`, which is cancel-safe, and
//! deriving events from the status involves no await. The cursor sits behind an async
//! mutex, locked by each call; the events are meant for one reader.

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
    /// The index the next derived event gets.
    next_index: u64,
    /// Derived, not yet acknowledged: (index, event).
    pending: VecDeque<(u64, Value)>,
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
            next_index: 1,
            pending: VecDeque::new(),
        }
    }

    /// The first event after index `after` (the reader's last), as JSON with its
    /// `index`; `None` once `closed` was acknowledged. Events up to `after` are dropped.
    pub async fn next(&mut self, after: u64) -> Option<String> {
        while self.pending.front().is_some_and(|(i, _)| *i <= after) {
            self.pending.pop_front();
        }
        loop {
            if let Some((index, ev)) = self.pending.front() {
                let mut ev = ev.clone();
                if let Value::Object(m) = &mut ev {
                    m.insert("index".into(), Value::from(*index));
                }
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

    fn push(&mut self, event: Value) {
        self.pending.push_back((self.next_index, event));
        self.next_index += 1;
    }

    /// Appends the events `status` shows that were not derived yet, in order.
    fn derive(&mut self, status: &StreamStatus) {
        if status.gaps > self.gaps_seen {
            self.gaps_seen = status.gaps;
            if let Some(g) = &status.last_gap {
                self.push(json!({
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
            self.push(json!({
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
            self.push(json!({
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
