//! OpenTelemetry traces over OTLP (feature `otel`, off by default).
//!
//! [`crate::logging::init`] adds a `tracing-opentelemetry` layer when the standard
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set and
//! `OTEL_SDK_DISABLED` is not `true`: spans (and the events inside them, as span
//! events) are batched and POSTed as OTLP/HTTP protobuf to `<endpoint>/v1/traces` by
//! the SDK's own background thread. `OTEL_SERVICE_NAME` names the service (default: the
//! executable's name); the SDK reads the other `OTEL_*` variables itself (headers,
//! timeout, `OTEL_RESOURCE_ATTRIBUTES`, the batch sizes).
//!
//! What reaches the collector is filtered separately from the log lines:
//! `WEIR_OTEL_FILTER` (an `EnvFilter` directive, default [`DEFAULT_FILTER`]), so that
//! the per-request DEBUG trace events become span events without printing them.
//!
//! Invariants: exporting never blocks a request (the batch processor drops spans when
//! its queue is full, counted by the SDK, never waited for); the [`OtelGuard`] flushes
//! and shuts the exporter down exactly once, when it is dropped at the end of `main`.
//! [`traceparent_of`] and [`set_remote_parent`] are the only places that convert
//! between the wire's [`TraceContext`] and OpenTelemetry's.

use opentelemetry::trace::{
    SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState, TracerProvider as _,
};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::Layer;
use tracing_subscriber::registry::LookupSpan;
use weir_protocol::llm::headers::{TraceContext, TraceParent};

/// What reaches the collector unless `WEIR_OTEL_FILTER` says otherwise: INFO spans and
/// events, plus the adapter's per-request trace events (DEBUG) as span events.
pub const DEFAULT_FILTER: &str = "info,weir_llm_adapter::trace=debug";

/// Flushes and shuts the exporter down when dropped (keep it until `main` returns).
#[must_use = "dropping the guard shuts the exporter down"]
pub struct OtelGuard {
    provider: SdkTracerProvider,
}

impl Drop for OtelGuard {
    fn drop(&mut self) {
        // Waits (bounded by the SDK's export timeout) for the last batch to be sent.
        if let Err(e) = self.provider.shutdown() {
            eprintln!("opentelemetry: flush at shutdown failed: {e}");
        }
    }
}

/// Whether the environment asks for export: an OTLP endpoint is set and the SDK is not
/// disabled.
pub fn enabled_by_env() -> bool {
    let set = |k: &str| std::env::var(k).is_ok_and(|v| !v.trim().is_empty());
    let disabled =
        std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.trim().eq_ignore_ascii_case("true"));
    !disabled && (set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
}

/// The OTLP layer and its guard, when [`enabled_by_env`]; `Ok(None)` otherwise.
pub fn layer_from_env<S>() -> Result<Option<(impl Layer<S>, OtelGuard)>, String>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    if !enabled_by_env() {
        return Ok(None);
    }
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
        .map_err(|e| format!("OTLP exporter: {e}"))?;
    let mut resource = Resource::builder();
    if std::env::var("OTEL_SERVICE_NAME").is_err() {
        resource = resource.with_service_name(default_service_name());
    }
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build();
    let filter = std::env::var("WEIR_OTEL_FILTER").unwrap_or_else(|_| DEFAULT_FILTER.into());
    let filter = tracing_subscriber::EnvFilter::try_new(&filter)
        .map_err(|e| format!("WEIR_OTEL_FILTER {filter:?}: {e}"))?;
    Ok(Some((
        layer(&provider).with_filter(filter),
        OtelGuard { provider },
    )))
}

/// A `tracing-opentelemetry` layer exporting through `provider` (tests pass one with an
/// in-memory exporter).
pub fn layer<S>(provider: &SdkTracerProvider) -> impl Layer<S> + use<S>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    tracing_opentelemetry::layer().with_tracer(provider.tracer("weir"))
}

fn default_service_name() -> String {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "weir".into())
}

/// The W3C context of `span`, to send on; `None` when no OpenTelemetry layer records it
/// (export off) — then there is no span of ours to name as a parent.
pub fn traceparent_of(span: &tracing::Span) -> Option<TraceContext> {
    let cx = span.context();
    let sc = cx.span().span_context().clone();
    if !sc.is_valid() {
        return None;
    }
    let state = sc.trace_state().header();
    Some(TraceContext {
        parent: TraceParent {
            trace_id: sc.trace_id().to_bytes(),
            parent_id: sc.span_id().to_bytes(),
            flags: sc.trace_flags().to_u8(),
        },
        state: (!state.is_empty()).then_some(state),
    })
}

/// Makes `span` a child of the remote `parent` (a caller's `traceparent`). Must be
/// called before `span` is first entered; a later call, or one without an
/// OpenTelemetry layer, changes nothing. A `tracestate` the SDK cannot parse is
/// dropped, the parent kept.
pub fn set_remote_parent(span: &tracing::Span, parent: &TraceContext) {
    let state = parent
        .state
        .as_deref()
        .and_then(|s| s.parse::<TraceState>().ok())
        .unwrap_or_default();
    let sc = SpanContext::new(
        TraceId::from_bytes(parent.parent.trace_id),
        SpanId::from_bytes(parent.parent.parent_id),
        TraceFlags::new(parent.parent.flags),
        true,
        state,
    );
    let cx = opentelemetry::Context::new().with_remote_span_context(sc);
    let _ = span.set_parent(cx);
}
