//! The services' admin and stdout contracts (docs/contracts.md): the ready line both
//! binaries print, latency percentiles, and the `/v1/stats` snapshots of the ingress
//! ([`IngressStats`]) and of the LLM adapter ([`AdapterStats`]) — one definition,
//! written by the services and read by the load test and by operators' tools; and the
//! JSON body of every HTTP refusal ([`HttpRefusal`]).
//!
//! Compatibility rules, as for the wire packets: fields are only ever added. Readers
//! ignore unknown fields and default missing ones (`#[serde(default)]` on every type),
//! and a field an older writer does not have is an `Option` (`None` when absent), so a
//! reader tells "not reported" from zero.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::WireName;
use crate::llm::ErrorCode;

/// The one line each service prints on stdout once it is ready, e.g.
/// `{"event":"ready","ws":"127.0.0.1:4000","admin":"127.0.0.1:4001"}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ReadyLine {
    /// Always `ready`.
    pub event: String,
    /// The WebSocket door's address (the ingress).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ws: Option<String>,
    /// The admin HTTP address (both services).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin: Option<String>,
    /// The WHIP UDP address (the ingress, when WHIP is on).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub whip_udp: Option<String>,
}

impl ReadyLine {
    /// The `event` value of a ready line.
    pub const EVENT: &'static str = "ready";

    /// A ready line with the given addresses.
    pub fn new(ws: Option<String>, admin: Option<String>, whip_udp: Option<String>) -> Self {
        Self {
            event: Self::EVENT.to_owned(),
            ws,
            admin,
            whip_udp,
        }
    }

    /// Whether this is a ready line (`event` = `ready`).
    pub fn is_ready(&self) -> bool {
        self.event == Self::EVENT
    }

    /// The line as printed: one JSON object, no trailing newline.
    pub fn to_line(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| format!("{{\"event\":\"{}\"}}", Self::EVENT))
    }
}

/// A latency summary in milliseconds (`queue_wait_ms` and `round_ms` of the ingress's
/// `/v1/stats`, the adapter's latency objects).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Percentiles {
    /// Number of values.
    pub count: u64,
    /// Median.
    pub p50: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest value.
    pub max: f64,
    /// Mean.
    pub mean: f64,
}

/// The ingress's `/v1/stats` snapshot.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct IngressStats {
    /// Streams open now.
    pub active_streams: u64,
    /// Streams opened since start.
    pub streams_total: u64,
    /// Bytes of PCM held over all streams: queued, or handed to NATS and not yet
    /// confirmed by the server.
    pub pending_bytes: u64,
    /// Frames held (queued or unconfirmed), all streams.
    pub pending_frames: u64,
    /// The per-stream byte budget (`None`: a design without one).
    pub pending_bytes_limit_per_stream: Option<u64>,
    /// Age of the oldest frame held, ms.
    pub oldest_frame_age_ms: f64,
    /// Queue wait (admission → handed to NATS), cumulative since start.
    pub queue_wait_ms: Percentiles,
    /// Frame counters.
    pub frames: FrameStats,
    /// Stream opens refused (invalid id, already active, `max_streams`, shutting down).
    pub admission_rejects: u64,
    /// Overload signals raised (streams ended by the `close` policy).
    pub overloads: u64,
    /// Gap markers handed to NATS.
    pub gaps: u64,
    /// tokio tasks alive in the ingress process.
    pub tasks_alive: u64,
    /// Whether the ingress's NATS connection is up.
    pub nats_connected: bool,
    /// The server-confirmed window (`None`: an ingress without it).
    pub window: Option<WindowStats>,
}

/// The `frames` object of the ingress's `/v1/stats`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct FrameStats {
    /// Frames offered by producers.
    pub offered: u64,
    /// Frames admitted (given a sequence number).
    pub admitted: u64,
    /// Frames handed to the NATS client (`None`: an ingress without the confirmed
    /// window, where `published` means handed over).
    pub handed_over: Option<u64>,
    /// Frames the server confirmed (without the window: handed over).
    pub published: u64,
    /// Frames handed over and not yet confirmed (part of pending).
    pub unconfirmed: u64,
    /// Frames unconfirmed when the NATS connection dropped: declared to consumers as
    /// possibly lost (`Weir-Possibly-Lost`), never counted as published.
    pub possibly_lost: u64,
    /// Frames not published, by reason (every reason present, zero included).
    pub dropped: BTreeMap<String, u64>,
    /// Shadow mode: frames the budget would have refused or dropped.
    pub would_reject: u64,
}

impl FrameStats {
    /// All drops, whatever the reason.
    pub fn dropped_total(&self) -> u64 {
        self.dropped.values().sum()
    }
}

/// The `window` object of the ingress's `/v1/stats`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct WindowStats {
    /// `confirmed`, `unconfirmed` (window off: handed over counts as published) or
    /// `jetstream` (`None` when not reported).
    pub mode: Option<String>,
    /// Bytes handed to NATS and not yet confirmed.
    pub unconfirmed_bytes: u64,
    /// Frames handed to NATS and not yet confirmed.
    pub unconfirmed_frames: u64,
    /// The current limit on `unconfirmed_bytes`.
    pub limit_bytes: u64,
    /// Confirmation rounds completed.
    pub rounds: u64,
    /// Round time (marker out → back), cumulative.
    pub round_ms: Percentiles,
    /// Age of the oldest unconfirmed frame (since admission), ms.
    pub oldest_unconfirmed_age_ms: f64,
    /// Connection losses that left frames unconfirmed (declared possibly lost).
    pub disconnects: u64,
}

/// The body of every refusal of the services' HTTP ports (admin, the WebSocket and WHIP
/// doors): `{"error":{"code":..,"message":..}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct HttpRefusal {
    /// What was refused.
    pub error: HttpRefusalError,
}

/// The `error` member of an [`HttpRefusal`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct HttpRefusalError {
    /// A stable snake_case code (`not_found`, `method_not_allowed`, `overloaded`,
    /// `timeout`, `invalid_request`, `not_ready`, `stream_active`, ...); match on it.
    pub code: String,
    /// For humans; never parse it.
    pub message: String,
}

/// The LLM adapter's `/v1/stats` snapshot: a point-in-time copy of its counters.
///
/// Accounting rule: every submission is answered exactly once, so
/// `offered = completed + Σ refused + in progress`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct AdapterStats {
    /// Submissions received (every attempt).
    pub offered: u64,
    /// Submissions that entered the queue (new inferences).
    pub admitted: u64,
    /// Submissions that joined a queued or running request with the same id.
    pub joined: u64,
    /// Submissions answered from the completion cache.
    pub cached: u64,
    /// Answers `ok`.
    pub completed: u64,
    /// Answers other than `ok`, by error code.
    pub refused: BTreeMap<String, u64>,
    /// Backend calls started.
    pub started: u64,
    /// Backend calls started after the request's deadline (must be 0).
    pub started_after_deadline: u64,
    /// Requests admitted and not yet started, now.
    pub queued_now: u64,
    /// Backend calls in progress, now.
    pub running_now: u64,
    /// Shadow mode: refusals that were counted but not enforced, by rule.
    pub would_reject: BTreeMap<String, u64>,
    /// Receipt → start of inference, for started requests.
    pub queue_wait_ms: Percentiles,
    /// Backend call duration.
    pub inference_ms: Percentiles,
    /// Total time spent in backend calls, milliseconds.
    pub backend_busy_ms: f64,
    /// Time spent in backend calls that answered `ok` (within the deadline), milliseconds.
    pub backend_useful_ms: f64,
    /// Slots taken and given back (session cap + per-key limits); equal when idle.
    pub slots_acquired: u64,
    /// See `slots_acquired`.
    pub slots_released: u64,
    /// Receipt → answer, for answers other than `ok` given without a backend call
    /// (refusals at admission, in the queue, at the start of inference).
    #[serde(default)]
    pub refusal_ms: Percentiles,
    /// The backend's service-time estimate (what admission predicts with).
    #[serde(default)]
    pub service_estimate: Option<ServiceEstimate>,
    /// The idempotency cache: size now, bound, evictions.
    #[serde(default)]
    pub cache: CacheStats,
    /// The NATS client's own drops (slow consumer) and disconnects.
    #[serde(default)]
    pub nats: NatsClientStats,
    /// Streamed replies: started, chunks and bytes sent, time to first token, aborts.
    #[serde(default)]
    pub stream: StreamStats,
    /// Per-key token budgets, by limit name (empty without any
    /// `limits[].tokens_per_minute`).
    #[serde(default)]
    pub tokens: BTreeMap<String, TokenBudgetStats>,
    /// Priority classes (`Weir-Priority`), by class (`interactive`, `batch`).
    #[serde(default)]
    pub priority: BTreeMap<String, PriorityClassStats>,
    /// Session interrupts (barge-in): session cancels, supersedes and what they cancelled.
    #[serde(default)]
    pub interrupts: InterruptStats,
}

/// Session interrupts in an [`AdapterStats`] (`interrupts`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct InterruptStats {
    /// `Weir-Cancel-Session` messages handled (whether or not they found a request).
    pub session_cancels: u64,
    /// Requests that carried `Weir-Supersede: session` (whether or not they superseded
    /// one).
    pub supersedes: u64,
    /// Requests cancelled by either while queued (answered `cancelled` at once).
    pub cancelled_queued: u64,
    /// Requests cancelled by either while running (the backend call aborted).
    pub cancelled_running: u64,
}

/// One priority class in an [`AdapterStats`] (`priority`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct PriorityClassStats {
    /// Requests of the class admitted into the queue.
    pub admitted: u64,
    /// Requests of the class refused at admission (any code).
    pub refused: u64,
    /// Queued requests of the class answered at once to make room for interactive
    /// work (`queue_full` or `deadline_exceeded`; only `batch` is ever displaced).
    pub displaced: u64,
    /// Receipt → start of inference, of the requests of the class that started.
    pub queue_wait_ms: Percentiles,
}

impl AdapterStats {
    /// Σ refused.
    pub fn refused_total(&self) -> u64 {
        self.refused.values().sum()
    }

    /// `refused[code]`, 0 when absent.
    pub fn refused_of(&self, code: ErrorCode) -> u64 {
        self.refused.get(code.as_str()).copied().unwrap_or(0)
    }

    /// Share of backend time spent on calls that answered `ok` (1.0 when idle).
    pub fn useful_backend_share(&self) -> f64 {
        if self.backend_busy_ms > 0.0 {
            self.backend_useful_ms / self.backend_busy_ms
        } else {
            1.0
        }
    }
}

/// Streamed replies in an [`AdapterStats`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct StreamStats {
    /// Streamed replies that reached a worker.
    pub started: u64,
    /// `chunk` messages published.
    pub chunks: u64,
    /// Body bytes published in chunks.
    pub bytes: u64,
    /// Start of inference → first chunk published.
    pub ttft_ms: Percentiles,
    /// Streams aborted because of the caller, by reason (`caller_gone`,
    /// `caller_stalled`, `publish_timeout`).
    pub aborted: BTreeMap<String, u64>,
}

/// One per-key token budget in an [`AdapterStats`] (`tokens`). Tokens reserved at
/// admission are settled when the request ends: `reserved = used + refunded −
/// overcharged + outstanding`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct TokenBudgetStats {
    /// The budget of one key, tokens per minute.
    pub tokens_per_minute: u64,
    /// Tokens reserved at admission (`max_tokens` or the default, plus the prompt
    /// estimate).
    pub reserved: u64,
    /// Tokens charged when requests ended: the backend's `usage` (clamped), else the
    /// reservation (answered) or the prompt estimate (failed after starting).
    pub used: u64,
    /// Reserved tokens given back (not used).
    pub refunded: u64,
    /// Tokens charged beyond a reservation (reported usage above it).
    pub overcharged: u64,
    /// Reservations not settled yet (requests queued or running).
    pub outstanding: u64,
    /// Requests refused `token_budget_exceeded` (counted in enforce mode).
    pub refused: u64,
    /// Ends settled from a `usage` the backend reported.
    pub usage_reported: u64,
    /// Reported usages above the clamp (a multiple of the reservation), charged at it.
    pub usage_clamped: u64,
    /// Replies (of started requests) without a readable `usage`: missing, garbage,
    /// negative, oversized.
    pub usage_missing: u64,
    /// Keys tracked now.
    pub keys: u64,
    /// Keys forgotten to stay within `max_token_keys` (least recently used first).
    pub evicted: u64,
}

/// The idempotency (completion) cache in an [`AdapterStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct CacheStats {
    /// Replies held now.
    pub entries: u64,
    /// Bytes held now (body + headers + key + a fixed per-entry overhead).
    pub bytes: u64,
    /// `idempotency.max_bytes`.
    pub max_bytes: u64,
    /// Replies evicted (oldest first) to stay within `max_bytes`.
    pub evicted_max_bytes: u64,
    /// Replies evicted (oldest first) to stay within `max_entries`.
    pub evicted_max_entries: u64,
    /// Replies not stored because one alone exceeds `max_bytes`.
    pub too_large: u64,
}

/// The NATS client's own events in an [`AdapterStats`] (`nats`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct NatsClientStats {
    /// Messages the NATS client dropped (slow consumer), all subscriptions.
    pub dropped: u64,
    /// The same, by subscription id (the service's endpoints and its `$SRV` handlers).
    pub dropped_by_sid: BTreeMap<u64, u64>,
    /// Connections lost (each is followed by a reconnect attempt).
    pub disconnects: u64,
    /// Messages the client could not read (skipped, or delivered without headers); the
    /// connection stayed up.
    #[serde(default)]
    pub malformed: u64,
    /// Messages the client received from the server, every subscription
    /// (async-nats `Statistics::in_messages`).
    pub in_messages: u64,
    /// Messages the adapter's endpoint loops took from their subscriptions.
    pub taken: u64,
    /// `in_messages − taken`: dropped by the client, still buffered, or for a
    /// subscription the endpoint loops do not read (`$SRV` requests, replies of a NATS
    /// backend). At rest and without such traffic it equals the messages dropped — the
    /// exact count; `dropped` above can be lower.
    pub not_taken: u64,
}

/// Where the service-time estimate comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum EstimateSource {
    /// No sample and no seed: no estimate.
    None,
    /// `estimator.initial_ms`, no sample yet.
    Seed,
    /// Measured inference times.
    Observed,
}

/// The adapter's service-time estimator, as shown in `/v1/stats` and the capabilities
/// document.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ServiceEstimate {
    /// The estimate of one inference, milliseconds (`null` = none yet).
    pub service_time_ms: Option<f64>,
    /// Where it comes from.
    pub source: EstimateSource,
    /// Samples in the window.
    pub samples: usize,
    /// Samples taken since start.
    pub samples_total: u64,
    /// The quantile taken.
    pub quantile: f64,
    /// Window size, samples.
    pub window: usize,
    /// Half-life, samples.
    pub half_life: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reader_defaults_what_an_older_writer_lacks_and_ignores_what_it_does_not_know() {
        let s: IngressStats = serde_json::from_str(
            r#"{"pending_frames":7,"frames":{"offered":3,"dropped":{"overload":1}},"future":1}"#,
        )
        .expect("decodes");
        assert_eq!(s.pending_frames, 7);
        assert_eq!(s.frames.handed_over, None);
        assert_eq!(s.frames.dropped_total(), 1);
        assert_eq!(s.window, None);
        assert_eq!(s.queue_wait_ms, Percentiles::default());
    }

    #[test]
    fn ready_lines_round_trip_and_leave_out_absent_addresses() {
        let r = ReadyLine::new(None, Some("127.0.0.1:9".into()), None);
        assert_eq!(r.to_line(), r#"{"event":"ready","admin":"127.0.0.1:9"}"#);
        let back: ReadyLine = serde_json::from_str(&r.to_line()).expect("decodes");
        assert!(back.is_ready());
        assert_eq!(back, r);
    }
}
