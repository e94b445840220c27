//! The NATS forwarding backend against an unchanged responder, and the OpenAI-compatible
//! HTTP backend against a local fake server.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use axum::routing::post;
use bytes::Bytes;
use common::{Rig, STEP, connect};
use futures::StreamExt;
use weir_llm_adapter::backend::openai::OpenAiBackend;
use weir_llm_adapter::config::{BackendKind, Config};
use weir_llm_client::{ClientErrorKind, LlmClient};
use weir_protocol::llm::headers as h;
use weir_protocol::llm::{ErrorCode, TraceContext};

fn code(
    r: &Result<weir_llm_client::LlmReply, weir_llm_client::ClientError>,
) -> Option<ClientErrorKind> {
    r.as_ref().err().map(|e| e.kind())
}

/// A deployed-style service on `legacy.llm`: answers `legacy:<body>` with a header,
/// sleeps 2 s on `slow`.
async fn legacy_service(url: &str) -> tokio::task::JoinHandle<()> {
    let client = connect(url).await;
    let mut sub = client.subscribe("legacy.llm").await.expect("subscribe");
    client.flush().await.expect("flush");
    tokio::spawn(async move {
        while let Some(msg) = sub.next().await {
            let client = client.clone();
            tokio::spawn(async move {
                let Some(reply) = msg.reply else { return };
                if &msg.payload[..] == b"slow" {
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
                let seen = msg
                    .headers
                    .as_ref()
                    .and_then(|hm| hm.get(h::TIMEOUT_MS))
                    .map(|v| v.as_str().to_owned())
                    .unwrap_or_default();
                let traceparent = msg
                    .headers
                    .as_ref()
                    .and_then(|hm| hm.get(h::TRACEPARENT))
                    .map_or_else(|| "none".to_owned(), |v| v.as_str().to_owned());
                let mut hm = async_nats::HeaderMap::new();
                hm.insert("X-Legacy", "yes");
                hm.insert("X-Seen-Timeout-Ms", seen.as_str());
                hm.insert("X-Seen-Traceparent", traceparent.as_str());
                let body = Bytes::from([b"legacy:".as_slice(), &msg.payload].concat());
                let _ = client.publish_with_headers(reply, hm, body).await;
            });
        }
    })
}

#[tokio::test]
async fn nats_backend_fronts_an_unchanged_service_with_the_remaining_deadline() {
    // The backend needs the adapter's own connection, so build the rig by hand.
    let server = weir_testkit::NatsServer::start().expect("nats-server");
    let _legacy = legacy_service(server.url()).await;
    let adapter_client = connect(server.url()).await;
    let config = Config::from_toml_str(
        "workers = 4\n[backend]\nkind = \"nats\"\ntimeout_ms = 5000\n[backend.nats]\nsubject = \"legacy.llm\"",
    )
    .expect("config");
    let built =
        weir_llm_adapter::backend::pool_from_config(&config, &adapter_client).expect("backend");
    assert!(matches!(config.backend.kind, BackendKind::Nats(_)));
    let adapter = weir_llm_adapter::start(adapter_client, config, built.backends[0].clone())
        .await
        .expect("start");
    let caller = connect(server.url()).await;
    caller.flush().await.expect("flush");
    let llm = LlmClient::new(caller.clone(), "llm.infer");

    let r = llm
        .request("hi")
        .timeout(Duration::from_secs(3))
        .send()
        .await
        .expect("reply");
    assert_eq!(&r.body[..], b"legacy:hi");
    assert_eq!(
        r.headers.get("X-Legacy").map(|v| v.as_str()),
        Some("yes"),
        "service headers pass through"
    );
    let seen: u64 = r
        .headers
        .get("X-Seen-Timeout-Ms")
        .and_then(|v| v.as_str().parse().ok())
        .expect("forwarded budget");
    assert!(
        seen > 2500 && seen <= 3000,
        "forwarded the remaining budget: {seen}"
    );

    // Without an OpenTelemetry exporter the caller's traceparent reaches the service
    // unchanged; a malformed one is ignored (answered, nothing forwarded).
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let traced = TraceContext::from_headers(Some(tp), None).expect("valid");
    let r = llm
        .request("t")
        .trace_context(traced)
        .send()
        .await
        .expect("reply");
    assert_eq!(
        r.headers.get("X-Seen-Traceparent").map(|v| v.as_str()),
        Some(tp)
    );
    let mut bad = async_nats::HeaderMap::new();
    bad.insert(h::TRACEPARENT, "00-zz-01");
    let r = caller
        .request_with_headers("llm.infer", bad, "u".into())
        .await
        .expect("reply");
    assert_eq!(&r.payload[..], b"legacy:u");
    assert_eq!(
        r.headers
            .as_ref()
            .and_then(|hm| hm.get("X-Seen-Traceparent"))
            .map(|v| v.as_str()),
        Some("none")
    );

    let t0 = std::time::Instant::now();
    let slow = llm
        .request("slow")
        .timeout(Duration::from_millis(300))
        .send()
        .await;
    assert_eq!(
        code(&slow),
        Some(ClientErrorKind::Server(ErrorCode::DeadlineExceeded))
    );
    assert!(
        t0.elapsed() < Duration::from_millis(1500),
        "{:?}",
        t0.elapsed()
    );

    adapter.shutdown().await;
}

#[tokio::test]
async fn nats_backend_without_responders_is_a_backend_error() {
    let server = weir_testkit::NatsServer::start().expect("nats-server");
    let adapter_client = connect(server.url()).await;
    let config = Config::from_toml_str(
        "[backend]\nkind = \"nats\"\n[backend.nats]\nsubject = \"nobody.home\"",
    )
    .expect("config");
    let built =
        weir_llm_adapter::backend::pool_from_config(&config, &adapter_client).expect("backend");
    let adapter = weir_llm_adapter::start(adapter_client, config, built.backends[0].clone())
        .await
        .expect("start");
    let caller = connect(server.url()).await;
    caller.flush().await.expect("flush");
    let llm = LlmClient::new(caller, "llm.infer");
    let r = llm
        .request("x")
        .timeout(Duration::from_secs(2))
        .send()
        .await;
    assert_eq!(
        code(&r),
        Some(ClientErrorKind::Server(ErrorCode::BackendError))
    );
    assert!(r.expect_err("error").to_string().contains("no responders"));
    adapter.shutdown().await;
}

/// A local OpenAI-compatible server: echoes the body inside a completion; `boom` → 500;
/// `slow` → 5 s.
async fn fake_openai() -> (String, tokio::task::JoinHandle<()>) {
    async fn completions(headers: axum::http::HeaderMap, body: Bytes) -> axum::response::Response {
        use axum::response::IntoResponse;
        let text = String::from_utf8_lossy(&body).into_owned();
        if text.contains("boom") {
            return (
                axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                "model exploded",
            )
                .into_response();
        }
        if text.contains("slow") {
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
        let auth = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let rid = headers
            .get("x-request-id")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let traceparent = headers
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        axum::Json(serde_json::json!({
            "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}}],
            "seen_auth": !auth.is_empty(),
            "seen_request_id": rid,
            "seen_traceparent": traceparent,
        }))
        .into_response()
    }
    let app = axum::Router::new().route("/v1/chat/completions", post(completions));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}"), task)
}

#[tokio::test]
async fn openai_backend_passes_bodies_through_and_maps_failures() {
    let (base, _srv) = fake_openai().await;
    // `PATH` is always set, so it stands in for an API key variable.
    let config = Config::from_toml_str(&format!(
        "workers = 2\n[backend]\nkind = \"openai\"\ntimeout_ms = 10000\n[backend.openai]\nbase_url = \"{base}\"\napi_key_env = \"PATH\""
    ))
    .expect("config");
    let BackendKind::OpenAi(oc) = &config.backend.kind else {
        panic!("openai")
    };
    let backend = OpenAiBackend::new(oc, config.backend.timeout).expect("backend");
    let mut rig = Rig::with_backend(
        &format!(
            "workers = 2\n[backend]\nkind = \"openai\"\n[backend.openai]\nbase_url = \"{base}\""
        ),
        Arc::new(backend),
    )
    .await;
    let llm = LlmClient::new(rig.caller.clone(), "llm.infer");

    let body = r#"{"model":"m","messages":[{"role":"user","content":"hello"}]}"#;
    // The caller's W3C trace context goes on as an HTTP header (no exporter here).
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let r = llm
        .request(body)
        .request_id("req-7")
        .timeout(Duration::from_secs(5))
        .trace_context(TraceContext::from_headers(Some(tp), None).expect("valid"))
        .send()
        .await
        .expect("reply");
    let v: serde_json::Value = serde_json::from_slice(&r.body).expect("json");
    assert_eq!(
        v["choices"][0]["message"]["content"], body,
        "body passed through unchanged"
    );
    assert_eq!(v["seen_auth"], true);
    assert_eq!(v["seen_request_id"], "req-7");
    assert_eq!(v["seen_traceparent"], tp);
    assert!(r.inference_time.is_some());

    let boom = llm
        .request(r#"{"boom":1}"#)
        .timeout(Duration::from_secs(5))
        .send()
        .await;
    let e = boom.expect_err("backend error");
    assert_eq!(e.kind(), ClientErrorKind::Server(ErrorCode::BackendError));
    assert!(
        e.to_string().contains("500") && e.to_string().contains("model exploded"),
        "{e}"
    );

    let t0 = std::time::Instant::now();
    let slow = llm
        .request(r#"{"slow":1}"#)
        .timeout(Duration::from_millis(300))
        .send()
        .await;
    assert_eq!(
        code(&slow),
        Some(ClientErrorKind::Server(ErrorCode::DeadlineExceeded))
    );
    assert!(t0.elapsed() < Duration::from_secs(2));
    // The aborted call released its worker: the next request is served at once.
    assert!(
        llm.request("{}")
            .timeout(Duration::from_secs(2))
            .send()
            .await
            .is_ok()
    );
    rig.shutdown().await;
}

#[tokio::test]
async fn openai_backend_unreachable_is_a_backend_error() {
    // A port nobody listens on: bind, note the port, drop the listener.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let config = Config::from_toml_str(&format!(
        "[backend]\nkind = \"openai\"\n[backend.openai]\nbase_url = \"http://127.0.0.1:{port}\"\nconnect_timeout_ms = 500"
    ))
    .expect("config");
    let BackendKind::OpenAi(oc) = &config.backend.kind else {
        panic!("openai")
    };
    let backend = OpenAiBackend::new(oc, config.backend.timeout).expect("backend");
    let mut rig = Rig::with_backend("workers = 1", Arc::new(backend)).await;
    let llm = LlmClient::new(rig.caller.clone(), "llm.infer");
    let r = llm
        .request("{}")
        .timeout(Duration::from_secs(3))
        .send()
        .await;
    assert_eq!(
        code(&r),
        Some(ClientErrorKind::Server(ErrorCode::BackendError))
    );
    assert_eq!(rig.adapter().stats().refused_of(ErrorCode::BackendError), 1);
    let _ = STEP;
    rig.shutdown().await;
}
