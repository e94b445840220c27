//! The telephony door: a phone carrier's media stream (Twilio Media Streams, Telnyx
//! media streaming) on the WebSocket port, both directions. A carrier connects to
//! `GET /v1/telephony/twilio`, `/v1/telephony/telnyx` or `/v1/telephony` (the dialect
//! read from its first message) and speaks its own published protocol unchanged
//! (`weir_audio_telephony::dialect`); the door turns it into one weir stream. The
//! protocol — admission at the carrier's `start`, the subjects and events of a call,
//! the refused messages and every end with its close code — is docs/protocol.md §6.3.
//!
//! **Caller → recognition** ([`call`], [`inbound`]): the stream is admitted like the
//! other doors' ([`crate::door`]) at `start`; each `media` chunk goes through the
//! reorder window, is decoded, resampled to 16 kHz and cut into 20 ms frames pushed on
//! the stream's handle. A missing chunk, or one later than the window, is a declared
//! gap (reason `source`), never a frame out of order.
//!
//! **Bot → caller** ([`outbound`]): the bot's PCM from NATS is queued (bounded in bytes
//! and age), encoded to the call's format and paced to the socket at real time, with
//! its marks; `clear` drops the queue at once ([`voice`]: the subjects and events).
//!
//! Invariants: per call one reader task (this connection's handler), one writer task
//! (the only one that sends to the socket, every send bounded by `ws_send_timeout_ms`),
//! one bot-audio intake task and one events task — never a task per chunk or frame; a
//! bad message ends only its own call and nothing it carried reaches NATS as audio;
//! every frame pushed is accounted by the producer core as for the other doors.

mod call;
mod inbound;
mod outbound;
pub mod voice;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::rejection::PathRejection;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::Response;
use axum::routing::get;
use weir_audio_telephony::dialect::{self, Dialect};
use weir_audio_telephony::outbound::OutboundConfig;

use crate::door::{self, Door, error_response};
use weir_audio_producer::publisher::Sink;

/// The telephony door's settings (`[telephony]` keys).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TelephonyConfig {
    /// Prefix of the bot-audio, control and event subjects (`telephony.subject_prefix`).
    pub subject_prefix: String,
    /// How long a chunk waits for a missing earlier one (`telephony.reorder_window_ms`).
    pub reorder_window: Duration,
    /// A connection without `start` within this is closed (`telephony.start_timeout_ms`).
    pub start_timeout: Duration,
    /// A call's bot-audio bounds and pacing (`telephony.out_max_bytes`,
    /// `telephony.out_max_age_ms`, `telephony.out_lead_ms`).
    pub out: OutboundConfig,
    /// Bound of every call's queued bot audio together (`telephony.out_max_total_bytes`).
    pub out_max_total_bytes: usize,
}

/// What the telephony door needs.
#[derive(Clone)]
pub struct TelephonyState<S: Sink> {
    /// What every door shares (a call is never parked: carriers do not resume).
    pub door: Door<S>,
    /// The door's settings.
    pub config: Arc<TelephonyConfig>,
    /// The NATS client of the bot-audio path and the call events; `None` (a service
    /// started on another sink): inbound only.
    pub nats: Option<async_nats::Client>,
    /// Bytes of bot audio queued by every call of this door.
    pub out_total: Arc<std::sync::atomic::AtomicUsize>,
}

/// The telephony routes, without fallbacks (`serve` merges them with the others).
pub fn routes<S: Sink>(state: TelephonyState<S>) -> Router {
    Router::new()
        .route("/v1/telephony", get(upgrade::<S>))
        .route("/v1/telephony/{dialect}", get(upgrade::<S>))
        .with_state(state)
}

/// `/v1/telephony/{dialect}`, or `/v1/telephony` (the dialect read from the first
/// message). Before the upgrade: the query (only `access_token` is read), readiness.
/// The stream itself is admitted at the carrier's `start` ([`call`]).
async fn upgrade<S: Sink>(
    State(state): State<TelephonyState<S>>,
    path: Result<Option<Path<String>>, PathRejection>,
    uri: Uri,
    headers: HeaderMap,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    let Ok(Ok(dialect)) = path.map(|p| p.map(|Path(p)| p.parse::<Dialect>()).transpose()) else {
        return error_response(
            StatusCode::NOT_FOUND,
            "not_found",
            "the telephony paths are /v1/telephony/twilio, /v1/telephony/telnyx and /v1/telephony",
        );
    };
    let ws = match ws {
        Ok(ws) => ws,
        Err(e) => return door::error_response(e.status(), "invalid_upgrade", e.body_text()),
    };
    let query = match state.door.query(uri.query()) {
        Ok(q) => q,
        Err(resp) => return *resp,
    };
    if let Err(resp) = state.door.ready() {
        return *resp;
    }
    let token = crate::auth::token_of(door::bearer(&headers), query.access_token.as_deref())
        .map(str::to_owned);
    let guard = state.door.tracker.token();
    door::bounded_socket(ws, dialect::MAX_MESSAGE_BYTES).on_upgrade(move |socket| {
        let span = tracing::info_span!("telephony");
        tracing::Instrument::instrument(
            async move {
                let _guard = guard;
                call::serve(socket, state, dialect, token).await;
            },
            span,
        )
    })
}

/// Sleeps until `at`; never resolves without one.
async fn sleep_until(at: Option<std::time::Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t.into()).await,
        None => std::future::pending().await,
    }
}
