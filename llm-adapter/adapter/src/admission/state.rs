//! The synchronous admission state machine. No tokio tasks, no NATS, no I/O: every
//! method takes `now` and returns [`Effects`] (answers to deliver, workers to wake) that
//! the async runtime in [`super`] carries out after releasing the lock.
//!
//! A request moves through stages, each optional:
//!
//! ```text
//! submit ─┬─ refused at once (answer)
//!         ├─ joined (same request id, waits for the same outcome)
//!         ├─ cached (same request id, answered from the completion cache)
//!         └─ queued ─> Session (FIFO behind the session's active request)
//!                   ─> Gate(i) (FIFO waiting for a slot of limit i's key)
//!                   ─> Ready (waiting for a worker, in `queue_order`)
//!                   ─> Running (backend call)      ─> retired (answered)
//! ```
//!
//! Invariants (checked by `check_invariants` in tests):
//! - `queued` = entries not Running ≤ `queue_capacity` (shadow mode does not lift it);
//!   `running` = Running entries ≤ `workers`;
//! - every entry is in exactly one place: one session FIFO, one gate waiter queue, the
//!   ready queue, or running (the active request of a session is in a gate, ready or
//!   running);
//! - strict FIFO per key: a gate's waiters are non-empty only while the key's slots are
//!   all taken; a slot freed is granted to the head waiter before anyone else;
//! - an entry leaves the map only in [`State::retire`], which drops its slot guards (so
//!   every slot is released exactly once), answers all its waiters, and then promotes the
//!   next request of its session and pumps the gates whose slots it freed;
//! - a request is never started once its deadline has passed ([`State::start_next`]
//!   checks it under the same lock that marks it Running);
//! - `answer_by = deadline − reply_margin`: a queued request is answered by then (its
//!   deadline timer is never later), a running one is aborted then, and with the
//!   adaptive start budget a queued request is answered as soon as less than the
//!   service-time estimate is left before it — so every refusal leaves before the
//!   deadline;
//! - the prediction at admission ([`State::predict`]) only refuses early; it never
//!   replaces the checks at the start of inference and during it, which are the
//!   guarantee (a probe — a request admitted onto an idle backend against the
//!   prediction — is exempt from the adaptive start budget only);
//! - under EDF (the default) every queued request, wherever it waits, has an order key
//!   fixed at admission (its due instant, then its admission id) and sits in `edf`;
//!   the ready queue is served in that order, so session FIFO and per-key FIFO still
//!   decide when a request becomes ready, and EDF only which ready one goes first;
//! - an admission never pushes a queued request that fits (global term: start +
//!   estimate ≤ `answer_by − now`) past its latest start: a new request overtakes a
//!   queued one only if that one keeps an estimate of slack afterwards, otherwise it
//!   goes behind the last one it would squeeze ([`State::edf_place`]) and is refused
//!   at once if it does not fit there — no admitted request is displaced into a
//!   refusal (requests admitted without a prediction — cold start, `predict = false` —
//!   take their plain EDF place);
//! - the overtaking is bounded: under EDF a request is admitted only if its predicted
//!   start leaves `overtake_share` of its slack (up to `deadline.overtake_share_pct`,
//!   sized by the share of recent requests with at most half its budget) for earlier
//!   deadlines; with one budget class the share is 0 and admission is as under FIFO;
//! - cascades (a release that grants a slot whose holder is then refused at the next
//!   gate, which releases ...) run from a work list, never by recursion.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;
use weir_protocol::WireName;
use weir_protocol::llm::{AdmissionPolicy, ErrorBody, ErrorCode, ErrorDetails};

use super::cache::CompletionCache;
use super::estimator::{EstimateView, Estimator};
use super::slots::{SlotGuard, SlotTable};
use super::stats::Stats;
use super::{
    AbortReason, AdmissionConfig, Admitted, CancelResult, Job, KeyView, LimitsView, Outcome,
    QueueView, RequestStatus, SessionView, StreamOut, Submission,
};
use crate::backend::{BackendReply, BackendRequest};
use crate::config::{KeySource, Mode, OnBusy, QueueOrder};
use crate::millis::whole_ms as millis;
use crate::trace::{TraceEvent, TraceKind, Tracer, ms};

/// Rule names used in traces, would-reject counts and metrics.
pub(crate) const RULE_SESSION_CAP: &str = "session_cap";
/// See [`RULE_SESSION_CAP`].
pub(crate) const RULE_SESSION_ORDER: &str = "session_order";
/// See [`RULE_SESSION_CAP`].
pub(crate) const RULE_QUEUE: &str = "queue";
/// Refused at admission: predicted not to finish before its deadline.
pub(crate) const RULE_PREDICTED: &str = "deadline_predicted";
/// Answered while queued or at the start of inference: its remaining budget fell
/// below the start budget (the estimate, or `deadline.min_start_budget_ms`).
pub(crate) const RULE_START_BUDGET: &str = "start_budget";

/// What the caller must do after a state transition, outside the lock.
pub(crate) struct Effects<W> {
    /// Answers to send.
    pub(crate) deliveries: Vec<(W, Arc<Outcome>)>,
    /// Requests that became ready (wake this many workers).
    pub(crate) ready_added: usize,
    /// A timer earlier than all previous ones was added (wake the sweeper).
    pub(crate) timers_changed: bool,
    /// `queued` events to publish to streaming callers.
    pub(crate) notices: Vec<Notice>,
    todo: VecDeque<Action>,
}

/// A `queued` event for a streaming caller: its position and predicted start.
pub(crate) struct Notice {
    pub(crate) out: Arc<dyn StreamOut>,
    pub(crate) position: usize,
    pub(crate) predicted_start: Option<Duration>,
}

/// Least time between two `queued` events of one request.
pub(crate) const POSITION_EVERY: Duration = Duration::from_secs(1);

impl<W> Default for Effects<W> {
    fn default() -> Self {
        Self {
            deliveries: Vec::new(),
            ready_added: 0,
            timers_changed: false,
            notices: Vec::new(),
            todo: VecDeque::new(),
        }
    }
}

enum Action {
    /// Move the entry through the gates from `from` on.
    Advance { id: u64, from: usize },
    /// Grant freed slots of `key` at gate `gate` to its waiters.
    Pump { gate: usize, key: String },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Session,
    Gate(usize),
    Ready,
    Running,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum TimerKind {
    Deadline,
    GateWait,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Timer {
    at: Instant,
    id: u64,
    kind: TimerKind,
}

/// What makes two submissions with the same request id "the same request".
#[derive(Debug, Clone, PartialEq, Eq)]
struct Fingerprint {
    session: Option<String>,
    body_len: usize,
    body_hash: u64,
}

impl Fingerprint {
    fn of(sub: &Submission) -> Self {
        let mut h = DefaultHasher::new();
        sub.body.hash(&mut h);
        Self {
            session: sub.session.clone(),
            body_len: sub.body.len(),
            body_hash: h.finish(),
        }
    }
}

struct Entry<W> {
    id: u64,
    request_id: Option<String>,
    fingerprint: Option<Fingerprint>,
    session: Option<String>,
    keys: Vec<Option<String>>,
    stage: Stage,
    received_at: Instant,
    deadline: Option<Instant>,
    /// `deadline − reply_margin`: the last moment an answer is still useful.
    answer_by: Option<Instant>,
    /// Admitted onto an idle backend although predicted too slow (the estimator must
    /// get samples to come down): exempt from the adaptive start budget.
    probe: bool,
    /// Position in the ready queue while Ready.
    ready_key: Option<ReadyKey>,
    /// Under EDF: position among all queued requests (the ready-queue key once
    /// Ready), fixed at admission; `None` under FIFO and once Running.
    order: Option<ReadyKey>,
    stage_since: Instant,
    started_at: Option<Instant>,
    session_slot: Option<SlotGuard>,
    key_slots: Vec<(usize, SlotGuard)>,
    /// The submitter's waiter (always present until retired) ...
    waiter: Option<W>,
    /// ... and those of requests that joined it (idempotent retries).
    joined: Vec<W>,
    request: Option<BackendRequest>,
    abort: Option<oneshot::Sender<AbortReason>>,
    gate_timer: Option<Timer>,
    deadline_timer: Option<Timer>,
    /// Where a streamed reply goes; `None` for a unary one.
    stream: Option<Arc<dyn StreamOut>>,
    /// The position last sent in a `queued` event, and when.
    notified: Option<(usize, Instant)>,
    /// The request's `llm_request` span: its trace events are emitted inside it.
    span: tracing::Span,
}

#[derive(Default)]
struct Gate {
    slots: SlotTable,
    waiters: HashMap<String, VecDeque<u64>>,
}

#[derive(Default)]
struct SessionOrder {
    active: Option<u64>,
    fifo: VecDeque<u64>,
}

/// The admission state. Owned by a mutex in [`super::Admission`].
pub(crate) struct State<W> {
    cfg: Arc<AdmissionConfig>,
    stats: Arc<Stats>,
    tracer: Tracer,
    entries: HashMap<u64, Entry<W>>,
    next_id: u64,
    by_request_id: HashMap<String, u64>,
    cache: CompletionCache<Fingerprint>,
    session_slots: SlotTable,
    sessions: HashMap<String, SessionOrder>,
    gates: Vec<Gate>,
    /// Ready entries in the order workers take them ([`QueueOrder`]).
    ready: BTreeMap<ReadyKey, u64>,
    ready_seq: u64,
    /// Under EDF: every queued request (wherever it waits) by its order key, with its
    /// `answer_by` — what the placement of a new request reads.
    edf: BTreeMap<ReadyKey, Option<Instant>>,
    /// The budgets of the last [`RECENT_BUDGETS`] requests offered with a deadline
    /// (the overtake share reads them).
    budgets: VecDeque<Duration>,
    /// Start of each running call (the predictor counts what is left of it).
    running_since: HashMap<u64, Instant>,
    queued: usize,
    running: usize,
    timers: BTreeSet<Timer>,
    shutting_down: bool,
    estimator: Estimator,
    /// The FIFO order's constant first key.
    epoch: Instant,
    /// Queued (not running) requests with a streamed reply: their position is sent
    /// again when it changes, at most every [`POSITION_EVERY`].
    stream_queued: BTreeSet<u64>,
    /// When the positions of `stream_queued` are looked at next.
    next_position_pass: Option<Instant>,
}

/// Ready-queue order: (due instant under EDF, or a constant under FIFO; admission id
/// under EDF, arrival in the ready queue under FIFO).
type ReadyKey = (Instant, u64);

/// How many recent budgets the overtake share is taken from.
const RECENT_BUDGETS: usize = 64;

/// Slack, in service-time estimates, that an overtaken request keeps: a request
/// squeezed to zero slack by earlier deadlines would miss its start at the first
/// stall of the machine (measured: late refusals and caller timeouts at 2x mixed).
const OVERTAKE_GUARD: f64 = 1.0;

/// What the predictor says about a new request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Prediction {
    /// Predicted wait before inference starts.
    pub(crate) start: Duration,
    /// The service-time estimate used.
    pub(crate) estimate: Duration,
    /// Under EDF: where the request goes among the queued ones.
    pub(crate) order: ReadyKey,
}

fn millis_ceil(d: Duration) -> u64 {
    let ms = millis(d);
    if Duration::from_millis(ms) < d {
        ms.saturating_add(1)
    } else {
        ms
    }
}

fn refusal(code: ErrorCode, message: String, details: ErrorDetails) -> ErrorBody {
    ErrorBody::new(code, message).with_details(details)
}

/// `deadline_exceeded` for a queued request that is not started: how long it waited,
/// the budget left at `now` and the service-time estimate.
fn not_started(
    message: String,
    waited: Duration,
    deadline: Option<Instant>,
    now: Instant,
    estimate: Option<Duration>,
) -> ErrorBody {
    let details = ErrorDetails {
        waited_ms: Some(millis(waited)),
        budget_ms: deadline.map(|d| millis(d.saturating_duration_since(now))),
        estimate_ms: estimate.map(millis_ceil),
        ..Default::default()
    };
    refusal(ErrorCode::DeadlineExceeded, message, details)
}

/// A refusal whose one detail is how long the request waited.
fn after_wait(code: ErrorCode, message: &str, waited: Duration) -> ErrorBody {
    let details = ErrorDetails {
        waited_ms: Some(millis(waited)),
        ..Default::default()
    };
    refusal(code, message.into(), details)
}

impl<W> State<W> {
    pub(crate) fn new(cfg: Arc<AdmissionConfig>, stats: Arc<Stats>, tracer: Tracer) -> Self {
        let gates = cfg.limits.iter().map(|_| Gate::default()).collect();
        let estimator = Estimator::new(cfg.estimator);
        let (entries, bytes) =
            (cfg.idempotency).map_or((0, 0), |i| (i.max_entries.get(), i.max_bytes.get()));
        let cache = CompletionCache::new(entries, bytes, stats.clone());
        Self {
            cfg,
            stats,
            tracer,
            entries: HashMap::new(),
            next_id: 1,
            by_request_id: HashMap::new(),
            cache,
            session_slots: SlotTable::default(),
            sessions: HashMap::new(),
            gates,
            ready: BTreeMap::new(),
            ready_seq: 0,
            edf: BTreeMap::new(),
            budgets: VecDeque::with_capacity(RECENT_BUDGETS),
            running_since: HashMap::new(),
            queued: 0,
            running: 0,
            timers: BTreeSet::new(),
            shutting_down: false,
            estimator,
            epoch: Instant::now(),
            stream_queued: BTreeSet::new(),
            next_position_pass: None,
        }
    }

    fn shadow(&self) -> bool {
        self.cfg.mode == Mode::Shadow
    }

    pub(crate) fn queued(&self) -> usize {
        self.queued
    }

    pub(crate) fn running(&self) -> usize {
        self.running
    }

    pub(crate) fn is_shutting_down(&self) -> bool {
        self.shutting_down
    }

    pub(crate) fn slot_totals(&self) -> (u64, u64) {
        let (mut a, mut r) = self.session_slots.totals();
        for g in &self.gates {
            let (ga, gr) = g.slots.totals();
            a += ga;
            r += gr;
        }
        (a, r)
    }

    /// Estimated time for one inference, for retry hints (100 ms before any).
    fn service_estimate(&self) -> Duration {
        self.estimator
            .estimate()
            .unwrap_or(Duration::from_millis(100))
    }

    /// The estimator's state.
    pub(crate) fn estimate_view(&self) -> EstimateView {
        self.estimator.view()
    }

    /// Whether the start budget follows the estimate (`min_start_budget_ms` unset).
    fn adaptive(&self) -> bool {
        self.cfg.deadline.min_start_budget.is_none()
    }

    /// When a queued entry must be looked at again: just after `answer_by − estimate`
    /// under the adaptive start budget (probes and cold start: `answer_by`). The extra
    /// millisecond makes the timer agree with the start check (`left < estimate`
    /// refuses): a worker free at exactly `answer_by − estimate` starts the request.
    fn deadline_timer_at(&self, answer_by: Instant, probe: bool) -> Instant {
        match self.estimator.estimate() {
            Some(est) if self.adaptive() && !probe => answer_by
                .checked_sub(est)
                .map_or(answer_by, |t| (t + Duration::from_millis(1)).min(answer_by)),
            _ => answer_by,
        }
    }

    /// (Re-)arms the deadline timer of a queued entry.
    fn arm_deadline(&mut self, id: u64, fx: &mut Effects<W>) {
        let Some(e) = self.entries.get(&id) else {
            return;
        };
        let (Some(answer_by), old) = (e.answer_by, e.deadline_timer) else {
            return;
        };
        let t = Timer {
            at: self.deadline_timer_at(answer_by, e.probe),
            id,
            kind: TimerKind::Deadline,
        };
        if let Some(old) = old {
            self.timers.remove(&old);
        }
        if let Some(e) = self.entries.get_mut(&id) {
            e.deadline_timer = Some(t);
        }
        self.add_timer(t, fx);
    }

    /// Predicts when a new request would start: the larger of
    /// - the global term: what is left of the running calls plus one estimate per
    ///   queued request ahead of it (under FIFO every queued request, wherever it
    ///   waits; under EDF those ahead of its place, [`State::edf_place`]), shared over
    ///   the workers;
    /// - the session term (ordering on): what is left of its session's active request,
    ///   then one turn of the ready queue (`max(1, (ready + running) / workers)`
    ///   estimates) per request queued behind it and for itself, one after the other;
    /// - each key gate's term: the holders and waiters ahead of it, `limit` at a time.
    ///
    /// `due` and `id` are the new request's EDF due instant and admission id. `None`
    /// without an estimate (cold start with no seed).
    pub(crate) fn predict(
        &self,
        session: Option<&str>,
        keys: &[Option<String>],
        due: Instant,
        id: u64,
        now: Instant,
    ) -> Option<Prediction> {
        let est = self.estimator.estimate()?;
        let e = est.as_secs_f64();
        let left = |started: &Instant| {
            (e - now.saturating_duration_since(*started).as_secs_f64()).max(0.0)
        };
        let running = self.running_left(e, now);
        // Every queued request counts, not only the ready ones: a request waiting behind
        // its session or at a key gate reaches the ready queue later, possibly while
        // this one still waits behind its own session or gate (measured: with session
        // ordering, counting only the ready queue admitted what then came late).
        let (ahead, order) = match self.cfg.queue_order {
            QueueOrder::Fifo => (self.queued, (self.epoch, id)),
            QueueOrder::Edf => {
                let (order, ahead) = self.edf_place(due, id, e, running, now);
                (ahead, order)
            }
        };
        let mut serial = 0.0f64;
        if self.cfg.session.ordering
            && let Some(s) = session
            && let Some(o) = self.sessions.get(s)
            && let Some(active) = o.active
        {
            // Each request of the session enters the ready queue only when the one
            // before it finished, at the back: one turn of the ready queue (`cycle`)
            // per request, not one estimate (measured with 10 sessions at 2x).
            let w = self.cfg.workers.get() as f64;
            let cycle = e * ((self.ready.len() + self.running) as f64 / w).max(1.0);
            let active_left = self.running_since.get(&active).map_or(cycle, left);
            serial = active_left + o.fifo.len() as f64 * cycle + (cycle - e);
        }
        let mut gate = 0.0f64;
        if !self.shadow() {
            for (gi, key) in keys.iter().enumerate() {
                let (Some(key), Some(limit)) = (key, self.cfg.limits.get(gi)) else {
                    continue;
                };
                let l = limit.limit.get();
                let g = &self.gates[gi];
                let waiting = g.waiters.get(key).map_or(0, VecDeque::len);
                let held = g.slots.in_use(key);
                if held + waiting >= l {
                    gate = gate.max((held + waiting + 1 - l) as f64 / l as f64 * e);
                }
            }
        }
        let global = self.global_start(ahead, e, running);
        Some(Prediction {
            // Finite and non-negative by construction; saturate rather than panic.
            start: Duration::try_from_secs_f64(global.max(serial).max(gate))
                .unwrap_or(Duration::MAX),
            estimate: est,
            order,
        })
    }

    /// What is left of the running calls at `now`, in seconds, with `e` s per call.
    fn running_left(&self, e: f64, now: Instant) -> f64 {
        let left = |s: &Instant| (e - now.saturating_duration_since(*s).as_secs_f64()).max(0.0);
        self.running_since.values().map(left).sum()
    }

    /// The global term of the prediction, in seconds, for a request with `ahead`
    /// queued requests ahead of it (estimate `e` s, `running` s left of the running
    /// calls): 0 while a worker is free for it.
    fn global_start(&self, ahead: usize, e: f64, running: f64) -> f64 {
        let workers = self.cfg.workers.get();
        if self.running + ahead < workers {
            0.0
        } else {
            (running + ahead as f64 * e) / workers as f64
        }
    }

    /// Under EDF: the order key of a new request due at `due` (admission id `id`) and
    /// how many queued requests are then ahead of it. It goes at its deadline
    /// position, unless one more estimate ahead would leave a request it overtakes
    /// with less than [`OVERTAKE_GUARD`] estimates of slack (one that fits now, `start
    /// + e ≤ answer_by − now`); then it goes behind the last such request. So an
    /// admission never pushes a queued request past its latest start (on the global
    /// term): overtaking is bounded by the slack of those overtaken, and nobody is
    /// displaced into a refusal. Linear in the queue (bounded by `queue_capacity`).
    fn edf_place(
        &self,
        due: Instant,
        id: u64,
        e: f64,
        running: f64,
        now: Instant,
    ) -> (ReadyKey, usize) {
        let mut key = (due, id);
        // The common case (one budget class): due after everything queued, nothing
        // overtaken, no walk.
        if self.edf.last_key_value().is_none_or(|(k, _)| *k < key) {
            return (key, self.edf.len());
        }
        let pos = self.edf.range(..key).count();
        let mut blocker = None;
        for (i, (k, by)) in self.edf.range(key..).enumerate() {
            let Some(by) = by else {
                continue;
            };
            let usable = by.saturating_duration_since(now).as_secs_f64();
            let at = pos + i;
            if self.global_start(at, e, running) + e <= usable
                && self.global_start(at + 1, e, running) + e * (1.0 + OVERTAKE_GUARD) > usable
            {
                blocker = Some(k.0);
            }
        }
        match blocker {
            None => (key, pos),
            Some(b) => {
                // Behind the blocker and everything due with it (ids are increasing).
                key = (b, id);
                (key, self.edf.range(..key).count())
            }
        }
    }

    /// The share of a request's slack kept for requests with earlier deadlines (EDF):
    /// the share of recent requests whose budget is at most half of `budget`, up to
    /// `deadline.overtake_share_pct`. 0 under FIFO and while one budget class alone
    /// is offered.
    fn overtake_share(&self, budget: Duration) -> f64 {
        let max = f64::from(self.cfg.deadline.overtake_share_pct) / 100.0;
        if self.cfg.queue_order != QueueOrder::Edf || max <= 0.0 || self.budgets.is_empty() {
            return 0.0;
        }
        let half = budget / 2;
        let shorter = self.budgets.iter().filter(|b| **b <= half).count();
        (shorter as f64 / self.budgets.len() as f64).min(max)
    }

    /// Remembers the budget of a request offered with a deadline.
    fn note_budget(&mut self, budget: Duration) {
        if self.budgets.len() >= RECENT_BUDGETS {
            self.budgets.pop_front();
        }
        self.budgets.push_back(budget);
    }

    /// The ready-queue key of a request becoming ready now: its order key under EDF,
    /// the arrival in the ready queue under FIFO.
    fn ready_key(&mut self, order: Option<ReadyKey>) -> ReadyKey {
        self.ready_seq += 1;
        match (self.cfg.queue_order, order) {
            (QueueOrder::Edf, Some(k)) => k,
            _ => (self.epoch, self.ready_seq),
        }
    }

    /// The due instant of a request under the queue order (what [`State::predict`]
    /// compares with the ready queue).
    fn due(&self, deadline: Option<Instant>, received_at: Instant) -> Instant {
        match self.cfg.queue_order {
            QueueOrder::Edf => deadline.unwrap_or(received_at + self.cfg.deadline.max),
            QueueOrder::Fifo => self.epoch,
        }
    }

    fn retry_after(&self, rounds: f64) -> Option<u64> {
        let ms = self.service_estimate().as_secs_f64() * 1000.0 * rounds.max(1.0);
        Some((ms.ceil() as u64).clamp(1, 60_000))
    }

    fn emit(
        &self,
        kind: TraceKind,
        e: &Entry<W>,
        now: Instant,
        fill: impl FnOnce(&mut TraceEvent),
    ) {
        self.tracer.emit(&e.span, || {
            let mut ev = TraceEvent::new(kind, e.id, now.saturating_duration_since(e.received_at));
            ev.request_id = e.request_id.clone();
            ev.session = e.session.clone();
            fill(&mut ev);
            ev
        });
    }

    /// An event of a submission that has no entry (yet): `id` 0 unless it joined one.
    fn emit_sub(
        &self,
        sub: &Submission,
        kind: TraceKind,
        id: u64,
        since_received: Duration,
        fill: impl FnOnce(&mut TraceEvent),
    ) {
        self.tracer.emit(&sub.span, || {
            let mut ev = TraceEvent::new(kind, id, since_received);
            ev.request_id = sub.request_id.clone();
            ev.session = sub.session.clone();
            fill(&mut ev);
            ev
        });
    }

    /// A session rule is busy for `sub`: emits `slot_busy` and counts the refusal, or in
    /// shadow mode the would-be refusal. `true` = enforce it (refuse).
    fn busy(&self, sub: &Submission, waited: Duration, rule: &str, key: Option<&str>) -> bool {
        let shadow = self.shadow();
        self.emit_sub(sub, TraceKind::SlotBusy, 0, waited, |ev| {
            ev.rule = Some(rule.to_owned());
            ev.key = key.map(str::to_owned);
            ev.shadow = shadow;
        });
        if shadow {
            self.stats.would_reject(rule);
        } else {
            self.stats.limit_reject(rule);
        }
        !shadow
    }

    /// A slot event of `rule` (and its `key`) for `e`.
    fn emit_slot(
        &self,
        kind: TraceKind,
        e: &Entry<W>,
        now: Instant,
        rule: &str,
        key: Option<&str>,
    ) {
        self.emit(kind, e, now, |ev| {
            ev.rule = Some(rule.to_owned());
            ev.key = key.map(str::to_owned);
        });
    }

    fn add_timer(&mut self, t: Timer, fx: &mut Effects<W>) {
        if self.timers.first().is_none_or(|first| t < *first) {
            fx.timers_changed = true;
        }
        self.timers.insert(t);
    }

    /// The earliest instant at which [`State::expire`] has work.
    pub(crate) fn next_wake(&self) -> Option<Instant> {
        [
            self.timers.first().map(|t| t.at),
            self.cache.next_expiry(),
            self.next_position_pass,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    // ---------------------------------------------------------------- submit

    /// Admits, joins, answers from cache, or refuses one submission.
    pub(crate) fn submit(
        &mut self,
        sub: Submission,
        waiter: W,
        now: Instant,
        fx: &mut Effects<W>,
    ) -> Admitted {
        self.stats.offered.add(1);
        self.cache.purge(now);
        let waited = now.saturating_duration_since(sub.received_at);
        // A refusal answered at once.
        let immediate = |fx: &mut Effects<W>, waiter: W, err: ErrorBody, sub: &Submission| {
            let code = err.code;
            fx.deliveries.reserve_exact(1);
            fx.deliveries.push((
                waiter,
                Arc::new(Outcome {
                    result: Err(err),
                    queue_time: waited,
                    inference_time: None,
                    request_id: sub.request_id.clone(),
                }),
            ));
            Admitted::Refused(code)
        };

        if self.shutting_down {
            return immediate(fx, waiter, shutting_down(), &sub);
        }

        // Deadline: the caller's budget (or the default), never above the maximum.
        let budget = sub
            .budget
            .or(self.cfg.deadline.default)
            .map(|b| b.min(self.cfg.deadline.max));
        let deadline = budget.map(|b| sub.received_at + b);
        if let Some(b) = budget {
            self.note_budget(b);
        }
        if let Some(d) = deadline
            && d <= now
        {
            let message = "deadline already passed at admission";
            let err = after_wait(ErrorCode::DeadlineExceeded, message, waited);
            return immediate(fx, waiter, err, &sub);
        }

        let keys = match resolve_keys(&self.cfg, &sub) {
            Ok(k) => k,
            Err(message) => {
                let err = ErrorBody::new(ErrorCode::InvalidRequest, message);
                return immediate(fx, waiter, err, &sub);
            }
        };

        // Idempotency: join a live request, or answer from the cache.
        let fingerprint = match (&self.cfg.idempotency, &sub.request_id) {
            (Some(_), Some(_)) => Some(Fingerprint::of(&sub)),
            _ => None,
        };
        if let (Some(fp), Some(rid)) = (&fingerprint, &sub.request_id) {
            if let Some(&id) = self.by_request_id.get(rid)
                && let Some(e) = self.entries.get_mut(&id)
            {
                if e.fingerprint.as_ref() != Some(fp) {
                    return immediate(fx, waiter, conflict(rid), &sub);
                }
                e.joined.push(waiter);
                self.stats.joined.add(1);
                // In the joiner's own span: its caller's trace shows that it joined.
                sub.span.record("id", id);
                let t = now.saturating_duration_since(self.entries[&id].received_at);
                self.emit_sub(&sub, TraceKind::Joined, id, t, |_| {});
                return Admitted::Joined;
            }
            if let Some(c) = self.cache.get(rid) {
                if c.fingerprint != *fp {
                    return immediate(fx, waiter, conflict(rid), &sub);
                }
                self.stats.cached.add(1);
                fx.deliveries.reserve_exact(1);
                fx.deliveries.push((waiter, c.outcome.clone()));
                self.emit_sub(&sub, TraceKind::Cached, 0, waited, |_| {});
                return Admitted::Cached;
            }
        }

        // Per-session pending cap.
        if let (Some(s), Some(cap)) = (&sub.session, self.cfg.session.pending_cap) {
            let pending = self.session_slots.in_use(s);
            let key = (pending >= cap.get()).then(|| format!("session:{s}"));
            if let Some(key) = key
                && self.busy(&sub, waited, RULE_SESSION_CAP, Some(&key))
            {
                let err = refusal(
                    ErrorCode::SessionQueueFull,
                    format!("session has {pending} pending requests (limit {cap})"),
                    ErrorDetails {
                        limit: Some(cap.get() as u64),
                        pending: Some(pending as u64),
                        retry_after_ms: self.retry_after(1.0),
                        key: Some(key),
                        ..Default::default()
                    },
                );
                return immediate(fx, waiter, err, &sub);
            }
        }

        // Per-session ordering with the `reject` policy.
        if let Some(s) = &sub.session
            && self.cfg.session.ordering
            && sub.policy == AdmissionPolicy::Reject
            && let Some(order) = self.sessions.get(s)
            && order.active.is_some()
        {
            let waiting = order.fifo.len() as u64;
            if self.busy(&sub, waited, RULE_SESSION_ORDER, None) {
                let err = refusal(
                    ErrorCode::ConcurrencyLimitExceeded,
                    "session is busy and the request asked for `reject`".into(),
                    ErrorDetails {
                        limit: Some(1),
                        in_flight: Some(1),
                        waiting: Some(waiting),
                        retry_after_ms: self.retry_after(waiting as f64 + 1.0),
                        key: Some(format!("session:{s}")),
                        ..Default::default()
                    },
                );
                return immediate(fx, waiter, err, &sub);
            }
        }

        // The global queue bound: always enforced (it is the memory bound).
        if self.queued >= self.cfg.queue_capacity.get() {
            self.stats.limit_reject(RULE_QUEUE);
            let err = refusal(
                ErrorCode::QueueFull,
                format!("queue holds {} requests (capacity)", self.queued),
                ErrorDetails {
                    limit: Some(self.cfg.queue_capacity.get() as u64),
                    pending: Some(self.queued as u64),
                    retry_after_ms: self
                        .retry_after(self.queued as f64 / self.cfg.workers.get() as f64),
                    ..Default::default()
                },
            );
            return immediate(fx, waiter, err, &sub);
        }

        // Predictive admission: refuse now what the work ahead would make late. An idle
        // backend always takes the request (a probe: a stale, too high estimate must
        // be able to come down). Under EDF a request also keeps a share of its slack
        // for earlier deadlines (`overtake_share`): the work ahead may fill only the
        // rest of what it can wait.
        let answer_by =
            deadline.map(|d| d.checked_sub(self.cfg.deadline.reply_margin).unwrap_or(d));
        let id = self.next_id;
        let due = self.due(deadline, sub.received_at);
        let mut order = (due, id);
        let mut probe = false;
        if self.cfg.deadline.predict
            && let (Some(d), Some(by)) = (deadline, answer_by)
            && let Some(p) = self.predict(sub.session.as_deref(), &keys, due, id, now)
        {
            order = p.order;
            let usable = by.saturating_duration_since(now);
            let share = budget.map_or(0.0, |b| self.overtake_share(b));
            let room = usable.saturating_sub(p.estimate).mul_f64(1.0 - share);
            let late = p.start.saturating_add(p.estimate) > usable;
            if late || p.start > room {
                if self.running == 0 && self.queued == 0 {
                    probe = true;
                } else {
                    self.stats.limit_reject(RULE_PREDICTED);
                    let budget = d.saturating_duration_since(now);
                    let kept = if late {
                        String::new()
                    } else {
                        format!(
                            ", {:.0} % of the wait kept for earlier deadlines",
                            100.0 * share
                        )
                    };
                    let over = p
                        .start
                        .saturating_add(p.estimate)
                        .saturating_sub(usable)
                        .max(p.start.saturating_sub(room));
                    let err = refusal(
                        ErrorCode::DeadlineExceeded,
                        format!(
                            "predicted to start in {} ms and take {} ms; {} ms left (reply margin {} ms){kept}",
                            millis(p.start),
                            millis(p.estimate),
                            millis(budget),
                            millis(self.cfg.deadline.reply_margin)
                        ),
                        ErrorDetails {
                            predicted_start_ms: Some(millis(p.start)),
                            budget_ms: Some(millis(budget)),
                            estimate_ms: Some(millis_ceil(p.estimate)),
                            retry_after_ms: Some(millis_ceil(over).max(1)),
                            ..Default::default()
                        },
                    );
                    return immediate(fx, waiter, err, &sub);
                }
            }
        }

        // Admit.
        self.next_id += 1;
        let order = (self.cfg.queue_order == QueueOrder::Edf).then_some(order);
        if let Some(k) = order {
            self.edf.insert(k, answer_by);
        }
        let session_slot = match (&sub.session, self.cfg.session.pending_cap) {
            (Some(s), Some(_)) => Some(self.session_slots.acquire(s)),
            _ => None,
        };
        let request = BackendRequest {
            body: sub.body,
            request_id: sub.request_id.clone(),
            session: sub.session.clone(),
            deadline,
            max_reply_bytes: self.cfg.max_reply_bytes,
            trace: sub.trace,
        };
        sub.span.record("id", id);
        let mut entry = Entry {
            id,
            request_id: sub.request_id,
            fingerprint,
            session: sub.session,
            keys,
            stage: Stage::Session,
            received_at: sub.received_at,
            deadline,
            answer_by,
            probe,
            ready_key: None,
            order,
            stage_since: now,
            started_at: None,
            session_slot,
            key_slots: Vec::new(),
            waiter: Some(waiter),
            joined: Vec::new(),
            request: Some(request),
            abort: None,
            gate_timer: None,
            deadline_timer: None,
            stream: sub.stream,
            notified: None,
            span: sub.span,
        };
        if let Some(by) = answer_by {
            let t = Timer {
                at: self.deadline_timer_at(by, probe),
                id,
                kind: TimerKind::Deadline,
            };
            entry.deadline_timer = Some(t);
            self.add_timer(t, fx);
        }
        if let (Some(rid), Some(_)) = (&entry.request_id, &entry.fingerprint) {
            self.by_request_id.insert(rid.clone(), id);
        }
        self.queued += 1;
        self.stats.admitted.add(1);
        self.emit(TraceKind::Queued, &entry, now, |_| {});
        if entry.session_slot.is_some() {
            self.emit_slot(TraceKind::SlotAcquired, &entry, now, RULE_SESSION_CAP, None);
        }

        // Session order: wait behind the active request, or become it.
        let mut behind_session = false;
        if self.cfg.session.ordering
            && let Some(s) = &entry.session
        {
            let order = self.sessions.entry(s.clone()).or_default();
            if order.active.is_some() {
                order.fifo.push_back(id);
                behind_session = true;
            } else {
                order.active = Some(id);
            }
        }
        if behind_session {
            self.emit_slot(
                TraceKind::SlotWaiting,
                &entry,
                now,
                RULE_SESSION_ORDER,
                None,
            );
        }
        self.entries.insert(id, entry);
        if !behind_session {
            self.advance(id, 0, now, fx);
        }
        self.run(now, fx);
        if self.entries.contains_key(&id) {
            self.note_stream_queued(id, now, fx);
            Admitted::Queued
        } else {
            Admitted::Refused(ErrorCode::ConcurrencyLimitExceeded)
        }
    }

    // --------------------------------------------------------- queue positions

    /// The order key a queued entry has among all queued ones: its EDF key, or its
    /// admission id under FIFO.
    fn position_key(&self, e: &Entry<W>) -> ReadyKey {
        e.order.unwrap_or((self.epoch, e.id))
    }

    /// The queued (not running) entries.
    fn queued_entries(&self) -> impl Iterator<Item = &Entry<W>> {
        self.entries.values().filter(|e| e.stage != Stage::Running)
    }

    /// The ids of the queued entries, ascending.
    fn queued_ids(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = self.queued_entries().map(|e| e.id).collect();
        ids.sort_unstable();
        ids
    }

    /// Every queued entry's order key, sorted.
    fn queued_keys(&self) -> Vec<ReadyKey> {
        let mut keys: Vec<ReadyKey> = self
            .queued_entries()
            .map(|e| self.position_key(e))
            .collect();
        keys.sort_unstable();
        keys
    }

    /// Predicted wait before a request with `ahead` queued requests ahead of it starts
    /// (the global term of [`State::predict`]); `None` without an estimate.
    fn predicted_start(&self, ahead: usize, now: Instant) -> Option<Duration> {
        let e = self.estimator.estimate()?.as_secs_f64();
        let running = self.running_left(e, now);
        Duration::try_from_secs_f64(self.global_start(ahead, e, running)).ok()
    }

    /// 1-based position of queued entry `id` and its predicted start.
    fn position(
        &self,
        keys: &[ReadyKey],
        id: u64,
        now: Instant,
    ) -> Option<(usize, Option<Duration>)> {
        let e = self
            .entries
            .get(&id)
            .filter(|e| e.stage != Stage::Running)?;
        let ahead = keys.partition_point(|k| *k < self.position_key(e));
        Some((ahead + 1, self.predicted_start(ahead, now)))
    }

    /// A streamed request was queued: when it has to wait (not ready, or more ready
    /// requests than free workers), its caller is told its position now, and again
    /// while it waits.
    fn note_stream_queued(&mut self, id: u64, now: Instant, fx: &mut Effects<W>) {
        let Some(e) = self.entries.get(&id) else {
            return;
        };
        if e.stream.is_none() {
            return;
        }
        if self.stream_queued.is_empty() {
            self.next_position_pass = Some(now + POSITION_EVERY);
            fx.timers_changed = true;
        }
        self.stream_queued.insert(id);
        let starts_now =
            e.stage == Stage::Ready && self.running + self.ready.len() <= self.cfg.workers.get();
        if !starts_now {
            let keys = self.queued_keys();
            self.notify_position(&keys, id, now, fx);
        }
    }

    /// Sends entry `id` its position if it changed since the last `queued` event and
    /// that event is at least [`POSITION_EVERY`] old.
    fn notify_position(&mut self, keys: &[ReadyKey], id: u64, now: Instant, fx: &mut Effects<W>) {
        let Some((position, predicted_start)) = self.position(keys, id, now) else {
            return;
        };
        let Some(e) = self.entries.get_mut(&id) else {
            return;
        };
        let due = match e.notified {
            None => true,
            Some((p, at)) => p != position && now >= at + POSITION_EVERY,
        };
        if let (true, Some(out)) = (due, &e.stream) {
            e.notified = Some((position, now));
            fx.notices.push(Notice {
                out: out.clone(),
                position,
                predicted_start,
            });
        }
    }

    /// The periodic pass over streamed requests still queued.
    fn position_pass(&mut self, now: Instant, fx: &mut Effects<W>) {
        if self.stream_queued.is_empty() {
            self.next_position_pass = None;
            return;
        }
        if self.next_position_pass.is_some_and(|at| now < at) {
            return;
        }
        let keys = self.queued_keys();
        let ids: Vec<u64> = self.stream_queued.iter().copied().collect();
        for id in ids {
            self.notify_position(&keys, id, now, fx);
        }
        self.next_position_pass = Some(now + POSITION_EVERY);
    }

    /// Where the request with `request_id` is: queued (position, predicted start),
    /// running (since when), done (its reply is in the completion cache) or not found.
    pub(crate) fn status(&self, request_id: &str, now: Instant) -> RequestStatus {
        if let Some(e) = self
            .by_request_id
            .get(request_id)
            .and_then(|id| self.entries.get(id))
        {
            if e.stage == Stage::Running {
                return RequestStatus::Running {
                    elapsed: e
                        .started_at
                        .map_or(Duration::ZERO, |s| now.saturating_duration_since(s)),
                };
            }
            let keys = self.queued_keys();
            if let Some((position, predicted_start)) = self.position(&keys, e.id, now) {
                return RequestStatus::Queued {
                    position,
                    predicted_start,
                    waited: now.saturating_duration_since(e.received_at),
                };
            }
        }
        if self.cache.get(request_id).is_some() {
            return RequestStatus::Done;
        }
        RequestStatus::NotFound
    }

    // ------------------------------------------------------------ the work list

    fn run(&mut self, now: Instant, fx: &mut Effects<W>) {
        while let Some(action) = fx.todo.pop_front() {
            match action {
                Action::Advance { id, from } => self.advance(id, from, now, fx),
                Action::Pump { gate, key } => self.pump(gate, &key, now, fx),
            }
        }
    }

    /// Moves entry `id` through gates `from..`; it ends up waiting at a gate, refused,
    /// or ready for a worker.
    fn advance(&mut self, id: u64, from: usize, now: Instant, fx: &mut Effects<W>) {
        if self.shutting_down {
            self.retire(id, Err(shutting_down()), now, fx);
            return;
        }
        let shadow = self.shadow();
        let cfg = self.cfg.clone();
        for gi in from..self.gates.len() {
            let Some(entry) = self.entries.get(&id) else {
                return;
            };
            let Some(key) = entry.keys.get(gi).cloned().flatten() else {
                continue;
            };
            let limit = &cfg.limits[gi];
            let gate = &self.gates[gi];
            let waiting = gate.waiters.get(&key).map_or(0, VecDeque::len);
            let in_use = gate.slots.in_use(&key);
            let free = waiting == 0 && in_use < limit.limit.get();
            if free || shadow {
                if !free {
                    // Shadow: would this request have been refused, or made to wait?
                    let over = in_use.saturating_sub(limit.limit.get()) + waiting;
                    let refused = match limit.on_busy {
                        OnBusy::Reject => true,
                        OnBusy::Wait { max_waiters, .. } => over >= max_waiters,
                    };
                    let e = &self.entries[&id];
                    let kind = match refused {
                        true => TraceKind::SlotBusy,
                        false => TraceKind::SlotWaiting,
                    };
                    self.emit(kind, e, now, |ev| {
                        ev.rule = Some(limit.name.clone());
                        ev.key = Some(key.clone());
                        ev.shadow = true;
                    });
                    if refused {
                        self.stats.would_reject(&limit.name);
                    }
                }
                let guard = self.gates[gi].slots.acquire(&key);
                if let Some(e) = self.entries.get_mut(&id) {
                    e.key_slots.push((gi, guard));
                }
                let e = &self.entries[&id];
                self.emit_slot(TraceKind::SlotAcquired, e, now, &limit.name, Some(&key));
                continue;
            }
            // Busy.
            let details = ErrorDetails {
                limit: Some(limit.limit.get() as u64),
                in_flight: Some(in_use as u64),
                waiting: Some(waiting as u64),
                retry_after_ms: self.retry_after(waiting as f64 / limit.limit.get() as f64 + 1.0),
                key: Some(key.clone()),
                ..Default::default()
            };
            match limit.on_busy {
                OnBusy::Wait {
                    max_wait,
                    max_waiters,
                } if waiting < max_waiters => {
                    self.gates[gi]
                        .waiters
                        .entry(key.clone())
                        .or_default()
                        .push_back(id);
                    let t = Timer {
                        at: now + max_wait,
                        id,
                        kind: TimerKind::GateWait,
                    };
                    if let Some(e) = self.entries.get_mut(&id) {
                        e.stage = Stage::Gate(gi);
                        e.stage_since = now;
                        e.gate_timer = Some(t);
                    }
                    self.add_timer(t, fx);
                    let e = &self.entries[&id];
                    self.emit_slot(TraceKind::SlotWaiting, e, now, &limit.name, Some(&key));
                    return;
                }
                _ => {
                    let name = &limit.name;
                    let message = match limit.on_busy {
                        OnBusy::Reject => {
                            format!("limit {name:?}: {in_use} in flight (limit {})", limit.limit)
                        }
                        OnBusy::Wait { .. } => format!(
                            "limit {name:?}: {in_use} in flight and {waiting} waiting (max waiters reached)"
                        ),
                    };
                    self.stats.limit_reject(name);
                    let e = &self.entries[&id];
                    self.emit_slot(TraceKind::SlotBusy, e, now, name, Some(&key));
                    let err = refusal(ErrorCode::ConcurrencyLimitExceeded, message, details);
                    self.retire(id, Err(err), now, fx);
                    return;
                }
            }
        }
        // Through every gate: ready for a worker.
        if let Some(order) = self.entries.get(&id).map(|e| e.order) {
            let key = self.ready_key(order);
            let Some(e) = self.entries.get_mut(&id) else {
                return;
            };
            e.stage = Stage::Ready;
            e.stage_since = now;
            e.ready_key = Some(key);
            self.ready.insert(key, id);
            fx.ready_added += 1;
            let e = &self.entries[&id];
            self.emit(TraceKind::Admitted, e, now, |_| {});
        }
    }

    /// Grants freed slots of `key` at gate `gi` to its waiters, strictly in order.
    fn pump(&mut self, gi: usize, key: &str, now: Instant, fx: &mut Effects<W>) {
        let limit = self.cfg.limits[gi].limit.get();
        loop {
            let gate = &mut self.gates[gi];
            if gate.slots.in_use(key) >= limit {
                return;
            }
            let Some(queue) = gate.waiters.get_mut(key) else {
                return;
            };
            let Some(head) = queue.pop_front() else {
                gate.waiters.remove(key);
                return;
            };
            if queue.is_empty() {
                gate.waiters.remove(key);
            }
            let guard = gate.slots.acquire(key);
            let Some(e) = self.entries.get_mut(&head) else {
                continue;
            };
            e.key_slots.push((gi, guard));
            let timer = e.gate_timer.take();
            let waited = now.saturating_duration_since(e.stage_since);
            if let Some(t) = timer {
                self.timers.remove(&t);
            }
            let e = &self.entries[&head];
            self.emit(TraceKind::SlotGranted, e, now, |ev| {
                ev.rule = Some(self.cfg.limits[gi].name.clone());
                ev.key = Some(key.to_owned());
                ev.waited_ms = Some(ms(waited));
            });
            fx.todo.push_back(Action::Advance {
                id: head,
                from: gi + 1,
            });
        }
    }

    // ------------------------------------------------------------------ retire

    /// Removes entry `id` and answers its waiters with `result`. The only place an
    /// entry leaves the map; see the module invariants.
    fn retire(
        &mut self,
        id: u64,
        result: Result<BackendReply, ErrorBody>,
        now: Instant,
        fx: &mut Effects<W>,
    ) {
        let Some(mut e) = self.entries.remove(&id) else {
            return;
        };
        self.stream_queued.remove(&id);
        match e.stage {
            Stage::Session => {
                if let Some(s) = &e.session
                    && let Some(order) = self.sessions.get_mut(s)
                    && let Some(pos) = order.fifo.iter().position(|x| *x == id)
                {
                    order.fifo.remove(pos);
                }
            }
            Stage::Gate(gi) => {
                if let Some(Some(key)) = e.keys.get(gi)
                    && let Some(q) = self.gates[gi].waiters.get_mut(key)
                {
                    if let Some(pos) = q.iter().position(|x| *x == id) {
                        q.remove(pos);
                    }
                    if q.is_empty() {
                        self.gates[gi].waiters.remove(key);
                    }
                }
            }
            Stage::Ready => {
                if let Some(k) = e.ready_key.take() {
                    self.ready.remove(&k);
                }
            }
            Stage::Running => {
                self.running_since.remove(&id);
            }
        }
        if e.stage == Stage::Running {
            self.running -= 1;
        } else {
            self.queued -= 1;
        }
        if let Some(k) = e.order.take() {
            self.edf.remove(&k);
        }
        for t in [e.gate_timer.take(), e.deadline_timer.take()]
            .into_iter()
            .flatten()
        {
            self.timers.remove(&t);
        }
        if let Some(rid) = &e.request_id
            && self.by_request_id.get(rid) == Some(&id)
        {
            self.by_request_id.remove(rid);
        }

        let inference_time = e.started_at.map(|s| now.saturating_duration_since(s));
        let queue_time = e
            .started_at
            .unwrap_or(now)
            .saturating_duration_since(e.received_at);
        let outcome = Arc::new(Outcome {
            result,
            queue_time,
            inference_time,
            request_id: e.request_id.clone(),
        });
        if outcome.result.is_ok()
            && let (Some(idem), Some(rid), Some(fp)) =
                (&self.cfg.idempotency, &e.request_id, &e.fingerprint)
            && !idem.window.is_zero()
        {
            self.cache.insert(
                rid.clone(),
                (fp.clone(), outcome.clone()),
                now + idem.window,
            );
        }
        self.emit(TraceKind::Finished, &e, now, |ev| {
            ev.outcome = Some(outcome.code());
            ev.waited_ms = Some(ms(queue_time));
            ev.inference_ms = inference_time.map(ms);
        });

        // Session order: the next request of the session becomes active.
        if self.cfg.session.ordering
            && let Some(s) = &e.session
            && let Some(order) = self.sessions.get_mut(s)
        {
            if order.active == Some(id) {
                order.active = order.fifo.pop_front();
                if let Some(next) = order.active {
                    fx.todo.push_back(Action::Advance { id: next, from: 0 });
                    if let Some(n) = self.entries.get_mut(&next) {
                        let waited = now.saturating_duration_since(n.stage_since);
                        n.stage_since = now;
                        let n = &self.entries[&next];
                        self.emit(TraceKind::SlotGranted, n, now, |ev| {
                            ev.rule = Some(RULE_SESSION_ORDER.into());
                            ev.waited_ms = Some(ms(waited));
                        });
                    }
                }
            }
            if let Some(order) = self.sessions.get(s)
                && order.active.is_none()
                && order.fifo.is_empty()
            {
                self.sessions.remove(s);
            }
        }

        // Release slots (dropping the guards), then let waiters have them.
        for (gi, guard) in std::mem::take(&mut e.key_slots) {
            let key = guard.key().to_owned();
            drop(guard);
            let rule = &self.cfg.limits[gi].name;
            self.emit_slot(TraceKind::SlotReleased, &e, now, rule, Some(&key));
            fx.todo.push_back(Action::Pump { gate: gi, key });
        }
        if let Some(guard) = e.session_slot.take() {
            drop(guard);
            self.emit_slot(TraceKind::SlotReleased, &e, now, RULE_SESSION_CAP, None);
        }
        let n = usize::from(e.waiter.is_some()) + e.joined.len();
        fx.deliveries.reserve_exact(n);
        for w in e
            .waiter
            .take()
            .into_iter()
            .chain(std::mem::take(&mut e.joined))
        {
            fx.deliveries.push((w, outcome.clone()));
        }
    }

    // ----------------------------------------------------------------- workers

    /// Hands the next ready request to a worker, answering the ones whose deadline
    /// passed (or that could no longer finish in time) on the way.
    pub(crate) fn start_next(&mut self, now: Instant, fx: &mut Effects<W>) -> Option<Job> {
        let estimate = self.estimator.estimate();
        while let Some((_, id)) = self.ready.pop_first() {
            let Some(e) = self.entries.get_mut(&id) else {
                continue;
            };
            if e.stage != Stage::Ready {
                continue;
            }
            e.ready_key = None;
            if let (Some(d), Some(by)) = (e.deadline, e.answer_by) {
                let waited = now.saturating_duration_since(e.received_at);
                let left = by.saturating_duration_since(now);
                let (min, what) = match self.cfg.deadline.min_start_budget {
                    Some(m) => (Some(m), "deadline.min_start_budget_ms"),
                    None if e.probe => (None, ""),
                    None => (estimate, "the service-time estimate"),
                };
                let late = if d <= now {
                    Some("deadline passed while queued; not started".to_owned())
                } else if by <= now {
                    Some(format!(
                        "{} ms left, within the reply margin ({} ms); not started",
                        millis(d - now),
                        millis(self.cfg.deadline.reply_margin)
                    ))
                } else if let Some(min) = min
                    && left < min
                {
                    Some(format!(
                        "{} ms left (reply margin {} ms), below {what} ({} ms); not started",
                        millis(d - now),
                        millis(self.cfg.deadline.reply_margin),
                        millis_ceil(min)
                    ))
                } else {
                    None
                };
                if let Some(message) = late {
                    if by > now {
                        self.stats.limit_reject(RULE_START_BUDGET);
                    }
                    let err = not_started(message, waited, Some(d), now, estimate);
                    self.retire(id, Err(err), now, fx);
                    self.run(now, fx);
                    continue;
                }
            }
            if let Some(k) = e.order.take() {
                self.edf.remove(&k);
            }
            let stream = e.stream.clone();
            e.stage = Stage::Running;
            e.started_at = Some(now);
            e.stage_since = now;
            let (tx, rx) = oneshot::channel();
            e.abort = Some(tx);
            let timer = e.deadline_timer.take();
            let request = e.request.take();
            let deadline = e.deadline;
            let answer_by = e.answer_by;
            let queue_time = now.saturating_duration_since(e.received_at);
            if let Some(t) = timer {
                self.timers.remove(&t);
            }
            self.queued -= 1;
            self.running += 1;
            self.running_since.insert(id, now);
            self.stats
                .started(queue_time, deadline.is_some_and(|d| now >= d));
            let e = &self.entries[&id];
            self.emit(TraceKind::Started, e, now, |ev| {
                ev.waited_ms = Some(ms(queue_time));
            });
            let span = e.span.clone();
            self.stream_queued.remove(&id);
            let request = request?;
            return Some(Job {
                id,
                request,
                answer_by,
                started_at: now,
                queue_time,
                abort: rx,
                stream,
                span,
            });
        }
        None
    }

    /// Whether a worker has anything to pick.
    pub(crate) fn has_ready(&self) -> bool {
        !self.ready.is_empty()
    }

    /// Feeds the estimator with a finished call: `ok` and the calls ended by a deadline
    /// or the backend timeout (those are lower bounds of the service time, and a slow
    /// backend shows up only through them). Failures, cancels and shutdown aborts say
    /// nothing about how long an answer takes.
    fn observe(&mut self, took: Duration, code: &str, fx: &mut Effects<W>) {
        let counts = code == "ok"
            || code == ErrorCode::DeadlineExceeded.as_str()
            || code == ErrorCode::BackendTimeout.as_str();
        if !counts {
            return;
        }
        let cold = self.estimator.estimate().is_none();
        self.estimator.observe(took);
        if cold && self.adaptive() {
            // First estimate: the queued requests' timers move to `answer_by − estimate`.
            for id in self.queued_ids() {
                self.arm_deadline(id, fx);
            }
        }
    }

    /// Settles a running request with the backend's result.
    pub(crate) fn finish(
        &mut self,
        id: u64,
        result: Result<BackendReply, ErrorBody>,
        took: Duration,
        now: Instant,
        fx: &mut Effects<W>,
    ) {
        let code = match &result {
            Ok(_) => "ok",
            Err(e) => e.code.as_str(),
        };
        self.stats.inference_done(took, code);
        self.observe(took, code, fx);
        self.retire(id, result, now, fx);
        self.run(now, fx);
    }

    // ------------------------------------------------------------------ timers

    /// Answers queued requests whose deadline passed and waiters whose `max_wait`
    /// elapsed; drops expired cache entries.
    pub(crate) fn expire(&mut self, now: Instant, fx: &mut Effects<W>) {
        self.cache.purge(now);
        self.position_pass(now, fx);
        while let Some(t) = self.timers.first().copied() {
            if t.at > now {
                break;
            }
            self.timers.remove(&t);
            let Some(e) = self.entries.get_mut(&t.id) else {
                continue;
            };
            let waited = now.saturating_duration_since(e.received_at);
            match t.kind {
                TimerKind::Deadline => {
                    e.deadline_timer = None;
                    if e.stage == Stage::Running {
                        continue;
                    }
                    let (deadline, answer_by, probe) = (e.deadline, e.answer_by, e.probe);
                    let Some(by) = answer_by else {
                        continue;
                    };
                    let estimate = self.estimator.estimate();
                    let left = by.saturating_duration_since(now);
                    let message = if by <= now {
                        if deadline.is_some_and(|d| d <= now) {
                            "deadline passed while queued; not started".to_owned()
                        } else {
                            format!(
                                "still queued within the reply margin ({} ms) of the deadline; not started",
                                millis(self.cfg.deadline.reply_margin)
                            )
                        }
                    } else if let Some(est) = estimate.filter(|_| self.adaptive() && !probe)
                        && left < est
                    {
                        self.stats.limit_reject(RULE_START_BUDGET);
                        format!(
                            "still queued with {} ms left (reply margin {} ms), less than the service-time estimate ({} ms); not started",
                            millis(deadline.map_or(left, |d| d.saturating_duration_since(now))),
                            millis(self.cfg.deadline.reply_margin),
                            millis_ceil(est)
                        )
                    } else {
                        // The estimate came down since the timer was set: look again later.
                        self.arm_deadline(t.id, fx);
                        continue;
                    };
                    let err = not_started(message, waited, deadline, now, estimate);
                    self.retire(t.id, Err(err), now, fx);
                }
                TimerKind::GateWait => {
                    e.gate_timer = None;
                    let Stage::Gate(gi) = e.stage else {
                        continue;
                    };
                    let waited_here = now.saturating_duration_since(e.stage_since);
                    let Some(Some(key)) = e.keys.get(gi).cloned() else {
                        continue;
                    };
                    let cfg = self.cfg.clone();
                    let limit = &cfg.limits[gi];
                    let in_use = self.gates[gi].slots.in_use(&key);
                    let waiting = self.gates[gi].waiters.get(&key).map_or(0, VecDeque::len);
                    let name = limit.name.clone();
                    self.stats.limit_reject(&name);
                    let err = refusal(
                        ErrorCode::ConcurrencyLimitExceeded,
                        format!(
                            "limit {name:?}: no slot within max_wait ({} ms)",
                            millis(waited_here)
                        ),
                        ErrorDetails {
                            limit: Some(limit.limit.get() as u64),
                            in_flight: Some(in_use as u64),
                            waiting: Some(waiting.saturating_sub(1) as u64),
                            waited_ms: Some(millis(waited_here)),
                            retry_after_ms: self
                                .retry_after(waiting as f64 / limit.limit.get() as f64),
                            key: Some(key.clone()),
                            ..Default::default()
                        },
                    );
                    let e = &self.entries[&t.id];
                    self.emit(TraceKind::SlotBusy, e, now, |ev| {
                        ev.rule = Some(name);
                        ev.key = Some(key);
                        ev.waited_ms = Some(ms(waited_here));
                    });
                    self.retire(t.id, Err(err), now, fx);
                }
            }
            self.run(now, fx);
        }
    }

    // ------------------------------------------------------------ cancellation

    /// Cancels the request with `request_id`: a queued one is answered `cancelled` now,
    /// a running one is told to abort (its worker answers `cancelled`).
    pub(crate) fn cancel(
        &mut self,
        request_id: &str,
        now: Instant,
        fx: &mut Effects<W>,
    ) -> CancelResult {
        let Some(&id) = self.by_request_id.get(request_id) else {
            return CancelResult::NotFound;
        };
        let Some(e) = self.entries.get_mut(&id) else {
            return CancelResult::NotFound;
        };
        if e.stage == Stage::Running {
            if let Some(tx) = e.abort.take() {
                let _ = tx.send(AbortReason::Cancelled);
            }
            return CancelResult::Running;
        }
        let waited = now.saturating_duration_since(e.received_at);
        let err = after_wait(ErrorCode::Cancelled, "cancelled while queued", waited);
        self.retire(id, Err(err), now, fx);
        self.run(now, fx);
        CancelResult::Queued
    }

    // ---------------------------------------------------------------- shutdown

    /// Stops admitting and answers every queued request `shutting_down`.
    pub(crate) fn begin_shutdown(&mut self, now: Instant, fx: &mut Effects<W>) -> usize {
        self.shutting_down = true;
        let queued = self.queued_ids();
        let n = queued.len();
        for id in queued {
            self.retire(id, Err(shutting_down()), now, fx);
            self.run(now, fx);
        }
        n
    }

    /// Tells every running request to abort with `shutting_down`; returns how many.
    pub(crate) fn abort_running(&mut self) -> usize {
        let mut n = 0;
        for e in self.entries.values_mut() {
            if e.stage == Stage::Running
                && let Some(tx) = e.abort.take()
            {
                let _ = tx.send(AbortReason::ShuttingDown);
                n += 1;
            }
        }
        n
    }

    // ------------------------------------------------------------------- views

    /// The busiest keys and sessions.
    pub(crate) fn limits_view(&self, top: usize, now: Instant) -> LimitsView {
        let mut keys = Vec::new();
        for (gi, gate) in self.gates.iter().enumerate() {
            let limit = &self.cfg.limits[gi];
            let mut per_key: HashMap<String, (usize, usize, f64)> = HashMap::new();
            for (k, n) in gate.slots.snapshot() {
                per_key.entry(k).or_default().0 = n;
            }
            for (k, q) in &gate.waiters {
                let longest = q
                    .front()
                    .and_then(|id| self.entries.get(id))
                    .map_or(0.0, |e| ms(now.saturating_duration_since(e.stage_since)));
                let v = per_key.entry(k.clone()).or_default();
                v.1 = q.len();
                v.2 = longest;
            }
            keys.extend(
                per_key
                    .into_iter()
                    .map(|(key, (in_flight, waiting, longest))| KeyView {
                        rule: limit.name.clone(),
                        key,
                        limit: limit.limit.get(),
                        in_flight,
                        waiting,
                        longest_wait_ms: longest,
                    }),
            );
        }
        keys.sort_by(|a, b| {
            (b.in_flight + b.waiting, b.longest_wait_ms)
                .partial_cmp(&(a.in_flight + a.waiting, a.longest_wait_ms))
                .unwrap_or(std::cmp::Ordering::Equal)
                .then_with(|| a.key.cmp(&b.key))
        });
        keys.truncate(top);

        let view = |session: &String, pending| SessionView {
            session: session.clone(),
            pending,
            limit: self.cfg.session.pending_cap.map(|c| c.get()),
            waiting: 0,
            longest_wait_ms: 0.0,
        };
        let mut sessions: HashMap<String, SessionView> = self
            .session_slots
            .snapshot()
            .into_iter()
            .map(|(s, pending)| (s.clone(), view(&s, pending)))
            .collect();
        for (s, order) in &self.sessions {
            let longest = order
                .fifo
                .front()
                .and_then(|id| self.entries.get(id))
                .map_or(0.0, |e| ms(now.saturating_duration_since(e.stage_since)));
            let v = sessions
                .entry(s.clone())
                .or_insert_with(|| view(s, usize::from(order.active.is_some()) + order.fifo.len()));
            v.waiting = order.fifo.len();
            v.longest_wait_ms = longest;
        }
        let mut sessions: Vec<SessionView> = sessions.into_values().collect();
        sessions.sort_by(|a, b| {
            b.pending
                .cmp(&a.pending)
                .then_with(|| a.session.cmp(&b.session))
        });
        sessions.truncate(top);

        LimitsView {
            queue: QueueView {
                depth: self.queued,
                capacity: self.cfg.queue_capacity.get(),
                running: self.running,
                workers: self.cfg.workers.get(),
                shutting_down: self.shutting_down,
            },
            keys,
            sessions,
        }
    }

    /// Checks the module invariants (tests).
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) {
        let running = self
            .entries
            .values()
            .filter(|e| e.stage == Stage::Running)
            .count();
        assert_eq!(running, self.running, "running count");
        assert_eq!(self.entries.len() - running, self.queued, "queued count");
        assert!(self.queued <= self.cfg.queue_capacity.get(), "queue bound");
        assert!(self.running <= self.cfg.workers.get(), "worker bound");
        for id in &self.stream_queued {
            let e = &self.entries[id];
            assert!(
                e.stream.is_some() && e.stage != Stage::Running,
                "stream_queued holds queued streamed requests only"
            );
        }
        for (k, id) in &self.ready {
            assert_eq!(self.entries[id].stage, Stage::Ready);
            assert_eq!(self.entries[id].ready_key, Some(*k));
        }
        if self.cfg.queue_order == QueueOrder::Edf {
            assert_eq!(
                self.edf.len(),
                self.queued,
                "every queued request in EDF order"
            );
            for e in self.entries.values() {
                match e.stage {
                    Stage::Running => assert_eq!(e.order, None),
                    Stage::Ready => assert_eq!(e.order, e.ready_key, "ready in EDF order"),
                    _ => {}
                }
                if let Some(k) = e.order {
                    assert_eq!(self.edf.get(&k), Some(&e.answer_by));
                }
            }
        } else {
            assert!(self.edf.is_empty());
        }
        assert_eq!(self.running_since.len(), self.running, "running starts");
        for (gi, g) in self.gates.iter().enumerate() {
            for (k, q) in &g.waiters {
                assert!(!q.is_empty(), "empty waiter queue kept");
                if self.cfg.mode == Mode::Enforce {
                    assert!(
                        g.slots.in_use(k) >= self.cfg.limits[gi].limit.get(),
                        "waiter behind a free slot"
                    );
                }
                for id in q {
                    assert_eq!(self.entries[id].stage, Stage::Gate(gi));
                }
            }
        }
        for order in self.sessions.values() {
            assert!(
                order.active.is_some() || order.fifo.is_empty(),
                "fifo without active"
            );
            for id in &order.fifo {
                assert_eq!(self.entries[id].stage, Stage::Session);
            }
        }
        let session_slots: usize = self.session_slots.snapshot().iter().map(|(_, n)| n).sum();
        let held = self
            .entries
            .values()
            .filter(|e| e.session_slot.is_some())
            .count();
        assert_eq!(session_slots, held, "session slots match entries");
    }
}

fn shutting_down() -> ErrorBody {
    ErrorBody::new(
        ErrorCode::ShuttingDown,
        "this replica is shutting down; retry on another one",
    )
}

fn conflict(rid: &str) -> ErrorBody {
    ErrorBody::new(
        ErrorCode::RequestIdConflict,
        format!("request id {rid:?} is in use with a different session or body"),
    )
}

/// Longest key value taken from a request body.
const MAX_KEY_VALUE_LEN: usize = 256;

/// The key of each configured limit for this submission (`None`: rule not applied).
/// The error is the message of an `invalid_request`.
pub(crate) fn resolve_keys(
    cfg: &AdmissionConfig,
    sub: &Submission,
) -> Result<Vec<Option<String>>, String> {
    let mut body: Option<Option<serde_json::Value>> = None;
    let mut keys = Vec::with_capacity(cfg.limits.len());
    for limit in &cfg.limits {
        let key = match &limit.key {
            KeySource::Client => sub.client_key.as_ref().map(|k| format!("client:{k}")),
            KeySource::Session => sub.session.as_ref().map(|s| format!("session:{s}")),
            KeySource::Service => Some("service".to_owned()),
            KeySource::Body(ptr) => {
                let doc = body.get_or_insert_with(|| serde_json::from_slice(&sub.body).ok());
                match doc.as_ref().and_then(|d| d.pointer(ptr)) {
                    Some(serde_json::Value::String(s)) => Some(s.clone()),
                    Some(v @ (serde_json::Value::Number(_) | serde_json::Value::Bool(_))) => {
                        Some(v.to_string())
                    }
                    _ => None,
                }
                .map(|v| {
                    if v.len() > MAX_KEY_VALUE_LEN {
                        Err(format!(
                            "body value at {ptr} is longer than {MAX_KEY_VALUE_LEN} bytes"
                        ))
                    } else {
                        Ok(format!("body:{ptr}={v}"))
                    }
                })
                .transpose()?
            }
        };
        keys.push(key);
    }
    Ok(keys)
}
