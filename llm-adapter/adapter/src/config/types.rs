//! The validated configuration types: what the rest of the adapter reads.

use std::net::SocketAddr;
use std::num::{NonZeroU64, NonZeroUsize};
use std::path::PathBuf;
use std::time::Duration;

use weir_service::admin::RequestLimits;
use weir_service::logging::LogFormat;

use super::raw::{RawSim, ServiceConfig};
use super::{AdmissionConfig, ConfigError, MAX_NAME_LEN, invalid};

/// Enforce the limits (`enforce`, the default), or (`shadow`) count `would_reject` for
/// the session cap, per-key limits and the session `reject` policy and admit anyway; the
/// global queue bound and deadlines stay enforced. The wire type of `mode` in the
/// capabilities document.
pub use weir_protocol::llm::capabilities::AdmissionMode as Mode;

/// Where a per-key limit takes its key from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// The `Weir-Client-Key` header (requests without it are not limited by this rule).
    Client,
    /// The session id (requests without a session are not limited by this rule).
    Session,
    /// One key for the whole service.
    Service,
    /// A JSON pointer (RFC 6901) into the request body; string, number and boolean values
    /// are keys, anything else (or a body that is not JSON) leaves the rule unapplied.
    Body(String),
}

impl KeySource {
    pub(super) fn parse(key: &str, s: &str) -> Result<Self, ConfigError> {
        match s {
            "client" => Ok(Self::Client),
            "session" => Ok(Self::Session),
            "service" => Ok(Self::Service),
            _ => match s.strip_prefix("body:") {
                Some(ptr) if ptr.starts_with('/') && ptr.len() <= MAX_NAME_LEN => {
                    Ok(Self::Body(ptr.to_owned()))
                }
                _ => Err(invalid(
                    key,
                    format!(
                        "expected \"client\", \"session\", \"service\" or \"body:/json/pointer\", got {s:?}"
                    ),
                )),
            },
        }
    }

    /// The configuration spelling (`client`, `body:/model`).
    pub fn describe(&self) -> String {
        match self {
            Self::Client => "client".into(),
            Self::Session => "session".into(),
            Self::Service => "service".into(),
            Self::Body(p) => format!("body:{p}"),
        }
    }
}

/// What a per-key limit does when all its slots are taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnBusy {
    /// Refuse at once with `concurrency_limit_exceeded`.
    Reject,
    /// Wait in strict FIFO order.
    Wait {
        /// Longest wait for a slot; then `concurrency_limit_exceeded` with `waited_ms`.
        max_wait: Duration,
        /// Most requests waiting per key; one more is refused at once.
        max_waiters: usize,
    },
}

/// One per-key concurrency limit (`[[limits]]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyLimit {
    /// Name used in metrics, traces and the limits view.
    pub name: String,
    /// Where the key comes from.
    pub key: KeySource,
    /// Most requests holding a slot of one key.
    pub limit: NonZeroUsize,
    /// What happens when the key is busy.
    pub on_busy: OnBusy,
    /// The key's token budget (`tokens_per_minute`); `None` = none.
    pub tokens: Option<TokenBudget>,
    /// The priority class of requests that have this key and no `Weir-Priority`
    /// (`priority`); `None` = not set here.
    pub priority: Option<crate::admission::Priority>,
}

/// A per-key token budget (`limits[].tokens_per_minute`): see
/// `admission/gates/tokens.rs` for the rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenBudget {
    /// Tokens one key may use per minute (also the burst: a full bucket).
    pub tokens_per_minute: NonZeroU64,
    /// Completion tokens reserved for a request without `max_tokens`.
    pub default_max_tokens: u64,
    /// Most keys tracked at once.
    pub max_keys: NonZeroUsize,
}

/// Per-session rules (`[session]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionConfig {
    /// Most accepted-but-unsettled requests per session; `None` = unlimited.
    pub pending_cap: Option<NonZeroUsize>,
    /// One running request per session, the rest FIFO.
    pub ordering: bool,
}

/// Deadline handling (`[deadline]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeadlineConfig {
    /// Budget for requests that carry no deadline; `None` = they have none.
    pub default: Option<Duration>,
    /// Longest budget accepted; longer ones are shortened to this.
    pub max: Duration,
    /// The start budget: a request with less left when a worker picks it is answered
    /// `deadline_exceeded`, not started. `None` (the default) = adaptive: the
    /// service-time estimate (`gates/start_budget.rs`).
    pub min_start_budget: Option<Duration>,
    /// Time kept for the answer to travel back: the adapter treats `deadline −
    /// reply_margin` as the last moment it can still answer usefully (refusals are sent
    /// by then, a running call is aborted then).
    pub reply_margin: Duration,
    /// Refuse at admission a request predicted not to finish before its deadline.
    pub predict: bool,
    /// Under `queue_order = "edf"`: the largest share (percent) of a request's slack
    /// kept for requests with earlier deadlines (`deadline.overtake_share_pct`).
    pub overtake_share_pct: u8,
}

impl DeadlineConfig {
    /// The budget of a request that asked for `asked`: it, else the default, at most
    /// `max`.
    pub fn budget(&self, asked: Option<Duration>) -> Option<Duration> {
        asked.or(self.default).map(|b| b.min(self.max))
    }
}

/// Order in which ready requests get a worker (`queue_order`): `fifo`, or `edf`, the
/// default, earliest deadline first within the bounds of `gates/deadline.rs` (see
/// docs/llm-adapter.md, "Fairness under mixed deadlines"). The wire type of
/// `queue_order` in the capabilities document.
pub use weir_protocol::llm::capabilities::QueueOrder;

/// Idempotency by request id (`[idempotency]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdempotencyConfig {
    /// How long a successful reply is kept for retries with the same id.
    pub window: Duration,
    /// Most cached replies; the oldest is evicted first.
    pub max_entries: NonZeroUsize,
    /// Most bytes held by cached replies (body + headers + key + a fixed per-entry
    /// overhead); the oldest is evicted first, a reply larger than this is not cached.
    pub max_bytes: NonZeroUsize,
}

/// Simulated latency distribution.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Latency {
    /// Always the same.
    Fixed(Duration),
    /// Uniform between the bounds.
    Uniform {
        /// Lower bound.
        min: Duration,
        /// Upper bound.
        max: Duration,
    },
    /// Log-normal with the given median and 99th percentile.
    LogNormal {
        /// Median.
        median: Duration,
        /// 99th percentile (≥ median).
        p99: Duration,
    },
}

/// `[backend.sim]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SimConfig {
    /// Latency of one call.
    pub latency: Latency,
    /// Share of calls that fail with a backend error, 0.0..=1.0.
    pub error_rate: f64,
    /// Random seed (latency and errors are reproducible).
    pub seed: u64,
    /// Streamed replies: tokens after a first-token delay, at a rate.
    pub stream: SimStream,
}

/// `[backend.sim]` streaming mode: what a streamed call ([`crate::backend::Backend::call_stream`])
/// produces — `tokens` SSE deltas, the first after `first_token`, then
/// `tokens_per_second`, then `data: [DONE]`. A body with `"max_tokens": N` asks for N.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SimStream {
    /// Delay before the first token.
    pub first_token: Duration,
    /// Tokens per reply when the body does not say (`max_tokens`).
    pub tokens: u32,
    /// Tokens per second after the first.
    pub tokens_per_second: f64,
}

impl Default for SimConfig {
    /// The defaults of `[backend.sim]`.
    fn default() -> Self {
        valid_default(RawSim::default().validate_at("backend.sim."))
    }
}

/// A configuration built from the defaults. They are inside their ranges; a test pins
/// this.
pub(super) fn valid_default<T>(built: Result<T, ConfigError>) -> T {
    built.unwrap_or_else(|e| unreachable!("the default configuration is invalid: {e}"))
}

/// `[backend.openai]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenAiConfig {
    /// `http://host:port` or `https://host[:port]` of the server (vLLM, llama.cpp
    /// server, Ollama, a hosted endpoint).
    pub base_url: String,
    /// Path the body is POSTed to, e.g. `/v1/chat/completions`.
    pub path: String,
    /// Name of the environment variable holding a bearer token, if any.
    pub api_key_env: Option<String>,
    /// TCP connect timeout.
    pub connect_timeout: Duration,
    /// Idle pooled connections kept per host.
    pub pool_max_idle_per_host: usize,
    /// How long an idle pooled connection is kept.
    pub pool_idle_timeout: Duration,
    /// PEM file of extra CA certificates trusted for HTTPS (beside the system roots).
    pub tls_ca_file: Option<PathBuf>,
    /// PEM client certificate (chain) presented over HTTPS; with `tls_key_file`.
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of `tls_cert_file`.
    pub tls_key_file: Option<PathBuf>,
}

/// `[backend.nats]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatsBackendConfig {
    /// Subject of the existing service the request is forwarded to.
    pub subject: String,
    /// Where a cancel message goes when a call is dropped before its reply; `None` =
    /// the call is only dropped.
    pub cancel_subject: Option<String>,
}

/// Which backend serves inference.
#[derive(Debug, Clone, PartialEq, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum BackendKind {
    /// Simulated backend.
    Sim(SimConfig),
    /// OpenAI-compatible HTTP server.
    #[strum(serialize = "openai")]
    OpenAi(OpenAiConfig),
    /// An existing NATS service.
    Nats(NatsBackendConfig),
}

impl BackendKind {
    /// `sim`, `openai` or `nats`.
    pub fn name(&self) -> &'static str {
        self.into()
    }
}

/// `[backend]`.
#[derive(Debug, Clone, PartialEq)]
pub struct BackendConfig {
    /// The backend's own per-call timeout (used when it is shorter than the deadline).
    pub timeout: Duration,
    /// The backend.
    pub kind: BackendKind,
}

/// The client name the adapter connects with (shown by the server).
pub const NATS_CLIENT_NAME: &str = "weir-llm-adapter";

/// `[nats]`: the adapter's own connection. The connection settings are the type every
/// weir client shares (`weir_service::nats::NatsConfig`: one authentication method,
/// files that exist, a `Debug` that redacts secrets); the adapter adds its bound on
/// publishing a reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdapterNats {
    /// Servers, authentication, TLS, timeouts, capacities. `subscription_capacity` is
    /// always set: `queue_capacity` + `nats.expected_burst` unless configured.
    pub client: weir_service::nats::NatsConfig,
    /// Bound on publishing one reply (the publish call waits without limit otherwise).
    pub publish_timeout: Duration,
}

/// `[admin]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdminConfig {
    /// Address of the admin HTTP server (localhost by default; port 0 = any free port).
    pub listen: SocketAddr,
    /// Most open admin connections; more are refused with 503 at once.
    pub max_connections: NonZeroUsize,
    /// Bound on receiving a request head (at accept and between keep-alive requests).
    pub header_timeout: Duration,
    /// A connection that moves no byte for this long is closed.
    pub idle_timeout: Duration,
    /// Per-request timeout and concurrency limit of the admin routes
    /// (`admin.request_timeout_ms`, `admin.max_concurrent_requests`).
    pub request_limits: RequestLimits,
}

/// `[trace]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceConfig {
    /// Emit per-request trace events as `tracing` events (target
    /// `weir_llm_adapter::trace`, level DEBUG).
    pub log: bool,
    /// Also publish them as JSON on this NATS subject.
    pub subject: Option<String>,
    /// Events buffered for the NATS publisher; overflow is counted and dropped.
    pub buffer: NonZeroUsize,
}

/// `intake`: how inference requests reach this replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Intake {
    /// Core NATS request/reply on `service.subject` (queue group): the default. A
    /// request lives in one replica's memory from receipt to answer.
    Core,
    /// A JetStream work-queue stream pulled by one durable consumer shared by every
    /// replica (`docs/llm-adapter.md`, durable intake). A replica that dies mid-request
    /// hands its work to another after `jetstream.ack_wait_ms`.
    JetStream(Box<JetStreamIntake>),
}

impl Intake {
    /// The JetStream settings when `intake = "jetstream"`.
    pub fn jetstream(&self) -> Option<&JetStreamIntake> {
        match self {
            Self::Core => None,
            Self::JetStream(j) => Some(j.as_ref()),
        }
    }
}

/// `[jetstream]`: the durable intake (read and validated whatever `intake` says, so
/// that a file can keep it and switch with `WEIR_LLM_INTAKE`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JetStreamIntake {
    /// The work-queue stream (created if absent).
    pub stream: String,
    /// The subject the stream captures; callers publish requests here.
    pub subject: String,
    /// The durable pull consumer every replica shares.
    pub consumer: String,
    /// Without an acknowledgement (or progress) for this long, the server hands a
    /// request to another replica.
    pub ack_wait: Duration,
    /// How often a replica sends progress for the requests it holds (and renews their
    /// session slots); below `ack_wait`.
    pub progress_interval: Duration,
    /// The consumer's `max_ack_pending`: requests out at all replicas together.
    pub max_ack_pending: NonZeroUsize,
    /// Deliveries of one request before the server gives up on it (a request that
    /// kills every replica that takes it stops there).
    pub max_deliver: NonZeroUsize,
    /// How long the stream remembers a `Nats-Msg-Id` (duplicates dropped).
    pub duplicate_window: Duration,
    /// Most requests the stream holds; more are refused to the publisher.
    pub max_messages: NonZeroUsize,
    /// Most bytes the stream holds.
    pub max_bytes: NonZeroUsize,
    /// Stream (and session bucket) replicas on a cluster.
    pub replicas: NonZeroUsize,
    /// File storage (survives a server restart) or memory.
    pub file_storage: bool,
    /// The KV bucket of the cluster-wide slots (session cap, limits).
    pub session_bucket: String,
    /// The KV bucket where each answer is kept for `duplicate_window`, by request id;
    /// `None` (`""`) = not kept.
    pub reply_bucket: Option<String>,
    /// A core request on `service.subject` is put into the stream by the replica that
    /// receives it (callers stay unchanged); `false` = only direct publishes.
    pub forward: bool,
}

/// The validated configuration: the admission core's part (`config.admission.workers`,
/// `config.admission.deadline`, ...) and the edges around it.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Workers, queue, mode, session, limits, deadlines, order, estimator,
    /// idempotency, shutdown grace, `backend.timeout` and the streams' coalescing.
    pub admission: AdmissionConfig,
    /// Backend: the single `[backend]`, or the first of `[[backends]]`.
    pub backend: BackendConfig,
    /// The pool (`[[backends]]`); empty with a single `[backend]`.
    pub backends: Vec<super::PoolMember>,
    /// NATS connection.
    pub nats: AdapterNats,
    /// NATS service.
    pub service: ServiceConfig,
    /// Admin HTTP.
    pub admin: AdminConfig,
    /// Trace events.
    pub trace: TraceConfig,
    /// Streamed replies.
    pub stream: StreamConfig,
    /// How requests arrive: core request/reply or the durable JetStream intake.
    pub intake: Intake,
    /// Log format (`log.format`).
    pub log: LogFormat,
}

/// `[stream]`: streamed replies (`Weir-Stream: 1`); the coalescing
/// (`chunk_interval_ms`, `chunk_max_bytes`) is [`AdmissionConfig::stream`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamConfig {
    /// Chunks a caller may leave unacknowledged; when that many are, the adapter waits
    /// for an acknowledgement up to `ack_timeout`, then aborts. 0 = callers do not
    /// acknowledge (a gone caller is still noticed by no-responders).
    pub window: usize,
    /// How long a full window waits for an acknowledgement.
    pub ack_timeout: Duration,
}
