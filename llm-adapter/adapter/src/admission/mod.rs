//! The admission core: a bounded queue in front of a fixed pool of workers, with
//! per-session caps and ordering, per-key concurrency limits, idempotency, cancellation
//! and deadlines. No NATS in here: requests come in as [`Submission`]s with an opaque
//! waiter, and answers go out through a [`Sink`]. The workers serve one backend, or a
//! pool of them (`pool.rs`: each backend its own slots, estimator and ready queue;
//! routing, health and failover in `state/routing.rs` and `state/health.rs`).
//!
//! Tasks: exactly `workers` worker tasks (each backend's `slots`, summing to `workers`)
//! and one timer task ("sweeper", which also finds stalled calls), spawned by
//! [`Admission::start`] / [`Admission::start_pool`]. Nothing is spawned per request: a request is an entry in the
//! state machine (`admission/state.rs`) until a worker picks it; its answer is delivered by whoever
//! settles it (the submitter for immediate refusals, a worker, the sweeper, a cancel, or
//! shutdown).
//!
//! Invariants a reader must not break:
//! - every submission gets exactly one answer (its waiter is delivered exactly once);
//! - memory is bounded by `queue_capacity` queued entries + `workers` running ones (plus
//!   joined waiters, which ride on an existing entry, and the bounded completion cache);
//! - a request whose deadline passed is never handed to the backend: the check and the
//!   transition to Running happen under one lock; during inference the backend future is
//!   dropped at `deadline − deadline.reply_margin` (or at the backend timeout, on cancel,
//!   at the end of the shutdown grace), so that its answer still reaches the caller;
//! - admission predicts (from the backend's service-time estimate, `estimator.rs`) and
//!   refuses at once what cannot finish in time; the prediction only refuses early, the
//!   checks above stay the guarantee;
//! - under `queue_order = "edf"` (the default) a new request overtakes queued ones only
//!   as far as each still starts in time (none is displaced into a refusal), and keeps
//!   a bounded share of its own slack for earlier deadlines (`state.rs`) — except that
//!   interactive work goes first within its slack, and displaces queued batch work when
//!   the queue is full or it would otherwise be late (`priority.rs`);
//! - the state lock is a `std::sync::Mutex` that is never held across an `.await`;
//! - a cancel (by request id or of a whole session, `state/barge_in.rs`) returns only
//!   once every running request it aborted has had its backend call dropped and its
//!   answer delivered (bounded by [`SETTLE_WAIT`]): nothing of a cancelled stream
//!   follows the cancel's acknowledgement.
//!
//! Time is tokio time, so tests drive everything with `start_paused = true`.

mod barge_in;
mod cache;
mod coalesce;
mod estimator;
mod gates;
mod pool;
mod priority;
#[cfg(test)]
mod priority_tests;
mod slots;
mod state;
mod stats;
mod streaming;
#[cfg(test)]
mod tokens_tests;
mod usage;

use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use serde::Serialize;
use tokio::sync::{Notify, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use weir_protocol::WireName;
use weir_protocol::llm::{AdmissionPolicy, ErrorBody, ErrorCode, ErrorDetails, TraceContext};

pub use estimator::{EstimateSource, EstimateView, Estimator, EstimatorConfig};
pub use pool::{BackendView, HealthConfig, PoolSlots};
pub use priority::{DEFAULT_BATCH_DELAY, Priority, PriorityConfig};
pub use stats::{CacheSnapshot, Percentiles, StatsSnapshot, StreamSnapshot};
pub use streaming::{PIECES_IN_FLIGHT, StopReason, StreamOut, StreamSettings, StreamStop};

pub use self::barge_in::SETTLE_WAIT;
use self::barge_in::settled;
pub use self::gates::key_limits::KeyError;
pub(crate) use self::gates::key_limits::resolve_keys;
pub use self::state::SessionCancel;
pub use self::state::TokenKeyView;
use self::state::{Effects, State};
use self::stats::Stats;
use crate::backend::{Backend, BackendErrorKind, BackendReply, BackendRequest};
use crate::config::{
    Config, DeadlineConfig, IdempotencyConfig, KeyLimit, Mode, QueueOrder, SessionConfig,
};
use crate::metrics as m;
use crate::sync::locked;
use crate::trace::Tracer;

/// The part of [`Config`] the admission core uses (`Config::admission`).
#[derive(Debug, Clone, PartialEq)]
pub struct AdmissionConfig {
    /// Fixed number of workers (concurrent backend calls).
    pub workers: NonZeroUsize,
    /// Most requests admitted but not yet started, over all sessions and keys.
    pub queue_capacity: NonZeroUsize,
    /// Enforce or shadow.
    pub mode: Mode,
    /// Per-session rules: cap and ordering.
    pub session: SessionConfig,
    /// Per-key limits, applied in order (narrow key first).
    pub limits: Vec<KeyLimit>,
    /// Deadlines.
    pub deadline: DeadlineConfig,
    /// Which ready request a free worker takes first.
    pub queue_order: QueueOrder,
    /// The backend's service-time estimator.
    pub estimator: EstimatorConfig,
    /// Idempotency; `None` = disabled.
    pub idempotency: Option<IdempotencyConfig>,
    /// The backend's own per-call timeout (`backend.timeout`).
    pub backend_timeout: Duration,
    /// The backend pool (`[[backends]]`), in configuration order; `workers` is then the
    /// sum of their slots. Empty = one backend with `workers` slots and
    /// `backend_timeout` (`[backend]`).
    pub pool: Vec<PoolSlots>,
    /// Health of the pool's backends (`[pool]`); off with a single backend.
    pub health: HealthConfig,
    /// Priority classes (`[priority]`, `priority.rs`).
    pub priority: PriorityConfig,
    /// Grace period for running requests at shutdown.
    pub shutdown_grace: Duration,
    /// Most bytes of a unary reply body the backend may read
    /// ([`BackendRequest::max_reply_bytes`]); set from the NATS `max_payload` by
    /// [`crate::start`], `usize::MAX` (no cap) otherwise. Also the largest `chunk`.
    pub max_reply_bytes: usize,
    /// How streamed replies are coalesced (`stream.chunk_interval_ms`,
    /// `stream.chunk_max_bytes`).
    pub stream: StreamSettings,
}

impl From<&Config> for AdmissionConfig {
    fn from(c: &Config) -> Self {
        c.admission.clone()
    }
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        Config::default().admission
    }
}

/// One request offered to the admission core.
#[derive(Debug, Clone)]
pub struct Submission {
    /// The caller's request id (idempotency and cancellation).
    pub request_id: Option<String>,
    /// The session (cap, ordering, session-keyed limits).
    pub session: Option<String>,
    /// The caller's identity for client-keyed limits.
    pub client_key: Option<String>,
    /// What to do when the session is busy.
    pub policy: AdmissionPolicy,
    /// Remaining budget at `received_at`; `None` = the configured default.
    pub budget: Option<Duration>,
    /// When the adapter received the request (queue time starts here).
    pub received_at: Instant,
    /// The body, passed to the backend unchanged.
    pub body: Bytes,
    /// Where a streamed reply goes (`Weir-Stream: 1`); `None` = a unary reply.
    pub stream: Option<Arc<dyn StreamOut>>,
    /// The request's `llm_request` span ([`crate::trace::request_span`]): the trace
    /// events are emitted inside it, the backend call runs in a child of it.
    pub span: tracing::Span,
    /// The caller's W3C trace context (`traceparent`), passed on to the backend.
    pub trace: Option<TraceContext>,
    /// `Weir-Priority`; `None` = the class of its keys (`limits[].priority`), else
    /// interactive.
    pub priority: Option<Priority>,
}

impl Submission {
    /// A submission received now with no metadata.
    pub fn new(body: impl Into<Bytes>) -> Self {
        Self {
            request_id: None,
            session: None,
            client_key: None,
            policy: AdmissionPolicy::Enqueue,
            budget: None,
            received_at: Instant::now(),
            body: body.into(),
            stream: None,
            span: crate::trace::request_span(None, None, None, None),
            trace: None,
            priority: None,
        }
    }

    /// Sets the priority class.
    pub fn priority(mut self, p: Priority) -> Self {
        self.priority = Some(p);
        self
    }

    /// Asks for a streamed reply through `out`.
    pub fn stream(mut self, out: Arc<dyn StreamOut>) -> Self {
        self.stream = Some(out);
        self
    }

    /// Sets the request id.
    pub fn request_id(mut self, id: impl Into<String>) -> Self {
        self.request_id = Some(id.into());
        self
    }

    /// Sets the session.
    pub fn session(mut self, s: impl Into<String>) -> Self {
        self.session = Some(s.into());
        self
    }

    /// Sets the client key.
    pub fn client_key(mut self, k: impl Into<String>) -> Self {
        self.client_key = Some(k.into());
        self
    }

    /// Sets the session-busy policy.
    pub fn policy(mut self, p: AdmissionPolicy) -> Self {
        self.policy = p;
        self
    }

    /// Sets the budget.
    pub fn budget(mut self, b: Duration) -> Self {
        self.budget = Some(b);
        self
    }
}

/// How a request ended, shared by every waiter of the request.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The backend's reply, or why there is none.
    pub result: Result<BackendReply, ErrorBody>,
    /// Receipt → start of inference (or → the answer, if it never started).
    pub queue_time: Duration,
    /// Duration of the backend call, if one started.
    pub inference_time: Option<Duration>,
    /// The request id.
    pub request_id: Option<String>,
}

impl Outcome {
    /// `ok` or the error code.
    pub fn code(&self) -> &'static str {
        match &self.result {
            Ok(_) => "ok",
            Err(e) => e.code.as_str(),
        }
    }

    /// The error code, `None` on success.
    pub fn error_code(&self) -> Option<ErrorCode> {
        self.result.as_ref().err().map(|e| e.code)
    }
}

/// What [`Admission::submit`] did with a submission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admitted {
    /// Queued; the answer comes later.
    Queued,
    /// Joined a live request with the same id; the answer comes with it.
    Joined,
    /// Answered from the completion cache (already delivered).
    Cached,
    /// Refused (already delivered).
    Refused(ErrorCode),
}

/// What [`Admission::cancel`] found.
#[derive(strum::IntoStaticStr, strum::Display, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CancelResult {
    /// It was queued; it has been answered `cancelled`.
    Queued,
    /// It was running; the backend call is being aborted and answered `cancelled`.
    Running,
    /// No queued or running request has this id.
    NotFound,
}

/// Where a request is, by request id (`llm.status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum RequestStatus {
    /// Admitted, waiting to start.
    Queued {
        /// 1-based position among the queued requests (1 = next), in the order workers
        /// take them (deadline order under EDF, arrival under FIFO).
        position: usize,
        /// Predicted wait before inference starts (`None` without an estimate).
        predicted_start: Option<Duration>,
        /// Time since receipt.
        waited: Duration,
    },
    /// Inference in progress.
    Running {
        /// Since the start of inference.
        elapsed: Duration,
    },
    /// Finished `ok`, and its reply is still in the idempotency cache (a retry with the
    /// same id gets it without running again).
    Done,
    /// Not queued, not running, not cached.
    NotFound,
}

impl RequestStatus {
    /// `queued`, `running`, `done` or `not_found`.
    pub fn as_str(&self) -> &'static str {
        self.into()
    }
}

/// Why a running call is aborted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AbortReason {
    Cancelled,
    /// A later request of the same session superseded it (its request id, if any).
    Superseded {
        by: Option<String>,
    },
    ShuttingDown,
}

/// A request handed to a worker.
pub(crate) struct Job {
    pub(crate) id: u64,
    /// The member of the pool it runs on.
    pub(crate) member: usize,
    /// How far the call got (pool with health on): written here, read by the sweeper.
    pub(crate) progress: Option<Arc<pool::Progress>>,
    pub(crate) request: BackendRequest,
    /// `deadline − reply_margin`: the call is aborted then.
    pub(crate) answer_by: Option<Instant>,
    pub(crate) started_at: Instant,
    /// Receipt → start.
    pub(crate) queue_time: Duration,
    pub(crate) abort: oneshot::Receiver<AbortReason>,
    /// Where the reply is streamed, for a streamed request.
    pub(crate) stream: Option<Arc<dyn StreamOut>>,
    /// A retry on another backend after a failover: a streamed one already got its
    /// `started` event and was counted as a stream.
    pub(crate) retry: bool,
    /// The request's `llm_request` span.
    pub(crate) span: tracing::Span,
}

/// Where answers go. The NATS edge publishes a reply; [`ChannelSink`] sends on a
/// oneshot channel.
pub trait Sink: Send + Sync + 'static {
    /// Identifies one caller waiting for an answer.
    type Waiter: Send + 'static;

    /// Delivers `outcome` to `waiter`. Called exactly once per waiter. Must not wait
    /// without bound (the NATS sink bounds its publish with a timeout). The future is
    /// awaited in place (not boxed): one reply costs no allocation here.
    fn deliver(
        &self,
        waiter: Self::Waiter,
        outcome: Arc<Outcome>,
    ) -> impl Future<Output = ()> + Send;
}

/// A [`Sink`] whose waiters are oneshot senders (tests, in-process callers).
#[derive(Debug, Clone, Copy, Default)]
pub struct ChannelSink;

impl Sink for ChannelSink {
    type Waiter = oneshot::Sender<Arc<Outcome>>;

    fn deliver(
        &self,
        waiter: Self::Waiter,
        outcome: Arc<Outcome>,
    ) -> impl Future<Output = ()> + Send {
        // The receiver may be gone (caller stopped waiting); the answer is then dropped.
        let _ = waiter.send(outcome);
        std::future::ready(())
    }
}

/// The live limits view: queue, busiest keys, busiest sessions.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LimitsView {
    /// The global queue.
    pub queue: QueueView,
    /// Busiest per-key limit keys (in flight + waiting, then longest wait).
    pub keys: Vec<KeyView>,
    /// Sessions with the most pending requests.
    pub sessions: Vec<SessionView>,
    /// Token budgets: the tracked keys with the fewest tokens left (share of their
    /// budget).
    pub tokens: Vec<TokenKeyView>,
}

/// The global queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct QueueView {
    /// Admitted, not started.
    pub depth: usize,
    /// Capacity.
    pub capacity: usize,
    /// Backend calls in progress.
    pub running: usize,
    /// Workers.
    pub workers: usize,
    /// No longer admitting.
    pub shutting_down: bool,
}

/// One key of a per-key limit.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KeyView {
    /// The limit's name.
    pub rule: String,
    /// The key.
    pub key: String,
    /// The limit.
    pub limit: usize,
    /// Slots held.
    pub in_flight: usize,
    /// Requests waiting.
    pub waiting: usize,
    /// How long the head waiter has waited, ms.
    pub longest_wait_ms: f64,
}

/// One session.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SessionView {
    /// The session id.
    pub session: String,
    /// Accepted-but-unsettled requests.
    pub pending: usize,
    /// The cap (`null` = unlimited).
    pub limit: Option<usize>,
    /// Requests waiting behind the session's active one.
    pub waiting: usize,
    /// How long the first of them has waited, ms.
    pub longest_wait_ms: f64,
}

/// What shutdown did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ShutdownReport {
    /// Queued requests answered `shutting_down`.
    pub answered_queued: usize,
    /// Running requests still running at the end of the grace period, aborted and
    /// answered `shutting_down`.
    pub aborted_running: usize,
}

struct Inner<S: Sink> {
    cfg: Arc<AdmissionConfig>,
    state: Mutex<State<S::Waiter>>,
    stats: Arc<Stats>,
    /// One backend per member of the pool, in its order.
    backends: Vec<Arc<dyn Backend>>,
    /// Each member's own per-call timeout.
    timeouts: Vec<Duration>,
    /// Failover on (a pool with health): a call keeps a copy of its request.
    failover: bool,
    sink: Arc<S>,
    /// Wakes idle workers of each member when requests bound to it become ready.
    work: Vec<Notify>,
    /// Wakes the sweeper when an earlier timer was added.
    timers: Notify,
    /// Stops the sweeper (shutdown, once the workers are done).
    stop: CancellationToken,
    answered_at_shutdown: AtomicUsize,
    workers: Mutex<Vec<JoinHandle<()>>>,
    sweeper: Mutex<Option<JoinHandle<()>>>,
}

/// The admission core. Cheap to clone; call [`Admission::shutdown`] to stop its tasks.
pub struct Admission<S: Sink> {
    inner: Arc<Inner<S>>,
}

impl<S: Sink> Clone for Admission<S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<S: Sink> Inner<S> {
    fn lock(&self) -> MutexGuard<'_, State<S::Waiter>> {
        // A poisoned lock means a bug panicked mid-transition; keep serving rather
        // than turning one bug into a crash of every request.
        locked(&self.state)
    }

    /// Runs one state transition at `now` under the lock, then (the lock released)
    /// carries out its effects.
    async fn step<R>(
        &self,
        transition: impl FnOnce(&mut State<S::Waiter>, Instant, &mut Effects<S::Waiter>) -> R,
    ) -> R {
        let mut fx = Effects::default();
        let r = transition(&mut self.lock(), Instant::now(), &mut fx);
        self.apply(fx).await;
        r
    }

    async fn apply(&self, fx: Effects<S::Waiter>) {
        // Every member with new ready requests gets as many wake-ups (a spare one only
        // makes an idle worker look once more).
        for (b, work) in self.work.iter().enumerate() {
            if fx.ready_on & pool::bit(b) != 0 {
                for _ in 0..fx.ready_added {
                    work.notify_one();
                }
            }
        }
        if fx.timers_changed {
            self.timers.notify_one();
        }
        for n in fx.notices {
            n.out.queued(n.position, n.predicted_start).await;
        }
        for (waiter, outcome) in fx.deliveries {
            self.stats.answered(&outcome);
            self.sink.deliver(waiter, outcome).await;
        }
        // Answers delivered: a waiting cancel may acknowledge now.
        drop(fx.settled);
    }

    /// The next job, if any, and whether the worker should exit (shutting down and
    /// nothing left to start).
    async fn take_job(&self, member: usize) -> (Option<Job>, bool) {
        let mut fx = Effects::default();
        let (job, exit) = {
            let mut st = self.lock();
            // Reading the clock costs; an idle worker that finds nothing skips it.
            let job = if st.has_ready(member) {
                st.start_next(member, Instant::now(), &mut fx)
            } else {
                None
            };
            let exit = job.is_none() && st.is_shutting_down();
            (job, exit)
        };
        self.apply(fx).await;
        (job, exit)
    }

    async fn run_job(&self, job: Job) {
        let Job {
            id,
            member,
            progress,
            request,
            answer_by: deadline,
            started_at,
            queue_time,
            mut abort,
            stream,
            retry: again,
            span: _,
        } = job;
        let mut request = request;
        let Some(backend) = self.backends.get(member % self.backends.len().max(1)) else {
            return;
        };
        // The backend call's own span, child of `llm_request` (the current span); its
        // context is what the backend receives as `traceparent`.
        let backend_span = tracing::info_span!("backend_call", backend = backend.name());
        request.trace = crate::trace::outgoing(&backend_span, request.trace.as_ref());
        let retry = self.failover.then(|| request.clone());
        let backend_timeout =
            (self.timeouts.get(member).copied()).unwrap_or(self.cfg.backend_timeout);
        let backend_end = started_at + backend_timeout;
        let (limit_at, deadline_first) = match deadline {
            Some(d) if d <= backend_end => (d, true),
            _ => (backend_end, false),
        };
        let failed_over = AtomicBool::new(false);
        let aborted = |reason: Result<AbortReason, oneshot::error::RecvError>| match reason {
            Ok(AbortReason::Cancelled) => ErrorBody::new(
                ErrorCode::Cancelled,
                "cancelled while running; backend call aborted",
            ),
            Ok(AbortReason::Superseded { by: Some(by) }) => ErrorBody::new(
                ErrorCode::Cancelled,
                format!(
                    "superseded by request {by} of the same session while running; backend call aborted"
                ),
            ),
            Ok(AbortReason::Superseded { by: None }) => ErrorBody::new(
                ErrorCode::Cancelled,
                "superseded by a later request of the same session while running; backend call aborted",
            ),
            _ => ErrorBody::new(
                ErrorCode::ShuttingDown,
                "shutdown grace period ended; backend call aborted",
            ),
        };
        let limited = || {
            if deadline_first {
                ErrorBody::new(ErrorCode::DeadlineExceeded, DEADLINE_DURING_INFERENCE).with_details(
                    ErrorDetails {
                        waited_ms: Some(crate::millis::whole_ms(limit_at - started_at)),
                        ..Default::default()
                    },
                )
            } else {
                ErrorBody::new(
                    ErrorCode::BackendTimeout,
                    format!(
                        "backend did not answer within backend.timeout_ms ({} ms)",
                        backend_timeout.as_millis()
                    ),
                )
            }
        };
        // A stall found by the sweeper (pool with health): the call is dropped and the
        // request handed back for a failover.
        let stalled = async {
            match &progress {
                Some(p) => p.failed_over().await,
                None => std::future::pending().await,
            }
            failed_over.store(true, Ordering::Relaxed);
            ErrorBody::new(
                ErrorCode::BackendError,
                "backend stalled (no reply bytes) and was ejected; call aborted",
            )
        };
        // Precedence when several are ready at once: an abort, then the backend's
        // answer, then a stall, then the deadline / backend timeout.
        let result = match stream {
            None => {
                let call = tracing::Instrument::instrument(
                    backend_span.in_scope(|| backend.call(request)),
                    backend_span,
                );
                tokio::select! {
                    biased;
                    reason = &mut abort => Err(aborted(reason)),
                    r = call => r.map_err(|e| backend_failure(&e, deadline)),
                    e = stalled => Err(e),
                    _ = tokio::time::sleep_until(limit_at) => Err(limited()),
                }
            }
            Some(out) => {
                let stop = async {
                    tokio::select! {
                        biased;
                        reason = &mut abort => aborted(reason),
                        e = stalled => e,
                        _ = tokio::time::sleep_until(limit_at) => limited(),
                    }
                };
                if !again {
                    self.stats.streams.add(1);
                    out.started(queue_time).await;
                }
                tracing::Instrument::instrument(
                    streaming::run_stream(
                        &**backend,
                        request,
                        &*out,
                        &self.stats,
                        self.cfg.stream,
                        started_at,
                        progress.as_deref(),
                        stop,
                    ),
                    backend_span,
                )
                .await
            }
        };
        if failed_over.load(Ordering::Relaxed) {
            self.step(|st, now, fx| st.failover(id, retry, now, fx))
                .await;
            return;
        }
        self.step(|st, now, fx| {
            let took = now.saturating_duration_since(started_at);
            st.finish(id, result, took, now, fx);
        })
        .await;
    }
}

/// The message of a call aborted (or timed out) at its deadline.
const DEADLINE_DURING_INFERENCE: &str = "deadline passed during inference; backend call aborted";

/// The answer for a failed backend call.
pub(crate) fn backend_failure(
    e: &crate::backend::BackendError,
    deadline: Option<Instant>,
) -> ErrorBody {
    match e.kind() {
        // A backend that bounds its call by the remaining budget (the NATS backend)
        // times out at the deadline: that is the deadline's doing.
        BackendErrorKind::Timeout if deadline.is_some_and(|d| Instant::now() >= d) => {
            ErrorBody::new(ErrorCode::DeadlineExceeded, DEADLINE_DURING_INFERENCE)
        }
        BackendErrorKind::Timeout => ErrorBody::new(ErrorCode::BackendTimeout, e.to_string()),
        // The backend's own overload: retryable after its `Retry-After` (kept as
        // `backend_error` so that callers built before the distinction still match).
        BackendErrorKind::Overloaded => ErrorBody::new(ErrorCode::BackendError, e.to_string())
            .with_details(ErrorDetails {
                retry_after_ms: e.retry_after().map(crate::millis::whole_ms),
                backend_status: e.status(),
                ..Default::default()
            }),
        BackendErrorKind::TooLarge | BackendErrorKind::Failed | BackendErrorKind::Unavailable => {
            ErrorBody::new(ErrorCode::BackendError, e.to_string()).with_details(ErrorDetails {
                backend_status: e.status(),
                limit: e.limit(),
                ..Default::default()
            })
        }
    }
}

async fn worker<S: Sink>(inner: Arc<Inner<S>>, member: usize) {
    loop {
        let Some(job) = next_job(&inner, member).await else {
            return;
        };
        // The request's span (opened at receipt): the backend call's log lines
        // carry its ids.
        let span = job.span.clone();
        span.record("queue_ms", job.queue_time.as_millis() as u64);
        tracing::Instrument::instrument(inner.run_job(job), span).await;
    }
}

/// Waits for the next job; `None` when the worker should exit (shutting down and
/// nothing left to start).
///
/// The wake-up registration lives only while the worker is idle. A worker that held it
/// through a job would be a waiter that cannot act: `notify_one` hands a newly ready
/// request's wake-up to the longest-registered waiter, which can be that busy worker,
/// and the request would then wait for its call to end while other workers sleep.
/// Dropping the registration before the job forwards a wake-up it already received to
/// another waiter (tokio's `Notified` does so on drop).
async fn next_job<S: Sink>(inner: &Inner<S>, member: usize) -> Option<Job> {
    let work = inner.work.get(member)?;
    loop {
        // Register before looking, so a request made ready in between is not missed.
        let notified = work.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let (job, exit) = inner.take_job(member).await;
        if job.is_some() {
            return job;
        }
        if exit {
            return None;
        }
        notified.await;
    }
}

async fn sweeper<S: Sink>(inner: Arc<Inner<S>>) {
    loop {
        let notified = inner.timers.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let next = inner
            .step(|st, now, fx| {
                st.expire(now, fx);
                st.next_wake()
            })
            .await;
        if inner.stop.is_cancelled() {
            return;
        }
        // Woken by the first timer, an earlier one, or the stop: one more pass, then
        // the stop is seen above.
        let first = async {
            match next {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = first => {}
            _ = &mut notified => {}
            _ = inner.stop.cancelled() => {}
        }
    }
}

impl<S: Sink> Admission<S> {
    /// Starts the workers and the timer task. Must be called inside a tokio runtime.
    /// With a pool (`cfg.pool`), every member calls `backend`: see
    /// [`Admission::start_pool`].
    pub fn start(
        cfg: AdmissionConfig,
        backend: Arc<dyn Backend>,
        sink: Arc<S>,
        tracer: Tracer,
    ) -> Self {
        Self::start_pool(cfg, vec![backend], sink, tracer)
    }

    /// Starts the workers (each member's `slots`) and the timer task over a pool:
    /// `backends[i]` serves member `i` of `cfg.pool` (a single backend when
    /// `cfg.pool` is empty); when fewer are given they are reused in turn. Must be
    /// called inside a tokio runtime.
    ///
    /// # Panics
    /// If `backends` is empty (a programming error).
    pub fn start_pool(
        cfg: AdmissionConfig,
        backends: Vec<Arc<dyn Backend>>,
        sink: Arc<S>,
        tracer: Tracer,
    ) -> Self {
        assert!(
            !backends.is_empty(),
            "Admission::start_pool without a backend"
        );
        let backend = backends[0].clone();
        let cfg = Arc::new(cfg);
        let mut rules: Vec<String> = [
            gates::RULE_QUEUE,
            gates::RULE_SESSION_CAP,
            gates::RULE_SESSION_ORDER,
            gates::RULE_PREDICTED,
            gates::RULE_START_BUDGET,
        ]
        .into_iter()
        .map(str::to_owned)
        .collect();
        rules.extend(cfg.limits.iter().map(|l| l.name.clone()));
        let stats = Arc::new(Stats::new(&rules, backend.name()));
        metrics::gauge!(m::WORKERS).set(cfg.workers.get() as f64);
        metrics::gauge!(m::QUEUE_CAPACITY).set(cfg.queue_capacity.get() as f64);
        let members = pool::Pool::new(&cfg);
        let slots: Vec<usize> = members.members.iter().map(|m| m.slots).collect();
        let timeouts = members.members.iter().map(|m| m.timeout).collect();
        let failover = members.health_on;
        drop(backend);
        let inner = Arc::new(Inner {
            state: Mutex::new(State::new(cfg.clone(), stats.clone(), tracer)),
            cfg,
            stats,
            backends: (0..slots.len())
                .map(|i| backends[i % backends.len()].clone())
                .collect(),
            timeouts,
            failover,
            sink,
            work: slots.iter().map(|_| Notify::new()).collect(),
            timers: Notify::new(),
            stop: CancellationToken::new(),
            answered_at_shutdown: AtomicUsize::new(0),
            workers: Mutex::new(Vec::new()),
            sweeper: Mutex::new(None),
        });
        let workers = (slots.iter().enumerate())
            .flat_map(|(b, n)| (0..*n).map(move |_| b))
            .map(|b| tokio::spawn(worker(inner.clone(), b)))
            .collect();
        *locked(&inner.workers) = workers;
        *locked(&inner.sweeper) = Some(tokio::spawn(sweeper(inner.clone())));
        Self { inner }
    }

    /// The configuration.
    pub fn config(&self) -> &AdmissionConfig {
        &self.inner.cfg
    }

    /// Offers one request. Immediate answers (refusal, cached reply) are delivered
    /// before this returns; otherwise the waiter is answered later.
    pub async fn submit(&self, sub: Submission, waiter: S::Waiter) -> Admitted {
        self.inner
            .step(|st, now, fx| st.submit(sub, waiter, now, fx))
            .await
    }

    /// Cancels the queued or running request with this request id. A running one is
    /// waited for (at most [`SETTLE_WAIT`]): on return its backend call was dropped and
    /// it was answered.
    pub async fn cancel(&self, request_id: &str) -> CancelResult {
        let (r, rx) = self
            .inner
            .step(|st, now, fx| {
                let r = st.cancel(request_id, now, fx);
                let rx = (r == CancelResult::Running)
                    .then(|| st.on_settled(request_id))
                    .flatten();
                (r, rx)
            })
            .await;
        settled(rx.into_iter().collect()).await;
        metrics::counter!(m::CANCEL_TOTAL, "result" => r.as_str()).increment(1);
        r
    }

    /// Where the request with this request id is.
    pub fn status(&self, request_id: &str) -> RequestStatus {
        self.inner.lock().status(request_id, Instant::now())
    }

    /// Counters and histograms.
    pub fn stats(&self) -> StatsSnapshot {
        let mut s = self.inner.stats.snapshot();
        let st = self.inner.lock();
        s.queued_now = st.queued() as u64;
        s.running_now = st.running() as u64;
        (s.slots_acquired, s.slots_released) = st.slot_totals();
        s.tokens = st.token_stats();
        self.inner.stats.publish_tokens(&s.tokens);
        let est = st.estimate_view();
        s.service_estimate = Some(est);
        // Metrics are published when read (a scrape reads stats), not per request.
        self.inner.stats.publish(st.queued(), st.running(), &est);
        st.publish_backends();
        s
    }

    /// Each backend of the pool: slots, estimate, health, ejections, spills.
    pub fn backends(&self) -> Vec<BackendView> {
        self.inner.lock().backends_view(Instant::now())
    }

    /// The backend's service-time estimate.
    pub fn estimate(&self) -> EstimateView {
        self.inner.lock().estimate_view()
    }

    /// Appends the latency histograms (`weir_llm_queue_wait_seconds`,
    /// `weir_llm_inference_seconds`) in the Prometheus text format.
    pub fn render_histograms(&self, out: &mut String) {
        self.inner.stats.render_histograms(out);
    }

    /// The busiest keys and sessions (at most `top` of each).
    pub fn limits_view(&self, top: usize) -> LimitsView {
        self.inner.lock().limits_view(top, Instant::now())
    }

    /// Answers a request that could not be decoded (counted as offered and answered).
    pub async fn answer_now(&self, waiter: S::Waiter, error: ErrorBody, received_at: Instant) {
        self.inner.stats.offered.add(1);
        let outcome = Arc::new(Outcome {
            result: Err(error),
            queue_time: received_at.elapsed(),
            inference_time: None,
            request_id: None,
        });
        self.inner.stats.answered(&outcome);
        self.inner.sink.deliver(waiter, outcome).await;
    }

    /// First step of shutdown: from now on every submission is answered
    /// `shutting_down`, and every queued request is answered `shutting_down` now.
    /// Running requests continue. Returns how many queued requests were answered.
    pub async fn stop_admitting(&self) -> usize {
        let n = self.inner.step(State::begin_shutdown).await;
        self.inner
            .answered_at_shutdown
            .fetch_add(n, Ordering::Relaxed);
        for work in &self.inner.work {
            work.notify_waiters();
        }
        n
    }

    /// Whether shutdown has begun.
    pub fn is_shutting_down(&self) -> bool {
        self.inner.lock().is_shutting_down()
    }

    /// Stops admitting (new submissions get `shutting_down`), answers every queued
    /// request `shutting_down`, lets running requests finish within the grace period,
    /// then aborts the rest (answered `shutting_down`) and stops the tasks.
    /// Calling it again is harmless.
    pub async fn shutdown(&self) -> ShutdownReport {
        self.stop_admitting().await;
        let workers: Vec<JoinHandle<()>> = std::mem::take(&mut *locked(&self.inner.workers));
        let mut all = futures::future::join_all(workers);
        let mut aborted_running = 0;
        if tokio::time::timeout(self.inner.cfg.shutdown_grace, &mut all)
            .await
            .is_err()
        {
            aborted_running = self.inner.lock().abort_running();
            // Aborted calls are answered at once; bound the wait anyway.
            let _ = tokio::time::timeout(Duration::from_secs(5), all).await;
        }
        self.inner.stop.cancel();
        let sweeper = locked(&self.inner.sweeper).take();
        if let Some(h) = sweeper {
            let _ = tokio::time::timeout(Duration::from_secs(1), h).await;
        }
        ShutdownReport {
            answered_queued: self.inner.answered_at_shutdown.load(Ordering::Relaxed),
            aborted_running,
        }
    }

    #[cfg(test)]
    pub(crate) fn check_invariants(&self) {
        self.inner.lock().check_invariants();
    }
}

impl Admission<ChannelSink> {
    /// Submits and returns the receiver of the answer.
    pub async fn call(&self, sub: Submission) -> (Admitted, oneshot::Receiver<Arc<Outcome>>) {
        let (tx, rx) = oneshot::channel();
        let a = self.submit(sub, tx).await;
        (a, rx)
    }
}

#[cfg(test)]
mod pool_tests;
#[cfg(test)]
mod tests;
