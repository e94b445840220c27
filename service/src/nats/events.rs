//! The one handler of a NATS client's own events (connected, disconnected, slow
//! consumer, a message the client could not read, server and client errors), for every
//! weir process: the same metric scheme, the same counts, the same log lines.
//!
//! Metrics, with the names the process passes in ([`EventMetrics`]):
//! - `<prefix>_nats_events_total{event}`: every event, `event` = [`super::event_label`];
//! - `<prefix>_nats_connected`: 1 after `connected`, 0 after `disconnected` or `closed`.
//!
//! Invariants:
//! - the callback does only atomic adds, a map update under a short lock and
//!   rate-limited logging (no I/O per event): async-nats delivers events through a
//!   128-slot channel and discards events when the callback falls behind, so a slow
//!   callback would make every count low;
//! - async-nats emits one `SlowConsumer(sid)` per dropped message: a log line is
//!   written for the first drop of each subscription and then for every
//!   [`LOG_EVERY`]th, never per message; a burst that overflows the event channel makes
//!   the slow-consumer count a lower bound;
//! - a malformed message (a non-UTF-8 subject or reply subject: skipped; a broken
//!   header block: delivered without headers) does not drop the connection (the
//!   vendored async-nats, vendor/README.md): it is counted and logged at most once per
//!   10 s.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::{ClientError, ConnectOptions, Event};

use crate::ratelimit::LogLimit;
use crate::sync::locked;

/// One log line per this many dropped messages of one subscription.
pub const LOG_EVERY: u64 = 10_000;

/// The metric label of [`EventMetrics::events_total`].
pub const LABEL_EVENT: &str = "event";

/// The names a process counts its NATS client's events under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventMetrics {
    /// Counter, label `event`: every event.
    pub events_total: &'static str,
    /// Gauge: 1 while connected, 0 after a disconnect or close.
    pub connected: &'static str,
}

/// What a slow-consumer event also does in the process that embeds the handler (the
/// consumer core tells its own listeners).
type SlowConsumerHook = Arc<dyn Fn(u64) + Send + Sync>;

/// The handler: counts, metrics and logs of one client's events. Cheap to clone
/// (shared).
#[derive(Clone)]
pub struct NatsEvents {
    metrics: EventMetrics,
    counts: Arc<Counts>,
    on_slow_consumer: Option<SlowConsumerHook>,
}

impl fmt::Debug for NatsEvents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsEvents")
            .field("metrics", &self.metrics)
            .field("counts", &self.counts())
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Counts {
    slow_consumer: AtomicU64,
    disconnects: AtomicU64,
    malformed: AtomicU64,
    by_sid: Mutex<BTreeMap<u64, u64>>,
}

/// The counts so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventCounts {
    /// Slow-consumer events (messages the client dropped), all subscriptions.
    pub slow_consumer: u64,
    /// Slow-consumer events by subscription id.
    pub slow_consumer_by_sid: BTreeMap<u64, u64>,
    /// Connections lost.
    pub disconnects: u64,
    /// Messages the client could not read (skipped, or delivered without headers).
    pub malformed: u64,
}

impl NatsEvents {
    /// A handler counting under `metrics`.
    pub fn new(metrics: EventMetrics) -> Self {
        Self {
            metrics,
            counts: Arc::default(),
            on_slow_consumer: None,
        }
    }

    /// Also calls `hook(sid)` on every slow-consumer event (after counting it).
    #[must_use]
    pub fn on_slow_consumer(mut self, hook: impl Fn(u64) + Send + Sync + 'static) -> Self {
        self.on_slow_consumer = Some(Arc::new(hook));
        self
    }

    /// `opts` with this handler as the event callback.
    pub fn attach(&self, opts: ConnectOptions) -> ConnectOptions {
        let me = self.clone();
        opts.event_callback(move |event| {
            let me = me.clone();
            async move { me.record(&event) }
        })
    }

    /// Handles one event: counter, gauge, counts, log line.
    pub fn record(&self, event: &Event) {
        let label = super::event_label(event);
        metrics::counter!(self.metrics.events_total, LABEL_EVENT => label).increment(1);
        match event {
            Event::Connected => {
                metrics::gauge!(self.metrics.connected).set(1.0);
                tracing::info!(event = label, "NATS connected");
            }
            Event::Disconnected => {
                self.counts.disconnects.fetch_add(1, Ordering::Relaxed);
                metrics::gauge!(self.metrics.connected).set(0.0);
                tracing::warn!(event = label, "NATS disconnected; the client reconnects");
            }
            Event::Closed => {
                metrics::gauge!(self.metrics.connected).set(0.0);
                tracing::error!(event = label, "NATS connection closed");
            }
            Event::SlowConsumer(sid) => self.slow_consumer(*sid),
            Event::ClientError(ClientError::MalformedMessage(_)) => {
                self.counts.malformed.fetch_add(1, Ordering::Relaxed);
                static MALFORMED: LogLimit = LogLimit::new(Duration::from_secs(10));
                if let Some(suppressed) = MALFORMED.allow() {
                    tracing::warn!(event = %event, suppressed, "NATS message the client could not read");
                }
            }
            other => tracing::warn!(event = label, detail = %other, "NATS event"),
        }
    }

    fn slow_consumer(&self, sid: u64) {
        self.counts.slow_consumer.fetch_add(1, Ordering::Relaxed);
        let n = {
            let mut map = locked(&self.counts.by_sid);
            let n = map.entry(sid).or_insert(0);
            *n += 1;
            *n
        };
        if n == 1 || n % LOG_EVERY == 0 {
            tracing::warn!(
                sid,
                dropped = n,
                "NATS client dropped messages (slow consumer)"
            );
        }
        if let Some(hook) = &self.on_slow_consumer {
            hook(sid);
        }
    }

    /// The counts so far.
    pub fn counts(&self) -> EventCounts {
        EventCounts {
            slow_consumer: self.counts.slow_consumer.load(Ordering::Relaxed),
            slow_consumer_by_sid: locked(&self.counts.by_sid).clone(),
            disconnects: self.counts.disconnects.load(Ordering::Relaxed),
            malformed: self.counts.malformed.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    const NAMES: EventMetrics = EventMetrics {
        events_total: "weir_test_nats_events_total",
        connected: "weir_test_nats_connected",
    };

    #[test]
    fn every_event_is_counted_by_label_and_the_kinds_apart() {
        let hooked = Arc::new(AtomicUsize::new(0));
        let h = Arc::clone(&hooked);
        let events = NatsEvents::new(NAMES).on_slow_consumer(move |_| {
            h.fetch_add(1, Ordering::Relaxed);
        });
        let recorder = metrics_util::debugging::DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        metrics::with_local_recorder(&recorder, || {
            for sid in [3, 3, 5] {
                events.record(&Event::SlowConsumer(sid));
            }
            events.record(&Event::Disconnected);
            events.record(&Event::Connected);
            events.record(&Event::ClientError(ClientError::MalformedMessage(
                "header block".into(),
            )));
        });
        let c = events.counts();
        assert_eq!(c.slow_consumer, 3);
        assert_eq!(c.slow_consumer_by_sid, BTreeMap::from([(3, 2), (5, 1)]));
        assert_eq!(c.disconnects, 1);
        assert_eq!(c.malformed, 1);
        assert_eq!(hooked.load(Ordering::Relaxed), 3);
        let mut by_label = BTreeMap::new();
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            if key.key().name() == NAMES.events_total {
                let label = key.key().labels().next().map(|l| l.value().to_owned());
                if let metrics_util::debugging::DebugValue::Counter(n) = value {
                    by_label.insert(label.unwrap_or_default(), n);
                }
            }
        }
        assert_eq!(by_label["slow_consumer"], 3);
        assert_eq!(by_label["disconnected"], 1);
        assert_eq!(by_label["connected"], 1);
        assert_eq!(by_label["malformed_message"], 1);
    }
}
