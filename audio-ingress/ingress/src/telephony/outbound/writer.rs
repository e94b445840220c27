//! The call's writer: the one task that sends to the carrier (see [`super`]).
//!
//! Invariants: a frame is popped only under the queue's lock and only while the
//! writer's clear epoch is the queue's, so the carrier's `clear` always goes out before
//! audio queued after it; a tail shorter than a frame, alone in the queue, is padded
//! and sent one frame time after it became the queue's last audio (a reply's end is
//! never held back for the next reply); every send is bounded.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::ws::{CloseFrame, Message, WebSocket};
use futures::stream::SplitSink;
use tokio::sync::mpsc;
use weir_audio_telephony::codec::Encoder;
use weir_audio_telephony::dialect::{self, Dialect};
use weir_audio_telephony::outbound::{Due, FRAME_DURATION};

use super::{Shared, tell_dropped};
use crate::metrics as m;
use crate::telephony::voice::Events;
use crate::ws::send_within;

/// What the call asks its writer to send.
#[derive(Debug)]
pub enum Cmd {
    /// The call started: bot audio may flow.
    Start(Box<Started>),
    /// The close frame (code, reason); the writer stops after it.
    Close(u16, String),
}

/// The call's writer: sends what the call asks and the due bot audio.
pub struct Writer {
    sink: SplitSink<WebSocket, Message>,
    shared: Arc<Shared>,
    send_timeout: Duration,
    /// Set by [`Cmd::Start`]: bot audio flows from then on.
    started: Option<Started>,
    payload: Vec<u8>,
    /// The clear epoch the carrier has been told.
    epoch: u64,
    /// When a tail alone in the queue is sent anyway.
    tail_due: Option<Instant>,
}

/// What the writer knows of a started call.
#[derive(Debug)]
pub struct Started {
    /// The carrier's dialect.
    pub dialect: Dialect,
    /// The carrier's stream id (Twilio `streamSid`), which bot audio is addressed to.
    pub stream_sid: String,
    /// The encoder of the call's return format.
    pub encoder: Encoder,
    /// The call's events.
    pub events: Events,
}

/// What the writer does next with the queue.
enum Next {
    /// Send this.
    Due(Due),
    /// A `clear` came: tell the carrier before anything else.
    Clear(u64),
    /// Nothing due now; wake at this time (if any).
    Wait(Option<Instant>),
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
        let (tx, rx) = mpsc::channel(8);
        let w = Self {
            sink,
            shared,
            send_timeout,
            started: None,
            payload: Vec::with_capacity(320),
            epoch: 0,
            tail_due: None,
        };
        (tx, tokio::spawn(w.run(rx)))
    }

    async fn run(mut self, mut rx: mpsc::Receiver<Cmd>) {
        let shared = Arc::clone(&self.shared);
        loop {
            let wake_at = match self.send_due().await {
                Some(t) => t,
                None => return,
            };
            let sleep = crate::telephony::sleep_until(wake_at);
            tokio::select! {
                biased;
                cmd = rx.recv() => match cmd {
                    None => return,
                    Some(Cmd::Start(started)) => self.started = Some(*started),
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
                () = sleep => {}
            }
        }
    }

    /// Sends every frame, mark and `clear` due now. `Some(when to look again)`, or
    /// `None` when the socket is abandoned.
    async fn send_due(&mut self) -> Option<Option<Instant>> {
        loop {
            if self.started.is_none() {
                return Some(None);
            }
            let text = match self.next(Instant::now()) {
                Next::Wait(t) => return Some(t),
                Next::Clear(epoch) => {
                    self.epoch = epoch;
                    let Some(s) = self.started.as_mut() else {
                        return Some(None);
                    };
                    s.encoder.reset();
                    dialect::clear_message(s.dialect, &s.stream_sid)
                }
                Next::Due(due) => {
                    let Some(s) = self.started.as_mut() else {
                        return Some(None);
                    };
                    match due {
                        Due::Frame(pcm) => {
                            self.payload.clear();
                            s.encoder.encode(&pcm, &mut self.payload);
                            metrics::counter!(m::TELEPHONY_FRAMES_TOTAL, m::LABEL_DIRECTION => "out")
                                .increment(1);
                            dialect::media_message(s.dialect, &s.stream_sid, &self.payload)
                        }
                        Due::Mark(name) => {
                            metrics::counter!(m::TELEPHONY_MARKS_TOTAL, m::LABEL_OUTCOME => "sent")
                                .increment(1);
                            dialect::mark_message(s.dialect, &s.stream_sid, &name)
                        }
                    }
                }
            };
            if !self.send(Message::Text(text.into())).await {
                return None;
            }
        }
    }

    /// Under the queue's lock: a pending `clear` first, then expiry, then what is due
    /// (a mark popped is entered in the ledger under the same lock, so a `clear`
    /// reports it unplayed until the carrier echoes it).
    fn next(&mut self, now: Instant) -> Next {
        let (epoch, tail_due) = (self.epoch, &mut self.tail_due);
        let (next, dropped) = self.shared.with_outbox(|o, s| {
            if o.epoch != epoch {
                *tail_due = None;
                return (Next::Clear(o.epoch), None);
            }
            let dropped = o.queue.expire(now);
            if o.queue.next_due().is_none() && o.queue.queued_bytes() > 0 {
                // A tail alone: the rest of the reply gets one frame time to come.
                match *tail_due {
                    Some(t) if t <= now => {
                        o.queue.flush_tail(now);
                        *tail_due = None;
                    }
                    Some(t) => return (Next::Wait(Some(t)), dropped),
                    None => {
                        let t = now + FRAME_DURATION;
                        *tail_due = Some(t);
                        return (Next::Wait(Some(t)), dropped);
                    }
                }
            } else {
                *tail_due = None;
            }
            match o.queue.pop_due(now) {
                Some(Due::Mark(name)) => {
                    if let Some(forgotten) = s.marks().sent(name.clone()) {
                        tracing::debug!(mark = %forgotten, "too many marks outstanding; the oldest is forgotten");
                        metrics::counter!(m::TELEPHONY_MARKS_TOTAL, m::LABEL_OUTCOME => "forgotten")
                            .increment(1);
                    }
                    (Next::Due(Due::Mark(name)), dropped)
                }
                Some(due) => (Next::Due(due), dropped),
                None => (Next::Wait(o.queue.next_due()), dropped),
            }
        });
        if let (Some(d), Some(s)) = (dropped, &self.started) {
            tell_dropped(&s.events, d.reason.code(), &d, None);
        }
        next
    }

    /// One bounded send; on failure or timeout the socket is abandoned.
    async fn send(&mut self, message: Message) -> bool {
        let sent = send_within(&mut self.sink, message, self.send_timeout, "carrier").await;
        // Told at once: the bot audio still queued will not be played.
        if sent == Err(true)
            && let Some(s) = &self.started
        {
            let frames = self.shared.with_outbox(|o, _| o.queue.queued_frames()) as u64;
            s.events.emit(
                serde_json::json!({"type": "overload", "source": "bot_audio",
                "reason": "carrier_stalled", "frames": frames, "ms": frames * 20}),
            );
        }
        if sent.is_err() {
            self.shared.abandon();
        }
        sent.is_ok()
    }
}
