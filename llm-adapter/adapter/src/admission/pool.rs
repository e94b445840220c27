//! The backend pool: one or more backends, each with its own slots (worker tasks), its
//! own service-time estimator, its own ready queue and its own health.
//!
//! Invariants:
//! - every queued or running request is bound to exactly one member; a worker of
//!   member `b` only starts requests bound to `b`;
//! - each member's ready queue is keyed like the single ready queue was (the EDF order
//!   key fixed at admission), so a request rebound to another member keeps its place in
//!   the deadline order;
//! - a member with `slots` workers runs at most `slots` calls;
//! - a single `[backend]` is a pool of one with `workers` slots and health off: its
//!   behaviour is the one of the adapter before the pool.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::AdmissionConfig;
use super::estimator::{EstimateView, Estimator, EstimatorConfig};
use super::gates::deadline::ReadyKey;

/// One backend's slots as the admission core sees them (`[[backends]]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolSlots {
    /// Its name.
    pub name: String,
    /// Concurrent calls (worker tasks).
    pub slots: NonZeroUsize,
    /// Its own per-call timeout.
    pub timeout: Duration,
    /// Cost of a call here (lower preferred among the backends in time).
    pub weight: u32,
}

/// Health of the pool's backends (`[pool]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthConfig {
    /// Consecutive failed calls that eject a backend.
    pub eject_after_errors: u32,
    /// A running call without a reply byte for this many estimates is a stall.
    pub stall_factor: u32,
    /// Least time without a reply byte that counts as a stall.
    pub stall_floor: Duration,
    /// First ejection's length.
    pub backoff_base: Duration,
    /// Longest ejection.
    pub backoff_max: Duration,
}

impl Default for HealthConfig {
    /// The defaults of `[pool]`.
    fn default() -> Self {
        AdmissionConfig::default().health
    }
}

/// One backend of the pool as `/v1/stats` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BackendView {
    /// Its name.
    pub name: String,
    /// Its slots.
    pub slots: usize,
    /// Slots busy (calls running).
    pub busy: usize,
    /// Queued requests bound to it.
    pub queued: usize,
    /// Its weight (cost).
    pub weight: u32,
    /// `healthy`, `ejected`, `probe_due` or `probing`.
    pub health: &'static str,
    /// While ejected: time left before its probe.
    pub ejected_for_ms: Option<u64>,
    /// Its service-time estimate.
    pub estimate: EstimateView,
    /// Times it was ejected.
    pub ejections: u64,
    /// Requests of a session it served last that missed their deadline here and went
    /// to another backend.
    pub spills: u64,
    /// Requests moved away from it (queued when it was ejected, or stalled calls).
    pub failovers: u64,
}

/// Publishes the per-backend metrics (when stats are read, like the other gauges).
pub(crate) fn publish(members: &[Member]) {
    use crate::metrics as m;
    for b in members {
        let name = b.backend.name.clone();
        let slots = b.backend.slots.get();
        metrics::gauge!(m::BACKEND_SLOTS, "backend" => name.clone()).set(slots as f64);
        metrics::gauge!(m::BACKEND_SLOTS_BUSY, "backend" => name.clone()).set(b.running() as f64);
        if let Some(e) = b.estimator.estimate() {
            metrics::gauge!(m::BACKEND_ESTIMATE_SECONDS, "backend" => name.clone())
                .set(e.as_secs_f64());
        }
        // 0 healthy, 1 probing (or due), 2 ejected.
        let health = match b.health {
            Health::Healthy => 0.0,
            Health::ProbeDue | Health::Probing { .. } => 1.0,
            Health::Ejected { .. } => 2.0,
        };
        metrics::gauge!(m::BACKEND_HEALTH, "backend" => name.clone()).set(health);
        metrics::counter!(m::BACKEND_EJECTIONS_TOTAL, "backend" => name.clone())
            .absolute(b.ejections);
        metrics::counter!(m::BACKEND_SPILLS_TOTAL, "backend" => name.clone()).absolute(b.spills);
        metrics::counter!(m::BACKEND_FAILOVERS_TOTAL, "backend" => name).absolute(b.failovers);
    }
}

/// The bit of `member` in `Effects::ready_on` (`state.rs`); members past the 64th
/// share every bit (they are woken whenever anything became ready).
pub(crate) fn bit(member: usize) -> u64 {
    u32::try_from(member)
        .ok()
        .and_then(|m| 1u64.checked_shl(m))
        .unwrap_or(u64::MAX)
}

/// Most sessions whose last backend is remembered (affinity); the oldest is forgotten
/// first.
pub(crate) const AFFINITY_SESSIONS: usize = 65_536;

/// A member's health; its name (`healthy`, `ejected`, `probe_due`, `probing`) is what
/// [`BackendView::health`] shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub(crate) enum Health {
    /// Takes requests.
    Healthy,
    /// Takes nothing until `until`.
    Ejected { until: Instant },
    /// The back-off ended: the next request routed here (or the first queued here) is
    /// the probe.
    ProbeDue,
    /// The probe (request `id`) runs; nothing else starts here until it ends.
    Probing { id: u64 },
}

/// One backend of the pool as the state machine sees it.
pub(crate) struct Member {
    /// Its name, slots, timeout and weight.
    pub(crate) backend: PoolSlots,
    pub(crate) estimator: Estimator,
    /// Requests bound here that passed every gate, in the order workers take them.
    pub(crate) ready: BTreeMap<ReadyKey, u64>,
    /// Start of each call running here.
    pub(crate) running_since: HashMap<u64, Instant>,
    /// Queued (not running) requests bound here, wherever they wait.
    pub(crate) queued: usize,
    pub(crate) health: Health,
    /// Consecutive failed calls.
    pub(crate) failures: u32,
    /// The next ejection's length.
    pub(crate) backoff: Duration,
    pub(crate) ejections: u64,
    /// Requests of a session whose last backend (this one) would have missed the
    /// deadline, sent elsewhere.
    pub(crate) spills: u64,
    /// Calls moved away from here (stalled or queued when ejected).
    pub(crate) failovers: u64,
}

impl Member {
    fn new(backend: PoolSlots, estimator: EstimatorConfig, backoff: Duration) -> Self {
        Self {
            backend,
            estimator: Estimator::new(estimator),
            ready: BTreeMap::new(),
            running_since: HashMap::new(),
            queued: 0,
            health: Health::Healthy,
            failures: 0,
            backoff,
            ejections: 0,
            spills: 0,
            failovers: 0,
        }
    }

    pub(crate) fn running(&self) -> usize {
        self.running_since.len()
    }

    /// Whether new requests may be routed here and its workers may start one now
    /// (healthy, or due for its probe).
    pub(crate) fn routable(&self) -> bool {
        matches!(self.health, Health::Healthy | Health::ProbeDue)
    }

    /// What `/v1/stats` shows of it.
    pub(crate) fn view(&self, now: Instant) -> BackendView {
        BackendView {
            name: self.backend.name.clone(),
            slots: self.backend.slots.get(),
            busy: self.running(),
            queued: self.queued,
            weight: self.backend.weight,
            health: self.health.into(),
            ejected_for_ms: match self.health {
                Health::Ejected { until } => Some(weir_service::config::whole_ms(
                    until.saturating_duration_since(now),
                )),
                _ => None,
            },
            estimate: self.estimator.view(),
            ejections: self.ejections,
            spills: self.spills,
            failovers: self.failovers,
        }
    }
}

/// The backends of `cfg`: its `[[backends]]`, or one with `workers` slots.
pub(crate) fn backends(cfg: &AdmissionConfig) -> Vec<PoolSlots> {
    if !cfg.pool.is_empty() {
        return cfg.pool.clone();
    }
    vec![PoolSlots {
        name: "default".into(),
        slots: cfg.workers,
        timeout: cfg.backend_timeout,
        weight: 1,
    }]
}

/// The members, and the sessions' last backends.
pub(crate) struct Pool {
    pub(crate) members: Vec<Member>,
    /// Health and failover on (`[[backends]]`); off for a single `[backend]`.
    pub(crate) health_on: bool,
    pub(crate) health: HealthConfig,
    /// The backend that served each session's last turn, bounded by
    /// [`AFFINITY_SESSIONS`] (oldest forgotten first).
    affinity: HashMap<String, usize>,
    affinity_order: VecDeque<String>,
}

impl Pool {
    /// The pool of `cfg`: its `[[backends]]`, or one member with `workers` slots.
    pub(crate) fn new(cfg: &AdmissionConfig) -> Self {
        Self {
            members: (backends(cfg).into_iter())
                .map(|s| Member::new(s, cfg.estimator, cfg.health.backoff_base))
                .collect(),
            health_on: !cfg.pool.is_empty(),
            health: cfg.health,
            affinity: HashMap::new(),
            affinity_order: VecDeque::new(),
        }
    }

    /// The member that served `session`'s last turn.
    pub(crate) fn last_of(&self, session: Option<&str>) -> Option<usize> {
        session.and_then(|s| self.affinity.get(s).copied())
    }

    /// Remembers that `member` served `session`.
    pub(crate) fn served(&mut self, session: &str, member: usize) {
        if let Some(m) = self.affinity.get_mut(session) {
            *m = member;
            return;
        }
        if self.affinity_order.len() >= AFFINITY_SESSIONS
            && let Some(old) = self.affinity_order.pop_front()
        {
            self.affinity.remove(&old);
        }
        self.affinity.insert(session.to_owned(), member);
        self.affinity_order.push_back(session.to_owned());
    }

    /// How long a call on `member` may go without a reply byte before it is a stall;
    /// `None` without an estimate or with health off.
    pub(crate) fn stall_after(&self, member: usize) -> Option<Duration> {
        if !self.health_on {
            return None;
        }
        let est = self.members.get(member)?.estimator.estimate()?;
        Some(
            est.saturating_mul(self.health.stall_factor)
                .max(self.health.stall_floor),
        )
    }

    /// A new request was bound to `member`; it spilled from `spilled_from`.
    pub(crate) fn admitted(&mut self, member: usize, spilled_from: Option<usize>) {
        if let Some(m) = self.members.get_mut(member) {
            m.queued += 1;
        }
        if let Some(m) = spilled_from.and_then(|f| self.members.get_mut(f)) {
            m.spills += 1;
        }
    }

    /// A worker of `member` starts request `id`: the probe, if one is due.
    pub(crate) fn starting(&mut self, member: usize, id: u64) {
        if let Some(m) = self.members.get_mut(member)
            && m.health == Health::ProbeDue
        {
            m.health = Health::Probing { id };
        }
    }
}

/// How far a running call got, written by its worker without the state lock and read
/// by the sweeper (stall detection): the last reply byte, whether a chunk reached the
/// caller (a streamed call that sent one cannot be retried elsewhere), and whether the
/// worker is waiting for the caller (a streamed call whose caller reads slowly stops
/// reading the backend: that silence is the caller's, not a backend stall).
#[derive(Debug)]
pub(crate) struct Progress {
    started: Instant,
    /// Milliseconds from `started` to the last reply byte; 0 = none yet.
    last_ms: AtomicU64,
    chunk_sent: AtomicBool,
    waiting_on_caller: AtomicBool,
    /// Set by the sweeper when the call stalled: the worker drops it and hands the
    /// request back for a failover (its cancel channel stays free for a cancel).
    failing_over: AtomicBool,
    wake: Notify,
}

impl Progress {
    pub(crate) fn new(started: Instant) -> Self {
        Self {
            started,
            last_ms: AtomicU64::new(0),
            chunk_sent: AtomicBool::new(false),
            waiting_on_caller: AtomicBool::new(false),
            failing_over: AtomicBool::new(false),
            wake: Notify::new(),
        }
    }

    /// Tells the worker to drop the call for a failover.
    pub(crate) fn fail_over(&self) {
        self.failing_over.store(true, Ordering::Relaxed);
        self.wake.notify_one();
    }

    /// Whether the call was told to fail over.
    pub(crate) fn failing_over(&self) -> bool {
        self.failing_over.load(Ordering::Relaxed)
    }

    /// Resolves once the call is told to fail over.
    pub(crate) async fn failed_over(&self) {
        // `notify_one` keeps a permit when nobody waits yet.
        while !self.failing_over() {
            self.wake.notified().await;
        }
    }

    /// Reply bytes arrived now.
    pub(crate) fn bytes(&self) {
        let ms = self.started.elapsed().as_millis();
        self.last_ms
            .store(u64::try_from(ms).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// A chunk reached the caller.
    pub(crate) fn chunk_sent(&self) {
        self.chunk_sent.store(true, Ordering::Relaxed);
    }

    /// The worker waits for the caller (`true`) or no longer does (`false`, which
    /// counts as progress: the stall clock starts again).
    pub(crate) fn waiting_on_caller(&self, waiting: bool) {
        if !waiting {
            self.bytes();
        }
        self.waiting_on_caller.store(waiting, Ordering::Relaxed);
    }

    /// When the last reply byte arrived (the start without one); `now` while the worker
    /// waits for the caller.
    pub(crate) fn last(&self, now: Instant) -> Instant {
        if self.waiting_on_caller.load(Ordering::Relaxed) {
            return now;
        }
        self.started + Duration::from_millis(self.last_ms.load(Ordering::Relaxed))
    }

    /// Whether a chunk reached the caller.
    pub(crate) fn sent(&self) -> bool {
        self.chunk_sent.load(Ordering::Relaxed)
    }
}
