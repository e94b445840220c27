//! Range and meaning of every key, in the order `--list-keys` and the docs show them
//! (name, type and default come from `RawConfig::default`; a unit test checks that
//! these cover exactly its fields). A numeric [`Range`] here is also the one the
//! validation checks. The `stream` section is the producer core's
//! (`weir_audio_producer::config::KEYS`), which its builder validates against.

use weir_service::config::Range;
use weir_service::config::keys::{KeyDoc, Section};
use weir_service::config::section::{ADMIN_KEYS, LOG_KEYS, NATS_KEYS};

const fn doc(name: &'static str, range: Range, help: &'static str) -> KeyDoc {
    KeyDoc::new(name, range, help)
}

/// Every key, by section.
pub const SECTIONS: &[Section] = &[
    Section::new("stream", weir_audio_producer::config::KEYS),
    Section::new(
        "server",
        &[
            doc(
                "listen",
                Range::text("socket address; port 0 = any free port"),
                "WebSocket listener",
            ),
            doc(
                "max_streams",
                Range::int(1, 1000000),
                "concurrent streams (including those still delivering their `end`); above: 503 + `Retry-After`",
            ),
            doc(
                "retry_after_s",
                Range::secs(1, 3600), "`Retry-After` of a 503"),
            doc(
                "idle_timeout_ms",
                Range::ms(100, 86400000),
                "a WebSocket that sends no frame for this long is ended (reason `idle`, close 1001; pings do not count)",
            ),
            doc(
                "resume_window_ms",
                Range::ms(0, 60000),
                "a stream whose producer's connection dropped waits this long for it to resume with its token (same stream, seq continuing), then ends `producer_gone`; 0 = resume off",
            ),
            doc(
                "ws_send_timeout_ms",
                Range::ms(10, 60000),
                "bound on each send to a WebSocket client (event or close frame); a client that stops reading is abandoned after it (stream ends `producer_gone`)",
            ),
            doc(
                "grace_period_ms",
                Range::ms(0, 600000),
                "SIGTERM/SIGINT: time to finish every stream",
            ),
            doc(
                "whip_udp_listen",
                Range::text("UDP socket address; port 0 = any free port; empty = WHIP off"),
                "WHIP ingest (`POST /v1/whip/{stream_id}` on the listen port): the one UDP socket of every session",
            ),
            doc(
                "whip_advertise_ips",
                Range::text("comma-separated IP addresses (at most 8); empty = the `whip_udp_listen` IP, which must then be specified"),
                "ICE host candidates offered to WHIP publishers (public or NAT 1:1 addresses), on the `whip_udp_listen` port",
            ),
            doc(
                "whip_connect_timeout_ms",
                Range::ms(1000, 120000),
                "a WHIP session that has not connected ICE and DTLS within this ends (`producer_gone`)",
            ),
            doc(
                "whip_disconnect_timeout_ms",
                Range::ms(500, 120000),
                "ICE disconnected, or no datagram from the publisher, this long ends the stream (`producer_gone`)",
            ),
            doc(
                "whip_max_sessions",
                Range::int(1, 100000),
                "concurrent WHIP sessions (503 + `Retry-After` above it); WHIP streams also count in `max_streams`",
            ),
            doc(
                "whip_max_sessions_per_ip",
                Range::int(0, 100000).note("; at most `whip_max_sessions`; 0 = a quarter of `whip_max_sessions`"),
                "concurrent WHIP sessions from one IPv4 address or IPv6 /64 (503 `max_sessions_per_ip` + `Retry-After` above it)",
            ),
            doc(
                "whip_allow_foreign_candidates",
                Range::text("`true` or `false`"),
                "`false`: the ICE agent checks only the offer's candidates on the HTTP client's own address (others are dropped from the offer, so no STUN goes to a third party); `true`: every candidate (a publisher behind an HTTP proxy or on another network path)",
            ),
            doc(
                "publish_page",
                Range::text("`true` or `false`; `true` needs `whip_udp_listen`"),
                "serve the reference browser publisher (one static page: microphone → WHIP, weir's events shown to the person) at `GET /publish` on the listen port; docs/publisher.md",
            ),
            doc(
                "auth_required",
                Range::text("`true` needs exactly one key below"),
                "producers must present a signed token (JWT) before the upgrade: 401 missing/invalid, 403 out of scope; on in production",
            ),
            doc(
                "auth_hs256_secret",
                Range::text("at least 32 bytes; or `auth_eddsa_public_key`"),
                "HS256 shared secret of producer tokens; never logged (set it by `WEIR_INGRESS_AUTH_HS256_SECRET` rather than on the command line)",
            ),
            doc(
                "auth_eddsa_public_key",
                Range::text("32-byte Ed25519 public key, base64url (43 characters); or `auth_hs256_secret`"),
                "EdDSA verification key of producer tokens (the signer keeps the private key)",
            ),
            doc(
                "auth_leeway_s",
                Range::secs(0, 300),
                "clock skew allowed on a token's `exp` and `nbf`",
            ),
            doc(
                "max_connections",
                Range::int(1, 1000000).note("; `max_connections` + `admin.max_connections` + 64 <= the hard `RLIMIT_NOFILE`"),
                "open TCP connections on the WebSocket port, upgraded or not; above: refused at accept (503 JSON, closed)",
            ),
            doc(
                "max_connections_per_ip",
                Range::int(0, 1000000).note("; at most `max_connections`; 0 = a quarter of `max_connections`"),
                "open connections on the WebSocket port from one IPv4 address or IPv6 /64",
            ),
            doc(
                "http_header_timeout_ms",
                Range::ms(100, 600000),
                "both ports: a connection must deliver a complete request head within this, counted from accept (and from the end of the previous response on a keep-alive connection); else it is closed",
            ),
            doc(
                "http_idle_timeout_ms",
                Range::ms(100, 3600000),
                "both ports: a connection that moves no byte in either direction for this long before an upgrade is closed",
            ),
            doc(
                "http_body_timeout_ms",
                Range::ms(100, 600000),
                "both ports: a request body must be complete within this of its head; else the request fails (WHIP: 408 `body_timeout`) and the connection is closed",
            ),
            doc(
                "http_body_min_rate",
                Range::int(0, 1073741824),
                "both ports: bytes/s a request body must average from 1 s after its head on (0 = no rate bound); slower: as `http_body_timeout_ms`",
            ),
            doc(
                "http_max_header_bytes",
                Range::bytes(8192, 1048576),
                "largest request head buffered per connection; a larger one is refused (431)",
            ),
        ],
    ),
    Section::new("admin", ADMIN_KEYS),
    Section::new("nats", NATS_KEYS),
    Section::new("capacity", super::CAPACITY_KEYS),
    Section::new("telephony", super::TELEPHONY_KEYS),
    Section::new("log", LOG_KEYS),
];
