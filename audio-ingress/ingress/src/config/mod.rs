//! Configuration: raw values (TOML file, `WEIR_INGRESS_<KEY>` environment variables,
//! command-line overrides) validated once into typed values that cannot be invalid.
//!
//! - [`StreamConfig`] — the producer core's budget and policy
//!   (`weir_audio_producer::config`, whose builder validates the `stream` keys against
//!   the ranges of its `KEYS`); `Default` is the documented default and is valid.
//! - [`ServerConfig`] — the `serve` front door (listeners, stream cap, timeouts).
//! - [`NatsConfig`] — the NATS connection (URL, auth, TLS, client timeouts): the
//!   settings type every weir client shares, `weir_service::nats`; the `[nats]` keys
//!   fill it and `NatsSection::validate` checks it.
//! - [`CapacityConfig`] — admission by recognition capacity (`[capacity]`,
//!   [`crate::capacity`]).
//! - [`TelephonyConfig`](crate::telephony::TelephonyConfig) — the telephony door
//!   (`[telephony]`, [`crate::telephony`]).
//! - [`Config`] — all of them, loaded by [`Config::load`] from [`ConfigSources`].
//!
//! Keys are snake_case names, flat for the ingress's own (`max_bytes`) and in the
//! shared sections every weir binary composes (`[nats]`, `[admin]`, `[log]`, from
//! `weir_service::config::section`). They are the fields of the private `RawConfig`
//! (serde, `deny_unknown_fields`), merged by `weir_service::config` with precedence,
//! lowest first: defaults, the file, the environment, `--set key=value` and the
//! dedicated flags. The flat names the `[nats]` and `[admin]` keys had (`nats_url`,
//! `admin`, ...) still load for one release ([`ALIASES`]), each with a warning naming
//! the new key. Each key's name, default, range and meaning are written once, in its
//! section's declaration (`config_section!`: the flat keys here, the `stream` keys in
//! `StreamConfigBuilder`, the shared sections in `weir_service`); `ServerConfig` and
//! [`Config`] default to those defaults, validated. [`key_table`] (`--list-keys`, and
//! the tables of docs/audio-ingress.md, which a test keeps equal) is generated from
//! them ([`SECTIONS`]); a numeric range there is a typed `Range`, the one the
//! validation checks. Every refusal is a [`ConfigError`]
//! naming the key (a misspelled variable: the variable), where the value came from
//! and, for numbers, the allowed range. [`Config::warnings`] is the tier beside the
//! refusals (`check-config`). Durations are configured in milliseconds (`*_ms`) or
//! seconds (`*_s`) and carried as [`Duration`](std::time::Duration) inside the code.

mod capacity;
mod check;
mod server;
mod telephony;

use std::num::NonZeroUsize;

use weir_service::config::keys::{self, Section};
use weir_service::config::section::{
    ADMIN_KEYS, AdminSection, LOG_KEYS, LogSection, NATS_KEYS, NatsSection,
};
use weir_service::config::{Alias, Layers, Origin, Range, whole_ms as ms};
pub use weir_service::config::{ConfigError, ConfigErrorKind, ConfigSources, ConfigWarning};
use weir_service::http::BodyLimits;
use weir_service::logging::LogFormat;
pub use weir_service::nats::{NatsAuth, NatsConfig, NatsTls};

pub use capacity::{CapacityConfig, CapacityMode, DEFAULT_MAX_LAG_MS};
pub use server::*;
use weir_audio_producer::config::{StreamConfig, StreamConfigBuilder};

/// Prefix of the environment variables: `WEIR_INGRESS_MAX_BYTES` sets `max_bytes`. A
/// variable under it that is not a key is refused (exit 2, naming it), except those in
/// [`ENV_NOT_KEYS`].
pub const ENV_PREFIX: &str = "WEIR_INGRESS_";

/// Variables under [`ENV_PREFIX`] that are not configuration keys: `WEIR_INGRESS_BIN`
/// (where the load test finds this binary; it is inherited by the ingress it starts)
/// and the variable of the `--log-format` flag (`WEIR_INGRESS_LOG_FORMAT`).
pub const ENV_NOT_KEYS: &[&str] = &["BIN", "LOG_FORMAT"];

/// The client name `serve` connects with (shown by the server).
pub const NATS_CLIENT_NAME: &str = "weir-audio-ingress";

/// The complete validated configuration of `audio-ingress serve`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Per-stream budget and policy.
    pub stream: StreamConfig,
    /// Front door.
    pub server: ServerConfig,
    /// NATS connection.
    pub nats: NatsConfig,
    /// Admission by recognition capacity (`[capacity]`).
    pub capacity: CapacityConfig,
    /// The telephony door (`[telephony]`).
    pub telephony: crate::telephony::TelephonyConfig,
    /// Log format (`log.format`).
    pub log: LogFormat,
}

impl Default for Config {
    /// The documented defaults (no key set).
    fn default() -> Self {
        valid_default(RawConfig::default().validate())
    }
}

/// A configuration built from the defaults. They are inside their ranges; a test pins
/// this.
fn valid_default<T>(built: Result<T, ConfigError>) -> T {
    match built {
        Ok(c) => c,
        Err(e) => unreachable!("the default configuration is invalid: {e}"),
    }
}

/// The renamed keys, read under their old flat name for one release (with a warning
/// naming the new key): the `nats_*` keys are the shared `[nats]` section's, the
/// `admin*` keys the shared `[admin]` section's.
pub const ALIASES: &[Alias] = &{
    /// `old => new` pairs, then `<section>_<key>` → `<section>.<key>` for each key.
    macro_rules! renamed {
        ([$($old:literal => $new:literal),*] $($section:literal: [$($key:literal),+]),+) => {
            [$(Alias::new($old, $new),)*
             $($(Alias::new(concat!($section, "_", $key), concat!($section, ".", $key))),+),+]
        };
    }
    renamed!(
        ["admin" => "admin.listen"]
        "nats": [
            "url", "name", "user", "password", "token", "nkey", "creds_file", "tls_required",
            "tls_ca_file", "tls_cert_file", "tls_key_file", "inbox_prefix",
            "connection_timeout_ms", "ping_interval_ms", "client_capacity"
        ],
        "admin": ["max_connections", "request_timeout_ms", "max_concurrent_requests"]
    )
};

/// Every key with its type, default, range and meaning: aligned text for
/// `--list-keys`, or the Markdown tables of docs/audio-ingress.md (each between its
/// `<!-- keys:NAME -->` markers) for `--list-keys --markdown`.
pub fn key_table(markdown: bool) -> String {
    keys::table(&Layers::new(&RawConfig::default()), SECTIONS, markdown)
}

weir_service::config_section! {
    /// The keys as read from the layers, before validation: one field per key, flat
    /// snake_case names and the shared sections; the flat keys are the `server` section
    /// of the key table. Unknown keys are refused by the loader, against the defaults'
    /// keys, before serde (the producer core's keys are flattened in). Secret fields make
    /// a `Debug` impl unwise; there is none.
    struct RawConfig: flattened, SERVER = "";
    {
        listen: String = "127.0.0.1:8080".to_owned(),
            Range::text("socket address; port 0 = any free port"), "WebSocket listener";
        max_streams: u64 = 1000, Range::int(1, 1000000),
            "concurrent streams (including those still delivering their `end`); above: 503 + \
            `Retry-After`";
        retry_after_s: u64 = 1, Range::secs(1, 3600),
            "`Retry-After` of a 503";
        idle_timeout_ms: u64 = 30_000, Range::ms(100, 86400000),
            "a WebSocket that sends no frame for this long is ended (reason `idle`, close 1001; \
            pings do not count)";
        // Covers the second or two a mobile or Wi-Fi producer's connection is lost for,
        // plus its reconnect.
        resume_window_ms: u64 = 5_000, Range::ms(0, 60000),
            "a stream whose producer's connection dropped waits this long for it to resume with \
            its token (same stream, seq continuing), then ends `producer_gone`; 0 = resume off";
        ws_send_timeout_ms: u64 = 2_000, Range::ms(10, 60000),
            "bound on each send to a WebSocket client (event or close frame); a client that \
            stops reading is abandoned after it (stream ends `producer_gone`)";
        // 32 KiB (the kernel doubles it): a phone call's bot audio is ~18.5 KB/s, so a
        // carrier that stops reading is noticed in seconds, not after the 4 MiB the
        // kernel's autotuning would take.
        send_buffer_bytes: u64 = 32 * 1024,
            Range::int(0, 16777216).note(
                "; 0 = the kernel's autotuning (up to `net.ipv4.tcp_wmem`, 4 MiB by default)",
            ),
            "`SO_SNDBUF` of each connection on the listen port: what a client or carrier that \
            stops reading can leave queued in the kernel, and so how soon a send times out \
            (`ws_send_timeout_ms`) for it — a phone carrier's bot audio is ~18.5 KB/s (the \
            kernel doubles the value)";
        grace_period_ms: u64 = 5_000, Range::ms(0, 600000),
            "SIGTERM/SIGINT: time to finish every stream";
        whip_udp_listen: String = String::new(),
            Range::text("UDP socket address; port 0 = any free port; empty = WHIP off"),
            "WHIP ingest (`POST /v1/whip/{stream_id}` on the listen port): the one UDP socket of \
            every session";
        whip_advertise_ips: String = String::new(),
            Range::text(
                "comma-separated IP addresses (at most 8); empty = the `whip_udp_listen` IP, \
                which must then be specified",
            ),
            "ICE host candidates offered to WHIP publishers (public or NAT 1:1 addresses), on the \
            `whip_udp_listen` port";
        whip_connect_timeout_ms: u64 = ms(DEFAULT_WHIP_CONNECT_TIMEOUT), Range::ms(1000, 120000),
            "a WHIP session that has not connected ICE and DTLS within this ends \
            (`producer_gone`)";
        whip_disconnect_timeout_ms: u64 = ms(DEFAULT_WHIP_DISCONNECT_TIMEOUT),
            Range::ms(500, 120000),
            "ICE disconnected, or no datagram from the publisher, this long ends the stream \
            (`producer_gone`)";
        whip_max_sessions: u64 = DEFAULT_WHIP_MAX_SESSIONS as u64, Range::int(1, 100000),
            "concurrent WHIP sessions (503 + `Retry-After` above it); WHIP streams also count in \
            `max_streams`";
        whip_max_sessions_per_ip: u64 = 0,
            Range::int(0, 100000)
                .note("; at most `whip_max_sessions`; 0 = a quarter of `whip_max_sessions`"),
            "concurrent WHIP sessions from one IPv4 address or IPv6 /64 (503 \
            `max_sessions_per_ip` + `Retry-After` above it)";
        whip_allow_foreign_candidates: bool = false, Range::text("`true` or `false`"),
            "`false`: the ICE agent checks only the offer's candidates on the HTTP client's own \
            address (others are dropped from the offer, so no STUN goes to a third party); \
            `true`: every candidate (a publisher behind an HTTP proxy or on another network \
            path)";
        publish_page: bool = false,
            Range::text("`true` or `false`; `true` needs `whip_udp_listen`"),
            "serve the reference browser publisher (one static page: microphone → WHIP, weir's \
            events shown to the person) at `GET /publish` on the listen port; \
            docs/publisher.md";
        auth_required: bool = false, Range::text("`true` needs exactly one key below"),
            "producers must present a signed token (JWT) before the upgrade: 401 \
            missing/invalid, 403 out of scope; on in production";
        auth_hs256_secret: String = String::new(),
            Range::text("at least 32 bytes; or `auth_eddsa_public_key`"),
            "HS256 shared secret of producer tokens; never logged (set it by \
            `WEIR_INGRESS_AUTH_HS256_SECRET` rather than on the command line)";
        auth_eddsa_public_key: String = String::new(),
            Range::text(
                "32-byte Ed25519 public key, base64url (43 characters); or `auth_hs256_secret`",
            ),
            "EdDSA verification key of producer tokens (the signer keeps the private key)";
        auth_leeway_s: u64 = 5, Range::secs(0, 300),
            "clock skew allowed on a token's `exp` and `nbf`";
        max_connections: u64 = 4096,
            Range::int(1, 1000000).note(
                "; `max_connections` + `admin.max_connections` + 64 <= the hard `RLIMIT_NOFILE`",
            ),
            "open TCP connections on the WebSocket port, upgraded or not; above: refused at \
            accept (503 JSON, closed)";
        // Unset: derived from `max_connections` as it is configured.
        max_connections_per_ip: u64 = 0,
            Range::int(0, 1000000)
                .note("; at most `max_connections`; 0 = a quarter of `max_connections`"),
            "open connections on the WebSocket port from one IPv4 address or IPv6 /64";
        http_header_timeout_ms: u64 = 5_000, Range::ms(100, 600000),
            "both ports: a connection must deliver a complete request head within this, counted \
            from accept (and from the end of the previous response on a keep-alive connection); \
            else it is closed";
        http_idle_timeout_ms: u64 = 10_000, Range::ms(100, 3600000),
            "both ports: a connection that moves no byte in either direction for this long \
            before an upgrade is closed";
        http_body_timeout_ms: u64 = ms(BodyLimits::default().timeout), Range::ms(100, 600000),
            "both ports: a request body must be complete within this of its head; else the \
            request fails (WHIP: 408 `body_timeout`) and the connection is closed";
        http_body_min_rate: u64 = BodyLimits::default().min_rate, Range::int(0, 1073741824),
            "both ports: bytes/s a request body must average from 1 s after its head on (0 = no \
            rate bound); slower: as `http_body_timeout_ms`";
        http_max_header_bytes: u64 = 16 * 1024, Range::bytes(8192, 1048576),
            "largest request head buffered per connection; a larger one is refused (431)";
    }
    nested {
        #[serde(flatten)] stream: StreamConfigBuilder,
        admin: AdminSection,
        nats: NatsSection = NatsSection::from_config(&NatsConfig::named(NATS_CLIENT_NAME)),
        capacity: capacity::CapacitySection,
        telephony: telephony::TelephonySection,
        log: LogSection,
    }
}

/// Every key, by section, in the order `--list-keys` and the docs show them (name, type
/// and default come from `RawConfig::default`; a unit test checks that these cover
/// exactly its fields). A numeric [`Range`] here is also the one the validation checks.
/// The `stream` section is the producer core's (`weir_audio_producer::config::KEYS`),
/// which its builder validates against.
pub const SECTIONS: &[Section] = &[
    Section::new("stream", weir_audio_producer::config::KEYS),
    Section::new("server", SERVER),
    Section::new("admin", ADMIN_KEYS),
    Section::new("nats", NATS_KEYS),
    Section::new("capacity", capacity::CAPACITY_KEYS),
    Section::new("telephony", telephony::TELEPHONY_KEYS),
    Section::new("log", LOG_KEYS),
];

/// Idle RSS allowance in [`Config::memory_bound_bytes`] (measured idle: ~17 MiB).
const IDLE_ALLOWANCE_BYTES: u64 = 32 << 20;

impl Config {
    /// The most memory this configuration lets one `serve` replica hold: an idle
    /// allowance (32 MiB) plus the worst case of every buffer in docs/operations.md
    /// § Memory, computed from these settings (≈ 396 MiB at the defaults). Exported as
    /// `weir_ingress_memory_bound_bytes` for the "RSS near the bound" alert.
    pub fn memory_bound_bytes(&self) -> u64 {
        let s = &self.stream;
        let streams = self.server.max_streams.get() as u64;
        // The PCM budget (× the shadow ceiling in shadow mode), charged at least 160 B a
        // frame; each queued frame also costs ~200 B of meta and slot, and a stream
        // holds up to one packet arena (4 KiB) and its gap markers (40 B a frame).
        let budget = s.enforced_max_bytes() as u64;
        let frames = budget / weir_audio_producer::queue::MIN_FRAME_CHARGE as u64 + 1;
        let per_stream_queue = budget + frames * (200 + 40) + 4096;
        // WebSocket buffers: read up to the largest message, write up to 64 KiB.
        let per_stream_ws = s.max_frame_bytes() as u64 + (64 << 10) + (64 << 10);
        // The NATS client's command channel: every slot a largest packet (+ meta,
        // headers).
        let nats = self.nats.client_capacity as u64 * (s.max_frame_bytes() as u64 + 1024);
        // Request heads of open connections on both ports (+ ~12 KiB of state each).
        let heads = (self.server.max_connections.get() + self.server.admin.max_connections.get())
            as u64
            * (self.server.http_max_header_bytes as u64 + (12 << 10));
        // With WHIP on, every connection may be reading an offer (at most 64 KiB
        // buffered, for at most `http_body_timeout_ms`).
        let offers = if self.server.whip.is_some() {
            self.server.max_connections.get() as u64 * crate::whip::MAX_OFFER_BYTES as u64
        } else {
            0
        };
        // A stream may be a phone call: its queued bot audio (`telephony.out_max_bytes`
        // of PCM a call, `out_max_total_bytes` for all; ~10 % more in frame slots).
        let t = &self.telephony;
        let voice = (streams * t.out.max_bytes as u64).min(t.out_max_total_bytes as u64) * 11 / 10;
        // Metrics, per-address table, `/v1/streams`, confirmation markers.
        let misc = 5 << 20;
        IDLE_ALLOWANCE_BYTES
            + streams * (per_stream_queue + per_stream_ws)
            + voice
            + nats
            + heads
            + offers
            + misc
    }

    /// Loads and validates the configuration from `sources`: every key is refused or
    /// accepted whichever layer set it, and a refusal names the key and, when the value
    /// was not a default, where it came from.
    pub fn load(sources: &ConfigSources) -> Result<Self, ConfigError> {
        Self::load_checked(sources).map(|(config, _)| config)
    }

    /// [`Config::load`], with the warnings of the load: each renamed key set under its
    /// old name (the timeout chains are [`Config::warnings`]).
    pub fn load_checked(
        sources: &ConfigSources,
    ) -> Result<(Self, Vec<ConfigWarning>), ConfigError> {
        let mut layers = Layers::new(&RawConfig::default()).with_aliases(ALIASES);
        layers
            .load(sources, ENV_PREFIX, ENV_NOT_KEYS)
            .map_err(from_load)?;
        let raw: RawConfig = layers.build().map_err(from_load)?;
        let config = raw.validate().map_err(|e| {
            let origin = layers.origin(e.key()).clone();
            e.with_origin(&origin)
        })?;
        Ok((config, layers.warnings().to_vec()))
    }
}

/// The loader's refusal as the operator has to fix it (`keys::refusal`); a misspelled
/// variable is named by the variable.
fn from_load(e: ConfigError) -> ConfigError {
    const LIST_KEYS: &str = "audio-ingress serve --list-keys";
    match (e.kind(), e.origin()) {
        (ConfigErrorKind::UnknownKey, Origin::Env(var)) => ConfigError::new(
            var.clone(),
            ConfigErrorKind::UnknownKey,
            format!("{} (see `{LIST_KEYS}`)", e.message()),
        ),
        _ => keys::refusal(e, SECTIONS, LIST_KEYS),
    }
}

/// `v` of `key` within the range [`SECTIONS`] gives it: the key table and the
/// validation read the same bounds ([`Range::Any`] for a key without one, which a range
/// check refuses).
fn int_in(key: &str, v: u64) -> Result<u64, ConfigError> {
    keys::range(SECTIONS, key).check(key, v)
}

impl RawConfig {
    /// Validates every value into the typed settings.
    fn validate(self) -> Result<Config, ConfigError> {
        Ok(Config {
            stream: self.stream.build()?,
            server: self.server()?,
            nats: self.nats.validate(NatsConfig::named(NATS_CLIENT_NAME))?,
            capacity: self.capacity.validate()?,
            telephony: self.telephony.validate()?,
            log: self.log.validate()?,
        })
    }
}

/// A subject prefix (`capacity.prefix`, `telephony.subject_prefix`): no wildcard, no
/// empty token.
fn subject_prefix(key: &str, prefix: &str) -> Result<(), ConfigError> {
    if weir_protocol::capacity::is_valid_prefix(prefix) {
        return Ok(());
    }
    Err(ConfigError::new(
        key,
        ConfigErrorKind::Invalid,
        format!("{prefix:?}: 1..=128 bytes of dot-separated tokens without `*`, `>` or whitespace"),
    ))
}

fn nonzero(v: u64) -> NonZeroUsize {
    NonZeroUsize::new(usize::try_from(v).unwrap_or(usize::MAX)).unwrap_or(NonZeroUsize::MIN)
}

#[cfg(test)]
mod tests;
