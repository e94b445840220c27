//! The LLM adapter's capabilities document (the capabilities subject and
//! `/v1/capabilities`): every limit (`null` when disabled), the subjects and the header
//! names, so that a caller can size its retries and deadlines without reading the
//! adapter's configuration.
//!
//! Compatibility rules, as for the other documents: members are only ever added, and a
//! reader ignores members it does not know.

use serde::{Deserialize, Serialize};

use crate::admin::ServiceEstimate;

/// The capabilities document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Capabilities {
    /// The NATS service and its subjects.
    pub service: ServiceInfo,
    /// Streamed replies.
    pub stream: StreamInfo,
    /// `enforce` (refuse what the limits refuse) or `shadow` (count and admit).
    pub mode: AdmissionMode,
    /// Inferences run at once.
    pub workers: u64,
    /// Requests the global queue holds.
    pub queue_capacity: u64,
    /// The per-session cap and ordering.
    pub session: SessionInfo,
    /// The per-key limits.
    pub limits: Vec<KeyLimitInfo>,
    /// Deadlines.
    pub deadline: DeadlineInfo,
    /// `fifo` or `edf` (earliest deadline first, within a bound).
    pub queue_order: QueueOrder,
    /// The backend's service-time estimator.
    pub estimator: EstimatorInfo,
    /// The completion cache (`null` when idempotency is off).
    pub idempotency: Option<IdempotencyInfo>,
    /// The backend.
    pub backend: BackendInfo,
    /// How long a shutdown lets admitted requests finish, milliseconds.
    pub shutdown_grace_ms: u64,
    /// How requests arrive: core request/reply or the durable JetStream intake.
    pub intake: IntakeInfo,
    /// The header names (`request_id`: `Weir-Request-Id`, ...).
    pub headers: std::collections::BTreeMap<String, String>,
    /// Priority classes (`Weir-Priority`); absent from documents of adapters built
    /// before them.
    #[serde(default)]
    pub priority: Option<PriorityInfo>,
}

/// `priority` of [`Capabilities`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct PriorityInfo {
    /// The classes, highest first (`interactive`, `batch`).
    pub classes: Vec<String>,
    /// The class of a request without the header whose keys set none.
    pub default: String,
    /// Added to a batch request's deadline for its place in the deadline order, ms.
    pub batch_delay_ms: u64,
}

/// `service` of [`Capabilities`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ServiceInfo {
    /// The NATS service name.
    pub name: String,
    /// Its version.
    pub version: String,
    /// The queue group of the endpoints.
    pub queue_group: String,
    /// The inference subject.
    pub subject: String,
    /// The cancel subject.
    pub cancel_subject: String,
    /// The capabilities subject.
    pub capabilities_subject: String,
    /// The limits subject.
    pub limits_subject: String,
    /// The status subject.
    pub status_subject: String,
}

/// `stream` of [`Capabilities`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct StreamInfo {
    /// Backend output is gathered into chunks at most this often, milliseconds.
    pub chunk_interval_ms: u64,
    /// Largest chunk body, bytes.
    pub chunk_max_bytes: u64,
    /// Chunks sent ahead of the caller's acknowledgements.
    pub window: u64,
    /// How long the adapter waits for an acknowledgement, milliseconds.
    pub ack_timeout_ms: u64,
}

/// `mode` of [`Capabilities`], and the adapter's `mode` key (default `enforce`).
#[derive(strum::IntoStaticStr, strum::Display, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum AdmissionMode {
    /// Refuse what the limits refuse.
    #[default]
    Enforce,
    /// Count what the session cap and per-key limits would refuse, and admit anyway.
    Shadow,
}

/// `queue_order` of [`Capabilities`], and the adapter's `queue_order` key (default
/// `edf`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum QueueOrder {
    /// Arrival order.
    Fifo,
    /// Earliest deadline first, within a bound.
    #[default]
    Edf,
}

/// `session` of [`Capabilities`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct SessionInfo {
    /// Unsettled requests one session may have (`null`: no cap).
    pub pending_cap: Option<u64>,
    /// Whether a session's requests run one at a time, in order.
    pub ordering: bool,
}

/// One element of `limits` of [`Capabilities`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct KeyLimitInfo {
    /// The limit's name.
    pub name: String,
    /// Where its key comes from: `client`, `session`, `service` or `body:<pointer>`.
    pub key: String,
    /// Requests one key may run at once.
    pub limit: u64,
    /// `reject` or `wait` when the key's slots are taken.
    pub on_busy: OnBusy,
    /// `wait`: the longest wait, milliseconds (`null` with `reject`).
    pub max_wait_ms: Option<u64>,
    /// `wait`: requests that may wait per key (`null` with `reject`).
    pub max_waiters: Option<u64>,
    /// The token budget of one key, tokens per minute (`null`: none).
    #[serde(default)]
    pub tokens_per_minute: Option<u64>,
    /// Completion tokens reserved for a request without `max_tokens` (`null` without
    /// a token budget).
    #[serde(default)]
    pub default_max_tokens: Option<u64>,
    /// The priority class of requests matched by this limit's key that carry no
    /// `Weir-Priority` (`interactive` or `batch`; `null`: not set here).
    #[serde(default)]
    pub priority: Option<String>,
}

/// `on_busy` of a [`KeyLimitInfo`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum OnBusy {
    /// Refuse at once (`concurrency_limit_exceeded`).
    Reject,
    /// Wait for a slot, within bounds.
    Wait,
}

/// `deadline` of [`Capabilities`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct DeadlineInfo {
    /// The budget of a request that carries none, milliseconds (`null`: none).
    pub default_ms: Option<u64>,
    /// The largest budget honoured, milliseconds.
    pub max_ms: u64,
    /// A fixed minimum budget left at the start of inference (`null`: adaptive).
    pub min_start_budget_ms: Option<u64>,
    /// `fixed` or `adaptive` (the service-time estimate).
    pub start_budget: StartBudget,
    /// Time kept for the reply after inference, milliseconds.
    pub reply_margin_ms: u64,
    /// Whether admission refuses what it predicts cannot start in time.
    pub predict: bool,
    /// How much of a request's wait earlier deadlines may take, percent.
    pub overtake_share_pct: u8,
}

/// `start_budget` of [`DeadlineInfo`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum StartBudget {
    /// `deadline.min_start_budget_ms`.
    Fixed,
    /// The service-time estimate.
    Adaptive,
}

/// `estimator` of [`Capabilities`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct EstimatorInfo {
    /// The estimate before the first sample, milliseconds (`null`: none).
    pub initial_ms: Option<u64>,
    /// Samples kept.
    pub window: u64,
    /// Half-life, samples.
    pub half_life: f64,
    /// The quantile taken.
    pub quantile: f64,
    /// The backend kind the estimate is of (the running service adds it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    /// The live estimate (the running service adds it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current: Option<ServiceEstimate>,
}

/// `idempotency` of [`Capabilities`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct IdempotencyInfo {
    /// How long an answer is kept for a retry with the same id, milliseconds.
    pub window_ms: u64,
    /// Answers kept at most.
    pub max_entries: u64,
    /// Bytes kept at most.
    pub max_bytes: u64,
}

/// `backend` of [`Capabilities`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct BackendInfo {
    /// `sim`, `openai` or `nats`.
    pub kind: String,
    /// The backend's own per-call timeout, milliseconds.
    pub timeout_ms: u64,
}

/// `intake` of [`Capabilities`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum IntakeInfo {
    /// Core NATS request/reply.
    Core,
    /// The durable intake: a JetStream work-queue stream.
    #[serde(rename = "jetstream")]
    JetStream {
        /// The stream.
        stream: String,
        /// The subject callers publish to.
        subject: String,
        /// The durable consumer.
        consumer: String,
        /// Redelivery after this long without an acknowledgement, milliseconds.
        ack_wait_ms: u64,
        /// Requests delivered and not yet acknowledged, at most.
        max_ack_pending: u64,
        /// The stream's deduplication window, milliseconds.
        duplicate_window_ms: u64,
        /// Whether a replica forwards what it cannot take.
        forward: bool,
        /// The header that carries the reply subject (`Weir-Reply-To`).
        reply_to_header: String,
    },
}
