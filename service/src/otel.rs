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
//! [`traceparent_of`] and [`set_remote_parent`] (in [`crate::trace_context`], which a
//! caller can use without the SDK) are the only places that convert between the wire's
//! `TraceContext` and OpenTelemetry's.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::Layer;
use tracing_subscriber::registry::LookupSpan;

use crate::config::{ConfigError, ConfigErrorKind};

pub use crate::trace_context::{set_remote_parent, traceparent_of};

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

/// The OTLP layer and its guard, when [`enabled_by_env`]; `Ok(None)` otherwise. A
/// refusal names the variable: `OTEL_EXPORTER_OTLP_ENDPOINT` when the exporter cannot
/// be built from the `OTEL_*` variables, `WEIR_OTEL_FILTER` when its directive is not one.
pub fn layer_from_env<S>() -> Result<Option<(impl Layer<S>, OtelGuard)>, ConfigError>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    if !enabled_by_env() {
        return Ok(None);
    }
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
        .map_err(|e| {
            ConfigError::new(
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                ConfigErrorKind::Invalid,
                format!("no OTLP exporter: {e}"),
            )
        })?;
    let mut resource = Resource::builder();
    if std::env::var("OTEL_SERVICE_NAME").is_err() {
        resource = resource.with_service_name(default_service_name());
    }
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build();
    let filter = std::env::var("WEIR_OTEL_FILTER").unwrap_or_else(|_| DEFAULT_FILTER.into());
    let filter = tracing_subscriber::EnvFilter::try_new(&filter).map_err(|e| {
        ConfigError::new(
            "WEIR_OTEL_FILTER",
            ConfigErrorKind::Invalid,
            format!("{filter:?} is not a filter directive: {e}"),
        )
    })?;
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
