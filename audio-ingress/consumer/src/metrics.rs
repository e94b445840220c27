//! Every metric name of the consumer core, in one place.
//!
//! Prefix `weir_consumer_`, `_total` on counters; low-cardinality labels only (never a
//! stream id: per-stream numbers are in `Consumer::stats()`). The core emits through the
//! `metrics` facade only: the recognition worker installs whatever recorder it uses,
//! and [`CONSUMER_DECLARED`] is registered when a consumer starts, so every name is in
//! the worker's first scrape.

/// Label: the event or reason of a counter.
pub const LABEL_EVENT: &str = "event";
/// Label: why a frame was dropped or a stream ended.
pub const LABEL_REASON: &str = "reason";

/// Label of the lease counters: `claim`, `takeover`, `renew`, `release`.
pub const LABEL_OP: &str = "op";
/// Label of the lease counters: `ok`, `conflict`, `timeout`, `error`.
pub const LABEL_OUTCOME: &str = "outcome";

weir_service::declare_metrics! {
    /// Every metric of the consumer core, registered when a consumer starts.
    pub const CONSUMER_DECLARED;

    /// Counter: NATS messages received by the consumer's subscriptions.
    counter pub const CONSUMER_MESSAGES_TOTAL: &str = "weir_consumer_messages_total";
    /// Counter: frames received in order (accepted by the sequence check).
    counter pub const CONSUMER_FRAMES_TOTAL: &str = "weir_consumer_frames_total";
    /// Counter: frames whose handler call completed.
    counter pub const CONSUMER_FRAMES_DELIVERED_TOTAL: &str = "weir_consumer_frames_delivered_total";
    /// Counter: frames dropped by the consumer, by `reason` (`overload` under the `gap`
    /// policy, `closed` after an overload under `close`, `handler_gone`).
    counter pub const CONSUMER_FRAMES_DROPPED_TOTAL: &str = "weir_consumer_frames_dropped_total";
    /// Counter: frames that never arrived (sequence jumps not covered by a gap packet).
    counter pub const CONSUMER_FRAMES_LOST_TOTAL: &str = "weir_consumer_frames_lost_total";
    /// Counter: frames declared missing by producer gap packets.
    counter pub const CONSUMER_DECLARED_GAP_FRAMES_TOTAL: &str = "weir_consumer_declared_gap_frames_total";
    /// Counter: duplicate or out-of-order packets refused.
    counter pub const CONSUMER_STALE_PACKETS_TOTAL: &str = "weir_consumer_stale_packets_total";
    /// Counter: `end` packets for streams the consumer was not following.
    counter pub const CONSUMER_ORPHAN_ENDS_TOTAL: &str = "weir_consumer_orphan_ends_total";
    /// Counter: undecodable packets, by `kind` (the decoder's error kind).
    counter pub const CONSUMER_DECODE_ERRORS_TOTAL: &str = "weir_consumer_decode_errors_total";
    /// Counter: messages whose subject does not fit the subject template.
    counter pub const CONSUMER_UNROUTABLE_TOTAL: &str = "weir_consumer_unroutable_total";
    /// Counter: messages whose stream hashes to another partition than their subject's.
    counter pub const CONSUMER_MISROUTED_TOTAL: &str = "weir_consumer_misrouted_total";
    /// Counter: stream instances started.
    counter pub const CONSUMER_STREAMS_STARTED_TOTAL: &str = "weir_consumer_streams_started_total";
    /// Counter: new streams refused (no handler created), by `reason` (`max_streams`).
    counter pub const CONSUMER_STREAMS_REFUSED_TOTAL: &str = "weir_consumer_streams_refused_total";
    /// Counter: frames of refused streams, by `reason` (`max_streams`); a refused gap
    /// packet adds the frames it declares.
    counter pub const CONSUMER_FRAMES_REFUSED_TOTAL: &str = "weir_consumer_frames_refused_total";
    /// Gauge: stream instances live in the demultiplexers.
    gauge pub const CONSUMER_STREAMS_ACTIVE: &str = "weir_consumer_streams_active";
    /// Counter: stream instances ended, by `cause` (`producer`, `idle`, `overload`,
    /// `restarted`, `shutdown`).
    counter pub const CONSUMER_STREAMS_ENDED_TOTAL: &str = "weir_consumer_streams_ended_total";
    /// Counter: streams reaped after the idle timeout without `end`.
    counter pub const CONSUMER_STREAMS_REAPED_TOTAL: &str = "weir_consumer_streams_reaped_total";
    /// Counter: times a stream's handler queue went over its bytes/age bound.
    counter pub const CONSUMER_OVERLOADS_TOTAL: &str = "weir_consumer_overloads_total";
    /// Counter: slow-consumer events from the NATS client (it dropped messages of a
    /// subscription whose `subscription_capacity` buffer was full).
    counter pub const CONSUMER_SLOW_CONSUMER_TOTAL: &str = "weir_consumer_slow_consumer_events_total";
    /// Counter: NATS client events seen by the consumer's connection, by `event`.
    counter pub const CONSUMER_NATS_EVENTS_TOTAL: &str = "weir_consumer_nats_events_total";
    /// Gauge: 1 while the consumer's NATS connection is up, 0 after a disconnect.
    gauge pub const CONSUMER_NATS_CONNECTED: &str = "weir_consumer_nats_connected";
    /// Counter: frames dropped before the handler because they were older than
    /// `max_frame_age_ms` (the [`Counters::stale_frames`](crate::Counters::stale_frames)).
    counter pub const CONSUMER_FRAMES_STALE_TOTAL: &str = "weir_consumer_frames_stale_total";
    /// Counter: frames of holes inside a range declared by `Weir-Possibly-Lost`, counted
    /// when the hole is found inside a declared range or when a declaration re-labels an
    /// earlier hole. A subset of `weir_consumer_frames_lost_total`, which counts every hole
    /// at detection: undeclared loss = lost − possibly lost.
    counter pub const CONSUMER_FRAMES_POSSIBLY_LOST_TOTAL: &str = "weir_consumer_frames_possibly_lost_total";
    /// Counter: packets that carried a valid `Weir-Possibly-Lost` header.
    counter pub const CONSUMER_POSSIBLE_LOSS_DECLARATIONS_TOTAL: &str = "weir_consumer_possible_loss_declarations_total";
    /// Counter: errors reported by the consumer's JetStream source (missed heartbeats,
    /// failed recreations); each is followed by a recovery attempt.
    counter pub const CONSUMER_JETSTREAM_ERRORS_TOTAL: &str = "weir_consumer_jetstream_errors_total";
    /// Counter: messages skipped because they were stored before a `start = "new"`
    /// JetStream consumer started (a replay after an early recreation).
    counter pub const CONSUMER_JETSTREAM_SKIPPED_TOTAL: &str = "weir_consumer_jetstream_skipped_total";
    /// Counter: seqs declared to handlers as a handover gap (lease ownership: a partition
    /// taken over from another worker).
    counter pub const CONSUMER_HANDOVER_FRAMES_TOTAL: &str = "weir_consumer_handover_frames_total";
    /// Counter: lease KV operations by `op` and `outcome`.
    counter pub const CONSUMER_LEASE_OPS_TOTAL: &str = "weir_consumer_lease_ops_total";
    /// Counter: partitions fenced (lease lost, run out, or released) by `reason`
    /// (`conflict`, `expired`, `taken_over`, `released`, `shutdown`, `stalled`: the
    /// worker's own heartbeats did not come back in time, `raced`: a claim that the
    /// server accepted but another worker's newer write overrode).
    counter pub const CONSUMER_LEASE_FENCES_TOTAL: &str = "weir_consumer_lease_fences_total";
    /// Gauge: partitions this worker holds by lease.
    gauge pub const CONSUMER_LEASES_HELD: &str = "weir_consumer_leases_held";
    /// Gauge: live workers this worker counts (itself included).
    gauge pub const CONSUMER_LEASE_LIVE_WORKERS: &str = "weir_consumer_lease_live_workers";
    /// Counter: capacity announcements published (`<prefix>.announce.<worker>`).
    counter pub const CONSUMER_CAPACITY_ANNOUNCEMENTS_TOTAL: &str = "weir_consumer_capacity_announcements_total";
    /// Counter: capacity announcements that could not be published (logged at most once
    /// per 10 s; the next interval tries again).
    counter pub const CONSUMER_CAPACITY_ANNOUNCE_FAILURES_TOTAL: &str = "weir_consumer_capacity_announce_failures_total";
    /// Counter: refusal notices published (`<prefix>.refused.<stream>`), one per stream
    /// instance refused for `max_streams`.
    counter pub const CONSUMER_CAPACITY_REFUSALS_TOTAL: &str = "weir_consumer_capacity_refusals_published_total";
    /// Counter: refusal notices not sent, by `reason` (`publish_failed`, `buffer_full`:
    /// more than 1,024 waiting for the announcer, `stopped`: refused during shutdown,
    /// after the last announcement, `memory_full`: more refused ids at once than the
    /// bounded memory of notified ones, `invalid_stream_id`).
    counter pub const CONSUMER_CAPACITY_REFUSALS_UNSENT_TOTAL: &str = "weir_consumer_capacity_refusals_unsent_total";
    /// Gauge: the worker's slots (`max_streams`), as last announced.
    gauge pub const CONSUMER_CAPACITY_SLOTS: &str = "weir_consumer_capacity_slots";
    /// Gauge: live streams, as last announced.
    gauge pub const CONSUMER_CAPACITY_LIVE_STREAMS: &str = "weir_consumer_capacity_live_streams";
    /// Gauge: the largest lag of a live stream (age of its oldest frame not yet taken by
    /// its handler), seconds, as last announced.
    gauge pub const CONSUMER_CAPACITY_MAX_LAG_SECONDS: &str = "weir_consumer_capacity_max_lag_seconds";
    /// Gauge: handler busy time over audio time, decaying p95, as last announced.
    gauge pub const CONSUMER_CAPACITY_RTF_P95: &str = "weir_consumer_capacity_rtf_p95";
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A metric added here but not to [`CONSUMER_DECLARED`] would be missing from the
    /// first scrape (and from the deploy kit's check).
    #[test]
    fn every_metric_name_is_declared_once() {
        let mut names =
            weir_service::metrics::names_in_source(include_str!("metrics.rs"), &["weir_consumer_"]);
        let mut listed: Vec<&str> = CONSUMER_DECLARED.iter().map(|d| d.name).collect();
        names.sort_unstable();
        listed.sort_unstable();
        assert_eq!(listed, names);
    }
}
