//! Admin HTTP server (localhost by default): Prometheus `/metrics`, `/healthz`,
//! `/readyz`, `/v1/capabilities`, `/v1/limits?top=N`, `/v1/stats`.
//!
//! `/healthz` answers 200 while the process serves HTTP. `/readyz` answers 200 only
//! while the NATS connection is up and the adapter admits requests (503 during shutdown
//! or a NATS outage) so that an orchestrator stops routing to it. Nothing here exposes
//! request bodies.
//!
//! Every refusal is JSON, `{"error":{"code","message"}}` like the ingress's: an unknown
//! path (404 `not_found`), a method other than GET (405 `method_not_allowed`), a bad
//! query (400 `invalid_request`), `/metrics` without a recorder (404 `no_recorder`), a
//! request over the admin concurrency limit or timeout (503 `overloaded`, `timeout`).
//! The skeleton (`/metrics`, `/healthz`, `/readyz`, the 404/405 refusals, the request
//! limits) is `weir_service::admin`'s, shared with the ingress; this module gives it
//! the adapter's readiness and metrics text and adds the `/v1/*` views.

use std::future::Future;
use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusHandle;
use serde::Deserialize;
use weir_service::admin::{Admin, MetricsSource, Readiness, Ready, error_response};
use weir_service::http::{BodyLimits, ConnLimiter, HttpOptions};

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

/// The admin routes: the shared skeleton with the adapter's `/v1/*` views.
pub fn router(state: AdminState) -> Router {
    let views = Router::new()
        .route("/v1/capabilities", get(capabilities))
        .route("/v1/limits", get(limits))
        .route("/v1/stats", get(stats))
        .with_state(state.clone());
    let limits = state.view.config().admin.request_limits;
    let state = Arc::new(state);
    weir_service::admin::router(
        Admin {
            readiness: Arc::clone(&state) as Arc<dyn Readiness>,
            metrics: state,
            not_found: "paths: /metrics, /healthz, /readyz, /v1/capabilities, /v1/limits, /v1/stats",
            limits,
        },
        views,
    )
}

impl MetricsSource for AdminState {
    fn render(&self) -> Option<String> {
        // Publishes the queue-depth and running gauges as of now, and the connected
        // gauge from the client's own state (connection events can be dropped by
        // async-nats).
        let _ = self.view.stats();
        ::metrics::gauge!(crate::metrics::NATS_CONNECTED)
            .set(f64::from(u8::from(self.view.nats_connected())));
        let h = self.prometheus.as_ref()?;
        let mut text = h.render();
        self.view.render_histograms(&mut text);
        Some(text)
    }
}

/// Ready: NATS connected and admitting requests.
impl Readiness for AdminState {
    fn readiness(&self) -> Ready {
        let connected = (
            "nats_connected".to_owned(),
            self.view.nats_connected().into(),
        );
        Ready {
            ready: self.view.is_ready(),
            detail: serde_json::Map::from_iter([connected]),
        }
    }
}

async fn capabilities(State(s): State<AdminState>) -> Response {
    Json(s.view.capabilities()).into_response()
}

async fn limits(
    State(s): State<AdminState>,
    q: Result<Query<TopQuery>, QueryRejection>,
) -> Response {
    match q {
        Ok(Query(q)) => Json(s.view.limits(q.top.unwrap_or(20).clamp(1, 1000))).into_response(),
        Err(e) => error_response(StatusCode::BAD_REQUEST, "invalid_request", e.body_text()),
    }
}

/// The stats snapshot, with each backend of the pool under `backends`.
async fn stats(State(s): State<AdminState>) -> Response {
    let mut v = serde_json::to_value(s.view.stats()).unwrap_or_default();
    if let Some(o) = v.as_object_mut() {
        let backends = serde_json::to_value(s.view.backends()).unwrap_or_default();
        o.insert("backends".into(), backends);
    }
    Json(v).into_response()
}

/// Largest buffered request head on the admin port.
pub const ADMIN_MAX_HEADER_BYTES: usize = 16 * 1024;

/// Serves the admin routes on `listener` until `shutdown` resolves, with the
/// connection hygiene of `admin.*` (connection cap, header and idle timeouts): the
/// accept loop the ingress's listeners use too (`weir_service::http`). Every client
/// address may use the whole cap (the port is for local scrapers and probes); when it
/// is full, a new connection takes the slot of the one that has waited longest for a
/// request head, so silent connections never keep a probe out. Request bodies have the
/// default bounds (`BodyLimits`: 10 s, 1,024 bytes/s).
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AdminState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let cfg = state.view.config().admin;
    let cap = cfg.max_connections.get();
    let limiter = ConnLimiter::new("admin", crate::metrics::ADMIN_CONNECTIONS_OPEN, cap, cap)
        .evict_silent_when_full();
    let options = HttpOptions {
        name: "admin",
        header_timeout: cfg.header_timeout,
        idle_timeout: cfg.idle_timeout,
        max_header_bytes: ADMIN_MAX_HEADER_BYTES,
        body: BodyLimits::default(),
        retry_after: std::time::Duration::from_secs(1),
        metrics: crate::metrics::ADMIN_LISTENER,
        send_buffer: None,
    };
    weir_service::http::serve(listener, router(state), limiter, options, shutdown).await;
    Ok(())
}
