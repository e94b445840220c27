//! One carrier connection, from the upgrade to the close: waits for `start` (nothing
//! is opened before it), admits the stream, then reads the carrier's events until an
//! [`Outcome`], and ends the stream and the socket as the table in [`super`] says.
//!
//! The reader (this task) never sends: every message to the carrier goes through the
//! call's [`Writer`], so a carrier that stops reading holds the writer for at most one
//! send timeout and never the inbound audio.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{Message, WebSocket};
use axum::http::StatusCode;
use futures::StreamExt;
use futures::stream::SplitStream;
use serde_json::json;
use tokio::sync::mpsc;
use tokio::time::Instant;
use weir_audio_telephony::codec::{Encoder, Encoding, MediaFormat};
use weir_audio_telephony::dialect::{self, Dialect, DialectError, Inbound, Start, Track};
use weir_protocol::WireName;
use weir_protocol::audio::extension::EndReason;
use weir_service::shutdown::CancellationToken;

use super::TelephonyState;
use super::inbound::{InboundAudio, Ready};
use super::outbound::{self, Cmd, Shared, Started, Writer};
use super::voice::{Events, Subjects};
use crate::capacity::Ticket;
use crate::door::{self, BadInput, Ending};
use crate::metrics as m;
use crate::ws::close_code;
use weir_audio_producer::Lost;
use weir_audio_producer::publisher::Sink;
use weir_audio_producer::stream::StreamHandle;

impl BadInput {
    /// A message the dialect could not read: close 1009 when too large, else 1003.
    fn dialect(e: &DialectError) -> Self {
        let close = if e.code() == "too_large" {
            close_code::MESSAGE_TOO_BIG
        } else {
            close_code::UNSUPPORTED
        };
        Self::new(close, e.code(), e.to_string())
    }
}

/// Why the read loop stopped.
enum Outcome {
    /// The socket dropped or closed without `stop`, or the writer abandoned it.
    Gone,
    /// The call ends: the carrier's `stop` ([`Ending::Producer`]), a bad message, an
    /// overload, no message for `idle_timeout`, or an end from the server side
    /// (shutdown, no capacity, ...).
    Ends(Ending),
}

impl From<BadInput> for Outcome {
    fn from(b: BadInput) -> Self {
        Self::Ends(Ending::Bad(b))
    }
}

/// Serves one carrier connection.
pub(super) async fn serve<S: Sink>(
    socket: WebSocket,
    state: TelephonyState<S>,
    dialect: Option<Dialect>,
    token: Option<String>,
) {
    let cfg = Arc::clone(&state.config);
    let (sink, mut stream) = socket.split();
    let shared = Shared::new(
        cfg.out,
        Arc::clone(&state.out_total),
        cfg.out_max_total_bytes,
    );
    let (writer, writer_task) = Writer::spawn(sink, Arc::clone(&shared), state.door.send_timeout);
    let started = tokio::time::timeout(cfg.start_timeout, wait_start(&mut stream, dialect))
        .await
        .unwrap_or_else(|_| Err(BadInput::policy("start_timeout", "").into()))
        .and_then(|(dialect, start)| {
            let format = return_format(dialect, &start)?;
            Ok((dialect, start, format))
        });
    let (dialect, start, return_format) = match started {
        Ok(s) => s,
        Err(Outcome::Ends(Ending::Bad(b))) => {
            count_bad(&b);
            let close = Cmd::Close(b.close, b.code.to_owned());
            return finish_writer(writer, writer_task, Some(close)).await;
        }
        // The socket is gone.
        Err(_) => return finish_writer(writer, writer_task, None).await,
    };
    let label = dialect.as_str();
    let (handle, ticket) = match admit(&state, &start, token.as_deref()) {
        Ok(opened) => opened,
        Err((code, reason)) => {
            metrics::counter!(m::TELEPHONY_CALLS_TOTAL, m::LABEL_DIALECT => label, m::LABEL_OUTCOME => "refused")
                .increment(1);
            return finish_writer(writer, writer_task, Some(Cmd::Close(code, reason))).await;
        }
    };
    metrics::counter!(m::TELEPHONY_CALLS_TOTAL, m::LABEL_DIALECT => label, m::LABEL_OUTCOME => "started")
        .increment(1);
    let _active = ActiveCall::new();
    let id = handle.id().as_str().to_owned();
    tracing::info!(stream = %id, dialect = label, call = %start.call_id, "call started");
    let subjects = Subjects::new(&cfg.subject_prefix, &id);
    let events = match &state.nats {
        Some(client) => Events::start(client.clone(), subjects.events.clone()),
        None => Events::none(),
    };
    let started = Started {
        dialect,
        stream_sid: start.stream_sid.clone(),
        encoder: Encoder::new(return_format),
        events: events.clone(),
    };
    let _ = writer.send(Cmd::Start(Box::new(started))).await;
    let stop_intake = CancellationToken::new();
    let intake = match &state.nats {
        Some(client) => spawn_intake(client, &subjects, &shared, &events, &stop_intake).await,
        None => None,
    };
    let format = format!("{}/{}", start.format.encoding, start.format.sample_rate);
    events.emit(json!({
        "type": "started", "stream": id, "dialect": label, "call_id": start.call_id,
        "stream_sid": start.stream_sid, "format": format,
        "bot_audio": subjects.out, "control": subjects.ctl,
    }));
    let mut call = Call {
        counts: Counts::new(),
        handle,
        ticket,
        inbound: InboundAudio::new(start.format, cfg.reorder_window),
        shared: Arc::clone(&shared),
        events: events.clone(),
    };
    let outcome = call
        .read(&mut stream, dialect, state.door.idle_timeout)
        .await;
    stop_intake.cancel();
    if let Some(mut task) = intake
        && tokio::time::timeout(Duration::from_secs(2), &mut task)
            .await
            .is_err()
    {
        task.abort();
    }
    let Call {
        handle,
        ticket,
        mut inbound,
        ..
    } = call;
    metrics::counter!(m::TELEPHONY_CHUNKS_TOTAL, m::LABEL_OUTCOME => "reordered")
        .increment(inbound.reordered());
    let status = handle.status();
    let (reason, close_cmd) = end(handle, &mut inbound, outcome, &events).await;
    let (unplayed_ms, unplayed_marks) = shared.end();
    events.emit(json!({
        "type": "stopped", "reason": reason.as_str(),
        "unplayed_ms": unplayed_ms, "unplayed_marks": unplayed_marks,
    }));
    tracing::info!(stream = %id, reason = reason.as_str(), "call ended");
    door::release_when_finished(ticket, status);
    finish_writer(writer, writer_task, close_cmd).await;
}

/// Reads until `start`: the dialect from the first message when the path did not name
/// it; `connected` and unknown events are skipped; anything else before `start` is
/// refused (`Ending::Bad`; otherwise the socket is gone, `Outcome::Gone`).
async fn wait_start(
    stream: &mut SplitStream<WebSocket>,
    mut dialect: Option<Dialect>,
) -> Result<(Dialect, Start), Outcome> {
    loop {
        let text = match stream.next().await {
            None | Some(Ok(Message::Close(_))) => return Err(Outcome::Gone),
            Some(Err(e)) => return Err(read_failure(e)),
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
            Some(Ok(Message::Binary(_))) => return Err(binary_message().into()),
            Some(Ok(Message::Text(t))) => t,
        };
        let d = match dialect.or_else(|| dialect::detect(text.as_str())) {
            Some(d) => *dialect.insert(d),
            None => {
                return Err(BadInput::policy(
                    "unknown_dialect",
                    "the first message is neither Twilio's nor Telnyx's (`connected` or `start`)",
                )
                .into());
            }
        };
        match dialect::parse(d, text.as_str()) {
            Err(e) => return Err(BadInput::dialect(&e).into()),
            Ok(Inbound::Start(s)) => return Ok((d, s)),
            Ok(Inbound::Connected { .. }) => {}
            Ok(Inbound::Other { .. }) => {
                metrics::counter!(m::TELEPHONY_IGNORED_EVENTS_TOTAL).increment(1);
            }
            Ok(_) => {
                return Err(BadInput::policy(
                    "before_start",
                    "an event other than `connected` came before `start`",
                )
                .into());
            }
        }
    }
}

/// The stream of `start`: id, session and token from the call; the doors' admission.
/// A refusal is the close code (1013 for a 503, else 1008) and the refusal's code.
fn admit<S: Sink>(
    state: &TelephonyState<S>,
    start: &Start,
    token: Option<&str>,
) -> Result<(StreamHandle, Ticket), (u16, String)> {
    let id = start.custom.get("stream_id").unwrap_or(&start.call_id);
    let session = start.custom.get("session_id").cloned();
    let token = start
        .custom
        .get("access_token")
        .map(String::as_str)
        .or(token);
    let door = &state.door;
    door.check_call(id, session, token)
        .and_then(|admitted| door.open(admitted))
        .map_err(|resp| {
            let close = if resp.status() == StatusCode::SERVICE_UNAVAILABLE {
                close_code::TRY_AGAIN_LATER
            } else {
                close_code::POLICY
            };
            let code = resp.extensions().get::<door::RefusalCode>();
            (close, code.map_or("refused", |c| c.0).to_owned())
        })
}

async fn spawn_intake(
    client: &async_nats::Client,
    subjects: &Subjects,
    shared: &Arc<Shared>,
    events: &Events,
    stop: &CancellationToken,
) -> Option<tokio::task::JoinHandle<()>> {
    let subscribe = async {
        let audio = client.subscribe(subjects.out.clone()).await?;
        let ctl = client.subscribe(subjects.ctl.clone()).await?;
        Ok::<_, async_nats::SubscribeError>((audio, ctl))
    };
    match tokio::time::timeout(Duration::from_secs(2), subscribe).await {
        Ok(Ok((audio, ctl))) => Some(tokio::spawn(outbound::intake::run(
            client.clone(),
            audio,
            ctl,
            Arc::clone(shared),
            events.clone(),
            stop.clone(),
        ))),
        _ => {
            tracing::warn!(subject = %subjects.out, "could not subscribe to the bot audio; the call has no return path");
            let message = "the door could not subscribe to the bot-audio subjects";
            events.emit(door::error_event("no_return_path", message));
            None
        }
    }
}

/// The open call's state while it reads.
struct Call {
    /// This call's per-chunk and per-frame counts.
    counts: Counts,
    handle: StreamHandle,
    ticket: Ticket,
    inbound: InboundAudio,
    shared: Arc<Shared>,
    events: Events,
}

impl Call {
    /// The read loop: carrier events in, frames to the stream, until an [`Outcome`].
    async fn read(
        &mut self,
        stream: &mut SplitStream<WebSocket>,
        dialect: Dialect,
        idle_timeout: Duration,
    ) -> Outcome {
        let mut status = door::StatusWatch::new(&self.handle);
        let idle = tokio::time::sleep(idle_timeout);
        tokio::pin!(idle);
        let mut last_message = Instant::now();
        // Registered once for the call, not per message.
        let shared = Arc::clone(&self.shared);
        let gone = shared.gone();
        tokio::pin!(gone);
        loop {
            let reorder_sleep = super::sleep_until(self.inbound.deadline());
            tokio::select! {
                biased;
                change = status.next_or_notice(&mut self.ticket, &mut self.handle) => {
                    if let Some(ev) = change.event {
                        self.events.emit(ev);
                    }
                    if let Some(stop) = change.stop {
                        return Outcome::Ends(stop);
                    }
                }
                () = reorder_sleep => {
                    let released = self.inbound.release(std::time::Instant::now());
                    if let Some(out) = self.after(released).await {
                        return out;
                    }
                }
                msg = stream.next() => {
                    // The wait below is polled only when no message is ready; a
                    // carrier that keeps sending is checked here, with one load.
                    if self.shared.is_gone() {
                        return Outcome::Gone;
                    }
                    last_message = Instant::now();
                    let text = match msg {
                        None | Some(Ok(Message::Close(_))) => return Outcome::Gone,
                        Some(Err(e)) => return read_failure(e),
                        Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
                        Some(Ok(Message::Binary(_))) => return binary_message().into(),
                        Some(Ok(Message::Text(t))) => t,
                    };
                    if let Some(out) = self.on_text(dialect, text.as_str()).await {
                        return out;
                    }
                }
                () = &mut gone => return Outcome::Gone,
                () = &mut idle => {
                    let due = last_message + idle_timeout;
                    if due <= Instant::now() {
                        return Outcome::Ends(Ending::Idle);
                    }
                    idle.as_mut().reset(due);
                }
            }
        }
    }

    /// One carrier message after `start`; `Some` ends the call.
    async fn on_text(&mut self, dialect: Dialect, text: &str) -> Option<Outcome> {
        let event = match dialect::parse(dialect, text) {
            Ok(e) => e,
            Err(e) => return Some(BadInput::dialect(&e).into()),
        };
        match event {
            Inbound::Media(media) => {
                if media.track != Track::Inbound {
                    metrics::counter!(m::TELEPHONY_CHUNKS_TOTAL, m::LABEL_OUTCOME => "other_track")
                        .increment(1);
                    return None;
                }
                self.counts.chunks += 1;
                let accepted = self.inbound.accept(media, std::time::Instant::now());
                self.after(accepted).await
            }
            Inbound::Mark { name, .. } => {
                if self.shared.played(&name) {
                    self.events.emit(json!({"type": "mark", "name": name}));
                }
                None
            }
            Inbound::Dtmf { digit } => {
                self.events.emit(json!({"type": "dtmf", "digit": digit}));
                None
            }
            Inbound::Stop => Some(Outcome::Ends(Ending::Producer)),
            Inbound::Start(_) => Some(
                BadInput::policy("duplicate_start", "a second `start` on one connection").into(),
            ),
            Inbound::Connected { .. } => None,
            Inbound::Error {
                code,
                title,
                detail,
            } => {
                // The carrier reports a problem of its own (Telnyx `error`): told to
                // the agent; the call goes on until the carrier stops it.
                self.events
                    .emit(json!({"type": "carrier_error", "code": code,
                    "title": title, "detail": detail}));
                None
            }
            Inbound::Other { .. } => {
                metrics::counter!(m::TELEPHONY_IGNORED_EVENTS_TOTAL).increment(1);
                None
            }
        }
    }

    /// Pushes what the inbound path made ready (after `result`, its check).
    async fn after(&mut self, result: Result<(), BadInput>) -> Option<Outcome> {
        if let Err(b) = result {
            return Some(b.into());
        }
        push_ready(&mut self.inbound, &self.handle, &mut self.counts)
            .await
            .err()
    }
}

/// Pushes every ready frame and loss to the stream.
async fn push_ready(
    inbound: &mut InboundAudio,
    handle: &StreamHandle,
    counts: &mut Counts,
) -> Result<(), Outcome> {
    while let Some(ready) = inbound.next_ready() {
        let pushed = match ready {
            Ready::Frame(pcm) => {
                let r = handle.push(pcm).await.map(|_| ());
                if r.is_ok() {
                    counts.frame();
                }
                r
            }
            Ready::Lost { frames, samples } => handle
                .declare_lost(frames, samples, Lost::Source)
                .map(|_| ()),
        };
        pushed.map_err(|e| Outcome::Ends(e.into()))?;
    }
    Ok(())
}

/// Ends the stream for `outcome`: its reason, and the close the writer sends.
async fn end(
    mut handle: StreamHandle,
    inbound: &mut InboundAudio,
    outcome: Outcome,
    events: &Events,
) -> (EndReason, Option<Cmd>) {
    let ending = match outcome {
        Outcome::Gone => {
            // Dropping the handle ends the stream with `producer_gone`.
            drop(handle);
            return (
                EndReason::ProducerGone,
                Some(Cmd::Close(close_code::NORMAL, String::new())),
            );
        }
        // At `stop`, what the window still holds goes out, with its gaps, before the
        // end (which may itself end the call otherwise).
        Outcome::Ends(Ending::Producer) => match inbound.finish() {
            Err(b) => Ending::Bad(b),
            Ok(()) => match push_ready(inbound, &handle, &mut Counts::new()).await {
                Err(Outcome::Ends(e)) => e,
                _ => Ending::Producer,
            },
        },
        Outcome::Ends(e) => e,
    };
    if let Ending::Bad(b) = &ending {
        count_bad(b);
    }
    if let Some(mut ev) = ending.close(&mut handle) {
        if matches!(ending, Ending::Overload(_)) {
            ev["source"] = "caller".into();
        }
        events.emit(ev);
    }
    ending.finished(&handle).await;
    let (code, reason) = ending.close_frame("stop");
    (ending.reason(), Some(Cmd::Close(code, reason.to_owned())))
}

/// Sends `close` (if any), lets the writer go and waits for it (bounded: one send
/// timeout and a second).
async fn finish_writer(
    writer: mpsc::Sender<Cmd>,
    task: tokio::task::JoinHandle<()>,
    close: Option<Cmd>,
) {
    if let Some(cmd) = close {
        let _ = tokio::time::timeout(Duration::from_secs(1), writer.send(cmd)).await;
    }
    drop(writer);
    let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
}

fn binary_message() -> BadInput {
    let message = "a carrier's media stream is JSON text; a binary message is not part of it";
    BadInput::unsupported("binary_message", message)
}

fn count_bad(b: &BadInput) {
    metrics::counter!(m::TELEPHONY_BAD_INPUT_TOTAL, m::LABEL_CODE => b.code).increment(1);
}

/// How a failed read ends the call: the carrier broke the WebSocket protocol, or the
/// connection is gone.
fn read_failure(e: axum::Error) -> Outcome {
    crate::ws::violation(e, "too_large").map_or(Outcome::Gone, Outcome::from)
}

/// The format of the call's return path: Twilio takes `audio/x-mulaw` at 8 kHz only;
/// Telnyx takes what its `stream_bidirectional_codec` says, which the stream does not
/// carry — the custom parameter `outbound_codec` (`PCMU`, the default, or `PCMA`)
/// names it.
fn return_format(dialect: Dialect, start: &Start) -> Result<MediaFormat, BadInput> {
    let encoding = match (
        dialect,
        start.custom.get("outbound_codec").map(String::as_str),
    ) {
        (Dialect::Twilio, _) | (Dialect::Telnyx, None | Some("PCMU")) => Encoding::Pcmu,
        (Dialect::Telnyx, Some("PCMA")) => Encoding::Pcma,
        (Dialect::Telnyx, Some(other)) => {
            let message =
                format!("start.custom_parameters.outbound_codec is {other:?}; PCMU or PCMA");
            return Err(BadInput::unsupported("unsupported_format", message));
        }
    };
    MediaFormat::new(encoding, 8000, 1)
        .map_err(|e| BadInput::policy("unsupported_format", e.to_string()))
}

/// A call's chunks taken and frames pushed, added to the shared counters once a second
/// of audio (and when dropped), not per chunk: the counters' atomics are shared by
/// every call.
struct Counts {
    chunks: u64,
    frames: u64,
    chunks_taken: metrics::Counter,
    frames_in: metrics::Counter,
}

impl Counts {
    /// Frames between two flushes (one second of audio).
    const FLUSH_EVERY: u64 = 50;

    fn new() -> Self {
        Self {
            chunks: 0,
            frames: 0,
            chunks_taken: metrics::counter!(m::TELEPHONY_CHUNKS_TOTAL, m::LABEL_OUTCOME => "taken"),
            frames_in: metrics::counter!(m::TELEPHONY_FRAMES_TOTAL, m::LABEL_DIRECTION => "in"),
        }
    }

    fn frame(&mut self) {
        self.frames += 1;
        if self.frames >= Self::FLUSH_EVERY {
            self.flush();
        }
    }

    fn flush(&mut self) {
        self.chunks_taken
            .increment(std::mem::take(&mut self.chunks));
        self.frames_in.increment(std::mem::take(&mut self.frames));
    }
}

impl Drop for Counts {
    fn drop(&mut self) {
        self.flush();
    }
}

/// Counts a call in `weir_telephony_calls_active` while it lives.
struct ActiveCall;

impl ActiveCall {
    fn new() -> Self {
        metrics::gauge!(m::TELEPHONY_CALLS_ACTIVE).increment(1.0);
        Self
    }
}

impl Drop for ActiveCall {
    fn drop(&mut self) {
        metrics::gauge!(m::TELEPHONY_CALLS_ACTIVE).decrement(1.0);
    }
}
