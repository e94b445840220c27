//! The `serve` front door's settings: listeners, caps, timeouts, producer
//! authentication and WHIP ingest, validated from the raw keys.

use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroUsize;
use std::time::Duration;

use weir_service::config::section::AdminSettings;
use weir_service::config::set;
use weir_service::http::BodyLimits;

use super::{ConfigError, ConfigErrorKind, RawConfig, int_in, nonzero};

/// The validated settings of the `serve` front door.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// WebSocket listener (`listen`).
    pub listen: SocketAddr,
    /// The admin HTTP listener, its connection cap (a separate cap, so `/readyz` and
    /// `/metrics` answer while the WebSocket port is full) and its routes' bounds
    /// (`[admin]`).
    pub admin: AdminSettings,
    /// Concurrent stream cap (`max_streams`).
    pub max_streams: NonZeroUsize,
    /// `Retry-After` sent with a 503 (`retry_after_s`).
    pub retry_after: Duration,
    /// A WebSocket silent for this long is ended with reason `idle` (`idle_timeout_ms`).
    pub idle_timeout: Duration,
    /// How long a stream whose producer's connection dropped waits for it to resume
    /// (`resume_window_ms`); zero: resume off, a dropped connection ends the stream.
    pub resume_window: Duration,
    /// `SO_SNDBUF` of the listen port's connections (`send_buffer_bytes`; `None`: the
    /// kernel's autotuning): what a peer that stops reading can leave queued in the
    /// kernel, and so how soon a bounded send notices it.
    pub send_buffer: Option<usize>,
    /// Bound on one send to a WebSocket client (`ws_send_timeout_ms`): a client that
    /// stops reading is abandoned after it, as if its connection had dropped (the
    /// stream is parked for a resume, then ends with `producer_gone`).
    pub ws_send_timeout: Duration,
    /// Time allowed to finish every stream on SIGTERM/SIGINT (`grace_period_ms`).
    pub grace_period: Duration,
    /// Open TCP connections on the WebSocket port, upgraded or not (`max_connections`).
    pub max_connections: NonZeroUsize,
    /// Open TCP connections on the WebSocket port from one client address, IPv4 or
    /// IPv6 /64 (`max_connections_per_ip`; unset: a quarter of `max_connections`); at
    /// most `max_connections`.
    pub max_connections_per_ip: NonZeroUsize,
    /// Bound on receiving a request head on either port (`http_header_timeout_ms`).
    pub http_header_timeout: Duration,
    /// A connection that moves no byte for this long before an upgrade is closed
    /// (`http_idle_timeout_ms`).
    pub http_idle_timeout: Duration,
    /// Largest request head buffered (`http_max_header_bytes`).
    pub http_max_header_bytes: usize,
    /// Bounds on reading a request body, both ports (`http_body_timeout_ms`,
    /// `http_body_min_rate`).
    pub http_body: BodyLimits,
    /// Producer authentication (`auth_required` and its keys); `None`: off.
    pub auth: Option<crate::auth::AuthConfig>,
    /// WHIP ingest (`whip_udp_listen` and the `whip_*` keys); `None`: off.
    pub whip: Option<WhipConfig>,
    /// Serve the reference browser publisher at `GET /publish` on the listen port
    /// (`publish_page`; needs WHIP on).
    pub publish_page: bool,
}

/// The validated settings of WHIP ingest ([`crate::whip`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WhipConfig {
    /// The one UDP socket of every WHIP session (`whip_udp_listen`).
    pub udp_listen: SocketAddr,
    /// The addresses offered to publishers as ICE host candidates, with the UDP port
    /// (`whip_advertise_ips`; default the listen address).
    pub advertise: Vec<IpAddr>,
    /// A session that has not connected ICE and DTLS within this ends
    /// (`whip_connect_timeout_ms`).
    pub connect_timeout: Duration,
    /// ICE disconnected, or no datagram from the publisher, for this long ends the
    /// stream with `producer_gone` (`whip_disconnect_timeout_ms`).
    pub disconnect_timeout: Duration,
    /// Concurrent WHIP sessions (`whip_max_sessions`).
    pub max_sessions: NonZeroUsize,
    /// Concurrent WHIP sessions from one client address, IPv4 or IPv6 /64
    /// (`whip_max_sessions_per_ip`; unset: a quarter of `whip_max_sessions`).
    pub max_sessions_per_ip: NonZeroUsize,
    /// Whether the ICE agent may check candidates on addresses other than the HTTP
    /// client's (`whip_allow_foreign_candidates`).
    pub allow_foreign_candidates: bool,
}

/// Default `whip_connect_timeout_ms`.
pub const DEFAULT_WHIP_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default `whip_disconnect_timeout_ms`.
pub const DEFAULT_WHIP_DISCONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Default `whip_max_sessions`.
pub const DEFAULT_WHIP_MAX_SESSIONS: usize = 256;

/// The per-address cap `key` = `per_ip` under the global cap `max_key` = `max`. Unset
/// (0), it is a quarter of the configured global cap (at least 1), so one address never
/// takes every slot by default; a value set above the global cap is refused.
fn per_ip_cap(key: &str, per_ip: u64, max_key: &str, max: u64) -> Result<u64, ConfigError> {
    let per_ip = if per_ip == 0 {
        (max / 4).max(1)
    } else {
        per_ip
    };
    if per_ip > max {
        let message = format!("{per_ip} exceeds {max_key} = {max}");
        return Err(ConfigError::new(key, ConfigErrorKind::Conflict, message));
    }
    Ok(per_ip)
}

impl Default for ServerConfig {
    /// The documented defaults: the keys' defaults, validated.
    fn default() -> Self {
        super::valid_default(RawConfig::default().server())
    }
}

/// `int!(raw, key)`: [`int_in`] of the field `key`, named by the field;
/// `millis!(raw, key)`: the same as a [`Duration`] of milliseconds.
macro_rules! int {
    ($raw:ident, $key:ident) => {
        int_in(stringify!($key), $raw.$key)
    };
}
macro_rules! millis {
    ($raw:ident, $key:ident) => {
        int!($raw, $key).map(Duration::from_millis)
    };
}

/// The first of `keys` whose value differs between two [`RawConfig`]s, by name.
macro_rules! first_changed {
    ($a:ident, $b:ident, $($key:ident),+) => {
        [$((stringify!($key), $a.$key != $b.$key)),+]
            .into_iter()
            .find_map(|(key, changed)| changed.then_some(key))
    };
}

/// A socket address key; the refusal shows `example`.
fn addr(key: &str, text: &str, example: &str) -> Result<SocketAddr, ConfigError> {
    text.parse().map_err(|_| {
        ConfigError::new(
            key,
            ConfigErrorKind::Invalid,
            format!("{text:?} is not a socket address like {example}"),
        )
    })
}

impl RawConfig {
    pub(super) fn server(&self) -> Result<ServerConfig, ConfigError> {
        let admin = self.admin.validate()?;
        let max_connections = int!(self, max_connections)?;
        let per_ip = int!(self, max_connections_per_ip)?;
        let per_ip = per_ip_cap(
            "max_connections_per_ip",
            per_ip,
            "max_connections",
            max_connections,
        )?;
        Ok(ServerConfig {
            listen: addr("listen", &self.listen, "127.0.0.1:8080")?,
            admin,
            max_streams: nonzero(int!(self, max_streams)?),
            retry_after: Duration::from_secs(int!(self, retry_after_s)?),
            idle_timeout: millis!(self, idle_timeout_ms)?,
            resume_window: millis!(self, resume_window_ms)?,
            ws_send_timeout: millis!(self, ws_send_timeout_ms)?,
            send_buffer: match int!(self, send_buffer_bytes)? {
                0 => None,
                n => Some(n as usize),
            },
            grace_period: millis!(self, grace_period_ms)?,
            max_connections: nonzero(max_connections),
            max_connections_per_ip: nonzero(per_ip),
            http_header_timeout: millis!(self, http_header_timeout_ms)?,
            http_idle_timeout: millis!(self, http_idle_timeout_ms)?,
            // At least 8 KiB: hyper accepts no smaller head buffer.
            http_max_header_bytes: int!(self, http_max_header_bytes)? as usize,
            http_body: BodyLimits {
                timeout: millis!(self, http_body_timeout_ms)?,
                min_rate: int!(self, http_body_min_rate)?,
            },
            auth: self.auth()?,
            whip: self.whip()?,
            publish_page: self.publish_page()?,
        })
    }

    /// `publish_page`: the page publishes over WHIP, so it needs WHIP on (a page that
    /// could only be refused would be silently useless).
    fn publish_page(&self) -> Result<bool, ConfigError> {
        if self.publish_page && set(&self.whip_udp_listen).is_none() {
            return Err(ConfigError::new(
                "publish_page",
                ConfigErrorKind::Conflict,
                "the page publishes over WHIP, which is off (whip_udp_listen is empty); set whip_udp_listen",
            ));
        }
        Ok(self.publish_page)
    }

    fn whip(&self) -> Result<Option<WhipConfig>, ConfigError> {
        let connect_timeout = millis!(self, whip_connect_timeout_ms)?;
        let disconnect_timeout = millis!(self, whip_disconnect_timeout_ms)?;
        let max_sessions = int!(self, whip_max_sessions)?;
        let per_ip = int!(self, whip_max_sessions_per_ip)?;
        let per_ip = per_ip_cap(
            "whip_max_sessions_per_ip",
            per_ip,
            "whip_max_sessions",
            max_sessions,
        )?;
        let Some(listen) = set(&self.whip_udp_listen) else {
            // A WHIP setting without the socket would be silently ignored.
            let d = Self::default();
            let changed = first_changed!(
                self,
                d,
                whip_advertise_ips,
                whip_connect_timeout_ms,
                whip_disconnect_timeout_ms,
                whip_max_sessions,
                whip_max_sessions_per_ip,
                whip_allow_foreign_candidates
            );
            return match changed {
                Some(k) => Err(ConfigError::new(
                    k,
                    ConfigErrorKind::Conflict,
                    "WHIP is off (whip_udp_listen is empty); set whip_udp_listen to use it",
                )),
                None => Ok(None),
            };
        };
        let udp_listen = addr("whip_udp_listen", listen, "127.0.0.1:8443")?;
        let refuse = |kind, message| ConfigError::new("whip_advertise_ips", kind, message);
        let mut advertise = Vec::new();
        for part in self
            .whip_advertise_ips
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
        {
            let ip: IpAddr = part.parse().map_err(|_| {
                refuse(
                    ConfigErrorKind::Invalid,
                    format!("{part:?} is not an IP address"),
                )
            })?;
            if ip.is_unspecified() || ip.is_multicast() {
                return Err(refuse(
                    ConfigErrorKind::Invalid,
                    format!("{ip} cannot be reached by a publisher (unspecified or multicast)"),
                ));
            }
            if !advertise.contains(&ip) {
                advertise.push(ip);
            }
        }
        if advertise.len() > MAX_WHIP_ADVERTISE_IPS {
            return Err(refuse(
                ConfigErrorKind::OutOfRange,
                format!(
                    "{} addresses; at most {MAX_WHIP_ADVERTISE_IPS}",
                    advertise.len()
                ),
            ));
        }
        if advertise.is_empty() {
            if udp_listen.ip().is_unspecified() {
                return Err(refuse(
                    ConfigErrorKind::Missing,
                    format!(
                        "whip_udp_listen = {udp_listen} listens on every address; name the ones \
                         publishers reach in whip_advertise_ips"
                    ),
                ));
            }
            advertise.push(udp_listen.ip());
        }
        Ok(Some(WhipConfig {
            udp_listen,
            advertise,
            connect_timeout,
            disconnect_timeout,
            max_sessions: nonzero(max_sessions),
            max_sessions_per_ip: nonzero(per_ip),
            allow_foreign_candidates: self.whip_allow_foreign_candidates,
        }))
    }

    fn auth(&self) -> Result<Option<crate::auth::AuthConfig>, ConfigError> {
        use crate::auth::{AuthConfig, AuthKey, MIN_HS256_SECRET_BYTES, b64url_decode};
        let leeway_s = int!(self, auth_leeway_s)?;
        let key = match (
            set(&self.auth_hs256_secret),
            set(&self.auth_eddsa_public_key),
        ) {
            (Some(_), Some(_)) => {
                return Err(ConfigError::new(
                    "auth_eddsa_public_key",
                    ConfigErrorKind::Conflict,
                    "set either auth_hs256_secret or auth_eddsa_public_key, not both",
                ));
            }
            // The secret itself is never part of a message.
            (Some(s), None) if s.len() < MIN_HS256_SECRET_BYTES => {
                return Err(ConfigError::new(
                    "auth_hs256_secret",
                    ConfigErrorKind::Invalid,
                    format!(
                        "too short ({} bytes); at least {MIN_HS256_SECRET_BYTES} bytes",
                        s.len()
                    ),
                ));
            }
            (Some(s), None) => Some(AuthKey::Hs256(s.as_bytes().to_vec())),
            (None, Some(p)) => {
                let bytes: [u8; 32] = b64url_decode(p)
                    .and_then(|b| b.try_into().ok())
                    .ok_or_else(|| {
                        ConfigError::new(
                            "auth_eddsa_public_key",
                            ConfigErrorKind::Invalid,
                            "expected the 32-byte Ed25519 public key in base64url (43 characters)",
                        )
                    })?;
                Some(AuthKey::EdDsa(bytes))
            }
            (None, None) => None,
        };
        match (self.auth_required, key) {
            (true, Some(key)) => Ok(Some(AuthConfig { key, leeway_s })),
            (false, None) => Ok(None),
            (true, None) => Err(ConfigError::new(
                "auth_required",
                ConfigErrorKind::Missing,
                "needs auth_hs256_secret or auth_eddsa_public_key",
            )),
            (false, Some(_)) => Err(ConfigError::new(
                "auth_required",
                ConfigErrorKind::Conflict,
                "a token key is set but auth_required is false; set auth_required = true to check tokens",
            )),
        }
    }
}

/// Most addresses `whip_advertise_ips` takes.
const MAX_WHIP_ADVERTISE_IPS: usize = 8;
