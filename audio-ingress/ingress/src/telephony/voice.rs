//! A call's NATS side: its three subjects and the events it publishes
//! (docs/protocol.md §6.3).
//!
//! - `<prefix>.out.<stream>`: the bot's audio, 16 kHz mono s16le PCM of any even
//!   length up to [`MAX_OUT_MESSAGE_BYTES`]; a `Weir-Mark: <name>` header puts a mark
//!   after it (an empty body with the header is a mark alone);
//! - `<prefix>.ctl.<stream>`: `{"type":"clear"}`, a request: the reply (and an event)
//!   is `cleared`;
//! - `<prefix>.events.<stream>`: JSON events from the door: `started`, `mark` (the
//!   carrier played it), `cleared`, `overload` (bot audio dropped), `gap`, `dtmf`,
//!   `degraded` / `recovered`, `error`, `stopped`.
//!
//! Invariant: emitting never waits: events go through a bounded channel (64) to one
//! publishing task per call; an event that finds the channel full is dropped and
//! counted (`weir_telephony_events_dropped_total`), so a stalled NATS cannot hold the
//! call's audio paths.

use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;

use crate::metrics as m;

/// Largest bot-audio message taken (1 s of 16 kHz PCM is 32,000 bytes).
pub const MAX_OUT_MESSAGE_BYTES: usize = 64 * 1024;
/// The header that puts a mark after a bot-audio message.
pub const MARK_HEADER: &str = "Weir-Mark";
/// Events waiting for the publishing task.
const EVENT_CHANNEL: usize = 64;
/// Bound on one event publish.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(2);

/// The subjects of one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subjects {
    /// Bot audio in.
    pub out: String,
    /// Control (`clear`) in.
    pub ctl: String,
    /// Events out.
    pub events: String,
}

impl Subjects {
    /// The subjects of `stream` under `prefix` (a stream id holds no `.`, `*` or `>`).
    pub fn new(prefix: &str, stream: &str) -> Self {
        Self {
            out: format!("{prefix}.out.{stream}"),
            ctl: format!("{prefix}.ctl.{stream}"),
            events: format!("{prefix}.events.{stream}"),
        }
    }
}

/// Publishes a call's events (see the module doc). Cheap to clone.
#[derive(Debug, Clone)]
pub struct Events {
    tx: Option<mpsc::Sender<Bytes>>,
}

impl Events {
    /// Events of a call without NATS (a service on another sink): dropped.
    pub fn none() -> Self {
        Self { tx: None }
    }

    /// Starts the publishing task of `subject`; it ends when every [`Events`] is gone.
    pub fn start(client: async_nats::Client, subject: String) -> Self {
        let (tx, mut rx) = mpsc::channel::<Bytes>(EVENT_CHANNEL);
        tokio::spawn(async move {
            while let Some(body) = rx.recv().await {
                let publish = client.publish(subject.clone(), body);
                match tokio::time::timeout(PUBLISH_TIMEOUT, publish).await {
                    Ok(Ok(())) => {}
                    _ => metrics::counter!(m::TELEPHONY_EVENTS_DROPPED_TOTAL).increment(1),
                }
            }
        });
        Self { tx: Some(tx) }
    }

    /// Emits `event` (never waits; see the module doc).
    pub fn emit(&self, event: serde_json::Value) {
        let Some(tx) = &self.tx else {
            return;
        };
        if tx.try_send(Bytes::from(event.to_string())).is_err() {
            metrics::counter!(m::TELEPHONY_EVENTS_DROPPED_TOTAL).increment(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_are_under_the_prefix() {
        let s = Subjects::new("weir.voice", "CA123");
        assert_eq!(s.out, "weir.voice.out.CA123");
        assert_eq!(s.ctl, "weir.voice.ctl.CA123");
        assert_eq!(s.events, "weir.voice.events.CA123");
    }
}
