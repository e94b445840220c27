//! The WebSocket front door: `GET /v1/streams/{stream_id}[?session_id=S]`, one
//! connection per stream (protocol pinned in docs/contracts.md and docs/protocol.md §6).
//!
//! Before the upgrade (nothing is opened for a refused request):
//! `400` unsafe stream id or session id, `409` id already active, `503` + `Retry-After`
//! when NATS is not connected (`not_ready`: disconnected, or before the first
//! connect), when `max_streams` are active or the service is shutting down. Body:
//! `{"error":{"code":..,"message":..}}`.
//!
//! After the upgrade, client → server: each binary message is one frame of s16le mono
//! 16 kHz PCM (even length, 2..=`max_frame_bytes`); the text message `{"type":"end"}`
//! ends the stream. Server → client: JSON text events `overload`, `gap`, `error`,
//! `closed`, then a close frame:
//!
//! | outcome | events | close code |
//! |---|---|---|
//! | client sent `{"type":"end"}` | `closed` (after the `end` is handed to NATS) | 1000 |
//! | overload (`close` policy) | `overload`, `closed` | 1013 |
//! | bad binary frame (odd, empty, too large) | `error`, `closed` | 1008 |
//! | bad text message | `error`, `closed` | 1003 |
//! | service shutting down | `closed` | 1001 |
//! | no frame for `idle_timeout` | `closed` | 1001 |
//! | internal error | `closed` | 1011 |
//!
//! A socket that drops without `end` ends the stream with `producer_gone` (queued
//! frames are still published). Frames are pushed with `push`, which waits at most
//! `max_wait` for room: while it waits the socket is not read, so a fast producer is
//! slowed by TCP backpressure before it is refused.
//!
//! Every send to the client (event or close frame) is bounded by `send_timeout`
//! (`ws_send_timeout_ms`): a client that stops reading fills the TCP buffers, and an
//! unbounded send would hold the handler task and the stream slot forever. A send that
//! times out (or fails) abandons the socket: no further event, no close frame. If the
//! stream was still open it ends as if the socket had dropped (`producer_gone`: queue
//! drained, `end` published); if it was already ending, it keeps its reason. Counted in
//! `weir_ingress_ws_send_timeouts_total`.
//!
//! Invariants: one handler task per connection and one publisher task per stream; a bad
//! message ends only its own stream and changes nothing else; every await in a handler
//! is bounded (idle timeout, `max_wait`, send timeout, the finish bounds).

use std::time::Duration;

use axum::Router;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Deserialize;
use serde_json::json;
use tokio::time::Instant;
use weir_protocol::StreamId;
use weir_protocol::audio::extension::{EndReason, Overload};

use crate::error::{OpenError, PushError};
use crate::metrics as m;
use crate::publisher::Sink;
use crate::shutdown::TaskTracker;
use crate::stream::{Ingress, StreamHandle, StreamSummary};

/// Close codes used by the front door.
pub mod close_code {
    /// Normal end.
    pub const NORMAL: u16 = 1000;
    /// Going away: shutdown or idle.
    pub const GOING_AWAY: u16 = 1001;
    /// Unsupported data: a bad text message.
    pub const UNSUPPORTED: u16 = 1003;
    /// Policy violation: a bad binary frame.
    pub const POLICY: u16 = 1008;
    /// Internal error.
    pub const INTERNAL: u16 = 1011;
    /// Try again later: overload.
    pub const TRY_AGAIN_LATER: u16 = 1013;
}

/// What the front door needs.
#[derive(Clone)]
pub struct WsState<S: Sink> {
    /// The producer core.
    pub ingress: Ingress<S>,
    /// `Retry-After` for 503.
    pub retry_after: Duration,
    /// A connection silent for this long is ended (reason `idle`).
    pub idle_timeout: Duration,
    /// Bound on one send to the client; on expiry the socket is abandoned.
    pub send_timeout: Duration,
    /// Tracks connection handlers so shutdown can wait for their close frames.
    pub tracker: TaskTracker,
}

/// The front door's routes.
pub fn router<S: Sink>(state: WsState<S>) -> Router {
    Router::new()
        .route("/v1/streams/{stream_id}", get(upgrade::<S>))
        .with_state(state)
}

/// Query parameters of the upgrade request.
#[derive(Debug, Default, Deserialize)]
pub struct StreamQuery {
    /// Carried as `session_id` in every packet's meta.
    #[serde(default)]
    pub session_id: Option<String>,
}

fn error_response(status: StatusCode, code: &str, message: String) -> Response {
    let body = json!({"error": {"code": code, "message": message}});
    (status, axum::Json(body)).into_response()
}

async fn upgrade<S: Sink>(
    State(state): State<WsState<S>>,
    Path(stream_id): Path<String>,
    Query(query): Query<StreamQuery>,
    ws: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Response {
    let id = match StreamId::parse(&stream_id) {
        Ok(id) => id,
        Err(e) => {
            state.ingress.global().admission_rejected("invalid_id");
            return error_response(StatusCode::BAD_REQUEST, "invalid_stream_id", e.to_string());
        }
    };
    let ws = match ws {
        Ok(ws) => ws,
        Err(rejection) => return rejection.into_response(),
    };
    // Readiness gates admission: a stream opened while NATS is disconnected (or before
    // the first connect) could only queue into the client; refuse it like a full cap.
    if !state.ingress.sink().is_connected() {
        state.ingress.global().admission_rejected("not_ready");
        let mut resp = error_response(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_ready",
            "not connected to NATS; retry later".to_owned(),
        );
        insert_retry_after(&mut resp, state.retry_after);
        return resp;
    }
    let session = query.session_id.filter(|s| !s.is_empty());
    let handle = match state.ingress.open_id(id, session) {
        Ok(h) => h,
        Err(e) => return open_refusal(&e, state.retry_after),
    };
    let max_frame = state.ingress.config().max_frame_bytes();
    let guard = state.tracker.guard();
    // Messages a little over max_frame_bytes get a clear 1008; far larger ones are cut
    // by the WebSocket layer itself (bounded memory per connection).
    ws.max_message_size(max_frame + 64 * 1024)
        .max_frame_size(max_frame + 64 * 1024)
        // tungstenite reserves 128 KiB per connection by default, i.e. ~8x the whole
        // default PCM budget of a stream; frames are at most a few KiB.
        .read_buffer_size(WS_READ_BUFFER_BYTES)
        .on_upgrade(move |socket| async move {
            let _guard = guard;
            let conn = Conn::new(socket, state.send_timeout);
            serve_socket(conn, handle, state.idle_timeout).await;
        })
}

fn open_refusal(e: &OpenError, retry_after: Duration) -> Response {
    let (status, code) = match e {
        OpenError::InvalidId(_) | OpenError::InvalidSession(_) => {
            (StatusCode::BAD_REQUEST, "invalid_request")
        }
        OpenError::AlreadyActive(_) => (StatusCode::CONFLICT, "stream_active"),
        OpenError::TooManyStreams { .. } => (StatusCode::SERVICE_UNAVAILABLE, "max_streams"),
        OpenError::ShuttingDown => (StatusCode::SERVICE_UNAVAILABLE, "shutting_down"),
        OpenError::NoRuntime => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
    };
    let mut resp = error_response(status, code, e.to_string());
    if status == StatusCode::SERVICE_UNAVAILABLE {
        insert_retry_after(&mut resp, retry_after);
    }
    resp
}

fn insert_retry_after(resp: &mut Response, retry_after: Duration) {
    if let Ok(v) = HeaderValue::from_str(&retry_after.as_secs().max(1).to_string()) {
        resp.headers_mut().insert(header::RETRY_AFTER, v);
    }
}

/// Why the receive loop stopped.
enum Outcome {
    /// `{"type":"end"}`.
    End,
    /// The socket closed or failed without `end`, or a send to it timed out (the
    /// client stopped reading).
    Gone,
    /// A bad binary frame.
    BadFrame(String),
    /// A bad text message.
    BadText(String),
    /// The stream overloaded.
    Overload(Overload),
    /// The stream was closed from the server side (shutdown) or ended otherwise.
    Closed(EndReason),
    /// No frame for `idle_timeout`.
    Idle,
}

#[derive(Deserialize)]
struct Control {
    #[serde(rename = "type")]
    ty: String,
}

/// The server side of one connection. Every send is bounded by `send_timeout`; after
/// the first send that fails or times out the socket is abandoned and later sends are
/// skipped, so a connection never costs more than one timeout of waiting.
struct Conn {
    socket: WebSocket,
    send_timeout: Duration,
    abandoned: bool,
}

impl Conn {
    fn new(socket: WebSocket, send_timeout: Duration) -> Self {
        Self {
            socket,
            send_timeout,
            abandoned: false,
        }
    }

    /// Sends `message` within the send timeout. `false` when the socket is (now)
    /// abandoned.
    async fn send(&mut self, message: Message) -> bool {
        if self.abandoned {
            return false;
        }
        match tokio::time::timeout(self.send_timeout, self.socket.send(message)).await {
            Ok(Ok(())) => return true,
            Ok(Err(_)) => {}
            Err(_) => {
                metrics::counter!(m::WS_SEND_TIMEOUTS_TOTAL).increment(1);
                tracing::warn!(
                    send_timeout_ms = self.send_timeout.as_millis() as u64,
                    "WebSocket client is not reading: send timed out, connection abandoned"
                );
            }
        }
        self.abandoned = true;
        false
    }

    /// Sends one JSON text event (see [`Self::send`]).
    async fn send_json(&mut self, value: serde_json::Value) -> bool {
        self.send(Message::Text(value.to_string().into())).await
    }

    /// Receives the next message (not bounded here: the caller selects on it).
    async fn recv(&mut self) -> Option<Result<Message, axum::Error>> {
        self.socket.recv().await
    }

    /// Sends the close frame (unless the socket was abandoned) and waits briefly for
    /// the client's reply so that the close frame is not lost to a reset.
    async fn close(mut self, code: u16, reason: &'static str) {
        let frame = CloseFrame {
            code,
            reason: reason.into(),
        };
        if !self.send(Message::Close(Some(frame))).await {
            return;
        }
        metrics::counter!(m::WS_CLOSES_TOTAL, m::LABEL_CODE => code.to_string()).increment(1);
        // A client that does not answer is dropped.
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            while let Some(Ok(_)) = self.socket.recv().await {}
        })
        .await;
    }
}

fn overload_event(o: &Overload, handle: &StreamHandle) -> serde_json::Value {
    let snapshot = handle.snapshot();
    json!({
        "type": "overload",
        "reason": o.reason,
        "dropped_frames": o.dropped_frames,
        "dropped_samples": o.dropped_samples,
        "pending_bytes": o.pending_bytes,
        "max_bytes": o.max_bytes,
        "max_age_ms": o.max_age_ms,
        "frames_published": snapshot.frames.published,
    })
}

fn closed_event(reason: &str, summary: &StreamSummary) -> serde_json::Value {
    let f = &summary.snapshot.frames;
    json!({
        "type": "closed",
        "reason": reason,
        "frames_published": f.published,
        "frames_dropped": f.dropped.values().sum::<u64>(),
        "end_delivered": summary.snapshot.end_delivered,
    })
}

/// Initial read buffer of one WebSocket connection (frames are 640 bytes, at most
/// `max_frame_bytes`; the buffer still grows for a larger message up to the limit).
const WS_READ_BUFFER_BYTES: usize = 16 * 1024;

/// Runs one connection: frames in, events out, until an [`Outcome`].
async fn serve_socket(mut socket: Conn, handle: StreamHandle, idle_timeout: Duration) {
    let mut status = handle.status();
    let mut gaps_seen = 0;
    // One timer for the connection, pushed back on every message (not one per message).
    let idle = tokio::time::sleep(idle_timeout);
    tokio::pin!(idle);
    let outcome = loop {
        tokio::select! {
            // Status first: a producer that floods frames must not starve its own
            // gap/overload events (an unbiased select picks the ready socket read
            // almost every time under load).
            biased;
            changed = status.changed() => {
                if changed.is_err() {
                    break Outcome::Closed(EndReason::Error);
                }
                let s = status.borrow_and_update().clone();
                if s.gaps > gaps_seen {
                    gaps_seen = s.gaps;
                    if let Some(g) = s.last_gap {
                        let ev = json!({
                            "type": "gap", "first_seq": g.first_seq, "last_seq": g.last_seq,
                            "frames": g.frames(), "samples": g.samples, "reason": g.reason,
                            "gaps_total": s.gaps,
                        });
                        if !socket.send_json(ev).await {
                            // Failed or timed out (a client that stopped reading):
                            // the stream ends as if the socket had dropped.
                            break Outcome::Gone;
                        }
                    }
                }
                if let Some(o) = s.overload {
                    break Outcome::Overload(o);
                }
                if let Some(r) = s.end_reason {
                    break Outcome::Closed(r);
                }
            }
            msg = socket.recv() => match msg {
                None | Some(Err(_)) | Some(Ok(Message::Close(_))) => break Outcome::Gone,
                Some(Ok(Message::Binary(data))) => {
                    idle.as_mut().reset(Instant::now() + idle_timeout);
                    match handle.push(data).await {
                        Ok(_) => {}
                        Err(PushError::InvalidFrame(e)) => break Outcome::BadFrame(e.to_string()),
                        Err(PushError::Overloaded(o)) => break Outcome::Overload(o),
                        Err(PushError::Closed(r)) => break Outcome::Closed(r),
                        Err(e @ PushError::Full { .. }) => break Outcome::BadFrame(e.to_string()),
                    }
                }
                Some(Ok(Message::Text(text))) => {
                    match serde_json::from_str::<Control>(text.as_str()) {
                        Ok(c) if c.ty == "end" => break Outcome::End,
                        Ok(c) => break Outcome::BadText(format!("unknown message type {:?}; the only text message is {{\"type\":\"end\"}}", c.ty)),
                        Err(e) => break Outcome::BadText(format!("not a JSON control message: {e}")),
                    }
                }
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
            },
            () = &mut idle => break Outcome::Idle,
        }
    };
    finish_socket(socket, handle, outcome).await;
}

async fn finish_socket(mut socket: Conn, handle: StreamHandle, outcome: Outcome) {
    match outcome {
        Outcome::Gone => {
            // Dropping the handle ends the stream with `producer_gone`.
            drop(handle);
        }
        Outcome::End => {
            let summary = handle.finish().await;
            socket
                .send_json(closed_event(EndReason::Producer.as_str(), &summary))
                .await;
            socket.close(close_code::NORMAL, "end").await;
        }
        Outcome::Overload(o) => {
            socket.send_json(overload_event(&o, &handle)).await;
            let summary = StreamSummary {
                snapshot: handle.snapshot(),
                finished: false,
            };
            socket
                .send_json(closed_event(EndReason::Overload.as_str(), &summary))
                .await;
            socket.close(close_code::TRY_AGAIN_LATER, "overload").await;
        }
        Outcome::BadFrame(message) => {
            refuse(socket, handle, close_code::POLICY, "bad_frame", message).await;
        }
        Outcome::BadText(message) => {
            refuse(
                socket,
                handle,
                close_code::UNSUPPORTED,
                "bad_message",
                message,
            )
            .await;
        }
        Outcome::Idle => {
            let summary = handle.finish_with(EndReason::Idle).await;
            socket
                .send_json(closed_event(EndReason::Idle.as_str(), &summary))
                .await;
            socket.close(close_code::GOING_AWAY, "idle").await;
        }
        Outcome::Closed(reason) => {
            let bound = Duration::from_secs(30);
            let summary = handle.wait_finished(bound).await;
            socket
                .send_json(closed_event(reason.as_str(), &summary))
                .await;
            let code = match reason {
                EndReason::Shutdown | EndReason::Idle => close_code::GOING_AWAY,
                EndReason::Overload => close_code::TRY_AGAIN_LATER,
                EndReason::Producer | EndReason::ProducerGone => close_code::NORMAL,
                EndReason::Error => close_code::INTERNAL,
            };
            socket.close(code, reason.as_str()).await;
        }
    }
}

/// Ends the stream (reason `error`) after a bad message: `error` event, `closed`
/// event, close `code`. What was admitted before is still published.
async fn refuse(
    mut socket: Conn,
    mut handle: StreamHandle,
    code: u16,
    error_code: &'static str,
    message: String,
) {
    // Ended first, so that a client that does not read cannot delay it.
    handle.close(EndReason::Error);
    socket
        .send_json(json!({"type": "error", "code": error_code, "message": message}))
        .await;
    let summary = StreamSummary {
        snapshot: handle.snapshot(),
        finished: false,
    };
    socket
        .send_json(closed_event(EndReason::Error.as_str(), &summary))
        .await;
    socket.close(code, error_code).await;
}
