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
//! `submit` screens a request (shutdown, a deadline already passed, its limit keys,
//! idempotency), then asks the admission gates of [`super::gates`] in their order of
//! precedence; each gate's rules and invariants are documented in its module.
//!
//! Invariants (checked by `check_invariants` in tests):
//! - `queued` = entries not Running ≤ `queue_capacity` (shadow mode does not lift it);
//!   `running` = Running entries ≤ `workers`;
//! - every entry is in exactly one place: one session FIFO, one gate waiter queue, the
//!   ready queue, or running (the active request of a session is in a gate, ready or
//!   running);
//! - an entry leaves the map only in [`State::retire`], which drops its slot guards (so
//!   every slot is released exactly once), answers all its waiters, and then promotes the
//!   next request of its session and pumps the gates whose slots it freed;
//! - a request is never started once its deadline has passed ([`State::start_next`]
//!   checks it under the same lock that marks it Running);
//! - `answer_by = deadline − reply_margin`: a queued request is answered by then (its
//!   deadline timer is never later), a running one is aborted then;
//! - under EDF (the default) the ready queue is served in the order keys fixed at
//!   admission, so session FIFO and per-key FIFO still decide when a request becomes
//!   ready, and EDF only which ready one goes first;
//! - cascades (a release that grants a slot whose holder is then refused at the next
//!   gate, which releases ...) run from a work list, never by recursion.

mod barge_in;
mod health;
mod idempotency;
mod positions;
mod priority;
mod routing;
mod telling;
mod timers;
mod tokens;
mod views;
mod workers;

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;
use weir_protocol::llm::{ErrorBody, ErrorCode};

pub use self::barge_in::SessionCancel;
use self::idempotency::Fingerprint;
pub(crate) use self::positions::Notice;
use self::routing::Routed;
use self::timers::{Timer, TimerKind};
use super::cache::CompletionCache;
use super::gates::deadline::{DeadlinePrediction, ReadyKey};
use super::gates::key_limits::{KeyAsk, KeyLimits, KeyPass, resolve_keys};
use super::gates::queue_bound::QueueBound;
use super::gates::session_cap::SessionCap;
use super::gates::session_order::SessionOrder;
use super::gates::start_budget::StartBudget;
use super::gates::tokens::{Reservation, TokenBudgets};
use super::gates::{Ask, Gate, RULE_SESSION_CAP, RULE_SESSION_ORDER, after_wait, shutting_down};
use super::pool::{Member, Pool};
use super::priority::Priority;
use super::slots::SlotGuard;
use super::stats::Stats;
use super::{AbortReason, AdmissionConfig, Admitted, Outcome, StreamOut, Submission};
use crate::backend::{BackendReply, BackendRequest};
use crate::config::{Mode, QueueOrder};
use crate::trace::{TraceKind, Tracer, ms};

/// What the caller must do after a state transition, outside the lock.
pub(crate) struct Effects<W> {
    /// Answers to send.
    pub(crate) deliveries: Vec<(W, Arc<Outcome>)>,
    /// Requests that became ready (wake this many workers) ...
    pub(crate) ready_added: usize,
    /// ... on these members of the pool (bit `b` = member `b`).
    pub(crate) ready_on: u64,
    /// A timer earlier than all previous ones was added (wake the sweeper).
    pub(crate) timers_changed: bool,
    /// `queued` events to publish to streaming callers.
    pub(crate) notices: Vec<Notice>,
    /// Dropped once the deliveries are done: tells a waiting cancel that the requests
    /// it aborted are answered ([`State::cancel_session`]).
    pub(crate) settled: Vec<oneshot::Sender<()>>,
    todo: VecDeque<Action>,
}

impl<W> Default for Effects<W> {
    fn default() -> Self {
        Self {
            deliveries: Vec::new(),
            ready_added: 0,
            ready_on: 0,
            timers_changed: false,
            notices: Vec::new(),
            settled: Vec::new(),
            todo: VecDeque::new(),
        }
    }
}

impl<W> Effects<W> {
    /// Answers `waiter` at once with `err`.
    fn refuse_now(
        &mut self,
        waiter: W,
        err: ErrorBody,
        sub: &Submission,
        waited: Duration,
    ) -> Admitted {
        let code = err.code;
        self.deliveries.reserve_exact(1);
        let outcome = Outcome::refused(err, waited, sub.request_id.clone());
        self.deliveries.push((waiter, Arc::new(outcome)));
        Admitted::Refused(code)
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
    /// In its member's ready queue, under this key.
    Ready(ReadyKey),
    Running,
}

struct Entry<W> {
    id: u64,
    /// The member of the pool it is bound to.
    member: usize,
    /// Its order key at admission: its place again after a failover.
    place: ReadyKey,
    /// While running on a pool with health on: how far the call got.
    progress: Option<Arc<super::pool::Progress>>,
    /// Put back in the queue by a failover after its call started: its next start is a
    /// retry, not counted as a start again.
    failed_over: bool,
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
    /// Dropped (after the answer is delivered) when the entry is retired: a cancel
    /// waits on them before it acknowledges.
    on_settled: Vec<oneshot::Sender<()>>,
    gate_timer: Option<Timer>,
    deadline_timer: Option<Timer>,
    /// Where a streamed reply goes; `None` for a unary one.
    stream: Option<Arc<dyn StreamOut>>,
    /// The position last sent in a `queued` event, and when.
    notified: Option<(usize, Instant)>,
    /// The request's `llm_request` span: its trace events are emitted inside it.
    span: tracing::Span,
    /// Tokens reserved at the token budgets; settled when the entry is retired.
    tokens: Option<Reservation>,
    /// Its priority class (`state/priority.rs`).
    priority: Priority,
}

/// What admission decided about a request that passed every gate.
struct Admit {
    keys: Vec<Option<String>>,
    fingerprint: Option<Fingerprint>,
    deadline: Option<Instant>,
    answer_by: Option<Instant>,
    routed: Routed,
    tokens: Option<Reservation>,
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
    session_cap: SessionCap,
    session_order: SessionOrder,
    queue_bound: QueueBound,
    deadline: DeadlinePrediction,
    keys: KeyLimits,
    pub(super) tokens: TokenBudgets,
    start_budget: StartBudget,
    /// The backends: each one's ready queue (in the order its workers take them,
    /// [`QueueOrder`]), estimator, running calls and health.
    pub(super) pool: Pool,
    ready_seq: u64,
    timers: BTreeSet<Timer>,
    shutting_down: bool,
    /// The FIFO order's constant first key.
    epoch: Instant,
    /// Queued (not running) requests with a streamed reply: their position is sent
    /// again when it changes, at most every [`POSITION_EVERY`].
    stream_queued: BTreeSet<u64>,
    /// When the positions of `stream_queued` are looked at next.
    next_position_pass: Option<Instant>,
    /// The batch-class entries (queued or running), by id (`state/priority.rs`).
    batch: BTreeSet<u64>,
}

impl<W> State<W> {
    pub(crate) fn new(cfg: Arc<AdmissionConfig>, stats: Arc<Stats>, tracer: Tracer) -> Self {
        let (entries, bytes) =
            (cfg.idempotency).map_or((0, 0), |i| (i.max_entries.get(), i.max_bytes.get()));
        let cache = CompletionCache::new(entries, bytes, stats.clone());
        Self {
            pool: Pool::new(&cfg),
            session_cap: SessionCap::new(cfg.session.pending_cap),
            session_order: SessionOrder::new(cfg.session.ordering),
            queue_bound: QueueBound::new(cfg.queue_capacity, cfg.workers),
            deadline: DeadlinePrediction::new(cfg.clone()),
            keys: KeyLimits::new(&cfg.limits),
            tokens: TokenBudgets::new(&cfg.limits),
            start_budget: StartBudget::new(cfg.clone()),
            cfg,
            stats,
            tracer,
            entries: HashMap::new(),
            next_id: 1,
            by_request_id: HashMap::new(),
            cache,
            ready_seq: 0,
            timers: BTreeSet::new(),
            shutting_down: false,
            epoch: Instant::now(),
            stream_queued: BTreeSet::new(),
            next_position_pass: None,
            batch: BTreeSet::new(),
        }
    }

    fn shadow(&self) -> bool {
        self.cfg.mode == Mode::Shadow
    }

    /// Queued (not running) requests, over every member.
    pub(crate) fn queued(&self) -> usize {
        self.pool.members.iter().map(|m| m.queued).sum()
    }

    /// Running calls, over every member.
    pub(crate) fn running(&self) -> usize {
        self.pool.members.iter().map(Member::running).sum()
    }

    pub(crate) fn is_shutting_down(&self) -> bool {
        self.shutting_down
    }

    pub(crate) fn slot_totals(&self) -> (u64, u64) {
        let (a, r) = self.session_cap.slots().totals();
        let (ka, kr) = self.keys.slot_totals();
        (a + ka, r + kr)
    }

    /// Estimated time for one inference, for retry hints (100 ms before any): the
    /// fastest member's.
    fn service_estimate(&self) -> Duration {
        (self.pool.members.iter())
            .filter_map(|m| m.estimator.estimate())
            .min()
            .unwrap_or(Duration::from_millis(100))
    }

    /// The service-time estimate of member `b`.
    fn estimate_of(&self, b: usize) -> Option<Duration> {
        self.pool.members.get(b)?.estimator.estimate()
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

    // ---------------------------------------------------------------- submit

    /// Admits, joins, answers from cache, or refuses one submission; `class` is set to
    /// its priority class once its keys are known ([`State::submit`] counts it).
    fn submit_as(
        &mut self,
        mut sub: Submission,
        waiter: W,
        class: &mut Priority,
        now: Instant,
        fx: &mut Effects<W>,
    ) -> Admitted {
        self.stats.offered.add(1);
        self.cache.purge(now);
        let waited = now.saturating_duration_since(sub.received_at);
        if self.shutting_down {
            return fx.refuse_now(waiter, shutting_down(), &sub, waited);
        }
        let budget = self.cfg.deadline.budget(sub.budget);
        let deadline = budget.map(|b| sub.received_at + b);
        if let Some(b) = budget {
            self.deadline.note_budget(b);
        }
        if deadline.is_some_and(|d| d <= now) {
            let message = "deadline already passed at admission";
            let err = after_wait(ErrorCode::DeadlineExceeded, message, waited);
            return fx.refuse_now(waiter, err, &sub, waited);
        }
        let keys = match resolve_keys(&self.cfg, &sub) {
            Ok(k) => k,
            Err(e) => {
                let err = ErrorBody::new(ErrorCode::InvalidRequest, e.to_string());
                return fx.refuse_now(waiter, err, &sub, waited);
            }
        };
        *class = super::priority::class_of(sub.priority, &self.cfg.limits, &keys);
        sub.priority = Some(*class);
        let fingerprint = match (&self.cfg.idempotency, &sub.request_id) {
            (Some(_), Some(_)) => Some(Fingerprint::of(&sub)),
            _ => None,
        };
        let waiter = match self.idempotent(&sub, fingerprint.as_ref(), waiter, waited, now, fx) {
            Ok(waiter) => waiter,
            Err(done) => return done,
        };
        let ask = Ask {
            sub: &sub,
            keys: &keys,
            now,
            budget,
            deadline,
            answer_by: deadline.map(|d| d.checked_sub(self.cfg.deadline.reply_margin).unwrap_or(d)),
            hint: self.service_estimate(),
            priority: *class,
        };
        let routed = match self.gates(&ask, waited) {
            Ok(r) => r,
            Err(err) => return fx.refuse_now(waiter, *err, &sub, waited),
        };
        let answer_by = ask.answer_by;
        // Token budgets: checked and reserved in this transition (one lock).
        let tokens = match self.reserve_tokens(&sub, &keys, now, waited) {
            Ok(t) => t,
            Err(err) => return fx.refuse_now(waiter, *err, &sub, waited),
        };
        let admit = Admit {
            keys,
            fingerprint,
            deadline,
            answer_by,
            routed,
            tokens,
        };
        let admitted = self.admit(sub, waiter, admit, now, fx);
        // Batch work displaced (answered now) to make room: only once the request is
        // queued (the key gates, inside `admit`, may still refuse it), so nothing is
        // displaced for a request that is then refused.
        if admitted == Admitted::Queued {
            self.displace_for(&routed, now, fx);
        }
        admitted
    }

    /// The admission gates, in their order of precedence: the session cap, the
    /// session order (`reject`), the queue bound, the deadline prediction.
    fn gates(&self, ask: &Ask<'_>, waited: Duration) -> Result<Routed, Box<ErrorBody>> {
        let sub = ask.sub;
        self.verdict(self.session_cap.check(ask), (), sub, waited)?;
        self.verdict(self.session_order.check(ask), (), sub, waited)?;
        if !self.may_displace_for_room(ask) {
            self.verdict(
                self.queue_bound.check((ask, self.queued())),
                (),
                sub,
                waited,
            )?;
        }
        let id = self.next_id;
        let due = self.deadline.due(ask.deadline, sub.received_at, self.epoch);
        let due = self.class_due(due, ask.priority);
        // Routing refuses only what shadow mode enforces too (a late prediction, every
        // backend ejected).
        self.route(ask, id, due).map_err(|r| {
            self.count(&r);
            r.body
        })
    }

    /// Queues a request that passed every gate: it takes its session slot and EDF
    /// place, arms its deadline timer, and goes behind its session or on to the key
    /// gates.
    fn admit(
        &mut self,
        sub: Submission,
        waiter: W,
        admit: Admit,
        now: Instant,
        fx: &mut Effects<W>,
    ) -> Admitted {
        let (placement, member) = (admit.routed.placement, admit.routed.member);
        let (deadline, answer_by) = (admit.deadline, admit.answer_by);
        let id = self.next_id;
        self.next_id += 1;
        let priority = self.admitted_as(id, sub.priority.unwrap_or_default());
        let order = self.deadline.enter(placement.order, answer_by, member);
        self.pool.admitted(member, admit.routed.spilled_from);
        let session_slot = self.session_cap.acquire(sub.session.as_deref());
        let request = BackendRequest {
            body: sub.body,
            request_id: sub.request_id.clone(),
            session: sub.session.clone(),
            deadline,
            max_reply_bytes: self.cfg.max_reply_bytes,
            trace: sub.trace,
        };
        sub.span.record("id", id);
        let entry = Entry {
            id,
            member,
            place: placement.order,
            progress: None,
            failed_over: false,
            request_id: sub.request_id,
            fingerprint: admit.fingerprint,
            session: sub.session,
            keys: admit.keys,
            stage: Stage::Session,
            received_at: sub.received_at,
            deadline,
            answer_by,
            probe: placement.probe,
            order,
            stage_since: now,
            started_at: None,
            session_slot,
            key_slots: Vec::new(),
            waiter: Some(waiter),
            joined: Vec::new(),
            request: Some(request),
            abort: None,
            on_settled: Vec::new(),
            gate_timer: None,
            deadline_timer: None,
            stream: sub.stream,
            notified: None,
            span: sub.span,
            tokens: admit.tokens,
            priority,
        };
        if let (Some(rid), Some(_)) = (&entry.request_id, &entry.fingerprint) {
            self.by_request_id.insert(rid.clone(), id);
        }
        self.stats.admitted.add(1);
        self.emit(TraceKind::Queued, &entry, now, |_| {});
        if entry.session_slot.is_some() {
            self.emit_slot(TraceKind::SlotAcquired, &entry, now, RULE_SESSION_CAP, None);
        }
        // Session order: wait behind the active request, or become it.
        let behind_session = self.session_order.enter(entry.session.as_deref(), id);
        if behind_session {
            let rule = RULE_SESSION_ORDER;
            self.emit_slot(TraceKind::SlotWaiting, &entry, now, rule, None);
        }
        self.entries.insert(id, entry);
        self.arm_deadline(id, fx);
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

    // ------------------------------------------------------------ the work list

    fn run(&mut self, now: Instant, fx: &mut Effects<W>) {
        while let Some(action) = fx.todo.pop_front() {
            match action {
                Action::Advance { id, from } => self.advance(id, from, now, fx),
                Action::Pump { gate, key } => self.pump(gate, &key, now, fx),
            }
        }
    }

    /// Moves entry `id` through the key gates `from..`; it ends up waiting at a gate,
    /// refused, or ready for a worker.
    fn advance(&mut self, id: u64, from: usize, now: Instant, fx: &mut Effects<W>) {
        if self.shutting_down {
            self.retire(id, Err(shutting_down()), now, fx);
            return;
        }
        let hint = self.service_estimate();
        for gate in from..self.keys.len() {
            let Some(entry) = self.entries.get(&id) else {
                return;
            };
            let Some(key) = entry.keys.get(gate).cloned().flatten() else {
                continue;
            };
            let ask = KeyAsk {
                gate,
                key: &key,
                hint,
            };
            let verdict = self.keys.check(&ask);
            match verdict {
                Ok(KeyPass::Free) => {}
                // Shadow: report what enforce mode would have done, then take the slot.
                _ if self.shadow() => self.shadow_key_busy(id, &ask, verdict.is_err(), now),
                Ok(KeyPass::Wait(max_wait)) => {
                    self.keys.wait(gate, &key, id);
                    let (at, kind) = (now + max_wait, TimerKind::GateWait);
                    let t = Timer { at, id, kind };
                    if let Some(e) = self.entries.get_mut(&id) {
                        e.stage = Stage::Gate(gate);
                        e.stage_since = now;
                        e.gate_timer = Some(t);
                    }
                    self.add_timer(t, fx);
                    let (e, rule) = (&self.entries[&id], &self.keys.limit(gate).name);
                    self.emit_slot(TraceKind::SlotWaiting, e, now, rule, Some(&key));
                    return;
                }
                Err(r) => {
                    self.count(&r);
                    let (e, rule) = (&self.entries[&id], &self.keys.limit(gate).name);
                    self.emit_slot(TraceKind::SlotBusy, e, now, rule, Some(&key));
                    self.retire(id, Err(*r.body), now, fx);
                    return;
                }
            }
            let guard = self.keys.acquire(gate, &key);
            if let Some(e) = self.entries.get_mut(&id) {
                e.key_slots.push((gate, guard));
            }
            let (e, rule) = (&self.entries[&id], &self.keys.limit(gate).name);
            self.emit_slot(TraceKind::SlotAcquired, e, now, rule, Some(&key));
        }
        // Through every gate: ready for a worker.
        self.make_ready(id, now, fx);
        if let Some(e) = self.entries.get(&id) {
            self.emit(TraceKind::Admitted, e, now, |_| {});
        }
    }

    /// Puts entry `id` in its member's ready queue (under its order key under EDF).
    fn make_ready(&mut self, id: u64, now: Instant, fx: &mut Effects<W>) {
        let Some(order) = self.entries.get(&id).map(|e| e.order) else {
            return;
        };
        let key = self.ready_key(order);
        let Some(e) = self.entries.get_mut(&id) else {
            return;
        };
        e.stage = Stage::Ready(key);
        e.stage_since = now;
        self.pool.members[e.member].ready.insert(key, id);
        fx.ready_added += 1;
        fx.ready_on |= super::pool::bit(e.member);
    }

    /// Shadow mode at a busy key: the trace event of what enforce mode would have done
    /// (`refused`, or made to wait), and the would-reject count.
    fn shadow_key_busy(&self, id: u64, ask: &KeyAsk<'_>, refused: bool, now: Instant) {
        let limit = self.keys.limit(ask.gate);
        let kind = match refused {
            true => TraceKind::SlotBusy,
            false => TraceKind::SlotWaiting,
        };
        self.emit(kind, &self.entries[&id], now, |ev| {
            ev.rule = Some(limit.name.clone());
            ev.key = Some(ask.key.to_owned());
            ev.shadow = true;
        });
        if refused {
            self.stats.would_reject(&limit.name);
        }
    }

    /// Grants freed slots of `key` at gate `gate` to its waiters, strictly in order.
    fn pump(&mut self, gate: usize, key: &str, now: Instant, fx: &mut Effects<W>) {
        while let Some((head, guard)) = self.keys.grant(gate, key) {
            let Some(e) = self.entries.get_mut(&head) else {
                continue;
            };
            e.key_slots.push((gate, guard));
            let timer = e.gate_timer.take();
            let waited = now.saturating_duration_since(e.stage_since);
            if let Some(t) = timer {
                self.timers.remove(&t);
            }
            let e = &self.entries[&head];
            self.emit(TraceKind::SlotGranted, e, now, |ev| {
                ev.rule = Some(self.keys.limit(gate).name.clone());
                ev.key = Some(key.to_owned());
                ev.waited_ms = Some(ms(waited));
            });
            fx.todo.push_back(Action::Advance {
                id: head,
                from: gate + 1,
            });
        }
    }

    // ------------------------------------------------------------------ retire

    /// Removes entry `id` and answers its waiters with `result`. The only place an
    /// entry leaves the map; see the module invariants.
    fn retire(
        &mut self,
        id: u64,
        mut result: Result<BackendReply, ErrorBody>,
        now: Instant,
        fx: &mut Effects<W>,
    ) {
        let Some(mut e) = self.entries.remove(&id) else {
            return;
        };
        self.unlink(&mut e);
        self.settle_tokens(&mut e, &mut result, now);
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
        if let Some(next) = self.session_order.release(e.session.as_deref(), id) {
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
        // Release slots (dropping the guards), then let waiters have them.
        for (gate, guard) in std::mem::take(&mut e.key_slots) {
            let key = guard.key().to_owned();
            drop(guard);
            let rule = &self.keys.limit(gate).name;
            self.emit_slot(TraceKind::SlotReleased, &e, now, rule, Some(&key));
            fx.todo.push_back(Action::Pump { gate, key });
        }
        if let Some(guard) = e.session_slot.take() {
            drop(guard);
            self.emit_slot(TraceKind::SlotReleased, &e, now, RULE_SESSION_CAP, None);
        }
        fx.settled.append(&mut e.on_settled);
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

    /// Takes a removed entry out of every place that refers to it: its stage's queue,
    /// the counts, its EDF place, its timers, its request id.
    fn unlink(&mut self, e: &mut Entry<W>) {
        let id = e.id;
        self.stream_queued.remove(&id);
        self.batch.remove(&id);
        match e.stage {
            Stage::Session => self.session_order.leave_waiting(e.session.as_deref(), id),
            Stage::Gate(gate) => {
                if let Some(Some(key)) = e.keys.get(gate) {
                    self.keys.leave(gate, key, id);
                }
            }
            Stage::Ready(k) => {
                self.pool.members[e.member].ready.remove(&k);
            }
            Stage::Running => {}
        }
        let m = &mut self.pool.members[e.member];
        if e.stage == Stage::Running {
            m.running_since.remove(&id);
        } else {
            m.queued -= 1;
        }
        if let Some(k) = e.order.take() {
            self.deadline.leave(k);
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
    }
}
