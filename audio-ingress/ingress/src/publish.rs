//! The reference browser publisher (`publish_page`): one static page, served as is at
//! `GET /publish` on the listen port, that captures the microphone, publishes it over
//! WHIP ([`crate::whip`]) and shows the person what weir decided (the refusals, the
//! `weir` data channel's events, the resume after a drop). The page is the file
//! `static/publish.html`, compiled in: no build step, no framework, nothing read from
//! disk at run time. docs/publisher.md says how to copy it into an app.
//!
//! Invariant: the page holds no secret and no per-deployment value; the stream id, the
//! token and the ingress URL come from its URL or its fields, so the same bytes work
//! from any origin (the WHIP routes answer CORS).

use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;

/// The page, as served.
pub const PAGE: &str = include_str!("../static/publish.html");

/// The path it is served at.
pub const PATH: &str = "/publish";

/// `GET /publish` (and `HEAD`): the page, never cached (an upgraded ingress serves the
/// page that matches it).
pub fn routes() -> Router {
    Router::new().route(
        PATH,
        get(|| async {
            (
                [
                    (header::CONTENT_TYPE, "text/html; charset=utf-8"),
                    (header::CACHE_CONTROL, "no-cache"),
                    (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
                    // The producer token may be in the page's URL (`?token=`): never
                    // sent on to another origin as a referrer.
                    (header::REFERRER_POLICY, "no-referrer"),
                ],
                PAGE,
            )
                .into_response()
        }),
    )
}
