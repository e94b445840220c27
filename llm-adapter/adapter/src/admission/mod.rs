//! The admission core: a bounded queue in front of a fixed pool of workers, with
//! per-session caps and ordering, per-key concurrency limits, idempotency, cancellation
//! and deadlines. No NATS in here: requests come in as [`Submission`]s with an opaque
//! waiter, and answers go out through a [`Sink`]. The workers serve one backend, or a
//! pool of them (`pool.rs`: each backend its own slots, estimator and ready queue;
//! routing, health and failover in `state/routing.rs` and `state/health.rs`).
//!
//! Tasks: exactly `workers` worker tasks and one timer task, the sweeper (`tasks.rs`).
//! Nothing is spawned per request: a request is an entry in the state machine
//! (`state.rs`) until a worker picks it; its answer is delivered by whoever settles it
//! (the submitter for immediate refusals, a worker, the sweeper, a cancel, shutdown).
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
mod job;
mod pool;
mod priority;
#[cfg(test)]
mod priority_tests;
mod request;
mod slots;
mod state;
mod stats;
mod streaming;
mod tasks;
#[cfg(test)]
mod tokens_tests;
mod usage;
mod views;

use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{Notify, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use weir_protocol::WireName;
use weir_protocol::llm::ErrorBody;
use weir_service::sync::locked;

pub use estimator::{EstimateSource, EstimateView, Estimator, EstimatorConfig};
pub use pool::{BackendView, HealthConfig, PoolSlots};
pub use priority::{DEFAULT_BATCH_DELAY, Priority, PriorityConfig};
pub use stats::{CacheSnapshot, Percentiles, StatsSnapshot, StreamSnapshot};
pub use streaming::{PIECES_IN_FLIGHT, StopReason, StreamOut, StreamSettings, StreamStop};

pub use self::barge_in::SETTLE_WAIT;
use self::barge_in::settled;
pub use self::gates::key_limits::KeyError;
pub(crate) use self::gates::key_limits::resolve_keys;
pub use self::gates::tokens::TokenKeyView;
pub(crate) use self::job::{AbortReason, Job, backend_failure};
pub use self::request::{
    Admitted, CancelResult, ChannelSink, Outcome, RequestStatus, Sink, Submission,
};
pub use self::state::SessionCancel;
use self::state::{Effects, State};
use self::stats::Stats;
pub use self::views::{KeyView, LimitsView, QueueView, SessionView, ShutdownReport};
use crate::backend::Backend;
use crate::config::{
    Config, DeadlineConfig, IdempotencyConfig, KeyLimit, Mode, QueueOrder, SessionConfig,
};
use crate::metrics as m;
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

impl Default for AdmissionConfig {
    fn default() -> Self {
        Config::default().admission
    }
}

struct Inner<S: Sink> {
    cfg: Arc<AdmissionConfig>,
    state: Mutex<State<S::Waiter>>,
    stats: Arc<Stats>,
    /// One backend per member of the pool, in its order.
    backends: Vec<Arc<dyn Backend>>,
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
}

impl<S: Sink> Admission<S> {
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
        let stats = Arc::new(Stats::new(&rules, backends[0].name()));
        metrics::gauge!(m::WORKERS).set(cfg.workers.get() as f64);
        metrics::gauge!(m::QUEUE_CAPACITY).set(cfg.queue_capacity.get() as f64);
        let pool = pool::backends(&cfg);
        let inner = Arc::new(Inner {
            state: Mutex::new(State::new(cfg.clone(), stats.clone(), tracer)),
            cfg,
            stats,
            backends: (0..pool.len())
                .map(|i| backends[i % backends.len()].clone())
                .collect(),
            sink,
            work: pool.iter().map(|_| Notify::new()).collect(),
            timers: Notify::new(),
            stop: CancellationToken::new(),
            answered_at_shutdown: AtomicUsize::new(0),
            workers: Mutex::new(Vec::new()),
            sweeper: Mutex::new(None),
        });
        let workers = (pool.iter().enumerate())
            .flat_map(|(b, p)| (0..p.slots.get()).map(move |_| b))
            .map(|b| tokio::spawn(tasks::worker(inner.clone(), b)))
            .collect();
        *locked(&inner.workers) = workers;
        *locked(&inner.sweeper) = Some(tokio::spawn(tasks::sweeper(inner.clone())));
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
        s.tokens = st.tokens.stats();
        self.inner.stats.publish_tokens(&s.tokens);
        let est = st.pool.members[0].estimator.view();
        s.service_estimate = Some(est);
        // Metrics are published when read (a scrape reads stats), not per request.
        self.inner.stats.publish(st.queued(), st.running(), &est);
        pool::publish(&st.pool.members);
        s
    }

    /// Each backend of the pool: slots, estimate, health, ejections, spills.
    pub fn backends(&self) -> Vec<BackendView> {
        let now = Instant::now();
        (self.inner.lock().pool.members.iter())
            .map(|m| m.view(now))
            .collect()
    }

    /// The backend's service-time estimate (the first member's: the only one of a
    /// single backend).
    pub fn estimate(&self) -> EstimateView {
        self.inner.lock().pool.members[0].estimator.view()
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
        let outcome = Arc::new(Outcome::refused(error, received_at.elapsed(), None));
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
