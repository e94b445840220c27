//! Every metric name of the crate, in one place.
//!
//! Conventions: the `weir_ingress_` prefix for the producer side (the `serve` front door
//! and the producer library), `_bytes`, `_seconds` and `_total` suffixes for units and
//! counters, low-cardinality labels only (never a stream id: per-stream numbers are in
//! the admin `/v1/streams` view, not in Prometheus).
//!
//! Histograms use the few buckets in [`QUEUE_WAIT_BUCKETS`], chosen around the 20 ms
//! frame scale so that "handed over within a frame", "within the 100 ms wait budget"
//! and "within the 500 ms age budget" are separate buckets. The binary installs the
//! Prometheus recorder with these buckets ([`prometheus_recorder`]); the library works
//! without any recorder.
//!
//! Nothing on the per-frame path calls the `metrics` facade: the frame counters and
//! the pending gauges are relaxed atomics of [`crate::stats::Global`], published when
//! `/metrics` is scraped ([`crate::stats::Global::publish_metrics`]), and
//! [`QUEUE_WAIT_SECONDS`] is a [`weir_service::metrics::LatencyHistogram`] the admin
//! server appends to the exporter's text. Per-event metrics (overloads, ends, gaps,
//! confirmation rounds, connections) go through the facade as they happen.

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusRecorder};

weir_service::declare_metrics! {
    /// Every producer-side metric of the `serve` binary, registered at start
    /// ([`weir_service::metrics::register`]) so that each is in the first scrape.
    pub const DECLARED;

    // ---------------------------------------------------------------------------------
    // Producer side (queue, publisher, WebSocket front door, NATS connection)
    // ---------------------------------------------------------------------------------

    /// Gauge: bytes charged for the frames admitted and not yet settled, summed over all
    /// streams: queued, the one frame each publisher may hold in flight, and handed to
    /// NATS but not yet confirmed by the server. Each frame is charged
    /// `max(PCM bytes, 160)`; a frame leaves when it is confirmed, declared possibly
    /// lost or dropped.
    gauge pub const PENDING_BYTES: &str = "weir_ingress_pending_bytes";
    /// Gauge: frames admitted and not yet settled (queued, in flight, or handed to NATS
    /// and unconfirmed), summed over all streams.
    gauge pub const PENDING_FRAMES: &str = "weir_ingress_pending_frames";
    /// Gauge: age of the oldest pending frame over all streams, in seconds (sampled).
    gauge pub const OLDEST_FRAME_AGE_SECONDS: &str = "weir_ingress_oldest_frame_age_seconds";
    /// Counter: frames handed to the NATS client (confirmed or not).
    counter pub const FRAMES_HANDED_OVER_TOTAL: &str = "weir_ingress_frames_handed_over_total";
    /// Gauge: bytes handed to the NATS client and not yet confirmed by the server.
    gauge pub const UNCONFIRMED_BYTES: &str = "weir_ingress_unconfirmed_bytes";
    /// Gauge: frames handed to the NATS client and not yet confirmed by the server.
    gauge pub const UNCONFIRMED_FRAMES: &str = "weir_ingress_unconfirmed_frames";
    /// Gauge: the confirmation window's current byte limit.
    gauge pub const CONFIRM_WINDOW_LIMIT_BYTES: &str = "weir_ingress_confirm_window_limit_bytes";
    /// Counter: confirmation rounds (markers that came back through the server).
    counter pub const CONFIRM_ROUNDS_TOTAL: &str = "weir_ingress_confirm_rounds_total";
    /// Histogram: duration of one confirmation round (marker out → back), seconds.
    histogram pub const CONFIRM_ROUND_SECONDS: &str = "weir_ingress_confirm_round_seconds";
    /// Counter: connection losses that left frames unconfirmed (declared possibly lost).
    counter pub const CONFIRM_DISCONNECTS_TOTAL: &str = "weir_ingress_confirm_disconnects_total";
    /// Counter: frames by `outcome` (`published` = confirmed by the server, `possibly_lost`,
    /// `dropped`, `rejected`) and `reason` (see [`crate::stats::DropReason`]; `none` for
    /// published, `unconfirmed_at_disconnect` for possibly lost).
    counter pub const FRAMES_TOTAL: &str = "weir_ingress_frames_total";
    /// Counter: frames offered to a stream (admitted or not).
    counter pub const FRAMES_OFFERED_TOTAL: &str = "weir_ingress_frames_offered_total";
    /// Counter: streams ended by the `close` policy, by `reason`
    /// (`queue_full`, `max_age`, `publish_timeout`).
    counter pub const OVERLOADS_TOTAL: &str = "weir_ingress_overloads_total";
    /// Counter: gap markers handed to NATS (`gap` policy).
    counter pub const GAPS_TOTAL: &str = "weir_ingress_gaps_total";
    /// Counter: frames covered by gap markers handed to NATS.
    counter pub const GAP_FRAMES_TOTAL: &str = "weir_ingress_gap_frames_total";
    /// Counter: shadow mode — frames the budget would have refused or dropped, by `reason`
    /// (`bytes`, `age`, `publish_timeout`). Nothing is enforced for them.
    counter pub const WOULD_REJECT_TOTAL: &str = "weir_ingress_would_reject_total";
    /// Gauge: streams open (including those still delivering their `end`).
    gauge pub const ACTIVE_STREAMS: &str = "weir_ingress_active_streams";
    /// Counter: streams opened.
    counter pub const STREAMS_TOTAL: &str = "weir_ingress_streams_total";
    /// Counter: stream opens refused, by `reason` (`invalid_id`, `already_active`,
    /// `max_streams`, `shutting_down`).
    counter pub const ADMISSION_REJECTS_TOTAL: &str = "weir_ingress_admission_rejects_total";
    /// Counter: `end` packets handed to NATS, by `reason` (`Weir-End-Reason` values).
    counter pub const ENDS_TOTAL: &str = "weir_ingress_ends_total";
    /// Counter: `end` packets and gap markers published again because the NATS connection
    /// was replaced before the server confirmed them (the client may have discarded
    /// them), by `packet` (`end`, `gap`).
    counter pub const CONTROL_REPUBLISHED_TOTAL: &str = "weir_ingress_control_packets_republished_total";
    /// Counter: `end` packets (or gap markers) that could not be handed to NATS before
    /// their deadline, by `packet` (`end`, `gap`).
    counter pub const CONTROL_LOST_TOTAL: &str = "weir_ingress_control_packets_lost_total";
    /// Counter: NATS publish attempts that hit the publish timeout, by `packet`.
    counter pub const PUBLISH_TIMEOUTS_TOTAL: &str = "weir_ingress_publish_timeouts_total";
    /// Counter: NATS publish calls that returned an error, by `packet`.
    counter pub const PUBLISH_ERRORS_TOTAL: &str = "weir_ingress_publish_errors_total";
    /// Counter: NATS client events, by `event` (`connected`, `disconnected`,
    /// `slow_consumer`, `lame_duck`, `server_error`, `client_error`, `malformed_message`,
    /// `draining`, `closed`).
    counter pub const NATS_EVENTS_TOTAL: &str = "weir_ingress_nats_events_total";
    /// Gauge: 1 while the NATS client is connected, else 0.
    gauge pub const NATS_CONNECTED: &str = "weir_ingress_nats_connected";
    /// Counter: WebSocket connections closed, by `code` (1000, 1001, 1003, 1008, 1011, 1013).
    counter pub const WS_CLOSES_TOTAL: &str = "weir_ingress_ws_closes_total";
    /// Counter: sends to a WebSocket client (event or close frame) that did not complete
    /// within `ws_send_timeout_ms`; the connection was abandoned.
    counter pub const WS_SEND_TIMEOUTS_TOTAL: &str = "weir_ingress_ws_send_timeouts_total";
    /// Gauge: open TCP connections of an HTTP listener, by `listener` (`ws`, `admin`),
    /// upgraded WebSockets included (see `weir_service::http`).
    gauge pub const HTTP_CONNECTIONS_OPEN: &str = "weir_ingress_http_connections_open";
    /// Counter: TCP connections accepted and given a slot, by `listener`.
    counter pub const HTTP_CONNECTIONS_TOTAL: &str = "weir_ingress_http_connections_total";
    /// Counter: TCP connections refused at accept, by `listener` and `reason`
    /// (`max_connections`, `per_ip`).
    counter pub const HTTP_CONNECTIONS_REFUSED_TOTAL: &str = "weir_ingress_http_connections_refused_total";
    /// Counter: connections closed before an upgrade by a timeout, by `listener` and
    /// `reason` (`header`: no complete request head within `http_header_timeout_ms`;
    /// `idle`: no byte moved for `http_idle_timeout_ms`; `body` / `body_rate`: a request
    /// body cut off by `http_body_timeout_ms` / `http_body_min_rate`; `evicted`: an
    /// admin connection waiting for a head, whose slot a new connection took).
    counter pub const HTTP_CONNECTIONS_TIMED_OUT_TOTAL: &str = "weir_ingress_http_connections_timed_out_total";
    /// Counter: `accept` failures other than a peer's reset (e.g. out of file descriptors),
    /// by `listener`.
    counter pub const HTTP_ACCEPT_ERRORS_TOTAL: &str = "weir_ingress_http_accept_errors_total";
    /// Counter: WHIP sessions created (offer answered 201).
    counter pub const WHIP_SESSIONS_TOTAL: &str = "weir_ingress_whip_sessions_total";
    /// Counter: WHIP sessions the driver ended because the publisher was lost (ICE
    /// disconnected or silent past `whip_disconnect_timeout_ms`, never connected within
    /// `whip_connect_timeout_ms`, DTLS or SRTP failure).
    counter pub const WHIP_SESSIONS_LOST_TOTAL: &str = "weir_ingress_whip_sessions_lost_total";
    /// Counter: Opus packets decoded by the WHIP pumps.
    counter pub const WHIP_PACKETS_DECODED_TOTAL: &str = "weir_ingress_whip_packets_decoded_total";
    /// Gauge that only grows (a counter of fractional seconds): time spent decoding Opus
    /// (÷ packets decoded = cost per packet).
    gauge pub const WHIP_DECODE_SECONDS_TOTAL: &str = "weir_ingress_whip_decode_seconds_total";
    /// Counter: Opus packets the decoder refused (each concealed).
    counter pub const WHIP_DECODE_ERRORS_TOTAL: &str = "weir_ingress_whip_decode_errors_total";
    /// Counter: 20 ms frames made by Opus loss concealment instead of decoded audio.
    counter pub const WHIP_CONCEALED_FRAMES_TOTAL: &str = "weir_ingress_whip_concealed_frames_total";
    /// Counter: RTP sequence gaps (one per jump).
    counter pub const WHIP_RTP_GAPS_TOTAL: &str = "weir_ingress_whip_rtp_gaps_total";
    /// Counter: RTP packets missing in those gaps.
    counter pub const WHIP_RTP_LOST_PACKETS_TOTAL: &str = "weir_ingress_whip_rtp_lost_packets_total";
    /// Counter: Opus packets dropped before decoding because a pump was behind (its
    /// bounded channel was full); the pump sees them as an RTP gap.
    counter pub const WHIP_PACKETS_DROPPED_TOTAL: &str = "weir_ingress_whip_packets_dropped_total";
    /// Gauge: the most memory this replica's configuration lets it hold above idle, plus an
    /// idle allowance, in bytes: the sum of docs/operations.md § Memory
    /// ([`crate::config::Config::memory_bound_bytes`]). Compare `process_resident_memory_bytes`
    /// with it: RSS near it means a buffer the table misses.
    gauge pub const MEMORY_BOUND_BYTES: &str = "weir_ingress_memory_bound_bytes";
}

/// Histogram: time from admission (`try_push`/`push`) to the frame being handed to
/// the NATS client, in seconds.
pub const QUEUE_WAIT_SECONDS: &str = "weir_ingress_queue_wait_seconds";

/// The names of both HTTP listeners' metrics, labelled `listener` = `ws` | `admin`.
pub const LISTENER: weir_service::http::ListenerMetrics = weir_service::http::ListenerMetrics {
    connections_total: HTTP_CONNECTIONS_TOTAL,
    refused_total: HTTP_CONNECTIONS_REFUSED_TOTAL,
    timed_out_total: HTTP_CONNECTIONS_TIMED_OUT_TOTAL,
    accept_errors_total: HTTP_ACCEPT_ERRORS_TOTAL,
};

/// Histogram buckets for [`QUEUE_WAIT_SECONDS`], in seconds.
pub const QUEUE_WAIT_BUCKETS: &[f64] = &[0.001, 0.005, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0];

/// Label key for the frame outcome.
pub const LABEL_OUTCOME: &str = "outcome";
/// Label key for a reason.
pub const LABEL_REASON: &str = "reason";
/// Label key for a packet type.
pub const LABEL_PACKET: &str = "packet";
/// Label key for a NATS event.
pub const LABEL_EVENT: &str = "event";
/// Label key for a WebSocket close code.
pub const LABEL_CODE: &str = "code";
/// Label key for an HTTP listener (`ws`, `admin`).
pub const LABEL_LISTENER: &str = "listener";

/// Builds (does not install) a Prometheus recorder with weir's histogram buckets.
///
/// The binary installs it globally with `metrics::set_global_recorder`, keeps
/// `recorder.handle()` to render `/metrics`, and calls `handle.run_upkeep()`
/// periodically. Tests use a local recorder instead.
pub fn prometheus_recorder() -> PrometheusRecorder {
    let builder = PrometheusBuilder::new();
    match builder.set_buckets(QUEUE_WAIT_BUCKETS) {
        Ok(b) => b.build_recorder(),
        // Only fails for an empty bucket list, which QUEUE_WAIT_BUCKETS is not.
        Err(_) => PrometheusBuilder::new().build_recorder(),
    }
}

// The consumer core's `weir_consumer_*` names are in the `weir-audio-consumer` crate
// (`weir_audio_consumer::metrics`).

#[cfg(test)]
mod tests {
    use super::*;
    use weir_service::metrics::names_in_source;

    /// A metric added to this module but not to its declared list would be missing from
    /// the first scrape (and from the deploy kit's check).
    #[test]
    fn every_metric_name_is_declared_once() {
        let src = include_str!("metrics.rs");
        // The queue-wait histogram is rendered by the ingress itself
        // (`stats::Global::render_histograms`), not registered with the recorder.
        let mut names: Vec<&str> = names_in_source(src, &["weir_ingress_"])
            .into_iter()
            .filter(|n| *n != QUEUE_WAIT_SECONDS)
            .collect();
        let mut listed: Vec<&str> = DECLARED
            .iter()
            .map(|d| d.name)
            .filter(|n| n.starts_with("weir_ingress_"))
            .collect();
        names.sort_unstable();
        listed.sort_unstable();
        assert_eq!(listed, names);
    }
}
