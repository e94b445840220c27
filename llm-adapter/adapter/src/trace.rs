//! Per-request trace events ([`TraceKind`]; docs/llm-adapter.md, "Trace events").
//!
//! Every request has one `llm_request` span ([`request_span`]), opened when the request
//! is decoded and closed when its last holder (the queue entry, the running job) lets
//! go, so it covers queueing and inference. The events are emitted *inside* that span
//! (explicit parent), which `tracing-opentelemetry` exports as span events (feature
//! `otel`); the backend call runs in a child span `backend_call`.
//!
//! Sinks: `tracing` events (target [`TARGET`], level DEBUG; span events with `otel`)
//! and, optionally, a bounded channel drained by a task that publishes each event as
//! JSON on a NATS subject (`trace.subject`).
//!
//! Trace context (W3C, [`weir_protocol::llm::headers::TraceContext`]): a caller's
//! valid `traceparent` becomes the remote parent of `llm_request` (feature `otel`); a
//! malformed one is ignored. Without a `traceparent`, the deployed envelope's
//! `trace_id`, when it is 32 hex digits, is the trace `llm_request` joins (under a
//! parent span id derived from it, which no exporter has: tools show `llm_request` as
//! the entry of that trace). The envelope's `trace_id` is recorded on the span as
//! `envelope.trace_id` either way. Backends get [`outgoing`]: the `backend_call`
//! span's context with `otel` and an exporter on; otherwise the caller's
//! `traceparent` unchanged (so a backend that traces still joins the caller's trace).
//!
//! Invariants: emitting never blocks and never allocates when no sink is enabled (the
//! event is built lazily); an event that does not fit the channel is dropped and
//! counted ([`Tracer::dropped`], metric `weir_llm_trace_events_dropped_total`), never waited
//! for — tracing must not slow admission down. Request bodies never appear in events.
//! Trace-context headers are network input: parsed by total functions, never a refusal.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::mpsc;
use tracing::Span;
use tracing::field::Empty;
use weir_protocol::WireName;
use weir_protocol::llm::headers::{self as h, TraceContext};

use crate::metrics as m;

/// The `tracing` target of trace events.
pub const TARGET: &str = "weir_llm_adapter::trace";

/// What happened; its snake_case name is [`WireName::as_str`].
#[derive(strum::IntoStaticStr, strum::Display, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TraceKind {
    /// Accepted into the queue.
    #[default]
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

/// One trace event.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
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
            t_ms: ms(since_received),
            ..Self::default()
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

    fn new(log: bool, tx: Option<mpsc::Sender<TraceEvent>>) -> Self {
        let dropped = AtomicU64::new(0);
        let inner = Arc::new(TracerInner { log, tx, dropped });
        Self { inner }
    }

    /// `tracing` events only (when `log`).
    pub fn logging(log: bool) -> Self {
        Self::new(log, None)
    }

    /// `tracing` events (when `log`) and a bounded channel of `capacity` events; the
    /// receiver is drained by the NATS trace publisher or by a test.
    pub fn with_channel(log: bool, capacity: usize) -> (Self, mpsc::Receiver<TraceEvent>) {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        (Self::new(log, Some(tx)), rx)
    }

    fn log_enabled(&self) -> bool {
        self.inner.log && tracing::enabled!(target: TARGET, tracing::Level::DEBUG)
    }

    /// Whether any sink wants events (callers skip building them otherwise).
    pub fn enabled(&self) -> bool {
        self.inner.tx.is_some() || self.log_enabled()
    }

    /// Emits the event built by `make` if a sink is enabled, inside `span` (the
    /// request's `llm_request` span).
    pub fn emit(&self, span: &Span, make: impl FnOnce() -> TraceEvent) {
        if !self.enabled() {
            return;
        }
        let ev = make();
        if self.log_enabled() {
            tracing::debug!(
                target: TARGET,
                parent: span,
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
                // The message names the event: the span event's name once exported.
                "{}",
                ev.event.as_str(),
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

/// Opens the `llm_request` span of a request received now: child of the caller's
/// `traceparent` (`remote`), else of the envelope's W3C `trace_id` (feature `otel`;
/// without it the span is only local). `id` and `queue_ms` are recorded later.
pub fn request_span(
    remote: Option<&TraceContext>,
    request_id: Option<&str>,
    session: Option<&str>,
    envelope_trace_id: Option<&str>,
) -> Span {
    // A bounded, printable value only: the envelope is network input.
    let envelope_trace_id = envelope_trace_id.and_then(|t| h::parse_id("trace_id", t).ok());
    let span = tracing::info_span!(
        "llm_request",
        id = Empty,
        request_id = request_id.unwrap_or(""),
        session = session.unwrap_or(""),
        queue_ms = Empty,
        envelope.trace_id = envelope_trace_id,
    );
    #[cfg(feature = "otel")]
    {
        let from_envelope = || {
            let trace_id = h::parse_trace_id(envelope_trace_id?)?;
            Some(TraceContext {
                parent: h::TraceParent {
                    trace_id,
                    parent_id: envelope_parent_id(&trace_id),
                    flags: 1,
                },
                state: None,
            })
        };
        if let Some(parent) = remote.cloned().or_else(from_envelope) {
            weir_service::otel::set_remote_parent(&span, &parent);
        }
    }
    #[cfg(not(feature = "otel"))]
    let _ = remote;
    span
}

/// The parent span id a trace id taken from the envelope is given: its last 8 bytes
/// (its first 8 if those are zero; a valid trace id is never all zero), so every
/// request of one envelope trace hangs under the same (absent) parent.
#[cfg(any(feature = "otel", test))]
fn envelope_parent_id(trace_id: &[u8; 16]) -> [u8; 8] {
    let (hi, lo) = trace_id.split_at(8);
    let pick = if lo.iter().any(|&b| b != 0) { lo } else { hi };
    let mut id = [0u8; 8];
    id.copy_from_slice(pick);
    id
}

/// The trace context a backend call sends on: the context of `span` (the
/// `backend_call` span) when OpenTelemetry records it, else the caller's own.
pub fn outgoing(span: &Span, incoming: Option<&TraceContext>) -> Option<TraceContext> {
    #[cfg(feature = "otel")]
    if let Some(cx) = weir_service::otel::traceparent_of(span) {
        return Some(cx);
    }
    #[cfg(not(feature = "otel"))]
    let _ = span;
    incoming.cloned()
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
        t.emit(&Span::none(), || unreachable!("must not be built"));
    }

    #[test]
    fn channel_overflow_is_counted_not_blocking() {
        let (t, mut rx) = Tracer::with_channel(false, 2);
        for i in 0..5 {
            t.emit(&Span::none(), || {
                TraceEvent::new(TraceKind::Queued, i, Duration::ZERO)
            });
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

    #[test]
    fn without_an_exporter_the_callers_context_is_passed_on_unchanged() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let incoming = TraceContext::from_headers(Some(tp), Some("v=1")).expect("valid");
        let span = request_span(Some(&incoming), Some("r"), None, Some("t 1"));
        assert_eq!(outgoing(&span, Some(&incoming)), Some(incoming));
        assert_eq!(outgoing(&span, None), None);
    }

    #[test]
    fn an_envelope_trace_id_gets_a_non_zero_parent_id() {
        let mut id = [0u8; 16];
        id[15] = 7;
        assert_eq!(envelope_parent_id(&id), [0, 0, 0, 0, 0, 0, 0, 7]);
        let mut id = [0u8; 16];
        id[0] = 9;
        assert_eq!(envelope_parent_id(&id), [9, 0, 0, 0, 0, 0, 0, 0]);
    }
}
