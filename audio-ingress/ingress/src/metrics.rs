//! Every metric name of the `serve` service, in one place: the WebSocket and WHIP
//! doors, the HTTP listeners and the memory bound. The producer core's names (queue,
//! publisher, confirmation window, NATS connection) are `weir_audio_producer::metrics`;
//! the binary registers both lists at start, so that each name is in the first scrape.
//!
//! Conventions: the `weir_ingress_` prefix, `_bytes`, `_seconds` and `_total` suffixes
//! for units and counters, low-cardinality labels only (never a stream id: per-stream
//! numbers are in the admin `/v1/streams` view, not in Prometheus).
//!
//! The binary installs the Prometheus recorder with the producer core's histogram
//! buckets ([`prometheus_recorder`]). Per-event metrics (connections, closes, WHIP
//! sessions) go through the `metrics` facade as they happen.

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusRecorder};
use weir_audio_producer::metrics::QUEUE_WAIT_BUCKETS;

weir_service::declare_metrics! {
    /// Every metric of the `serve` front door, registered at start
    /// ([`weir_service::metrics::register`]) beside the producer core's
    /// (`weir_audio_producer::metrics::DECLARED`) so that each is in the first scrape.
    pub const DECLARED;

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
    /// Gauge: recognition workers announcing for this door's subject and partitions,
    /// live (heard within 2.5 of their intervals).
    gauge pub const CAPACITY_WORKERS: &str = "weir_ingress_capacity_workers";
    /// Gauge: slots (`max_streams`) of the live workers.
    gauge pub const CAPACITY_SLOTS: &str = "weir_ingress_capacity_slots";
    /// Gauge: slots of the live workers not taken by a live stream.
    gauge pub const CAPACITY_FREE_SLOTS: &str = "weir_ingress_capacity_free_slots";
    /// Gauge: p99 of the lag of the streams the live workers list, in seconds.
    gauge pub const CAPACITY_LAG_P99_SECONDS: &str = "weir_ingress_capacity_lag_p99_seconds";
    /// Gauge: 1 while lease-mode workers are heard but the door's view of their lease
    /// bucket is not complete (at start, while its watcher is re-created, or for ever
    /// when NATS permissions deny the watch: the door then decides on the partitions
    /// the workers announce, which it cannot check); 0 otherwise.
    gauge pub const CAPACITY_LEASE_UNSYNCED: &str = "weir_ingress_capacity_lease_unsynced";
    /// Counter: streams refused `503 no_capacity`, by `reason` (`gone`, `orphaned`,
    /// `full`, `lagging`).
    counter pub const CAPACITY_REFUSED_TOTAL: &str = "weir_ingress_capacity_refused_total";
    /// Counter: streams `capacity.mode = shadow` admitted that `enforce` would have
    /// refused, by `reason`.
    counter pub const CAPACITY_SHADOW_WOULD_REJECT_TOTAL: &str = "weir_ingress_capacity_shadow_would_reject_total";
    /// Counter: capacity messages ignored, by `kind` (the decoding's kinds: `too_large`,
    /// `invalid_json`, `unknown_field`, `unsupported_version`, `subject_mismatch`,
    /// `invalid_id`, `out_of_range`, `stale`; the view's: `other_subject`,
    /// `instance_conflict`, `seq_not_increasing`, `other_bucket`, `too_many_workers`,
    /// `not_owned` (one per partition a worker claims that the lease bucket gives to
    /// another), `refusal_not_held` (a refusal for a stream this door does not hold),
    /// `refusal_other_worker` (a refusal from a worker that does not serve the stream),
    /// `bad_lease_key`).
    counter pub const CAPACITY_IGNORED_TOTAL: &str = "weir_ingress_capacity_ignored_total";
    /// Counter: valid worker refusals received (`<prefix>.refused.*`).
    counter pub const CAPACITY_WORKER_REFUSALS_TOTAL: &str = "weir_ingress_capacity_worker_refusals_total";
    /// Counter: worker refusals that ended a stream of this door (`closed`
    /// `no_capacity`).
    counter pub const CAPACITY_WORKER_REFUSALS_APPLIED_TOTAL: &str = "weir_ingress_capacity_worker_refusals_applied_total";
    /// Counter: `degraded` events sent to producers.
    counter pub const CAPACITY_DEGRADED_EVENTS_TOTAL: &str = "weir_ingress_capacity_degraded_events_total";
    /// Counter: resume attempts, by `outcome` (`resumed`, or the refusal's code:
    /// `resume_invalid`, `resume_mismatch`, `resume_expired`, `resume_ended`,
    /// `resume_ahead`, `invalid_request`, `taken_over`, `resume_busy`).
    counter pub const RESUMES_TOTAL: &str = "weir_ingress_resumes_total";
    /// Counter: streams parked because their producer's connection dropped (they wait
    /// `resume_window_ms` for it).
    counter pub const RESUME_PARKED_TOTAL: &str = "weir_ingress_resume_parked_total";
    /// Counter: parked streams that ended without a resume, by `reason` (`expired`:
    /// the window ran out, `replaced`: a fresh open of the id).
    counter pub const RESUME_PARKED_ENDED_TOTAL: &str = "weir_ingress_resume_parked_ended_total";
    /// Histogram: seconds from a resume's request to the first frame the door admitted
    /// on the resumed connection.
    histogram pub const RESUME_SECONDS: &str = "weir_ingress_resume_seconds";
    /// Counter: carrier connections that reached `start`, by `dialect` (`twilio`,
    /// `telnyx`) and `outcome` (`started`; `refused`: the door's admission refused the
    /// stream).
    counter pub const TELEPHONY_CALLS_TOTAL: &str = "weir_ingress_telephony_calls_total";
    /// Gauge: calls open on the telephony door.
    gauge pub const TELEPHONY_CALLS_ACTIVE: &str = "weir_ingress_telephony_calls_active";
    /// Counter: 20 ms frames of the telephony door, by `direction`: `in` (caller audio
    /// pushed to its stream), `out` (bot audio sent to the carrier).
    counter pub const TELEPHONY_FRAMES_TOTAL: &str = "weir_ingress_telephony_frames_total";
    /// Counter: carrier `media` chunks, by `outcome`: `taken` (inbound track), `late`
    /// (after its slot was declared a gap: dropped), `reordered` (arrived after a later
    /// chunk and was put back in order), `other_track` (outbound-track media, ignored).
    counter pub const TELEPHONY_CHUNKS_TOTAL: &str = "weir_ingress_telephony_chunks_total";
    /// Counter: gaps declared for missing or late carrier chunks (reason `source`).
    counter pub const TELEPHONY_GAPS_TOTAL: &str = "weir_ingress_telephony_gaps_total";
    /// Counter: carrier chunks inside those gaps.
    counter pub const TELEPHONY_GAP_CHUNKS_TOTAL: &str = "weir_ingress_telephony_gap_chunks_total";
    /// Counter: carrier messages refused (the call ended `error`, or never started), by
    /// `code` (`invalid_json`, `invalid_base64`, `unsupported_format`, `sequence_repeat`,
    /// `before_start`, `duplicate_start`, `start_timeout`, ...).
    counter pub const TELEPHONY_BAD_INPUT_TOTAL: &str = "weir_ingress_telephony_bad_input_total";
    /// Counter: carrier events the door does not use (unknown event names), ignored.
    counter pub const TELEPHONY_IGNORED_EVENTS_TOTAL: &str = "weir_ingress_telephony_ignored_events_total";
    /// Gauge: bot audio queued towards the carriers, bytes of 16 kHz PCM, all calls.
    gauge pub const TELEPHONY_OUT_QUEUE_BYTES: &str = "weir_ingress_telephony_out_queue_bytes";
    /// Counter: bot-audio frames dropped, by `reason`: `queue_full` (refused at the
    /// call's byte bound), `total_full` (at every call's), `max_age`, `cleared` (a
    /// `clear`), `ended` (queued when the call ended).
    counter pub const TELEPHONY_OUT_DROPPED_FRAMES_TOTAL: &str = "weir_ingress_telephony_out_dropped_frames_total";
    /// Counter: bot-audio and control messages refused, by `code` (`too_large`,
    /// `odd_length`, `invalid_mark`, `invalid_control`).
    counter pub const TELEPHONY_OUT_REFUSED_TOTAL: &str = "weir_ingress_telephony_out_refused_total";
    /// Counter: `clear` commands carried out.
    counter pub const TELEPHONY_CLEARS_TOTAL: &str = "weir_ingress_telephony_clears_total";
    /// Counter: marks, by `outcome`: `sent` (to the carrier), `played` (echoed back),
    /// `unknown` (an echo of no outstanding mark).
    counter pub const TELEPHONY_MARKS_TOTAL: &str = "weir_ingress_telephony_marks_total";
    /// Counter: call events not published (their channel full, or NATS did not take
    /// them within 2 s).
    counter pub const TELEPHONY_EVENTS_DROPPED_TOTAL: &str = "weir_ingress_telephony_events_dropped_total";
}

/// The names of both HTTP listeners' metrics, labelled `listener` = `ws` | `admin`.
pub const LISTENER: weir_service::http::ListenerMetrics = weir_service::http::ListenerMetrics {
    connections_total: HTTP_CONNECTIONS_TOTAL,
    refused_total: HTTP_CONNECTIONS_REFUSED_TOTAL,
    timed_out_total: HTTP_CONNECTIONS_TIMED_OUT_TOTAL,
    accept_errors_total: HTTP_ACCEPT_ERRORS_TOTAL,
};

/// Label key for a WebSocket close code.
pub const LABEL_CODE: &str = "code";
/// Label key of a refusal reason.
pub const LABEL_REASON: &str = "reason";
/// Label key of an ignored capacity message's kind.
pub const LABEL_KIND: &str = "kind";
/// Label key of a resume's outcome.
pub const LABEL_OUTCOME: &str = "outcome";
/// Label key of a carrier dialect (`twilio`, `telnyx`).
pub const LABEL_DIALECT: &str = "dialect";
/// Label key of a telephony frame's direction (`in`, `out`).
pub const LABEL_DIRECTION: &str = "direction";

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
        let mut names: Vec<&str> = names_in_source(src, &["weir_ingress_"]);
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
