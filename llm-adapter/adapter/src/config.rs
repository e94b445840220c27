//! Configuration: defaults < a TOML file < `WEIR_LLM_*` environment variables <
//! command-line flags, merged by the loader every weir service shares
//! (`weir_service::config`) into the private `RawConfig` (serde,
//! `deny_unknown_fields`), then validated once into a [`Config`].
//!
//! Each default is written once, in `RawConfig::default` (from the typed defaults where
//! they exist: [`SimConfig`], [`EstimatorConfig`], `RequestLimits`); each range once, in
//! [`SECTIONS`], which `validate` reads the bounds from. [`key_table`] (`--list-keys`,
//! and the tables of docs/llm-adapter.md, which a test keeps equal) is generated from
//! both. A key whose default follows another (`stream.ack_timeout_ms`,
//! `nats.subscription_capacity`, ...) is an `Option` unset by default and resolved in
//! `validate`; its meaning states the rule.
//!
//! Invariants:
//! - every error names the full key (`session.pending_cap`, `limits[1].max_wait_ms`),
//!   where a value not a default came from, and the allowed range; unknown keys are
//!   errors whichever layer set them, never ignored (a typo must not silently leave a
//!   limit disabled);
//! - numbers are whole, non-negative and inside their range: `-1`, `2.5`, `"five"` and
//!   `true` are refused for an integer key; a text value (environment, `--set`) takes
//!   the type of the key (`WEIR_LLM_NATS__TOKEN=123456` is a string);
//! - a [`Config`] built by [`Config::load`] / [`Config::from_toml_str`] satisfies every
//!   range. Its fields are public for reading and for programmatic tweaks in tests; the
//!   numeric types (`NonZeroUsize`, `Duration`, enums) keep such tweaks valid.
//!
//! `0` means "unlimited"/"disabled" only where the reference says so
//! (`session.pending_cap`, `deadline.default_ms`, `idempotency.window_ms`).

use std::collections::BTreeSet;
use std::fmt;
use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::millis::whole_ms as ms;
use serde::{Deserialize, Serialize};
use weir_service::admin::RequestLimits;
use weir_service::config::keys::{self, KeyDoc, Section};
use weir_service::config::{Layers, LoadError, LoadErrorKind, Origin};

pub use crate::admission::{AdmissionConfig, EstimatorConfig};

/// Prefix of environment overrides: `WEIR_LLM_QUEUE_CAPACITY=64`,
/// `WEIR_LLM_SESSION__PENDING_CAP=5` (`__` separates sections). A variable under it
/// that is not a key is refused, except those in [`ENV_NOT_KEYS`].
pub const ENV_PREFIX: &str = "WEIR_LLM_";

/// Variables under [`ENV_PREFIX`] that are not configuration keys: those of the
/// command-line flags (`WEIR_LLM_CONFIG`, `WEIR_LLM_NATS_URL`, ...).
pub const ENV_NOT_KEYS: &[&str] = &["CONFIG", "NATS_URL", "ADMIN", "THREADS", "LOG_FORMAT"];

/// Longest accepted limit name, subject or service name.
const MAX_NAME_LEN: usize = 128;

/// Most `[[limits]]` entries.
const MAX_LIMITS: usize = 16;

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
#[derive(strum::IntoStaticStr, strum::Display, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Refuse what the limits refuse. The default.
    #[default]
    Enforce,
    /// Count `would_reject` for the session cap, per-key limits and the session
    /// `reject` policy, and admit anyway. The global queue bound and deadlines stay
    /// enforced.
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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
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

impl Default for SimConfig {
    /// The defaults of `[backend.sim]`.
    fn default() -> Self {
        valid_default(RawSim::default().validate())
    }
}

/// A configuration built from the defaults. They are inside their ranges; a test pins
/// this.
fn valid_default<T>(built: Result<T, ConfigError>) -> T {
    match built {
        Ok(c) => c,
        Err(e) => unreachable!("the default configuration is invalid: {e}"),
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

/// The validated configuration: the admission core's part (`config.admission.workers`,
/// `config.admission.deadline`, ...) and the edges around it.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Workers, queue, mode, session, limits, deadlines, order, estimator,
    /// idempotency, shutdown grace, `backend.timeout` and the streams' coalescing.
    pub admission: AdmissionConfig,
    /// Backend.
    pub backend: BackendConfig,
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

/// Where configuration comes from, lowest precedence first.
#[derive(Debug, Clone, Default)]
pub struct ConfigSources {
    /// A TOML file.
    pub file: Option<PathBuf>,
    /// Environment variables (pass `std::env::vars()`); only `WEIR_LLM_*` are read.
    pub env: Vec<(String, String)>,
    /// `key=value` overrides from the command line (dotted keys), applied last in order.
    pub overrides: Vec<(String, String)>,
}

impl Default for Config {
    /// The documented defaults (an empty file).
    fn default() -> Self {
        valid_default(RawConfig::default().validate())
    }
}

impl Config {
    /// Loads and validates the configuration from `sources`. A refusal names the key,
    /// where its value came from and the allowed values.
    pub fn load(sources: &ConfigSources) -> Result<Self, ConfigError> {
        let mut layers = layers();
        if let Some(path) = &sources.file {
            layers.file(path).map_err(from_load)?;
        }
        layers.env(ENV_PREFIX, sources.env.iter().cloned(), ENV_NOT_KEYS);
        for (key, value) in &sources.overrides {
            layers.set_text(key, value, Origin::CommandLine);
        }
        Self::build(&layers)
    }

    /// Parses and validates TOML text (every key optional).
    pub fn from_toml_str(text: &str) -> Result<Self, ConfigError> {
        let table: toml::Table = text.parse().map_err(|e: toml::de::Error| ConfigError {
            key: "<toml>".into(),
            kind: ConfigErrorKind::Syntax,
            message: e.to_string(),
        })?;
        let mut layers = layers();
        layers.table(&table, &Origin::File("<toml>".into()));
        Self::build(&layers)
    }

    fn build(layers: &Layers) -> Result<Self, ConfigError> {
        let raw: RawConfig = layers.build().map_err(from_load)?;
        raw.validate().map_err(|e| match layers.origin(&e.key) {
            Origin::Default => e,
            origin => ConfigError {
                message: format!("{} (from {origin})", e.message),
                ..e
            },
        })
    }
}

/// The loader over `RawConfig`: its defaults, and a schema with every optional key and
/// one `[[limits]]` element (for the key table, typing and "did you mean").
fn layers() -> Layers {
    let schema = RawConfig {
        limits: vec![RawLimit::default()],
        deadline: RawDeadline {
            min_start_budget_ms: Some(0),
            ..RawDeadline::default()
        },
        backend: RawBackend {
            sim: RawSim {
                min_ms: Some(0),
                max_ms: Some(0),
                p99_ms: Some(0),
                ..RawSim::default()
            },
            ..RawBackend::default()
        },
        nats: RawNats {
            subscription_capacity: Some(0),
            ..RawNats::default()
        },
        stream: RawStream {
            ack_timeout_ms: Some(0),
            ..RawStream::default()
        },
        jetstream: RawJetStream {
            progress_interval_ms: Some(0),
            max_ack_pending: Some(0),
            ..RawJetStream::default()
        },
        ..RawConfig::default()
    };
    Layers::new(&RawConfig::default()).with_schema(&schema)
}

/// The loader's refusal in this crate's terms, with the allowed values of the key.
fn from_load(e: LoadError) -> ConfigError {
    let kind = match e.kind() {
        LoadErrorKind::UnknownKey => ConfigErrorKind::UnknownKey,
        LoadErrorKind::File => ConfigErrorKind::Syntax,
        LoadErrorKind::WrongType | LoadErrorKind::InvalidValue => ConfigErrorKind::InvalidValue,
    };
    let message = match (kind, e.origin()) {
        (ConfigErrorKind::Syntax, _) => e.message().to_owned(),
        (ConfigErrorKind::UnknownKey, origin) => format!(
            "{} (from {origin}; see `llm-adapter serve --list-keys`)",
            e.message()
        ),
        (_, origin) => match documented(e.key())
            .map(|d| d.range)
            .filter(|r| !r.is_empty())
        {
            Some(range) => format!("{} (from {origin}); allowed: {range}", e.message()),
            None => format!("{} (from {origin})", e.message()),
        },
    };
    ConfigError {
        key: e.key().to_owned(),
        kind,
        message,
    }
}

/// The documentation of `key` (`limits[2].limit` is `limits[].limit`).
fn documented(key: &str) -> Option<&'static KeyDoc> {
    let name = match key.strip_prefix("limits[").and_then(|r| r.split_once("].")) {
        Some((_, field)) => format!("limits[].{field}"),
        None => key.to_owned(),
    };
    SECTIONS
        .iter()
        .flat_map(|s| s.keys)
        .find(|d| d.name == name)
}

/// The bounds `a..=b` a range text starts with.
fn bounds<T: std::str::FromStr>(range: &str) -> Option<(T, T)> {
    let text = range.split([' ', ';']).next()?;
    let (low, high) = text.split_once("..=")?;
    Some((low.parse().ok()?, high.parse().ok()?))
}

/// `v` of `key` inside the range [`SECTIONS`] documents for it (`what` it is).
fn in_range<T>(key: &str, v: T, what: &str) -> Result<T, ConfigError>
where
    T: std::str::FromStr + PartialOrd + Copy + fmt::Display,
{
    let range = documented(key).map_or("", |d| d.range);
    match bounds::<T>(range) {
        Some((low, high)) if (low..=high).contains(&v) => Ok(v),
        _ => Err(ConfigError::invalid(
            key,
            format!("expected {what} in {range}, got {v}"),
        )),
    }
}

/// [`in_range`] for an integer key.
fn int(key: &str, v: u64) -> Result<u64, ConfigError> {
    in_range(key, v, "a whole number")
}

/// [`int`] as a count that is not zero.
fn count(key: &str, v: u64) -> Result<NonZeroUsize, ConfigError> {
    let v = usize::try_from(int(key, v)?).unwrap_or(usize::MAX);
    NonZeroUsize::new(v)
        .ok_or_else(|| ConfigError::invalid(key, "expected a whole number above 0, got 0"))
}

/// [`int`] as milliseconds.
fn millis(key: &str, v: u64) -> Result<Duration, ConfigError> {
    int(key, v).map(Duration::from_millis)
}

/// [`int`] as a `usize`.
fn size(key: &str, v: u64) -> Result<usize, ConfigError> {
    int(key, v).map(|v| usize::try_from(v).unwrap_or(usize::MAX))
}

/// [`in_range`] for a decimal key.
fn decimal(key: &str, v: f64) -> Result<f64, ConfigError> {
    in_range(key, v, "a number")
}

/// `Some(text)` unless empty (an empty string is "unset" for the optional keys).
fn set(text: &str) -> Option<String> {
    (!text.is_empty()).then(|| text.to_owned())
}

/// Every key with its type, default, range and meaning: aligned text for
/// `--list-keys`, or the Markdown tables of docs/llm-adapter.md (each between its
/// `<!-- keys:NAME -->` markers) for `--list-keys --markdown`.
pub fn key_table(markdown: bool) -> String {
    keys::table(&layers(), SECTIONS, markdown)
}

impl Config {
    /// The capabilities document: every limit (`null` when disabled), the subjects and
    /// the header names. Served on the capabilities subject and `/v1/capabilities`.
    pub fn capabilities(&self) -> serde_json::Value {
        use serde_json::json;
        use weir_protocol::llm::headers as h;
        let limits: Vec<serde_json::Value> = self
            .admission
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
                "chunk_interval_ms": ms(self.admission.stream.interval),
                "chunk_max_bytes": self.admission.stream.max_bytes,
                "window": self.stream.window,
                "ack_timeout_ms": ms(self.stream.ack_timeout),
            },
            "mode": self.admission.mode,
            "workers": self.admission.workers.get(),
            "queue_capacity": self.admission.queue_capacity.get(),
            "session": {
                "pending_cap": self.admission.session.pending_cap.map(NonZeroUsize::get),
                "ordering": self.admission.session.ordering,
            },
            "limits": limits,
            "deadline": {
                "default_ms": self.admission.deadline.default.map(ms),
                "max_ms": ms(self.admission.deadline.max),
                "min_start_budget_ms": self.admission.deadline.min_start_budget.map(ms),
                "start_budget": if self.admission.deadline.min_start_budget.is_some() { "fixed" } else { "adaptive" },
                "reply_margin_ms": ms(self.admission.deadline.reply_margin),
                "predict": self.admission.deadline.predict,
                "overtake_share_pct": self.admission.deadline.overtake_share_pct,
            },
            "queue_order": self.admission.queue_order,
            "estimator": {
                "initial_ms": self.admission.estimator.initial.map(ms),
                "window": self.admission.estimator.window,
                "half_life": self.admission.estimator.half_life,
                "quantile": self.admission.estimator.quantile,
            },
            "idempotency": self.admission.idempotency.map(|i| json!({
                "window_ms": ms(i.window),
                "max_entries": i.max_entries.get(),
                "max_bytes": i.max_bytes.get(),
            })),
            "backend": {
                "kind": self.backend.kind.name(),
                "timeout_ms": ms(self.backend.timeout),
            },
            "shutdown_grace_ms": ms(self.admission.shutdown_grace),
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

/// `intake`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum IntakeKind {
    #[default]
    Core,
    #[serde(rename = "jetstream")]
    JetStream,
}

/// `backend.kind`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum BackendName {
    #[default]
    Sim,
    #[serde(rename = "openai")]
    OpenAi,
    Nats,
}

/// `backend.sim.distribution`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Distribution {
    #[default]
    Fixed,
    Uniform,
    #[serde(rename = "lognormal")]
    LogNormal,
}

/// `limits[].on_busy`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum OnBusyKind {
    #[default]
    Wait,
    Reject,
}

/// `jetstream.storage`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Storage {
    #[default]
    File,
    Memory,
}

/// One section of the raw configuration, written once: the serde struct
/// (`deny_unknown_fields`, every field defaulted), its `Default`, and the key
/// documentation `$docs` (the docs' section `$section`: range and meaning), one entry per key:
/// `field: type = default, "range", "meaning";`. `nested` fields are sections (their
/// own `raw_section!`), not keys.
macro_rules! raw_section {
    (
        $(#[$meta:meta])*
        $name:ident, $docs:ident, $section:literal, $prefix:literal {
            $($field:ident: $ty:ty = $default:expr, $range:literal, $help:literal;)*
        }
        $(nested { $($sub:ident: $sub_ty:ty),* $(,)? })?
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        #[serde(deny_unknown_fields, default)]
        struct $name {
            $($field: $ty,)*
            $($($sub: $sub_ty,)*)?
        }

        impl Default for $name {
            fn default() -> Self {
                Self {
                    $($field: $default,)*
                    $($($sub: Default::default(),)*)?
                }
            }
        }

        const $docs: Section = Section {
            name: $section,
            keys: &[$(KeyDoc {
                name: concat!($prefix, stringify!($field)),
                range: $range,
                help: $help,
            }),*],
        };
    };
}

raw_section! {
    /// The configuration as written: the top-level keys and the sections.
    RawConfig, GENERAL, "general", "" {
        workers: u64 = 8, "1..=4096",
            "fixed number of workers (concurrent backend calls); match the backend's parallel \
            slots";
        queue_capacity: u64 = 256, "1..=1000000",
            "most requests admitted but not yet started, over all sessions and keys";
        mode: Mode = Mode::default(), "`enforce`, `shadow`",
            "`shadow`: count `would_reject` for the session cap, per-key limits and the session \
            `reject` policy, and admit anyway (the queue bound and deadlines stay enforced)";
        shutdown_grace_ms: u64 = 10_000, "0..=3600000",
            "grace period for running requests at shutdown";
        queue_order: QueueOrder = QueueOrder::default(), "`edf`, `fifo`",
            "the order in which workers take ready requests: `edf` (earliest deadline first within \
            a bound; no deadline = due at `deadline.max_ms`) or `fifo`; see \
            [fairness](#fairness-under-mixed-deadlines)";
        intake: IntakeKind = IntakeKind::default(), "`core`, `jetstream`",
            "core request/reply on `service.subject`, or the durable JetStream intake \
            (`[jetstream]`)";
    }
    nested {
        session: RawSession, deadline: RawDeadline, estimator: RawEstimator,
        idempotency: RawIdempotency, limits: Vec<RawLimit>, backend: RawBackend, nats: RawNats,
        service: RawService, admin: RawAdmin, trace: RawTrace, stream: RawStream,
        jetstream: RawJetStream,
    }
}

raw_section! {
    RawSession, SESSION, "session", "session." {
        pending_cap: u64 = 5, "0..=1000000 (0 = unlimited)",
            "most accepted-but-unsettled requests per session";
        ordering: bool = true, "", "one running request per session, the rest FIFO";
    }
}

raw_section! {
    RawDeadline, DEADLINE, "deadline", "deadline." {
        max_ms: u64 = 120_000, "1..=86400000",
            "longest budget accepted; longer ones are shortened to this";
        default_ms: u64 = 30_000, "0..=86400000 (0 = no default); at most `deadline.max_ms`",
            "budget of requests that carry no deadline";
        min_start_budget_ms: Option<u64> = None, "0..=3600000 (unset = adaptive)",
            "unset = **adaptive**: the service-time estimate is the start budget, and a queued \
            request is answered `deadline_exceeded` once less than it is left; set = a fixed start \
            budget (0 = start anything with budget left)";
        reply_margin_ms: u64 = 20, "0..=60000",
            "time kept for the answer to reach the caller: decisions and aborts happen by `deadline \
            − reply_margin_ms`";
        predict: bool = true, "",
            "refuse at admission a request predicted not to finish before its deadline";
        overtake_share_pct: u64 = 50, "0..=90",
            "under `queue_order = \"edf\"`: the largest share of a request's slack kept for \
            requests with earlier deadlines (the share applied is that of recent requests with at \
            most half its budget, up to this; one budget class alone keeps none). 0 = EDF with \
            protected slack only. See [fairness](#fairness-under-mixed-deadlines)";
    }
}

raw_section! {
    RawEstimator, ESTIMATOR, "estimator", "estimator." {
        initial_ms: u64 = EstimatorConfig::default().initial.map_or(0, ms),
            "0..=3600000 (0 = no estimate before the first call)",
            "the estimate before the first call finishes (nothing is refused on a prediction until \
            the backend was measured when 0)";
        window: u64 = EstimatorConfig::default().window as u64, "1..=4096", "samples kept";
        half_life: u64 = EstimatorConfig::default().half_life as u64,
            "1..=4096; at most `estimator.window`",
            "age (in samples) at which a sample weighs half as much as the newest";
        quantile: f64 = EstimatorConfig::default().quantile, "0.5..=0.999",
            "the quantile of the weighted window taken as the estimate";
    }
}

raw_section! {
    RawIdempotency, IDEMPOTENCY, "idempotency", "idempotency." {
        enabled: bool = true, "", "answer a retry with the same request id from the cache";
        window_ms: u64 = 60_000, "0..=86400000 (0 = no cache after completion)",
            "how long a successful reply is kept for retries (0 = join only while queued/running)";
        max_entries: u64 = 10_000, "1..=10000000",
            "most cached replies; the oldest is evicted first";
        max_bytes: u64 = 64 << 20, "1024..=68719476736",
            "bytes held by cached replies (body + headers + key + 256 B per entry), oldest evicted; \
            a reply larger than this is not cached. See [Memory](#memory)";
    }
}

raw_section! {
    /// One `[[limits]]` entry. Every field has a default (the loader tries an element's
/// value alone to name a refused one); `key` and `limit` are required by `validate`.
    RawLimit, LIMITS, "limits", "limits[]." {
        key: String = String::new(),
            "`client`, `session`, `service`, `body:/json/pointer` (required)",
            "where the key comes from: the `Weir-Client-Key` header, the session id, one key for \
            the service, or a JSON pointer into the body";
        name: String = String::new(), "1..=128 visible ASCII characters, unique",
            "name in metrics, traces and the limits view; default: the `key` text";
        limit: u64 = 0, "1..=1000000 (required)", "most requests holding a slot of one key";
        on_busy: OnBusyKind = OnBusyKind::default(), "`wait`, `reject`",
            "when all slots of a key are taken: wait in FIFO order, or refuse at once";
        max_wait_ms: u64 = 1_000, "1..=3600000",
            "`wait`: longest wait for a slot, then `concurrency_limit_exceeded`";
        max_waiters: u64 = 100, "0..=1000000",
            "`wait`: most requests waiting per key; one more is refused at once";
    }
}

raw_section! {
    RawBackend, BACKEND, "backend", "backend." {
        timeout_ms: u64 = 60_000, "1..=3600000",
            "the backend's own per-call timeout (used when shorter than the deadline)";
        kind: BackendName = BackendName::default(), "`sim`, `openai`, `nats`",
            "which backend serves inference; every `[backend.*]` section present is validated \
            whichever is selected";
    }
    nested { sim: RawSim, openai: RawOpenAi, nats: RawBackendNats }
}

raw_section! {
    RawSim, SIM, "sim", "backend.sim." {
        latency_ms: u64 = 20, "0..=3600000",
            "simulated latency (`fixed`), upper bound default (`uniform`), median (`lognormal`)";
        distribution: Distribution = Distribution::default(), "`fixed`, `uniform`, `lognormal`",
            "simulated latency distribution";
        min_ms: Option<u64> = None, "0..=3600000", "`uniform`: lower bound; default = 0";
        max_ms: Option<u64> = None, "0..=3600000; at least `backend.sim.min_ms`",
            "`uniform`: upper bound; default = the larger of `latency_ms` and `min_ms`";
        p99_ms: Option<u64> = None, "0..=3600000; at least `backend.sim.latency_ms`",
            "`lognormal`: 99th percentile; default = 3 × `latency_ms`";
        error_rate: f64 = 0.0, "0.0..=1.0",
            "share of calls that fail with a backend error";
        seed: u64 = 1, "0..=9223372036854775807",
            "random seed (latency and errors are reproducible)";
        first_token_ms: u64 = 20, "0..=3600000",
            "streamed replies: delay before the first token";
        tokens: u64 = 16, "1..=1000000",
            "streamed replies: tokens when the body has no `max_tokens`";
        tokens_per_second: f64 = 50.0, "0.001..=1000000",
            "streamed replies: tokens per second after the first";
    }
}

raw_section! {
    RawOpenAi, OPENAI, "openai", "backend.openai." {
        base_url: String = "http://127.0.0.1:8000".into(),
            "`http://host:port` or `https://host[:port]`",
            "the OpenAI-compatible server (vLLM, llama.cpp server, Ollama, a hosted endpoint); \
            HTTPS with rustls (the system roots plus `tls_ca_file`)";
        path: String = "/v1/chat/completions".into(), "starts with `/`",
            "path the body is POSTed to";
        api_key_env: String = String::new(), "",
            "name of the environment variable holding a bearer token";
        connect_timeout_ms: u64 = 2_000, "1..=600000", "TCP connect timeout";
        pool_max_idle_per_host: u64 = 64, "0..=100000", "idle pooled connections kept per host";
        pool_idle_timeout_ms: u64 = 90_000, "1..=3600000",
            "how long an idle pooled connection is kept";
        tls_ca_file: String = String::new(), "https only",
            "PEM file of CA certificates trusted beside the system roots (a private CA, a \
            self-signed server); unreadable or empty → exit 1 naming the key";
        tls_cert_file: String = String::new(), "https only; with `tls_key_file`",
            "PEM client certificate (chain)";
        tls_key_file: String = String::new(), "with `tls_cert_file`",
            "PEM private key of `tls_cert_file`";
    }
}

raw_section! {
    RawBackendNats, BACKEND_NATS, "backend_nats", "backend.nats." {
        subject: String = String::new(),
            "a NATS subject without wildcards; required when `kind = \"nats\"`",
            "subject of the existing service requests are forwarded to";
    }
}

raw_section! {
    RawNats, NATS, "nats", "nats." {
        url: String = weir_service::nats::DEFAULT_URL.into(),
            "`nats://`, `tls://`, `ws://` URLs, comma-separated",
            "NATS server(s); each URL parsed on its own (`--nats-url` too)";
        name: String = NATS_CLIENT_NAME.into(), "", "client name shown by the server";
        user: String = String::new(), "with `nats.password`; one authentication method",
            "user name (secrets show as `<redacted>` in `Debug` output and logs)";
        password: String = String::new(), "with `nats.user`", "password";
        token: String = String::new(), "one authentication method", "token";
        nkey: String = String::new(), "one authentication method", "NKey seed";
        creds_file: String = String::new(), "an existing file; one authentication method",
            "credentials file (JWT + NKey)";
        tls_required: bool = false, "", "require TLS";
        tls_ca_file: String = String::new(), "an existing file",
            "PEM CA certificates trusted for the server";
        tls_cert_file: String = String::new(), "an existing file; with `nats.tls_key_file`",
            "PEM client certificate";
        tls_key_file: String = String::new(), "an existing file; with `nats.tls_cert_file`",
            "PEM private key of the client certificate";
        inbox_prefix: String = weir_service::nats::DEFAULT_INBOX_PREFIX.into(),
            "1..=8 tokens of `A-Z a-z 0-9 _ -`, dot-separated, ≤ 128 bytes",
            "prefix of the adapter's inboxes (NATS-backend replies, streaming acknowledgements \
            `<prefix>.<nuid>.<stream id>`): the user's own, e.g. `_INBOX.llm-adapter` \
            (deploy/nats-server.conf)";
        connection_timeout_ms: u64 = 2_000, "1..=600000",
            "bound on connecting to one server (a reconnect that tries a hung node first waits this \
            long)";
        ping_interval_ms: u64 = 2_000, "100..=3600000",
            "a dead server is noticed after 2–3 pings: 4–6 s for a hung node; see \
            [operations.md](operations.md#ingress-and-adapter-on-a-cluster)";
        expected_burst: u64 = 65_536, "0..=1000000",
            "requests that may arrive at once beyond `queue_capacity`; sizes the subscription (see \
            [Bursts](#bursts))";
        subscription_capacity: Option<u64> = None, "16..=2000000; at least `queue_capacity`",
            "messages buffered per subscription; beyond it the NATS client drops (counted, no \
            answer); default = `queue_capacity` + `nats.expected_burst` (65792)";
        retry_initial_connect: bool = true, "",
            "start even when no server answers yet and keep trying: the adapter waits up to \
            `nats.connection_timeout_ms` for the first connection, then starts anyway (`/readyz` \
            503 until connected); `false`: exit 1 if the first connection fails";
        publish_timeout_ms: u64 = 1_000, "1..=600000", "bound on publishing one reply";
    }
}

raw_section! {
    RawService, SERVICE, "service", "service." {
        name: String = "weir-llm".into(), "1..=128 of `A-Z a-z 0-9 - _`", "NATS micro service name";
        version: String = env!("CARGO_PKG_VERSION").into(), "a semantic version like 1.2.3",
            "version advertised in `$SRV.INFO`";
        description: String = "weir bounded LLM adapter".into(), "",
            "description advertised in `$SRV.INFO`";
        queue_group: String = "q".into(), "1..=128 visible ASCII characters",
            "queue group shared by replicas";
        subject: String = "llm.infer".into(), "a NATS subject; the five subjects differ",
            "inference requests";
        cancel_subject: String = "llm.cancel".into(), "a NATS subject",
            "cancellation by request id";
        capabilities_subject: String = "llm.capabilities".into(), "a NATS subject",
            "capabilities (every limit, `null` when disabled)";
        limits_subject: String = "llm.limits".into(), "a NATS subject", "busiest keys";
        status_subject: String = "llm.status".into(), "a NATS subject",
            "where a request is, by request id";
    }
}

raw_section! {
    RawAdmin, ADMIN, "admin", "admin." {
        listen: String = "127.0.0.1:9091".into(),
            "an address like 127.0.0.1:9091 (port 0 = any free port)",
            "admin HTTP server";
        max_connections: u64 = 64, "1..=4096",
            "open admin connections; more get 503 + `Retry-After` (JSON) at once";
        header_timeout_ms: u64 = 5_000, "100..=600000",
            "bound on receiving a request head (at accept and between keep-alive requests)";
        idle_timeout_ms: u64 = 10_000, "100..=3600000",
            "a connection that moves no byte for this long is closed";
        request_timeout_ms: u64 = ms(RequestLimits::default().timeout), "100..=600000",
            "an admin request (probes included) still running after this is answered `503` \
            `timeout`";
        max_concurrent_requests: u64 = RequestLimits::default().max_concurrent.get() as u64,
            "1..=1024",
            "admin requests to `/metrics` and `/v1/*` running at once; one more is answered `503` \
            `overloaded` (`/healthz`, `/readyz` not counted)";
    }
}

raw_section! {
    RawTrace, TRACE, "trace", "trace." {
        log: bool = true, "",
            "per-request events as `tracing` DEBUG events (target `weir_llm_adapter::trace`) inside \
            the request's `llm_request` span (span events with the feature `otel`)";
        subject: String = String::new(), "a NATS subject without wildcards",
            "also publish them as JSON on this subject";
        buffer: u64 = 4096, "1..=1000000",
            "events buffered for the NATS publisher; overflow is counted and dropped";
    }
}

raw_section! {
    RawStream, STREAM, "stream", "stream." {
        chunk_interval_ms: u64 = 20, "0..=10000 (0 = no coalescing by time)",
            "after a `chunk`, the next waits this long unless `chunk_max_bytes` are pending; the \
            first bytes after a quiet period go at once";
        chunk_max_bytes: u64 = 4096, "1..=1048576",
            "pending bytes that go at once; a chunk is also capped at `max_payload` − 1 KiB";
        window: u64 = 16, "0..=100000 (0 = no acknowledgements)",
            "chunks a caller may leave unacknowledged (0 = callers do not acknowledge; only a gone \
            caller and a publish timeout abort)";
        ack_timeout_ms: Option<u64> = None, "1..=600000",
            "how long a full window waits for an acknowledgement before the stream is aborted \
            (`caller_stalled`); default = `nats.publish_timeout_ms`";
    }
}

raw_section! {
    RawJetStream, JETSTREAM, "jetstream", "jetstream." {
        stream: String = "WEIR_LLM_INTAKE".into(), "1..=128 of `A-Z a-z 0-9 - _`",
            "the work-queue stream (created if absent)";
        subject: String = "llm.intake".into(), "a NATS subject without wildcards",
            "the subject the stream captures; callers publish requests here";
        consumer: String = "weir-llm".into(), "1..=128 of `A-Z a-z 0-9 - _`",
            "the durable pull consumer every replica shares";
        ack_wait_ms: u64 = 10_000, "100..=3600000",
            "without `+ACK`/progress for this long, the request goes to another replica";
        progress_interval_ms: Option<u64> = None, "10..=1200000; below `jetstream.ack_wait_ms`",
            "progress for held requests, renewal of their session slots; default = `ack_wait_ms` / \
            3";
        max_ack_pending: Option<u64> = None, "1..=1000000; at least `workers`",
            "requests out at all replicas together (set the sum of `workers` over the replicas); \
            default = `workers`";
        max_deliver: u64 = 5, "1..=1000",
            "deliveries of one request before the server gives up on it";
        duplicate_window_ms: u64 = 120_000, "100..=86400000",
            "how long the stream remembers a `Nats-Msg-Id`";
        max_messages: u64 = 100_000, "1..=100000000", "requests the stream holds (discard new)";
        max_bytes: u64 = 1 << 30, "1024..=1099511627776", "most bytes the stream holds";
        replicas: u64 = 1, "1..=5", "stream (and bucket) replicas on a cluster";
        storage: Storage = Storage::default(), "`file`, `memory`", "stream storage";
        session_bucket: String = "weir_llm_sessions".into(), "1..=128 of `A-Z a-z 0-9 - _`",
            "KV bucket of the cluster-wide slots (session cap, limits); entries live `ack_wait_ms` \
            after their last renewal";
        reply_bucket: String = "weir_llm_replies".into(),
            "1..=128 of `A-Z a-z 0-9 - _`, not the session bucket; empty = not kept",
            "KV bucket where each intake answer is kept for `duplicate_window_ms` (a duplicate is \
            answered with it); `\"\"` = keep none (duplicates get `request_id_conflict`)";
        forward: bool = true, "",
            "a core request on `service.subject` is put into the stream (callers unchanged); \
            `false` = core requests are served in memory";
    }
}

/// The range and meaning of every key, by section, in the order shown. `validate`
/// reads each numeric range from here (the bounds a range text starts with).
pub const SECTIONS: &[Section] = &[
    GENERAL,
    SESSION,
    DEADLINE,
    ESTIMATOR,
    IDEMPOTENCY,
    LIMITS,
    BACKEND,
    SIM,
    OPENAI,
    BACKEND_NATS,
    NATS,
    SERVICE,
    ADMIN,
    TRACE,
    STREAM,
    JETSTREAM,
];

impl RawConfig {
    /// Validates every value into the typed settings; a refusal names the key.
    fn validate(self) -> Result<Config, ConfigError> {
        let workers = count("workers", self.workers)?;
        let queue_capacity = count("queue_capacity", self.queue_capacity)?;
        let nats = self.nats.validate(queue_capacity.get())?;
        let backend = self.backend.validate()?;
        Ok(Config {
            admission: AdmissionConfig {
                workers,
                queue_capacity,
                mode: self.mode,
                session: SessionConfig {
                    pending_cap: NonZeroUsize::new(size(
                        "session.pending_cap",
                        self.session.pending_cap,
                    )?),
                    ordering: self.session.ordering,
                },
                limits: self.limits()?,
                deadline: self.deadline.validate()?,
                queue_order: self.queue_order,
                estimator: self.estimator.validate()?,
                idempotency: self.idempotency.validate()?,
                backend_timeout: backend.timeout,
                shutdown_grace: millis("shutdown_grace_ms", self.shutdown_grace_ms)?,
                max_reply_bytes: usize::MAX,
                stream: crate::admission::StreamSettings {
                    interval: millis("stream.chunk_interval_ms", self.stream.chunk_interval_ms)?,
                    max_bytes: size("stream.chunk_max_bytes", self.stream.chunk_max_bytes)?,
                },
            },
            backend,
            service: self.service.validate()?,
            admin: self.admin.validate()?,
            trace: TraceConfig {
                log: self.trace.log,
                subject: set(&self.trace.subject)
                    .map(|s| subject("trace.subject", s, false))
                    .transpose()?,
                buffer: count("trace.buffer", self.trace.buffer)?,
            },
            stream: StreamConfig {
                window: size("stream.window", self.stream.window)?,
                ack_timeout: match self.stream.ack_timeout_ms {
                    Some(v) => millis("stream.ack_timeout_ms", v)?,
                    None => nats.publish_timeout,
                },
            },
            intake: match self.intake {
                IntakeKind::Core => {
                    self.jetstream.validate(workers)?;
                    Intake::Core
                }
                IntakeKind::JetStream => {
                    Intake::JetStream(Box::new(self.jetstream.validate(workers)?))
                }
            },
            nats,
        })
    }

    fn limits(&self) -> Result<Vec<KeyLimit>, ConfigError> {
        if self.limits.len() > MAX_LIMITS {
            return Err(ConfigError::invalid(
                "limits",
                format!("at most {MAX_LIMITS} limits"),
            ));
        }
        let mut names = BTreeSet::new();
        let mut out = Vec::with_capacity(self.limits.len());
        for (n, l) in self.limits.iter().enumerate() {
            let key_of = |field: &str| format!("limits[{n}].{field}");
            let key = KeySource::parse(&key_of("key"), &l.key)?;
            let name = set(&l.name).unwrap_or_else(|| key.describe());
            name_check(&key_of("name"), &name)?;
            if !names.insert(name.clone()) {
                return Err(ConfigError::invalid(
                    key_of("name"),
                    format!("duplicate limit name {name:?}"),
                ));
            }
            out.push(KeyLimit {
                name,
                key,
                limit: count(&key_of("limit"), l.limit)?,
                on_busy: match l.on_busy {
                    OnBusyKind::Reject => OnBusy::Reject,
                    OnBusyKind::Wait => OnBusy::Wait {
                        max_wait: millis(&key_of("max_wait_ms"), l.max_wait_ms)?,
                        max_waiters: size(&key_of("max_waiters"), l.max_waiters)?,
                    },
                },
            });
        }
        Ok(out)
    }
}

impl RawDeadline {
    fn validate(&self) -> Result<DeadlineConfig, ConfigError> {
        let max = millis("deadline.max_ms", self.max_ms)?;
        let default = int("deadline.default_ms", self.default_ms)?;
        if default > self.max_ms {
            return Err(ConfigError::invalid(
                "deadline.default_ms",
                format!("{default} is larger than deadline.max_ms ({})", self.max_ms),
            ));
        }
        Ok(DeadlineConfig {
            default: (default > 0).then(|| Duration::from_millis(default)),
            max,
            min_start_budget: self
                .min_start_budget_ms
                .map(|v| millis("deadline.min_start_budget_ms", v))
                .transpose()?,
            reply_margin: millis("deadline.reply_margin_ms", self.reply_margin_ms)?,
            predict: self.predict,
            overtake_share_pct: u8::try_from(int(
                "deadline.overtake_share_pct",
                self.overtake_share_pct,
            )?)
            .unwrap_or(90),
        })
    }
}

impl RawEstimator {
    fn validate(&self) -> Result<EstimatorConfig, ConfigError> {
        let initial = int("estimator.initial_ms", self.initial_ms)?;
        let window = size("estimator.window", self.window)?;
        let half_life = int("estimator.half_life", self.half_life)?;
        if half_life > self.window {
            return Err(ConfigError::invalid(
                "estimator.half_life",
                format!("{half_life} is larger than estimator.window ({window})"),
            ));
        }
        Ok(EstimatorConfig {
            initial: (initial > 0).then(|| Duration::from_millis(initial)),
            window,
            half_life: half_life as f64,
            quantile: decimal("estimator.quantile", self.quantile)?,
        })
    }
}

impl RawIdempotency {
    fn validate(&self) -> Result<Option<IdempotencyConfig>, ConfigError> {
        let cfg = IdempotencyConfig {
            window: millis("idempotency.window_ms", self.window_ms)?,
            max_entries: count("idempotency.max_entries", self.max_entries)?,
            max_bytes: count("idempotency.max_bytes", self.max_bytes)?,
        };
        Ok(self.enabled.then_some(cfg))
    }
}

impl RawBackend {
    /// Every backend section is validated, whichever is selected, so a file may keep
    /// several and switch with `kind` (e.g. `WEIR_LLM_BACKEND__KIND=openai`).
    fn validate(&self) -> Result<BackendConfig, ConfigError> {
        let timeout = millis("backend.timeout_ms", self.timeout_ms)?;
        let sim = self.sim.validate()?;
        let openai = self.openai.validate()?;
        let nats_subject = set(&self.nats.subject)
            .map(|s| subject("backend.nats.subject", s, false))
            .transpose()?;
        let kind = match self.kind {
            BackendName::Sim => BackendKind::Sim(sim),
            BackendName::OpenAi => BackendKind::OpenAi(openai),
            BackendName::Nats => BackendKind::Nats(NatsBackendConfig {
                subject: nats_subject.ok_or_else(|| {
                    ConfigError::invalid(
                        "backend.nats.subject",
                        "required when backend.kind = \"nats\"",
                    )
                })?,
            }),
        };
        Ok(BackendConfig { timeout, kind })
    }
}

impl RawSim {
    fn validate(&self) -> Result<SimConfig, ConfigError> {
        let latency = int("backend.sim.latency_ms", self.latency_ms)?;
        // A bound of another distribution would be ignored: refused instead.
        let unused = match self.distribution {
            Distribution::Fixed => vec![
                ("min_ms", self.min_ms),
                ("max_ms", self.max_ms),
                ("p99_ms", self.p99_ms),
            ],
            Distribution::Uniform => vec![("p99_ms", self.p99_ms)],
            Distribution::LogNormal => vec![("min_ms", self.min_ms), ("max_ms", self.max_ms)],
        };
        if let Some((key, _)) = unused.iter().find(|(_, v)| v.is_some()) {
            return Err(ConfigError::invalid(
                format!("backend.sim.{key}"),
                "set, but backend.sim.distribution does not use it",
            ));
        }
        let latency = match self.distribution {
            Distribution::Fixed => Latency::Fixed(Duration::from_millis(latency)),
            Distribution::Uniform => {
                let min = int("backend.sim.min_ms", self.min_ms.unwrap_or(0))?;
                let max = int(
                    "backend.sim.max_ms",
                    self.max_ms.unwrap_or(latency.max(min)),
                )?;
                if max < min {
                    return Err(ConfigError::invalid(
                        "backend.sim.max_ms",
                        format!("{max} is below min_ms {min}"),
                    ));
                }
                Latency::Uniform {
                    min: Duration::from_millis(min),
                    max: Duration::from_millis(max),
                }
            }
            Distribution::LogNormal => {
                let p99 = int(
                    "backend.sim.p99_ms",
                    self.p99_ms.unwrap_or(latency.saturating_mul(3)),
                )?;
                if p99 < latency {
                    return Err(ConfigError::invalid(
                        "backend.sim.p99_ms",
                        format!("{p99} is below the median latency_ms {latency}"),
                    ));
                }
                Latency::LogNormal {
                    median: Duration::from_millis(latency),
                    p99: Duration::from_millis(p99),
                }
            }
        };
        Ok(SimConfig {
            latency,
            error_rate: decimal("backend.sim.error_rate", self.error_rate)?,
            seed: int("backend.sim.seed", self.seed)?,
            stream: SimStream {
                first_token: millis("backend.sim.first_token_ms", self.first_token_ms)?,
                tokens: u32::try_from(int("backend.sim.tokens", self.tokens)?).unwrap_or(u32::MAX),
                tokens_per_second: decimal(
                    "backend.sim.tokens_per_second",
                    self.tokens_per_second,
                )?,
            },
        })
    }
}

impl RawOpenAi {
    fn validate(&self) -> Result<OpenAiConfig, ConfigError> {
        let base_url = &self.base_url;
        let host = base_url
            .strip_prefix("https://")
            .or_else(|| base_url.strip_prefix("http://"));
        if host.is_none_or(|h| h.trim_end_matches('/').is_empty()) {
            return Err(ConfigError::invalid(
                "backend.openai.base_url",
                format!("expected http://host:port or https://host[:port], got {base_url:?}"),
            ));
        }
        let tls_ca_file = set(&self.tls_ca_file).map(PathBuf::from);
        let tls_cert_file = set(&self.tls_cert_file).map(PathBuf::from);
        let tls_key_file = set(&self.tls_key_file).map(PathBuf::from);
        if tls_cert_file.is_some() != tls_key_file.is_some() {
            let missing = if tls_cert_file.is_some() {
                "backend.openai.tls_key_file"
            } else {
                "backend.openai.tls_cert_file"
            };
            return Err(ConfigError::invalid(
                missing,
                "tls_cert_file and tls_key_file go together",
            ));
        }
        if !base_url.starts_with("https://")
            && let Some(k) = [
                ("backend.openai.tls_ca_file", tls_ca_file.is_some()),
                ("backend.openai.tls_cert_file", tls_cert_file.is_some()),
            ]
            .into_iter()
            .find_map(|(k, set)| set.then_some(k))
        {
            return Err(ConfigError::invalid(
                k,
                "set, but base_url is not https:// (it would be ignored)",
            ));
        }
        if !self.path.starts_with('/') {
            return Err(ConfigError::invalid(
                "backend.openai.path",
                "must start with '/'",
            ));
        }
        Ok(OpenAiConfig {
            base_url: base_url.trim_end_matches('/').to_owned(),
            path: self.path.clone(),
            api_key_env: set(&self.api_key_env),
            connect_timeout: millis("backend.openai.connect_timeout_ms", self.connect_timeout_ms)?,
            pool_max_idle_per_host: size(
                "backend.openai.pool_max_idle_per_host",
                self.pool_max_idle_per_host,
            )?,
            pool_idle_timeout: millis(
                "backend.openai.pool_idle_timeout_ms",
                self.pool_idle_timeout_ms,
            )?,
            tls_ca_file,
            tls_cert_file,
            tls_key_file,
        })
    }
}

impl RawNats {
    fn validate<'a>(&'a self, queue_capacity: usize) -> Result<NatsConfig, ConfigError> {
        let base = weir_service::nats::NatsConfig {
            name: self.name.clone(),
            connection_timeout: millis("nats.connection_timeout_ms", self.connection_timeout_ms)?,
            ping_interval: millis("nats.ping_interval_ms", self.ping_interval_ms)?,
            subscription_capacity: Some(self.subscription_capacity(queue_capacity)?),
            retry_initial_connect: self.retry_initial_connect,
            // Replies are published through it, each bounded by `publish_timeout_ms`:
            // async-nats's own default.
            client_capacity: 2048,
            ..weir_service::nats::NatsConfig::named(NATS_CLIENT_NAME)
        };
        // An empty string is "unset".
        let text = |s: &'a String| (!s.is_empty()).then_some(s.as_str());
        let path = |s: &'a String| text(s).map(Path::new);
        let client = weir_service::nats::NatsInput {
            url: Some(self.url.as_str()),
            user: text(&self.user),
            password: text(&self.password),
            token: text(&self.token),
            nkey: text(&self.nkey),
            creds_file: path(&self.creds_file),
            tls_required: self.tls_required,
            tls_ca_file: path(&self.tls_ca_file),
            tls_cert_file: path(&self.tls_cert_file),
            tls_key_file: path(&self.tls_key_file),
            inbox_prefix: text(&self.inbox_prefix),
        }
        .validate(base)
        .map_err(|e| ConfigError::invalid(format!("nats.{}", e.field), e.message))?;
        Ok(NatsConfig {
            client,
            publish_timeout: millis("nats.publish_timeout_ms", self.publish_timeout_ms)?,
        })
    }

    /// `nats.subscription_capacity`: by default `queue_capacity` +
    /// `nats.expected_burst`, so that a burst of that many requests arriving at once is
    /// buffered by the client and answered (a refusal is fast; a message the client
    /// drops gets no answer at all). Set explicitly, it must hold at least
    /// `queue_capacity` messages.
    fn subscription_capacity(&self, queue_capacity: usize) -> Result<usize, ConfigError> {
        let burst = size("nats.expected_burst", self.expected_burst)?;
        let Some(explicit) = self.subscription_capacity else {
            return Ok(queue_capacity.saturating_add(burst).max(16));
        };
        let cap = size("nats.subscription_capacity", explicit)?;
        if cap < queue_capacity {
            return Err(ConfigError::invalid(
                "nats.subscription_capacity",
                format!(
                    "{cap} is smaller than queue_capacity ({queue_capacity}): the client would \
                     drop requests (no answer) before the queue refuses them; use at least \
                     queue_capacity + the largest burst expected"
                ),
            ));
        }
        Ok(cap)
    }
}

impl RawService {
    fn validate(&self) -> Result<ServiceConfig, ConfigError> {
        stream_name("service.name", &self.name)?;
        if !is_semver(&self.version) {
            return Err(ConfigError::invalid(
                "service.version",
                format!(
                    "expected a semantic version like 1.2.3, got {:?}",
                    self.version
                ),
            ));
        }
        name_check("service.queue_group", &self.queue_group)?;
        let endpoint = |key: &str, s: &String| subject(key, s.clone(), true);
        let cfg = ServiceConfig {
            name: self.name.clone(),
            version: self.version.clone(),
            description: self.description.clone(),
            queue_group: self.queue_group.clone(),
            subject: endpoint("service.subject", &self.subject)?,
            cancel_subject: endpoint("service.cancel_subject", &self.cancel_subject)?,
            capabilities_subject: endpoint(
                "service.capabilities_subject",
                &self.capabilities_subject,
            )?,
            limits_subject: endpoint("service.limits_subject", &self.limits_subject)?,
            status_subject: endpoint("service.status_subject", &self.status_subject)?,
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
                "service.subject",
                "the five service subjects must differ",
            ));
        }
        Ok(cfg)
    }
}

impl RawAdmin {
    fn validate(&self) -> Result<AdminConfig, ConfigError> {
        let listen = self.listen.parse::<SocketAddr>().map_err(|_| {
            ConfigError::invalid(
                "admin.listen",
                format!(
                    "expected an address like 127.0.0.1:9091, got {:?}",
                    self.listen
                ),
            )
        })?;
        Ok(AdminConfig {
            listen,
            max_connections: count("admin.max_connections", self.max_connections)?,
            header_timeout: millis("admin.header_timeout_ms", self.header_timeout_ms)?,
            idle_timeout: millis("admin.idle_timeout_ms", self.idle_timeout_ms)?,
            request_limits: RequestLimits {
                timeout: millis("admin.request_timeout_ms", self.request_timeout_ms)?,
                max_concurrent: count(
                    "admin.max_concurrent_requests",
                    self.max_concurrent_requests,
                )?,
            },
        })
    }
}

impl RawJetStream {
    /// `[jetstream]`, read and validated whatever `intake` says (so that a file can
    /// keep it and switch with `WEIR_LLM_INTAKE`).
    fn validate(&self, workers: NonZeroUsize) -> Result<JetStreamIntake, ConfigError> {
        stream_name("jetstream.stream", &self.stream)?;
        let subject_s = subject("jetstream.subject", self.subject.clone(), false)?;
        stream_name("jetstream.consumer", &self.consumer)?;
        let ack_wait = millis("jetstream.ack_wait_ms", self.ack_wait_ms)?;
        let progress_interval = millis(
            "jetstream.progress_interval_ms",
            self.progress_interval_ms.unwrap_or(self.ack_wait_ms / 3),
        )?;
        if progress_interval >= ack_wait {
            return Err(ConfigError::invalid(
                "jetstream.progress_interval_ms",
                format!(
                    "{} must be below jetstream.ack_wait_ms ({})",
                    progress_interval.as_millis(),
                    ack_wait.as_millis()
                ),
            ));
        }
        let max_ack_pending = count(
            "jetstream.max_ack_pending",
            self.max_ack_pending.unwrap_or(workers.get() as u64),
        )?;
        if max_ack_pending < workers {
            return Err(ConfigError::invalid(
                "jetstream.max_ack_pending",
                format!(
                    "{max_ack_pending} is below workers ({workers}): the replica could never fill its workers"
                ),
            ));
        }
        stream_name("jetstream.session_bucket", &self.session_bucket)?;
        let reply_bucket = match set(&self.reply_bucket) {
            None => None,
            Some(b) => {
                stream_name("jetstream.reply_bucket", &b)?;
                if b == self.session_bucket {
                    return Err(ConfigError::invalid(
                        "jetstream.reply_bucket",
                        "must differ from jetstream.session_bucket",
                    ));
                }
                Some(b)
            }
        };
        Ok(JetStreamIntake {
            stream: self.stream.clone(),
            subject: subject_s,
            consumer: self.consumer.clone(),
            ack_wait,
            progress_interval,
            max_ack_pending,
            max_deliver: count("jetstream.max_deliver", self.max_deliver)?,
            duplicate_window: millis("jetstream.duplicate_window_ms", self.duplicate_window_ms)?,
            max_messages: count("jetstream.max_messages", self.max_messages)?,
            max_bytes: count("jetstream.max_bytes", self.max_bytes)?,
            replicas: count("jetstream.replicas", self.replicas)?,
            file_storage: self.storage == Storage::File,
            session_bucket: self.session_bucket.clone(),
            reply_bucket,
            forward: self.forward,
        })
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

#[cfg(test)]
mod tests {
    use super::*;
    use weir_protocol::WireName;

    use weir_testkit::names::assert_serde_names;

    #[test]
    fn wire_names_are_the_serde_names_or_unchanged() {
        use crate::admission::{CancelResult, StopReason};
        use crate::intake::TermReason;
        assert_serde_names::<Mode>();
        assert_serde_names::<CancelResult>();
        assert_serde_names::<crate::trace::TraceKind>();
        let names = |all: &[&'static str]| all.to_vec();
        let stops: Vec<_> = StopReason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(
            stops,
            names(&["caller_gone", "caller_stalled", "publish_timeout"])
        );
        let terms: Vec<_> = TermReason::ALL.iter().map(|r| r.to_string()).collect();
        let want = [
            "expired",
            "invalid",
            "no_reply",
            "no_headers",
            "request_id_conflict",
            "session_cap",
            "key_limit",
            "wait_expired",
            "slot_store",
        ];
        assert_eq!(terms, want);
    }

    #[test]
    fn backend_kind_names_are_unchanged() {
        let kind = |text: &str| Config::from_toml_str(text).expect("valid").backend.kind;
        assert_eq!(Config::default().backend.kind.name(), "sim");
        let nats = kind("[backend]\nkind = \"nats\"\n[backend.nats]\nsubject = \"svc\"");
        assert_eq!(nats.name(), "nats");
        let openai = "[backend]\nkind = \"openai\"\n[backend.openai]\nbase_url = \"https://x/\"";
        assert_eq!(kind(openai).name(), "openai");
    }

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
        assert_eq!(c.admission.workers.get(), 8);
        assert_eq!(c.admission.queue_capacity.get(), 256);
        assert_eq!(
            c.admission.session.pending_cap.map(NonZeroUsize::get),
            Some(5)
        );
        assert!(c.admission.session.ordering);
        assert_eq!(c.admission.deadline.default, Some(Duration::from_secs(30)));
        assert_eq!(c.admission.mode, Mode::Enforce);
        assert!(c.admission.limits.is_empty());
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
        assert_eq!(
            c.admission.deadline.min_start_budget, None,
            "unset = adaptive"
        );
        assert_eq!(c.admission.deadline.reply_margin, Duration::from_millis(20));
        assert!(c.admission.deadline.predict);
        assert_eq!(c.admission.queue_order, QueueOrder::Edf);
        assert_eq!(c.admission.deadline.overtake_share_pct, 50);
        assert_eq!(c.admission.estimator, EstimatorConfig::default());
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
            c.admission.deadline.min_start_budget,
            Some(Duration::ZERO),
            "set = fixed"
        );
        assert_eq!(c.capabilities()["deadline"]["start_budget"], "fixed");
        assert_eq!(c.admission.deadline.reply_margin, Duration::from_millis(5));
        assert!(!c.admission.deadline.predict);
        assert_eq!(c.admission.queue_order, QueueOrder::Fifo);
        assert_eq!(c.admission.deadline.overtake_share_pct, 0);
        assert_eq!(
            c.admission.estimator.initial,
            Some(Duration::from_millis(80))
        );
        assert_eq!(
            (
                c.admission.estimator.window,
                c.admission.estimator.half_life
            ),
            (32, 8.0)
        );

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
        assert_eq!(c.admission.session.pending_cap, None);
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
        let i = c.admission.idempotency.expect("enabled by default");
        assert_eq!(i.max_bytes.get(), 64 * 1024 * 1024);
        assert_eq!(
            c.capabilities()["idempotency"]["max_bytes"],
            64 * 1024 * 1024
        );
        let c = Config::from_toml_str("[idempotency]\nmax_bytes = 1048576").expect("valid");
        assert_eq!(
            c.admission.idempotency.map(|i| i.max_bytes.get()),
            Some(1 << 20)
        );
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
    fn the_key_table_lists_every_key_with_its_default_and_range() {
        let (undocumented, extra) = keys::uncovered(&layers(), SECTIONS);
        assert!(
            undocumented.is_empty(),
            "keys without docs: {undocumented:?}"
        );
        assert!(extra.is_empty(), "docs without keys: {extra:?}");
        let layers = layers();
        let rows: Vec<keys::KeyRow> = SECTIONS
            .iter()
            .flat_map(|s| keys::rows(&layers, s))
            .collect();
        let get = |k: &str| {
            rows.iter()
                .find(|r| r.name == k)
                .unwrap_or_else(|| panic!("{k} listed"))
        };
        assert_eq!(get("stream.window").default.as_deref(), Some("16"));
        assert_eq!(
            get("stream.window").range,
            "0..=100000 (0 = no acknowledgements)"
        );
        assert_eq!(get("stream.ack_timeout_ms").default, None, "follows nats");
        assert!(
            get("stream.ack_timeout_ms")
                .help
                .contains("nats.publish_timeout_ms")
        );
        assert_eq!(get("stream.ack_timeout_ms").ty, "integer");
        assert_eq!(get("backend.openai.tls_ca_file").default, None);
        assert_eq!(
            get("backend.openai.base_url").default.as_deref(),
            Some("http://127.0.0.1:8000")
        );
        assert_eq!(
            get("backend.sim.first_token_ms").default.as_deref(),
            Some("20")
        );
        assert_eq!(get("backend.sim.p99_ms").ty, "integer");
        assert_eq!(
            get("service.status_subject").default.as_deref(),
            Some("llm.status")
        );
        assert_eq!(get("workers").range, "1..=4096");
        assert_eq!(get("limits[].max_wait_ms").default.as_deref(), Some("1000"));
        assert_eq!(get("limits[].on_busy").default.as_deref(), Some("wait"));
        assert_eq!(
            get("admin.request_timeout_ms").default.as_deref(),
            Some("10000")
        );
        assert_eq!(
            get("admin.max_concurrent_requests").default.as_deref(),
            Some("8")
        );
        assert!(rows.len() > 100, "{} keys", rows.len());
        // Every numeric range `validate` reads parses.
        for r in &rows {
            if r.ty == "integer" {
                assert!(bounds::<u64>(r.range).is_some(), "{}: {}", r.name, r.range);
            }
            if r.ty == "decimal" {
                assert!(bounds::<f64>(r.range).is_some(), "{}: {}", r.name, r.range);
            }
        }
    }

    /// docs/llm-adapter.md holds the tables `--list-keys --markdown` prints; this
    /// fails when they differ (regenerate them with that command).
    #[test]
    fn the_docs_tables_are_the_generated_ones() {
        let doc = include_str!("../../../docs/llm-adapter.md");
        assert_eq!(
            keys::stale_docs_sections(doc, &key_table(true), SECTIONS),
            Vec::<&str>::new(),
            "docs/llm-adapter.md: these tables differ from the generated ones; paste the output \
             of `llm-adapter serve --list-keys --markdown`"
        );
    }

    #[test]
    fn admin_request_limits_default_to_the_shared_ones_and_flow_from_the_keys() {
        assert_eq!(
            Config::default().admin.request_limits,
            RequestLimits::default()
        );
        let c = Config::from_toml_str(
            "[admin]
request_timeout_ms = 2500
max_concurrent_requests = 3",
        )
        .expect("valid");
        assert_eq!(
            c.admin.request_limits,
            RequestLimits {
                timeout: Duration::from_millis(2500),
                max_concurrent: NonZeroUsize::new(3).expect("3 > 0"),
            }
        );
        for bad in [
            "request_timeout_ms = 99",
            "max_concurrent_requests = 0",
            "max_concurrent_requests = 1025",
        ] {
            let e = err(&format!("[admin]\n{bad}"));
            assert!(e.key().starts_with("admin."), "{e}");
            assert!(bad.starts_with(e.key().trim_start_matches("admin.")), "{e}");
        }
    }

    fn load(
        file: Option<&str>,
        env: &[(&str, &str)],
        set: &[(&str, &str)],
    ) -> Result<Config, ConfigError> {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("adapter.toml");
        if let Some(text) = file {
            std::fs::write(&path, text).expect("write");
        }
        let pairs = |v: &[(&str, &str)]| -> Vec<(String, String)> {
            v.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        Config::load(&ConfigSources {
            file: file.map(|_| path.clone()),
            env: pairs(env),
            overrides: pairs(set),
        })
    }

    #[test]
    fn precedence_is_file_then_environment_then_command_line() {
        let file = "workers = 2
queue_capacity = 100
[session]
pending_cap = 7
[nats]
url = \"nats://file:4222\"
";
        let c = load(
            Some(file),
            &[
                ("WEIR_LLM_QUEUE_CAPACITY", "200"),
                ("WEIR_LLM_WORKERS", "3"),
            ],
            &[("workers", "4"), ("nats.url", "nats://flag:4222")],
        )
        .expect("valid");
        assert_eq!(
            c.admission.workers.get(),
            4,
            "the command line beats the environment"
        );
        assert_eq!(
            c.admission.queue_capacity.get(),
            200,
            "the environment beats the file"
        );
        assert_eq!(
            c.admission.session.pending_cap.map(NonZeroUsize::get),
            Some(7),
            "the file beats the default"
        );
        assert_eq!(c.nats.client.url_list(), "nats://flag:4222");
        assert_eq!(
            c.admission.deadline.max,
            Duration::from_secs(120),
            "the default stays"
        );
        // A refusal says where the value came from.
        let e = load(Some("workers = 0\n"), &[], &[]).expect_err("zero");
        assert!(e.to_string().contains("adapter.toml"), "{e}");
        let e = load(None, &[("WEIR_LLM_WORKERS", "0")], &[]).expect_err("zero");
        assert!(e.to_string().contains("WEIR_LLM_WORKERS"), "{e}");
    }

    /// The old loader typed environment values by their text alone: a numeric token
    /// was an integer, refused as "expected a string". A value takes its key's type.
    #[test]
    fn a_numeric_nats_token_from_the_environment_is_a_string() {
        let c = load(None, &[("WEIR_LLM_NATS__TOKEN", "123456")], &[]).expect("valid");
        let shown = format!("{:?}", c.nats.client);
        assert!(!shown.contains("123456"), "redacted: {shown}");
        assert!(shown.contains("<redacted>"), "{shown}");
        let c = load(
            None,
            &[
                ("WEIR_LLM_SERVICE__VERSION", "1.2.3"),
                ("WEIR_LLM_SERVICE__NAME", "42"),
            ],
            &[],
        )
        .expect("valid");
        assert_eq!(
            (c.service.version.as_str(), c.service.name.as_str()),
            ("1.2.3", "42")
        );
    }

    #[test]
    fn limits_elements_are_keys_with_their_index() {
        let file = "[[limits]]\nkey = \"client\"\nlimit = 1\n[[limits]]\nkey = \"session\"\nlimit = 2\nmax_wait_ms = -3\n";
        let e = load(Some(file), &[], &[]).expect_err("negative");
        assert_eq!(e.key(), "limits[1].max_wait_ms", "{e}");
        assert!(e.to_string().contains("1..=3600000"), "{e}");
        let file = "[[limits]]\nkey = \"client\"\nlimit = 1\n";
        let c = load(
            Some(file),
            &[],
            &[("limits[0].limit", "5"), ("limits[0].on_busy", "reject")],
        )
        .expect("valid");
        assert_eq!(c.admission.limits[0].limit.get(), 5);
        assert_eq!(c.admission.limits[0].on_busy, OnBusy::Reject);
        let e = load(Some(file), &[], &[("limits[0].max_waiter", "5")]).expect_err("typo");
        assert_eq!(
            (e.key(), e.kind()),
            ("limits[0].max_waiter", ConfigErrorKind::UnknownKey)
        );
        assert!(e.to_string().contains("`limits[].max_waiters`"), "{e}");
        assert_eq!(err("[[limits]]\nlimit = 1").key(), "limits[0].key");
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
        assert_eq!(c.admission.limits.len(), 2);
        assert_eq!(c.admission.limits[0].name, "client");
        assert_eq!(
            c.admission.limits[0].on_busy,
            OnBusy::Wait {
                max_wait: Duration::from_secs(1),
                max_waiters: 100
            }
        );
        assert_eq!(c.admission.limits[1].key, KeySource::Body("/model".into()));
        assert_eq!(c.admission.limits[1].on_busy, OnBusy::Reject);

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
            err("[backend.sim]\np99_ms = 50").key(),
            "backend.sim.p99_ms"
        );
        assert_eq!(
            err("[backend.sim]\ndistribution = \"lognormal\"\nmin_ms = 5").key(),
            "backend.sim.min_ms"
        );
        let c = Config::from_toml_str(
            "[backend.sim]\ndistribution = \"uniform\"\nmin_ms = 5\nlatency_ms = 30",
        )
        .expect("uniform");
        let BackendKind::Sim(sim) = c.backend.kind else {
            panic!("sim expected");
        };
        assert_eq!(
            sim.latency,
            Latency::Uniform {
                min: Duration::from_millis(5),
                max: Duration::from_millis(30)
            }
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
        let c = load(
            Some("workers = 2"),
            &[
                ("WEIR_LLM_WORKERS", "3"),
                ("WEIR_LLM_SESSION__PENDING_CAP", "0"),
                ("WEIR_LLM_BACKEND__SIM__ERROR_RATE", "0.25"),
                ("WEIR_LLM_MODE", "shadow"),
                ("WEIR_LLM_NATS_URL", "nats://x"),
                ("WEIR_LLM_CONFIG", "ignored.toml"),
                ("OTHER", "1"),
            ],
            &[],
        )
        .expect("valid");
        assert_eq!(c.admission.workers.get(), 3);
        assert_eq!(c.admission.session.pending_cap, None);
        assert_eq!(c.admission.mode, Mode::Shadow);
        match c.backend.kind {
            BackendKind::Sim(s) => assert_eq!(s.error_rate, 0.25),
            other => panic!("unexpected {other:?}"),
        }
        let e = load(None, &[("WEIR_LLM_SESSION__PENDING_CAP", "-2")], &[]).expect_err("refused");
        assert_eq!(e.key(), "session.pending_cap");
        let e = load(None, &[("WEIR_LLM_LIMITS__0", "1")], &[]).expect_err("refused");
        assert!(e.to_string().contains("WEIR_LLM_LIMITS__0"), "{e}");
        let e = load(None, &[("WEIR_LLM_QUEUE_CAPACTY", "5")], &[]).expect_err("typo");
        assert_eq!(
            (e.key(), e.kind()),
            ("queue_capacty", ConfigErrorKind::UnknownKey)
        );
        assert!(e.to_string().contains("WEIR_LLM_QUEUE_CAPACTY"), "{e}");
        assert!(
            e.to_string().contains("did you mean `queue_capacity`?"),
            "{e}"
        );
    }
}
