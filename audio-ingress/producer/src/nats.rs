//! The NATS edge: the shared connection (`weir_service::nats`, from [`NatsConfig`])
//! with the client's events counted by the one handler
//! ([`weir_service::nats::NatsEvents`]) under the ingress's names
//! (`weir_ingress_nats_events_total{event}`, `weir_ingress_nats_connected`).
//! Readiness is read from `Client::connection_state()`, not from events.
//!
//! Subscribing with the server's confirmation (the tap, the consumer core) is
//! `weir_service::nats::subscribe_confirmed`.

use async_nats::{Client, ConnectOptions};
use weir_service::nats::{self, ConnectError, EventMetrics, NatsConfig, NatsEvents};

use crate::metrics as m;

/// The names the ingress counts its NATS client's events under.
pub const EVENT_METRICS: EventMetrics = EventMetrics {
    events_total: m::NATS_EVENTS_TOTAL,
    connected: m::NATS_CONNECTED,
};

/// Connection options from the validated config, with the event handler installed.
pub async fn connect_options(cfg: &NatsConfig) -> Result<ConnectOptions, ConnectError> {
    Ok(NatsEvents::new(EVENT_METRICS).attach(nats::options(cfg).await?))
}

/// Connects, events counted into metrics (first-connect behaviour:
/// `weir_service::nats::connect`).
pub async fn connect(cfg: &NatsConfig) -> Result<Client, ConnectError> {
    nats::connect(cfg, connect_options(cfg).await?).await
}
