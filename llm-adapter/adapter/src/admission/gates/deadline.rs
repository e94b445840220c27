//! Deadline prediction at admission: from the backend's service-time estimate, when a
//! new request would start, refusing at once (`deadline_exceeded`) what the work ahead
//! would make late; under EDF, where the request goes among the queued ones.
//!
//! Invariants:
//! - the prediction only refuses early: it never replaces the checks at the start of
//!   inference and during it, which are the guarantee; a request admitted onto an idle
//!   backend against the prediction is a *probe* (a stale, too high estimate must be
//!   able to come down) and is exempt from the adaptive start budget only;
//! - an admission never pushes a queued request that fits (global term: start +
//!   estimate ≤ `answer_by − now`) past its latest start: a new request overtakes a
//!   queued one only if that one keeps [`OVERTAKE_GUARD`] estimates of slack
//!   afterwards, otherwise it goes behind the last one it would squeeze
//!   ([`DeadlinePrediction::place`]) and is refused at once if it does not fit there —
//!   no admitted request is displaced into a refusal (requests admitted without a
//!   prediction — cold start, `predict = false` — take their plain EDF place);
//! - the overtaking is bounded: under EDF a request is admitted only if its predicted
//!   start leaves `overtake_share` of its slack (up to `deadline.overtake_share_pct`,
//!   sized by the share of recent requests with at most half its budget) for earlier
//!   deadlines; with one budget class the share is 0 and admission is as under FIFO;
//! - under EDF every queued request, wherever it waits, has an order key fixed at
//!   admission (its due instant — plus `priority.batch_delay_ms` for a batch request —
//!   then its admission id) and is in `edf` until it starts or retires;
//! - priority classes (`admission/priority.rs`): an interactive request never goes
//!   behind a batch request to spare that one's slack, and when it is predicted late
//!   only because of batch requests ahead of it, the prediction says how many of them
//!   must be displaced ([`Placement::displace`]); nothing else changes for it.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use weir_protocol::llm::{ErrorCode, ErrorDetails};

use super::key_limits::KeyLimits;
use super::session_order::SessionOrder;
use super::{Ask, Gate, RULE_PREDICTED, Refusal, millis_ceil, refusal};
use crate::admission::AdmissionConfig;
use crate::admission::pool::Member;
use crate::admission::priority::Priority;
use crate::config::QueueOrder;
use weir_service::config::whole_ms as millis;

/// Ready-queue order: (due instant under EDF, or a constant under FIFO; admission id
/// under EDF, arrival in the ready queue under FIFO).
pub(crate) type ReadyKey = (Instant, u64);

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
    /// Queued requests ahead of it (the global term's count).
    pub(crate) ahead: usize,
    /// What is left of the running calls, seconds (the global term's).
    pub(crate) left: f64,
    /// The session and key-gate terms, seconds: what no displacement shortens.
    pub(crate) floor: f64,
}

/// What the rest of the state looks like to the predictor, on one member of the pool
/// (the whole state for a single backend).
pub(crate) struct Load<'a> {
    /// The member (`pool.rs`) the request would be bound to.
    pub(crate) member: usize,
    /// Its slots.
    pub(crate) workers: usize,
    /// Its service-time estimate (`None`: cold start, no prediction).
    pub(crate) estimate: Option<Duration>,
    /// Queued requests bound to it.
    pub(crate) queued: usize,
    /// Calls running on it.
    pub(crate) running: usize,
    /// Requests in its ready queue.
    pub(crate) ready: usize,
    /// Start of each call running on it.
    pub(crate) running_since: &'a HashMap<u64, Instant>,
    /// Every member (a session's active request may run on another).
    pub(crate) members: &'a [Member],
    pub(crate) sessions: &'a SessionOrder,
    pub(crate) keys: &'a KeyLimits,
    pub(crate) shadow: bool,
    /// The new request's admission id and due instant ([`DeadlinePrediction::due`]).
    pub(crate) id: u64,
    pub(crate) due: Instant,
    /// The new request's class, and the admission ids of the batch requests (queued or
    /// running; only the queued ones are in `edf`).
    pub(crate) priority: Priority,
    pub(crate) batch: &'a BTreeSet<u64>,
}

/// Where an admitted request goes, and whether it is a probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Placement {
    /// Its order key among the queued requests.
    pub(crate) order: ReadyKey,
    /// Admitted onto an idle backend although predicted too slow.
    pub(crate) probe: bool,
    /// The predicted wait plus the estimate (`None` without a prediction): what the
    /// pool routes by.
    pub(crate) finish: Option<Duration>,
    /// Interactive only: how many batch requests queued ahead of it on its member must
    /// be displaced (answered at once) for it to start in time; 0 = none.
    pub(crate) displace: usize,
}

/// The deadline predictor and the EDF order of the queued requests.
pub(crate) struct DeadlinePrediction {
    cfg: Arc<AdmissionConfig>,
    /// Under EDF: every queued request (wherever it waits) by its order key, with its
    /// `answer_by` and the member it is bound to — what the placement of a new request
    /// reads.
    edf: BTreeMap<ReadyKey, (Option<Instant>, usize)>,
    /// The budgets of the last [`RECENT_BUDGETS`] requests offered with a deadline
    /// (the overtake share reads them).
    budgets: VecDeque<Duration>,
}

/// What is left of the running calls at `now`, in seconds, with `e` s per call.
pub(crate) fn running_left(running_since: &HashMap<u64, Instant>, e: f64, now: Instant) -> f64 {
    let left = |s: &Instant| (e - now.saturating_duration_since(*s).as_secs_f64()).max(0.0);
    running_since.values().map(left).sum()
}

/// The global term of the prediction, in seconds, for a request with `ahead` queued
/// requests ahead of it (estimate `e` s, `left` s left of the `running` calls): 0 while
/// one of the `workers` is free for it.
pub(crate) fn global_start(workers: usize, running: usize, ahead: usize, e: f64, left: f64) -> f64 {
    if running + ahead < workers {
        0.0
    } else {
        (left + ahead as f64 * e) / workers as f64
    }
}

impl DeadlinePrediction {
    pub(crate) fn new(cfg: Arc<AdmissionConfig>) -> Self {
        Self {
            cfg,
            edf: BTreeMap::new(),
            budgets: VecDeque::with_capacity(RECENT_BUDGETS),
        }
    }

    /// Remembers the budget of a request offered with a deadline.
    pub(crate) fn note_budget(&mut self, budget: Duration) {
        if self.budgets.len() >= RECENT_BUDGETS {
            self.budgets.pop_front();
        }
        self.budgets.push_back(budget);
    }

    /// The due instant of a request under the queue order (what the prediction
    /// compares with the queued ones); `epoch` is the FIFO order's constant.
    pub(crate) fn due(
        &self,
        deadline: Option<Instant>,
        received_at: Instant,
        epoch: Instant,
    ) -> Instant {
        match self.cfg.queue_order {
            QueueOrder::Edf => deadline.unwrap_or(received_at + self.cfg.deadline.max),
            QueueOrder::Fifo => epoch,
        }
    }

    /// An admitted request takes its EDF place (under EDF; `None` under FIFO).
    pub(crate) fn enter(
        &mut self,
        order: ReadyKey,
        answer_by: Option<Instant>,
        member: usize,
    ) -> Option<ReadyKey> {
        (self.cfg.queue_order == QueueOrder::Edf).then(|| {
            self.edf.insert(order, (answer_by, member));
            order
        })
    }

    /// A queued request is bound to another member: same place, other member.
    pub(crate) fn rebind(&mut self, order: ReadyKey, member: usize) {
        if let Some(v) = self.edf.get_mut(&order) {
            v.1 = member;
        }
    }

    /// A queued request leaves its EDF place (started or answered).
    pub(crate) fn leave(&mut self, order: ReadyKey) {
        self.edf.remove(&order);
    }

    /// The EDF places (invariants).
    #[cfg(test)]
    pub(crate) fn places(&self) -> &BTreeMap<ReadyKey, (Option<Instant>, usize)> {
        &self.edf
    }

    /// Predicts when a new request would start: the larger of
    /// - the global term: what is left of the running calls plus one estimate per
    ///   queued request ahead of it (under FIFO every queued request, wherever it
    ///   waits; under EDF those ahead of its place, [`DeadlinePrediction::place`]),
    ///   shared over the workers;
    /// - the session term (ordering on): what is left of its session's active request,
    ///   then one turn of the ready queue (`max(1, (ready + running) / workers)`
    ///   estimates) per request queued behind it and for itself, one after the other;
    /// - each key gate's term: the holders and waiters ahead of it, `limit` at a time.
    ///
    /// `None` without an estimate (cold start with no seed).
    pub(crate) fn predict(
        &self,
        session: Option<&str>,
        keys: &[Option<String>],
        load: &Load<'_>,
        now: Instant,
        epoch: Instant,
    ) -> Option<Prediction> {
        let est = load.estimate?;
        let e = est.as_secs_f64();
        let workers = load.workers;
        let running = running_left(load.running_since, e, now);
        // Every queued request counts, not only the ready ones: a request waiting behind
        // its session or at a key gate reaches the ready queue later, possibly while
        // this one still waits behind its own session or gate (measured: with session
        // ordering, counting only the ready queue admitted what then came late).
        let (ahead, order) = match self.cfg.queue_order {
            QueueOrder::Fifo => (load.queued, (epoch, load.id)),
            QueueOrder::Edf => {
                let (order, ahead) = self.place(load, e, running, now);
                (ahead, order)
            }
        };
        let mut serial = 0.0f64;
        if let Some((active, waiting)) = load.sessions.busy(session) {
            // Each request of the session enters the ready queue only when the one
            // before it finished, at the back: one turn of the ready queue (`cycle`)
            // per request, not one estimate (measured with 10 sessions at 2x).
            let cycle = e * ((load.ready + load.running) as f64 / workers as f64).max(1.0);
            let since = load
                .members
                .iter()
                .find_map(|m| m.running_since.get(&active));
            let active_left = since.map_or(cycle, |s| {
                (e - now.saturating_duration_since(*s).as_secs_f64()).max(0.0)
            });
            serial = active_left + waiting as f64 * cycle + (cycle - e);
        }
        let gate = if load.shadow {
            0.0
        } else {
            load.keys.predicted_wait(keys, e)
        };
        let global = global_start(workers, load.running, ahead, e, running);
        Some(Prediction {
            // Finite and non-negative by construction; saturate rather than panic.
            start: Duration::try_from_secs_f64(global.max(serial).max(gate))
                .unwrap_or(Duration::MAX),
            estimate: est,
            order,
            ahead,
            left: running,
            floor: serial.max(gate),
        })
    }

    /// Under EDF: the order key of a new request due at `load.due` (admission id
    /// `load.id`) and how many queued requests are then ahead of it. It goes at its
    /// deadline position, unless one more estimate ahead would leave a request it
    /// overtakes with less than [`OVERTAKE_GUARD`] estimates of slack (one that fits
    /// now, `start + e ≤ answer_by − now`); then it goes behind the last such request.
    /// Linear in the queue (bounded by `queue_capacity`).
    fn place(&self, load: &Load<'_>, e: f64, running: f64, now: Instant) -> (ReadyKey, usize) {
        let (workers, id, member) = (load.workers, load.id, load.member);
        let start = |ahead| global_start(workers, load.running, ahead, e, running);
        let mut key = (load.due, id);
        // The common case (one budget class): due after everything queued, nothing
        // overtaken, no walk.
        if self.edf.last_key_value().is_none_or(|(k, _)| *k < key) {
            return (key, load.queued);
        }
        let mine = |(_, (_, m)): &(&ReadyKey, &(Option<Instant>, usize))| *m == member;
        let pos = self.edf.range(..key).filter(mine).count();
        let mut blocker = None;
        let interactive = load.priority == Priority::Interactive;
        for (i, (k, (by, _))) in self.edf.range(key..).filter(mine).enumerate() {
            let Some(by) = by else {
                continue;
            };
            // Interactive work goes first within its slack: a batch request it squeezes
            // is answered by its own deadline, or displaced (`state/priority.rs`).
            if interactive && load.batch.contains(&k.1) {
                continue;
            }
            let usable = by.saturating_duration_since(now).as_secs_f64();
            let at = pos + i;
            if start(at) + e <= usable && start(at + 1) + e * (1.0 + OVERTAKE_GUARD) > usable {
                blocker = Some(k.0);
            }
        }
        match blocker {
            None => (key, pos),
            Some(b) => {
                // Behind the blocker and everything due with it (ids are increasing).
                key = (b, id);
                (key, self.edf.range(..key).filter(mine).count())
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

    /// The refusal of a request predicted late: to start in `p.start` with `usable`
    /// left before its `answer_by`, of which `room` may be spent waiting.
    fn late(
        &self,
        p: &Prediction,
        d: Instant,
        usable: Duration,
        room: Duration,
        share: f64,
        now: Instant,
    ) -> Refusal {
        let late = p.start.saturating_add(p.estimate) > usable;
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
        let body = refusal(
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
        Refusal::always(RULE_PREDICTED, body)
    }
}

impl Gate for DeadlinePrediction {
    /// The request, what the rest of the state looks like, and the FIFO epoch.
    type Input<'a> = (&'a Ask<'a>, Load<'a>, Instant);
    type Pass = Placement;

    /// Refuses now what the work ahead would make late. An idle backend always takes
    /// the request (a probe). Under EDF a request also keeps a share of its slack for
    /// earlier deadlines (`overtake_share`): the work ahead may fill only the rest of
    /// what it can wait.
    fn check(
        &self,
        (ask, load, epoch): (&Ask<'_>, Load<'_>, Instant),
    ) -> Result<Placement, Refusal> {
        let mut placement = Placement {
            order: (load.due, load.id),
            probe: false,
            finish: None,
            displace: 0,
        };
        if !self.cfg.deadline.predict {
            return Ok(placement);
        }
        let (Some(d), Some(by)) = (ask.deadline, ask.answer_by) else {
            return Ok(placement);
        };
        let session = ask.sub.session.as_deref();
        let Some(p) = self.predict(session, ask.keys, &load, ask.now, epoch) else {
            return Ok(placement);
        };
        placement.order = p.order;
        placement.finish = Some(p.start.saturating_add(p.estimate));
        let usable = by.saturating_duration_since(ask.now);
        let share = ask.budget.map_or(0.0, |b| self.overtake_share(b));
        let room = usable.saturating_sub(p.estimate).mul_f64(1.0 - share);
        let late = p.start.saturating_add(p.estimate) > usable;
        if !late && p.start <= room {
            return Ok(placement);
        }
        if load.running == 0 && load.queued == 0 {
            placement.probe = true;
            return Ok(placement);
        }
        if load.priority == Priority::Interactive
            && let Some(k) = self.displace_to_fit(&p, &load, usable, room)
        {
            placement.displace = k;
            return Ok(placement);
        }
        Err(self.late(&p, d, usable, room, share, ask.now))
    }
}

impl DeadlinePrediction {
    /// The fewest batch requests queued ahead of a late interactive request (on its
    /// member, before its order key) whose displacement lets it start in time (`start
    /// + estimate ≤ usable` and `start ≤ room`, as in `check`); `None` if even all of
    /// them do not. Only the global term shrinks. Linear in the queue (bounded by
    /// `queue_capacity`), and only on this refusal path.
    fn displace_to_fit(
        &self,
        p: &Prediction,
        load: &Load<'_>,
        usable: Duration,
        room: Duration,
    ) -> Option<usize> {
        let member = load.member;
        let batch_ahead = (self.edf.range(..p.order))
            .filter(|(k, (_, m))| *m == member && load.batch.contains(&k.1))
            .count();
        let e = p.estimate.as_secs_f64();
        (1..=batch_ahead.min(p.ahead)).find(|k| {
            let global = global_start(load.workers, load.running, p.ahead - k, e, p.left);
            let start = Duration::try_from_secs_f64(global.max(p.floor)).unwrap_or(Duration::MAX);
            start.saturating_add(p.estimate) <= usable && start <= room
        })
    }
}
