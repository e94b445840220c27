//! Every metric name the adapter records, in one place, and the Prometheus recorder.
//!
//! Conventions: `weir_llm_` prefix (every weir metric starts with `weir_`), `_total` on
//! counters, `_seconds` on durations. Labels have small, fixed value sets (`outcome` =
//! `ok` or an error code, `rule` = a limit name or `session_cap` / `session_order`):
//! never a request id, session id or key. Each label's values: the table of
//! docs/llm-adapter.md § Metrics reference.
//!
//! Without an installed recorder (library use, tests) every call is a no-op; it must be
//! installed before [`crate::start`]. The per-request counters and the queue gauges are
//! plain atomics of the admission core, published to the recorder whenever stats are
//! read (every `/metrics` scrape): a request pays no metrics-facade call.
//!
//! The latency histograms are not recorded through the facade (the Prometheus exporter
//! stores every sample): they are [`weir_service::metrics::LatencyHistogram`]s, which
//! `/v1/stats` reads too, rendered with [`DURATION_BUCKETS`] ([`latency_series`]).

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};

weir_service::declare_metrics! {
    /// Every metric recorded through the `metrics` facade, registered at start
    /// ([`weir_service::metrics::register`]) so that each is in the first scrape. (The
    /// latency histograms are `LatencyHistogram`s, always rendered.)
    pub const DECLARED;

    /// Counter: requests received on the inference subject (every attempt, joins included).
    counter pub const OFFERED_TOTAL: &str = "weir_llm_requests_offered_total";
    /// Counter: requests admitted into the queue.
    counter pub const ADMITTED_TOTAL: &str = "weir_llm_requests_admitted_total";
    /// Counter: requests that joined an identical request already queued or running.
    counter pub const JOINED_TOTAL: &str = "weir_llm_requests_joined_total";
    /// Counter: retries answered from the completion cache.
    counter pub const CACHED_TOTAL: &str = "weir_llm_requests_cached_total";
    /// Counter: answers sent, label `outcome` = `ok` or the error code.
    counter pub const ANSWERED_TOTAL: &str = "weir_llm_requests_answered_total";
    /// Counter: limits that would have refused in shadow mode, label `rule`.
    counter pub const WOULD_REJECT_TOTAL: &str = "weir_llm_would_reject_total";
    /// Counter: refusals by a limit in enforce mode, label `rule`.
    counter pub const LIMIT_REJECT_TOTAL: &str = "weir_llm_limit_reject_total";
    /// Counter: backend calls started.
    counter pub const INFERENCE_STARTED_TOTAL: &str = "weir_llm_inference_started_total";
    /// Counter: backend calls started after the request's deadline (must stay 0).
    counter pub const STARTED_AFTER_DEADLINE_TOTAL: &str = "weir_llm_started_after_deadline_total";
    /// Counter: streamed replies (`Weir-Stream: 1`) that reached a worker.
    counter pub const STREAMS_TOTAL: &str = "weir_llm_streams_total";
    /// Counter: `chunk` messages published to streaming callers.
    counter pub const STREAM_CHUNKS_TOTAL: &str = "weir_llm_stream_chunks_total";
    /// Counter: body bytes published in `chunk` messages.
    counter pub const STREAM_BYTES_TOTAL: &str = "weir_llm_stream_bytes_total";
    /// Counter: streams aborted because of the caller, label `reason` (`caller_gone` = no
    /// subscriber on its reply subject, `caller_stalled` = no acknowledgement within
    /// `stream.ack_timeout_ms` with the window full, `publish_timeout` = the NATS client
    /// could not take a chunk within `nats.publish_timeout_ms`).
    counter pub const STREAM_ABORTED_TOTAL: &str = "weir_llm_stream_aborted_total";
    /// Counter: `llm.status` queries, label `result`.
    counter pub const STATUS_TOTAL: &str = "weir_llm_status_requests_total";
    /// Gauge: requests admitted and not yet started (published when stats are read).
    gauge pub const QUEUE_DEPTH: &str = "weir_llm_queue_depth";
    /// Gauge: backend calls in progress (published like [`QUEUE_DEPTH`]).
    gauge pub const RUNNING: &str = "weir_llm_running";
    /// Gauge: configured queue capacity.
    gauge pub const QUEUE_CAPACITY: &str = "weir_llm_queue_capacity";
    /// Gauge: configured worker count.
    gauge pub const WORKERS: &str = "weir_llm_workers";
    /// Gauge: the backend's service-time estimate (decaying p90 of recent calls), seconds,
    /// label `backend` (`sim`, `openai`, `nats`); 0 while there is none (see
    /// [`SERVICE_ESTIMATE_SAMPLES`]). Published like [`QUEUE_DEPTH`].
    gauge pub const SERVICE_ESTIMATE_SECONDS: &str = "weir_llm_service_time_estimate_seconds";
    /// Gauge: samples behind [`SERVICE_ESTIMATE_SECONDS`], label `backend`.
    gauge pub const SERVICE_ESTIMATE_SAMPLES: &str = "weir_llm_service_time_estimate_samples";
    /// Counter: cancellation requests, label `result` (`queued`, `running`, `not_found`).
    counter pub const CANCEL_TOTAL: &str = "weir_llm_cancel_requests_total";
    /// Counter: session cancels (`Weir-Cancel-Session`), label `result` (`cancelled` =
    /// at least one request was, `not_found`).
    counter pub const SESSION_CANCEL_TOTAL: &str = "weir_llm_session_cancels_total";
    /// Counter: requests sent with `Weir-Supersede: session` (valid ones), label
    /// `result` (`superseded` = at least one earlier request was cancelled, `nothing`).
    counter pub const SUPERSEDE_TOTAL: &str = "weir_llm_supersedes_total";
    /// Counter: requests cancelled by a session cancel or a supersede, labels `by`
    /// (`session_cancel`, `supersede`) and `stage` (`queued` = answered at once,
    /// `running` = backend call aborted).
    counter pub const INTERRUPTED_TOTAL: &str = "weir_llm_session_interrupted_requests_total";
    /// Counter: replies that could not be published (timeout or connection closed).
    counter pub const REPLY_FAILED_TOTAL: &str = "weir_llm_reply_failed_total";
    /// Counter: requests without a reply subject (nothing can be answered; dropped).
    counter pub const NO_REPLY_SUBJECT_TOTAL: &str = "weir_llm_requests_without_reply_total";
    /// Counter: trace events dropped because the NATS trace publisher fell behind.
    counter pub const TRACE_DROPPED_TOTAL: &str = "weir_llm_trace_events_dropped_total";
    /// Gauge: replies held by the idempotency cache (published like [`QUEUE_DEPTH`]).
    gauge pub const CACHE_ENTRIES: &str = "weir_llm_idempotency_cache_entries";
    /// Gauge: bytes held by the idempotency cache (body + headers + key + per-entry
    /// overhead), never above `idempotency.max_bytes`.
    gauge pub const CACHE_BYTES: &str = "weir_llm_idempotency_cache_bytes";
    /// Counter: cached replies evicted before their window ended, label `reason`.
    counter pub const CACHE_EVICTED_TOTAL: &str = "weir_llm_idempotency_cache_evicted_total";
    /// Counter: replies not cached because one alone exceeds `idempotency.max_bytes`.
    counter pub const CACHE_TOO_LARGE_TOTAL: &str = "weir_llm_idempotency_cache_too_large_total";
    /// Counter: the NATS client's events, label `event` (`slow_consumer` = one message
    /// dropped: a request dropped there gets no answer; also `nats.dropped` in `/v1/stats`).
    counter pub const NATS_EVENTS_TOTAL: &str = "weir_llm_nats_events_total";
    /// Counter: messages the NATS client received (published when stats are read).
    counter pub const NATS_IN_MESSAGES_TOTAL: &str = "weir_llm_nats_in_messages_total";
    /// Counter: messages the endpoint loops took from their subscriptions. At rest,
    /// `weir_llm_nats_in_messages_total − weir_llm_intake_taken_total` is the exact number the
    /// client dropped (plus `$SRV` requests and NATS-backend replies).
    counter pub const INTAKE_TAKEN_TOTAL: &str = "weir_llm_intake_taken_total";
    /// Counter: admin connections refused because `admin.max_connections` were open
    /// (labels `listener` = `admin`, `reason` = `max_connections`).
    counter pub const ADMIN_CONNECTIONS_REFUSED_TOTAL: &str = "weir_llm_admin_connections_refused_total";
    /// Counter: admin connections closed by a timeout, label `reason` (`header`, `idle`,
    /// `body`, `body_rate`), or evicted by a new connection on a full cap (`evicted`).
    counter pub const ADMIN_CONNECTIONS_TIMED_OUT_TOTAL: &str = "weir_llm_admin_connections_timed_out_total";
    /// Counter: admin connections accepted.
    counter pub const ADMIN_CONNECTIONS_TOTAL: &str = "weir_llm_admin_connections_total";
    /// Gauge: admin connections open.
    gauge pub const ADMIN_CONNECTIONS_OPEN: &str = "weir_llm_admin_connections_open";
    /// Counter: admin accept errors other than a peer's reset (e.g. out of descriptors).
    counter pub const ADMIN_ACCEPT_ERRORS_TOTAL: &str = "weir_llm_admin_accept_errors_total";
    /// Counter: requests pulled from the durable intake stream (`intake = "jetstream"`).
    counter pub const INTAKE_PULLED_TOTAL: &str = "weir_llm_intake_pulled_total";
    /// Counter: pulled requests the server had delivered before (to a replica that died,
    /// stalled beyond `jetstream.ack_wait_ms`, or stopped and handed them back).
    counter pub const INTAKE_REDELIVERED_TOTAL: &str = "weir_llm_intake_redelivered_total";
    /// Counter: acknowledgements sent for intake requests, label `kind` (`ack` = answered,
    /// `term` = refused before admission, `nak` = handed to another replica, `progress`
    /// = still working).
    counter pub const INTAKE_ACKS_TOTAL: &str = "weir_llm_intake_acks_total";
    /// Counter: acknowledgements that could not be published within
    /// `nats.publish_timeout_ms` (the server redelivers such a request after AckWait).
    counter pub const INTAKE_ACK_FAILED_TOTAL: &str = "weir_llm_intake_ack_failed_total";
    /// Counter: intake requests terminated without admission, label `reason` (`expired` =
    /// its deadline passed in the stream, `invalid` = a malformed header, ...).
    counter pub const INTAKE_TERMINATED_TOTAL: &str = "weir_llm_intake_terminated_total";
    /// Counter: pull requests that failed or ended in an error item (a missed heartbeat, a
    /// server restart); the loop pulls again.
    counter pub const INTAKE_PULL_ERRORS_TOTAL: &str = "weir_llm_intake_pull_errors_total";
    /// Counter: cluster-wide slot operations (session cap, limits), label `result`
    /// (`acquired`, `taken_over` = a redelivered request took its own slot back, `full`,
    /// `waited` = a wait-limit slot taken after waiting, `wait_timeout` = none within
    /// `max_wait` or the deadline, `wait_refused` = `max_waiters` already waiting on this
    /// replica, `error` = the KV store failed and the request was handed back, `lost` = a
    /// renewal found the slot taken).
    counter pub const INTAKE_CLUSTER_SLOTS_TOTAL: &str = "weir_llm_intake_cluster_slots_total";
    /// Counter: core requests put into the durable intake by this replica
    /// (`jetstream.forward`), label `result` (`stored`, `duplicate`, `failed`, `joined`,
    /// `conflict` = a duplicate with another body or session).
    counter pub const INTAKE_FORWARDED_TOTAL: &str = "weir_llm_intake_forwarded_total";
    /// Counter: writes of answers to the reply bucket (`jetstream.reply_bucket`), label
    /// `result` (`kept`; `retried` = an attempt failed and is made again; `failed` = not
    /// kept within `jetstream.ack_wait_ms`, acknowledged without it).
    counter pub const INTAKE_REPLIES_KEPT_TOTAL: &str = "weir_llm_intake_replies_kept_total";
    /// Counter: redelivered intake requests answered from the reply bucket instead of
    /// running again (a replica answered them and died before its `+ACK` arrived).
    counter pub const INTAKE_REPLAYED_TOTAL: &str = "weir_llm_intake_replayed_total";
    /// Counter: redelivered intake requests whose reply-bucket read failed: handed back
    /// for later (`-NAK`), or run on their last delivery (`jetstream.max_deliver`).
    counter pub const INTAKE_REPLAY_CHECK_FAILED_TOTAL: &str =
        "weir_llm_intake_replay_check_failed_total";
    /// Gauge: intake requests this replica holds (pulled, not yet settled).
    gauge pub const INTAKE_HELD: &str = "weir_llm_intake_held";
    /// Counter: tokens reserved at admission by the per-key token budgets, label `rule`.
    counter pub const TOKENS_RESERVED_TOTAL: &str = "weir_llm_tokens_reserved_total";
    /// Counter: tokens charged when requests ended (the backend's `usage`, clamped;
    /// else the reservation, or the prompt estimate of a failed call), label `rule`.
    counter pub const TOKENS_USED_TOTAL: &str = "weir_llm_tokens_used_total";
    /// Counter: reserved tokens given back (not used), label `rule`.
    counter pub const TOKENS_REFUNDED_TOTAL: &str = "weir_llm_tokens_refunded_total";
    /// Counter: tokens charged beyond a reservation, label `rule`.
    counter pub const TOKENS_OVERCHARGED_TOTAL: &str = "weir_llm_tokens_overcharged_total";
    /// Counter: requests refused `token_budget_exceeded`, label `rule`.
    counter pub const TOKENS_REFUSED_TOTAL: &str = "weir_llm_token_budget_refused_total";
    /// Counter: settlements of started requests, labels `rule` and `usage` (where the
    /// count came from).
    counter pub const TOKENS_USAGE_TOTAL: &str = "weir_llm_token_usage_total";
    /// Gauge: keys whose token budget is tracked now, label `rule`.
    gauge pub const TOKEN_KEYS: &str = "weir_llm_token_budget_keys";
    /// Counter: keys forgotten to stay within `max_token_keys`, label `rule`.
    counter pub const TOKEN_KEYS_EVICTED_TOTAL: &str = "weir_llm_token_budget_keys_evicted_total";
    /// Counter: requests admitted, label `class` (the priority class).
    counter pub const PRIORITY_ADMITTED_TOTAL: &str = "weir_llm_priority_admitted_total";
    /// Counter: requests refused at admission (any code), label `class`.
    counter pub const PRIORITY_REFUSED_TOTAL: &str = "weir_llm_priority_refused_total";
    /// Counter: queued requests answered at once (`queue_full`, `deadline_exceeded`) to
    /// admit interactive work, label `class` (only `batch` is displaced).
    counter pub const PRIORITY_DISPLACED_TOTAL: &str = "weir_llm_priority_displaced_total";
    /// Gauge: 1 while the NATS connection is up.
    gauge pub const NATS_CONNECTED: &str = "weir_llm_nats_connected";
    /// Gauge: [`memory_bound_bytes`] of this replica's configuration (docs/operations.md §
    /// Memory); compare `process_resident_memory_bytes` with it.
    gauge pub const MEMORY_BOUND_BYTES: &str = "weir_llm_memory_bound_bytes";
    /// Gauge: slots (concurrent calls) of each backend of the pool, label `backend` (its
    /// name; `default` for a single `[backend]`).
    gauge pub const BACKEND_SLOTS: &str = "weir_llm_backend_slots";
    /// Gauge: slots busy (calls running) per backend, label `backend`.
    gauge pub const BACKEND_SLOTS_BUSY: &str = "weir_llm_backend_slots_busy";
    /// Gauge: each backend's service-time estimate, seconds, label `backend` (absent
    /// before its first call without a seed).
    gauge pub const BACKEND_ESTIMATE_SECONDS: &str = "weir_llm_backend_estimate_seconds";
    /// Gauge: each backend's health, label `backend`: 0 healthy, 1 probing (its
    /// back-off ended, one probe request decides), 2 ejected.
    gauge pub const BACKEND_HEALTH: &str = "weir_llm_backend_health";
    /// Counter: ejections (consecutive failures or a stalled call), label `backend`.
    counter pub const BACKEND_EJECTIONS_TOTAL: &str = "weir_llm_backend_ejections_total";
    /// Counter: requests of a session sent to another backend than its last turn's,
    /// because that one would have missed the deadline, label `backend` (the one left).
    counter pub const BACKEND_SPILLS_TOTAL: &str = "weir_llm_backend_spills_total";
    /// Counter: requests moved off a backend (queued there when it was ejected, or a
    /// stalled call retried elsewhere), label `backend`.
    counter pub const BACKEND_FAILOVERS_TOTAL: &str = "weir_llm_backend_failovers_total";
    /// Counter: cancel messages of the NATS backend (`cancel_subject`) for calls dropped
    /// before their reply, label `backend` and `result` = `sent` (handed to the client) or
    /// `dropped` (no room within a second, or the connection closed).
    counter pub const BACKEND_CANCELS_TOTAL: &str = "weir_llm_backend_cancels_total";
}

/// Histogram ([`latency_series`]): receipt → start of inference, seconds.
pub const QUEUE_WAIT_SECONDS: &str = "weir_llm_queue_wait_seconds";

/// Histogram ([`latency_series`]): receipt → start of inference, seconds, label
/// `class` (the priority class).
pub const PRIORITY_QUEUE_WAIT_SECONDS: &str = "weir_llm_priority_queue_wait_seconds";

/// Histogram ([`latency_series`]): backend call duration, seconds, label `outcome`. The `_sum` of
/// `outcome="ok"` over the total `_sum` is the share of backend time that produced
/// answers within their deadline.
pub const INFERENCE_SECONDS: &str = "weir_llm_inference_seconds";

/// Histogram ([`latency_series`]): streamed replies, start of inference → first chunk
/// published to the caller (time to first token), seconds.
pub const TTFT_SECONDS: &str = "weir_llm_time_to_first_token_seconds";

/// The admin listener's metric names (`weir_service::http::serve`).
pub const ADMIN_LISTENER: weir_service::http::ListenerMetrics =
    weir_service::http::ListenerMetrics {
        connections_total: ADMIN_CONNECTIONS_TOTAL,
        refused_total: ADMIN_CONNECTIONS_REFUSED_TOTAL,
        timed_out_total: ADMIN_CONNECTIONS_TIMED_OUT_TOTAL,
        accept_errors_total: ADMIN_ACCEPT_ERRORS_TOTAL,
    };

/// Histogram buckets for [`QUEUE_WAIT_SECONDS`] and [`INFERENCE_SECONDS`]: from 1 ms
/// (zero-latency backends, queue hops) to a minute (long generations).
pub const DURATION_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// Builds the Prometheus recorder. Nothing is recorded as a facade histogram, so it
/// needs no buckets and no `run_upkeep()`. The caller installs it and keeps the handle
/// for `/metrics`.
pub fn prometheus_recorder() -> (PrometheusRecorder, PrometheusHandle) {
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    (recorder, handle)
}

/// The request size [`memory_bound_bytes`] assumes for message-counted buffers: chat
/// sized (1 KiB) plus ~256 B of message overhead. Larger requests scale those buffers
/// (docs/operations.md § Memory).
const CHAT_MESSAGE_BYTES: u64 = 1024 + 256;

/// The most memory `config` lets one replica hold at chat-sized requests, plus a 16 MiB
/// idle allowance (measured idle: ~9 MiB): the sum of docs/operations.md § Memory
/// (≈ 184 MiB at the defaults). Exported as [`MEMORY_BOUND_BYTES`].
pub fn memory_bound_bytes(config: &crate::config::Config) -> u64 {
    const MIB: u64 = 1 << 20;
    let cache = config
        .admission
        .idempotency
        .as_ref()
        .map_or(0, |i| i.max_bytes.get() as u64);
    let messages = (config.nats.client.subscription_capacity.unwrap_or(0)
        + config.admission.queue_capacity.get()) as u64;
    // Running calls hold a request and a reply of up to the NATS max_payload (1 MiB).
    let running = config.admission.workers.get() as u64 * 2 * MIB;
    // async-nats command channel (2,048 replies), trace events, admin request heads.
    let replies = 2048 * CHAT_MESSAGE_BYTES;
    let trace = config.trace.buffer.get() as u64 * 300;
    let admin = config.admin.max_connections.get() as u64 * 28 * 1024;
    // Token budgets: at most 1 KiB per tracked key (two copies of a key of at most
    // ~400 bytes, the bucket, the order entry); a stream keeps its last 16 KiB.
    let token_keys: u64 = (config.admission.limits.iter())
        .filter_map(|l| l.tokens)
        .map(|t| t.max_keys.get() as u64 * 1024)
        .sum();
    let tails = config.admission.workers.get() as u64 * 16 * 1024;
    16 * MIB
        + cache
        + messages * CHAT_MESSAGE_BYTES
        + running
        + replies
        + trace
        + admin
        + token_keys
        + tails
        + 2 * MIB
}

/// How a latency histogram `name{label}` appears in `/metrics`: with
/// [`DURATION_BUCKETS`].
pub fn latency_series(
    name: &'static str,
    label: Option<(&'static str, &'static str)>,
) -> weir_service::metrics::Series {
    weir_service::metrics::Series {
        name,
        label,
        buckets: DURATION_BUCKETS,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A metric added to this module but not to [`DECLARED`] would be missing from the
    /// first scrape (and from the deploy kit's check).
    #[test]
    fn every_facade_metric_name_is_declared_once() {
        let src = include_str!("metrics.rs");
        let histograms = [
            QUEUE_WAIT_SECONDS,
            INFERENCE_SECONDS,
            TTFT_SECONDS,
            PRIORITY_QUEUE_WAIT_SECONDS,
        ];
        let mut names: Vec<&str> = weir_service::metrics::names_in_source(src, &["weir_llm_"])
            .into_iter()
            .filter(|n| !histograms.contains(n))
            .collect();
        let mut listed: Vec<&str> = DECLARED
            .iter()
            .map(|d| d.name)
            .filter(|n| n.starts_with("weir_llm_"))
            .collect();
        names.sort_unstable();
        listed.sort_unstable();
        assert_eq!(listed, names);
    }

    /// Every `le` bound is a bucket edge of the latency histogram, so `/metrics` counts
    /// exactly the samples `<= le`.
    #[test]
    fn the_duration_buckets_render_exactly() {
        assert!(latency_series(QUEUE_WAIT_SECONDS, None).is_exact());
    }

    #[test]
    fn the_memory_bound_at_the_defaults_is_the_documented_sum() {
        let mib = memory_bound_bytes(&crate::config::Config::default()) as f64 / f64::from(1 << 20);
        assert!((140.0..200.0).contains(&mib), "{mib} MiB");
    }

    #[test]
    fn recorder_renders_facade_counters() {
        let (recorder, handle) = prometheus_recorder();
        metrics::with_local_recorder(&recorder, || {
            metrics::counter!(ANSWERED_TOTAL, "outcome" => "ok").increment(2);
        });
        let text = handle.render();
        assert!(
            text.contains("weir_llm_requests_answered_total{outcome=\"ok\"} 2"),
            "{text}"
        );
    }
}
