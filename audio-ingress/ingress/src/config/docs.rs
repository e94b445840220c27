//! Range and meaning of every key, in the order `--list-keys` and the docs show them
//! (name, type and default come from `RawConfig::default`; a unit test checks that
//! these cover exactly its fields). A numeric [`Range`] here is also the one the
//! validation checks.

use weir_service::config::Range;
use weir_service::config::keys::{KeyDoc, Section};
use weir_service::config::section::{ADMIN_KEYS, LOG_KEYS, NATS_KEYS};

const fn doc(name: &'static str, range: Range, help: &'static str) -> KeyDoc {
    KeyDoc::new(name, range, help)
}

/// Every key, by section.
pub const SECTIONS: &[Section] = &[
    Section::new(
        "stream",
        &[
            doc(
                "max_bytes",
                Range::text("2×`max_frame_bytes`..=67108864"),
                "PCM byte budget per stream (queued + in flight + unconfirmed); each frame is charged at least 160 bytes (5 ms), so a stream holds at most `max_bytes` / 160 frames",
            ),
            doc(
                "max_rate",
                Range::text("0 (no bound) or 1.0..=1000"),
                "rate bound in audio time: a stream delivers at most `max_rate` × real time sustained, with a burst of `max_bytes` + 2 s of audio (catching up after a network stall); beyond it the policy applies (close: overload, reason rate; gap: dropped into a marker). Shadow mode enforces `shadow_ceiling_factor` × it",
            ),
            doc(
                "max_age_ms",
                Range::ms(20, 60000),
                "age budget of the oldest pending frame",
            ),
            doc(
                "max_wait_ms",
                Range::text("0..=`max_age_ms`"),
                "`close`: how long a full stream may stay full before it overloads; what `push` waits at most",
            ),
            doc(
                "policy",
                Range::text("`close` or `gap`"),
                "what a stream does when its budget is exhausted",
            ),
            doc(
                "extended_consumers",
                Range::Any,
                "every consumer of the subject speaks the extended protocol; required by `policy = \"gap\"`",
            ),
            doc(
                "shadow",
                Range::Any,
                "measure the budget and count `would_reject`; enforce only the ceiling",
            ),
            doc(
                "shadow_ceiling_factor",
                Range::int(2, 64),
                "shadow mode: the policy still applies at this multiple of the budget",
            ),
            doc(
                "publish_timeout_ms",
                Range::text("1..=`max_age_ms`"),
                "bound on one NATS publish call",
            ),
            doc(
                "end_timeout_ms",
                Range::ms(100, 300000),
                "how long a closing stream keeps trying to hand its `end` (and last gap marker) to NATS",
            ),
            doc(
                "max_frame_bytes",
                Range::text("even, 2..=32000"),
                "largest accepted frame (WebSocket binary message)",
            ),
            doc(
                "frame_headers",
                Range::Any,
                "frames also carry the `Weir-Audio-Version` and `Weir-Captured-At-Ms` headers. The capture time is always in the meta (`captured_at_ms`); headers halve throughput. `end` and `gap` always carry headers",
            ),
            doc(
                "delivery",
                Range::text("`confirmed`, `unconfirmed` or `jetstream`"),
                "`confirmed`: a frame is pending until the server confirms it (the budget holds up to the server); `unconfirmed`: published once handed to the client (comparison only); `jetstream`: lossless mode, frames stored in a JetStream stream (see `jetstream_*`)",
            ),
            doc(
                "confirm_window_ms",
                Range::ms(10, 10000),
                "unconfirmed bytes per connection are limited to this much of the admitted byte rate",
            ),
            doc(
                "confirm_window_min_bytes",
                Range::text("`max_frame_bytes`..=67108864"),
                "the window's floor (one stream's budget)",
            ),
            doc(
                "confirm_interval_ms",
                Range::text("1..=`max_age_ms`/4"),
                "minimum spacing of confirmation markers (one in flight)",
            ),
            doc(
                "jetstream_stream",
                Range::text("1..=64 of `A-Za-z0-9_-`"),
                "`delivery = \"jetstream\"`: the stream (created if missing), capturing the subject template",
            ),
            doc(
                "jetstream_max_age_s",
                Range::secs(1, 604800),
                "how long the stream keeps audio",
            ),
            doc(
                "jetstream_duplicate_window_s",
                Range::text("1..=`jetstream_max_age_s`"),
                "`Nats-Msg-Id` deduplication window (retries within it are stored once)",
            ),
            doc(
                "jetstream_replicas",
                Range::int(1, 5), "stream replicas"),
            doc(
                "subject",
                Range::text("template: `{stream}` once, `{partition}` at most once, no wildcards"),
                "frame subject",
            ),
            doc(
                "partitions",
                Range::text("0 (unset: 1 partition) or 1..=4096 (the consumer core's bound: one subscription per owned partition); required with `{partition}`"),
                "N of `FNV-1a-32(stream id) mod N`",
            ),
        ],
    ),
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
    Section::new("log", LOG_KEYS),
];
