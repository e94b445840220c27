//! The admin router skeleton both services mount their `/v1/*` views on: `/metrics`,
//! `/healthz`, `/readyz`, the JSON refusals, and per-request limits, written once.
//!
//! - `/metrics`: the service's [`MetricsSource`] text (exporter + latency histograms)
//!   followed by the process's own figures ([`crate::process::render`]); without a
//!   recorder a JSON 404 `no_recorder` (not a transient state: the process runs without
//!   one, so retrying does not help).
//! - `/healthz`: `200 ok` while the process serves HTTP.
//! - `/readyz`: the service's [`Readiness`]: 200 when ready, 503 when not, with the body
//!   `{"ready": bool, …detail}` (e.g. `nats_connected`, `shutting_down`).
//! - Every refusal is JSON `{"error":{"code","message"}}`: an unknown path is a 404
//!   `not_found`, a method other than the route's a 405 `method_not_allowed`.
//!
//! Request limits ([`RequestLimits`], tower layers):
//! - every request, probes included, is bounded by `timeout`; one still running then is
//!   dropped and answered `503` `timeout`. The handlers are short snapshots; the bound is
//!   for one that would wait (a lock, a future source) so a stuck view cannot hold a
//!   connection slot of the admin port forever. 503 rather than 408: the request arrived
//!   in full, the server failed to answer it in time (a slow request head is the accept
//!   loop's header timeout, [`crate::http`]).
//! - at most `max_concurrent` requests to `/metrics` and the service's routes run at
//!   once; one more is refused at once (no queueing) with `503` `overloaded` and
//!   `Retry-After: 1`. `/healthz` and `/readyz` are not counted: they are O(1), and an
//!   orchestrator must not see a service as unready because scrapers are busy.
//!
//! Invariants: the JSON shapes above are pinned by both services' tests; a concurrency permit is held by the request's
//! future and released by `Drop` when it completes, times out or its connection closes.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use axum::error_handling::HandleErrorLayer;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{BoxError, Json, Router};
use serde_json::{Map, Value};
use tower::ServiceBuilder;

/// Whether the service should receive traffic now, and why.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Ready {
    /// 200 when true, 503 when false.
    pub ready: bool,
    /// Fields added next to `ready` in the `/readyz` body (e.g. `nats_connected`).
    pub detail: Map<String, Value>,
}

/// What `/readyz` asks.
pub trait Readiness: Send + Sync + 'static {
    /// Ready or not, with the detail.
    fn readiness(&self) -> Ready;
}

/// What `/metrics` renders.
pub trait MetricsSource: Send + Sync + 'static {
    /// The Prometheus text (the exporter's and the service's own histograms), having
    /// refreshed whatever the service publishes at scrape time; `None` when no recorder
    /// is installed. The process metrics are appended by the router.
    fn render(&self) -> Option<String>;
}

/// Per-request bounds of the admin routes (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLimits {
    /// Longest a request may take before it is answered `503 timeout`.
    pub timeout: Duration,
    /// Requests to `/metrics` and the service's routes running at once; one more is
    /// answered `503 overloaded`.
    pub max_concurrent: NonZeroUsize,
}

impl RequestLimits {
    /// 10 s: Prometheus's default scrape timeout.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
    /// 8: a few scrapers and operators at once; a snapshot takes microseconds.
    pub const DEFAULT_MAX_CONCURRENT: NonZeroUsize = NonZeroUsize::new(8).expect("8 > 0");
}

impl Default for RequestLimits {
    fn default() -> Self {
        Self {
            timeout: Self::DEFAULT_TIMEOUT,
            max_concurrent: Self::DEFAULT_MAX_CONCURRENT,
        }
    }
}

/// What the skeleton needs from a service.
#[derive(Clone)]
pub struct Admin {
    /// Asked by `/readyz`.
    pub readiness: Arc<dyn Readiness>,
    /// Rendered by `/metrics`.
    pub metrics: Arc<dyn MetricsSource>,
    /// The message of the 404 `not_found` (e.g. the paths the port serves).
    pub not_found: &'static str,
    /// Timeout and concurrency limit.
    pub limits: RequestLimits,
}

/// A JSON refusal: `{"error":{"code","message"}}` with `status`.
pub fn error_response(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    let body = serde_json::json!({"error": {"code": code, "message": message.into()}});
    (status, Json(body)).into_response()
}

/// The admin router: `/metrics`, `/healthz`, `/readyz`, the service's `routes` (its
/// `/v1/*` views, state already applied), the JSON 404/405 refusals and the request
/// limits of `admin.limits`.
pub fn router(admin: Admin, routes: Router) -> Router {
    let limits = admin.limits;
    let not_found = admin.not_found;
    let probes = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(Arc::clone(&admin.readiness))
        .method_not_allowed_fallback(method_not_allowed);
    let limited = Router::new()
        .route("/metrics", get(metrics))
        .with_state(Arc::clone(&admin.metrics))
        .merge(routes)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(
            ServiceBuilder::new()
                .layer(HandleErrorLayer::new(refusal))
                .load_shed()
                .layer(tower::limit::GlobalConcurrencyLimitLayer::new(
                    limits.max_concurrent.get(),
                )),
        );
    probes
        .merge(limited)
        .fallback(
            move || async move { error_response(StatusCode::NOT_FOUND, "not_found", not_found) },
        )
        .layer(
            ServiceBuilder::new()
                .layer(HandleErrorLayer::new(refusal))
                .timeout(limits.timeout),
        )
}

async fn method_not_allowed() -> Response {
    error_response(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "the admin endpoints answer GET",
    )
}

/// The answer to a request the limits refused.
async fn refusal(err: BoxError) -> Response {
    static REFUSED: crate::ratelimit::LogLimit =
        crate::ratelimit::LogLimit::new(Duration::from_secs(10));
    let (code, message) = if err.is::<tower::load_shed::error::Overloaded>() {
        ("overloaded", "too many admin requests at once; retry later")
    } else if err.is::<tower::timeout::error::Elapsed>() {
        ("timeout", "the admin request took too long")
    } else {
        // The layers only fail in the two ways above; keep the answer JSON regardless.
        ("internal", "admin request failed")
    };
    if let Some(suppressed) = REFUSED.allow() {
        tracing::warn!(code, suppressed, "admin request refused");
    }
    let mut response = error_response(StatusCode::SERVICE_UNAVAILABLE, code, message);
    if code == "overloaded" {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
    }
    response
}

async fn metrics(State(source): State<Arc<dyn MetricsSource>>) -> Response {
    match source.render() {
        Some(mut text) => {
            crate::process::render(&mut text);
            ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
        }
        None => error_response(
            StatusCode::NOT_FOUND,
            "no_recorder",
            "no metrics recorder installed",
        ),
    }
}

async fn readyz(State(readiness): State<Arc<dyn Readiness>>) -> Response {
    let Ready { ready, detail } = readiness.readiness();
    let mut body = detail;
    body.insert("ready".to_owned(), Value::Bool(ready));
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(Value::Object(body))).into_response()
}

#[cfg(test)]
mod tests;
