//! The skeleton's answers, driven through the router as a tower service (no socket):
//! readiness, `/metrics` with and without a recorder, the JSON refusals, and the two
//! limits (a handler parked on a `Notify`, the timeout on a paused clock).

use std::sync::atomic::{AtomicBool, Ordering};

use axum::body::Body;
use axum::http::{Method, Request};
use tokio::sync::Notify;
use tower::ServiceExt as _;

use super::*;

struct Flag(AtomicBool);

impl Readiness for Flag {
    fn readiness(&self) -> Ready {
        let connected = self.0.load(Ordering::Relaxed);
        let mut detail = Map::new();
        detail.insert("nats_connected".to_owned(), Value::Bool(connected));
        Ready {
            ready: connected,
            detail,
        }
    }
}

struct Text(Option<&'static str>);

impl MetricsSource for Text {
    fn render(&self) -> Option<String> {
        self.0.map(str::to_owned)
    }
}

fn admin(ready: &Arc<Flag>, text: Option<&'static str>, limits: RequestLimits) -> Admin {
    Admin {
        readiness: Arc::clone(ready) as Arc<dyn Readiness>,
        metrics: Arc::new(Text(text)),
        not_found: "paths: /metrics, /healthz, /readyz, /v1/x",
        limits,
    }
}

async fn call(app: &Router, method: Method, path: &str) -> (u16, Option<String>, String) {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .body(Body::empty())
        .expect("request");
    let res = app.clone().oneshot(req).await.expect("infallible");
    let status = res.status().as_u16();
    let retry = res
        .headers()
        .get(header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = axum::body::to_bytes(res.into_body(), 1 << 20)
        .await
        .expect("body");
    (status, retry, String::from_utf8_lossy(&body).into_owned())
}

fn json(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or(Value::Null)
}

fn views() -> Router {
    Router::new().route("/v1/x", get(|| async { Json(serde_json::json!({"x": 1})) }))
}

#[tokio::test]
async fn readyz_is_503_with_the_detail_when_not_ready_and_200_when_ready() {
    let flag = Arc::new(Flag(AtomicBool::new(false)));
    let app = router(admin(&flag, None, RequestLimits::default()), views());
    let (status, _, body) = call(&app, Method::GET, "/readyz").await;
    assert_eq!(status, 503);
    assert_eq!(
        json(&body),
        serde_json::json!({"ready": false, "nats_connected": false})
    );
    flag.0.store(true, Ordering::Relaxed);
    let (status, _, body) = call(&app, Method::GET, "/readyz").await;
    assert_eq!(status, 200);
    assert_eq!(
        json(&body),
        serde_json::json!({"ready": true, "nats_connected": true})
    );
    assert_eq!(call(&app, Method::GET, "/healthz").await.2, "ok\n");
}

/// One code path for both services: without a recorder `/metrics` is the JSON 404
/// `no_recorder` (the ingress once answered a plain-text 503, the adapter a 404).
#[tokio::test]
async fn metrics_without_a_recorder_is_a_json_404_and_with_one_gets_the_process_figures() {
    let flag = Arc::new(Flag(AtomicBool::new(true)));
    let none = router(admin(&flag, None, RequestLimits::default()), views());
    let (status, _, body) = call(&none, Method::GET, "/metrics").await;
    assert_eq!(status, 404);
    assert_eq!(json(&body)["error"]["code"], "no_recorder", "{body}");

    let some = router(
        admin(&flag, Some("weir_x_total 3\n"), RequestLimits::default()),
        views(),
    );
    let (status, _, body) = call(&some, Method::GET, "/metrics").await;
    assert_eq!(status, 200);
    assert!(body.starts_with("weir_x_total 3\n"), "{body}");
    if cfg!(target_os = "linux") {
        assert!(body.contains(crate::process::OPEN_FDS), "{body}");
    }
}

#[tokio::test]
async fn service_routes_are_merged_and_refusals_are_json() {
    let flag = Arc::new(Flag(AtomicBool::new(true)));
    let app = router(admin(&flag, None, RequestLimits::default()), views());
    let (status, _, body) = call(&app, Method::GET, "/v1/x").await;
    assert_eq!((status, json(&body)), (200, serde_json::json!({"x": 1})));
    let (status, _, body) = call(&app, Method::GET, "/nope").await;
    assert_eq!(status, 404);
    assert_eq!(json(&body)["error"]["code"], "not_found");
    assert_eq!(
        json(&body)["error"]["message"],
        "paths: /metrics, /healthz, /readyz, /v1/x"
    );
    for path in ["/v1/x", "/metrics", "/readyz", "/healthz"] {
        let (status, _, body) = call(&app, Method::POST, path).await;
        assert_eq!(status, 405, "{path}");
        assert_eq!(json(&body)["error"]["code"], "method_not_allowed", "{path}");
    }
}

/// A view that says when it is entered, then waits to be released.
fn parked(entered: Arc<Notify>, release: Arc<Notify>) -> Router {
    Router::new().route(
        "/v1/slow",
        get(move || async move {
            entered.notify_one();
            release.notified().await;
            "done"
        }),
    )
}

#[tokio::test]
async fn a_request_over_the_concurrency_limit_is_refused_503_overloaded() {
    let flag = Arc::new(Flag(AtomicBool::new(true)));
    let (entered, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let limits = RequestLimits {
        max_concurrent: NonZeroUsize::MIN,
        ..RequestLimits::default()
    };
    let app = router(
        admin(&flag, Some("x 1\n"), limits),
        parked(Arc::clone(&entered), Arc::clone(&release)),
    );
    let first = tokio::spawn({
        let app = app.clone();
        async move { call(&app, Method::GET, "/v1/slow").await }
    });
    entered.notified().await;
    for path in ["/v1/slow", "/metrics"] {
        let (status, retry, body) = call(&app, Method::GET, path).await;
        assert_eq!(status, 503, "{path}");
        assert_eq!(retry.as_deref(), Some("1"), "{path}");
        assert_eq!(json(&body)["error"]["code"], "overloaded", "{path}: {body}");
    }
    // Probes are not counted against the limit.
    assert_eq!(call(&app, Method::GET, "/readyz").await.0, 200);
    release.notify_one();
    assert_eq!(first.await.expect("first").0, 200);
    // The permit went back with the first request.
    assert_eq!(call(&app, Method::GET, "/metrics").await.0, 200);
}

#[tokio::test(start_paused = true)]
async fn a_request_over_the_timeout_is_refused_503_timeout_and_frees_its_permit() {
    let flag = Arc::new(Flag(AtomicBool::new(true)));
    let (entered, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let limits = RequestLimits {
        timeout: Duration::from_secs(2),
        max_concurrent: NonZeroUsize::MIN,
    };
    let app = router(
        admin(&flag, Some("x 1\n"), limits),
        parked(entered, release),
    );
    let start = tokio::time::Instant::now();
    // Never released: the paused clock advances to the timeout.
    let (status, retry, body) = call(&app, Method::GET, "/v1/slow").await;
    assert_eq!(status, 503);
    assert_eq!(retry, None);
    assert_eq!(json(&body)["error"]["code"], "timeout", "{body}");
    assert_eq!(start.elapsed(), Duration::from_secs(2));
    assert_eq!(call(&app, Method::GET, "/metrics").await.0, 200);
}
