//! The NATS connection settings both services (and the ingress's `tap`) use, validated
//! once.
//!
//! Invariants of a [`NatsConfig`] built by [`NatsSection::validate`]
//! (the one validation of the keys, for both services and the ingress's `tap`):
//! - at least one URL, each one a valid NATS address (a comma-separated list is split
//!   here: async-nats reads one string as one address);
//! - at most one authentication method ([`NatsAuth`]): the client would otherwise send
//!   several and the server would pick one the operator did not choose;
//! - a password goes with a user, a client key with a client certificate;
//! - every file named (credentials, CA, certificate, key) exists when validated;
//! - the inbox prefix is a literal subject of 1..=[`MAX_INBOX_PREFIX_TOKENS`] tokens of
//!   `A-Z a-z 0-9 _ -` (no wildcard, no empty token, at most [`MAX_INBOX_PREFIX_LEN`]
//!   bytes): every reply subject the client makes starts with it, and server
//!   permissions (`_INBOX.caller.>`) are written against it;
//! - `Debug` never prints a password, token or NKey seed (configuration is logged and
//!   printed in errors).
//!
//! [`NatsSection::validate`]: crate::config::section::NatsSection::validate

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// How the client authenticates (at most one method).
#[derive(Clone, PartialEq, Eq, Default)]
pub enum NatsAuth {
    /// No credentials.
    #[default]
    None,
    /// User and password.
    UserPassword {
        /// User name.
        user: String,
        /// Password.
        password: String,
    },
    /// A token.
    Token(String),
    /// An NKey seed (`SU...`).
    NKey(String),
    /// A `.creds` file (JWT + seed).
    CredsFile(PathBuf),
}

impl fmt::Debug for NatsAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::None => f.write_str("None"),
            Self::UserPassword { user, .. } => write!(f, "UserPassword({user:?}, <redacted>)"),
            Self::Token(_) => f.write_str("Token(<redacted>)"),
            Self::NKey(_) => f.write_str("NKey(<redacted>)"),
            Self::CredsFile(p) => write!(f, "CredsFile({p:?})"),
        }
    }
}

/// TLS towards the server.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NatsTls {
    /// Require TLS even if the server does not ask for it.
    pub required: bool,
    /// Extra root CA file, PEM.
    pub ca_file: Option<PathBuf>,
    /// Client certificate and key, PEM.
    pub client_cert: Option<(PathBuf, PathBuf)>,
}

/// The validated connection settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatsConfig {
    /// Server URLs, tried in turn.
    pub urls: Vec<String>,
    /// Client name shown by the server.
    pub name: String,
    /// Authentication.
    pub auth: NatsAuth,
    /// TLS.
    pub tls: NatsTls,
    /// Timeout of one connection attempt.
    pub connection_timeout: Duration,
    /// PING interval; a dead server is noticed after 2–3 of these.
    pub ping_interval: Duration,
    /// async-nats command channel capacity: messages the client buffers while the
    /// server is slow or gone before `publish` blocks.
    pub client_capacity: usize,
    /// Messages buffered per subscription before the client drops them (slow
    /// consumer); `None`: the async-nats default (65,536).
    pub subscription_capacity: Option<usize>,
    /// Start even when no server answers yet and keep trying in the background (the
    /// service reports not-ready until connected); `false`: the first connection must
    /// succeed.
    pub retry_initial_connect: bool,
    /// Prefix of every inbox (reply subject) the client makes: `<prefix>.<unique>`.
    /// One prefix per NATS user lets the server allow each user only its own replies
    /// (deploy/nats-server.conf). Default [`DEFAULT_INBOX_PREFIX`].
    pub inbox_prefix: String,
}

/// The inbox prefix of every NATS client unless configured.
pub const DEFAULT_INBOX_PREFIX: &str = "_INBOX";

/// Longest inbox prefix accepted, in bytes.
pub const MAX_INBOX_PREFIX_LEN: usize = 128;

/// Most tokens an inbox prefix may have.
pub const MAX_INBOX_PREFIX_TOKENS: usize = 8;

/// The default server.
pub const DEFAULT_URL: &str = "nats://127.0.0.1:4222";

impl NatsConfig {
    /// The defaults both services share, under the client name `name`: the local
    /// server, connect timeout and ping interval 2 s (a hung node costs seconds, not
    /// the 20–30 s of async-nats's defaults), 1,024 buffered commands, and the first
    /// connection retried in the background.
    pub fn named(name: impl Into<String>) -> Self {
        Self {
            urls: vec![DEFAULT_URL.to_owned()],
            name: name.into(),
            auth: NatsAuth::None,
            tls: NatsTls::default(),
            connection_timeout: Duration::from_secs(2),
            ping_interval: Duration::from_secs(2),
            client_capacity: 1024,
            subscription_capacity: None,
            retry_initial_connect: true,
            inbox_prefix: DEFAULT_INBOX_PREFIX.to_owned(),
        }
    }

    /// Settings for tests and local tools: `url`, short timeouts (connect 500 ms,
    /// ping 1 s), and the first connection must succeed.
    pub fn for_url(name: impl Into<String>, url: impl Into<String>) -> Self {
        Self {
            urls: vec![url.into()],
            connection_timeout: Duration::from_millis(500),
            ping_interval: Duration::from_secs(1),
            retry_initial_connect: false,
            ..Self::named(name)
        }
    }

    /// The URLs as one comma-separated string, for messages.
    pub fn url_list(&self) -> String {
        self.urls.join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_never_appear_in_debug_output() {
        for auth in [
            NatsAuth::UserPassword {
                user: "alice".into(),
                password: "hunter2-secret".into(),
            },
            NatsAuth::Token("tok-secret".into()),
            NatsAuth::NKey("SUAKSEEDsecret".into()),
        ] {
            let c = NatsConfig {
                auth,
                ..NatsConfig::named("t")
            };
            let shown = format!("{c:?}");
            assert!(!shown.contains("secret"), "{shown}");
            assert!(shown.contains("<redacted>"), "{shown}");
        }
    }
}
