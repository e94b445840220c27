//! `[admin]`: the admin HTTP listener of every binary, once.
//!
//! Invariants: the same keys, ranges and meanings in every binary ([`ADMIN_KEYS`]);
//! only the default address differs (each binary its own port).

use std::net::SocketAddr;
use std::num::NonZeroUsize;

use serde::{Deserialize, Serialize};

use crate::admin::RequestLimits;
use crate::config::keys::KeyDoc;
use crate::config::{ConfigError, ConfigErrorKind, Range};

/// `admin.max_connections`: a separate cap, small next to any service port.
const MAX_CONNECTIONS: Range = Range::int(1, 10_000);
/// `admin.request_timeout_ms`.
const REQUEST_TIMEOUT: Range = Range::ms(100, 600_000);
/// `admin.max_concurrent_requests`.
const MAX_CONCURRENT: Range = Range::int(1, 1024);

/// Default `admin.max_connections`.
pub const DEFAULT_ADMIN_MAX_CONNECTIONS: u64 = 64;

/// The `[admin]` keys as read, before validation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminSection {
    /// `admin.listen`.
    pub listen: String,
    /// `admin.max_connections`.
    pub max_connections: u64,
    /// `admin.request_timeout_ms`.
    pub request_timeout_ms: u64,
    /// `admin.max_concurrent_requests`.
    pub max_concurrent_requests: u64,
}

/// The validated `[admin]` settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdminSettings {
    /// Address of the listener (port 0: any free port).
    pub listen: SocketAddr,
    /// Open connections on the admin port.
    pub max_connections: NonZeroUsize,
    /// Per-request timeout and concurrency limit of the admin routes.
    pub request_limits: RequestLimits,
}

impl Default for AdminSection {
    fn default() -> Self {
        Self::listening_on("127.0.0.1:9090")
    }
}

impl AdminSection {
    /// The defaults, with the binary's own address.
    pub fn listening_on(listen: &str) -> Self {
        let limits = RequestLimits::default();
        Self {
            listen: listen.to_owned(),
            max_connections: DEFAULT_ADMIN_MAX_CONNECTIONS,
            request_timeout_ms: u64::try_from(limits.timeout.as_millis()).unwrap_or(u64::MAX),
            max_concurrent_requests: limits.max_concurrent.get() as u64,
        }
    }

    /// Validates every key; a refusal names `admin.<field>`.
    pub fn validate(&self) -> Result<AdminSettings, ConfigError> {
        let listen = self.listen.parse::<SocketAddr>().map_err(|_| {
            ConfigError::new(
                "admin.listen",
                ConfigErrorKind::Invalid,
                format!(
                    "{:?} is not a socket address like 127.0.0.1:9090",
                    self.listen
                ),
            )
        })?;
        Ok(AdminSettings {
            listen,
            max_connections: MAX_CONNECTIONS
                .count("admin.max_connections", self.max_connections)?,
            request_limits: RequestLimits {
                timeout: REQUEST_TIMEOUT
                    .millis("admin.request_timeout_ms", self.request_timeout_ms)?,
                max_concurrent: MAX_CONCURRENT.count(
                    "admin.max_concurrent_requests",
                    self.max_concurrent_requests,
                )?,
            },
        })
    }
}

/// Range and meaning of every `[admin]` key, in the order shown.
pub const ADMIN_KEYS: &[KeyDoc] = &[
    KeyDoc::new(
        "admin.listen",
        Range::text("an address like 127.0.0.1:9090 (port 0 = any free port)"),
        "admin HTTP listener (`/metrics`, `/healthz`, `/readyz`, `/v1/*`): keep it private \
         (`--admin` too)",
    ),
    KeyDoc::new(
        "admin.max_connections",
        MAX_CONNECTIONS,
        "open TCP connections on the admin port (a separate cap: `/readyz` and `/metrics` \
         answer while a service port is full); when it is full, a new connection takes the \
         slot of the one that has waited longest for a request head",
    ),
    KeyDoc::new(
        "admin.request_timeout_ms",
        REQUEST_TIMEOUT,
        "an admin request (probes included) still running after this is answered `503` \
         `timeout`",
    ),
    KeyDoc::new(
        "admin.max_concurrent_requests",
        MAX_CONCURRENT,
        "admin requests to `/metrics` and `/v1/*` running at once; one more is answered \
         `503` `overloaded` (`/healthz`, `/readyz` not counted)",
    ),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_refusals_name_the_key() {
        let s = AdminSection::listening_on("127.0.0.1:0")
            .validate()
            .expect("valid");
        assert_eq!(s.request_limits, RequestLimits::default());
        let e = AdminSection {
            max_connections: 10_001,
            ..AdminSection::default()
        }
        .validate()
        .expect_err("too many");
        assert_eq!(e.key(), "admin.max_connections");
        assert_eq!(e.allowed(), Some("1..=10000"));
    }
}
