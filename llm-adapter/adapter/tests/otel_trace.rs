//! One OpenTelemetry trace from caller to backend (feature `otel`): a caller span →
//! `weir-llm-client` request (`traceparent` header) → the adapter's `llm_request` span
//! (with the trace events as span events) → its `backend_call` span → a NATS service
//! behind the NATS backend, which extracts the `traceparent` it receives and records
//! its own span. Everything is exported to the SDK's in-memory exporter (the collector
//! stand-in); the test checks one trace id and the parent chain.
//!
//! A real nats-server, the adapter in-process. The subscriber is the process-wide one
//! (the adapter's workers run on other threads), so this binary holds one test.

#[path = "it/common/mod.rs"]
mod common;

use std::time::Duration;

use futures::StreamExt;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use tracing::Instrument;
use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;
use weir_llm_adapter::Config;
use weir_llm_client::LlmClient;
use weir_protocol::llm::headers as h;
use weir_protocol::llm::{TraceContext, TraceParent};

use common::{STEP, connect, eventually};

/// A NATS service standing in for an inference backend that traces: it joins the trace
/// of the `traceparent` it receives with a span of its own, and echoes.
async fn traced_service(url: &str) -> tokio::task::JoinHandle<()> {
    let c = connect(url).await;
    let mut sub = c.subscribe("traced.llm").await.expect("subscribe");
    c.flush().await.expect("flush");
    tokio::spawn(async move {
        while let Some(m) = sub.next().await {
            let header = |name| {
                m.headers
                    .as_ref()
                    .and_then(|hm| hm.get(name))
                    .map(|v| v.as_str())
            };
            let span = tracing::info_span!("backend_service");
            if let Some(parent) =
                TraceContext::from_headers(header(h::TRACEPARENT), header(h::TRACESTATE))
            {
                weir_service::otel::set_remote_parent(&span, &parent);
            }
            let body = format!("traced:{}", String::from_utf8_lossy(&m.payload));
            async {
                tracing::info!("answering");
                if let Some(reply) = m.reply.clone() {
                    let _ = c.publish(reply, body.into()).await;
                }
            }
            .instrument(span)
            .await;
        }
    })
}

fn named<'a>(spans: &'a [SpanData], name: &str) -> Vec<&'a SpanData> {
    spans.iter().filter(|s| s.name == name).collect()
}

fn one<'a>(spans: &'a [SpanData], name: &str) -> &'a SpanData {
    let found = named(spans, name);
    assert_eq!(found.len(), 1, "one {name} span: {:#?}", names(spans));
    found[0]
}

fn names(spans: &[SpanData]) -> Vec<String> {
    spans.iter().map(|s| s.name.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_spans_caller_adapter_and_backend() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let filter = tracing_subscriber::EnvFilter::new(weir_service::otel::DEFAULT_FILTER);
    let subscriber = tracing_subscriber::registry()
        .with(weir_service::otel::layer(&provider).with_filter(filter));
    tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");

    let server = weir_testkit::NatsServer::start().expect("nats-server");
    let _service = traced_service(server.url()).await;
    let adapter_client = connect(server.url()).await;
    let config = Config::from_toml_str(
        "workers = 2\n[backend]\nkind = \"nats\"\ntimeout_ms = 5000\n[backend.nats]\nsubject = \"traced.llm\"",
    )
    .expect("config");
    let built =
        weir_llm_adapter::backend::pool_from_config(&config, &adapter_client).expect("backend");
    let adapter = tokio::time::timeout(
        STEP,
        weir_llm_adapter::start(adapter_client, config, built.backends[0].clone()),
    )
    .await
    .expect("start in time")
    .expect("start");
    let caller = connect(server.url()).await;
    caller.flush().await.expect("flush");
    let llm = LlmClient::new(caller.clone(), "llm.infer");

    // 1. The caller's span is the root; the client sends its context.
    let root = tracing::info_span!("caller");
    let reply = llm
        .request("hi")
        .request_id("otel-1")
        .timeout(Duration::from_secs(5))
        .send()
        .instrument(root.clone())
        .await
        .expect("reply");
    assert_eq!(&reply.body[..], b"traced:hi");
    drop(root);

    // 2. A request that carries no traceparent but the deployed envelope with a W3C
    // trace id: `llm_request` joins that trace.
    let envelope_trace = "0af7651916cd43dd8448eb211c80319c";
    let body = format!(
        r#"{{"trace_id":"{envelope_trace}","request_id":"env-1","session_id":"s-1","ts_ms":1}}"#
    );
    let reply = tokio::time::timeout(STEP, caller.request("llm.infer", body.into()))
        .await
        .expect("in time")
        .expect("reply");
    assert!(reply.payload.starts_with(b"traced:"));

    // 3. A malformed traceparent is ignored: answered, in a trace of its own.
    let mut hm = async_nats::HeaderMap::new();
    hm.insert(h::TRACEPARENT, "00-not-a-trace-01");
    let reply = tokio::time::timeout(
        STEP,
        caller.request_with_headers("llm.infer", hm, "bad".into()),
    )
    .await
    .expect("in time")
    .expect("reply");
    assert_eq!(&reply.payload[..], b"traced:bad");

    // Spans end when their last holder lets go (the adapter's entry is retired after
    // the answer was published): wait for all of them.
    eventually(STEP, || {
        let spans = exporter.get_finished_spans().unwrap_or_default();
        named(&spans, "llm_request").len() == 3 && named(&spans, "backend_service").len() == 3
    })
    .await;
    tokio::time::timeout(STEP, adapter.shutdown())
        .await
        .expect("shutdown in time");
    let spans = exporter.get_finished_spans().expect("spans");

    // One trace, caller → llm_request → backend_call → backend_service.
    let caller_span = one(&spans, "caller");
    let trace_id = caller_span.span_context.trace_id();
    let in_trace: Vec<&SpanData> = spans
        .iter()
        .filter(|s| s.span_context.trace_id() == trace_id)
        .collect();
    let by_name = |name: &str| -> &SpanData {
        let found: Vec<_> = in_trace.iter().filter(|s| s.name == name).collect();
        assert_eq!(found.len(), 1, "one {name} in the caller's trace");
        found[0]
    };
    let request = by_name("llm_request");
    let call = by_name("backend_call");
    let service = by_name("backend_service");
    assert_eq!(request.parent_span_id, caller_span.span_context.span_id());
    assert_eq!(call.parent_span_id, request.span_context.span_id());
    assert_eq!(service.parent_span_id, call.span_context.span_id());
    assert!(service.parent_span_is_remote && request.parent_span_is_remote);
    assert_eq!(in_trace.len(), 4, "{:?}", names(&spans));

    // The per-request trace events are span events of llm_request.
    let events: Vec<&str> = request.events.iter().map(|e| e.name.as_ref()).collect();
    for kind in ["queued", "admitted", "started", "finished"] {
        assert!(events.contains(&kind), "{kind} in {events:?}");
    }
    let attr = |s: &SpanData, key: &str| {
        s.attributes
            .iter()
            .find(|kv| kv.key.as_str() == key)
            .map(|kv| kv.value.to_string())
    };
    assert_eq!(attr(request, "request_id").as_deref(), Some("otel-1"));
    assert_eq!(attr(call, "backend").as_deref(), Some("nats"));

    // The envelope's trace id: the trace that request joined, and an attribute.
    let envelope_id =
        TraceParent::parse(&format!("00-{envelope_trace}-00f067aa0ba902b7-01")).expect("valid");
    let env_request = named(&spans, "llm_request")
        .into_iter()
        .find(|s| attr(s, "request_id").as_deref() == Some("env-1"))
        .expect("the envelope request's span");
    assert_eq!(
        env_request.span_context.trace_id().to_bytes(),
        envelope_id.trace_id
    );
    assert_eq!(
        attr(env_request, "envelope.trace_id").as_deref(),
        Some(envelope_trace)
    );

    // The malformed traceparent: a root of its own (no remote parent), still joined by
    // the backend.
    let lonely = named(&spans, "llm_request")
        .into_iter()
        .find(|s| attr(s, "request_id").is_none_or(|r| r.is_empty()))
        .expect("the third request's span");
    assert!(!lonely.parent_span_is_remote);
    let lonely_trace = lonely.span_context.trace_id();
    assert_ne!(lonely_trace, trace_id);
    assert_eq!(
        named(&spans, "backend_service")
            .iter()
            .filter(|s| s.span_context.trace_id() == lonely_trace)
            .count(),
        1
    );
    let _ = provider.shutdown();
}
