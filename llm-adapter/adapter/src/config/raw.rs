//! The configuration as written: one serde struct per section (`deny_unknown_fields`,
//! every field defaulted) with its key documentation, written once by
//! `weir_service::config_section!`;
//! `[nats]`, `[admin]` and `[log]` compose the shared sections of
//! `weir_service::config::section`.

use serde::{Deserialize, Serialize};
use weir_service::config::Range;
use weir_service::config::keys::Section;
use weir_service::config::section::{
    ADMIN_KEYS, AdminSection, LOG_KEYS, LogSection, NATS_KEYS, NatsSection,
};

use super::{EstimatorConfig, Mode, NATS_CLIENT_NAME, QueueOrder, ms};

/// `intake`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum IntakeKind {
    #[default]
    Core,
    #[serde(rename = "jetstream")]
    JetStream,
}

/// `backend.kind`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum BackendName {
    #[default]
    Sim,
    #[serde(rename = "openai")]
    OpenAi,
    Nats,
}

/// `backend.sim.distribution`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum Distribution {
    #[default]
    Fixed,
    Uniform,
    #[serde(rename = "lognormal")]
    LogNormal,
}

/// `limits[].on_busy`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum OnBusyKind {
    #[default]
    Wait,
    Reject,
}

/// `jetstream.storage`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum Storage {
    #[default]
    File,
    Memory,
}

weir_service::config_section! {
    /// The configuration as written: the top-level keys and the sections.
    pub(super) struct RawConfig, GENERAL = "";
    {
        workers: u64 = 8, Range::int(1, 4096),
            "fixed number of workers (concurrent backend calls); match the backend's parallel \
            slots";
        queue_capacity: u64 = 256, Range::int(1, 1000000),
            "most requests admitted but not yet started, over all sessions and keys";
        mode: Mode = Mode::default(), Range::text("`enforce`, `shadow`"),
            "`shadow`: count `would_reject` for the session cap, per-key limits and the session \
            `reject` policy, and admit anyway (the queue bound and deadlines stay enforced)";
        shutdown_grace_ms: u64 = 10_000, Range::ms(0, 3600000),
            "grace period for running requests at shutdown";
        queue_order: QueueOrder = QueueOrder::default(), Range::text("`edf`, `fifo`"),
            "the order in which workers take ready requests: `edf` (earliest deadline first within \
            a bound; no deadline = due at `deadline.max_ms`) or `fifo`; see \
            [fairness](#fairness-under-mixed-deadlines)";
        intake: IntakeKind = IntakeKind::default(), Range::text("`core`, `jetstream`"),
            "core request/reply on `service.subject`, or the durable JetStream intake \
            (`[jetstream]`)";
    }
    nested {
        session: RawSession, deadline: RawDeadline, estimator: RawEstimator,
        idempotency: RawIdempotency, limits: Vec<RawLimit>, backend: RawBackend,
        backends: Vec<RawPoolBackend>, pool: RawPool, priority: RawPriority, nats: RawNats,
        service: ServiceConfig, admin: RawAdmin, trace: RawTrace, stream: RawStream,
        jetstream: RawJetStream, log: LogSection,
    }
}

weir_service::config_section! {
    pub(super) struct RawSession, SESSION = "session.";
    {
        pending_cap: u64 = 5, Range::int(0, 1000000).note(" (0 = unlimited)"),
            "most accepted-but-unsettled requests per session";
        ordering: bool = true, Range::Any, "one running request per session, the rest FIFO";
    }
}

weir_service::config_section! {
    pub(super) struct RawDeadline, DEADLINE = "deadline.";
    {
        max_ms: u64 = 120_000, Range::ms(1, 86400000),
            "longest budget accepted; longer ones are shortened to this";
        default_ms: u64 = 30_000, Range::ms(0, 86400000).note(" (0 = no default); at most `deadline.max_ms`"),
            "budget of requests that carry no deadline";
        min_start_budget_ms: Option<u64> = None, Range::ms(0, 3600000).note(" (unset = adaptive)"),
            "unset = **adaptive**: the service-time estimate is the start budget, and a queued \
            request is answered `deadline_exceeded` once less than it is left; set = a fixed start \
            budget (0 = start anything with budget left)";
        reply_margin_ms: u64 = 20, Range::ms(0, 60000),
            "time kept for the answer to reach the caller: decisions and aborts happen by `deadline \
            − reply_margin_ms`";
        predict: bool = true, Range::Any,
            "refuse at admission a request predicted not to finish before its deadline";
        overtake_share_pct: u64 = 50, Range::int(0, 90),
            "under `queue_order = \"edf\"`: the largest share of a request's slack kept for \
            requests with earlier deadlines (the share applied is that of recent requests with at \
            most half its budget, up to this; one budget class alone keeps none). 0 = EDF with \
            protected slack only. See [fairness](#fairness-under-mixed-deadlines)";
    }
}

weir_service::config_section! {
    pub(super) struct RawEstimator, ESTIMATOR = "estimator.";
    {
        initial_ms: u64 = EstimatorConfig::default().initial.map_or(0, ms),
            Range::ms(0, 3600000).note(" (0 = no estimate before the first call)"),
            "the estimate before the first call finishes (nothing is refused on a prediction until \
            the backend was measured when 0)";
        window: u64 = EstimatorConfig::default().window as u64, Range::int(1, 4096), "samples kept";
        half_life: u64 = EstimatorConfig::default().half_life as u64,
            Range::int(1, 4096).note("; at most `estimator.window`"),
            "age (in samples) at which a sample weighs half as much as the newest";
        quantile: f64 = EstimatorConfig::default().quantile, Range::decimal(0.5, 0.999),
            "the quantile of the weighted window taken as the estimate";
    }
}

weir_service::config_section! {
    pub(super) struct RawIdempotency, IDEMPOTENCY = "idempotency.";
    {
        enabled: bool = true, Range::Any, "answer a retry with the same request id from the cache";
        window_ms: u64 = 60_000, Range::ms(0, 86400000).note(" (0 = no cache after completion)"),
            "how long a successful reply is kept for retries (0 = join only while queued/running)";
        max_entries: u64 = 10_000, Range::int(1, 10000000),
            "most cached replies; the oldest is evicted first";
        max_bytes: u64 = 64 << 20, Range::bytes(1024, 68719476736),
            "bytes held by cached replies (body + headers + key + 256 B per entry), oldest evicted; \
            a reply larger than this is not cached. See [Memory](#memory)";
    }
}

weir_service::config_section! {
    /// One `[[limits]]` entry. Every field has a default (the loader tries an element's
/// value alone to name a refused one); `key` and `limit` are required by `validate`.
    pub(super) struct RawLimit, LIMITS = "limits[].";
    {
        key: String = String::new(),
            Range::text("`client`, `session`, `service`, `body:/json/pointer` (required)"),
            "where the key comes from: the `Weir-Client-Key` header, the session id, one key for \
            the service, or a JSON pointer into the body";
        name: String = String::new(), Range::text("1..=128 visible ASCII characters, unique"),
            "name in metrics, traces and the limits view; default: the `key` text";
        limit: u64 = 0, Range::int(1, 1000000).note(" (required)"), "most requests holding a slot of one key";
        on_busy: OnBusyKind = OnBusyKind::default(), Range::text("`wait`, `reject`"),
            "when all slots of a key are taken: wait in FIFO order, or refuse at once";
        max_wait_ms: u64 = 1_000, Range::ms(1, 3600000),
            "`wait`: longest wait for a slot, then `concurrency_limit_exceeded`";
        max_waiters: u64 = 100, Range::int(0, 1000000),
            "`wait`: most requests waiting per key; one more is refused at once";
        tokens_per_minute: u64 = 0, Range::int(0, 1000000000).note(" (0 = no token budget)"),
            "token budget of one key, refilled continuously: a request reserves its `max_tokens` \
            (or `default_max_tokens`) + prompt bytes / 4 at admission, reconciled with the backend's \
            `usage` at the end; over budget = `token_budget_exceeded` with `retry_after_ms`. See \
            [token budgets](#token-budgets)";
        default_max_tokens: u64 = 256, Range::int(1, 10000000).note("; at most `tokens_per_minute`"),
            "completion tokens reserved for a request whose body has no `max_tokens`";
        max_token_keys: u64 = 10_000, Range::int(1, 10000000),
            "most keys whose token budget is tracked; an idle key (budget refilled) is forgotten \
            first, then the least recently used";
        priority: String = String::new(), Range::text("`interactive`, `batch` (unset = none)"),
            "the priority class of requests that have this limit's key and no `Weir-Priority` \
            header (the first limit that sets one wins; none = `interactive`). See \
            [priority classes](#priority-classes)";
    }
}

weir_service::config_section! {
    /// `[priority]`: priority classes inside the deadline order.
    pub(super) struct RawPriority, PRIORITY = "priority.";
    {
        batch_delay_ms: u64 = ms(crate::admission::DEFAULT_BATCH_DELAY), Range::ms(0, 3600000),
            "added to a `batch` request's deadline for its place in the EDF order: interactive \
            requests due up to this long after a batch request's deadline go ahead of it; a batch \
            request overtakes interactive ones due later (it ages). See \
            [priority classes](#priority-classes)";
    }
}

weir_service::config_section! {
    /// `[backend]`, and the same keys of each `[[backends]]` element.
    pub(super) struct RawBackend, BACKEND = "backend.", BACKENDS_BACKEND = "backends[].";
    {
        timeout_ms: u64 = 60_000, Range::ms(1, 3600000),
            "the backend's own per-call timeout (used when shorter than the deadline)";
        kind: BackendName = BackendName::default(), Range::text("`sim`, `openai`, `nats`"),
            "which kind of backend serves inference, with its settings in the sub-table of that \
            name (`sim`, `openai`, `nats`); every sub-table present is validated whichever is \
            selected";
    }
    nested { sim: RawSim, openai: RawOpenAi, nats: RawBackendNats }
}

weir_service::config_section! {
    pub(super) struct RawSim, SIM = "backend.sim.", BACKENDS_SIM = "backends[].sim.";
    {
        latency_ms: u64 = 20, Range::ms(0, 3600000),
            "simulated latency (`fixed`), upper bound default (`uniform`), median (`lognormal`)";
        distribution: Distribution = Distribution::default(), Range::text("`fixed`, `uniform`, `lognormal`"),
            "simulated latency distribution";
        min_ms: Option<u64> = None, Range::ms(0, 3600000), "`uniform`: lower bound; default = 0";
        max_ms: Option<u64> = None, Range::ms(0, 3600000).note("; at least `backend.sim.min_ms`"),
            "`uniform`: upper bound; default = the larger of `latency_ms` and `min_ms`";
        p99_ms: Option<u64> = None, Range::ms(0, 3600000).note("; at least `backend.sim.latency_ms`"),
            "`lognormal`: 99th percentile; default = 3 × `latency_ms`";
        error_rate: f64 = 0.0, Range::decimal(0.0, 1.0),
            "share of calls that fail with a backend error";
        seed: u64 = 1, Range::int(0, 9223372036854775807),
            "random seed (latency and errors are reproducible)";
        first_token_ms: u64 = 20, Range::ms(0, 3600000),
            "streamed replies: delay before the first token";
        tokens: u64 = 16, Range::int(1, 1000000),
            "streamed replies: tokens when the body has no `max_tokens`";
        tokens_per_second: f64 = 50.0, Range::decimal(0.001, 1000000.0),
            "streamed replies: tokens per second after the first";
    }
}

weir_service::config_section! {
    pub(super) struct RawOpenAi, OPENAI = "backend.openai.", BACKENDS_OPENAI = "backends[].openai.";
    {
        base_url: String = "http://127.0.0.1:8000".into(),
            Range::text("`http://host:port` or `https://host[:port]`"),
            "the OpenAI-compatible server (vLLM, llama.cpp server, Ollama, a hosted endpoint); \
            HTTPS with rustls (the system roots plus `tls_ca_file`)";
        path: String = "/v1/chat/completions".into(), Range::text("starts with `/`"),
            "path the body is POSTed to";
        api_key_env: String = String::new(), Range::Any,
            "name of the environment variable holding a bearer token";
        connect_timeout_ms: u64 = 2_000, Range::ms(1, 600000), "TCP connect timeout";
        pool_max_idle_per_host: u64 = 64, Range::int(0, 100000), "idle pooled connections kept per host";
        pool_idle_timeout_ms: u64 = 90_000, Range::ms(1, 3600000),
            "how long an idle pooled connection is kept";
        tls_ca_file: String = String::new(), Range::text("https only"),
            "PEM file of CA certificates trusted beside the system roots (a private CA, a \
            self-signed server); unreadable or empty → exit 1 naming the key";
        tls_cert_file: String = String::new(), Range::text("https only; with `tls_key_file`"),
            "PEM client certificate (chain)";
        tls_key_file: String = String::new(), Range::text("with `tls_cert_file`"),
            "PEM private key of `tls_cert_file`";
    }
}

weir_service::config_section! {
    pub(super) struct RawBackendNats, BACKEND_NATS = "backend.nats.", BACKENDS_NATS = "backends[].nats.";
    {
        subject: String = String::new(),
            Range::text("a NATS subject without wildcards; required when `kind = \"nats\"`"),
            "subject of the existing service requests are forwarded to";
        cancel_subject: String = String::new(),
            Range::text("a NATS subject without wildcards, not the `subject`; empty = none"),
            "when set, a call dropped before its reply (cancel, supersede, deadline, failover, \
            shutdown) publishes a cancel message here naming it (`Weir-Cancel`, \
            `Weir-Cancel-Inbox`; see [NATS backend cancel](#nats-backend-cancel))";
    }
}

weir_service::config_section! {
    /// One `[[backends]]` entry: its own keys and those of a `[backend]`. Every field
    /// has a default (the loader tries an element's value alone to name a refused one);
    /// `name` and `slots` are required by `validate`. Unknown keys are refused by the
    /// loader (from the schema): serde cannot with a flattened section.
    pub(super) struct RawPoolBackend: flattened, BACKENDS = "backends[].";
    {
        name: String = String::new(),
            Range::text("1..=64 of `A-Z a-z 0-9 - _`, unique (required)"),
            "the backend's name in metrics, `/v1/stats`, the capabilities document and logs";
        slots: u64 = 0, Range::int(1, 4096).note(" (required)"),
            "concurrent calls to this backend (its parallel slots); the pool's workers are the \
            sum of the slots";
        weight: u64 = 1, Range::int(1, 1000),
            "cost of a call here: among backends predicted to finish in time, the lowest weight \
            is chosen, then the soonest predicted finish";
    }
    nested { #[serde(flatten)] backend: RawBackend }
}

weir_service::config_section! {
    /// `[pool]`: health of the `[[backends]]` (unused with a single `[backend]`).
    pub(super) struct RawPool, POOL = "pool.";
    {
        eject_after_errors: u64 = 5, Range::int(1, 1000),
            "consecutive failed calls (errors, backend timeouts) that eject a backend";
        stall_factor: u64 = 3, Range::int(1, 1000),
            "a running call with no reply byte for this many service-time estimates of its \
            backend is a stall: the backend is ejected";
        stall_floor_ms: u64 = 250, Range::ms(1, 3600000),
            "least time without a reply byte that counts as a stall";
        backoff_base_ms: u64 = 1_000, Range::ms(1, 3600000),
            "first ejection's length; each failed probe doubles it";
        backoff_max_ms: u64 = 30_000, Range::ms(1, 3600000).note("; at least `pool.backoff_base_ms`"),
            "longest ejection";
    }
}

weir_service::config_section! {
    /// `[nats]`: the shared section ([`NatsSection`]: servers, authentication, TLS, inbox
    /// prefix, timeouts, the client's buffer) and the adapter's own keys. Unknown keys are
    /// refused by the loader (from the schema): serde cannot with a flattened section.
    pub(super) struct RawNats: flattened, NATS = "nats.";
    {
        expected_burst: u64 = 65_536, Range::int(0, 1000000),
            "requests that may arrive at once beyond `queue_capacity`; sizes the subscription \
            (see [Bursts](#bursts))";
        subscription_capacity: Option<u64> = None,
            Range::int(16, 2000000).note("; at least `queue_capacity`"),
            "messages buffered per subscription; beyond it the NATS client drops (counted, no \
            answer); default = `queue_capacity` + `nats.expected_burst` (65792)";
        publish_timeout_ms: u64 = 1_000, Range::ms(1, 600000), "bound on publishing one reply";
    }
    nested { #[serde(flatten)] common: NatsSection = NatsSection::from_config(&adapter_nats_defaults()) }
}

/// The adapter's connection defaults: the shared ones, with 2,048 buffered commands
/// (async-nats's own default; every reply is published through them, each bounded by
/// `nats.publish_timeout_ms`).
pub(super) fn adapter_nats_defaults() -> weir_service::nats::NatsConfig {
    weir_service::nats::NatsConfig {
        client_capacity: 2048,
        ..weir_service::nats::NatsConfig::named(NATS_CLIENT_NAME)
    }
}

weir_service::config_section! {
    /// `[service]`: the NATS micro service.
    #[derive(Debug, PartialEq, Eq)]
    pub struct ServiceConfig, SERVICE = "service.";
    {
        name: String = "weir-llm".into(), Range::text("1..=128 of `A-Z a-z 0-9 - _`"), "NATS micro service name";
        version: String = env!("CARGO_PKG_VERSION").into(), Range::text("a semantic version like 1.2.3"),
            "version advertised in `$SRV.INFO`";
        description: String = "weir bounded LLM adapter".into(), Range::Any,
            "description advertised in `$SRV.INFO`";
        queue_group: String = "q".into(), Range::text("1..=128 visible ASCII characters"),
            "queue group shared by replicas";
        subject: String = "llm.infer".into(), Range::text("a NATS subject; the five subjects differ"),
            "inference requests";
        cancel_subject: String = "llm.cancel".into(), Range::text("a NATS subject"),
            "cancellation by request id";
        capabilities_subject: String = "llm.capabilities".into(), Range::text("a NATS subject"),
            "capabilities (every limit, `null` when disabled)";
        limits_subject: String = "llm.limits".into(), Range::text("a NATS subject"), "busiest keys";
        status_subject: String = "llm.status".into(), Range::text("a NATS subject"),
            "where a request is, by request id";
    }
}

weir_service::config_section! {
    /// `[admin]`: the shared section ([`AdminSection`]) and the adapter's own listener
    /// timeouts.
    pub(super) struct RawAdmin: flattened, ADMIN = "admin.";
    {
        header_timeout_ms: u64 = 5_000, Range::ms(100, 600000),
            "bound on receiving a request head (at accept and between keep-alive requests)";
        idle_timeout_ms: u64 = 10_000, Range::ms(100, 3600000),
            "a connection that moves no byte for this long is closed";
    }
    nested { #[serde(flatten)] common: AdminSection = AdminSection::listening_on("127.0.0.1:9091") }
}

weir_service::config_section! {
    pub(super) struct RawTrace, TRACE = "trace.";
    {
        log: bool = true, Range::Any,
            "per-request events as `tracing` DEBUG events (target `weir_llm_adapter::trace`) inside \
            the request's `llm_request` span (span events with the feature `otel`)";
        subject: String = String::new(), Range::text("a NATS subject without wildcards"),
            "also publish them as JSON on this subject";
        buffer: u64 = 4096, Range::int(1, 1000000),
            "events buffered for the NATS publisher; overflow is counted and dropped";
    }
}

weir_service::config_section! {
    pub(super) struct RawStream, STREAM = "stream.";
    {
        chunk_interval_ms: u64 = 20, Range::ms(0, 10000).note(" (0 = no coalescing by time)"),
            "after a `chunk`, the next waits this long unless `chunk_max_bytes` are pending; the \
            first bytes after a quiet period go at once";
        chunk_max_bytes: u64 = 4096, Range::bytes(1, 1048576),
            "pending bytes that go at once; a chunk is also capped at `max_payload` − 1 KiB";
        window: u64 = 16, Range::int(0, 100000).note(" (0 = no acknowledgements)"),
            "chunks a caller may leave unacknowledged (0 = callers do not acknowledge; only a gone \
            caller and a publish timeout abort)";
        ack_timeout_ms: Option<u64> = None, Range::ms(1, 600000),
            "how long a full window waits for an acknowledgement before the stream is aborted \
            (`caller_stalled`); default = `nats.publish_timeout_ms`";
    }
}

weir_service::config_section! {
    pub(super) struct RawJetStream, JETSTREAM = "jetstream.";
    {
        stream: String = "WEIR_LLM_INTAKE".into(), Range::text("1..=128 of `A-Z a-z 0-9 - _`"),
            "the work-queue stream (created if absent)";
        subject: String = "llm.intake".into(), Range::text("a NATS subject without wildcards"),
            "the subject the stream captures; callers publish requests here";
        consumer: String = "weir-llm".into(), Range::text("1..=128 of `A-Z a-z 0-9 - _`"),
            "the durable pull consumer every replica shares";
        ack_wait_ms: u64 = 10_000, Range::ms(100, 3600000),
            "without `+ACK`/progress for this long, the request goes to another replica";
        progress_interval_ms: Option<u64> = None, Range::ms(10, 1200000).note("; below `jetstream.ack_wait_ms`"),
            "progress for held requests, renewal of their session slots; default = `ack_wait_ms` / \
            3";
        max_ack_pending: Option<u64> = None, Range::int(1, 1000000).note("; at least `workers`"),
            "requests out at all replicas together (set the sum of `workers` over the replicas); \
            default = `workers`";
        max_deliver: u64 = 5, Range::int(1, 1000),
            "deliveries of one request before the server gives up on it";
        duplicate_window_ms: u64 = 120_000, Range::ms(100, 86400000),
            "how long the stream remembers a `Nats-Msg-Id`";
        max_messages: u64 = 100_000, Range::int(1, 100000000), "requests the stream holds (discard new)";
        max_bytes: u64 = 1 << 30, Range::bytes(1024, 1099511627776), "most bytes the stream holds";
        replicas: u64 = 1, Range::int(1, 5), "stream (and bucket) replicas on a cluster";
        storage: Storage = Storage::default(), Range::text("`file`, `memory`"), "stream storage";
        session_bucket: String = "weir_llm_sessions".into(), Range::text("1..=128 of `A-Z a-z 0-9 - _`"),
            "KV bucket of the cluster-wide slots (session cap, limits); entries live `ack_wait_ms` \
            after their last renewal";
        reply_bucket: String = "weir_llm_replies".into(),
            Range::text("1..=128 of `A-Z a-z 0-9 - _`, not the session bucket; empty = not kept"),
            "KV bucket where each intake answer is kept for `duplicate_window_ms` (a duplicate is \
            answered with it); `\"\"` = keep none (duplicates get `request_id_conflict`)";
        forward: bool = true, Range::Any,
            "a core request on `service.subject` is put into the stream (callers unchanged); \
            `false` = core requests are served in memory";
    }
}

/// The range and meaning of every key, by section, in the order shown. `validate`
/// checks each numeric key against the typed range here.
pub const SECTIONS: &[Section] = &[
    Section::new("general", GENERAL),
    Section::new("session", SESSION),
    Section::new("deadline", DEADLINE),
    Section::new("estimator", ESTIMATOR),
    Section::new("idempotency", IDEMPOTENCY),
    Section::new("limits", LIMITS),
    Section::new("backend", BACKEND),
    Section::new("sim", SIM),
    Section::new("openai", OPENAI),
    Section::new("backend_nats", BACKEND_NATS),
    Section::with_extra("backends", BACKENDS, BACKENDS_BACKEND),
    Section::new("backends_sim", BACKENDS_SIM),
    Section::new("backends_openai", BACKENDS_OPENAI),
    Section::new("backends_nats", BACKENDS_NATS),
    Section::new("pool", POOL),
    Section::new("priority", PRIORITY),
    Section::with_extra("nats", NATS_KEYS, NATS),
    Section::new("service", SERVICE),
    Section::with_extra("admin", ADMIN_KEYS, ADMIN),
    Section::new("trace", TRACE),
    Section::new("stream", STREAM),
    Section::new("jetstream", JETSTREAM),
    Section::new("log", LOG_KEYS),
];
