//! Admin HTTP server (localhost by default): Prometheus `/metrics`, `/healthz`,
//! `/readyz`, `/v1/capabilities`, `/v1/limits?top=N`, `/v1/stats`.
//!
//! `/healthz` answers 200 while the process serves HTTP. `/readyz` answers 200 only
//! while the NATS connection is up and the adapter admits requests (503 during shutdown
//! or a NATS outage) so that an orchestrator stops routing to it. Nothing here exposes
//! request bodies.

use std::future::Future;

use axum::Json;
use axum::Router;
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusHandle;
use serde::Deserialize;

use crate::AdapterView;

/// What the admin routes read.
#[derive(Clone)]
pub struct AdminState {
    /// The running adapter.
    pub view: AdapterView,
    /// The Prometheus handle, when the binary installed the recorder.
    pub prometheus: Option<PrometheusHandle>,
}

#[derive(Deserialize)]
struct TopQuery {
    top: Option<usize>,
}

/// The admin routes.
pub fn router(state: AdminState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/v1/capabilities", get(capabilities))
        .route("/v1/limits", get(limits))
        .route("/v1/stats", get(stats))
        .with_state(state)
}

async fn metrics(State(s): State<AdminState>) -> Response {
    // Publishes the queue-depth and running gauges as of now.
    let _ = s.view.stats();
    match &s.prometheus {
        Some(h) => {
            let mut text = h.render();
            text.push_str(&s.view.render_histograms());
            ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
        }
        None => (StatusCode::NOT_FOUND, "no metrics recorder installed\n").into_response(),
    }
}

async fn readyz(State(s): State<AdminState>) -> Response {
    let body = serde_json::json!({
        "ready": s.view.is_ready(),
        "nats_connected": s.view.nats_connected(),
    });
    let code = if s.view.is_ready() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, Json(body)).into_response()
}

async fn capabilities(State(s): State<AdminState>) -> Response {
    Json(s.view.capabilities()).into_response()
}

async fn limits(State(s): State<AdminState>, Query(q): Query<TopQuery>) -> Response {
    Json(s.view.limits(q.top.unwrap_or(20).clamp(1, 1000))).into_response()
}

async fn stats(State(s): State<AdminState>) -> Response {
    Json(s.view.stats()).into_response()
}

/// Serves the admin routes on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AdminState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await
}
