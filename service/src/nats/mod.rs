//! NATS for every weir client: the connection settings, validated once
//! ([`settings`]), one way to connect ([`connect`]), connection-event labels and
//! subscribing with the server's confirmation.

mod connect;
mod settings;

use std::time::Duration;

use async_nats::{Client, Event, Subscriber};
use bytes::Bytes;
use futures::StreamExt;

pub use connect::{ConnectError, ConnectErrorKind, connect, options};
pub use settings::{
    DEFAULT_URL, FieldError, FieldErrorKind, NatsAuth, NatsConfig, NatsInput, NatsTls, parse_urls,
};

/// The metric label of an event.
pub fn event_label(event: &Event) -> &'static str {
    match event {
        Event::Connected => "connected",
        Event::Disconnected => "disconnected",
        Event::LameDuckMode => "lame_duck",
        Event::Draining => "draining",
        Event::Closed => "closed",
        Event::SlowConsumer(_) => "slow_consumer",
        Event::ServerError(_) => "server_error",
        Event::ClientError(_) => "client_error",
    }
}

/// A subscription that could not be made or confirmed in time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscribeError {
    /// The subject (or the probe inbox) that failed.
    pub subject: String,
    /// Why.
    pub reason: String,
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
                    return Err(SubscribeError {
                        subject,
                        reason: e.to_string(),
                    });
                }
            }
        }
        let inbox = client.new_inbox();
        let fail = |reason: String| SubscribeError {
            subject: inbox.clone(),
            reason,
        };
        let mut probe = client
            .subscribe(inbox.clone())
            .await
            .map_err(|e| fail(e.to_string()))?;
        client
            .publish(inbox.clone(), Bytes::new())
            .await
            .map_err(|e| fail(e.to_string()))?;
        probe
            .next()
            .await
            .ok_or_else(|| fail("probe subscription closed".into()))?;
        Ok(subs)
    };
    tokio::time::timeout(bound, work)
        .await
        .map_err(|_| SubscribeError {
            subject: all,
            reason: format!(
                "the server did not confirm the subscriptions within {} ms",
                bound.as_millis()
            ),
        })?
}
