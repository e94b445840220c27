//! Counters of the NATS client's own events: messages the client dropped because a
//! subscription's channel was full (slow consumer), and disconnects.
//!
//! A request dropped inside async-nats never reaches the adapter, so admission cannot
//! count it; async-nats emits one `Event::SlowConsumer(sid)` per dropped message, and
//! this is where they are counted (`weir_llm_nats_dropped_total`, `nats.dropped` in
//! `/v1/stats`). A caller whose request was dropped there gets no answer at all (a
//! timeout; see docs/llm-adapter.md, "Bursts").
//!
//! async-nats discards events when its 128-slot event channel is full, and a burst
//! that overflows a subscription emits thousands within microseconds: `dropped` is then
//! a lower bound (measured: 384 of 7,437 drops seen). The exact figure comes from the
//! client's own statistics: `not_taken` = messages the client received − messages the
//! endpoint loops took ([`NatsEvents::took`]).
//!
//! Invariants:
//! - the event callback does only atomic adds and a map update under a short lock (no
//!   I/O per event): async-nats delivers events through a 128-slot channel and discards
//!   events when the callback falls behind, which would make the count low;
//! - a log line is written for the first drop of each subscription and then for every
//!   [`LOG_EVERY`]th, never per message.
//!
//! A message the client could not read (a non-UTF-8 subject or reply subject, a broken
//! header block) no longer drops the connection (the vendored async-nats skips it, or
//! delivers it without headers); it is counted here (`weir_llm_nats_malformed_total`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::metrics as m;
use crate::sync::locked;

/// One log line per this many dropped messages of one subscription.
pub const LOG_EVERY: u64 = 10_000;

/// Counters of one client's events. Cheap to clone (shared).
#[derive(Clone, Default)]
pub struct NatsEvents {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    taken: AtomicU64,
    dropped: AtomicU64,
    disconnects: AtomicU64,
    malformed: AtomicU64,
    by_sid: Mutex<BTreeMap<u64, u64>>,
}

/// A snapshot of [`NatsEvents`], part of `/v1/stats` (the shared admin type).
pub use weir_protocol::admin::NatsClientStats as NatsEventsSnapshot;

impl NatsEvents {
    /// Fresh counters.
    pub fn new() -> Self {
        Self::default()
    }

    /// `opts` with an event callback that counts into `self`, logs connection changes
    /// and keeps the `weir_llm_nats_connected` gauge.
    pub fn attach(&self, opts: async_nats::ConnectOptions) -> async_nats::ConnectOptions {
        let me = self.clone();
        opts.event_callback(move |event| {
            let me = me.clone();
            async move { me.on_event(&event) }
        })
    }

    fn on_event(&self, event: &async_nats::Event) {
        use async_nats::Event;
        match event {
            Event::SlowConsumer(sid) => {
                self.inner.dropped.fetch_add(1, Ordering::Relaxed);
                metrics::counter!(m::NATS_DROPPED_TOTAL).increment(1);
                let n = {
                    let mut map = locked(&self.inner.by_sid);
                    let n = map.entry(*sid).or_insert(0);
                    *n += 1;
                    *n
                };
                if n == 1 || n % LOG_EVERY == 0 {
                    tracing::warn!(
                        sid,
                        dropped = n,
                        "nats client dropped messages (slow consumer): callers get no answer"
                    );
                }
            }
            Event::Connected => {
                metrics::gauge!(m::NATS_CONNECTED).set(1.0);
                tracing::info!(event = %event, "nats connection event");
            }
            Event::Disconnected => {
                self.inner.disconnects.fetch_add(1, Ordering::Relaxed);
                metrics::counter!(m::NATS_DISCONNECTS_TOTAL).increment(1);
                metrics::gauge!(m::NATS_CONNECTED).set(0.0);
                tracing::warn!(event = %event, "nats connection event");
            }
            Event::ClientError(async_nats::ClientError::MalformedMessage(_)) => {
                self.inner.malformed.fetch_add(1, Ordering::Relaxed);
                metrics::counter!(m::NATS_MALFORMED_TOTAL).increment(1);
                static MALFORMED: weir_service::ratelimit::LogLimit =
                    weir_service::ratelimit::LogLimit::new(std::time::Duration::from_secs(10));
                if let Some(suppressed) = MALFORMED.allow() {
                    tracing::warn!(event = %event, suppressed, "nats message the client could not read");
                }
            }
            _ => tracing::info!(event = %event, "nats connection event"),
        }
    }

    /// One message taken by an endpoint loop.
    pub(crate) fn took(&self) {
        self.inner.taken.fetch_add(1, Ordering::Relaxed);
    }

    /// The counters now, with the client's received-message count.
    pub fn snapshot_with(&self, client: &async_nats::Client) -> NatsEventsSnapshot {
        let mut s = self.snapshot();
        s.in_messages = client.statistics().in_messages.load(Ordering::Relaxed);
        s.not_taken = s.in_messages.saturating_sub(s.taken);
        metrics::counter!(m::NATS_IN_MESSAGES_TOTAL).absolute(s.in_messages);
        metrics::counter!(m::INTAKE_TAKEN_TOTAL).absolute(s.taken);
        s
    }

    /// The counters now (`in_messages` = 0: see [`NatsEvents::snapshot_with`]).
    pub fn snapshot(&self) -> NatsEventsSnapshot {
        NatsEventsSnapshot {
            taken: self.inner.taken.load(Ordering::Relaxed),
            in_messages: 0,
            not_taken: 0,
            dropped: self.inner.dropped.load(Ordering::Relaxed),
            dropped_by_sid: locked(&self.inner.by_sid).clone(),
            disconnects: self.inner.disconnects.load(Ordering::Relaxed),
            malformed: self.inner.malformed.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slow_consumer_events_are_counted_per_sid_and_disconnects_apart() {
        let e = NatsEvents::new();
        for sid in [3, 3, 5] {
            e.on_event(&async_nats::Event::SlowConsumer(sid));
        }
        e.on_event(&async_nats::Event::Disconnected);
        e.on_event(&async_nats::Event::Connected);
        e.on_event(&async_nats::Event::ClientError(
            async_nats::ClientError::MalformedMessage("header block".into()),
        ));
        let s = e.snapshot();
        assert_eq!(s.malformed, 1);
        assert_eq!(s.dropped, 3);
        assert_eq!(s.dropped_by_sid, BTreeMap::from([(3, 2), (5, 1)]));
        assert_eq!(s.disconnects, 1);
    }
}
