//! The NATS edge: the shared connection (`weir_service::nats`, from [`NatsConfig`])
//! with connection events made visible in metrics and logs.
//!
//! Events (`connected`, `disconnected`, `slow_consumer`, `lame_duck`, errors) arrive
//! through async-nats's event callback, which feeds a 128-slot channel and drops events
//! when the callback is slow — so the callback only bumps a counter, sets a gauge and
//! logs. Readiness is read from `Client::connection_state()`, not from events.
//!
//! Subscribing with the server's confirmation (the tap, the consumer core) is
//! `weir_service::nats::subscribe_confirmed`.

use async_nats::{Client, ConnectOptions, Event};
use weir_service::nats::{self, ConnectError, NatsConfig};

use crate::metrics as m;

/// Records one connection event: counter by `event`, the connected gauge, a log line.
pub fn record_event(event: &Event) {
    let label = weir_service::nats::event_label(event);
    metrics::counter!(m::NATS_EVENTS_TOTAL, m::LABEL_EVENT => label).increment(1);
    match event {
        Event::Connected => {
            metrics::gauge!(m::NATS_CONNECTED).set(1.0);
            tracing::info!(event = label, "NATS connected");
        }
        Event::Disconnected => {
            metrics::gauge!(m::NATS_CONNECTED).set(0.0);
            tracing::warn!(
                event = label,
                "NATS disconnected; publishes buffer in the client until it reconnects or the publish timeout fires"
            );
        }
        Event::Closed => {
            metrics::gauge!(m::NATS_CONNECTED).set(0.0);
            tracing::error!(event = label, "NATS connection closed");
        }
        Event::SlowConsumer(sid) => {
            tracing::warn!(event = label, sid, "NATS slow consumer: messages dropped");
        }
        other => tracing::warn!(event = label, detail = %other, "NATS event"),
    }
}

/// Connection options from the validated config, with the event callback installed.
pub async fn connect_options(cfg: &NatsConfig) -> Result<ConnectOptions, ConnectError> {
    Ok(nats::options(cfg)
        .await?
        .event_callback(|event| async move { record_event(&event) }))
}

/// Connects, events counted into metrics (first-connect behaviour:
/// `weir_service::nats::connect`).
pub async fn connect(cfg: &NatsConfig) -> Result<Client, ConnectError> {
    nats::connect(cfg, connect_options(cfg).await?).await
}
