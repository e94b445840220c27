//! `[admin]`: the admin HTTP listener of every binary, once.
//!
//! Invariants: the same keys, ranges and meanings in every binary ([`ADMIN_KEYS`]);
//! only the default address differs (each binary its own port).

use std::net::SocketAddr;
use std::num::NonZeroUsize;

use crate::admin::RequestLimits;
use crate::config::{ConfigError, ConfigErrorKind, Range, whole_ms as ms};

/// Default `admin.max_connections`.
pub const DEFAULT_ADMIN_MAX_CONNECTIONS: u64 = 64;

crate::config_section! {
    /// The `[admin]` keys as read, before validation.
    #[derive(Debug, PartialEq, Eq)]
    pub struct AdminSection, ADMIN_KEYS = "admin.";
    /// The defaults, with the binary's own address.
    pub fn listening_on(listen: &str);
    {
        listen: String = listen.to_owned(),
            Range::text("an address like 127.0.0.1:9090 (port 0 = any free port)"),
            "admin HTTP listener (`/metrics`, `/healthz`, `/readyz`, `/v1/*`): keep it private \
            (`--admin` too)";
        max_connections: u64 = DEFAULT_ADMIN_MAX_CONNECTIONS, Range::int(1, 10_000),
            "open TCP connections on the admin port (a separate cap: `/readyz` and `/metrics` \
            answer while a service port is full); when it is full, a new connection takes the \
            slot of the one that has waited longest for a request head";
        request_timeout_ms: u64 = ms(RequestLimits::default().timeout), Range::ms(100, 600_000),
            "an admin request (probes included) still running after this is answered `503` \
            `timeout`";
        max_concurrent_requests: u64 = RequestLimits::default().max_concurrent.get() as u64,
            Range::int(1, 1024),
            "admin requests to `/metrics` and `/v1/*` running at once; one more is answered \
            `503` `overloaded` (`/healthz`, `/readyz` not counted)";
    }
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

fn range(key: &str) -> Range {
    crate::config::keys::range_of(ADMIN_KEYS, key)
}

impl AdminSection {
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
            max_connections: range("admin.max_connections")
                .count("admin.max_connections", self.max_connections)?,
            request_limits: RequestLimits {
                timeout: range("admin.request_timeout_ms")
                    .millis("admin.request_timeout_ms", self.request_timeout_ms)?,
                max_concurrent: range("admin.max_concurrent_requests").count(
                    "admin.max_concurrent_requests",
                    self.max_concurrent_requests,
                )?,
            },
        })
    }
}

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
