//! NATS for every weir client: the connection settings (validated once, by
//! [`crate::config::section::NatsSection`]), one way to connect ([`connect`]), one handler of the client's
//! events ([`events`]) and their labels,
//! subscribing with the server's confirmation and the stream of a KV bucket.

mod connect;
pub mod events;
mod settings;

use std::time::Duration;

use async_nats::jetstream::stream;
use async_nats::{Client, ClientError, Event, Subscriber};
use bytes::Bytes;
use futures::StreamExt;

pub use connect::{ConnectError, ConnectErrorKind, connect, options};
pub use events::{EventCounts, EventMetrics, NatsEvents};
pub use settings::{
    DEFAULT_INBOX_PREFIX, DEFAULT_URL, MAX_INBOX_PREFIX_LEN, MAX_INBOX_PREFIX_TOKENS, NatsAuth,
    NatsConfig, NatsTls,
};

/// The metric label of an event. `malformed_message`: the server relayed a message the
/// client could not read (a non-UTF-8 subject or reply subject: skipped; a malformed
/// header block: delivered without headers); the connection stayed up (vendor/README.md).
pub fn event_label(event: &Event) -> &'static str {
    match event {
        Event::Connected => "connected",
        Event::Disconnected => "disconnected",
        Event::LameDuckMode => "lame_duck",
        Event::Draining => "draining",
        Event::Closed => "closed",
        Event::SlowConsumer(_) => "slow_consumer",
        Event::ServerError(_) => "server_error",
        Event::ClientError(ClientError::MalformedMessage(_)) => "malformed_message",
        Event::ClientError(_) => "client_error",
    }
}

/// The `KV_<bucket>` stream of a JetStream KV bucket, for `get_or_create_stream` before
/// `get_key_value` (async-nats 0.51's `create_key_value` cannot parse nats-server 2.9's
/// account info): subjects `$KV.<bucket>.>`, history 1 (one message per subject),
/// `max_age` = how long an entry lives after its last write, rollup allowed, delete
/// denied, direct get, `discard: new`.
pub fn kv_stream_config(bucket: &str, max_age: Duration, replicas: usize) -> stream::Config {
    stream::Config {
        name: format!("KV_{bucket}"),
        subjects: vec![format!("$KV.{bucket}.>")],
        max_messages_per_subject: 1,
        max_age,
        allow_rollup: true,
        deny_delete: true,
        allow_direct: true,
        discard: stream::DiscardPolicy::New,
        num_replicas: replicas,
        ..Default::default()
    }
}

/// Which step of [`subscribe_confirmed`] failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SubscribeErrorKind {
    /// The client refused a `subscribe` (closed client, invalid subject).
    Subscribe,
    /// The probe that confirms the subscriptions could not be subscribed or published.
    Probe,
    /// The server did not confirm the subscriptions within the bound.
    Timeout,
}

/// A subscription that could not be made or confirmed in time: the subject (or the
/// probe inbox, or every subject for a timeout) and the client's error kept as
/// `source()`.
#[derive(Debug)]
pub struct SubscribeError {
    /// The subject (or the probe inbox) that failed.
    pub subject: String,
    /// What failed, with the client's error as its source.
    pub error: crate::Error<SubscribeErrorKind>,
}

impl SubscribeError {
    fn new(subject: String, error: crate::Error<SubscribeErrorKind>) -> Self {
        Self { subject, error }
    }

    /// Which step failed.
    pub fn kind(&self) -> SubscribeErrorKind {
        self.error.kind()
    }
}

impl std::fmt::Display for SubscribeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "subscription to {:?}: {}", self.subject, self.error)
    }
}

impl std::error::Error for SubscribeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&self.error)
    }
}

/// Subscribes to every subject in `subjects`, then waits until the server has processed
/// the SUBs: it handles one connection's commands in order, so once a message published
/// after them comes back on a fresh inbox, they are all in place.
///
/// Bounded by `bound` as a whole: async-nats `subscribe` and `publish` wait without
/// limit when the client's command channel is full (slow, paused or absent server).
pub async fn subscribe_confirmed(
    client: &Client,
    subjects: Vec<String>,
    bound: Duration,
) -> Result<Vec<(String, Subscriber)>, SubscribeError> {
    let all = subjects.join(",");
    let work = async {
        let mut subs = Vec::with_capacity(subjects.len());
        for subject in subjects {
            match client.subscribe(subject.clone()).await {
                Ok(sub) => subs.push((subject, sub)),
                Err(e) => {
                    let refused = "the client refused the subscription";
                    let error =
                        crate::Error::with_source(SubscribeErrorKind::Subscribe, refused, e);
                    return Err(SubscribeError::new(subject, error));
                }
            }
        }
        let inbox = client.new_inbox();
        let fail = |error| SubscribeError::new(inbox.clone(), error);
        let probe_failed = |what: &str, e: Box<dyn std::error::Error + Send + Sync>| {
            fail(crate::Error::with_source(
                SubscribeErrorKind::Probe,
                format!("the confirmation probe's {what} failed"),
                e,
            ))
        };
        let mut probe = client
            .subscribe(inbox.clone())
            .await
            .map_err(|e| probe_failed("subscription", e.into()))?;
        client
            .publish(inbox.clone(), Bytes::new())
            .await
            .map_err(|e| probe_failed("publish", e.into()))?;
        probe.next().await.ok_or_else(|| {
            fail(crate::Error::new(
                SubscribeErrorKind::Probe,
                "the confirmation probe's subscription closed",
            ))
        })?;
        Ok(subs)
    };
    tokio::time::timeout(bound, work).await.map_err(|_| {
        let ms = bound.as_millis();
        let message = format!("the server did not confirm the subscriptions within {ms} ms");
        SubscribeError::new(all, crate::Error::new(SubscribeErrorKind::Timeout, message))
    })?
}
