//! Per-request trace events.
//!
//! Request lifecycle: `queued` (accepted into the queue), `admitted` (passed session
//! order and key limits, waiting for a worker), `started` (backend call begins),
//! `finished` (answered, with the code and timings), plus `joined` / `cached` for
//! idempotent retries. Slots (session cap, session order, per-key limits):
//! `slot_acquired`, `slot_waiting`, `slot_granted` (after waiting, with `waited_ms`),
//! `slot_released`, `slot_busy` (refused, or counted as would-reject in shadow mode).
//!
//! Sinks: `tracing` events (target [`TARGET`], level DEBUG) and, optionally, a bounded
//! channel drained by a task that publishes each event as JSON on a NATS subject.
//!
//! Invariants: emitting never blocks and never allocates when no sink is enabled (the
//! event is built lazily); an event that does not fit the channel is dropped and
//! counted ([`Tracer::dropped`], metric `weir_llm_trace_events_dropped_total`), never waited
//! for — tracing must not slow admission down. Request bodies never appear in events.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::mpsc;

use crate::metrics as m;

/// The `tracing` target of trace events.
pub const TARGET: &str = "weir_llm_adapter::trace";

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TraceKind {
    /// Accepted into the queue.
    Queued,
    /// Passed every gate; waiting for a worker.
    Admitted,
    /// The backend call started.
    Started,
    /// Answered (any outcome).
    Finished,
    /// Joined an identical request (same request id).
    Joined,
    /// Answered from the completion cache.
    Cached,
    /// A slot was taken without waiting.
    SlotAcquired,
    /// Waiting for a slot.
    SlotWaiting,
    /// A slot was granted after waiting.
    SlotGranted,
    /// A slot was given back.
    SlotReleased,
    /// A slot was not available and the request was refused (or would have been).
    SlotBusy,
}

impl TraceKind {
    /// The snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Admitted => "admitted",
            Self::Started => "started",
            Self::Finished => "finished",
            Self::Joined => "joined",
            Self::Cached => "cached",
            Self::SlotAcquired => "slot_acquired",
            Self::SlotWaiting => "slot_waiting",
            Self::SlotGranted => "slot_granted",
            Self::SlotReleased => "slot_released",
            Self::SlotBusy => "slot_busy",
        }
    }
}

/// One trace event.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TraceEvent {
    /// What happened.
    pub event: TraceKind,
    /// The adapter's internal id of the request (unique per process).
    pub id: u64,
    /// The caller's request id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// The session.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// For slot events: `session_cap`, `session_order` or a limit name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// For slot events: the key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Milliseconds since the adapter received the request.
    pub t_ms: f64,
    /// For `slot_granted`, `finished`: how long the request waited.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waited_ms: Option<f64>,
    /// For `finished`: `ok` or the error code.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome: Option<&'static str>,
    /// For `finished`: backend call duration.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inference_ms: Option<f64>,
    /// `true` when the event is a shadow-mode observation (nothing was enforced).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub shadow: bool,
}

impl TraceEvent {
    /// A bare event; the other fields are filled by the caller.
    pub fn new(event: TraceKind, id: u64, since_received: Duration) -> Self {
        Self {
            event,
            id,
            request_id: None,
            session: None,
            rule: None,
            key: None,
            t_ms: ms(since_received),
            waited_ms: None,
            outcome: None,
            inference_ms: None,
            shadow: false,
        }
    }
}

/// Milliseconds as a float, for events and stats.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Where trace events go. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Tracer {
    inner: Arc<TracerInner>,
}

#[derive(Debug, Default)]
struct TracerInner {
    log: bool,
    tx: Option<mpsc::Sender<TraceEvent>>,
    dropped: AtomicU64,
}

impl Tracer {
    /// No sink: events are never built.
    pub fn disabled() -> Self {
        Self::default()
    }

    /// `tracing` events only (when `log`).
    pub fn logging(log: bool) -> Self {
        Self {
            inner: Arc::new(TracerInner {
                log,
                tx: None,
                dropped: AtomicU64::new(0),
            }),
        }
    }

    /// `tracing` events (when `log`) and a bounded channel of `capacity` events; the
    /// receiver is drained by the NATS trace publisher or by a test.
    pub fn with_channel(log: bool, capacity: usize) -> (Self, mpsc::Receiver<TraceEvent>) {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        (
            Self {
                inner: Arc::new(TracerInner {
                    log,
                    tx: Some(tx),
                    dropped: AtomicU64::new(0),
                }),
            },
            rx,
        )
    }

    fn log_enabled(&self) -> bool {
        self.inner.log && tracing::enabled!(target: TARGET, tracing::Level::DEBUG)
    }

    /// Whether any sink wants events (callers skip building them otherwise).
    pub fn enabled(&self) -> bool {
        self.inner.tx.is_some() || self.log_enabled()
    }

    /// Emits the event built by `make` if a sink is enabled.
    pub fn emit(&self, make: impl FnOnce() -> TraceEvent) {
        if !self.enabled() {
            return;
        }
        let ev = make();
        if self.log_enabled() {
            tracing::debug!(
                target: TARGET,
                event = ev.event.as_str(),
                id = ev.id,
                request_id = ev.request_id.as_deref(),
                session = ev.session.as_deref(),
                rule = ev.rule.as_deref(),
                key = ev.key.as_deref(),
                t_ms = ev.t_ms,
                waited_ms = ev.waited_ms,
                outcome = ev.outcome,
                inference_ms = ev.inference_ms,
                shadow = ev.shadow,
            );
        }
        if let Some(tx) = &self.inner.tx
            && tx.try_send(ev).is_err()
        {
            self.inner.dropped.fetch_add(1, Ordering::Relaxed);
            metrics::counter!(m::TRACE_DROPPED_TOTAL).increment(1);
        }
    }

    /// Events dropped because the channel was full or closed.
    pub fn dropped(&self) -> u64 {
        self.inner.dropped.load(Ordering::Relaxed)
    }
}

/// Publishes trace events as JSON on `subject` until the channel closes. Each publish
/// is bounded by `publish_timeout`; an event that cannot be published is dropped and
/// counted.
pub async fn publish_events(
    client: async_nats::Client,
    subject: String,
    mut rx: mpsc::Receiver<TraceEvent>,
    publish_timeout: Duration,
) {
    while let Some(ev) = rx.recv().await {
        let Ok(body) = serde_json::to_vec(&ev) else {
            continue;
        };
        let sent = tokio::time::timeout(
            publish_timeout,
            client.publish(subject.clone(), body.into()),
        )
        .await;
        if !matches!(sent, Ok(Ok(()))) {
            metrics::counter!(m::TRACE_DROPPED_TOTAL).increment(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disabled_tracer_never_builds_events() {
        let t = Tracer::disabled();
        assert!(!t.enabled());
        t.emit(|| unreachable!("must not be built"));
    }

    #[test]
    fn channel_overflow_is_counted_not_blocking() {
        let (t, mut rx) = Tracer::with_channel(false, 2);
        for i in 0..5 {
            t.emit(|| TraceEvent::new(TraceKind::Queued, i, Duration::ZERO));
        }
        assert_eq!(t.dropped(), 3);
        assert_eq!(rx.try_recv().map(|e| e.id).ok(), Some(0));
        let json = serde_json::to_value(TraceEvent::new(
            TraceKind::SlotBusy,
            7,
            Duration::from_millis(3),
        ))
        .expect("serialises");
        assert_eq!(json["event"], "slot_busy");
        assert_eq!(json["t_ms"], 3.0);
        assert!(json.get("shadow").is_none());
    }
}
