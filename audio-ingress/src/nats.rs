//! The NATS edge: connection options (auth, TLS, timeouts, client capacity) built from
//! [`NatsConfig`], and connection events made visible in metrics and logs.
//!
//! Events (`connected`, `disconnected`, `slow_consumer`, `lame_duck`, errors) arrive
//! through async-nats's event callback, which feeds a 128-slot channel and drops events
//! when the callback is slow — so the callback only bumps a counter, sets a gauge and
//! logs. Readiness is read from `Client::connection_state()`, not from events.
//!
//! Subscribing with the server's confirmation (the tap, the consumer core) is
//! `weir_service::nats::subscribe_confirmed`.

use async_nats::{Client, ConnectOptions, Event};

use crate::config::{NatsAuth, NatsConfig};
use crate::error::Error;
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
pub async fn connect_options(cfg: &NatsConfig) -> Result<ConnectOptions, Error> {
    let mut opts = match &cfg.auth {
        NatsAuth::None => ConnectOptions::new(),
        NatsAuth::UserPassword { user, password } => {
            ConnectOptions::with_user_and_password(user.clone(), password.clone())
        }
        NatsAuth::Token(t) => ConnectOptions::with_token(t.clone()),
        NatsAuth::NKey(seed) => ConnectOptions::with_nkey(seed.clone()),
        NatsAuth::CredsFile(path) => ConnectOptions::with_credentials_file(path)
            .await
            .map_err(|e| Error::Nats(format!("nats_creds_file {}: {e}", path.display())))?,
    };
    if cfg.tls.required {
        opts = opts.require_tls(true);
    }
    if let Some(ca) = &cfg.tls.ca_file {
        opts = opts.add_root_certificates(ca.clone());
    }
    if let Some((cert, key)) = &cfg.tls.client_cert {
        opts = opts.add_client_certificate(cert.clone(), key.clone());
    }
    Ok(opts
        .name(&cfg.name)
        .connection_timeout(cfg.connection_timeout)
        .ping_interval(cfg.ping_interval)
        .client_capacity(cfg.client_capacity)
        .event_callback(|event| async move { record_event(&event) }))
}

/// Connects. With `retry_initial`, returns at once and keeps trying in the background
/// (the service starts and reports not-ready until connected); without, the first
/// connection must succeed.
pub async fn connect(cfg: &NatsConfig, retry_initial: bool) -> Result<Client, Error> {
    let mut opts = connect_options(cfg).await?;
    if retry_initial {
        opts = opts.retry_on_initial_connect();
    }
    let urls: Vec<async_nats::ServerAddr> =
        cfg.urls.iter().filter_map(|u| u.parse().ok()).collect();
    opts.connect(urls)
        .await
        .map_err(|e| Error::Nats(format!("connect to {}: {e}", cfg.urls.join(","))))
}
