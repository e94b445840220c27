//! The WebSocket front door: `GET /v1/streams/{stream_id}[?session_id=S]`, one
//! connection per stream (protocol pinned in docs/contracts.md and docs/protocol.md §6;
//! its outcomes, events and close codes tabled in docs/audio-ingress.md § WebSocket
//! protocol).
//!
//! Before the upgrade, the doors' admission ([`crate::door`]; nothing is opened for a
//! refused request), then the upgrade extractor's own refusals (`invalid_upgrade`);
//! every body is `{"error":{"code":..,"message":..}}`. After it, client → server: each
//! binary message is one frame of s16le mono 16 kHz PCM, the text message
//! `{"type":"end"}` ([`control`]) ends the stream; server → client: the JSON events
//! (`opened`/`resumed` and `ack` when resume is on, `gap`, `degraded`, `recovered`,
//! `overload`, `error`, `closed`), then a close frame. A connection that drops (or
//! closes) without `end` parks its stream for a resume ([`crate::resume`]). Frames are
//! pushed with `push`, which waits at most `max_wait` for room: while it waits the
//! socket is not read, so a fast producer is slowed by TCP backpressure before it is
//! refused.
//!
//! `closed` is sent once the stream has finished (or its finish bound passed), whatever
//! ended it, so its counts are what the server confirmed. Every send to the client is
//! bounded by `send_timeout` (`ws_send_timeout_ms`): one that times out (or fails)
//! abandons the socket — no further event, no close frame — and a stream still open
//! ends as if the socket had dropped; counted in `weir_ingress_ws_send_timeouts_total`.
//!
//! Invariants: one handler task per connection and one publisher task per stream; a bad
//! message ends only its own stream and changes nothing else; every await in a handler
//! is bounded (idle timeout, `max_wait`, send timeout, the finish bounds).

use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::response::Response;
use axum::routing::get;
use futures::SinkExt;
use tokio::time::Instant;
use weir_protocol::WireName;
use weir_protocol::audio::extension::EndReason;
use weir_protocol::audio::ws::Event;

use crate::door::{self, BadInput, Door, Ending};
use crate::metrics as m;
use crate::resume::admit::Loss;
use crate::resume::{Attachment, Held};
use weir_audio_producer::publisher::Sink;

mod control;

/// Close codes used by the front door.
pub mod close_code {
    use weir_protocol::audio::extension::EndReason;

    /// Normal end.
    pub const NORMAL: u16 = 1000;
    /// Going away: shutdown or idle.
    pub const GOING_AWAY: u16 = 1001;
    /// Unsupported data: a bad text message.
    pub const UNSUPPORTED: u16 = 1003;
    /// Protocol error: the client broke the WebSocket protocol (unmasked frame, bad
    /// close code, reserved bits, ...).
    pub const PROTOCOL: u16 = 1002;
    /// Invalid payload data: a text message (or close reason) that is not UTF-8.
    pub const INVALID_PAYLOAD: u16 = 1007;
    /// Policy violation: a bad binary frame.
    pub const POLICY: u16 = 1008;
    /// Message too big: a message over the WebSocket layer's limit.
    pub const MESSAGE_TOO_BIG: u16 = 1009;
    /// Internal error.
    pub const INTERNAL: u16 = 1011;
    /// Try again later: overload.
    pub const TRY_AGAIN_LATER: u16 = 1013;
    /// A resume on another connection took the stream (private-use range).
    pub const TAKEN_OVER: u16 = 4001;

    /// The close code of a stream that ended for `reason` on the server side.
    pub fn of_end(reason: EndReason) -> u16 {
        match reason {
            EndReason::Shutdown | EndReason::Idle => GOING_AWAY,
            EndReason::Overload | EndReason::NoCapacity => TRY_AGAIN_LATER,
            EndReason::Producer | EndReason::ProducerGone => NORMAL,
            EndReason::Error => INTERNAL,
        }
    }
}

/// How often a resumable stream's producer is told the last seq the door took (only
/// when it took new frames since).
pub const ACK_INTERVAL: Duration = Duration::from_secs(1);

/// The front door's routes, with the JSON 404/405 answers (a WebSocket-only router;
/// `serve` merges [`routes`] with the WHIP routes instead).
pub fn router<S: Sink>(state: Door<S>) -> Router {
    door::with_fallbacks(routes(state))
}

/// The WebSocket route alone, without fallbacks.
pub fn routes<S: Sink>(state: Door<S>) -> Router {
    Router::new()
        .route("/v1/streams/{stream_id}", get(upgrade::<S>))
        .with_state(state)
}

/// Every refusal carries the JSON body, including the extractors' own (a path that is
/// not UTF-8 once percent-decoded, a bad upgrade request): [`door::Admitted`] answers
/// with the door's.
async fn upgrade<S: Sink>(
    State(state): State<Door<S>>,
    admitted: door::Admitted,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    let ws = match ws {
        Ok(ws) => ws,
        Err(e) => return door::error_response(e.status(), "invalid_upgrade", e.body_text()),
    };
    let requested_at = Instant::now();
    let (att, first_event, resumed) = match state.open_or_resume(admitted, Loss::Declared).await {
        Ok(opened) => opened,
        Err(resp) => return *resp,
    };
    let resumed = resumed.map(|r| (requested_at, r.gaps_before));
    let max_frame = state.ingress.config().max_frame_bytes();
    let guard = state.tracker.token();
    // Messages a little over max_frame_bytes get a clear 1008; far larger ones are cut
    // by the WebSocket layer itself (bounded memory per connection).
    door::bounded_socket(ws, max_frame + 64 * 1024).on_upgrade(move |socket| {
        // One span per producer connection, with the stream it feeds.
        let span = tracing::info_span!("ws", stream = %att.handle().id());
        tracing::Instrument::instrument(
            async move {
                let _guard = guard;
                let conn = Conn {
                    socket,
                    send_timeout: state.send_timeout,
                    abandoned: false,
                };
                serve_socket(conn, att, first_event, resumed, state.idle_timeout).await;
            },
            span,
        )
    })
}

/// Why the receive loop stopped.
enum Outcome {
    /// The socket closed or failed without `end`, or a send to it timed out (the
    /// client stopped reading).
    Gone,
    /// The client sent a close frame without `end` (its echo is sent): the stream
    /// ends with `producer_gone`, or `error` when the close was a protocol violation
    /// (a close code the client may not send, echoed as 1002).
    ClientClosed {
        /// The client's close was a protocol violation.
        violation: bool,
    },
    /// A resume on another connection took the stream.
    TakenOver,
    /// The stream ends at this door: `{"type":"end"}`, a bad message (binary frame:
    /// close 1008; text: 1003) or a broken WebSocket protocol (1002, 1007, 1009), an
    /// overload, no frame for `idle_timeout`, or an end from the server side.
    Ends(Ending),
}

impl From<Ending> for Outcome {
    fn from(e: Ending) -> Self {
        Self::Ends(e)
    }
}

/// How a failed read ends the connection: the client broke the protocol (the stream
/// ends `error`) or the connection is simply gone.
fn read_failure(e: axum::Error) -> Outcome {
    violation(e, "message_too_big").map_or(Outcome::Gone, |b| Ending::Bad(b).into())
}

/// The close code, error code and message of a failed read where the client broke the
/// WebSocket protocol (`too_big`: the error code of a message over the limit); `None`
/// when the connection is simply gone.
pub(crate) fn violation(e: axum::Error, too_big: &'static str) -> Option<BadInput> {
    use tungstenite::error::{Error as WsError, ProtocolError};
    let e = e.into_inner().downcast::<WsError>().ok()?;
    let (close, code) = match &*e {
        WsError::Utf8(_) => (close_code::INVALID_PAYLOAD, "invalid_utf8"),
        WsError::Capacity(_) => (close_code::MESSAGE_TOO_BIG, too_big),
        WsError::Protocol(ProtocolError::ResetWithoutClosingHandshake) => return None,
        WsError::Protocol(_) => (close_code::PROTOCOL, "protocol_error"),
        _ => return None,
    };
    Some(BadInput::new(close, code, e.to_string()))
}

/// The server side of one connection. Every send is bounded by `send_timeout`; after
/// the first send that fails or times out the socket is abandoned and later sends are
/// skipped, so a connection never costs more than one timeout of waiting.
struct Conn {
    socket: WebSocket,
    send_timeout: Duration,
    abandoned: bool,
}

/// One send of a door to its client (`peer`, for the log) within `send_timeout`: `Err`
/// when it failed, `Err(true)` when it timed out (the client stopped reading; counted in
/// `weir_ingress_ws_send_timeouts_total`). Either way the door abandons the socket.
pub(crate) async fn send_within<T>(
    sink: &mut T,
    message: Message,
    send_timeout: Duration,
    peer: &str,
) -> Result<(), bool>
where
    T: futures::Sink<Message> + Unpin,
{
    match tokio::time::timeout(send_timeout, sink.send(message)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(_)) => Err(false),
        Err(_) => {
            metrics::counter!(m::WS_SEND_TIMEOUTS_TOTAL).increment(1);
            tracing::warn!(
                send_timeout_ms = send_timeout.as_millis() as u64,
                "{peer} is not reading: send timed out, connection abandoned"
            );
            Err(true)
        }
    }
}

impl Conn {
    /// Sends `message` within the send timeout. `false` when the socket is (now)
    /// abandoned.
    async fn send(&mut self, message: Message) -> bool {
        if !self.abandoned {
            let sent = send_within(
                &mut self.socket,
                message,
                self.send_timeout,
                "WebSocket client",
            );
            self.abandoned = sent.await.is_err();
        }
        !self.abandoned
    }

    /// Sends one JSON text event (see [`Self::send`]).
    async fn send_json(&mut self, value: serde_json::Value) -> bool {
        self.send(Message::Text(value.to_string().into())).await
    }

    /// Sends what the WebSocket layer queued by itself (the echo of a client's close),
    /// within the send timeout.
    async fn flush(&mut self) {
        if !self.abandoned {
            let _ = tokio::time::timeout(self.send_timeout, self.socket.flush()).await;
        }
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

/// Runs one connection: `first_event` (`opened` or `resumed`; `None`: resume off),
/// then frames in, events out, until an [`Outcome`]. `resumed`: when the resume was
/// requested (for the latency to its first admitted frame) and the stream's gap count
/// before its loss was declared. The capacity ticket is held until the stream
/// finished; a connection that went away without `end` leaves the stream parked for a
/// resume (its attachment is dropped).
async fn serve_socket(
    mut socket: Conn,
    mut att: Attachment,
    first_event: Option<serde_json::Value>,
    resumed: Option<(Instant, u64)>,
    idle_timeout: Duration,
) {
    let revoked = att.revoked();
    tokio::pin!(revoked);
    let resumable = att.token().is_some();
    let mut resumed_at = resumed.map(|(at, _)| at);
    let mut status = match resumed {
        Some((_, gaps_before)) => door::StatusWatch::since(att.handle(), gaps_before),
        None => door::StatusWatch::new(att.handle()),
    };
    let outcome = 'serve: {
        if let Some(ev) = first_event
            && !socket.send_json(ev).await
        {
            break 'serve Outcome::Gone;
        }
        let (handle, ticket) = att.parts();
        // One timer for the connection. A message only records its time; the timer is
        // moved when it fires early (resetting it for every frame cost a timer-wheel
        // update per frame).
        let idle = tokio::time::sleep(idle_timeout);
        tokio::pin!(idle);
        let mut last_message = Instant::now();
        let mut ack = tokio::time::interval(ACK_INTERVAL);
        ack.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let (mut took, mut acked) = (0u64, 0u64);
        loop {
            tokio::select! {
                // Status first: a producer that floods frames must not starve its own
                // gap/overload events (an unbiased select picks the ready socket read
                // almost every time under load).
                biased;
                () = &mut revoked => break Outcome::TakenOver,
                change = status.next_or_notice(ticket, handle) => {
                    if let Some(ev) = change.event
                        && !socket.send_json(ev).await
                    {
                        // Failed or timed out (a client that stopped reading): the stream
                        // goes on as if the socket had dropped.
                        break Outcome::Gone;
                    }
                    if let Some(stop) = change.stop {
                        break stop.into();
                    }
                }
                msg = socket.socket.recv() => match msg {
                    None => break Outcome::Gone,
                    Some(Err(e)) => break read_failure(e),
                    Some(Ok(Message::Close(frame))) => {
                        // The WebSocket layer answers a close code the client may not send
                        // (1004-1006, 1015, under 1000, ...) as a protocol error, 1002.
                        let violation = frame.is_some_and(|f| f.code == close_code::PROTOCOL);
                        break Outcome::ClientClosed { violation };
                    }
                    Some(Ok(Message::Binary(data))) => {
                        last_message = Instant::now();
                        match handle.push(data).await {
                            Ok(seq) => {
                                took = seq;
                                if let Some(t) = resumed_at.take() {
                                    metrics::histogram!(m::RESUME_SECONDS)
                                        .record(t.elapsed().as_secs_f64());
                                }
                            }
                            Err(e) => break Ending::from(e).into(),
                        }
                    }
                    Some(Ok(Message::Text(text))) => match control::parse(text.as_str()) {
                        Ok(()) => break Ending::Producer.into(),
                        Err(e) => break Ending::Bad(BadInput::unsupported("bad_message", e.to_string())).into(),
                    },
                    Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
                },
                _ = ack.tick(), if resumable => {
                    if took > acked {
                        acked = took;
                        if !socket.send_json(door::event_value(&Event::Ack { seq: took })).await {
                            break Outcome::Gone;
                        }
                    }
                }
                () = &mut idle => {
                    let due = last_message + idle_timeout;
                    if due <= Instant::now() {
                        break Ending::Idle.into();
                    }
                    idle.as_mut().reset(due);
                }
            }
        }
    };
    finish_socket(socket, att, outcome).await;
}

/// Ends the connection for `outcome`. A stream its producer may come back for is let
/// go of (parked, or ended `producer_gone` with resume off); any other ends at this
/// door, and its capacity slot is held until it finished.
async fn finish_socket(mut socket: Conn, att: Attachment, outcome: Outcome) {
    // The end reason of a stream that ends here is told to a later resume's claimant.
    let ending = match outcome {
        Outcome::Ends(ending) => ending,
        // Parked (a takeover's claimant takes the stream now).
        Outcome::Gone => return drop(att),
        Outcome::TakenOver => {
            drop(att);
            let message = "a resume on another connection took this stream; it goes on there";
            socket
                .send_json(door::error_event("taken_over", message))
                .await;
            return socket.close(close_code::TAKEN_OVER, "taken_over").await;
        }
        // The close handshake: the echo was queued by the WebSocket layer.
        Outcome::ClientClosed { violation: false } => {
            drop(att);
            return socket.flush().await;
        }
        Outcome::ClientClosed { violation: true } => {
            let mut held = att.end(EndReason::Error.as_str());
            held.handle.close(EndReason::Error);
            // The close handshake, as above; releasing the handle ends the stream.
            socket.flush().await;
            return held.release();
        }
    };
    let Held { mut handle, ticket } = att.end(ending.reason().as_str());
    let status = handle.status();
    // `closed` reports the finished stream (what was published, whether the `end` was
    // delivered); what was admitted before a bad message is still published.
    if let Some(ev) = ending.close(&mut handle) {
        socket.send_json(ev).await;
    }
    let summary = ending.finished(&handle).await;
    let (code, reason) = ending.close_frame("end");
    socket
        .send_json(door::closed_event(ending.reason(), &summary))
        .await;
    socket.close(code, reason).await;
    door::release_when_finished(ticket, status);
}
