//! The call's bot-audio intake: NATS → the call's queue (see [`super`]).
//!
//! Invariants: both subscriptions are read all the time (`clear` first when both have
//! something), whatever the socket does; a message is taken whole or refused whole,
//! with its mark; every refusal is told (`overload` or `error` event) and counted;
//! nothing here waits on the carrier.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde_json::json;
use weir_audio_telephony::outbound::{
    DropReason, Dropped, MAX_MARK_NAME_BYTES, MAX_QUEUED_MARKS, OutboundError,
};
use weir_service::shutdown::CancellationToken;

use super::{Shared, count_dropped, tell_dropped};
use crate::metrics as m;
use crate::telephony::voice::{Events, MARK_HEADER, MAX_OUT_MESSAGE_BYTES};

/// Bound on answering a `clear` request.
const REPLY_TIMEOUT: Duration = Duration::from_secs(2);

/// Moves the bot's audio and `clear` commands from NATS into the call until both
/// subscriptions end or `stop` is cancelled.
pub async fn run(
    client: async_nats::Client,
    mut audio: async_nats::Subscriber,
    mut ctl: async_nats::Subscriber,
    shared: Arc<Shared>,
    events: Events,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            biased;
            () = stop.cancelled() => break,
            msg = ctl.next() => match msg {
                None => break,
                Some(msg) => {
                    let reply = control(&msg.payload, &shared);
                    if let Some(to) = msg.reply {
                        let body = bytes::Bytes::from(reply.to_string());
                        let _ = tokio::time::timeout(REPLY_TIMEOUT, client.publish(to, body)).await;
                    }
                    events.emit(reply);
                }
            },
            msg = audio.next() => match msg {
                None => break,
                Some(msg) => take_audio(&msg, &shared, &events),
            },
        }
    }
    let _ = audio.unsubscribe().await;
    let _ = ctl.unsubscribe().await;
}

/// One bot-audio message: its PCM into the queue, then its mark — both or neither.
fn take_audio(msg: &async_nats::Message, shared: &Shared, events: &Events) {
    let mark = msg
        .headers
        .as_ref()
        .and_then(|h| h.get(MARK_HEADER))
        .map(|v| v.as_str().to_owned());
    let refuse = |code: &str, message: String| {
        metrics::counter!(m::TELEPHONY_OUT_REFUSED_TOTAL, m::LABEL_CODE => code.to_owned())
            .increment(1);
        let mut ev = json!({"type": "error", "code": code, "message": message});
        if let Some(name) = &mark {
            ev["mark"] = name.as_str().into();
        }
        events.emit(ev);
    };
    let len = msg.payload.len();
    if len > MAX_OUT_MESSAGE_BYTES {
        return refuse(
            "too_large",
            format!("bot audio message of {len} bytes; at most {MAX_OUT_MESSAGE_BYTES}"),
        );
    }
    if let Some(name) = &mark
        && (name.is_empty() || name.len() > MAX_MARK_NAME_BYTES)
    {
        return refuse(
            "invalid_mark_name",
            format!(
                "{MARK_HEADER} is {} bytes; 1..={MAX_MARK_NAME_BYTES} are allowed",
                name.len()
            ),
        );
    }
    if shared.over_total(len) {
        let d = Dropped {
            frames: len.div_ceil(640) as u64,
            ms: (len as u64).div_ceil(32),
            reason: DropReason::QueueFull,
        };
        tell_dropped(events, "total_full", &d, mark.as_deref());
        return;
    }
    let now = std::time::Instant::now();
    let pushed = shared.with_outbox(|o, _| {
        if mark.is_some() && o.queue.queued_marks() >= MAX_QUEUED_MARKS {
            return Err(OutboundError::TooManyMarks {
                max: MAX_QUEUED_MARKS,
            });
        }
        let dropped = if len == 0 {
            None
        } else {
            o.queue.push_audio(&msg.payload, now)?
        };
        if dropped.is_none()
            && let Some(name) = &mark
        {
            o.queue.push_mark(name.clone(), now)?;
        }
        Ok(dropped)
    });
    // Whatever happened, the writer looks again (a push may have changed the queue
    // even when the mark after it was refused).
    shared.wake.notify_one();
    match pushed {
        Ok(None) => {}
        Ok(Some(d)) => tell_dropped(events, d.reason.code(), &d, mark.as_deref()),
        Err(e) => refuse(e.code(), e.to_string()),
    }
}

/// One control message: `{"type":"clear"}`, answered `cleared`; anything else is an
/// `error` answer that changes nothing.
fn control(payload: &[u8], shared: &Shared) -> serde_json::Value {
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
    let (frames, ms, unplayed) = shared.clear();
    // The writer sends the carrier's `clear` before anything else it pops.
    shared.wake.notify_one();
    count_dropped("cleared", frames);
    metrics::counter!(m::TELEPHONY_CLEARS_TOTAL).increment(1);
    json!({"type": "cleared", "frames": frames, "ms": ms, "unplayed_marks": unplayed})
}
