//! Configuration: a TOML table (file, then `WEIR_LLM_*` environment overrides, then
//! command-line flags) validated once into a [`Config`].
//!
//! Invariants:
//! - every error names the full key (`session.pending_cap`, `limits[1].max_wait_ms`) and
//!   the allowed range; unknown keys are errors, never ignored (a typo must not silently
//!   leave a limit disabled);
//! - numbers are whole, non-negative and inside their range: `-1`, `2.5`, `"five"` and
//!   `true` are refused for an integer key;
//! - a [`Config`] built by [`Config::from_table`] / [`Config::from_toml_str`] satisfies
//!   every range below. Its fields are public for reading and for programmatic tweaks in
//!   tests; the numeric types (`NonZeroUsize`, `Duration`, enums) keep such tweaks valid.
//!
//! `0` means "unlimited"/"disabled" only where the reference says so
//! (`session.pending_cap`, `deadline.default_ms`, `idempotency.window_ms`).

use std::collections::BTreeSet;
use std::fmt;
use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::sync::LazyLock;
use std::time::Duration;

use serde::Serialize;
use toml::{Table, Value};

pub use crate::admission::EstimatorConfig;

/// Prefix of environment overrides: `WEIR_LLM_QUEUE_CAPACITY=64`,
/// `WEIR_LLM_SESSION__PENDING_CAP=5` (`__` separates sections).
pub const ENV_PREFIX: &str = "WEIR_LLM_";

/// Default `idempotency.max_bytes`: 64 MiB.
const DEFAULT_CACHE_MAX_BYTES: u64 = 64 * 1024 * 1024;
/// Largest accepted `idempotency.max_bytes`: 64 GiB.
const MAX_CACHE_MAX_BYTES: u64 = 64 * 1024 * 1024 * 1024;

/// Longest accepted limit name, subject or service name.
const MAX_NAME_LEN: usize = 128;

/// A configuration value that was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("config `{key}`: {message}")]
pub struct ConfigError {
    key: String,
    kind: ConfigErrorKind,
    message: String,
}

/// Machine-readable kind of a [`ConfigError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConfigErrorKind {
    /// The file could not be read or is not valid TOML.
    Syntax,
    /// A key that the adapter does not know.
    UnknownKey,
    /// A value of the wrong type or outside its range.
    InvalidValue,
}

impl ConfigError {
    fn invalid(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            kind: ConfigErrorKind::InvalidValue,
            message: message.into(),
        }
    }

    fn syntax(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            kind: ConfigErrorKind::Syntax,
            message: message.into(),
        }
    }

    /// The full key that was refused (`limits[0].limit`), or the file for syntax errors.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The kind, for callers that match on it.
    pub fn kind(&self) -> ConfigErrorKind {
        self.kind
    }
}

/// Enforce the limits, or only count what they would refuse.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Refuse what the limits refuse. The default.
    #[default]
    Enforce,
    /// Count `would_reject` for the session cap, per-key limits and the session `reject`
    /// policy, and admit anyway. The global queue bound and deadlines stay enforced.
    Shadow,
}

/// Where a per-key limit takes its key from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
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
    fn parse(key: &str, s: &str) -> Result<Self, ConfigError> {
        match s {
            "client" => Ok(Self::Client),
            "session" => Ok(Self::Session),
            "service" => Ok(Self::Service),
            _ => match s.strip_prefix("body:") {
                Some(ptr) if ptr.starts_with('/') && ptr.len() <= MAX_NAME_LEN => {
                    Ok(Self::Body(ptr.to_owned()))
                }
                _ => Err(ConfigError::invalid(
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
    /// A request whose remaining budget is below this when a worker picks it is answered
    /// `deadline_exceeded` instead of being started (it could not finish in time).
    /// `None` (the key unset, the default) = adaptive: the service-time estimate is the
    /// minimum, and a queued request is answered as soon as its remaining budget falls
    /// below it.
    pub min_start_budget: Option<Duration>,
    /// Time kept for the answer to travel back: the adapter treats `deadline −
    /// reply_margin` as the last moment it can still answer usefully (refusals are sent
    /// by then, a running call is aborted then).
    pub reply_margin: Duration,
    /// Refuse at admission a request predicted not to finish before its deadline.
    pub predict: bool,
    /// Under `queue_order = "edf"`: the largest share (percent) of a request's wait
    /// that requests with earlier deadlines may take from it. A request is admitted
    /// only if it would still start in time with that share of its slack kept for
    /// them; the share applied is the share of recent requests with at most half its
    /// budget, up to this value (one budget class alone keeps none). 0 = plain EDF
    /// with protected slack.
    pub overtake_share_pct: u8,
}

/// Order in which admitted requests that passed their session and key gates get a
/// worker (`queue_order`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum QueueOrder {
    /// Arrival order (in the ready queue): no later request overtakes. Under mixed
    /// deadlines, long budgets fill the queue and short ones are refused.
    Fifo,
    /// Earliest deadline first, within a bound (the default): a request without a
    /// deadline counts as due at `deadline.max_ms`; ties in admission order. A new
    /// request overtakes queued ones only as far as each of them still starts in time
    /// (otherwise it goes behind the last one it would make late), so an admitted
    /// request is not displaced into a refusal; how much of a request's wait earlier
    /// deadlines may take is bounded by `deadline.overtake_share_pct`.
    #[default]
    Edf,
}

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

impl Default for SimStream {
    fn default() -> Self {
        Self {
            first_token: Duration::from_millis(20),
            tokens: 16,
            tokens_per_second: 50.0,
        }
    }
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            latency: Latency::Fixed(Duration::from_millis(20)),
            error_rate: 0.0,
            seed: 1,
            stream: SimStream::default(),
        }
    }
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
}

/// Which backend serves inference.
#[derive(Debug, Clone, PartialEq)]
pub enum BackendKind {
    /// Simulated backend.
    Sim(SimConfig),
    /// OpenAI-compatible HTTP server.
    OpenAi(OpenAiConfig),
    /// An existing NATS service.
    Nats(NatsBackendConfig),
}

impl BackendKind {
    /// `sim`, `openai` or `nats`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Sim(_) => "sim",
            Self::OpenAi(_) => "openai",
            Self::Nats(_) => "nats",
        }
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
pub struct NatsConfig {
    /// Servers, authentication, TLS, timeouts, capacities. `subscription_capacity` is
    /// always set: `queue_capacity` + `nats.expected_burst` unless configured.
    pub client: weir_service::nats::NatsConfig,
    /// Bound on publishing one reply (the publish call waits without limit otherwise).
    pub publish_timeout: Duration,
}

/// `[service]`: the NATS micro service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceConfig {
    /// Service name (`A-Z a-z 0-9 - _`).
    pub name: String,
    /// Semantic version advertised in `$SRV.INFO`.
    pub version: String,
    /// Description advertised in `$SRV.INFO`.
    pub description: String,
    /// Queue group shared by replicas.
    pub queue_group: String,
    /// Inference requests.
    pub subject: String,
    /// Cancellation by request id.
    pub cancel_subject: String,
    /// Capabilities (every limit, `null` when disabled).
    pub capabilities_subject: String,
    /// Busiest keys.
    pub limits_subject: String,
    /// Where a request is, by request id (`llm.status`).
    pub status_subject: String,
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
    /// `core` or `jetstream`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Core => "core",
            Self::JetStream(_) => "jetstream",
        }
    }

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
    /// The consumer's `max_ack_pending`: requests out at all replicas together. Set it
    /// to the sum of `workers` over the replicas.
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
    /// The KV bucket of cluster-wide session slots (`session.pending_cap` over every
    /// replica).
    pub session_bucket: String,
    /// The KV bucket where each answer is kept for `duplicate_window` (keyed by request
    /// id), so that a duplicate the stream dropped is answered with the original's
    /// answer by any replica; `None` (`""`) = not kept.
    pub reply_bucket: Option<String>,
    /// A core request on `service.subject` is put into the stream by the replica that
    /// receives it (callers stay unchanged); `false` = only direct publishes.
    pub forward: bool,
}

/// The validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Fixed number of workers (concurrent backend calls).
    pub workers: NonZeroUsize,
    /// Most requests admitted but not yet started, over all sessions and keys.
    pub queue_capacity: NonZeroUsize,
    /// Enforce or shadow.
    pub mode: Mode,
    /// Per-session rules.
    pub session: SessionConfig,
    /// Per-key limits, applied in order (narrow key first).
    pub limits: Vec<KeyLimit>,
    /// Deadlines.
    pub deadline: DeadlineConfig,
    /// Which ready request a free worker takes first.
    pub queue_order: QueueOrder,
    /// The service-time estimator.
    pub estimator: EstimatorConfig,
    /// Idempotency; `None` = disabled.
    pub idempotency: Option<IdempotencyConfig>,
    /// Backend.
    pub backend: BackendConfig,
    /// Grace period for running requests at shutdown.
    pub shutdown_grace: Duration,
    /// NATS connection.
    pub nats: NatsConfig,
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
}

/// `[stream]`: streamed replies (`Weir-Stream: 1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamConfig {
    /// Coalescing: `chunk_interval_ms`, `chunk_max_bytes`.
    pub settings: crate::admission::StreamSettings,
    /// Chunks a caller may leave unacknowledged; when that many are, the adapter waits
    /// for an acknowledgement up to `ack_timeout`, then aborts. 0 = callers do not
    /// acknowledge (a gone caller is still noticed by no-responders).
    pub window: usize,
    /// How long a full window waits for an acknowledgement.
    pub ack_timeout: Duration,
}

impl Default for Config {
    /// The documented defaults (an empty file).
    fn default() -> Self {
        match Self::from_table(&Table::new()) {
            Ok(c) => c,
            // The defaults are constants inside their ranges; a test pins this.
            Err(e) => unreachable!("default configuration is invalid: {e}"),
        }
    }
}

impl Config {
    /// Parses and validates TOML text.
    pub fn from_toml_str(text: &str) -> Result<Self, ConfigError> {
        let table: Table =
            toml::from_str(text).map_err(|e| ConfigError::syntax("<toml>", e.to_string()))?;
        Self::from_table(&table)
    }

    /// Validates a TOML table (file contents with overrides applied).
    pub fn from_table(table: &Table) -> Result<Self, ConfigError> {
        let mut r = Reader::root(table);
        let workers = nz(r.uint("workers", 8, 1..=4096, "")?);
        let queue_capacity = nz(r.uint("queue_capacity", 256, 1..=1_000_000, "")?);
        let mode = match r.string("mode", "enforce")?.as_str() {
            "enforce" => Mode::Enforce,
            "shadow" => Mode::Shadow,
            other => {
                return Err(ConfigError::invalid(
                    r.key("mode"),
                    format!("expected \"enforce\" or \"shadow\", got {other:?}"),
                ));
            }
        };
        let shutdown_grace = r.millis("shutdown_grace_ms", 10_000, 0..=3_600_000, "")?;
        let queue_order = match r.string("queue_order", "edf")?.as_str() {
            "edf" => QueueOrder::Edf,
            "fifo" => QueueOrder::Fifo,
            other => {
                return Err(ConfigError::invalid(
                    r.key("queue_order"),
                    format!("expected \"edf\" or \"fifo\", got {other:?}"),
                ));
            }
        };

        let mut s = r.section("session")?;
        let cap = s.uint("pending_cap", 5, 0..=1_000_000, " (0 = unlimited)")?;
        let session = SessionConfig {
            pending_cap: NonZeroUsize::new(usize_of(cap)),
            ordering: s.boolean("ordering", true)?,
        };
        s.finish()?;

        let mut d = r.section("deadline")?;
        let max = d.millis("max_ms", 120_000, 1..=86_400_000, "")?;
        let default_ms = d.uint("default_ms", 30_000, 0..=86_400_000, " (0 = no default)")?;
        if default_ms > max.as_millis() as u64 {
            return Err(ConfigError::invalid(
                d.key("default_ms"),
                format!(
                    "{default_ms} is larger than deadline.max_ms ({})",
                    max.as_millis()
                ),
            ));
        }
        let min_start_budget = match d.get("min_start_budget_ms") {
            None => None,
            Some(_) => Some(d.millis(
                "min_start_budget_ms",
                0,
                0..=3_600_000,
                " (unset = adaptive)",
            )?),
        };
        let deadline = DeadlineConfig {
            default: (default_ms > 0).then(|| Duration::from_millis(default_ms)),
            max,
            min_start_budget,
            reply_margin: d.millis("reply_margin_ms", 20, 0..=60_000, "")?,
            predict: d.boolean("predict", true)?,
            overtake_share_pct: u8::try_from(d.uint("overtake_share_pct", 50, 0..=90, "")?)
                .unwrap_or(90),
        };
        d.finish()?;

        let mut e = r.section("estimator")?;
        let initial_ms = e.uint(
            "initial_ms",
            0,
            0..=3_600_000,
            " (0 = no estimate before the first call)",
        )?;
        let window = usize_of(e.uint("window", 64, 1..=4096, "")?);
        let half_life = e.uint("half_life", 16, 1..=4096, "")?;
        if usize_of(half_life) > window {
            return Err(ConfigError::invalid(
                e.key("half_life"),
                format!("{half_life} is larger than estimator.window ({window})"),
            ));
        }
        let estimator = EstimatorConfig {
            initial: (initial_ms > 0).then(|| Duration::from_millis(initial_ms)),
            window,
            half_life: half_life as f64,
            quantile: e.float("quantile", 0.9, 0.5..=0.999)?,
        };
        e.finish()?;

        let mut i = r.section("idempotency")?;
        let enabled = i.boolean("enabled", true)?;
        let window = i.millis(
            "window_ms",
            60_000,
            0..=86_400_000,
            " (0 = no cache after completion)",
        )?;
        let max_entries = nz(i.uint("max_entries", 10_000, 1..=10_000_000, "")?);
        let max_bytes = nz(i.uint(
            "max_bytes",
            DEFAULT_CACHE_MAX_BYTES,
            1024..=MAX_CACHE_MAX_BYTES,
            "",
        )?);
        let idempotency = enabled.then_some(IdempotencyConfig {
            window,
            max_entries,
            max_bytes,
        });
        i.finish()?;

        let limits = read_limits(&mut r)?;
        let backend = read_backend(&mut r)?;
        let nats = read_nats(&mut r, queue_capacity.get())?;
        let service = read_service(&mut r)?;

        let mut a = r.section("admin")?;
        let listen_s = a.string("listen", "127.0.0.1:9091")?;
        let listen = listen_s.parse::<SocketAddr>().map_err(|_| {
            ConfigError::invalid(
                a.key("listen"),
                format!("expected an address like 127.0.0.1:9091, got {listen_s:?}"),
            )
        })?;
        let admin = AdminConfig {
            listen,
            max_connections: nz(a.uint("max_connections", 64, 1..=4096, "")?),
            header_timeout: a.millis("header_timeout_ms", 5_000, 100..=600_000, "")?,
            idle_timeout: a.millis("idle_timeout_ms", 10_000, 100..=3_600_000, "")?,
        };
        a.finish()?;

        let mut t = r.section("trace")?;
        let trace = TraceConfig {
            log: t.boolean("log", true)?,
            subject: t
                .opt_string("subject")?
                .map(|s| subject(&t.key("subject"), s, false))
                .transpose()?,
            buffer: nz(t.uint("buffer", 4096, 1..=1_000_000, "")?),
        };
        t.finish()?;

        let mut st = r.section("stream")?;
        let stream = StreamConfig {
            settings: crate::admission::StreamSettings {
                interval: st.millis(
                    "chunk_interval_ms",
                    20,
                    0..=10_000,
                    " (0 = no coalescing by time)",
                )?,
                max_bytes: usize_of(st.uint("chunk_max_bytes", 4096, 1..=1_048_576, "")?),
            },
            window: usize_of(st.uint("window", 16, 0..=100_000, " (0 = no acknowledgements)")?),
            ack_timeout: st.millis(
                "ack_timeout_ms",
                nats.publish_timeout.as_millis().try_into().unwrap_or(1_000),
                1..=600_000,
                "",
            )?,
        };
        st.finish()?;
        let intake = read_intake(&mut r, workers)?;
        r.finish()?;

        Ok(Self {
            workers,
            queue_capacity,
            mode,
            session,
            limits,
            deadline,
            queue_order,
            estimator,
            idempotency,
            backend,
            shutdown_grace,
            nats,
            service,
            admin,
            trace,
            stream,
            intake,
        })
    }
}

impl Config {
    /// The capabilities document: every limit (`null` when disabled), the subjects and
    /// the header names. Served on the capabilities subject and `/v1/capabilities`.
    pub fn capabilities(&self) -> serde_json::Value {
        use serde_json::json;
        use weir_protocol::llm::headers as h;
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let limits: Vec<serde_json::Value> = self
            .limits
            .iter()
            .map(|l| {
                let (on_busy, max_wait_ms, max_waiters) = match l.on_busy {
                    OnBusy::Reject => ("reject", None, None),
                    OnBusy::Wait {
                        max_wait,
                        max_waiters,
                    } => ("wait", Some(ms(max_wait)), Some(max_waiters)),
                };
                json!({
                    "name": l.name,
                    "key": l.key.describe(),
                    "limit": l.limit.get(),
                    "on_busy": on_busy,
                    "max_wait_ms": max_wait_ms,
                    "max_waiters": max_waiters,
                })
            })
            .collect();
        json!({
            "service": {
                "name": self.service.name,
                "version": self.service.version,
                "queue_group": self.service.queue_group,
                "subject": self.service.subject,
                "cancel_subject": self.service.cancel_subject,
                "capabilities_subject": self.service.capabilities_subject,
                "limits_subject": self.service.limits_subject,
                "status_subject": self.service.status_subject,
            },
            "stream": {
                "chunk_interval_ms": ms(self.stream.settings.interval),
                "chunk_max_bytes": self.stream.settings.max_bytes,
                "window": self.stream.window,
                "ack_timeout_ms": ms(self.stream.ack_timeout),
            },
            "mode": self.mode,
            "workers": self.workers.get(),
            "queue_capacity": self.queue_capacity.get(),
            "session": {
                "pending_cap": self.session.pending_cap.map(NonZeroUsize::get),
                "ordering": self.session.ordering,
            },
            "limits": limits,
            "deadline": {
                "default_ms": self.deadline.default.map(ms),
                "max_ms": ms(self.deadline.max),
                "min_start_budget_ms": self.deadline.min_start_budget.map(ms),
                "start_budget": if self.deadline.min_start_budget.is_some() { "fixed" } else { "adaptive" },
                "reply_margin_ms": ms(self.deadline.reply_margin),
                "predict": self.deadline.predict,
                "overtake_share_pct": self.deadline.overtake_share_pct,
            },
            "queue_order": self.queue_order,
            "estimator": {
                "initial_ms": self.estimator.initial.map(ms),
                "window": self.estimator.window,
                "half_life": self.estimator.half_life,
                "quantile": self.estimator.quantile,
            },
            "idempotency": self.idempotency.map(|i| json!({
                "window_ms": ms(i.window),
                "max_entries": i.max_entries.get(),
                "max_bytes": i.max_bytes.get(),
            })),
            "backend": {
                "kind": self.backend.kind.name(),
                "timeout_ms": ms(self.backend.timeout),
            },
            "shutdown_grace_ms": ms(self.shutdown_grace),
            "intake": match &self.intake {
                Intake::Core => json!({"kind": "core"}),
                Intake::JetStream(j) => json!({
                    "kind": "jetstream",
                    "stream": j.stream,
                    "subject": j.subject,
                    "consumer": j.consumer,
                    "ack_wait_ms": ms(j.ack_wait),
                    "max_ack_pending": j.max_ack_pending.get(),
                    "duplicate_window_ms": ms(j.duplicate_window),
                    "forward": j.forward,
                    "reply_to_header": weir_protocol::llm::headers::REPLY_TO,
                }),
            },
            "headers": {
                "request_id": h::REQUEST_ID,
                "session_id": h::SESSION_ID,
                "deadline_ms": h::DEADLINE_MS,
                "timeout_ms": h::TIMEOUT_MS,
                "admission": h::ADMISSION,
                "client_key": h::CLIENT_KEY,
                "cancel": h::CANCEL,
                "queue_ms": h::QUEUE_MS,
                "inference_ms": h::INFERENCE_MS,
                "error_code": h::ERROR_CODE,
                "stream": weir_protocol::llm::stream::STREAM,
                "stream_event": weir_protocol::llm::stream::STREAM_EVENT,
                "stream_seq": weir_protocol::llm::stream::STREAM_SEQ,
            },
        })
    }
}

fn read_limits(r: &mut Reader<'_>) -> Result<Vec<KeyLimit>, ConfigError> {
    let Some(v) = r.get("limits") else {
        return Ok(Vec::new());
    };
    let Value::Array(items) = v else {
        return Err(ConfigError::invalid(
            r.key("limits"),
            "expected an array of tables ([[limits]])",
        ));
    };
    if items.len() > 16 {
        return Err(ConfigError::invalid(r.key("limits"), "at most 16 limits"));
    }
    let mut names = BTreeSet::new();
    let mut out = Vec::with_capacity(items.len());
    for (n, item) in items.iter().enumerate() {
        let prefix = format!("limits[{n}]");
        let Value::Table(t) = item else {
            return Err(ConfigError::invalid(prefix, "expected a table"));
        };
        let mut l = Reader::new(prefix, t);
        let key_s = l.required_string("key")?;
        let key = KeySource::parse(&l.key("key"), &key_s)?;
        let name = l.string("name", &key.describe())?;
        name_check(&l.key("name"), &name)?;
        if !names.insert(name.clone()) {
            return Err(ConfigError::invalid(
                l.key("name"),
                format!("duplicate limit name {name:?}"),
            ));
        }
        let limit = nz(l.required_uint("limit", 1..=1_000_000)?);
        let on_busy = match l.string("on_busy", "wait")?.as_str() {
            "reject" => OnBusy::Reject,
            "wait" => OnBusy::Wait {
                max_wait: l.millis("max_wait_ms", 1_000, 1..=3_600_000, "")?,
                max_waiters: usize_of(l.uint("max_waiters", 100, 0..=1_000_000, "")?),
            },
            other => {
                return Err(ConfigError::invalid(
                    l.key("on_busy"),
                    format!("expected \"wait\" or \"reject\", got {other:?}"),
                ));
            }
        };
        l.finish()?;
        out.push(KeyLimit {
            name,
            key,
            limit,
            on_busy,
        });
    }
    Ok(out)
}

fn read_backend(r: &mut Reader<'_>) -> Result<BackendConfig, ConfigError> {
    let mut b = r.section("backend")?;
    let timeout = b.millis("timeout_ms", 60_000, 1..=3_600_000, "")?;
    let kind_s = b.string("kind", "sim")?;
    // Every backend section present is validated, whichever is selected, so a file may
    // keep several and switch with `kind` (e.g. WEIR_LLM_BACKEND__KIND=openai).
    let mut sim = b.section("sim")?;
    let sim_cfg = read_sim(&mut sim)?;
    sim.finish()?;
    let mut openai = b.section("openai")?;
    let openai_cfg = read_openai(&mut openai)?;
    openai.finish()?;
    let mut nats = b.section("nats")?;
    let nats_subject = nats
        .opt_string("subject")?
        .map(|s| subject(&nats.key("subject"), s, false))
        .transpose()?;
    let nats_key = nats.key("subject");
    nats.finish()?;
    let kind = match kind_s.as_str() {
        "sim" => BackendKind::Sim(sim_cfg),
        "openai" => BackendKind::OpenAi(openai_cfg),
        "nats" => BackendKind::Nats(NatsBackendConfig {
            subject: nats_subject.ok_or_else(|| {
                ConfigError::invalid(nats_key, "required when backend.kind = \"nats\"")
            })?,
        }),
        other => {
            return Err(ConfigError::invalid(
                b.key("kind"),
                format!("expected \"sim\", \"openai\" or \"nats\", got {other:?}"),
            ));
        }
    };
    b.finish()?;
    Ok(BackendConfig { timeout, kind })
}

fn read_openai(openai: &mut Reader<'_>) -> Result<OpenAiConfig, ConfigError> {
    let base_url = openai.string("base_url", "http://127.0.0.1:8000")?;
    let host = base_url
        .strip_prefix("https://")
        .or_else(|| base_url.strip_prefix("http://"));
    if host.is_none_or(|h| h.trim_end_matches('/').is_empty()) {
        return Err(ConfigError::invalid(
            openai.key("base_url"),
            format!("expected http://host:port or https://host[:port], got {base_url:?}"),
        ));
    }
    let tls_ca_file = openai.opt_string("tls_ca_file")?.map(PathBuf::from);
    let tls_cert_file = openai.opt_string("tls_cert_file")?.map(PathBuf::from);
    let tls_key_file = openai.opt_string("tls_key_file")?.map(PathBuf::from);
    if tls_cert_file.is_some() != tls_key_file.is_some() {
        return Err(ConfigError::invalid(
            openai.key(if tls_cert_file.is_some() {
                "tls_key_file"
            } else {
                "tls_cert_file"
            }),
            "tls_cert_file and tls_key_file go together",
        ));
    }
    if !base_url.starts_with("https://")
        && let Some(k) = [
            ("tls_ca_file", tls_ca_file.is_some()),
            ("tls_cert_file", tls_cert_file.is_some()),
        ]
        .into_iter()
        .find_map(|(k, set)| set.then_some(k))
    {
        return Err(ConfigError::invalid(
            openai.key(k),
            "set, but base_url is not https:// (it would be ignored)",
        ));
    }
    let path = openai.string("path", "/v1/chat/completions")?;
    if !path.starts_with('/') {
        return Err(ConfigError::invalid(
            openai.key("path"),
            "must start with '/'",
        ));
    }
    Ok(OpenAiConfig {
        base_url: base_url.trim_end_matches('/').to_owned(),
        path,
        api_key_env: openai.opt_string("api_key_env")?,
        connect_timeout: openai.millis("connect_timeout_ms", 2_000, 1..=600_000, "")?,
        pool_max_idle_per_host: usize_of(openai.uint(
            "pool_max_idle_per_host",
            64,
            0..=100_000,
            "",
        )?),
        pool_idle_timeout: openai.millis("pool_idle_timeout_ms", 90_000, 1..=3_600_000, "")?,
        tls_ca_file,
        tls_cert_file,
        tls_key_file,
    })
}

fn read_sim(s: &mut Reader<'_>) -> Result<SimConfig, ConfigError> {
    let latency_ms = s.uint("latency_ms", 20, 0..=3_600_000, "")?;
    let latency = match s.string("distribution", "fixed")?.as_str() {
        "fixed" => Latency::Fixed(Duration::from_millis(latency_ms)),
        "uniform" => {
            let min = s.uint("min_ms", 0, 0..=3_600_000, "")?;
            let max = s.uint("max_ms", latency_ms.max(min), 0..=3_600_000, "")?;
            if max < min {
                return Err(ConfigError::invalid(
                    s.key("max_ms"),
                    format!("{max} is below min_ms {min}"),
                ));
            }
            Latency::Uniform {
                min: Duration::from_millis(min),
                max: Duration::from_millis(max),
            }
        }
        "lognormal" => {
            let p99 = s.uint("p99_ms", latency_ms.saturating_mul(3), 0..=3_600_000, "")?;
            if p99 < latency_ms {
                return Err(ConfigError::invalid(
                    s.key("p99_ms"),
                    format!("{p99} is below the median latency_ms {latency_ms}"),
                ));
            }
            Latency::LogNormal {
                median: Duration::from_millis(latency_ms),
                p99: Duration::from_millis(p99),
            }
        }
        other => {
            return Err(ConfigError::invalid(
                s.key("distribution"),
                format!("expected \"fixed\", \"uniform\" or \"lognormal\", got {other:?}"),
            ));
        }
    };
    Ok(SimConfig {
        latency,
        error_rate: s.float("error_rate", 0.0, 0.0..=1.0)?,
        seed: s.uint("seed", 1, 0..=u64::MAX, "")?,
        stream: SimStream {
            first_token: s.millis("first_token_ms", 20, 0..=3_600_000, "")?,
            tokens: u32::try_from(s.uint("tokens", 16, 1..=1_000_000, "")?).unwrap_or(16),
            tokens_per_second: s.float("tokens_per_second", 50.0, 0.001..=1_000_000.0)?,
        },
    })
}

fn read_nats(r: &mut Reader<'_>, queue_capacity: usize) -> Result<NatsConfig, ConfigError> {
    let mut n = r.section("nats")?;
    let url = n.string("url", weir_service::nats::DEFAULT_URL)?;
    let user = n.opt_string("user")?;
    let password = n.opt_string("password")?;
    let token = n.opt_string("token")?;
    let nkey = n.opt_string("nkey")?;
    let creds_file = n.opt_string("creds_file")?.map(PathBuf::from);
    let tls_ca_file = n.opt_string("tls_ca_file")?.map(PathBuf::from);
    let tls_cert_file = n.opt_string("tls_cert_file")?.map(PathBuf::from);
    let tls_key_file = n.opt_string("tls_key_file")?.map(PathBuf::from);
    let base = weir_service::nats::NatsConfig {
        name: n.string("name", NATS_CLIENT_NAME)?,
        // A node that hangs (host lost, network cut) is noticed after 2–3 pings, and a
        // reconnect that tries it first waits one connection timeout: 2 s + 2 s keep a
        // hung node's cost to seconds (it was 20–30 s + 5 s; issue 13).
        connection_timeout: n.millis("connection_timeout_ms", 2_000, 1..=600_000, "")?,
        ping_interval: n.millis("ping_interval_ms", 2_000, 100..=3_600_000, "")?,
        subscription_capacity: Some(subscription_capacity(&mut n, queue_capacity)?),
        retry_initial_connect: n.boolean("retry_initial_connect", true)?,
        // Replies are published through it, each bounded by `publish_timeout_ms`:
        // async-nats's own default.
        client_capacity: 2048,
        ..weir_service::nats::NatsConfig::named(NATS_CLIENT_NAME)
    };
    let client = weir_service::nats::NatsInput {
        url: Some(url.as_str()),
        user: user.as_deref(),
        password: password.as_deref(),
        token: token.as_deref(),
        nkey: nkey.as_deref(),
        creds_file: creds_file.as_deref(),
        tls_required: n.boolean("tls_required", false)?,
        tls_ca_file: tls_ca_file.as_deref(),
        tls_cert_file: tls_cert_file.as_deref(),
        tls_key_file: tls_key_file.as_deref(),
    }
    .validate(base)
    .map_err(|e| ConfigError::invalid(n.key(e.field), e.message))?;
    let cfg = NatsConfig {
        client,
        publish_timeout: n.millis("publish_timeout_ms", 1_000, 1..=600_000, "")?,
    };
    n.finish()?;
    Ok(cfg)
}

/// `nats.subscription_capacity`: by default `queue_capacity` + `nats.expected_burst`, so
/// that a burst of that many requests arriving at once is buffered by the client and
/// answered (a refusal is fast; a message the client drops gets no answer at all). Set
/// explicitly, it must hold at least `queue_capacity` messages.
fn subscription_capacity(n: &mut Reader<'_>, queue_capacity: usize) -> Result<usize, ConfigError> {
    let burst = usize_of(n.uint("expected_burst", 65_536, 0..=1_000_000, "")?);
    let explicit = n.uint("subscription_capacity", 0, 16..=2_000_000, "")?;
    if explicit == 0 {
        return Ok(queue_capacity.saturating_add(burst).max(16));
    }
    let cap = usize_of(explicit);
    if cap < queue_capacity {
        return Err(ConfigError::invalid(
            n.key("subscription_capacity"),
            format!(
                "{cap} is smaller than queue_capacity ({queue_capacity}): the client would drop \
                 requests (no answer) before the queue refuses them; use at least \
                 queue_capacity + the largest burst expected"
            ),
        ));
    }
    Ok(cap)
}

fn read_service(r: &mut Reader<'_>) -> Result<ServiceConfig, ConfigError> {
    let mut s = r.section("service")?;
    let name = s.string("name", "weir-llm")?;
    if name.is_empty()
        || name.len() > MAX_NAME_LEN
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(ConfigError::invalid(
            s.key("name"),
            format!("only A-Z a-z 0-9 - _ allowed (1..={MAX_NAME_LEN}), got {name:?}"),
        ));
    }
    let version = s.string("version", env!("CARGO_PKG_VERSION"))?;
    if !is_semver(&version) {
        return Err(ConfigError::invalid(
            s.key("version"),
            format!("expected a semantic version like 1.2.3, got {version:?}"),
        ));
    }
    let queue_group = s.string("queue_group", "q")?;
    name_check(&s.key("queue_group"), &queue_group)?;
    let cfg = ServiceConfig {
        name,
        version,
        description: s.string("description", "weir bounded LLM adapter")?,
        queue_group,
        subject: subject(&s.key("subject"), s.string("subject", "llm.infer")?, true)?,
        cancel_subject: subject(
            &s.key("cancel_subject"),
            s.string("cancel_subject", "llm.cancel")?,
            true,
        )?,
        capabilities_subject: subject(
            &s.key("capabilities_subject"),
            s.string("capabilities_subject", "llm.capabilities")?,
            true,
        )?,
        limits_subject: subject(
            &s.key("limits_subject"),
            s.string("limits_subject", "llm.limits")?,
            true,
        )?,
        status_subject: subject(
            &s.key("status_subject"),
            s.string("status_subject", "llm.status")?,
            true,
        )?,
    };
    let all = [
        &cfg.subject,
        &cfg.cancel_subject,
        &cfg.capabilities_subject,
        &cfg.limits_subject,
        &cfg.status_subject,
    ];
    let distinct: BTreeSet<&String> = all.iter().copied().collect();
    if distinct.len() != all.len() {
        return Err(ConfigError::invalid(
            s.key("subject"),
            "the five service subjects must differ",
        ));
    }
    s.finish()?;
    Ok(cfg)
}

/// `intake` and `[jetstream]`.
fn read_intake(r: &mut Reader<'_>, workers: NonZeroUsize) -> Result<Intake, ConfigError> {
    let kind = r.string("intake", "core")?;
    let mut j = r.section("jetstream")?;
    let stream = j.string("stream", "WEIR_LLM_INTAKE")?;
    stream_name(&j.key("stream"), &stream)?;
    let subject_s = subject(&j.key("subject"), j.string("subject", "llm.intake")?, false)?;
    let consumer = j.string("consumer", "weir-llm")?;
    stream_name(&j.key("consumer"), &consumer)?;
    let ack_wait = j.millis("ack_wait_ms", 10_000, 100..=3_600_000, "")?;
    let progress_default = u64::try_from(ack_wait.as_millis() / 3).unwrap_or(1_000);
    let progress_interval = j.millis(
        "progress_interval_ms",
        progress_default,
        10..=1_200_000,
        " (below ack_wait_ms; default ack_wait_ms / 3)",
    )?;
    if progress_interval >= ack_wait {
        return Err(ConfigError::invalid(
            j.key("progress_interval_ms"),
            format!(
                "{} must be below jetstream.ack_wait_ms ({})",
                progress_interval.as_millis(),
                ack_wait.as_millis()
            ),
        ));
    }
    let max_ack_pending = nz(j.uint(
        "max_ack_pending",
        workers.get() as u64,
        1..=1_000_000,
        " (default workers; set the sum of workers over the replicas)",
    )?);
    if max_ack_pending < workers {
        return Err(ConfigError::invalid(
            j.key("max_ack_pending"),
            format!(
                "{} is below workers ({}): the replica could never fill its workers",
                max_ack_pending, workers
            ),
        ));
    }
    let session_bucket = j.string("session_bucket", "weir_llm_sessions")?;
    stream_name(&j.key("session_bucket"), &session_bucket)?;
    let reply_bucket = j.string("reply_bucket", "weir_llm_replies")?;
    let reply_bucket = if reply_bucket.is_empty() {
        None
    } else {
        stream_name(&j.key("reply_bucket"), &reply_bucket)?;
        if reply_bucket == session_bucket {
            return Err(ConfigError::invalid(
                j.key("reply_bucket"),
                "must differ from jetstream.session_bucket",
            ));
        }
        Some(reply_bucket)
    };
    let cfg = JetStreamIntake {
        stream,
        subject: subject_s,
        consumer,
        ack_wait,
        progress_interval,
        max_ack_pending,
        max_deliver: nz(j.uint("max_deliver", 5, 1..=1000, "")?),
        duplicate_window: j.millis("duplicate_window_ms", 120_000, 100..=86_400_000, "")?,
        max_messages: nz(j.uint("max_messages", 100_000, 1..=100_000_000, "")?),
        max_bytes: nz(j.uint("max_bytes", 1 << 30, 1024..=(1u64 << 40), "")?),
        replicas: nz(j.uint("replicas", 1, 1..=5, "")?),
        file_storage: match j.string("storage", "file")?.as_str() {
            "file" => true,
            "memory" => false,
            other => {
                return Err(ConfigError::invalid(
                    j.key("storage"),
                    format!("expected \"file\" or \"memory\", got {other:?}"),
                ));
            }
        },
        session_bucket,
        reply_bucket,
        forward: j.boolean("forward", true)?,
    };
    j.finish()?;
    match kind.as_str() {
        "core" => Ok(Intake::Core),
        "jetstream" => Ok(Intake::JetStream(Box::new(cfg))),
        other => Err(ConfigError::invalid(
            r.key("intake"),
            format!("expected \"core\" or \"jetstream\", got {other:?}"),
        )),
    }
}

/// A stream, consumer or bucket name: `A-Z a-z 0-9 - _` (no dots, spaces or wildcards,
/// which JetStream refuses in names).
fn stream_name(key: &str, s: &str) -> Result<(), ConfigError> {
    if s.is_empty()
        || s.len() > MAX_NAME_LEN
        || !s
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(ConfigError::invalid(
            key,
            format!("only A-Z a-z 0-9 - _ allowed (1..={MAX_NAME_LEN}), got {s:?}"),
        ));
    }
    Ok(())
}

fn is_semver(v: &str) -> bool {
    let core = v.split(['-', '+']).next().unwrap_or("");
    let parts: Vec<&str> = core.split('.').collect();
    parts.len() == 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// Validates a subject; wildcards only where `wildcards` (endpoint subjects).
fn subject(key: &str, s: String, wildcards: bool) -> Result<String, ConfigError> {
    let bad = s.is_empty()
        || s.len() > 256
        || s.split('.').any(|t| {
            t.is_empty()
                || t.bytes().any(|b| !(b'!'..=b'~').contains(&b))
                || (!wildcards && (t == "*" || t == ">"))
        });
    if bad {
        return Err(ConfigError::invalid(
            key,
            format!(
                "expected a NATS subject of non-empty dot-separated tokens without spaces{}, got {s:?}",
                if wildcards { "" } else { " or wildcards" }
            ),
        ));
    }
    Ok(s)
}

fn name_check(key: &str, s: &str) -> Result<(), ConfigError> {
    if s.is_empty() || s.len() > MAX_NAME_LEN || s.bytes().any(|b| !(b'!'..=b'~').contains(&b)) {
        return Err(ConfigError::invalid(
            key,
            format!("expected 1..={MAX_NAME_LEN} visible ASCII characters, got {s:?}"),
        ));
    }
    Ok(())
}

fn nz(v: u64) -> NonZeroUsize {
    NonZeroUsize::new(usize_of(v)).unwrap_or(NonZeroUsize::MIN)
}

fn usize_of(v: u64) -> usize {
    usize::try_from(v).unwrap_or(usize::MAX)
}

static EMPTY: LazyLock<Table> = LazyLock::new(Table::new);

/// Reads typed values out of one TOML table, remembering which keys were used so that
/// [`Reader::finish`] can refuse the unknown ones with their full path.
struct Reader<'a> {
    prefix: String,
    table: &'a Table,
    seen: Vec<&'a str>,
}

/// One configuration key as [`list_keys`] reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeyDoc {
    /// Dotted key (`stream.window`), as in the file; `WEIR_LLM_STREAM__WINDOW` in the
    /// environment.
    pub key: String,
    /// The default.
    pub default: String,
    /// Allowed values.
    pub allowed: String,
}

thread_local! {
    /// Set while [`list_keys`] runs: every key the parser reads is noted here.
    static KEY_LOG: std::cell::RefCell<Option<Vec<KeyDoc>>> = const { std::cell::RefCell::new(None) };
}

/// Notes a key the parser reads (only while [`list_keys`] runs; the closures cost
/// nothing otherwise).
fn note_key(
    key: impl FnOnce() -> String,
    default: impl FnOnce() -> String,
    allowed: impl FnOnce() -> String,
) {
    KEY_LOG.with(|log| {
        if let Some(v) = log.borrow_mut().as_mut() {
            let key = key();
            if !v.iter().any(|k| k.key == key) {
                v.push(KeyDoc {
                    key,
                    default: default(),
                    allowed: allowed(),
                });
            }
        }
    });
}

/// Every key the parser reads for an empty file, with its default and range, in
/// reading order: the list comes from the parser itself, so it cannot drift from it.
/// Keys read only in some cases (the `[[limits]]` entries, `backend.sim.min_ms` and
/// the other distribution-specific keys, `backend.nats.subject` when required) are in
/// docs/llm-adapter.md; `--list-keys` prints this list.
pub fn list_keys() -> Vec<KeyDoc> {
    KEY_LOG.with(|log| *log.borrow_mut() = Some(Vec::new()));
    let _ = Config::from_table(&Table::new());
    KEY_LOG.with(|log| log.borrow_mut().take().unwrap_or_default())
}

impl<'a> Reader<'a> {
    fn root(table: &'a Table) -> Self {
        Self::new(String::new(), table)
    }

    fn new(prefix: String, table: &'a Table) -> Self {
        Self {
            prefix,
            table,
            seen: Vec::new(),
        }
    }

    fn key(&self, name: &str) -> String {
        if self.prefix.is_empty() {
            name.to_owned()
        } else {
            format!("{}.{name}", self.prefix)
        }
    }

    fn get(&mut self, name: &str) -> Option<&'a Value> {
        let (k, v) = self.table.get_key_value(name)?;
        self.seen.push(k.as_str());
        Some(v)
    }

    fn section(&mut self, name: &str) -> Result<Reader<'a>, ConfigError> {
        match self.get(name) {
            None => Ok(Reader::new(self.key(name), &EMPTY)),
            Some(Value::Table(t)) => Ok(Reader::new(self.key(name), t)),
            Some(_) => Err(ConfigError::invalid(
                self.key(name),
                "expected a table (section)",
            )),
        }
    }

    fn finish(self) -> Result<(), ConfigError> {
        for k in self.table.keys() {
            if !self.seen.contains(&k.as_str()) {
                return Err(ConfigError {
                    key: if self.prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{}.{k}", self.prefix)
                    },
                    kind: ConfigErrorKind::UnknownKey,
                    message: "unknown key (see docs/llm-adapter.md for the reference)".into(),
                });
            }
        }
        Ok(())
    }

    fn uint(
        &mut self,
        name: &str,
        default: u64,
        range: RangeInclusive<u64>,
        note: &str,
    ) -> Result<u64, ConfigError> {
        note_key(
            || self.key(name),
            || default.to_string(),
            || format!("{}..={}{note}", range.start(), range.end()),
        );
        match self.get(name) {
            None => Ok(default),
            Some(v) => uint_of(&self.key(name), v, &range, note),
        }
    }

    fn required_uint(
        &mut self,
        name: &str,
        range: RangeInclusive<u64>,
    ) -> Result<u64, ConfigError> {
        match self.get(name) {
            None => Err(ConfigError::invalid(
                self.key(name),
                format!(
                    "required; a whole number in {}..={}",
                    range.start(),
                    range.end()
                ),
            )),
            Some(v) => uint_of(&self.key(name), v, &range, ""),
        }
    }

    fn millis(
        &mut self,
        name: &str,
        default: u64,
        range: RangeInclusive<u64>,
        note: &str,
    ) -> Result<Duration, ConfigError> {
        self.uint(name, default, range, note)
            .map(Duration::from_millis)
    }

    fn float(
        &mut self,
        name: &str,
        default: f64,
        range: RangeInclusive<f64>,
    ) -> Result<f64, ConfigError> {
        let key = self.key(name);
        note_key(
            || key.clone(),
            || default.to_string(),
            || format!("{}..={}", range.start(), range.end()),
        );
        let v = match self.get(name) {
            None => return Ok(default),
            Some(Value::Float(f)) => *f,
            Some(Value::Integer(i)) => *i as f64,
            Some(other) => {
                return Err(ConfigError::invalid(
                    key,
                    format!(
                        "expected a number in {}..={}, got {}",
                        range.start(),
                        range.end(),
                        describe(other)
                    ),
                ));
            }
        };
        if !range.contains(&v) {
            return Err(ConfigError::invalid(
                key,
                format!(
                    "expected a number in {}..={}, got {v}",
                    range.start(),
                    range.end()
                ),
            ));
        }
        Ok(v)
    }

    fn boolean(&mut self, name: &str, default: bool) -> Result<bool, ConfigError> {
        note_key(
            || self.key(name),
            || default.to_string(),
            || "true, false".into(),
        );
        match self.get(name) {
            None => Ok(default),
            Some(Value::Boolean(b)) => Ok(*b),
            Some(other) => Err(ConfigError::invalid(
                self.key(name),
                format!("expected true or false, got {}", describe(other)),
            )),
        }
    }

    fn opt_string(&mut self, name: &str) -> Result<Option<String>, ConfigError> {
        note_key(|| self.key(name), || "none".into(), || "string".into());
        match self.get(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(ConfigError::invalid(
                self.key(name),
                format!("expected a string, got {}", describe(other)),
            )),
        }
    }

    fn string(&mut self, name: &str, default: &str) -> Result<String, ConfigError> {
        note_key(
            || self.key(name),
            || format!("{default:?}"),
            || "string".into(),
        );
        Ok(self.opt_string(name)?.unwrap_or_else(|| default.to_owned()))
    }

    fn required_string(&mut self, name: &str) -> Result<String, ConfigError> {
        self.opt_string(name)?
            .ok_or_else(|| ConfigError::invalid(self.key(name), "required"))
    }
}

fn uint_of(
    key: &str,
    v: &Value,
    range: &RangeInclusive<u64>,
    note: &str,
) -> Result<u64, ConfigError> {
    let expected = format!(
        "expected a whole number in {}..={}{note}",
        range.start(),
        range.end()
    );
    match v {
        Value::Integer(i) if *i >= 0 && range.contains(&(*i as u64)) => Ok(*i as u64),
        Value::Integer(i) => Err(ConfigError::invalid(key, format!("{expected}, got {i}"))),
        Value::Float(f) => Err(ConfigError::invalid(
            key,
            format!("{expected}, got {f} (fractional values are refused)"),
        )),
        other => Err(ConfigError::invalid(
            key,
            format!("{expected}, got {}", describe(other)),
        )),
    }
}

fn describe(v: &Value) -> String {
    match v {
        Value::String(s) => format!("the string {s:?}"),
        Value::Integer(i) => i.to_string(),
        Value::Float(f) => f.to_string(),
        Value::Boolean(b) => b.to_string(),
        Value::Datetime(d) => format!("the date {d}"),
        Value::Array(_) => "an array".into(),
        Value::Table(_) => "a table".into(),
    }
}

/// Applies `WEIR_LLM_*` environment overrides to `table`.
///
/// `WEIR_LLM_A__B=v` sets key `a.b`. Values are typed like TOML scalars: `42` is an
/// integer, `0.5` a float, `true`/`false` booleans, anything else a string. Variables
/// in `skip` (those that clap reads for flags) are left alone. `[[limits]]` cannot be
/// set from the environment.
pub fn apply_env<I>(table: &mut Table, vars: I, skip: &[&str]) -> Result<(), ConfigError>
where
    I: IntoIterator<Item = (String, String)>,
{
    for (name, value) in vars {
        let Some(rest) = name.strip_prefix(ENV_PREFIX) else {
            continue;
        };
        if skip.contains(&name.as_str()) || rest.is_empty() {
            continue;
        }
        let path: Vec<String> = rest.split("__").map(|p| p.to_ascii_lowercase()).collect();
        if path.iter().any(String::is_empty) || path[0] == "limits" {
            return Err(ConfigError::invalid(
                name.clone(),
                "cannot map this variable to a key ([[limits]] only from the file)",
            ));
        }
        set_path(table, &path, scalar(&value))
            .map_err(|m| ConfigError::invalid(name.clone(), m))?;
    }
    Ok(())
}

/// Sets `path` (e.g. `["nats","url"]`) to `value`, creating sections as needed.
pub fn set_path(table: &mut Table, path: &[String], value: Value) -> Result<(), String> {
    let Some((last, parents)) = path.split_last() else {
        return Err("empty key".into());
    };
    let mut t = table;
    for p in parents {
        let entry = t
            .entry(p.clone())
            .or_insert_with(|| Value::Table(Table::new()));
        t = match entry {
            Value::Table(inner) => inner,
            _ => return Err(format!("`{p}` is not a section")),
        };
    }
    t.insert(last.clone(), value);
    Ok(())
}

fn scalar(s: &str) -> Value {
    if let Ok(i) = s.parse::<i64>() {
        Value::Integer(i)
    } else if let Ok(f) = s.parse::<f64>()
        && s.contains(['.', 'e', 'E'])
        && f.is_finite()
    {
        Value::Float(f)
    } else if s == "true" || s == "false" {
        Value::Boolean(s == "true")
    } else {
        Value::String(s.to_owned())
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Enforce => "enforce",
            Self::Shadow => "shadow",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> ConfigError {
        Config::from_toml_str(text).expect_err("must be refused")
    }

    #[test]
    fn one_nats_auth_method_at_a_time() {
        let e = err("[nats]\nuser = \"u\"\npassword = \"p\"\ntoken = \"t\"\n");
        assert!(e.to_string().contains("nats.token"), "{e}");
        assert!(e.to_string().contains("user, token"), "{e}");
        let e = err("[nats]\ntoken = \"t\"\nnkey = \"SUAK\"\n");
        assert!(e.to_string().contains("one authentication method"), "{e}");
        assert!(Config::from_toml_str("[nats]\ntoken = \"t\"\n").is_ok());
    }

    #[test]
    fn nats_secrets_never_appear_in_debug_output() {
        for (toml, secret) in [
            ("user = \"weir\"\npassword = \"pa55-word\"", "pa55-word"),
            ("token = \"t0ken-value\"", "t0ken-value"),
            ("nkey = \"SUAKSEEDVALUE\"", "SUAKSEEDVALUE"),
        ] {
            let c = Config::from_toml_str(&format!("[nats]\n{toml}\n")).expect("valid");
            let shown = format!("{c:?}");
            assert!(!shown.contains(secret), "{secret} in {shown}");
            assert!(shown.contains("<redacted>"), "{shown}");
        }
    }

    #[test]
    fn defaults_are_valid_and_documented_values() {
        let c = Config::default();
        assert_eq!(c.workers.get(), 8);
        assert_eq!(c.queue_capacity.get(), 256);
        assert_eq!(c.session.pending_cap.map(NonZeroUsize::get), Some(5));
        assert!(c.session.ordering);
        assert_eq!(c.deadline.default, Some(Duration::from_secs(30)));
        assert_eq!(c.mode, Mode::Enforce);
        assert!(c.limits.is_empty());
        assert_eq!(c.backend.kind.name(), "sim");
        assert_eq!(c.service.subject, "llm.infer");
        assert_eq!(c.admin.listen.to_string(), "127.0.0.1:9091");
        assert_eq!(c.admin.max_connections.get(), 64);
        assert_eq!(c.admin.header_timeout, Duration::from_secs(5));
        assert_eq!(c.admin.idle_timeout, Duration::from_secs(10));
    }

    #[test]
    fn deadline_defaults_are_adaptive_and_the_new_keys_are_checked() {
        let c = Config::default();
        assert_eq!(c.deadline.min_start_budget, None, "unset = adaptive");
        assert_eq!(c.deadline.reply_margin, Duration::from_millis(20));
        assert!(c.deadline.predict);
        assert_eq!(c.queue_order, QueueOrder::Edf);
        assert_eq!(c.deadline.overtake_share_pct, 50);
        assert_eq!(c.estimator, EstimatorConfig::default());
        let v = c.capabilities();
        assert_eq!(v["deadline"]["start_budget"], "adaptive");
        assert_eq!(v["deadline"]["reply_margin_ms"], 20);
        assert_eq!(v["queue_order"], "edf");
        assert_eq!(v["deadline"]["overtake_share_pct"], 50);
        assert_eq!(v["estimator"]["initial_ms"], serde_json::Value::Null);
        assert_eq!(v["estimator"]["quantile"], 0.9);

        let c = Config::from_toml_str(
            "queue_order = \"fifo\"\n[deadline]\nmin_start_budget_ms = 0\nreply_margin_ms = 5\npredict = false\novertake_share_pct = 0\n[estimator]\ninitial_ms = 80\nwindow = 32\nhalf_life = 8\nquantile = 0.95",
        )
        .expect("valid");
        assert_eq!(
            c.deadline.min_start_budget,
            Some(Duration::ZERO),
            "set = fixed"
        );
        assert_eq!(c.capabilities()["deadline"]["start_budget"], "fixed");
        assert_eq!(c.deadline.reply_margin, Duration::from_millis(5));
        assert!(!c.deadline.predict);
        assert_eq!(c.queue_order, QueueOrder::Fifo);
        assert_eq!(c.deadline.overtake_share_pct, 0);
        assert_eq!(c.estimator.initial, Some(Duration::from_millis(80)));
        assert_eq!((c.estimator.window, c.estimator.half_life), (32, 8.0));

        assert_eq!(err("queue_order = \"lifo\"").key(), "queue_order");
        assert_eq!(
            err("[deadline]\novertake_share_pct = 95").key(),
            "deadline.overtake_share_pct"
        );
        assert_eq!(
            err("[deadline]\nmin_start_budget_ms = -1").key(),
            "deadline.min_start_budget_ms"
        );
        assert_eq!(
            err("[estimator]\nwindow = 8\nhalf_life = 16").key(),
            "estimator.half_life"
        );
        assert_eq!(
            err("[estimator]\nquantile = 1.5").key(),
            "estimator.quantile"
        );
        assert_eq!(err("[estimator]\nwindow = 0").key(), "estimator.window");
        assert_eq!(err("[estimator]\nseed_ms = 5").key(), "estimator.seed_ms");
    }

    #[test]
    fn session_cap_zero_means_unlimited() {
        let c = Config::from_toml_str("[session]\npending_cap = 0").expect("valid");
        assert_eq!(c.session.pending_cap, None);
    }

    #[test]
    fn capabilities_show_null_for_disabled_limits() {
        let c = Config::from_toml_str(
            "[session]\npending_cap = 0\n[deadline]\ndefault_ms = 0\n[idempotency]\nenabled = false",
        )
        .expect("valid");
        let v = c.capabilities();
        assert_eq!(v["session"]["pending_cap"], serde_json::Value::Null);
        assert_eq!(v["deadline"]["default_ms"], serde_json::Value::Null);
        assert_eq!(
            v["deadline"]["min_start_budget_ms"],
            serde_json::Value::Null
        );
        assert_eq!(v["idempotency"], serde_json::Value::Null);
        assert_eq!(v["limits"], serde_json::json!([]));
        let v = Config::default().capabilities();
        assert_eq!(v["session"]["pending_cap"], 5);
        assert_eq!(v["queue_capacity"], 256);
        assert_eq!(v["mode"], "enforce");
        assert_eq!(v["headers"]["request_id"], "Weir-Request-Id");
    }

    #[test]
    fn negative_fractional_and_non_numeric_caps_are_refused_with_the_key() {
        for bad in ["-1", "2.5", "\"five\"", "true"] {
            let e = err(&format!("[session]\npending_cap = {bad}"));
            assert_eq!(e.key(), "session.pending_cap", "{bad}");
            assert_eq!(e.kind(), ConfigErrorKind::InvalidValue);
            assert!(e.to_string().contains("0..=1000000"), "{e}");
        }
        let e = err("workers = 0");
        assert_eq!(e.key(), "workers");
        assert!(e.to_string().contains("1..=4096"), "{e}");
    }

    #[test]
    fn idempotency_max_bytes_defaults_to_64_mib_and_is_range_checked() {
        let c = Config::default();
        let i = c.idempotency.expect("enabled by default");
        assert_eq!(i.max_bytes.get(), 64 * 1024 * 1024);
        assert_eq!(
            c.capabilities()["idempotency"]["max_bytes"],
            64 * 1024 * 1024
        );
        let c = Config::from_toml_str("[idempotency]\nmax_bytes = 1048576").expect("valid");
        assert_eq!(c.idempotency.map(|i| i.max_bytes.get()), Some(1 << 20));
        for bad in ["0", "1023", "-1", "\"64MiB\"", "68719476737"] {
            let e = err(&format!("[idempotency]\nmax_bytes = {bad}"));
            assert_eq!(e.key(), "idempotency.max_bytes", "{bad}");
            assert!(e.to_string().contains("1024..=68719476736"), "{e}");
        }
    }

    #[test]
    fn subscription_capacity_follows_the_queue_and_the_expected_burst() {
        let c = Config::default();
        assert_eq!(c.nats.client.subscription_capacity, Some(256 + 65_536));
        let c = Config::from_toml_str("queue_capacity = 1000\n[nats]\nexpected_burst = 20000")
            .expect("valid");
        assert_eq!(c.nats.client.subscription_capacity, Some(21_000));
        let c = Config::from_toml_str("[nats]\nsubscription_capacity = 300").expect("valid");
        assert_eq!(c.nats.client.subscription_capacity, Some(300));
        let e = err("queue_capacity = 512\n[nats]\nsubscription_capacity = 500");
        assert_eq!(e.key(), "nats.subscription_capacity");
        assert!(
            e.to_string().contains("smaller than queue_capacity (512)"),
            "{e}"
        );
        let e = err("[nats]\nexpected_burst = -1");
        assert_eq!(e.key(), "nats.expected_burst");
    }

    #[test]
    fn unknown_keys_are_refused_with_their_path() {
        let e = err("queue_capacty = 5");
        assert_eq!(
            (e.key(), e.kind()),
            ("queue_capacty", ConfigErrorKind::UnknownKey)
        );
        let e = err("[session]\npending = 5");
        assert_eq!(e.key(), "session.pending");
        let e = err("[[limits]]\nkey = \"client\"\nlimit = 2\nmax_wait = 5");
        assert_eq!(e.key(), "limits[0].max_wait");
    }

    #[test]
    fn list_keys_comes_from_the_parser_with_defaults_and_ranges() {
        let keys = list_keys();
        let get = |k: &str| {
            keys.iter()
                .find(|d| d.key == k)
                .unwrap_or_else(|| panic!("{k} listed"))
        };
        assert_eq!(get("stream.window").default, "16");
        assert_eq!(
            get("stream.window").allowed,
            "0..=100000 (0 = no acknowledgements)"
        );
        assert_eq!(get("stream.ack_timeout_ms").default, "1000");
        assert_eq!(get("stream.chunk_interval_ms").default, "20");
        assert_eq!(get("backend.openai.tls_ca_file").default, "none");
        assert_eq!(
            get("backend.openai.base_url").default,
            "\"http://127.0.0.1:8000\""
        );
        assert_eq!(get("backend.sim.first_token_ms").default, "20");
        assert_eq!(get("service.status_subject").default, "\"llm.status\"");
        assert_eq!(get("workers").allowed, "1..=4096");
        let mut names: Vec<&str> = keys.iter().map(|k| k.key.as_str()).collect();
        let n = names.len();
        names.dedup();
        assert_eq!(names.len(), n, "each key once");
        assert!(n > 60, "{n} keys");
        // Not recording outside list_keys.
        let _ = Config::default();
        assert_eq!(list_keys().len(), n);
    }

    #[test]
    fn limits_parse_with_defaults_and_validation() {
        let c = Config::from_toml_str(
            r#"
            [[limits]]
            key = "client"
            limit = 2
            [[limits]]
            name = "model"
            key = "body:/model"
            limit = 4
            on_busy = "reject"
            "#,
        )
        .expect("valid");
        assert_eq!(c.limits.len(), 2);
        assert_eq!(c.limits[0].name, "client");
        assert_eq!(
            c.limits[0].on_busy,
            OnBusy::Wait {
                max_wait: Duration::from_secs(1),
                max_waiters: 100
            }
        );
        assert_eq!(c.limits[1].key, KeySource::Body("/model".into()));
        assert_eq!(c.limits[1].on_busy, OnBusy::Reject);

        let e = err("[[limits]]\nkey = \"client\"");
        assert_eq!(e.key(), "limits[0].limit");
        let e = err("[[limits]]\nkey = \"header\"\nlimit = 1");
        assert_eq!(e.key(), "limits[0].key");
        let e = err("[[limits]]\nkey = \"client\"\nlimit = 1\nmax_wait_ms = -3");
        assert_eq!(e.key(), "limits[0].max_wait_ms");
        let e =
            err("[[limits]]\nkey = \"client\"\nlimit = 1\n[[limits]]\nkey = \"client\"\nlimit = 2");
        assert_eq!(e.key(), "limits[1].name");
    }

    #[test]
    fn intake_defaults_to_core_and_jetstream_keys_are_checked_with_their_names() {
        assert_eq!(Config::default().intake, Intake::Core);
        let c = Config::from_toml_str("intake = \"jetstream\"\nworkers = 3").expect("valid");
        let j = c.intake.jetstream().expect("jetstream");
        assert_eq!(j.stream, "WEIR_LLM_INTAKE");
        assert_eq!(j.subject, "llm.intake");
        assert_eq!(j.consumer, "weir-llm");
        assert_eq!(j.ack_wait, Duration::from_secs(10));
        assert_eq!(j.progress_interval, Duration::from_millis(3333));
        assert_eq!(j.max_ack_pending.get(), 3, "defaults to workers");
        assert!(j.forward && j.file_storage);
        assert_eq!(c.capabilities()["intake"]["kind"], "jetstream");
        assert_eq!(Config::default().capabilities()["intake"]["kind"], "core");
        for (text, key) in [
            ("intake = \"kafka\"", "intake"),
            (
                "[jetstream]\nack_wait_ms = 1000\nprogress_interval_ms = 1000",
                "jetstream.progress_interval_ms",
            ),
            (
                "workers = 4\n[jetstream]\nmax_ack_pending = 2",
                "jetstream.max_ack_pending",
            ),
            ("[jetstream]\nstream = \"a.b\"", "jetstream.stream"),
            ("[jetstream]\nconsumer = \"\"", "jetstream.consumer"),
            ("[jetstream]\nsubject = \"llm.*\"", "jetstream.subject"),
            ("[jetstream]\nstorage = \"disk\"", "jetstream.storage"),
            ("[jetstream]\nack_wait_ms = 5", "jetstream.ack_wait_ms"),
            (
                "[jetstream]\nsession_bucket = \"x y\"",
                "jetstream.session_bucket",
            ),
            (
                "[jetstream]\nreply_bucket = \"weir_llm_sessions\"",
                "jetstream.reply_bucket",
            ),
            ("[jetstream]\nmax_deliver = 0", "jetstream.max_deliver"),
            ("[jetstream]\nwat = 1", "jetstream.wat"),
        ] {
            let e = Config::from_toml_str(text).expect_err(text);
            assert_eq!(e.key(), key, "{text}: {e}");
        }
    }

    #[test]
    fn backend_and_service_values_are_checked() {
        assert_eq!(err("[backend]\nkind = \"gpu\"").key(), "backend.kind");
        assert_eq!(
            err("[backend]\nkind = \"nats\"").key(),
            "backend.nats.subject"
        );
        assert_eq!(
            err("[backend]\nkind = \"openai\"\n[backend.openai]\nbase_url = \"ftp://x\"").key(),
            "backend.openai.base_url"
        );
        assert_eq!(
            err("[backend.openai]\nbase_url = \"https://\"").key(),
            "backend.openai.base_url"
        );
        assert_eq!(
            err("[backend.openai]\nbase_url = \"https://x\"\ntls_cert_file = \"c.pem\"").key(),
            "backend.openai.tls_key_file"
        );
        assert_eq!(
            err("[backend.openai]\nbase_url = \"http://x\"\ntls_ca_file = \"ca.pem\"").key(),
            "backend.openai.tls_ca_file"
        );
        let c = Config::from_toml_str(
            "[backend]\nkind = \"openai\"\n[backend.openai]\nbase_url = \"https://api.example.com/\"\ntls_ca_file = \"ca.pem\"",
        )
        .expect("https accepted");
        let BackendKind::OpenAi(o) = &c.backend.kind else {
            panic!("openai expected");
        };
        assert_eq!(o.base_url, "https://api.example.com");
        assert_eq!(
            o.tls_ca_file.as_deref(),
            Some(std::path::Path::new("ca.pem"))
        );
        assert_eq!(
            err("[backend.sim]\nerror_rate = 1.5").key(),
            "backend.sim.error_rate"
        );
        assert_eq!(
            err("[service]\nsubject = \"a..b\"").key(),
            "service.subject"
        );
        assert_eq!(err("[service]\nversion = \"1.0\"").key(), "service.version");
        assert_eq!(err("[service]\nname = \"a b\"").key(), "service.name");
        assert_eq!(err("[admin]\nlisten = \"localhost\"").key(), "admin.listen");
        assert_eq!(
            err("[admin]\nmax_connections = 0").key(),
            "admin.max_connections"
        );
        assert_eq!(
            err("[admin]\nheader_timeout_ms = 5").key(),
            "admin.header_timeout_ms"
        );
        assert_eq!(
            err("[deadline]\ndefault_ms = 10\nmax_ms = 5").key(),
            "deadline.default_ms"
        );
        assert_eq!(err("[trace]\nsubject = \"ev.*\"").key(), "trace.subject");
        assert_eq!(err("mode = \"loud\"").key(), "mode");
        assert_eq!(err("[nats]\nuser = \"u\"").key(), "nats.password");
        assert_eq!(err("workers = [").kind(), ConfigErrorKind::Syntax);
    }

    #[test]
    fn env_overrides_are_typed_and_nested() {
        let mut t: Table = toml::from_str("workers = 2").expect("toml");
        apply_env(
            &mut t,
            [
                ("WEIR_LLM_WORKERS".to_string(), "3".to_string()),
                ("WEIR_LLM_SESSION__PENDING_CAP".to_string(), "0".to_string()),
                (
                    "WEIR_LLM_BACKEND__SIM__ERROR_RATE".to_string(),
                    "0.25".to_string(),
                ),
                ("WEIR_LLM_MODE".to_string(), "shadow".to_string()),
                ("WEIR_LLM_NATS_URL".to_string(), "nats://x".to_string()),
                ("OTHER".to_string(), "1".to_string()),
            ],
            &["WEIR_LLM_NATS_URL"],
        )
        .expect("applies");
        let c = Config::from_table(&t).expect("valid");
        assert_eq!(c.workers.get(), 3);
        assert_eq!(c.session.pending_cap, None);
        assert_eq!(c.mode, Mode::Shadow);
        match c.backend.kind {
            BackendKind::Sim(s) => assert_eq!(s.error_rate, 0.25),
            other => panic!("unexpected {other:?}"),
        }

        let mut t = Table::new();
        apply_env(
            &mut t,
            [("WEIR_LLM_SESSION__PENDING_CAP".into(), "-2".into())],
            &[],
        )
        .expect("applies");
        assert_eq!(
            Config::from_table(&t).expect_err("refused").key(),
            "session.pending_cap"
        );
        let mut t = Table::new();
        let e = apply_env(&mut t, [("WEIR_LLM_LIMITS__0".into(), "1".into())], &[])
            .expect_err("refused");
        assert_eq!(e.key(), "WEIR_LLM_LIMITS__0");
    }
}
