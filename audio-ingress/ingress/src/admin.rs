//! Admin HTTP (127.0.0.1 by default): `/metrics` (Prometheus text), `/healthz`,
//! `/readyz` (NATS connected and not shutting down), `/v1/streams` (each active
//! stream), `/v1/stats` (the aggregate snapshot pinned in docs/contracts.md) and
//! `/v1/limits` (the configured budget, policy and caps), `/v1/whip` (WHIP sessions and
//! their media counters: decode cost, concealed frames, RTP gaps).
//!
//! The skeleton (`/metrics`, `/healthz`, `/readyz`, the JSON 404/405 refusals, the
//! request timeout and concurrency limit) is `weir_service::admin`'s, shared with the
//! LLM adapter; this module gives it the ingress's readiness and metrics text and adds
//! the `/v1/*` views.
//!
//! Read-only: nothing here changes a stream. Every handler is a snapshot of atomics and
//! short-held locks, so a scrape cannot slow the data path noticeably.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::json;
use weir_service::admin::{Admin, MetricsSource, Readiness, Ready, RequestLimits, error_response};

use weir_audio_producer::publisher::Sink;
use weir_audio_producer::stream::Ingress;

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
    /// The admin routes' timeout and concurrency limit (`admin_request_timeout_ms`,
    /// `admin_max_concurrent_requests`).
    pub limits: RequestLimits,
}

/// The message of the 404 `not_found`.
const PATHS: &str = "no such admin endpoint; paths: /metrics, /healthz, /readyz, /v1/streams, /v1/stats, /v1/limits, /v1/whip";

/// The admin routes: the shared skeleton with the ingress's `/v1/*` views.
pub fn router<S: Sink>(state: AdminState<S>) -> Router {
    let views = Router::new()
        .route("/v1/streams", get(streams::<S>))
        .route("/v1/stats", get(stats::<S>))
        .route("/v1/limits", get(limits::<S>))
        .route("/v1/whip", get(whip::<S>))
        .with_state(state.clone());
    let limits = state.limits;
    let state = Arc::new(state);
    weir_service::admin::router(
        Admin {
            readiness: Arc::clone(&state) as Arc<dyn Readiness>,
            metrics: state,
            not_found: PATHS,
            limits,
        },
        views,
    )
}

impl<S: Sink> MetricsSource for AdminState<S> {
    fn render(&self) -> Option<String> {
        let h = self.prometheus.as_ref()?;
        // Refresh the sampled gauges before rendering. The connected gauge is also
        // kept by connection events, which async-nats drops when its event channel is
        // full: the scrape reads the client's own state.
        self.ingress.oldest_frame_age();
        metrics::gauge!(weir_audio_producer::metrics::NATS_CONNECTED)
            .set(f64::from(u8::from(self.ingress.sink().is_connected())));
        // The per-frame counters live in the ingress's atomics (no facade call per
        // frame); they and the queue-wait histogram are published here.
        let global = self.ingress.global();
        global.publish_metrics();
        let mut text = h.render();
        global.render_histograms(&mut text);
        Some(text)
    }
}

/// Ready: NATS connected and not shutting down.
impl<S: Sink> Readiness for AdminState<S> {
    fn readiness(&self) -> Ready {
        let connected = self.ingress.sink().is_connected();
        let shutting_down = self.ingress.is_shutting_down();
        let mut detail = serde_json::Map::new();
        detail.insert("nats_connected".to_owned(), connected.into());
        detail.insert("shutting_down".to_owned(), shutting_down.into());
        Ready {
            ready: connected && !shutting_down,
            detail,
        }
    }
}

async fn whip<S: Sink>(State(state): State<AdminState<S>>) -> Response {
    match &state.whip {
        Some(w) => axum::Json(w.snapshot()).into_response(),
        None => error_response(
            StatusCode::NOT_FOUND,
            "whip_off",
            "WHIP is off (whip_udp_listen is empty)",
        ),
    }
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
    use async_nats::{HeaderMap, Subject};
    use bytes::Bytes;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use weir_audio_producer::StreamConfig;
    use weir_audio_producer::publisher::SinkError;

    /// A connected sink that takes every message (the test opens no stream).
    #[derive(Clone)]
    struct NullSink;

    impl Sink for NullSink {
        async fn publish(&self, _: Subject, _: HeaderMap, _: Bytes) -> Result<(), SinkError> {
            Ok(())
        }
    }

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
            ingress: Ingress::new(NullSink, StreamConfig::default()),
            prometheus: None,
            max_streams: 1,
            edge: serde_json::Value::Null,
            whip: None,
            limits: RequestLimits::default(),
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
