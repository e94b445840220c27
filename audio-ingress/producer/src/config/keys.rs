//! Range and meaning of every key of [`StreamConfig`](super::StreamConfig), in the order
//! `--list-keys` and the docs show them (the `stream` section of the `serve` binary's key
//! table, which takes name, type and default from its loader's defaults). A numeric
//! [`Range`] here is also the one [`StreamConfigBuilder::build`](super::StreamConfigBuilder::build)
//! checks.

use weir_service::config::Range;
use weir_service::config::keys::{KeyDoc, Section};

const fn doc(name: &'static str, range: Range, help: &'static str) -> KeyDoc {
    KeyDoc::new(name, range, help)
}

/// Every key of the producer core's budget and policy, in the order shown.
pub const KEYS: &[KeyDoc] = &[
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
    doc("jetstream_replicas", Range::int(1, 5), "stream replicas"),
    doc(
        "subject",
        Range::text("template: `{stream}` once, `{partition}` at most once, no wildcards"),
        "frame subject",
    ),
    doc(
        "partitions",
        Range::text(
            "0 (unset: 1 partition) or 1..=4096 (the consumer core's bound: one subscription per owned partition); required with `{partition}`",
        ),
        "N of `FNV-1a-32(stream id) mod N`",
    ),
];

/// The range [`KEYS`] gives `key` ([`Range::Any`] for a key without one, which a range
/// check refuses).
pub(super) fn range(key: &str) -> Range {
    weir_service::config::keys::range(&[Section::new("stream", KEYS)], key)
}
