//! The W3C trace context between the wire and OpenTelemetry (feature `trace-context`:
//! the `opentelemetry` API and `tracing-opentelemetry`, no SDK or exporter, so a caller
//! such as `weir-llm-client` can send its span's context without exporting anything).
//!
//! Invariant: these two functions are the only places that convert between the wire's
//! [`TraceContext`] (`traceparent`/`tracestate` headers) and OpenTelemetry's
//! `SpanContext`; a context that is not valid is never sent.

use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use weir_protocol::llm::headers::{TraceContext, TraceParent};

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
