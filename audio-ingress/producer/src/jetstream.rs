//! Lossless delivery (`delivery = "jetstream"`): frames go to a JetStream stream and
//! count as published once the server acknowledged storing them.
//!
//! - Every packet carries `Nats-Msg-Id: <stream id>:<instance>:<seq>` (the instance
//!   tells two lives of one stream id apart). A publish whose ack does not come back in
//!   `publish_timeout` — a stalled or restarting server — is **retried with the same
//!   id**; the server drops a duplicate within the stream's `duplicate_window`, so a
//!   frame is stored exactly once.
//! - **One ack in flight per stream.** A stream's next packet is handed over only after
//!   the previous one was acknowledged. Pipelining would be faster, but across a
//!   reconnect the client discards its unsent buffer while later messages still in its
//!   channel get stored: a replay of the lost ones would land *after* them and break the
//!   per-stream order the recognition workers depend on. At 50 frames/s per stream the
//!   ack round trip (~0.1–0.2 ms on loopback) is far below the 20 ms cadence; the cost
//!   shows only in bulk throughput (measured in docs/audio-ingress.md).
//! - The byte and age budget still applies: the frame being retried and the ones behind
//!   it are pending; when the budget runs out the policy acts (`close`: overload).
//! - Consumers read through an ordered JetStream consumer, in stream order: with the
//!   consumer core, `source = { jetstream = { stream = "WEIR_AUDIO" } }`
//!   ([`weir_audio_consumer::ConsumerSource::JetStream`]).
//! - Works on nats-server 2.9.10 (`get_or_create_stream` is fine there; only KV
//!   creation trips over the account-info query) and 2.15.1: see
//!   `tests/lossless_jetstream.rs`.

use std::time::Duration;

use async_nats::jetstream::{self, Context, stream};
use async_nats::{Client, HeaderMap, Subject};
use bytes::Bytes;

use crate::config::{Delivery, StreamConfig};
use crate::publisher::{Sink, SinkError, SinkErrorKind, SinkResult};

/// The JetStream stream weir publishes audio into ([`StreamConfig::jetstream`]): named
/// by `jetstream_stream`, capturing the subject template's subjects, file storage, the
/// `jetstream_max_age_s`, `jetstream_duplicate_window_s` and `jetstream_replicas` keys.
pub type JetStreamSettings = stream::Config;

/// A [`Sink`] that publishes to JetStream and returns once the server stored the
/// message (its ack). Cheap to clone.
#[derive(Clone, Debug)]
pub struct JetStreamSink {
    /// Boxed behind an `Arc`: the context is large, and [`NatsSink`] holds either it or
    /// a plain client.
    js: std::sync::Arc<Context>,
}

impl JetStreamSink {
    /// Creates (or reuses) the stream and returns the sink. `ack_timeout` bounds the
    /// JetStream API calls; publishes are bounded by the publisher's timeout.
    pub async fn new(
        client: Client,
        settings: &JetStreamSettings,
        ack_timeout: Duration,
    ) -> Result<Self, SinkError> {
        let js = jetstream::ContextBuilder::new()
            .timeout(ack_timeout)
            .build(client);
        js.get_or_create_stream(settings.clone())
            .await
            .map_err(|e| {
                let message = format!("JetStream stream {:?}", settings.name);
                SinkError::with_source(SinkErrorKind::Stream, message, e)
            })?;
        Ok(Self {
            js: std::sync::Arc::new(js),
        })
    }
}

impl Sink for JetStreamSink {
    async fn publish(&self, subject: Subject, headers: HeaderMap, payload: Bytes) -> SinkResult {
        let ack = self
            .js
            .publish_with_headers(subject, headers, payload)
            .await
            .map_err(|e| {
                SinkError::with_source(SinkErrorKind::Publish, "JetStream publish failed", e)
            })?;
        ack.await.map_err(|e| {
            SinkError::with_source(SinkErrorKind::Ack, "JetStream did not store it", e)
        })?;
        Ok(())
    }

    fn is_connected(&self) -> bool {
        Sink::is_connected(&self.js.client())
    }

    async fn flush(&self) -> SinkResult {
        Sink::flush(&self.js.client()).await
    }

    fn lossless(&self) -> bool {
        true
    }
}

/// The sink `serve` publishes to: core NATS with the confirmation window, or
/// JetStream.
#[derive(Clone, Debug)]
pub enum NatsSink {
    /// Core NATS (`delivery = "confirmed"` or `"unconfirmed"`).
    Core(Client),
    /// JetStream (`delivery = "jetstream"`).
    JetStream(JetStreamSink),
}

/// Bound on the JetStream API calls when a sink is made (creating the stream).
pub const JETSTREAM_API_TIMEOUT: Duration = Duration::from_secs(5);

impl NatsSink {
    /// The sink `config.delivery()` asks for, on `client`: core NATS, or JetStream with
    /// its stream created (or reused) under [`JETSTREAM_API_TIMEOUT`]. What every
    /// producer built on this crate (the ingress, the Python package) starts with.
    pub async fn for_config(client: Client, config: &StreamConfig) -> Result<Self, SinkError> {
        Ok(match config.delivery() {
            Delivery::JetStream => Self::JetStream(
                JetStreamSink::new(client, &config.jetstream(), JETSTREAM_API_TIMEOUT).await?,
            ),
            Delivery::Confirmed | Delivery::Unconfirmed => Self::Core(client),
        })
    }
}

impl Sink for NatsSink {
    async fn publish(&self, subject: Subject, headers: HeaderMap, payload: Bytes) -> SinkResult {
        match self {
            Self::Core(c) => Sink::publish(c, subject, headers, payload).await,
            Self::JetStream(j) => j.publish(subject, headers, payload).await,
        }
    }

    fn is_connected(&self) -> bool {
        match self {
            Self::Core(c) => Sink::is_connected(c),
            Self::JetStream(j) => j.is_connected(),
        }
    }

    async fn flush(&self) -> SinkResult {
        match self {
            Self::Core(c) => Sink::flush(c).await,
            Self::JetStream(j) => Sink::flush(j).await,
        }
    }

    fn confirmer(&self) -> Option<std::sync::Arc<dyn crate::confirm::Confirmer>> {
        match self {
            Self::Core(c) => Sink::confirmer(c),
            Self::JetStream(_) => None,
        }
    }

    fn lossless(&self) -> bool {
        matches!(self, Self::JetStream(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_stream_failure_keeps_the_jetstream_error_as_source() {
        // A server without JetStream: creating the stream fails.
        let server = weir_testkit::NatsServer::start().expect("nats-server");
        let client = async_nats::connect(server.url()).await.expect("connect");
        let settings = JetStreamSettings {
            name: "WEIR_ERR_TEST".into(),
            subjects: vec!["err.test.*".into()],
            ..Default::default()
        };
        let e = JetStreamSink::new(client, &settings, Duration::from_secs(2))
            .await
            .expect_err("no JetStream on this server");
        assert_eq!(e.kind(), SinkErrorKind::Stream);
        assert_eq!(e.message(), "JetStream stream \"WEIR_ERR_TEST\"");
        let cause = std::error::Error::source(&e).expect("source kept");
        assert!(
            cause
                .downcast_ref::<jetstream::context::CreateStreamError>()
                .is_some(),
            "{cause:?}"
        );
    }
}
