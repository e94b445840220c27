//! The configuration as written: one serde struct per section (`deny_unknown_fields`,
//! every field defaulted) with its key documentation, written once by `raw_section!`;
//! `[nats]`, `[admin]` and `[log]` compose the shared sections of
//! `weir_service::config::section`.

use serde::{Deserialize, Serialize};
use weir_service::config::Range;
use weir_service::config::keys::{KeyDoc, Section};
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

/// One section of the raw configuration, written once: the serde struct
/// (`deny_unknown_fields`, every field defaulted), its `Default`, and the key
/// documentation `$docs` (the docs' section `$section`: range and meaning), one entry per key:
/// `field: type = default, "range", "meaning";`. `nested` fields are sections (their
/// own `raw_section!`), not keys.
macro_rules! raw_section {
    // A section that is also an element's sub-table (`[backend.sim]` and
    // `[backends.sim]`): the same struct, its keys documented under a second prefix too.
    (
        $(#[$meta:meta])*
        $name:ident, $docs:ident, $section:literal, $prefix:literal
        also $docs2:ident, $section2:literal, $prefix2:literal {
            $($field:ident: $ty:ty = $default:expr, $range:expr, $help:literal;)*
        }
    ) => {
        raw_section! {
            $(#[$meta])*
            $name, $docs, $section, $prefix {
                $($field: $ty = $default, $range, $help;)*
            }
        }

        const $docs2: Section = Section::new($section2, &[$(KeyDoc::new(
            concat!($prefix2, stringify!($field)),
            $range,
            $help,
        )),*]);
    };
    (
        $(#[$meta:meta])*
        $name:ident, $docs:ident, $section:literal, $prefix:literal {
            $($field:ident: $ty:ty = $default:expr, $range:expr, $help:literal;)*
        }
        $(nested { $($sub:ident: $sub_ty:ty),* $(,)? })?
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        #[serde(deny_unknown_fields, default)]
        pub(super) struct $name {
            $(pub(super) $field: $ty,)*
            $($(pub(super) $sub: $sub_ty,)*)?
        }

        impl Default for $name {
            fn default() -> Self {
                Self {
                    $($field: $default,)*
                    $($($sub: Default::default(),)*)?
                }
            }
        }

        const $docs: Section = Section::new($section, &[$(KeyDoc::new(
            concat!($prefix, stringify!($field)),
            $range,
            $help,
        )),*]);
    };
}

raw_section! {
    /// The configuration as written: the top-level keys and the sections.
    RawConfig, GENERAL, "general", "" {
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
        service: RawService, admin: RawAdmin, trace: RawTrace, stream: RawStream,
        jetstream: RawJetStream, log: LogSection,
    }
}

raw_section! {
    RawSession, SESSION, "session", "session." {
        pending_cap: u64 = 5, Range::int(0, 1000000).note(" (0 = unlimited)"),
            "most accepted-but-unsettled requests per session";
        ordering: bool = true, Range::Any, "one running request per session, the rest FIFO";
    }
}

raw_section! {
    RawDeadline, DEADLINE, "deadline", "deadline." {
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

raw_section! {
    RawEstimator, ESTIMATOR, "estimator", "estimator." {
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

raw_section! {
    RawIdempotency, IDEMPOTENCY, "idempotency", "idempotency." {
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

raw_section! {
    /// One `[[limits]]` entry. Every field has a default (the loader tries an element's
/// value alone to name a refused one); `key` and `limit` are required by `validate`.
    RawLimit, LIMITS, "limits", "limits[]." {
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

raw_section! {
    /// `[priority]`: priority classes inside the deadline order.
    RawPriority, PRIORITY, "priority", "priority." {
        batch_delay_ms: u64 = ms(crate::admission::DEFAULT_BATCH_DELAY), Range::ms(0, 3600000),
            "added to a `batch` request's deadline for its place in the EDF order: interactive \
            requests due up to this long after a batch request's deadline go ahead of it; a batch \
            request overtakes interactive ones due later (it ages). See \
            [priority classes](#priority-classes)";
    }
}

raw_section! {
    RawBackend, BACKEND, "backend", "backend." {
        timeout_ms: u64 = 60_000, Range::ms(1, 3600000),
            "the backend's own per-call timeout (used when shorter than the deadline)";
        kind: BackendName = BackendName::default(), Range::text("`sim`, `openai`, `nats`"),
            "which backend serves inference; every `[backend.*]` section present is validated \
            whichever is selected";
    }
    nested { sim: RawSim, openai: RawOpenAi, nats: RawBackendNats }
}

raw_section! {
    RawSim, SIM, "sim", "backend.sim."
    also BACKENDS_SIM, "backends_sim", "backends[].sim." {
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

raw_section! {
    RawOpenAi, OPENAI, "openai", "backend.openai."
    also BACKENDS_OPENAI, "backends_openai", "backends[].openai." {
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

raw_section! {
    RawBackendNats, BACKEND_NATS, "backend_nats", "backend.nats."
    also BACKENDS_NATS, "backends_nats", "backends[].nats." {
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

raw_section! {
    /// One `[[backends]]` entry. Every field has a default (the loader tries an
    /// element's value alone to name a refused one); `name` and `slots` are required by
    /// `validate`.
    RawPoolBackend, BACKENDS, "backends", "backends[]." {
        name: String = String::new(),
            Range::text("1..=64 of `A-Z a-z 0-9 - _`, unique (required)"),
            "the backend's name in metrics, `/v1/stats`, the capabilities document and logs";
        kind: BackendName = BackendName::default(), Range::text("`sim`, `openai`, `nats`"),
            "which kind of backend; its `[backends.*]` sub-table (`sim`, `openai`, `nats`) as \
            under `[backend]`";
        slots: u64 = 0, Range::int(1, 4096).note(" (required)"),
            "concurrent calls to this backend (its parallel slots); the pool's workers are the \
            sum of the slots";
        timeout_ms: u64 = 60_000, Range::ms(1, 3600000),
            "this backend's own per-call timeout (used when shorter than the deadline)";
        weight: u64 = 1, Range::int(1, 1000),
            "cost of a call here: among backends predicted to finish in time, the lowest weight \
            is chosen, then the soonest predicted finish";
    }
    nested { sim: RawSim, openai: RawOpenAi, nats: RawBackendNats }
}

raw_section! {
    /// `[pool]`: health of the `[[backends]]` (unused with a single `[backend]`).
    RawPool, POOL, "pool", "pool." {
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

/// `[nats]`: the shared section ([`NatsSection`]: servers, authentication, TLS, inbox
/// prefix, timeouts, the client's buffer) and the adapter's own keys. Unknown keys are
/// refused by the loader (from the schema): serde cannot with a flattened section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub(super) struct RawNats {
    #[serde(flatten)]
    pub(super) common: NatsSection,
    pub(super) expected_burst: u64,
    pub(super) subscription_capacity: Option<u64>,
    pub(super) publish_timeout_ms: u64,
}

impl Default for RawNats {
    fn default() -> Self {
        Self {
            common: NatsSection::from_config(&adapter_nats_defaults()),
            expected_burst: 65_536,
            subscription_capacity: None,
            publish_timeout_ms: 1_000,
        }
    }
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

const NATS: Section = Section::with_extra(
    "nats",
    NATS_KEYS,
    &[
        KeyDoc::new(
            "nats.expected_burst",
            Range::int(0, 1000000),
            "requests that may arrive at once beyond `queue_capacity`; sizes the subscription \
             (see [Bursts](#bursts))",
        ),
        KeyDoc::new(
            "nats.subscription_capacity",
            Range::int(16, 2000000).note("; at least `queue_capacity`"),
            "messages buffered per subscription; beyond it the NATS client drops (counted, no \
             answer); default = `queue_capacity` + `nats.expected_burst` (65792)",
        ),
        KeyDoc::new(
            "nats.publish_timeout_ms",
            Range::ms(1, 600000),
            "bound on publishing one reply",
        ),
    ],
);

raw_section! {
    RawService, SERVICE, "service", "service." {
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

/// `[admin]`: the shared section ([`AdminSection`]) and the adapter's own listener
/// timeouts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub(super) struct RawAdmin {
    #[serde(flatten)]
    pub(super) common: AdminSection,
    pub(super) header_timeout_ms: u64,
    pub(super) idle_timeout_ms: u64,
}

impl Default for RawAdmin {
    fn default() -> Self {
        Self {
            common: AdminSection::listening_on("127.0.0.1:9091"),
            header_timeout_ms: 5_000,
            idle_timeout_ms: 10_000,
        }
    }
}

const ADMIN: Section = Section::with_extra(
    "admin",
    ADMIN_KEYS,
    &[
        KeyDoc::new(
            "admin.header_timeout_ms",
            Range::ms(100, 600000),
            "bound on receiving a request head (at accept and between keep-alive requests)",
        ),
        KeyDoc::new(
            "admin.idle_timeout_ms",
            Range::ms(100, 3600000),
            "a connection that moves no byte for this long is closed",
        ),
    ],
);

const LOG: Section = Section::new("log", LOG_KEYS);

raw_section! {
    RawTrace, TRACE, "trace", "trace." {
        log: bool = true, Range::Any,
            "per-request events as `tracing` DEBUG events (target `weir_llm_adapter::trace`) inside \
            the request's `llm_request` span (span events with the feature `otel`)";
        subject: String = String::new(), Range::text("a NATS subject without wildcards"),
            "also publish them as JSON on this subject";
        buffer: u64 = 4096, Range::int(1, 1000000),
            "events buffered for the NATS publisher; overflow is counted and dropped";
    }
}

raw_section! {
    RawStream, STREAM, "stream", "stream." {
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

raw_section! {
    RawJetStream, JETSTREAM, "jetstream", "jetstream." {
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
    BACKENDS,
    BACKENDS_SIM,
    BACKENDS_OPENAI,
    BACKENDS_NATS,
    POOL,
    PRIORITY,
    NATS,
    SERVICE,
    ADMIN,
    TRACE,
    STREAM,
    JETSTREAM,
    LOG,
];
