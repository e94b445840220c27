//! The JetStream source ([`crate::ConsumerSource::JetStream`]): one ordered push consumer per
//! owned partition subject, feeding the same demultiplexer as a core subscription.
//!
//! Why an *ordered push* consumer (async-nats `jetstream::consumer::push::OrderedConfig`):
//! - it delivers in stream order with no acks (one ephemeral, memory-stored, R1 consumer
//!   on the server; `AckPolicy::None`, flow control, 5 s idle heartbeats);
//! - the client checks the consumer sequence of every message and, on a mismatch, a
//!   missed heartbeat, or a `Disconnected → Connected` transition, deletes the consumer
//!   and creates a new one that starts right after the last **stream** sequence it
//!   delivered — so a server kill + restart (which loses the memory-stored consumer)
//!   resumes where the worker was, and nothing is delivered twice or skipped;
//! - it works on nats-server 2.9.10 and 2.15.1 (checked by
//!   `tests/lossless_jetstream.rs`). The pull variant reacts to a restart only after
//!   two missed heartbeats (≥ 30 s with async-nats's defaults).
//!
//! One wrinkle of async-nats 0.51: a consumer recreated before it delivered anything
//! restarts from stream sequence 1 (`DeliverPolicy::All`), whatever the original start.
//! With [`JetStreamStart::New`] the start is pinned at creation (the stream's last
//! sequence + 1), and messages at or below that floor are skipped here until the first
//! one above it passes; after that the check costs nothing.
//!
//! The consumer is ephemeral: when the worker stops, the server removes it after its
//! inactivity threshold (30 s).

use std::time::Duration;

use async_nats::jetstream::{self, consumer::DeliverPolicy, consumer::push};
use futures::StreamExt;
use futures::stream::BoxStream;

use super::config::JetStreamStart;
use super::{ConsumerError, ConsumerErrorKind};

/// One item of a feed: a message, or a transient error of the source (logged and
/// counted; the source recovers by itself).
pub(crate) type Inbound = Result<async_nats::Message, push::OrderedError>;

/// Creates one ordered consumer per subject on `stream` and returns their feeds,
/// bounded as a whole by `bound`.
pub(crate) async fn ordered_feeds(
    client: &async_nats::Client,
    stream: &str,
    start: JetStreamStart,
    subjects: Vec<String>,
    bound: Duration,
) -> Result<Vec<(String, BoxStream<'static, Inbound>)>, ConsumerError> {
    let all = subjects.join(",");
    let work = async {
        let js = jetstream::ContextBuilder::new()
            .timeout(bound)
            .build(client.clone());
        let handle = js
            .get_stream(stream)
            .await
            .map_err(|e| {
                ConsumerError::operation(
                    ConsumerErrorKind::Subscribe,
                    format!(
                        "cannot subscribe to {all:?}: JetStream stream {stream:?} (the ingress with delivery = \"jetstream\" creates it)"
                    ),
                    e,
                )
            })?;
        let (deliver_policy, floor) = match start {
            JetStreamStart::All => (DeliverPolicy::All, None),
            JetStreamStart::New => {
                // `get_stream` read the stream's info: its last sequence now.
                let last = handle.cached_info().state.last_sequence;
                (
                    DeliverPolicy::ByStartSequence {
                        start_sequence: last + 1,
                    },
                    Some(last),
                )
            }
        };
        let mut feeds = Vec::with_capacity(subjects.len());
        for subject in subjects {
            let fail = |what: &str, e: weir_service::error::Source| {
                ConsumerError::operation(
                    ConsumerErrorKind::Subscribe,
                    format!(
                        "cannot subscribe to {subject:?}: JetStream ordered consumer on {stream:?} ({what})"
                    ),
                    e,
                )
            };
            let consumer = handle
                .create_consumer(push::OrderedConfig {
                    deliver_subject: client.new_inbox(),
                    filter_subject: subject.clone(),
                    deliver_policy,
                    description: Some("weir consumer core (ordered)".into()),
                    ..Default::default()
                })
                .await
                .map_err(|e| fail("create", e.into()))?;
            let ordered = consumer
                .messages()
                .await
                .map_err(|e| fail("subscribe", e.into()))?;
            feeds.push((subject, feed(ordered, floor.filter(|&f| f > 0))));
        }
        Ok(feeds)
    };
    tokio::time::timeout(bound, work).await.map_err(|_| {
        ConsumerError::Operation(weir_service::Error::new(
            ConsumerErrorKind::Subscribe,
            format!(
                "cannot subscribe to {all:?}: JetStream consumers not created within {bound:?}"
            ),
        ))
    })?
}

/// Maps the ordered consumer's items to [`Inbound`], skipping messages at or below
/// `floor` until the first one above it.
fn feed(ordered: push::Ordered, mut floor: Option<u64>) -> BoxStream<'static, Inbound> {
    ordered
        .filter_map(move |item| {
            let out = match item {
                Ok(m) if floor.is_some_and(|f| m.info().is_ok_and(|i| i.stream_sequence <= f)) => {
                    metrics::counter!(crate::metrics::CONSUMER_JETSTREAM_SKIPPED_TOTAL)
                        .increment(1);
                    None
                }
                Ok(m) => {
                    floor = None;
                    Some(Ok(m.message))
                }
                Err(e) => Some(Err(e)),
            };
            futures::future::ready(out)
        })
        .boxed()
}
