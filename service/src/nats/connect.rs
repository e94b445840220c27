//! Connecting with a validated [`NatsConfig`]: one set of options (authentication, TLS,
//! timeouts, capacities, inbox prefix) for every weir client, and one first-connect
//! behaviour.
//!
//! A caller adds its own event callback to [`options`] (the ingress counts events into
//! metrics, the adapter into its `NatsEvents` too) and passes the result to [`connect`].

use async_nats::{Client, ConnectOptions, ServerAddr};

use super::settings::{NatsAuth, NatsConfig};

/// Machine-readable kind of a [`ConnectError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConnectErrorKind {
    /// The options could not be built (an unreadable credentials file).
    Options,
    /// A URL is not a NATS address.
    Url,
    /// No server accepted the first connection (only when it is not retried).
    Connect,
}

/// Why a client could not be set up; the async-nats or I/O error is its `source()`.
pub type ConnectError = crate::Error<ConnectErrorKind>;

/// The connection options of `cfg`, without an event callback.
pub async fn options(cfg: &NatsConfig) -> Result<ConnectOptions, ConnectError> {
    let mut opts =
        match &cfg.auth {
            NatsAuth::None => ConnectOptions::new(),
            NatsAuth::UserPassword { user, password } => {
                ConnectOptions::with_user_and_password(user.clone(), password.clone())
            }
            NatsAuth::Token(t) => ConnectOptions::with_token(t.clone()),
            NatsAuth::NKey(seed) => ConnectOptions::with_nkey(seed.clone()),
            NatsAuth::CredsFile(path) => ConnectOptions::with_credentials_file(path)
                .await
                .map_err(|e| {
                    ConnectError::with_source(
                        ConnectErrorKind::Options,
                        format!("NATS credentials file {}", path.display()),
                        e,
                    )
                })?,
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
    if let Some(capacity) = cfg.subscription_capacity {
        opts = opts.subscription_capacity(capacity);
    }
    Ok(opts
        .name(&cfg.name)
        .connection_timeout(cfg.connection_timeout)
        .ping_interval(cfg.ping_interval)
        .client_capacity(cfg.client_capacity)
        .custom_inbox_prefix(&cfg.inbox_prefix))
}

/// Connects with `options` (from [`options`], plus the caller's callback).
///
/// With `retry_initial_connect` the client keeps trying in the background and this
/// waits at most one connection timeout for it: with a server up the caller's
/// subscriptions are in place on return, with none the caller starts not-ready (its
/// readiness reads `Client::connection_state()`). Without, the first connection must
/// succeed.
pub async fn connect(cfg: &NatsConfig, options: ConnectOptions) -> Result<Client, ConnectError> {
    let urls = cfg
        .urls
        .iter()
        .map(|u| {
            u.parse::<ServerAddr>().map_err(|e| {
                ConnectError::with_source(ConnectErrorKind::Url, format!("NATS URL {u:?}"), e)
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let options = if cfg.retry_initial_connect {
        options.retry_on_initial_connect()
    } else {
        options
    };
    let client = options.connect(urls).await.map_err(|e| {
        ConnectError::with_source(
            ConnectErrorKind::Connect,
            format!("connecting to NATS at {}", cfg.url_list()),
            e,
        )
    })?;
    if cfg.retry_initial_connect {
        let deadline = tokio::time::Instant::now() + cfg.connection_timeout;
        while client.connection_state() != async_nats::connection::State::Connected
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }
    Ok(client)
}
