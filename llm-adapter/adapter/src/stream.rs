//! The NATS side of streamed replies (`Weir-Stream: 1`): publishing the events to the
//! caller's reply subject, and the flow control that notices a caller that stopped
//! reading. The wire format is `docs/protocol.md` §8; the coalescing and the worker
//! loop are in [`crate::admission`] (`streaming.rs`).
//!
//! How a caller that stops reading is detected (core NATS gives the publisher no
//! feedback: a publish succeeds whether or not anyone reads):
//! - every `chunk` is published with a reply subject, the stream's **acknowledgement
//!   subject** `<adapter inbox>.<stream id>`; the caller publishes the sequence number
//!   of the last chunk it has taken to it;
//! - at most `stream.window` chunks may be unacknowledged; with the window full the
//!   worker waits up to `stream.ack_timeout_ms` for an acknowledgement, then aborts the
//!   request (`caller_stalled`) — the backend read stops meanwhile (backpressure), so a
//!   stalled caller costs one window of chunks, never more;
//! - when nobody is subscribed to the reply subject any more (the caller unsubscribed,
//!   crashed or disconnected), the server answers the chunk's reply subject with a
//!   no-responders status: the stream is aborted at once (`caller_gone`);
//! - a chunk the NATS client does not take within `nats.publish_timeout_ms` aborts it
//!   too (`publish_timeout`).
//!
//! Invariants: one subscription per adapter for every acknowledgement (no per-stream
//! subscription); a stream's entry in the [`AckHub`] lives exactly as long as its
//! [`NatsStream`] (removed by `Drop`); every publish is bounded by the publish timeout;
//! an acknowledgement that does not parse (canonical ASCII decimal only,
//! [`s::parse_ack`]) or that names a chunk not yet sent is ignored, never trusted, so no
//! acknowledgement can credit chunks ahead of time and switch the stall guard off.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::{HeaderMap, StatusCode, Subject};
use bytes::Bytes;
use futures::StreamExt;
use futures::future::BoxFuture;
use weir_protocol::WireName;
use weir_protocol::llm::headers as h;
use weir_protocol::llm::stream::{self as s, StreamEvent};
use weir_service::sync::locked;

use crate::admission::{StopReason, StreamOut, StreamStop};
use crate::nats_events::AdapterEvents;
use crate::service::{publish_reply, put_static as put};

/// What the caller has acknowledged of one stream.
#[derive(Debug, Default)]
struct AckState {
    acked: AtomicU64,
    /// The highest chunk sequence number handed to NATS so far (set before its
    /// publish): an acknowledgement above it is ignored.
    sent: AtomicU64,
    gone: AtomicBool,
    changed: tokio::sync::Notify,
}

impl AckState {
    /// Whether chunk `seq` fits a window of `window` unacknowledged chunks.
    fn has_room(&self, seq: u64, window: u64) -> bool {
        seq <= self.acked.load(Ordering::Acquire).saturating_add(window)
    }
}

/// Routes acknowledgements (and no-responders statuses) from the adapter's one
/// acknowledgement subscription to the streams. Cheap to clone.
#[derive(Clone)]
pub struct AckHub {
    prefix: String,
    next: Arc<AtomicU64>,
    streams: Arc<Mutex<HashMap<u64, Arc<AckState>>>>,
}

impl AckHub {
    /// Subscribes `<new inbox>.*` on `client` and starts the task that routes what
    /// arrives there. Every message it takes is counted in `events`.
    pub async fn start(
        client: &async_nats::Client,
        events: AdapterEvents,
    ) -> Result<(Self, tokio::task::JoinHandle<()>), async_nats::SubscribeError> {
        let prefix = client.new_inbox();
        let mut sub = client.subscribe(format!("{prefix}.*")).await?;
        let hub = Self {
            prefix,
            next: Arc::new(AtomicU64::new(1)),
            streams: Arc::new(Mutex::new(HashMap::new())),
        };
        let routes = hub.clone();
        let task = tokio::spawn(async move {
            while let Some(msg) = sub.next().await {
                events.took();
                routes.route(&msg);
            }
        });
        Ok((hub, task))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<AckState>>> {
        locked(&self.streams)
    }

    fn route(&self, msg: &async_nats::Message) {
        let Some(id) = msg
            .subject
            .rsplit('.')
            .next()
            .and_then(|t| t.parse::<u64>().ok())
        else {
            return;
        };
        let Some(state) = self.lock().get(&id).cloned() else {
            return;
        };
        if msg.status == Some(StatusCode::NO_RESPONDERS) {
            state.gone.store(true, Ordering::Release);
        } else if let Some(seq) = s::parse_ack(&msg.payload)
            && seq <= state.sent.load(Ordering::Acquire)
        {
            state.acked.fetch_max(seq, Ordering::AcqRel);
        } else {
            return;
        }
        state.changed.notify_waiters();
    }

    fn register(&self) -> (u64, Arc<AckState>) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let state = Arc::new(AckState::default());
        self.lock().insert(id, state.clone());
        (id, state)
    }
}

/// Flow-control settings of one stream.
#[derive(Debug, Clone, Copy)]
pub struct StreamLimits {
    /// Unacknowledged chunks allowed (0 = no acknowledgements expected).
    pub window: usize,
    /// How long a full window waits for an acknowledgement.
    pub ack_timeout: Duration,
    /// Bound of each publish.
    pub publish_timeout: Duration,
}

/// One caller's streamed reply, published on NATS.
pub struct NatsStream {
    client: async_nats::Client,
    reply: Subject,
    ack_subject: Subject,
    request_id: Option<String>,
    id: u64,
    state: Arc<AckState>,
    hub: AckHub,
    limits: StreamLimits,
    sent: Arc<Delivered>,
}

/// What one streaming caller received: chunks and body bytes published to its reply
/// subject. Shared by its [`NatsStream`] (which counts) and its waiter (whose `end`
/// reports them: a caller that joined another caller's stream received none).
#[derive(Debug, Default)]
pub struct Delivered {
    chunks: AtomicU64,
    bytes: AtomicU64,
}

impl Delivered {
    /// Chunks and bytes so far.
    pub fn get(&self) -> (u64, u64) {
        (
            self.chunks.load(Ordering::Acquire),
            self.bytes.load(Ordering::Acquire),
        )
    }
}

impl Drop for NatsStream {
    fn drop(&mut self) {
        self.hub.lock().remove(&self.id);
    }
}

/// The headers of a streamed event: its name and the request id.
pub(crate) fn event_headers(event: StreamEvent, request_id: Option<&str>) -> HeaderMap {
    let mut hm = HeaderMap::new();
    put(&mut hm, s::STREAM_EVENT, event.as_str());
    if let Some(rid) = request_id {
        put(&mut hm, h::REQUEST_ID, rid);
    }
    hm
}

impl NatsStream {
    /// A stream to `reply`, registered in `hub`, counting what it publishes in `sent`.
    pub fn new(
        client: async_nats::Client,
        reply: Subject,
        request_id: Option<String>,
        hub: &AckHub,
        limits: StreamLimits,
        sent: Arc<Delivered>,
    ) -> Self {
        let (id, state) = hub.register();
        let ack_subject = Subject::from(format!("{}.{id}", hub.prefix));
        Self {
            client,
            reply,
            ack_subject,
            request_id,
            id,
            state,
            hub: hub.clone(),
            limits,
            sent,
        }
    }

    async fn publish(&self, headers: HeaderMap, body: Bytes, with_ack: bool) -> bool {
        let (reply, client) = (self.reply.clone(), &self.client);
        let publish = async move {
            match with_ack {
                true => {
                    let ack = self.ack_subject.clone();
                    client
                        .publish_with_reply_and_headers(reply, ack, headers, body)
                        .await
                }
                false => client.publish_with_headers(reply, headers, body).await,
            }
        };
        publish_reply(self.limits.publish_timeout, publish).await
    }

    fn gone(&self) -> Option<StreamStop> {
        self.state.gone.load(Ordering::Acquire).then(|| StreamStop {
            reason: StopReason::CallerGone,
            message: "no subscriber on the reply subject (no responders)".into(),
        })
    }

    /// Waits until chunk `seq` fits the window, at most the acknowledgement timeout.
    async fn credit(&self, seq: u64) -> Result<(), StreamStop> {
        let window = self.limits.window as u64;
        if window == 0 {
            return self.gone().map_or(Ok(()), Err);
        }
        let wait = async {
            loop {
                let changed = self.state.changed.notified();
                tokio::pin!(changed);
                changed.as_mut().enable();
                if let Some(stop) = self.gone() {
                    return Err(stop);
                }
                if self.state.has_room(seq, window) {
                    return Ok(());
                }
                changed.await;
            }
        };
        match tokio::time::timeout(self.limits.ack_timeout, wait).await {
            Ok(r) => r,
            Err(_) => Err(StreamStop {
                reason: StopReason::CallerStalled,
                message: format!(
                    "{window} chunks unacknowledged for stream.ack_timeout_ms ({} ms)",
                    self.limits.ack_timeout.as_millis()
                ),
            }),
        }
    }
}

impl StreamOut for NatsStream {
    fn queued(&self, position: usize, predicted_start: Option<Duration>) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let mut hm = event_headers(StreamEvent::Queued, self.request_id.as_deref());
            put(&mut hm, s::QUEUE_POSITION, &position.to_string());
            if let Some(p) = predicted_start {
                put(&mut hm, s::PREDICTED_START_MS, &h::format_ms(p));
            }
            self.publish(hm, Bytes::new(), false).await;
        })
    }

    fn started(&self, queue_wait: Duration) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let mut hm = event_headers(StreamEvent::Started, self.request_id.as_deref());
            put(&mut hm, h::QUEUE_MS, &h::format_ms(queue_wait));
            self.publish(hm, Bytes::new(), false).await;
        })
    }

    fn chunk(&self, seq: u64, data: Bytes) -> BoxFuture<'_, Result<(), StreamStop>> {
        Box::pin(async move {
            self.credit(seq).await?;
            // Before the publish: the caller may acknowledge the chunk as soon as it
            // arrives.
            self.state.sent.fetch_max(seq, Ordering::AcqRel);
            let mut hm = event_headers(StreamEvent::Chunk, self.request_id.as_deref());
            put(&mut hm, s::STREAM_SEQ, &seq.to_string());
            let len = data.len() as u64;
            if !self.publish(hm, data, true).await {
                return Err(StreamStop {
                    reason: StopReason::PublishTimeout,
                    message: format!(
                        "the NATS client did not take chunk {seq} within nats.publish_timeout_ms ({} ms)",
                        self.limits.publish_timeout.as_millis()
                    ),
                });
            }
            self.sent.bytes.fetch_add(len, Ordering::AcqRel);
            self.sent.chunks.fetch_add(1, Ordering::AcqRel);
            self.gone().map_or(Ok(()), Err)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hub() -> AckHub {
        AckHub {
            prefix: "_INBOX.ack".into(),
            next: Arc::new(AtomicU64::new(1)),
            streams: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    fn ack(id: u64, body: &'static [u8]) -> async_nats::Message {
        async_nats::Message {
            subject: Subject::from(format!("_INBOX.ack.{id}")),
            reply: None,
            payload: Bytes::from_static(body),
            headers: None,
            status: None,
            description: None,
            length: body.len(),
        }
    }

    #[test]
    fn an_acknowledgement_counts_only_for_chunks_sent_and_only_in_canonical_decimal() {
        let hub = hub();
        let (id, st) = hub.register();
        let window = 4;
        // Chunks 1..=4 sent, none acknowledged: chunk 5 must wait.
        st.sent.store(4, Ordering::Release);
        assert!(!st.has_room(5, window));
        // Far ahead of what was sent: ignored, the stall guard stays on.
        hub.route(&ack(id, b"1000000"));
        hub.route(&ack(id, b"5"));
        assert_eq!(st.acked.load(Ordering::Acquire), 0);
        assert!(!st.has_room(5, window));
        // Signed, padded or spaced numbers are ignored.
        for body in [&b"+3"[..], b"03", b" 3", b"3 ", b"3\n"] {
            hub.route(&ack(id, body));
        }
        assert_eq!(st.acked.load(Ordering::Acquire), 0);
        // A canonical number up to the last chunk sent counts, and never goes back.
        hub.route(&ack(id, b"3"));
        hub.route(&ack(id, b"2"));
        assert_eq!(st.acked.load(Ordering::Acquire), 3);
        assert!(st.has_room(7, window) && !st.has_room(8, window));
        hub.route(&ack(id, b"4"));
        assert_eq!(st.acked.load(Ordering::Acquire), 4);
        // An acknowledgement for an unknown stream or a bad subject changes nothing.
        hub.route(&ack(id + 1, b"1"));
        assert_eq!(st.acked.load(Ordering::Acquire), 4);
    }
}
