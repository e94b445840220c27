//! Every metric name of the producer core, in one place.
//!
//! Conventions: the `weir_ingress_` prefix (the producer core's names are those of the
//! `audio-ingress serve` replica that links it), `_bytes`, `_seconds` and `_total`
//! suffixes for units and counters, low-cardinality labels only (never a stream id:
//! per-stream numbers are in [`crate::Ingress::streams`], not in Prometheus).
//!
//! Histograms use the few buckets in [`QUEUE_WAIT_BUCKETS`], chosen around the 20 ms
//! frame scale so that "handed over within a frame", "within the 100 ms wait budget"
//! and "within the 500 ms age budget" are separate buckets. The library works without
//! any recorder; a binary that installs one registers [`DECLARED`]
//! ([`weir_service::metrics::register`]) so that each name is in the first scrape.
//! Nothing on the per-frame path calls the `metrics` facade: see [`crate::stats`].

weir_service::declare_metrics! {
    /// Every metric of the producer core (queue, publisher, confirmation window, NATS
    /// connection), registered at start by the binary that links it
    /// ([`weir_service::metrics::register`]) so that each is in the first scrape.
    pub const DECLARED;

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
}

/// Histogram: time from admission (`try_push`/`push`) to the frame being handed to
/// the NATS client, in seconds.
pub const QUEUE_WAIT_SECONDS: &str = "weir_ingress_queue_wait_seconds";

/// Histogram buckets for [`QUEUE_WAIT_SECONDS`], in seconds.
pub const QUEUE_WAIT_BUCKETS: &[f64] = &[0.001, 0.005, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0];

/// Label key for the frame outcome.
pub const LABEL_OUTCOME: &str = "outcome";
/// Label key for a reason.
pub const LABEL_REASON: &str = "reason";
/// Label key for a packet type.
pub const LABEL_PACKET: &str = "packet";

#[cfg(test)]
mod tests {
    use super::*;
    use weir_service::metrics::names_in_source;

    /// A metric added to this module but not to its declared list would be missing from
    /// the first scrape (and from the deploy kit's check).
    #[test]
    fn every_metric_name_is_declared_once() {
        let src = include_str!("metrics.rs");
        // The queue-wait histogram is rendered by the producer core itself
        // (`stats::Global::render_histograms`), not registered with the recorder.
        let mut names: Vec<&str> = names_in_source(src, &["weir_ingress_"])
            .into_iter()
            .filter(|n| *n != QUEUE_WAIT_SECONDS)
            .collect();
        let mut listed: Vec<&str> = DECLARED.iter().map(|d| d.name).collect();
        names.sort_unstable();
        listed.sort_unstable();
        assert_eq!(listed, names);
    }
}
