//! A call's socket writer and its bot-audio intake: the only task that sends to the
//! carrier ([`Writer`]), and the task that moves the bot's audio and `clear` commands
//! from NATS into the call's bounded queue ([`intake`]).
//!
//! - **Writer.** Sends the door's own messages ([`Cmd`]) and, once the call started,
//!   the queued bot audio when it is due (`weir_audio_telephony::outbound::OutQueue`:
//!   real time, `telephony_out_lead_ms` ahead), encoded to the call's format, and its
//!   marks. Every send is bounded by `ws_send_timeout_ms`; the first that fails or
//!   times out abandons the socket and cancels the call's `gone` token.
//! - **Intake.** Reads `<prefix>.out.<stream>` and `<prefix>.ctl.<stream>` all the
//!   time, whatever the socket does, so the NATS client never buffers a call's audio:
//!   it goes into the queue or is refused there (bytes bound: the new audio is
//!   refused, what is queued keeps playing) and told (`overload` event). `clear`
//!   empties the queue under its lock — the writer cannot pop another frame after it —
//!   then has the carrier's `clear` sent and answers `cleared` with the marks never
//!   played (queued, or sent and not echoed).
//!
//! Invariant: the queue's bytes are the call's only bot-audio memory; they are counted
//! in `weir_telephony_out_queue_bytes` (all calls) as they change, and what is left
//! when the call ends is counted as dropped (`ended`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, WebSocket};
use futures::stream::SplitSink;
use futures::{SinkExt, StreamExt};
use serde_json::json;
use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;
use weir_audio_telephony::codec::{Encoder, MediaFormat};
use weir_audio_telephony::dialect::{self, Dialect};
use weir_audio_telephony::outbound::{DropReason, Dropped, Due, Marks, OutQueue, OutboundConfig};
use weir_service::shutdown::CancellationToken;

use super::voice::{Events, MARK_HEADER, MAX_OUT_MESSAGE_BYTES};
use crate::metrics as m;

/// What the call asks its writer to send.
#[derive(Debug)]
pub enum Cmd {
    /// The call started: bot audio may flow, encoded to `format`, addressed to
    /// `stream_sid`.
    Start {
        /// The carrier's dialect.
        dialect: Dialect,
        /// The carrier's stream id (Twilio `streamSid`).
        stream_sid: String,
        /// The call's media format.
        format: MediaFormat,
        /// The call's events.
        events: Events,
    },
    /// The carrier's `clear` (after the queue was emptied).
    Clear,
    /// The close frame (code, reason); the writer stops after it.
    Close(u16, String),
}

/// The call's bot-audio state, shared by the writer and the intake.
pub struct Shared {
    queue: Mutex<OutQueue>,
    marks: Mutex<Marks>,
    /// New audio, or a clear.
    wake: Notify,
    /// Cancelled when the socket is abandoned (a send failed or timed out).
    pub gone: CancellationToken,
    /// The queue's bytes as last counted in the gauge and in `total`.
    counted: Mutex<usize>,
    /// Bytes queued by every call of the door, and their bound.
    total: Arc<AtomicUsize>,
    total_max: usize,
}

impl Shared {
    /// The state of a call with these bounds; `total` counts every call's queued
    /// bytes against `total_max`.
    pub fn new(config: OutboundConfig, total: Arc<AtomicUsize>, total_max: usize) -> Arc<Self> {
        Arc::new(Self {
            queue: Mutex::new(OutQueue::new(config)),
            marks: Mutex::new(Marks::default()),
            wake: Notify::new(),
            gone: CancellationToken::new(),
            counted: Mutex::new(0),
            total,
            total_max,
        })
    }

    /// Whether `len` more bytes would take every call's bot audio over its bound (a
    /// check, not a reservation: calls pushing at the same instant may pass it together,
    /// by at most one message each).
    fn over_total(&self, len: usize) -> bool {
        self.total.load(Ordering::Relaxed).saturating_add(len) > self.total_max
    }

    fn queue(&self) -> MutexGuard<'_, OutQueue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn marks(&self) -> MutexGuard<'_, Marks> {
        self.marks.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` on the queue and moves the all-calls gauge by the change in its bytes.
    fn with_queue<R>(&self, f: impl FnOnce(&mut OutQueue) -> R) -> R {
        let mut q = self.queue();
        let r = f(&mut q);
        let now = q.queued_bytes();
        drop(q);
        let mut counted = self.counted.lock().unwrap_or_else(PoisonError::into_inner);
        if now != *counted {
            if now > *counted {
                self.total.fetch_add(now - *counted, Ordering::Relaxed);
            } else {
                self.total.fetch_sub(*counted - now, Ordering::Relaxed);
            }
            metrics::gauge!(m::TELEPHONY_OUT_QUEUE_BYTES).increment(now as f64 - *counted as f64);
            *counted = now;
        }
        r
    }

    /// Drops what is left at the end of the call (counted `ended`); the marks never
    /// played.
    pub fn end(&self) -> (u64, Vec<String>) {
        let cleared = self.with_queue(OutQueue::clear);
        count_dropped("ended", cleared.frames);
        let mut unplayed = self.marks().cleared();
        unplayed.extend(cleared.queued_marks);
        (cleared.ms, unplayed)
    }

    /// A mark the carrier echoed back (played): `Some(name)` when it was one of this
    /// call's, else counted as unknown.
    pub fn played(&self, name: &str) -> bool {
        let known = self.marks().played(name).is_ok();
        let outcome = if known { "played" } else { "unknown" };
        metrics::counter!(m::TELEPHONY_MARKS_TOTAL, m::LABEL_OUTCOME => outcome).increment(1);
        known
    }
}

fn count_dropped(reason: &'static str, frames: u64) {
    if frames > 0 {
        metrics::counter!(m::TELEPHONY_OUT_DROPPED_FRAMES_TOTAL, m::LABEL_REASON => reason)
            .increment(frames);
    }
}

fn drop_reason(r: DropReason) -> &'static str {
    match r {
        DropReason::QueueFull => "queue_full",
        DropReason::MaxAge => "max_age",
        DropReason::Cleared => "cleared",
    }
}

/// The `overload` event for bot audio dropped by a bound.
fn overload_event(d: &Dropped) -> serde_json::Value {
    json!({"type": "overload", "reason": drop_reason(d.reason), "frames": d.frames, "ms": d.ms})
}

/// The call's writer: sends what the call asks and the due bot audio.
pub struct Writer {
    sink: SplitSink<WebSocket, Message>,
    shared: Arc<Shared>,
    send_timeout: Duration,
    /// Set by [`Cmd::Start`]: bot audio flows from then on.
    started: Option<Started>,
    payload: Vec<u8>,
}

/// What the writer knows of a started call.
struct Started {
    dialect: Dialect,
    stream_sid: String,
    encoder: Encoder,
    events: Events,
}

impl Writer {
    /// Starts the writer task of `sink`; commands go through the returned sender (the
    /// task ends after a [`Cmd::Close`], when every sender is gone, or when the socket
    /// is abandoned).
    pub fn spawn(
        sink: SplitSink<WebSocket, Message>,
        shared: Arc<Shared>,
        send_timeout: Duration,
    ) -> (mpsc::Sender<Cmd>, tokio::task::JoinHandle<()>) {
        let (tx, rx) = mpsc::channel(32);
        let w = Self {
            sink,
            shared,
            send_timeout,
            started: None,
            payload: Vec::with_capacity(320),
        };
        (tx, tokio::spawn(w.run(rx)))
    }

    async fn run(mut self, mut rx: mpsc::Receiver<Cmd>) {
        let shared = Arc::clone(&self.shared);
        loop {
            let due = match &self.started {
                Some(started) => {
                    let (due, dropped) = self.shared.with_queue(|q| {
                        let dropped = q.expire(std::time::Instant::now());
                        (q.next_due(), dropped)
                    });
                    if let Some(d) = dropped {
                        count_dropped(drop_reason(d.reason), d.frames);
                        started.events.emit(overload_event(&d));
                    }
                    due
                }
                None => None,
            };
            let sleep = async {
                match due {
                    Some(t) => tokio::time::sleep_until(Instant::from_std(t)).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                cmd = rx.recv() => match cmd {
                    None => return,
                    Some(Cmd::Start { dialect, stream_sid, format, events }) => {
                        self.started = Some(Started {
                            dialect,
                            stream_sid,
                            encoder: Encoder::new(format),
                            events,
                        });
                    }
                    Some(Cmd::Clear) => {
                        let Some(started) = &mut self.started else {
                            continue;
                        };
                        started.encoder.reset();
                        let text = dialect::clear_message(started.dialect, &started.stream_sid);
                        if !self.send(Message::Text(text.into())).await {
                            return;
                        }
                    }
                    Some(Cmd::Close(code, reason)) => {
                        let frame = CloseFrame { code, reason: reason.into() };
                        if self.send(Message::Close(Some(frame))).await {
                            metrics::counter!(m::WS_CLOSES_TOTAL, m::LABEL_CODE => code.to_string())
                                .increment(1);
                        }
                        return;
                    }
                },
                () = shared.wake.notified() => {}
                () = sleep => {
                    if !self.send_due().await {
                        return;
                    }
                }
            }
        }
    }

    /// Sends every frame and mark due now. `false` when the socket is abandoned.
    async fn send_due(&mut self) -> bool {
        loop {
            let now = std::time::Instant::now();
            let Some(due) = self.shared.with_queue(|q| q.pop_due(now)) else {
                return true;
            };
            let Some(started) = &mut self.started else {
                return true;
            };
            let (d, sid) = (started.dialect, started.stream_sid.as_str());
            let text = match due {
                Due::Frame(pcm) => {
                    self.payload.clear();
                    started.encoder.encode(&pcm, &mut self.payload);
                    metrics::counter!(m::TELEPHONY_FRAMES_TOTAL, m::LABEL_DIRECTION => "out")
                        .increment(1);
                    dialect::media_message(d, sid, &self.payload)
                }
                Due::Mark(name) => {
                    let text = dialect::mark_message(d, sid, &name);
                    if let Some(forgotten) = self.shared.marks().sent(name) {
                        tracing::debug!(mark = %forgotten, "too many marks outstanding; the oldest is forgotten");
                        metrics::counter!(m::TELEPHONY_MARKS_TOTAL, m::LABEL_OUTCOME => "forgotten")
                            .increment(1);
                    }
                    metrics::counter!(m::TELEPHONY_MARKS_TOTAL, m::LABEL_OUTCOME => "sent")
                        .increment(1);
                    text
                }
            };
            if !self.send(Message::Text(text.into())).await {
                return false;
            }
        }
    }

    /// One bounded send; on failure or timeout the socket is abandoned.
    async fn send(&mut self, message: Message) -> bool {
        match tokio::time::timeout(self.send_timeout, self.sink.send(message)).await {
            Ok(Ok(())) => true,
            Ok(Err(_)) => {
                self.shared.gone.cancel();
                false
            }
            Err(_) => {
                metrics::counter!(m::WS_SEND_TIMEOUTS_TOTAL).increment(1);
                tracing::warn!(
                    send_timeout_ms = self.send_timeout.as_millis() as u64,
                    "carrier is not reading: send timed out, connection abandoned"
                );
                self.shared.gone.cancel();
                false
            }
        }
    }
}

/// Moves the bot's audio and `clear` commands from NATS into the call (see the module
/// doc) until both subscriptions end or `stop` is cancelled.
pub async fn intake(
    client: async_nats::Client,
    mut audio: async_nats::Subscriber,
    mut ctl: async_nats::Subscriber,
    shared: Arc<Shared>,
    writer: mpsc::Sender<Cmd>,
    events: Events,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            msg = audio.next() => match msg {
                None => break,
                Some(msg) => take_audio(&msg, &shared, &events),
            },
            msg = ctl.next() => match msg {
                None => break,
                Some(msg) => {
                    let reply = control(&msg.payload, &shared, &writer).await;
                    let body = bytes::Bytes::from(reply.to_string());
                    if let Some(to) = msg.reply {
                        let _ = tokio::time::timeout(
                            Duration::from_secs(2),
                            client.publish(to, body.clone()),
                        )
                        .await;
                    }
                    events.emit(reply);
                }
            },
        }
    }
    let _ = audio.unsubscribe().await;
    let _ = ctl.unsubscribe().await;
}

/// One bot-audio message: its PCM into the queue, then its mark.
fn take_audio(msg: &async_nats::Message, shared: &Shared, events: &Events) {
    let refuse = |code: &str, message: String| {
        metrics::counter!(m::TELEPHONY_OUT_REFUSED_TOTAL, m::LABEL_CODE => code.to_owned())
            .increment(1);
        events.emit(json!({"type": "error", "code": code, "message": message}));
    };
    if msg.payload.len() > MAX_OUT_MESSAGE_BYTES {
        return refuse(
            "too_large",
            format!(
                "bot audio message of {} bytes; at most {MAX_OUT_MESSAGE_BYTES}",
                msg.payload.len()
            ),
        );
    }
    // Checked by the queue (1..=256 bytes), with the audio.
    let mark = msg
        .headers
        .as_ref()
        .and_then(|h| h.get(MARK_HEADER))
        .map(|v| v.as_str().to_owned());
    if shared.over_total(msg.payload.len()) {
        let frames = msg.payload.len().div_ceil(640) as u64;
        count_dropped("total_full", frames);
        events.emit(
            json!({"type": "overload", "reason": "total_full", "frames": frames,
            "ms": (msg.payload.len() as u64).div_ceil(32)}),
        );
        return;
    }
    let now = std::time::Instant::now();
    let pushed = shared.with_queue(|q| {
        let dropped = if msg.payload.is_empty() {
            None
        } else {
            q.push_audio(&msg.payload, now)?
        };
        // A mark follows its audio; audio refused at the bound takes its mark with it
        // (the agent is told both in the `overload`).
        if dropped.is_none()
            && let Some(name) = mark
        {
            q.push_mark(name, now)?;
        }
        Ok::<_, weir_audio_telephony::outbound::OutboundError>(dropped)
    });
    match pushed {
        Ok(dropped) => {
            if let Some(d) = dropped {
                count_dropped(drop_reason(d.reason), d.frames);
                events.emit(overload_event(&d));
            }
            shared.wake.notify_one();
        }
        Err(e) => refuse(e.code(), e.to_string()),
    }
}

/// One control message: `{"type":"clear"}`, answered `cleared`; anything else is an
/// `error` answer that changes nothing.
async fn control(payload: &[u8], shared: &Shared, writer: &mpsc::Sender<Cmd>) -> serde_json::Value {
    let is_clear = serde_json::from_slice::<serde_json::Value>(payload)
        .ok()
        .and_then(|v| {
            let obj = v.as_object()?;
            (obj.len() == 1 && obj.get("type")?.as_str()? == "clear").then_some(())
        })
        .is_some();
    if !is_clear {
        metrics::counter!(m::TELEPHONY_OUT_REFUSED_TOTAL, m::LABEL_CODE => "invalid_control")
            .increment(1);
        return json!({"type": "error", "code": "invalid_control",
            "message": "a control message is the JSON object {\"type\":\"clear\"}"});
    }
    let cleared = shared.with_queue(OutQueue::clear);
    shared.wake.notify_one();
    // Sent and not echoed first (they came before what is still queued).
    let mut unplayed = shared.marks().cleared();
    unplayed.extend(cleared.queued_marks);
    count_dropped("cleared", cleared.frames);
    metrics::counter!(m::TELEPHONY_CLEARS_TOTAL).increment(1);
    // The carrier drops what it buffered; bounded, as every send.
    let _ = tokio::time::timeout(Duration::from_secs(2), writer.send(Cmd::Clear)).await;
    json!({"type": "cleared", "frames": cleared.frames, "ms": cleared.ms,
        "unplayed_marks": unplayed})
}
