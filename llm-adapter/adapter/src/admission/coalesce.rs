//! Coalesces the pieces of a streamed reply into `chunk` messages, to bound the message
//! rate per stream. Pure: time comes in as arguments.
//!
//! Rules (a reader must not break them):
//! - the first piece after a quiet period goes at once (time to first token is not
//!   delayed); after a message, the next one waits until `interval` has passed since it,
//!   so a stream sends at most one message per `interval` — unless `max_bytes` are
//!   pending, which go at once;
//! - a message ends at the last SSE event boundary (`\n\n` or `\r\n\r\n`) of what is
//!   pending, so every message carries whole events, unchanged; a body without a
//!   boundary goes once `max_bytes` are pending, or at the end;
//! - no message is larger than `max_message` (the NATS payload less header room);
//! - at the end everything pending goes; nothing is dropped or reordered.

use bytes::{Bytes, BytesMut};
use tokio::time::{Duration, Instant};

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Coalescer {
    buf: BytesMut,
    interval: Duration,
    max_bytes: usize,
    max_message: usize,
    last_flush: Option<Instant>,
    /// When the oldest pending byte arrived (or the rest of a cut message was left).
    since: Option<Instant>,
}

/// End of the last SSE event boundary in `b` (the index after it), if any.
fn last_boundary(b: &[u8]) -> Option<usize> {
    let lf = b.windows(2).rposition(|w| w == b"\n\n").map(|i| i + 2);
    let crlf = b.windows(4).rposition(|w| w == b"\r\n\r\n").map(|i| i + 4);
    lf.max(crlf)
}

impl Coalescer {
    pub(crate) fn new(interval: Duration, max_bytes: usize, max_message: usize) -> Self {
        Self {
            buf: BytesMut::new(),
            interval,
            max_bytes: max_bytes.max(1),
            max_message: max_message.max(1),
            last_flush: None,
            since: None,
        }
    }

    /// Adds a piece received at `now`.
    pub(crate) fn push(&mut self, piece: &[u8], now: Instant) {
        if piece.is_empty() {
            return;
        }
        if self.buf.is_empty() {
            self.since = Some(now);
        }
        self.buf.extend_from_slice(piece);
    }

    /// Bytes pending.
    #[cfg(test)]
    pub(crate) fn pending(&self) -> usize {
        self.buf.len()
    }

    /// When the pending bytes are due by time (`None`: nothing pending).
    pub(crate) fn due_at(&self) -> Option<Instant> {
        let since = self.since.filter(|_| !self.buf.is_empty())?;
        Some(match self.last_flush {
            None => since,
            Some(l) => (l + self.interval).max(since),
        })
    }

    /// The next message, if one is due at `now` (`end`: the reply is complete, take
    /// everything). Call until `None`.
    pub(crate) fn take(&mut self, now: Instant, end: bool) -> Option<Bytes> {
        if self.buf.is_empty() {
            return None;
        }
        let by_size = self.buf.len() >= self.max_bytes;
        let by_time = self.due_at().is_some_and(|at| now >= at);
        if !(end || by_size || by_time) {
            return None;
        }
        let cut = if end {
            self.buf.len()
        } else {
            match last_boundary(&self.buf) {
                Some(b) => b,
                None if by_size => self.buf.len(),
                // Time is due but the only event is incomplete: wait for its end (or
                // for `max_bytes`).
                None => return None,
            }
        };
        let cut = cut.min(self.max_message);
        let msg = self.buf.split_to(cut).freeze();
        self.last_flush = Some(now);
        self.since = (!self.buf.is_empty()).then_some(now);
        Some(msg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(i: usize) -> String {
        format!("data: {{\"i\":{i}}}\n\n")
    }

    #[tokio::test(start_paused = true)]
    async fn first_piece_goes_at_once_then_one_message_per_interval() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut c = Coalescer::new(ms(20), 4096, 1 << 20);
        c.push(ev(0).as_bytes(), t0);
        assert_eq!(c.take(t0, false).as_deref(), Some(ev(0).as_bytes()));
        // Tokens every 2 ms: nothing goes before 20 ms after the last message.
        for i in 1..=9 {
            let now = t0 + ms(2 * i as u64);
            c.push(ev(i).as_bytes(), now);
            assert_eq!(c.take(now, false), None, "{i}");
        }
        assert_eq!(c.due_at(), Some(t0 + ms(20)));
        let m = c.take(t0 + ms(20), false).expect("due");
        let want: String = (1..=9).map(ev).collect();
        assert_eq!(&m[..], want.as_bytes(), "whole events, in order, unchanged");
        assert_eq!(c.pending(), 0);
        assert_eq!(c.due_at(), None);
        // After a quiet period the next piece goes at once again.
        c.push(ev(10).as_bytes(), t0 + ms(100));
        assert!(c.take(t0 + ms(100), false).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn messages_end_at_event_boundaries_and_respect_the_size_bounds() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(Duration::from_millis(20), 64, 100);
        c.push(b"data: a\n\ndata: partial", t0);
        assert_eq!(c.take(t0, false).as_deref(), Some(&b"data: a\n\n"[..]));
        // Time due, but the pending event is incomplete: wait.
        let t1 = t0 + Duration::from_millis(30);
        assert_eq!(c.take(t1, false), None);
        c.push(b" end\r\n\r\n", t1);
        assert_eq!(
            c.take(t1, false).as_deref(),
            Some(&b"data: partial end\r\n\r\n"[..])
        );
        // max_bytes pending go at once, even without a boundary, cut at max_message.
        let big = vec![b'x'; 250];
        c.push(&big, t1);
        let mut got = Vec::new();
        while let Some(m) = c.take(t1, false) {
            assert!(m.len() <= 100);
            got.extend_from_slice(&m);
        }
        // 250 → 100 + 100 by size; the last 50 (< max_bytes, no boundary) wait ...
        assert_eq!(got.len(), 200);
        assert_eq!(c.pending(), 50);
        // ... until the end, which takes everything.
        got.extend_from_slice(&c.take(t1, true).expect("end"));
        assert_eq!(got, big);
        assert_eq!(c.take(t1, true), None);
    }
}
