//! The adapter's view of its NATS client's events: the one event handler
//! ([`weir_service::nats::NatsEvents`], counting `weir_llm_nats_events_total{event}` and
//! `weir_llm_nats_connected`) plus the messages the endpoint loops took.
//!
//! A request dropped inside async-nats never reaches the adapter, so admission cannot
//! count it; async-nats emits one `Event::SlowConsumer(sid)` per dropped message
//! (`weir_llm_nats_events_total{event="slow_consumer"}`, `nats.dropped` in
//! `/v1/stats`). A caller whose request was dropped there gets no answer at all (a
//! timeout; see docs/llm-adapter.md, "Bursts").
//!
//! async-nats discards events when its 128-slot event channel is full, and a burst
//! that overflows a subscription emits thousands within microseconds: `dropped` is then
//! a lower bound (measured: 384 of 7,437 drops seen). The exact figure comes from the
//! client's own statistics: `not_taken` = messages the client received − messages the
//! endpoint loops took ([`AdapterEvents::took`]).
//!
//! A message the client could not read (a non-UTF-8 subject or reply subject, a broken
//! header block) does not drop the connection (the vendored async-nats skips it, or
//! delivers it without headers); it is counted
//! (`weir_llm_nats_events_total{event="malformed_message"}`, `nats.malformed`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use weir_service::nats::EventMetrics;

use crate::metrics as m;

/// Counters of one client's events and of the messages the endpoint loops took. Cheap
/// to clone (shared).
#[derive(Clone, Debug)]
pub struct AdapterEvents {
    events: weir_service::nats::NatsEvents,
    taken: Arc<AtomicU64>,
}

impl Default for AdapterEvents {
    fn default() -> Self {
        Self::new()
    }
}

/// A snapshot of [`AdapterEvents`], part of `/v1/stats` (the shared admin type).
pub use weir_protocol::admin::NatsClientStats as NatsEventsSnapshot;

impl AdapterEvents {
    /// Fresh counters.
    pub fn new() -> Self {
        Self {
            events: weir_service::nats::NatsEvents::new(EventMetrics {
                events_total: m::NATS_EVENTS_TOTAL,
                connected: m::NATS_CONNECTED,
            }),
            taken: Arc::default(),
        }
    }

    /// `opts` with the event handler installed.
    pub fn attach(&self, opts: async_nats::ConnectOptions) -> async_nats::ConnectOptions {
        self.events.attach(opts)
    }

    /// One message taken by an endpoint loop.
    pub(crate) fn took(&self) {
        self.taken.fetch_add(1, Ordering::Relaxed);
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

    /// The counters now (`in_messages` = 0: see [`AdapterEvents::snapshot_with`]).
    pub fn snapshot(&self) -> NatsEventsSnapshot {
        let c = self.events.counts();
        NatsEventsSnapshot {
            taken: self.taken.load(Ordering::Relaxed),
            in_messages: 0,
            not_taken: 0,
            dropped: c.slow_consumer,
            dropped_by_sid: c.slow_consumer_by_sid,
            disconnects: c.disconnects,
            malformed: c.malformed,
        }
    }

    #[cfg(test)]
    fn on_event(&self, event: &async_nats::Event) {
        self.events.record(event);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn slow_consumer_events_are_counted_per_sid_and_disconnects_apart() {
        let e = AdapterEvents::new();
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
