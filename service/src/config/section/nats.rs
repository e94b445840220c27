//! `[nats]`: the connection keys of every weir client, once.
//!
//! Invariants: the keys, their defaults (from a [`NatsConfig`]), ranges and meanings
//! are the same in every binary ([`NATS_KEYS`]); a refusal names the key as
//! `nats.<field>`; `Debug` never prints a password, token or NKey seed.

use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::config::keys::KeyDoc;
use crate::config::{ConfigError, ConfigErrorKind, Range};
use crate::nats::{FieldErrorKind, NatsConfig, NatsInput};

/// `nats.connection_timeout_ms`: below 100 ms no real network connects, above 60 s a
/// reconnect that tries a hung node first stalls for a minute.
const CONNECTION_TIMEOUT: Range = Range::ms(100, 60_000);
/// `nats.ping_interval_ms`: a dead server is noticed after 2–3 of these.
const PING_INTERVAL: Range = Range::ms(100, 600_000);
/// `nats.client_capacity`.
const CLIENT_CAPACITY: Range = Range::int(16, 1_048_576);

/// The `[nats]` keys as read, before validation. An empty string is unset.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NatsSection {
    /// `nats.url`: comma-separated server URLs.
    pub url: String,
    /// `nats.name`: the client name (empty: the binary's).
    pub name: String,
    /// `nats.user` (with `nats.password`).
    pub user: String,
    /// `nats.password` (with `nats.user`).
    pub password: String,
    /// `nats.token`.
    pub token: String,
    /// `nats.nkey`: an NKey user seed.
    pub nkey: String,
    /// `nats.creds_file`: a `.creds` file.
    pub creds_file: String,
    /// `nats.tls_required`.
    pub tls_required: bool,
    /// `nats.tls_ca_file`.
    pub tls_ca_file: String,
    /// `nats.tls_cert_file` (with `nats.tls_key_file`).
    pub tls_cert_file: String,
    /// `nats.tls_key_file` (with `nats.tls_cert_file`).
    pub tls_key_file: String,
    /// `nats.inbox_prefix`.
    pub inbox_prefix: String,
    /// `nats.connection_timeout_ms`.
    pub connection_timeout_ms: u64,
    /// `nats.ping_interval_ms`.
    pub ping_interval_ms: u64,
    /// `nats.client_capacity`.
    pub client_capacity: u64,
    /// `nats.retry_initial_connect`.
    pub retry_initial_connect: bool,
}

impl Default for NatsSection {
    fn default() -> Self {
        Self::from_config(&NatsConfig::named(""))
    }
}

impl fmt::Debug for NatsSection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secret = |s: &str| if s.is_empty() { "" } else { "<redacted>" };
        f.debug_struct("NatsSection")
            .field("url", &self.url)
            .field("name", &self.name)
            .field("user", &self.user)
            .field("password", &secret(&self.password))
            .field("token", &secret(&self.token))
            .field("nkey", &secret(&self.nkey))
            .field("creds_file", &self.creds_file)
            .field("tls_required", &self.tls_required)
            .field("tls_ca_file", &self.tls_ca_file)
            .field("tls_cert_file", &self.tls_cert_file)
            .field("tls_key_file", &self.tls_key_file)
            .field("inbox_prefix", &self.inbox_prefix)
            .field("connection_timeout_ms", &self.connection_timeout_ms)
            .field("ping_interval_ms", &self.ping_interval_ms)
            .field("client_capacity", &self.client_capacity)
            .field("retry_initial_connect", &self.retry_initial_connect)
            .finish()
    }
}

fn ms(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl NatsSection {
    /// The keys whose defaults are `config` (a binary's [`NatsConfig::named`], with
    /// its own client name and capacity); no credentials.
    pub fn from_config(config: &NatsConfig) -> Self {
        Self {
            url: config.url_list(),
            name: config.name.clone(),
            user: String::new(),
            password: String::new(),
            token: String::new(),
            nkey: String::new(),
            creds_file: String::new(),
            tls_required: config.tls.required,
            tls_ca_file: String::new(),
            tls_cert_file: String::new(),
            tls_key_file: String::new(),
            inbox_prefix: config.inbox_prefix.clone(),
            connection_timeout_ms: ms(config.connection_timeout),
            ping_interval_ms: ms(config.ping_interval),
            client_capacity: config.client_capacity as u64,
            retry_initial_connect: config.retry_initial_connect,
        }
    }

    /// Validates the keys into `base` (which keeps what the section has no key for:
    /// `subscription_capacity`). A refusal names `nats.<field>`.
    pub fn validate(&self, base: NatsConfig) -> Result<NatsConfig, ConfigError> {
        let key = |field: &str| format!("nats.{field}");
        let base = NatsConfig {
            name: match self.name.as_str() {
                "" => base.name,
                name => name.to_owned(),
            },
            connection_timeout: CONNECTION_TIMEOUT
                .millis(&key("connection_timeout_ms"), self.connection_timeout_ms)?,
            ping_interval: PING_INTERVAL.millis(&key("ping_interval_ms"), self.ping_interval_ms)?,
            client_capacity: CLIENT_CAPACITY.size(&key("client_capacity"), self.client_capacity)?,
            retry_initial_connect: self.retry_initial_connect,
            ..base
        };
        NatsInput {
            url: Some(self.url.as_str()),
            user: text(&self.user),
            password: text(&self.password),
            token: text(&self.token),
            nkey: text(&self.nkey),
            creds_file: text(&self.creds_file).map(Path::new),
            tls_required: self.tls_required,
            tls_ca_file: text(&self.tls_ca_file).map(Path::new),
            tls_cert_file: text(&self.tls_cert_file).map(Path::new),
            tls_key_file: text(&self.tls_key_file).map(Path::new),
            inbox_prefix: text(&self.inbox_prefix),
        }
        .validate(base)
        .map_err(|e| {
            let kind = match e.kind {
                FieldErrorKind::Missing => ConfigErrorKind::Missing,
                FieldErrorKind::Invalid => ConfigErrorKind::Invalid,
                FieldErrorKind::Conflict => ConfigErrorKind::Conflict,
            };
            ConfigError::new(key(e.field), kind, e.message)
        })
    }
}

/// Range and meaning of every `[nats]` key, in the order shown.
pub const NATS_KEYS: &[KeyDoc] = &[
    KeyDoc::new(
        "nats.url",
        Range::text("`nats://`, `tls://`, `ws://` URLs, comma-separated"),
        "NATS server(s), tried in turn; each URL parsed on its own (`--nats-url` too)",
    ),
    KeyDoc::new(
        "nats.name",
        Range::Any,
        "client name shown by the server (empty: the binary's)",
    ),
    KeyDoc::new(
        "nats.user",
        Range::text("with `nats.password`; one authentication method"),
        "user name (secrets show as `<redacted>` in `Debug` output and logs)",
    ),
    KeyDoc::new("nats.password", Range::text("with `nats.user`"), "password"),
    KeyDoc::new(
        "nats.token",
        Range::text("one authentication method"),
        "token",
    ),
    KeyDoc::new(
        "nats.nkey",
        Range::text("an NKey user seed (`SU...`); one authentication method"),
        "NKey seed",
    ),
    KeyDoc::new(
        "nats.creds_file",
        Range::text("an existing file; one authentication method"),
        "credentials file (JWT + NKey seed)",
    ),
    KeyDoc::new("nats.tls_required", Range::Any, "require TLS"),
    KeyDoc::new(
        "nats.tls_ca_file",
        Range::text("an existing PEM file"),
        "CA certificates trusted for the server",
    ),
    KeyDoc::new(
        "nats.tls_cert_file",
        Range::text("an existing PEM file; with `nats.tls_key_file`"),
        "client certificate (mutual TLS)",
    ),
    KeyDoc::new(
        "nats.tls_key_file",
        Range::text("an existing PEM file; with `nats.tls_cert_file`"),
        "private key of the client certificate",
    ),
    KeyDoc::new(
        "nats.inbox_prefix",
        Range::text("1..=8 tokens of `A-Z a-z 0-9 _ -`, dot-separated, ≤ 128 bytes"),
        "prefix of every inbox (reply subject) the client makes, `<prefix>.<unique>`: the \
         NATS user's own, e.g. `_INBOX.ingress`, `_INBOX.llm-adapter` \
         (deploy/nats-server.conf)",
    ),
    KeyDoc::new(
        "nats.connection_timeout_ms",
        CONNECTION_TIMEOUT,
        "bound on connecting to one server (a reconnect that tries a hung node first waits \
         this long)",
    ),
    KeyDoc::new(
        "nats.ping_interval_ms",
        PING_INTERVAL,
        "PING interval: a silent server is declared dead after 2–3 of these (4–6 s for a \
         hung node at the default); see \
         [operations.md](operations.md#ingress-and-adapter-on-a-cluster)",
    ),
    KeyDoc::new(
        "nats.client_capacity",
        CLIENT_CAPACITY,
        "messages the NATS client buffers (shared by every stream or reply) before a \
         publish waits",
    ),
    KeyDoc::new(
        "nats.retry_initial_connect",
        Range::Any,
        "start even when no server answers yet and keep trying in the background \
         (`/readyz` 503 until connected); `false`: exit 1 if the first connection fails",
    ),
];

/// `Some(s)` unless empty (an empty string is unset).
fn text(s: &str) -> Option<&str> {
    (!s.is_empty()).then_some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section() -> NatsSection {
        NatsSection::from_config(&NatsConfig::named("t"))
    }

    #[test]
    fn the_defaults_validate_to_the_config_they_came_from() {
        let base = NatsConfig::named("t");
        assert_eq!(section().validate(base.clone()), Ok(base));
    }

    #[test]
    fn refusals_name_the_qualified_key_and_the_range() {
        let e = NatsSection {
            connection_timeout_ms: 99,
            ..section()
        }
        .validate(NatsConfig::named("t"))
        .expect_err("too short");
        assert_eq!(e.key(), "nats.connection_timeout_ms");
        assert_eq!(e.allowed(), Some("100..=60000 ms"));
        let e = NatsSection {
            token: "t".into(),
            nkey: "SUAK".into(),
            ..section()
        }
        .validate(NatsConfig::named("t"))
        .expect_err("two methods");
        assert_eq!(
            (e.key(), e.kind()),
            ("nats.nkey", ConfigErrorKind::Conflict)
        );
    }

    #[test]
    fn secrets_never_appear_in_debug_output() {
        let s = NatsSection {
            user: "alice".into(),
            password: "pw-secret".into(),
            token: "tok-secret".into(),
            nkey: "SUsecret".into(),
            ..section()
        };
        let shown = format!("{s:?}");
        assert!(!shown.contains("secret"), "{shown}");
        assert!(shown.contains("alice"), "{shown}");
    }
}
