//! Admin HTTP (127.0.0.1 by default): `/metrics` (Prometheus text), `/healthz`,
//! `/readyz` (NATS connected and not shutting down), `/v1/streams` (each active
//! stream), `/v1/stats` (the aggregate snapshot pinned in docs/contracts.md) and
//! `/v1/limits` (the configured budget, policy and caps), `/v1/whip` (WHIP sessions and
//! their media counters: decode cost, concealed frames, RTP gaps).
//!
//! Read-only: nothing here changes a stream. Every handler is a snapshot of atomics and
//! short-held locks, so a scrape cannot slow the data path noticeably.

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::json;

use crate::publisher::Sink;
use crate::stream::Ingress;

/// What the admin endpoint reads.
#[derive(Clone)]
pub struct AdminState<S: Sink> {
    /// The producer core.
    pub ingress: Ingress<S>,
    /// The Prometheus recorder's handle (`None`: `/metrics` answers 404 `no_recorder`).
    pub prometheus: Option<PrometheusHandle>,
    /// `max_streams` of the front door, for `/v1/limits`.
    pub max_streams: usize,
    /// The front door's connection and authentication settings, for `/v1/limits`
    /// (never a secret).
    pub edge: serde_json::Value,
    /// The WHIP door's view (`None`: WHIP is off; `/v1/whip` answers 404).
    pub whip: Option<crate::whip::WhipView>,
}

/// The admin routes.
pub fn router<S: Sink>(state: AdminState<S>) -> Router {
    Router::new()
        .route("/metrics", get(metrics_text::<S>))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz::<S>))
        .route("/v1/streams", get(streams::<S>))
        .route("/v1/stats", get(stats::<S>))
        .route("/v1/limits", get(limits::<S>))
        .route("/v1/whip", get(whip::<S>))
        .fallback(|| async { not_found("not_found", "no such admin endpoint") })
        .with_state(state)
}

async fn metrics_text<S: Sink>(State(state): State<AdminState<S>>) -> Response {
    match &state.prometheus {
        Some(h) => {
            // Refresh the sampled gauges before rendering. The connected gauge is also
            // kept by connection events, which async-nats drops when its event channel
            // is full: the scrape reads the client's own state.
            state.ingress.oldest_frame_age();
            metrics::gauge!(crate::metrics::NATS_CONNECTED)
                .set(f64::from(u8::from(state.ingress.sink().is_connected())));
            // The per-frame counters live in the ingress's atomics (no facade call per
            // frame); they and the queue-wait histogram are published here.
            let global = state.ingress.global();
            global.publish_metrics();
            let mut text = h.render();
            global.render_histograms(&mut text);
            weir_service::process::render(&mut text);
            ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
        }
        // Not a transient state (the process runs without a recorder): 404 with the JSON
        // error body, the same answer as the LLM adapter's.
        None => not_found("no_recorder", "no metrics recorder installed"),
    }
}

/// A 404 with the JSON error body every refusal carries.
fn not_found(code: &str, message: &str) -> Response {
    (
        StatusCode::NOT_FOUND,
        axum::Json(json!({"error": {"code": code, "message": message}})),
    )
        .into_response()
}

async fn whip<S: Sink>(State(state): State<AdminState<S>>) -> Response {
    match &state.whip {
        Some(w) => axum::Json(w.snapshot()).into_response(),
        None => not_found("whip_off", "WHIP is off (whip_udp_listen is empty)"),
    }
}

async fn readyz<S: Sink>(State(state): State<AdminState<S>>) -> Response {
    let connected = state.ingress.sink().is_connected();
    let shutting_down = state.ingress.is_shutting_down();
    let ready = connected && !shutting_down;
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = json!({"ready": ready, "nats_connected": connected, "shutting_down": shutting_down});
    (status, axum::Json(body)).into_response()
}

async fn streams<S: Sink>(State(state): State<AdminState<S>>) -> Response {
    axum::Json(state.ingress.streams()).into_response()
}

async fn stats<S: Sink>(State(state): State<AdminState<S>>) -> Response {
    axum::Json(state.ingress.stats()).into_response()
}

async fn limits<S: Sink>(State(state): State<AdminState<S>>) -> Response {
    let c = state.ingress.config();
    axum::Json(json!({
        "max_bytes": c.max_bytes(),
        "max_age_ms": c.max_age().as_millis() as u64,
        "max_wait_ms": c.max_wait().as_millis() as u64,
        "policy": c.policy(),
        "shadow": c.shadow(),
        "enforced_max_bytes": c.enforced_max_bytes(),
        "enforced_max_age_ms": c.enforced_max_age().as_millis() as u64,
        "publish_timeout_ms": c.publish_timeout().as_millis() as u64,
        "end_timeout_ms": c.end_timeout().as_millis() as u64,
        "max_frame_bytes": c.max_frame_bytes(),
        "max_rate": f64::from(c.max_rate_permille()) / 1000.0,
        "enforced_max_rate": f64::from(c.enforced_max_rate_permille()) / 1000.0,
        "subject": c.subject().as_str(),
        "partitions": c.partitions().get(),
        "max_streams": state.max_streams,
        "edge": state.edge,
    }))
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::StreamConfig;
    use crate::stream_tests::MemorySink;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, serde_json::Value) {
        let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.expect("write");
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.expect("read");
        let text = String::from_utf8_lossy(&buf).to_string();
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        (status, serde_json::from_str(body).unwrap_or_default())
    }

    /// Without a recorder `/metrics` is a 404 with the JSON error body, like the LLM
    /// adapter's (it was a plain-text 503); unknown paths get the JSON 404 too.
    #[tokio::test]
    async fn metrics_without_a_recorder_and_unknown_paths_are_json_404s() {
        let app = router(AdminState {
            ingress: Ingress::new(MemorySink::confirming(), StreamConfig::default()),
            prometheus: None,
            max_streams: 1,
            edge: serde_json::Value::Null,
            whip: None,
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = tokio::spawn(async move { axum::serve(listener, app).await });
        for (path, code) in [("/metrics", "no_recorder"), ("/nope", "not_found")] {
            let (status, body) = get(addr, path).await;
            assert_eq!(status, 404, "{path}");
            assert_eq!(body["error"]["code"], code, "{path}: {body}");
        }
        assert_eq!(get(addr, "/readyz").await.0, 200);
        server.abort();
    }
}
